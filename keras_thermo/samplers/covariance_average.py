"""The moving-average gradient-noise covariance shared by CCAdL and mCCAdL's `covariance="diag"`.

    I_t = (1 - k_t) I_{t-1} + k_t V(theta_t),   V = Gc^T Gc / (n - 1),

`k_t = 1/t` counted from the papers' start (`ThermostatSampler.steps_since_start`: `k = 1` at the
restart after the warm-up, which forgets the warm-up's covariance), or `max(1/t, 1/W)` with a
window W: an exponential average over about the last W steps. Kept in float64: in float32 a 1/t
update is quantised by ~5% at t = 1e6 and stops moving near t = 1e7.

Why an average and not the minibatch's own `V` (the mCCAdL paper's listing): where a few
examples carry most of the gradient noise (a net's logits once most examples are fitted), the
minibatch's `V` is large exactly when its kick is, and a covariance step fed that `V` damps the
kick it has just received (cold, in the one-coordinate model of
`benchmarks/lab/c_step_heat_balance.py --per-example`); another minibatch's `V` is independent
of the kick but usually small, and the exact exponential cannot remove more than all of the
momentum on the rare large one (hot). Which wins depends on the noise and the step (the heavy-
tailed regression of `tests/test_statistical_ccadl.py` runs hot). An average over many
minibatches is close to the true covariance and nearly independent of any one kick.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from keras_thermo.samplers import integrators


def average_weight(steps_since_start: tf.Tensor, window: int | None) -> tf.Tensor:
    """`k_t` (float64) for the step `steps_since_start` (0 at the start: `k = 1`).

    Example:
        >>> import tensorflow as tf
        >>> [round(float(average_weight(tf.constant(s, tf.int64), 4)), 3) for s in (0, 1, 9)]
        [1.0, 0.5, 0.25]
    """
    weight = 1.0 / tf.cast(steps_since_start + 1, integrators.THERMOSTAT_DTYPE)
    if window is None:
        return weight
    return tf.maximum(weight, tf.constant(1.0 / window, integrators.THERMOSTAT_DTYPE))


def sampler_weight(sampler, step: tf.Tensor) -> tf.Tensor:
    """`k_t` of the step whose state has counter `step` for a `ThermostatSampler` with a
    `covariance_window` (CCAdL, mCCAdL): counted from its restart after the warm-up."""
    return average_weight(sampler.steps_since_start(step), sampler.covariance_window)


def zeros_like_variables(params: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The diagonal average's initial state: float64 zeros shaped like each variable."""
    return [tf.zeros(p.shape, integrators.THERMOSTAT_DTYPE) for p in params]


def diagonal_average(average: Sequence[tf.Tensor], per_example, params, weight: tf.Tensor) -> list[tf.Tensor]:
    """`(1 - k) I + k diag(V)` per variable (float64), `V` from `per_example`'s minibatch."""
    current = per_example.variable_diagonal_covariances(params)
    return [(1.0 - weight) * old + weight * tf.cast(new, integrators.THERMOSTAT_DTYPE)
            for old, new in zip(average, current)]
