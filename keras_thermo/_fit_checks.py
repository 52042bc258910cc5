"""Checks of `BayesianModel.fit`'s arguments: what Keras accepts but would change the sampled
target, or would make the chain's numbers wrong, refused or said in plain words before the first
step."""

from __future__ import annotations

import logging
import math
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import losses as kt_losses
from keras_thermo._outputs import check_outputs_match_loss

# Keras callbacks that drive an optimizer's learning rate, which a BayesianModel does not have.
_LEARNING_RATE_CALLBACKS = (keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau)


def _callback_list(callbacks) -> list:
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    return list(callbacks or [])


def check_no_learning_rate_callbacks(callbacks) -> None:
    """Refuses Keras' learning-rate callbacks with a message saying what to use instead."""
    for callback in _callback_list(callbacks):
        if isinstance(callback, _LEARNING_RATE_CALLBACKS):
            raise ValueError(
                f"`callbacks` contains {type(callback).__name__}, which sets an optimizer's "
                "learning rate; a BayesianModel has no optimizer, and a sampler's step size h is "
                "not a learning rate (for SGHMC-type samplers lr = h^2 N). Give the sampler a "
                "keras LearningRateSchedule as `step_size`, or set `model.sampler.step_size` "
                "(and `model.temperature`) from your own callback: both take effect at the next "
                "step and are checkpointed."
            )


def warn_about_restoring_callbacks(callbacks) -> None:
    """Warns about `EarlyStopping(restore_best_weights=True)`, which breaks the chain."""
    for callback in _callback_list(callbacks):
        if isinstance(callback, keras.callbacks.EarlyStopping) and callback.restore_best_weights:
            warnings.warn(
                "BayesianModel.fit: EarlyStopping(restore_best_weights=True) puts the weights of "
                "its best epoch back at the end of training, without the sampler state (momenta, "
                "thermostat) that went with them: the net then holds one old sample, and a later "
                "fit continues a broken chain. Use restore_best_weights=False, and keep samples "
                "with keras_thermo.callbacks.SampleCollector.",
                UserWarning,
                stacklevel=4,
            )


def warn_about_class_weight(class_weight) -> None:
    """Warns that `class_weight` reweights the likelihood (the target is no longer the posterior)."""
    if class_weight:
        warnings.warn(
            f"BayesianModel.fit: class_weight={class_weight!r} multiplies each example's "
            "likelihood term by its class's weight, so the chain samples a reweighted (tempered "
            "per class) target, not the Bayes posterior of the data. Rebalance the data instead "
            "if the posterior is what you want.",
            UserWarning,
            stacklevel=4,
        )


def training_rows(x, validation_split) -> int | None:
    """The number of examples an epoch of `fit(x, validation_split=...)` trains on, where `fit`
    knows it: arrays (less Keras' validation split), or a finite unbatched-size pipeline whose
    batches all have a static size; else None."""
    if isinstance(x, tf.data.Dataset):
        cardinality = int(x.cardinality())
        sizes = {leaf.shape[0] for leaf in tf.nest.flatten(x.element_spec) if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank}
        if cardinality < 0 or len(sizes) != 1 or None in sizes:
            return None
        return cardinality * sizes.pop()
    leaves = tf.nest.flatten(x) if x is not None else []
    if not leaves or not all(hasattr(leaf, "shape") and len(leaf.shape) > 0 for leaf in leaves):
        return None
    rows = int(leaves[0].shape[0])
    if validation_split:
        rows = int(math.floor(rows * (1.0 - validation_split)))
    return rows


def check_num_examples(num_examples: int, rows: int | None, validation_split) -> None:
    """Warns when `num_examples` (N, the likelihood's weight) disagrees with the rows `fit`
    trains on."""
    if rows is None or rows == num_examples:
        return
    held_out = f" (validation_split={validation_split} holds the rest out)" if validation_split else ""
    warnings.warn(
        f"BayesianModel(num_examples={num_examples}) weights the likelihood as if there were "
        f"{num_examples} training examples, but fit trains on {rows}{held_out}: the likelihood "
        f"is {num_examples / rows:.3g} times what the data give. Pass num_examples={rows}, or "
        "num_examples=None to take it from the first fit.",
        UserWarning,
        stacklevel=4,
    )


def resolve_num_examples(rows: int | None) -> int:
    """N from the rows of the first `fit` (for `num_examples=None`), or a clear error."""
    if rows is None:
        raise ValueError(
            "BayesianModel(num_examples=None) takes N from the training data, but this fit's data "
            "has no known size (a generator, a repeated or unknown-length pipeline, or a partial "
            "last batch). Pass num_examples=<number of training examples>."
        )
    logging.getLogger("keras_thermo").info("BayesianModel: num_examples=%d, the rows fit trains on.", rows)
    return rows


