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
from scipy import stats
from scipy.special import softmax

from keras_thermo import diagnostics
from keras_thermo.callbacks import SampleCollector
from keras_thermo.diagnostics import effective_sample_size, potential_scale_reduction, summary


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


# --------------------------------------------------------------------------------------------
# summary: split R-hat and ESS across chains, condensed


def ar1_chain_array(rng, phi, num_chains, num_draws, num_columns, centres=None):
    """[C, S, D] stationary AR(1) chains of unit variance around `centres` [C] (default 0)."""
    flat = ar1_chains(rng, phi, num_draws, num_chains * num_columns)  # [S, C * D]
    chains = flat.reshape(num_draws, num_chains, num_columns).transpose(1, 0, 2)
    if centres is not None:
        chains = chains + np.asarray(centres, np.float64)[:, None, None]
    return chains


def test_summary_condenses_tfps_per_scalar_statistics(monkeypatch):
    rng = np.random.default_rng(10)
    chains = rng.normal(size=(3, 40, 7)) + 0.3 * rng.normal(size=(3, 1, 7))  # chains disagree a bit
    rhat = potential_scale_reduction(chains)
    ess = effective_sample_size(chains)
    report = summary(chains, quantiles=(0.1, 0.9), rhat_threshold=1.05)
    assert set(report) == {"parameters"}
    section = report["parameters"]
    assert (section["num_chains"], section["num_draws"], section["num_scalars"], section["num_constant"]) == (3, 40, 7, 0)
    order_statistic = lambda values, q: float(np.quantile(values, q, method="inverted_cdf"))  # noqa: E731
    assert section["rhat"] == {
        "worst": pytest.approx(rhat.max(), rel=1e-12),
        "worst_index": int(np.argmax(rhat)),
        "median": pytest.approx(order_statistic(rhat, 0.5), rel=1e-12),
        "quantiles": {"q10": pytest.approx(order_statistic(rhat, 0.1), rel=1e-12),
                      "q90": pytest.approx(order_statistic(rhat, 0.9), rel=1e-12)},
        "num_undefined": 0,
        "threshold": 1.05,
        "fraction_above_threshold": float(np.mean(rhat > 1.05)),
    }
    assert section["ess"]["worst"] == pytest.approx(ess.min(), rel=1e-12)
    assert section["ess"]["worst_index"] == int(np.argmin(ess))
    assert section["ess"]["quantiles"]["q10"] == pytest.approx(order_statistic(ess, 0.1), rel=1e-12)
    # Computed by blocks of two scalars (as for a network too large for one block): same figures.
    monkeypatch.setattr(diagnostics, "SUMMARY_BLOCK_ELEMENTS", 3 * 40 * 2)
    blocked = summary(chains, quantiles=(0.1, 0.9), rhat_threshold=1.05)["parameters"]
    assert blocked["rhat"] == section["rhat"] and blocked["ess"]["worst"] == pytest.approx(ess.min(), rel=1e-12)


def test_summary_of_predictive_probabilities_has_one_rhat_per_example_and_class(tmp_path):
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(4, 30, 5, 3)) + rng.normal(size=(4, 1, 5, 3))  # [C, S, n, K]
    probs = softmax(logits, axis=-1)
    per_entry = potential_scale_reduction(np.log(probs).reshape(4, 30, 15)).reshape(5, 3)  # log scale
    section = summary(probs=probs)["predictive"]
    assert (section["num_examples"], section["num_classes"], section["num_chains"]) == (5, 3, 4)
    assert section["rhat"]["worst"] == pytest.approx(per_entry.max(), rel=1e-12)
    assert section["rhat"]["worst_index"] == list(np.unravel_index(np.argmax(per_entry), (5, 3)))
    # Parameters from a .npy store (memory-mapped) and a SampleCollector-free array agree.
    weights = rng.normal(size=(4, 30, 6)).astype("float32")
    np.save(tmp_path / "chains.npy", weights)
    both = summary(tmp_path / "chains.npy", probs=probs)
    assert both["parameters"] == summary(weights)["parameters"]
    assert both["predictive"] == section


def test_summary_leaves_out_constant_scalars_and_reports_stuck_ones_as_infinite():
    rng = np.random.default_rng(12)
    probs = softmax(rng.normal(size=(2, 20, 3, 2)), axis=-1)
    probs[:, :, 1] = [1.0, 0.0]  # example 1 saturated in every draw: no R-hat for its 2 entries
    section = summary(probs=probs)["predictive"]
    assert section["num_constant"] == 2
    assert np.isfinite(section["rhat"]["worst"]) and section["rhat"]["worst_index"][0] != 1
    chains = rng.normal(size=(2, 20, 3))
    chains[:, :, 2] = np.array([0.0, 1.0])[:, None]  # constant within each chain, chains apart
    rhat = summary(chains, quantiles=(0.99,))["parameters"]["rhat"]
    assert rhat["worst"] == np.inf and rhat["worst_index"] == 2
    assert rhat["quantiles"]["q99"] == np.inf  # an order statistic, not inf - inf = NaN
    all_constant = summary(np.zeros((2, 10, 2)))["parameters"]
    assert all_constant["num_constant"] == 2 and np.isnan(all_constant["rhat"]["worst"])


