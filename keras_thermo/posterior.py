"""Posterior-averaged predictions: during a sampling run, and afterwards from stored samples.

The posterior predictive distribution of a classifier is approximated by averaging the
predictive probabilities of posterior samples,

    p(y | x, D) ~= sum_s w_s p(y | x, theta_s) / sum_s w_s,

with `w_s = 1`, or `w_s = eps_s` (the step size that produced sample `s`) for SGLD's decaying
step sizes (Welling & Teh 2011, eq. 11).

- `PosteriorAverage` is a callback: it keeps the running average over held-out `data` while
  `BayesianModel.fit` samples, and reports its metrics into the epoch logs.
- `predict_posterior` and `evaluate_posterior` do the same afterwards from stored samples (a
  `SampleCollector`, an array, a `.npy` file read lazily, or any iterable of vectors; samples
  of several chains, `[C, S, Nd]`, are pooled).
- `predict_samples` keeps each sample's own predictions, `[S, n, K]` or `[C, S, n, K]`, for
  convergence checks of the predictive (`keras_thermo.diagnostics.summary`).

Alongside the average, `PosteriorAverage` and `predict_posterior(..., return_uncertainty=True)`
give per example the predictive entropy, the expected entropy and their difference, the mutual
information between label and parameters (epistemic uncertainty; see
`keras_thermo.metrics.PredictiveMixture`).

What the model returns, logits or probabilities (`outputs`), is read from the model when not
given: from the compiled loss's `from_logits` (Keras' crossentropy losses, as objects, functions
or names such as `"sparse_categorical_crossentropy"`, whose default is `from_logits=False`) and
from the activation of the net's last layer (softmax or sigmoid: probabilities; linear or
log-softmax: logits). Hints that contradict each other, or none at all, are refused with what
to set; an explicit `outputs` wins, with a warning if a hint contradicts it. A single output
column is binary: a logit, or the probability of class 1 (a one-unit sigmoid layer).

Predictions at a sample are computed without touching the model's variables: the flattened
sample is split into tensors shaped like `model.trainable_variables` and substituted for them
inside a `keras.StatelessScope`, so the sampler's current position is never disturbed. The
compiled forward pass is built once per model and reused by every later call. Memory is one
`[n, K]` and one `[n]` running sum, however many samples there are.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any, Iterable, Iterator, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import _tree
from keras_thermo import losses as kt_losses
from keras_thermo import metrics as kt_metrics
from keras_thermo._outputs import activation_hint, loss_hint
from keras_thermo._validation import check_bool, check_choice, check_int
from keras_thermo._recording import ParameterRecorder, RecordingCallback, SampleCollector
from keras_thermo.samplers.base import num_scalars

OUTPUTS = ("logits", "probabilities")
WEIGHTINGS = ("uniform", "step_size")

# The metric names `PosteriorAverage` writes into the epoch logs, keyed by `result()` names.
LOG_NAMES = {
    "accuracy": "posterior_accuracy",
    "nll": "posterior_nll",
    "expected_log_loss": "expected_log_loss",
    "ece": "ece",
    "brier": "brier",
    "num_samples": "num_samples",
}
# The same for a regression net; coverage levels and `crps` keep their `result()` names.
REGRESSION_LOG_NAMES = {"rmse": "posterior_rmse", "nll": "posterior_nll"}


def _regression():
    """`keras_thermo.regression`, imported when first needed: it builds on this module."""
    from keras_thermo import regression  # noqa: PLC0415

    return regression


# --------------------------------------------------------------------------------------------
# Evaluation data: arrays or a finite tf.data pipeline, read in the same order on every pass


def _as_labels(y: Any) -> np.ndarray:
    """Integer class labels `[n]` from `[n]` or `[n, 1]` arrays."""
    labels = np.asarray(y)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise ValueError(
            f"Labels must be integer class indices of shape [n] or [n, 1], got shape "
            f"{labels.shape} (one-hot labels are not supported: pass their argmax)."
        )
    return labels


class _EvaluationData:
    """Batches of `(x, y)` (y may be None) from arrays or a `tf.data.Dataset`.

    Accepts a tuple `(x, y)` of arrays, an array `x`, a `tf.data.Dataset` yielding `(x, y)`,
    `(x, y, sample_weight)` or `x` batches, or an object with a `.dataset` attribute holding
    such a dataset (e.g. `keras_thermo.data.ClassificationData`). `y` is read by `read_y`:
    class labels by default; `np.asarray` keeps it as given (targets, or labels checked later).
    """

    def __init__(self, data: Any, batch_size: int, name: str = "data", read_y: Any = None):
        self.batch_size = check_int("batch_size", batch_size, low=1)
        self.read_y = _as_labels if read_y is None else read_y
        if hasattr(data, "dataset") and isinstance(data.dataset, tf.data.Dataset):
            data = data.dataset
        self.dataset: tf.data.Dataset | None = None
        self.x = None
        self.y = None
        if isinstance(data, tf.data.Dataset):
            if data.cardinality() == tf.data.INFINITE_CARDINALITY:
                raise ValueError(
                    f"`{name}` is an infinite tf.data.Dataset (a `.repeat()` without count?); "
                    "evaluation needs one finite pass over the held-out examples."
                )
            self.dataset = data
            return
        if isinstance(data, (tuple, list)):
            if len(data) not in (1, 2):
                raise ValueError(
                    f"`{name}` as a tuple must be (x,) or (x, y), got {len(data)} elements."
                )
            self.x = data[0]
            self.y = None if len(data) == 1 or data[1] is None else self.read_y(data[1])
        else:
            self.x = data
        leaves = tf.nest.flatten(self.x)
        if not leaves or not all(hasattr(leaf, "shape") and len(leaf.shape) >= 1 for leaf in leaves):
            raise TypeError(
                f"`{name}` must be arrays `x` or `(x, y)`, or a tf.data.Dataset of batches, got "
                f"{type(data).__name__}."
            )
        self.num_examples = int(leaves[0].shape[0])
        if self.y is not None and self.y.shape[0] != self.num_examples:
            raise ValueError(
                f"`{name}`: x has {self.num_examples} examples but y has {self.y.shape[0]}."
            )

    def batches(self) -> Iterator[tuple[Any, np.ndarray | None]]:
        if self.dataset is not None:
            for element in self.dataset:
                x, y, _ = keras.utils.unpack_x_y_sample_weight(
                    tuple(element) if isinstance(element, list) else element
                )
                yield x, None if y is None else self.read_y(np.asarray(y))
            return
        for start in range(0, self.num_examples, self.batch_size):
            end = min(start + self.batch_size, self.num_examples)
            x = tf.nest.map_structure(lambda leaf: leaf[start:end], self.x)
            yield x, None if self.y is None else self.y[start:end]


# --------------------------------------------------------------------------------------------
# What the model returns: logits or probabilities


def _resolve_outputs(model: keras.Model, outputs: str | None) -> str:
    """`outputs` if given (warning on contradicting hints), else what the model's hints agree on."""
    hints = [hint for hint in (loss_hint(model), activation_hint(model)) if hint is not None]
    if outputs is not None:
        outputs = check_choice("outputs", outputs, OUTPUTS)
        against = [reason for kind, reason in hints if kind != outputs]
        if against:
            warnings.warn(
                f"`outputs={outputs!r}` is used as given, but for `model` {model.name!r} "
                f"{' and '.join(against)}; check which the model returns.",
                UserWarning,
                stacklevel=4,
            )
        return outputs
    kinds = {kind for kind, _ in hints}
    if len(kinds) == 1:
        return kinds.pop()
    if kinds:
        reasons = " but ".join(reason for _, reason in hints)
        raise ValueError(
            f"Cannot tell what `model` {model.name!r} returns: {reasons}. Pass "
            "outputs='logits' or outputs='probabilities'."
        )
    raise ValueError(
        f"Cannot tell whether `model` {model.name!r} returns logits or probabilities: it has no "
        "compiled crossentropy loss with `from_logits`, and its last layer has no softmax, "
        "sigmoid, linear or log_softmax activation. Pass outputs='logits' or "
        "outputs='probabilities'."
    )


