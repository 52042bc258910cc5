"""The pieces every sampler is assembled from, as pure functions of lists of tensors.

Names follow the splitting literature (Leimkuhler & Matthews; Wei & Shang 2026, eq. 23):

- B `kick`:        p += tau F
- A `drift`:       theta += tau M^-1 p
- O `ornstein_uhlenbeck`: exact flow of dp = -xi p dt + sqrt(2 A T) M^1/2 dW over tau
- D `thermostat`:  xi += (tau / mu) (p.M^-1.p - Nd T), accumulated in float64
- `euler_momentum`: the Euler step of SGHMC/SGNHT, p += h F - h xi p + sqrt(2 A T h) M^1/2 R
- `symmetric_step`: the splitting B A O D [C] D O A B of SGNHT (symmetric) and mCCAdL

Samplers are sequences of these; a newcomer finds each rule here, once.

`mass` is the scalar M (a Python float), or a diagonal mass given per trainable tensor (a list of
float32 tensors, each a scalar or shaped like its tensor; `keras_thermo.samplers.preconditioning`):
every piece then uses `M^-1 p`, `p.M^-1.p` and `M^1/2` noise. A scalar mass keeps the
scalar code path unchanged.

Thermostats are float64: one scalar for the whole net, or one per trainable tensor (a vector
`[V]`, `per_variable_thermostat=True`; `thermostat_kwargs`' `variable_sizes` then gives each
tensor's size, and the O steps and friction apply each tensor's own xi). With the paper configs' friction (xi ~ A = 434-1061) and step
sizes (h ~ 1.3e-4) one D step moves xi by `h (K - T)`, which is below half a float32 ulp of xi
unless the kinetic temperature is off by 13-43%: a float32 thermostat would stay frozen at A and
turn SGNHT into SGHMC. Momenta and weights stay float32; xi is cast where it multiplies them.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from keras_thermo.random import STREAM_MOMENTUM, STREAM_MOMENTUM_2
from keras_thermo.temperatures import kinetic_temperature, twice_kinetic_energy  # noqa: F401 (the samplers' names)

Tensors = list[tf.Tensor]

#: dtype of every thermostat variable (xi, TACT-HMC's z) and running average (see module doc).
THERMOSTAT_DTYPE = tf.float64


def as_float32(value) -> tf.Tensor:
    """A float64 thermostat value (or a Python number) as float32, to multiply momenta with."""
    return tf.cast(value, tf.float32)


def per_tensor(mass, count: int) -> list:
    """The mass of each of `count` tensors: the scalar repeated, or the given diagonal masses."""
    if isinstance(mass, (list, tuple)):
        if len(mass) != count:
            raise ValueError(f"{len(mass)} masses were given for {count} tensors.")
        return list(mass)
    return [mass] * count


def per_variable(value, count: int) -> list:
    """`value` (a scalar, or a vector `[count]` of per-tensor values) as one value per tensor: a
    scalar is repeated, so the shared thermostat's arithmetic is unchanged."""
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 0:
        return [value] * count
    return tf.unstack(value, num=count)


def kick(momentum: Sequence[tf.Tensor], force: Sequence[tf.Tensor], tau) -> Tensors:
    """B: `p + tau F`."""
    return [p + tau * f for p, f in zip(momentum, force)]


def drift(params: Sequence[tf.Tensor], momentum: Sequence[tf.Tensor], tau, mass) -> Tensors:
    """A: `theta + tau M^-1 p`."""
    return [theta + (tau / m) * p for theta, p, m in zip(params, momentum, per_tensor(mass, len(params)))]


def ou_noise_std(xi, tau, noise_friction, temperature: float):
    """Std of the O step's noise per unit mass: `sqrt(A T (1 - exp(-2 xi tau)) / xi)`.

    Continuous in xi: tends to `sqrt(2 A T tau)` at xi = 0, and stays real for xi < 0 (both
    the numerator and the denominator change sign).
    """
    xi = as_float32(xi)
    two_tau = 2.0 * tau
    small = tf.abs(xi * two_tau) < 1e-4
    safe_xi = tf.where(small, tf.ones_like(xi), xi)
    # -expm1(-2 xi tau) / xi, with its Taylor series 2 tau (1 - xi tau) near xi = 0.
    ratio = tf.where(small, two_tau * (1.0 - xi * tau), -tf.math.expm1(-two_tau * safe_xi) / safe_xi)
    return tf.sqrt(noise_friction * temperature * ratio)