def _confident_chains(rng, num_draws=40):
    """[4, S, 30, 3] probabilities of a confident net: logits ~200 apart, jittered per draw.

    Most entries are below 1e-3 or above 1 - 1e-3, many below 1e-154 (where squared
    deviations underflow in float64) without being constant.
    """
    centres = 200.0 * rng.normal(size=(30, 3))
    return softmax(centres + rng.normal(size=(4, num_draws, 30, 3)), axis=-1)


def test_rhat_and_ess_do_not_underflow_on_tiny_draws():
    # Both statistics are invariant under x -> a x: draws scaled down to ~1e-170 (their squares
    # underflow) give the figures of the unscaled draws, not 0/0.
    chains = np.random.default_rng(20).normal(size=(4, 50, 3)) + [[[0.0]], [[0.0]], [[0.0]], [[1.0]]]
    for scale in (1e-170, 1e-300, 1e300):
        for statistic in (potential_scale_reduction, effective_sample_size):
            np.testing.assert_allclose(statistic(scale * chains), statistic(chains), rtol=1e-9)
    assert np.isnan(potential_scale_reduction(np.full((2, 10), 1e-200)))  # constant: 0/0


def test_predictive_rhat_of_a_confident_net_is_that_of_its_log_probabilities(caplog):
    rng = np.random.default_rng(21)
    probs = _confident_chains(rng)
    assert np.mean((probs < 1e-3) | (probs > 1 - 1e-3)) > 0.9 and np.mean(probs < 1e-154) > 0.05
    with caplog.at_level("WARNING", logger="tensorflow"):
        section = summary(probs=probs, quantiles=(0.0, 1.0))["predictive"]
    assert not [r for r in caplog.records if "complex" in r.getMessage()]  # TFP's FFT cast
    flat = probs.reshape(4, -1, 90)
    constant = np.all(flat == flat[:1, :1], axis=(0, 1))  # saturated at exactly 1.0
    assert 0 < section["num_constant"] == int(constant.sum()) < 90
    # Reference: numpy's log of the moving columns, none of them below 1e-308 here.
    moving = flat[:, :, ~constant]
    assert moving.min() > 1e-300
    reference = potential_scale_reduction(np.log(moving))
    rhat, ess = section["rhat"], section["ess"]
    assert rhat["num_undefined"] == 0 and np.all(np.isfinite(reference))
    assert rhat["worst"] == pytest.approx(reference.max(), rel=1e-9)
    assert rhat["quantiles"]["q0"] == pytest.approx(reference.min(), rel=1e-9)
    assert rhat["median"] == pytest.approx(float(np.quantile(reference, 0.5, method="inverted_cdf")), rel=1e-9)
    assert np.isfinite(ess["worst"]) and ess["num_undefined"] == 0


def test_predictive_rhat_of_confident_chains_that_disagree_is_flagged():
    # Same confident net, but chain 3 sits elsewhere: its logits are shifted by 20 draws' SD.
    rng = np.random.default_rng(22)
    centres = 200.0 * rng.normal(size=(30, 3))
    logits = centres + rng.normal(size=(4, 40, 30, 3))
    logits[3] += 20.0 * rng.normal(size=(30, 3))
    section = summary(probs=softmax(logits, axis=-1))["predictive"]
    assert section["rhat"]["median"] > 1.5 and section["rhat"]["worst"] > 10


def test_one_undefined_statistic_does_not_poison_the_summary(monkeypatch):
    chains = np.random.default_rng(23).normal(size=(4, 30, 5))
    rhat = potential_scale_reduction(chains)

    def with_one_nan(array, **kwargs):
        values = rhat.copy()
        values[2] = np.nan
        return values

    monkeypatch.setattr(diagnostics, "potential_scale_reduction", with_one_nan)
    report = summary(chains, quantiles=(0.1, 0.9))["parameters"]["rhat"]
    kept = np.delete(rhat, 2)
    assert report["num_undefined"] == 1
    assert report["worst"] == pytest.approx(kept.max(), rel=1e-12)
    assert report["median"] == pytest.approx(float(np.quantile(kept, 0.5, method="inverted_cdf")), rel=1e-12)
    assert all(np.isfinite(v) for v in report["quantiles"].values())
    assert report["fraction_above_threshold"] == float(np.mean(kept > 1.02))