def _probabilities(outputs: np.ndarray, kind: str) -> np.ndarray:
    """`[n, K]` float64 probabilities of one sample's outputs; one column is binary (class 1)."""
    if kind == "logits":
        return kt_metrics.probabilities_from_logits(outputs)
    probs = np.asarray(outputs, np.float64)
    if probs.shape[1] == 1:
        probs = np.concatenate([1.0 - probs, probs], axis=1)
    return probs


def _update(averager: kt_metrics.PredictiveMixture, outputs: np.ndarray, kind: str, weight: float) -> None:
    if kind == "logits":
        averager.update(logits=outputs, weight=weight)  # exact log losses from logits
    else:
        averager.update(probs=_probabilities(outputs, kind), weight=weight)


# --------------------------------------------------------------------------------------------
# Forward passes at stored parameter vectors

# One compiled forward function per model, `(variables, function)`, reused by every later
# prediction: a new tf.function per call would trace again on each (and TensorFlow warns).
_BATCH_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _batch_function(model: keras.Model, variables: list) -> Any:
    """The compiled `(vector, x) -> outputs` of `model` with `variables` set from `vector`."""
    cached = _BATCH_FUNCTIONS.get(model)
    if cached is not None and len(cached[0]) == len(variables) and all(
        a is b for a, b in zip(cached[0], variables)
    ):
        return cached[1]
    model_ref = weakref.ref(model)  # the cache must not keep the model alive

    def batch_outputs(vector: tf.Tensor, x: Any) -> tf.Tensor:
        values = _tree.unflatten(vector, variables)
        mapping = [(v, tf.cast(value, v.dtype)) for v, value in zip(variables, values)]
        with keras.StatelessScope(state_mapping=mapping):
            return tf.cast(model_ref()(x, training=False), tf.float32)

    function = tf.function(batch_outputs, reduce_retracing=True)
    _BATCH_FUNCTIONS[model] = (variables, function)
    return function


