"""The temperatures of a chain, in one place: the kinetic temperature `p.M^-1.p / Nd`, which a
thermostat holds at T by construction, and the configurational temperature `-theta . F / Nd`,
which averages T at equilibrium for any sampler and which nothing forces there (integration by
parts of `theta . grad U` against `exp(-U/T)`), for the whole net and per variable. The
samplers log the kinetic one, the train step the configurational one, and
`keras_thermo.equilibration` judges both.

Example:
    >>> import tensorflow as tf
    >>> float(kinetic_temperature([tf.constant([1.0, 2.0])], 1.0, 2))
    2.5
    >>> float(configurational_temperature([tf.constant([1.0, 2.0])], [tf.constant([-1.0, -2.0])]))
    2.5
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf


def twice_kinetic_energy(momentum: Sequence[tf.Tensor], mass) -> tf.Tensor:
    """`p.M^-1.p` as a float32 scalar."""
    if isinstance(mass, (list, tuple)):
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(p, tf.float32)) / m) for p, m in zip(momentum, mass)])
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(p, tf.float32))) for p in momentum]) / mass


def kinetic_temperature(momentum: Sequence[tf.Tensor], mass, num_params: int) -> tf.Tensor:
    """`p.M^-1.p / Nd`, which averages T at equilibrium."""
    return twice_kinetic_energy(momentum, mass) / float(num_params)


def _dot(theta: tf.Tensor, force: tf.Tensor) -> tf.Tensor:
    """`theta . F` as a float64 scalar: the products in float32 (float64 for float64 weights),
    summed along the last axis in that dtype (a row of m terms to within about
    `m 2^-24 sum_row |theta_i F_i|` in float32, far less in practice: TensorFlow sums in blocks;
    a rank-1 variable is one row), the rows in float64. The terms
    cancel (the total crosses zero while they reach `|theta . F|`), hence float64 across rows;
    casting every product to float64 first cost several times more on a CPU (a weight-sized
    float64 array written and read back; `python -m benchmarks.lab.step_pieces`)."""
    dtype = tf.float64 if theta.dtype == tf.float64 else tf.float32  # float16 products would overflow
    product = tf.cast(theta, dtype) * tf.cast(force, dtype)
    if product.shape.rank is not None and product.shape.rank >= 2:
        return tf.reduce_sum(tf.cast(tf.reduce_sum(product, axis=-1), tf.float64))
    return tf.cast(tf.reduce_sum(product), tf.float64)


def configurational_temperature(params, force) -> tf.Tensor:
    """`-theta . F / Nd` with the step's own force: averages T at equilibrium for any sampler
    (integration by parts of `theta . grad U` against `exp(-U/T)`), unlike the kinetic temperature,
    which a thermostat holds at T by construction. One step's value is noisy (minibatch force);
    its running average is the check. The sums as in `_dot`."""
    total = tf.add_n([_dot(theta, f) for theta, f in zip(params, force)])
    return tf.cast(-total / float(sum(p.shape.num_elements() for p in params)), tf.float32)


def variable_configurational_temperatures(params, force) -> list[tf.Tensor]:
    """`-theta_v . F_v / n_v` per variable (float64), with the step's force `F = -grad U`, summed
    as in `_dot`."""
    return [-_dot(theta, f) / float(np.prod(theta.shape)) for theta, f in zip(params, force)]
