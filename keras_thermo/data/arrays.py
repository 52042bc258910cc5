"""The in-memory core every loader shares: `ClassificationData`, built from arrays by
`from_arrays`, and the per-epoch plan (order and noisy labels) of each pass over it.

Each pass over a returned dataset is one epoch: Keras' `fit` starts a new pass per epoch, and
pass `e` uses the deterministic plan `epoch_plan(labels, e, ...)`, so a run is reproducible from
its seed.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from keras_thermo._validation import check_bool, check_int, check_number, check_seed
from keras_thermo.data._minibatches import mark_with_replacement
from keras_thermo.data.labels import permute_labels


@dataclasses.dataclass(frozen=True)
class ClassificationData:
    """A batched classification dataset and its metadata.

    Attributes:
        dataset: `tf.data.Dataset` of `(x, y)` batches; `x` float32 `[b, *input_shape]`, `y`
            int64 `[b]`. Each pass over it is one epoch (new order and label noise).
        name: Dataset name, e.g. `"fashion_mnist"` or `"digits[7,9]"`.
        split: Split name, e.g. `"train"`.
        num_examples: Number of examples in one pass (the `N` of the potential).
        num_classes: Number of classes `K`; labels lie in `[0, K)`.
        input_shape: Shape of one example, e.g. `(28, 28, 1)`, `(784,)` with `flatten=True`.
        batch_size: Batch size (the last batch of a pass may be smaller).
        labels: `[num_examples]` int64 clean labels in storage order (before noise or shuffling).
    """

    dataset: tf.data.Dataset
    name: str
    split: str
    num_examples: int
    num_classes: int
    input_shape: tuple[int, ...]
    batch_size: int
    labels: np.ndarray

    @property
    def steps_per_epoch(self) -> int:
        return int(self.dataset.cardinality())


def epoch_plan(
    labels: Any, epoch: int, *, shuffle: bool, label_noise: float, seed: int, with_replacement: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The example order and the (noisy) labels of one epoch; pure and deterministic.

    Pass `epoch` (0-based) over a dataset built by this module yields examples
    `order[0], order[1], ...` with labels `epoch_labels[order[0]], ...`. Label noise draws from
    `np.random.default_rng((seed, epoch, 0))` and the order from
    `np.random.default_rng((seed, epoch, 1))`, so switching shuffling on or off does not
    change which labels are permuted.

    Args:
        labels: `[N]` clean labels.
        epoch: Epoch index, `>= 0`.
        shuffle: Whether to draw a random order (else `0..N-1`).
        label_noise: Fraction of labels permuted this epoch (`permute_labels`).
        seed: Base seed, an integer in `[0, 2**31)`.
        with_replacement: Draw the N positions independently and uniformly (each minibatch is
            then an independent draw: white gradient noise, as the samplers assume).

    Returns:
        `(order, epoch_labels)`: int64 `[N]` each; `epoch_labels` is indexed like `labels`.
    """
    clean = np.asarray(labels, dtype=np.int64)
    noisy = permute_labels(clean, label_noise, np.random.default_rng((seed, epoch, 0)))
    if with_replacement:
        order = np.random.default_rng((seed, epoch, 1)).integers(clean.shape[0], size=clean.shape[0])
    elif shuffle:
        order = np.random.default_rng((seed, epoch, 1)).permutation(clean.shape[0])
    else:
        order = np.arange(clean.shape[0])
    return order.astype(np.int64), noisy