class _SamplePredictor:
    """Outputs of `model` on `data` at a flattened parameter vector, variables untouched.

    `outputs` is what the caller said the model returns (None: read from the model).
    """

    def __init__(self, model: keras.Model, outputs: str | None):
        if not model.built or not model.trainable_variables:
            raise ValueError(
                f"`model` {model.name!r} must be built and have trainable weights before "
                "posterior predictions (fit it, or call it on a batch first)."
            )
        self.model = model
        self.outputs = _resolve_outputs(model, outputs)
        self.variables = list(model.trainable_variables)
        self.num_params = num_scalars(self.variables)
        self._predict_batch = _batch_function(model, self.variables)

    def check_vector(self, vector: Any, where: str) -> np.ndarray:
        vector = np.asarray(vector, dtype=np.float32)
        if vector.shape != (self.num_params,):
            raise ValueError(
                f"{where} must be a flattened parameter vector of length {self.num_params} "
                f"(the trainable scalars of {self.model.name!r}), got shape {vector.shape}."
            )
        return vector

    def predict(self, vector: np.ndarray, data: _EvaluationData) -> tuple[np.ndarray, np.ndarray | None]:
        """Returns `(outputs [n, K], labels [n] or None)` for one pass over `data`."""
        vector = tf.constant(vector)
        outputs, labels = [], []
        for x, y in data.batches():
            outputs.append(self._predict_batch(vector, x).numpy())
            labels.append(y)
        if not outputs:
            raise ValueError("The evaluation data is empty: it yielded no batch.")
        stacked = np.concatenate(outputs, axis=0)
        if stacked.ndim != 2:
            raise ValueError(
                f"The model must output [batch, K] {self.outputs} for posterior averaging, got "
                f"shape {stacked.shape}."
            )
        if any(y is None for y in labels):
            return stacked, None
        return stacked, np.concatenate(labels, axis=0)


def _empty_result() -> dict[str, float]:
    result = {name: float("nan") for name in LOG_NAMES if name != "num_samples"}
    result["num_samples"] = 0
    return result


# --------------------------------------------------------------------------------------------
# During sampling


