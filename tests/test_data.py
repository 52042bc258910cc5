"""Tests for keras_thermo.data: label permutation, per-epoch datasets, TFDS on mock data
(offline), the missing-data error, and the bundled sklearn digits."""

import collections
import math

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds
from sklearn.datasets import load_digits as sklearn_load_digits

from keras_thermo import data, networks


def collect(dataset):
    """One pass over a dataset of (x, y) batches -> (x, y, batch sizes) as numpy."""
    xs, ys, sizes = [], [], []
    for x, y in dataset:
        xs.append(x.numpy())
        ys.append(y.numpy())
        sizes.append(int(y.shape[0]))
    return np.concatenate(xs), np.concatenate(ys), sizes


# ---------------------------------------------------------------------------------------------
# Label permutation


@pytest.mark.parametrize(
    "num_labels, fraction, expected_moved",
    [
        (1000, 0.0, 0),
        (1000, 0.2, 200),
        (1000, 0.3, 300),
        (101, 0.2, 20),  # 20.2 -> 20
        (101, 0.3, 30),  # 30.3 -> 30
        (10, 0.25, 3),  # 2.5 rounds half up (Python's round would give 2)
        (7, 1.0, 7),
        (10, 0.1, 0),  # k = 1: a single label has nowhere to go
    ],
)
def test_label_permutation_moves_exactly_the_requested_number(num_labels, fraction, expected_moved):
    source = data.label_permutation(num_labels, fraction, np.random.default_rng(0))
    assert sorted(source.tolist()) == list(range(num_labels))  # a permutation
    assert int(np.sum(source != np.arange(num_labels))) == expected_moved


def test_label_permutation_is_one_cycle_over_the_chosen_positions():
    source = data.label_permutation(500, 0.3, np.random.default_rng(1))
    moved = np.flatnonzero(source != np.arange(500))
    position, cycle_length = moved[0], 0
    while True:
        position = source[position]
        cycle_length += 1
        if position == moved[0]:
            break
    assert cycle_length == len(moved) == 150


def test_permute_labels_with_distinct_labels_changes_exactly_k_values():
    labels = np.arange(400) * 10  # distinct values: every moved position changes value
    permuted = data.permute_labels(labels, 0.2, np.random.default_rng(2))
    changed = permuted != labels
    assert changed.sum() == 80
    assert sorted(permuted.tolist()) == sorted(labels.tolist())
    # The moved labels came from the other moved positions only.
    assert set(permuted[changed].tolist()) == set(labels[changed].tolist())


