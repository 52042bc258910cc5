"""Statistical correctness of CCAdL and mCCAdL through fit: posterior, thermostat, T, M, weights.

Bayesian linear regression (`keras_thermo.testing`) with N = 4096 examples, 2 Gaussian features
and a weak signal, minibatches of 16 drawn with replacement (white gradient noise), h = 1e-3 and
A = 10. The gradient noise is strong: `(h/2) Sigma / T ~ 75` per coordinate at T = 1, M = 1, so
the covariance friction carries most of the dissipation and an error in it is large.

Two checks per run, each with its tolerance from the Monte Carlo error of independent chains
started at the posterior mean (Student t per quantity, Bonferroni, `keras_thermo.testing`):

- posterior: the mean and marginal variance of every coordinate against the exact Gaussian at
  temperature T (`compare_with_gaussian`). Each test asserts its own resolution
  (`detectable_*`: threshold x standard error) so the power claimed below cannot silently erode.
- thermostat: the kinetic temperature averages T (the set point), and the mean of xi matches its
  stationary value. The thermostat absorbs whatever dissipation the covariance friction misses:
  energy balance per coordinate, `2 gamma T = 2 A T + h Sigma_ii` with total friction
  `gamma = xi + f (h/2) Sigma_ii / T` when the sampler applies `f` times the right friction, gives
  `xi = A + (1 - f) (h/2) Sigma / T` (Sigma averaged over coordinates): A for CCAdL/mCCAdL, and
  `A + (h/2) Sigma / T` for SGNHT (f = 0). The allowance is the Euler integrator's O(h) shift
  `h gamma^2 / 2` (gamma = A + (h/2) Sigma / T) plus the t threshold times the standard error:
  ~5% of `(h/2) Sigma / T` at equilibrium. With the default thermal mass (Nd), xi relaxes over
  ~1e5 steps, far longer than these runs, so the chains start at xi = A (the correct value) and
  a wrong friction shows first in the kinetic temperature, `T_kin / T - 1 ~ (1 - f) (h/2) Sigma
  / (T gamma)`: the kinetic t-test resolves ~15% of T, i.e. a friction error of ~17%.
  Sigma is computed here from the data at the posterior mean, independently of the sampler.

T, M and sample weights enter exactly where a missing factor would move xi: beta = 1/T scales
the covariance friction `(h/2) beta Sigma`, the papers' `Sigma` is the force covariance over M,
and a weighted example's gradient noise is that of `w_i l_i`. The weighted data have integer
weights 1..3, so the exact posterior is that of the data with each example repeated w_i times
(`keras_thermo.testing` module doc).

Negative controls: the posterior check rejects the same samples against the posterior at the
wrong temperature and against the unweighted posterior; the thermostat check rejects SGNHT (no
covariance friction), CCAdL with beta left out of its friction at T = 2, and mCCAdL with the
mass left out of Sigma at M = 4.
"""

import dataclasses
import math

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.samplers.ccadl import CCAdL
from keras_thermo.samplers.mccadl import MCCAdL

NUM_EXAMPLES = 4096
BATCH = 16
STEP = 1e-3
FRICTION = 10.0
PRIOR_STD = 1.0
DEFAULT_ALPHA = 0.01
SLOW_ALPHA = 1e-3


def _regression_problem(num_examples=NUM_EXAMPLES, noise_std=0.19, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 2)).astype(np.float32)
    y = (x @ np.array([0.1, -0.1]) + noise_std * rng.normal(size=num_examples))[:, None]
    return x, y.astype(np.float32)


def _weights(x):
    """Integer weights 1..3 that depend on the features, so they change the posterior."""
    return (1 + (x[:, 0] > 0) + (x[:, 1] > 0)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Config:
    sampler: str  # "ccadl", "ccadl-full", "mccadl" (the paper's minibatch C step) or "mccadl-diag" (the default)
    temperature: float = 1.0
    mass: float = 1.0
    weighted: bool = False
    step_size: float = STEP


def _make_sampler(config: Config, sigma_factor: float = 1.0):
    """The sampler of `config`; `sigma_factor != 1` makes it apply that multiple of the right
    covariance friction (a deliberate defect for the negative controls: scaling N by
    sqrt(factor) scales the `N^2 / n` of Sigma and nothing else in these samplers' updates)."""
    cls = MCCAdL if config.sampler.startswith("mccadl") else CCAdL
    kwargs = {"friction": FRICTION, "mass": config.mass}
    kwargs["covariance"] = {"ccadl-full": "full", "mccadl": "minibatch", "mccadl-diag": "diag"}.get(config.sampler, "diag")
    if sigma_factor == 1.0:
        return lambda: cls(config.step_size, **kwargs)

    class Misscaled(cls):
        def update(self, state, params, force, context):
            scaled = context._replace(num_examples=context.num_examples * math.sqrt(sigma_factor))
            return super().update(state, params, force, scaled)

    return lambda: Misscaled(config.step_size, **kwargs)


def _exact(config: Config, x, y, *, temperature=None, weighted=None):
    """Exact posterior mean and covariance (optionally at another T or weighting)."""
    temperature = config.temperature if temperature is None else temperature
    weighted = config.weighted if weighted is None else weighted
    if weighted:
        repeats = _weights(x).astype(int)
        x, y = np.repeat(x, repeats, axis=0), np.repeat(y, repeats, axis=0)
    return testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD, temperature=temperature)