class PosteriorAverage(RecordingCallback):
    """Running posterior-averaged predictive distribution on held-out data, during `fit`.

    The weights after every `every_n_steps`-th step following `burn_in_steps` are evaluated on
    `data`, on steps the sampler marks as samples (TACT-HMC yields samples only on the
    plateau of its tempering variable), exactly also when `steps_per_execution > 1`: the
    compiled step records them and this callback evaluates them after each execution. Each
    sample's predictive probabilities are added to one weighted running sum `[n, K]` (memory
    independent of the run length), each sample's own test log loss to a running mean, and
    each sample's per-example entropy to a running sum `[n]`, which gives the per-example
    `predictive_entropy`, `expected_entropy` and `mutual_information` (epistemic uncertainty,
    `keras_thermo.metrics.PredictiveMixture`).

    At the end of every epoch the metrics are written into `logs`, so `History`, the progress
    bar of the next epoch and `keras.callbacks.TensorBoard` receive them (list this callback
    before `TensorBoard`): `posterior_accuracy`, `posterior_nll` (NLL of the averaged
    predictive distribution), `expected_log_loss` (mean over samples of each sample's log
    loss), `ece`, `brier` and `num_samples`. Before the first sample the metrics are NaN and
    `num_samples` is 0, so History's lists stay aligned with epochs.

    Works with `keras_thermo.BayesianModel`, whose `fit` wires the recording into the compiled
    train step. Samples accumulate across successive `fit` calls; `reset()` starts over.

    A regression net (compiled with `keras_thermo.losses.GaussianNLL`) is recognised from its
    loss when `fit` starts: each sample's Gaussians `N(mu_s, sigma_s^2)` join the predictive
    mixture (`keras_thermo.regression`), and the logs get `posterior_rmse` (of the predictive
    mean), `posterior_nll` (the mixture's negative log density per example, as
    `keras_thermo.regression.evaluate_posterior`'s `nll`), `coverage_90` (and one per entry
    of `levels`: the fraction of targets inside the mixture's central interval), `crps` and
    `num_samples`, streamed as `keras_thermo.regression.RegressionAverager` streams them: exact
    in `O(n D)` memory, except the CRPS's pair term, exact up to `max_crps_samples` samples and
    then taken from an evenly thinned store of that many. `result()` uses the names `rmse`,
    `nll`, `coverage_<level>`, `crps`.

    Several chains (`BayesianModel(num_chains=C)`): every recorded step gives one sample of
    each chain that yields one there (every chain, except with TACT-HMC, whose chains yield
    samples on their own plateau steps), all pooled into the average (`num_samples` counts
    them all); `chain_results()` gives each chain's own metrics besides.

    Args:
        data: Held-out examples with labels (class indices; regression targets `[n]` or
            `[n, D]`): `(x, y)` arrays, a finite `tf.data.Dataset` of `(x, y)` batches that
            yields the same examples in the same order on every pass (no shuffling), or a
            `keras_thermo.data.ClassificationData`.
        burn_in_steps: Sampler steps to skip before averaging.
        every_n_steps: Evaluate every n-th step after burn-in (thinning).
        weighting: `"uniform"`, or `"step_size"` to weight each sample by the step size of the
            step that produced it (`sampler.step_size_at(step - 1)`, the logged `step_size`),
            for SGLD with a decaying step size.
        outputs: What the model returns, `"logits"` or `"probabilities"` (a single column is
            binary: a logit, or the probability of class 1); None (default) reads it from the
            model's compiled loss and last activation, refusing when they disagree or say
            nothing (see the module docstring).
        batch_size: Batch size for evaluating array `data`.
        num_bins: Confidence bins of the ECE (classification).
        levels: Regression only: probabilities of the central intervals whose coverage is
            reported (default 0.9: `coverage_90`).
        crps: Regression only: whether to report the CRPS.
        max_crps_samples: Regression only: most samples stored for the CRPS's pair term
            (memory `2 max_crps_samples n D` float64), or None for all of them.
        scaler: Regression only: a fitted `keras_thermo.regression.TargetScaler` the net's
            targets were standardized with; `data`'s targets are then on their own scale, and
            so are the metrics.

    Attributes:
        predictions: `[n, K]` averaged predictive probabilities (float64); for a regression
            net, the `[n, D]` predictive mean.
        predictive_entropy: `[n]` entropy of `predictions` (total uncertainty).
        expected_entropy: `[n]` weighted mean of the samples' own entropies (aleatoric part).
        mutual_information: `[n]` their difference, >= 0 (epistemic part).
        num_samples: Samples averaged so far.

    The entropies and the mutual information are classification metrics; a regression net's
    uncertainty comes from `keras_thermo.regression.predict_posterior` on stored samples.

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> from keras_thermo.posterior import PosteriorAverage
        >>> x, y = np.random.rand(64, 4).astype("float32"), np.arange(64) % 3
        >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> model = kt.BayesianModel(net, kt.samplers.SGNHT(step_size=1e-2), num_examples=64,
        ...                          prior=kt.priors.Gaussian(1.0), seed=0)
        >>> model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> avg = PosteriorAverage((x, y), burn_in_steps=4, every_n_steps=2)
        >>> history = model.fit(x, y, batch_size=16, epochs=2, callbacks=[avg], verbose=0)
        >>> avg.result()["num_samples"], history.history["num_samples"]
        (2, [0, 2])
        >>> avg.mutual_information.shape, bool(np.all(avg.mutual_information >= 0))
        ((64,), True)

    Reference:
        Welling & Teh (2011), Bayesian learning via stochastic gradient Langevin dynamics,
        ICML, eq. 11 (step-size weights); Wei & Shang (2026), section 3.2 (expected log loss).
    """

    def __init__(
        self,
        data: Any,
        burn_in_steps: int = 0,
        every_n_steps: int = 1,
        *,
        weighting: str = "uniform",
        outputs: str | None = None,
        batch_size: int = 256,
        num_bins: int = 15,
        levels: Any = (0.9,),
        crps: bool = True,
        max_crps_samples: int | None = 100,
        scaler: Any = None,
    ):
        super().__init__(burn_in_steps, every_n_steps)
        # Labels or regression targets, read as one or the other once the model is known.
        self.data = _EvaluationData(data, batch_size, read_y=np.asarray)
        if self.data.dataset is None and self.data.y is None:
            raise ValueError(
                "`data` must include labels (or regression targets), (x, y) or a dataset of "
                "(x, y) batches, to score the predictions; got inputs only."
            )
        self.weighting = check_choice("weighting", weighting, WEIGHTINGS)
        self.outputs = None if outputs is None else check_choice("outputs", outputs, OUTPUTS)
        self.num_bins = check_int("num_bins", num_bins, low=1)
        regression = _regression()
        self.levels = regression._check_levels(levels)
        self.crps = check_bool("crps", crps)
        self.max_crps_samples = (
            None if max_crps_samples is None else check_int("max_crps_samples", max_crps_samples, low=2)
        )
        if scaler is not None and not isinstance(scaler, regression.TargetScaler):
            raise TypeError(f"`scaler` must be a keras_thermo.regression.TargetScaler, got {type(scaler).__name__}.")
        self.scaler = scaler
        self._predictor: _SamplePredictor | None = None
        self._likelihood = None  # the regression net's GaussianNLL; None for a classifier
        self._averager = None
        self._chain_averagers: list = []
        self._labels: np.ndarray | None = None

    @property
    def is_regression(self) -> bool:
        """True once attached to a net compiled with a regression likelihood."""
        return self._likelihood is not None

    def reset(self) -> None:
        """Forgets every sample averaged so far."""
        self._averager = None
        self._chain_averagers = []

    def attach(self, model) -> ParameterRecorder:
        recorder = super().attach(model)
        loss = getattr(model, "loss", None)
        regression = isinstance(loss, (kt_losses.GaussianNLL, kt_losses.StudentTNLL))
        if self._predictor is None or self._predictor.model is not model or regression != self.is_regression:
            if self._averager is not None and self._predictor is not None:
                raise ValueError(
                    "This PosteriorAverage already holds samples of another model (or of this "
                    "model under another loss); call `reset()` or create a new one."
                )
            if regression:
                if self.outputs is not None:
                    raise ValueError(
                        f"`outputs={self.outputs!r}` is for classifiers, but `model` {model.name!r} "
                        f"is compiled with {type(loss).__name__}, a regression likelihood: leave it None."
                    )
                self._likelihood = _regression()._likelihood(model, None)  # refuses StudentTNLL
                self._predictor = _regression()._predictor(model)
            else:
                if self.scaler is not None:
                    raise ValueError(
                        "`scaler` is for regression nets compiled with keras_thermo.losses.GaussianNLL, "
                        f"but `model` {model.name!r} is compiled with {loss!r}."
                    )
                self._likelihood = None
                self._predictor = _SamplePredictor(model, self.outputs)
        if self.weighting == "step_size" and not hasattr(getattr(model, "sampler", None), "step_size_at"):
            raise ValueError(
                "`weighting='step_size'` needs a model with a sampler (a BayesianModel), got "
                f"{type(model).__name__}."
            )
        return recorder

    def _sample_weight(self, step: int) -> float:
        if self.weighting == "uniform":
            return 1.0
        # The step that completed as `step` ran with the step size of step index `step - 1`.
        sampler = self._predictor.model.sampler
        return float(sampler.step_size_at(tf.constant(int(step) - 1, tf.int64)))

    def consume(self, values: np.ndarray, steps: np.ndarray, masks: np.ndarray | None = None) -> None:
        for index, (row, step) in enumerate(zip(values, steps)):
            chains = row[None] if row.ndim == 1 else row  # [Nd] of one chain, or [C, Nd]
            for chain, vector in enumerate(chains):
                if masks is None or masks[index][chain]:  # only the chains that yielded a sample
                    self._add(vector, step, chain if row.ndim == 2 else None)

    def _new_averager(self):
        if self.is_regression:
            return _regression().RegressionAverager(self._labels, self.levels, self.crps, self.max_crps_samples)
        return kt_metrics.PredictiveAverager(self._labels, self.num_bins)

    def _add(self, vector: np.ndarray, step, chain: int | None) -> None:
        """Adds one sample (of chain `chain`, None for a one-chain model) to the averages."""
        outputs, labels = self._predictor.predict(vector, self.data)
        if labels is None:
            raise ValueError("`data` yielded batches without labels; PosteriorAverage needs (x, y).")
        labels = _regression()._targets(labels, "data's y") if self.is_regression else _as_labels(labels)
        if self._labels is None or self._averager is None:
            self._labels = labels
        elif labels.shape != self._labels.shape or np.any(labels != self._labels):
            raise ValueError(
                "`data` yielded different labels on two passes: evaluation data must give "
                "the same examples in the same order every pass (do not shuffle it)."
            )
        if self._averager is None:
            self._averager = self._new_averager()
        weight = self._sample_weight(step)
        averagers = [self._averager]
        if chain is not None:
            while len(self._chain_averagers) <= chain:
                self._chain_averagers.append(self._new_averager())
            averagers.append(self._chain_averagers[chain])
        if self.is_regression:
            gaussians = _regression()._sample_gaussians(self._likelihood, outputs, labels.shape[1], self.scaler)
            for averager in averagers:
                averager.update(*gaussians, weight)
        else:
            for averager in averagers:
                _update(averager, outputs, self._predictor.outputs, weight)

    @property
    def num_samples(self) -> int:
        return 0 if self._averager is None else self._averager.num_samples

    def _filled_averager(self, classification_only: str | None = None):
        if classification_only is not None and self.is_regression:
            raise ValueError(
                f"`{classification_only}` is a classification metric; for the uncertainty of a "
                "regression net use keras_thermo.regression.predict_posterior on stored samples."
            )
        if self._averager is None:
            raise ValueError(
                f"No posterior sample has been averaged yet ({self.burn_in_description()}, "
                f"every_n_steps={self.every_n_steps}); run longer or lower burn_in_steps."
            )
        return self._averager

    @property
    def predictions(self) -> np.ndarray:
        """`[n, K]` weighted average of the samples' predictive probabilities; for a
        regression net, the `[n, D]` predictive mean."""
        averager = self._filled_averager()
        return averager.mean if self.is_regression else averager.mean_probs

    @property
    def predictive_entropy(self) -> np.ndarray:
        """`[n]` entropy of the averaged predictive distribution, in nats."""
        return self._filled_averager("predictive_entropy").predictive_entropy

    @property
    def expected_entropy(self) -> np.ndarray:
        """`[n]` weighted mean over samples of each sample's predictive entropy, in nats."""
        return self._filled_averager("expected_entropy").expected_entropy

    @property
    def mutual_information(self) -> np.ndarray:
        """`[n]` predictive minus expected entropy: the samples' disagreement, in nats."""
        return self._filled_averager("mutual_information").mutual_information

    @property
    def labels(self) -> np.ndarray | None:
        """`[n]` labels of `data` (`[n, D]` regression targets), once the first sample has
        been evaluated."""
        return self._labels

    def result(self) -> dict[str, float]:
        """`{'accuracy', 'nll', 'expected_log_loss', 'ece', 'brier', 'num_samples'}`; for a
        regression net `{'rmse', 'nll', 'coverage_<level>'..., 'crps', 'num_samples'}`.

        NaN metrics and `num_samples = 0` before the first sample.
        """
        if self._averager is not None:
            return self._averager.result()
        if self.is_regression:
            names = _regression()._metric_names(self.levels, self.crps)
            return {**dict.fromkeys(names, float("nan")), "num_samples": 0}
        return _empty_result()

    def chain_results(self) -> list[dict[str, float]]:
        """Each chain's own `result()` (its samples only), for a model with several chains;
        empty for one chain or before the first sample."""
        return [averager.result() for averager in self._chain_averagers]

    def on_epoch_end(self, epoch, logs=None):
        self._drain()
        if logs is not None:
            names = REGRESSION_LOG_NAMES if self.is_regression else LOG_NAMES
            logs.update({names.get(name, name): value for name, value in self.result().items()})

    def get_config(self) -> dict:
        return {
            "burn_in_steps": self.burn_in_steps,
            "every_n_steps": self.every_n_steps,
            "weighting": self.weighting,
            "outputs": self.outputs,
            "batch_size": self.data.batch_size,
            "num_bins": self.num_bins,
            "levels": list(self.levels),
            "crps": self.crps,
            "max_crps_samples": self.max_crps_samples,
            "scaler": None if self.scaler is None else self.scaler.get_config(),
        }


