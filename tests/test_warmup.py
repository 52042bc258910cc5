"""The thermostat samplers' warm-up from Keras' default initialisation.

Linear regression with N = 2000 examples, d = 5 Gaussian features, minibatches of 1000 drawn with
replacement, h = 1e-3, A = 1, prior variance 10; every chain starts at Keras' default
initialisation of `Dense(1)` (Glorot-uniform kernel, zero bias), ~1e4 T of potential energy above
the posterior. Without a warm-up the thermostat absorbs that energy by driving xi to 50-100, and
then falls by only ~h T per step while the chain runs at a kinetic temperature ~A T / xi: the
samples after thousands of steps have a few percent of the posterior variance. With the default
warm-up (1000 steps, then the papers' algorithm restarted from the weights reached, xi from the
warm-up's heat balance) the samples from the end of the warm-up have the posterior variance.

Statistic: each chain's marginal variances (about the pooled mean, `testing.chain_moments`) over
the exact ones, averaged over the 6 coordinates: one estimate per independent chain, so the
Student t of their mean against 1 has C - 1 degrees of freedom (`testing.chain_t_statistic`).
Each test asserts its resolution (threshold x standard error).

The default tests run `sampler.update` in a compiled loop (`testing.simulate_regression_chains`);
the slow ones also go through `BayesianModel.fit` with four chains from the net's default starts.

Run `python -m tests.test_warmup` for the table of variance ratios with and without warm-up.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.samplers.ccadl import CCAdL
from keras_thermo.samplers.mccadl import MCCAdL

NUM_EXAMPLES, NUM_FEATURES, BATCH, STEP, FRICTION, PRIOR_STD = 2000, 5, 1000, 1e-3, 1.0, 10**0.5
ALPHA = 0.01
SAMPLERS = {"sgnht": kt.samplers.SGNHT, "ccadl": CCAdL, "mccadl": MCCAdL}


def _problem():
    x, y = testing.linear_regression_data(NUM_EXAMPLES, NUM_FEATURES, seed=0)
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD)
    return x, y, mean, covariance


def variance_ratios(name: str, *, num_chains: int, num_steps: int, sample_from: int, seed: int = 3, **options):
    """Per-chain variance ratios `[C]` (mean over coordinates) of samples from `sample_from` on."""
    x, y, _, covariance = _problem()
    starts = testing.default_initial_params(NUM_FEATURES, num_chains, seed=11 + seed)
    result = testing.simulate_regression_chains(
        lambda: SAMPLERS[name](STEP, friction=FRICTION, **options), x, y, starts, num_steps=num_steps,
        batch_size=BATCH, burn_in_steps=sample_from, prior_std=PRIOR_STD, seed=seed,
    )
    _, variances = testing.chain_moments(result.samples)
    return (variances / np.diag(covariance)).mean(axis=1)


def assert_posterior_variance(ratios: np.ndarray, resolution: float):
    threshold = testing.t_threshold(len(ratios), 1, ALPHA)
    t = testing.chain_t_statistic(ratios[:, None], np.ones(1))[0]
    detectable = threshold * testing.standard_error(ratios[:, None])[0]
    assert detectable < resolution, (ratios, detectable)
    assert abs(t) < threshold, (ratios, t, threshold)


def test_warmup_default_is_documented_and_kept_in_the_config():
    sampler = kt.samplers.SGNHT(STEP)
    assert sampler.warmup_steps == kt.samplers.base.DEFAULT_WARMUP_STEPS == 1000
    assert kt.samplers.SGNHT.from_config(kt.samplers.SGNHT(STEP, warmup_steps=7).get_config()).warmup_steps == 7
    with pytest.raises(ValueError, match="warmup_steps.*>= 0.*-1"):
        MCCAdL(STEP, warmup_steps=-1)


def test_sgnht_from_default_start_has_the_posterior_variance_after_the_default_warmup():
    # 8 chains x (1000 warm-up + 3000 samples), ~8 s; the cold run without warm-up is 0.93 below
    # 1, so a resolution of 0.3 separates them by 3 resolutions.
    ratios = variance_ratios("sgnht", num_chains=8, num_steps=4000, sample_from=1000)
    assert_posterior_variance(ratios, resolution=0.3)


def test_sgnht_without_warmup_is_cold():
    # The same run with warmup_steps=0 (the papers' algorithm from the default start): measured
    # mean ratio 0.07; the warm-up is what makes the test above pass.
    ratios = variance_ratios("sgnht", num_chains=4, num_steps=3000, sample_from=1000, warmup_steps=0)
    assert np.all(ratios < 0.3), ratios
    threshold = testing.t_threshold(len(ratios), 1, ALPHA)
    assert abs(testing.chain_t_statistic(ratios[:, None], np.ones(1))[0]) > threshold, ratios


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mccadl", "ccadl"])
def test_covariance_samplers_from_default_start_after_the_default_warmup(name):
    # 8 chains x (1000 + 4000 steps). Measured mean ratios: mCCAdL 0.99 +- 0.01, CCAdL 0.92 +- 0.03.
    ratios = variance_ratios(name, num_chains=8, num_steps=5000, sample_from=1000)
    assert_posterior_variance(ratios, resolution=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mccadl", "ccadl"])
def test_covariance_samplers_without_warmup_are_cold(name):
    ratios = variance_ratios(name, num_chains=4, num_steps=5000, sample_from=1000, warmup_steps=0)
    assert np.all(ratios < 0.3), ratios


def main():
    print("sampler  warmup  samples  chains  variance ratio (mean +- se)")
    for name in SAMPLERS:
        for warmup in (0, 1000):
            ratios = variance_ratios(name, num_chains=8, num_steps=5000, sample_from=1000, warmup_steps=warmup)
            error = testing.standard_error(ratios[:, None])[0]
            print(f"{name:8s} {warmup:6d}  1000-5000  8  {ratios.mean():.3f} +- {error:.3f}", flush=True)


if __name__ == "__main__":
    main()
