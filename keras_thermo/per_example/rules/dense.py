"""`Dense` on inputs of any rank (`z = x W + b` at every position of `x[:, ..., :]`) and `EinsumDense`.

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

from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import ExplicitBlock, factor_or_explicit


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


class DenseRule(registry.LayerRule):
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


registry.register(DenseRule())


def _einsum_specs(equation: str, rank: int) -> tuple[str, str, str, str]:
    """`(input, kernel, output, batch letter)` of an `EinsumDense` equation, its ellipsis spelled
    out in letters the equation does not use, for inputs of rank `rank`."""
    inputs, rest = equation.replace(" ", "").split(",")
    kernel, outputs = rest.split("->")
    if "..." in inputs:
        free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation]
        elided = "".join(free[: rank - (len(inputs) - 3)])
        inputs, outputs = inputs.replace("...", elided), outputs.replace("...", elided)
    return inputs, kernel, outputs, inputs[0]


class EinsumDenseRule(registry.LayerRule):
    """`EinsumDense`: example i's kernel gradient is the layer's einsum contracted with its
    output error instead of the kernel, `einsum('{in},{out}->b{kernel}')` with `b` the batch
    letter (explicit rows); its bias gradient sums the error over the axes the bias does not
    span. (TF 2.21's `tf.vectorized_map` mishandles some `Einsum`s, e.g. `abc,cde->abde`: wrong
    rows or a crash, so for such layers this rule is also the only working per-example path.)"""

    layer_types = (keras.layers.EinsumDense,)

    def unsupported(self, layer):
        inputs = layer.equation.split(",")[0]
        if inputs.startswith("...") or not inputs[:1].isalpha():
            return f"equation {layer.equation!r} (the rule needs the batch axis named first)"
        return unsupported_variant(layer)

    def forward(self, layer, call, inputs, training=None):
        inputs = call.save("inputs", inputs)
        z = keras.ops.einsum(layer.equation, inputs, layer.kernel)
        if layer.bias is not None:
            z = keras.ops.add(z, layer.bias)
        z = call.watch("z", z)
        return layer.activation(z) if layer.activation is not None else z

    def blocks(self, layer, calls):
        rank = calls[0]["inputs"].shape.rank
        inputs, kernel, outputs, batch = _einsum_specs(layer.equation, rank)
        kernel_size = int(layer.kernel.shape.num_elements())
        rows = tf.add_n([
            tf.reshape(tf.einsum(f"{inputs},{outputs}->{batch}{kernel}", call["inputs"], call["d_z"]), [-1, kernel_size])
            for call in calls
        ])
        variables, columns = [layer.kernel], [rows]
        if layer.bias is not None:
            bias_letters = "".join(c for c in outputs if c in layer.bias_axes)
            columns.append(tf.add_n([
                tf.reshape(tf.einsum(f"{outputs}->{batch}{bias_letters}", call["d_z"]),
                           [-1, int(layer.bias.shape.num_elements())])
                for call in calls
            ]))
            variables.append(layer.bias)
        sizes = [int(v.shape.num_elements()) for v in variables]
        return [(variables, ExplicitBlock(tf.concat(columns, axis=1), sizes))]


registry.register(EinsumDenseRule())
