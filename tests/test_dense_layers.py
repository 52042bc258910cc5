"""Tests of keras_thermo.per_example.dense_layers: per-example gradient statistics from Dense factors.

Reference: the materialised path, `per_example.per_example_gradients` (a `tf.vectorized_map` over
per-example backward passes, itself tested against a loop in test_per_example_rows.py) wrapped in
`per_example.PerExampleGradients` (two-pass centered sums). The factored path computes the same sums
in another order, so the tolerances are float32 rounding bounds:

* every statistic is a sum over n = 16 examples of products of O(1) factors, each contracted
  over at most `in = 6` terms; both computations round each of these ~n + in additions with
  unit roundoff u = 6e-8, so agreeing values differ by at most ~(n + in) u ~ 1.3e-6 of the
  largest term. RTOL = 1e-5 (relative to the largest entry of the compared quantity) leaves
  a margin of ~8; measured differences are ~1e-7.
* the variances on the diagonal are compared entry by entry with RTOL plus ATOL = 1e-7 of the
  largest variance (coordinates of dead ReLU units are exactly 0 in both).
* expm actions are held to the bound of test_linalg.py (C = 4) against scipy in float64.
"""

from __future__ import annotations

import logging
import re

import keras
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from keras_thermo import per_example
from keras_thermo.per_example.dense_layers import (
    DenseLayerGradients,
    DenseLayerRows,
    dense_layer_gradients,
    dense_layer_incompatibility,
)
from keras_thermo.linalg import expm_action, expm_action_taylor, gram_matrix
from keras_thermo.linalg import taylor as taylor_module
from keras_thermo.linalg import gram as gram_module
from keras_thermo.linalg.operators import MatrixRows
from keras_thermo.linalg.dispatch import GRAM, TAYLOR
from helpers import assert_close_to_scale

tf.get_logger().setLevel(logging.ERROR)  # pfor logs retracing of its helper functions

BATCH = 16
NUM_CLASSES = 3
RTOL = 1e-5
ATOL_OF_MAX = 1e-7
UNIT_ROUNDOFF = 2.0**-24


def _mlp(hidden_activations=("tanh", "relu"), outputs=NUM_CLASSES, seed=0) -> keras.Sequential:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(5, activation=hidden_activations[0]),
            keras.layers.Dense(4, activation=hidden_activations[1]),
            keras.layers.Dense(outputs),
        ]
    )


def _data(seed=0, outputs=NUM_CLASSES):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, 6)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, BATCH).astype(np.int32)
    targets = rng.standard_normal((BATCH, outputs)).astype(np.float32)
    weights = rng.uniform(0.2, 2.0, BATCH).astype(np.float32)
    return x, labels, targets, weights


def _squared_error(y_true, y_pred):
    """A plain callable: per-example losses [n]."""
    return tf.reduce_sum(tf.square(y_true - y_pred), axis=-1)


# (name, loss, uses integer labels, with sample weights)
CROSS_ENTROPY = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
LOSSES = [
    ("sparse_ce", CROSS_ENTROPY, True, False),
    ("sparse_ce_weighted", CROSS_ENTROPY, True, True),
    ("mse_name", "mse", False, False),
    ("mse_object_weighted", keras.losses.MeanSquaredError(), False, True),
    ("callable_weighted", _squared_error, False, True),
]


def _both_paths(net, loss, x, y, weights):
    reference = per_example.PerExampleGradients(per_example.per_example_gradients(net, loss, x, y, weights))
    fast = dense_layer_gradients(net, loss, x, y, weights)
    return reference, fast


def _assert_close(actual, expected, rtol=RTOL):
    assert_close_to_scale(actual, expected, rtol)


# ---------------------------------------------------------------------------------------------
# Statistics against the materialised path


@pytest.mark.parametrize("activations", [("tanh", "relu"), ("relu", "tanh")])
@pytest.mark.parametrize("name,loss,labels,weighted", LOSSES, ids=[c[0] for c in LOSSES])
def test_statistics_match_the_materialised_path(activations, name, loss, labels, weighted):
    net = _mlp(activations)
    x, integer_labels, targets, weights = _data()
    y = integer_labels if labels else targets
    reference, fast = _both_paths(net, loss, x, y, weights if weighted else None)

    assert float(fast.count) == float(reference.count) == BATCH
    diagonal = fast.diagonal_covariance().numpy()
    expected_diagonal = reference.diagonal_covariance().numpy()
    assert diagonal.dtype == np.float32
    np.testing.assert_allclose(
        diagonal, expected_diagonal, rtol=RTOL, atol=ATOL_OF_MAX * expected_diagonal.max()
    )
    _assert_close(fast.full_covariance(), reference.full_covariance())
    np.testing.assert_allclose(
        float(fast.covariance_trace()), float(reference.covariance_trace()), rtol=RTOL
    )


