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


def configurational_temperature(params, force) -> tf.Tensor:
    """`-theta . F / Nd` with the step's own force: averages T at equilibrium for any sampler
    (integration by parts of `theta . grad U` against `exp(-U/T)`), unlike the kinetic temperature,
    which a thermostat holds at T by construction. One step's value is noisy (minibatch force);
    its running average is the check.

    The terms cancel (the value crosses zero while they reach `|theta . F| / Nd`), so they are
    summed in float64; each product is rounded to float32 first (an error of at most `2^-24`
    of `sum |theta_i F_i|`, far below one step's minibatch noise), which halves the cost of
    casting both factors (`python -m benchmarks.lab.step_pieces`)."""
    total = tf.add_n([tf.reduce_sum(tf.cast(theta * tf.cast(f, theta.dtype), tf.float64)) for theta, f in zip(params, force)])
    return tf.cast(-total / float(sum(p.shape.num_elements() for p in params)), tf.float32)


def variable_configurational_temperatures(params, force) -> list[tf.Tensor]:
    """`-theta_v . F_v / n_v` per variable (float64), with the step's force `F = -grad U`: each
    product rounded to float32 and summed in float64, as `configurational_temperature` does (one
    float32 product instead of two float64 copies of every weight and force)."""
    return [
        -tf.reduce_sum(tf.cast(theta * tf.cast(f, theta.dtype), tf.float64)) / float(np.prod(theta.shape))
        for theta, f in zip(params, force)
    ]