def test_permute_labels_keeps_class_counts_and_is_reproducible():
    labels = np.random.default_rng(3).integers(0, 5, size=1000)
    a = data.permute_labels(labels, 0.3, np.random.default_rng(7))
    b = data.permute_labels(labels, 0.3, np.random.default_rng(7))
    c = data.permute_labels(labels, 0.3, np.random.default_rng(8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(np.bincount(a, minlength=5), np.bincount(labels, minlength=5))
    # About k (1 - sum p_c^2) = 300 * 0.8 = 240 values change; binomial-like spread ~ 7.
    assert 200 < int(np.sum(a != labels)) <= 300


def test_permute_labels_checks_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"`fraction` must be in \[0, 1\], got 1.5"):
        data.permute_labels(np.arange(10), 1.5, rng)
    with pytest.raises(ValueError, match="`fraction`"):
        data.permute_labels(np.arange(10), -0.1, rng)
    with pytest.raises(ValueError, match=r"`labels` must be a 1-D array \[N\], got shape \(2, 5\)"):
        data.permute_labels(np.zeros((2, 5), int), 0.2, rng)


# ---------------------------------------------------------------------------------------------
# Per-epoch datasets from arrays


def index_dataset(num_examples, **kwargs):
    """Features that carry their own index, and distinct labels 0..N-1."""
    x = np.arange(num_examples, dtype=np.float32)[:, None]
    y = np.arange(num_examples)
    return data.from_arrays(x, y, **kwargs), y


def test_each_pass_is_one_epoch_of_the_deterministic_plan():
    n = 50
    built, clean = index_dataset(n, batch_size=8, shuffle=True, label_noise=0.3, seed=3)
    assert built.steps_per_epoch == 7
    moved_sets = []
    for epoch in range(3):
        x, y, sizes = collect(built.dataset)
        assert sizes == [8] * 6 + [2]
        order, epoch_labels = data.epoch_plan(
            clean, epoch, shuffle=True, label_noise=0.3, seed=3
        )
        np.testing.assert_array_equal(x[:, 0].astype(int), order)
        np.testing.assert_array_equal(y, epoch_labels[order])
        # Labels are distinct, so exactly round(0.3 * 50) = 15 examples carry a foreign label.
        moved = set(np.flatnonzero(y != order).tolist())
        assert len(moved) == 15
        moved_sets.append(moved)
    assert moved_sets[0] != moved_sets[1] != moved_sets[2]


def test_same_seed_reproduces_epochs_and_another_seed_does_not():
    first, _ = index_dataset(40, batch_size=16, label_noise=0.2, seed=11)
    second, _ = index_dataset(40, batch_size=16, label_noise=0.2, seed=11)
    other, _ = index_dataset(40, batch_size=16, label_noise=0.2, seed=12)
    for _ in range(2):
        x1, y1, _ = collect(first.dataset)
        x2, y2, _ = collect(second.dataset)
        x3, y3, _ = collect(other.dataset)
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
        assert not np.array_equal(y1, y3)


def test_label_noise_without_shuffle_keeps_order_and_noise_does_not_depend_on_shuffle():
    noisy_only, clean = index_dataset(30, batch_size=30, shuffle=False, label_noise=0.2, seed=5)
    shuffled, _ = index_dataset(30, batch_size=30, shuffle=True, label_noise=0.2, seed=5)
    x, y, _ = collect(noisy_only.dataset)
    np.testing.assert_array_equal(x[:, 0], np.arange(30))
    assert int(np.sum(y != clean)) == 6
    # Same seed and epoch: the same labels are permuted, whatever the order.
    xs, ys, _ = collect(shuffled.dataset)
    np.testing.assert_array_equal(ys[np.argsort(xs[:, 0])], y)


def test_static_dataset_without_shuffle_or_noise_is_the_data_in_order():
    x_in = np.random.default_rng(0).integers(0, 256, size=(10, 2, 2, 1)).astype(np.uint8)
    y_in = np.arange(10) % 3
    built = data.from_arrays(
        x_in, y_in, batch_size=4, shuffle=False, scale=1 / 255, flatten=True, drop_remainder=True
    )
    assert built.input_shape == (4,) and built.num_classes == 3 and built.steps_per_epoch == 2
    for _ in range(2):
        x, y, sizes = collect(built.dataset)
        assert sizes == [4, 4]
        np.testing.assert_allclose(x, x_in[:8].reshape(8, 4) / 255.0, rtol=1e-6)
        np.testing.assert_array_equal(y, y_in[:8])
        assert x.dtype == np.float32 and y.dtype == np.int64


def test_keras_fit_starts_one_pass_per_epoch():
    n = 32
    x = np.random.default_rng(1).normal(size=(n, 4)).astype(np.float32)
    y = np.arange(n) % 2
    built = data.from_arrays(x, y, batch_size=8, label_noise=0.25, seed=9)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(built.dataset, epochs=2, verbose=0)
    # fit used epochs 0 and 1, so the next pass is epoch 2.
    _, labels, _ = collect(built.dataset)
    order, epoch_labels = data.epoch_plan(y, 2, shuffle=True, label_noise=0.25, seed=9)
    np.testing.assert_array_equal(labels, epoch_labels[order])


def test_with_replacement_draws_each_pass_independently_and_marks_the_dataset():
    n = 40
    x = np.arange(n, dtype=np.float32)[:, None]
    y = np.arange(n) % 2
    built = data.from_arrays(x, y, batch_size=8, seed=3, with_replacement=True)
    assert getattr(built.dataset, "draws_with_replacement", False)
    first, _, sizes = collect(built.dataset)
    assert sizes == [8] * 5
    order, _ = data.epoch_plan(y, 0, shuffle=True, label_noise=0.0, seed=3, with_replacement=True)
    np.testing.assert_array_equal(first[:, 0], order)
    # Uniform draws with replacement: repeats occur (P(no repeat in 40 of 40) ~ 1e-16), and
    # over many passes every example's frequency is 1/n within binomial error.
    assert len(np.unique(order)) < n
    counts = np.zeros(n)
    for epoch in range(200):
        counts += np.bincount(data.epoch_plan(y, epoch, shuffle=True, label_noise=0.0, seed=3,
                                              with_replacement=True)[0], minlength=n)
    expected = 200.0  # 200 passes x n draws / n examples
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
    assert not getattr(data.from_arrays(x, y, batch_size=8).dataset, "draws_with_replacement", False)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(batch_size=0), ValueError, "`batch_size` must be an integer >= 1, got 0"),
        (dict(batch_size=4, with_replacement="yes"), TypeError, "`with_replacement`"),
        (dict(batch_size=4, label_noise=1.5), ValueError, r"`label_noise` must be in \[0, 1\]"),
        (dict(batch_size=4, seed=-1), ValueError, "`seed`"),
        (dict(batch_size=4, num_classes=2), ValueError, "num_classes=2 but a label 2"),
        (dict(batch_size=4, squeeze_channels=True), ValueError, r"example shape \(3,\)"),
    ],
)
def test_from_arrays_checks_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        data.from_arrays(np.zeros((6, 3)), np.array([0, 1, 2, 0, 1, 2]), **kwargs)