def _noise_friction_scale(config: Config, x, y, mean):
    """`(h/2) Sigma / T` averaged over coordinates: the papers' Sigma = (N^2/n) Cov(w_i g_i) / M
    of the force at the posterior mean, g_i = grad of (a_i . theta - y_i)^2."""
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    per_example = 2.0 * (design @ mean - y[:, 0].astype(np.float64))[:, None] * design
    if config.weighted:
        per_example = per_example * _weights(x)[:, None]
    sigma = len(x) ** 2 / BATCH * per_example.var(axis=0) / config.mass
    return float(0.5 * config.step_size * sigma.mean() / config.temperature)


def _run(config: Config, num_chains, num_steps, *, burn_in_steps=200, sigma_factor=1.0, make_sampler=None):
    x, y = _regression_problem()
    mean, covariance = _exact(config, x, y)
    result = testing.run_chains(
        make_sampler or _make_sampler(config, sigma_factor), x, y, num_chains=num_chains,
        num_steps=num_steps, batch_size=BATCH, burn_in_steps=burn_in_steps, every_n_steps=2,
        prior_std=PRIOR_STD, temperature=config.temperature, initial_params=mean.astype(np.float32),
        log_keys=("kinetic_temperature", "xi"), sample_weight=_weights(x) if config.weighted else None,
    )
    return result, x, y, mean, covariance


@dataclasses.dataclass
class ThermostatCheck:
    xi_passed: bool
    kinetic_passed: bool
    xi_error: float  # mean xi minus its predicted stationary value
    allowance: float
    kinetic_t: float
    threshold: float
    noise_friction: float  # (h/2) Sigma / T

    @property
    def passed(self) -> bool:
        return self.xi_passed and self.kinetic_passed

    @property
    def detectable_friction_error(self) -> float:
        """Relative error of the covariance friction that moves xi by the allowance."""
        return self.allowance / self.noise_friction

    def summary(self) -> str:
        return (
            f"xi - predicted {self.xi_error:.3f} (allowance {self.allowance:.3f}, i.e. "
            f"{100 * self.detectable_friction_error:.1f}% of the friction (h/2) Sigma / T = "
            f"{self.noise_friction:.1f}); kinetic temperature t {self.kinetic_t:.2f} (|t| < "
            f"{self.threshold:.2f})"
        )


def _thermostat_check(result, config: Config, noise_friction, *, absorbed_fraction=0.0, alpha, kept_from=0.2) -> ThermostatCheck:
    """xi against `A + absorbed_fraction * (h/2) Sigma / T`, kinetic temperature against T
    (module doc). The first `kept_from` of the logged values is dropped as burn-in."""
    xi = result.logs["xi"]
    kinetic = result.logs["kinetic_temperature"]
    kept = slice(int(xi.shape[1] * kept_from), None)
    num_chains = xi.shape[0]
    threshold = testing.t_threshold(num_chains, 2, alpha)
    predicted = FRICTION + absorbed_fraction * noise_friction
    xi_means = xi[:, kept].mean(axis=1)
    gamma = FRICTION + noise_friction
    allowance = config.step_size * gamma**2 / 2 + threshold * float(testing.standard_error(xi_means[:, None])[0])
    xi_error = float(xi_means.mean() - predicted)
    kinetic_t = float(testing.chain_t_statistic(kinetic[:, kept].mean(axis=1, keepdims=True), np.array([config.temperature]))[0])
    return ThermostatCheck(
        abs(xi_error) < allowance, abs(kinetic_t) < threshold, xi_error, allowance, kinetic_t, threshold, noise_friction
    )


