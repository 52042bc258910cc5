"""Real images without a download: the IDX reader and loader, and the runner's data directory.

Every test writes its own small IDX files; nothing here reads the real datasets.
"""

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import demo, run
from keras_thermo import data

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write_idx(path, array, *, compress=None, type_code=None):
    """Writes `array` as an IDX file (big-endian data after the magic number and the sizes)."""
    array = np.asarray(array)
    codes = {np.dtype(dtype).newbyteorder("=").str: code for code, dtype in data.IDX_DTYPES.items()}
    code = codes[array.dtype.newbyteorder("=").str] if type_code is None else type_code
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    content = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path = Path(path)
    compress = path.suffix == ".gz" if compress is None else compress
    path.write_bytes(gzip.compress(content) if compress else content)
    return path


def write_split(folder, split_name, images, labels, *, prefix="", separator="-", suffix=""):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / f"{prefix}{split_name}-images{separator}idx3-ubyte{suffix}", images)
    write_idx(folder / f"{prefix}{split_name}-labels{separator}idx1-ubyte{suffix}", labels)


def random_split(num_examples, size=28, num_classes=10, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(num_examples, size, size), dtype=np.uint8)
    labels = (np.arange(num_examples) % num_classes).astype(np.uint8)
    return images, labels


# ---------------------------------------------------------------------------------------------
# read_idx


@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8"])
@pytest.mark.parametrize("shape", [(5,), (3, 2, 4)])
@pytest.mark.parametrize("name", ["array-idx-ubyte", "array-idx-ubyte.gz"])
def test_read_idx_gives_the_written_dtype_shape_and_values(dtype, shape, name, tmp_path):
    rng = np.random.default_rng(0)
    values = rng.integers(-100, 100, size=shape) if "f" not in dtype else rng.normal(size=shape) * 1e3
    if dtype == "u1":
        values = np.abs(values) + 100  # up to 199: the high bit is set in some bytes
    array = values.astype(dtype)
    path = write_idx(tmp_path / name, array)
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    loaded = data.read_idx(path)
    assert loaded.shape == shape
    assert loaded.dtype == np.dtype(dtype).newbyteorder("=") and loaded.dtype.isnative
    np.testing.assert_array_equal(loaded, array)


def test_read_idx_knows_compression_by_content_not_name(tmp_path):
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    np.testing.assert_array_equal(data.read_idx(write_idx(tmp_path / "plain.gz", array, compress=False)), array)
    np.testing.assert_array_equal(data.read_idx(write_idx(tmp_path / "packed", array, compress=True)), array)


@pytest.mark.parametrize(
    "content, found",
    [
        (bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 5]), "0x00000701"),  # unknown type code
        (bytes([1, 0, 0x08, 1, 0, 0, 0, 1, 5]), "0x01000801"),  # not two zero bytes
        (bytes([0, 0, 0x08, 0]), "0x00000800"),  # no dimensions
        (bytes([0, 0]), "none"),
    ],
)
def test_read_idx_rejects_a_bad_magic_number_naming_the_file_the_value_and_what_is_allowed(content, found,
                                                                                          tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        data.read_idx(path)
    message = str(caught.value)
    assert f"IDX file '{path}' has magic number {found}" in message
    assert "0x08 (uint8)" in message and "0x0E (float64)" in message and "DD >= 1" in message


def test_read_idx_names_a_broken_gzip_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 1, 5]))[:-6])
    with pytest.raises(ValueError, match=f"IDX file '{path}' starts as a gzip stream but does not decompress"):
        data.read_idx(path)


def test_read_idx_rejects_data_of_the_wrong_size(tmp_path):
    path = tmp_path / "short-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 0x08, 1, 0, 0, 0, 4, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"declares shape \(4,\) of uint8, 4 bytes of data, but holds 3"):
        data.read_idx(path)
    path.write_bytes(bytes([0, 0, 0x08, 2, 0, 0, 0, 4]))
    with pytest.raises(ValueError, match="cut short in its header: 2 dimensions need 12 bytes"):
        data.read_idx(path)


# ---------------------------------------------------------------------------------------------
# Finding and loading a dataset's files


