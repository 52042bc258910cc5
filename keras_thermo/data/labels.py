"""Label noise and stratified holdouts over integer class labels.

Label noise follows Luo et al. (2018), section 5.2: at the start of every epoch a fraction of
the training labels is permuted among themselves (`permute_labels`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from keras_thermo._validation import check_int, check_number, check_seed


def num_permuted_labels(num_labels: int, fraction: float) -> int:
    """`floor(fraction * num_labels + 1/2)`: the requested fraction, rounded half up."""
    return int(math.floor(fraction * num_labels + 0.5))


def label_permutation(num_labels: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Source indices of a permutation that moves exactly `k` labels, `k = num_permuted_labels`.

    `k` positions are drawn uniformly without replacement, put in random order
    `(i_1, ..., i_k)`, and position `i_j` receives the label of `i_{j+1}` (`i_k` that of
    `i_1`): a uniformly random cyclic permutation of the chosen positions. Every chosen label
    therefore moves to another chosen position (no fixed points, unlike a plain shuffle of the
    subset, which would leave about one in place); the other `N - k` labels stay. With `k = 1`
    there is nowhere to move, and nothing changes.

    Args:
        num_labels: `N`, the number of labels.
        fraction: Fraction of labels to move, in `[0, 1]`.
        rng: Numpy random generator.

    Returns:
        int64 `[N]` array `source` such that the permuted labels are `labels[source]`.

    Example:
        >>> source = label_permutation(10, 0.3, np.random.default_rng(0))
        >>> int(np.sum(source != np.arange(10)))
        3
    """
    num_labels = check_int("num_labels", num_labels, low=0)
    fraction = check_number("fraction", fraction, low=0.0, high=1.0, low_inclusive=True)
    source = np.arange(num_labels, dtype=np.int64)
    count = num_permuted_labels(num_labels, fraction)
    if count >= 2:
        chosen = rng.choice(num_labels, size=count, replace=False)
        source[chosen] = np.roll(chosen, -1)
    return source


def permute_labels(labels: Any, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Returns a copy of `labels` in which exactly `round(fraction * N)` positions are permuted.

    The label noise of Luo et al. (2018), section 5.2, made exact: the chosen positions swap
    labels cyclically (see `label_permutation`), so each of them now holds the label of a
    different example. The multiset of labels is unchanged. The number of labels whose
    *value* changes can be smaller than `k`, when an example receives the label of another
    example of the same class (about `k (1 - sum_c p_c^2)` changes for class frequencies p).

    Args:
        labels: `[N]` integer labels.
        fraction: Fraction of positions to permute, in `[0, 1]` (the paper uses 0, 0.2, 0.3).
        rng: Numpy random generator.

    Returns:
        The permuted labels, `[N]`, same dtype.

    Example:
        >>> permute_labels(np.arange(5), 0.4, np.random.default_rng(1)).tolist()  # 2 swapped
        [0, 2, 1, 3, 4]

    Reference:
        Luo, Wang, Zhou, Yang, Wang, Li (2018), Thermostat-assisted continuously-tempered
        Hamiltonian Monte Carlo for Bayesian learning, NeurIPS, section 5.2.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D array [N], got shape {array.shape}.")
    return array[label_permutation(array.shape[0], fraction, rng)]


def stratified_holdout(labels: Any, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Splits example indices into a kept and a held-out part, class by class.

    Within each class c (in increasing order), `floor(fraction * n_c + 1/2)` of its examples,
    chosen by one `np.random.default_rng(seed)` permutation per class, are held out. The digits
    train/test split is this split of the whole dataset; a validation split carved from a
    training split is this split of the training labels.

    Args:
        labels: `[N]` integer class labels.
        fraction: Fraction of each class to hold out, in `[0, 1)`.
        seed: Seed of the draw, in `[0, 2**31)`.

    Returns:
        `(kept, held_out)`: sorted int64 index arrays, disjoint, together `0..N-1`.

    Example:
        >>> kept, held_out = stratified_holdout([0, 0, 0, 0, 1, 1, 1, 1], 0.25, seed=0)
        >>> len(kept), len(held_out)
        (6, 2)
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"`labels` must be a 1-D array of integer labels, got {labels.dtype} shape {labels.shape}."
        )
    fraction = check_number("fraction", fraction, low=0.0, high=1.0, low_inclusive=True, high_inclusive=False)
    seed = check_seed("seed", seed)
    rng = np.random.default_rng(seed)
    held = np.zeros(labels.shape[0], dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        held[rng.permutation(members)[: num_permuted_labels(members.size, fraction)]] = True
    return np.flatnonzero(~held).astype(np.int64), np.flatnonzero(held).astype(np.int64)