def ornstein_uhlenbeck(
    momentum: Sequence[tf.Tensor],
    noise: Sequence[tf.Tensor],
    xi,
    tau,
    *,
    noise_friction,
    temperature: float,
    mass,
) -> Tensors:
    """O: `p <- exp(-xi tau) p + sqrt(A T (1 - exp(-2 xi tau)) / xi) M^1/2 R`.

    Args:
        momentum: p.
        noise: R, standard normal, one tensor per momentum tensor.
        xi: Friction of the decay (the thermostat for SGNHT-type samplers, A for Langevin): a
            scalar, or one per tensor (a vector).
        tau: Duration of the sub-step (h/2 in the symmetric splittings).
        noise_friction: A, which sets the injected noise `sqrt(2 A T)`.
        temperature: T.
        mass: Scalar M.
    """
    count = len(momentum)
    decays = per_variable(tf.exp(-as_float32(xi) * tau), count)
    stds = per_variable(ou_noise_std(xi, tau, noise_friction, temperature), count)
    masses = per_tensor(mass, count)
    return [decay * p + (std * m**0.5) * r for p, r, m, decay, std in zip(momentum, noise, masses, decays, stds)]


def euler_momentum(
    momentum: Sequence[tf.Tensor],
    force: Sequence[tf.Tensor],
    noise: Sequence[tf.Tensor],
    xi,
    h,
    *,
    noise_friction,
    temperature: float,
    mass,
) -> Tensors:
    """Euler momentum step: `p + h F - h xi p + sqrt(2 A T h) M^1/2 R` (xi a scalar, or one per
    tensor)."""
    frictions = per_variable(h * as_float32(xi), len(momentum))
    stds = [tf.sqrt(2.0 * noise_friction * temperature * h * m) for m in per_tensor(mass, len(momentum))]
    return [p + h * f - friction * p + std * r for p, f, r, std, friction in zip(momentum, force, noise, stds, frictions)]


def thermostat(
    xi,
    momentum: Sequence[tf.Tensor],
    tau,
    *,
    thermal_mass: float,
    num_params: int,
    temperature: float,
    mass,
    variable_sizes=None,
) -> tf.Tensor:
    """D: `xi + (tau / mu) (p.M^-1.p - Nd T)`: rises when the system runs hotter than T.

    Returns float64 (a scalar, or one per tensor with `variable_sizes`): the increment is formed
    and added in float64 (module doc), so a 1% temperature error moves xi even when xi is in
    the hundreds.
    """
    return thermostat_from_energy(
        xi, thermostat_energy(momentum, mass, variable_sizes), tau,
        thermal_mass=thermal_mass, num_params=num_params, temperature=temperature, variable_sizes=variable_sizes,
    )


def thermostat_energy(momentum: Sequence[tf.Tensor], mass, variable_sizes=None) -> tf.Tensor:
    """`p.M^-1.p` that the thermostat reads: the whole net's (a scalar), or each tensor's (a
    vector `[V]`) when `variable_sizes` is given (one thermostat per tensor)."""
    if variable_sizes is None:
        return twice_kinetic_energy(momentum, mass)
    masses = per_tensor(mass, len(momentum))
    return tf.stack([tf.reduce_sum(tf.square(tf.cast(p, tf.float32)) / m) for p, m in zip(momentum, masses)])


def thermostat_kinetic(energy, num_params: int, variable_sizes=None) -> tf.Tensor:
    """The kinetic temperature of `thermostat_energy`'s `energy`: the whole net's, or each
    tensor's `p_v.M^-1.p_v / n_v`."""
    if variable_sizes is None:
        return energy / float(num_params)
    return energy / tf.constant(variable_sizes, energy.dtype)


def whole_net_kinetic(kinetic, variable_sizes=None) -> tf.Tensor:
    """The whole net's kinetic temperature from `thermostat_kinetic`'s value (the size-weighted
    mean of the per-tensor values), the figure every sampler logs."""
    if variable_sizes is None:
        return kinetic
    sizes = tf.constant(variable_sizes, kinetic.dtype)
    return tf.reduce_sum(kinetic * sizes) / tf.reduce_sum(sizes)


