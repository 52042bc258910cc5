"""The step size chosen from the data (`step_size="auto"`, every sampler's default) and the
friction that follows it (`friction=None`, the default of SGHMC, SGNHT, CCAdL and mCCAdL).

Criterion (DESIGN section 4, "Automatic step size"). In the stiffest direction of the potential,
the largest eigenvalue `lambda` of `M^-1 H` (H the Hessian of `U` on a minibatch, M the mass),
the integrators oscillate with `omega = sqrt(lambda)`: they are stable only while
`h omega < 2`, and their discretisation bias there grows as `(h omega)^2` (about
`(h omega)^2 / 4` of the variance for the leapfrog-like and Euler kicks). The automatic step is
`h = STABILITY_FRACTION / sqrt(lambda)`: ten times inside the stability bound, a bias of about 1%
in that direction and less in every softer one. SGLD's `eps` and TACT-HMC's `eta` are squared
step sizes (`h^2 / M`), so theirs is `STABILITY_FRACTION^2 / lambda`. CCAdL's explicit
covariance friction adds its own bound, `h < 2 / sqrt(beta lambda_Sigma)`: its step is also at
most `NOISE_FRACTION` of that (`CCAdL.step_size_cap`), taken on every chain's minibatch where the
step freezes, at the window's end. Inside the window CCAdL runs without that friction and mCCAdL
without its C step (`ThermostatSampler.covariance_friction_weight`, which says why).

`lambda` is measured by power iteration with Hessian-vector products from finite differences of
the force (`largest_curvature`; the fused cross-entropy of TensorFlow has no second derivative,
so double back-propagation is not an option) on the step's minibatch, at the steps
`measurement_steps(W)` of the adaptation window W (the thermostat samplers' `warmup_steps`, else
`DEFAULT_ADAPTATION_STEPS`): curvature grows while the chain descends from its initialisation,
so it is measured again as the window goes on, and from its middle on the largest value seen is
kept. From step W on the step size is frozen: the chain after the window is one
time-homogeneous Markov chain, the papers' algorithm at that fixed step, started from where the
window left it, so it has the papers' invariant distribution.

Friction. `friction=None` gives `A = (1 - DEFAULT_MOMENTUM) / h` at every step, following the
step size (its schedule, or the automatic one), as the papers' configurations scale it (their
`A h` is 0.04-0.15). The constant is 0.01 (SGD momentum 0.99): the Euler friction of SGNHT and
CCAdL biases the configurational temperature by about `-1.1 A h` once the thermostat holds the
kinetic one at T (-11% at `A h = 0.1`, -4% at 0.03, within 1% at 0.01 on the linear-regression
check, `tests/test_auto_step.py`), and a weak friction also lets the soft directions move
ballistically instead of diffusing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from keras_thermo import random as kt_random

#: The `step_size` that asks for the automatic step size.
AUTO = "auto"

#: `h sqrt(lambda)` of the automatic step size: ten times inside the stability bound `2`.
STABILITY_FRACTION = 0.2

#: CCAdL's automatic step is at most this fraction of its covariance friction's stability bound.
NOISE_FRACTION = 0.5

#: `1 - A h` of `friction=None`: the momentum of the equivalent SGD (module doc).
DEFAULT_MOMENTUM = 0.99

#: The adaptation window of the samplers without a warm-up (SGLD, SGHMC, TACT-HMC) under
#: `step_size="auto"`.
DEFAULT_ADAPTATION_STEPS = 1000

#: Power iterations per measurement (each one force evaluation).
POWER_ITERATIONS = 20

#: The finite-difference displacement, relative to the weights' norm.
RELATIVE_DISPLACEMENT = 1e-3

def measurement_steps(window: int) -> list[int]:
    """The step counters at which the curvature is measured: 0, and W/4, W/2, 3W/4 and W of the
    adaptation window W (only 0 when W = 0).

    Example:
        >>> measurement_steps(1000)
        [0, 250, 500, 750, 1000]
    """
    if window <= 0:
        return [0]
    return sorted({0, window // 4, window // 2, (3 * window) // 4, window})


def default_friction(step_size) -> tf.Tensor:
    """`A = (1 - DEFAULT_MOMENTUM) / h`: the friction of `friction=None` at step size `h`."""
    return (1.0 - DEFAULT_MOMENTUM) / step_size


def largest_curvature(
    force_at: Callable[[list], list],
    params: Sequence[tf.Tensor],
    inverse_masses,
    *,
    seed: int,
    step: tf.Tensor,
    iterations: int = POWER_ITERATIONS,
) -> tf.Tensor:
    """The largest `|eigenvalue|` of `M^-1 H` at `params` (float32 scalar), H the Hessian of the
    potential whose force `force_at(theta)` returns (a list like `params`).

    Power iteration on `M^-1 H`, with `H v` from the one-sided difference
    `-(F(theta + e v) - F(theta)) / e` and the eigenvalue from the Rayleigh quotient
    `v.H.v / v.M.v` (M-symmetric, so it is exact at an eigenvector and a lower bound on the
    largest eigenvalue before that). `inverse_masses`: one scale (a float) or one per tensor.

    Example:
        >>> import tensorflow as tf
        >>> hessian = tf.constant([3.0, 100.0])  # U = sum(hessian * theta^2) / 2
        >>> lam = largest_curvature(lambda t: [-hessian * t[0]], [tf.constant([1.0, 1.0])], 1.0,
        ...                         seed=0, step=tf.constant(0, tf.int64))
        >>> round(float(lam))
        100
    """
    params = [tf.cast(p, tf.float32) for p in params]
    if not isinstance(inverse_masses, (list, tuple)):
        inverse_masses = [inverse_masses] * len(params)
    inverse_masses = [tf.cast(w, tf.float32) for w in inverse_masses]
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(p)) for p in params]))
    size = float(sum(p.shape.num_elements() for p in params))
    # Large enough that the difference stands well above float32 rounding of the force, small
    # enough to stay in the quadratic region (1e-3 of the weights, at least 1e-3 per scalar).
    displacement = RELATIVE_DISPLACEMENT * tf.maximum(norm, 1e-3 * size**0.5)
    base = [tf.cast(f, tf.float32) for f in force_at(params)]

    def normalized(vector):
        length = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(v)) for v in vector]))
        return [v / tf.maximum(length, 1e-30) for v in vector]

    def body(i, vector, estimate):
        moved = force_at([p + displacement * v for p, v in zip(params, vector)])
        product = [-(tf.cast(f, tf.float32) - f0) / displacement for f, f0 in zip(moved, base)]  # H v
        quotient = tf.add_n([tf.reduce_sum(v * hv) for v, hv in zip(vector, product)]) / tf.add_n(
            [tf.reduce_sum(v * v / w) for v, w in zip(vector, inverse_masses)]
        )
        return i + 1, normalized([w * hv for w, hv in zip(inverse_masses, product)]), tf.abs(quotient)

    start = normalized(kt_random.normal_like(kt_random.step_key(seed, step, kt_random.STREAM_CURVATURE), params))
    _, _, estimate = tf.while_loop(
        lambda i, *_: i < iterations, body, (tf.constant(0), start, tf.constant(0.0)),
        parallel_iterations=1,
    )
    return estimate


def step_for_curvature(sampler, curvature):
    """`STABILITY_FRACTION / sqrt(lambda)` for a time step, its square for a squared one
    (`Sampler.step_size_is_time`); `curvature` a float or a tensor."""
    if sampler.step_size_is_time:
        return STABILITY_FRACTION / curvature**0.5
    return STABILITY_FRACTION**2 / curvature


def stability_bound(sampler, curvature: float) -> float:
    """The largest stable step size for the curvature `lambda`: `2 / sqrt(lambda)` for a time
    step, `4 / lambda` for a squared one (SGLD's `eps / 2` kick)."""
    return 2.0 / curvature**0.5 if sampler.step_size_is_time else 4.0 / curvature


def choose_step_size(sampler, state, force_at, params, context, cross, *, step_size_variable, curvature_variable,
                     other_chains=()):
    """The step of `BayesianModel` that keeps an automatic step size: at the measurement steps
    of the adaptation window (`measurement_steps(sampler.adaptation_steps)`), measures the
    largest curvature of `M^-1 H` at `params` on the step's minibatch (`force_at(theta)`: its
    force at `theta`), keeps the largest from the window's middle on, and assigns the step size
    `step_for_curvature` gives for it; at the window's end, where the step size freezes, lowers
    it to `sampler.step_size_cap` where that is smaller (CCAdL's noise bound, whose friction
    starts there). Run before the sampler's update, which reads `step_size_variable`. Returns
    the curvature the step size comes from (float32).

    A step size the user gave (a float) is only measured against, at the same steps: the model
    warns when it is above `stability_bound` (`step_size_variable` None).

    Chains: the curvature is measured on the first chain (`state`, `params`, `context`); the cap
    is the smallest over it and `other_chains`, `(state, params, context)` of each other chain,
    since one step size serves them all and each chain's gradient noise is its own.

    Replicas: each measures the curvature of its share of U (its slice of the batch, `U / r`
    each), and the shares' curvatures are summed (one scalar all-reduce per step, outside the
    branch: a cross-replica exchange inside `tf.cond` or the power iteration's loop is refused
    by `tf.distribute`), so every replica sets the same step size. The sum estimates the whole
    batch's largest curvature from slices of it (an upper bound of the curvature of their sum):
    not the single device's figure (25% above it on `tests/test_distribute.py`'s regression).
    """
    window = sampler.adaptation_steps
    measure = tf.reduce_any(tf.equal(state.step, tf.constant(measurement_steps(window), tf.int64)))
    masses = sampler.masses(state.preconditioner)
    inverse_masses = [1.0 / m for m in masses] if isinstance(masses, (list, tuple)) else 1.0 / masses
    curvature = tf.cond(
        measure,
        lambda: largest_curvature(force_at, params, inverse_masses, seed=context.seed, step=state.step),
        lambda: tf.constant(0.0),
    )
    curvature = cross.sum(curvature)
    # Curvature grows while the chain descends: from the window's middle on keep the largest seen.
    keep_largest = tf.logical_and(state.step > 0, state.step >= window // 2)
    curvature = tf.where(keep_largest, tf.maximum(curvature, curvature_variable), curvature)
    if step_size_variable is None:
        measured = tf.logical_and(measure, tf.logical_and(tf.math.is_finite(curvature), curvature > 0))
    else:
        step_size = tf.cast(step_for_curvature(sampler, curvature), tf.float32)
        # A failed measurement (non-finite, e.g. a diverged force) keeps the last step size.
        measured = tf.logical_and(measure, tf.logical_and(tf.math.is_finite(step_size), step_size > 0))
        step_size = tf.where(measured, step_size, tf.convert_to_tensor(step_size_variable))
        # Outside a branch: CCAdL's bound reads per-example statistics its update computes anyway.
        cap = sampler.step_size_cap(context, params, masses)
        for other_state, other_params, other_context in other_chains if cap is not None else ():
            cap = tf.minimum(cap, sampler.step_size_cap(other_context, other_params, sampler.masses(other_state.preconditioner)))
        if cap is not None:
            cap = tf.cast(cap, tf.float32)
            capped = tf.logical_and(tf.equal(state.step, window), tf.logical_and(tf.math.is_finite(cap), cap > 0))
            step_size = tf.where(capped, tf.minimum(step_size, cap), step_size)
        step_size_variable.assign(step_size)
    curvature = tf.where(measured, curvature, tf.convert_to_tensor(curvature_variable))
    curvature_variable.assign(curvature)
    return curvature
