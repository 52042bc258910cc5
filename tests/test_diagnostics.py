"""Tests for keras_thermo.diagnostics against closed forms and a numpy R-hat reference.

Tolerances come from the spread of the estimators, measured over many independent columns
(seeds) with the same settings as the tests:

- i.i.d. N(0, 1), S = 4000, Geyer truncation: ESS / S has mean 0.972 and standard deviation
  0.055 per column (2000 columns; the truncated sum is biased slightly low). The mean over 20
  columns then has SD 0.012.
- AR(1), phi = 0.5, S = 20000: ESS / (S (1 - phi)/(1 + phi)) has mean 0.987, SD 0.047 per
  column (500 columns); the mean over 20 columns has SD 0.011.
- AR(1), phi = -0.5, S = 4000 (antithetic, ESS = 3 S): ratio mean 0.975, SD 0.113 per column.
- R-hat (TFP's variance-ratio form, split chains) of 4 i.i.d. chains of 1000 draws: mean
  1.0002, SD 0.0012, max 1.0077 over 1000 values.

Bounds sit 5 or more standard deviations away from the mean, so a correct implementation
fails with negligible probability under any seed, while a wrong axis convention or a wrong
closed form misses by far more.
"""

import numpy as np
import pytest

from keras_thermo.diagnostics import effective_sample_size, potential_scale_reduction


def ar1_chains(rng, phi, num_draws, num_columns):
    """Stationary AR(1): x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t, unit marginal variance."""
    x = np.empty((num_draws, num_columns))
    x[0] = rng.normal(size=num_columns)
    noise = rng.normal(size=(num_draws, num_columns)) * np.sqrt(1 - phi**2)
    for t in range(1, num_draws):
        x[t] = phi * x[t - 1] + noise[t]
    return x


def test_ess_of_iid_draws_is_close_to_the_number_of_draws():
    num_draws = 4000
    draws = np.random.default_rng(0).normal(size=(num_draws, 20))
    ratio = effective_sample_size(draws) / num_draws
    assert ratio.shape == (20,)
    assert np.all((ratio > 0.7) & (ratio < 1.3))  # about +-5 SD per column
    assert 0.91 < ratio.mean() < 1.04  # about +-5 SD of the 20-column mean


def test_ess_of_a_single_series_is_a_float():
    series = np.random.default_rng(1).normal(size=1000)
    ess = effective_sample_size(series)
    assert isinstance(ess, float)
    # Same estimator as a [S, 1] column.
    assert ess == pytest.approx(float(effective_sample_size(series[:, None])[0]), rel=1e-12)


def test_ess_of_ar1_matches_closed_form():
    phi, num_draws = 0.5, 20000
    closed_form = num_draws * (1 - phi) / (1 + phi)  # tau = (1 + phi) / (1 - phi) = 3
    x = ar1_chains(np.random.default_rng(2), phi, num_draws, 20)
    ratio = effective_sample_size(x) / closed_form
    assert np.all((ratio > 0.75) & (ratio < 1.25))  # about +-5 SD per column
    assert 0.93 < ratio.mean() < 1.04  # about +-5 SD of the 20-column mean


def test_ess_of_antithetic_chain_exceeds_draws_only_with_positive_pairs():
    phi, num_draws = -0.5, 4000
    x = ar1_chains(np.random.default_rng(3), phi, num_draws, 10)
    ratio = effective_sample_size(x) / (num_draws * (1 - phi) / (1 + phi))  # ESS = 3 S
    assert np.all((ratio > 0.4) & (ratio < 1.6))  # about 5 SD per column
    assert 0.8 < ratio.mean() < 1.15  # about 5 SD of the 10-column mean (SD 0.036)
    # Truncating at the first negative autocorrelation (lag 1 here) keeps only rho_0.
    thresholded = effective_sample_size(x, filter_beyond_positive_pairs=False)
    np.testing.assert_allclose(thresholded, num_draws, rtol=1e-9)