def thermostat_from_energy(
    xi, twice_kinetic, tau, *, thermal_mass: float, num_params: int, temperature, mass=None, variable_sizes=None
):
    """`thermostat` given `p.M^-1.p` already computed (`thermostat_energy`; the symmetric step
    also logs it). One thermostat per tensor (`variable_sizes`): tensor v's
    `xi_v + (tau / mu_v) (p_v.M^-1.p_v - n_v T)` with `mu_v = mu n_v / Nd`, so each xi_v moves
    at the rate the shared xi would (`tau (K_v - T)` for the default `mu = Nd`)."""
    del mass  # already in `twice_kinetic`
    f64 = THERMOSTAT_DTYPE
    if variable_sizes is None:
        excess = tf.cast(twice_kinetic, f64) - num_params * tf.cast(temperature, f64)
        return tf.cast(xi, f64) + (tf.cast(tau, f64) / thermal_mass) * excess
    sizes = tf.constant(variable_sizes, f64)
    excess_per_scalar = tf.cast(twice_kinetic, f64) / sizes - tf.cast(temperature, f64)
    return tf.cast(xi, f64) + (tf.cast(tau, f64) * (float(num_params) / thermal_mass)) * excess_per_scalar


def opening_kick_scale(step: tf.Tensor) -> tf.Tensor:
    """1 for a merged closing + opening half kick, 1/2 on the first step (nothing to close)."""
    return tf.where(tf.equal(step, 0), 0.5, 1.0)


def symmetric_step(
    state, params, force, h, context, *, ou_kwargs, thermostat_kwargs, covariance_step=None, fresh_start=False
):
    """One step of the symmetric splitting B A O D [C] D O A B, with one force per step.

    Shared by SGNHT (`integrator="symmetric"`, no C step) and mCCAdL (with its C step). The
    closing half kick of step t and the opening half kick of step t+1 use the same force, so this
    applies one kick `h F(theta_t)` (`h F / 2` on the very first step), then A O D [C] D O A. With
    a step-size schedule the merged kick uses the current h for both halves (an O(h_t - h_{t-1})
    departure from the exact splitting).

    Args:
        state: A state with `step`, `momentum` and `xi`.
        params, force: theta and F(theta), lists of tensors.
        h: Step size.
        context: The step's `StepContext` (its `normal` draws the O steps' noise).
        ou_kwargs: Keyword arguments of `ornstein_uhlenbeck` (A, T, M).
        thermostat_kwargs: Keyword arguments of `thermostat` (mu, Nd, T, M).
        covariance_step: Optional `momentum -> (momentum, extras)`, the C step.
        fresh_start: Whether `state.momentum` was just drawn afresh (a restart after the warm-up,
            `ThermostatSampler.restart_after_warmup`): like the first step, there is no closing
            half kick to merge, so the kick is `h F / 2`.

    Returns:
        `(params, momentum, xi, kinetic_temperature, extras)`. `kinetic_temperature` is the mean
        of the kinetic temperatures the two D steps see (before and after C), whose average over
        the run the thermostat holds at T (`whole_net_kinetic` of it is the value to log; it is
        per tensor with one thermostat per tensor). Without a C step both are the same.
    """
    half = 0.5 * h
    mass = ou_kwargs["mass"]
    first_step = tf.logical_or(tf.equal(state.step, 0), fresh_start)
    momentum = kick(state.momentum, force, tf.where(first_step, 0.5, 1.0) * h)  # B B
    new_params = drift(params, momentum, half, mass)  # A
    noise = context.normal(state.step, params, STREAM_MOMENTUM)
    momentum = ornstein_uhlenbeck(momentum, noise, state.xi, half, **ou_kwargs)  # O
    variable_sizes = thermostat_kwargs.get("variable_sizes")
    energy = thermostat_energy(momentum, mass, variable_sizes)
    xi = thermostat_from_energy(state.xi, energy, half, **thermostat_kwargs)  # D
    extras = None
    if covariance_step is not None:
        momentum, extras = covariance_step(momentum)  # C
        energy_after_c = thermostat_energy(momentum, mass, variable_sizes)
        xi = thermostat_from_energy(xi, energy_after_c, half, **thermostat_kwargs)  # D
        energy = 0.5 * (energy + energy_after_c)
    else:
        xi = thermostat_from_energy(xi, energy, half, **thermostat_kwargs)  # D
    kinetic = thermostat_kinetic(energy, thermostat_kwargs["num_params"], variable_sizes)
    noise = context.normal(state.step, params, STREAM_MOMENTUM_2)
    momentum = ornstein_uhlenbeck(momentum, noise, xi, half, **ou_kwargs)  # O
    new_params = drift(new_params, momentum, half, mass)  # A; the closing B opens the next step
    return new_params, momentum, xi, kinetic, extras
