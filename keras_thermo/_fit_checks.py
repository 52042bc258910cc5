"""Checks of `BayesianModel`'s arguments (its net, `compile`'s loss, `fit`'s data and callbacks):
what Keras accepts but would change the sampled target, or would make the chain's numbers wrong,
refused or said in plain words before the first step."""

from __future__ import annotations

import logging
import math
import warnings
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import losses as kt_losses
from keras_thermo.per_example import dense_layers as kt_dense_layers
from keras_thermo import per_example as kt_per_example
from keras_thermo._outputs import check_outputs_match_loss
from keras_thermo._validation import check_positive

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
        cardinality, batch_size = int(x.cardinality()), _static_batch_size(x)
        if cardinality < 0 or batch_size is None:
            return None
        return cardinality * batch_size
    leaves = tf.nest.flatten(x) if x is not None else []
    if not leaves or not all(hasattr(leaf, "shape") and len(leaf.shape) > 0 for leaf in leaves):
        return None
    rows = int(leaves[0].shape[0])
    if validation_split:
        rows = int(math.floor(rows * (1.0 - validation_split)))
    return rows


def _static_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The one static batch size of a pipeline's elements, or None (unknown or mixed)."""
    sizes = {leaf.shape[0] for leaf in tf.nest.flatten(dataset.element_spec) if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def dropped_remainder(x) -> int:
    """How many examples a batched pipeline may leave out of each pass and still hold
    `num_examples`: fewer than one batch (`drop_remainder=True`); 0 for arrays."""
    batch_size = _static_batch_size(x) if isinstance(x, tf.data.Dataset) else None
    return max(0, batch_size - 1) if batch_size else 0


def check_num_examples(num_examples: int, rows: int | None, validation_split, slack: int = 0) -> None:
    """Warns when `num_examples` (N, the likelihood's weight) disagrees with the rows `fit`
    trains on; `slack`: how many more than `rows` still agree (`dropped_remainder`)."""
    if rows is None or rows <= num_examples <= rows + slack:
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


def check_float32_variables(variables) -> None:
    """Refuses weights that are not float32: the samplers' noise, momenta and step sizes are
    float32, and a float64 (or float16) weight would fail deep inside the traced step."""
    for variable in variables:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        if dtype != "float32":
            raise TypeError(
                f"BayesianModel samples float32 weights, but trainable variable "
                f"{getattr(variable, 'path', variable.name)!r} has dtype {dtype!r}. Build the net "
                "with dtype='float32' (or keras.config.set_floatx('float32')); a mixed-precision "
                "policy such as 'mixed_bfloat16' keeps float32 weights and is accepted."
            )


def single_output_loss_weight(loss, loss_weights, sampler_name: str) -> float:
    """The factor `loss_weights` puts on a single-output loss (1 when None).

    Per-example gradients are those of one loss per example; Keras' multi-output losses (a list
    or dict of losses) would need the per-example pass to reproduce Keras' matching of targets
    to outputs, so they are refused here with what to do instead.
    """
    losses = [loss] if isinstance(loss, (str, keras.losses.Loss)) or callable(loss) else tf.nest.flatten(loss)
    weights = [] if loss_weights is None else (
        [loss_weights] if isinstance(loss_weights, (int, float)) else tf.nest.flatten(loss_weights)
    )
    if len(losses) > 1 or len(weights) > 1:
        raise ValueError(
            f"{sampler_name} takes per-example gradients of a single-output loss, but `loss` is "
            f"{loss!r} with `loss_weights` {loss_weights!r}. Combine the outputs' losses into one "
            "keras.losses.Loss (a subclass whose `call` returns each example's weighted sum), or "
            "use a sampler without per-example gradients (SGLD, SGHMC, SGNHT, TACT-HMC)."
        )
    if not weights:
        return 1.0
    return check_positive("loss_weights", weights[0])


def loss_reductions(loss) -> list[tuple[str, Any]]:
    """(description, reduction) for every Keras loss object inside a compile `loss` argument."""
    found = []
    for item in tf.nest.flatten(loss) if not isinstance(loss, keras.losses.Loss) else [loss]:
        if isinstance(item, keras.losses.Loss):
            found.append((type(item).__name__, item.reduction))
    return found


def is_array_data(x) -> bool:
    """Whether `fit`'s `x` is in-memory arrays (numpy or tensors, possibly nested), not a
    `tf.data.Dataset`, `PyDataset` or generator."""
    if x is None or isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)):
        return False
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in leaves)


def _check_same_rows(named: dict, where: str) -> None:
    """Every array of `named` (x, y, sample_weight, each possibly a structure) holds one row per
    example."""
    def rows(array):  # None for what has no rows (Keras refuses it with its own message)
        shape = getattr(array, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) and shape[0] is not None else None

    sizes = {}
    for name, value in named.items():
        paths = keras.tree.flatten_with_path(value) if keras.tree.is_nested(value) else [((), value)]
        for path, array in paths:
            size = rows(array)
            if size is not None:
                sizes[name + "".join(f"[{key!r}]" for key in path)] = size
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"`{name}` {size}" for name, size in sizes.items())
        raise ValueError(f"{where} must hold the same number of examples (rows along the first axis); got {listed}.")


