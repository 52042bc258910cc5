"""Metrics of predictive distributions for classification: functions of `probs` (or logits)
and labels.

Every function takes numpy arrays (or anything `np.asarray` accepts), works in float64 and
returns Python floats or numpy arrays. `probs` is `[n, K]`: one categorical distribution over
`K` classes per example, typically the posterior predictive averaged over samples,
`p(y | x) ~= (1/S) sum_s p(y | x, theta_s)`. `labels` is `[n]` integers in `[0, K)`. The
`_check_*` helpers validate them; the streaming averages over samples live in
`keras_thermo.metrics.mixture`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from keras_thermo._validation import check_int, check_number

# Rows of `probs` must sum to 1 within this absolute tolerance. Loose enough for float32
# softmax outputs averaged over many samples, tight enough to catch logits passed by mistake.
ROW_SUM_TOLERANCE = 1e-3

# `nll` clips the probability of the true label from below at this value, so a confidently
# wrong prediction costs at most -log(1e-15) ~= 34.5 nats instead of infinity.
NLL_PROBABILITY_FLOOR = 1e-15


def _check_labels(labels: Any, num_examples: int | None, num_classes: int | None) -> np.ndarray:
    """Returns `labels` as int64 `[n]` after checking shape, integrality and range."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D array [n], got shape {array.shape}.")
    if num_examples is not None and array.shape[0] != num_examples:
        raise ValueError(
            f"`labels` must have one entry per row of `probs` ({num_examples}), "
            f"got shape {array.shape}."
        )
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise TypeError(f"`labels` must hold integers, got dtype {array.dtype}.")
    if np.issubdtype(array.dtype, np.floating):
        # Keras pipelines often carry labels as floats; accept them when they are whole numbers.
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            bad = array[~np.isfinite(array) | (array != np.round(array))][:3]
            raise ValueError(
                f"`labels` must hold whole numbers, got values such as {bad.tolist()}."
            )
    array = array.astype(np.int64)
    if num_classes is not None and array.size and (array.min() < 0 or array.max() >= num_classes):
        bad = array[(array < 0) | (array >= num_classes)][:3]
        raise ValueError(
            f"`labels` must be integers in [0, {num_classes}), got values such as {bad.tolist()}."
        )
    return array


def _finite_matrix(name: str, value: Any) -> np.ndarray:
    """`value` as a finite float64 `[n, K]` array with n, K >= 1 (`name` in the errors)."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(
            f"`{name}` must be a 2-D array [n, K] with n >= 1 and K >= 1, got shape {array.shape}."
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite, got NaN or infinite entries.")
    return array


def _check_probs(probs: Any) -> np.ndarray:
    """Returns `probs` as float64 `[n, K]` after checking shape, range and row sums."""
    p = _finite_matrix("probs", probs)
    if np.any(p < 0.0):
        raise ValueError(f"`probs` must be non-negative, got minimum {float(p.min())!r}.")
    row_sums = p.sum(axis=1)
    worst = int(np.argmax(np.abs(row_sums - 1.0)))
    if abs(row_sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(
            f"`probs` rows must sum to 1 (within {ROW_SUM_TOLERANCE:g}); row {worst} sums to "
            f"{float(row_sums[worst])!r}. Pass probabilities, not logits "
            f"(see `probabilities_from_logits`)."
        )
    return p


def _check_probs_and_labels(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Returns (probs float64 [n, K], labels int64 [n]) after validating both."""
    p = _check_probs(probs)
    return p, _check_labels(labels, p.shape[0], p.shape[1])