def test_weights_change_the_statistics():
    """Guards the weighted cases above against weights being silently dropped."""
    net = _mlp()
    x, labels, _, weights = _data()
    loss = CROSS_ENTROPY
    weighted = dense_layer_gradients(net, loss, x, labels, weights).diagonal_covariance()
    unweighted = dense_layer_gradients(net, loss, x, labels).diagonal_covariance()
    assert np.max(np.abs(weighted.numpy() - unweighted.numpy())) > 0.05 * np.max(unweighted)


def test_layers_without_trainable_weights_and_bias_free_layers():
    """Rescaling, Flatten, Activation, Dropout(0), a frozen Dense and use_bias=False."""
    keras.utils.set_random_seed(3)
    frozen = keras.layers.Dense(5, activation="tanh")
    frozen.trainable = False
    net = keras.Sequential(
        [
            keras.Input((2, 3)),
            keras.layers.Rescaling(0.5, offset=0.1),
            keras.layers.Flatten(),
            keras.layers.Dense(7, use_bias=False),
            keras.layers.Activation("tanh"),
            keras.layers.Dropout(0.0),
            frozen,
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    assert dense_layer_incompatibility(net) is None
    x, labels, _, _ = _data(seed=3)
    x = x.reshape(BATCH, 2, 3)
    reference, fast = _both_paths(net, CROSS_ENTROPY, x, labels, None)
    expected = reference.diagonal_covariance().numpy()
    assert expected.shape == (6 * 7 + 5 * NUM_CLASSES + NUM_CLASSES,)  # frozen: 7 -> 5
    np.testing.assert_allclose(
        fast.diagonal_covariance().numpy(), expected, rtol=RTOL, atol=ATOL_OF_MAX * expected.max()
    )
    _assert_close(fast.full_covariance(), reference.full_covariance())


def test_diagonal_keeps_accuracy_when_the_mean_gradient_dominates():
    """Regression targets far from the outputs and positive inputs: mean^2 / variance reaches
    ~1e3 for some coordinates, where `sum g^2 - n mean^2` loses ~3 digits in float32. The
    shifted form must stay as accurate as the two-pass reference (both against float64)."""
    net = _mlp(("relu", "relu"), outputs=2, seed=5)
    rng = np.random.default_rng(5)
    x = (3.0 + rng.uniform(size=(BATCH, 6))).astype(np.float32)
    y = (50.0 + rng.standard_normal((BATCH, 2))).astype(np.float32)
    loss = keras.losses.MeanSquaredError()
    rows = per_example.per_example_gradients(net, loss, x, y).numpy().astype(np.float64)
    exact = np.sum((rows - rows.mean(axis=0)) ** 2, axis=0) / (BATCH - 1)
    dominated = BATCH * rows.mean(axis=0) ** 2 / np.maximum(exact * (BATCH - 1), 1e-30)
    assert dominated.max() > 100.0  # the case this test is about
    fast = dense_layer_gradients(net, loss, x, y).diagonal_covariance().numpy()
    live = exact > 1e-12 * exact.max()
    assert np.max(np.abs(fast - exact)[live] / exact[live]) < RTOL


# ---------------------------------------------------------------------------------------------
# The operator against the dense Gc


def test_operator_products_match_the_centered_rows():
    net = _mlp()
    x, labels, _, weights = _data(seed=1)
    reference, fast = _both_paths(net, CROSS_ENTROPY, x, labels, weights)
    gc = reference.covariance_factor().numpy().astype(np.float64)
    operator = fast.covariance_factor()
    assert isinstance(operator, DenseLayerRows)
    assert (operator.num_rows, operator.num_cols) == gc.shape
    assert operator.dtype == tf.float32
    rng = np.random.default_rng(1)
    block = rng.standard_normal((gc.shape[1], 3)).astype(np.float32)
    rows_block = rng.standard_normal((BATCH, 3)).astype(np.float32)

    _assert_close(operator.to_dense(), gc)
    _assert_close(operator.matvec(block), gc @ block)
    _assert_close(operator.rmatvec(rows_block), gc.T @ rows_block)
    gram = operator.gram().numpy()
    np.testing.assert_array_equal(gram, gram.T)
    _assert_close(gram, gc @ gc.T)
    _assert_close(gram_matrix(operator), gc @ gc.T)
    np.testing.assert_allclose(float(operator.frobenius_squared()), np.sum(gc**2), rtol=RTOL)
    # Gc has centered rows: 1^T Gc = 0, so Gc^T 1 = 0 up to rounding of the products.
    assert np.max(np.abs(operator.rmatvec(np.ones((BATCH, 1), np.float32)))) < 1e-6 * np.max(
        np.abs(gc)
    )


@pytest.mark.parametrize("method", ["taylor", "gram", "auto"])
@pytest.mark.parametrize("tau_frobenius", [1e-3, 0.5, 20.0])
def test_expm_action_on_the_operator_matches_scipy(method, tau_frobenius):
    """Bound of test_linalg.py, C = 4, rho_b = ||Gc||_F^2 (a bound on rho for both methods)."""
    net = _mlp()
    x, labels, _, _ = _data(seed=2)
    fast = dense_layer_gradients(net, CROSS_ENTROPY, x, labels)
    operator = fast.covariance_factor()
    gc = operator.to_dense().numpy().astype(np.float64)
    frobenius = float(np.sum(gc**2))
    tau = tau_frobenius / frobenius
    v = np.random.default_rng(2).standard_normal(gc.shape[1]).astype(np.float32)
    result, _, code = expm_action(operator, v, tau, method=method)
    reference = scipy.linalg.expm(-tau * gc.T @ gc) @ v.astype(np.float64)
    bound = 4.0 * UNIT_ROUNDOFF * (1.0 + tau * frobenius) * np.linalg.norm(v)
    assert result.shape == v.shape
    assert np.linalg.norm(result.numpy() - reference) <= bound
    if method == "auto":  # the cheaper method by the operator's own cost estimates
        _, plan, _ = taylor_module.prepare_taylor(operator, v, tau, None, taylor_module.MAX_DEGREE, None)
        gram_cost = float(gram_module.gram_method_cost(operator))
        expected = GRAM if gram_cost < float(plan.predicted_matvecs) + 0.5 else TAYLOR
        assert int(code) == expected, (gram_cost, float(plan.predicted_matvecs))


def test_taylor_traces_once_per_layout_not_per_operator():
    net = _mlp()
    loss = CROSS_ENTROPY
    v = np.ones(net.count_params(), np.float32)
    before = None
    for seed in range(3):
        x, labels, _, _ = _data(seed=10 + seed)
        operator = dense_layer_gradients(net, loss, x, labels).covariance_factor()
        expm_action(operator, v, 0.01, method="taylor")
        count = taylor_module._scaled_taylor_steps.experimental_get_tracing_count()
        before = count if before is None else before
        assert count == before


@pytest.mark.slow  # ~12 s of XLA compilation; mCCAdL on the Dense path runs under XLA in test_compile_modes.py
def test_runs_inside_a_compiled_function():
    """The whole path (losses by vectorized_map, factors, statistics, C step) under XLA."""
    net = _mlp()
    loss = CROSS_ENTROPY
    x, labels, _, weights = _data(seed=4)
    v = np.random.default_rng(4).standard_normal(net.count_params()).astype(np.float32)

    def statistics(x, labels, weights):
        stats = dense_layer_gradients(net, loss, x, labels, weights)
        # Taylor only: compiling the Gram branch's eigh too would double the compile time.
        result, _ = expm_action_taylor(stats.covariance_factor(), v, 1e-3)
        return stats.diagonal_covariance(), stats.covariance_trace(), result

    compiled = tf.function(statistics, jit_compile=True)(x, labels, weights)
    eager = statistics(x, labels, weights)
    for got, expected in zip(compiled, eager):
        _assert_close(got, expected)


def test_dense_layer_gradients_construct_from_factors():
    """Hand-computed: one layer, in = out = 1, a = (1, 2), delta = (1, 3): G = [[1, 1], [6, 3]]."""
    stats = DenseLayerGradients(
        [tf.constant([[1.0], [2.0]])], [tf.constant([[1.0], [3.0]])], [True]
    )
    np.testing.assert_allclose(stats.diagonal_covariance().numpy(), [12.5, 2.0])
    np.testing.assert_allclose(stats.full_covariance().numpy(), [[12.5, 5.0], [5.0, 2.0]])
    np.testing.assert_allclose(float(stats.covariance_trace()), 14.5)


# ---------------------------------------------------------------------------------------------
# When the fast path does not apply, and bad input


def _functional():
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))


