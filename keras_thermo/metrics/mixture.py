"""Posterior samples' predictions streamed into their average: `PredictiveMixture` (the
averaged predictive and its entropies, no labels) and `PredictiveAverager` (with the labelled
metrics of `keras_thermo.metrics.classification`). Memory is `O(n K)` however many samples arrive.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_thermo._validation import check_int, check_number
from keras_thermo.metrics.classification import (
    _check_labels,
    _check_probs,
    _entropy_of_rows,
    _log_probabilities_from_logits,
    accuracy,
    brier_score,
    expected_calibration_error,
    log_loss_from_logits,
    nll,
)


def _sample_distribution(logits: Any, probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities [n, K], entropies [n]) of one sample's logits or probabilities.

    From logits the entropy uses the log-softmax directly, so classes whose probability
    underflows to 0 in float64 still contribute their (vanishing) `p log p` exactly.
    """
    if (logits is None) == (probs is None):
        raise ValueError("Pass exactly one of `logits` and `probs` to `update`.")
    if logits is not None:
        log_p = _log_probabilities_from_logits(logits)
        p = np.exp(log_p)
        return p, 0.0 - np.sum(p * log_p, axis=1)
    p = _check_probs(probs)
    return p, _entropy_of_rows(p)


class PredictiveMixture:
    """Streams posterior samples' predictive distributions into their average and its entropies.

    Each `update` takes one posterior sample's predictions on the same `n` examples (logits or
    probabilities) and an optional weight `w_s` (e.g. SGLD's step size). Kept are two running
    sums, `sum_s w_s p_s` `[n, K]` and `sum_s w_s H[p_s]` `[n]`, so memory is `O(n K)` however
    many samples arrive. From them, per example:

    - `mean_probs`: `p_bar = sum_s w_s p_s / sum_s w_s`, the posterior predictive;
    - `predictive_entropy`: `H[p_bar]`, the total uncertainty;
    - `expected_entropy`: `sum_s w_s H[p_s] / sum_s w_s`, the aleatoric part;
    - `mutual_information`: `H[p_bar] - expected_entropy`, the epistemic part (Depeweg et al.
      2018, eq. 5; Smith & Gal 2018, eq. 4). It equals the weighted mean of
      `KL(p_s || p_bar)`, so it is >= 0 and is 0 exactly when all samples agree; the
      subtraction can leave a float64 rounding residue below 0 (|.| ~ 1e-16 log K), which is
      set to 0.

    No labels are needed; `PredictiveAverager` adds the labelled metrics.

    Example:
        >>> mixture = PredictiveMixture()
        >>> mixture.update(probs=[[1.0, 0.0], [0.5, 0.5]])
        >>> mixture.update(probs=[[0.0, 1.0], [0.5, 0.5]])
        >>> mixture.predictive_entropy.round(4)  # both examples: p_bar = [0.5, 0.5]
        array([0.6931, 0.6931])
        >>> mixture.expected_entropy.round(4)  # sure samples vs two coin flips
        array([0.    , 0.6931])
        >>> mixture.mutual_information.round(4)  # disagreement vs agreement
        array([0.6931, 0.    ])

    References:
        Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft (2018), Decomposition of uncertainty in
        Bayesian deep learning for efficient and risk-sensitive learning, ICML; Smith & Gal
        (2018), Understanding measures of uncertainty for adversarial example detection, UAI.
    """

    def __init__(self):
        self._weighted_probs: np.ndarray | None = None
        self._weighted_entropy: np.ndarray | None = None
        self._total_weight = 0.0
        self.num_samples = 0

    def update(self, *, logits: Any = None, probs: Any = None, weight: float = 1.0) -> None:
        """Adds one sample's `[n, K]` predictions; pass exactly one of `logits` and `probs`.

        A single logit column `[n, 1]` is binary (see `probabilities_from_logits`). `weight`
        is a finite real >= 0.
        """
        weight = check_number("weight", weight, low=0.0, low_inclusive=True)
        sample_probs, sample_entropy = _sample_distribution(logits, probs)
        if self._weighted_probs is None:
            self._weighted_probs = np.zeros_like(sample_probs)
            self._weighted_entropy = np.zeros_like(sample_entropy)
        elif sample_probs.shape != self._weighted_probs.shape:
            raise ValueError(
                f"Each update must predict {self._weighted_probs.shape} (examples, classes), "
                f"got {sample_probs.shape}."
            )
        self._weighted_probs += weight * sample_probs
        self._weighted_entropy += weight * sample_entropy
        self._total_weight += weight
        self.num_samples += 1

    @property
    def total_weight(self) -> float:
        """Sum of the weights of the samples so far."""
        return self._total_weight

    def _check_ready(self) -> None:
        if self._weighted_probs is None:
            raise ValueError("No samples yet: call `update` before reading results.")
        if not self._total_weight > 0:
            raise ValueError(
                f"The {self.num_samples} samples so far all have weight 0; the average needs a "
                "positive total weight."
            )

    @property
    def mean_probs(self) -> np.ndarray:
        """`[n, K]` weighted average of the samples' predictive probabilities."""
        self._check_ready()
        return self._weighted_probs / self._total_weight

    @property
    def predictive_entropy(self) -> np.ndarray:
        """`[n]` entropy of the averaged predictive distribution (total uncertainty)."""
        return _entropy_of_rows(self.mean_probs)

    @property
    def expected_entropy(self) -> np.ndarray:
        """`[n]` weighted mean of the samples' own entropies (aleatoric uncertainty)."""
        self._check_ready()
        return self._weighted_entropy / self._total_weight

    @property
    def mutual_information(self) -> np.ndarray:
        """`[n]` predictive minus expected entropy (epistemic uncertainty), >= 0."""
        return np.maximum(self.predictive_entropy - self.expected_entropy, 0.0)


