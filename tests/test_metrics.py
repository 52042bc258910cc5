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
