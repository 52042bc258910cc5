"""Tests of the explicit per-example rows (`keras_thermo.per_example.per_example_gradients`), the
covariance estimators over them (`PerExampleGradients`) and `flatten` / `unflatten`.

References are independent of the code under test: per-example gradients are
recomputed one example at a time with ``tf.GradientTape`` and flattened with
numpy, sample weights are applied by hand, and the covariances come from
``np.var``/``np.cov``. Tolerances: float32 gradients of O(1) size whose sums
run over at most a few hundred terms agree to ~1e-6; 1e-5 leaves room for the
different summation order of the vectorized ops.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_thermo import _tree, per_example

tf.get_logger().setLevel(logging.ERROR)  # pfor logs the ops it cannot convert

BATCH = 6
NUM_CLASSES = 3
ATOL = 1e-5
RTOL = 1e-4


# --- models and data ------------------------------------------------------


def _mlp() -> tuple[keras.Model, np.ndarray]:
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    return model, np.random.default_rng(1).normal(size=(BATCH, 5)).astype("float32")


def _functional() -> tuple[keras.Model, dict]:
    a = keras.Input((4,), name="a")
    b = keras.Input((2,), name="b")
    hidden = keras.layers.Dense(6, activation="relu")(a)
    merged = keras.layers.Concatenate()([hidden, keras.layers.Dense(3)(b)])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(NUM_CLASSES)(merged))
    rng = np.random.default_rng(2)
    x = {
        "a": rng.normal(size=(BATCH, 4)).astype("float32"),
        "b": rng.normal(size=(BATCH, 2)).astype("float32"),
    }
    return model, x


def _conv() -> tuple[keras.Model, np.ndarray]:
    model = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(3, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    x = np.random.default_rng(3).normal(size=(BATCH, 6, 6, 1)).astype("float32")
    return model, x


def _lstm() -> tuple[keras.Model, np.ndarray]:
    # Embedding first: its IndexedSlices gradient must be densified, and the
    # LSTM must pass gradients back to its inputs.
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(10, 3),
            keras.layers.LSTM(4, unroll=True),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    # Repeated token ids: their embedding rows must add up.
    x = np.random.default_rng(4).integers(0, 10, size=(BATCH, 5)).astype("int32")
    return model, x


MODELS = {"mlp": _mlp, "functional": _functional, "conv": _conv, "lstm": _lstm}


def _loss_and_targets(name: str):
    rng = np.random.default_rng(5)
    if name == "mse":
        return (
            keras.losses.MeanSquaredError(),
            rng.normal(size=(BATCH, NUM_CLASSES)).astype("float32"),
        )
    return (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        rng.integers(0, NUM_CLASSES, size=BATCH).astype("int32"),
    )


def _example(x, i: int):
    return tf.nest.map_structure(lambda t: t[i : i + 1], x)


def _flat_gradient(tape: tf.GradientTape, loss, variables) -> np.ndarray:
    """The gradient of ``loss``, densified and flattened with numpy."""
    gradients = tape.gradient(loss, variables)
    return np.concatenate(
        [
            np.zeros(v.shape).ravel() if g is None else tf.convert_to_tensor(g).numpy().ravel()
            for g, v in zip(gradients, variables)
        ]
    )


def _reference_rows(model, loss_fn, x, y, sample_weight=None) -> np.ndarray:
    """Gradients of each example's unweighted loss, one at a time, times w_i."""
    rows = []
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i : i + 1], model(_example(x, i), training=True))
        row = _flat_gradient(tape, loss, model.trainable_variables)
        rows.append(row if sample_weight is None else sample_weight[i] * row)
    return np.stack(rows)


