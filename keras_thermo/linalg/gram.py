"""`exp(-tau Gc^T Gc) v` through a small Gram matrix, without a truncation error above rounding.

With the thin SVD `Gc = U Sigma W^T`, `Gc^T Gc = W Sigma^2 W^T` and `K = Gc Gc^T = U Sigma^2 U^T`,
so

    exp(-tau Gc^T Gc) = I + W (exp(-tau Sigma^2) - I) W^T = I + Gc^T f(K) Gc = I + f(M) M,

`M = Gc^T Gc`, `f(l) = (exp(-tau l) - 1) / l = expm1(-tau l) / l`, `f(0) = -tau` (the identity
holds on the row space of `Gc` by the SVD and is trivially true on its orthogonal complement,
which `Gc` maps to 0). The method works in the smaller of the two spaces:

* rows (`n <= D`, the usual minibatch case): form the `n x n` matrix `K` (one `n x n x D`
  product), `u = Gc v`, `z = f(K) u`, result `v + Gc^T z`;
* columns (`D < n`, e.g. a regression with more examples per batch than parameters): form the
  `D x D` matrix `M`, result `v + f(M) (M v)`; no further product with `Gc`.

`f(matrix) b` comes from a few tens of Lanczos steps in float64 (`keras_thermo.linalg.krylov`),
their number fixed a priori from `tau` and a bound on the largest eigenvalue so that the Krylov
truncation error stays below the unit roundoff of the working dtype times `||v||`; the only
eigendecomposition left is that of the small tridiagonal matrix of the Lanczos coefficients.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_thermo.linalg import _operands, krylov
from keras_thermo.linalg.operators import CenteredRows, MatrixRows, symmetrized

#: Flops a matrix product performs per element of `Gc` it reads before it stops being limited
#: by memory traffic (the roofline "machine balance"). 16 matches a 2-core x86 CPU (Gram method
#: for n = 32 and 128, D = 1e5..1e6, float32, measured at 3 and 9 products with S); GPUs have a
#: higher balance, which makes the Gram method cheaper than this model says.
MACHINE_BALANCE = 16.0
#: Flops of one Lanczos step in units of dim^2: the product with the small matrix (2) and the
#: full reorthogonalisation against a basis of `dim` slots (4).
LANCZOS_FLOPS_PER_DIM_SQUARED = 6.0
#: Largest static D for which a trace with unknown n keeps the column-space branch (its `D x D`
#: matrices are allocated only if taken, but XLA compiles both branches of a `tf.cond`).
MAX_DYNAMIC_COLUMN_SPACE = 2048


def gram_matrix(gc: Any) -> tf.Tensor:
    """`K = Gc Gc^T` (`[n, n]`), symmetrised so that rounding cannot make it asymmetric.

    Args:
        gc: an `[n, D]` float32/float64 matrix or a `CenteredRows` operator.

    Example:
        >>> gram_matrix(tf.constant([[1.0, 2.0], [0.0, 3.0]])).numpy().tolist()
        [[5.0, 6.0], [6.0, 9.0]]
    """
    return _operands.as_operator(gc).gram()


def column_gram_matrix(gc: Any) -> tf.Tensor:
    """`M = Gc^T Gc` (`[D, D]`), symmetrised; meant for `D` smaller than `n`.

    A dense matrix takes one `D x n x D` product; an operator gives `Gc^T (Gc I_D)` through its
    products (`D` columns at once).

    Example:
        >>> column_gram_matrix(tf.constant([[1.0, 2.0], [0.0, 3.0]])).numpy().tolist()
        [[1.0, 2.0], [2.0, 13.0]]
    """
    rows = _operands.as_operator(gc)
    if isinstance(rows, MatrixRows):
        return symmetrized(tf.matmul(rows.matrix, rows.matrix, transpose_a=True))
    identity = tf.eye(rows.num_cols, dtype=rows.dtype)
    return symmetrized(rows.rmatvec(rows.matvec(identity)))


def works_in_columns(n: Any, d: Any) -> Any:
    """Whether the Gram method works with `M` (`D < n`): a Python bool when `n` and `D` are static,
    a boolean tensor when only `D` is (and small enough), else False (the row space)."""
    if isinstance(n, int) and isinstance(d, int):
        return d < n
    if isinstance(d, int) and d <= MAX_DYNAMIC_COLUMN_SPACE:
        return tf.less(d, n)
    return False


def _row_space_fixed_cost(n: tf.Tensor, d: tf.Tensor) -> tf.Tensor:
    """`Gc v`, `Gc^T z` (1 product) and `K` (`max(1/2, n / B)` products), for a dense matrix."""
    return 1.0 + 0.5 * tf.maximum(tf.constant(1.0, tf.float64), 2.0 * n / MACHINE_BALANCE)


def _column_space_fixed_cost(n: tf.Tensor, d: tf.Tensor, dense: bool) -> tf.Tensor:
    """Forming `M`: `2 n D^2` flops for a dense matrix (`max(1/2, D / B)` products), twice that
    through an operator's products with the `D x D` identity (`max(1, 2 D / B)`)."""
    factor = 1.0 if dense else 2.0
    return factor * tf.maximum(tf.constant(0.5, tf.float64), d / MACHINE_BALANCE)