# name: (config, chains x steps of the default version). Starting at the posterior mean, 200
# steps of burn-in are ~10 relaxation times (the slowest, gamma M / precision, is ~20 steps).
# The covariance friction slows the chains down: the slowest relaxation time is gamma M / (h P),
# P the posterior precision per coordinate, and gamma M = A M + (h/2) Cov(F) / T grows at low T.
# The default runs use T >= 1 (hot chains mix faster); the slow ones cover T = 0.5.
# Plain CCAdL (T = 1, M = 1, 12 x 1600) runs with the slow set: the weighted CCAdL run below
# exercises the same update with T, M and weights. Both runs below are listed in
# conftest.SLOW_CASES too (50 s each on 2 busy cores), to keep the default suite under 10 minutes.
DEFAULT = {
    "mccadl-T2-M0.5": (Config("mccadl", temperature=2.0, mass=0.5), 12, 1200),
    # Full covariance: the weights (which depend on the signs of both features) correlate the
    # coordinates' gradient noise, which the diagonal estimate misses (see SLOW).
    "ccadl-full-T2-M4-weighted": (Config("ccadl-full", temperature=2.0, mass=4.0, weighted=True), 10, 1200),
}
# Resolution the default versions must keep (asserted): measured ~0.15 sd / ~25% at 12 x 1600
# and ~0.2 sd / ~35% at 10 x 1200; what they can see is reported by the failure message.
DEFAULT_RESOLUTION = {"mean_sd": 0.25, "variance": 0.45, "friction": 0.06}


def _assert_resolution(check: testing.GaussianCheck, thermostat: ThermostatCheck, limits):
    assert np.all(check.detectable_mean_error < limits["mean_sd"]), check.summary()
    assert np.all(check.detectable_variance_error < limits["variance"]), check.summary()
    assert thermostat.detectable_friction_error < limits["friction"], thermostat.summary()


@pytest.mark.parametrize("name", sorted(DEFAULT))
def test_posterior_and_thermostat(name):
    """Default versions: 12 chains x 1600 steps (T = 1, M = 1) detect a mean error of ~0.15
    posterior sd and a variance error of ~25% per coordinate; 10 x 1200 (T, M, weights) ~0.2 sd
    and ~35%. The thermostat check detects a covariance friction off by ~17% (kinetic
    temperature; xi's band is ~5% of the friction at equilibrium). The same samples are rejected against the posterior at the wrong
    T (T = 1 for T != 1 runs, T = 2 for T = 1 runs) and, when weighted, against the unweighted
    posterior (negative controls)."""
    config, num_chains, num_steps = DEFAULT[name]
    result, x, y, mean, covariance = _run(config, num_chains, num_steps)
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=DEFAULT_ALPHA)
    thermostat = _thermostat_check(result, config, _noise_friction_scale(config, x, y, mean), alpha=DEFAULT_ALPHA)
    print(f"{name}: {check.summary()}; {thermostat.summary()}")
    assert check.passed, f"{name}: {check.summary()}"
    assert thermostat.passed, f"{name}: {thermostat.summary()}"
    _assert_resolution(check, thermostat, DEFAULT_RESOLUTION)

    wrong_t = 2.0 if config.temperature == 1.0 else 1.0
    wrong = testing.compare_with_gaussian(result.samples, *_exact(config, x, y, temperature=wrong_t), alpha=DEFAULT_ALPHA)
    assert not wrong.passed, f"{name}: samples accepted as T = {wrong_t}: {wrong.summary()}"
    if config.weighted:
        unweighted = testing.compare_with_gaussian(result.samples, *_exact(config, x, y, weighted=False), alpha=DEFAULT_ALPHA)
        assert not unweighted.passed, f"{name}: accepted as unweighted: {unweighted.summary()}"


