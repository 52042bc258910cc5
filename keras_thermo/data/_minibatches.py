"""`fit`'s minibatch drawing: keyed streams drawn with replacement (`keyed_minibatches`), the
validation rows held out as Keras holds them out (`split_off_validation`), and the simple
endless streams of the samplers' tests and benchmarks (`random_minibatches`)."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_number


def random_minibatches(x, y, batch_size: int, *, seed: int, with_replacement: bool = True) -> tf.data.Dataset:
    """An endless stream of minibatches of `(x, y)`.

    With replacement (the default, and the papers' protocol), every minibatch is an independent
    draw, so the gradient noise is white, which is what thermostat theory assumes. Reshuffled
    epochs without replacement make the noise of the minibatches of one epoch sum to zero; with
    few minibatches per epoch that anti-correlation matters, and noise-absorbing thermostats
    (SGNHT) then over-damp and sample too cold. `batch_size == len(x)` gives the full batch.
    """
    num_examples = len(x)
    x, y = tf.constant(x), tf.constant(y)
    if batch_size >= num_examples:
        return mark_with_replacement(tf.data.Dataset.from_tensors((x, y)).repeat())  # no noise at all
    if not with_replacement:
        # One long epoch stream: per-epoch overhead would dominate a model this small.
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
            .repeat()
            .batch(batch_size, drop_remainder=True)
        )
    def draw(batch_index):
        # One stateless draw of a whole batch of indices: per-example tf.data work would cost
        # more than the step of a small model.
        indices = tf.random.stateless_uniform(
            [batch_size], seed=tf.stack([tf.constant(seed, tf.int64), batch_index]),
            maxval=num_examples, dtype=tf.int64,
        )
        return tf.gather(x, indices), tf.gather(y, indices)

    # `repeat()` makes the cardinality infinite, not 2^62: `fit` then reads no epoch of rows from it
    # (N must be given), where 2^62 batches passed for 2^62 x batch_size training examples.
    return mark_with_replacement(tf.data.Dataset.range(2**62).repeat().map(draw))


def mark_with_replacement(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks a dataset whose minibatches are independent draws, so `BayesianModel.fit` does not
    note that a pipeline's own batch order is used (the mark does not survive transformations)."""
    dataset.draws_with_replacement = True
    return dataset


def keyed_minibatches(data: Any, batch_size: int, *, seed: int, first_batch: Any = 0) -> tf.data.Dataset:
    """An endless stream of minibatches of the arrays in `data` (any nest), drawn with replacement.

    Batch k's indices are a pure function of `(seed, k)` (stream `STREAM_DATA` of
    `keras_thermo.random`), and the stream starts at batch `first_batch`: `BayesianModel.fit`
    passes its step counter, so a run continued by another `fit` call, or resumed from a
    checkpoint, draws the same minibatches as an uninterrupted run. `first_batch` may be a
    variable: it is read when iteration starts (after `BackupAndRestore` has restored it).

    Example:
        >>> import numpy as np
        >>> batches = keyed_minibatches((np.arange(10.0), np.arange(10)), 4, seed=0)
        >>> [tuple(t.shape) for t in next(iter(batches))]
        [(4,), (4,)]
    """
    leaves = [tf.convert_to_tensor(leaf) for leaf in tf.nest.flatten(data)]
    num_examples = int(leaves[0].shape[0])

    def draw(batch_index):
        key = kt_random.step_key(seed, batch_index, kt_random.STREAM_DATA)
        indices = tf.random.stateless_uniform([batch_size], seed=key, maxval=num_examples, dtype=tf.int64)
        return tf.nest.pack_sequence_as(data, [tf.gather(leaf, indices) for leaf in leaves])

    def from_first_batch(_):
        start = tf.cast(tf.convert_to_tensor(first_batch), tf.int64)
        return tf.data.Dataset.range(start, 2**62)

    return mark_with_replacement(tf.data.Dataset.from_tensors(0).flat_map(from_first_batch).map(draw))


def split_off_validation(arrays: Any, validation_split: float) -> tuple[Any, Any]:
    """`(training, validation)`: the last `validation_split` of the rows of every array in
    `arrays` (a nest) held out, as Keras' `fit(validation_split=...)` holds them out (before any
    shuffling, the first `floor(n (1 - validation_split))` rows train).

    Example:
        >>> import numpy as np
        >>> (x_train,), (x_val,) = split_off_validation((np.arange(10),), 0.2)
        >>> x_train.tolist(), x_val.tolist()
        ([0, 1, 2, 3, 4, 5, 6, 7], [8, 9])
    """
    split = check_number("validation_split", validation_split, low=0.0, high=1.0)
    leaves = tf.nest.flatten(arrays)
    num_rows = int(leaves[0].shape[0])
    cut = int(math.floor(num_rows * (1.0 - split)))
    if not 0 < cut < num_rows:
        raise ValueError(
            f"`validation_split` {validation_split!r} leaves {cut} of {num_rows} rows for training "
            f"and {num_rows - cut} for validation; both need at least one row."
        )
    return (
        tf.nest.pack_sequence_as(arrays, [leaf[:cut] for leaf in leaves]),
        tf.nest.pack_sequence_as(arrays, [leaf[cut:] for leaf in leaves]),
    )
