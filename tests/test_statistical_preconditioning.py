"""Preconditioned samplers still sample the linear-regression posterior (the shared check of
`keras_thermo.testing`), on a badly scaled design where the unpreconditioned chain mixes poorly.

The problem: N = 500 examples, 2 Gaussian features scaled by 10, prior N(0, 1). The kernel's
posterior precision (P ~ 2 N 100 = 1e5) is 100 times the bias's (~2 N = 1e3): the step size is
set by the stiff kernel, and without preconditioning the bias crawls. The layerwise mass
(estimated over a 200-step warm-up from the start at the posterior mean, then frozen) is
proportional to each variable's force rms, ~sqrt(P) at equilibrium: the kernel gets ~10x the
bias's mass (m ~ 1.4 and 0.14 after normalising to mean 1), which speeds the bias up at the
same step size.

Settings, per sampler (`REGIMES`), each in the regime where the sampler is exact, with its
discretisation bias well below the resolution the test asserts:

- SGLD, SGHMC, SGNHT and TACT-HMC run on the full batch (no gradient noise: SGLD is then the
  unadjusted Langevin algorithm and SGNHT's thermostat has nothing to absorb). SGLD's variance
  bias is ~eps P / (4 m) <= 2% at eps = 1e-6; the momentum samplers keep `h sqrt(P / m) <= 0.1`
  with h = 3e-4 and A = 50 (TACT-HMC: eta = h^2, noise c = A h). These three draw the same
  noise (keyed by seed and step) and on the full batch their thermostats stay at A, so their
  chains nearly coincide: their checks cover each sampler's code path under the mass.
- TACT-HMC runs with `tempering=False` (its thermostats-only ablation, where every step is on
  the plateau): with tempering, xi spends only ~2% of the steps on the plateau on this problem
  (the report's `tact_hmc_tempered`: 352 plateau samples in 16,000 steps for the fewest of 4
  chains with the mass, 378 without; too few for the check to reject even T = 2). The mass
  enters only theta's update and thermostat, which this covers; the tempered chain is checked
  on an easier problem in tests/test_tact_hmc.py.
- CCAdL and mCCAdL need gradient noise to correct: minibatches of 50 drawn with replacement
  (white noise, as their papers assume; with the full batch their covariance estimate would see
  noise that is not there), h = 3e-4 and A = 10, where the covariance friction carries most of
  the kernel's dissipation ((h/2) Sigma ~ 100).

Measured with the layerwise mass (the report): the checks resolve every mean to 0.01-0.17
posterior sd and every variance to 6-34% (`detectable_*`), and find |t| <= 2.2 against
thresholds 3.8-4.9; the bias's autocorrelation time drops from 2452 to 175 steps (SGLD), 317
to 70 (SGHMC, SGNHT, TACT-HMC) and 227 to 89 (CCAdL, mCCAdL), while the kernel's rises from
~23 to ~28 (40 to 58 for SGLD).

The RMSprop mass (pSGLD, `Preconditioner("rmsprop")`) changes every step and the chain drops
pSGLD's correction term `Gamma`, so it is approximate. Its bias comes from the mass following
the position: in the continuous-time limit of SGLD with a mass `m(theta)` and no `Gamma`, the
stationary density is `exp(-U / T) m(theta)` instead of `exp(-U / T)` (in one dimension, zero
Fokker-Planck flux needs `p / m` proportional to `exp(-U / T)`). With no averaging (decay 0)
the mass is the current `|F| ~ P |theta - mean|`, so each marginal becomes `|x| exp(-x^2 / 2
s^2)`, whose variance is twice the target's: +100% (measured: +76% to +107%; SGHMC and SGNHT,
whose mass acts through the momentum, +16% to +60%), which
`test_rmsprop_without_averaging_is_rejected` checks. The moving average makes the mass depend on
the recent path instead: the part that follows theta shrinks as the decay approaches 1 (the mass
averages over ~1 / (1 - decay) steps, here at least the bias's autocorrelation time), so at decay
0.999 what is left is small but not zero: with 24 SGLD chains the bias's variance came out
7-18% high on each of three seeds on two noise streams, which 8 chains could not resolve (on one
stream they resolved that variance to 71% only). `test_rmsprop_mass_with_slow_average_samples_the_posterior`
therefore bounds SGLD's bias (every variance within 50%, every mean within half a posterior sd, as
upper confidence bounds) instead of asking for the exact samplers' verdict (SGHMC and SGNHT, whose
mass acts through the momentum, still pass it). At pSGLD's usual
0.99 the check rejects SGLD on this full-batch problem
(variance +9%, +8%, +31%, t up to 6.4 against 4.9), while SGHMC and SGNHT pass (within 3.2%):
the bias is real and problem-dependent, so it is reported, not asserted. (With minibatches the
gradient noise dominates `V` and the mass follows theta less.)

Every check has a negative control: the same samples are rejected against the posterior at
T = 2 (the check's power on those very samples: t from -11 to -89), and the decay-0 RMSprop
chains are rejected.

All runs here are slow (0.5-2.5 minutes each on 2 cores, above the default suite's share): the
default suite checks the preconditioned updates one step at a time against hand computations
and the frozen masses on resume (tests/test_preconditioning.py).
`PYTHONPATH=. python tests/test_statistical_preconditioning.py` prints every figure (t
statistics against the threshold, autocorrelation times with and without the mass).
"""