# Negative controls of the thermostat check: samplers whose covariance friction is f times the
# right one (f = T: beta left out; f = M: mass left out). Their chains start at xi = A like the
# correct ones, and xi relaxes slowly (rate ~ (Nd / mu) T / gamma per unit time: ~1e5 steps with
# mu = Nd), so within the run the kinetic temperature shows the error: it settles near
# T gamma_needed / gamma_applied, here ~40-50% off T.
NEGATIVE = {
    "ccadl-beta-left-out-T2": (Config("ccadl", temperature=2.0), 2.0),
    "mccadl-mass-left-out-M4": (Config("mccadl", mass=4.0), 4.0),
}
# Chains of each control (x NEGATIVE_STEPS steps). With 3 chains the t threshold is 14.1 and the
# controls rejected on only 12% / 38% of noise streams (benchmarks/results/stream_sensitivity.json);
# CCAdL's kinetic t varies most from stream to stream, so it runs 16 chains (threshold 3.3),
# mCCAdL's 8 (4.0). Rejection rates at these sizes: `python -m benchmarks.lab.stream_sensitivity`,
# benchmarks/results/stream_sensitivity_stronger_controls.json.
NEGATIVE_CHAINS = {"ccadl-beta-left-out-T2": 16, "mccadl-mass-left-out-M4": 8}
NEGATIVE_STEPS = 600


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_thermostat_check_rejects_a_wrong_covariance_friction(name):
    config, factor = NEGATIVE[name]
    result, x, y, mean, _ = _run(config, NEGATIVE_CHAINS[name], NEGATIVE_STEPS, sigma_factor=factor)
    check = _thermostat_check(result, config, _noise_friction_scale(config, x, y, mean), alpha=DEFAULT_ALPHA)
    print(f"{name}: {check.summary()}")
    assert not check.passed, f"{name}: {check.summary()}"


def test_sgnht_xi_settles_where_the_energy_balance_puts_it():
    """SGNHT on the same problem (no covariance friction, f = 0): xi settles at
    A + (h/2) Sigma / T ~ 86 (the theory behind the xi check), which the xi check of the
    covariance samplers (xi near A) rejects. A light thermostat (mu = Nd / 100) relaxes in
    ~1000 steps; 6 chains x 3000 steps, the first 1500 dropped."""
    config = Config("ccadl")
    result, x, y, mean, _ = _run(
        config, 6, 3000, burn_in_steps=1500,
        make_sampler=lambda: kt.samplers.SGNHT(STEP, friction=FRICTION, thermal_mass=0.03),
    )
    noise_friction = _noise_friction_scale(config, x, y, mean)
    expected = _thermostat_check(result, config, noise_friction, absorbed_fraction=1.0, alpha=DEFAULT_ALPHA, kept_from=0.5)
    as_ccadl = _thermostat_check(result, config, noise_friction, alpha=DEFAULT_ALPHA, kept_from=0.5)
    print(f"sgnht: {expected.summary()}")
    assert expected.passed, expected.summary()
    assert not as_ccadl.xi_passed, as_ccadl.summary()


SLOW = {
    "ccadl": Config("ccadl"),
    "ccadl-full": Config("ccadl-full"),
    "mccadl": Config("mccadl"),
    "mccadl-diag": Config("mccadl-diag"),
    "ccadl-T2": Config("ccadl", temperature=2.0),
    # T = 1/2 and M = 1/2 double (h/2) Sigma / (M T) to 151: at h = 1e-3 xi's discretisation
    # allowance h gamma^2 / 2 alone is 8.6% of it (the friction resolution asks for 5%), and that
    # ratio goes as h^2, so these two run at h = 5e-4, with twice the chains for the slower mixing.
    "mccadl-T0.5": Config("mccadl", temperature=0.5, step_size=5e-4),
    "ccadl-M4": Config("ccadl", mass=4.0),
    "mccadl-M0.5": Config("mccadl", mass=0.5, step_size=5e-4),
    # Weights 1..3 (from the signs of both features) double the effective data and correlate
    # the coordinates' gradient noise. Measured at 32 x 5000: mCCAdL at h = 1e-3 is off by
    # +7..+14% in variance (mean t 8.8), at h = 5e-4 by +0.2..+2.9% (mean t 3.4): a step-size
    # bias, so it runs at 5e-4. CCAdL with the diagonal covariance is off by -7..-15% at both
    # step sizes: the diagonal estimate misses the correlation, so the weighted check uses the
    # full covariance (the diagonal approximation is CCAdL's documented limit, not the weights').
    # With it at h = 1e-3 the posterior passes but the kinetic temperature runs hot (t = 5.2,
    # (h/2) Sigma / T = 330), so it too runs at h = 5e-4.
    "ccadl-weighted": Config("ccadl-full", weighted=True, step_size=5e-4),
    "mccadl-weighted": Config("mccadl", weighted=True, step_size=5e-4),
}
# M = 4 and the weighted runs at h = 5e-4 mix slowest: their bias coordinate resolves 0.076 and
# 0.091 posterior sd (measured), hence 0.1 for the mean. At 32 chains CCAdL's M = 4 resolved a
# variance error of 0.101-0.122 per coordinate, on the limit, so it runs twice the chains.
SLOW_RESOLUTION = {"mean_sd": 0.1, "variance": 0.12, "friction": 0.05}
SLOW_CHAINS = {"ccadl-M4": 64, "mccadl-T0.5": 64, "mccadl-M0.5": 64}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_posterior_and_thermostat_long(name):
    """32 chains (64 where `SLOW_CHAINS` says) x 5000 steps, alpha = 1e-3, one factor (T, M or
    weights) at a time: detects a mean error of ~0.05 posterior sd and a variance error of ~8%
    per coordinate."""
    config = SLOW[name]
    result, x, y, mean, covariance = _run(config, SLOW_CHAINS.get(name, 32), 5000)
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=SLOW_ALPHA)
    thermostat = _thermostat_check(result, config, _noise_friction_scale(config, x, y, mean), alpha=SLOW_ALPHA)
    assert check.passed, f"{name}: {check.summary()}"
    assert thermostat.passed, f"{name}: {thermostat.summary()}"
    _assert_resolution(check, thermostat, SLOW_RESOLUTION)


