"""Tests for keras_thermo.metrics: hand-computed cases, sklearn references, input checks."""

import math

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, log_loss

from keras_thermo import metrics

# Four examples, three classes. Per example: true label, prediction, confidence (max prob).
#   0: [0.70, 0.20, 0.10], y=0 -> predicts 0, correct, conf 0.7
#   1: [0.10, 0.60, 0.30], y=2 -> predicts 1, wrong,   conf 0.6
#   2: [0.30, 0.30, 0.40], y=2 -> predicts 2, correct, conf 0.4
#   3: [0.05, 0.90, 0.05], y=1 -> predicts 1, correct, conf 0.9
PROBS = np.array(
    [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.05, 0.9, 0.05]]
)
LABELS = np.array([0, 2, 2, 1])


def test_accuracy_hand_computed():
    assert metrics.accuracy(PROBS, LABELS) == 0.75  # 3 of 4 correct


def test_nll_hand_computed():
    # -(ln 0.7 + ln 0.3 + ln 0.4 + ln 0.9) / 4
    # = (0.3566749 + 1.2039728 + 0.9162907 + 0.1053605) / 4 = 0.6455747
    assert metrics.nll(PROBS, LABELS) == pytest.approx(0.6455747489, abs=1e-9)


def test_brier_hand_computed():
    # Squared error summed over classes, per example:
    #   0: 0.3^2 + 0.2^2 + 0.1^2   = 0.14
    #   1: 0.1^2 + 0.6^2 + 0.7^2   = 0.86
    #   2: 0.3^2 + 0.3^2 + 0.6^2   = 0.54
    #   3: 0.05^2 + 0.1^2 + 0.05^2 = 0.015
    # mean = 1.555 / 4 = 0.38875
    assert metrics.brier_score(PROBS, LABELS) == pytest.approx(0.38875, abs=1e-12)


def test_ece_hand_computed_right_closed_bins():
    # 5 bins with edges 0, .2, .4, .6, .8, 1, closed on the right.
    # Confidence 0.4 sits exactly on an edge (0.4 == linspace(0, 1, 6)[2] in float64) and
    # belongs to bin (0.2, 0.4]:
    #   (0.2, 0.4]: example 2, acc 1, conf 0.4 -> |1 - 0.4| = 0.6
    #   (0.4, 0.6]: example 1, acc 0, conf 0.6 -> 0.6
    #   (0.6, 0.8]: example 0, acc 1, conf 0.7 -> 0.3
    #   (0.8, 1.0]: example 3, acc 1, conf 0.9 -> 0.1
    # ECE = (0.6 + 0.6 + 0.3 + 0.1) / 4 = 0.4. (Left-closed bins would pair examples 1 and 2
    # in [0.4, 0.6): acc 0.5, conf 0.5, giving ECE = (0.3 + 0.1) / 4 = 0.1.)
    assert metrics.expected_calibration_error(PROBS, LABELS, num_bins=5) == pytest.approx(0.4)


def test_ece_single_bin_is_accuracy_confidence_gap():
    # One bin: accuracy 0.75, mean confidence (0.7 + 0.6 + 0.4 + 0.9) / 4 = 0.65.
    assert metrics.expected_calibration_error(PROBS, LABELS, num_bins=1) == pytest.approx(0.1)


