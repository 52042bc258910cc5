"""Step-keyed Gaussian noise.

Every random draw is a pure function of (seed, step, stream), drawn with TensorFlow's stateless
generators. The only random state is therefore the seed (in the model config) and the step
counter (a model variable): a resumed run continues the exact noise sequence, and replicas that
share the step draw identical noise.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

# Streams keep draws made in the same step independent of one another.
STREAM_INIT = 0
STREAM_MOMENTUM = 1
STREAM_MOMENTUM_2 = 2
STREAM_TEMPERING = 3
STREAM_TEMPERING_INIT = 4
STREAM_DATA = 5  # minibatch indices drawn by `BayesianModel.fit` from arrays
STREAM_PRIOR = 16  # hyperparameter draws of priors (`keras_thermo.priors.HierarchicalGaussian`)


def step_key(seed: int, step: tf.Tensor, stream: int) -> tf.Tensor:
    """Returns a stateless RNG key `[2] int32` for `(seed, step, stream)`.

    Example:
        >>> k = step_key(0, tf.constant(3, tf.int64), STREAM_MOMENTUM)
        >>> k.shape
        TensorShape([2])
    """
    base = tf.constant([seed, stream], dtype=tf.int32)
    step = tf.cast(step, tf.int32)
    return tf.random.experimental.stateless_fold_in(base, step)


def normal_like(key: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Independent standard normal draws shaped like each tensor in `tensors`.

    Args:
        key: A stateless key from `step_key`.
        tensors: Tensors (or variables) whose shapes and float dtypes the draws copy.

    Returns:
        A list of tensors, one per input, with i.i.d. N(0, 1) entries.
    """
    draws = []
    for index, like in enumerate(tensors):
        sub_key = tf.random.experimental.stateless_fold_in(key, index)
        draws.append(tf.random.stateless_normal(tf.shape(like), seed=sub_key, dtype=like.dtype))
    return draws
