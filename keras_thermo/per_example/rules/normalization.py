"""`LayerNormalization`: `y = xhat * gamma + beta`, `xhat` normalized over the layer's axes.

Example i's gradients are `sum xhat_i * delta_i` (gamma) and `sum delta_i` (beta), summed over
the positions outside the normalized axes, with `delta_i = d l_i / d y_i`; the rows (as many
entries as gamma) are formed explicitly. The statistics of a layer normalization are those of
one example, so it couples no examples. `BatchNormalization` needs no rule: frozen
(`trainable=False`) it has no trainable variables and runs in inference mode, passed through;
in training mode it couples the examples and is refused by name
(`keras_thermo.per_example.checks`).

Example:
    >>> import keras, tensorflow as tf
    >>> from keras_thermo.per_example.engine import rule_for
    >>> type(rule_for(keras.layers.LayerNormalization())).__name__
    'LayerNormalizationRule'
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import ExplicitBlock


def _axes(layer, rank: int) -> list[int]:
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    return sorted(a % rank for a in axes)


class LayerNormalizationRule(registry.LayerRule):
    layer_types = (keras.layers.LayerNormalization,)

    def forward(self, layer, call, inputs, *args, **kwargs):
        rank = inputs.shape.rank
        axes = _axes(layer, rank)
        x = tf.cast(inputs, tf.float64 if inputs.dtype == tf.float64 else tf.float32)
        broadcast = [1] * rank
        for axis in axes:
            broadcast[axis] = x.shape[axis]
        mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
        inverse = tf.math.rsqrt(variance + layer.epsilon)
        normalized = x * inverse if layer.rms_scaling else (x - mean) * inverse
        normalized = call.save("normalized", normalized)
        outputs = normalized
        if layer.gamma is not None:
            outputs = outputs * tf.reshape(tf.cast(layer.gamma, x.dtype), broadcast)
        if layer.beta is not None:
            outputs = outputs + tf.reshape(tf.cast(layer.beta, x.dtype), broadcast)
        outputs = call.watch("outputs", outputs)
        return tf.cast(outputs, layer.compute_dtype)

    def blocks(self, layer, calls):
        rank = calls[0]["normalized"].shape.rank
        outside = [a for a in range(1, rank) if a not in _axes(layer, rank)]
        variables, columns = [], []
        for variable, factor in ((layer.gamma, "normalized"), (layer.beta, None)):
            if variable is None or not variable.trainable:
                continue
            rows = 0.0
            for call in calls:
                values = call["d_outputs"] if factor is None else call[factor] * call["d_outputs"]
                summed = tf.reduce_sum(values, axis=outside) if outside else values
                rows += tf.reshape(summed, [-1, int(variable.shape.num_elements())])
            variables.append(variable)
            columns.append(rows)
        return [(variables, ExplicitBlock(tf.concat(columns, axis=1), [int(v.shape.num_elements()) for v in variables]))]


registry.register(LayerNormalizationRule())