class PredictiveAverager(PredictiveMixture):
    """Streams posterior samples' predictions into the averaged predictive and its metrics.

    Each `update` takes one posterior sample's predictions on the same `n` test examples
    (logits or probabilities) and an optional weight. Memory is `O(n K)`, independent of the
    number of samples. `result()` returns the metrics of the averaged predictive distribution
    together with the posterior expected log loss of the individual samples; the per-example
    entropies and mutual information of `PredictiveMixture` are available too.

    Args:
        labels: `[n]` integer test labels.
        num_bins: Number of ECE bins.

    Example:
        >>> averager = PredictiveAverager(labels=[0, 1])
        >>> averager.update(logits=[[2.0, 0.0], [0.0, 2.0]])
        >>> averager.update(probs=[[0.5, 0.5], [0.5, 0.5]])
        >>> sorted(averager.result())
        ['accuracy', 'brier', 'ece', 'expected_log_loss', 'nll', 'num_samples']
    """

    def __init__(self, labels: Any, num_bins: int = 15):
        super().__init__()
        self.labels = _check_labels(labels, None, None)
        if self.labels.shape[0] < 1 or self.labels.min() < 0:
            raise ValueError(
                f"`labels` must be a non-empty array of integers >= 0, got {labels!r}."
            )
        self.num_bins = check_int("num_bins", num_bins, low=1)
        self._weighted_loss = 0.0

    def update(self, *, logits: Any = None, probs: Any = None, weight: float = 1.0) -> None:
        """Adds one posterior sample's predictions; pass exactly one of `logits` and `probs`.

        With logits the sample's log loss is exact (`log_loss_from_logits`); with
        probabilities it is `nll`, clipped at `NLL_PROBABILITY_FLOOR`.
        """
        if (logits is None) == (probs is None):
            raise ValueError("Pass exactly one of `logits` and `probs` to `update`.")
        if logits is not None:
            sample_loss = log_loss_from_logits(logits, self.labels)
        else:
            sample_loss = nll(probs, self.labels)
        super().update(logits=logits, probs=probs, weight=weight)
        self._weighted_loss += float(weight) * sample_loss

    def result(self) -> dict[str, float]:
        """Metrics: accuracy, nll, brier, ece (averaged predictive), expected_log_loss."""
        p = self.mean_probs
        return {
            "accuracy": accuracy(p, self.labels),
            "nll": nll(p, self.labels),
            "brier": brier_score(p, self.labels),
            "ece": expected_calibration_error(p, self.labels, self.num_bins),
            "expected_log_loss": self._weighted_loss / self._total_weight,
            "num_samples": self.num_samples,
        }