def test_reliability_diagram_hand_computed():
    diagram = metrics.reliability_diagram_data(PROBS, LABELS, num_bins=5)
    np.testing.assert_allclose(diagram.bin_edges, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert diagram.counts.tolist() == [0, 1, 1, 1, 1]
    np.testing.assert_allclose(diagram.accuracy, [np.nan, 1.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(diagram.confidence, [np.nan, 0.4, 0.6, 0.7, 0.9])
    assert diagram.num_examples == 4


def _ece_reference(probs, labels, num_bins):
    """Loop over bins with explicit (lo, hi] comparisons; independent of searchsorted."""
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    total = 0.0
    for b in range(num_bins):
        lo, hi = edges[b], edges[b + 1]
        members = [i for i, c in enumerate(confidence) if (lo < c <= hi) or (b == 0 and c == lo)]
        if members:
            gap = abs(np.mean(correct[members]) - np.mean(confidence[members]))
            total += len(members) / len(labels) * gap
    return total


@pytest.mark.parametrize("num_bins", [1, 3, 10, 15])
def test_ece_matches_loop_reference_on_random_data(num_bins):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(4, 0.5), size=300)
    labels = rng.integers(0, 4, size=300)
    assert metrics.expected_calibration_error(probs, labels, num_bins) == pytest.approx(
        _ece_reference(probs, labels, num_bins), abs=1e-12
    )


def test_ece_of_perfectly_calibrated_confident_predictions_is_zero_and_of_wrong_ones_is_one():
    one_hot = np.eye(3)[[0, 1, 2, 1]]
    assert metrics.expected_calibration_error(one_hot, [0, 1, 2, 1]) == 0.0
    assert metrics.expected_calibration_error(one_hot, [1, 2, 0, 0]) == 1.0


def test_nll_and_brier_match_sklearn_on_random_data():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(5), size=500)
    labels = rng.integers(0, 5, size=500)
    assert metrics.nll(probs, labels) == pytest.approx(
        log_loss(labels, probs, labels=range(5)), rel=1e-12
    )
    # sklearn's multi-class Brier without the binary halving is the same definition.
    assert metrics.brier_score(probs, labels) == pytest.approx(
        brier_score_loss(labels, probs, labels=range(5), scale_by_half=False), rel=1e-12
    )


def test_binary_brier_is_twice_sklearns_default():
    rng = np.random.default_rng(2)
    p1 = rng.uniform(size=200)
    labels = rng.integers(0, 2, size=200)
    probs = np.stack([1 - p1, p1], axis=1)
    assert metrics.brier_score(probs, labels) == pytest.approx(
        2 * brier_score_loss(labels, p1), rel=1e-12
    )


def test_nll_clips_at_the_documented_floor():
    probs = np.array([[1.0, 0.0], [0.5, 0.5]])
    expected = (-math.log(metrics.NLL_PROBABILITY_FLOOR) + math.log(2)) / 2
    assert metrics.nll(probs, [1, 0]) == pytest.approx(expected, rel=1e-12)
    assert metrics.nll(probs, [1, 0], epsilon=1e-3) == pytest.approx(
        (-math.log(1e-3) + math.log(2)) / 2, rel=1e-12
    )


def test_log_loss_from_logits_matches_sklearn_and_is_not_clipped():
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=3.0, size=(100, 4))
    labels = rng.integers(0, 4, size=100)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert metrics.log_loss_from_logits(logits, labels) == pytest.approx(
        log_loss(labels, probs, labels=range(4)), rel=1e-10
    )
    # A logit gap of 1000 costs exactly 1000 nats; probabilities would have to clip.
    assert metrics.log_loss_from_logits([[1000.0, 0.0]], [1]) == pytest.approx(1000.0)


def test_binary_logit_column_is_the_papers_logistic_log_loss():
    # Wei & Shang eq. (31): mean log(1 + exp(-s z)), s = +-1.
    rng = np.random.default_rng(4)
    z = rng.normal(scale=4.0, size=50)
    labels = rng.integers(0, 2, size=50)
    signs = 2 * labels - 1
    expected = np.mean(np.logaddexp(0.0, -signs * z))
    assert metrics.log_loss_from_logits(z[:, None], labels) == pytest.approx(expected, rel=1e-12)
    probs = metrics.probabilities_from_logits(z[:, None])
    np.testing.assert_allclose(probs[:, 1], 1 / (1 + np.exp(-z)), rtol=1e-12)


def test_expected_log_loss_is_mean_of_per_sample_losses_and_bounds_nll():
    # Three posterior samples' logits on the same 80 test examples.
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, size=80)
    sample_logits = [rng.normal(scale=2.0, size=(80, 3)) for _ in range(3)]
    per_sample = [metrics.log_loss_from_logits(z, labels) for z in sample_logits]
    expected = metrics.expected_log_loss(per_sample)
    assert expected == pytest.approx(sum(per_sample) / 3, rel=1e-12)
    mean_probs = np.mean([metrics.probabilities_from_logits(z) for z in sample_logits], axis=0)
    # Jensen: the log loss of the averaged predictive is below the average log loss.
    assert metrics.nll(mean_probs, labels) < expected


def test_expected_log_loss_weights_and_nan_propagation():
    # (1 * 0.5 + 3 * 0.9) / 4 = 0.8
    assert metrics.expected_log_loss([0.5, 0.9], weights=[1.0, 3.0]) == pytest.approx(0.8)
    assert math.isnan(metrics.expected_log_loss([0.5, float("nan")]))
    with pytest.raises(ValueError, match="per_sample_log_losses"):
        metrics.expected_log_loss([])
    with pytest.raises(ValueError, match="weights"):
        metrics.expected_log_loss([0.5, 0.9], weights=[0.0, 0.0])


