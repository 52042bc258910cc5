"""Posterior predictive distributions and their metrics for regression, from stored samples.

A net trained with a Gaussian likelihood (`keras_thermo.losses.GaussianNLL`) predicts, at
each posterior sample `theta_s`, a Gaussian `N(mu_s(x), sigma_s(x)^2)` per target (`sigma`
fixed, or learned by the net). The posterior predictive distribution is their mixture,

    p(y | x, D) ~= sum_s w_s N(y; mu_s(x), sigma_s(x)^2),   sum_s w_s = 1,

with equal weights, or weights such as SGLD's step sizes. `predict_posterior` returns it as a
`RegressionPrediction`: its mean and its total standard deviation, split by the law of total
variance into the aleatoric part (the noise the likelihood models, `E_s sigma_s^2`) and the
epistemic part (the samples' disagreement, `Var_s mu_s`); its exact quantiles and central
intervals (the mixture's CDF inverted numerically, not a Gaussian approximation); its density
and CDF. `evaluate_posterior` scores it on labelled data: RMSE of the mean, NLL (the mixture's
negative log density per example), the coverage and width of central intervals and the CRPS
(exact for a Gaussian mixture).

The likelihood is read from the model's compiled loss (`model.loss`, a `GaussianNLL`), or
given as `loss=`. With `TargetScaler` the net can be trained on standardized targets and every
prediction and metric reported on the targets' own scale (`scaler=`).

Memory: the forward passes stream over the samples, one at a time (the samples themselves may
be a memory-mapped `.npy` file). The mean, the standard deviations and the NLL are running sums,
`O(n D)`, whatever the number of samples `S`. The mixture's quantiles, intervals, CDF and CRPS
need every component of every example, so the components are kept: two `[S, n, D]` float64
arrays (`S = 1000` samples of `n = 10 000` examples of one target: 160 MB). Thin the samples
(`samples[::k]`) where that is too much, or ask `evaluate_posterior` only for the streamed
metrics (`levels=(), crps=False`). The CRPS's pair term runs in blocks, never `[S, S, n]`.

Only Gaussian likelihoods are supported here; a model compiled with `StudentTNLL` is refused.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import losses as kt_losses
from keras_thermo._validation import check_bool, check_int, check_number
from keras_thermo.posterior import _EvaluationData, _SamplePredictor, _stream

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


# --------------------------------------------------------------------------------------------
# Target scaling


class TargetScaler:
    """Standardizes regression targets, and maps predictions back to their own scale.

    `fit(y_train)` stores each target's mean and standard deviation (1 for a constant target);
    `transform(y)` gives `(y - mean) / std`, what the net is trained on. Back on the targets'
    scale: `inverse_transform` for values (means, quantiles, interval bounds, or a `(lower,
    upper)` pair) and `inverse_transform_std` for standard deviations. `predict_posterior` and
    `evaluate_posterior` take `scaler=` and report everything, the NLL and CRPS included, on
    the targets' scale (the NLL grows by `sum_d log std_d`).

    A fixed noise `GaussianNLL(scale=s)` on standardized targets is noise `s * std` on the
    targets' scale, and the learned scale's floor `min_scale` is `min_scale * std`.

    Example:
        >>> import numpy as np
        >>> scaler = TargetScaler().fit(np.array([10.0, 20.0, 30.0]))
        >>> scaler.transform(np.array([20.0, 30.0])).round(4)
        array([0.    , 1.2247])
        >>> scaler.inverse_transform(np.array([0.0])), scaler.inverse_transform_std(np.array([1.0])).round(4)
        (array([20.]), array([8.165]))
    """

    def __init__(self, mean: Any = None, std: Any = None):
        if (mean is None) != (std is None):
            raise ValueError("`mean` and `std` must be given together (or neither, then call fit).")
        self.mean = None if mean is None else np.asarray(mean, np.float64).reshape(-1)
        self.std = None if std is None else np.asarray(std, np.float64).reshape(-1)
        if self.std is not None and (self.std.shape != self.mean.shape or not np.all(self.std > 0)):
            raise ValueError(
                f"`std` must be positive with the shape of `mean` {self.mean.shape}, got {self.std.tolist()}."
            )

    def fit(self, y: Any) -> "TargetScaler":
        targets = _targets(y)
        if not np.all(np.isfinite(targets)):
            raise ValueError("`y` must be finite to fit a TargetScaler.")
        self.mean = targets.mean(axis=0)
        std = targets.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)
        return self

    def _parameters(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.mean is None:
            raise ValueError("This TargetScaler is not fitted: call fit(y_train) first.")
        # One target: any shape ([n], [n, 1], [k, n, 1]); D targets: a last axis of D.
        if self.mean.shape[0] != 1 and (values.ndim == 0 or values.shape[-1] != self.mean.shape[0]):
            raise ValueError(
                f"The scaler was fitted on {self.mean.shape[0]} target(s); values of shape "
                f"{values.shape} do not end in that many."
            )
        return self.mean, self.std

    def transform(self, y: Any) -> np.ndarray:
        """`(y - mean) / std`, in `y`'s shape (float32 for float32 input, else float64)."""
        values = np.asarray(y)
        dtype = values.dtype if values.dtype == np.float32 else np.float64
        mean, std = self._parameters(values)
        return ((values - mean) / std).astype(dtype)

    def inverse_transform(self, y: Any) -> Any:
        """`y * std + mean`: means, quantiles or interval bounds back on the targets' scale; a
        `(lower, upper)` pair is mapped bound by bound."""
        if isinstance(y, tuple):
            return tuple(self.inverse_transform(bound) for bound in y)
        values = np.asarray(y, np.float64)
        mean, std = self._parameters(values)
        return values * std + mean

    def inverse_transform_std(self, std: Any) -> np.ndarray:
        """`std * scaler.std`: standard deviations back on the targets' scale."""
        values = np.asarray(std, np.float64)
        _, scale = self._parameters(values)
        return values * scale

    def get_config(self) -> dict:
        return {
            "mean": None if self.mean is None else self.mean.tolist(),
            "std": None if self.std is None else self.std.tolist(),
        }

    @classmethod
    def from_config(cls, config: dict) -> "TargetScaler":
        return cls(**config)