def gram_matvec_equivalents(n: Any, d: Any, krylov_steps: Any = 0) -> tf.Tensor:
    """Time of the Gram method for a dense `[n, D]` matrix in products with `S` (float64 scalar).

    For `D >> n` every step streams the `[n, D]` matrix from memory, so costs are counted in
    passes over `Gc`, a product with `S` being two (`Gc u`, then `Gc^T z`), and a computation of
    `F` flops as `F / (2 n D B)` products (`B = MACHINE_BALANCE` flops per element read).

    * rows (`n <= D`): 1 product for `Gc v` and `Gc^T z`, `max(1/2, n / B)` for `K` (one pass,
      unless its `2 n^2 D` flops take longer);
    * columns (`D < n`): `max(1/2, D / B)` for `M`;
    * plus `krylov_steps` Lanczos steps of `6 dim^2` flops each, `dim = min(n, D)`.

    For a block `v` of k columns a product with `S` still takes two passes (k small), so the
    count does not depend on k.

    Args:
        n, d: rows and columns of `Gc`; Python numbers or tensors.
        krylov_steps: Lanczos steps (a number or a tensor).

    Example:
        >>> float(gram_matvec_equivalents(32, 10**6))  # 1 + 2 for K (64 > 16 flops per element)
        3.0
    """
    n64 = tf.cast(n, tf.float64)
    d64 = tf.cast(d, tf.float64)
    columns = tf.less(d64, n64)
    fixed = tf.where(
        columns, _column_space_fixed_cost(n64, d64, dense=True), _row_space_fixed_cost(n64, d64)
    )
    return fixed + _krylov_cost(n64, d64, tf.minimum(n64, d64), krylov_steps)


def _krylov_cost(n: tf.Tensor, d: tf.Tensor, dim: tf.Tensor, steps: Any) -> tf.Tensor:
    flops = LANCZOS_FLOPS_PER_DIM_SQUARED * tf.cast(steps, tf.float64) * dim * dim
    return flops / (2.0 * n * d * MACHINE_BALANCE)


def small_matrix_cost(rows: CenteredRows) -> tf.Tensor | None:
    """Products with `S` spent forming the small matrix (`K`, or `M` when `D < n`); None when
    the space is only known at run time.

    In the row space this is the fixed cost less the product for `Gc v` and `Gc^T z`.
    """
    n, d = _operands.matrix_shape(rows)
    columns = works_in_columns(n, d)
    if not isinstance(columns, bool):
        return None
    n64, d64 = tf.cast(n, tf.float64), tf.cast(d, tf.float64)
    if columns:
        return _column_space_fixed_cost(n64, d64, dense=isinstance(rows, MatrixRows))
    row_cost = rows.gram_method_cost()
    row_cost = _row_space_fixed_cost(n64, d64) if row_cost is None else tf.cast(row_cost, tf.float64)
    return row_cost - 1.0


def small_matrix(rows: CenteredRows) -> tf.Tensor:
    """The matrix the Gram method works with, in float64: `K = Gc Gc^T`, or `M = Gc^T Gc` when
    `works_in_columns` says so (which must be static here)."""
    n, d = _operands.matrix_shape(rows)
    columns = works_in_columns(n, d)
    return tf.cast(column_gram_matrix(rows) if columns else rows.gram(), tf.float64)


def gram_method_cost(rows: CenteredRows, krylov_steps: Any = 0) -> tf.Tensor:
    """The Gram method's time in products with `S` for the operator `rows` (float64 scalar).

    In the row space, the operator's own estimate of the fixed work (`CenteredRows.
    gram_method_cost`: `Gc v`, `Gc^T z` and `K`) or, when it has none, the dense-matrix model of
    `gram_matvec_equivalents`; in the column space, the cost of forming `M`; plus the Lanczos
    steps.
    """
    n, d = _operands.matrix_shape(rows)
    n64, d64 = tf.cast(n, tf.float64), tf.cast(d, tf.float64)
    row_cost = rows.gram_method_cost()
    row_cost = _row_space_fixed_cost(n64, d64) if row_cost is None else tf.cast(row_cost, tf.float64)
    columns = works_in_columns(n, d)
    if columns is False:
        fixed, dim = row_cost, n64
    else:
        column_cost = _column_space_fixed_cost(n64, d64, dense=isinstance(rows, MatrixRows))
        fixed = tf.where(columns, column_cost, row_cost)
        dim = tf.where(columns, d64, n64)
    return fixed + _krylov_cost(n64, d64, dim, krylov_steps)


