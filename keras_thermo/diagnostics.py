"""MCMC convergence diagnostics: effective sample size and R-hat.

Thin numpy-in, numpy-out wrappers over `tensorflow_probability.mcmc`; the estimators are
TFP's. What this module adds is one array convention and input checks:

- a single chain is `[S]` or `[S, D]` (S draws of D scalars: sample axis first, as in
  `SampleCollector.samples`);
- several chains are `[C, S, D]` (or `[C, S]`): chain axis first, then draws, then scalars.

Computation is in float64, on each scalar's draws shifted by their mean and divided by their
largest deviation: both statistics are ratios of (co)variances, unchanged by that affine map,
while the squared deviations of raw draws below ~1e-154 underflow to 0 and would give 0/0.
`summary` condenses both statistics over every parameter of a network (and over the
predictive log-probabilities of a held-out batch) into a few numbers.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from keras_thermo._validation import check_bool, check_number
from keras_thermo.metrics import ROW_SUM_TOLERANCE

# `summary` hands TFP blocks of parameters of at most this many float64 entries
# ([C, S, block]), so the memory of a million-weight chain stays bounded (TFP's FFT-based ESS
# holds a few padded complex copies of its input).
SUMMARY_BLOCK_ELEMENTS = 2**22


# `summary` takes the R-hat and ESS of predictive probabilities on the log scale, with
# probabilities below float64's smallest normal number (which keep fewer significant digits,
# down to none at 0) counted as equal to it: log(2.2e-308) = -708.4.
PROBABILITY_FLOOR = float(np.finfo(np.float64).tiny)


def _standardized(array: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Each scalar's draws (reduced over `axes`) centred and divided by their largest deviation.

    R-hat and ESS are invariant under `x -> (x - a) / b`, so this changes neither; it keeps
    their variances O(1), where the squares of deviations below ~1e-154 underflow to 0. A
    constant scalar stays all zeros (its statistics remain 0/0 = NaN). Scaling by the largest
    magnitude first keeps the mean of huge draws from overflowing.
    """
    peak = np.max(np.abs(array), axis=axes, keepdims=True)
    array = array / np.where(peak > 0, peak, 1.0)
    centred = array - np.mean(array, axis=axes, keepdims=True)
    spread = np.max(np.abs(centred), axis=axes, keepdims=True)
    return centred / np.where(spread > 0, spread, 1.0)