# --- per-example gradients ------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("loss_name", ["mse", "sparse_ce"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_per_example_gradients_match_one_at_a_time(model_name, loss_name, weighted):
    keras.utils.set_random_seed(0)
    model, x = MODELS[model_name]()
    loss_fn, y = _loss_and_targets(loss_name)
    weights = np.linspace(0.5, 2.0, BATCH).astype("float32") if weighted else None
    num_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)

    g = per_example.per_example_gradients(model, loss_fn, x, y, sample_weight=weights)

    assert g.shape == (BATCH, num_params)
    expected = _reference_rows(model, loss_fn, x, y, weights)
    assert np.max(np.abs(expected)) > 1e-3  # the comparison is not 0 == 0
    np.testing.assert_allclose(g.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("model_name", ["mlp", "lstm"])
def test_mean_row_is_gradient_of_keras_batch_loss(model_name):
    # Ties G to the potential U = N * L: with Keras' default reduction the
    # weighted batch loss is the mean of the weighted per-example losses.
    keras.utils.set_random_seed(0)
    model, x = MODELS[model_name]()
    loss_fn, y = _loss_and_targets("sparse_ce")
    weights = np.linspace(0.5, 2.0, BATCH).astype("float32")
    with tf.GradientTape() as tape:
        batch_loss = loss_fn(y, model(x, training=True), sample_weight=weights)
    expected = _flat_gradient(tape, batch_loss, model.trainable_variables)

    g = per_example.per_example_gradients(model, loss_fn, x, y, sample_weight=weights)

    np.testing.assert_allclose(g.numpy().mean(axis=0), expected, rtol=RTOL, atol=ATOL)


def test_callable_and_named_losses():
    keras.utils.set_random_seed(0)
    model, x = _mlp()
    _, labels = _loss_and_targets("sparse_ce")
    targets = np.random.default_rng(6).normal(size=(BATCH, NUM_CLASSES)).astype("float32")
    weights = np.linspace(2.0, 0.5, BATCH).astype("float32")

    def cross_entropy(y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    g_callable = per_example.per_example_gradients(
        model, cross_entropy, x, labels, sample_weight=weights
    )
    g_named = per_example.per_example_gradients(model, "mean_squared_error", x, targets)

    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        g_callable.numpy(), _reference_rows(model, ce, x, labels, weights), rtol=RTOL, atol=ATOL
    )
    mse = keras.losses.MeanSquaredError()
    np.testing.assert_allclose(
        g_named.numpy(), _reference_rows(model, mse, x, targets), rtol=RTOL, atol=ATOL
    )


def test_columns_follow_trainable_variables_order():
    # Gradient of the loss 0.5 * ||W x + b||^2 through one Dense layer is known
    # in closed form: dW = x r^T, db = r with r = W x + b - y (y = 0).
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    kernel = np.arange(6, dtype="float32").reshape(3, 2) / 10
    bias = np.array([0.5, -1.0], dtype="float32")
    model.set_weights([kernel, bias])
    x = np.array([[1.0, 2.0, -1.0], [0.0, 1.0, 3.0]], dtype="float32")

    def half_squared_norm(y_true, y_pred):
        return 0.5 * tf.reduce_sum(tf.square(y_pred - y_true), axis=-1)

    g = per_example.per_example_gradients(model, half_squared_norm, x, np.zeros((2, 2), "float32"))

    residual = x @ kernel + bias
    expected = np.stack(
        [np.concatenate([np.outer(x[i], residual[i]).ravel(), residual[i]]) for i in range(2)]
    )
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["function", "xla"])
@pytest.mark.parametrize("model_name", ["mlp", "lstm"])
def test_inside_tf_function(model_name, jit_compile):
    keras.utils.set_random_seed(0)
    model, x = MODELS[model_name]()
    loss_fn, y = _loss_and_targets("sparse_ce")
    weights = np.linspace(0.5, 2.0, BATCH).astype("float32")

    @tf.function(jit_compile=jit_compile)
    def compute(x, y, w):
        return per_example.per_example_gradients(model, loss_fn, x, y, sample_weight=w)

    g = compute(x, y, weights)

    np.testing.assert_allclose(
        g.numpy(), _reference_rows(model, loss_fn, x, y, weights), rtol=RTOL, atol=ATOL
    )


class _NoiseProbe(keras.Model):
    """Logs tr(V) of each batch from inside the compiled train step."""

    def __init__(self, net: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.net = net

    def call(self, inputs, training=None):
        return self.net(inputs, training=training)

    def train_step(self, data):
        x, y = data
        g = per_example.per_example_gradients(self.net, self.loss, x, y)
        return {"trace_v": tf.reduce_sum(per_example.diagonal_covariance(g))}


def test_inside_fit_with_xla_and_steps_per_execution():
    keras.utils.set_random_seed(0)
    net, _ = _mlp()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 5)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, size=32).astype("int32")
    probe = _NoiseProbe(net)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    probe.compile(loss=loss_fn, jit_compile=True, steps_per_execution=2)

    history = probe.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert probe.jit_compile

    # The weights are not updated, so the last batch's value can be recomputed.
    rows = []
    for i in range(24, 32):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i : i + 1], net(x[i : i + 1], training=True))
        rows.append(_flat_gradient(tape, loss, net.trainable_variables))
    expected = np.var(np.stack(rows), axis=0, ddof=1).sum()
    np.testing.assert_allclose(history.history["trace_v"][-1], expected, rtol=1e-4)