# --------------------------------------------------------------------------------------------
# From stored samples


def _likelihood(model: keras.Model, loss: Any) -> kt_losses.GaussianNLL:
    """The Gaussian likelihood the samples were drawn under: `loss`, else the compiled loss."""
    given = loss is not None
    loss = loss if given else getattr(model, "loss", None)
    if isinstance(loss, kt_losses.GaussianNLL):
        return loss
    where = "`loss`" if given else f"the compiled loss of `model` {model.name!r}"
    if isinstance(loss, kt_losses.StudentTNLL):
        raise ValueError(
            f"{where} is StudentTNLL: predictive mixtures are implemented for GaussianNLL only."
        )
    hint = ""
    if loss in ("mse", "mean_squared_error") or isinstance(loss, keras.losses.MeanSquaredError):
        hint = (
            " A net fitted with loss='mse' (mean reduction, one target) sampled the likelihood of "
            "Gaussian noise of standard deviation sqrt(1/2): pass "
            "loss=kt.losses.GaussianNLL(scale=0.5 ** 0.5) to predict with it."
        )
    raise ValueError(
        f"{where} is {loss!r}, not a keras_thermo.losses.GaussianNLL: the predictive "
        f"distribution needs the likelihood's noise model. Compile with GaussianNLL(scale=...) or "
        f"GaussianNLL(), or pass `loss=`.{hint}"
    )


def _predictor(model: keras.Model) -> _SamplePredictor:
    # The classification predictor's `outputs` (logits or probabilities) has no meaning for a
    # regression net; any value serves, and its warnings about the last activation do not apply.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`outputs=", category=UserWarning)
        return _SamplePredictor(model, "logits")


