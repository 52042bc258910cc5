"""Tests of the layer-rule engine (keras_thermo.per_example) against the vectorized rows.

Reference: `per_example.per_example_gradients` (a `tf.vectorized_map` over per-example backward
passes, tested against a loop over examples in test_per_example_rows.py), centered in float64. Recurrent
layers are compared with an identical layer built with `unroll=True` (the vectorized path
refuses `unroll=False`) and the same weights.

Tolerances are float32 rounding bounds. Every compared quantity is a sum over the n = 8
examples of products of O(1) factors, each contracted over at most L terms, where L is the
longest contraction either path performs: the positions times the patch size of a convolution
(at most 81 x 18), the T = 4 time steps of a recurrence through the hidden units. The two paths
add these in different orders, so entries differ by at most ~(n + L) u (u = 6e-8 the unit
roundoff) of the largest term, i.e. ~1e-4 in the worst case and ~1e-6 for the others; RTOL = 2e-5
(relative to the largest entry of the compared quantity) holds every case measured (the
largest differences seen were 3e-7) with margin, and a wrong rule (a transposed kernel, a
missing bias, a time step off by one) is off by O(1).

The CCAdL and mCCAdL chains on the engine and on the vectorized rows take the same noise (keyed
by seed and step), so they differ only by the rounding of the statistics (and of the forward
pass, which the engine computes in its own order), a few ulp relative per step, which the
dynamics carry along. Each model variable (weights, momenta, thermostat) is compared against a
bound relative to its own scale, `rtol` times its largest entry: an entry near zero (a bias, a
momentum component crossing zero) is computed from larger values through shared sums and
inherits their rounding, so a per-entry relative bound would be meaningless there (as in
test_compile_modes.py). After 20 steps rtol = 1e-4, as the Dense-layer comparison in
test_ccadl_mccadl.py; after 300 steps ten times that. The logged noise_scale of the last step
(the trace of the estimated force covariance, a positive sum) is held to rtol. A wrong statistic
(a missing bias column, a factor of n - 1, a variance 1% off) moves noise_scale by as much at
every step: `test_the_chain_comparison_rejects_a_variance_off_by_one_percent`.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import per_example
from keras_thermo.per_example import blocks as kt_blocks
from keras_thermo.per_example.rules import conv as conv_rule
from keras_thermo.samplers import CCAdL, MCCAdL
from helpers import assert_close_to_scale

tf.get_logger().setLevel(logging.ERROR)  # pfor logs retracing of its helper functions

BATCH = 8
RTOL = 2e-5
SEED = 5


# --- nets ---------------------------------------------------------------------------------------


def _seed(seed=0):
    keras.utils.set_random_seed(seed)


def _dense_on_sequences():
    return keras.Sequential([keras.Input((3, 5)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def _einsum_dense():
    return keras.Sequential([keras.Input((3, 5)),
                             keras.layers.EinsumDense("abc,cde->abde", output_shape=(3, 4, 2), bias_axes="de",
                                                      activation="tanh"),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def _conv2d(**options):
    return keras.Sequential([keras.Input((9, 9, 2)), keras.layers.Conv2D(3, 3, activation="relu", **options),
                             keras.layers.MaxPooling2D(2), keras.layers.Flatten(), keras.layers.Dense(2)])


def _conv1d(**options):
    return keras.Sequential([keras.Input((11, 2)), keras.layers.Conv1D(3, 3, activation="tanh", **options),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def _embedding():
    return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(7, 3),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def _layer_norm():
    return keras.Sequential([keras.Input((3, 5)), keras.layers.Dense(4), keras.layers.LayerNormalization(),
                             keras.layers.LayerNormalization(axis=[1, 2], center=False),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


def _shared_noise_scale(on_sequences):
    """One noise scale for every input: the regression head, or on sequences (summed positions)."""
    if on_sequences:
        return keras.Sequential([keras.Input((3, 5)), keras.layers.Dense(2, activation="tanh"),
                                 kt.regression.SharedNoiseScale(), keras.layers.Flatten(), keras.layers.Dense(2)])
    return keras.Sequential([keras.Input((3, 5)), keras.layers.Flatten(), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1), kt.regression.SharedNoiseScale()])


def _two_branches():
    """Functional: a Dense branch and a Conv1D branch of the same input, concatenated."""
    inputs = keras.Input((11, 2))
    left = keras.layers.Dense(3, activation="relu")(keras.layers.Flatten()(inputs))
    right = keras.layers.GlobalAveragePooling1D()(keras.layers.Conv1D(4, 3, activation="tanh")(inputs))
    merged = keras.layers.Concatenate()([left, right])
    return keras.Model(inputs, keras.layers.Dense(2)(merged))


class _Subclassed(keras.Model):
    """A subclassed model whose call reuses one Dense layer on two paths (a shared layer)."""

    def __init__(self):
        super().__init__()
        self.shared = keras.layers.Dense(5, activation="tanh")
        self.norm = keras.layers.LayerNormalization()
        self.head = keras.layers.Dense(2)

    def call(self, inputs, training=None):
        first = self.shared(inputs)
        second = self.shared(2.0 * inputs + 1.0)  # the same weights, a second call
        return self.head(self.norm(first * second))


def _subclassed():
    net = _Subclassed()
    net(np.zeros((1, 5), "float32"))
    return net


def _shared_embedding_two_inputs():
    """Mixed inputs (int32 tokens, float32 features); one Embedding applied to two token inputs."""
    tokens_a, tokens_b = keras.Input((4,), dtype="int32"), keras.Input((3,), dtype="int32")
    features = keras.Input((5,), dtype="float32")
    embed = keras.layers.Embedding(6, 3)
    pooled = keras.layers.Concatenate()([
        keras.layers.Flatten()(embed(tokens_a)), keras.layers.Flatten()(embed(tokens_b)),
        keras.layers.Dense(3, activation="relu")(features),
    ])
    return keras.Model([tokens_a, tokens_b, features], keras.layers.Dense(2)(pooled))


def _recurrent(layer_type, mask=False, **options):
    """`(net with unroll=False, the same net unrolled)` over 4 steps, sharing weights."""

    def build(unroll):
        _seed(3)
        if mask:
            head = [keras.Input((4,), dtype="int32"), keras.layers.Embedding(6, 5, mask_zero=True)]
        else:
            head = [keras.Input((4, 5)), keras.layers.Dense(5, activation="tanh")]
        return keras.Sequential(head + [layer_type(3, unroll=unroll, **options), keras.layers.Flatten(),
                                        keras.layers.Dense(2)])

    net, reference = build(False), build(True)
    reference.set_weights(net.get_weights())
    return net, reference


def _inputs(net, seed=0):
    rng = np.random.default_rng(seed)
    # A subclassed model has no symbolic inputs: its call takes [batch, 5] features.
    specs = getattr(net, "inputs", None) or [keras.KerasTensor((None, 5), "float32")]
    arrays = []
    for spec in specs:
        shape = (BATCH, *spec.shape[1:])
        if "int" in str(spec.dtype):
            values = rng.integers(0, 6, shape)
            values[:, -1] = 0  # padding tokens (masked where the embedding masks zeros)
            arrays.append(values.astype("int32"))
        else:
            arrays.append(rng.standard_normal(shape).astype("float32"))
    return arrays if len(arrays) > 1 else arrays[0]


NETS = {
    "dense_rank3": _dense_on_sequences,
    "conv2d": _conv2d,
    "conv2d_strided_same": lambda: _conv2d(strides=2, padding="same"),
    "conv2d_dilated": lambda: _conv2d(dilation_rate=2),
    "conv1d_causal_dilated": lambda: _conv1d(padding="causal", dilation_rate=2),
    "conv1d_strided_same": lambda: _conv1d(strides=2, padding="same"),
    "embedding": _embedding,
    "layer_norm": _layer_norm,
    "shared_noise_scale": lambda: _shared_noise_scale(on_sequences=False),
    "shared_noise_scale_on_sequences": lambda: _shared_noise_scale(on_sequences=True),
    "functional_two_branches": _two_branches,
    "subclassed_shared_layer": _subclassed,
    "shared_embedding_mixed_inputs": _shared_embedding_two_inputs,
}
RECURRENT = {
    "lstm": lambda: _recurrent(keras.layers.LSTM),
    "lstm_backwards_sequences": lambda: _recurrent(keras.layers.LSTM, go_backwards=True, return_sequences=True),
    "lstm_masked": lambda: _recurrent(keras.layers.LSTM, mask=True, return_sequences=True),
    "gru_reset_after": lambda: _recurrent(keras.layers.GRU),
    "gru_reset_before": lambda: _recurrent(keras.layers.GRU, reset_after=False),
    "gru_masked": lambda: _recurrent(keras.layers.GRU, mask=True),
}


# --- comparisons --------------------------------------------------------------------------------


def _assert_close(actual, expected, rtol=RTOL):
    assert_close_to_scale(actual, expected, rtol)


def _loop_rows(net, x, y):
    """Per-example gradients of the mean squared error one example at a time (a plain tape)."""
    loss = keras.losses.MeanSquaredError()
    rows = []
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            value = loss(y[i:i + 1], net(x[i:i + 1], training=True))
        rows.append(per_example.flatten(tape.gradient(value, net.trainable_variables)).numpy())
    return np.array(rows)


def _compare(net, reference, x, y, loss="mse", weights=None, rows=None):
    if rows is None:
        rows = per_example.per_example_gradients(reference, loss, x, y, weights).numpy()
    rows = np.asarray(rows, np.float64)
    expected = rows - rows.mean(axis=0)
    stats = per_example.layer_statistics(net, loss, x, y, weights)
    operator = stats.covariance_factor()
    rng = np.random.default_rng(1)
    block = rng.standard_normal((expected.shape[1], 2)).astype(np.float32)
    weights_n = rng.standard_normal((BATCH, 2)).astype(np.float32)

    assert float(stats.count) == BATCH and operator.num_cols == expected.shape[1]
    _assert_close(operator.to_dense(), expected)
    _assert_close(stats.diagonal_covariance(), np.sum(expected**2, axis=0) / (BATCH - 1))
    _assert_close(stats.covariance_trace(), np.sum(expected**2) / (BATCH - 1))
    _assert_close(operator.matvec(block), expected @ block)
    _assert_close(operator.rmatvec(weights_n), expected.T @ weights_n)
    gram = operator.gram().numpy()
    np.testing.assert_array_equal(gram, gram.T)
    _assert_close(gram, expected @ expected.T)
    return operator


def _targets(seed=0):
    return np.random.default_rng(seed + 100).standard_normal((BATCH, 2)).astype("float32")


# The default suite compares one net per kind of model (functional: Dense and Conv1D; subclassed:
# a shared Dense and LayerNormalization; a shared Embedding on mixed inputs) and the masked LSTM;
# the other variants (Conv2D, EinsumDense, GRU, ...) run with the slow tests (~2 s each).
DEFAULT_NETS = ("functional_two_branches", "subclassed_shared_layer", "shared_embedding_mixed_inputs",
                "shared_noise_scale_on_sequences")
DEFAULT_RECURRENT = ("lstm_masked",)


def _cases(names, default):
    return [pytest.param(name, marks=() if name in default else pytest.mark.slow) for name in sorted(names)]


@pytest.mark.parametrize("name", _cases(NETS, DEFAULT_NETS))
def test_rule_matches_the_vectorized_rows(name):
    _seed(0)
    net = NETS[name]()
    assert per_example.incompatibility(net) is None
    _compare(net, net, _inputs(net), _targets())


@pytest.mark.parametrize("name", _cases(RECURRENT, DEFAULT_RECURRENT))
def test_recurrent_rule_without_unrolling_matches_the_unrolled_vectorized_rows(name):
    net, reference = RECURRENT[name]()
    assert per_example.incompatibility(net) is None
    x = _inputs(net)
    _compare(net, reference, x, _targets())


def test_einsum_dense_matches_a_loop_over_examples():
    """EinsumDense against single-example gradients: tf.vectorized_map of this Einsum (TF 2.21)
    returns wrong rows or crashes the process, so the vectorized path is no reference here."""
    _seed(0)
    net = _einsum_dense()
    x, y = _inputs(net), _targets()
    _compare(net, None, x, y, rows=_loop_rows(net, x, y))


@pytest.mark.slow  # ~1.5 s; weights on the engine are checked in the default suite by test_dense_layers.py
def test_sample_weights_and_a_loss_object_reach_the_rows():
    """Weighted cross-entropy on a convolution: the weights change the statistics (guards the
    comparison against weights being dropped on both paths)."""
    _seed(1)
    net = _conv1d(strides=2, padding="same")
    x = _inputs(net)
    labels = np.random.default_rng(2).integers(0, 2, BATCH).astype("int32")
    weights = np.random.default_rng(3).uniform(0.2, 2.0, BATCH).astype("float32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _compare(net, net, x, labels, loss, weights)
    weighted = per_example.layer_statistics(net, loss, x, labels, weights).diagonal_covariance().numpy()
    plain = per_example.layer_statistics(net, loss, x, labels).diagonal_covariance().numpy()
    assert np.max(np.abs(weighted - plain)) > 0.05 * np.max(plain)


def test_each_block_keeps_the_cheaper_form():
    """Dense on [batch, features]: factors; convolutions and recurrences: explicit rows; a wide
    Dense on a short sequence: factors (n T (d + p) < d p); an Embedding: present tokens only."""
    a = tf.ones([8, 1, 30])
    assert isinstance(kt_blocks.factor_or_explicit(a, tf.ones([8, 1, 20]), True), kt_blocks.FactorBlock)
    wide = kt_blocks.factor_or_explicit(tf.ones([8, 2, 200]), tf.ones([8, 2, 200]), True)
    assert isinstance(wide, kt_blocks.FactorBlock) and wide.positions == 2
    conv = kt_blocks.factor_or_explicit(tf.ones([8, 900, 27]), tf.ones([8, 900, 16]), True)
    assert isinstance(conv, kt_blocks.ExplicitBlock) and conv.sizes == (27 * 16, 16)
    _seed(0)
    net = _embedding()
    operator = per_example.layer_statistics(net, "mse", _inputs(net), _targets()).covariance_factor()
    embedding_block = operator.blocks[0]
    assert isinstance(embedding_block, kt_blocks.SparseRowsBlock)
    # Ids 0..5 of a vocabulary of 7 in a batch of 8 x 6 tokens: at most min(7, 48) slots, never [n, V, dim]
    # per token position.
    assert embedding_block._rows.shape.as_list() == [BATCH, 7, 3]


def test_wide_dense_on_a_sequence_in_factor_form_matches_the_rows():
    """The T > 1 factor (Gram) form itself: products, Gram matrix and variances."""
    _seed(2)
    net = keras.Sequential([keras.Input((2, 40)), keras.layers.Dense(40, activation="tanh"),
                            keras.layers.Flatten(), keras.layers.Dense(2)])
    x = _inputs(net)
    operator = _compare(net, net, x, _targets())
    assert isinstance(operator.blocks[0], kt_blocks.FactorBlock) and operator.blocks[0].positions == 2


def test_explicit_rows_in_chunks_equal_the_whole():
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((10, 6, 4)).astype("float32"))
    delta = tf.constant(rng.standard_normal((10, 6, 3)).astype("float32"))
    whole = kt_blocks.explicit_gradients(a, delta).numpy()
    original = kt_blocks.CHUNK_ENTRIES
    kt_blocks.CHUNK_ENTRIES = 3 * 6 * 7  # three examples' factors per chunk: four chunks
    try:
        chunked = kt_blocks.explicit_gradients(a, delta).numpy()
        # Batch size unknown when traced: padded to whole chunks and mapped over.
        spec = [tf.TensorSpec([None, 6, 4]), tf.TensorSpec([None, 6, 3])]
        mapped = tf.function(kt_blocks.explicit_gradients, input_signature=spec)(a, delta).numpy()
    finally:
        kt_blocks.CHUNK_ENTRIES = original
    # Equal up to float32 rounding of 6-term sums: TensorFlow's CPU kernels may block a product
    # differently by shape and by the threads free at the time, so bit equality is not promised.
    bound = 6 * 2**-23 * np.abs(whole).max()
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=bound)
    np.testing.assert_allclose(mapped, whole, rtol=0, atol=bound)
    np.testing.assert_allclose(whole, np.einsum("ntd,ntp->ndp", a.numpy(), delta.numpy()).reshape(10, -1),
                               rtol=1e-6, atol=1e-6)


def _extracted_patches(layer, inputs):
    """The patches by `tf.image.extract_patches` (the independent reference for the slices)."""
    if layer.rank == 1:
        if layer.padding == "causal":
            inputs = tf.pad(inputs, [[0, 0], [layer.dilation_rate[0] * (layer.kernel_size[0] - 1), 0], [0, 0]])
        images, sizes = inputs[:, tf.newaxis], (1, *layer.kernel_size)
        strides, rates = (1, *layer.strides), (1, *layer.dilation_rate)
    else:
        images, sizes, strides, rates = inputs, layer.kernel_size, layer.strides, layer.dilation_rate
    extracted = tf.image.extract_patches(images, sizes=[1, *sizes, 1], strides=[1, *strides, 1],
                                         rates=[1, *rates, 1], padding="SAME" if layer.padding == "same" else "VALID")
    return tf.reshape(extracted, [tf.shape(inputs)[0], -1, extracted.shape[-1]])


PATCH_CASES = [  # (layer, input shape): every padding, strides and dilation, odd and even sizes
    *[(keras.layers.Conv2D(2, kernel, strides=strides, dilation_rate=dilation, padding=padding), shape)
      for kernel, strides, dilation in [(3, 1, 1), ((2, 3), (2, 1), 1), ((4, 2), (3, 2), 1), (3, 1, (2, 1))]
      for padding in ("valid", "same") for shape in [(9, 8, 2), (10, 7, 2)]],
    *[(keras.layers.Conv1D(2, kernel, strides=strides, dilation_rate=dilation, padding=padding), (11, 2))
      for kernel, strides, dilation in [(3, 1, 1), (4, 3, 1), (2, 2, 1), (3, 1, 3)]
      for padding in ("valid", "same", "causal")],
]


def test_convolution_patches_equal_the_extracted_patches():
    """The strided slices are copies of the same input values: equal, also with the spatial sizes
    known only at run time. (A wrong offset, stride or padding split moves whole patches.)"""
    rng = np.random.default_rng(0)
    for layer, shape in PATCH_CASES:
        x = tf.constant(rng.standard_normal((3, *shape)).astype("float32"))
        expected = _extracted_patches(layer, x).numpy()
        np.testing.assert_array_equal(conv_rule.patches(layer, x).numpy(), expected, err_msg=str(layer.get_config()))
        if layer.padding == "valid" or max(layer.strides + layer.dilation_rate) == 1:
            continue  # run-time sizes: the cases whose padding and output size depend on them (one trace each)
        dynamic = tf.function(lambda x, layer=layer: conv_rule.patches(layer, x),
                              input_signature=[tf.TensorSpec([None] * len(shape) + [shape[-1]])])
        np.testing.assert_array_equal(dynamic(x).numpy(), expected, err_msg=str(layer.get_config()))


def test_convolution_rows_in_chunks_equal_the_whole():
    """The rule's per-offset products, one chunk of examples at a time (static and run-time batch
    size), against one product of the whole patches."""
    _seed(3)
    layer = keras.layers.Conv2D(3, 3, strides=2, padding="same")
    layer.build((None, 9, 9, 2))
    rng = np.random.default_rng(4)
    x = tf.constant(rng.standard_normal((10, 9, 9, 2)).astype("float32"))
    delta = tf.constant(rng.standard_normal((10, 25, 3)).astype("float32"))
    contract = lambda inputs, deltas: conv_rule.kernel_rows(layer, inputs, deltas)  # noqa: E731
    whole = kt_blocks.explicit_gradients(conv_rule.patches(layer, x), delta).numpy()
    per_offset = contract((x,), delta).numpy()
    original = kt_blocks.CHUNK_ENTRIES
    kt_blocks.CHUNK_ENTRIES = 3 * 25 * (18 + 3)  # three examples' patches and errors per chunk
    try:
        chunked = kt_blocks.explicit_gradients((x,), delta, contract=contract, input_width=18).numpy()
        spec = [tf.TensorSpec([None, 9, 9, 2]), tf.TensorSpec([None, 25, 3])]
        mapped = tf.function(lambda x, delta: kt_blocks.explicit_gradients((x,), delta, contract=contract, input_width=18),
                             input_signature=spec)(x, delta).numpy()
    finally:
        kt_blocks.CHUNK_ENTRIES = original
    # Sums of the same 25 position terms, possibly in another grouping (TensorFlow's CPU kernels
    # may block a product differently by shape and by the threads free at the time): float32
    # rounding of the largest row.
    bound = 25 * 2**-23 * np.abs(whole).max()
    np.testing.assert_allclose(chunked, per_offset, rtol=0, atol=bound)
    np.testing.assert_allclose(mapped, per_offset, rtol=0, atol=bound)
    np.testing.assert_allclose(per_offset, whole, rtol=0, atol=bound)


def test_variables_in_another_order_than_the_layers_are_placed_by_variable():
    """A subclassed model creating its head before its body: model.trainable_variables lists the
    head first, the engine's blocks come in call order."""

    class HeadFirst(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(2)
            self.body = keras.layers.Conv1D(3, 3, activation="tanh")

        def call(self, inputs):
            return self.head(keras.layers.Flatten()(self.body(inputs)))

    _seed(4)
    net = HeadFirst()
    net(np.zeros((1, 11, 2), "float32"))
    assert net.trainable_variables[0] is net.head.kernel
    _compare(net, net, _inputs(_conv1d()), _targets())


@pytest.mark.slow  # ~7 s of XLA compilation; the Dense-only version runs in test_dense_layers.py
def test_runs_inside_a_compiled_function():
    _seed(0)
    net = _conv1d(padding="causal", dilation_rate=2)
    x, y = _inputs(net), _targets()

    def statistics(x, y):
        stats = per_example.layer_statistics(net, "mse", x, y)
        return stats.diagonal_covariance(), stats.covariance_trace(), stats.covariance_factor().gram()

    compiled = tf.function(statistics, jit_compile=True)(x, y)
    for got, expected in zip(compiled, statistics(x, y)):
        _assert_close(got, expected)


# --- what the engine refuses, and the fallback --------------------------------------------------


class _OwnWeights(keras.layers.Layer):
    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        return inputs * self.scale


def test_a_layer_without_a_rule_makes_auto_fall_back_with_one_log_line(caplog):
    _seed(0)
    net = keras.Sequential([keras.Input((3,)), _OwnWeights(name="custom_scale"), keras.layers.Dense(2)])
    reason = per_example.incompatibility(net)
    assert "custom_scale" in reason and "no per-example rule" in reason
    with pytest.raises(ValueError, match="custom_scale"):
        per_example.layer_statistics(net, "mse", np.ones((4, 3), "float32"), np.ones((4, 2), "float32"))
    model = kt.BayesianModel(net, CCAdL(1e-3), num_examples=8, seed=0)
    assert model.per_example_path == "vectorized"
    model.compile(loss="mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    with caplog.at_level(logging.WARNING, logger="keras_thermo"):
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    fallback = [r for r in caplog.records if "tf.vectorized_map" in r.getMessage()]
    assert len(fallback) == 1 and "custom_scale" in fallback[0].getMessage()
    forced = kt.BayesianModel(net, CCAdL(1e-3), num_examples=8, seed=0, per_example_method="layers")
    forced.compile(loss="mse")
    with pytest.raises(ValueError, match="per_example_method.*'layers'.*custom_scale"):
        forced.fit(x, y, batch_size=4, verbose=0)


def test_training_mode_batch_normalization_is_refused_by_name():
    _seed(0)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                            keras.layers.BatchNormalization(name="batch_norm_in_training"), keras.layers.Dense(2)])
    model = kt.BayesianModel(net, MCCAdL(1e-3), num_examples=8, seed=0)
    model.compile(loss="mse")
    with pytest.raises(ValueError, match="batch_norm_in_training.*BatchNormalization in training mode"):
        model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=4, verbose=0)