import dataclasses
from typing import Callable

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.samplers.preconditioning import Preconditioner
from keras_thermo.samplers.tact_hmc import TACTHMC

NUM_EXAMPLES = 500
PRIOR_STD = 1.0
FEATURE_SCALE = 10.0
WARMUP = 200
# Long enough for the RMSprop average (1 / (1 - 0.999) steps) and the layerwise warm-up.
MIN_BURN_IN = 1000
ALPHA = 0.01
RMSPROP_DECAY = 0.999
PSGLD_DECAY = 0.99  # pSGLD's usual value: reported, not asserted (module doc)


@dataclasses.dataclass(frozen=True)
class Regime:
    make: Callable  # preconditioner (None or a Preconditioner) -> sampler
    batch_size: int
    num_chains: int
    num_steps: int


H = 3e-4  # the momentum samplers' time step: h sqrt(P / m) <= 0.1 on the stiff kernel
# Sizes: the slow mode (mostly the bias, which also leaks into the first kernel weight through
# the design's nonzero feature means) sets the resolution; these give every variance to within
# ~10-30% (`detectable_variance_error`) in 1-2.5 minutes a test on 2 cores.
REGIMES = {
    "sgld": Regime(lambda p: kt.samplers.SGLD(1e-6, preconditioner=p), NUM_EXAMPLES, 8, 16_000),
    "sghmc": Regime(lambda p: kt.samplers.SGHMC(H, friction=50.0, preconditioner=p), NUM_EXAMPLES, 16, 8_000),
    "sgnht": Regime(lambda p: kt.samplers.SGNHT(H, friction=50.0, preconditioner=p), NUM_EXAMPLES, 16, 8_000),
    "tact_hmc": Regime(
        lambda p: TACTHMC(H**2, noise=50.0 * H, sample_every=1, tempering=False, preconditioner=p),
        NUM_EXAMPLES, 16, 8_000,
    ),
    "ccadl": Regime(lambda p: kt.samplers.CCAdL(H, friction=10.0, preconditioner=p), 50, 16, 8_000),
    # The paper's minibatch C step: its mass-weighted factor (ScaledColumns) has no other statistical check.
    "mccadl": Regime(lambda p: kt.samplers.MCCAdL(H, friction=10.0, preconditioner=p, covariance="minibatch"), 50, 16, 8_000),
}
RMSPROP_SAMPLERS = ("sgld", "sghmc", "sgnht")
# Reported by `__main__` only: TACT-HMC with tempering on this problem, where xi sits on the
# plateau for too few steps to feed the check (module doc).
REPORT_ONLY = {
    "tact_hmc_tempered": Regime(
        lambda p: TACTHMC(H**2, xi_step_size=2e-4, noise=50.0 * H, xi_noise=0.1, sample_every=1, preconditioner=p),
        NUM_EXAMPLES, 4, 20_000,
    ),
}

