"""The checks a sampling step makes on the values it computed: whether they are finite (the NaN
guard of `keras_thermo.step`) and whether the net's outputs still differ across the batch (the
collapse signal). Each is one reduction over arrays the step has already computed.
"""

from __future__ import annotations

import tensorflow as tf


#: Outputs whose spread over a batch is below this fraction of their size count as identical:
#: identical rows pushed through matrix products differ by a few float32 roundings (~1e-7).
COLLAPSED_RELATIVE_SPREAD = 1e-5


def output_spread(x, y_pred) -> tf.Tensor:
    """How much the net's outputs differ across the batch, relative to their size: the largest
    range (max - min over the batch) of any output unit over `1 + max |output|`. NaN when that is
    at most `COLLAPSED_RELATIVE_SPREAD` and the inputs are identical across the batch (or the
    batch has one example): then equal outputs say nothing."""

    def rows(tree):
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tree) if t is not None]
        return [
            tf.reshape(tf.cast(t, tf.float32), [tf.shape(t)[0], -1]) for t in leaves
            if t.dtype.is_floating or t.dtype.is_integer
        ]

    def largest_range(tensors):
        return tf.reduce_max(tf.stack([tf.reduce_max(tf.reduce_max(t, 0) - tf.reduce_min(t, 0)) for t in tensors]))

    outputs = rows(y_pred)
    size = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(t)) for t in outputs]))
    spread = largest_range(outputs) / (1.0 + size)
    inputs = rows(x)
    if not inputs:
        return spread

    def unless_inputs_identical():
        return tf.where(largest_range(inputs) > 0, spread, tf.constant(float("nan")))

    # The inputs are read only when the outputs look collapsed: a pass over the batch otherwise
    # spent on every step.
    return tf.cond(spread <= COLLAPSED_RELATIVE_SPREAD, unless_inputs_identical, lambda: spread)


def all_finite(tensors) -> tf.Tensor:
    """Whether every entry of every float tensor is finite (a boolean scalar).

    One sum per tensor, in its own dtype, then added in float64: an infinite or NaN entry makes
    its tensor's sum non-finite. The sum reads each entry once and writes nothing the size of the
    tensor (the cheapest pass a check can make; `reduce_all(is_finite(t))` costs several times
    more on a CPU, `python -m benchmarks.lab.step_pieces`). It also reads as non-finite a tensor
    whose finite entries sum beyond the dtype's range (about 3e38 for float32): a chain there
    has diverged in all but name, and its next step would overflow anyway.

    Example:
        >>> bool(all_finite([tf.constant([1.0, -2.0]), tf.constant(3.0, tf.float64)]))
        True
        >>> bool(all_finite([tf.constant([1.0, float("inf")])]))
        False
        >>> bool(all_finite([tf.constant([float("inf"), -float("inf")])]))
        False
    """
    sums = [tf.cast(tf.reduce_sum(tensor), tf.float64) for tensor in tensors]
    return tf.math.is_finite(tf.add_n(sums))
