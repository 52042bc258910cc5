"""`keras_thermo.regression.SharedNoiseScale`: `y = [means, 0 * means + r]`, one raw noise scale
`r` per target shared by every input.

Example i's gradient of `r` is `sum delta_i` over the positions between the batch axis and the
last (`delta_i = d l_i / d y_i` at the raw-scale columns); the rows (`[n, D]`) are formed
explicitly. The layer couples no examples.

Example:
    >>> import keras_thermo as kt
    >>> from keras_thermo.per_example.engine import rule_for
    >>> type(rule_for(kt.regression.SharedNoiseScale())).__name__
    'SharedNoiseScaleRule'
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo.losses import SharedNoiseScale
from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import ExplicitBlock


class SharedNoiseScaleRule(registry.LayerRule):
    layer_types = (SharedNoiseScale,)

    def forward(self, layer, call, means, *args, **kwargs):
        means = tf.convert_to_tensor(means)
        dtype = tf.float64 if means.dtype == tf.float64 else tf.float32
        scales = call.watch("scales", tf.zeros_like(means, dtype) + tf.cast(layer.raw_scale, dtype))
        return tf.cast(tf.concat([tf.cast(means, dtype), scales], axis=-1), layer.compute_dtype)

    def blocks(self, layer, calls):
        size = int(layer.raw_scale.shape.num_elements())
        rows = 0.0
        for call in calls:
            gradients = call["d_scales"]
            between = list(range(1, gradients.shape.rank - 1))
            rows += tf.reshape(tf.reduce_sum(gradients, axis=between) if between else gradients, [-1, size])
        return [([layer.raw_scale], ExplicitBlock(rows, [size]))]


registry.register(SharedNoiseScaleRule())
