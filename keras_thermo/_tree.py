"""Flatten / unflatten of variable lists: one flat vector for a list of tensors, in row-major
order and list order, and back. Samplers, the per-example statistics (whose columns follow this
order) and the posterior's sample store all use it.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf


def flatten(tensors: Sequence[Any]) -> tf.Tensor:
    """Concatenates a list of tensors into one flat vector.

    Each tensor is flattened in row-major (C) order and the pieces are
    concatenated in list order; :func:`unflatten` inverts this exactly.

    Args:
        tensors: non-empty sequence of tensors or variables, all of one dtype.

    Returns:
        A rank-1 tensor with ``sum(size(t))`` entries.

    Raises:
        ValueError: if ``tensors`` is empty.
        TypeError: if the dtypes differ.

    Example:
        >>> import tensorflow as tf
        >>> flatten([tf.ones([2, 2]), tf.zeros([3])]).shape
        TensorShape([7])
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("flatten: `tensors` is empty; expected at least one tensor.")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(
            "flatten: all tensors must share one dtype; got "
            f"{sorted(d.name for d in dtypes)}."
        )
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(vector: Any, like: Sequence[Any]) -> list[tf.Tensor]:
    """Splits a flat vector into tensors shaped like ``like`` (inverse of flatten).

    Args:
        vector: rank-1 tensor with as many entries as ``like`` has in total.
        like: sequence of tensors or variables with fully known static shapes
            (for example ``model.trainable_variables``).

    Returns:
        A list of tensors with the shapes of ``like``, in its order, and the
        dtype of ``vector``.

    Raises:
        ValueError: if ``vector`` is not rank 1, a shape in ``like`` is not
            fully known, or the sizes do not add up.

    Example:
        >>> import tensorflow as tf
        >>> parts = unflatten(tf.range(7.0), [tf.ones([2, 2]), tf.ones([3])])
        >>> [p.shape.as_list() for p in parts]
        [[2, 2], [3]]
    """
    vector = tf.convert_to_tensor(vector)
    if vector.shape.rank != 1:
        raise ValueError(
            f"unflatten: `vector` must be rank 1; got shape {vector.shape}."
        )
    shapes = [tf.TensorShape(t.shape) for t in like]
    for index, shape in enumerate(shapes):
        if not shape.is_fully_defined():
            raise ValueError(
                f"unflatten: `like[{index}]` has shape {shape}; all shapes "
                "must be fully known."
            )
    sizes = [shape.num_elements() for shape in shapes]
    length = vector.shape[0]
    if length is not None and length != sum(sizes):
        raise ValueError(
            f"unflatten: `vector` has {length} entries but `like` holds "
            f"{sum(sizes)}."
        )
    pieces = tf.split(vector, sizes) if sizes else []
    return [tf.reshape(piece, shape) for piece, shape in zip(pieces, shapes)]
