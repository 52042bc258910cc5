"""`exp(-tau Gc^T Gc) v` by truncated Taylor series with scaling and shift.

The method of Al-Mohy & Higham (2011), "Computing the action of the matrix exponential, with an
application to exponential integrators", SIAM J. Sci. Comput. 33(2), 488-511 (their Algorithm
3.2 with the parameter choice of their Section 3), specialised to the operator of the mCCAdL
C step, `S = -tau Gc^T Gc` with `Gc` of shape `[n, D]`:

* `S` is symmetric negative semi-definite with spectrum in `[-tau rho, 0]`,
  `rho = lambda_max(Gc Gc^T)`. Shifting by the midpoint `mu = -tau rho / 2` gives
  `A = S - mu I` with `||A||_2 = tau rho / 2`. For a symmetric matrix `||A^p||_2^(1/p) =
  ||A||_2`, so the refined quantities `alpha_p(A)` of the paper's Section 3 bring nothing and
  the choice of degree `m` and scaling `s` reduces to minimising `m * ceil(||A|| / theta_m)`.
  (The paper's `tr(S)/D` shift is useless here: for a rank <= n-1 matrix it is ~0.)
* `rho` is replaced by an upper bound, by default `||Gc||_F^2 = tr(Gc Gc^T)`. An upper bound is
  what the backward-error guarantee needs (a power-iteration estimate is a lower bound and
  would void it), and it costs half a matvec. Anything tighter needs the `n x n` Gram matrix,
  and once that is formed the exact `gram` method costs only an `n^3` eigendecomposition more,
  so tightening the bound is left to the caller (`rho_bound`) and to the dispatcher.
* `S u = -tau Gc^T (Gc u)`: two products with `Gc`; the `D x D` matrix is never formed.

With `theta_m` from the table of the requested tolerance, the computed result is
`exp(S + dA) v` with `||dA||_2 <= tol * ||A||_2` in exact arithmetic (`dA` is a function of `S`,
so it commutes with it), whence `||error|| <= tol * (tau rho_bound / 2) * ||v||` to first order.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext
from typing import Any, NamedTuple

import tensorflow as tf

from keras_thermo.linalg import _operands, operators

#: Unit roundoff of IEEE double precision, the default tolerance for float64.
DOUBLE_TOLERANCE = 2.0**-53
#: Unit roundoff of IEEE single precision, the default tolerance for float32.
SINGLE_TOLERANCE = 2.0**-24
#: Largest Taylor degree with a tabulated theta (the paper's m_max).
MAX_DEGREE = 55
#: Tolerances accepted by `expm_action_taylor`; between these the theta series converge well
#: (theta_55 stays below 14, under the radius ~16.3 of the series for m = 55).
TOLERANCE_RANGE = (2.0**-60, 2.0**-20)

# theta_m, m = 1..55: the largest theta with h~_{m+1}(theta) / theta <= tol, where
# h_{m+1}(x) = log(exp(-x) T_m(x)) = sum_{k>m} c_k x^k, T_m the degree-m Taylor polynomial of
# exp and h~ the same series with |c_k| (Al-Mohy & Higham 2011, eq. (3.6)-(3.7)); then one
# scaled step T_m(A/s) equals exp(A/s + dA) with ||dA|| <= tol ||A/s|| whenever
# ||A/s|| <= theta_m. Obtained with `backward_error_theta` below (400 series terms, 50-digit
# decimal arithmetic, 70 bisection steps) and rounded down to 10 significant digits. They agree
# with the 2-digit values of the paper's Table 3.1 (double: theta_5 = 2.4e-3, theta_10 = 1.4e-1,
# theta_30 = 3.5, theta_55 = 9.9; single: theta_5 = 1.3e-1, theta_10 = 1.0, theta_30 = 6.3,
# theta_55 = 1.3e1); tests/test_linalg.py recomputes them.
THETA_DOUBLE = (  # tol = 2^-53
    2.219903948e-16, 2.580956802e-8, 1.386347866e-5, 3.397168839e-4, 2.400876357e-3,
    9.065656407e-3, 2.384455532e-2, 4.991228871e-2, 8.957760203e-2, 1.441829761e-1,
    2.142358068e-1, 2.996158913e-1, 3.997775336e-1, 5.139146936e-1, 6.410835233e-1,
    7.802874256e-1, 9.305328460e-1, 1.090863719, 1.260381060, 1.438252596,
    1.623715950, 1.816077816, 2.014710780, 2.219048869, 2.428582524,
    2.642853457, 2.861449633, 3.084000544, 3.310172839, 3.539666348,
    3.772210495, 4.007561086, 4.245497442, 4.485819859, 4.728347345,
    4.972915626, 5.219375371, 5.467590630, 5.717437447, 5.968802630,
    6.221582661, 6.475682736, 6.731015898, 6.987502282, 7.245068429,
    7.503646685, 7.763174657, 8.023594728, 8.284853629, 8.546902045,
    8.809694269, 9.073187890, 9.337343505, 9.602124472, 9.867496675,
)
THETA_SINGLE = (  # tol = 2^-24
    1.192092800e-7, 5.978858893e-4, 1.123386473e-2, 5.116619363e-2, 1.308487164e-1,
    2.495289322e-1, 4.014582423e-1, 5.800524627e-1, 7.795113374e-1, 9.951840790e-1,
    1.223479542, 1.461661507, 1.707648529, 1.959850585, 2.217044394,
    2.478280877, 2.742817112, 3.010066362, 3.279561212, 3.550926214,
    3.823857425, 4.098106972, 4.373471311, 4.649782224, 4.926899843,
    5.204707228, 5.483106087, 5.762013408, 6.041358758, 6.321082126,
    6.601132179, 6.881464845, 7.162042154, 7.442831291, 7.723803811,
    8.004934986, 8.286203267, 8.567589827, 8.849078185, 9.130653881,
    9.412304202, 9.694017956, 9.975785274, 10.25759743, 10.53944673,
    10.82132634, 11.10323020, 11.38515296, 11.66708985, 11.94903664,
    12.23098956, 12.51294529, 12.79490083, 13.07685357, 13.35880114,
)


def backward_error_theta(degree: int, tol: float, *, terms: int = 400) -> float:
    """theta_m of Al-Mohy & Higham (2011): largest `theta` with `h~_{m+1}(theta)/theta <= tol`.

    Uses `h_{m+1}'(x) = -x^m / (m! T_m(x))` (differentiate `log(exp(-x) T_m(x))`), so the
    coefficients are `c_{m+1+k} = -r_k / (m! (m+1+k))` with `r_k` the power-series coefficients
    of `1 / T_m(x)`, obtained from the recursion `r_0 = 1`, `r_k = -sum_{j=1}^{min(k,m)}
    r_{k-j} / j!`. The sum `sum_k |c_k| theta^(k-1)` increases with theta; it is solved for
    `tol` by bisection in 50-digit decimal arithmetic. The result is rounded down to 10
    significant digits.

    Args:
        degree: Taylor degree m >= 1.
        tol: backward-error tolerance, e.g. 2**-53.
        terms: number of series terms kept (400 converge to far below `tol` for
            `tol in TOLERANCE_RANGE` and m <= 55).

    Returns:
        theta_m as a float.

    Example:
        >>> round(backward_error_theta(55, 2.0**-53), 2)
        9.87
    """
    with localcontext() as context:
        context.prec = 50
        inverse_factorials = [Decimal(1) / math.factorial(j) for j in range(degree + 1)]
        inverse_taylor = [Decimal(1)]
        for k in range(1, terms):
            recent = range(1, min(k, degree) + 1)
            inverse_taylor.append(
                -sum(inverse_taylor[k - j] * inverse_factorials[j] for j in recent)
            )
        degree_factorial = math.factorial(degree)
        abs_coefficients = [
            abs(r) / (degree_factorial * (degree + 1 + k)) for k, r in enumerate(inverse_taylor)
        ]
        tolerance = Decimal(tol)

        def bound_over_theta(theta: Decimal) -> Decimal:
            total, power = Decimal(0), theta**degree
            for coefficient in abs_coefficients:
                total += coefficient * power
                power *= theta
            return total

        low, high = Decimal(0), Decimal(64)
        for _ in range(70):
            middle = (low + high) / 2
            if bound_over_theta(middle) <= tolerance:
                low = middle
            else:
                high = middle
        context.prec = 10
        context.rounding = "ROUND_FLOOR"
        return float(+low)


@functools.lru_cache(maxsize=16)
def _computed_theta_table(tol: float) -> tuple[float, ...]:
    return tuple(backward_error_theta(m, tol) for m in range(1, MAX_DEGREE + 1))


def theta_table(tol: float, max_degree: int = MAX_DEGREE) -> tuple[float, ...]:
    """`(theta_1, ..., theta_max_degree)` for `tol`: tabulated for 2^-53 and 2^-24, else computed.

    Computing a table for another tolerance takes about a second (then cached).

    Example:
        >>> theta_table(2.0**-24, 5)[-1]
        0.1308487164
    """
    if tol == DOUBLE_TOLERANCE:
        table = THETA_DOUBLE
    elif tol == SINGLE_TOLERANCE:
        table = THETA_SINGLE
    else:
        table = _computed_theta_table(float(tol))
    return table[:max_degree]


def default_tolerance(dtype: tf.DType) -> float:
    """The unit roundoff of `dtype` (float32 or float64)."""
    return SINGLE_TOLERANCE if dtype == tf.float32 else DOUBLE_TOLERANCE


def _check_options(tol: Any, max_degree: Any, dtype: tf.DType) -> float:
    if isinstance(max_degree, bool) or not isinstance(max_degree, int) or not (
        1 <= max_degree <= MAX_DEGREE
    ):
        raise ValueError(f"`max_degree` must be an int in [1, {MAX_DEGREE}]; got {max_degree!r}")
    if tol is None:
        return default_tolerance(dtype)
    low, high = TOLERANCE_RANGE
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not low <= tol <= high:
        raise ValueError(
            f"`tol` must be None (the unit roundoff of the dtype) or a float in [2**-60, 2**-20]; "
            f"got {tol!r}"
        )
    return float(tol)


class TaylorPlan(NamedTuple):
    """Degree and scaling chosen for one call, plus what they cost.

    Attributes:
        degree: int32 scalar, Taylor degree m (0 when there is nothing to do).
        scaling: int32 scalar, number of scaled steps s (0 when `tau * rho_bound == 0`).
        shift: scalar of the working dtype, `mu = -tau * rho_bound / 2`.
        predicted_matvecs: float64 scalar, `m * s`, the most products the loop can spend
            (the early-exit test usually stops sooner).
    """

    degree: tf.Tensor
    scaling: tf.Tensor
    shift: tf.Tensor
    predicted_matvecs: tf.Tensor


def plan_taylor(tau: tf.Tensor, rho_bound: tf.Tensor, thetas: tuple[float, ...]) -> TaylorPlan:
    """Chooses `(m, s)` minimising `m * ceil(||A|| / theta_m)`, `||A|| = tau * rho_bound / 2`.

    Ties go to the smallest m (fewer terms per step). A zero norm gives `s = 0` (the result is
    `v`); a non-finite norm gives one step of the largest degree, so NaN/inf propagate to the
    result instead of being hidden.
    """
    shift = -0.5 * tau * rho_bound
    norm = tf.abs(tf.cast(shift, tf.float64))
    finite = tf.math.is_finite(norm)
    safe_norm = tf.where(finite, norm, tf.zeros_like(norm))
    theta = tf.constant(thetas, dtype=tf.float64)
    degrees = tf.range(1, len(thetas) + 1, dtype=tf.float64)
    scalings = tf.math.ceil(safe_norm / theta)
    costs = degrees * scalings
    best_cost = tf.reduce_min(costs)
    not_best = tf.fill(tf.shape(degrees), tf.constant(math.inf, tf.float64))
    degree = tf.reduce_min(tf.where(costs == best_cost, degrees, not_best))
    scaling = tf.math.ceil(safe_norm / tf.gather(theta, tf.cast(degree, tf.int32) - 1))
    # Beyond 2^31 - 1 steps the loop would run for days anyway; clamp to keep int32 valid.
    scaling = tf.minimum(scaling, 2.0**31 - 1)
    degree = tf.where(scaling > 0, degree, tf.zeros_like(degree))
    degree = tf.where(finite, degree, tf.constant(len(thetas), tf.float64))
    scaling = tf.where(finite, scaling, tf.ones_like(scaling))
    return TaylorPlan(
        degree=tf.cast(degree, tf.int32),
        scaling=tf.cast(scaling, tf.int32),
        shift=shift,
        predicted_matvecs=degree * scaling,
    )


@tf.function(autograph=False)
def _scaled_taylor_steps(
    gc: operators.CenteredRows,
    v: tf.Tensor,
    tau: tf.Tensor,
    shift: tf.Tensor,
    degree: tf.Tensor,
    scaling: tf.Tensor,
    tol: tf.Tensor,
    max_degree: int,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Algorithm 3.2 of Al-Mohy & Higham (2011) for `A = S - shift I`; see `expm_action_taylor`.

    Compiled as a graph once per operator type, dtype and shape (operators pass as nested
    structures of tensors) so that eager callers do not run the loops op by op; inside a
    caller's `tf.function` (with or without XLA) it is inlined.
    """
    steps = tf.cast(tf.maximum(scaling, 1), v.dtype)
    step_factor = tf.exp(shift / steps)  # exp(mu / s), applied after every step (no overflow)

    def apply_shifted(block: tf.Tensor) -> tf.Tensor:
        # (S - mu I) b = -tau Gc^T (Gc b) - mu b: two products with Gc, no D x D matrix.
        return -tau * gc.rmatvec(gc.matvec(block)) - shift * block

    def max_abs(block: tf.Tensor) -> tf.Tensor:
        return tf.reduce_max(tf.abs(block))

    def one_step(step: tf.Tensor, total: tf.Tensor, matvecs: tf.Tensor):
        def keep_going(j, term, partial_sum, previous_norm, converged, count):
            return tf.logical_and(j <= degree, tf.logical_not(converged))

        def add_term(j, term, partial_sum, previous_norm, converged, count):
            term = apply_shifted(term) / (steps * tf.cast(j, v.dtype))
            term_norm = max_abs(term)
            partial_sum = partial_sum + term
            # Early exit of the paper: the last two terms are negligible against the sum.
            converged = previous_norm + term_norm <= tol * max_abs(partial_sum)
            return j + 1, term, partial_sum, term_norm, converged, count + 1

        _, _, total, _, _, matvecs = tf.while_loop(
            keep_going,
            add_term,
            (tf.constant(1), total, total, max_abs(total), tf.constant(False), matvecs),
            maximum_iterations=max_degree,
        )
        return step + 1, step_factor * total, matvecs

    _, result, matvecs = tf.while_loop(
        lambda step, total, matvecs: step < scaling,
        one_step,
        (tf.constant(0), v, tf.constant(0)),
    )
    return result, matvecs


