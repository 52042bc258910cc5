"""Preconditioned samplers still sample the linear-regression posterior (the shared check of
`keras_thermo.testing`), on a badly scaled design where the unpreconditioned chain mixes poorly.

The features are scaled by 10, so the kernel's posterior precision (~2 N 100 = 1e5) is 100 times
the bias's (~2 N): the step size is set by the stiff kernel, and without preconditioning the bias
crawls. The layerwise mass (estimated over a warm-up from the start at the posterior mean, then
frozen) gives the kernel ~10x the bias's mass, which speeds the bias up several times at the same
step size. SGHMC runs on the full batch (no gradient noise, its exact regime) with
`h sqrt(precision / m) <= 0.1`.

All runs here are slow (8 chains x 3000 steps on the full batch cost ~15 s on 2 cores, above the
default suite's share): the default suite checks the preconditioned updates one step at a time
against hand computations and the frozen masses on resume (tests/test_preconditioning.py).
`PYTHONPATH=. python tests/test_statistical_preconditioning.py` prints the figures of the short runs.
"""

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.samplers.preconditioning import Preconditioner

NUM_EXAMPLES = 500
PRIOR_STD = 1.0
FEATURE_SCALE = 10.0
STEP_SIZE = 3e-4
FRICTION = 50.0
WARMUP = 200

SHORT = dict(num_chains=8, num_steps=3_000, alpha=0.01)
LONG = dict(num_chains=16, num_steps=20_000, alpha=1e-3)


def _problem():
    x, y = testing.linear_regression_data(NUM_EXAMPLES, 2, seed=0)
    x = x * np.float32(FEATURE_SCALE)
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD)
    return x, y, mean, covariance


def _make_sampler(preconditioner):
    def make():
        return kt.samplers.SGHMC(
            STEP_SIZE, friction=FRICTION,
            preconditioner=None if preconditioner is None else Preconditioner(preconditioner, warmup_steps=WARMUP),
        )

    return make


def _run(preconditioner, num_chains, num_steps, alpha):
    x, y, mean, covariance = _problem()
    result = testing.run_chains(
        _make_sampler(preconditioner), x, y, num_chains=num_chains, num_steps=num_steps,
        batch_size=NUM_EXAMPLES, burn_in_steps=max(num_steps // 5, WARMUP), every_n_steps=1,
        prior_std=PRIOR_STD, initial_params=mean.astype(np.float32),
    )
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=alpha)
    return result, check


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


@pytest.mark.slow
def test_layerwise_mass_samples_the_posterior_short():
    _, check = _run("layerwise", **SHORT)
    assert check.passed, check.summary()


@pytest.mark.slow
def test_layerwise_mass_samples_the_posterior_long():
    _, check = _run("layerwise", **LONG)
    assert check.passed, check.summary()


@pytest.mark.slow
def test_layerwise_mass_mixes_the_bias_faster_than_the_unit_mass():
    preconditioned, _ = _run("layerwise", **SHORT)
    plain, _ = _run(None, **SHORT)
    bias_time = [autocorrelation_time(result.samples[:, :, -1]) for result in (preconditioned, plain)]
    assert bias_time[0] * 2 < bias_time[1], bias_time


if __name__ == "__main__":
    for kind in ("layerwise", None):
        result, check = _run(kind, **SHORT)
        times = [autocorrelation_time(result.samples[:, :, i]) for i in range(3)]
        print(f"preconditioner={kind}: passed={check.passed}; autocorrelation times (kernel, kernel, bias) "
              f"{np.round(times, 1)}; {check.summary()}")