def test_frozen_batch_normalization_and_parameter_free_layers_pass_through():
    _seed(0)
    frozen = keras.layers.BatchNormalization()
    net = keras.Sequential([keras.Input((9, 9, 2)), keras.layers.Conv2D(3, 3), frozen, keras.layers.ReLU(),
                            keras.layers.Dropout(0.0), keras.layers.AveragePooling2D(2), keras.layers.Reshape((-1,)),
                            keras.layers.Dense(2)])
    frozen.trainable = False
    net.layers[1].moving_variance.assign(np.full(3, 2.0, "float32"))  # not the identity
    _compare(net, net, _inputs(net), _targets())


def test_layers_calling_sublayers_on_reshaped_batches_are_refused():
    net = keras.Sequential([keras.Input((3, 4)), keras.layers.TimeDistributed(keras.layers.Dense(2), name="per_step"),
                            keras.layers.Flatten(), keras.layers.Dense(1)])
    assert "per_step" in per_example.incompatibility(net)


# --- the samplers on the engine -----------------------------------------------------------------


def _paper_like(kind, unroll=False):
    _seed(7)
    if kind == "mlp":
        layers = [keras.Input((12,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    elif kind == "lstm":  # the Fashion-MNIST LSTM in small: rows of an image as time steps
        layers = [keras.Input((5, 6)), keras.layers.LSTM(8, unroll=unroll), keras.layers.Activation("relu"),
                  keras.layers.Dense(6, activation="relu"), keras.layers.Dense(3)]
    else:  # the CIFAR-10 CNN in small
        layers = [keras.Input((10, 10, 2)), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.MaxPooling2D(2),
                  keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                  keras.layers.Dense(6, activation="relu"), keras.layers.Dense(3)]
    return keras.Sequential(layers)


def _chain(kind, make_sampler, method, steps, nudge=False):
    """`steps` steps of the sampler on `kind`'s net by `method`; `nudge` moves every initial weight
    by one float32 ulp (the chain's own sensitivity to rounding, `_separation`)."""
    net = _paper_like(kind, unroll=method == "vectorized")
    if nudge:
        for variable in net.trainable_variables:
            value = variable.numpy()
            variable.assign(np.nextafter(value, np.float32(np.inf)).astype(value.dtype))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, *net.input_shape[1:])).astype("float32")
    labels = rng.integers(0, 3, 64).astype("int32")
    model = kt.BayesianModel(net, make_sampler(), num_examples=64, prior=kt.priors.Gaussian(1.0), seed=SEED,
                             per_example_method=method)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=steps)
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(16).repeat()
    history = model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    assert model.per_example_path == method
    return model, history


