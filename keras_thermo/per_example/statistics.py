"""The statistics the covariance-controlled samplers take from per-example gradients.

The rows of `G` (`[n, Nd]`) are the per-example gradients `w_i grad l_i` of a minibatch; its
columns follow `model.trainable_variables`, each variable flattened row-major (`flatten`). Layer
regularization losses and the prior are the same for every example: they shift every row by
the same vector, which cancels in `Gc = G - mean(G)`, so they are left out of `G`. The samplers
never touch rows; they ask an object with these members for what they need:

* `count`: n, the examples of the global batch;
* `diagonal_covariance()`: `diag(V)`, `V = Gc^T Gc / (n - 1)`, in a two-pass or shifted form
  that keeps float32 accuracy where a mean gradient dominates its spread;
* `full_covariance()`: `V` itself (small models);
* `covariance_factor()`: `Gc` as a `keras_thermo.linalg.operators.CenteredRows` (`Gc v`,
  `Gc^T z`, the `n x n` Gram matrix, `||Gc||_F^2`), the operand of mCCAdL's C step;
* `covariance_trace()`: `tr(V)`.

Two implementations: `PerExampleGradients` over explicit rows (the vectorized path), and
`LayerStatistics` over per-layer column blocks (`keras_thermo.per_example.blocks`, built by the
engine), which never forms `G` unless a layer's rule chose explicit rows for its own columns.
Under `tf.distribute` both give the statistics of the global batch.

Reference: the covariance estimate is that of Shang, Zhu, Leimkuhler & Storkey (2015),
"Covariance-Controlled Adaptive Langevin Thermostat for Large-Scale Bayesian Sampling",
NeurIPS, Sec. 3.1, eq. (19).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import tensorflow as tf

from keras_thermo._tree import flatten, unflatten  # noqa: F401 (the column order; their home is _tree)
from keras_thermo.linalg.operators import CenteredRows, symmetrized
from keras_thermo.per_example.blocks import ColumnBlock, centered_over_rows


def _check_rows(g: tf.Tensor, name: str) -> tf.Tensor:
    g = tf.convert_to_tensor(g)
    if g.shape.rank != 2:
        raise ValueError(
            f"{name}: `g` must have shape [n, Nd] (rank 2); got shape {g.shape}."
        )
    return g


def centered(g: Any) -> tf.Tensor:
    """``G - mean(G)``: each column minus its mean over the examples.

    Args:
        g: per-example gradients, shape ``[n, Nd]``.

    Returns:
        ``Gc`` of the same shape; the sum of its rows is zero.

    Example:
        >>> import tensorflow as tf
        >>> centered(tf.constant([[1.0, 2.0], [3.0, 6.0]])).numpy().tolist()
        [[-1.0, -2.0], [1.0, 2.0]]
    """
    return centered_over_rows(_check_rows(g, "centered"))


def _check_static_count(count: Any, owner: str) -> None:
    """Refuses a global batch known now (`count` a Python int; a tensor is checked when the graph
    runs) to hold fewer than the 2 examples a covariance estimate needs."""
    if isinstance(count, int) and count < 2:
        raise ValueError(
            f"{owner}: estimating the gradient-noise covariance needs a (global) batch of at "
            f"least 2 examples; got n={count}."
        )


def diagonal_covariance(g: Any) -> tf.Tensor:
    """Per-coordinate empirical variance of the rows, ``(n - 1)`` denominator.

    This is the diagonal of :func:`full_covariance` without forming it. Both are
    ``PerExampleGradients(g)``'s statistics: inside a ``tf.distribute`` replica
    context they are those of the global batch.

    Args:
        g: per-example gradients, shape ``[n, Nd]`` with ``n >= 2``.

    Returns:
        Variances, shape ``[Nd]``.

    Raises:
        ValueError: if ``g`` is not rank 2 or has fewer than 2 rows.

    Example:
        >>> import tensorflow as tf
        >>> diagonal_covariance(tf.constant([[1.0, 0.0], [3.0, 0.0]])).numpy()
        array([2., 0.], dtype=float32)
    """
    return PerExampleGradients(g).diagonal_covariance()


def full_covariance(g: Any) -> tf.Tensor:
    """Empirical covariance ``V = Gc^T Gc / (n - 1)`` of the rows.

    Forms a ``[Nd, Nd]`` matrix: meant for small models and tests. The C step
    of mCCAdL never forms it (see ``keras_thermo.linalg``).

    Args:
        g: per-example gradients, shape ``[n, Nd]`` with ``n >= 2``.

    Returns:
        The covariance, shape ``[Nd, Nd]``, symmetric positive semidefinite
        with rank at most ``n - 1``.

    Raises:
        ValueError: if ``g`` is not rank 2 or has fewer than 2 rows.

    Example:
        >>> import tensorflow as tf
        >>> full_covariance(tf.constant([[1.0, 2.0], [3.0, 6.0]])).numpy()
        array([[2., 4.],
               [4., 8.]], dtype=float32)
    """
    return PerExampleGradients(g).full_covariance()


class PerExampleGradients:
    """The per-example gradients of one minibatch and the statistics samplers take from them.

    Samplers never touch the rows directly: they ask for the covariance estimate they need, so the
    same sampler code runs on one device and under `tf.distribute`, where each replica holds the
    rows of its slice of the global batch. Statistics are always those of the global batch:

    * `diagonal_covariance()`: two all-reduces of an `[Nd]` vector (the global mean, then the
      centered sums of squares), so the result equals the single-device one;
    * `full_covariance()`: the global mean plus one all-reduce of `[Nd, Nd]`;
    * `covariance_factor()`: the global `Gc` (`[n, Nd]`, every replica's centered rows gathered
      in replica order), the operand of mCCAdL's C step. One all-gather of `n * Nd` floats per
      step: the adaptive Taylor loop cannot all-reduce inside its `tf.while_loop` under
      `MirroredStrategy`, so the rows travel once instead.

    Other representations (for example the per-layer factors of `Dense` networks) provide the
    same members: `count`, `diagonal_covariance()`, `full_covariance()`, `covariance_factor()`
    (anything `keras_thermo.linalg.expm_action` accepts as `gc`) and `covariance_trace()`.

    Args:
        rows: `G`, `[n, Nd]` per-example gradients of this replica's examples (cast to float32).
        cross_replica: A `keras_thermo._distribute.CrossReplica`; None creates one for the current
            context (the identity outside a strategy).

    Example:
        >>> import tensorflow as tf
        >>> g = PerExampleGradients(tf.constant([[1.0, 2.0], [3.0, 6.0]]))
        >>> float(g.count), g.diagonal_covariance().numpy().tolist()
        (2.0, [2.0, 8.0])
    """

    def __init__(self, rows: Any, cross_replica: Any = None):
        from keras_thermo._distribute import CrossReplica  # noqa: PLC0415 (tiny module)

        self._rows = _check_rows(rows, "PerExampleGradients")
        if not self._rows.dtype.is_floating:
            raise TypeError(
                "PerExampleGradients: `rows` must be a floating tensor [n, Nd]; got dtype "
                f"{self._rows.dtype.name}."
            )
        self._cross = cross_replica if cross_replica is not None else CrossReplica()
        local = self._rows.shape[0]
        self._static_count = None if local is None else local * self._cross.num_replicas
        _check_static_count(self._static_count, "PerExampleGradients")
        self._mean = None
        self._factor = None

    @property
    def count(self) -> tf.Tensor:
        """n, the number of examples in the global batch (scalar in the rows' dtype)."""
        dtype = self._rows.dtype
        if self._static_count is not None:
            return tf.constant(float(self._static_count), dtype)
        count = self._cross.sum(tf.cast(tf.shape(self._rows)[0], dtype))
        # Unknown batch size at trace time: checked when the graph runs (XLA drops asserts;
        # the batch size there is static in practice).
        check = tf.debugging.assert_greater_equal(
            count, tf.constant(2.0, dtype), message="PerExampleGradients: needs at least 2 examples"
        )
        with tf.control_dependencies([check]):
            return tf.identity(count)

    def _centered_local(self) -> tf.Tensor:
        if self._mean is None:
            self._mean = self._cross.sum(tf.reduce_sum(self._rows, axis=0)) / self.count
        return self._rows - self._mean

    def diagonal_covariance(self) -> tf.Tensor:
        """`diag(V)`, `[Nd]`, with `V = Gc^T Gc / (n - 1)` over the global batch."""
        squares = tf.reduce_sum(tf.square(self._centered_local()), axis=0)
        return self._cross.sum(squares) / (self.count - 1.0)

    def variable_diagonal_covariances(self, like) -> list[tf.Tensor]:
        """`diag(V)` per variable, shaped like each of `like` (the trainable variables)."""
        return unflatten(self.diagonal_covariance(), like)

    def full_covariance(self) -> tf.Tensor:
        """`V`, `[Nd, Nd]` (small models only)."""
        local = self._centered_local()
        product = tf.matmul(local, local, transpose_a=True)
        return self._cross.sum(product) / (self.count - 1.0)

    def covariance_factor(self) -> tf.Tensor:
        """`Gc`, the `[n, Nd]` centered rows of the global batch: `V = Gc^T Gc / (n - 1)`."""
        if self._factor is None:
            self._factor = self._cross.gather_rows(self._centered_local())
        return self._factor

    def covariance_trace(self) -> tf.Tensor:
        """`tr(V) = ||Gc||_F^2 / (n - 1)` (from the gathered factor: no further communication)."""
        return tf.reduce_sum(tf.square(self.covariance_factor())) / (self.count - 1.0)


#: Where each variable's columns live: per model variable, (block index, slot within the block).
Placement = tuple[tuple[int, int], ...]


class LayerRows(CenteredRows):
    """`Gc`, the centered per-example gradients, as column blocks (one or more per layer).

    `G = [G_1 ... G_L]` up to a permutation of the variables: block `b` holds the variables
    whose `placement` entries name it, in its own slot order; products split and reassemble
    vectors in the order of the model's variables. `Gc = H G` with `H = I - 11^T / n`:
    `Gc v = H (G v)`, `Gc^T z = G^T (H z)`, `Gc Gc^T = H K H` with `K = sum_b G_b G_b^T`.

    Args:
        blocks: the `ColumnBlock`s, all with the same rows and dtype.
        placement: per model variable, `(block, slot)`; every slot of every block once.

    Example:
        >>> import tensorflow as tf
        >>> from keras_thermo.per_example.blocks import ExplicitBlock
        >>> rows = LayerRows([ExplicitBlock(tf.constant([[1.0], [3.0]]), (1,))], ((0, 0),))
        >>> rows.to_dense().numpy().tolist()
        [[-1.0], [1.0]]
    """

    def __init__(self, blocks: Sequence[ColumnBlock], placement: Placement):
        self._blocks = list(blocks)
        self._placement = tuple((int(b), int(s)) for b, s in placement)
        slots = sorted(self._placement)
        expected = sorted((b, s) for b, block in enumerate(self._blocks) for s in range(len(block.sizes)))
        if slots != expected:
            raise ValueError(
                f"LayerRows: `placement` must name every slot of every block once; got {self._placement} "
                f"for blocks of sizes {[block.sizes for block in self._blocks]}."
            )

    # -- layout ------------------------------------------------------------------------------

    @property
    def num_rows(self) -> Any:
        return self._blocks[0].num_rows

    @property
    def num_cols(self) -> int:
        return sum(block.num_cols for block in self._blocks)

    @property
    def dtype(self) -> tf.DType:
        return tf.float32

    @property
    def blocks(self) -> list[ColumnBlock]:
        return list(self._blocks)

    def _variable_sizes(self) -> list[int]:
        return [self._blocks[b].sizes[s] for b, s in self._placement]

    def _in_model_order(self) -> bool:
        return list(self._placement) == [
            (b, s) for b, block in enumerate(self._blocks) for s in range(len(block.sizes))
        ]

    def _split_by_block(self, block: tf.Tensor) -> list[tf.Tensor]:
        """A `[D, k]` block in model order -> per column block, its rows in slot order."""
        if self._in_model_order():
            return tf.split(block, [b.num_cols for b in self._blocks], axis=0)
        pieces = tf.split(block, self._variable_sizes(), axis=0)
        by_slot = {key: piece for key, piece in zip(self._placement, pieces)}
        return [
            tf.concat([by_slot[(b, s)] for s in range(len(column.sizes))], axis=0)
            for b, column in enumerate(self._blocks)
        ]

    def _join_by_variable(self, per_block: list[tf.Tensor]) -> tf.Tensor:
        """Per column block `[D_b, ...]` -> one tensor in model order."""
        if self._in_model_order():
            return tf.concat(per_block, axis=0)
        slots = {}
        for b, (column, values) in enumerate(zip(self._blocks, per_block)):
            for s, piece in enumerate(tf.split(values, list(column.sizes), axis=0)):
                slots[(b, s)] = piece
        return tf.concat([slots[key] for key in self._placement], axis=0)

    # -- CenteredRows ------------------------------------------------------------------------

    def matvec(self, block: tf.Tensor) -> tf.Tensor:
        """`Gc @ block` for a `[D, k]` block: `[n, k]`."""
        pieces = self._split_by_block(block)
        total = tf.add_n([column.matvec(piece) for column, piece in zip(self._blocks, pieces)])
        return centered_over_rows(total)

    def rmatvec(self, block: tf.Tensor) -> tf.Tensor:
        """`Gc^T @ block` for an `[n, k]` block: `[D, k]`."""
        block = centered_over_rows(block)  # Gc^T z = G^T (H z)
        return self._join_by_variable([column.rmatvec(block) for column in self._blocks])

    def gram(self) -> tf.Tensor:
        """`Gc Gc^T = H K H`, `[n, n]`, exactly symmetric."""
        total = tf.add_n([column.gram() for column in self._blocks])
        total = centered_over_rows(total)
        total = total - tf.reduce_mean(total, axis=1, keepdims=True)
        return symmetrized(total)

    def frobenius_squared(self) -> tf.Tensor:
        """`||Gc||_F^2`, each block in its accurate form."""
        return tf.add_n([column.centered_frobenius_squared() for column in self._blocks])

    def column_sums_of_squares(self) -> tf.Tensor:
        """`diag(Gc^T Gc)`, `[D]`, in model order."""
        return self._join_by_variable([column.centered_column_squares() for column in self._blocks])

    def column_sums_of_squares_by_variable(self) -> list[tf.Tensor]:
        """`diag(Gc^T Gc)` per model variable (flat), without joining them into one `[D]`
        vector (a concatenation is a pass over all of it)."""
        slots = {}
        for b, column in enumerate(self._blocks):
            for s, piece in enumerate(column.centered_column_squares_by_slot()):
                slots[(b, s)] = piece
        return [slots[key] for key in self._placement]

    def to_dense(self) -> tf.Tensor:
        """`Gc` as an `[n, D]` tensor (small models and tests)."""
        rows = [tf.transpose(column.rows()) for column in self._blocks]
        return centered_over_rows(tf.transpose(self._join_by_variable(rows)))

    def gram_method_cost(self) -> tf.Tensor:
        """The Gram method in products with `S`: `1 + (K + eigh) / product`.

        Each block's `product_flops` (a product with `Gc` and one with `Gc^T`) and `gram_flops`
        (`K`), and `9 n^3` flops for `eigh`. For `Dense` layers kept as factors a product costs
        `4 n d p` and `K` `2 n^2 (d + p)` (the factors fit in cache); for the EMNIST MLP at
        n = 128 the Gram method costs about 2.2 products, where the dense-matrix model of
        `keras_thermo.linalg.gram` would charge 9.
        """
        n = tf.cast(self.num_rows, tf.float64)
        static = tf.get_static_value(n)
        count = float(static) if static is not None else None
        if count is None:  # batch size known only at run time: the costs as tensors
            product = tf.add_n([tf.cast(b.product_flops(1.0), tf.float64) * n for b in self._blocks])
            gram = tf.add_n([tf.cast(b.gram_flops(1.0), tf.float64) * n * n for b in self._blocks])
        else:
            product = tf.constant(sum(b.product_flops(count) for b in self._blocks), tf.float64)
            gram = tf.constant(sum(b.gram_flops(count) for b in self._blocks), tf.float64)
        return 1.0 + (gram + 9.0 * n * n * n) / tf.maximum(product, 1.0)

    # -- nest protocol -----------------------------------------------------------------------

    def __tf_flatten__(self) -> tuple[Hashable, Sequence[tf.Tensor]]:
        metadata, components = [], []
        for column in self._blocks:
            column_metadata, column_components = column.__tf_flatten__()
            metadata.append((type(column), column_metadata, len(column_components)))
            components += list(column_components)
        return (tuple(metadata), self._placement), tuple(components)

    @classmethod
    def __tf_unflatten__(cls, metadata: Hashable, components: Sequence[tf.Tensor]) -> "LayerRows":
        rows = cls.__new__(cls)  # TensorFlow may rebuild with placeholders: skip the checks
        block_metadata, rows._placement = metadata
        rows._blocks, start = [], 0
        for block_type, column_metadata, count in block_metadata:
            rows._blocks.append(block_type.__tf_unflatten__(column_metadata, components[start:start + count]))
            start += count
        return rows


class LayerStatistics:
    """Per-example gradient statistics of a minibatch from per-layer column blocks.

    The same members as `PerExampleGradients`, so samplers use either without knowing which:
    `count`, `diagonal_covariance()`, `full_covariance()`, `covariance_factor()` (a `LayerRows`
    operator, which `keras_thermo.linalg.expm_action` accepts as `gc`) and
    `covariance_trace()`. Built by `keras_thermo.per_example.engine.layer_statistics` from the
    global batch (under `tf.distribute` the engine gathers the layers' factors once), so every
    statistic is computed locally with no further communication.

    Args:
        rows: the `LayerRows` of the global batch.

    Raises:
        ValueError: a global batch of fewer than 2 examples.

    Example:
        >>> import tensorflow as tf
        >>> from keras_thermo.per_example.blocks import FactorBlock
        >>> block = FactorBlock(tf.constant([[[1.0]], [[2.0]]]), tf.constant([[[1.0]], [[3.0]]]), True)
        >>> stats = LayerStatistics(LayerRows([block], ((0, 0), (0, 1))))
        >>> float(stats.count), stats.diagonal_covariance().numpy().tolist()  # G = [[1, 1], [6, 3]]
        (2.0, [12.5, 2.0])
    """

    def __init__(self, rows: LayerRows):
        _check_static_count(rows.num_rows, "LayerStatistics")
        self._rows = rows
        self._column_squares = None

    @property
    def count(self) -> tf.Tensor:
        """n, the number of examples in the global batch (float32 scalar)."""
        return tf.cast(self._rows.num_rows, tf.float32)

    def diagonal_covariance(self) -> tf.Tensor:
        """`diag(V)`, `[Nd]`, in the order of the flattened trainable variables."""
        if self._column_squares is None:
            self._column_squares = self._rows.column_sums_of_squares()
        return self._column_squares / (self.count - 1.0)

    def variable_diagonal_covariances(self, like) -> list[tf.Tensor]:
        """`diag(V)` per variable, shaped like each of `like` (the trainable variables): the
        same numbers as `diagonal_covariance`, without its `[Nd]` concatenation and split."""
        return [tf.reshape(squares / (self.count - 1.0), v.shape)
                for squares, v in zip(self._rows.column_sums_of_squares_by_variable(), like)]

    def full_covariance(self) -> tf.Tensor:
        """`V`, `[Nd, Nd]` (forms `Gc`: small models only)."""
        centered = self._rows.to_dense()
        return tf.matmul(centered, centered, transpose_a=True) / (self.count - 1.0)

    def covariance_factor(self) -> LayerRows:
        """`Gc` as a `LayerRows` operator: `V = Gc^T Gc / (n - 1)`."""
        return self._rows

    def covariance_trace(self) -> tf.Tensor:
        """`tr(V) = ||Gc||_F^2 / (n - 1)`."""
        return self._rows.frobenius_squared() / (self.count - 1.0)