def krylov_dimension(rows: CenteredRows) -> Any:
    """The size of the small matrix the Gram method works with: `min(n, D)` (as chosen by
    `works_in_columns`)."""
    n, d = _operands.matrix_shape(rows)
    columns = works_in_columns(n, d)
    if columns is True:
        return d
    if columns is False:
        return n
    return tf.where(columns, d, n)


def _filtered(matrix: tf.Tensor, block: tf.Tensor, tau: tf.Tensor, dtype: tf.DType, dimension):
    """`f(matrix) block` in float64, with the Lanczos steps planned for `dtype`'s roundoff.

    Returns `(z, steps_taken)`; a non-finite matrix or block gives NaN (a finite stand-in is
    processed, so no kernel sees NaN).
    """
    finite = tf.logical_and(
        tf.reduce_all(tf.math.is_finite(matrix)), tf.reduce_all(tf.math.is_finite(block))
    )
    matrix = tf.where(finite, matrix, tf.zeros_like(matrix))
    block = tf.where(finite, block, tf.zeros_like(block))
    bound = krylov.spectral_bound(matrix)
    steps = krylov.krylov_steps(tau * bound, dimension, krylov.reach_table(dtype))
    result, steps_taken = krylov.filter_action(matrix, block, tau, steps)
    return tf.where(finite, result, tf.constant(float("nan"), tf.float64)), steps_taken


def run_gram(
    operands: _operands.Operands, small: tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """The Gram method on checked operands; returns `([D, k] block, matvec equivalents)`.

    `small`: the float64 matrix of `small_matrix(gc)` if the caller has formed it already.
    """
    gc, v, tau = operands.gc, operands.v, operands.tau
    tau64 = tf.cast(tau, tf.float64)
    n, d = _operands.matrix_shape(gc)

    def in_rows():
        gram = tf.cast(gc.gram(), tf.float64) if small is None else small
        projected = tf.cast(gc.matvec(v), tf.float64)
        coefficients, steps = _filtered(gram, projected, tau64, v.dtype, n)
        return v + gc.rmatvec(tf.cast(coefficients, v.dtype)), steps

    def in_columns():
        gram = tf.cast(column_gram_matrix(gc), tf.float64) if small is None else small
        applied = tf.matmul(gram, tf.cast(v, tf.float64))
        correction, steps = _filtered(gram, applied, tau64, v.dtype, d)
        return v + tf.cast(correction, v.dtype), steps

    columns = works_in_columns(n, d)
    if columns is True:
        result, steps = in_columns()
    elif columns is False:
        result, steps = in_rows()
    else:
        result, steps = tf.cond(columns, in_columns, in_rows)
    return result, tf.cast(tf.math.ceil(gram_method_cost(gc, steps)), tf.int32)


def expm_action_gram(gc: Any, v: Any, tau: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """`exp(-tau Gc^T Gc) v = v + Gc^T f(Gc Gc^T) Gc v = v + f(Gc^T Gc) Gc^T Gc v` to rounding.

    `f(l) = expm1(-tau l) / l` (`f(0) = -tau`) is applied to the smaller of the `n x n` and
    `D x D` Gram matrices by Lanczos steps in float64 (`keras_thermo.linalg.krylov`), as many as
    keep the truncation error below the unit roundoff of the dtype of `gc` times `||v||` (a few
    tens for `tau * lambda_max` up to ~100); the result is cast back to that dtype. Works
    eagerly, inside `tf.function` and under `jit_compile=True`. Under XLA, TensorFlow lowers the
    eigendecomposition of the small tridiagonal matrix to XLA's Jacobi solver, which stops at
    residuals near `1e-8` of the norm even in float64 (measured on CPU), so there the result is
    accurate to single precision only (the Taylor method keeps full precision).

    Args:
        gc: `[n, D]` float32/float64 matrix (centered per-example gradients), or a
            `keras_thermo.linalg.operators.CenteredRows` operator (products and Gram matrix only).
        v: `[D]` vector or `[D, k]` block of the same dtype.
        tau: scalar >= 0 (Python number or tensor).

    Returns:
        `(result, matvecs)`: `result` shaped like `v`; `matvecs` an int32 scalar, the time in
        products with `S`, `ceil(gram_method_cost(gc, steps))` for the Lanczos steps taken (for a
        dense matrix `gram_matvec_equivalents`: 2 for n = 32 and D >> n).

    Example:
        >>> import numpy as np
        >>> gc = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
        >>> result, matvecs = expm_action_gram(gc, np.ones(3), 0.5)
        >>> np.round(result.numpy(), 6).tolist()  # exp(-0.5 * [1, 4, 0])
        [0.606531, 0.135335, 1.0]
    """
    operands = _operands.prepare_operands(gc, v, tau)
    result, matvecs = run_gram(operands)
    return _operands.restore_layout(result, operands.vector_input), matvecs