class _OwnLoss(kt.BayesianModel):
    """A model whose loss is not Keras' compiled loss plus `self.losses`."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return 2.0 * super().compute_loss(x, y, y_pred, sample_weight, training)


@pytest.mark.parametrize("kind", ["mlp", "lstm", "cnn"])
def test_the_force_from_the_engine_backward_pass_is_the_potential_gradient(kind):
    """The covariance samplers take the loss term of F from the per-example backward pass (the
    rows of G summed) and only the prior and the weight regularizers from the train step's tape:
    F equals -grad U of `compute_potential`, with a kernel regularizer, a prior, sample weights
    and `loss_weights`. The two differ only in the order of float32 sums over the batch
    (16 examples, a few dozen terms each): 1e-5 of the largest entry is about 80 float32 ulps."""
    net = _paper_like(kind)
    net.layers[-1].kernel.regularizer = keras.regularizers.L2(0.1)  # a loss of the weights alone
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((16, *net.input_shape[1:])).astype("float32"))
    y = tf.constant(rng.integers(0, 3, 16).astype("int32"))
    weights = tf.constant(rng.uniform(0.5, 1.5, 16).astype("float32"))
    for model_type, shared in [(kt.BayesianModel, True), (_OwnLoss, False)]:
        model = model_type(net, CCAdL(1e-3), num_examples=500, prior=kt.priors.Gaussian(0.5), seed=SEED)
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), loss_weights=[0.5])
        cross = kt._distribute.CrossReplica()
        recording = per_example.Recording(net, model.trainable_variables)
        assert model._shares_backward_pass(recording, cross) is shared
        force, potential, _, _, statistics = model._force_and_statistics(x, y, weights, cross, recording)
        with tf.GradientTape() as tape:
            expected_potential, _, _ = model.compute_potential(x, y, weights)
        expected = tape.gradient(expected_potential, model.trainable_variables)
        assert net.losses, "the regularizer adds a loss"
        np.testing.assert_allclose(float(potential), float(expected_potential), rtol=1e-6)
        assert statistics.diagonal_covariance().shape == [sum(int(np.prod(v.shape)) for v in net.trainable_variables)]
        for f, g, v in zip(force, expected, model.trainable_variables):
            scale = float(np.max(np.abs(g.numpy())))
            np.testing.assert_allclose(-f.numpy(), g.numpy(), rtol=0, atol=1e-5 * scale, err_msg=v.path)


SAMPLERS = {
    "ccadl_diag": lambda: CCAdL(1e-3), "ccadl_full": lambda: CCAdL(1e-3, covariance="full"),
    "mccadl_taylor": lambda: MCCAdL(1e-2, covariance="minibatch", expm="taylor"),
    "mccadl_gram": lambda: MCCAdL(1e-2, covariance="minibatch", expm="gram"),
}


def _separation(a, b) -> float:
    """The largest difference of two `(model, history)` runs: of any variable, relative to its
    largest entry, and of the logged noise scale, relative to it."""
    (model_a, history_a), (model_b, history_b) = a, b
    worst = 0.0
    for u, v in zip(model_a.variables, model_b.variables):
        got, want = np.asarray(u.numpy(), np.float64), np.asarray(v.numpy(), np.float64)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        if scale > 0:
            worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    got, want = (np.asarray(h.history["noise_scale"], np.float64) for h in (history_a, history_b))
    return max(worst, float(np.max(np.abs(got - want) / np.abs(want))))


def _assert_same_chain(kind, sampler, steps, rtol, *, beyond_predictability=False):
    """The engine's and the vectorized per-example paths run the same chain: every variable
    within `rtol` of its largest entry, and the logged noise scales within `rtol`.

    With `beyond_predictability`, a run long enough for the chain to forget float32 rounding
    (its own start moved by one ulp ends farther than `rtol` from it, in a variable or the noise
    scale) is held instead to differ from the other path by no more than three times that: over
    such a horizon two exact implementations part as far as rounding alone parts a chain from
    itself."""
    engine, engine_history = _chain(kind, SAMPLERS[sampler], "layers", steps)
    rows, rows_history = _chain(kind, SAMPLERS[sampler], "vectorized", steps)
    assert engine.sampler_step == rows.sampler_step == steps
    paths = _separation((engine, engine_history), (rows, rows_history))
    if beyond_predictability and paths > rtol:
        nudged = _separation((engine, engine_history), _chain(kind, SAMPLERS[sampler], "layers", steps, nudge=True))
        assert nudged > rtol, f"the paths part by {paths:.3g}, rounding alone by {nudged:.3g}"
        assert paths <= 3.0 * nudged, f"the paths part by {paths:.3g}, rounding alone by {nudged:.3g}"
        return
    for a, b in zip(engine.variables, rows.variables):
        got, want = np.asarray(a.numpy(), np.float64), np.asarray(b.numpy(), np.float64)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale, err_msg=a.path)
    np.testing.assert_allclose(engine_history.history["noise_scale"], rows_history.history["noise_scale"], rtol=rtol)


def test_the_chain_comparison_rejects_a_variance_off_by_one_percent(monkeypatch):
    """The comparison above fails when the engine's diagonal variances are 1% too large."""
    exact = kt_blocks._dense_column_squares  # both the joined and the per-variable squares read it
    monkeypatch.setattr(kt_blocks, "_dense_column_squares", lambda *args: [1.01 * s for s in exact(*args)])
    with pytest.raises(AssertionError, match="noise_scale|Not equal"):
        _assert_same_chain("mlp", "ccadl_diag", 20, rtol=1e-4)