class _EpochCounter:
    """Hands out epoch plans in order, one per pass over the dataset (thread-safe)."""

    def __init__(self, labels: np.ndarray, shuffle: bool, label_noise: float, seed: int, with_replacement: bool):
        self._with_replacement = with_replacement
        self._labels = labels
        self._shuffle = shuffle
        self._label_noise = label_noise
        self._seed = seed
        self._lock = threading.Lock()
        self.epochs_started = 0

    def next_plan(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            epoch = self.epochs_started
            self.epochs_started += 1
        return epoch_plan(
            self._labels,
            epoch,
            shuffle=self._shuffle,
            label_noise=self._label_noise,
            seed=self._seed,
            with_replacement=self._with_replacement,
        )


def from_arrays(
    x: Any,
    y: Any,
    *,
    batch_size: int,
    num_classes: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    label_noise: float = 0.0,
    flatten: bool = False,
    squeeze_channels: bool = False,
    scale: float | None = None,
    drop_remainder: bool = False,
    with_replacement: bool = False,
    examples: Sequence[int] | None = None,
    name: str = "arrays",
    split: str = "",
) -> ClassificationData:
    """Builds a `ClassificationData` from in-memory arrays.

    `x` stays in memory in its own dtype (uint8 images cost a quarter of float32) and each
    batch is gathered, cast to float32 and multiplied by `scale`. With `shuffle` or
    `label_noise`, every pass over the dataset draws its order and noisy labels from
    `epoch_plan(y, e, ...)`, `e` counting passes from 0; this runs in a `tf.numpy_function`
    once per pass, so such a dataset cannot be serialised into a graph.

    Args:
        x: `[N, ...]` features.
        y: `[N]` integer labels in `[0, num_classes)`.
        batch_size: Examples per batch, `>= 1`.
        num_classes: Number of classes; default `max(y) + 1`.
        shuffle: Draw a new example order every pass.
        seed: Seed of the order and the label noise, in `[0, 2**31)`; None draws one from
            fresh entropy (not reproducible).
        label_noise: Fraction of labels permuted at the start of every pass, in `[0, 1]`.
        flatten: Reshape each example to a vector.
        squeeze_channels: Drop a trailing channel axis of size 1: `(28, 28, 1) -> (28, 28)`,
            the row-sequence layout of `networks.fashion_mnist_lstm`.
        scale: Multiplier applied after the cast to float32; None for none.
        drop_remainder: Drop the last batch of a pass when it is smaller than `batch_size`.
        with_replacement: Every pass draws its N examples independently with replacement
            (`epoch_plan`), so minibatches are independent draws, as the samplers' thermostats and
            CCAdL/mCCAdL's covariance estimate assume; the dataset is marked for
            `BayesianModel.fit` (`mark_with_replacement`).
        examples: Keep only these examples (indices into `x` and `y`, in this order), e.g. the
            parts of a `stratified_holdout`; None keeps all.
        name: Name recorded in the metadata.
        split: Split recorded in the metadata.

    Returns:
        A `ClassificationData`.

    Example:
        >>> data = from_arrays(np.zeros((10, 3), "uint8"), np.arange(10) % 2, batch_size=4)
        >>> data.num_examples, data.num_classes, data.input_shape, data.steps_per_epoch
        (10, 2, (3,), 3)
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    seed = check_seed("seed", seed)
    if seed is None:  # Fresh entropy: a run that is not meant to be reproducible.
        seed = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
    label_noise = check_number("label_noise", label_noise, low=0.0, high=1.0, low_inclusive=True)
    with_replacement = check_bool("with_replacement", with_replacement)
    features = np.asarray(x)
    if features.ndim < 2 or features.shape[0] < 1:
        raise ValueError(f"`x` must be an array [N, ...] with N >= 1, got shape {features.shape}.")
    if not (np.issubdtype(features.dtype, np.number) and features.dtype != bool):
        raise TypeError(f"`x` must be numeric, got dtype {features.dtype}.")
    labels = np.asarray(y)
    if labels.shape != (features.shape[0],):
        raise ValueError(
            f"`y` must be a 1-D array with one label per example ({features.shape[0]}), "
            f"got shape {labels.shape}."
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"`y` must hold integers, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    if examples is not None:
        examples = np.asarray(examples)
        if examples.ndim != 1 or examples.size < 1 or not np.issubdtype(examples.dtype, np.integer) or (
            examples.min() < 0 or examples.max() >= features.shape[0]
        ):
            raise ValueError(
                f"`examples` must be a non-empty 1-D array of indices in [0, {features.shape[0]}), got "
                f"{examples if examples.size <= 10 else f'shape {examples.shape}'}."
            )
        features, labels = features[examples], labels[examples]
    if labels.min() < 0:
        raise ValueError(f"`y` must be non-negative class indices, got minimum {labels.min()}.")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    num_classes = check_int("num_classes", num_classes, low=1)
    if labels.max() >= num_classes:
        raise ValueError(
            f"`num_classes` must exceed every label; got num_classes={num_classes} but a label "
            f"{int(labels.max())}."
        )

    example_shape = features.shape[1:]
    if squeeze_channels:
        if example_shape[-1] != 1 or len(example_shape) < 2:
            raise ValueError(
                f"`squeeze_channels=True` needs examples with a trailing channel axis of size 1, "
                f"got example shape {example_shape}."
            )
        example_shape = example_shape[:-1]
    if flatten:
        example_shape = (int(np.prod(example_shape)),)
    example_shape = tuple(int(d) for d in example_shape)

    num_examples = features.shape[0]
    if shuffle or label_noise > 0 or with_replacement:
        counter = _EpochCounter(labels, shuffle, label_noise, seed, with_replacement)

        def one_pass(_: tf.Tensor) -> tf.data.Dataset:
            order, epoch_labels = tf.numpy_function(
                counter.next_plan, [], (tf.int64, tf.int64), stateful=True
            )
            order = tf.ensure_shape(order, [num_examples])
            epoch_labels = tf.ensure_shape(epoch_labels, [num_examples])
            return tf.data.Dataset.from_tensor_slices((order, tf.gather(epoch_labels, order)))

        indexed = tf.data.Dataset.range(1).flat_map(one_pass)
    else:
        indexed = tf.data.Dataset.from_tensor_slices((np.arange(num_examples), labels))

    stored = tf.constant(features)
    multiplier = None if scale is None else tf.constant(scale, tf.float32)

    def gather_batch(indices: tf.Tensor, batch_labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batch = tf.cast(tf.gather(stored, indices), tf.float32)
        if multiplier is not None:
            batch = batch * multiplier
        batch = tf.reshape(batch, tf.concat([tf.shape(indices), example_shape], axis=0))
        return batch, batch_labels

    num_batches = num_examples // batch_size if drop_remainder else -(-num_examples // batch_size)
    dataset = (
        indexed.batch(batch_size, drop_remainder=drop_remainder)
        .map(gather_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .apply(tf.data.experimental.assert_cardinality(num_batches))
        .prefetch(tf.data.AUTOTUNE)
    )
    if with_replacement:
        dataset = mark_with_replacement(dataset)
    return ClassificationData(
        dataset=dataset,
        name=name,
        split=split,
        num_examples=num_examples,
        num_classes=num_classes,
        input_shape=example_shape,
        batch_size=batch_size,
        labels=labels,
    )
