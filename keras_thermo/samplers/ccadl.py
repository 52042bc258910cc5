"""Covariance-controlled adaptive Langevin thermostat (Shang et al., 2015, Algorithm 1).

SGNHT plus a friction term `(h/2) beta Sigma p` matched to the covariance `Sigma` of the noisy
force, which it estimates from the per-example gradients of each minibatch (DESIGN section 4):

    I_t = (1 - k_t) I_{t-1} + k_t V(theta_t),   k_t = 1/t,   V = Gc^T Gc / (n - 1),
    Sigma = (N^2 / n) I_t,
    p    += h F - (h/2) beta Sigma p h - xi p h + sqrt(2 A T h) M^1/2 R,
    theta += h M^-1 p,
    xi   += (h / mu) (p.M^-1.p - (h^2/4) beta q.Sigma.q - Nd T),   q = M^-1/2 p,

(by default one xi per trainable tensor, each with this D step over its own tensor's scalars;
`ThermostatSampler`)

with `Gc` the centered per-example gradients `[n, Nd]` and `beta = 1/T`. The paper leaves the
weights `k_t` to the user; `covariance_window=W` uses `k_t = max(1/t, 1/W)`, an exponential average
over about the last W steps, which forgets the covariance seen during burn-in (the 1/t average
keeps the noise of the starting point forever, and from an initialisation far from the posterior
that can keep `(h^2/2) beta ||Sigma||` above the stability limit). `I_t` is accumulated in float64:
in float32 a 1/t update is quantised by ~5% at t = 1e6 and stops moving near t = 1e7. The paper's
listing moves
theta first and then evaluates the force at the new theta; here the force arrives with the step
(evaluated at the current theta, like `V`), so the same cycle starts at the momentum update and the
order is that of SGNHT's Euler integrator: p, theta, xi.

The thermostat reads `p.M^-1.p - (h^2/4) beta q.Sigma.q` (`q = M^-1/2 p`, Sigma as in
`update`) instead of `p.M^-1.p`, a departure from the listing. The explicit friction multiplies
p by `1 - c` per step (`c = (h^2/2) beta Sigma` along an eigenvector) and the noise it balances
adds `h^2 Sigma`, so p's stationary variance is `T / (1 - c/2)`, not T. Held at `p.M^-1.p =
Nd T`, xi settles above A and the positions run cold by about the mean of `c/2` (4.5-6.9% of
the posterior variance at the automatic step on the regression of
`tests/test_ccadl_thermostat_reading.py`). Subtracting the first-order excess leaves xi and the
positions where SGNHT's Euler scheme puts them, to first order in c (relative offsets of about
`h A / 2`); inside the automatic step's window, where the covariance friction is off, the
reading is SGNHT's.

The covariance term is an explicit (Euler) friction: along an eigenvector of `Sigma` with
eigenvalue `lambda` it multiplies `p` by `1 - h xi - (h^2/2) beta lambda`, which leaves the unit
interval once `(h^2/2) beta lambda` approaches 2. Past that step size the momentum grows
geometrically and the model's divergence guard stops `fit` with `SamplerDivergedError`: CCAdL's
known failure mode, which mCCAdL (`keras_thermo.samplers.mccadl`) removes by integrating this term
exactly.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import _tree
from keras_thermo import random as kt_random
from keras_thermo._validation import check_choice, check_int
from keras_thermo.samplers import auto_step, covariance_average, integrators
from keras_thermo.samplers.base import StepContext, force_noise_scale, num_scalars, require_per_example_gradients
from keras_thermo.samplers.thermostat import (
    DEFAULT_PER_VARIABLE_THERMOSTAT, DEFAULT_WARMUP_STEPS, ThermostatSampler,
)

#: Default largest Nd for `covariance="full"`: the [Nd, Nd] float64 moving average then takes
#: 32 MB and its update costs ~4e6 multiply-adds per step.
DEFAULT_MAX_FULL_PARAMS = 2000


class CCAdLState(NamedTuple):
    """Step counter, momenta, thermostat and the moving-average gradient covariance `I_t`.

    `covariance` is a per-variable list of variances (`"diag"`) or one `[Nd, Nd]` matrix
    (`"full"`), without the `N^2 / n` factor, in float64 (module doc).
    """

    step: tf.Tensor
    momentum: list
    xi: tf.Tensor
    covariance: list | tf.Tensor
    preconditioner: tuple = ()
    friction: tf.Tensor = 0.0  # A of the last step (`ThermostatSampler.follow_friction`), float64
    # The last step's covariance friction per step, `C p = friction_strength I_t p` (`I_t M^-1 p`
    # under a diagonal mass): what the thermostat's reading subtracts (float32; module doc).
    friction_strength: tf.Tensor = 0.0


@keras.saving.register_keras_serializable(package="keras_thermo")
class CCAdL(ThermostatSampler):
    """CCAdL: SGNHT with friction matched to the estimated covariance of the gradient noise.

    The thermostat `xi` absorbs what the covariance term misses (estimation error, the diagonal
    approximation), so it settles near `A` when the estimate is good, instead of growing with the
    noise as in SGNHT.

    Stability: the covariance friction is explicit, so the step size must satisfy
    `(h^2/2) beta ||Sigma|| < 2` (roughly; `h xi` adds to the left side). The largest eigenvalue
    of `Sigma` grows like `N^2 / n`: for large datasets this limits h more than the force does.
    Reduce `step_size`, increase the batch size, or use `MCCAdL`, which has no such limit.

    Args:
        step_size: h, a positive float, a `LearningRateSchedule`, or `"auto"` (the default:
            measured from the curvature during the warm-up, then frozen; `samplers.auto_step`).
        friction: A > 0: the injected-noise amplitude `sqrt(2 A T)` and `xi_0`; None (the
            default) follows the step size, `A = 0.01 / h` (SGD momentum 0.99, `samplers.auto_step`).
        covariance: `"diag"` (per-coordinate variances, the paper's choice in high dimension) or
            `"full"` (an `[Nd, Nd]` matrix; only for `Nd <= max_full_params`).
        thermal_mass: mu > 0; default `Nd`, the number of trainable scalars.
        mass: Scalar mass M > 0.
        max_full_params: Largest Nd accepted with `covariance="full"` (default 2000); a larger
            model is refused when the sampler state is created.
        covariance_window: None (default) for the paper's running mean `k_t = 1/t` over every
            step, or an integer W >= 1 for `k_t = max(1/t, 1/W)`: the running mean for the first
            W steps, then an exponential average over about the last W, which forgets burn-in.
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (approximate)
            or a `preconditioning.Preconditioner`: the mass becomes `M diag(m)`.
        per_variable_thermostat: True (the default): one xi per trainable tensor; False: the
            papers' one for the net (as `SGNHT`; `ThermostatSampler`); logged `xi` is the mean.
        warmup_steps: W >= 0 (default 1000): the papers' update restarts at step W with `xi = A`,
            fresh `p ~ N(0, T M)` and the covariance average `I_t` started again (`k = 1` at
            step W, so the warm-up's covariance is forgotten; `average_weight`), as `SGNHT`
            (`ThermostatSampler`).

    Example:
        >>> import keras_thermo as kt
        >>> from keras_thermo.samplers.ccadl import CCAdL
        >>> sampler = CCAdL(step_size=1e-4, friction=1.0, covariance="diag")
        >>> sampler.needs_per_example_gradients
        True

    Reference:
        X. Shang, Z. Zhu, B. Leimkuhler and A. Storkey, "Covariance-controlled adaptive Langevin
        thermostat for large-scale Bayesian sampling", NeurIPS 2015, Algorithm 1.
    """

    name = "ccadl"
    needs_per_example_gradients = True

    def __init__(
        self,
        step_size=auto_step.AUTO,
        friction: float | None = None,
        covariance: str = "diag",
        thermal_mass: float | None = None,
        mass: float = 1.0,
        max_full_params: int = DEFAULT_MAX_FULL_PARAMS,
        covariance_window: int | None = None,
        preconditioner=None,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        per_variable_thermostat: bool = DEFAULT_PER_VARIABLE_THERMOSTAT,
    ):
        super().__init__(
            step_size, friction=friction, thermal_mass=thermal_mass, mass=mass, preconditioner=preconditioner,
            warmup_steps=warmup_steps, per_variable_thermostat=per_variable_thermostat,
        )
        self.covariance = check_choice("covariance", covariance, ("diag", "full"))
        self.max_full_params = check_int("max_full_params", max_full_params, low=1)
        self.covariance_window = (
            None if covariance_window is None else check_int("covariance_window", covariance_window, low=1)
        )

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> CCAdLState:
        num_params = num_scalars(params)
        if self.covariance == "full":
            if num_params > self.max_full_params:
                raise ValueError(
                    f"CCAdL(covariance='full') keeps an [Nd, Nd] covariance matrix, but the model "
                    f"has Nd = {num_params} trainable scalars, above max_full_params = "
                    f"{self.max_full_params}. Use covariance='diag' (per-coordinate variances), "
                    "MCCAdL(covariance='minibatch') (each minibatch's full covariance, never formed), "
                    f"or raise max_full_params if {num_params}x{num_params} floats fit in memory."
                )
            average = tf.zeros([num_params, num_params], integrators.THERMOSTAT_DTYPE)
        else:
            average = covariance_average.zeros_like_variables(params)
        momentum, xi, friction = self.initial_momentum_and_xi(params, temperature=temperature, seed=seed)
        return CCAdLState(
            step=tf.constant(0, tf.int64), momentum=momentum, xi=xi, covariance=average,
            preconditioner=self.init_preconditioner(params), friction=friction,
            friction_strength=tf.constant(0.0, tf.float32),
        )

    def step_size_cap(self, context: StepContext, params, masses) -> tf.Tensor:
        """`NOISE_FRACTION` of the covariance friction's stability bound `2 / sqrt(beta
        lambda_Sigma)` on this minibatch, with `lambda_Sigma >= max_i Sigma_ii` from its
        per-example gradients (a lower bound on the eigenvalue, hence the margin). Applied where
        the step size freezes, at the window's end, on every chain (`auto_step.choose_step_size`):
        a net's per-example gradients grow many-fold as it leaves its initialisation (on real
        Fashion-MNIST they outgrew the first step's bound within 87 steps, and the covariance
        friction then amplified the momentum until the run diverged), so the bound is taken where
        the friction starts."""
        variances = require_per_example_gradients(context, "CCAdL").diagonal_covariance()
        inverse_mass = [tf.broadcast_to(1.0 / m, p.shape) for m, p in zip(integrators.per_tensor(masses, len(params)), params)]
        largest = force_noise_scale(context) * tf.reduce_max(tf.cast(variances, tf.float32) * _tree.flatten(inverse_mass))
        beta = 1.0 / tf.cast(context.temperature, tf.float32)
        return auto_step.NOISE_FRACTION * 2.0 * tf.math.rsqrt(beta * tf.maximum(largest, 1e-30))

    def average_weight(self, step: tf.Tensor) -> tf.Tensor:
        """`k_t` (float64) of the step whose state has counter `step`: t = step + 1, counted
        again from the restart after the warm-up (`steps_since_start`), where `k_t = 1` replaces
        the average by the current `V`.

        From a far start the warm-up's per-example gradients vary far more than at the posterior;
        a 1/t average over them keeps Sigma too large for thousands of steps after the restart.
        The covariance friction `(h/2) beta Sigma` is several times A at the step sizes where
        CCAdL is stable, so a few percent of excess friction holds the chain cold while xi,
        restarted at A, sinks below A to make up for it (too slowly to keep the temperature)."""
        return covariance_average.sampler_weight(self, step)

    def _moving_average(self, state: CCAdLState, per_example, params):
        """`I_t = (1 - k_t) I_{t-1} + k_t V(theta_t)` in float64."""
        weight = self.average_weight(state.step)
        f64 = integrators.THERMOSTAT_DTYPE
        if self.covariance == "full":
            current = tf.cast(per_example.full_covariance(), f64)
            return (1.0 - weight) * state.covariance + weight * current
        return covariance_average.diagonal_average(state.covariance, per_example, params, weight)

    def _covariance_times(self, average, momentum, params) -> list[tf.Tensor]:
        """`I_t p`, per variable (float32, like the momenta); `average` in float64 or already
        cast (`_as_float32`)."""
        if self.covariance == "full":
            product = tf.linalg.matvec(integrators.as_float32(average), _tree.flatten(momentum))
            return _tree.unflatten(product, params)
        return [integrators.as_float32(var) * p for var, p in zip(average, momentum)]

    @staticmethod
    def _as_float32(average):
        """The float64 average cast once per step for the products that read it (a cast is a
        pass over a weight-sized array; a float32 input passes through)."""
        if isinstance(average, (list, tuple)):
            return [integrators.as_float32(v) for v in average]
        return integrators.as_float32(average)

    def _friction_excess(self, momentum, mass, average, params, strength) -> list[tf.Tensor]:
        """Each tensor's share of `p.M^-1.C.p / 2`, `C p = strength I_t p` (scalar M) or
        `strength I_t M^-1 p` (diagonal M), as the covariance friction of `update` applies it."""
        masses = integrators.per_tensor(mass, len(momentum))
        # M^-1 p (a unit scalar mass divides by nothing: no pass over the momenta)
        scaled = [p if isinstance(m, float) and m == 1.0 else p / m for p, m in zip(momentum, masses)]
        operand = momentum if self.preconditioner is None else scaled
        friction = self._covariance_times(average, operand, params)
        return [0.5 * strength * tf.reduce_sum(u * f) for u, f in zip(scaled, friction)]

    def variable_kinetic_temperatures(self, new_state: CCAdLState, params, new_params):
        """Each variable's `(p_v.M^-1.p_v - p_v.M^-1.C.p_v / 2) / n_v`: what the thermostat reads
        (module doc), which averages T at equilibrium."""
        raw = super().variable_kinetic_temperatures(new_state, params, new_params)
        mass = self.mass if self.preconditioner is None else self.masses(new_state.preconditioner)
        excess = self._friction_excess(new_state.momentum, mass, new_state.covariance, params, new_state.friction_strength)
        return [k - e / float(num_scalars([p])) for k, e, p in zip(raw, excess, params)]

    @staticmethod
    def _largest_diagonal(average, inverse_mass=None) -> tf.Tensor:
        """`max_i I_ii` (or `max_i I_ii / m_i`): a lower bound on the largest eigenvalue of
        `I_t` (of `M^-1/2 I_t M^-1/2`), exact for the diagonal covariance."""
        if isinstance(average, (list, tuple)):  # each variable's largest (no concatenated copy)
            weights = [None] * len(average) if inverse_mass is None else inverse_mass
            return tf.reduce_max(tf.stack([
                tf.reduce_max(integrators.as_float32(v) if w is None else integrators.as_float32(v) * w)
                for v, w in zip(average, weights)
            ]))
        diagonal = integrators.as_float32(tf.linalg.diag_part(average))
        if inverse_mass is not None:
            diagonal = diagonal * _tree.flatten(inverse_mass)
        return tf.reduce_max(diagonal)

    @staticmethod
    def _trace(average, inverse_mass=None) -> tf.Tensor:
        """`tr(I_t)`, or `tr(M^-1/2 I_t M^-1/2) = sum_i I_ii / m_i` given `M^-1` per variable."""
        if inverse_mass is None:
            if isinstance(average, (list, tuple)):
                return integrators.as_float32(tf.add_n([tf.reduce_sum(v) for v in average]))
            return integrators.as_float32(tf.linalg.trace(average))
        if isinstance(average, (list, tuple)):
            return tf.add_n([tf.reduce_sum(integrators.as_float32(v) * w) for v, w in zip(average, inverse_mass)])
        diagonal = integrators.as_float32(tf.linalg.diag_part(average))
        return tf.reduce_sum(diagonal * _tree.flatten(inverse_mass))

    def update(self, state: CCAdLState, params, force, context: StepContext):
        per_example = require_per_example_gradients(context, "CCAdL")
        h = self.step_size_at(state.step)
        num_params = num_scalars(params)
        beta = 1.0 / context.temperature
        state, mass, preconditioner, _ = self.start_step(state, params, force, context)

        average = self._moving_average(state, per_example, params)
        average32 = self._as_float32(average)
        if self.preconditioner is None:
            # The papers' Sigma is defined by F~ = -grad U + sqrt(Sigma) M^1/2 R, i.e. the force
            # covariance divided by the mass: Sigma = (N^2/n) I_t / M.
            sigma_scale = force_noise_scale(context) / self.mass
            sigma_p = [sigma_scale * v for v in self._covariance_times(average32, state.momentum, params)]
            noise_scale = sigma_scale * self._trace(average) / float(num_params)
            largest = sigma_scale * self._largest_diagonal(average32)
        else:
            # Diagonal mass M. The force noise B = (N^2/n) I_t enters p with covariance h^2 B per
            # step; in q = M^-1/2 p (q ~ N(0, T I) at equilibrium) it is M^-1/2 B M^-1/2 =: Sigma,
            # so the friction that cancels it is dq = -(h/2) beta Sigma q dt, i.e. on p
            #   M^1/2 (h/2) beta Sigma M^-1/2 p = (h/2) beta (N^2/n) I_t M^-1 p
            # (fluctuation-dissipation: K T M + T M K^T = h B holds for K = (h/2) beta B M^-1).
            # A scalar M gives the line above; `noise_scale` is tr(Sigma) / Nd.
            inverse_mass = [1.0 / m for m in mass]
            sigma_scale = force_noise_scale(context)
            scaled_momentum = [p * w for p, w in zip(state.momentum, inverse_mass)]
            sigma_p = [sigma_scale * v for v in self._covariance_times(average32, scaled_momentum, params)]
            full_inverse = [tf.broadcast_to(w, p.shape) for w, p in zip(inverse_mass, params)]
            noise_scale = sigma_scale * self._trace(average32, full_inverse) / float(num_params)
            largest = sigma_scale * self._largest_diagonal(average32, full_inverse)
        # p + h (F - (h/2) beta Sigma p) - h xi p + noise is the paper's momentum update (inside
        # the automatic step's window without the Sigma term: `covariance_friction_weight`).
        rate = (0.5 * h * beta) * self.covariance_friction_weight(state.step)
        corrected_force = [f - rate * s for f, s in zip(force, sigma_p)]
        noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
        momentum = integrators.euler_momentum(
            state.momentum, corrected_force, noise, state.xi, h, **self.ou_kwargs(context, mass, h=h)
        )
        new_params = integrators.drift(params, momentum, h, mass)
        thermostat_kwargs = self.thermostat_kwargs(params, context, mass)
        # The explicit covariance friction multiplies p by `1 - C` per step (`C = h rate Sigma`),
        # which leaves p's variance at `T M (1 + C / 2)` to first order: a thermostat reading
        # p.M^-1.p settles xi above A, and the positions run cold by about mean(C) / 2 (module
        # doc). It reads `p.M^-1.p - p.M^-1.C.p / 2`, the energy the positions equilibrate with.
        strength = h * rate * sigma_scale
        excess = self._friction_excess(momentum, mass, average32, params, strength)
        variable_sizes = thermostat_kwargs["variable_sizes"]
        energy = integrators.thermostat_energy(momentum, mass, variable_sizes)
        energy = energy - (tf.stack(excess) if variable_sizes is not None else tf.add_n(excess))
        xi = integrators.thermostat_from_energy(state.xi, energy, h, **thermostat_kwargs)
        diagnostics = {
            "kinetic_temperature": integrators.whole_net_kinetic(
                integrators.thermostat_kinetic(energy, num_params, variable_sizes), variable_sizes
            ),
            "step_size": h,
            "xi": self.logged_xi(xi),
            "noise_scale": noise_scale,
            # The explicit covariance friction stays stable while (h^2/2) beta lambda < 2, with
            # lambda >= the largest diagonal entry of Sigma: h must stay below this.
            "step_size_limit": tf.sqrt(4.0 / (beta * tf.maximum(largest, 1e-30))),
        }
        new_state = CCAdLState(
            step=state.step + 1, momentum=momentum, xi=xi, covariance=average, preconditioner=preconditioner,
            friction=state.friction, friction_strength=tf.cast(strength, tf.float32),
        )
        return new_params, new_state, diagnostics

    def get_config(self):
        return {
            **super().get_config(),
            "covariance": self.covariance,
            "max_full_params": self.max_full_params,
            "covariance_window": self.covariance_window,
        }
