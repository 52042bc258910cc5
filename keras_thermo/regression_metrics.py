"""The predictive mixture of a regression net's posterior samples, and its metrics, in float64.

Each posterior sample `theta_s` predicts a Gaussian `N(mu_s(x), sigma_s(x)^2)` per target; the
posterior predictive distribution is their weighted mixture. `RegressionPrediction` holds it:
its mean and its total standard deviation (split by the law of total variance into the
aleatoric part `E_s sigma_s^2` and the epistemic part `Var_s mu_s`), its exact quantiles and
central intervals (the mixture's CDF inverted numerically), its density, CDF and CRPS (exact for
a Gaussian mixture, its pair term in blocks, never `[S, S, n]`). `RegressionAverager` streams
the same metrics over samples as they arrive, in bounded memory (what
`keras_thermo.callbacks.PosteriorAverage` reports during `fit`).

`keras_thermo.regression` builds these from stored samples and re-exports both classes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from keras_thermo._validation import check_bool, check_int, check_number

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# Elements of one block of the CRPS pair term, [block, S, n, D].
_PAIR_BLOCK_ELEMENTS = 4_000_000


# --------------------------------------------------------------------------------------------
# The standard normal, in float64


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    # erfc keeps the lower tail accurate (1 - Phi(-z) would cancel).
    return 0.5 * tf.math.erfc(tf.constant(-np.asarray(z, np.float64) / _SQRT2)).numpy()


def _normal_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * np.square(z) - _LOG_SQRT_2PI)


def _normal_ppf(p: float) -> float:
    return float(tf.math.ndtri(tf.constant(p, tf.float64)))


def _expected_abs_normal(m: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """`E|X|` for `X ~ N(m, variance)`: `2 s phi(m / s) + m (2 Phi(m / s) - 1)`."""
    s = np.sqrt(variance)
    z = m / s
    return 2.0 * s * _normal_pdf(z) + m * tf.math.erf(tf.constant(z / _SQRT2)).numpy()


def _targets(y: Any, name: str = "y") -> np.ndarray:
    """Targets as float64 `[n, D]` (`[n]` is one target)."""
    y = np.asarray(y, np.float64)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ValueError(f"`{name}` must be regression targets of shape [n] or [n, D], got shape {y.shape}.")
    return y


def _check_probability(name: str, value: Any) -> float:
    return check_number(name, value, low=0.0, high=1.0, high_inclusive=False)


class _LogMeanExp:
    """Running `log sum_s w_s exp(l_s)` per example, stable for any magnitude of `l_s`."""

    def __init__(self):
        self.shift = None  # running max of l_s
        self.total = None  # sum_s w_s exp(l_s - shift)
        self.weight = 0.0

    def add(self, log_values: np.ndarray, weight: float) -> None:
        if weight == 0.0:
            return
        self.weight += weight
        if self.shift is None:
            self.shift, self.total = log_values.copy(), np.full_like(log_values, weight)
            return
        shift = np.maximum(self.shift, log_values)
        self.total = self.total * np.exp(self.shift - shift) + weight * np.exp(log_values - shift)
        self.shift = shift

    def result(self) -> np.ndarray:
        """`log (sum_s w_s exp(l_s) / sum_s w_s)`."""
        return self.shift + np.log(self.total / self.weight)


def _component_log_density(y: np.ndarray, means: np.ndarray, stds: np.ndarray) -> np.ndarray:
    """`[n]` log density of one sample's Gaussian at the example's `D` targets."""
    z = (y - means) / stds
    return np.sum(-0.5 * np.square(z) - np.log(stds) - _LOG_SQRT_2PI, axis=-1)


# --------------------------------------------------------------------------------------------
# The predictive mixture


class RegressionPrediction:
    """The posterior predictive distribution of regression targets: per example and target, a
    weighted mixture of the samples' Gaussians `N(mu_s, sigma_s^2)`.

    Built one sample at a time with `add` (what `predict_posterior` does), or from arrays with
    `from_components`. Arrays it returns are float64 `[n, D]`; `log_density` is `[n]`.

    The moments are running sums (`O(n D)` memory); the quantiles, intervals, CDF and CRPS need
    the components, kept as two `[S, n, D]` arrays unless `keep_components=False`.

    Example:
        >>> import numpy as np
        >>> # Two samples that agree on the noise (sd 1) and disagree on the mean (-1, +1).
        >>> prediction = RegressionPrediction.from_components(
        ...     means=[[[-1.0]], [[1.0]]], stds=[[[1.0]], [[1.0]]])
        >>> prediction.mean, prediction.aleatoric_std, prediction.epistemic_std
        (array([[0.]]), array([[1.]]), array([[1.]]))
        >>> lower, upper = prediction.interval(0.9)
        >>> round(float(upper[0, 0]), 4)  # the Gaussian of the same sd, sqrt(2), says 2.326
        2.2845
    """

    def __init__(self, keep_components: bool = True):
        self.keep_components = check_bool("keep_components", keep_components)
        self.total_weight = 0.0
        self.num_samples = 0
        self._shift = None  # the first sample's means: moments about it avoid cancellation
        self._sum_mean = self._sum_square = self._sum_variance = None
        self._means: list[np.ndarray] = []
        self._stds: list[np.ndarray] = []
        self._weights: list[float] = []
        self._components = None

    @classmethod
    def from_components(cls, means: Any, stds: Any, weights: Any = None) -> "RegressionPrediction":
        """A mixture from component means and standard deviations `[S, n, D]` (optional
        non-negative weights `[S]`, default equal)."""
        means = np.asarray(means, np.float64)
        stds = np.asarray(stds, np.float64)
        if means.ndim != 3 or stds.shape != means.shape:
            raise ValueError(
                f"`means` and `stds` must both be [S, n, D] arrays, got shapes {means.shape} and {stds.shape}."
            )
        weights = np.ones(means.shape[0]) if weights is None else np.asarray(weights, np.float64)
        if weights.shape != (means.shape[0],):
            raise ValueError(f"`weights` must have shape ({means.shape[0]},), one per sample, got {weights.shape}.")
        prediction = cls()
        for mean, std, weight in zip(means, stds, weights):
            prediction.add(mean, std, float(weight))
        return prediction

    def add(self, means: np.ndarray, stds: np.ndarray, weight: float = 1.0) -> None:
        """Adds one sample's Gaussians: `means`, `stds` `[n, D]`, weight >= 0."""
        means = np.asarray(means, np.float64)
        stds = np.asarray(stds, np.float64)
        weight = check_number("weight", weight, low=0.0, low_inclusive=True, high=None)
        if means.ndim != 2 or stds.shape != means.shape:
            raise ValueError(f"`means` and `stds` must be [n, D] arrays of one shape, got {means.shape} and {stds.shape}.")
        if not np.all(stds > 0):
            raise ValueError(f"`stds` must be positive, got a minimum of {float(np.min(stds))!r}.")
        if self._shift is None:
            self._shift = means.copy()
            self._sum_mean, self._sum_square, self._sum_variance = (np.zeros_like(means) for _ in range(3))
        elif means.shape != self._shift.shape:
            raise ValueError(f"Every sample must predict shape {self._shift.shape}, got {means.shape}.")
        centred = means - self._shift
        self._sum_mean += weight * centred
        self._sum_square += weight * np.square(centred)
        self._sum_variance += weight * np.square(stds)
        self.total_weight += weight
        self.num_samples += 1
        if self.keep_components:
            self._means.append(means)
            self._stds.append(stds)
            self._weights.append(weight)
            self._components = None

    def _check_filled(self) -> None:
        if self.num_samples == 0:
            raise ValueError("The prediction has no samples yet.")
        if not self.total_weight > 0:
            raise ValueError(f"The samples' weights must have a positive sum, got {self.total_weight!r}.")

    def components(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(means [S, n, D], stds [S, n, D], weights [S] summing to 1)`."""
        self._check_filled()
        if not self.keep_components:
            raise ValueError(
                "This prediction was built with keep_components=False: quantiles, intervals, the "
                "CDF and the CRPS need every sample's Gaussians."
            )
        if self._components is None:
            weights = np.asarray(self._weights) / self.total_weight
            self._components = (np.stack(self._means), np.stack(self._stds), weights)
        return self._components

    @property
    def mean(self) -> np.ndarray:
        """`[n, D]` predictive mean `sum_s w_s mu_s`."""
        self._check_filled()
        return self._shift + self._sum_mean / self.total_weight

    @property
    def aleatoric_std(self) -> np.ndarray:
        """`[n, D]` `sqrt(sum_s w_s sigma_s^2)`: the noise the likelihood models."""
        self._check_filled()
        return np.sqrt(self._sum_variance / self.total_weight)

    @property
    def epistemic_std(self) -> np.ndarray:
        """`[n, D]` `sqrt(sum_s w_s (mu_s - mean)^2)`: the samples' disagreement."""
        self._check_filled()
        centred_mean = self._sum_mean / self.total_weight
        return np.sqrt(np.maximum(self._sum_square / self.total_weight - np.square(centred_mean), 0.0))

    @property
    def std(self) -> np.ndarray:
        """`[n, D]` total predictive standard deviation (law of total variance)."""
        return np.sqrt(np.square(self.aleatoric_std) + np.square(self.epistemic_std))

    def cdf(self, y: Any) -> np.ndarray:
        """`[n, D]` mixture CDF at `y` (`[n]` or `[n, D]`)."""
        means, stds, weights = self.components()
        y = _targets(y).reshape(means.shape[1:])
        return np.einsum("s,snd->nd", weights, _normal_cdf((y - means) / stds))

    def log_density(self, y: Any) -> np.ndarray:
        """`[n]` log density of the mixture at each example's targets (all `D` together)."""
        means, stds, weights = self.components()
        y = _targets(y).reshape(means.shape[1:])
        accumulator = _LogMeanExp()
        for mean, std, weight in zip(means, stds, weights):
            accumulator.add(_component_log_density(y, mean, std), float(weight))
        return accumulator.result()

    def quantile(self, q: Any, *, tolerance: float = 1e-10) -> np.ndarray:
        """Exact quantiles of the mixture: `[n, D]` for a scalar `q` in (0, 1), `[len(q), n, D]`
        for a sequence.

        Solves `F(x) = q` per example and target by Newton's method on the mixture CDF,
        safeguarded by bisection inside the bracket `[min_s, max_s]` of the components' own
        `q`-quantiles (which always contains the mixture's), to `tolerance` times the smallest
        component standard deviation.
        """
        if np.ndim(q) > 0:
            return np.stack([self.quantile(value, tolerance=tolerance) for value in np.asarray(q).reshape(-1)])
        q = check_number("q", q, low=0.0, high=1.0, high_inclusive=False)
        means, stds, weights = self.components()
        component_quantiles = means + stds * _normal_ppf(q)
        lower, upper = component_quantiles.min(axis=0), component_quantiles.max(axis=0)
        x = np.einsum("s,snd->nd", weights, component_quantiles)
        resolution = tolerance * stds.min(axis=0)
        for _ in range(200):
            z = (x - means) / stds
            excess = np.einsum("s,snd->nd", weights, _normal_cdf(z)) - q
            density = np.einsum("s,snd->nd", weights, _normal_pdf(z) / stds)
            lower = np.where(excess < 0, x, lower)
            upper = np.where(excess > 0, x, upper)
            with np.errstate(divide="ignore", invalid="ignore"):
                newton = x - excess / density
            inside = np.isfinite(newton) & (newton > lower) & (newton < upper)
            updated = np.where(excess == 0, x, np.where(inside, newton, 0.5 * (lower + upper)))
            done = (np.abs(updated - x) <= resolution) | (upper - lower <= resolution)
            x = updated
            if np.all(done):
                break
        return x

    def interval(self, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """The central interval holding probability `level`: the `(1 - level) / 2` and
        `(1 + level) / 2` quantiles, each `[n, D]`."""
        level = check_number("level", level, low=0.0, high=1.0, high_inclusive=False)
        lower, upper = self.quantile([(1.0 - level) / 2.0, (1.0 + level) / 2.0])
        return lower, upper

    def crps(self, y: Any) -> np.ndarray:
        """`[n, D]` continuous ranked probability score at `y`, exact for the mixture:

        `CRPS = E|X - y| - E|X - X'| / 2 = sum_s w_s A(y - mu_s, sigma_s^2)
        - 1/2 sum_{s,t} w_s w_t A(mu_s - mu_t, sigma_s^2 + sigma_t^2)`, `A(m, v) = E|N(m, v)|`.
        The pair term runs over blocks of samples, `[block, S, n, D]` at a time.
        """
        means, stds, weights = self.components()
        y = _targets(y).reshape(means.shape[1:])
        return np.einsum("s,snd->nd", weights, _crps_target_terms(y, means, stds)) - _crps_half_spread(
            means, stds, weights
        )


def _crps_target_terms(y: np.ndarray, means: np.ndarray, stds: np.ndarray) -> np.ndarray:
    """`E|X_s - y|` of each component (any shape broadcasting `y` against `means`): the CRPS's
    first term is their weighted sum."""
    return _expected_abs_normal(y - means, np.square(stds))


def _crps_half_spread(means: np.ndarray, stds: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`[n, D]` `E|X - X'| / 2` of the mixture of `[S, n, D]` components with weights `[S]`
    summing to 1 (the CRPS's pair term), in blocks of samples, never `[S, S, n, D]`."""
    variances = np.square(stds)
    spread = np.zeros(means.shape[1:])
    block = max(1, _PAIR_BLOCK_ELEMENTS // means.size)
    for start in range(0, means.shape[0], block):
        rows = slice(start, start + block)
        pairs = _expected_abs_normal(means[rows, None] - means[None], variances[rows, None] + variances[None])
        spread += 0.5 * np.einsum("s,t,stnd->nd", weights[rows], weights, pairs)
    return spread


def _rmse(targets: np.ndarray, mean: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(targets - mean))))


def _level_name(level: float) -> str:
    return f"{100.0 * level:.10g}"


class RegressionAverager:
    """Streams posterior samples' Gaussians on fixed labelled examples into the metrics of
    their predictive mixture, in bounded memory (what `keras_thermo.callbacks.PosteriorAverage`
    reports for a regression net).

    Each `update` adds one sample's `means` and `stds` `[n, D]` at the same `n` examples with
    targets `targets`. Running sums give, exactly and in `O(n D)` memory whatever the number of
    samples:

    - `rmse` of the predictive mean and `nll`, the mixture's negative log density per example
      (as `evaluate_posterior`);
    - `coverage_<level>` for each of `levels`: a target lies in the mixture's central interval
      of probability `level` exactly when the mixture CDF at it, `sum_s w_s Phi((y - mu_s) /
      sigma_s)`, a running sum, lies in `[(1 - level) / 2, (1 + level) / 2]`;
    - the first term of the CRPS, `sum_s w_s E|X_s - y|`.

    The CRPS's pair term `E|X - X'| / 2` couples every two samples; it is computed from a store
    of at most `max_crps_samples` samples' Gaussians: every sample while they fit (the CRPS is
    then exact, as `evaluate_posterior`'s), then an evenly thinned subset (every second, fourth,
    ... sample, its weights renormalised), memory `2 max_crps_samples n D` float64. Interval
    widths need the mixture's quantiles, hence every component: `evaluate_posterior` gives them.

    Args:
        targets: `[n]` or `[n, D]` targets of the examples.
        levels: Probabilities of the central intervals whose coverage is measured.
        crps: Whether to compute the CRPS.
        max_crps_samples: Most samples stored for the CRPS's pair term (>= 2), or None for all.

    Example:
        >>> import numpy as np
        >>> averager = RegressionAverager(targets=[0.0, 3.0])
        >>> averager.update(means=[[0.0], [0.0]], stds=[[1.0], [1.0]])
        >>> {name: round(value, 4) for name, value in averager.result().items()}
        {'rmse': 2.1213, 'nll': 3.1689, 'coverage_90': 0.5, 'crps': 1.3351, 'num_samples': 1}
    """

    def __init__(self, targets: Any, levels: Any = (0.9,), crps: bool = True, max_crps_samples: int | None = 100):
        self.targets = _targets(targets, "targets")
        if not np.all(np.isfinite(self.targets)):
            raise ValueError("`targets` must be finite.")
        self.levels = _check_levels(levels)
        self.crps = check_bool("crps", crps)
        if max_crps_samples is not None:
            max_crps_samples = check_int("max_crps_samples", max_crps_samples, low=2)
        self.max_crps_samples = max_crps_samples
        self.reset()

    def reset(self) -> None:
        """Forgets every sample."""
        self._moments = RegressionPrediction(keep_components=False)
        self._log_density = _LogMeanExp()
        self._cdf_sum = np.zeros_like(self.targets)
        self._crps_sum = np.zeros_like(self.targets)
        self._stored: list[tuple[np.ndarray, np.ndarray, float]] = []
        self._stride = 1  # the store holds the samples whose index is a multiple of it

    @property
    def num_samples(self) -> int:
        return self._moments.num_samples

    @property
    def mean(self) -> np.ndarray:
        """`[n, D]` predictive mean."""
        return self._moments.mean

    @property
    def std(self) -> np.ndarray:
        """`[n, D]` total predictive standard deviation."""
        return self._moments.std

    def update(self, means: Any, stds: Any, weight: float = 1.0) -> None:
        """Adds one sample's Gaussians, `means` and `stds` `[n, D]` (or `[n]`), weight >= 0."""
        means = _targets(means, "means").reshape(self.targets.shape)
        stds = _targets(stds, "stds").reshape(self.targets.shape)
        index = self._moments.num_samples
        self._moments.add(means, stds, weight)  # checks the shapes, the stds and the weight
        self._log_density.add(_component_log_density(self.targets, means, stds), weight)
        if self.levels:
            self._cdf_sum += weight * _normal_cdf((self.targets - means) / stds)
        if self.crps:
            self._crps_sum += weight * _crps_target_terms(self.targets, means, stds)
            if index % self._stride == 0:
                self._stored.append((means, stds, weight))
                if self.max_crps_samples is not None and len(self._stored) > self.max_crps_samples:
                    self._stored = self._stored[::2]
                    self._stride *= 2

    def result(self) -> dict[str, float]:
        """`rmse`, `nll`, `coverage_<level>` for each level, `crps` (if asked) and
        `num_samples`; NaN metrics and `num_samples = 0` before the first sample (or while the
        weights sum to 0)."""
        moments = self._moments
        if moments.num_samples == 0 or not moments.total_weight > 0:
            return {**dict.fromkeys(self.metric_names(), float("nan")), "num_samples": moments.num_samples}
        result = {"rmse": _rmse(self.targets, moments.mean), "nll": float(-np.mean(self._log_density.result()))}
        cdf = self._cdf_sum / moments.total_weight
        for level in self.levels:
            inside = (cdf >= (1.0 - level) / 2.0) & (cdf <= (1.0 + level) / 2.0)
            result[f"coverage_{_level_name(level)}"] = float(np.mean(inside))
        if self.crps:
            means, stds, weights = (np.stack(values) for values in zip(*self._stored))
            if weights.sum() > 0:
                half_spread = _crps_half_spread(means, stds, weights / weights.sum())
            else:  # the stored samples all weigh 0: take them equally
                half_spread = _crps_half_spread(means, stds, np.full(len(weights), 1.0 / len(weights)))
            result["crps"] = float(np.mean(self._crps_sum / moments.total_weight - half_spread))
        result["num_samples"] = moments.num_samples
        return result

    def metric_names(self) -> list[str]:
        """The metric names of `result()`, in order, without `num_samples`."""
        return _metric_names(self.levels, self.crps)


def _metric_names(levels: tuple[float, ...], crps: bool) -> list[str]:
    return ["rmse", "nll"] + [f"coverage_{_level_name(level)}" for level in levels] + (["crps"] if crps else [])


def _check_levels(levels: Any) -> tuple[float, ...]:
    return tuple(_check_probability("levels", level) for level in np.atleast_1d(np.asarray(levels, dtype=object)))


__all__ = ["RegressionAverager", "RegressionPrediction"]