def test_predictive_averager_matches_direct_computation():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 3, size=40)
    logits = [rng.normal(size=(40, 3)) for _ in range(3)]
    weights = [1.0, 2.0, 0.5]
    averager = metrics.PredictiveAverager(labels, num_bins=10)
    for z, w in zip(logits, weights):
        averager.update(logits=z, weight=w)
    probs = [metrics.probabilities_from_logits(z) for z in logits]
    mean_probs = sum(w * p for w, p in zip(weights, probs)) / sum(weights)
    np.testing.assert_allclose(averager.mean_probs, mean_probs, rtol=1e-12)
    result = averager.result()
    assert result["num_samples"] == 3
    assert result["accuracy"] == metrics.accuracy(mean_probs, labels)
    assert result["nll"] == pytest.approx(metrics.nll(mean_probs, labels), rel=1e-12)
    assert result["ece"] == pytest.approx(
        metrics.expected_calibration_error(mean_probs, labels, 10), rel=1e-12
    )
    assert result["brier"] == pytest.approx(metrics.brier_score(mean_probs, labels), rel=1e-12)
    per_sample = [metrics.log_loss_from_logits(z, labels) for z in logits]
    assert result["expected_log_loss"] == pytest.approx(
        metrics.expected_log_loss(per_sample, weights), rel=1e-12
    )


