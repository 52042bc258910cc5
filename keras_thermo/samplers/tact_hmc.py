"""Thermostat-assisted continuously-tempered HMC (Luo et al., 2018, Algorithm 1).

The parameters theta are coupled to a tempering variable xi through the extended Hamiltonian

    H = lambda(xi) U(theta) + W(xi) + kinetic energies,

so theta sees the effective temperature `T / lambda(xi)`: 1x on the plateau `|xi| <= xi0`, up to
9x at the walls for the default coupling. xi moves in an infinite well `|xi| <= wall`; an adaptive
biasing force (ABF) cancels the mean force on xi so that it wanders uniformly over the well, and
Nose-Hoover thermostats `z_theta`, `z_xi` absorb the minibatch noise of the force and of the
potential. Samples are the theta of steps with `k mod K = 0` on the plateau, where the target is
exactly `exp(-U / T)`.

Units (DESIGN section 3). The state keeps the paper's per-step variables: `r = h p / M` (the
displacement of one step) and `z = h s` (friction per step), with `eta = h^2 / M`. When eta changes
from one step to the next (a schedule, or a step size set between fits), each `r` is first rescaled
by `sqrt(eta_t / eta_{t-1})`, which keeps the momentum `p` (and `|r|^2 / eta`, the kinetic
temperature): `r` is the only step-scaled part of the state. The thermostats are not rescaled:
the injected noise is set per step (`c = A h`), so the value `z` settles at is `c` at any eta
(a physical friction `s = z / h` that follows `A = c / h`). The state records the eta each `r`
carries. One step is

    z_xi    += lambda'^2 (r_xi^2 - eta_xi T) / gamma_xi
    z_theta += lambda^2 (|r|^2 / Nd - eta T) / gamma_theta
    r_xi     = exp(-lambda'^2 z_xi) r_xi - lambda' (eta_xi U + sqrt(2 c_xi eta_xi T) R')
               + eta_xi abf[bin(xi)]
    r        = exp(-lambda^2 z_theta) r + lambda (eta F + sqrt(2 c_theta eta T) R)
    abf[bin(xi)] <- running mean of lamb'(xi) U over the visits of that bin
    theta   += r;   xi += r_xi, reflected at +-wall (r_xi reversed on each reflection)

with `U = N L + R` and `F = -grad U` of the minibatch. At equilibrium `|r|^2 / (Nd eta)` averages
T (the `kinetic_temperature` diagnostic), whatever lambda is.

Converting the paper's reported 7-tuple `[eta_theta, eta_xi, c_theta, c_xi, gamma_theta,
gamma_xi, K]`: the paper's step sizes multiply the gradient of the *mean* loss (its public code
scales them by the training-set size N before use), so

    step_size = eta_theta / N,   xi_step_size = eta_xi / N,
    noise = c_theta,   xi_noise = c_xi,   thermal_inertia = gamma_theta,
    xi_thermal_inertia = gamma_xi,   sample_every = K.

E.g. the EMNIST MLP setting `[0.0015, 0.0015, 0.05, 0.05, 1.0, 1.0, 50]` with N = 112800 is
`TACTHMC(1.33e-8, 1.33e-8, 0.05, 0.05, 1.0, 1.0, 50)`. Against the SGHMC/SGNHT parameters of this
project (time step h, friction A, thermal mass mu, unit mass): `eta = h^2`, `c = A h`,
`gamma = mu / Nd`.

Departures from the extracted listing (DESIGN section 4, errata): lambda is the reciprocal form
below; samples need `lambda(xi) = 1`; ABF keeps a running mean per bin with per-bin visit
counts; the wall is a real mirror reflection; friction is applied as `exp(-lambda^2 z)` (the
listing's Euler factor `1 - lambda^2 z` is kept as `friction_integrator="euler"` for comparison:
it diverges once `lambda'^2 z_xi > 2`, which a noisy potential makes happen quickly).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import (
    check_bool,
    check_choice,
    check_int,
    check_non_negative,
    check_number,
    check_optional_positive,
    check_positive,
)
from keras_thermo.samplers import auto_step, integrators
from keras_thermo.samplers.base import FloatSetting, Sampler, StepContext, num_scalars

# Noise streams of this sampler beyond the shared ones in `keras_thermo.random`.


class TACTHMCState(NamedTuple):
    """State of `TACTHMC`; every field becomes a non-trainable model variable.

    Attributes:
        step: int64 number of completed steps.
        momentum: r_theta, one tensor per trainable variable (displacement of one step).
        xi: The tempering variable (float32 scalar).
        xi_momentum: r_xi (float32 scalar).
        z_theta: Thermostat of theta: a float64 scalar, or one per trainable variable.
        z_xi: Thermostat of xi (float64 scalar).
        abf_mean_force: `[num_bins]` float64 running mean of `lambda'(xi) U` in each bin of xi.
        momentum_step_size: The eta that `momentum` carries (float32 scalar): the next step
            rescales `r` by `sqrt(eta / momentum_step_size)` (module doc).
        xi_momentum_step_size: The eta_xi that `xi_momentum` carries, likewise.

    The thermostats and running means are float64 for the reason given in
    `keras_thermo.samplers.integrators`: with the paper's `eta ~ 1e-8` and `c ~ 0.1` one update of
    `z_theta` is ~1e-8 times the relative temperature error, below a float32 ulp of z unless that
    error exceeds 14-37%.
        abf_visits: `[num_bins]` int64 visits of each bin (the running means' counts).
    """

    step: tf.Tensor
    momentum: list
    xi: tf.Tensor
    xi_momentum: tf.Tensor
    z_theta: Any
    z_xi: tf.Tensor
    abf_mean_force: tf.Tensor
    abf_visits: tf.Tensor
    momentum_step_size: tf.Tensor
    xi_momentum_step_size: tf.Tensor
    preconditioner: tuple = ()


def coupling(xi, *, xi0: float, xi1: float, power: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The coupling `lambda(xi)` and its derivative `lambda'(xi)` (paper, supplementary A).

    `1 / lambda(xi) = 1` for `|xi| <= xi0`, else `1 + ((|xi| - xi0) / (xi1 - xi0))^power`; theta's
    effective temperature is `T / lambda(xi)` (2 T at `|xi| = xi1`).

    Args:
        xi: Tensor of tempering values (any float dtype).
        xi0: Half-width of the plateau `lambda = 1`.
        xi1: Where `lambda = 1/2`; `xi1 > xi0`.
        power: The exponent n >= 1.

    Returns:
        `(lambda, dlambda_dxi)`, tensors like `xi`.

    Example:
        >>> lam, _ = coupling(tf.constant([0.0, 1.0, 5 / 3]), xi0=1 / 3, xi1=1.0, power=3)
        >>> [round(float(1 / v), 4) for v in lam]
        [1.0, 2.0, 9.0]
    """
    xi = tf.convert_to_tensor(xi)
    width = xi1 - xi0
    distance = tf.abs(xi) - xi0
    outside = distance > 0
    u = tf.where(outside, distance, tf.zeros_like(distance)) / width
    u_pow = tf.pow(u, power)
    lam = 1.0 / (1.0 + u_pow)
    # d/dxi of 1 / (1 + u^n) = -n u^(n-1) u' / (1 + u^n)^2, with u' = sign(xi) / width.
    slope = -power * tf.pow(u, power - 1) / width * tf.square(lam) * tf.sign(xi)
    return lam, tf.where(outside, slope, tf.zeros_like(slope))


def step_size_ratio(eta, previous_eta) -> tf.Tensor:
    """`sqrt(eta / previous_eta)`: the factor that keeps the momentum of a per-step displacement
    `r = sqrt(eta / M) p` when the step size changes (0 if `previous_eta` is 0, where r is 0).

    Example:
        >>> float(step_size_ratio(tf.constant(0.04), tf.constant(0.01)))
        2.0
    """
    return tf.sqrt(tf.math.divide_no_nan(tf.cast(eta, tf.float32), tf.cast(previous_eta, tf.float32)))


def reflect_into_well(position, velocity, wall):
    """Elastic reflection of `position` into `[-wall, wall]` (any number of bounces).

    A point that left the well by `d` is put back `d` inside, and the velocity is reversed once per
    bounce. Points inside are returned unchanged.

    Example:
        >>> x, v = reflect_into_well(tf.constant(1.25), tf.constant(0.5), 1.0)
        >>> float(x), float(v)
        (0.75, -0.5)
    """
    period = 4.0 * wall
    shifted = tf.math.floormod(position + wall, period)
    mirrored = shifted > 2.0 * wall
    folded = tf.where(mirrored, period - shifted, shifted) - wall
    inside = tf.abs(position) <= wall  # returned bit for bit
    return tf.where(inside, position, folded), tf.where(mirrored & ~inside, -velocity, velocity)


def bin_index(xi, *, wall: float, num_bins: int) -> tf.Tensor:
    """Index (int32) of the ABF bin of `xi`: `num_bins` equal bins over `[-wall, wall]`."""
    scaled = (tf.cast(xi, tf.float32) + wall) * (num_bins / (2.0 * wall))
    return tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0, num_bins - 1)