def test_ess_of_chains_combines_them_and_penalises_disagreement():
    rng = np.random.default_rng(4)
    chains = rng.normal(size=(4, 1000, 20))  # [C, S, D]
    combined = effective_sample_size(chains)
    assert combined.shape == (20,)
    # Cross-chain ESS of 4 x 1000 i.i.d. draws: per-column mean 0.97, SD 0.058 of 4000.
    assert 0.9 < combined.mean() / 4000 < 1.04
    per_chain = effective_sample_size(chains, combine_chains=False)
    assert per_chain.shape == (4, 20)
    for c in range(4):
        np.testing.assert_allclose(per_chain[c], effective_sample_size(chains[c]), rtol=1e-10)
    # A chain stuck one standard deviation away: the combined ESS collapses (to ~0.5% of 4000).
    chains[3] += 1.0
    assert effective_sample_size(chains).mean() < 100


def test_ess_of_one_chain_given_as_3d_equals_2d():
    chain = np.random.default_rng(5).normal(size=(1, 500, 3))
    np.testing.assert_allclose(effective_sample_size(chain), effective_sample_size(chain[0]))


def rhat_reference(chains):
    """Brooks & Gelman's corrected ratio, straight from the formula, chains [C, S, D]."""
    num_chains, num_draws = chains.shape[:2]
    within = chains.var(axis=1, ddof=1).mean(axis=0)
    between_over_n = chains.mean(axis=1).var(axis=0, ddof=1)
    pooled = (num_draws - 1) / num_draws * within + between_over_n
    return (num_chains + 1) / num_chains * pooled / within - (num_draws - 1) / (
        num_chains * num_draws
    )


def test_rhat_matches_formula_with_and_without_split():
    rng = np.random.default_rng(6)
    chains = rng.normal(size=(3, 101, 4)) + rng.normal(size=(3, 1, 4))
    np.testing.assert_allclose(
        potential_scale_reduction(chains, split_chains=False), rhat_reference(chains), rtol=1e-10
    )
    # Split: drop the odd last draw, halves become chains [0..49] and [50..99].
    halves = np.concatenate([chains[:, :50], chains[:, 50:100]], axis=0)
    np.testing.assert_allclose(
        potential_scale_reduction(chains), rhat_reference(halves), rtol=1e-10
    )


def test_rhat_is_near_one_for_chains_of_the_same_distribution():
    chains = np.random.default_rng(7).normal(size=(4, 1000, 5))
    rhat = potential_scale_reduction(chains)
    assert rhat.shape == (5,)
    assert np.all(np.abs(rhat - 1.0) < 0.01)  # about 8 SD


def test_rhat_flags_chains_with_different_means():
    rng = np.random.default_rng(8)
    chains = rng.normal(size=(4, 1000, 3)) + np.array([0.0, 0.0, 0.0, 1.0])[:, None, None]
    # Expected about 1 + (C+1)/C * var(means) / W = 1 + 1.25 * 0.25 ~= 1.31 unsplit.
    assert np.all(potential_scale_reduction(chains, split_chains=False) > 1.2)
    assert np.all(potential_scale_reduction(chains) > 1.1)


def test_split_rhat_flags_a_drifting_chain():
    rng = np.random.default_rng(9)
    chains = rng.normal(size=(4, 1000))
    chains[0] += np.linspace(-2.0, 2.0, 1000)  # one chain drifts; its halves disagree
    assert potential_scale_reduction(chains) > 1.1
    assert potential_scale_reduction(chains).shape == ()


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: effective_sample_size(np.zeros((2, 3, 4, 5))),
            r"`samples` must be .*shape \(2, 3, 4, 5\)",
        ),
        (lambda: effective_sample_size(np.zeros(1)), "at least 2 draws"),
        (lambda: effective_sample_size(np.array([0.0, np.nan, 1.0])), "finite"),
        (lambda: potential_scale_reduction(np.zeros((1, 10, 2))), "at least 2 chains"),
        (lambda: potential_scale_reduction(np.zeros((2, 3))), "at least 4 draws"),
        (lambda: potential_scale_reduction(np.zeros(10)), r"`chains` must be .*shape \(10,\)"),
    ],
)
def test_invalid_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
