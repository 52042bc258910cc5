"""The benchmark runner and its configs: schema, unit conversions, quick runs on mock data."""

import math
from pathlib import Path

import pytest
import tensorflow as tf

from benchmarks import demo, run
from keras_thermo.testing import load_strict_json

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TASKS = {"emnist": 112_800, "fashion_mnist": 60_000, "cifar10": 50_000}  # training-set sizes N
# Luo et al. (2018), sec. 5.2: TACT-HMC's (eta_theta, c_theta, K) per task, in the paper's units.
PAPER_TACT = {"emnist": (0.0015, 0.05, 50), "fashion_mnist": (0.0012, 0.15, 50), "cifar10": (0.0010, 0.10, 50)}
METHODS = ["adam", "sgd", "sghmc", "sgnht", "ccadl", "mccadl", "tact_hmc"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_outputs(out, labels):
    results = load_strict_json(out / "results.json")
    table = (out / "table.md").read_text()
    assert "| % permuted labels | 0% |" in table
    for label in labels:
        assert f"| {label} |" in table
    for name in ("accuracy.png", "nll.png", "reliability.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    return results


# ---------------------------------------------------------------------------------------------
# Configs


@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_configs_parse_and_convert_the_papers_units(task):
    everything = run.load_config(CONFIGS / f"{task}_all.yaml")
    assert list(everything["methods"]) == METHODS
    assert everything["data"]["label_noise"] == [0.0, 0.2, 0.3]
    assert everything["training"]["epochs"] == 1000
    n = TASKS[task]
    eta_paper, c_paper, period = PAPER_TACT[task]
    tact = everything["methods"]["tact_hmc"]["options"]
    # The paper's step sizes are per mean loss: eta = eta_paper / N.
    assert tact["step_size"] * n == pytest.approx(eta_paper, rel=1e-3)
    assert tact["xi_step_size"] * n == pytest.approx(eta_paper, rel=1e-3)
    assert (tact["noise"], tact["sample_every"]) == (c_paper, period)
    for key in ("sghmc", "sgnht", "ccadl", "mccadl"):
        options = everything["methods"][key]["options"]
        # Same learning rate h^2 N and momentum decay A h as TACT-HMC.
        assert options["step_size"] ** 2 * n == pytest.approx(eta_paper, rel=1e-3)
        assert options["friction"] * options["step_size"] == pytest.approx(c_paper, rel=1e-3)
    # Posterior samples must be able to fall on TACT's sampling steps.
    assert everything["evaluation"]["every_n_steps"] % period == 0
    # Each per-method config is exactly one method of the task config.
    for key in METHODS:
        single = run.load_config(CONFIGS / f"{task}_{key}.yaml")
        assert single["methods"] == {key: everything["methods"][key]}
        assert single["name"] == f"{task}_{key}"
        assert {k: v for k, v in single.items() if k not in ("methods", "name")} == {
            k: v for k, v in everything.items() if k not in ("methods", "name")
        }


def test_digits_config_parses():
    config = run.load_config(CONFIGS / "digits.yaml")
    assert config["data"]["dataset"] == "digits"
    assert {m.get("sampler") for m in config["methods"].values()} >= {"sgnht", "mccadl", "tact_hmc"}
    assert any(m.get("optimizer") == "adam" for m in config["methods"].values())


def test_config_errors_name_the_key(tmp_path):
    base = (CONFIGS / "digits.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "\nepochs: 3\n")
    with pytest.raises(run.ConfigError, match=r"unknown keys \['epochs'\]"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\nonly: [nope]\n")
    with pytest.raises(run.ConfigError, match="nope"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\nmethods: {adam: {sampler: sgnht}}\n")
    with pytest.raises(run.ConfigError, match="exactly one of `optimizer` and `sampler`"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\ntraining: {epochs: 1, batch_size: 32, num_chains: 0}\n")
    with pytest.raises(run.ConfigError, match=r"`training.num_chains` must be a positive integer, got 0"):
        run.load_config(bad)
    # TACT-HMC yields samples only every K steps: a thinning that never meets them is refused.
    config = run.load_config(CONFIGS / "emnist_tact_hmc.yaml")
    config["evaluation"]["every_n_steps"] = 75
    sampler = run.build_sampler(config["methods"]["tact_hmc"])
    with pytest.raises(run.ConfigError, match="multiple of the sampler's sample_every=50"):
        run._evaluation_schedule(config, config["methods"]["tact_hmc"], 10, sampler)


def test_missing_data_gives_the_preparation_message_not_a_traceback(tmp_path, capsys):
    status = run.main([str(CONFIGS / "emnist_adam.yaml"), "--quick", "--data-dir", str(tmp_path),
                       "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == run.EXIT_ERROR
    assert "emnist/balanced" in captured.err and "tfds build" in captured.err
    assert "--mock-data" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "out" / "results.json").exists()


# ---------------------------------------------------------------------------------------------
# End to end, a few steps each


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_configured_sampler_is_registered(task, method):
    config = run.load_config(CONFIGS / f"{task}_{method}.yaml")
    spec = config["methods"][method]
    if "sampler" in spec:
        assert run.sampler_is_registered(spec["sampler"]), f"{task}_{method}.yaml: {spec['sampler']!r}"
        run.build_sampler(spec)  # the configured hyperparameters are accepted
    else:
        run.build_optimizer(spec)


# Per-example gradients through the unrolled LSTM take about a minute to trace on 2 CPU cores:
# the default suite runs the other Fashion-MNIST methods, the slow suite these two.
HEAVY = {("fashion_mnist", "ccadl"), ("fashion_mnist", "mccadl")}


@pytest.mark.parametrize(
    "task, heavy",
    # The default suite runs the EMNIST MLP end to end; the LSTM and CNN tasks (23 s and 12 s
    # on 2 cores, their layers covered by tests/test_models.py) run with the slow tests.
    [("emnist", False)]
    + [pytest.param(task, False, marks=pytest.mark.slow) for task in sorted(TASKS) if task != "emnist"]
    + [pytest.param("fashion_mnist", True, marks=pytest.mark.slow)],
)
def test_task_configs_run_quick_on_mock_data(task, heavy, tmp_path):
    # One run of the task config covers its per-method configs (equal by the test above).
    path = CONFIGS / f"{task}_all.yaml"
    config = run.load_config(path)
    available = [k for k, m in config["methods"].items() if ((task, k) in HEAVY) == heavy]
    out = tmp_path / "out"
    status = run.main([str(path), "--quick", "--mock-data", "--data-dir", str(tmp_path / "tfds"),
                       "--out", str(out), "--verbose", "0", "--methods", ",".join(available)])
    assert status == 0
    results = _check_outputs(out, [config["methods"][k]["label"] for k in available])
    assert [r["method"] for r in results["runs"]] == available
    for record in results["runs"]:
        assert record["num_examples"] == config["quick"]["mock_examples"]
        assert record["status"] == "ok", (record["method"], record["message"])
        metrics = record["metrics"]
        assert metrics["num_samples"] >= 1
        assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["nll"] > 0 and 0 <= metrics["ece"] <= 1
        # Two quick epochs: one entry per epoch in each curve the plots use.
        curve = "posterior_accuracy" if record["kind"] == "sampler" else "test_accuracy"
        assert len(record["history"][curve]) == config["quick"]["epochs"]


def _event_tags(folder):
    tags = set()
    for path in Path(folder).rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_demo_quick_writes_table_plots_and_tensorboard(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "| Adam |" in printed and "posterior average vs Adam" in printed
    results = _check_outputs(out, ["Adam", "SGNHT"])
    runs = {r["method"]: r for r in results["runs"]}
    sgnht = runs["sgnht"]
    assert sgnht["status"] == "ok" and sgnht["metrics"]["num_samples"] >= 1
    # The table and the JSON agree.
    assert f"{100 * sgnht['metrics']['accuracy']:.2f}%" in (out / "table.md").read_text()
    # The averaged predictive's NLL never exceeds the mean per-sample log loss (Jensen).
    assert sgnht["metrics"]["nll"] <= sgnht["metrics"]["expected_log_loss"] + 1e-9
    # TensorBoard receives the sampler's diagnostics and the posterior metrics.
    tags = _event_tags(sgnht["tensorboard"])
    for name in ("kinetic_temperature", "xi", "potential", "step_size", "posterior_accuracy", "posterior_nll", "ece"):
        assert f"epoch_{name}" in tags, sorted(tags)
    assert math.isfinite(runs["adam"]["metrics"]["nll"])


def load_config_epochs() -> int:
    return int(run.load_config(CONFIGS / "digits.yaml")["quick"]["epochs"])


@pytest.mark.slow  # ~1 min; tests/test_chains.py covers the chains themselves in the default suite
def test_demo_with_several_chains_pools_them_and_logs_each_chain(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--quick", "--num-chains", "2"]) == 0
    capsys.readouterr()
    results = _check_outputs(out, ["Adam", "SGNHT"])
    sgnht = {r["method"]: r for r in results["runs"]}["sgnht"]
    assert sgnht["status"] == "ok" and sgnht["num_chains"] == 2
    assert sgnht["metrics"]["num_samples"] % 2 == 0 and sgnht["metrics"]["num_samples"] >= 2  # both chains pooled
    assert len(sgnht["history"]["posterior_accuracy"]) == load_config_epochs()
    tags = _event_tags(sgnht["tensorboard"])
    for name in ("kinetic_temperature_chain_0", "kinetic_temperature_chain_1", "xi_chain_1", "xi"):
        assert f"epoch_{name}" in tags, sorted(tags)