@pytest.mark.parametrize(
    "name, layout",
    [
        ("fashion_mnist", {"suffix": ".gz"}),  # Fashion-MNIST: train-images-idx3-ubyte.gz
        ("mnist", {}),  # MNIST: train-images-idx3-ubyte
        ("mnist", {"separator": "."}),  # train-images.idx3-ubyte, as some copies name them
        ("emnist/balanced", {"prefix": "emnist-balanced-", "suffix": ".gz"}),
    ],
)
@pytest.mark.parametrize("in_subfolder", [False, True])
def test_idx_files_finds_the_distributions_names(name, layout, in_subfolder, tmp_path):
    folder = tmp_path / data.IDX_DATASETS[name]["folder"] if in_subfolder else tmp_path
    test_name = "test" if name.startswith("emnist") else "t10k"  # EMNIST calls its test split test
    write_split(folder, "train", *random_split(12, size=4), **layout)
    write_split(folder, test_name, *random_split(6, size=4), **layout)
    images, labels = data.idx_files(tmp_path, name, "test")
    assert images.parent == folder and images.name.startswith(f"{layout.get('prefix', '')}{test_name}-images")
    x, y = data.read_idx_split(tmp_path, name, "train", limit=5)
    assert x.shape == (5, 4, 4, 1) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(y, np.arange(5))
    # Another distribution's names are not taken for these (EMNIST's carry its prefix).
    other = "mnist" if name.startswith("emnist") else "emnist/balanced"
    assert data.idx_files(tmp_path, other, "train") is None


def test_idx_files_names_the_missing_half_and_checks_its_arguments(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", random_split(3, size=2)[0])
    with pytest.raises(ValueError, match=r"holds the train images of mnist \(train-images-idx3-ubyte\) but not its "
                                         r"labels \(one of \['train-labels-idx1-ubyte'"):
        data.idx_files(tmp_path, "mnist", "train")
    assert data.idx_files(tmp_path, "mnist", "test") is None
    with pytest.raises(ValueError, match="`name` must be one of .* got 'cifar10'"):
        data.idx_files(tmp_path, "cifar10", "train")
    with pytest.raises(ValueError, match="`split` must be one of .* got 'validation'"):
        data.idx_files(tmp_path, "mnist", "validation")
    write_idx(tmp_path / "t10k-images-idx3-ubyte", random_split(3, size=2)[0])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match=r"shape \(3, 2, 2\).*shape \(4,\).*same n"):
        data.read_idx_split(tmp_path, "mnist", "test")


