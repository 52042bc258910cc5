"""`Conv1D` and `Conv2D`: example i's kernel gradient is `P_i^T Delta_i` over the output pixels.

`P_i` (`[T, kh kw c_in]`) holds the input patches the kernel meets at each of the `T` output
positions (strides, dilation and `valid`/`same`/`causal` padding as the layer uses them, from
`tf.image.extract_patches`, whose patch order `(row, column, channel)` is the row-major order of
the kernel `[kh, kw, c_in, c_out]`), and `Delta_i` (`[T, c_out]`) the gradient at the
pre-activation. `T^2 (d + p)` far exceeds `d p` for convolutions, so the rows are formed
explicitly (`einsum('ntd,ntp->ndp')`), in chunks of examples when the patches would be large.

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

import keras
import tensorflow as tf

from keras_thermo.per_example import engine
from keras_thermo.per_example.rules.dense import shared_kernel_blocks, unsupported_variant


def patches(layer, inputs: tf.Tensor) -> tf.Tensor:
    """`[n, T, kh kw c_in]`: the input patches of every output position of a channels-last
    `Conv1D`/`Conv2D` layer."""
    if layer.rank == 1:
        if layer.padding == "causal":
            left = layer.dilation_rate[0] * (layer.kernel_size[0] - 1)
            inputs = tf.pad(inputs, [[0, 0], [left, 0], [0, 0]])
        images = inputs[:, tf.newaxis]  # [n, 1, L, c]
        sizes, strides, rates = (1, *layer.kernel_size), (1, *layer.strides), (1, *layer.dilation_rate)
    else:
        images = inputs
        sizes, strides, rates = layer.kernel_size, layer.strides, layer.dilation_rate
    padding = "SAME" if layer.padding == "same" else "VALID"
    extracted = tf.image.extract_patches(
        images, sizes=[1, *sizes, 1], strides=[1, *strides, 1], rates=[1, *rates, 1], padding=padding
    )
    pixels = extracted.shape[1:-1]
    if pixels.is_fully_defined():
        return tf.reshape(extracted, [-1, int(pixels.num_elements()), int(extracted.shape[-1])])
    return tf.reshape(extracted, [tf.shape(inputs)[0], -1, int(extracted.shape[-1])])


class ConvolutionRule(engine.LayerRule):
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
        calls = [{"patches": patches(layer, call["inputs"]), "d_z": call["d_z"]} for call in calls]
        return shared_kernel_blocks(calls, "patches", "d_z", variables, layer.use_bias)


engine.register(ConvolutionRule())
