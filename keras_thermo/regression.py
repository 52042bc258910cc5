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

import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import losses as kt_losses
from keras_thermo.losses import SharedNoiseScale  # noqa: F401 (public here: the regression nets' noise head)
from keras_thermo._validation import check_bool
from keras_thermo.posterior import _EvaluationData, _SamplePredictor, _stream
from keras_thermo.regression_metrics import (
    RegressionAverager,
    RegressionPrediction,
    _check_levels,
    _component_log_density,
    _level_name,
    _LogMeanExp,
    _rmse,
    _targets,
)


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
    "SharedNoiseScale",
    "TargetScaler",
    "evaluate_posterior",
    "predict_posterior",
]
