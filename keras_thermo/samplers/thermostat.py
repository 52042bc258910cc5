"""The shared part of the samplers with momentum `p`, friction A and a Nose-Hoover thermostat
`xi` (SGNHT, CCAdL, mCCAdL): `p_0` and `xi_0`, the warm-up and its restart, and the keyword
bundles of the O and D steps (`ThermostatSampler`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_bool, check_int, check_optional_positive, check_positive
from keras_thermo.samplers import auto_step, integrators
from keras_thermo.samplers.base import FloatSetting, Sampler, StepContext, num_scalars, sample_momentum


#: Default `warmup_steps` of the thermostat samplers (`ThermostatSampler`).
DEFAULT_WARMUP_STEPS = 1000
#: Default `per_variable_thermostat` of SGNHT, CCAdL and mCCAdL: one xi per trainable tensor.
DEFAULT_PER_VARIABLE_THERMOSTAT = True


class ThermostatSampler(Sampler):
    """Shared parts of the samplers with momentum `p`, friction A and a thermostat `xi`
    (SGNHT, CCAdL, mCCAdL): argument checks, `p_0 ~ N(0, T M)`, `xi_0 = A` (float64, see
    `integrators`), the warm-up restart, and the keyword bundles of the O and D steps.

    Warm-up. From a start far from the posterior (e.g. Keras' default initialisation) the first
    steps turn the excess potential energy into momentum, and the thermostat absorbs it by
    driving xi far above its stationary value (tens, for a potential excess of 1e4 T). Afterwards
    xi can only fall by about `h T` per step while the chain runs cold (kinetic temperature about
    `A T / xi`), so a chain stays cold for tens of thousands of steps. The thermostat is what
    dissipates the excess fastest, so the warm-up keeps it, and then restarts the papers'
    algorithm from the weights it reached: at the step whose state has counter `warmup_steps`,
    `xi <- A` and `p <- N(0, T M)` (fresh draws, keyed by that step), exactly the papers'
    initial condition. Every later step is the papers' update (with one xi per tensor by default,
    below), so the chain from then on is the papers' time-homogeneous Markov chain started at the
    warmed-up weights, and has their invariant distribution. The restart is a pure function of
    the state (its step counter), so resuming stays exact. `warmup_steps=0` is the papers'
    algorithm from the first step.

    A change of A (`follow_friction`). In the papers' invariant distribution xi is centred on A
    (plus the gradient noise's share), so when A changes (the automatic step size inside its
    window under `friction=None`, a schedule, a value set between fits) xi moves by the same
    amount at that step. With A constant, as after the window at a fixed step size, the move is
    exactly zero and every step is the papers' update bit for bit; after a one-time change the
    chain is the papers' chain at the new A, started from the moved xi.

    One thermostat per tensor (`per_variable_thermostat=True`, the default). Algorithm 1's xi is one
    scalar, so it holds the whole net's kinetic temperature at T; gradient noise that is stronger in
    one tensor than in the others (a net's last layer) leaves that tensor hot and the rest cold.
    With one xi per trainable tensor, each with the D step `xi_v += (h / mu_v) (p_v.M^-1.p_v - n_v
    T)` (`mu_v = mu n_v / Nd`), every tensor's kinetic temperature is held at T and each xi_v
    absorbs its own tensor's noise. The invariant density is the papers' with one Gaussian factor
    `exp(-mu_v (xi_v - A)^2 / (2 T))` per tensor instead of one for the net: the Nose-Hoover
    argument applies to each block of momenta and its xi_v separately (DESIGN section 4). It is the
    block-scalar case of the general thermostat of Ding et al.'s section 4 (a matrix Xi that absorbs
    non-isotropic noise; Algorithm 1 is its scalar case). It is the default because on networks the
    noise is not isotropic: from Keras' initialisation on the digits MLP the single xi left the
    logits kernel 5-18% hot in 8 of SGNHT's 9 runs over three seeds (docs/temperature.md, "One
    thermostat per tensor"); `per_variable_thermostat=False` is Algorithm 1.
    """

    #: Its thermostats absorb gradient noise assuming independent minibatches (`BayesianModel`
    #: notes when a data pipeline's own batch order is used).
    assumes_white_gradient_noise = True

    friction = FloatSetting(check_optional_positive, optional=True)
    thermal_mass = FloatSetting(check_optional_positive, optional=True, dtype=integrators.THERMOSTAT_DTYPE)

    def __init__(
        self, step_size=auto_step.AUTO, friction: float | None = None, thermal_mass: float | None = None, mass: float = 1.0,
        preconditioner=None, warmup_steps: int = DEFAULT_WARMUP_STEPS,
        per_variable_thermostat: bool = DEFAULT_PER_VARIABLE_THERMOSTAT,
    ):
        super().__init__(step_size, preconditioner=preconditioner)
        self.friction = friction
        self.thermal_mass = thermal_mass
        self.mass = check_positive("mass", mass)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, low=0)
        self.per_variable_thermostat = check_bool("per_variable_thermostat", per_variable_thermostat)

    def initial_momentum_and_xi(self, params, *, temperature: float, seed: int):
        """`(p_0, xi_0, A)`: `p_0 ~ N(0, T M)`, `xi_0 = A` (one per tensor with
        `per_variable_thermostat`) and A as the states' `friction`, the scalar that
        `follow_friction` compares with. With the automatic step size and friction, A is
        not known before the first step: xi starts at 0 and the first step restarts the chain
        with `xi = A` (`restart_after_warmup`); a given friction with the automatic step size
        is A from the start."""
        momentum = sample_momentum(params, seed=seed, temperature=temperature, mass=self.mass)
        if self._restarts_at_first_step:
            xi = 0.0
        elif self.is_auto_step_size:  # a given friction: A does not wait for the measured step size
            xi = self.read_setting("friction")
        else:
            xi = self.friction_at(self.step_size_at(tf.constant(0, tf.int64)))
        friction = tf.cast(xi, integrators.THERMOSTAT_DTYPE)
        return momentum, self.thermostat_shaped(friction, len(params)), friction

    def logged_xi(self, xi) -> tf.Tensor:
        """The `xi` the sampler logs (float32): the thermostat, or the mean of the per-tensor ones."""
        xi = integrators.as_float32(xi)
        return tf.reduce_mean(xi) if self.per_variable_thermostat else xi

    def thermostat_shaped(self, value, count: int) -> tf.Tensor:
        """`value` (a float64 scalar) as the thermostat state: itself, or repeated for each of
        the `count` tensors with `per_variable_thermostat`."""
        if not self.per_variable_thermostat:
            return value
        return tf.fill([count], tf.cast(value, integrators.THERMOSTAT_DTYPE))

    @property
    def _restarts_at_first_step(self) -> bool:
        return self.is_auto_step_size and vars(self).get("friction") is None  # as constructed

    def steps_since_start(self, step: tf.Tensor) -> tf.Tensor:
        """The papers' step counter of the step whose state has counter `step`: `step`, and from
        the restart after the warm-up on `step - warmup_steps` (0 at the restart), so that
        every running estimate of the papers' algorithm (CCAdL's `I_t`) starts afresh there."""
        if self.warmup_steps == 0:
            return step
        return tf.where(step >= self.warmup_steps, step - self.warmup_steps, step)

    def restart_xi(self, state: NamedTuple, params, context: StepContext, mass) -> tf.Tensor:
        """xi of the restart after the warm-up (float64): A, the papers' `xi_0`, which is also
        the stationary value of the samplers whose covariance friction removes the gradient
        noise's heat (CCAdL, mCCAdL; CCAdL's only with its covariance estimate restarted too,
        `steps_since_start`)."""
        del params, context, mass
        friction = tf.cast(self.friction_at(self.step_size_at(state.step)), integrators.THERMOSTAT_DTYPE)
        return self.thermostat_shaped(friction, len(state.momentum))

    def restart_after_warmup(self, state: NamedTuple, params, context: StepContext, mass) -> tuple[NamedTuple, Any]:
        """`(state, restarted)`: at the step whose state has counter `warmup_steps`, the state
        with `xi = A` and fresh momenta `p ~ N(0, T M)` (`mass`: this step's masses, from
        `precondition`), and True; at every other step the state unchanged (class doc). With
        the automatic step size and friction the first step restarts too, once A is known."""
        if self.warmup_steps == 0 and not self._restarts_at_first_step:
            return state, tf.constant(False)
        restarted = tf.equal(state.step, self.warmup_steps)
        if self._restarts_at_first_step:
            restarted = tf.logical_or(restarted, tf.equal(state.step, 0))

        def fresh():
            noise = context.normal(state.step, params, kt_random.STREAM_INIT)
            masses = integrators.per_tensor(mass, len(noise))
            temperature = tf.cast(context.temperature, tf.float32)
            momentum = [tf.sqrt(temperature * m) * r for r, m in zip(noise, masses)]
            return momentum, self.restart_xi(state, params, context, mass)

        momentum, xi = tf.cond(restarted, fresh, lambda: (list(state.momentum), state.xi))
        return state._replace(momentum=momentum, xi=xi), restarted

    def start_step(self, state: NamedTuple, params, force, context: StepContext) -> tuple[NamedTuple, Any, Any, Any]:
        """`(state, mass, preconditioner state, restarted)`: what every thermostat step starts
        with, `preconditioned_state`, `follow_friction` and then `restart_after_warmup` at this
        step's masses."""
        state, mass, preconditioner = self.preconditioned_state(state, force)
        state = self.follow_friction(state)
        state, restarted = self.restart_after_warmup(state, params, context, mass)
        return state, mass, preconditioner, restarted

    def covariance_friction_weight(self, step: tf.Tensor) -> tf.Tensor:
        """1.0 where the step whose state has counter `step` applies the gradient-noise
        correction (CCAdL's covariance friction `(h/2) beta Sigma p`, mCCAdL's C step), 0.0
        inside the automatic step size's window (float32); 1.0 at every step with a given step
        size.

        Inside the window the chain runs as SGNHT does (the thermostat absorbs the gradient
        noise), at the step the curvature gives. A correction running there damps the momentum
        along the noisiest directions, and on real Fashion-MNIST the chain so damped settled
        where the largest curvature was 10-22x SGNHT's, so the step frozen from that curvature
        came out a fifth to a third of SGNHT's (`docs/real_data.md`). The window is not
        sampling: from its end on every step is the sampler's own update at the frozen step, so
        the chain has that update's invariant distribution."""
        if not self.is_auto_step_size:
            return tf.constant(1.0)
        return tf.cast(step >= self.adaptation_steps, tf.float32)

    def follow_friction(self, state: NamedTuple) -> NamedTuple:
        """The state with xi moved by the change of A since the last step, `xi += A_t - A_{t-1}`,
        and `friction = A_t` (the A of the step whose state has counter `state.step`).

        xi is stationary at A plus the gradient noise's share, and moves only by about
        `h (K / T - 1)` per step (its thermal mass is Nd), so when A changes (the step size of
        `friction=None` set between fits, a step-size schedule, the automatic step size inside
        its window, or a new `friction`) a thermostat left at the old A takes thousands of steps
        to catch up, the chain hot (A up) or cold (A down) meanwhile. Moving xi with A keeps its
        excess over A, which is all the thermostat has learned. A constant A changes nothing,
        bit for bit."""
        friction = tf.cast(self.friction_at(self.step_size_at(state.step)), integrators.THERMOSTAT_DTYPE)
        return state._replace(xi=state.xi + (friction - state.friction), friction=friction)

    def ou_kwargs(self, context: StepContext, mass=None, *, h) -> dict:
        """Keyword arguments of `integrators.ornstein_uhlenbeck` / `euler_momentum` (`mass`: the
        step's masses from `precondition`; default the scalar `mass`; `h`: the step size)."""
        return {"noise_friction": self.friction_at(h), "temperature": context.temperature, "mass": self.mass if mass is None else mass}

    def thermostat_kwargs(self, params, context: StepContext, mass=None) -> dict:
        """Keyword arguments of `integrators.thermostat` (thermal mass defaults to Nd; with
        `per_variable_thermostat`, `variable_sizes` gives each tensor's size)."""
        num_params = num_scalars(params)
        return {
            "thermal_mass": self.read_setting("thermal_mass", default=float(num_params)),
            "num_params": num_params,
            "temperature": context.temperature,
            "mass": self.mass if mass is None else mass,
            "variable_sizes": tuple(float(num_scalars([p])) for p in params) if self.per_variable_thermostat else None,
        }

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "friction": self.friction,
            "thermal_mass": self.thermal_mass,
            "mass": self.mass,
            "warmup_steps": self.warmup_steps,
            "per_variable_thermostat": self.per_variable_thermostat,
        }