def accuracy(probs: Any, labels: Any) -> float:
    """Fraction of examples whose most probable class is the true label.

    Ties go to the lowest class index (`np.argmax`).

    Args:
        probs: `[n, K]` predictive probabilities; rows sum to 1.
        labels: `[n]` integer labels in `[0, K)`.

    Returns:
        Accuracy in `[0, 1]`.

    Example:
        >>> accuracy([[0.9, 0.1], [0.4, 0.6]], [0, 0])
        0.5
    """
    p, y = _check_probs_and_labels(probs, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def nll(probs: Any, labels: Any, *, epsilon: float = NLL_PROBABILITY_FLOOR) -> float:
    """Mean negative log probability of the true label, `-(1/n) sum_i log p_i[y_i]`.

    The probability of the true label is clipped from below at `epsilon` before the log, so
    an example given probability 0 contributes `-log(epsilon)` (34.5 nats for the default)
    instead of infinity. Nothing else is clipped. Applied to a posterior-averaged predictive
    distribution this is the negated test log likelihood.

    Args:
        probs: `[n, K]` predictive probabilities; rows sum to 1.
        labels: `[n]` integer labels in `[0, K)`.
        epsilon: Probability floor, in `(0, 1)`.

    Returns:
        The mean negative log likelihood in nats.

    Example:
        >>> round(nll([[0.5, 0.5], [0.25, 0.75]], [0, 1]), 6)  # (log 2 + log 4/3) / 2
        0.490415
    """
    epsilon = check_number("epsilon", epsilon, low=0.0, high=1.0, high_inclusive=False)
    p, y = _check_probs_and_labels(probs, labels)
    true_class_probs = p[np.arange(p.shape[0]), y]
    return float(-np.mean(np.log(np.maximum(true_class_probs, epsilon))))


def brier_score(probs: Any, labels: Any) -> float:
    """Multi-class Brier score, `(1/n) sum_i sum_k (p_ik - 1[y_i = k])^2`.

    The squared error is summed over all `K` classes and averaged over examples (Brier 1950),
    so it lies in `[0, 2]`. For `K = 2` this is twice the binary form `mean((p_i1 - y_i)^2)`
    that `sklearn.metrics.brier_score_loss` reports by default.

    Args:
        probs: `[n, K]` predictive probabilities; rows sum to 1.
        labels: `[n]` integer labels in `[0, K)`.

    Returns:
        The Brier score.

    Example:
        >>> round(brier_score([[0.8, 0.2], [0.5, 0.5]], [0, 1]), 6)  # (0.08 + 0.5) / 2
        0.29
    """
    p, y = _check_probs_and_labels(probs, labels)
    one_hot = np.zeros_like(p)
    one_hot[np.arange(p.shape[0]), y] = 1.0
    return float(np.mean(np.sum((p - one_hot) ** 2, axis=1)))


@dataclasses.dataclass(frozen=True)
class ReliabilityDiagram:
    """Per-bin calibration statistics (see `reliability_diagram_data`).

    Attributes:
        bin_edges: `[B + 1]` edges `linspace(0, 1, B + 1)`; bin `b` holds confidences in
            `(bin_edges[b], bin_edges[b + 1]]`.
        counts: `[B]` number of examples per bin.
        accuracy: `[B]` fraction of correct predictions per bin; NaN for empty bins.
        confidence: `[B]` mean confidence (max probability) per bin; NaN for empty bins.
    """

    bin_edges: np.ndarray
    counts: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray

    @property
    def num_examples(self) -> int:
        return int(self.counts.sum())

    def expected_calibration_error(self) -> float:
        """`sum_b (|B_b| / n) |acc_b - conf_b|` over the non-empty bins."""
        filled = self.counts > 0
        weights = self.counts[filled] / self.num_examples
        return float(np.sum(weights * np.abs(self.accuracy[filled] - self.confidence[filled])))


def reliability_diagram_data(probs: Any, labels: Any, num_bins: int = 15) -> ReliabilityDiagram:
    """Bins predictions by confidence, for reliability diagrams and the ECE.

    Confidence is the largest predicted probability of an example and the prediction is its
    argmax. The `num_bins` equal-width bins over `[0, 1]` are closed on the right: bin `b`
    holds confidences in `(b/B, (b+1)/B]`, with the edges taken from `np.linspace(0, 1, B+1)`
    (Guo et al. 2017's convention). A confidence of exactly 0, which a probability vector
    cannot have, would go to the first bin.

    Args:
        probs: `[n, K]` predictive probabilities; rows sum to 1.
        labels: `[n]` integer labels in `[0, K)`.
        num_bins: Number of bins, `>= 1`.

    Returns:
        A `ReliabilityDiagram` with per-bin counts, accuracies and mean confidences.

    Example:
        >>> d = reliability_diagram_data([[0.9, 0.1], [0.3, 0.7]], [0, 0], num_bins=2)
        >>> d.counts.tolist(), d.accuracy.tolist(), d.confidence.tolist()
        ([0, 2], [nan, 0.5], [nan, 0.8])

    Reference:
        Guo, Pleiss, Sun, Weinberger (2017), On calibration of modern neural networks, ICML.
    """
    num_bins = check_int("num_bins", num_bins, low=1)
    p, y = _check_probs_and_labels(probs, labels)
    confidence = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    # side="left" returns i with edges[i-1] < c <= edges[i]: right-closed bins.
    bin_index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, num_bins - 1)
    counts = np.bincount(bin_index, minlength=num_bins)
    correct_sum = np.bincount(bin_index, weights=correct, minlength=num_bins)
    confidence_sum = np.bincount(bin_index, weights=confidence, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        bin_accuracy = np.where(counts > 0, correct_sum / counts, np.nan)
        bin_confidence = np.where(counts > 0, confidence_sum / counts, np.nan)
    return ReliabilityDiagram(edges, counts, bin_accuracy, bin_confidence)


def expected_calibration_error(probs: Any, labels: Any, num_bins: int = 15) -> float:
    """Expected calibration error, `ECE = sum_b (|B_b| / n) |acc_b - conf_b|`.

    Bins are those of `reliability_diagram_data`: `num_bins` equal-width confidence bins over
    `[0, 1]`, closed on the right. Empty bins contribute nothing.

    Args:
        probs: `[n, K]` predictive probabilities; rows sum to 1.
        labels: `[n]` integer labels in `[0, K)`.
        num_bins: Number of bins, `>= 1`.

    Returns:
        The ECE in `[0, 1]`.

    Example:
        >>> # One bin (0.5, 1]: accuracy 1/2, mean confidence 0.8.
        >>> round(expected_calibration_error([[0.9, 0.1], [0.3, 0.7]], [0, 0], num_bins=2), 6)
        0.3

    Reference:
        Naeini, Cooper, Hauskrecht (2015), Obtaining well calibrated probabilities using
        Bayesian binning, AAAI; Guo et al. (2017), ICML.
    """
    return reliability_diagram_data(probs, labels, num_bins).expected_calibration_error()


def probabilities_from_logits(logits: Any) -> np.ndarray:
    """Softmax of `[n, K]` logits in float64; a single column `[n, 1]` is a binary logit.

    A binary logit `z` (a `Dense(1)` output, as in `networks.logistic_regression`) becomes the
    two-class distribution `[1 - sigmoid(z), sigmoid(z)]`, i.e. the softmax of `[0, z]`.

    Example:
        >>> probabilities_from_logits([[0.0]]).tolist()
        [[0.5, 0.5]]
    """
    return np.exp(_log_probabilities_from_logits(logits))


def _log_probabilities_from_logits(logits: Any) -> np.ndarray:
    z = _finite_matrix("logits", logits)
    if z.shape[1] == 1:
        z = np.concatenate([np.zeros_like(z), z], axis=1)
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def log_loss_from_logits(logits: Any, labels: Any) -> float:
    """Mean test log loss of one model, `-(1/n) sum_i log softmax(z_i)[y_i]`, without clipping.

    Computed with a stable log-sum-exp, so it stays exact where `nll` on probabilities would
    have to clip. A single logit column is binary (see `probabilities_from_logits`); then this
    is `(1/n) sum_i log(1 + exp(-s_i z_i))` with `s_i = 2 y_i - 1`, Wei & Shang's eq. (31).

    Args:
        logits: `[n, K]` logits, or `[n, 1]` binary logits.
        labels: `[n]` integer labels in `[0, K)` (`{0, 1}` for binary logits).

    Returns:
        The mean log loss in nats.

    Example:
        >>> round(log_loss_from_logits([[0.0, 0.0]], [1]), 6)  # log 2
        0.693147
    """
    log_p = _log_probabilities_from_logits(logits)
    y = _check_labels(labels, log_p.shape[0], log_p.shape[1])
    return float(-np.mean(log_p[np.arange(log_p.shape[0]), y]))


def _entropy_of_rows(p: np.ndarray) -> np.ndarray:
    """`-sum_k p_k log p_k` per row, with `0 log 0 = 0`."""
    safe_log = np.log(np.where(p > 0.0, p, 1.0))
    return 0.0 - np.sum(p * safe_log, axis=1)  # 0.0 - x, not -x: a sure row gives 0.0, not -0.0


def entropy(probs: Any) -> np.ndarray:
    """Shannon entropy of each row, `H[p_i] = -sum_k p_ik log p_ik` in nats (`0 log 0 = 0`).

    Applied to the posterior-averaged predictive distribution this is the predictive entropy,
    the total uncertainty about each label; it lies in `[0, log K]`.

    Args:
        probs: `[n, K]` probabilities; rows sum to 1.

    Returns:
        `[n]` float64 entropies.

    Example:
        >>> entropy([[0.5, 0.5], [1.0, 0.0]]).round(6)  # log 2, and 0 for a sure prediction
        array([0.693147, 0.      ])
    """
    return _entropy_of_rows(_check_probs(probs))


def _check_scores(name: str, scores: Any) -> np.ndarray:
    array = np.asarray(scores)
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.number) or array.dtype == bool
    ) or np.issubdtype(array.dtype, np.complexfloating):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {array.dtype}.")
    array = array.astype(np.float64)
    if array.ndim != 1 or array.shape[0] < 1:
        raise ValueError(
            f"`{name}` must be a non-empty 1-D array of scores [n], got shape {array.shape}."
        )
    if np.any(np.isnan(array)):
        raise ValueError(
            f"`{name}` must not contain NaN, got {int(np.isnan(array).sum())} NaN entries "
            f"(at index {int(np.argmax(np.isnan(array)))} first)."
        )
    return array


