"""Tests of keras_thermo.linalg: exp(-tau Gc^T Gc) v by the Taylor and Gram methods.

References are computed independently in float64 by scipy (`scipy.linalg.expm` of the formed
D x D matrix, and `scipy.sparse.linalg.expm_multiply`).

Error tolerance (all accuracy tests): with `u` the unit roundoff of the working dtype and
`rho_b` the bound on `rho = lambda_max(Gc Gc^T)` a method uses (`||Gc||_F^2` for Taylor, the
exact `rho` for Gram), we require

    ||y - y_ref||_2 <= C (u (1 + tau rho_b) + u64 (1 + tau rho)) ||v||_2,   C = 4.

Why: both methods are backward stable, i.e. they return `exp(S + E) v` (plus rounding of the
result, ~u ||v||) with `||E||_2 <~ c u ||S||_2`. For symmetric negative semi-definite `S`,
`||exp(S + E) v - exp(S) v|| <= ||E|| ||v||` to first order (the Frechet derivative of exp at
such S has norm <= max ||exp(tS)|| = 1), so the error is `<~ c u tau rho ||v||`; `||v||` is the
natural scale since `||exp(S) v|| <= ||v||`. For Taylor, `c` collects 1/2 from the theta_m table
(`||dA|| <= u ||A||` with `||A|| = tau rho_b / 2`) and the rounding of the `s` scaled steps
(each adds ~u ||A|| / s + u, i.e. ~u (tau rho_b / 2 + s) in total, with `s <= ||A|| / theta_m + 1`
and theta_m ~ 10), doubled for the rounding constants of the inner products: C = 4. For Gram, the
eigendecomposition's backward error `~u ||K||` plays the same role. The scipy reference is
itself computed in float64 by a backward-stable method, so it carries the same kind of error
with `u64 = 2^-53` (negligible against float32 tolerances). In float64 at tau rho = 100 this is
~1e-13; in float32 at tau rho = 1, ~5e-7.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
import scipy.sparse.linalg
import scipy.special
import tensorflow as tf

from keras_thermo.linalg import (
    GRAM,
    TAYLOR,
    CenteredRows,
    MatrixRows,
    expm_action,
    expm_action_gram,
    expm_action_taylor,
    gram_matrix,
)
from keras_thermo.linalg import gram as gram_module
from keras_thermo.linalg import krylov
from keras_thermo.linalg import taylor as taylor_module

UNIT_ROUNDOFF = {np.float32: 2.0**-24, np.float64: 2.0**-53}
ERROR_CONSTANT = 4.0
TAU_RHO_VALUES = (1e-4, 1e-2, 1.0, 10.0, 100.0)
# (n, D, singular-value decay): decaying spectra (||Gc||_F^2 within a small factor of rho, as
# for per-example gradients dominated by a few directions) and flat ones (||Gc||_F^2 = (n-1) rho,
# the worst case for the Frobenius bound); the last two have more rows than columns (the Gram
# method then works with the D x D matrix Gc^T Gc).
SHAPES = ((5, 30, 0.5), (5, 200, 1.0), (20, 30, 0.8), (20, 200, 1.0), (40, 12, 0.8), (60, 20, 1.0))


def centered_low_rank(seed: int, n: int, d: int, decay: float) -> np.ndarray:
    """An [n, d] matrix with rows summing to 0 (rank min(n-1, d)) and singular values decay^i."""
    rng = np.random.default_rng(seed)
    rank = min(n - 1, d)
    # Orthonormal columns orthogonal to (1, ..., 1): the rows of the product then sum to 0.
    with_ones = np.hstack([np.ones((n, 1)), rng.standard_normal((n, rank))])
    left = np.linalg.qr(with_ones)[0][:, 1:]
    right = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    return (left * decay ** np.arange(rank)) @ right.T


def scipy_reference(gc: np.ndarray, v: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """exp(-tau gc^T gc) v in float64 by scipy's expm and expm_multiply."""
    gc64, v64 = gc.astype(np.float64), v.astype(np.float64)
    operator = -tau * gc64.T @ gc64
    return scipy.linalg.expm(operator) @ v64, scipy.sparse.linalg.expm_multiply(operator, v64)


def largest_gram_eigenvalue(gc: np.ndarray) -> float:
    gc64 = gc.astype(np.float64)
    return float(np.linalg.eigvalsh(gc64 @ gc64.T)[-1])


def error_bound(dtype, tau: float, rho_bound: float, rho: float, v: np.ndarray) -> float:
    """The tolerance of the module docstring."""
    u = UNIT_ROUNDOFF[dtype]
    u64 = UNIT_ROUNDOFF[np.float64]
    scale = u * (1.0 + tau * rho_bound) + u64 * (1.0 + tau * rho)
    return ERROR_CONSTANT * scale * float(np.linalg.norm(v.astype(np.float64)))


def planned_steps(tau_rho_bound: float, thetas: tuple[float, ...]) -> tuple[int, int]:
    """Independent numpy version of the plan: (m, s) minimising m * ceil((x / 2) / theta_m)."""
    norm = tau_rho_bound / 2.0
    degrees = np.arange(1, len(thetas) + 1)
    scalings = np.ceil(norm / np.asarray(thetas))
    costs = degrees * scalings
    best = int(np.flatnonzero(costs == costs.min())[0])
    return int(degrees[best]), int(scalings[best])


# ---------------------------------------------------------------------------------------------
# Tables


