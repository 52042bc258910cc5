"""Statistics on block sums of a chain's output: the batch-means mean and standard error, the
MSER burn-in, the joining of correlated blocks and the familywise critical value. Plain numpy,
exact-value tested; `keras_thermo.equilibration` judges temperatures with them (and re-exports
them).

References:
    C. J. Geyer, "Practical Markov chain Monte Carlo", Statist. Sci. 7 (1992): batch means.
    K. P. White, "An effective truncation heuristic for bias reduction in simulation output",
    Simulation 69 (1997): the MSER truncation rule.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

import numpy as np

__all__ = ["batch_means", "critical_value", "merge_correlated_blocks", "mser_truncation"]


def batch_means(sums: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted mean and its batch-means standard error from per-block sums.

    Block b holds `sums[b] = sum of w_t x_t` and `weights[b] = sum of w_t` over its steps (w_t =
    1, or 0 on steps that do not count, such as TACT-HMC's steps off the plateau). The mean is
    the ratio `sum(sums) / sum(weights)`; its variance is that of a ratio estimator over the
    b non-empty blocks, `b / (b - 1) * sum((s_b - mean w_b)^2) / W^2`, which for equal weights is
    the usual `var(block means) / b`. Needs at least two non-empty blocks (else the error is inf).

    Args:
        sums: `[B, ...]` per-block weighted sums.
        weights: `[B]` per-block weights.

    Returns:
        `(mean, standard_error)`, each of shape `sums.shape[1:]`.

    Example:
        >>> mean, se = batch_means(np.array([1.0, 3.0]), np.array([1.0, 1.0]))
        >>> float(mean), float(se)
        (2.0, 1.0)
    """
    sums = np.asarray(sums, np.float64)
    weights = np.asarray(weights, np.float64)
    used = weights > 0
    sums, weights = sums[used], weights[used]
    count = len(weights)
    shape = sums.shape[1:]
    if count == 0:
        return np.full(shape, np.nan), np.full(shape, np.inf)
    total = weights.sum()
    mean = sums.sum(axis=0) / total
    if count < 2:
        return mean, np.full(shape, np.inf)
    extra = (1,) * len(shape)
    residuals = sums - mean[None] * weights.reshape((count,) + extra)
    variance = count / (count - 1) * np.square(residuals).sum(axis=0) / total**2
    return mean, np.sqrt(variance)


def mser_truncation(block_means: Sequence[float], max_fraction: float = 0.5) -> int:
    """The MSER burn-in: how many leading blocks to drop.

    Chooses `d` minimising `sum_{j >= d} (m_j - mean_{>= d})^2 / (B - d)^2`, the squared standard
    error of the remaining mean, over `d <= max_fraction * B` (White 1997): dropping the
    transient lowers the spread faster than it loses blocks; past the transient it does not.

    Example:
        >>> mser_truncation([5.0, 3.0, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
        2
    """
    means = np.asarray(block_means, np.float64)
    count = len(means)
    if count < 3:
        return 0
    scores = [
        np.square(means[d:] - means[d:].mean()).sum() / (count - d) ** 2
        for d in range(int(max_fraction * count) + 1)
    ]
    return int(np.argmin(scores))  # the first of equal scores: drop no more than needed


def merge_correlated_blocks(weights: np.ndarray, sums: np.ndarray, min_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Joins neighbouring blocks in pairs while their means are correlated and at least
    `2 * min_blocks` blocks remain.

    Batch-means errors assume the block means are independent; blocks shorter than the chain's
    autocorrelation time (a slow thermostat, a drift) give correlated means and an error that is
    too small, so an equilibrated run would be flagged. The lag-1 autocorrelation of the means
    (whole-net column of either kind) is tested against `2 / sqrt(B)`, its ~98% one-sided bound
    for independent means; a run that still drifts at `min_blocks`-sized blocks keeps those,
    the longest blocks the verdict allows. Empty blocks (weight 0) are dropped first.

    Args:
        weights: `[B]` per-block weights.
        sums: `[B, K, V]` per-block weighted sums; column `[:, :, 0]` is tested.
        min_blocks: Blocks the verdict needs.

    Returns:
        `(weights, sums)` of the merged blocks.

    Example:
        >>> w = np.ones(40)
        >>> drift = np.linspace(0.0, 1.0, 40)[:, None, None]  # a trend: strongly correlated means
        >>> merged, _ = merge_correlated_blocks(w, drift, min_blocks=10)
        >>> len(merged)
        10
    """
    used = np.asarray(weights) > 0
    weights, sums = np.asarray(weights, np.float64)[used], np.asarray(sums, np.float64)[used]
    while len(weights) >= 2 * min_blocks:
        means = sums[:, :, 0] / weights[:, None]
        centred = means - means.mean(axis=0)
        variance = np.square(centred).sum(axis=0)
        lag_one = (centred[1:] * centred[:-1]).sum(axis=0) / np.where(variance > 0, variance, np.inf)
        if np.all(lag_one <= 2.0 / math.sqrt(len(weights))):
            break
        odd = len(weights) % 2  # an odd first block joins the first pair
        weights = np.concatenate([weights[:odd + 2].sum(keepdims=True), weights[odd + 2:].reshape(-1, 2).sum(axis=1)])
        sums = np.concatenate([sums[:odd + 2].sum(axis=0, keepdims=True), sums[odd + 2:].reshape((-1, 2) + sums.shape[1:]).sum(axis=1)])
    return weights, sums


def critical_value(confidence: float, num_checks: int) -> float:
    """Two-sided normal quantile with a Bonferroni split over `num_checks` comparisons, so the
    chance that an equilibrated run fails any of them stays below `1 - confidence`."""
    alpha = (1.0 - confidence) / max(1, num_checks)
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)
