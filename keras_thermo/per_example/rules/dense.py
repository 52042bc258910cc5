"""`Dense` on inputs of any rank: `z = x W + b` applied at every position of `x[:, ..., :]`.

Example i's kernel gradient is `sum_t x_it^T delta_it` over the `T` positions (`T = 1` for
`[batch, features]` inputs), its bias gradient `sum_t delta_it`. Calls of one layer (a layer
used twice) concatenate along the positions.

Example:
    >>> import keras, tensorflow as tf
    >>> from keras_thermo.per_example.engine import rule_for
    >>> type(rule_for(keras.layers.Dense(3))).__name__
    'DenseRule'
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo.per_example import engine
from keras_thermo.per_example.blocks import factor_or_explicit


def unsupported_variant(layer) -> str | None:
    """LoRA and quantized weights are not the plain kernel the rule differentiates."""
    if getattr(layer, "lora_enabled", False):
        return "LoRA is enabled (its trainable weights are the LoRA factors)"
    if getattr(layer, "quantization_mode", None) is not None:
        return f"it is quantized ({layer.quantization_mode})"
    return None


def positions_of(tensor: tf.Tensor) -> tf.Tensor:
    """`[n, ..., c]` -> `[n, T, c]` (static `c`; `T` static where the middle axes are)."""
    middle = tensor.shape[1:-1]
    if middle.is_fully_defined():
        return tf.reshape(tensor, [-1, int(middle.num_elements()), int(tensor.shape[-1])])
    return tf.reshape(tensor, [tf.shape(tensor)[0], -1, int(tensor.shape[-1])])


def shared_kernel_blocks(calls, input_name: str, delta_name: str, variables, has_bias: bool):
    """One block for a kernel shared over positions: the calls' positions concatenated."""
    inputs = tf.concat([positions_of(call[input_name]) for call in calls], axis=1)
    deltas = tf.concat([positions_of(call[delta_name]) for call in calls], axis=1)
    return [(variables, factor_or_explicit(inputs, deltas, has_bias))]


class DenseRule(engine.LayerRule):
    layer_types = (keras.layers.Dense,)

    def unsupported(self, layer):
        return unsupported_variant(layer)

    def forward(self, layer, call, inputs, training=None):
        inputs = call.save("inputs", inputs)
        z = keras.ops.matmul(inputs, layer.kernel)
        if layer.bias is not None:
            z = keras.ops.add(z, layer.bias)
        z = call.watch("z", z)
        return layer.activation(z) if layer.activation is not None else z

    def blocks(self, layer, calls):
        variables = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
        return shared_kernel_blocks(calls, "inputs", "d_z", variables, layer.bias is not None)


engine.register(DenseRule())