class _ComplexCastFilter(logging.Filter):
    """Drops TensorFlow's warning about TFP's deliberate cast of its FFT result back to real."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "casting an input of type complex" not in record.getMessage()


@contextlib.contextmanager
def _quiet_complex_cast():
    # TFP's auto-correlation takes the real part of a complex FFT with `tf.cast`, which logs a
    # warning on every eager call; the discarded imaginary part is zero by construction.
    logger = tf.get_logger()
    record_filter = _ComplexCastFilter()
    logger.addFilter(record_filter)
    try:
        yield
    finally:
        logger.removeFilter(record_filter)


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
        `[D]` (or `[C, D]`) effective sample sizes; a float for `[S]` input. NaN for a scalar
        whose draws are all equal.

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
    standard = _standardized(array, (0, 1) if array.ndim == 3 else (0,))
    if array.ndim == 3:
        # TFP wants draws on axis 0: [C, S, D] -> [S, C, D].
        states = np.transpose(standard, (1, 0, 2))
        cross_chain_dims = 1 if combine_chains and array.shape[0] >= 2 else None
    else:
        states, cross_chain_dims = standard, None
    with _quiet_complex_cast():
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
        `[D]` R-hat values (`[]`-shaped array for `[C, S]` input). NaN for a scalar whose
        draws are all equal (0/0), inf for one constant within each chain but not across.

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
    states = np.swapaxes(_standardized(array, (0, 1)), 0, 1)  # [C, S, ...] -> [S, C, ...]
    return tfp.mcmc.potential_scale_reduction(
        tf.constant(states), independent_chain_ndims=1, split_chains=split_chains
    ).numpy()


def _load_chains(name: str, value: Any, layout: str, ndim: int):
    """The `[C, S, ...]` array behind `value` (memory-mapped for a `.npy` path), shape-checked."""
    from keras_thermo._recording import SampleCollector  # noqa: PLC0415 (TF-heavy, needed rarely)

    if isinstance(value, SampleCollector):
        value = value.samples
    if isinstance(value, (str, os.PathLike)):
        value = np.load(os.fspath(value), mmap_mode="r")
    elif not isinstance(value, np.ndarray):
        value = np.asarray(value)
    if value.dtype == object or not np.issubdtype(value.dtype, np.number):
        raise TypeError(f"`{name}` must hold real numbers {layout}, got dtype {value.dtype}.")
    if value.ndim != ndim:
        hint = ""
        if value.ndim == ndim - 1:
            hint = " (one chain? R-hat compares several: stack chains along a new axis 0)"
        raise ValueError(f"`{name}` must be {layout}, got shape {value.shape}{hint}.")
    if value.shape[0] < 2:
        raise ValueError(
            f"`{name}` needs at least 2 chains along axis 0 for R-hat, got shape {value.shape} "
            f"({value.shape[0]} chain); run several independent chains and stack them."
        )
    if any(d < 1 for d in value.shape[2:]):
        raise ValueError(f"`{name}` must not have empty axes, got shape {value.shape}.")
    return value


def _column_statistics(name: str, chains: Any, split_chains: bool, probabilities: bool):
    """(R-hat [D], ESS [D], constant [D]) of `[C, S, D]` chains, computed by blocks of columns.

    Probabilities are taken on the log scale, `log max(p, PROBABILITY_FLOOR)`. A column whose
    every draw of every chain is equal (after that map) has no R-hat or ESS (0/0); it is
    flagged in `constant` and its statistics are NaN.
    """
    num_chains, num_draws, num_columns = chains.shape
    min_draws = 4 if split_chains else 2
    if num_draws < min_draws:
        raise ValueError(
            f"`{name}` needs at least {min_draws} draws along axis 1 (split_chains={split_chains}), "
            f"got shape {chains.shape}."
        )
    rhat = np.empty(num_columns)
    ess = np.empty(num_columns)
    constant = np.empty(num_columns, bool)
    block = max(1, SUMMARY_BLOCK_ELEMENTS // (num_chains * num_draws))
    for low in range(0, num_columns, block):
        high = min(low + block, num_columns)
        chunk = np.asarray(chains[:, :, low:high], dtype=np.float64)
        if not np.all(np.isfinite(chunk)):
            column = low + int(np.argmin(np.all(np.isfinite(chunk), axis=(0, 1))))
            raise ValueError(f"`{name}` must be finite, got NaN or infinite draws of scalar {column}.")
        if probabilities and (chunk.min() < 0.0 or chunk.max() > 1.0):
            raise ValueError(
                f"`{name}` must hold probabilities in [0, 1], got values in "
                f"[{chunk.min():g}, {chunk.max():g}] (pass probabilities, not logits)."
            )
        if probabilities:
            chunk = np.log(np.maximum(chunk, PROBABILITY_FLOOR))
        constant[low:high] = np.all(chunk == chunk[:1, :1], axis=(0, 1))
        rhat[low:high] = potential_scale_reduction(chunk, split_chains=split_chains)
        ess[low:high] = effective_sample_size(chunk)
    rhat[constant] = np.nan
    ess[constant] = np.nan
    return rhat, ess, constant


def _quantile_name(q: float) -> str:
    return f"q{100 * q:g}"


def _describe(values: np.ndarray, defined: np.ndarray, worst: str, quantiles, index_shape) -> dict:
    """Worst value (and where), median and quantiles over the `defined` entries that are not NaN.

    A NaN outside the constant scalars (a statistic TFP could not form) is left out and counted
    in `num_undefined`, so one such scalar cannot turn the worst value, the median and every
    quantile into NaN. Quantiles are order statistics (numpy's "inverted_cdf"), not
    interpolations, so an infinite R-hat (chains constant within themselves but apart) is
    reported as inf, never as NaN.
    """
    undefined = defined & np.isnan(values)
    defined = defined & ~undefined
    if not np.any(defined):
        nan = float("nan")
        return {"worst": nan, "worst_index": None, "median": nan,
                "quantiles": {_quantile_name(q): nan for q in quantiles},
                "num_undefined": int(undefined.sum())}
    masked = np.where(defined, values, -np.inf if worst == "max" else np.inf)
    flat_index = int(np.argmax(masked) if worst == "max" else np.argmin(masked))
    index = np.unravel_index(flat_index, index_shape)
    kept = values[defined]
    levels = np.quantile(kept, [0.5, *quantiles], method="inverted_cdf")
    return {
        "worst": float(values[flat_index]),
        "worst_index": int(index[0]) if len(index) == 1 else [int(i) for i in index],
        "median": float(levels[0]),
        "quantiles": {_quantile_name(q): float(v) for q, v in zip(quantiles, levels[1:])},
        "num_undefined": int(undefined.sum()),
    }


def _section(name, chains, index_shape, split_chains, quantiles, rhat_threshold, probabilities) -> dict:
    num_chains, num_draws = chains.shape[:2]
    flat = chains.reshape(num_chains, num_draws, -1)
    rhat, ess, constant = _column_statistics(name, flat, split_chains, probabilities)
    defined = ~constant
    rhat_summary = _describe(rhat, defined, "max", quantiles, index_shape)
    rhat_summary["threshold"] = rhat_threshold
    counted = defined & ~np.isnan(rhat)
    rhat_summary["fraction_above_threshold"] = (
        float(np.mean(rhat[counted] > rhat_threshold)) if np.any(counted) else float("nan")
    )
    return {
        "num_chains": int(num_chains),
        "num_draws": int(num_draws),
        "num_constant": int(constant.sum()),
        "rhat": rhat_summary,
        "ess": _describe(ess, defined, "min", quantiles, index_shape),
    }


def summary(
    samples: Any = None,
    *,
    probs: Any = None,
    quantiles: Sequence[float] = (0.01, 0.1, 0.9, 0.99),
    rhat_threshold: float = 1.02,
    split_chains: bool = True,
) -> dict:
    """Convergence across chains, condensed: split R-hat and ESS, worst case and quantiles.

    For each scalar, R-hat (`potential_scale_reduction`, split chains by default) and the
    cross-chain ESS (`effective_sample_size`), both TFP's estimators, are computed and then
    summarised by their worst value and where it is, their median and the given quantiles,
    and the fraction of R-hats above `rhat_threshold`. Two inputs, either or both:

    - `samples`, `[C, S, Nd]`: the flattened network weights of C chains. With millions of
      weights the per-parameter figures are many and each is noisy; the quantiles say how
      much of the network has mixed.
    - `probs`, `[C, S, n, K]`: each sample's predictive probabilities on a held-out batch
      (`keras_thermo.posterior.predict_samples`): one R-hat per (example, class), of the
      log-probability `log p`. Weights are not identifiable (permuting hidden units leaves
      the net's function unchanged), so chains may disagree on weights and still agree on
      predictions; this R-hat is the convergence figure that decides whether posterior
      averages can be trusted. The log scale (of a confident net's probabilities, roughly
      its logit gaps) keeps what a probability of 1e-200 says: on the probability scale such
      columns are heavy-tailed, dominated by their largest draws, and chains whose logits
      sit 20 nats apart barely move their R-hat. Probabilities below float64's smallest
      normal number (`PROBABILITY_FLOOR`, 2.2e-308) count as equal to it.

    Scalars that never change (every draw of every chain equal, e.g. a probability saturated
    at exactly 1, or below `PROBABILITY_FLOOR`) have no R-hat or ESS: both are 0/0. They are
    counted in `num_constant` and left out rather than given R-hat 1: a scalar that never
    moves says nothing about mixing, and counting it as converged would pull the median and
    quantiles towards 1 and hide the scalars that do move. Scalars that do move, however
    little, get their statistics: both are computed on each scalar's draws standardised (see
    the module docstring), where squares cannot underflow. A statistic that is still NaN is
    left out of the figures and counted in `num_undefined`.

    R-hat is TFP's statistic, a ratio of variances (see `potential_scale_reduction`): the
    default threshold 1.02 is about the `1.01` that Vehtari et al. (2021) recommend for its
    square root; the classic `1.1` of Gelman & Rubin corresponds to about 1.21 here.

    Args:
        samples: `[C, S, Nd]` (C >= 2 chains, S draws, Nd scalars), a `.npy` path holding one
            (memory-mapped and read by blocks of scalars), a `SampleCollector` holding
            `[C, S, Nd]`, or None.
        probs: `[C, S, n, K]` predictive probabilities (rows over K sum to 1), or None.
        quantiles: Levels in [0, 1] reported besides the median (upper ones matter for R-hat,
            lower ones for ESS).
        rhat_threshold: R-hat above which a scalar counts as not converged; > 1.
        split_chains: Split each chain in halves for R-hat (needs S >= 4), which also flags a
            chain that drifts.

    Returns:
        A JSON-ready dict with a `"parameters"` entry (from `samples`) and/or a `"predictive"`
        entry (from `probs`), each `{"num_chains", "num_draws", "num_constant", "rhat", "ess"}`
        (the predictive one also `"num_examples"`, `"num_classes"`); `"rhat"` and `"ess"` are
        `{"worst", "worst_index", "median", "quantiles": {"q1": ..., ...}, "num_undefined"}`
        (worst: largest R-hat, smallest ESS; the index is a parameter index, or
        `[example, class]`; `num_undefined`: non-constant scalars whose statistic is NaN, left
        out of the figures), and `"rhat"` also has `"threshold"` and
        `"fraction_above_threshold"` (over the scalars with an R-hat).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> chains = rng.normal(size=(4, 500, 3))  # [C, S, Nd]: four chains of one posterior
        >>> chains[3] += 3.0  # ... but the fourth is stuck elsewhere
        >>> report = summary(chains)["parameters"]
        >>> report["rhat"]["median"] > 1.1, report["rhat"]["fraction_above_threshold"]
        (True, 1.0)
        >>> probs = np.full((2, 10, 5, 3), 1 / 3)  # [C, S, n, K]: constant predictions
        >>> summary(probs=probs)["predictive"]["num_constant"]
        15

    References:
        Vehtari, Gelman, Simpson, Carpenter, Buerkner (2021), Rank-normalization, folding, and
        localization: an improved R-hat, Bayesian Analysis 16(2); Gelman & Rubin (1992),
        Statistical Science 7(4).
    """
    if samples is None and probs is None:
        raise ValueError("Pass `samples` [C, S, Nd], `probs` [C, S, n, K], or both; got neither.")
    if isinstance(quantiles, (str, bytes)) or not isinstance(quantiles, Sequence) or not quantiles:
        raise TypeError(f"`quantiles` must be a non-empty sequence of levels in [0, 1], got {quantiles!r}.")
    quantiles = tuple(
        check_number(f"quantiles[{i}]", q, low=0.0, high=1.0, low_inclusive=True)
        for i, q in enumerate(quantiles)
    )
    rhat_threshold = check_number("rhat_threshold", rhat_threshold, low=1.0)
    split_chains = check_bool("split_chains", split_chains)
    report: dict[str, Any] = {}
    if samples is not None:
        chains = _load_chains("samples", samples, "[C, S, Nd] (chains, draws, scalars)", 3)
        report["parameters"] = {
            "num_scalars": int(chains.shape[2]),
            **_section("samples", chains, chains.shape[2:], split_chains, quantiles,
                       rhat_threshold, probabilities=False),
        }
    if probs is not None:
        chains = _load_chains("probs", probs, "[C, S, n, K] (chains, draws, examples, classes)", 4)
        row_sums = np.asarray(chains.sum(axis=3), np.float64)
        worst = np.unravel_index(int(np.argmax(np.abs(row_sums - 1.0))), row_sums.shape)
        if abs(row_sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
            raise ValueError(
                f"`probs` rows over the class axis must sum to 1 (within {ROW_SUM_TOLERANCE:g}); "
                f"probs[{', '.join(str(int(i)) for i in worst)}, :] sums to {float(row_sums[worst])!r}."
            )
        report["predictive"] = {
            "num_examples": int(chains.shape[2]),
            "num_classes": int(chains.shape[3]),
            **_section("probs", chains, chains.shape[2:], split_chains, quantiles,
                       rhat_threshold, probabilities=True),
        }
    return report
