"""`exp(-tau Gc^T Gc) v` exactly through the `n x n` Gram matrix `K = Gc Gc^T`.

With the thin SVD `Gc = U Sigma W^T`, `Gc^T Gc = W Sigma^2 W^T` and `K = U Sigma^2 U^T`, so

    exp(-tau Gc^T Gc) = I + W (exp(-tau Sigma^2) - I) W^T = I + Gc^T f(K) Gc,

`f(l) = (exp(-tau l) - 1) / l = expm1(-tau l) / l`, `f(0) = -tau` (the identity holds on the
row space of `Gc` by the SVD and is trivially true on its orthogonal complement, which `Gc`
maps to 0). `f(K)` comes from `eigh(K)` in float64; there is no truncation error, and the cost
is one `n x n x D` product for `K`, an `O(n^3)` eigendecomposition and two products with `Gc`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_thermo.linalg import _operands

#: Flops a matrix product performs per element of `Gc` it reads before it stops being limited
#: by memory traffic (the roofline "machine balance"). 16 matches a 2-core x86 CPU (Gram method
#: for n = 32 and 128, D = 1e5..1e6, float32, measured at 3 and 9 products with S); GPUs have a
#: higher balance, which makes the Gram method cheaper than this model says.
MACHINE_BALANCE = 16.0
#: Rough flop count of a symmetric eigendecomposition with eigenvectors, in units of n^3.
EIGH_FLOPS_PER_N_CUBED = 9.0


def gram_matrix(gc: Any) -> tf.Tensor:
    """`K = Gc Gc^T` (`[n, n]`), symmetrised so that rounding cannot make it asymmetric.

    Args:
        gc: an `[n, D]` float32/float64 matrix or a `CenteredRows` operator.

    Example:
        >>> gram_matrix(tf.constant([[1.0, 2.0], [0.0, 3.0]])).numpy().tolist()
        [[5.0, 6.0], [6.0, 9.0]]
    """
    return _operands.as_operator(gc).gram()


def gram_matvec_equivalents(n: Any, d: Any) -> tf.Tensor:
    """Time of the Gram method in products with `S` (float64 scalar tensor).

    For `D >> n` every step streams the `[n, D]` matrix from memory, so costs are counted in
    passes over `Gc`, a product with `S` being two (`Gc u`, then `Gc^T`). The Gram method makes
    two passes for `Gc v` and `Gc^T y` (1 product), one for `K = Gc Gc^T` unless its `2 n^2 D`
    flops take longer, i.e. `max(1, 2n / MACHINE_BALANCE)` passes, and `eigh` costs
    `9 n^3` flops, `9 n^2 / (2 D MACHINE_BALANCE)` products at the same rate. For a block
    `v` of k columns a product with `S` still takes two passes (k small), so the count does not
    depend on k.

    Args:
        n, d: rows and columns of `Gc`; Python numbers or tensors.
    """
    n = tf.cast(n, tf.float64)
    d = tf.cast(d, tf.float64)
    gram_passes = tf.maximum(tf.constant(1.0, tf.float64), 2.0 * n / MACHINE_BALANCE)
    eigh_products = EIGH_FLOPS_PER_N_CUBED * n * n / (2.0 * d * MACHINE_BALANCE)
    return 1.0 + 0.5 * gram_passes + eigh_products


def gram_method_cost(rows) -> tf.Tensor:
    """The Gram method's time in products with `S` for the operator `rows`: its own estimate
    (`CenteredRows.gram_method_cost`) or, for a dense matrix, `gram_matvec_equivalents`."""
    cost = rows.gram_method_cost()
    if cost is None:
        n, d = _operands.matrix_shape(rows)
        cost = gram_matvec_equivalents(n, d)
    return tf.cast(cost, tf.float64)


def run_gram(operands: _operands.Operands) -> tuple[tf.Tensor, tf.Tensor]:
    """The Gram method on checked operands; returns `([D, k] block, matvec equivalents)`."""
    gc, v, tau = operands.gc, operands.v, operands.tau
    gram = tf.cast(gc.gram(), tf.float64)
    # eigh fails on NaN/inf on some devices: factor a finite stand-in and return NaN instead.
    finite = tf.reduce_all(tf.math.is_finite(gram))
    gram = tf.where(finite, gram, tf.zeros_like(gram))
    eigenvalues, eigenvectors = tf.linalg.eigh(gram)
    # K is positive semi-definite; rounding can leave eigenvalues slightly below 0.
    eigenvalues = tf.maximum(eigenvalues, 0.0)
    tau64 = tf.cast(tau, tf.float64)
    positive = eigenvalues > 0.0
    safe_eigenvalues = tf.where(positive, eigenvalues, tf.ones_like(eigenvalues))
    # f(l) = expm1(-tau l) / l keeps full relative accuracy for tiny tau * l.
    filter_values = tf.where(
        positive, tf.math.expm1(-tau64 * safe_eigenvalues) / safe_eigenvalues, -tau64
    )
    projected = tf.matmul(eigenvectors, tf.cast(gc.matvec(v), tf.float64), transpose_a=True)
    coefficients = tf.matmul(eigenvectors, filter_values[:, tf.newaxis] * projected)
    result = v + gc.rmatvec(tf.cast(coefficients, v.dtype))
    result = tf.where(finite, result, tf.constant(float("nan"), v.dtype))
    return result, tf.cast(tf.math.ceil(gram_method_cost(operands.gc)), tf.int32)


def expm_action_gram(gc: Any, v: Any, tau: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """`exp(-tau Gc^T Gc) v = v + Gc^T f(Gc Gc^T) Gc v`, exact up to rounding.

    `f(l) = expm1(-tau l) / l` (`f(0) = -tau`) is applied through `tf.linalg.eigh` of the
    `n x n` Gram matrix in float64 (the result is cast back to the dtype of `gc`). Negative
    eigenvalues from rounding are clipped to 0. Works eagerly, inside `tf.function` and under
    `jit_compile=True`; there, TensorFlow lowers `eigh` to XLA's Jacobi solver, which stops at
    residuals near `1e-8 ||K||` even in float64 (measured on CPU, n <= 200), so under XLA the
    result is accurate to single precision only (the Taylor method keeps full precision).

    Args:
        gc: `[n, D]` float32/float64 matrix (centered per-example gradients), or a
            `keras_thermo.linalg.operators.CenteredRows` operator (products and Gram matrix only).
        v: `[D]` vector or `[D, k]` block of the same dtype.
        tau: scalar >= 0 (Python number or tensor).

    Returns:
        `(result, matvecs)`: `result` shaped like `v`; `matvecs` an int32 scalar, the time in
        products with `S`, `ceil(gram_matvec_equivalents(n, D))`: 1 for the two products with
        `Gc`, `max(1/2, n / MACHINE_BALANCE)` for forming `K`, `9 n^2 / (2 D MACHINE_BALANCE)`
        for `eigh` (so 3 for n = 32 and D >> n).

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
