"""`f(A) b` for a small symmetric positive semi-definite matrix by the Lanczos method.

The Gram method of the mCCAdL C step needs `f(A) b` with

    f(l) = (exp(-tau l) - 1) / l = expm1(-tau l) / l,   f(0) = -tau,

where `A` is the `n x n` Gram matrix `Gc Gc^T` (or the `D x D` matrix `Gc^T Gc` when `D < n`)
and `b` a block of a few columns. Instead of an eigendecomposition of `A` (`O(dim^3)` per step),
`m` Lanczos steps build a basis `Q_m` of the Krylov space `span{b, A b, ..., A^(m-1) b}` and
the tridiagonal `T_m = Q_m^T A Q_m` (three-term recurrence, float64); then
`f(A) b ~ ||b|| Q_m f(T_m) e_1`, with `f(T_m)` from the eigendecomposition of the `m x m`
tridiagonal only. When the plan below asks for the whole space (`m >= dim`: tiny matrices, or
`tau rho_b` beyond the table) the eigendecomposition of `A` itself is used instead.

Number of steps (a priori, from a bound `rho_b >= lambda_max(A)`). The Lanczos approximation is
exact for polynomials of degree `< m`, and the eigenvalues of `T_m` lie in `[0, rho_b]`, so
(Saad 1992, "Analysis of some Krylov subspace approximations to the matrix exponential
operator", SIAM J. Numer. Anal. 29(1), Theorem 3.3 for general f)

    ||f(A) b - ||b|| Q_m f(T_m) e_1|| <= 2 ||b|| E_(m-1),

`E_(m-1)` the best uniform approximation error of `f` on `[0, rho_b]` by polynomials of degree
`m - 1`. With `x = (rho_b / 2)(1 + t)`, `c = tau rho_b / 2` and `f(x) = -tau int_0^1 exp(-s tau
x) ds`, the Chebyshev expansion `exp(-z t) = I_0(z) + 2 sum_k (-1)^k I_k(z) T_k(t)` (modified
Bessel functions) bounds `E_(m-1) <= (4 / rho_b) int_0^c P_m(x) dx`, where
`P_m(x) = sum_(k >= m) exp(-x) I_k(x)` is the upper tail of a Skellam distribution of variance
`x` (the difference of two Poisson(x/2) variables; it increases with x). The C step multiplies
the result by `Gc^T` (or starts from `b = Gc^T Gc v`), which costs at most another factor
`rho_b`: its error is at most

    eps_m(tau rho_b) = 8 int_0^(tau rho_b / 2) P_m(x) dx   times ||v||.

In floating point the Lanczos vectors lose orthogonality once Ritz values converge, but the
approximation of `f(A) b` still obeys the same bound with the interval widened by a few
rounding units (Druskin, Greenbaum & Knizhnerman 1998, "Using nonorthogonal Lanczos vectors in
the computation of matrix functions", SIAM J. Sci. Comput. 19(1); Musco, Musco & Sidford 2018,
"Stability of the Lanczos method for matrix function approximation", SODA), so no
reorthogonalisation is needed; the rounding of the float64 process adds ~dim u64 ||f|| ||b||.

`KRYLOV_REACH_SINGLE` / `_DOUBLE` tabulate, for m = 1, 2, ..., the largest `tau rho_b` with
`eps_m <= u` (the unit roundoff of float32 / float64); `krylov_reach` recomputes any entry.
About 15 steps cover `tau rho_b = 10` in float32, 23 in float64; the count grows like
`sqrt(tau rho_b)`.

Example:
    >>> import numpy as np
    >>> a = tf.constant(np.diag([0.0, 1.0, 4.0, 4.0]))   # 3 distinct eigenvalues: 3 steps
    >>> result, steps = filter_action(a, tf.constant(np.ones((4, 1))),
    ...                               tf.constant(0.5, tf.float64), tf.constant(3))
    >>> np.round(result.numpy().ravel(), 6).tolist()  # f(l) = (exp(-l/2) - 1) / l
    [-0.5, -0.393469, -0.216166, -0.216166]
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import tensorflow as tf

#: Tolerances of the tabulated reaches (the unit roundoffs of float32 and float64).
SINGLE_TOLERANCE = 2.0**-24
DOUBLE_TOLERANCE = 2.0**-53
#: Ratio between consecutive points of the geometric grid `krylov_reach` integrates on.
_GRID_RATIO = 1.0 + 1.0 / 256.0
_GRID_START = 2.0**-40
# fmt: off
KRYLOV_REACH_SINGLE = (  # tol = 2^-24; entry m - 1 is the reach of m steps
    0.0003448, 0.01125, 0.06924, 0.2178, 0.4844, 0.8865, 1.426, 2.106,
    2.922, 3.885, 4.966, 6.202, 7.537, 9.018, 10.62, 12.36,
    14.17, 16.18, 18.26, 20.44, 22.71, 25.14, 27.71, 30.31,
    33.16, 35.99, 38.91, 42.06, 45.12, 48.59, 51.92, 55.48,
    59.05, 62.85, 66.63, 70.37, 74.61, 78.79, 82.89, 87.2,
    91.73, 96.13, 100.7, 105.5, 110.6, 115.4, 120.5, 125.8,
    130.8, 136.0, 141.4, 147.0, 152.8, 158.3, 164.6, 170.5,
    176.6, 182.2, 188.7, 194.6, 201.6, 208.0, 214.6, 221.4,
    228.4, 234.7, 242.1, 248.8, 256.7, 263.8, 271.1, 278.6,
    286.3, 294.3, 301.2, 309.6, 316.9, 325.7, 333.4, 342.6,
    350.7, 359.0, 367.5, 376.2, 385.1, 394.2, 402.0, 411.5,
    421.2, 429.5, 439.7, 448.4, 457.2, 468.0, 477.2, 486.6,
    496.2, 506.0, 515.9, 526.1, 536.4, 547.0, 557.8, 568.7,
    579.9, 589.1, 600.7, 612.5, 622.1, 634.4, 644.3, 657.0,
    667.3, 677.8, 691.2, 702.0, 713.1, 724.3, 738.5, 750.1,
    761.9, 773.9, 786.1, 798.4, 811.0, 823.7, 836.7, 849.8,
)
KRYLOV_REACH_DOUBLE = (  # tol = 2^-53
    1.488e-08, 1.383e-05, 0.0004531, 0.003837, 0.01649, 0.04781, 0.1079, 0.207,
    0.3519, 0.5509, 0.8073, 1.124, 1.5, 1.948, 2.452, 3.027,
    3.678, 4.384, 5.144, 5.988, 6.891, 7.868, 8.878, 9.98,
    11.13, 12.36, 13.63, 14.97, 16.37, 17.84, 19.36, 20.93,
    22.63, 24.27, 26.04, 27.82, 29.73, 31.64, 33.68, 35.71,
    37.86, 39.98, 42.22, 44.42, 46.73, 49.16, 51.51, 53.98,
    56.57, 59.28, 61.87, 64.59, 67.15, 70.1, 72.88, 75.78,
    78.79, 81.93, 84.85, 88.23, 91.38, 94.64, 97.64, 101.1,
    104.3, 108.0, 111.4, 115.0, 118.6, 122.4, 125.8, 129.7,
    133.3, 137.6, 141.4, 145.3, 149.3, 153.4, 157.7, 161.4,
    165.9, 169.8, 174.5, 178.6, 182.9, 187.9, 192.4, 196.9,
    201.6, 206.4, 210.4, 215.4, 220.5, 225.7, 230.2, 235.6,
    240.3, 245.0, 250.8, 255.7, 260.8, 265.9, 271.1, 276.5,
    281.9, 287.5, 293.1, 298.9, 304.8, 310.8, 315.7, 321.9,
    328.2, 333.4, 339.9, 345.3, 352.1, 357.6, 363.2, 370.4,
    376.2, 382.1, 388.1, 395.8, 402.0, 408.3, 414.7, 421.2,
)
# fmt: on


def _skellam_tail(x: np.ndarray, steps: int) -> np.ndarray:
    """`P_m(x) = sum_(k >= m) exp(-x) I_k(x)` for `m = steps` at every `x > 0`.

    Miller's backward recurrence `I_(k-1) = I_(k+1) + (2k / x) I_k`, started far above both `m`
    and `x` (where the terms are negligible) and normalised with `I_0 + 2 sum_(k>=1) I_k =
    exp(x)`; every term is positive, so the sums lose nothing to cancellation. Values are
    rescaled on the way down to stay within float64's range.
    """
    top = int(max(steps, float(x.max())) + 30.0 * math.sqrt(float(x.max())) + 80)
    above = np.zeros_like(x)
    current = np.full_like(x, 1e-300)  # I_top, up to a common factor per x
    tail = current.copy()
    total = 2.0 * current
    result = None
    for k in range(top, 0, -1):
        above, current = current, above + (2.0 * k / x) * current  # current = I_(k-1)
        if k - 1 >= 1:
            tail += current
            total += 2.0 * current
        else:
            total += current
        if k - 1 == steps:
            result = tail.copy()
        large = current > 1e250
        if large.any():
            scale = np.where(large, 1e-250, 1.0)
            above *= scale
            current *= scale
            tail *= scale
            total *= scale
            if result is not None:
                result *= scale
    return result / total


def krylov_reach(steps: int, tol: float) -> float:
    """Largest `tau rho_b` at which `steps` Lanczos steps meet `eps_m(tau rho_b) <= tol`.

    `eps_m(t) = 8 int_0^(t/2) P_m(x) dx` (module docstring) is integrated with right-endpoint
    sums on a geometric grid (ratio 1 + 1/256): `P_m` increases, so the sums bound the integral
    from above and the reach returned is never too large. Rounded down to 4 significant digits.

    Args:
        steps: number of Lanczos steps m >= 1.
        tol: tolerance, e.g. 2**-24.

    Example:
        >>> krylov_reach(15, 2.0**-24)
        10.62
    """
    upper = steps * steps / 8.0 + 4.0
    while True:
        count = int(math.ceil(math.log(upper / _GRID_START) / math.log(_GRID_RATIO))) + 1
        grid = _GRID_START * _GRID_RATIO ** np.arange(count)
        widths = np.diff(grid, prepend=0.0)
        errors = 8.0 * np.cumsum(_skellam_tail(grid, steps) * widths)
        if errors[-1] > tol:
            break
        upper *= 4.0
    within = np.flatnonzero(errors <= tol)
    if within.size == 0:
        return 0.0
    reach = 2.0 * float(grid[within[-1]])
    digits = 3 - math.floor(math.log10(reach))
    return math.floor(reach * 10.0**digits) / 10.0**digits


def reach_table(dtype: tf.DType) -> tuple[float, ...]:
    """The tabulated reaches for the unit roundoff of `dtype` (float32 or float64)."""
    return KRYLOV_REACH_SINGLE if dtype == tf.float32 else KRYLOV_REACH_DOUBLE


def krylov_steps(tau_rho_bound: tf.Tensor, dimension: Any, table: tuple[float, ...]) -> tf.Tensor:
    """Lanczos steps for `tau * rho_b`: the fewest the table allows, at most `dimension`.

    At least one step; beyond the table's last reach, `dimension` (the whole space: exact). A
    non-finite `tau * rho_b` also gives `dimension`, so NaN reaches the result.

    Returns:
        int32 scalar.
    """
    reach = tf.constant(table, tf.float64)
    value = tf.cast(tau_rho_bound, tf.float64)
    # Index of the first reach >= value: that many steps minus one.
    steps = tf.searchsorted(reach, value[tf.newaxis], side="left")[0] + 1
    dimension = tf.cast(dimension, tf.int32)
    beyond = tf.logical_or(steps > len(table), tf.logical_not(tf.math.is_finite(value)))
    steps = tf.where(beyond, dimension, tf.cast(steps, tf.int32))
    return tf.clip_by_value(steps, 1, tf.maximum(dimension, 1))


def spectral_bound(matrix: tf.Tensor) -> tf.Tensor:
    """An upper bound on `lambda_max` of a symmetric PSD matrix: min(trace, Frobenius, Gershgorin).

    Each is a valid bound for a positive semi-definite matrix; which is tightest depends on the
    spectrum (trace for rank one, Gershgorin or Frobenius for flat spectra, where the trace
    overstates `lambda_max` by up to `dim` times). Costs one pass over the matrix.

    Example:
        >>> float(spectral_bound(tf.constant([[2.0, 1.0], [1.0, 2.0]])))  # eigenvalues 1, 3
        3.0
    """
    trace = tf.linalg.trace(matrix)
    frobenius = tf.norm(matrix)
    gershgorin = tf.reduce_max(tf.reduce_sum(tf.abs(matrix), axis=1))
    return tf.minimum(tf.minimum(trace, frobenius), gershgorin)


def gram_filter(eigenvalues: tf.Tensor, tau: tf.Tensor) -> tf.Tensor:
    """`f(l) = expm1(-tau l) / l`, `f(0) = -tau`, with full relative accuracy for tiny `tau l`.

    Eigenvalues below 0 (rounding of a PSD matrix) are treated as 0.
    """
    eigenvalues = tf.maximum(eigenvalues, 0.0)
    positive = eigenvalues > 0.0
    safe = tf.where(positive, eigenvalues, tf.ones_like(eigenvalues))
    return tf.where(positive, tf.math.expm1(-tau * safe) / safe, -tau * tf.ones_like(eigenvalues))


def _bucket_sizes(capacity: int) -> list[int]:
    """Static sizes for the projected matrix: powers of two from 8, then `capacity` (XLA needs
    static shapes; a bucket at most twice the size needed keeps its eigendecomposition small)."""
    sizes, size = [], 8
    while size < capacity:
        sizes.append(size)
        size *= 2
    return sizes + [capacity]


def filter_action(
    matrix: tf.Tensor, block: tf.Tensor, tau: tf.Tensor, steps: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """`f(matrix) block` by at most `steps` Lanczos steps per column, in float64.

    Each column `b` gets a basis `Q` of its Krylov space from the three-term Lanczos recurrence,
    one product with `matrix` per step and no reorthogonalisation (the module docstring says why
    the bound holds without it). Then `f(matrix) b ~ ||b|| Q f(T) e_1`, with `T` the Lanczos
    tridiagonal of the recurrence's coefficients, decomposed with `eigh` at a small static size.

    Compiled as a graph once per shape (eager callers do not run the loop op by op); inside a
    caller's `tf.function`, with or without XLA, it is inlined. A static `dim` gives static
    shapes throughout (as XLA needs); an unknown one slices to the steps taken.

    Args:
        matrix: `[dim, dim]` float64, symmetric positive semi-definite.
        block: `[dim, k]` float64.
        tau: float64 scalar >= 0.
        steps: int32 scalar, 1 <= steps <= dim (`krylov_steps`).

    Returns:
        `(result, steps_taken)`: `result` `[dim, k]` float64; `steps_taken` the products with
        `matrix` spent (fewer than `steps` once every column's Krylov space is exhausted, e.g.
        for a low-rank `matrix`).
    """
    return _filter_action(matrix, block, tau, steps, matrix.shape[0])


# `capacity` (the static size, or None) is a Python argument so that a trace for an unknown size
# is never reused for a known one: tf.function would otherwise accept static shapes into the
# more general trace, whose dynamic slicing XLA cannot compile.
@tf.function(autograph=False)
def _filter_action(matrix, block, tau, steps, capacity):
    size = tf.shape(matrix)[0] if capacity is None else capacity
    return tf.cond(
        steps >= size,
        lambda: (_filter_by_eigh(matrix, block, tau), tf.convert_to_tensor(size, tf.int32)),
        lambda: _filter_by_lanczos(matrix, block, tau, steps, capacity),
    )


def _filter_by_eigh(matrix: tf.Tensor, block: tf.Tensor, tau: tf.Tensor) -> tf.Tensor:
    """`f(matrix) block` through the eigendecomposition: when the plan needs the whole space."""
    eigenvalues, eigenvectors = tf.linalg.eigh(matrix)
    projected = tf.matmul(eigenvectors, block, transpose_a=True)
    return tf.matmul(eigenvectors, gram_filter(eigenvalues, tau)[:, tf.newaxis] * projected)


def _lanczos_recurrence(matrix, start, steps, breakdown):
    """Up to `steps` Lanczos steps from the unit columns `start` (`[k, dim]`), each column
    stopping once its residual is below `breakdown`; the loop ends when every column has.

    Returns:
        `(steps_taken, vectors, diagonal, off_diagonal)`, the last three `TensorArray`s of
        `dim` entries (`[k, dim]`, `[k]`, `[k]`), zero past the steps taken.
    """
    dim = tf.shape(matrix)[0] if matrix.shape[0] is None else matrix.shape[0]

    def array(shape):
        # Unwritten entries read as zeros (fully defined element shape), in graph mode and XLA.
        return tf.TensorArray(tf.float64, size=dim, element_shape=shape)

    def keep_going(step, current, previous, coupling, vectors, diagonal, off_diagonal):
        return tf.logical_and(step < steps, tf.reduce_any(tf.not_equal(current, 0.0)))

    def lanczos_step(step, current, previous, coupling, vectors, diagonal, off_diagonal):
        residual = tf.matmul(current, matrix)  # (A q_j)^T, A symmetric
        alpha = tf.reduce_sum(residual * current, axis=1)
        residual -= alpha[:, tf.newaxis] * current + coupling[:, tf.newaxis] * previous
        beta = tf.norm(residual, axis=1)
        beta = tf.where(beta > breakdown, beta, tf.zeros_like(beta))
        following = tf.math.divide_no_nan(residual, beta[:, tf.newaxis])
        return (
            step + 1,
            following,
            current,
            beta,
            vectors.write(step, current),
            diagonal.write(step, alpha),
            off_diagonal.write(step, beta),
        )

    norms_shape = start.shape[:1]
    steps_taken, _, _, _, vectors, diagonal, off_diagonal = tf.while_loop(
        keep_going,
        lanczos_step,
        (
            tf.constant(0),
            start,
            tf.zeros_like(start),
            tf.zeros_like(start[:, 0]),
            array(start.shape),
            array(norms_shape),
            array(norms_shape),
        ),
    )
    return steps_taken, vectors, diagonal, off_diagonal


# The recurrence runs as a graph `tf.while_loop`, not compiled with XLA. Compiled, its
# per-iteration bookkeeping (loop frames, TensorArray writes, one executor dispatch per op) goes,
# halving it (docs/notes/c_step.md, EMNIST MLP, 128 x 128, 15 steps: 1.08 ms as a graph loop,
# 0.54 ms compiled, on CPU), but the XLA compiler it loads raises the process's peak memory by
# about 80 MiB (`python -m benchmarks.step_cost --networks emnist_mlp --memory`: mCCAdL 857 MiB
# compiled, 778 MiB as a graph loop, SGD 720 MiB), more than the C step's whole budget of extra
# memory on the paper networks. The tridiagonal's `eigh` stays in TensorFlow's LAPACK kernel.
@tf.function(autograph=False)
def _stacked_lanczos_recurrence(matrix, start, steps, breakdown):
    steps_taken, vectors, diagonal, off_diagonal = _lanczos_recurrence(
        matrix, start, steps, breakdown
    )
    return steps_taken, vectors.stack(), diagonal.stack(), off_diagonal.stack()


def _filter_by_lanczos(matrix, block, tau, steps, capacity):
    """The Lanczos process (three-term recurrence, no reorthogonalisation) for every column."""
    dim = tf.shape(matrix)[0] if capacity is None else capacity
    columns = tf.transpose(block)  # [k, dim]
    width = columns.shape[0]
    static = capacity is not None and width is not None
    norms = tf.norm(columns, axis=1)
    start = tf.math.divide_no_nan(columns, norms[:, tf.newaxis])
    # A residual this small means the Krylov space is invariant up to rounding (which leaves
    # residuals of ~sqrt(dim) u ||A||): stop the column rather than normalise rounding noise.
    breakdown = tf.cast(dim, tf.float64) * DOUBLE_TOLERANCE * spectral_bound(matrix)
    if static:
        steps_taken, all_vectors, all_diagonal, all_off = _stacked_lanczos_recurrence(
            matrix, start, steps, breakdown
        )
    else:
        steps_taken, vectors, diagonal, off_diagonal = _lanczos_recurrence(
            matrix, start, steps, breakdown
        )
    needed = tf.maximum(steps_taken, 1)

    def combine(size, vectors, diagonal, off_diagonal):
        # T_m padded with zeros to `size`: the padding is a separate block that e_1 never sees.
        diagonal = tf.transpose(diagonal)  # [k, size]
        off_diagonal = tf.where(
            tf.range(size - 1) < needed - 1, tf.transpose(off_diagonal[: size - 1]), 0.0
        )
        tridiagonal = (
            tf.linalg.diag(diagonal)
            + tf.linalg.diag(off_diagonal, k=1)
            + tf.linalg.diag(off_diagonal, k=-1)
        )
        eigenvalues, eigenvectors = tf.linalg.eigh(tridiagonal)
        weights = gram_filter(eigenvalues, tau) * eigenvectors[:, 0, :]  # f(l_j) (e_1 . w_j)
        coefficients = tf.linalg.matvec(eigenvectors, weights)  # f(T) e_1, [k, size]
        return tf.einsum("ks,skd->kd", coefficients, vectors)

    if static:

        def bucket(size):
            return combine(size, all_vectors[:size], all_diagonal[:size], all_off[:size])

        sizes = _bucket_sizes(dim)
        if len(sizes) == 1:
            combined = bucket(sizes[0])
        else:
            index = tf.searchsorted(tf.constant(sizes), needed[tf.newaxis], side="left")[0]
            combined = tf.switch_case(index, [functools.partial(bucket, size) for size in sizes])
    else:  # shapes unknown at trace time: read what was written (graph mode only, not XLA)
        written = tf.range(needed)
        combined = combine(
            needed, vectors.gather(written), diagonal.gather(written), off_diagonal.gather(written)
        )
    return tf.transpose(norms[:, tf.newaxis] * combined), steps_taken