def test_theta_tables_match_their_generator():
    """The hard-coded theta_m equal the generator's output (recomputed for a spread of m)."""
    for degree in (1, 2, 3, 5, 10, 17, 26, 33, 41, 48, 55):
        assert taylor_module.THETA_DOUBLE[degree - 1] == taylor_module.backward_error_theta(
            degree, 2.0**-53
        )
        assert taylor_module.THETA_SINGLE[degree - 1] == taylor_module.backward_error_theta(
            degree, 2.0**-24
        )


def test_theta_tables_agree_with_published_values():
    """Table 3.1 of Al-Mohy & Higham (2011), printed to 2 significant digits."""
    published = {
        "double": {5: 2.4e-3, 10: 1.4e-1, 15: 6.4e-1, 20: 1.4, 25: 2.4, 30: 3.5, 35: 4.7,
                   40: 6.0, 45: 7.2, 50: 8.5, 55: 9.9},
        "single": {5: 1.3e-1, 10: 1.0, 15: 2.2, 20: 3.6, 25: 4.9, 30: 6.3, 35: 7.7, 40: 9.1,
                   45: 1.1e1, 50: 1.2e1, 55: 1.3e1},
    }
    tables = {"double": taylor_module.THETA_DOUBLE, "single": taylor_module.THETA_SINGLE}
    for precision, values in published.items():
        for degree, value in values.items():
            computed = tables[precision][degree - 1]
            assert float(f"{computed:.1e}") == pytest.approx(value), (precision, degree, computed)


# ---------------------------------------------------------------------------------------------
# Accuracy against scipy


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n,d,decay", SHAPES)
def test_both_methods_match_scipy(dtype, n, d, decay):
    gc = centered_low_rank(n * 1000 + d, n, d, decay).astype(dtype)
    v = np.random.default_rng(d).standard_normal(d).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    frobenius = float(np.sum(gc.astype(np.float64) ** 2))
    for tau_rho in TAU_RHO_VALUES:
        tau = tau_rho / rho
        by_expm, by_expm_multiply = scipy_reference(gc, v, tau)
        results = {
            "taylor": (expm_action_taylor(gc, v, tau)[0], frobenius),
            "gram": (expm_action_gram(gc, v, tau)[0], rho),
        }
        for method, (result, rho_bound) in results.items():
            assert result.dtype == tf.as_dtype(dtype) and result.shape == (d,)
            bound = error_bound(dtype, tau, rho_bound, rho, v)
            for reference in (by_expm, by_expm_multiply):
                error = np.linalg.norm(result.numpy().astype(np.float64) - reference)
                assert error <= bound, (method, tau_rho, error, bound)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_methods_agree_with_each_other_and_on_blocks(dtype):
    """Applied to the identity block, both give the whole matrix exp(-tau Gc^T Gc)."""
    n, d = 6, 30
    gc = centered_low_rank(7, n, d, 0.7).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    frobenius = float(np.sum(gc.astype(np.float64) ** 2))
    identity = np.eye(d, dtype=dtype)
    for tau_rho in (1e-3, 3.0, 30.0):
        tau = tau_rho / rho
        by_taylor = expm_action_taylor(gc, identity, tau)[0].numpy().astype(np.float64)
        by_gram = expm_action_gram(gc, identity, tau)[0].numpy().astype(np.float64)
        reference = scipy.linalg.expm(-tau * gc.astype(np.float64).T @ gc.astype(np.float64))
        # Column j is the action on e_j (||e_j|| = 1): each column is held to the bound.
        taylor_bound = error_bound(dtype, tau, frobenius, rho, identity[:, 0])
        gram_bound = error_bound(dtype, tau, rho, rho, identity[:, 0])
        assert np.linalg.norm(by_taylor - reference, axis=0).max() <= taylor_bound
        assert np.linalg.norm(by_gram - reference, axis=0).max() <= gram_bound
        assert np.linalg.norm(by_taylor - by_gram, axis=0).max() <= taylor_bound + gram_bound


def test_dispatcher_matches_the_method_it_names():
    n, d = 40, 200  # forming K costs 2.5 products: the dispatcher bounds rho by ||Gc||_F^2
    gc = centered_low_rank(3, n, d, 0.8)
    v = np.random.default_rng(3).standard_normal(d)
    rho = largest_gram_eigenvalue(gc)
    # Taylor needs a single product (tau ||Gc||_F^2 / 2 <= theta_1 = 2.2e-16) only at tiny tau;
    # the Gram method costs ~3.5 products here.
    for tau_rho, expected_code in ((1e-17, TAYLOR), (100.0, GRAM)):
        tau = tau_rho / rho
        result, matvecs, code = expm_action(gc, v, tau)
        assert int(code) == expected_code
        chosen = expm_action_taylor if expected_code == TAYLOR else expm_action_gram
        expected_result, expected_matvecs = chosen(gc, v, tau)
        np.testing.assert_array_equal(result.numpy(), expected_result.numpy())
        assert int(matvecs) == int(expected_matvecs)
        for method, method_code in (("taylor", TAYLOR), ("gram", GRAM)):
            assert int(expm_action(gc, v, tau, method=method)[2]) == method_code


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_auto_forms_a_cheap_small_matrix_first(dtype):
    """Where K costs at most 1.5 products (n = 10: 0.625) the dispatcher forms it first, bounds
    rho by its trace, Frobenius norm and Gershgorin bound instead of a pass for ||Gc||_F^2, and
    charges it to both methods: the Gram branch reuses it (same work as the Gram method alone),
    the Taylor branch reports it on top of its products. (D = 12: 10 Lanczos steps would cost
    1.6 products, so the choice is made at run time.)"""
    n, d = 10, 12
    gc = centered_low_rank(4, n, d, 1.0).astype(dtype)  # flat: ||Gc||_F^2 = 9 rho
    v = np.random.default_rng(4).standard_normal(d).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    bound = spectral_bound_numpy(gc.astype(np.float64) @ gc.astype(np.float64).T)
    assert bound < 0.5 * float(np.sum(gc.astype(np.float64) ** 2))
    thetas = taylor_module.theta_table(UNIT_ROUNDOFF[dtype])
    codes = []
    for tau_rho in (1e-20, 1e-6, 1e-3, 1.0, 100.0):
        tau = tau_rho / rho
        result, matvecs, code = expm_action(gc, v, tau)
        degree, scaling = planned_steps(tau * bound, thetas)
        steps = planned_krylov_steps(tau * bound, n, dtype)
        use_gram = gram_work(n, d, steps) < max(0.5, n / 16) + degree * scaling
        assert int(code) == (GRAM if use_gram else TAYLOR), tau_rho
        codes.append(int(code))
        if use_gram:
            assert int(matvecs) == int(expm_action_gram(gc, v, tau)[1])
        else:
            # The early exit may stop the Taylor sum early, but every step spends a product.
            assert scaling + 1 <= int(matvecs) <= degree * scaling + 1
        reference = scipy_reference(gc, v, tau)[0]
        rho_bound = rho if use_gram else bound
        assert np.linalg.norm(result.numpy() - reference) <= error_bound(dtype, tau, rho_bound, rho, v)
    assert codes[0] == TAYLOR and codes[-1] == GRAM