class _MyDense(keras.layers.Dense):
    pass


def _lora_dense():
    layer = keras.layers.Dense(3)
    net = keras.Sequential([keras.Input((6,)), layer])
    layer.enable_lora(2)
    return net


@pytest.mark.parametrize(
    "build,pattern",
    [
        (lambda: keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3)]),
         r"'conv2d(_\d+)?' \(Conv2D\).*not a keras.layers.Dense"),
        (lambda: keras.Sequential([keras.Input((4, 3)), keras.layers.LSTM(2, unroll=True)]),
         r"LSTM.*not a keras.layers.Dense"),
        (lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                                   keras.layers.Dropout(0.5), keras.layers.Dense(2)]),
         r"Dropout \(rate=0.5\)"),
        (_functional, r"Functional, not a keras.Sequential"),
        (lambda: keras.Sequential([keras.Input((6,)), _MyDense(2)]),
         r"_MyDense.*not a keras.layers.Dense"),
        (_lora_dense, r"LoRA"),
        (lambda: keras.Sequential([keras.Input((4, 6)), keras.layers.Dense(2)]), r"rank-3 inputs"),
        (lambda: keras.Sequential([keras.Input((6,)), keras.layers.Masking(),
                                   keras.layers.Dense(2)]),
         r"Masking"),
        (lambda: keras.Sequential([keras.layers.Dense(2)]), r"no trainable variables"),
    ],
    ids=["conv2d", "lstm", "dropout", "functional", "subclass", "lora", "rank3", "masking",
         "unbuilt"],
)
def test_incompatible_models_get_a_one_line_reason(build, pattern):
    net = build()
    reason = dense_layer_incompatibility(net)
    assert reason is not None and "\n" not in reason
    assert re.search(pattern, reason), reason
    with pytest.raises(ValueError, match="fast path does not apply"):
        dense_layer_gradients(net, "mse", np.ones((2, 6), np.float32), np.ones((2, 2), np.float32))