# R-hat of chains that sample one distribution, and of chains stuck in different modes.
#
# TFP's split R-hat with m = 2C halves of n = S/2 draws is exactly
#     R - 1 = (m + 1)/m * V/W - 1/n,
# V the sample variance (ddof 1) of the m half-chain means and W their mean within-half
# variance. For stationary AR(1) chains of unit variance each half mean is Gaussian with
# variance tau/n, tau = (1 + phi)/(1 - phi) (at most that for a function of the chain, whose
# autocorrelations are dominated by phi^k), so V ~ (tau/n) chi2_{m-1}/(m-1); W has relative
# SD sqrt(2 (1 + phi^2)/(1 - phi^2) / (m n)) ~ 0.02 here, so W > 0.8 holds with a margin of
# 10 SD. The bound below is the 1 - 1e-6 quantile of that law with W = 0.8: over the 80
# scalars tested a correct estimator exceeds it with probability < 1e-4.
PHI, NUM_CHAINS, NUM_DRAWS = 0.5, 4, 2000
TAU = (1 + PHI) / (1 - PHI)
HALVES, HALF_LENGTH = 2 * NUM_CHAINS, NUM_DRAWS // 2
RHAT_BOUND = 1 + (HALVES + 1) / HALVES * TAU / HALF_LENGTH * stats.chi2.ppf(1 - 1e-6, HALVES - 1) / (HALVES - 1) / 0.8


def _one_parameter_net_probs(theta, rng):
    """[C, S, n, K] probabilities of a 10-example, 3-class model whose logits are theta * w."""
    w = rng.normal(size=(10, 3))
    return softmax(theta[..., None, None] * w, axis=-1)


def test_summary_rhat_is_near_one_for_chains_of_one_gaussian():
    rng = np.random.default_rng(13)
    chains = ar1_chain_array(rng, PHI, NUM_CHAINS, NUM_DRAWS, 50)
    probs = _one_parameter_net_probs(ar1_chain_array(rng, PHI, NUM_CHAINS, NUM_DRAWS, 1)[..., 0], rng)
    report = summary(chains, probs=probs)
    assert RHAT_BOUND < 1.03  # the check is tight enough to matter (stuck chains: ~5)
    for section in ("parameters", "predictive"):
        assert report[section]["rhat"]["worst"] < RHAT_BOUND
        assert report[section]["rhat"]["worst"] > 1 - 1 / HALF_LENGTH  # V >= 0
    # The law behind the bound: mean over 50 scalars of R - 1 is (m+1)/m tau/n - 1/n, within
    # 5 SD of that mean (per-scalar SD (m+1)/m tau/n sqrt(2/(m-1))).
    excess = potential_scale_reduction(chains) - 1
    expected = (HALVES + 1) / HALVES * TAU / HALF_LENGTH - 1 / HALF_LENGTH
    sd_of_mean = (HALVES + 1) / HALVES * TAU / HALF_LENGTH * np.sqrt(2 / (HALVES - 1)) / np.sqrt(50)
    assert abs(excess.mean() - expected) < 5 * sd_of_mean
    # Cross-chain ESS of AR(1) chains: about C S / tau = 2667. Per scalar ESS / (C S / tau) has
    # an SD of about 0.05-0.08 (see the header); the median of 50 scalars varies far less.
    assert 0.7 < report["parameters"]["ess"]["median"] / (NUM_CHAINS * NUM_DRAWS / TAU) < 1.3


