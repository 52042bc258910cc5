"""Matrix-free operands for `keras_thermo.linalg`: an `[n, D]` matrix known by its products.

The expm-action routines only ever need four things from the centered per-example gradients
`Gc` (`n` rows, `D` columns): the products `Gc u` and `Gc^T z`, the Gram matrix `Gc Gc^T` and
`||Gc||_F^2`. `CenteredRows` is that interface. `MatrixRows` implements it for a dense tensor
(what `expm_action` builds from a tensor `gc`); other representations, such as the per-layer
factors of a network of `Dense` layers (`keras_thermo.per_example.dense_layers`), implement it without
ever forming the `[n, D]` matrix.

Operators travel through `tf.function` and `tf.while_loop` as nested structures: each one
splits into its tensors and a hashable description of everything static
(`__tf_flatten__` / `__tf_unflatten__`, TensorFlow's custom nest protocol), so a compiled
routine is traced once per operator type and shape, not once per object.

Example:
    >>> import tensorflow as tf
    >>> rows = MatrixRows(tf.constant([[1.0, 2.0], [-1.0, -2.0]]))
    >>> rows.num_rows, rows.num_cols, float(rows.frobenius_squared())
    (2, 2, 10.0)
    >>> rows.matvec(tf.constant([[1.0], [1.0]])).numpy().ravel().tolist()
    [3.0, -3.0]
"""

from __future__ import annotations

import abc
from typing import Any, Hashable, Sequence

import tensorflow as tf


def symmetrized(square: tf.Tensor) -> tf.Tensor:
    """`(K + K^T) / 2`: a Gram matrix computed in floating point, made exactly symmetric."""
    return 0.5 * (square + tf.transpose(square))


def row_gram(matrix: tf.Tensor) -> tf.Tensor:
    """`X X^T` of an `[n, D]` matrix (as computed: symmetric up to rounding).

    An einsum rather than `tf.matmul(X, X, transpose_b=True)`: for wide per-example rows (n in
    the tens to hundreds, D from ~10^4 to ~10^5) TensorFlow's einsum kernel (a batched product)
    ran 1.4-2.2x faster than the matmul kernel on 2 CPU cores (1.2x at D = 2320), same sums to
    float32 rounding (docs/notes/c_step.md: the LSTM's recurrent-kernel rows, `[64, 65536]`,
    6.6 -> 3.1 ms). For `X^T X` (`n > D`) the two were equal, so `column_gram_matrix` keeps
    `matmul`.

    Example:
        >>> row_gram(tf.constant([[1.0, 2.0], [0.0, 3.0]])).numpy().tolist()
        [[5.0, 6.0], [6.0, 9.0]]
    """
    return tf.einsum("nd,md->nm", matrix, matrix)


def dimension(tensor: tf.Tensor, axis: int) -> Any:
    """The size of `axis`: a Python int where static, a scalar int32 tensor otherwise."""
    static = tensor.shape[axis]
    return static if static is not None else tf.shape(tensor)[axis]


class RowProducts(abc.ABC):
    """An `[n, D]` matrix `X` given through its products with blocks of vectors: the interface
    that `CenteredRows` (the operand of the expm actions) and the per-example column blocks
    (`keras_thermo.per_example.blocks.ColumnBlock`) share.

    Subclasses also implement the custom nest protocol (`__tf_flatten__` returning
    `(static_description, tensors)`, the class method `__tf_unflatten__(static_description,
    tensors)` rebuilding an equal object), so that they can be passed to a `tf.function` and
    carried through `tf.cond`. TensorFlow also calls `__tf_unflatten__` with `tf.TensorSpec`s in
    place of the tensors, so it must store the components as given, without converting or
    checking them.
    """

    @property
    @abc.abstractmethod
    def num_rows(self) -> Any:
        """`n`: Python int if static, scalar int32 tensor otherwise."""

    @abc.abstractmethod
    def matvec(self, block: tf.Tensor) -> tf.Tensor:
        """`X @ block`: `[D, k]` -> `[n, k]`."""

    @abc.abstractmethod
    def rmatvec(self, block: tf.Tensor) -> tf.Tensor:
        """`X^T @ block`: `[n, k]` -> `[D, k]`."""

    @abc.abstractmethod
    def gram(self) -> tf.Tensor:
        """`X X^T`, `[n, n]`."""

    @abc.abstractmethod
    def __tf_flatten__(self) -> tuple[Hashable, Sequence[tf.Tensor]]:
        """`(static description, tensors)`; the description must be hashable."""

    @classmethod
    @abc.abstractmethod
    def __tf_unflatten__(cls, metadata: Hashable, components: Sequence[tf.Tensor]) -> "RowProducts":
        """Rebuilds the object from `__tf_flatten__`'s output."""


