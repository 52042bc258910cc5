"""`Conv1D` and `Conv2D`: example i's kernel gradient is `P_i^T Delta_i` over the output pixels.

`P_i` (`[T, kh kw c_in]`) holds the input patches the kernel meets at each of the `T` output
positions (strides, dilation and `valid`/`same`/`causal` padding as the layer uses them), in the
order `(row, column, channel)`, the row-major order of the kernel `[kh, kw, c_in, c_out]`;
`Delta_i` (`[T, c_out]`) is the gradient at the pre-activation. `T^2 (d + p)` far exceeds `d p`
for convolutions, so the rows are formed explicitly, in chunks of examples when they would be
large.

Each kernel offset meets one slice of the padded input (through a reshape that splits each
axis by its stride, so that strided and dilated offsets are contiguous slices too), and
`P_i^T Delta_i` is, offset by offset, that slice's `[c_in, T] x [T, c_out]` product
(`kernel_rows`): the patches (`patches`, the slices side by side, equal to
`tf.image.extract_patches`) are formed only for the rare layer kept in factor form.
The three ways' times on 2 CPU cores: docs/notes/conv_patches.md.

Reference: Rochette, Manoel & Tramel (2019), "Efficient Per-Example Gradient Computations in
Convolutional Neural Networks", arXiv:1912.06015.

Example:
    >>> import keras, tensorflow as tf
    >>> layer = keras.layers.Conv2D(2, 3, strides=2, padding="same")
    >>> _ = layer.build((None, 7, 7, 1))
    >>> patches(layer, tf.ones([1, 7, 7, 1])).shape   # 4 x 4 output pixels, 3 x 3 x 1 patches
    TensorShape([1, 16, 9])
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import ExplicitBlock, FactorBlock, explicit_gradients, uses_factor_form
from keras_thermo.per_example.rules.dense import positions_of, unsupported_variant


def _axis_window(size: Any, kernel: int, stride: int, dilation: int, padding: str) -> tuple[Any, Any, Any]:
    """`(pad_before, pad_after, outputs)` along one spatial axis of `size` entries (an int, or a
    scalar tensor when not static), as TensorFlow's `VALID`/`SAME` and Keras' `causal` padding."""
    span = dilation * (kernel - 1) + 1
    static = isinstance(size, int)
    if padding == "valid":
        return 0, 0, (size - span) // stride + 1
    if padding == "causal":  # left padding by the span, then valid
        return span - 1, 0, (size - 1) // stride + 1
    outputs = -(-size // stride)  # "same": ceil(size / stride) outputs, padding split low side first
    total = (outputs - 1) * stride + span - size
    total = max(total, 0) if static else tf.maximum(total, 0)
    return total // 2, total - total // 2, outputs


def offset_inputs(layer, inputs: tf.Tensor) -> list[tf.Tensor]:
    """Per kernel offset, in the kernel's row-major order, the `[n, T, c_in]` inputs
    that offset meets at the `T` output positions of a channels-last `Conv1D`/`Conv2D` layer."""
    batch = static_or_dynamic(inputs, 0)
    sizes = [static_or_dynamic(inputs, 1 + axis) for axis in range(layer.rank)]
    windows = [
        _axis_window(size, kernel, stride, dilation, layer.padding)
        for size, kernel, stride, dilation in zip(sizes, layer.kernel_size, layer.strides, layer.dilation_rate)
    ]
    # Each spatial axis, padded to a whole number of strides, becomes [length / stride, stride]:
    # input (q + t) stride + r, what kernel offset q stride + r meets at output t, is then entry
    # [q + t, r], so every offset's inputs are one contiguous slice (a strided slice is several
    # times slower than `extract_patches` on a CPU, this is faster).
    paddings, split_shape = [[0, 0]], [batch]
    for size, (before, after, _), stride in zip(sizes, windows, layer.strides):
        after = after + (-(size + before + after)) % stride
        paddings.append([before, after])
        split_shape += [(size + before + after) // stride, stride]
    channels = int(inputs.shape[-1])
    if any(not isinstance(amount, int) or amount for pair in paddings for amount in pair):
        inputs = tf.pad(inputs, paddings + [[0, 0]])
    split = tf.reshape(inputs, split_shape + [channels])

    def offsets(axis: int) -> list[tuple[slice, int]]:
        """`(outputs slice, phase)` of each kernel offset along `axis`."""
        outputs, stride, dilation = windows[axis][2], layer.strides[axis], layer.dilation_rate[axis]
        return [(slice(k * dilation // stride, k * dilation // stride + outputs), k * dilation % stride)
                for k in range(layer.kernel_size[axis])]

    if layer.rank == 1:
        pieces = [split[:, rows, row_phase] for rows, row_phase in offsets(0)]
    else:
        pieces = [split[:, rows, row_phase, columns, column_phase]
                  for rows, row_phase in offsets(0) for columns, column_phase in offsets(1)]
    count = 1
    for _, _, outputs in windows:
        count *= outputs
    return [tf.reshape(piece, [batch, count, channels]) for piece in pieces]


def patches(layer, inputs: tf.Tensor) -> tf.Tensor:
    """`[n, T, kh kw c_in]`: the input patches of every output position of a channels-last
    `Conv1D`/`Conv2D` layer (the offsets' inputs side by side)."""
    return tf.concat(offset_inputs(layer, inputs), axis=-1)


def kernel_rows(layer, inputs: Sequence[tf.Tensor], deltas: tf.Tensor) -> tf.Tensor:
    """`[n, kh kw c_in c_out]`: example i's kernel gradient `P_i^T Delta_i`, flattened row-major.

    One batched product per kernel offset, `[n, c_in, T] x [n, T, c_out]`, of that offset's
    inputs (concatenated over the calls `inputs`, as `deltas` `[n, T, c_out]` is): the patches
    themselves are never formed, and the small products take about two thirds of the time of one
    product of the patches on 2 CPU cores for the CIFAR-10 CNN's first layer (2.4 against 3.6 ms)
    (docs/notes/conv_patches.md).
    """
    per_call = [offset_inputs(layer, call_inputs) for call_inputs in inputs]
    rows = [
        tf.matmul(tf.concat(list(offset), axis=1), deltas, transpose_a=True)  # [n, c_in, c_out]
        for offset in zip(*per_call)
    ]
    return tf.reshape(tf.stack(rows, axis=1), [tf.shape(deltas)[0], -1])


def static_or_dynamic(tensor: tf.Tensor, axis: int) -> Any:
    """The size of `axis`: a Python int where static, a scalar int32 tensor otherwise."""
    static = tensor.shape[axis]
    return int(static) if static is not None else tf.shape(tensor)[axis]


class ConvolutionRule(registry.LayerRule):
    layer_types = (keras.layers.Conv1D, keras.layers.Conv2D)

    def unsupported(self, layer):
        if layer.data_format != "channels_last":
            return f"data_format={layer.data_format!r} (the rule reads channels-last patches)"
        if layer.groups != 1:
            return f"groups={layer.groups} (grouped convolutions have no rule)"
        return unsupported_variant(layer)

    def forward(self, layer, call, inputs, *args, **kwargs):
        inputs = call.save("inputs", inputs)
        padding = layer.padding
        if padding == "causal":  # Conv1D: left padding, then a valid convolution
            left = layer.dilation_rate[0] * (layer.kernel_size[0] - 1)
            inputs, padding = tf.pad(inputs, [[0, 0], [left, 0], [0, 0]]), "valid"
        z = keras.ops.conv(
            inputs, layer.kernel, strides=list(layer.strides), padding=padding,
            dilation_rate=layer.dilation_rate, data_format=layer.data_format,
        )
        if layer.use_bias:
            z = keras.ops.add(z, layer.bias)
        z = call.watch("z", z)
        return layer.activation(z) if layer.activation is not None else z

    def blocks(self, layer, calls):
        variables = [layer.kernel] + ([layer.bias] if layer.use_bias else [])
        inputs = tuple(call["inputs"] for call in calls)
        deltas = tf.concat([positions_of(call["d_z"]) for call in calls], axis=1)

        width = layer.kernel_size[0] * (layer.kernel_size[1] if layer.rank == 2 else 1) * int(inputs[0].shape[-1])
        if uses_factor_form(deltas, width):  # the calls' patches concatenated along the positions
            all_patches = tf.concat([patches(layer, call_inputs) for call_inputs in inputs], axis=1)
            return [(variables, FactorBlock(all_patches, deltas, layer.use_bias))]
        contract = lambda chunk, chunk_deltas: kernel_rows(layer, chunk, chunk_deltas)  # noqa: E731
        pieces = [explicit_gradients(inputs, deltas, contract=contract, input_width=width)]
        if layer.use_bias:
            pieces.append(tf.reduce_sum(deltas, axis=1))
        sizes = [int(v.shape.num_elements()) for v in variables]
        return [(variables, ExplicitBlock(tf.concat(pieces, axis=1), sizes))]


registry.register(ConvolutionRule())
