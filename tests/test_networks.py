"""Tests for keras_thermo.networks: hand-counted parameters, numpy forward-pass references,
and per-example gradients through tf.vectorized_map."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_thermo import networks


def weights_of(model, layer_name):
    return [w.numpy().astype(np.float64) for w in model.get_layer(layer_name).weights]


def relu(x):
    return np.maximum(x, 0.0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize(
    "build, input_shape, num_params",
    [
        # 784*100 + 100 (hidden) + 100*47 + 47 (logits)
        (networks.emnist_mlp, (784,), 784 * 100 + 100 + 100 * 47 + 47),
        # LSTM: 4 gates x (input kernel 28*128 + recurrent 128*128 + bias 128);
        # dense 128*64 + 64; logits 64*10 + 10.
        (
            networks.fashion_mnist_lstm,
            (28, 28),
            4 * (28 * 128 + 128 * 128 + 128) + 128 * 64 + 64 + 650,
        ),
        # conv 3*3*3*16 + 16; conv 3*3*16*16 + 16; valid padding: 32 -> 30 -> 15 -> 13 -> 6,
        # flatten 6*6*16 = 576; dense 576*100 + 100; logits 100*10 + 10.
        (networks.cifar10_cnn, (32, 32, 3), 448 + 2320 + 576 * 100 + 100 + 1010),
        # 64*50 + 50 + 50*10 + 10
        (networks.digits_mlp, (64,), 64 * 50 + 50 + 50 * 10 + 10),
        # weights + intercept
        (lambda: networks.logistic_regression(64), (64,), 64 + 1),
    ],
)
def test_parameter_counts_and_output_shapes(build, input_shape, num_params):
    model = build()
    assert model.count_params() == num_params
    assert tuple(model.inputs[0].shape[1:]) == input_shape
    x = np.random.default_rng(0).uniform(size=(3, *input_shape)).astype(np.float32)
    out = model(x).numpy()
    expected_outputs = model.layers[-1].units
    assert out.shape == (3, expected_outputs) and np.all(np.isfinite(out))


def test_variant_parameter_counts():
    # "same" padding: 32 -> 16 -> 8, flatten 8*8*16 = 1024.
    assert networks.cifar10_cnn(padding="same").count_params() == 448 + 2320 + 1024 * 100 + 100 + 1010
    # 64 -> 32 -> 16 -> 10
    assert networks.digits_mlp(hidden=(32, 16)).count_params() == (64 * 32 + 32) + (32 * 16 + 16) + (
        16 * 10 + 10
    )
    assert networks.digits_mlp(hidden=()).count_params() == 64 * 10 + 10
    assert networks.logistic_regression(5, use_bias=False).count_params() == 5
    assert networks.emnist_mlp(num_classes=10, hidden_units=20).count_params() == 784 * 20 + 20 + 210
    wide = networks.image_mlp(hidden=(1000, 1000))
    assert wide.count_params() == 784 * 1000 + 1000 + 1000 * 1000 + 1000 + 1000 * 10 + 10
    assert [layer.name for layer in wide.layers] == ["hidden1", "hidden2", "logits"] and wide.name == "image_mlp"
    assert wide.input_shape == (None, 784)
    lstm = networks.fashion_mnist_lstm()
    assert lstm.get_layer("lstm").count_params() == 80384


def test_names():
    builders = (networks.emnist_mlp, networks.fashion_mnist_lstm, networks.cifar10_cnn, networks.digits_mlp)
    assert [build().name for build in builders] == [
        "emnist_mlp",
        "fashion_mnist_lstm",
        "cifar10_cnn",
        "digits_mlp",
    ]
    assert networks.logistic_regression(3).name == "logistic_regression"


def test_mlp_outputs_logits_of_a_relu_network():
    model = networks.emnist_mlp()
    x = np.random.default_rng(1).uniform(size=(5, 784))
    w1, b1 = weights_of(model, "hidden")
    w2, b2 = weights_of(model, "logits")
    reference = relu(x @ w1 + b1) @ w2 + b2  # no softmax: raw logits
    np.testing.assert_allclose(model(x.astype(np.float32)).numpy(), reference, rtol=1e-4, atol=1e-5)


def test_logistic_regression_is_one_affine_logit():
    model = networks.logistic_regression(7)
    x = np.random.default_rng(2).normal(size=(4, 7))
    w, b = weights_of(model, "logit")
    np.testing.assert_allclose(model(x.astype(np.float32)).numpy(), x @ w + b, rtol=1e-5, atol=1e-6)


def lstm_reference(x, kernel, recurrent, bias):
    """Keras gate order (input, forget, candidate, output); returns the last hidden state."""
    units = recurrent.shape[0]
    h = np.zeros((x.shape[0], units))
    c = np.zeros_like(h)
    for t in range(x.shape[1]):  # one image row per step
        z = x[:, t] @ kernel + h @ recurrent + bias
        i, f = sigmoid(z[:, :units]), sigmoid(z[:, units : 2 * units])
        g, o = np.tanh(z[:, 2 * units : 3 * units]), sigmoid(z[:, 3 * units :])
        c = f * c + i * g
        h = o * np.tanh(c)
    return h


@pytest.mark.parametrize("unroll", [True, False])
def test_lstm_reads_rows_and_matches_numpy_reference(unroll):
    model = networks.fashion_mnist_lstm(unroll=unroll)
    x = np.random.default_rng(3).uniform(size=(2, 28, 28))
    h = lstm_reference(x, *weights_of(model, "lstm"))
    w1, b1 = weights_of(model, "hidden")
    w2, b2 = weights_of(model, "logits")
    reference = relu(relu(h) @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(model(x.astype(np.float32)).numpy(), reference, rtol=1e-4, atol=1e-5)


def conv_valid(x, kernel, bias):
    """3x3 'valid' cross-correlation, stride 1, channels last."""
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # [b,h,w,c,3,3]
    return np.einsum("bhwcij,ijco->bhwo", windows, kernel) + bias


def max_pool_2x2(x):
    b, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def test_cnn_matches_numpy_reference():
    model = networks.cifar10_cnn()
    x = np.random.default_rng(4).uniform(size=(2, 32, 32, 3))
    a = max_pool_2x2(relu(conv_valid(x, *weights_of(model, "conv1"))))
    a = max_pool_2x2(relu(conv_valid(a, *weights_of(model, "conv2"))))
    assert a.shape == (2, 6, 6, 16)
    w1, b1 = weights_of(model, "hidden")
    w2, b2 = weights_of(model, "logits")
    reference = relu(a.reshape(2, -1) @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(model(x.astype(np.float32)).numpy(), reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "build, input_shape, num_classes",
    [
        (networks.emnist_mlp, (784,), 47),
        (networks.fashion_mnist_lstm, (28, 28), 10),
        (networks.cifar10_cnn, (32, 32, 3), 10),
        (networks.digits_mlp, (64,), 10),
    ],
)
def test_per_example_gradients_vectorize(build, input_shape, num_classes):
    # No layer couples the examples of a batch: gradients from tf.vectorized_map match those
    # of each example computed alone.
    model = build()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(5)
    x = tf.constant(rng.uniform(size=(3, *input_shape)), tf.float32)
    y = tf.constant(rng.integers(0, num_classes, size=3))

    def gradient(example):
        xi, yi = example
        with tf.GradientTape() as tape:
            loss = loss_fn(yi[None], model(xi[None]))
        return tape.gradient(loss, model.trainable_variables)

    batched = tf.function(lambda x, y: tf.vectorized_map(gradient, (x, y)))(x, y)
    for i in range(3):
        single = gradient((x[i], y[i]))
        for g_batched, g_single in zip(batched, single):
            np.testing.assert_allclose(g_batched[i].numpy(), g_single.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: networks.cifar10_cnn(padding="full"),
            ValueError,
            r"`padding` must be one of \['valid', 'same'\], got 'full'",
        ),
        (
            lambda: networks.digits_mlp(hidden=(10, 0)),
            ValueError,
            r"`hidden\[1\]` must be an integer >= 1, got 0",
        ),
        (
            lambda: networks.logistic_regression(0),
            ValueError,
            "`num_features` must be an integer >= 1",
        ),
        (lambda: networks.emnist_mlp(num_classes=1), ValueError, "`num_classes`"),
        (lambda: networks.digits_mlp(hidden=2.5), TypeError, "hidden"),
    ],
)
def test_invalid_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