# --- refused models -------------------------------------------------------


@pytest.mark.parametrize(
    "offending_layer, word",
    [
        (lambda: keras.layers.Dropout(0.2, name="offender"), "Dropout"),
        (lambda: keras.layers.BatchNormalization(name="offender"), "BatchNormalization"),
        (lambda: keras.layers.GaussianNoise(0.1, name="offender"), "GaussianNoise"),
        (lambda: keras.layers.GaussianDropout(0.1, name="offender"), "GaussianDropout"),
        (lambda: keras.layers.AlphaDropout(0.1, name="offender"), "AlphaDropout"),
        (lambda: keras.layers.ActivityRegularization(l1=0.1, name="offender"), "activity"),
        (lambda: keras.layers.Dense(4, activity_regularizer="l2", name="offender"), "activity"),
        (lambda: keras.layers.RandomFlip(name="offender"), "augmentation"),
    ],
    ids=["dropout", "batchnorm", "gaussian_noise", "gaussian_dropout", "alpha_dropout",
         "activity_layer", "activity_regularizer", "random_flip"],
)
def test_refuses_layers_that_couple_or_randomise(offending_layer, word):
    # The offender sits in a nested model: the check must walk into it.
    inner = keras.Sequential([keras.layers.Dense(4), offending_layer()], name="inner")
    model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2)])
    x = np.ones((3, 4), "float32")
    with pytest.raises(ValueError, match="offender") as info:
        per_example.per_example_gradients(model, "mse", x, np.ones((3, 2), "float32"))
    assert word in str(info.value)


@pytest.mark.parametrize(
    "recurrent, word",
    [
        (lambda: keras.layers.LSTM(3, unroll=False, name="offender"), "unroll=True"),
        (lambda: keras.layers.LSTM(3, unroll=True, dropout=0.1, name="offender"), "dropout"),
        (lambda: keras.layers.GRU(3, unroll=True, recurrent_dropout=0.1, name="offender"),
         "recurrent_dropout"),
    ],
    ids=["lstm_not_unrolled", "lstm_dropout", "gru_recurrent_dropout"],
)
def test_refuses_recurrent_settings(recurrent, word):
    model = keras.Sequential([keras.Input((5, 2)), recurrent(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="offender") as info:
        per_example.check_per_example_compatible(model)
    assert word in str(info.value)


class _TrainingScale(keras.layers.Layer):
    """Doubles its input in training mode only (deterministic)."""

    def call(self, inputs, training=None):
        return inputs * 2.0 if training else inputs


def test_accepts_frozen_batchnorm_and_zero_rate_dropout():
    # _TrainingScale also checks that the model runs with training=True.
    keras.utils.set_random_seed(0)
    frozen = keras.layers.BatchNormalization()
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), frozen,
         keras.layers.Dropout(0.0), _TrainingScale(), keras.layers.Dense(4, activation="tanh"),
         keras.layers.Dense(NUM_CLASSES)]
    )
    frozen.trainable = False  # Keras 3 then runs it in inference mode
    x = np.random.default_rng(8).normal(size=(BATCH, 5)).astype("float32")
    loss_fn, y = _loss_and_targets("sparse_ce")

    g = per_example.per_example_gradients(model, loss_fn, x, y)

    expected = _reference_rows(model, loss_fn, x, y)
    np.testing.assert_allclose(g.numpy(), expected, rtol=RTOL, atol=ATOL)


def test_refuses_masked_outputs():
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(10, 3, mask_zero=True),
            keras.layers.LSTM(4, unroll=True, return_sequences=True),
            keras.layers.Dense(2),
        ]
    )
    x = np.ones((3, 5), "int32")
    with pytest.raises(ValueError, match="mask"):
        per_example.per_example_gradients(model, "mse", x, np.ones((3, 5, 2), "float32"))


def test_refuses_bad_loss_arguments():
    model, x = _mlp()
    y = np.zeros(BATCH, "int32")
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    with pytest.raises(ValueError, match="reduction"):
        per_example.per_example_gradients(model, summed, x, y)
    with pytest.raises(TypeError, match="loss_fn"):
        per_example.per_example_gradients(model, 3.0, x, y)
    with pytest.raises(ValueError, match=r"sample_weight.*\(6, 2\)"):
        per_example.per_example_gradients(
            model, lambda t, p: tf.reduce_sum(p), x, y, sample_weight=np.ones((BATCH, 2))
        )
    with pytest.raises(ValueError, match="`y` is None"):
        per_example.per_example_gradients(model, "mse", x, None)