def test_auto_takes_gram_outright_where_lanczos_steps_are_negligible():
    """n = 10, D = 200: K costs 0.625 products and even 10 Lanczos steps only 0.09, so the Gram
    method is within 0.1 product of the best Taylor plan at any tau: no run-time choice."""
    n, d = 10, 200
    gc = centered_low_rank(4, n, d, 1.0)
    v = np.random.default_rng(4).standard_normal(d)
    traced = tf.function(lambda tau: expm_action(gc, v, tau))  # the costs are static there too
    for tau in (1e-25, 1e-3, 10.0):
        result, matvecs, code = expm_action(gc, v, tau)
        expected, expected_matvecs = expm_action_gram(gc, v, tau)
        assert int(code) == GRAM and int(matvecs) == int(expected_matvecs)
        np.testing.assert_array_equal(result.numpy(), expected.numpy())
        assert int(traced(tf.constant(tau, tf.float64))[2]) == GRAM


# Slow (~10 s: a Keras net and a traced C step). The default suite covers the same path through
# test_ccadl_mccadl's mCCAdL fits on Dense networks, whose train steps autograph traces.
@pytest.mark.slow
def test_auto_decides_in_python_inside_an_autograph_traced_c_step():
    """Decided in Python while tracing, for Dense-factor operators (own cost estimate) captured
    by an autograph-converted function, as in a train step: a graph conditional made of the
    decision would lose the static shape of the result (`unflatten` needs it)."""
    import keras  # noqa: PLC0415

    from keras_thermo.per_example.dense_layers import dense_layer_gradients  # noqa: PLC0415

    keras.utils.set_random_seed(4)
    net = keras.Sequential([keras.Input((20,)), keras.layers.Dense(30, activation="tanh"),
                            keras.layers.Dense(3)])
    inputs = np.random.default_rng(4).standard_normal((16, 20)).astype(np.float32)
    labels = np.arange(16) % 3
    operator = dense_layer_gradients(
        net, keras.losses.SparseCategoricalCrossentropy(from_logits=True), inputs, labels
    ).covariance_factor()
    from keras_thermo.samplers.mccadl import covariance_step  # noqa: PLC0415

    momentum = [tf.ones_like(variable) for variable in net.trainable_variables]
    step = tf.function(lambda p: covariance_step(p, operator, 0.1, "auto"))
    new_momentum, _, code = step(momentum)  # unflatten needs the static shape
    assert int(code) == GRAM and [m.shape for m in new_momentum] == [m.shape for m in momentum]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [32, 128])
def test_auto_switches_to_gram_where_taylor_is_costlier(dtype, n):
    """The choice follows the documented model: Gram once the Taylor plan's m * s + 1/2 passes
    the Gram method's time; the switch comes once along increasing tau."""
    d = 300
    gc = centered_low_rank(11, n, d, 1.0).astype(dtype)
    v = np.random.default_rng(11).standard_normal(d).astype(dtype)
    frobenius = float(np.sum(gc.astype(np.float64) ** 2))
    thetas = taylor_module.theta_table(UNIT_ROUNDOFF[dtype])
    codes = []
    for tau_frobenius in np.geomspace(1e-10, 1e2, 25):
        tau = dtype(tau_frobenius / frobenius)
        code = int(expm_action(gc, v, tau)[2])
        degree, scaling = planned_steps(float(tau) * frobenius, thetas)
        # The dispatcher plans the Lanczos steps from the Taylor method's bound ||Gc||_F^2.
        steps = planned_krylov_steps(float(tau) * frobenius, n, dtype)
        assert (code == GRAM) == (gram_work(n, d, steps) < degree * scaling + 0.5), tau_frobenius
        codes.append(code)
    assert codes == sorted(codes) and codes[0] == TAYLOR and codes[-1] == GRAM