@pytest.mark.slow  # 5-30 s each; the default suite compares the chains on an MLP (test_ccadl_mccadl.py)
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("kind", ["lstm", "cnn"])
def test_engine_and_vectorized_chains_agree(kind, sampler):
    """20 steps of each covariance sampler on a small LSTM (unroll=False on the engine) and CNN.
    (The MLP, all Dense, is compared this way in test_ccadl_mccadl.py.)"""
    _assert_same_chain(kind, sampler, 20, rtol=1e-4)


@pytest.mark.slow  # 10 s to 3 min each on 2 loaded cores
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("kind", ["mlp", "lstm", "cnn"])
def test_engine_and_vectorized_chains_agree_over_300_steps(kind, sampler):
    """Where the chain is still predictable after 300 steps the paths agree to 1e-3. mCCAdL's
    minibatch C step on the CNN is not (a one-ulp nudge of its start parts it from itself by more
    than that), and is held to what rounding does (`_assert_same_chain`): there this comparison
    cannot see an error in the statistics, which the 20-step comparison above does (its control:
    `test_the_chain_comparison_rejects_a_variance_off_by_one_percent`)."""
    _assert_same_chain(kind, sampler, 300, rtol=1e-3, beyond_predictability=True)


@pytest.mark.parametrize("sampler", [pytest.param(CCAdL, marks=pytest.mark.slow), MCCAdL])
def test_a_user_written_lstm_runs_under_the_covariance_samplers(sampler):
    """`keras.layers.LSTM(16)` as a user writes it (unroll=False) through fit."""
    _seed(0)
    net = keras.Sequential([keras.Input((6, 4)), keras.layers.LSTM(16), keras.layers.Dense(3)])
    model = kt.BayesianModel(net, sampler(1e-3), num_examples=16, seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6, 4)).astype("float32"), rng.integers(0, 3, 16).astype("int32")
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model.per_example_path == "layers" and model.sampler_step == 2
    assert np.all(np.isfinite(history.history["noise_scale"])) and history.history["noise_scale"][-1] > 0


