"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011).

Update (DESIGN section 4): `theta += (eps_t / 2) F + sqrt(eps_t T) R`, with `eps_t` constant or
from a schedule (`keras_thermo.schedules.PolynomialDecay` gives the paper's `a (b + t)^-gamma`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo.samplers import integrators
from keras_thermo.samplers.base import Sampler, StepContext, num_scalars


class SGLDState(NamedTuple):
    step: tf.Tensor
    preconditioner: tuple = ()


@keras.saving.register_keras_serializable(package="keras_thermo")
class SGLD(Sampler):
    """Stochastic gradient Langevin dynamics.

    SGLD has no momentum; its logged `kinetic_temperature` is that of the velocity
    `v = dtheta / sqrt(eps)`, i.e. `|dtheta|^2 / (eps Nd)`. It equals T + eps |F|^2 / (4 Nd) in
    expectation: T when the step is small enough for the noise to dominate the drift, and well
    above T when the step is too large for SGLD to be accurate.

    With a preconditioner (diagonal mass M, `keras_thermo.samplers.preconditioning`) the step
    is `theta += (eps/2) M^-1 F + sqrt(eps T) M^-1/2 R` and the kinetic temperature that of
    `M^1/2 dtheta / sqrt(eps)`.

    Args:
        step_size: eps, a positive float, a `LearningRateSchedule` of the step count, or `"auto"`
            (the default: `0.04 / lambda` for the largest curvature lambda measured during the
            first 1000 steps, then frozen; `samplers.auto_step`).
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (pSGLD,
            approximate) or a `preconditioning.Preconditioner`.

    Example:
        >>> import keras_thermo as kt
        >>> sampler = kt.samplers.SGLD(step_size=kt.schedules.PolynomialDecay(1e-3, 1.0, 0.55))

    Reference:
        M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
        ICML 2011, eq. 4.
    """

    name = "sgld"
    #: eps = h^2: the automatic step size is `STABILITY_FRACTION^2 / lambda`.
    step_size_is_time = False

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> SGLDState:
        del temperature, seed
        return SGLDState(step=tf.constant(0, tf.int64), preconditioner=self.init_preconditioner(params))

    def update(self, state: SGLDState, params, force, context: StepContext):
        eps = self.step_size_at(state.step)
        noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
        noise_std = tf.sqrt(eps * context.temperature)
        mass, preconditioner, _ = self.precondition(state, force)
        if self.preconditioner is None:
            increments = [0.5 * eps * f + noise_std * r for f, r in zip(force, noise)]
            kinetic = integrators.kinetic_temperature(increments, eps, num_scalars(params))
        else:
            increments = [(0.5 * eps / m) * f + (noise_std / tf.sqrt(m)) * r for f, r, m in zip(force, noise, mass)]
            kinetic = self._velocity_temperature(increments, eps, mass)
        new_params = [theta + d for theta, d in zip(params, increments)]
        diagnostics = {"kinetic_temperature": kinetic, "step_size": eps}
        return new_params, SGLDState(step=state.step + 1, preconditioner=preconditioner), diagnostics

    @staticmethod
    def _velocity_temperature(increments, eps, mass) -> tf.Tensor:
        """`dtheta.M.dtheta / (eps n)`: with `v = M dtheta / sqrt(eps)` this is `v.M^-1.v / n`."""
        weighted = [m * d for m, d in zip(mass, increments)]
        return integrators.twice_kinetic_energy(weighted, list(mass)) / (eps * float(num_scalars(increments)))

    def variable_kinetic_temperatures(self, new_state: SGLDState, params, new_params):
        """Per variable, that of the velocity `dtheta / sqrt(eps)`: `|dtheta_v|^2 / (eps n_v)`."""
        eps = self.step_size_at(new_state.step - 1)
        if self.preconditioner is None:
            return [
                integrators.kinetic_temperature([new - old], eps, num_scalars([old]))
                for old, new in zip(params, new_params)
            ]
        masses = self.masses(new_state.preconditioner)
        return [self._velocity_temperature([new - old], eps, [m]) for old, new, m in zip(params, new_params, masses)]
