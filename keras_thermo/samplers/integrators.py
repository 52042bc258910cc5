"""The pieces every sampler is assembled from, as pure functions of lists of tensors.

Names follow the splitting literature (Leimkuhler & Matthews; Wei & Shang 2026, eq. 23):

- B `kick`:        p += tau F
- A `drift`:       theta += tau M^-1 p
- O `ornstein_uhlenbeck`: exact flow of dp = -xi p dt + sqrt(2 A T) M^1/2 dW over tau
- D `thermostat`:  xi += (tau / mu) (p.M^-1.p - Nd T)
- `euler_momentum`: the Euler step of SGHMC/SGNHT, p += h F - h xi p + sqrt(2 A T h) M^1/2 R

Samplers are sequences of these; a newcomer finds each rule here, once.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

Tensors = list[tf.Tensor]


def kick(momentum: Sequence[tf.Tensor], force: Sequence[tf.Tensor], tau) -> Tensors:
    """B: `p + tau F`."""
    return [p + tau * f for p, f in zip(momentum, force)]


def drift(params: Sequence[tf.Tensor], momentum: Sequence[tf.Tensor], tau, mass: float) -> Tensors:
    """A: `theta + tau M^-1 p` (scalar mass)."""
    return [theta + (tau / mass) * p for theta, p in zip(params, momentum)]


def ou_noise_std(xi, tau, noise_friction, temperature: float):
    """Std of the O step's noise per unit mass: `sqrt(A T (1 - exp(-2 xi tau)) / xi)`.

    Continuous in xi: tends to `sqrt(2 A T tau)` at xi = 0, and stays real for xi < 0 (both
    the numerator and the denominator change sign).
    """
    xi = tf.convert_to_tensor(xi, tf.float32)
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
    mass: float,
) -> Tensors:
    """O: `p <- exp(-xi tau) p + sqrt(A T (1 - exp(-2 xi tau)) / xi) M^1/2 R`.

    Args:
        momentum: p.
        noise: R, standard normal, one tensor per momentum tensor.
        xi: Friction of the decay (the thermostat for SGNHT-type samplers, A for Langevin).
        tau: Duration of the sub-step (h/2 in the symmetric splittings).
        noise_friction: A, which sets the injected noise `sqrt(2 A T)`.
        temperature: T.
        mass: Scalar M.
    """
    decay = tf.exp(-tf.cast(xi, tf.float32) * tau)
    std = ou_noise_std(xi, tau, noise_friction, temperature) * mass**0.5
    return [decay * p + std * r for p, r in zip(momentum, noise)]


def euler_momentum(
    momentum: Sequence[tf.Tensor],
    force: Sequence[tf.Tensor],
    noise: Sequence[tf.Tensor],
    xi,
    h,
    *,
    noise_friction,
    temperature: float,
    mass: float,
) -> Tensors:
    """Euler momentum step: `p + h F - h xi p + sqrt(2 A T h) M^1/2 R`."""
    std = tf.sqrt(2.0 * noise_friction * temperature * h * mass)
    return [p + h * f - h * xi * p + std * r for p, f, r in zip(momentum, force, noise)]


def twice_kinetic_energy(momentum: Sequence[tf.Tensor], mass: float) -> tf.Tensor:
    """`p.M^-1.p` as a float32 scalar."""
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(p, tf.float32))) for p in momentum]) / mass


def kinetic_temperature(momentum: Sequence[tf.Tensor], mass: float, num_params: int) -> tf.Tensor:
    """`p.M^-1.p / Nd`, which averages T at equilibrium."""
    return twice_kinetic_energy(momentum, mass) / float(num_params)


def thermostat(
    xi,
    momentum: Sequence[tf.Tensor],
    tau,
    *,
    thermal_mass: float,
    num_params: int,
    temperature: float,
    mass: float,
) -> tf.Tensor:
    """D: `xi + (tau / mu) (p.M^-1.p - Nd T)`: rises when the system runs hotter than T."""
    excess = twice_kinetic_energy(momentum, mass) - num_params * temperature
    return xi + (tau / thermal_mass) * excess
