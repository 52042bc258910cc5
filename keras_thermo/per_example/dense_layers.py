"""`per_example_method="dense_layers"`: the per-example engine restricted to `Dense` networks.

This option and these names predate the layer-rule engine (`keras_thermo.per_example.engine`),
which now computes everything here for any network it has rules for. What remains specific to
this module is the restriction it promises: a
`keras.Sequential` of plain `Dense` layers on `[batch, features]` inputs
(`dense_layer_incompatibility`), where every layer is kept as factors (`T = 1`, see
`keras_thermo.per_example.blocks.FactorBlock`).

Reference: Goodfellow (2015), "Efficient Per-Example Gradient Computations", arXiv:1510.01799.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from keras_thermo.per_example import checks, engine
from keras_thermo.per_example.blocks import FactorBlock
from keras_thermo.per_example.losses import LossLike
from keras_thermo.per_example.statistics import LayerRows, LayerStatistics


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _trainable_dense_reason(layer: keras.layers.Layer) -> str | None:
    """Why a layer with trainable weights is not a plain rank-2 `Dense`, or None."""
    name = f"layer '{layer.name}' ({type(layer).__name__})"
    if type(layer) is not keras.layers.Dense:  # a subclass may change `call`
        return f"{name} has trainable weights but is not a keras.layers.Dense"
    if getattr(layer, "lora_enabled", False):
        return f"{name} has LoRA enabled (its trainable weights are the LoRA factors)"
    if getattr(layer, "quantization_mode", None) is not None:
        return f"{name} is quantized ({layer.quantization_mode})"
    if layer.compute_dtype != layer.variable_dtype:
        return (
            f"{name} uses the mixed dtype policy '{layer.dtype_policy.name}'; the fast path "
            "needs the compute dtype to equal the variable dtype"
        )
    expected = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
    if [id(w) for w in layer.trainable_weights] != [id(w) for w in expected]:
        return f"{name} has trainable weights other than its kernel and bias"
    try:
        rank = len(layer.input.shape)
    except (AttributeError, ValueError):  # not called in a symbolic graph: checked at run time
        rank = 2
    if rank != 2:
        return (
            f"{name} acts on rank-{rank} inputs; the fast path needs [batch, features] "
            "inputs (put a Flatten before it)"
        )
    return None


def dense_layer_incompatibility(net: Any) -> str | None:
    """Why the `Dense`-layer fast path does not apply to `net`, or None when it does.

    The fast path applies to a `keras.Sequential` whose layers with trainable weights are all
    plain `keras.layers.Dense` layers (not subclasses, no LoRA, not quantized, no mixed
    precision, kernel and bias their only trainable weights) acting on rank-2 inputs, and
    that passes `keras_thermo.per_example.checks.check_per_example_compatible`. Layers without trainable
    weights (`Flatten`, `Activation`, `Reshape`, `Rescaling`, frozen layers, ...) may sit
    anywhere; `Masking` may not (the fast path does not propagate Keras masks).

    This function never raises for a model it cannot handle: what
    `check_per_example_compatible` would raise becomes the returned reason (on one line).

    Args:
        net: the model to check.

    Returns:
        None, or a one-line reason naming the model or the offending layer.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> dense_layer_incompatibility(net) is None
        True
        >>> dense_layer_incompatibility(keras.Sequential([
        ...     keras.Input((4, 1)), keras.layers.Conv1D(2, 3)]))
        "layer 'conv1d' (Conv1D) has trainable weights but is not a keras.layers.Dense"
    """
    if not isinstance(net, keras.Sequential):
        return (
            f"the model is a {type(net).__name__}, not a keras.Sequential (the fast path runs "
            "the layers one after the other)"
        )
    try:
        checks.check_per_example_compatible(net)
    except ValueError as error:
        return _one_line(str(error))
    if not net.trainable_variables:
        return (
            f"model '{net.name}' has no trainable variables (build it, e.g. with a "
            "keras.Input, before asking for per-example gradients)"
        )
    layout_order = []
    for layer in net.layers:
        if isinstance(layer, keras.layers.Masking):
            return f"layer '{layer.name}' (Masking) sets a Keras mask, which the fast path ignores"
        if not layer.trainable_weights:
            continue
        reason = _trainable_dense_reason(layer)
        if reason is not None:
            return reason
        layout_order += layer.trainable_weights
    if [id(v) for v in layout_order] != [id(v) for v in net.trainable_variables]:
        return (
            f"the trainable variables of model '{net.name}' are not the Dense kernels and "
            "biases in layer order"
        )
    return None


def _factor_blocks(inputs, output_gradients, has_bias, caller: str):
    inputs, output_gradients, has_bias = list(inputs), list(output_gradients), list(has_bias)
    if not (len(inputs) == len(output_gradients) == len(has_bias)) or not inputs:
        raise ValueError(
            f"{caller}: `inputs`, `output_gradients` and `has_bias` must list the same number "
            f"(>= 1) of layers; got {len(inputs)}, {len(output_gradients)} and {len(has_bias)}."
        )
    blocks = []
    for index, (a, delta, bias) in enumerate(zip(inputs, output_gradients, has_bias)):
        a, delta = tf.convert_to_tensor(a), tf.convert_to_tensor(delta)
        if a.shape.rank != 2 or delta.shape.rank != 2 or None in (a.shape[1], delta.shape[1]):
            raise ValueError(
                f"{caller}: layer {index} needs factors of shapes [n, in] and [n, out] with known "
                f"in/out; got {a.shape} and {delta.shape}."
            )
        blocks.append(FactorBlock(tf.cast(a, tf.float32)[:, tf.newaxis], tf.cast(delta, tf.float32)[:, tf.newaxis], bias))
    placement = tuple((b, s) for b, block in enumerate(blocks) for s in range(len(block.sizes)))
    return blocks, placement


class DenseLayerRows(LayerRows):
    """`Gc` of a `Dense` network from per-layer factors: a `LayerRows` of `T = 1` factor blocks.

    Row `i` of the uncentered `G` is, layer after layer, `vec(a_i delta_i^T)` (row-major)
    followed by `delta_i` when the layer has a bias.

    Args:
        inputs: per layer, `A_l`, `[n, in_l]`.
        output_gradients: per layer, `Delta_l`, `[n, out_l]`.
        has_bias: per layer, whether its bias is a column block of `G`.

    Example:
        >>> import tensorflow as tf
        >>> rows = DenseLayerRows([tf.constant([[1.0], [2.0]])],
        ...                       [tf.constant([[1.0], [3.0]])], [True])
        >>> rows.to_dense().numpy().tolist()   # G = [[1, 1], [6, 3]], centered
        [[-2.5, -1.0], [2.5, 1.0]]
    """

    def __init__(self, inputs: Sequence[tf.Tensor], output_gradients: Sequence[tf.Tensor], has_bias: Sequence[bool]):
        super().__init__(*_factor_blocks(inputs, output_gradients, has_bias, "DenseLayerRows"))


class DenseLayerGradients(LayerStatistics):
    """`LayerStatistics` of a `Dense` network given by its per-layer factors.

    Under `tf.distribute` each replica passes the factors of its slice of the batch; they are
    gathered once (in replica order).

    Args:
        inputs: per Dense layer, `A_l`, `[n, in_l]`, this replica's examples.
        output_gradients: per Dense layer, `Delta_l = d l_i / d z_i`, `[n, out_l]`.
        has_bias: per Dense layer, whether its bias is trainable and follows its kernel.
        cross_replica: a `keras_thermo._distribute.CrossReplica`; None creates one for the
            current context.

    Example:
        >>> import tensorflow as tf
        >>> stats = DenseLayerGradients([tf.constant([[1.0], [2.0]])],
        ...                             [tf.constant([[1.0], [3.0]])], [True])
        >>> float(stats.count), stats.diagonal_covariance().numpy().tolist()  # G = [[1, 1], [6, 3]]
        (2.0, [12.5, 2.0])
    """

    def __init__(self, inputs, output_gradients, has_bias, cross_replica: Any = None):
        from keras_thermo._distribute import CrossReplica  # noqa: PLC0415 (tiny module)

        if len(inputs) != len(output_gradients) or not inputs:
            raise ValueError(
                "DenseLayerGradients: `inputs` and `output_gradients` must list the same "
                f"number (>= 1) of layers; got {len(inputs)} and {len(output_gradients)}."
            )
        cross = cross_replica if cross_replica is not None else CrossReplica()
        factors = [tf.cast(t, tf.float32) for pair in zip(inputs, output_gradients) for t in pair]
        widths = [int(t.shape[1]) for t in factors]
        pieces = tf.split(cross.gather_rows(tf.concat(factors, axis=1)), widths, axis=1)
        blocks, placement = _factor_blocks(pieces[0::2], pieces[1::2], has_bias, "DenseLayerGradients")
        rows = DenseLayerRows.__new__(DenseLayerRows)
        LayerRows.__init__(rows, blocks, placement)
        super().__init__(rows)


def dense_layer_gradients(
    net: keras.Sequential,
    loss_fn: LossLike,
    x: Any,
    y: Any,
    sample_weight: Any = None,
    cross_replica: Any = None,
    loss_scale: float = 1.0,
) -> LayerStatistics:
    """`keras_thermo.per_example.layer_statistics` for a network of `Dense` layers only.

    Args:
        net: a `keras.Sequential` for which `dense_layer_incompatibility(net)` is None.
        loss_fn, x, y, sample_weight, cross_replica, loss_scale: as for `layer_statistics`.

    Returns:
        A `LayerStatistics` whose `covariance_factor()` is a `DenseLayerRows`.

    Raises:
        ValueError: the `Dense` restriction does not hold (the reason, see
            `dense_layer_incompatibility`), or what `layer_statistics` raises.

    Example:
        >>> import keras, tensorflow as tf
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> stats = dense_layer_gradients(net, "mse", tf.random.normal([5, 3]), tf.zeros([5, 2]))
        >>> stats.diagonal_covariance().shape   # 3 * 2 kernel + 2 bias entries
        TensorShape([8])
    """
    reason = dense_layer_incompatibility(net)
    if reason is not None:
        raise ValueError(f"dense_layer_gradients: the Dense-layer fast path does not apply: {reason}.")
    stats = engine.layer_statistics(
        net, loss_fn, x, y, sample_weight, cross_replica=cross_replica, loss_scale=loss_scale
    )
    generic = stats.covariance_factor()
    rows = DenseLayerRows.__new__(DenseLayerRows)
    LayerRows.__init__(rows, generic.blocks, generic._placement)
    return LayerStatistics(rows)