def check_array_rows(arguments: dict) -> None:
    """`fit`'s arrays, and `validation_data`'s, each hold one row per example: refused before the
    first batch builds the net or the minibatches are drawn (Keras checks too, but only after the
    draws would have indexed past the shorter, or, for `validation_data`, after the first epoch)."""
    named = {name: arguments[name] for name in ("x", "y", "sample_weight") if arguments.get(name) is not None}
    if is_array_data(named.get("x")):
        _check_same_rows(named, "fit's arrays")
    validation = arguments.get("validation_data")
    if isinstance(validation, (tuple, list)) and is_array_data(validation[0] if validation else None):
        _check_same_rows({name: v for name, v in zip(("x", "y", "sample_weight"), validation) if v is not None},
                         "`validation_data`'s arrays")


def check_chain_batch_size(model, x, batch_size, draws_batches: bool) -> None:
    """Refuses, before the first step, batches of a known size that do not split into one
    equal part per chain (`chain_minibatches="split"`); sizes that show only at run time
    stop `fit` at the first such batch (`_chain_batches`). Batches `fit` draws itself
    (`draws_batches`) hold `batch_size` examples per chain."""
    if model.num_chains == 1 or model.chain_minibatches == "shared" or draws_batches:
        return
    if isinstance(x, tf.data.Dataset):
        sizes = {
            leaf.shape[0] for leaf in tf.nest.flatten(x.element_spec)
            if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank and leaf.shape[0] is not None
        }
        what = "the tf.data pipeline's batches hold"
    elif is_array_data(x):
        sizes, what = {batch_size or 32}, "`batch_size` is"
    else:
        return
    for size in sizes:
        if size % model.num_chains:
            raise ValueError(
                f"{what} {size} examples, which do not split into num_chains={model.num_chains} "
                "equal parts (chain_minibatches='split' gives each chain one part): use a batch "
                f"size that is a multiple of {model.num_chains}, fit on arrays with the default "
                "shuffle (each chain then draws batch_size examples of its own), or "
                "chain_minibatches='shared'."
            )


def check_per_example_method(model) -> None:
    if not model.sampler.needs_per_example_gradients:
        return
    if kt_per_example.stochastic_layers(model.net):
        # No per-example path takes these layers: refuse now rather than name a fallback.
        kt_per_example.check_per_example_compatible(model.net, recurrent_loops=True)
    if model.per_example_method == "dense_layers":
        reason = kt_dense_layers.dense_layer_incompatibility(model.net)
    elif model.per_example_method in ("layers", "auto"):
        reason = kt_per_example.incompatibility(model.net)
    else:
        return
    if reason is None:
        return
    if model.per_example_method == "auto":
        if not model._runtime.noted_per_example_fallback:
            model._runtime.noted_per_example_fallback = True
            logging.getLogger("keras_thermo").warning(
                "%s: per-example gradients of net %r come from tf.vectorized_map (several times "
                "slower than the layer rules) because %s.",
                type(model.sampler).__name__, model.net.name, reason,
            )
        return
    raise ValueError(
        f"`per_example_method` {model.per_example_method!r} does not apply to net {model.net.name!r}: "
        f"{reason}. Use 'auto' or 'vectorized'."
    )


# What each kind of `grads.stochastic_setting` does to the sampled target.
_TARGET_EFFECTS = {
    "batch_statistics": (
        "normalises each example with its minibatch's statistics, so U depends on which examples "
        "share a batch and the chain samples a batch-dependent target, not exp(-U/T). Its moving "
        "mean and variance are not sampled weights: SampleCollector's samples hold none of them, "
        "so a stored sample is evaluated later with the final moving statistics. Freeze it "
        "(layer.trainable = False) or use LayerNormalization"
    ),
    "noise": (
        "multiplies or perturbs activations with fresh noise at every step, so U is random and the "
        "chain samples a noise-averaged target, not exp(-U/T) (predict and evaluate run without "
        "the noise). Set the rate to 0: the sampler injects its own noise"
    ),
    "random_draws": (
        "draws random numbers in training mode (e.g. a random augmentation), so U is random and "
        "the target is an average over those draws. Move augmentation into the tf.data pipeline "
        "if the augmented examples are meant as data"
    ),
}


def warn_about_stochastic_layers(model) -> None:
    """Warns once per model about layers that make U random or batch-coupled (samplers with
    per-example gradients refuse them instead, see `grads.check_per_example_compatible`)."""
    if model._runtime.warned_about_layers or model.sampler.needs_per_example_gradients:
        return
    model._runtime.warned_about_layers = True
    for layer, kind, setting in kt_per_example.stochastic_layers(model.net):
        warnings.warn(
            f"BayesianModel: layer {layer.name!r}, {setting}, {_TARGET_EFFECTS[kind]}.",
            UserWarning,
            stacklevel=3,
        )


def note_pipeline_noise(model) -> None:
    """Logs once that a pipeline's own batch order is used (thermostats assume white noise)."""
    if model._runtime.noted_pipeline or not getattr(model.sampler, "assumes_white_gradient_noise", False):
        return
    model._runtime.noted_pipeline = True
    logging.getLogger("keras_thermo").warning(
        "%s assumes independent minibatches (white gradient noise); this dataset's own batch "
        "order is used. Epochs drawn without replacement make the noise of an epoch sum to "
        "zero, which biases noise-absorbing thermostats and CCAdL/mCCAdL's covariance "
        "correction: draw batches with replacement (keras_thermo.data.random_minibatches, or "
        "fit on arrays, which does so by default).",
        type(model.sampler).__name__,
    )


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