def test_bad_inputs_are_rejected_by_name():
    net = _mlp()
    x, labels, targets, weights = _data()
    with pytest.raises(ValueError, match=r"`y` is None"):
        dense_layer_gradients(net, "mse", x, None)
    with pytest.raises(TypeError, match=r"`loss_fn`.*42"):
        dense_layer_gradients(net, 42, x, targets)
    with pytest.raises(ValueError, match=r"`sample_weight`.*\[n\].*\(16, 1\)"):
        dense_layer_gradients(net, _squared_error, x, targets, weights[:, None])
    with pytest.raises(ValueError, match=r"at least 2 examples; got n=1"):
        dense_layer_gradients(net, "mse", x[:1], targets[:1])
    with pytest.raises(ValueError, match=r"reduction"):
        dense_layer_gradients(net, keras.losses.MeanSquaredError(reduction="sum"), x, targets)
    with pytest.raises(ValueError, match=r"same number.*got 2 and 1"):
        DenseLayerGradients([tf.ones([2, 1])] * 2, [tf.ones([2, 1])], [True, True])


def test_gram_method_cost_counts_the_factored_products():
    """K from factors costs 2 n^2 sum(in + out) flops, a product with S 4 n sum(in * out), eigh
    9 n^3: far below the dense-matrix estimate for an MLP, so "auto" prefers Gram sooner."""
    net = _mlp()
    x, labels, _, _ = _data(seed=2)
    operator = dense_layer_gradients(net, CROSS_ENTROPY, x, labels).covariance_factor()
    layout = [(k.shape[0], k.shape[1]) for k in net.trainable_variables if len(k.shape) == 2]
    n = BATCH
    expected = 1.0 + (2 * n * n * sum(i + o for i, o in layout) + 9 * n**3) / (4 * n * sum(i * o for i, o in layout))
    np.testing.assert_allclose(float(operator.gram_method_cost()), expected, rtol=1e-12)
    assert float(gram_module.gram_method_cost(operator)) == pytest.approx(expected)
    # EMNIST MLP layout (784 -> 100 -> 47) at n = 128: about 2.2 products, against ~9 for the
    # dense-matrix estimate.
    emnist = DenseLayerRows(
        [tf.zeros([128, 784]), tf.zeros([128, 100])], [tf.zeros([128, 100]), tf.zeros([128, 47])],
        [True, True],
    )
    assert float(emnist.gram_method_cost()) == pytest.approx(2.24, abs=0.01)
    assert float(gram_module.gram_matvec_equivalents(128, emnist.num_cols)) > 8.0
    assert float(gram_module.gram_method_cost(MatrixRows(tf.zeros([n, 7])))) == pytest.approx(
        float(gram_module.gram_matvec_equivalents(n, 7))
    )
