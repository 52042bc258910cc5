"""The per-example losses whose gradients are the rows of `G`, shared by both per-example paths.

Example `i`'s loss is the loss of the example run as a batch of one: `c w_i l_i`, with `w_i` its
sample weight and `c` the compile-time `loss_weights` factor. With a mean reduction
(`sum_over_batch_size` or `mean`) the batch loss is the mean of these, so the rows of `G`
average to the gradient of the batch loss.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import keras
import tensorflow as tf

LossLike = Union[keras.losses.Loss, Callable[..., Any], str]

# Reductions for which the loss of a batch is the mean of its per-example
# losses, so per-example losses computed on batches of one average to it.
PER_EXAMPLE_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


def resolve_loss(loss_fn: LossLike, caller: str = "per_example_gradients") -> Callable[..., Any]:
    """Turns a loss identifier into a callable and checks its reduction (errors name `caller`)."""
    if isinstance(loss_fn, str):
        loss_fn = keras.losses.get(loss_fn)
    if not callable(loss_fn):
        raise TypeError(
            f"{caller}: `loss_fn` must be a keras.losses.Loss, a "
            f"callable or a loss name; got {loss_fn!r}."
        )
    if isinstance(loss_fn, keras.losses.Loss):
        if loss_fn.reduction not in PER_EXAMPLE_MEAN_REDUCTIONS:
            raise ValueError(
                f"{caller}: `loss_fn.reduction` must be one of "
                f"{PER_EXAMPLE_MEAN_REDUCTIONS}, so that the batch loss is the mean of "
                f"the per-example losses; got {loss_fn.reduction!r}."
            )
    return loss_fn


def example_loss(
    loss_fn: Callable[..., Any], y_i: Any, y_pred_i: Any, weight_i: Any = None, loss_scale: float = 1.0
) -> tf.Tensor:
    """The loss `c w_i l_i` of one example given as a batch of one (the row of `G` is its
    gradient); `c = loss_scale` is the compile-time `loss_weights` factor of the batch loss.

    A Keras loss object gets the example's weight; a plain callable's mean over the batch of one
    is multiplied by it (one scalar per example).
    """
    if isinstance(loss_fn, keras.losses.Loss):
        loss = loss_fn(y_i, y_pred_i, sample_weight=weight_i)
        # Under tf.distribute a Keras loss divides itself by the number of replicas (so that
        # summed replica gradients average); a per-example loss must not.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss * tf.cast(replicas * loss_scale, loss.dtype)
    loss = tf.reduce_mean(loss_fn(y_i, y_pred_i))
    if weight_i is not None:
        loss = loss * tf.cast(tf.reshape(weight_i, []), loss.dtype)
    return loss * tf.cast(loss_scale, loss.dtype) if loss_scale != 1.0 else loss


def check_targets(y: Any, sample_weight: Any, loss_fn: Callable[..., Any], caller: str) -> tuple[Any, Any]:
    """`y` and `sample_weight` as tensors, refusing what no per-example loss can use."""
    if y is None:
        raise ValueError(
            f"{caller}: `y` is None; per-example gradients need targets for `loss_fn`."
        )
    y = tf.nest.map_structure(tf.convert_to_tensor, y)
    if sample_weight is not None:
        sample_weight = tf.convert_to_tensor(sample_weight)
        if not isinstance(loss_fn, keras.losses.Loss) and sample_weight.shape.rank != 1:
            raise ValueError(
                f"{caller}: with a plain callable `loss_fn`, `sample_weight` must have shape "
                f"[n] (one weight per example); got shape {sample_weight.shape}. Use a "
                "keras.losses.Loss for per-timestep weights."
            )
    return y, sample_weight


def output_gradients(
    loss_fn: Any, y: Any, y_pred: Any, sample_weight: Any = None, loss_scale: float = 1.0
) -> Any:
    """`d (c w_i l_i) / d y_pred_i` for every example, stacked like `y_pred` (a nest).

    Each example's loss is `example_loss` of a batch of one, so reductions and sample weights
    mean exactly what they mean for the vectorized rows; its gradient is taken inside a
    `tf.vectorized_map` (a few ops on the outputs). Differentiating a vectorized loss from
    outside instead makes XLA treat the step's inputs as compile-time constants and recompile
    the train step at every step.

    Example:
        >>> import tensorflow as tf
        >>> g = output_gradients("mse", tf.zeros([2, 1]), tf.constant([[1.0], [3.0]]))
        >>> g.numpy().ravel().tolist()   # d (y_pred - y)^2 / d y_pred
        [2.0, 6.0]
    """
    loss_fn = resolve_loss(loss_fn, "output_gradients")

    def one_gradient(example: tuple) -> Any:
        y_i, pred_i = tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), example[:2])
        weight_i = tf.expand_dims(example[2], 0) if len(example) == 3 else None
        with tf.GradientTape() as tape:
            tape.watch(pred_i)
            loss = example_loss(loss_fn, y_i, pred_i, weight_i, loss_scale)
        return tf.nest.map_structure(lambda g: g[0], tape.gradient(loss, pred_i))

    examples = (y, y_pred) if sample_weight is None else (y, y_pred, sample_weight)
    return tf.vectorized_map(one_gradient, examples)