def test_from_arrays_checks_labels():
    with pytest.raises(ValueError, match=r"one label per example \(6\), got shape \(5,\)"):
        data.from_arrays(np.zeros((6, 3)), np.arange(5), batch_size=2)
    with pytest.raises(TypeError, match="`y` must hold integers"):
        data.from_arrays(np.zeros((6, 3)), np.zeros(6), batch_size=2)


# ---------------------------------------------------------------------------------------------
# TFDS datasets on mock data (no network, no prepared files)


@pytest.mark.parametrize(
    "loader, name, image_shape, num_classes",
    [
        (data.load_emnist_balanced, "emnist/balanced", (28, 28, 1), 47),
        (data.load_fashion_mnist, "fashion_mnist", (28, 28, 1), 10),
        (data.load_cifar10, "cifar10", (32, 32, 3), 10),
    ],
)
def test_tfds_loaders_on_mock_data(loader, name, image_shape, num_classes, tmp_path):
    with tfds.testing.mock_data(num_examples=20):
        built = loader("train", batch_size=8, data_dir=str(tmp_path), seed=1)
        raw = loader("train", batch_size=8, data_dir=str(tmp_path), normalize=False, shuffle=False)
        flat = loader("test", batch_size=8, data_dir=str(tmp_path), flatten=True, limit=5)
    assert (built.name, built.split, built.num_examples) == (name, "train", 20)
    assert built.num_classes == num_classes and built.input_shape == image_shape
    assert built.batch_size == 8 and built.steps_per_epoch == 3
    x, y, sizes = collect(built.dataset)
    assert sizes == [8, 8, 4]
    assert x.shape == (20, *image_shape) and x.dtype == np.float32 and y.dtype == np.int64
    # Mock pixels are uniform over 0..255: scaled ones fill [0, 1] without exceeding it.
    assert x.min() >= 0.0 and x.max() <= 1.0 and x.max() > 0.9
    assert y.min() >= 0 and y.max() < num_classes
    # Raw pixels, unshuffled, are 255 times the clean storage-order data.
    x_raw, y_raw, _ = collect(raw.dataset)
    assert x_raw.max() > 200
    np.testing.assert_array_equal(y_raw, raw.labels)
    order = data.epoch_plan(built.labels, 0, shuffle=True, label_noise=0.0, seed=1)[0]
    np.testing.assert_allclose(x, x_raw[order] / 255.0, rtol=1e-6)
    # flatten + limit
    assert flat.num_examples == 5 and flat.input_shape == (math.prod(image_shape),)
    assert collect(flat.dataset)[0].shape == (5, math.prod(image_shape))