# --------------------------------------------------------------------------------------------
# After sampling, from stored samples


class _SampleSource(NamedTuple):
    vectors: Iterable[Any]  # flattened parameter vectors, chains one after another
    count: int | None  # number of vectors, None for an iterable of unknown length
    chain_shape: tuple[int, int] | None  # (C, S) for several chains, None for one


def _sample_source(samples: Any) -> _SampleSource:
    """Vectors, their count and their chain layout, from the accepted kinds of sample stores."""
    if isinstance(samples, SampleCollector):
        samples = samples.samples
    if isinstance(samples, (str, os.PathLike)):
        # Memory-mapped: rows are read from disk one at a time.
        samples = np.load(os.fspath(samples), mmap_mode="r")
    if isinstance(samples, np.ndarray) or tf.is_tensor(samples):
        shape = tuple(int(d) for d in samples.shape)
        if len(shape) not in (2, 3):
            raise ValueError(
                f"`samples` must be a 2-D array [num_samples, num_params] or a 3-D array "
                f"[num_chains, num_samples, num_params], got shape {shape}."
            )
        if len(shape) == 3:  # Pool the chains: [C, S, Nd] -> [C * S, Nd], a view for arrays.
            reshape = tf.reshape if tf.is_tensor(samples) else np.reshape
            samples = reshape(samples, [-1, shape[2]])
        return _SampleSource(samples, int(np.prod(shape[:-1])), shape[:2] if len(shape) == 3 else None)
    if isinstance(samples, Iterable):
        count = len(samples) if hasattr(samples, "__len__") else None
        return _SampleSource(samples, count, None)
    raise TypeError(
        "`samples` must be an array [num_samples, num_params] or [num_chains, num_samples, "
        "num_params], a SampleCollector, the path of a .npy file, or an iterable of parameter "
        f"vectors; got {type(samples).__name__}."
    )