def test_per_variable_variances_are_the_flat_ones_without_joining_them():
    """`variable_diagonal_covariances` gives each variable's share of `diagonal_covariance`,
    bit for bit, for blocks of several slots placed out of model order (and for dense rows)."""
    from keras_thermo.per_example.statistics import LayerRows, LayerStatistics, PerExampleGradients
    rng = np.random.default_rng(0)
    first = kt_blocks.ExplicitBlock(tf.constant(rng.normal(size=(5, 7)), tf.float32), (4, 3))
    second = kt_blocks.ExplicitBlock(tf.constant(rng.normal(size=(5, 2)), tf.float32), (2,))
    like = [tf.zeros([3]), tf.zeros([2, 1]), tf.zeros([2, 2])]  # slots (0, 1), (1, 0), (0, 0)
    for stats in (LayerStatistics(LayerRows([first, second], ((0, 1), (1, 0), (0, 0)))),
                  PerExampleGradients(tf.constant(rng.normal(size=(5, 9)), tf.float32))):
        flat = stats.diagonal_covariance().numpy()
        pieces = stats.variable_diagonal_covariances(like)
        assert [p.shape.as_list() for p in pieces] == [[3], [2, 1], [2, 2]]
        np.testing.assert_array_equal(np.concatenate([p.numpy().ravel() for p in pieces]), flat)