def test_fashion_mnist_rows_feed_the_lstm(tmp_path):
    with tfds.testing.mock_data(num_examples=6):
        built = data.load_fashion_mnist(
            "train", batch_size=6, data_dir=str(tmp_path), squeeze_channels=True
        )
        with pytest.raises(ValueError, match="squeeze_channels"):
            data.load_cifar10("train", batch_size=6, data_dir=str(tmp_path), squeeze_channels=True)
    assert built.input_shape == (28, 28)
    x, _ = next(iter(built.dataset))
    assert networks.fashion_mnist_lstm()(x).shape == (6, 10)


@pytest.mark.parametrize("name", ["fashion_mnist", "emnist/balanced"])
def test_missing_dataset_raises_a_clear_error(name, tmp_path):
    with pytest.raises(data.DatasetNotPreparedError) as caught:
        data.load_classification(name, "train", batch_size=8, data_dir=str(tmp_path))
    message = str(caught.value)
    assert f"Dataset '{name}' is not prepared in data_dir '{tmp_path}'" in message
    assert f"tfds build {name} --data_dir={tmp_path}" in message
    assert "download=True" in message
    assert isinstance(caught.value, RuntimeError)


# ---------------------------------------------------------------------------------------------
# scikit-learn digits


def test_digits_split_is_stratified_disjoint_and_complete():
    x_train, y_train = data.digits_arrays("train")
    x_test, y_test = data.digits_arrays("test")
    full = sklearn_load_digits()
    assert x_train.shape[1] == x_test.shape[1] == 64
    assert len(y_train) + len(y_test) == 1797
    class_counts = np.bincount(full.target, minlength=10)
    expected_test = np.floor(0.25 * class_counts + 0.5).astype(int)
    np.testing.assert_array_equal(np.bincount(y_test, minlength=10), expected_test)
    # Together the two splits are exactly the dataset (as a multiset of (pixels, label)).
    def rows(x, y):
        pixels = np.round(np.asarray(x) * 16).astype(int)
        return collections.Counter((tuple(r), int(t)) for r, t in zip(pixels, y))
    assert rows(x_train, y_train) + rows(x_test, y_test) == rows(full.data / 16.0, full.target)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert x_train.min() == 0.0 and x_train.max() == 1.0


def test_digits_split_is_fixed_by_its_seed():
    a = data.digits_arrays("test", split_seed=0)[0]
    b = data.digits_arrays("test", split_seed=0)[0]
    c = data.digits_arrays("test", split_seed=1)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_digits_layout_options():
    images, _ = data.digits_arrays("train", flatten=False, normalize=False)
    flat, _ = data.digits_arrays("train")
    assert images.shape[1:] == (8, 8, 1) and images.max() == 16.0
    np.testing.assert_array_equal(images.reshape(len(images), 64) / 16.0, flat)


def test_digits_7_vs_9_relabels_the_same_test_examples():
    x_all, y_all = data.digits_arrays("test")
    x_bin, y_bin = data.digits_arrays("test", classes=(7, 9))
    assert set(y_bin.tolist()) == {0, 1}
    np.testing.assert_array_equal(x_bin[y_bin == 0], x_all[y_all == 7])
    np.testing.assert_array_equal(x_bin[y_bin == 1], x_all[y_all == 9])


