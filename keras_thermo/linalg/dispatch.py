"""`expm_action`: picks the Taylor or the Gram method for `exp(-tau Gc^T Gc) v` by cost.

For `D >> n` both methods are limited by streaming the `[n, D]` matrix `Gc` from memory, so the
cost model counts time in products with `S` (two passes over `Gc`; the unit of `matvecs`):

* taylor: `m * s + 1/2`, the planned number of products (the early exit may spend fewer) plus
  the pass for `||Gc||_F^2`. For large `tau ||Gc||_F^2` it grows like
  `(55 / theta_55) tau ||Gc||_F^2 / 2`: `2.8 tau ||Gc||_F^2` in float64 (theta_55 = 9.87),
  `2.1 tau ||Gc||_F^2` in float32 (theta_55 = 13.36).
* gram (`gram.gram_matvec_equivalents`; operators may give their own fixed part): for
  `n <= D`, `1 + max(1/2, n / 16)`, the product forming `K` reading `Gc` once and only becoming
  compute-bound for n above 8; for `D < n`, `max(1/2, D / 16)` for `Gc^T Gc`; plus
  `3 m min(n, D)^2 / (16 n D)` for `m` Lanczos steps, planned here from `tau ||Gc||_F^2` (the
  method itself plans from a tighter bound, so it spends at most that many).

A pure flop count (`4 n D` per product, `2 n^2 D` for `K`) would charge the Gram method `n / 2`
products and favour the Taylor method far too long: on a 2-core CPU in float32 (n = 32,
D = 1e6) one product with S takes ~30 ms and the whole Gram method ~110 ms.

The Taylor plan depends on the value of `tau * ||Gc||_F^2`, so the choice is a `tf.cond` in
graph mode; both branches trace once. For n = 32 (Gram: 3 products) the Taylor method is chosen
while its plan needs at most 2 products: `tau ||Gc||_F^2` below 2 theta_2, i.e. 5e-8 in
float64 and 1.2e-3 in float32; for n = 128 (9 products) while it needs at most 8.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from keras_thermo.linalg import _operands, gram, krylov, taylor

#: `"auto"` forms the Gram method's small matrix before choosing when that costs at most this
#: many products with `S` (the pass for `||Gc||_F^2` it replaces costs 1/2): the Dense-factor
#: operators (~1.2) and dense matrices with n <= 24 rows.
SMALL_MATRIX_FIRST_COST = 1.5
#: With the small matrix formed first, `"auto"` takes the Gram method outright when its Lanczos
#: steps can cost at most this many products (see `_gram_within_a_product_of_any_taylor_plan`).
GRAM_WITHOUT_CHOICE_MARGIN = 0.5
#: Method codes returned by `expm_action`.
TAYLOR = 0
GRAM = 1
METHODS = ("auto", "taylor", "gram")


def expm_action(
    gc: Any,
    v: Any,
    tau: Any,
    method: str = "auto",
    *,
    tol: float | None = None,
    max_degree: int = taylor.MAX_DEGREE,
    rho_bound: Any = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`exp(-tau Gc^T Gc) v` without forming the `D x D` matrix, by the cheaper method.

    `"taylor"` is the scaled Taylor method of Al-Mohy & Higham (2011) (`expm_action_taylor`),
    `"gram"` the exact `n x n` eigendecomposition method (`expm_action_gram`), and `"auto"`
    chooses per call the one with the smaller estimated work (see the module docstring): Taylor
    for small `tau * ||Gc||_F^2`, Gram otherwise.

    Args:
        gc: `[n, D]` float32/float64 matrix (centered per-example gradients), or a
            `keras_thermo.linalg.operators.CenteredRows` operator that gives its products
            without forming it.
        v: `[D]` vector or `[D, k]` block of the same dtype.
        tau: scalar >= 0 (Python number or tensor).
        method: `"auto"`, `"taylor"` or `"gram"`.
        tol, max_degree, rho_bound: passed to the Taylor method (see `expm_action_taylor`).

    Returns:
        `(result, matvecs, method_code)`: `result` shaped like `v`; `matvecs` an int32 scalar
        (work in products with S, as each method counts it); `method_code` an int32 scalar,
        `TAYLOR` (0) or `GRAM` (1).

    Raises:
        ValueError: unknown `method`, or invalid operands (see `expm_action_taylor`).

    Example:
        >>> import numpy as np
        >>> gc = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
        >>> result, matvecs, code = expm_action(gc, np.ones(3), 0.5)
        >>> np.round(result.numpy(), 6).tolist(), int(code)  # n = 2: Gram is cheaper
        ([0.606531, 0.135335, 1.0], 1)
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}; got {method!r}")
    if method == "gram":
        operands = _operands.prepare_operands(gc, v, tau)
        result, matvecs = gram.run_gram(operands)
        code = GRAM
    elif method == "auto" and _gram_within_a_product_of_any_taylor_plan(gc):
        operands = _operands.prepare_operands(gc, v, tau)
        result, matvecs = gram.run_gram(operands)
        code = GRAM
    elif method == "auto" and _forms_small_matrix_first(gc):
        operands, result, matvecs, code = _auto_with_small_matrix(
            gc, v, tau, tol, max_degree, rho_bound
        )
    else:
        operands, plan, tol = taylor.prepare_taylor(gc, v, tau, tol, max_degree, rho_bound)
        if method == "taylor":
            result, matvecs = taylor.run_taylor(operands, plan, tol, max_degree)
            code = TAYLOR
        else:
            # Lanczos steps from the Taylor plan's bound, tau ||Gc||_F^2 (-2 shift): an upper
            # bound on what the Gram method will plan from its own, tighter bound.
            steps = krylov.krylov_steps(
                -2.0 * plan.shift,
                gram.krylov_dimension(operands.gc),
                krylov.reach_table(operands.gc.dtype),
            )
            use_gram = gram.gram_method_cost(operands.gc, steps) < plan.predicted_matvecs + 0.5
            result, matvecs = tf.cond(
                use_gram,
                lambda: gram.run_gram(operands),
                lambda: taylor.run_taylor(operands, plan, tol, max_degree),
            )
            code = tf.where(use_gram, GRAM, TAYLOR)
    return (
        _operands.restore_layout(result, operands.vector_input),
        matvecs,
        tf.convert_to_tensor(code, tf.int32),
    )


# Python-level decisions at trace time: autograph must not turn them into graph conditionals.
@tf.autograph.experimental.do_not_convert
def _static_float(compute) -> float | None:
    """`compute()` as a Python float, evaluated eagerly even while tracing (the cost models are
    arithmetic on static sizes); None if it needs a value known only at run time."""
    try:
        with tf.init_scope():
            value = compute()
            return None if value is None else float(np.asarray(value))
    except (TypeError, ValueError, tf.errors.OpError):
        return None


# Python-level decisions at trace time: autograph must not turn them into graph conditionals.
@tf.autograph.experimental.do_not_convert
def _gram_within_a_product_of_any_taylor_plan(gc: Any) -> bool:
    """Whether `"auto"` takes the Gram method without a run-time choice.

    Where the small matrix is formed first (`_forms_small_matrix_first`), both methods pay for
    it; beyond that the Taylor method spends at least one product, the Gram method one product
    plus its Lanczos steps, at most `dim` of them. When those steps cost at most
    `GRAM_WITHOUT_CHOICE_MARGIN` products (their flops are negligible whenever `dim << D`, as
    for the Dense-factor operators), the Gram method is never more than that behind the best
    Taylor plan, and choosing it statically saves the plan and the `tf.cond` (~0.3-0.5 ms on a
    2-core CPU, a third of a product on the EMNIST MLP).
    """
    if not _forms_small_matrix_first(gc):
        return False
    rows = _operands.as_operator(gc)
    dimension = gram.krylov_dimension(rows)
    most = _static_float(
        lambda: gram.gram_method_cost(rows, dimension) - gram.gram_method_cost(rows, 0)
    )
    return most is not None and most <= GRAM_WITHOUT_CHOICE_MARGIN


# Python-level decisions at trace time: autograph must not turn them into graph conditionals.
@tf.autograph.experimental.do_not_convert
def _forms_small_matrix_first(gc: Any) -> bool:
    """Whether `"auto"` forms the Gram method's small matrix before choosing (see
    `_auto_with_small_matrix`): when that costs at most `SMALL_MATRIX_FIRST_COST` products and
    the space (`K` or `Gc^T Gc`) is known at trace time."""
    rows = _operands.as_operator(gc)
    cost = _static_float(lambda: gram.small_matrix_cost(rows))
    return cost is not None and cost <= SMALL_MATRIX_FIRST_COST


def _auto_with_small_matrix(gc, v, tau, tol, max_degree, rho_bound):
    """`"auto"` with the small matrix formed first.

    Its bound on `lambda_max` (`krylov.spectral_bound`: trace, Frobenius norm, Gershgorin) then
    replaces the pass for `||Gc||_F^2` (the trace of `K`) and is tighter, which shortens the
    Taylor plan too; the matrix is reused if the Gram method is chosen. Both costs include
    forming it, so the choice compares the Taylor products `m * s` with the rest of the Gram
    method.
    """
    rows = _operands.as_operator(gc)
    small = gram.small_matrix(rows)
    bound = tf.cast(krylov.spectral_bound(small), rows.dtype)
    if rho_bound is not None:
        checked = _operands.check_non_negative_scalar(rho_bound, "rho_bound", rows.dtype)
        bound = tf.minimum(bound, checked)
    operands, plan, tol = taylor.prepare_taylor(rows, v, tau, tol, max_degree, bound)
    steps = krylov.krylov_steps(
        tf.cast(operands.tau, tf.float64) * tf.cast(bound, tf.float64),
        gram.krylov_dimension(rows),
        krylov.reach_table(rows.dtype),
    )
    small_cost = gram.small_matrix_cost(rows)
    use_gram = gram.gram_method_cost(rows, steps) < small_cost + plan.predicted_matvecs
    result, matvecs = tf.cond(
        use_gram,
        lambda: gram.run_gram(operands, small),
        lambda: taylor.run_taylor(operands, plan, tol, max_degree),
    )
    # The Taylor branch also spent the small matrix.
    matvecs = tf.where(
        use_gram, matvecs, matvecs + tf.cast(tf.math.ceil(small_cost), tf.int32)
    )
    return operands, result, matvecs, tf.where(use_gram, GRAM, TAYLOR)