# ---------------------------------------------------------------------------------------------
# Work spent


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_taylor_matvecs_grow_with_tau_rho_and_follow_the_plan(dtype):
    gc = centered_low_rank(5, 10, 100, 0.8).astype(dtype)
    v = np.random.default_rng(5).standard_normal(100).astype(dtype)
    frobenius = float(np.sum(gc.astype(np.float64) ** 2))
    thetas = taylor_module.theta_table(UNIT_ROUNDOFF[dtype])
    counts = []
    for tau_frobenius in (1e-8, 1e-4, 1e-2, 1.0, 10.0, 100.0, 1000.0):
        matvecs = int(expm_action_taylor(gc, v, tau_frobenius / frobenius)[1])
        degree, scaling = planned_steps(tau_frobenius, thetas)
        # The early exit may stop a step early, but every step spends at least one product.
        assert scaling <= matvecs <= degree * scaling, (tau_frobenius, matvecs, degree, scaling)
        counts.append(matvecs)
    assert counts == sorted(counts)
    assert counts[0] <= 3 and counts[1] <= 6  # a handful for tiny tau * rho
    assert counts[-1] > 100 * counts[0]


def test_early_exit_stops_when_the_terms_vanish():
    """With rho_bound = 2 sigma^2, the shifted operator annihilates the singular vector w of
    sigma: the Taylor terms vanish (up to rounding) and the early-exit test of Al-Mohy & Higham
    must stop each step after a few products instead of running the planned degree."""
    gc = centered_low_rank(13, 6, 40, 0.7)
    _, singular_values, right_vectors = np.linalg.svd(gc)
    sigma_squared, direction = singular_values[0] ** 2, right_vectors[0]
    rho_bound = 2.0 * sigma_squared
    tau_rho_bound = 2.0 * taylor_module.THETA_DOUBLE[19]  # plan: m = 20, s = 1
    assert planned_steps(tau_rho_bound, taylor_module.THETA_DOUBLE) == (20, 1)
    tau = tau_rho_bound / rho_bound
    result, matvecs = expm_action_taylor(gc, direction, tau, rho_bound=rho_bound)
    # The first term is rounding, ~u ||A|| ||w||; later ones shrink like ||A||^j / j! with
    # ||A|| = 1.44, so the test is met within a few terms; without it, 20 are spent.
    assert int(matvecs) <= 8
    expected = np.exp(-tau * sigma_squared) * direction
    bound = error_bound(np.float64, tau, rho_bound, sigma_squared, direction)
    assert np.linalg.norm(result.numpy() - expected) <= bound
    # A generic vector needs the full degree.
    generic = np.random.default_rng(13).standard_normal(40)
    assert int(expm_action_taylor(gc, generic, tau, rho_bound=rho_bound)[1]) >= 15


def gram_work(n: int, d: int, steps: int) -> float:
    """The documented time model of the Gram method for a dense matrix, in products with S:
    rows (n <= D): 1 + max(1/2, n / 16) for the products and K; columns (D < n): max(1/2, D / 16)
    for M; plus 6 dim^2 flops per Lanczos step at 2 n D 16 flops per product."""
    dim = min(n, d)
    fixed = max(0.5, d / 16) if d < n else 1 + max(0.5, n / 16)
    return fixed + 6 * steps * dim**2 / (2 * n * d * 16)


def planned_krylov_steps(tau_rho_bound: float, dim: int, dtype) -> int:
    """Independent numpy version of the Lanczos plan: the fewest steps whose reach covers
    tau * rho_bound, the whole space beyond the table."""
    table = krylov.KRYLOV_REACH_SINGLE if dtype == np.float32 else krylov.KRYLOV_REACH_DOUBLE
    covering = [m for m, reach in enumerate(table, start=1) if reach >= tau_rho_bound]
    return min(covering[0] if covering else dim, dim)


def spectral_bound_numpy(matrix: np.ndarray) -> float:
    """min(trace, Frobenius norm, largest absolute row sum): each bounds lambda_max of a PSD matrix."""
    return min(np.trace(matrix), np.linalg.norm(matrix), np.abs(matrix).sum(axis=1).max())


def test_gram_matvecs_follow_the_documented_convention():
    for n, d in ((20, 200), (5, 30), (64, 100), (500, 100)):
        gc = centered_low_rank(9, n, d, 0.8)
        small = gc @ gc.T if n <= d else gc.T @ gc
        planned = planned_krylov_steps(0.1 * spectral_bound_numpy(small), min(n, d), np.float64)
        # The Lanczos loop may stop before the plan once the Krylov space is exhausted.
        possible = {int(np.ceil(gram_work(n, d, steps))) for steps in range(1, planned + 1)}
        assert int(expm_action_gram(gc, np.ones(d), 0.1)[1]) in possible
        assert int(expm_action_gram(gc, np.ones((d, 4)), 0.1)[1]) in possible
    # n = 500 > D = 100 works with the 100 x 100 matrix: 6.25 products, not the 16.6 that forming
    # the 500 x 500 one would take.
    assert int(expm_action_gram(gc, np.ones(d), 0.1)[1]) == 7


def test_gram_matrix_is_gc_gc_transpose():
    gc = centered_low_rank(4, 5, 30, 0.5)
    np.testing.assert_allclose(gram_matrix(tf.constant(gc)).numpy(), gc @ gc.T, rtol=0, atol=1e-15)


def test_smaller_tolerance_costs_more_and_looser_costs_less():
    gc = centered_low_rank(12, 8, 60, 0.8)
    v = np.random.default_rng(12).standard_normal(60)
    frobenius = float(np.sum(gc**2))
    tau = 5.0 / frobenius
    loose_result, loose_matvecs = expm_action_taylor(gc, v, tau, tol=2.0**-30)
    _, default_matvecs = expm_action_taylor(gc, v, tau)
    assert int(loose_matvecs) < int(default_matvecs)
    reference = scipy_reference(gc, v, tau)[0]
    loose_bound = ERROR_CONSTANT * 2.0**-30 * (1 + tau * frobenius) * np.linalg.norm(v)
    assert np.linalg.norm(loose_result.numpy() - reference) <= loose_bound