def test_load_digits_serves_the_arrays():
    built = data.load_digits("test", batch_size=64, shuffle=False)
    x_ref, y_ref = data.digits_arrays("test")
    assert (built.num_examples, built.num_classes, built.input_shape) == (len(y_ref), 10, (64,))
    x, y, _ = collect(built.dataset)
    np.testing.assert_array_equal(x, x_ref)
    np.testing.assert_array_equal(y, y_ref)
    binary = data.load_digits_7_vs_9("train", batch_size=32)
    assert binary.name == "digits[7,9]" and binary.num_classes == 2
    assert binary.num_examples == len(data.digits_arrays("train", classes=(7, 9))[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(split="validation"), "`split` must be 'train' or 'test', got 'validation'"),
        (dict(classes=(7,)), "at least two distinct digits"),
        (dict(classes=(7, 10)), "at least two distinct digits"),
        (dict(classes=(7, 7)), "at least two distinct digits"),
        (dict(test_fraction=1.0), "`test_fraction`"),
    ],
)
def test_digits_check_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.digits_arrays(**kwargs)


def test_random_minibatches_draw_with_replacement_reproducibly():
    from keras_thermo.data import random_minibatches

    x = np.arange(100, dtype="float32")[:, None]
    first = [b[0].numpy().ravel() for b in random_minibatches(x, x, 50, seed=1).take(400)]
    again = [b[0].numpy().ravel() for b in random_minibatches(x, x, 50, seed=1).take(2)]
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    # 20000 uniform draws over 100 items: each count is Binomial(20000, 1/100), mean 200, sd 14.
    counts = np.bincount(np.concatenate(first).astype(int), minlength=100)
    assert counts.min() > 200 - 5 * 14 and counts.max() < 200 + 5 * 14
    # With replacement: some batch repeats an item (a batch of 50 from 100 almost surely does).
    assert any(len(np.unique(batch)) < 50 for batch in first)
    full = next(iter(random_minibatches(x, x, 100, seed=0)))
    np.testing.assert_array_equal(full[0].numpy(), x)


def test_stratified_holdout_is_disjoint_complete_and_per_class():
    labels = np.repeat(np.arange(3), [10, 7, 4])
    kept, held_out = data.stratified_holdout(labels, 0.25, seed=3)
    assert not set(kept) & set(held_out) and sorted([*kept, *held_out]) == list(range(21))
    # floor(0.25 n_c + 1/2) per class: 10 -> 3 (2.5 rounds up), 7 -> 2, 4 -> 1.
    np.testing.assert_array_equal(np.bincount(labels[held_out], minlength=3), [3, 2, 1])
    again = data.stratified_holdout(labels, 0.25, seed=3)[1]
    other = data.stratified_holdout(labels, 0.25, seed=4)[1]
    np.testing.assert_array_equal(held_out, again)
    assert not np.array_equal(held_out, other)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(labels=[0.5, 1.0], fraction=0.5), "`labels` must be a 1-D array of integer labels"),
        (dict(labels=[[0, 1]], fraction=0.5), "`labels` must be a 1-D array"),
        (dict(labels=[0, 1], fraction=1.0), "`fraction`"),
        (dict(labels=[0, 1], fraction=-0.1), "`fraction`"),
    ],
)
def test_stratified_holdout_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.stratified_holdout(**kwargs)


def test_load_digits_examples_keeps_those_rows_in_order():
    x_train, y_train = data.digits_arrays("train")
    kept, held_out = data.stratified_holdout(y_train, 0.2, seed=0)
    part = data.load_digits("train", batch_size=1000, shuffle=False, examples=held_out[::-1])
    x, y, _ = collect(part.dataset)
    np.testing.assert_array_equal(x, x_train[held_out[::-1]])
    np.testing.assert_array_equal(y, y_train[held_out[::-1]])
    assert part.num_examples == len(held_out)
    for bad in ([], [len(y_train)], [-1], [0.5]):
        with pytest.raises(ValueError, match="`examples` must be a non-empty 1-D array of indices"):
            data.load_digits("train", batch_size=8, examples=np.array(bad))