def _sample_weights(weights: Any, source: _SampleSource) -> np.ndarray | None:
    if weights is None:
        return None
    array = np.asarray(weights, np.float64)
    count = source.count
    if source.chain_shape is not None and array.shape == source.chain_shape:
        array = array.reshape(-1)  # [C, S] weights of pooled chains, in the samples' order
    if array.ndim != 1 or (count is not None and array.shape[0] != count):
        allowed = f"one weight per sample ({count})"
        if source.chain_shape is not None:
            allowed += f", or shape {source.chain_shape} (chains, samples)"
        raise ValueError(f"`weights` must be a 1-D array with {allowed}, got shape {array.shape}.")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"`weights` must be finite and non-negative, got {array[:5].tolist()}...")
    return array


def _stream(
    predictor: _SamplePredictor, samples, data, weights, verbose
) -> Iterator[tuple[np.ndarray, np.ndarray | None, float]]:
    """Yields (outputs [n, K], labels or None, weight) for each stored sample, with a progress bar.

    `samples` is a store as `predict_posterior` accepts, or a `_SampleSource` made from one.
    """
    source = samples if isinstance(samples, _SampleSource) else _sample_source(samples)
    weight_array = _sample_weights(weights, source)
    progress = keras.utils.Progbar(source.count, verbose=verbose, unit_name="sample")
    index = -1
    for index, vector in enumerate(source.vectors):
        if weight_array is not None and index >= weight_array.shape[0]:
            raise ValueError(f"`weights` has {weight_array.shape[0]} entries but there are more samples.")
        vector = predictor.check_vector(vector, f"samples[{index}]")
        sample_outputs, labels = predictor.predict(vector, data)
        yield sample_outputs, labels, 1.0 if weight_array is None else float(weight_array[index])
        progress.update(index + 1)
    if index < 0:
        raise ValueError("`samples` is empty: at least one posterior sample is needed.")