class CenteredRows(RowProducts):
    """An `[n, D]` matrix `Gc` (centered per-example gradients) given through its products.

    Subclasses implement the products of `RowProducts` (with `gram()`, `Gc Gc^T`, exactly
    symmetric), its nest protocol, and the members below.

    Attributes:
        num_rows: `n`, a Python int where known statically, else a scalar int32 tensor.
        num_cols: `D`, likewise.
        dtype: the floating dtype of every product (float32 or float64).
    """

    @property
    @abc.abstractmethod
    def num_cols(self) -> Any:
        """`D`: Python int if static, scalar int32 tensor otherwise."""

    @property
    @abc.abstractmethod
    def dtype(self) -> tf.DType:
        """Dtype of the products."""

    @abc.abstractmethod
    def frobenius_squared(self) -> tf.Tensor:
        """`||Gc||_F^2 = tr(Gc Gc^T)`, a scalar of `dtype`."""

    def gram_method_cost(self) -> tf.Tensor | None:
        """Time of the Gram method's fixed work in the row space, in products with
        `S = -tau Gc^T Gc` (float64 scalar): `Gc v`, `Gc^T z` and forming `Gc Gc^T` (its Lanczos
        steps are added by `keras_thermo.linalg.gram.gram_method_cost`), for
        `expm_action(method="auto")` and the `matvecs` count; None (the default) means "as for
        a dense `[n, D]` matrix" (`keras_thermo.linalg.gram.gram_matvec_equivalents`).
        Representations whose Gram matrix is cheap relative to a product override it."""
        return None


class MatrixRows(CenteredRows):
    """`CenteredRows` backed by a dense `[n, D]` tensor (which it does not center: pass `Gc`).

    Args:
        matrix: a rank-2 float32 or float64 tensor (or anything convertible to one).

    Raises:
        ValueError: `matrix` is not rank 2.
        TypeError: its dtype is not float32 or float64.

    Example:
        >>> import tensorflow as tf
        >>> MatrixRows(tf.constant([[1.0, 2.0], [0.0, 3.0]])).gram().numpy().tolist()
        [[5.0, 6.0], [6.0, 9.0]]
    """

    def __init__(self, matrix: Any):
        matrix = tf.convert_to_tensor(matrix)
        if matrix.dtype not in (tf.float32, tf.float64):
            raise TypeError(
                f"MatrixRows: `matrix` must have dtype float32 or float64; got {matrix.dtype.name}."
            )
        if matrix.shape.rank != 2:
            raise ValueError(
                f"MatrixRows: `matrix` must have rank 2 ([n, D]); got shape {matrix.shape}."
            )
        self.matrix = matrix

    @property
    def num_rows(self) -> Any:
        return dimension(self.matrix, 0)

    @property
    def num_cols(self) -> Any:
        return dimension(self.matrix, 1)

    @property
    def dtype(self) -> tf.DType:
        return self.matrix.dtype

    def matvec(self, block: tf.Tensor) -> tf.Tensor:
        return tf.matmul(self.matrix, block)

    def rmatvec(self, block: tf.Tensor) -> tf.Tensor:
        return tf.matmul(self.matrix, block, transpose_a=True)

    def gram(self) -> tf.Tensor:
        return symmetrized(row_gram(self.matrix))

    def frobenius_squared(self) -> tf.Tensor:
        return tf.reduce_sum(tf.square(self.matrix))

    def __tf_flatten__(self) -> tuple[Hashable, Sequence[tf.Tensor]]:
        return (), (self.matrix,)

    @classmethod
    def __tf_unflatten__(
        cls, metadata: Hashable, components: Sequence[tf.Tensor]
    ) -> "MatrixRows":
        # TensorFlow may rebuild with placeholders or specs: skip the checks of __init__.
        rows = cls.__new__(cls)
        rows.matrix = components[0]
        return rows