@pytest.mark.parametrize("modes", [(-2.0, -2.0, 2.0, 2.0), (-2.0, -2.0, -2.0, 2.0)])
def test_summary_rhat_flags_chains_stuck_in_different_modes_of_a_bimodal_target(modes):
    # Target 1/2 N(-2, 1) + 1/2 N(2, 1); each chain stays in the mode it started in. Expected
    # R - 1 ~ (m+1)/m var(half means) = 9/8 * 4 * 8/7 ~ 5.1 (two and two) or ~ 3.9 (three and one).
    rng = np.random.default_rng(14)
    chains = ar1_chain_array(rng, PHI, NUM_CHAINS, NUM_DRAWS, 50, centres=modes)
    theta = ar1_chain_array(rng, PHI, NUM_CHAINS, NUM_DRAWS, 1, centres=modes)[..., 0]
    report = summary(chains, probs=_one_parameter_net_probs(theta, rng), quantiles=(0.0,))
    parameters, predictive = report["parameters"]["rhat"], report["predictive"]["rhat"]
    assert parameters["quantiles"]["q0"] > 1.1  # every parameter flagged, not just the worst
    assert parameters["fraction_above_threshold"] == 1.0
    assert predictive["median"] > 1.1 and predictive["worst"] > RHAT_BOUND
    # Both far above what chains of one distribution reach.
    assert parameters["median"] > 3.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, r"Pass `samples` \[C, S, Nd\], `probs` \[C, S, n, K\], or both"),
        ({"samples": np.zeros((10, 3))}, ValueError, r"`samples` must be \[C, S, Nd\].*shape \(10, 3\) \(one chain\?"),
        ({"samples": np.zeros((1, 10, 3))}, ValueError, r"`samples` needs at least 2 chains along axis 0 .*\(1, 10, 3\)"),
        ({"samples": np.zeros((2, 3, 3))}, ValueError, r"`samples` needs at least 4 draws along axis 1 \(split_chains=True\)"),
        ({"samples": np.zeros((2, 10, 0))}, ValueError, r"`samples` must not have empty axes"),
        ({"samples": np.array([[[0.0, np.nan]] * 5] * 2)}, ValueError, r"`samples` must be finite.* scalar 1"),
        ({"samples": np.full((2, 5, 1), "a")}, TypeError, r"`samples` must hold real numbers"),
        ({"probs": np.full((2, 10, 3), 0.5)}, ValueError, r"`probs` must be \[C, S, n, K\].*shape \(2, 10, 3\)"),
        ({"probs": np.full((1, 10, 2, 2), 0.5)}, ValueError, r"`probs` needs at least 2 chains"),
        ({"probs": np.full((2, 10, 2, 2), 0.7)}, ValueError, r"`probs` rows over the class axis must sum to 1 .*probs\[0, 0, 0, :\] sums to 1.4"),
        ({"probs": np.tile([1.5, -0.5], (2, 10, 2, 1))}, ValueError, r"`probs` must hold probabilities in \[0, 1\]"),
        ({"samples": np.zeros((2, 10, 1)), "quantiles": (0.5, 1.5)}, ValueError, r"`quantiles\[1\]` must be in \[0, 1\], got 1.5"),
        ({"samples": np.zeros((2, 10, 1)), "quantiles": ()}, TypeError, r"`quantiles` must be a non-empty sequence"),
        ({"samples": np.zeros((2, 10, 1)), "rhat_threshold": 0.9}, ValueError, r"`rhat_threshold` must be in \(1, inf\), got 0.9"),
        ({"samples": np.zeros((2, 10, 1)), "split_chains": "no"}, TypeError, r"`split_chains` must be True or False"),
    ],
)
def test_summary_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        summary(**kwargs)


def test_summary_of_a_single_chain_collector_says_it_needs_chains():
    collector = SampleCollector(max_samples=10)
    collector.allocate(3)
    collector.consume(np.zeros((6, 3), np.float32), np.arange(1, 7))  # six samples of one chain
    with pytest.raises(ValueError, match=r"`samples` must be \[C, S, Nd\].*\(6, 3\) \(one chain\?"):
        summary(collector)


if __name__ == "__main__":
    # Prints the R-hat figures of the convergence tests above:
    #   KERAS_BACKEND=tensorflow .venv/bin/python -m tests.test_diagnostics
    print(f"bound for chains of one Gaussian (C={NUM_CHAINS}, S={NUM_DRAWS}, phi={PHI}): {RHAT_BOUND:.4f}")
    generator = np.random.default_rng(13)
    same = summary(ar1_chain_array(generator, PHI, NUM_CHAINS, NUM_DRAWS, 50),
                   probs=_one_parameter_net_probs(ar1_chain_array(generator, PHI, NUM_CHAINS, NUM_DRAWS, 1)[..., 0], generator))
    for section in ("parameters", "predictive"):
        print(f"one Gaussian, {section}: worst R-hat {same[section]['rhat']['worst']:.4f}, "
              f"median {same[section]['rhat']['median']:.4f}, median ESS {same[section]['ess']['median']:.0f}")
    for modes in [(-2.0, -2.0, 2.0, 2.0), (-2.0, -2.0, -2.0, 2.0)]:
        generator = np.random.default_rng(14)
        chains = ar1_chain_array(generator, PHI, NUM_CHAINS, NUM_DRAWS, 50, centres=modes)
        theta = ar1_chain_array(generator, PHI, NUM_CHAINS, NUM_DRAWS, 1, centres=modes)[..., 0]
        stuck = summary(chains, probs=_one_parameter_net_probs(theta, generator), quantiles=(0.0,))
        for section in ("parameters", "predictive"):
            rhat = stuck[section]["rhat"]
            print(f"modes {modes}, {section}: R-hat min {rhat['quantiles']['q0']:.3f}, "
                  f"median {rhat['median']:.3f}, worst {rhat['worst']:.3f}")