class PosteriorPrediction(NamedTuple):
    """What `predict_posterior(..., return_uncertainty=True)` returns; float64 arrays.

    Attributes:
        probs: `[n, K]` averaged predictive probabilities.
        predictive_entropy: `[n]` entropy of `probs`, the total uncertainty (nats).
        expected_entropy: `[n]` weighted mean of each sample's entropy, the aleatoric part.
        mutual_information: `[n]` `predictive_entropy - expected_entropy` >= 0, the epistemic
            part: how much the samples disagree. A score for out-of-distribution inputs
            (`keras_thermo.metrics.ood_auroc`).
    """

    probs: np.ndarray
    predictive_entropy: np.ndarray
    expected_entropy: np.ndarray
    mutual_information: np.ndarray


def predict_posterior(
    model: keras.Model,
    samples: Any,
    x: Any,
    *,
    weights: Any = None,
    outputs: str | None = None,
    batch_size: int = 256,
    return_uncertainty: bool = False,
    verbose: int = 1,
) -> np.ndarray | PosteriorPrediction:
    """Posterior predictive probabilities on new inputs, averaged over stored samples.

    Computes `sum_s w_s p(y | x, theta_s) / sum_s w_s` one sample at a time, with a progress
    bar over the samples, and with it the running sum of each sample's per-example entropy
    (`keras_thermo.metrics.PredictiveMixture`): memory `[n, K] + [n]` plus one sample. Samples
    of several chains are pooled. The model's own weights are not changed.

    Args:
        model: The model the samples belong to (a `BayesianModel` or its `net`: both have the
            same trainable variables); built.
        samples: Flattened parameter vectors in `model.trainable_variables` order: an array
            `[S, Nd]` (e.g. `SampleCollector.samples`) or `[C, S, Nd]` (C chains, pooled), a
            `SampleCollector`, the path of a `.npy` file holding either (memory-mapped, so a
            long run's store need not fit in memory; write it with `np.save` or
            `np.lib.format.open_memmap`), or any iterable of `[Nd]` vectors.
        x: Inputs: an array (or structure of arrays), or a `tf.data.Dataset` of `x` or
            `(x, y)` batches (labels are ignored).
        weights: Optional non-negative weights (e.g. SGLD step sizes), `[S]`, or `[C, S]` or
            `[C * S]` for chains; default uniform.
        outputs: What the model returns, `"logits"` or `"probabilities"` (a single column is
            binary: a logit, or the probability of class 1); None (default) reads it from the
            model's compiled loss and last activation, refusing when they disagree or say
            nothing (see the module docstring).
        batch_size: Batch size for array inputs.
        return_uncertainty: If True, return a `PosteriorPrediction` with the per-example
            predictive entropy, expected entropy and mutual information besides the
            probabilities.
        verbose: 1 shows a `keras.utils.Progbar` over the samples, 0 is silent.

    Returns:
        `[n, K]` float64 averaged predictive probabilities (a single binary column gives
        `K = 2`), or a
        `PosteriorPrediction` when `return_uncertainty=True`.

    Example:
        >>> import keras, numpy as np
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        >>> samples = np.zeros((4, net.count_params()), "float32")  # all-zero weights
        >>> predict_posterior(net, samples, np.ones((5, 2), "float32"), verbose=0)[0].round(3)
        array([0.333, 0.333, 0.333])
        >>> # Two samples that agree on nothing: the uncertainty is all epistemic.
        >>> samples = np.zeros((2, net.count_params()), "float32")
        >>> samples[0, -3:], samples[1, -3:] = [50.0, 0.0, 0.0], [0.0, 50.0, 0.0]  # the biases
        >>> result = predict_posterior(net, samples, np.ones((1, 2), "float32"),
        ...                            return_uncertainty=True, verbose=0)
        >>> result.probs.round(3), result.expected_entropy.round(3), result.mutual_information.round(3)
        (array([[0.5, 0.5, 0. ]]), array([0.]), array([0.693]))
    """
    return_uncertainty = check_bool("return_uncertainty", return_uncertainty)
    data = _EvaluationData(x, batch_size, name="x")
    predictor = _SamplePredictor(model, outputs)
    mixture = kt_metrics.PredictiveMixture()
    for sample_outputs, _, weight in _stream(predictor, samples, data, weights, verbose):
        _update(mixture, sample_outputs, predictor.outputs, weight)
    if not mixture.total_weight > 0:
        raise ValueError(f"`weights` must have a positive sum, got {mixture.total_weight!r}.")
    if not return_uncertainty:
        return mixture.mean_probs
    return PosteriorPrediction(
        mixture.mean_probs, mixture.predictive_entropy, mixture.expected_entropy,
        mixture.mutual_information,
    )