def running_mean_update(mean, visits, index, value) -> tuple[tf.Tensor, tf.Tensor]:
    """Adds `value` to the running mean of bin `index`; returns `(mean, visits)`.

    Each bin averages its own visits (`mean += (value - mean) / visits`), so early, far from
    equilibrium visits of one bin do not outweigh later ones.
    """
    hit = tf.one_hot(index, tf.shape(mean)[0], dtype=mean.dtype)
    visits = visits + tf.cast(hit, visits.dtype)
    count = tf.maximum(tf.cast(visits, mean.dtype), 1.0)
    return mean + hit * (tf.cast(value, mean.dtype) - mean) / count, visits


@keras.saving.register_keras_serializable(package="keras_thermo")
class TACTHMC(Sampler):
    """TACT-HMC: continuously tempered, thermostatted stochastic-gradient HMC (Algorithm 1).

    Crosses energy barriers by letting a tempering variable xi raise theta's temperature up to
    `T / lambda(wall)` and back, while thermostats absorb minibatch noise. Only steps with
    `step mod sample_every == 0` and xi on the plateau yield samples (`is_sample`); with the
    default coupling and a flat xi histogram that is `xi0 / wall = 20%` of those steps.

    The first seven arguments are the paper's 7-tuple in this project's units; see the module
    docstring for the conversion from the paper's reported values (`eta / N`).

    Args:
        step_size: eta_theta = h^2 / M > 0 for the potential `U = N L + R` (a float or a
            `LearningRateSchedule`); the step's displacement is `r`, with `|r|^2 ~ Nd eta T`.
        xi_step_size: eta_xi > 0; None uses `step_size` (the paper's choice in every experiment).
        noise: c_theta >= 0, the injected-noise level (friction per step) of theta and the initial
            and fixed-without-thermostat value of `z_theta`.
        xi_noise: c_xi >= 0, the same for xi.
        thermal_inertia: gamma_theta > 0 (larger = slower thermostat).
        xi_thermal_inertia: gamma_xi > 0.
        sample_every: K >= 1; samples are taken every K steps, when on the plateau.
        xi0: Half-width of the plateau of lambda (> 0).
        xi1: Where the effective temperature is 2 T (> xi0).
        power: Exponent n >= 1 of the coupling.
        wall: Position of the infinite well's walls (> xi0); the highest temperature reached is
            `T (1 + ((wall - xi0) / (xi1 - xi0))^power)`.
        num_bins: Number of ABF bins over `[-wall, wall]` (>= 2).
        abf: Apply the adaptive biasing force (False: the table is still accumulated, not used).
        tempering: False fixes xi at 0 (thermostats without tempering: the paper's ablation).
        thermostat: False fixes `z_theta = noise`, `z_xi = xi_noise` (tempering without
            thermostats: the other ablation).
        per_variable_thermostat: One `z_theta` per trainable tensor instead of one scalar.
        friction_integrator: `"exact"` (`r <- exp(-lambda^2 z) r`) or `"euler"` (the listing's
            `r - lambda^2 z r`, unstable once `lambda^2 z > 2`; for comparison only).
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (approximate)
            or a `preconditioning.Preconditioner`: theta's mass becomes `diag(m)`, so its
            per-step variables carry `eta_v = eta / m_v`: `r += lambda (eta_v F + sqrt(2 c eta_v T)
            R)`, and the thermostat and kinetic temperature use `m r^2`, whose mean is `eta T`.

    Example:
        >>> import keras_thermo.samplers.tact_hmc as tact
        >>> sampler = tact.TACTHMC(step_size=1e-4, xi_step_size=1e-4, noise=0.1, xi_noise=0.1,
        ...                        thermal_inertia=1.0, xi_thermal_inertia=1.0, sample_every=10)
        >>> float(sampler.max_temperature_factor())
        9.0

    Reference:
        R. Luo, J. Wang, Y. Yang, Z. Zhu, J. Wang, "Thermostat-assisted continuously-tempered
        Hamiltonian Monte Carlo for Bayesian learning", NeurIPS 2018.
    """

    #: Its thermostats absorb gradient noise assuming independent minibatches (`BayesianModel`
    #: notes when a data pipeline's own batch order is used).
    assumes_white_gradient_noise = True

    name = "tact_hmc"
    xi_step_size = FloatSetting(check_optional_positive, optional=True)
    noise = FloatSetting(check_non_negative)
    xi_noise = FloatSetting(check_non_negative)
    thermal_inertia = FloatSetting(check_positive, dtype=integrators.THERMOSTAT_DTYPE)
    xi_thermal_inertia = FloatSetting(check_positive, dtype=integrators.THERMOSTAT_DTYPE)

    #: eta = h^2 / M: the automatic step size is `STABILITY_FRACTION^2 / lambda`.
    step_size_is_time = False

    def __init__(
        self,
        step_size=auto_step.AUTO,
        xi_step_size: float | None = None,
        noise: float = 0.1,
        xi_noise: float = 0.1,
        thermal_inertia: float = 1.0,
        xi_thermal_inertia: float = 1.0,
        sample_every: int = 50,
        xi0: float = 1.0 / 3.0,
        xi1: float = 1.0,
        power: int = 3,
        wall: float = 5.0 / 3.0,
        num_bins: int = 100,
        abf: bool = True,
        tempering: bool = True,
        thermostat: bool = True,
        per_variable_thermostat: bool = False,
        friction_integrator: str = "exact",
        preconditioner=None,
    ):
        super().__init__(step_size, preconditioner=preconditioner)
        self.xi_step_size = xi_step_size
        self.noise = noise
        self.xi_noise = xi_noise
        self.thermal_inertia = thermal_inertia
        self.xi_thermal_inertia = xi_thermal_inertia
        self.sample_every = check_int("sample_every", sample_every, low=1)
        self.xi0 = check_positive("xi0", xi0)
        self.xi1 = check_number("xi1", xi1, low=self.xi0)
        self.power = check_int("power", power, low=1)
        self.wall = check_number("wall", wall, low=self.xi0)
        self.num_bins = check_int("num_bins", num_bins, low=2)
        self.abf = check_bool("abf", abf)
        self.tempering = check_bool("tempering", tempering)
        self.thermostat = check_bool("thermostat", thermostat)
        self.per_variable_thermostat = check_bool("per_variable_thermostat", per_variable_thermostat)
        self.friction_integrator = check_choice("friction_integrator", friction_integrator, ("exact", "euler"))

    # --- pieces -------------------------------------------------------------------------------

    def coupling(self, xi) -> tuple[tf.Tensor, tf.Tensor]:
        """`(lambda(xi), lambda'(xi))` with this sampler's xi0, xi1 and power."""
        return coupling(xi, xi0=self.xi0, xi1=self.xi1, power=self.power)

    def max_temperature_factor(self) -> float:
        """`1 / lambda(wall)`: the hottest effective temperature, in units of T."""
        return 1.0 + ((self.wall - self.xi0) / (self.xi1 - self.xi0)) ** self.power

    def collapse_hint(self, state) -> str:
        """The likely cause of a collapsed net (`kt.SamplerCollapsedError`) when the tempering
        has theta above T where `fit` stopped (any chain's xi off the plateau: the state is read
        at the end of the epoch in which the collapse was seen), else "": theta runs at
        `T / lambda(xi)`, hot enough to wipe out what the net had learned."""
        if not self.tempering:
            return ""
        xi = float(np.max(np.abs(np.asarray(state.xi))))
        factor = 1.0 / float(self.coupling(tf.constant(xi, tf.float64))[0])
        if factor <= 1.0:
            return ""
        return (
            f"Likely cause: the tempering. Its tempering variable xi is at {xi:.3g} now (the largest "
            "|xi| of its chains when fit stopped, at the end of the epoch in which the net collapsed; "
            f"the plateau at T is |xi| <= {self.xi0:.3g}), where theta runs at {factor:.3g} T (up to "
            f"{self.max_temperature_factor():.3g} T at the wall, |xi| = {self.wall:.3g}); a net that hot "
            "loses what it learned. The adaptive biasing force holds xi off the wall only once its "
            "bins have learned the potential at every temperature, which a potential that keeps "
            "rising while theta heats outruns. Lower the hottest temperature (wall closer to "
            f"xi1={self.xi1:.3g}, where it is 2 T), slow xi down (a smaller xi_step_size), or sample "
            "without tempering (tempering=False). "
        )

    def bin_edges(self) -> np.ndarray:
        """The `num_bins + 1` edges of the ABF bins over `[-wall, wall]`."""
        return np.linspace(-self.wall, self.wall, self.num_bins + 1)

    def xi_step_size_at(self, step: tf.Tensor) -> tf.Tensor:
        """eta_xi at `step` (follows `step_size` when `xi_step_size` is None)."""
        # Lazily: with a given xi_step_size the automatic theta step may not be measured yet.
        value = self.read_setting("xi_step_size", default=lambda: self.step_size_at(step))
        return tf.cast(value, tf.float32)

    def _friction(self, momentum: tf.Tensor, rate: tf.Tensor) -> tf.Tensor:
        """Friction sub-step `dr/dt = -rate r` over one step."""
        if self.friction_integrator == "exact":
            return tf.exp(-rate) * momentum
        return momentum - rate * momentum

    # --- the Sampler interface ----------------------------------------------------------------

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> TACTHMCState:
        step = tf.constant(0, tf.int64)
        # The automatic step size is measured at the first step: until then the momenta carry
        # eta = 1, and the first step rescales them to the measured eta (`step_size_ratio`).
        unmeasured = tf.constant(1.0, tf.float32)
        eta = unmeasured if self.is_auto_step_size else self.step_size_at(step)
        noise = kt_random.normal_like(kt_random.step_key(seed, step, kt_random.STREAM_INIT), params)
        momentum = [tf.sqrt(eta * temperature) * r for r in noise]
        eta_xi = unmeasured if self.is_auto_step_size and self.xi_step_size is None else self.xi_step_size_at(step)
        if self.tempering:
            draw = kt_random.normal_like(kt_random.step_key(seed, step, kt_random.STREAM_TEMPERING_INIT), [tf.zeros([])])[0]
            xi_momentum = tf.sqrt(eta_xi * temperature) * draw
        else:
            xi_momentum = tf.constant(0.0, tf.float32)
        f64 = integrators.THERMOSTAT_DTYPE
        if self.per_variable_thermostat:
            z_theta = [tf.constant(self.noise, f64) for _ in params]
        else:
            z_theta = tf.constant(self.noise, f64)
        return TACTHMCState(
            step=step,
            momentum=momentum,
            xi=tf.constant(0.0, tf.float32),
            xi_momentum=xi_momentum,
            z_theta=z_theta,
            z_xi=tf.constant(self.xi_noise, f64),
            abf_mean_force=tf.zeros([self.num_bins], f64),
            abf_visits=tf.zeros([self.num_bins], tf.int64),
            momentum_step_size=eta,
            xi_momentum_step_size=eta_xi,
            preconditioner=self.init_preconditioner(params),
        )

    def _theta_thermostat(self, z_theta, momentum, lam_sq, eta, temperature, mass):
        """Listing line 6: `z += lambda^2 (|r|^2 / dim - eta T) / gamma` (per tensor if asked),
        the increment formed and added in float64; `|r|^2` is `r.M.r` under a diagonal mass."""
        f64 = integrators.THERMOSTAT_DTYPE
        if not self.thermostat:
            # Fixed at c, read from the setting so that a new c keeps friction and noise matched.
            fixed = tf.cast(self.read_setting("noise"), f64)
            return [fixed for _ in z_theta] if self.per_variable_thermostat else fixed
        target = tf.cast(eta, f64) * tf.cast(temperature, f64)
        rate = tf.cast(lam_sq, f64) / self.read_setting("thermal_inertia")
        if self.per_variable_thermostat:
            return [
                z + rate * (tf.cast(self._weighted_square_sum([r], [m]) / float(num_scalars([r])), f64) - target)
                for z, r, m in zip(z_theta, momentum, integrators.per_tensor(mass, len(momentum)))
            ]
        mean_square = self._weighted_square_sum(momentum, mass) / float(num_scalars(momentum))
        return z_theta + rate * (tf.cast(mean_square, f64) - target)

    @staticmethod
    def _weighted_square_sum(momentum, mass) -> tf.Tensor:
        """`r.M.r` (float32): `|r|^2` for the unit mass, `sum_v m_v |r_v|^2` for a diagonal one."""
        if not isinstance(mass, (list, tuple)):
            return integrators.twice_kinetic_energy(momentum, 1.0)
        return tf.add_n([tf.reduce_sum(m * tf.square(r)) for r, m in zip(momentum, mass)])

    def update(self, state: TACTHMCState, params, force, context: StepContext):
        temperature = tf.cast(context.temperature, tf.float32)
        eta = self.step_size_at(state.step)
        num_params = num_scalars(params)
        lam, dlam = self.coupling(state.xi)
        lam_sq = tf.square(lam)
        eta_xi = self.xi_step_size_at(state.step)
        mass, preconditioner, factors = self.precondition(state, force)
        # r = h M^-1 p with h = sqrt(eta M): keeping p means r scales by sqrt(eta_new / eta_old),
        # and keeping p^2 / m by sqrt(m_old / m_new) (module doc).
        scale = step_size_ratio(eta, state.momentum_step_size)
        if factors is None:
            momentum = [scale * r for r in state.momentum]
        else:
            momentum = [scale * r / c for r, c in zip(state.momentum, factors)]
        state = state._replace(
            momentum=momentum, xi_momentum=step_size_ratio(eta_xi, state.xi_momentum_step_size) * state.xi_momentum
        )

        # Thermostats first, from the previous step's momenta (listing lines 5-6).
        z_theta = self._theta_thermostat(state.z_theta, state.momentum, lam_sq, eta, temperature, mass)
        z_per_variable = z_theta if self.per_variable_thermostat else [z_theta] * len(params)

        # theta: friction, then the tempered force and injected noise (line 12).
        noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
        if self.preconditioner is None:
            noise_std = tf.sqrt(2.0 * self.read_setting("noise") * eta * temperature)
            momentum = [
                self._friction(r, lam_sq * integrators.as_float32(z)) + lam * (eta * tf.cast(f, r.dtype) + noise_std * n)
                for r, z, f, n in zip(state.momentum, z_per_variable, force, noise)
            ]
        else:
            etas = [eta / m for m in mass]  # eta_v = h^2 / (M m_v)
            momentum = [
                self._friction(r, lam_sq * integrators.as_float32(z))
                + lam * (eta_v * tf.cast(f, r.dtype) + tf.sqrt(2.0 * self.read_setting("noise") * eta_v * temperature) * n)
                for r, z, f, n, eta_v in zip(state.momentum, z_per_variable, force, noise, etas)
            ]
        new_params = [theta + r for theta, r in zip(params, momentum)]

        xi, xi_momentum, z_xi = state.xi, state.xi_momentum, state.z_xi
        abf_mean_force, abf_visits = state.abf_mean_force, state.abf_visits
        if self.tempering:
            dlam_sq = tf.square(dlam)
            f64 = integrators.THERMOSTAT_DTYPE
            if not self.thermostat:
                z_xi = tf.cast(self.read_setting("xi_noise"), f64)  # fixed at c_xi, as z_theta
            else:
                excess = tf.cast(tf.square(xi_momentum), f64) - tf.cast(eta_xi, f64) * tf.cast(temperature, f64)
                z_xi = z_xi + tf.cast(dlam_sq, f64) * excess / self.read_setting("xi_thermal_inertia")
            potential = tf.cast(context.potential, tf.float32)
            xi_noise = context.normal(state.step, [xi], kt_random.STREAM_TEMPERING)[0]
            kick = -dlam * (eta_xi * potential + tf.sqrt(2.0 * self.read_setting("xi_noise") * eta_xi * temperature) * xi_noise)
            index = bin_index(xi, wall=self.wall, num_bins=self.num_bins)
            if self.abf:
                kick += eta_xi * integrators.as_float32(tf.gather(abf_mean_force, index))
            xi_momentum = self._friction(xi_momentum, dlam_sq * integrators.as_float32(z_xi)) + kick  # line 11
            # The mean of dH/dxi = lambda'(xi) U per bin, i.e. the free-energy gradient (line 13).
            abf_mean_force, abf_visits = running_mean_update(abf_mean_force, abf_visits, index, dlam * potential)
            xi, xi_momentum = reflect_into_well(xi + xi_momentum, xi_momentum, self.wall)

        new_state = TACTHMCState(
            step=state.step + 1,
            momentum=momentum,
            xi=xi,
            xi_momentum=xi_momentum,
            z_theta=z_theta,
            z_xi=z_xi,
            abf_mean_force=abf_mean_force,
            abf_visits=abf_visits,
            momentum_step_size=eta,
            xi_momentum_step_size=eta_xi,
            preconditioner=preconditioner,
        )
        new_lam, _ = self.coupling(xi)
        diagnostics = {
            "kinetic_temperature": self._weighted_square_sum(momentum, mass) / (num_params * eta),
            "step_size": eta,
            "xi": xi,
            "effective_temperature": temperature / new_lam,
            "z_theta": integrators.as_float32(
                tf.reduce_mean(tf.stack(z_per_variable)) if self.per_variable_thermostat else z_theta
            ),
            "z_xi": integrators.as_float32(z_xi),
            "on_plateau": tf.cast(self.is_sample(new_state), tf.float32),
        }
        return new_params, new_state, diagnostics

    def variable_kinetic_temperatures(self, new_state: TACTHMCState, params, new_params):
        """`|r_v|^2 / (eta n_v)` per variable (r carries `eta T` per scalar at equilibrium)."""
        del params, new_params
        eta = new_state.momentum_step_size
        masses = integrators.per_tensor(self.masses(new_state.preconditioner), len(new_state.momentum))
        return [
            self._weighted_square_sum([r], m if isinstance(m, float) else [m]) / (float(num_scalars([r])) * eta)
            for r, m in zip(new_state.momentum, masses)
        ]

    def parameter_temperature(self, state: TACTHMCState, temperature) -> tf.Tensor:
        """theta's effective temperature `T / lambda(xi)` at `state` (T on the plateau)."""
        lam, _ = self.coupling(state.xi)
        return tf.cast(temperature, tf.float32) / tf.cast(lam, tf.float32)

    def at_target_temperature(self, state: TACTHMCState) -> tf.Tensor:
        """On the plateau `|xi| <= xi0`, where `lambda(xi) = 1` and theta sees T itself."""
        return tf.abs(state.xi) <= self.xi0

    def is_sample(self, state: TACTHMCState) -> tf.Tensor:
        """True when `step mod K == 0` and xi is on the plateau (`lambda(xi) = 1`), and the
        step-size schedule (if cyclical) is in a sampling phase."""
        due = tf.equal(tf.math.floormod(state.step, self.sample_every), 0)
        on_plateau = tf.logical_and(due, tf.abs(state.xi) <= self.xi0)
        return tf.logical_and(on_plateau, self.in_sampling_phase(state))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "xi_step_size": self.xi_step_size,
            "noise": self.noise,
            "xi_noise": self.xi_noise,
            "thermal_inertia": self.thermal_inertia,
            "xi_thermal_inertia": self.xi_thermal_inertia,
            "sample_every": self.sample_every,
            "xi0": self.xi0,
            "xi1": self.xi1,
            "power": self.power,
            "wall": self.wall,
            "num_bins": self.num_bins,
            "abf": self.abf,
            "tempering": self.tempering,
            "thermostat": self.thermostat,
            "per_variable_thermostat": self.per_variable_thermostat,
            "friction_integrator": self.friction_integrator,
        }
