"""`PosteriorAverage`: the posterior-averaged predictive distribution on held-out data, kept
while `BayesianModel.fit` samples and reported into the epoch logs.

Each recorded sample is evaluated as `keras_thermo.posterior` evaluates stored samples (a
forward pass that leaves the model's variables untouched) and added to a running average:
`keras_thermo.metrics.PredictiveAverager` for a classifier, the predictive mixture's
`keras_thermo.regression_metrics.RegressionAverager` for a regression net.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from keras_thermo import losses as kt_losses
from keras_thermo import metrics as kt_metrics
from keras_thermo._recording import ParameterRecorder, RecordingCallback
from keras_thermo._validation import check_bool, check_choice, check_int
from keras_thermo.posterior import OUTPUTS, _as_labels, _EvaluationData, _SamplePredictor, _update
from keras_thermo.regression import TargetScaler, _likelihood, _predictor, _sample_gaussians
from keras_thermo.regression_metrics import RegressionAverager, _check_levels, _metric_names, _targets

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


def _empty_result() -> dict[str, float]:
    result = {name: float("nan") for name in LOG_NAMES if name != "num_samples"}
    result["num_samples"] = 0
    return result


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
        >>> from keras_thermo.callbacks import PosteriorAverage
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
        self.levels = _check_levels(levels)
        self.crps = check_bool("crps", crps)
        self.max_crps_samples = (
            None if max_crps_samples is None else check_int("max_crps_samples", max_crps_samples, low=2)
        )
        if scaler is not None and not isinstance(scaler, TargetScaler):
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
        regression = isinstance(loss, kt_losses._LocationScaleNLL)  # GaussianNLL, StudentTNLL
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
                self._likelihood = _likelihood(model, None)  # refuses StudentTNLL
                self._predictor = _predictor(model)
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
            return RegressionAverager(self._labels, self.levels, self.crps, self.max_crps_samples)
        return kt_metrics.PredictiveAverager(self._labels, self.num_bins)

    def _add(self, vector: np.ndarray, step, chain: int | None) -> None:
        """Adds one sample (of chain `chain`, None for a one-chain model) to the averages."""
        outputs, labels = self._predictor.predict(vector, self.data)
        if labels is None:
            raise ValueError("`data` yielded batches without labels; PosteriorAverage needs (x, y).")
        labels = _targets(labels, "data's y") if self.is_regression else _as_labels(labels)
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
            gaussians = _sample_gaussians(self._likelihood, outputs, labels.shape[1], self.scaler)
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
        return self._no_samples_result()

    def _no_samples_result(self) -> dict[str, float]:
        if self.is_regression:
            names = _metric_names(self.levels, self.crps)
            return {**dict.fromkeys(names, float("nan")), "num_samples": 0}
        return _empty_result()

    def chain_results(self) -> list[dict[str, float]]:
        """Each chain's own `result()` (its samples only), one per chain of a model with several
        chains (a chain with no sample yet: NaN metrics, `num_samples` 0); empty for one chain or
        before the first sample."""
        num_chains = getattr(getattr(self, "recorder", None), "num_chains", None) or 1
        if self._averager is not None:  # chains after the last one that gave a sample
            while len(self._chain_averagers) < num_chains:
                self._chain_averagers.append(self._new_averager())
        return [averager.result() if averager.num_samples else self._no_samples_result()
                for averager in self._chain_averagers]

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


__all__ = ["PosteriorAverage"]