# The slow average's chains: SGLD's 8 resolved the bias's variance to 71% only, on one noise stream
# (the bound asserted is 50%); with 24 the resolution was 16-29% and the excess 7-18%, an upper
# bound up to 0.47, so it runs 48 (resolution about 11-20%).
SLOW_AVERAGE_CHAINS = {"sgld": 48, "sghmc": 16, "sgnht": 16}
# The decay-0 control's chains and the floor of every variance's excess. Measured with 48 chains
# on two noise streams: SGLD +82% to +106% (variance t above 14), SGHMC +35% to +60% (t above 9),
# SGNHT +30% to +37% on the kernel weights (t 6.3-7.2 against 3.3) and +16% to +26% on the bias
# (t 3.6-5.5). At its regime's 16 chains SGNHT was not rejected on one stream (t 2.2-2.7 against
# 3.8), so it runs 48 with a floor of 0 (its bias's excess is too near 0.2 for that floor to hold
# on every stream); SGHMC runs 32 (standard error of its excess about 0.05, three below its
# smallest) with the floor of 0.2, SGLD 16 with 0.5.
NO_AVERAGING_CHAINS = {"sgld": 16, "sghmc": 32, "sgnht": 48}
NO_AVERAGING_FLOOR = {"sgld": 0.5, "sghmc": 0.2, "sgnht": 0.0}

# SGHMC's long run, as before: 16 chains x 20,000 steps at alpha = 1e-3.
LONG = dict(num_chains=16, num_steps=20_000, alpha=1e-3)


def _problem(temperature=1.0):
    x, y = testing.linear_regression_data(NUM_EXAMPLES, 2, seed=0)
    x = x * np.float32(FEATURE_SCALE)
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD, temperature=temperature)
    return x, y, mean, covariance


def _preconditioner(kind, decay=RMSPROP_DECAY):
    if kind is None:
        return None
    if kind == "layerwise":
        return Preconditioner("layerwise", warmup_steps=WARMUP)
    return Preconditioner("rmsprop", decay=decay)


def _run(name, kind, *, decay=RMSPROP_DECAY, num_chains=None, num_steps=None, alpha=ALPHA):
    regime = {**REGIMES, **REPORT_ONLY}[name]
    num_chains = num_chains or regime.num_chains
    num_steps = num_steps or regime.num_steps
    x, y, mean, covariance = _problem()
    result = testing.run_chains(
        lambda: regime.make(_preconditioner(kind, decay)), x, y, num_chains=num_chains,
        num_steps=num_steps, batch_size=regime.batch_size,
        burn_in_steps=max(num_steps // 5, MIN_BURN_IN), every_n_steps=1, prior_std=PRIOR_STD,
        initial_params=mean.astype(np.float32),
    )
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=alpha)
    return result, check


def _hot_check(result, alpha=ALPHA):
    """The same samples against the posterior at T = 2 (negative control)."""
    _, _, mean, covariance = _problem(temperature=2.0)
    return testing.compare_with_gaussian(result.samples, mean, covariance, alpha=alpha)


def autocorrelation_time(chains: np.ndarray, max_lag: int = 2000) -> float:
    """Integrated autocorrelation time (in samples) of one coordinate's chains `[C, S]`, pooled
    over the chains, summed up to the first negative autocorrelation (Geyer's initial positive
    sequence, simplified)."""
    centered = chains - chains.mean()
    variance = np.mean(centered**2)
    total = 1.0
    for lag in range(1, min(max_lag, chains.shape[1] - 1)):
        rho = np.mean(centered[:, lag:] * centered[:, :-lag]) / variance
        if rho < 0:
            break
        total += 2 * rho
    return float(total)


def _assert_passes_and_hot_is_rejected(name, result, check):
    assert check.passed, f"{name}: {check.summary()}"
    # The resolution behind the verdict (measured: 0.05-0.2 sd and 5-30%, see the report): every
    # mean to better than half a posterior sd, every variance to better than the T = 2
    # control's -50%.
    assert np.all(check.detectable_mean_error < 0.5), check.summary()
    assert np.all(check.detectable_variance_error < 0.5), check.summary()
    hot = _hot_check(result)
    assert not hot.passed, f"{name}: accepted as T = 2: {hot.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGIMES))
def test_layerwise_mass_samples_the_posterior(name):
    result, check = _run(name, "layerwise")
    _assert_passes_and_hot_is_rejected(name, result, check)