def test_predictive_averager_errors():
    averager = metrics.PredictiveAverager([0, 1])
    with pytest.raises(ValueError, match="update"):
        averager.result()
    with pytest.raises(ValueError, match="exactly one"):
        averager.update()
    averager.update(probs=[[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        averager.update(probs=[[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])


@pytest.mark.parametrize(
    "probs, labels, match",
    [
        (np.array([0.5, 0.5]), [0], "`probs` must be a 2-D array"),
        (np.array([[0.5, 0.6]]), [0], "row 0 sums to 1.1"),
        (np.array([[2.0, -1.0]]), [0], "non-negative"),
        (np.array([[np.nan, 1.0]]), [0], "finite"),
        (np.array([[0.5, 0.5]]), [2], r"\[0, 2\), got values such as \[2\]"),
        (np.array([[0.5, 0.5]]), [-1], r"got values such as \[-1\]"),
        (np.array([[0.5, 0.5]]), [0, 1], "one entry per row"),
        (np.array([[0.5, 0.5]]), [[0]], "1-D"),
        (np.array([[0.5, 0.5]]), [0.5], r"whole numbers, got values such as \[0.5\]"),
    ],
)
def test_invalid_inputs_raise_value_error_naming_the_argument(probs, labels, match):
    with pytest.raises(ValueError, match=match):
        metrics.accuracy(probs, labels)


def test_num_bins_and_epsilon_are_checked():
    with pytest.raises(ValueError, match="`num_bins` must be an integer >= 1, got 0"):
        metrics.expected_calibration_error(PROBS, LABELS, num_bins=0)
    with pytest.raises(TypeError, match="num_bins"):
        metrics.reliability_diagram_data(PROBS, LABELS, num_bins=2.5)
    with pytest.raises(ValueError, match="epsilon"):
        metrics.nll(PROBS, LABELS, epsilon=0.0)


def test_float_labels_with_whole_values_are_accepted():
    assert metrics.accuracy(PROBS, LABELS.astype(np.float32)) == 0.75


# --------------------------------------------------------------------------------------------
# Entropies and mutual information
#
# Float64 tolerance: each entropy is a sum of K terms of size <= log K and the running sums add
# S such values, so rounding leaves |error| of order (K + S) ulp(log K) ~ 1e-15 here; 1e-12 is a
# safe margin that no formula error could hide under (the hand cases differ by > 1e-2).
EXACT = 1e-12


def _h(*p):
    """Entropy of one distribution, straight from the definition."""
    return -sum(q * math.log(q) for q in p if q > 0)


def test_entropy_hand_computed_and_zero_for_sure_predictions():
    got = metrics.entropy([[0.5, 0.5], [1.0, 0.0]])
    np.testing.assert_allclose(got, [math.log(2), 0.0], rtol=0, atol=EXACT)
    assert not np.signbit(got[1])  # +0.0: a sure prediction has no uncertainty, not "-0"
    assert metrics.entropy([[0.7, 0.2, 0.1]])[0] == pytest.approx(_h(0.7, 0.2, 0.1), abs=EXACT)
    with pytest.raises(ValueError, match="row 0 sums"):
        metrics.entropy([[2.0, 0.0]])


def test_mutual_information_of_two_samples_and_two_classes_by_hand():
    # Example 0: samples [0.9, 0.1] and [0.5, 0.5]  -> p_bar = [0.7, 0.3].
    # Example 1: samples [1.0, 0.0] and [0.0, 1.0]  -> p_bar = [0.5, 0.5], each sample sure.
    # Example 2: both samples [0.2, 0.8]            -> they agree: MI = 0.
    first = [[0.9, 0.1], [1.0, 0.0], [0.2, 0.8]]
    second = [[0.5, 0.5], [0.0, 1.0], [0.2, 0.8]]
    predictive = [_h(0.7, 0.3), math.log(2), _h(0.2, 0.8)]
    expected = [(_h(0.9, 0.1) + math.log(2)) / 2, 0.0, _h(0.2, 0.8)]
    mixture = metrics.PredictiveMixture()
    mixture.update(probs=first)
    mixture.update(probs=second)
    np.testing.assert_allclose(mixture.mean_probs, [[0.7, 0.3], [0.5, 0.5], [0.2, 0.8]], atol=EXACT)
    np.testing.assert_allclose(mixture.predictive_entropy, predictive, rtol=0, atol=EXACT)
    np.testing.assert_allclose(mixture.expected_entropy, expected, rtol=0, atol=EXACT)
    # 0.610864 - 0.509115 = 0.101749 nats; log 2 for the sure but opposite samples; 0.
    np.testing.assert_allclose(
        mixture.mutual_information, np.subtract(predictive, expected), rtol=0, atol=EXACT
    )
    assert mixture.mutual_information[0] == pytest.approx(0.101749, abs=1e-6)
    assert mixture.num_samples == 2


def test_mutual_information_from_logits_binary_logits_and_weights():
    # The same first example from logits: log-odds log 9 gives [0.9, 0.1]; zeros give [0.5, 0.5].
    from_logits = metrics.PredictiveMixture()
    from_logits.update(logits=[[math.log(9.0), 0.0]])
    from_logits.update(logits=[[0.0, 0.0]])
    # A single binary-logit column z is the distribution [1 - sigmoid(z), sigmoid(z)].
    binary = metrics.PredictiveMixture()
    binary.update(logits=[[-math.log(9.0)]])
    binary.update(logits=[[0.0]])
    mi = _h(0.7, 0.3) - (_h(0.9, 0.1) + math.log(2)) / 2
    for mixture in (from_logits, binary):
        assert mixture.mutual_information[0] == pytest.approx(mi, abs=EXACT)
    # Weights 1 and 3: p_bar = (1 [0.9, 0.1] + 3 [0.5, 0.5]) / 4 = [0.6, 0.4].
    weighted = metrics.PredictiveMixture()
    weighted.update(probs=[[0.9, 0.1]], weight=1.0)
    weighted.update(probs=[[0.5, 0.5]], weight=3.0)
    assert weighted.expected_entropy[0] == pytest.approx((_h(0.9, 0.1) + 3 * math.log(2)) / 4, abs=EXACT)
    assert weighted.mutual_information[0] == pytest.approx(
        _h(0.6, 0.4) - (_h(0.9, 0.1) + 3 * math.log(2)) / 4, abs=EXACT
    )


@pytest.mark.parametrize("seed", range(5))
def test_mutual_information_is_the_mean_kl_to_the_mixture_hence_non_negative(seed):
    rng = np.random.default_rng(seed)
    num_samples, num_examples, num_classes = 1 + seed, 30, 4
    # Dirichlet(0.3) samples: many near-sure rows, the hard case for the subtraction.
    samples = rng.dirichlet(np.full(num_classes, 0.3), size=(num_samples, num_examples))
    weights = rng.uniform(0.1, 2.0, size=num_samples)
    mixture = metrics.PredictiveMixture()
    for probs, weight in zip(samples, weights):
        mixture.update(probs=probs, weight=weight)
    mean = np.tensordot(weights, samples, axes=1) / weights.sum()
    # I = sum_s w_s KL(p_s || p_bar) / sum_s w_s: a sum of non-negative terms, computed apart.
    kl = np.sum(samples * (np.log(samples) - np.log(mean)), axis=2)
    reference = weights @ kl / weights.sum()
    assert np.all(mixture.mutual_information >= 0.0)
    np.testing.assert_allclose(mixture.mutual_information, reference, rtol=0, atol=EXACT)
    if num_samples > 1:
        assert reference.min() > 1e-4  # disagreeing samples: clearly positive, not clipped to 0

    # All samples equal, whatever the weights: no disagreement, so I = 0 up to rounding, and the
    # expected entropy is the shared one.
    agreeing = metrics.PredictiveMixture()
    for weight in weights:
        agreeing.update(probs=samples[0], weight=weight)
    np.testing.assert_allclose(agreeing.mutual_information, 0.0, rtol=0, atol=EXACT)
    np.testing.assert_allclose(agreeing.expected_entropy, metrics.entropy(samples[0]), rtol=0, atol=EXACT)


def test_predictive_mixture_errors():
    mixture = metrics.PredictiveMixture()
    with pytest.raises(ValueError, match="No samples yet"):
        _ = mixture.mutual_information
    with pytest.raises(ValueError, match="exactly one"):
        mixture.update(probs=[[1.0, 0.0]], logits=[[0.0, 0.0]])
    with pytest.raises(ValueError, match=r"`weight` must be in \[0, inf\), got -1.0"):
        mixture.update(probs=[[1.0, 0.0]], weight=-1.0)
    mixture.update(probs=[[1.0, 0.0]], weight=0.0)
    with pytest.raises(ValueError, match="weight 0"):
        _ = mixture.mean_probs
    with pytest.raises(ValueError, match=r"\(1, 2\)"):
        mixture.update(probs=[[1.0, 0.0], [0.0, 1.0]])


def test_predictive_averager_exposes_the_uncertainty_of_its_samples():
    averager = metrics.PredictiveAverager([0, 1])
    averager.update(probs=[[0.9, 0.1], [1.0, 0.0]])
    averager.update(probs=[[0.5, 0.5], [0.0, 1.0]])
    np.testing.assert_allclose(
        averager.mutual_information, [_h(0.7, 0.3) - (_h(0.9, 0.1) + math.log(2)) / 2, math.log(2)],
        rtol=0, atol=EXACT,
    )
    assert sorted(averager.result()) == [
        "accuracy", "brier", "ece", "expected_log_loss", "nll", "num_samples"
    ]


# --------------------------------------------------------------------------------------------
# OOD AUROC


@pytest.mark.parametrize(
    "inside, outside, expected",
    [
        ([1.0, 2.0], [2.0, 3.0], 3.5 / 4),  # 1<2, 1<3, 2=2 (half), 2<3
        ([0.0, 1.0, 1.0, 2.0], [1.0, 1.0, 3.0], 8 / 12),  # each 1: one win, two ties; 3: four wins
        ([0.0, 0.1], [0.5, 0.9, 2.0], 1.0),  # separated
        ([0.5, 0.9, 2.0], [0.0, 0.1], 0.0),  # separated the wrong way
        ([0.3, 0.3, 0.3], [0.3, 0.3], 0.5),  # one constant score: chance
        ([-np.inf, 0.0], [np.inf, 0.0], 3.5 / 4),  # infinite scores rank as usual
        ([1, 3], [2], 0.5),  # integer scores
    ],
)
def test_ood_auroc_hand_computed_with_ties(inside, outside, expected):
    assert metrics.ood_auroc(inside, outside) == expected  # counts are integers: exact


@pytest.mark.parametrize("seed", range(3))
def test_ood_auroc_matches_sklearn_and_is_antisymmetric(seed):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    # Rounded scores: many ties, where the half-credit rule matters.
    inside = np.round(rng.normal(size=200 + 37 * seed), 1)
    outside = np.round(rng.normal(loc=0.7, size=150), 1)
    labels = np.concatenate([np.zeros(inside.size), np.ones(outside.size)])
    reference = roc_auc_score(labels, np.concatenate([inside, outside]))
    assert metrics.ood_auroc(inside, outside) == pytest.approx(reference, rel=1e-12)
    assert metrics.ood_auroc(inside, outside) + metrics.ood_auroc(outside, inside) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize(
    "inside, outside, error, match",
    [
        ([], [1.0], ValueError, r"`in_distribution_scores` must be a non-empty 1-D array .* shape \(0,\)"),
        ([1.0], [[1.0, 2.0]], ValueError, r"`out_of_distribution_scores` must be a non-empty 1-D .* shape \(1, 2\)"),
        ([1.0, np.nan], [1.0], ValueError, "`in_distribution_scores` must not contain NaN, got 1 NaN entries"),
        (["a"], [1.0], TypeError, "`in_distribution_scores` must hold real numbers"),
    ],
)
def test_ood_auroc_bad_input(inside, outside, error, match):
    with pytest.raises(error, match=match):
        metrics.ood_auroc(inside, outside)