# ---------------------------------------------------------------------------------------------
# Structure of the operator


@pytest.mark.parametrize("method", ["taylor", "gram", "auto"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tau_zero_returns_v_exactly(method, dtype):
    gc = centered_low_rank(2, 5, 30, 0.5).astype(dtype)
    v = np.random.default_rng(2).standard_normal(30).astype(dtype)
    result, matvecs, _ = expm_action(gc, v, 0.0, method=method)
    np.testing.assert_array_equal(result.numpy(), v)
    if method == "taylor":
        assert int(matvecs) == 0


@pytest.mark.parametrize("method", ["taylor", "gram"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_null_space_is_kept_and_row_space_is_shrunk(method, dtype):
    n, d = 5, 30
    gc64 = centered_low_rank(6, n, d, 0.5)
    gc = gc64.astype(dtype)
    _, singular_values, right_vectors = np.linalg.svd(gc.astype(np.float64))
    row_basis = right_vectors[: n - 1]  # rank n - 1
    rng = np.random.default_rng(6)
    raw = rng.standard_normal(d)
    null_vector = (raw - row_basis.T @ (row_basis @ raw)).astype(dtype)
    tau = 10.0 / singular_values[0] ** 2
    rho_bound = float(np.sum(gc.astype(np.float64) ** 2))
    function = {"taylor": expm_action_taylor, "gram": expm_action_gram}[method]

    kept = function(gc, null_vector, tau)[0].numpy()
    # The rounded null vector is not exactly null: Gc maps it to ~u ||Gc|| ||v||, which the
    # operator shrinks by at most tau * ||Gc||_2^2 times that: within the error bound.
    bound = error_bound(dtype, tau, rho_bound, singular_values[0] ** 2, null_vector)
    assert np.linalg.norm(kept.astype(np.float64) - null_vector) <= bound

    for index in range(n - 1):
        direction = row_basis[index].astype(dtype)
        shrunk = function(gc, direction, tau)[0].numpy().astype(np.float64)
        expected = np.exp(-tau * singular_values[index] ** 2) * direction.astype(np.float64)
        assert np.linalg.norm(shrunk) < np.linalg.norm(direction)
        bound = error_bound(dtype, tau, rho_bound, singular_values[0] ** 2, direction)
        assert np.linalg.norm(shrunk - expected) <= bound


@pytest.mark.parametrize("method", ["taylor", "gram"])
def test_non_finite_input_propagates(method):
    gc = centered_low_rank(1, 5, 30, 0.5)
    gc[2, 3] = np.nan
    result = expm_action(gc, np.ones(30), 0.1, method=method)[0]
    assert np.isnan(result.numpy()).all()


# ---------------------------------------------------------------------------------------------
# The Lanczos evaluation inside the Gram method


def krylov_error_by_scipy(steps: int, tau_rho_bound: float) -> float:
    """eps_m(t) = 8 int_0^(t/2) sum_(k >= m) exp(-x) I_k(x) dx, by scipy (ive, quad)."""

    def tail(x: float) -> float:
        # Terms beyond x + 12 sqrt(x) + 60 are below 1e-30 of the largest.
        orders = np.arange(steps, steps + int(x + 12.0 * np.sqrt(x)) + 60)
        return float(scipy.special.ive(orders, x).sum())

    integral, _ = scipy.integrate.quad(tail, 0.0, tau_rho_bound / 2.0, epsabs=0.0, epsrel=1e-9,
                                       limit=200)
    return 8.0 * integral


def test_krylov_reach_tables_match_their_generator():
    for steps in (1, 2, 3, 8, 15, 40):
        assert krylov.KRYLOV_REACH_SINGLE[steps - 1] == krylov.krylov_reach(steps, 2.0**-24)
        assert krylov.KRYLOV_REACH_DOUBLE[steps - 1] == krylov.krylov_reach(steps, 2.0**-53)


@pytest.mark.parametrize("steps", [1, 4, 15, 40, 100])
def test_krylov_reach_is_the_largest_tau_rho_within_the_tolerance(steps):
    """Independently of the generator's recurrence and grid: at the tabulated reach the bound is
    within the unit roundoff, 2% beyond it is not (the table is tight, not merely safe)."""
    for table, tol in ((krylov.KRYLOV_REACH_SINGLE, 2.0**-24), (krylov.KRYLOV_REACH_DOUBLE, 2.0**-53)):
        reach = table[steps - 1]
        assert krylov_error_by_scipy(steps, reach) <= tol, (steps, tol)
        assert krylov_error_by_scipy(steps, 1.02 * reach) > tol, (steps, tol)


def spread_spectrum_matrix(seed: int, dim: int, rho: float) -> np.ndarray:
    """A symmetric PSD matrix with eigenvalues spread evenly over [0, rho]: no cluster for the
    Krylov space to exploit (the hard case for a polynomial approximation)."""
    basis = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))[0]
    return (basis * np.linspace(0.0, rho, dim)) @ basis.T


def exact_filter(matrix: np.ndarray, block: np.ndarray, tau: float) -> np.ndarray:
    """f(matrix) block by numpy's eigh, f(l) = expm1(-tau l) / l (f(0) = -tau)."""
    eigenvalues, vectors = np.linalg.eigh(matrix)
    eigenvalues = np.maximum(eigenvalues, 0.0)
    safe = np.where(eigenvalues > 0, eigenvalues, 1.0)
    values = np.where(eigenvalues > 0, np.expm1(-tau * safe) / safe, -tau)
    return vectors @ (values[:, None] * (vectors.T @ block))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_planned_lanczos_steps_are_needed(dtype):
    """The Lanczos error bound is ||f(A) b - y_m|| <= eps_m ||b|| / rho_b (eps_m <= u for the
    planned m), plus the float64 rounding of the process, ~dim u64 ||f|| ||b|| with ||f|| <= tau.
    With the planned steps the computed result meets it; with half as many it misses it by
    orders of magnitude, so a plan that stopped well short would fail the accuracy tests above.
    (On this spectrum the plan keeps a margin of 3 to 5 steps in float32: the bound is not
    tight for it.)"""
    dim, rho = 80, 1.0
    matrix = spread_spectrum_matrix(5, dim, rho)
    block = np.random.default_rng(5).standard_normal((dim, 2))
    norms = np.linalg.norm(block, axis=0)
    table = krylov.reach_table(tf.as_dtype(dtype))
    for tau_rho in (1.0, 30.0, 100.0):
        tau = tau_rho / rho
        planned = int(krylov.krylov_steps(tf.constant(tau_rho, tf.float64), dim, table))
        assert planned == planned_krylov_steps(tau_rho, dim, dtype) and planned < dim
        exact = exact_filter(matrix, block, tau)
        bound = UNIT_ROUNDOFF[dtype] * norms / rho + dim * 2.0**-53 * tau * norms
        errors = {}
        for steps in (planned, planned // 2):
            result, taken = krylov.filter_action(
                tf.constant(matrix), tf.constant(block), tf.constant(tau, tf.float64), tf.constant(steps)
            )
            assert int(taken) == steps
            errors[steps] = np.linalg.norm(result.numpy() - exact, axis=0)
        assert np.all(errors[planned] <= bound), (tau_rho, errors, bound)
        assert np.all(errors[planned // 2] > 100 * bound), (tau_rho, errors, bound)


def test_lanczos_stops_when_the_krylov_space_is_exhausted():
    """A rank-3 matrix: after 3 steps from a vector in its range (4 with a null component) the
    residual vanishes, so the loop stops there, not at the 40 steps asked for, with the exact
    result. (Asked for the whole space, 50 steps, the method uses the eigendecomposition.)"""
    rng = np.random.default_rng(8)
    factor = rng.standard_normal((50, 3))
    matrix = factor @ factor.T
    in_range = factor @ rng.standard_normal((3, 1))
    general = rng.standard_normal((50, 1))
    for block, most in ((in_range, 3), (general, 4)):
        result, taken = krylov.filter_action(
            tf.constant(matrix), tf.constant(block), tf.constant(0.7, tf.float64), tf.constant(40)
        )
        assert int(taken) <= most
        exact = exact_filter(matrix, block, 0.7)
        assert np.linalg.norm(result.numpy() - exact) <= 64 * 2.0**-53 * 0.7 * np.linalg.norm(block)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_more_examples_than_parameters_matches_scipy(dtype):
    """The mCCAdL paper's regression shape (n = 500 examples, D = 100 parameters): the Gram
    method works with the 100 x 100 matrix Gc^T Gc."""
    n, d = 500, 100
    gc = centered_low_rank(17, n, d, 0.97).astype(dtype)
    v = np.random.default_rng(17).standard_normal(d).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    for tau_rho in (1e-2, 1.0, 100.0):  # the whole range runs on smaller shapes (SHAPES)
        tau = tau_rho / rho
        result, matvecs = expm_action_gram(gc, v, tau)
        # 6.25 products for M plus the Lanczos steps; forming the 500 x 500 K alone takes 31.
        assert gram_module.works_in_columns(n, d) and int(matvecs) <= 10
        by_expm, by_expm_multiply = scipy_reference(gc, v, tau)
        bound = error_bound(dtype, tau, rho, rho, v)
        for reference in (by_expm, by_expm_multiply):
            error = np.linalg.norm(result.numpy().astype(np.float64) - reference)
            assert error <= bound, (tau_rho, error, bound)


# ---------------------------------------------------------------------------------------------
# Graph mode and XLA


@pytest.mark.parametrize("method", ["auto", "taylor", "gram"])
def test_traced_once_for_changing_tau(method):
    n, d = 40, 100  # n large enough for the Taylor method to win at small tau
    gc = centered_low_rank(8, n, d, 0.7)
    v = np.random.default_rng(8).standard_normal(d)
    rho = largest_gram_eigenvalue(gc)
    frobenius = float(np.sum(gc**2))
    traces = []

    # Unknown n and D, as for a final partial batch under a relaxed trace.
    @tf.function(
        input_signature=(
            tf.TensorSpec([None, None], tf.float64),
            tf.TensorSpec([None], tf.float64),
            tf.TensorSpec([], tf.float64),
        )
    )
    def apply(gc_tensor, v_tensor, tau):
        traces.append(None)
        return expm_action(gc_tensor, v_tensor, tau, method=method)

    codes = set()
    for tau_rho in (1e-5, 1.0, 50.0):
        tau = tau_rho / rho
        result, _, code = apply(tf.constant(gc), tf.constant(v), tf.constant(tau, tf.float64))
        codes.add(int(code))
        reference = scipy_reference(gc, v, tau)[0]
        rho_bound = frobenius if int(code) == TAYLOR else rho
        assert np.linalg.norm(result.numpy() - reference) <= error_bound(
            np.float64, tau, rho_bound, rho, v
        )
    smaller_batch = gc[: n // 2]
    result = apply(tf.constant(smaller_batch), tf.constant(v), tf.constant(0.3, tf.float64))[0]
    reference = scipy_reference(smaller_batch, v, 0.3)[0]
    rho_small = largest_gram_eigenvalue(smaller_batch)
    bound = error_bound(np.float64, 0.3, float(np.sum(smaller_batch**2)), rho_small, v)
    assert np.linalg.norm(result.numpy() - reference) <= bound
    assert len(traces) == 1
    if method == "auto":
        assert codes == {TAYLOR, GRAM}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiles_with_xla(dtype):
    """All three entry points under jit_compile=True, traced once for changing tau.

    XLA's CPU eigh is a Jacobi solver whose stopping rule leaves residuals near 1e-8 ||K|| even
    in float64, so under XLA the Gram method is held to the float32 tolerance (as its docstring
    says); the Taylor method runs the same operations as eagerly and keeps the dtype's.
    """
    n, d = 6, 40
    gc = centered_low_rank(10, n, d, 0.7).astype(dtype)
    v = np.random.default_rng(10).standard_normal(d).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    frobenius = float(np.sum(gc.astype(np.float64) ** 2))
    traces = []

    @tf.function(jit_compile=True)
    def apply(tau):
        traces.append(None)
        return (
            expm_action_taylor(gc, v, tau)[0],
            expm_action_gram(gc, v, tau)[0],
            expm_action(gc, v, tau),
        )

    for tau_rho in (1e-3, 1.0, 50.0):
        tau = tau_rho / rho
        by_taylor, by_gram, (by_auto, _, code) = apply(tf.constant(tau, dtype))
        reference = scipy_reference(gc, v, tau)[0]
        gram_bound = error_bound(np.float32, tau, rho, rho, v)
        taylor_bound = error_bound(dtype, tau, frobenius, rho, v)
        assert np.linalg.norm(by_taylor.numpy().astype(np.float64) - reference) <= taylor_bound
        assert np.linalg.norm(by_gram.numpy().astype(np.float64) - reference) <= gram_bound
        auto_bound = gram_bound if int(code) == GRAM else taylor_bound
        assert np.linalg.norm(by_auto.numpy().astype(np.float64) - reference) <= auto_bound
    assert len(traces) == 1


# ---------------------------------------------------------------------------------------------
# Bad input


def test_unknown_method_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"`method`.*auto.*taylor.*gram.*'pade'"):
        expm_action(np.ones((2, 3)), np.ones(3), 0.1, method="pade")


@pytest.mark.parametrize(
    "gc,v,tau,error,pattern",
    [
        (np.ones(3), np.ones(3), 0.1, ValueError, r"`gc`.*rank-2.*\(3,\)"),
        (np.ones((2, 3)), np.ones(4), 0.1, ValueError, r"`v`.*D = 3.*\(4,\)"),
        (np.ones((2, 3)), np.ones((3, 2, 1)), 0.1, ValueError, r"`v`.*\[D\].*\(3, 2, 1\)"),
        (np.ones((2, 3)), np.ones(3), -0.5, ValueError, r"`tau`.*>= 0.*-0.5"),
        (np.ones((2, 3)), np.ones(3), float("nan"), ValueError, r"`tau`.*nan"),
        (np.ones((2, 3)), np.ones(3), np.ones(2), ValueError, r"`tau`.*scalar"),
        (np.ones((2, 3), np.int32), np.ones(3), 0.1, TypeError, r"`gc`.*float32 or float64.*int32"),
        (np.ones((2, 3)), tf.ones(3, tf.float32), 0.1, TypeError, r"`v`.*float64.*float32"),
    ],
)
def test_bad_operands_are_rejected_with_a_clear_message(gc, v, tau, error, pattern):
    for method in ("taylor", "gram", "auto"):
        with pytest.raises(error, match=pattern):
            expm_action(gc, v, tau, method=method)


def test_bad_taylor_options_are_rejected():
    gc, v = np.ones((2, 3)), np.ones(3)
    with pytest.raises(ValueError, match=r"`max_degree`.*\[1, 55\].*60"):
        expm_action_taylor(gc, v, 0.1, max_degree=60)
    with pytest.raises(ValueError, match=r"`tol`.*0\.1"):
        expm_action_taylor(gc, v, 0.1, tol=0.1)
    with pytest.raises(ValueError, match=r"`rho_bound`.*>= 0.*-1"):
        expm_action_taylor(gc, v, 0.1, rho_bound=-1.0)


def test_negative_tensor_tau_fails_at_run_time():
    with pytest.raises(tf.errors.InvalidArgumentError, match="tau"):
        expm_action_gram(np.ones((2, 3)), np.ones(3), tf.constant(-1.0, tf.float64))


# ---------------------------------------------------------------------------------------------
# Operators (gc given through its products)


class FactoredRows(CenteredRows):
    """`Gc = left @ right^T` kept factored: the methods can only have used the interface."""

    def __init__(self, left, right):
        self.left, self.right = tf.convert_to_tensor(left), tf.convert_to_tensor(right)

    num_rows = property(lambda self: tf.shape(self.left)[0] if self.left.shape[0] is None
                        else self.left.shape[0])
    num_cols = property(lambda self: tf.shape(self.right)[0] if self.right.shape[0] is None
                        else self.right.shape[0])
    dtype = property(lambda self: self.left.dtype)

    def matvec(self, block):
        return tf.matmul(self.left, tf.matmul(self.right, block, transpose_a=True))

    def rmatvec(self, block):
        return tf.matmul(self.right, tf.matmul(self.left, block, transpose_a=True))

    def gram(self):
        inner = tf.matmul(self.right, self.right, transpose_a=True)
        product = tf.matmul(self.left, tf.matmul(inner, self.left, transpose_b=True))
        return 0.5 * (product + tf.transpose(product))

    def frobenius_squared(self):
        return tf.linalg.trace(self.gram())

    def __tf_flatten__(self):
        return (), (self.left, self.right)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        operator = cls.__new__(cls)  # components may be TensorSpecs: store them as they are
        operator.left, operator.right = components
        return operator


def factored(seed: int, n: int, d: int, decay: float, dtype) -> tuple[FactoredRows, np.ndarray]:
    """A FactoredRows operator and its dense float64 matrix (centered rows, rank n - 1)."""
    gc = centered_low_rank(seed, n, d, decay)
    left, singular, right_t = np.linalg.svd(gc, full_matrices=False)
    left, right = left * singular, right_t.T
    dense = left.astype(dtype).astype(np.float64) @ right.astype(dtype).astype(np.float64).T
    return FactoredRows(left.astype(dtype), right.astype(dtype)), dense


def test_matrix_rows_products_match_numpy():
    gc = centered_low_rank(20, 5, 30, 0.6)
    rows = MatrixRows(gc)
    block = np.random.default_rng(20).standard_normal((30, 2))
    row_block = np.random.default_rng(21).standard_normal((5, 2))
    assert (rows.num_rows, rows.num_cols, rows.dtype) == (5, 30, tf.float64)
    np.testing.assert_allclose(rows.matvec(block).numpy(), gc @ block, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(rows.rmatvec(row_block).numpy(), gc.T @ row_block, atol=1e-13)
    np.testing.assert_allclose(rows.gram().numpy(), gc @ gc.T, atol=1e-13)
    np.testing.assert_allclose(float(rows.frobenius_squared()), np.sum(gc**2), rtol=1e-13)
    np.testing.assert_array_equal(gram_matrix(rows).numpy(), gram_matrix(gc).numpy())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["taylor", "gram", "auto"])
def test_operator_operands_match_scipy(dtype, method):
    operator, gc = factored(30, 12, 80, 0.8, dtype)
    v = np.random.default_rng(30).standard_normal((80, 2)).astype(dtype)
    rho = largest_gram_eigenvalue(gc)
    frobenius = float(np.sum(gc**2))
    for tau_rho in (1e-3, 1.0, 30.0):
        tau = tau_rho / rho
        result, _, code = expm_action(operator, v, tau, method=method)
        assert result.shape == v.shape and result.dtype == tf.as_dtype(dtype)
        reference = scipy.linalg.expm(-tau * gc.T @ gc) @ v.astype(np.float64)
        rho_bound = frobenius if int(code) == TAYLOR else rho
        for column in range(2):
            bound = error_bound(dtype, tau, rho_bound, rho, v[:, column])
            computed = result.numpy()[:, column].astype(np.float64)
            error = np.linalg.norm(computed - reference[:, column])
            assert error <= bound, (tau_rho, error, bound)
        # Same plan and choice as for the dense matrix.
        dense_code = expm_action(gc.astype(dtype), v, tau, method=method)[2]
        assert int(code) == int(dense_code)


def test_operator_with_unknown_rows_in_a_traced_function():
    """n unknown at trace time (num_rows a tensor); traced once for three batch sizes."""
    traces = []

    @tf.function(
        input_signature=(
            tf.TensorSpec([None, 40], tf.float64),
            tf.TensorSpec([40, 40], tf.float64),
            tf.TensorSpec([], tf.float64),
        )
    )
    def apply(left, right, tau):
        traces.append(None)
        return expm_action(FactoredRows(left, right), tf.ones([40], tf.float64), tau)

    # n = 60 > D = 40: the Gram method works with the D x D matrix (chosen at run time).
    for n in (12, 7, 60):
        operator, gc = factored(40 + n, n, 40, 0.7, np.float64)
        # rank-column factors, padded with zero columns to the traced width 40 (same product).
        left, right = (
            np.pad(factor.numpy(), ((0, 0), (0, 40 - factor.shape[1])))
            for factor in (operator.left, operator.right)
        )
        rho = largest_gram_eigenvalue(gc)
        for tau_rho in (1e-4, 20.0):
            tau = tau_rho / rho
            tau_tensor = tf.constant(tau, tf.float64)
            result, _, code = apply(tf.constant(left), tf.constant(right), tau_tensor)
            reference = scipy.linalg.expm(-tau * gc.T @ gc) @ np.ones(40)
            rho_bound = float(np.sum(gc**2)) if int(code) == TAYLOR else rho
            assert np.linalg.norm(result.numpy() - reference) <= error_bound(
                np.float64, tau, rho_bound, rho, np.ones(40)
            )
    assert len(traces) == 1


def test_bad_operator_operands_are_rejected_with_a_clear_message():
    operator, _ = factored(50, 4, 30, 0.5, np.float64)
    for method in ("taylor", "gram", "auto"):
        with pytest.raises(ValueError, match=r"`v`.*D = 30.*\(31,\)"):
            expm_action(operator, np.ones(31), 0.1, method=method)
        with pytest.raises(TypeError, match=r"`v`.*float64.*float32"):
            expm_action(operator, tf.ones(30, tf.float32), 0.1, method=method)
    half = FactoredRows(np.ones((4, 2), np.float16), np.ones((30, 2), np.float16))
    with pytest.raises(TypeError, match=r"`gc`.*float32 or float64.*FactoredRows.*float16"):
        expm_action(half, np.ones(30, np.float16), 0.1)
    with pytest.raises(ValueError, match=r"`matrix`.*rank 2.*\(3,\)"):
        MatrixRows(np.ones(3))
    with pytest.raises(TypeError, match=r"`matrix`.*float32 or float64.*int32"):
        MatrixRows(np.ones((2, 3), np.int32))
