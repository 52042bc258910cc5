"""Posterior-averaged predictions: during a sampling run, and afterwards from stored samples.

The posterior predictive distribution of a classifier is approximated by averaging the
predictive probabilities of posterior samples,

    p(y | x, D) ~= sum_s w_s p(y | x, theta_s) / sum_s w_s,

with `w_s = 1`, or `w_s = eps_s` (the step size that produced sample `s`) for SGLD's decaying
step sizes (Welling & Teh 2011, eq. 11).

- `PosteriorAverage` (in `keras_thermo.posterior_average`, also importable from here and from
  `keras_thermo.callbacks`) is a callback: it keeps the running average over held-out `data` while
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
from keras_thermo._recording import SampleCollector
from keras_thermo.samplers.base import num_scalars

OUTPUTS = ("logits", "probabilities")


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


def _refuse_regression_net(model: keras.Model, function: str) -> None:
    """Class probabilities of a net compiled with a regression likelihood mean nothing: say what
    to use instead (`_USE_REGRESSION`)."""
    loss = getattr(model, "loss", None)
    if isinstance(loss, kt_losses._LocationScaleNLL):  # GaussianNLL, StudentTNLL
        raise ValueError(
            f"`model` {model.name!r} is compiled with {type(loss).__name__}, a regression likelihood, "
            f"but keras_thermo.{function} gives class probabilities. {_USE_REGRESSION[function]}"
        )


_USE_REGRESSION = {
    "predict_posterior": "Use keras_thermo.regression.predict_posterior (pass `scaler=` for standardized targets): "
                         "the predictive mean, standard deviations and intervals.",
    "evaluate_posterior": "Use keras_thermo.regression.evaluate_posterior (pass `scaler=` for standardized targets): "
                          "RMSE, NLL, interval coverage and CRPS.",
    "predict_samples": "For each sample's own outputs, run the net at the sample (model.predict after setting its "
                       "weights); keras_thermo.regression.predict_posterior gives the mixture over the samples.",
}


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
    _refuse_regression_net(model, "predict_posterior")
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
    _refuse_regression_net(model, "predict_samples")
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
    _refuse_regression_net(model, "evaluate_posterior")
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


def __getattr__(name: str) -> Any:
    # `PosteriorAverage` lives in `posterior_average`, which builds on this module: imported on
    # first use, so the two never import each other while loading.
    if name == "PosteriorAverage":
        from keras_thermo.posterior_average import PosteriorAverage  # noqa: PLC0415

        return PosteriorAverage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PosteriorAverage",
    "PosteriorPrediction",
    "evaluate_posterior",
    "predict_posterior",
    "predict_samples",
]
