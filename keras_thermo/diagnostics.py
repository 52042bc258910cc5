"""MCMC convergence diagnostics: effective sample size and R-hat.

Thin numpy-in, numpy-out wrappers over `tensorflow_probability.mcmc`; the estimators are
TFP's. What this module adds is one array convention and input checks:

- a single chain is `[S]` or `[S, D]` (S draws of D scalars: sample axis first, as in
  `SampleCollector.samples`);
- several chains are `[C, S, D]` (or `[C, S]`): chain axis first, then draws, then scalars.

Computation is in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp


def _as_float64_array(
    name: str, value: Any, allowed_ndims: tuple[int, ...], layout: str
) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim not in allowed_ndims:
        raise ValueError(f"`{name}` must be {layout}, got an array of shape {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite, got NaN or infinite entries.")
    return array


def effective_sample_size(
    samples: Any,
    *,
    combine_chains: bool = True,
    filter_beyond_positive_pairs: bool = True,
) -> np.ndarray | float:
    """Effective sample size of each scalar, via `tfp.mcmc.effective_sample_size`.

    `ESS = S / tau`, with `tau = 1 + 2 sum_k rho_k` the integrated autocorrelation time. By
    default the sum over lags is truncated with Geyer's initial positive sequence (pairs of
    autocorrelations are summed until a pair turns negative), which is consistent for
    reversible chains and can report `ESS > S` for antithetic ones; with
    `filter_beyond_positive_pairs=False` TFP truncates at the first negative autocorrelation
    instead, which never reports more than about S.

    Args:
        samples: One chain, `[S]` or `[S, D]` (draws along axis 0), or several chains,
            `[C, S, D]` (chain axis 0, draws along axis 1). S >= 2.
        combine_chains: For `[C, S, D]` input with C >= 2: if True, one ESS per scalar for all
            chains together, with the cross-chain autocorrelation estimate of Vehtari et al.
            (2021), which also penalises chains that disagree (about C * S for well-mixed
            i.i.d. chains); if False, one ESS per chain, shape `[C, D]`.
        filter_beyond_positive_pairs: Truncation rule, see above.

    Returns:
        `[D]` (or `[C, D]`) effective sample sizes; a float for `[S]` input.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> ess = effective_sample_size(rng.normal(size=(2000, 3)))
        >>> ess.shape, bool(np.all((ess > 1600) & (ess < 2400)))
        ((3,), True)

    References:
        Geyer (1992), Practical Markov chain Monte Carlo, Statistical Science 7(4).
        Vehtari, Gelman, Simpson, Carpenter, Buerkner (2021), Rank-normalization, folding, and
        localization: an improved R-hat, Bayesian Analysis 16(2).
    """
    array = _as_float64_array(
        "samples", samples, (1, 2, 3), "[S], [S, D] (one chain) or [C, S, D] (chains)"
    )
    sample_axis = 1 if array.ndim == 3 else 0
    if array.shape[sample_axis] < 2:
        raise ValueError(
            f"`samples` needs at least 2 draws along axis {sample_axis}, got shape {array.shape}."
        )
    if array.ndim == 3:
        # TFP wants draws on axis 0: [C, S, D] -> [S, C, D].
        states = np.transpose(array, (1, 0, 2))
        cross_chain_dims = 1 if combine_chains and array.shape[0] >= 2 else None
    else:
        states, cross_chain_dims = array, None
    ess = tfp.mcmc.effective_sample_size(
        tf.constant(states),
        filter_beyond_positive_pairs=filter_beyond_positive_pairs,
        cross_chain_dims=cross_chain_dims,
    ).numpy()
    if array.ndim == 3 and cross_chain_dims is None and combine_chains:
        ess = ess[0]  # A single chain given as [1, S, D].
    return float(ess) if array.ndim == 1 else ess


def potential_scale_reduction(chains: Any, *, split_chains: bool = True) -> np.ndarray:
    """Potential scale reduction factor (R-hat) of each scalar, via TFP.

    Returns TFP's statistic (Brooks & Gelman 1998), a ratio of variances, not its square
    root: with `W` the mean within-chain variance, `B/S` the variance of the chain means,
    `var+ = (S-1)/S W + B/S`,

        R = (C + 1)/C * var+ / W - (S - 1)/(C S).

    It tends to 1 when all chains sample the same distribution and exceeds 1 when their
    means disagree. Because it is a variance ratio, a threshold on the square-root form
    (e.g. 1.01) corresponds to about its square (1.02) here.

    Args:
        chains: `[C, S, D]` or `[C, S]`: C >= 2 chains (axis 0) of S draws (axis 1).
        split_chains: If True (the default, as Vehtari et al. 2021 recommend), each chain is
            cut into halves that count as separate chains, which also flags a chain that
            drifts within itself. Needs S >= 4.

    Returns:
        `[D]` R-hat values (`[]`-shaped array for `[C, S]` input).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> r = potential_scale_reduction(rng.normal(size=(4, 1000, 2)))
        >>> bool(np.all(np.abs(r - 1) < 0.02))
        True

    References:
        Gelman & Rubin (1992), Statistical Science 7(4); Brooks & Gelman (1998), Journal of
        Computational and Graphical Statistics 7(4).
    """
    array = _as_float64_array("chains", chains, (2, 3), "[C, S] or [C, S, D] (chains first)")
    if array.shape[0] < 2:
        raise ValueError(f"`chains` needs at least 2 chains along axis 0, got shape {array.shape}.")
    min_draws = 4 if split_chains else 2
    if array.shape[1] < min_draws:
        raise ValueError(
            f"`chains` needs at least {min_draws} draws along axis 1 "
            f"(split_chains={split_chains}), got shape {array.shape}."
        )
    states = np.swapaxes(array, 0, 1)  # [C, S, ...] -> [S, C, ...]
    return tfp.mcmc.potential_scale_reduction(
        tf.constant(states), independent_chain_ndims=1, split_chains=split_chains
    ).numpy()
