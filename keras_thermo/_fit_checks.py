"""Checks of `BayesianModel.fit`'s arguments: what Keras accepts but would change the sampled
target, or would make the chain's numbers wrong, refused or said in plain words before the first
step."""

from __future__ import annotations

import logging
import math
import warnings

import keras
import tensorflow as tf

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
