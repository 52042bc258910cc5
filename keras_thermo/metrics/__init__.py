"""Metrics of predictive distributions for classification.

Every function takes numpy arrays (or anything `np.asarray` accepts), works in float64 and
returns Python floats or numpy arrays. `probs` is `[n, K]`: one categorical distribution over
`K` classes per example, typically the posterior predictive averaged over samples,
`p(y | x) ~= (1/S) sum_s p(y | x, theta_s)`. `labels` is `[n]` integers in `[0, K)`.

Two log losses appear in the SG-MCMC literature and both are here:

- `nll`: the negative log likelihood of the *averaged* predictive distribution,
  `-(1/n) sum_i log((1/S) sum_s p(y_i | x_i, theta_s))` (the "test log likelihood", negated).
- `expected_log_loss`: the *posterior expected* log loss, `(1/S) sum_s l_s` with
  `l_s = -(1/n) sum_i log p(y_i | x_i, theta_s)`, the mean test log loss of each posterior
  sample averaged over samples (Wei & Shang 2026, section 3.2, Tables 1 and 3).

By Jensen's inequality `nll <= expected_log_loss`; the gap measures how much averaging over
the posterior helps. `PredictiveAverager` accumulates both while samples stream in.

Epistemic uncertainty splits the same way (Depeweg et al. 2018; Smith & Gal 2018). Per example,
the *predictive entropy* `H[p_bar]` of the averaged distribution is the total uncertainty, the
*expected entropy* `(1/S) sum_s H[p_s]` the part every sample already has (aleatoric), and
their difference, the *mutual information* between the label and the parameters,
`I = H[p_bar] - (1/S) sum_s H[p_s] >= 0`, the part that comes from the samples disagreeing.
`PredictiveMixture` streams all three; `ood_auroc` scores any of them as a detector of
out-of-distribution inputs.

The functions (and `ROW_SUM_TOLERANCE`, `NLL_PROBABILITY_FLOOR`) live in `classification`, the
streaming averages in `mixture`; every name is importable from `keras_thermo.metrics`.
"""

from keras_thermo.metrics.classification import (
    NLL_PROBABILITY_FLOOR,
    ROW_SUM_TOLERANCE,
    ReliabilityDiagram,
    accuracy,
    brier_score,
    entropy,
    expected_calibration_error,
    expected_log_loss,
    log_loss_from_logits,
    nll,
    ood_auroc,
    probabilities_from_logits,
    reliability_diagram_data,
)
from keras_thermo.metrics.mixture import PredictiveAverager, PredictiveMixture

__all__ = [
    "accuracy",
    "brier_score",
    "entropy",
    "expected_calibration_error",
    "expected_log_loss",
    "log_loss_from_logits",
    "nll",
    "NLL_PROBABILITY_FLOOR",
    "ood_auroc",
    "PredictiveAverager",
    "PredictiveMixture",
    "probabilities_from_logits",
    "reliability_diagram_data",
    "ReliabilityDiagram",
    "ROW_SUM_TOLERANCE",
]