def _labelled_data(data: Any, batch_size: int) -> tuple[_EvaluationData, np.ndarray]:
    """The inputs as `_EvaluationData` and the targets `[n, D]`, from `(x, y)` arrays or a finite
    dataset of `(x, y)` batches (read once for the targets, then once per sample)."""
    if hasattr(data, "dataset") and isinstance(data.dataset, tf.data.Dataset):
        data = data.dataset
    if isinstance(data, tf.data.Dataset):
        targets = []
        for element in data:
            _, y, _ = keras.utils.unpack_x_y_sample_weight(tuple(element) if isinstance(element, list) else element)
            if y is None:
                raise ValueError("`data` must yield (x, y) batches: the targets are needed for the metrics.")
            targets.append(_targets(y, "data's y"))
        if not targets:
            raise ValueError("`data` is empty: it yielded no batch.")
        inputs = _EvaluationData(data.map(lambda *element: element[0]), batch_size, name="data")
        return inputs, np.concatenate(targets)
    if not isinstance(data, (tuple, list)) or len(data) != 2 or data[1] is None:
        raise ValueError(
            f"`data` must be (x, y) arrays or a tf.data.Dataset of (x, y) batches, got {type(data).__name__}."
        )
    inputs = _EvaluationData(data[0], batch_size, name="data")
    targets = _targets(data[1], "data's y")
    if targets.shape[0] != inputs.num_examples:
        raise ValueError(f"`data`: x has {inputs.num_examples} examples but y has {targets.shape[0]}.")
    return inputs, targets


def _sample_gaussians(
    likelihood: kt_losses.GaussianNLL, outputs: np.ndarray, num_targets: int | None, scaler: TargetScaler | None
) -> tuple[np.ndarray, np.ndarray]:
    """One sample's `(means, stds)` `[n, D]` from its outputs `[n, K]`, on the targets' scale."""
    units = likelihood.units_per_target
    if outputs.shape[1] % units or (num_targets is not None and outputs.shape[1] != units * num_targets):
        expected = "D" if num_targets is None else str(units * num_targets)
        raise ValueError(
            f"The model outputs {outputs.shape[1]} units per example, but {likelihood.name} "
            f"({'learned' if likelihood.learned_scale else 'fixed'} scale) needs {units} per "
            f"target ({units} x {num_targets or 'D'} = {expected})."
        )
    means, stds = (np.asarray(t, np.float64) for t in likelihood.parameters(outputs.astype(np.float64)))
    if scaler is not None:
        means, stds = scaler.inverse_transform(means), scaler.inverse_transform_std(stds)
    return means, stds


def predict_posterior(
    model: keras.Model,
    samples: Any,
    x: Any,
    *,
    weights: Any = None,
    loss: Any = None,
    scaler: TargetScaler | None = None,
    keep_components: bool = True,
    batch_size: int = 256,
    verbose: int = 1,
) -> RegressionPrediction:
    """The posterior predictive distribution of regression targets at inputs `x`.

    Runs the net at every stored sample, one at a time (the model's weights are not changed),
    and mixes the Gaussians they predict (module docstring: memory).

    Args:
        model: The model the samples belong to (a `BayesianModel` or its `net`), built.
        samples: Flattened parameter vectors, as `keras_thermo.predict_posterior` takes them:
            `[S, Nd]`, `[C, S, Nd]` (chains, pooled), a `SampleCollector`, a `.npy` path, or an
            iterable of `[Nd]` vectors.
        x: Inputs: an array (or structure of arrays), or a finite `tf.data.Dataset`.
        weights: Optional non-negative per-sample weights, `[S]` (or `[C, S]`); default equal.
        loss: The likelihood, a `keras_thermo.losses.GaussianNLL`; None reads `model.loss`.
        scaler: A fitted `TargetScaler` the net's targets were standardized with: the
            prediction is then on the targets' own scale.
        keep_components: False keeps only the running moments (mean and standard deviations),
            `O(n D)` memory; quantiles, intervals, CDF and CRPS then refuse.
        batch_size: Batch size for array inputs.
        verbose: 1 shows a progress bar over the samples.

    Returns:
        A `RegressionPrediction`.

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> samples = np.array([[1.0, 0.0], [1.0, 1.0]], "float32")  # [kernel, bias]: y = x, y = x + 1
        >>> prediction = predict_posterior(net, samples, np.zeros((1, 1), "float32"),
        ...                                loss=kt.losses.GaussianNLL(scale=0.5), verbose=0)
        >>> prediction.mean, prediction.std.round(4)
        (array([[0.5]]), array([[0.7071]]))
    """
    likelihood = _likelihood(model, loss)
    data = _EvaluationData(x, batch_size, name="x")
    prediction = RegressionPrediction(keep_components)
    for outputs, _, weight in _stream(_predictor(model), samples, data, weights, verbose):
        prediction.add(*_sample_gaussians(likelihood, outputs, None, scaler), weight)
    prediction._check_filled()
    return prediction