def warn_about_output_kind(model) -> None:
    """Warns when the compiled loss's `from_logits` contradicts the net's last activation."""
    message = check_outputs_match_loss(model)
    if message is not None:
        warnings.warn(f"BayesianModel.fit: {message}", UserWarning, stacklevel=4)


# Models already told about their loss or their targets' scale: each warning comes once a model.
_WARNED_ABOUT_MSE: weakref.WeakSet = weakref.WeakSet()
_WARNED_ABOUT_TARGET_SCALE: weakref.WeakSet = weakref.WeakSet()
_MSE_NAMES = ("mse", "mean_squared_error", "MSE")
# Beyond these the targets are "far from unit scale": priors such as Gaussian(1.0), the step
# sizes and GaussianNLL's min_scale all assume targets of order one.
_TARGET_SCALE_FACTOR = 10.0


def _is_mse(loss) -> bool:
    return (
        (isinstance(loss, str) and loss in _MSE_NAMES)
        or isinstance(loss, keras.losses.MeanSquaredError)
        or loss is keras.losses.mean_squared_error
    )


def _is_regression_loss(loss) -> bool:
    regression_losses = (
        keras.losses.MeanSquaredError, keras.losses.MeanAbsoluteError, keras.losses.Huber,
        keras.losses.LogCosh, kt_losses.GaussianNLL, kt_losses.StudentTNLL,
    )
    if isinstance(loss, str):
        return loss in _MSE_NAMES or loss in ("mae", "mean_absolute_error", "huber", "log_cosh")
    return _is_mse(loss) or isinstance(loss, regression_losses)


def warn_about_mse_likelihood(model) -> None:
    """Warns once a model that `loss="mse"` is a Gaussian likelihood of noise variance 1/2."""
    if not _is_mse(getattr(model, "loss", None)) or model in _WARNED_ABOUT_MSE:
        return
    _WARNED_ABOUT_MSE.add(model)
    warnings.warn(
        "BayesianModel.fit: loss='mse' makes the potential N * mean((y - f)^2), the negative log "
        "likelihood of Gaussian noise with variance 1/2 (standard deviation 0.707, in y's units, "
        "for one target) whatever the data's real noise: the posterior's width follows that "
        "assumed noise. Compile with keras_thermo.losses.GaussianNLL(scale=s) for a known noise "
        "standard deviation s, or keras_thermo.losses.GaussianNLL() to learn it (the net then "
        "emits a mean and a raw scale per target).",
        UserWarning,
        stacklevel=4,
    )


def warn_about_target_scale(model, y) -> None:
    """Warns once a model with a regression loss when the targets `y` (an array `fit` can see)
    are far from unit scale, saying how to standardise them and map predictions back."""
    if model in _WARNED_ABOUT_TARGET_SCALE or not _is_regression_loss(getattr(model, "loss", None)):
        return
    if not (isinstance(y, np.ndarray) or tf.is_tensor(y)):
        return
    targets = np.asarray(y)
    if targets.ndim == 0 or targets.shape[0] < 2 or not np.issubdtype(targets.dtype, np.number):
        return
    targets = targets.reshape(targets.shape[0], -1).astype(np.float64)
    if not np.all(np.isfinite(targets)):
        return
    means, stds = targets.mean(axis=0), targets.std(axis=0)
    large = np.abs(means) > _TARGET_SCALE_FACTOR
    off_scale = (stds > _TARGET_SCALE_FACTOR) | ((stds > 0) & (stds < 1.0 / _TARGET_SCALE_FACTOR))
    if not np.any(large | off_scale):
        return
    _WARNED_ABOUT_TARGET_SCALE.add(model)
    warnings.warn(
        f"BayesianModel.fit: the targets y have mean {np.round(means, 4).tolist()} and standard "
        f"deviation {np.round(stds, 4).tolist()} (per target), far from unit scale: the prior, "
        "the step size and the noise scale's floor assume targets of order one, and the sampler "
        "runs hot or stiff on these. Standardise them: scaler = "
        "keras_thermo.regression.TargetScaler().fit(y_train), fit on scaler.transform(y_train), "
        "then pass scaler=scaler to keras_thermo.regression.predict_posterior, evaluate_posterior "
        "or callbacks.PosteriorAverage to get predictions, intervals and metrics on y's own scale "
        "(by hand: scaler.inverse_transform(mean or interval bounds), "
        "scaler.inverse_transform_std(std)).",
        UserWarning,
        stacklevel=4,
    )
