"""Stochastic gradient Nose-Hoover thermostat (Ding et al., 2014, Algorithm 1).

Euler (the paper's listing, DESIGN section 4):
`p += -xi p h + h F + sqrt(2 A T h) M^1/2 R;  theta += h M^-1 p;
 xi += (h / mu) (p.M^-1.p - Nd T)`, with `xi_0 = A` and `p_0 ~ N(0, T M)`. By default one xi per
trainable tensor v (`per_variable_thermostat=True`, `ThermostatSampler`): `p_v` is damped by its
own `xi_v`, and `xi_v += (h / mu_v) (p_v.M^-1.p_v - n_v T)` with `mu_v = mu n_v / Nd`.

Symmetric (`integrator="symmetric"`): the second-order BAODDOAB splitting (Leimkuhler & Shang,
2016), i.e. mCCAdL's BAODCDOAB without its C step. One force per step: the closing half kick of
step t and the opening half kick of step t+1 use the same force, so each `update` applies one full
kick `h F(theta_t)` (a half kick on the very first step) and then A O D D O A.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_choice
from keras_thermo.samplers import auto_step, integrators
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.thermostat import (
    DEFAULT_PER_VARIABLE_THERMOSTAT, DEFAULT_WARMUP_STEPS, ThermostatSampler,
)


class SGNHTState(NamedTuple):
    """`heat`: the sum of `xi K` (friction times kinetic temperature) over the second half of
    the warm-up, which sets xi at its end (`SGNHT.restart_xi`); float64."""

    step: tf.Tensor
    momentum: list
    xi: tf.Tensor
    heat: tf.Tensor = 0.0
    preconditioner: tuple = ()
    friction: tf.Tensor = 0.0  # A of the last step (`ThermostatSampler.follow_friction`), float64


@keras.saving.register_keras_serializable(package="keras_thermo")
class SGNHT(ThermostatSampler):
    """SGNHT: SGHMC whose friction xi is a thermostat driven to the target kinetic temperature.

    The thermostat absorbs gradient noise whose covariance is (roughly) isotropic and constant;
    `xi` settles near `A + (h / 2) * (noise variance per coordinate) / T`.

    Args:
        step_size: h, a positive float, a `LearningRateSchedule`, or `"auto"` (the default:
            measured from the curvature during the warm-up, then frozen; `samplers.auto_step`).
        friction: A > 0: the injected-noise amplitude `sqrt(2 A T)` and `xi_0`; None (the
            default) follows the step size, `A = 0.01 / h` (SGD momentum 0.99, `samplers.auto_step`).
        thermal_mass: mu > 0; default `Nd`, the number of trainable scalars.
        mass: Scalar mass M > 0.
        integrator: `"euler"` (Algorithm 1) or `"symmetric"` (BAODDOAB).
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (approximate)
            or a `preconditioning.Preconditioner`: the mass becomes `M diag(m)`.
        per_variable_thermostat: True (the default): one xi per trainable tensor, so that a
            tensor with more gradient noise than the rest (a net's last layer) is held at T too
            (the block-scalar case of the paper's general thermostat, its section 4;
            `ThermostatSampler`); logged `xi` is then their mean. False: Algorithm 1's single
            xi for the whole net.
        warmup_steps: W >= 0 (default 1000): after W steps of the papers' update the algorithm
            restarts from the weights reached, with `xi = A` and fresh `p ~ N(0, T M)`, which
            leaves behind the large xi that absorbing a far start leaves (`ThermostatSampler`).
            Samples count from step W on; 0 runs the papers' algorithm from the first step.

    Example:
        >>> import keras_thermo as kt
        >>> sampler = kt.samplers.SGNHT(step_size=1e-3, friction=1.0, integrator="symmetric")

    Reference:
        N. Ding et al., "Bayesian sampling using stochastic gradient thermostats", NeurIPS 2014.
    """

    name = "sgnht"

    def __init__(
        self,
        step_size=auto_step.AUTO,
        friction: float | None = None,
        thermal_mass: float | None = None,
        mass: float = 1.0,
        integrator: str = "euler",
        preconditioner=None,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        per_variable_thermostat: bool = DEFAULT_PER_VARIABLE_THERMOSTAT,
    ):
        super().__init__(
            step_size, friction=friction, thermal_mass=thermal_mass, mass=mass, preconditioner=preconditioner,
            warmup_steps=warmup_steps, per_variable_thermostat=per_variable_thermostat,
        )
        self.integrator = check_choice("integrator", integrator, ("euler", "symmetric"))

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> SGNHTState:
        momentum, xi, friction = self.initial_momentum_and_xi(params, temperature=temperature, seed=seed)
        return SGNHTState(
            step=tf.constant(0, tf.int64), momentum=momentum, xi=xi,
            heat=self.thermostat_shaped(tf.constant(0.0, integrators.THERMOSTAT_DTYPE), len(params)),
            preconditioner=self.init_preconditioner(params), friction=friction,
        )

    def update(self, state: SGNHTState, params, force, context: StepContext):
        h = self.step_size_at(state.step)
        state, mass, preconditioner, restarted = self.start_step(state, params, force, context)
        ou_kwargs = self.ou_kwargs(context, mass, h=h)
        thermostat_kwargs = self.thermostat_kwargs(params, context, mass)
        if self.integrator == "euler":
            noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
            momentum = integrators.euler_momentum(state.momentum, force, noise, state.xi, h, **ou_kwargs)
            new_params = integrators.drift(params, momentum, h, mass)
            energy = integrators.thermostat_energy(momentum, mass, thermostat_kwargs["variable_sizes"])
            xi = integrators.thermostat_from_energy(state.xi, energy, h, **thermostat_kwargs)
            kinetic = integrators.thermostat_kinetic(energy, thermostat_kwargs["num_params"], thermostat_kwargs["variable_sizes"])
        else:
            new_params, momentum, xi, kinetic, _ = integrators.symmetric_step(
                state, params, force, h, context, ou_kwargs=ou_kwargs, thermostat_kwargs=thermostat_kwargs,
                fresh_start=restarted,
            )
        diagnostics = {
            # At the point the thermostat sees: it averages T exactly once xi is stationary.
            "kinetic_temperature": integrators.whole_net_kinetic(kinetic, thermostat_kwargs["variable_sizes"]),
            "step_size": h,
            "xi": self.logged_xi(xi),
        }
        new_state = SGNHTState(
            step=state.step + 1, momentum=momentum, xi=xi, heat=self._accumulated_heat(state, kinetic),
            preconditioner=preconditioner, friction=state.friction,
        )
        return new_params, new_state, diagnostics

    def _heat_window(self) -> tuple[int, int]:
        """`[first, end)` steps of the warm-up whose `xi K` `heat` sums: its second half."""
        return self.warmup_steps // 2, self.warmup_steps

    def _accumulated_heat(self, state: SGNHTState, kinetic) -> tf.Tensor:
        first, end = self._heat_window()
        f64 = integrators.THERMOSTAT_DTYPE
        inside = tf.logical_and(state.step >= first, state.step < end)
        term = tf.cast(state.xi, f64) * tf.cast(kinetic, f64)
        return tf.cast(state.heat, f64) + tf.where(inside, term, tf.zeros_like(term))

    def restart_xi(self, state: SGNHTState, params, context: StepContext, mass) -> tf.Tensor:
        """xi of the restart after the warm-up: the friction that balances the heat the chain
        takes in, `max(A, <xi K> / T)`, averaged over the second half of the warm-up.

        There the chain is in the quasi-stationary state of its (slowly moving) friction xi,
        with `xi K = A T + (h/2) sigma^2` per coordinate on average (injected plus gradient-noise
        heat), and the stationary xi at temperature T is that heat over T (SGNHT's xi does not
        settle at A under gradient noise). From A, or from a one-step estimate (K has Nd degrees
        of freedom), the thermostat takes thousands of steps to reach it, the chain hot meanwhile.
        """
        del params, mass
        first, end = self._heat_window()
        if end <= first:  # no warm-up: no heat was measured, so the papers' xi_0 = A
            return super().restart_xi(state, None, context, None)
        f64 = integrators.THERMOSTAT_DTYPE
        balanced = tf.cast(state.heat, f64) / (float(end - first) * tf.cast(context.temperature, f64))
        return tf.maximum(super().restart_xi(state, None, context, None), balanced)

    def get_config(self):
        return {**super().get_config(), "integrator": self.integrator}

    @property
    def symmetric_step(self) -> bool:
        """Whether the step is the second-order symmetric splitting (`integrator="symmetric"`)."""
        return self.integrator == "symmetric"