# --- Heavy-tailed gradient noise: which covariance mCCAdL's C step uses -----------------------
#
# A regression whose feature is heavy-tailed (2% of the examples 8x larger before the feature is
# rescaled to unit mean square), so a few examples carry most of the gradient noise, as in a
# net's logits once most examples are fitted. The paper's C step uses the covariance of the
# minibatch whose kick opened the step: with 16 examples, most minibatches hold no large example
# and their covariance is far below the true one, while the rare one that does holds it in its
# kick too. `covariance="diag"` uses CCAdL's moving average instead
# (`keras_thermo.samplers.covariance_average`). h = 2e-3, A = 10: `h^2 Sigma` is about 0.7 for
# the kernel, where the exact exponential's response to the estimate is far from linear.
# Measured (16 x 3000): the minibatch covariance puts the kernel's variance 54% high (t = 11)
# and its mean 5 standard errors off; the average passes with a resolution of 12% in variance.


def _heavy_tailed_problem(num_examples=NUM_EXAMPLES, tail_fraction=0.02, tail_scale=8.0, seed=5):
    rng = np.random.default_rng(seed)
    heavy = rng.random(num_examples) < tail_fraction
    x = rng.normal(size=(num_examples, 1)) * np.where(heavy, tail_scale, 1.0)[:, None]
    x = (x / np.sqrt(np.mean(x**2))).astype(np.float32)
    y = (0.1 * x[:, 0] + 0.19 * rng.normal(size=num_examples))[:, None]
    return x, y.astype(np.float32)


@pytest.mark.slow
def test_mccadl_averaged_covariance_samples_heavy_tailed_noise_and_the_minibatch_one_does_not():
    x, y = _heavy_tailed_problem()
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD)
    checks = {}
    for kind in ("diag", "minibatch"):
        result = testing.run_chains(
            lambda: MCCAdL(2e-3, friction=FRICTION, covariance=kind, warmup_steps=0), x, y,
            num_chains=16, num_steps=3000, batch_size=BATCH, burn_in_steps=200,
            initial_params=mean.astype(np.float32), prior_std=PRIOR_STD,
        )
        checks[kind] = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=SLOW_ALPHA)
    assert checks["diag"].passed, checks["diag"].summary()
    assert np.all(checks["diag"].detectable_variance_error < 0.2), checks["diag"].summary()
    assert not checks["minibatch"].passed, checks["minibatch"].summary()
    # The direction measured: the kernel (the heavy-tailed coordinate) sampled too wide.
    assert checks["minibatch"].relative_variance_error[0] > 0.2, checks["minibatch"].summary()


if __name__ == "__main__":
    # python tests/test_statistical_ccadl.py NAME [STEP_SIZE [SAMPLER]]: the posterior figures of
    # one slow configuration (32 x 5000), optionally at another step size or with another sampler
    # ("ccadl", "ccadl-full", "mccadl"): the commands behind the measured figures above.
    import sys

    chosen = SLOW[sys.argv[1]]
    if len(sys.argv) > 2:
        chosen = dataclasses.replace(chosen, step_size=float(sys.argv[2]))
    if len(sys.argv) > 3:
        chosen = dataclasses.replace(chosen, sampler=sys.argv[3])
    run_result, _, _, exact_mean, exact_covariance = _run(chosen, 32, 5000)
    verdict = testing.compare_with_gaussian(run_result.samples, exact_mean, exact_covariance, alpha=1e-3)
    print(f"{chosen}: passed={verdict.passed}; {verdict.summary()}")