@pytest.mark.slow
@pytest.mark.parametrize("name", RMSPROP_SAMPLERS)
def test_rmsprop_mass_with_slow_average_samples_the_posterior(name):
    """decay = 0.999: the mass averages over ~1000 steps and its bias shrinks (module doc). SGHMC
    and SGNHT pass the exact samplers' check. SGLD's bias stays resolvable (module doc), so for it
    the upper confidence bound of every variance error must be below half the decay-0 excess
    (+100%), of every mean error below half a posterior sd; the T = 2 control is rejected."""
    result, check = _run(name, "rmsprop", num_chains=SLOW_AVERAGE_CHAINS[name])
    if name != "sgld":
        _assert_passes_and_hot_is_rejected(name, result, check)
        return
    _, _, _, covariance = _problem()
    mean_bound = np.abs(check.mean_error) / np.sqrt(np.diag(covariance)) + check.detectable_mean_error
    variance_bound = np.abs(check.relative_variance_error) + check.detectable_variance_error
    assert np.all(mean_bound < 0.5), check.summary()
    assert np.all(variance_bound < 0.5), check.summary()
    hot = _hot_check(result)
    assert not hot.passed, f"{name}: accepted as T = 2: {hot.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", RMSPROP_SAMPLERS)
def test_rmsprop_without_averaging_is_rejected(name):
    """decay = 0: the mass follows the current force, the dropped `Gamma` term matters and the
    variance comes out far too large (+100% predicted for SGLD; module doc): the check rejects a
    variance as too large, and every variance comes out above the posterior's by more than the
    sampler's floor (`NO_AVERAGING_FLOOR`)."""
    _, check = _run(name, "rmsprop", decay=0.0, num_chains=NO_AVERAGING_CHAINS[name])
    assert not check.passed, f"{name}: {check.summary()}"
    assert np.max(check.variance_t) > check.threshold, check.summary()
    assert np.all(check.relative_variance_error > NO_AVERAGING_FLOOR[name]), check.summary()


@pytest.mark.slow
def test_layerwise_mass_samples_the_posterior_long():
    _, check = _run("sghmc", "layerwise", **LONG)
    assert check.passed, check.summary()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGIMES))
def test_layerwise_mass_mixes_the_bias_faster_than_the_unit_mass(name):
    """The reason for the mass: the bias's integrated autocorrelation time at least halves at
    the same step size (4 chains each; the report prints the times of the full runs)."""
    num_chains = 4
    preconditioned, _ = _run(name, "layerwise", num_chains=num_chains)
    plain, _ = _run(name, None, num_chains=num_chains)
    bias_time = [autocorrelation_time(result.samples[:, :, -1]) for result in (preconditioned, plain)]
    assert bias_time[0] * 2 < bias_time[1], bias_time


def _report(label, result, check):
    times = [autocorrelation_time(result.samples[:, :, i]) for i in range(3)]
    print(f"{label}: passed={check.passed}; {result.samples.shape[1]} samples per chain; autocorrelation "
          f"times (kernel, kernel, bias) {np.round(times, 1)} samples; {check.summary()}", flush=True)


if __name__ == "__main__":
    # python tests/test_statistical_preconditioning.py [NAME ...]: every regime (or the named
    # ones, including REPORT_ONLY's) without a mass and with the layerwise mass, plus the T = 2
    # control of the layerwise samples, and (SGLD, SGHMC, SGNHT) with RMSprop at decay 0.999,
    # 0.99 and 0. Samples are every step (TACT-HMC: every plateau step), so autocorrelation
    # times are in steps.
    import sys

    for regime_name in sys.argv[1:] or sorted(REGIMES):
        for kind, decay in [(None, None), ("layerwise", None)] + (
            [("rmsprop", RMSPROP_DECAY), ("rmsprop", PSGLD_DECAY), ("rmsprop", 0.0)]
            if regime_name in RMSPROP_SAMPLERS else []
        ):
            chains = (SLOW_AVERAGE_CHAINS if decay == RMSPROP_DECAY else NO_AVERAGING_CHAINS if decay == 0.0 else {}).get(regime_name)
            run, verdict = _run(regime_name, kind, decay=decay, num_chains=chains)
            _report(f"{regime_name} preconditioner={kind}" + (f" decay={decay}" if decay is not None else ""), run, verdict)
            if kind == "layerwise":
                print(f"{regime_name} layerwise against T = 2: passed={_hot_check(run).passed}; {_hot_check(run).summary()}")
