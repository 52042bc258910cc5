"""`Embedding`: example i's gradient is `sum_t e_{id_it} delta_it^T`, nonzero on its tokens only.

The rows are summed per (example, token) over the tokens present in the batch (segment sums,
`U <= min(V, n T)` distinct tokens), giving explicit rows `[n, U, dim]`; the `V - U` tokens that
do not occur have zero gradient for every example and add nothing to any statistic. A dense
`[n, V, dim]` tensor is never formed. Distinct tokens are found by sorting (`argsort`), which
keeps every shape static when the batch shape is (XLA).

Example:
    >>> import tensorflow as tf
    >>> rows, ids = rows_over_present_tokens(tf.constant([[3, 1, 3]]), tf.ones([1, 3, 2]), 10)
    >>> ids.numpy().tolist(), rows.numpy().tolist()   # token 1 once, token 3 twice
    [1, 3, 0], [[[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]]
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import SparseRowsBlock
from keras_thermo.per_example.rules.dense import unsupported_variant


def rows_over_present_tokens(ids: tf.Tensor, deltas: tf.Tensor, num_ids: int) -> tuple[tf.Tensor, tf.Tensor]:
    """`([n, U, dim] rows, [U] token ids)` from ids `[n, T]` and `deltas` `[n, T, dim]`.

    `U = min(num_ids, n T)` (slots beyond the distinct tokens are zero rows with id 0).
    """
    n = tf.shape(ids)[0]
    flat = tf.reshape(tf.cast(ids, tf.int32), [-1])
    total = flat.shape[0]
    order = tf.argsort(flat, stable=True)
    sorted_ids = tf.gather(flat, order)
    is_new = tf.concat([[True], sorted_ids[1:] != sorted_ids[:-1]], axis=0)
    sorted_slots = tf.cumsum(tf.cast(is_new, tf.int32)) - 1
    slots_of = tf.scatter_nd(order[:, tf.newaxis], sorted_slots, tf.shape(flat))
    # Slots depend on shapes only, not on the ids, so XLA sees static sizes.
    slots = min(num_ids, total) if total is not None else tf.minimum(num_ids, tf.size(flat))
    present = tf.maximum(tf.math.unsorted_segment_max(flat, slots_of, slots), 0)  # empty: id 0
    width = int(deltas.shape[-1])
    positions = tf.shape(flat)[0] // n
    examples = tf.repeat(tf.range(n), positions)
    rows = tf.math.unsorted_segment_sum(
        tf.reshape(deltas, [-1, width]), examples * slots + slots_of, n * slots
    )
    return tf.reshape(rows, [n, slots, width]), present


def _per_example(tensor: tf.Tensor, width: int | None = None) -> tf.Tensor:
    """`[n, ...]` -> `[n, T]` (or `[n, T, width]`), static where the shape is."""
    tail = [] if width is None else [width]
    middle = tensor.shape[1:] if width is None else tensor.shape[1:-1]
    if middle.is_fully_defined():
        return tf.reshape(tensor, [-1, int(middle.num_elements()), *tail])
    return tf.reshape(tensor, [tf.shape(tensor)[0], -1, *tail])


class EmbeddingRule(registry.LayerRule):
    layer_types = (keras.layers.Embedding,)

    def unsupported(self, layer):
        return unsupported_variant(layer)

    def forward(self, layer, call, inputs, *args, **kwargs):
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        call.save("ids", inputs)
        outputs = call.watch("outputs", keras.ops.take(layer.embeddings, inputs, axis=0))
        return keras.ops.cast(outputs, layer.compute_dtype)

    def blocks(self, layer, calls):
        width = int(layer.output_dim)
        ids = tf.concat([_per_example(call["ids"]) for call in calls], axis=1)
        deltas = tf.concat([_per_example(call["d_outputs"], width) for call in calls], axis=1)
        rows, present = rows_over_present_tokens(ids, deltas, int(layer.input_dim))
        return [([layer.embeddings], SparseRowsBlock(rows, present, int(layer.input_dim)))]


registry.register(EmbeddingRule())
