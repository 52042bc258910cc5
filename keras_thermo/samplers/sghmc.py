"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, 2014), the papers' baseline.

Update (DESIGN section 4, with the noise estimate Bhat = 0):
`p += h F - h A p + sqrt(2 A T h) M^1/2 R;  theta += h M^-1 p`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_optional_positive, check_positive
from keras_thermo.samplers import auto_step, integrators
from keras_thermo.samplers.base import FloatSetting, Sampler, StepContext, num_scalars, sample_momentum


class SGHMCState(NamedTuple):
    step: tf.Tensor
    momentum: list
    preconditioner: tuple = ()


@keras.saving.register_keras_serializable(package="keras_thermo")
class SGHMC(Sampler):
    """SGHMC with Euler integration and no gradient-noise correction.

    Exact (to first order in h) only when the minibatch gradient noise is negligible next to the
    injected noise `2 A T h`; otherwise it samples a hotter distribution.

    Mapping to learning-rate terms for the mean loss: `lr = h^2 N`, `momentum = 1 - A h`.

    Args:
        step_size: h, a positive float, a `LearningRateSchedule`, or `"auto"` (the default:
            measured from the curvature during the warm-up, then frozen; `samplers.auto_step`).
        friction: A > 0; None (the default) follows the step size, `A = 0.01 / h` (SGD momentum
            0.99, `samplers.auto_step`).
        mass: Scalar mass M > 0.
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (approximate)
            or a `preconditioning.Preconditioner`: the mass becomes `M diag(m)`.

    Example:
        >>> import keras_thermo as kt
        >>> sampler = kt.samplers.SGHMC(step_size=1e-3, friction=1.0)

    Reference:
        T. Chen, E. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo", ICML 2014.
    """

    name = "sghmc"
    friction = FloatSetting(check_optional_positive, optional=True)

    def __init__(self, step_size=auto_step.AUTO, friction: float | None = None, mass: float = 1.0, preconditioner=None):
        super().__init__(step_size, preconditioner=preconditioner)
        self.friction = friction
        self.mass = check_positive("mass", mass)

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> SGHMCState:
        momentum = sample_momentum(params, seed=seed, temperature=temperature, mass=self.mass)
        return SGHMCState(step=tf.constant(0, tf.int64), momentum=momentum, preconditioner=self.init_preconditioner(params))

    def update(self, state: SGHMCState, params, force, context: StepContext):
        h = self.step_size_at(state.step)
        noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
        state, mass, preconditioner = self.preconditioned_state(state, force)
        friction = self.friction_at(h)
        momentum = integrators.euler_momentum(
            state.momentum, force, noise, friction, h,
            noise_friction=friction, temperature=context.temperature, mass=mass,
        )
        new_params = integrators.drift(params, momentum, h, mass)
        diagnostics = {
            "kinetic_temperature": integrators.kinetic_temperature(momentum, mass, num_scalars(params)),
            "step_size": h,
        }
        new_state = SGHMCState(step=state.step + 1, momentum=momentum, preconditioner=preconditioner)
        return new_params, new_state, diagnostics

    def get_config(self):
        return {**super().get_config(), "friction": self.friction, "mass": self.mass}