def evaluate_posterior(
    model: keras.Model,
    samples: Any,
    data: Any,
    *,
    levels: Any = (0.9,),
    crps: bool = True,
    weights: Any = None,
    loss: Any = None,
    scaler: TargetScaler | None = None,
    batch_size: int = 256,
    verbose: int = 1,
) -> dict[str, float]:
    """Metrics of the posterior predictive distribution on labelled regression data.

    Args:
        model, samples, weights, loss, batch_size, verbose: As for `predict_posterior`.
        data: `(x, y)` arrays, `y` `[n]` or `[n, D]`, or a finite `tf.data.Dataset` of `(x, y)`
            batches in a fixed order. On the targets' own scale when `scaler` is given.
        levels: Probabilities of the central intervals whose coverage is measured.
        crps: Whether to compute the CRPS (its pair term costs `O(S^2 n D)`).
        scaler: A fitted `TargetScaler` the net's targets were standardized with.

    Returns:
        `rmse` of the predictive mean; `nll`, the mixture's negative log density per example
        (all `D` targets of an example together; the same units as `GaussianNLL`); for each
        level, e.g. 0.9, `coverage_90` (fraction of targets inside the central interval) and
        `interval_width_90` (its mean width); `crps`, the mean CRPS per target; and
        `num_samples`. Coverage, width and CRPS average over every example and target. Only
        `levels=()` with `crps=False` keeps memory at `O(n D)` (module docstring).

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> samples = np.zeros((3, 2), "float32")  # predicts 0 everywhere
        >>> x, y = np.zeros((4, 1), "float32"), np.array([-1.0, 1.0, -1.0, 1.0])
        >>> metrics = evaluate_posterior(net, samples, (x, y), loss=kt.losses.GaussianNLL(scale=1.0),
        ...                              verbose=0)
        >>> round(metrics["rmse"], 4), round(metrics["nll"], 4), metrics["coverage_90"]
        (1.0, 1.4189, 1.0)
    """
    likelihood = _likelihood(model, loss)
    crps = check_bool("crps", crps)
    levels = _check_levels(levels)
    inputs, targets = _labelled_data(data, batch_size)
    prediction = RegressionPrediction(keep_components=bool(levels) or crps)
    log_density = _LogMeanExp()
    for outputs, _, weight in _stream(_predictor(model), samples, inputs, weights, verbose):
        means, stds = _sample_gaussians(likelihood, outputs, targets.shape[1], scaler)
        prediction.add(means, stds, weight)
        log_density.add(_component_log_density(targets, means, stds), weight)
    prediction._check_filled()
    result = {
        "rmse": _rmse(targets, prediction.mean),
        "nll": float(-np.mean(log_density.result())),
    }
    for level in levels:
        lower, upper = prediction.interval(level)
        result[f"coverage_{_level_name(level)}"] = float(np.mean((lower <= targets) & (targets <= upper)))
        result[f"interval_width_{_level_name(level)}"] = float(np.mean(upper - lower))
    if crps:
        result["crps"] = float(np.mean(prediction.crps(targets)))
    result["num_samples"] = prediction.num_samples
    return result


__all__ = [
    "RegressionAverager",
    "RegressionPrediction",
    "TargetScaler",
    "evaluate_posterior",
    "predict_posterior",
]