def run_taylor(
    operands: _operands.Operands, plan: TaylorPlan, tol: float, max_degree: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Runs the planned Taylor steps on checked operands; returns `([D, k] block, matvecs)`."""
    return _scaled_taylor_steps(
        operands.gc,
        operands.v,
        operands.tau,
        plan.shift,
        plan.degree,
        plan.scaling,
        tf.constant(tol, operands.v.dtype),
        max_degree,
    )


def prepare_taylor(
    gc: Any, v: Any, tau: Any, tol: float | None, max_degree: int, rho_bound: Any
) -> tuple[_operands.Operands, TaylorPlan, float]:
    """Checks the inputs and plans `(m, s)`; shared by `expm_action_taylor` and the dispatcher."""
    operands = _operands.prepare_operands(gc, v, tau)
    tol = _check_options(tol, max_degree, operands.gc.dtype)
    if rho_bound is None:
        rho = _operands.frobenius_rho_bound(operands.gc)
    else:
        rho = _operands.check_non_negative_scalar(rho_bound, "rho_bound", operands.gc.dtype)
    plan = plan_taylor(operands.tau, rho, theta_table(tol, max_degree))
    return operands, plan, tol


def expm_action_taylor(
    gc: Any,
    v: Any,
    tau: Any,
    *,
    tol: float | None = None,
    max_degree: int = MAX_DEGREE,
    rho_bound: Any = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """`exp(-tau Gc^T Gc) v` by scaled, shifted, truncated Taylor series; `Gc^T Gc` is never formed.

    Al-Mohy & Higham (2011), "Computing the action of the matrix exponential", SIAM J. Sci.
    Comput. 33(2): with `A = S - mu I`, `S = -tau Gc^T Gc`, `mu = -tau rho_bound / 2`,
    `exp(S) v = (exp(mu/s) T_m(A/s))^s v`, where `T_m` is the degree-m Taylor polynomial,
    `(m, s)` minimise the number of products `m * s` subject to `||A/s||_2 <= theta_m`, and
    each Taylor sum stops early once its last two terms fall below `tol` times the sum. Every
    product `S u = -tau Gc^T (Gc u)` costs two matrix-vector products with `Gc`.

    Works eagerly, inside `tf.function` (traced once; `tau` may change between calls) and under
    `jit_compile=True`.

    Args:
        gc: `[n, D]` float32/float64 matrix (centered per-example gradients), or a
            `keras_thermo.linalg.operators.CenteredRows` operator (products only).
        v: `[D]` vector or `[D, k]` block of the same dtype.
        tau: scalar >= 0 (Python number or tensor).
        tol: backward-error tolerance; None uses the unit roundoff of the dtype (2^-24 or
            2^-53) and its tabulated thetas. Other values in [2^-60, 2^-20] compute a table.
        max_degree: largest Taylor degree m considered, 1..55 (static).
        rho_bound: optional upper bound on `lambda_max(Gc Gc^T)`; defaults to `||Gc||_F^2`.
            A value below the true one voids the accuracy guarantee.

    Returns:
        `(result, matvecs)`: `result` shaped like `v`; `matvecs` an int32 scalar, the number of
        products with `S` spent (each two products with `Gc`; the norm bound's extra pass over
        `Gc` is not counted).

    Example:
        >>> import numpy as np
        >>> gc = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
        >>> result, matvecs = expm_action_taylor(gc, np.ones(3), 0.5)
        >>> np.round(result.numpy(), 6).tolist()  # exp(-0.5 * [1, 4, 0])
        [0.606531, 0.135335, 1.0]
    """
    operands, plan, tol = prepare_taylor(gc, v, tau, tol, max_degree, rho_bound)
    result, matvecs = run_taylor(operands, plan, tol, max_degree)
    return _operands.restore_layout(result, operands.vector_input), matvecs