def predict_samples(
    model: keras.Model,
    samples: Any,
    x: Any,
    *,
    outputs: str | None = None,
    batch_size: int = 256,
    verbose: int = 1,
) -> np.ndarray:
    """Each stored sample's own predictive probabilities on `x`, not averaged.

    Memory is `S n K` (`C S n K` for chains) float64: meant for a held-out batch, e.g. to
    check convergence of the predictive with `keras_thermo.diagnostics.summary(probs=...)`,
    where the R-hat of each (example, class) probability is a figure a network of millions of
    weights still yields in a readable size.

    Args:
        model: The model the samples belong to; built.
        samples: Stored samples, as for `predict_posterior`: `[S, Nd]`, `[C, S, Nd]`, a
            `SampleCollector`, a `.npy` path or an iterable of `[Nd]` vectors.
        x: Inputs: an array (or structure of arrays), or a finite `tf.data.Dataset`.
        outputs: What the model returns, as for `predict_posterior`.
        batch_size: Batch size for array inputs.
        verbose: 1 shows a progress bar over the samples.

    Returns:
        `[S, n, K]` float64 probabilities, or `[C, S, n, K]` for samples given as `[C, S, Nd]`.

    Example:
        >>> import keras, numpy as np
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        >>> chains = np.zeros((4, 10, net.count_params()), "float32")  # [C, S, Nd]
        >>> predict_samples(net, chains, np.ones((5, 2), "float32"), verbose=0).shape
        (4, 10, 5, 3)
    """
    data = _EvaluationData(x, batch_size, name="x")
    source = _sample_source(samples)
    predictor = _SamplePredictor(model, outputs)
    probs = [
        _probabilities(sample_outputs, predictor.outputs)
        for sample_outputs, _, _ in _stream(predictor, source, data, None, verbose)
    ]
    stacked = np.stack(probs)
    if source.chain_shape is not None:
        return stacked.reshape(source.chain_shape + stacked.shape[1:])
    return stacked


def evaluate_posterior(
    model: keras.Model,
    samples: Any,
    data: Any,
    *,
    weights: Any = None,
    outputs: str | None = None,
    batch_size: int = 256,
    num_bins: int = 15,
    verbose: int = 1,
) -> dict[str, float]:
    """Metrics of the posterior-averaged predictive distribution, from stored samples.

    The same metrics as `PosteriorAverage.result()`, for samples kept by a `SampleCollector`
    or stored on disk (see `predict_posterior` for the accepted forms).

    Args:
        model: The model the samples belong to; built.
        samples: Stored samples, as for `predict_posterior`.
        data: Labelled held-out data, `(x, y)` arrays or a `tf.data.Dataset` of `(x, y)`
            batches in a fixed order.
        weights: Optional `[S]` non-negative per-sample weights.
        outputs: What the model returns, as for `predict_posterior`.
        batch_size: Batch size for array data.
        num_bins: Confidence bins of the ECE.
        verbose: 1 shows a progress bar over the samples.

    Returns:
        `{'accuracy', 'nll', 'expected_log_loss', 'ece', 'brier', 'num_samples'}`.

    Example:
        >>> import keras, numpy as np
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        >>> samples = np.zeros((3, net.count_params()), "float32")
        >>> x, y = np.ones((4, 2), "float32"), np.array([0, 1, 0, 1])
        >>> round(evaluate_posterior(net, samples, (x, y), verbose=0)["nll"], 4)  # log 2
        0.6931
    """
    evaluation = _EvaluationData(data, batch_size)
    predictor = _SamplePredictor(model, outputs)
    averager = None
    for sample_outputs, labels, weight in _stream(predictor, samples, evaluation, weights, verbose):
        if labels is None:
            raise ValueError("`data` must include labels: (x, y) arrays or a dataset of (x, y) batches.")
        if averager is None:
            averager = kt_metrics.PredictiveAverager(labels, num_bins)
        _update(averager, sample_outputs, predictor.outputs, weight)
    return averager.result()


__all__ = [
    "PosteriorAverage",
    "PosteriorPrediction",
    "evaluate_posterior",
    "predict_posterior",
    "predict_samples",
]