def ood_auroc(in_distribution_scores: Any, out_of_distribution_scores: Any) -> float:
    """Area under the ROC curve of a score that should be higher out of distribution.

    The AUROC of the detector "flag x as out-of-distribution (OOD) when score(x) > t", over all
    thresholds t, with the OOD examples as the positive class. It equals the Mann-Whitney
    statistic: the probability that a random OOD example scores higher than a random
    in-distribution one, a tie counting one half,

        AUROC = (#{(i, o): s_o > s_i} + 1/2 #{(i, o): s_o = s_i}) / (n_in n_out).

    1 separates perfectly, 0.5 is chance (or a constant score), 0 ranks every OOD example
    below every in-distribution one. The pair counts are integers, so the result is exact;
    cost `O((n_in + n_out) log n_in)`. Typical scores are the predictive entropy or the mutual
    information of `PredictiveMixture` / `keras_thermo.predict_posterior` (higher = more
    uncertain). Infinite scores are ranked as usual; NaN is refused.

    Args:
        in_distribution_scores: `[n_in]` scores of held-out in-distribution examples.
        out_of_distribution_scores: `[n_out]` scores of out-of-distribution examples.

    Returns:
        The AUROC in `[0, 1]`.

    Example:
        >>> # Pairs (in, out): 1 < 2, 1 < 3, 2 = 2 (half), 2 < 3: (3 + 0.5) / 4.
        >>> ood_auroc([1.0, 2.0], [2.0, 3.0])
        0.875

    References:
        Mann & Whitney (1947), Annals of Mathematical Statistics 18(1); Hanley & McNeil (1982),
        The meaning and use of the area under a ROC curve, Radiology 143(1).
    """
    inside = np.sort(_check_scores("in_distribution_scores", in_distribution_scores))
    outside = _check_scores("out_of_distribution_scores", out_of_distribution_scores)
    below = np.searchsorted(inside, outside, side="left")  # in-distribution scores < s_o
    not_above = np.searchsorted(inside, outside, side="right")  # ... <= s_o
    # Twice the Mann-Whitney U: 2 per pair won plus 1 per tie = below + not_above.
    twice_u = int(np.sum(below, dtype=np.int64)) + int(np.sum(not_above, dtype=np.int64))
    return twice_u / (2 * inside.shape[0] * outside.shape[0])