def test_load_mnist_reads_idx_files_without_tfds(tmp_path):
    write_split(tmp_path / "mnist", "train", *random_split(20))
    write_split(tmp_path / "mnist", "t10k", *random_split(10, seed=1))
    built = data.load_mnist("train", batch_size=8, data_dir=str(tmp_path), shuffle=False, flatten=True, limit=16)
    assert (built.name, built.num_examples, built.num_classes, built.input_shape) == ("mnist", 16, 10, (784,))
    x, y = next(iter(built.dataset))
    images, labels = random_split(20)
    np.testing.assert_allclose(x.numpy(), images[:8].reshape(8, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y.numpy(), labels[:8])
    rows = data.load_mnist("test", batch_size=4, data_dir=str(tmp_path), squeeze_channels=True)
    assert rows.num_examples == 10 and rows.input_shape == (28, 28)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_missing_real_data_names_both_routes_and_the_commands(name, tmp_path):
    with pytest.raises(data.DatasetNotPreparedError) as caught:
        data.load_classification(name, "train", batch_size=8, data_dir=str(tmp_path))
    message = str(caught.value)
    assert f"no IDX files of it in '{tmp_path}' or '{tmp_path / name}'" in message
    assert "`make real-data` (or `bash scripts/get_real_data.sh data/real`)" in message
    assert "`--data-dir data/real`" in message
    assert f"(2) TensorFlow Datasets: Dataset '{name}' is not prepared" in message
    assert f"tfds build {name} --data_dir={tmp_path}" in message


# ---------------------------------------------------------------------------------------------
# The runner's data directory


def _mnist_config(tmp_path, data_dir):
    config = {
        "name": "mnist_idx",
        "data": {"dataset": "mnist", "options": {"flatten": True}, "eval_batch_size": 10, "data_dir": data_dir},
        "model": {"builder": "emnist_mlp", "options": {"num_classes": 10, "hidden_units": 8}},
        "training": {"epochs": 1, "batch_size": 10},
        "evaluation": {"burn_in_epochs": 0, "every_n_steps": 1},
        "methods": {"adam": {"optimizer": "adam"},
                    "sgnht": {"sampler": "sgnht", "options": {"step_size": 1.0e-3, "friction": 10.0},
                              "prior_std": 1.0}},
    }
    path = tmp_path / "mnist_idx.yaml"
    path.write_text(yaml.safe_dump(config))
    return run.load_config(path)


def _write_real(tmp_path):
    write_split(tmp_path / "real" / "mnist", "train", *random_split(40))
    write_split(tmp_path / "real" / "mnist", "t10k", *random_split(20, seed=1))
    return str(tmp_path / "real")


def test_runner_loads_idx_files_from_the_configs_data_dir_or_the_command_lines(tmp_path):
    real = _write_real(tmp_path)
    task = run.load_task_data(_mnist_config(tmp_path, real), 0.0, quick=False, mock_data=False, data_dir=None)
    assert (task.train.name, task.train.num_examples, task.test.num_examples) == ("mnist", 40, 20)
    assert (task.train.input_shape, task.train.num_classes) == ((784,), 10)
    # The command line's directory wins over the config's.
    elsewhere = _mnist_config(tmp_path, str(tmp_path / "nothing_here"))
    task = run.load_task_data(elsewhere, 0.0, quick=False, mock_data=False, data_dir=real)
    assert (task.train.num_examples, task.test.num_examples) == (40, 20)


@pytest.mark.slow
def test_runner_trains_on_idx_files_and_records_where_they_came_from(tmp_path):
    real = _write_real(tmp_path)
    config = _mnist_config(tmp_path, None)
    results = run.run_config(config, tmp_path / "out", data_dir=real, verbose=0, log=lambda *_: None)
    assert [r["status"] for r in results["runs"]] == ["ok", "ok"]
    assert all(r["metrics"]["num_samples"] >= 1 for r in results["runs"] if r["kind"] == "sampler")
    assert results["config"]["data"]["data_dir"] == real


def test_runner_without_the_data_says_how_to_get_it(tmp_path, capsys):
    config = _mnist_config(tmp_path, str(tmp_path / "empty"))
    assert run.main([str(tmp_path / "mnist_idx.yaml"), "--out", str(tmp_path / "out")]) == run.EXIT_ERROR
    error = capsys.readouterr().err
    assert "Two routes to 'mnist'" in error and "make real-data" in error and "tfds build mnist" in error
    assert "--mock-data" in error
    assert config["data"]["data_dir"] == str(tmp_path / "empty")


def test_runner_checks_data_dir(tmp_path):
    config = yaml.safe_load((CONFIGS / "digits.yaml").read_text())
    config["data"]["data_dir"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(run.ConfigError, match="`data.data_dir` must be a directory name or null, got 3"):
        run.load_config(path)


def test_demo_mentions_the_real_data_comparison_only_where_real_mnist_is(tmp_path):
    assert demo.real_data_hint(tmp_path / "real") is None
    _write_real(tmp_path)
    hint = demo.real_data_hint(tmp_path / "real")
    assert f"Real MNIST found in {tmp_path / 'real'}" in hint
    assert "python -m benchmarks.logistic_regression --config configs/logistic_mnist.yaml" in hint
    assert f"python -m benchmarks.run configs/mnist_mlp_real.yaml --data-dir {tmp_path / 'real'}" in hint
    assert demo.REAL_DATA_DIR == Path(demo.__file__).resolve().parent.parent / "data" / "real"


# ---------------------------------------------------------------------------------------------
# Out-of-distribution scoring against another dataset (MNIST-trained nets on Fashion-MNIST)


def _write_fashion(tmp_path):
    write_split(tmp_path / "real" / "fashion_mnist", "train", *random_split(30, seed=2))
    write_split(tmp_path / "real" / "fashion_mnist", "t10k", *random_split(15, seed=3))


@pytest.mark.parametrize("ood, dataset, match", [
    ({"dataset": "cifar10"}, "mnist", r"`ood.dataset` must be one of \['emnist_balanced', 'fashion_mnist', 'mnist'\] "
                                      r"other than `data.dataset`.*got ood.dataset 'cifar10'"),
    ({"dataset": "mnist"}, "mnist", r"other than `data.dataset`.*got ood.dataset 'mnist' with data.dataset 'mnist'"),
    ({"dataset": "mnist"}, "cifar10", r"data.dataset 'cifar10'"),
    ({"dataset": "fashion_mnist", "in_classes": [0, 1]}, "mnist", r"either `dataset` or `in_classes`"),
    ({"dataset": "fashion_mnist", "label_noise": 0.3}, "mnist",
     r"`ood.label_noise` 0.3 must be one of `data.label_noise` \[0.0, 0.2\]"),
])
def test_cross_dataset_ood_block_is_checked(ood, dataset, match):
    with pytest.raises(run.ConfigError, match=match):
        run.check_ood(ood, {"dataset": dataset, "label_noise": [0.0, 0.2]})


def test_runner_scores_another_datasets_test_split_as_ood(tmp_path):
    """`ood: {dataset: fashion_mnist}` on an MNIST config: the reported runs at `ood.label_noise`
    (and only they) hold Fashion-MNIST's test split, score it, and the table reports it."""
    real = _write_real(tmp_path)
    _write_fashion(tmp_path)
    config = _mnist_config(tmp_path, real)
    config["data"]["label_noise"] = [0.0, 0.2]
    config["ood"] = run.check_ood({"dataset": "fashion_mnist"}, config["data"])
    task = run.load_task_data(config, 0.0, quick=False, mock_data=False, data_dir=None)
    assert (task.ood.name, task.ood.num_examples, task.ood.input_shape) == ("fashion_mnist", 15, (784,))
    assert run.load_task_data(config, 0.2, quick=False, mock_data=False, data_dir=None).ood is None
    config["data"]["label_noise"] = [0.0]
    results = run.run_config(config, tmp_path / "out", verbose=0, log=lambda *_: None)
    assert results["ood_runs"] == []  # no separate study: the scores are in the reported runs
    scores = {r["method"]: r["ood"] for r in results["runs"]}
    assert 0.0 <= scores["adam"]["auroc_predictive_entropy"] <= 1.0
    assert scores["adam"]["auroc_mutual_information"] is None
    assert 0.0 <= scores["sgnht"]["auroc_mutual_information"] <= 1.0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "scores the test images of fashion_mnist against those of mnist" in table
    assert "- OOD: best optimizer AUROC adam" in table  # the method key stands for its label


def test_runner_data_limits_take_the_first_examples_and_quick_replaces_them(tmp_path):
    real = _write_real(tmp_path)
    _write_fashion(tmp_path)
    config = _mnist_config(tmp_path, real)
    config["data"].update(train_limit=25, test_limit=12)
    config["ood"] = run.check_ood({"dataset": "fashion_mnist"}, config["data"])
    task = run.load_task_data(config, 0.0, quick=False, mock_data=False, data_dir=None)
    assert (task.train.num_examples, task.test.num_examples, task.ood.num_examples) == (25, 12, 12)
    config["quick"] = {"train_limit": 30}
    task = run.load_task_data(config, 0.0, quick=True, mock_data=False, data_dir=None)
    assert (task.train.num_examples, task.test.num_examples) == (30, 12)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "all"])
def test_runner_data_limits_are_checked(limit, tmp_path):
    path = tmp_path / "limited.yaml"
    config = yaml.safe_load((CONFIGS / "emnist_all.yaml").read_text())
    config["data"]["train_limit"] = limit
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(run.ConfigError, match=r"`data.train_limit` must be a positive integer \(the first examples"):
        run.load_config(path)


def test_runner_without_the_ood_dataset_says_how_to_get_it_before_training(tmp_path, capsys):
    real = _write_real(tmp_path)  # MNIST only
    config = _mnist_config(tmp_path, real)
    text = yaml.safe_load((tmp_path / "mnist_idx.yaml").read_text())
    text["ood"] = {"dataset": "fashion_mnist"}
    (tmp_path / "mnist_idx.yaml").write_text(yaml.safe_dump(text))
    assert run.main([str(tmp_path / "mnist_idx.yaml"), "--out", str(tmp_path / "out")]) == run.EXIT_ERROR
    error = capsys.readouterr().err
    assert "Two routes to 'fashion_mnist'" in error and "make real-data" in error
    assert not (tmp_path / "out" / "tensorboard").exists()  # nothing was trained
    assert config["data"]["data_dir"] == real