class _HistogramScale(keras.layers.Layer):
    """Scales each input by 1 + its number of positive entries.

    HistogramFixedWidth has no pfor conversion, which makes this layer a
    stand-in for any op that tf.vectorized_map cannot vectorize.
    """

    def call(self, inputs):
        counts = tf.histogram_fixed_width(inputs, [-1.0, 1.0], nbins=2)
        return inputs * (1.0 + tf.cast(counts[1], inputs.dtype))

    def compute_output_shape(self, input_shape):
        return input_shape


def test_unvectorizable_op_error_and_while_loop_fallback():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3), _HistogramScale(), keras.layers.Dense(2)]
    )
    x = np.random.default_rng(9).normal(size=(BATCH, 4)).astype("float32")
    y = np.zeros((BATCH, 2), "float32")
    loss_fn = keras.losses.MeanSquaredError()

    with pytest.raises(ValueError, match="HistogramFixedWidth.*fallback_to_while_loop=True"):
        per_example.per_example_gradients(model, loss_fn, x, y)

    g = per_example.per_example_gradients(model, loss_fn, x, y, fallback_to_while_loop=True)
    expected = _reference_rows(model, loss_fn, x, y)
    np.testing.assert_allclose(g.numpy(), expected, rtol=RTOL, atol=ATOL)


# --- covariance estimators ------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_centered_and_covariances_match_numpy(dtype):
    rng = np.random.default_rng(10)
    g = (rng.normal(size=(7, 5)) * [1.0, 2.0, 0.1, 5.0, 1.0] + 3.0).astype(dtype)
    tol = 1e-5 if dtype == "float32" else 1e-12

    gc = per_example.centered(g).numpy()
    np.testing.assert_allclose(gc.sum(axis=0), 0.0, atol=tol * 10)
    np.testing.assert_allclose(gc, g - g.mean(axis=0), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        per_example.diagonal_covariance(g).numpy(), np.var(g, axis=0, ddof=1), rtol=tol
    )
    np.testing.assert_allclose(
        per_example.full_covariance(g).numpy(), np.cov(g, rowvar=False), rtol=tol, atol=tol
    )


def test_covariance_needs_two_rows():
    with pytest.raises(ValueError, match="n=1"):
        per_example.diagonal_covariance(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="n=1"):
        per_example.full_covariance(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="rank 2"):
        per_example.centered(np.ones(3, "float32"))

    # Batch size unknown while tracing: checked when the graph runs.
    unknown_rows = tf.function(
        per_example.diagonal_covariance, input_signature=[tf.TensorSpec([None, 3], tf.float32)]
    )
    variances = unknown_rows(np.eye(3, dtype="float32")).numpy()
    np.testing.assert_allclose(variances, [1 / 3] * 3, rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least 2"):
        unknown_rows(np.ones((1, 3), "float32"))


# --- flatten / unflatten --------------------------------------------------


def test_flatten_unflatten_round_trip_exactly():
    model, _ = _conv()
    variables = model.trainable_variables
    rng = np.random.default_rng(11)
    tensors = [rng.normal(size=v.shape).astype("float32") for v in variables]

    flat = _tree.flatten(tensors)
    np.testing.assert_array_equal(flat.numpy(), np.concatenate([t.ravel() for t in tensors]))

    back = _tree.unflatten(flat, variables)
    assert [b.shape.as_list() for b in back] == [list(v.shape) for v in variables]
    for original, restored in zip(tensors, back):
        np.testing.assert_array_equal(restored.numpy(), original)

    vector = rng.normal(size=flat.shape[0]).astype("float32")
    round_trip = _tree.flatten(_tree.unflatten(vector, variables))
    np.testing.assert_array_equal(round_trip.numpy(), vector)


def test_flatten_unflatten_refuse_bad_input():
    with pytest.raises(ValueError, match="empty"):
        _tree.flatten([])
    with pytest.raises(TypeError, match="dtype"):
        _tree.flatten([tf.ones(2, tf.float32), tf.ones(2, tf.float64)])
    with pytest.raises(ValueError, match="5 entries.*6"):
        _tree.unflatten(tf.zeros(5), [tf.ones([2, 3])])
    with pytest.raises(ValueError, match="rank 1"):
        _tree.unflatten(tf.zeros([2, 3]), [tf.ones([2, 3])])