def expected_log_loss(per_sample_log_losses: Any, weights: Any = None) -> float:
    """Posterior expected log loss: the (weighted) mean of per-sample mean test log losses.

    With posterior samples `theta_1..theta_S` and a test set of size `n`,
    `l_s = -(1/n) sum_i log p(y_i | x_i, theta_s)` is the mean test log loss of sample `s`
    (`log_loss_from_logits` or `nll` of that sample's probabilities), and

        expected_log_loss = sum_s w_s l_s / sum_s w_s,

    with `w_s = 1` by default (Wei & Shang 2026, section 3.2). Weights allow SGLD's
    step-size-weighted averages (Welling & Teh 2011, eq. 11). A non-finite `l_s` (a diverged
    sampler) makes the result NaN or inf, which is how the paper reports unstable runs.

    Args:
        per_sample_log_losses: `[S]` mean test log loss of each posterior sample, S >= 1.
        weights: Optional `[S]` non-negative weights with a positive sum.

    Returns:
        The posterior expected log loss in nats.

    Example:
        >>> expected_log_loss([0.5, 0.7, 0.6])
        0.6
    """
    losses = np.asarray(per_sample_log_losses, dtype=np.float64)
    if losses.ndim != 1 or losses.shape[0] < 1:
        raise ValueError(
            f"`per_sample_log_losses` must be a non-empty 1-D array [S], got shape {losses.shape}."
        )
    if weights is None:
        return float(np.mean(losses))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != losses.shape:
        raise ValueError(
            f"`weights` must have the shape of `per_sample_log_losses` {losses.shape}, "
            f"got {w.shape}."
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(
            f"`weights` must be finite, non-negative, with a positive sum, got {w.tolist()}."
        )
    return float(np.sum(w * losses) / np.sum(w))
