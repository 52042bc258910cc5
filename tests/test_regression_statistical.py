"""`GaussianNLL(scale=s)` makes `BayesianModel` sample the exact posterior of linear regression with
noise standard deviation `s`, and `loss="mse"` (noise variance 1/2) does not.

With `U = N mean_i [(y_i - a_i . theta)^2 / (2 s^2) + log s + log(2 pi) / 2] + |theta|^2 /
(2 p^2)` the posterior is Gaussian with precision `A^T A / s^2 + I / p^2`. That is
`keras_thermo.testing.linear_regression_posterior` (written for `mse`, precision
`(2 A^T A + I / p'^2) / T`) at `T = 2 s^2` and `p' = p / (sqrt(2) s)`: same precision, same mean.

The chains run together in one model (`num_chains`), on the full batch (SGHMC is exact without
gradient noise, tests/test_statistical.py), started at the posterior mean; the verdict is
`keras_thermo.testing.compare_with_gaussian`'s (Student-t over independent chains,
Bonferroni-corrected, tolerances from the chains' own spread).
"""

import math

import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing

NUM_EXAMPLES = 500
NUM_FEATURES = 2
NOISE_STD = 0.5
PRIOR_STD = 1.0


def _problem():
    x, y = testing.linear_regression_data(NUM_EXAMPLES, NUM_FEATURES, noise_std=NOISE_STD, seed=1)
    mean, covariance = testing.linear_regression_posterior(
        x, y, prior_std=PRIOR_STD / (math.sqrt(2.0) * NOISE_STD), temperature=2.0 * NOISE_STD**2
    )
    return x, y, mean, covariance


def _chains(loss, x, y, start, *, num_chains, num_steps, seed=0):
    """`[C, S, Nd]` samples of `BayesianModel(num_chains=C)` under `loss`, SGHMC on the full batch."""
    net = testing.linear_regression_net(NUM_FEATURES)
    # Posterior precision ~ N / s^2 = 2000 per coordinate: h sqrt(precision) ~ 0.13, Euler biases
    # h A / 2 ~ 2% and h^2 precision / 4 ~ 0.5%; friction 15 decorrelates in ~20 steps.
    model = kt.BayesianModel(
        net, kt.samplers.SGHMC(3e-3, friction=15.0), num_examples=NUM_EXAMPLES,
        prior=kt.priors.Gaussian(PRIOR_STD), seed=seed, num_chains=num_chains, chain_minibatches="shared",
    )
    model.compile(loss=loss, steps_per_execution=100)
    model(x[:1])
    weights = [start[:-1].reshape(NUM_FEATURES, 1).astype(np.float32), start[-1:].astype(np.float32)]
    for chain in range(num_chains):
        model.set_chain_weights(chain, weights)
    burn_in = num_steps // 5
    collector = kt.callbacks.SampleCollector(burn_in, every_n_steps=5, max_samples=num_steps)
    data = kt.data.random_minibatches(x, y, NUM_EXAMPLES, seed=seed)
    model.fit(data, steps_per_epoch=num_steps, epochs=1, verbose=0, callbacks=[collector])
    return model, collector


# The short runs (8 chains x 1500 steps, ~4-7 s each on 2 shared cores) resolve mean errors of
# 0.1-0.2 posterior sd and variance errors of 25-45% (`detectable_*`); the slow run 2-3x finer.
SHORT = dict(num_chains=8, num_steps=1_500, alpha=0.01)
LONG = dict(num_chains=16, num_steps=20_000, alpha=1e-3)


def _check(loss, num_chains, num_steps, alpha):
    x, y, mean, covariance = _problem()
    model, collector = _chains(loss, x, y, mean, num_chains=num_chains, num_steps=num_steps)
    return model, collector, testing.compare_with_gaussian(collector.samples, mean, covariance, alpha=alpha)


@pytest.fixture(scope="module")
def gaussian_nll_run():
    return _check(kt.losses.GaussianNLL(scale=NOISE_STD), **SHORT)


def test_gaussian_nll_samples_the_exact_posterior_of_its_noise(gaussian_nll_run):
    _, _, check = gaussian_nll_run
    assert check.passed, check.summary()
    assert np.all(check.detectable_mean_error < 0.5), check.summary()


def test_the_check_rejects_mse_a_different_noise_variance():
    """The control: `mse` is Gaussian noise of variance 1/2, not 1/4, so its posterior
    variances are twice the exact ones, and the same check fails."""
    _, _, check = _check("mse", **SHORT)
    assert not check.passed, check.summary()
    np.testing.assert_array_less(0.5, check.relative_variance_error)  # about +100%


@pytest.mark.slow
def test_gaussian_nll_samples_the_exact_posterior_long():
    _, _, check = _check(kt.losses.GaussianNLL(scale=NOISE_STD), **LONG)
    assert check.passed, check.summary()


def test_predictive_interval_of_the_samples_is_the_exact_predictive(gaussian_nll_run):
    """From the collected chains, the predictive of a new input is `N(a . m, a^T C a + s^2)`
    (posterior mean m, covariance C): `kt.regression.predict_posterior` on the chains' samples
    `[C, S, Nd]` matches its mean, its sd and its 90% interval within Monte Carlo error."""
    _, _, mean, covariance = _problem()
    model, collector, _ = gaussian_nll_run
    x_new = np.array([[0.5, -1.0], [2.0, 1.0]], np.float32)
    samples = collector.samples[:, ::4]  # every 20th step: ~ independent, and 4x fewer passes
    prediction = kt.regression.predict_posterior(model, samples, x_new, verbose=0)
    design = np.concatenate([x_new, np.ones((2, 1))], axis=1)
    exact_mean = design @ mean
    exact_epistemic = np.sqrt(np.einsum("ni,ij,nj->n", design, covariance, design))
    # Per-chain predictive means give the Monte Carlo error of the pooled one.
    chain_means = np.einsum("csi,ni->cn", samples.astype(np.float64), design).mean(axis=1)
    threshold = testing.t_threshold(chain_means.shape[0], 2, 0.01)
    t = (prediction.mean[:, 0] - exact_mean) / testing.standard_error(chain_means)
    assert np.all(np.abs(t) < threshold), t
    # The noise dominates the total sd (~0.5 against ~0.03): a 25% error in the epistemic
    # variance moves the interval by < 0.1%.
    exact_std = np.sqrt(exact_epistemic**2 + NOISE_STD**2)
    np.testing.assert_allclose(prediction.std[:, 0], exact_std, rtol=2e-3)
    np.testing.assert_allclose(prediction.aleatoric_std[:, 0], NOISE_STD, rtol=1e-6)
    lower, upper = prediction.interval(0.9)
    half_widths = np.stack([upper[:, 0] - prediction.mean[:, 0], prediction.mean[:, 0] - lower[:, 0]])
    np.testing.assert_allclose(half_widths, 1.6448536 * np.stack([exact_std, exact_std]), rtol=2e-3)
