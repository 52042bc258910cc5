"""Statistical correctness of SGLD, SGHMC and SGNHT on Bayesian linear regression, through fit.

Each method is tested in the regime where it is exact (DESIGN section 8, issue 2):
SGLD with small steps; SGHMC with the full batch (no gradient noise); SGNHT with minibatch noise
that is roughly constant and isotropic (Gaussian inputs), which its thermostat absorbs.

Verdicts come from `keras_thermo.testing.compare_with_gaussian`: independent chains, a Student-t
statistic per posterior mean and marginal variance, Bonferroni-corrected at familywise level
`alpha`. The default suite runs a short version (`alpha = 0.01`); `-m slow` runs 16 longer chains
at `alpha = 1e-3`, which resolves biases of about 2% of a posterior std.
"""

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing

NUM_EXAMPLES = 500
PRIOR_STD = 1.0


@pytest.fixture(scope="module")
def problem():
    x, y = testing.linear_regression_data(NUM_EXAMPLES, 2, seed=0)
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD)
    return x, y, mean, covariance


# name: (sampler factory, batch size). Posterior precision ~ 1e3 per coordinate here, so the
# steps keep h * sqrt(precision) <= 0.1 and the Euler biases (h A / 2, h^2 precision / 4 for
# SGHMC; eps precision / 4 for SGLD) below 1%.
REGIMES = {
    "sgld-small-steps": (lambda: kt.samplers.SGLD(2e-5), 50),
    "sghmc-full-batch": (lambda: kt.samplers.SGHMC(3e-3, friction=5.0), NUM_EXAMPLES),
    "sgnht-euler-minibatch": (lambda: kt.samplers.SGNHT(2e-3, friction=5.0), 100),
    "sgnht-symmetric-minibatch": (lambda: kt.samplers.SGNHT(2e-3, friction=5.0, integrator="symmetric"), 100),
}

SHORT = dict(num_chains=10, num_steps=10_000, alpha=0.01)
LONG = dict(num_chains=16, num_steps=40_000, alpha=1e-3)


def _run(problem, name, num_chains, num_steps, alpha):
    x, y, mean, covariance = problem
    make_sampler, batch_size = REGIMES[name]
    result = testing.run_chains(
        make_sampler, x, y, num_chains=num_chains, num_steps=num_steps, batch_size=batch_size,
        burn_in_steps=num_steps // 10, every_n_steps=5, prior_std=PRIOR_STD,
        log_keys=("kinetic_temperature", "xi"),
    )
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=alpha)
    return result, check


def _assert_thermostat(result, alpha):
    """Kinetic temperature averages T = 1, and xi is stationary in the second half of the run."""
    kinetic = result.logs["kinetic_temperature"]
    xi = result.logs["xi"]
    num_chains, length = kinetic.shape
    after_burn_in = slice(length // 10, None)
    threshold = testing.t_threshold(num_chains, 2, alpha)
    t_kinetic = testing.chain_t_statistic(kinetic[:, after_burn_in].mean(axis=1, keepdims=True), np.array([1.0]))
    assert abs(t_kinetic[0]) < threshold, f"kinetic temperature t = {t_kinetic[0]:.2f}"
    third = xi[:, length // 2 : 3 * length // 4].mean(axis=1)
    fourth = xi[:, 3 * length // 4 :].mean(axis=1)
    t_xi = testing.chain_t_statistic((fourth - third)[:, None], np.array([0.0]))
    assert abs(t_xi[0]) < threshold, f"xi still drifting: t = {t_xi[0]:.2f}"
    assert np.all(xi[:, after_burn_in] > 0)


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_posterior_mean_and_variances_short(problem, name):
    result, check = _run(problem, name, **SHORT)
    assert check.passed, check.summary()
    if name.startswith("sgnht"):
        _assert_thermostat(result, SHORT["alpha"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGIMES))
def test_posterior_mean_and_variances_long(problem, name):
    result, check = _run(problem, name, **LONG)
    assert check.passed, check.summary()
    if name.startswith("sgnht"):
        _assert_thermostat(result, LONG["alpha"])


def test_the_check_detects_a_wrong_temperature(problem):
    """The same check rejects samples of the wrong distribution (T = 2 instead of 1)."""
    x, y, mean, covariance = problem
    make_sampler, batch_size = REGIMES["sghmc-full-batch"]
    result = testing.run_chains(
        make_sampler, x, y, num_chains=6, num_steps=4000,
        batch_size=batch_size, burn_in_steps=1000, every_n_steps=5, prior_std=PRIOR_STD,
        temperature=2.0,
    )
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=SHORT["alpha"])
    assert not check.passed
    np.testing.assert_array_less(0.5, check.relative_variance_error)  # about +100%
