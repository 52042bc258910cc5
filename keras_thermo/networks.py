"""The benchmark networks, as Keras 3 `Sequential` builders.

Every builder returns a built `keras.Sequential` with an `Input` layer and a name. All output
logits (no softmax), to be paired with a `from_logits=True` loss. None uses Dropout or
BatchNorm: both make one example's output depend on random masks or on the other examples of
the batch, which breaks the per-example gradients some samplers need.

The first three are the networks of Luo et al. (2018), section 5.2; `digits_mlp` and
`logistic_regression` serve the offline digits demo and the logistic-regression benchmark, and
`image_mlp` the real-scale defaults benchmark on Fashion-MNIST.
"""

from __future__ import annotations

import numbers
from typing import Sequence

import keras

from keras_thermo._validation import check_choice, check_int


def emnist_mlp(num_classes: int = 47, hidden_units: int = 100) -> keras.Sequential:
    """784-100-47 multilayer perceptron with a ReLU hidden layer, for flattened EMNIST.

    Input `(784,)` (use `data.load_emnist_balanced(..., flatten=True)`), output 47 logits.
    `784*100 + 100 + 100*47 + 47 = 83,247` parameters.

    Example:
        >>> emnist_mlp().count_params()
        83247

    Reference:
        Luo et al. (2018), Thermostat-assisted continuously-tempered Hamiltonian Monte Carlo
        for Bayesian learning, NeurIPS, section 5.2 ("EMNIST classification with MLP").
    """
    num_classes = check_int("num_classes", num_classes, low=2)
    hidden_units = check_int("hidden_units", hidden_units, low=1)
    return keras.Sequential(
        [
            keras.Input(shape=(784,)),
            keras.layers.Dense(hidden_units, activation="relu", name="hidden"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="emnist_mlp",
    )


def fashion_mnist_lstm(unroll: bool = True, num_classes: int = 10) -> keras.Sequential:
    """LSTM(128) reading a 28x28 image row by row, then ReLU, Dense(64) ReLU, Dense(10) logits.

    Input `(28, 28)`: 28 time steps (rows) of 28 features (use
    `data.load_fashion_mnist(..., squeeze_channels=True)`). The LSTM's last output goes
    through a ReLU, as in the paper. Parameters: LSTM `4 (128 (28 + 128) + 128) = 80,384`,
    dense `128*64 + 64 = 8,256` and `64*10 + 10 = 650`; 89,290 in all.

    Args:
        unroll: Unroll the 28 steps into a static graph (the default) instead of a symbolic
            while-loop. With TensorFlow 2.21 `tf.vectorized_map` vectorises per-example
            gradients through either form (no per-example fallback loop); on a CPU at batch
            128 both took a few tenths of a second per batch, the unrolled one traced faster.
            Unrolling also keeps the graph free of control flow for other per-example tools.
        num_classes: Number of output logits.

    Example:
        >>> fashion_mnist_lstm().count_params()
        89290

    Reference:
        Luo et al. (2018), section 5.2 ("Fashion-MNIST classification with RNN").
    """
    num_classes = check_int("num_classes", num_classes, low=2)
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28)),
            keras.layers.LSTM(128, unroll=bool(unroll), name="lstm"),
            keras.layers.Activation("relu", name="lstm_relu"),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="fashion_mnist_lstm",
    )


def cifar10_cnn(padding: str = "valid", num_classes: int = 10) -> keras.Sequential:
    """Two 3x3x16 conv layers (ReLU, 2x2 max pooling each), Dense(100) ReLU, Dense(10) logits.

    Input `(32, 32, 3)`. The paper gives kernels, strides (1) and pooling (2x2) but not the
    padding; "valid" (no padding) is the default here, so the feature maps go
    32 -> 30 -> 15 -> 13 -> 6 and the flattened vector has `6*6*16 = 576` entries.
    Parameters: conv `3*3*3*16 + 16 = 448` and `3*3*16*16 + 16 = 2,320`, dense
    `576*100 + 100 = 57,700` and `100*10 + 10 = 1,010`; 61,478 in all (106,278 with "same").

    Args:
        padding: `"valid"` or `"same"` for both convolutions.
        num_classes: Number of output logits.

    Example:
        >>> cifar10_cnn().count_params()
        61478

    Reference:
        Luo et al. (2018), section 5.2 ("CIFAR-10 classification with CNN").
    """
    padding = check_choice("padding", padding, ("valid", "same"))
    num_classes = check_int("num_classes", num_classes, low=2)
    return keras.Sequential(
        [
            keras.Input(shape=(32, 32, 3)),
            keras.layers.Conv2D(16, 3, padding=padding, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2, name="pool1"),
            keras.layers.Conv2D(16, 3, padding=padding, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2, name="pool2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(100, activation="relu", name="hidden"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="cifar10_cnn",
    )


def digits_mlp(hidden: int | Sequence[int] = 50, num_classes: int = 10) -> keras.Sequential:
    """MLP for the 8x8 digits: 64 inputs, ReLU hidden layers, `num_classes` logits.

    Args:
        hidden: Width of the single hidden layer, or a sequence of widths (empty for
            multinomial logistic regression).
        num_classes: Number of output logits.

    Example:
        >>> digits_mlp(hidden=50).count_params()  # 64*50 + 50 + 50*10 + 10
        3760
    """
    return _relu_mlp(64, hidden, num_classes, "digits_mlp")


def image_mlp(hidden: int | Sequence[int] = (100, 100), num_classes: int = 10) -> keras.Sequential:
    """MLP for flattened 28x28 images (MNIST, Fashion-MNIST): 784 inputs, ReLU hidden layers
    (`hidden1`, `hidden2`, ...), `num_classes` logits. The default is the ordinary
    two-hidden-layer net of the real-scale defaults benchmark; use
    `data.load_fashion_mnist(..., flatten=True)`.

    Example:
        >>> image_mlp(hidden=(100, 100)).count_params()  # 784*100 + 100 + 100*100 + 100 + 100*10 + 10
        89610
    """
    return _relu_mlp(784, hidden, num_classes, "image_mlp")


def _relu_mlp(inputs: int, hidden, num_classes: int, name: str) -> keras.Sequential:
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        widths = [check_int("hidden", hidden, low=1)]
    elif isinstance(hidden, (list, tuple)):
        widths = [check_int(f"hidden[{i}]", w, low=1) for i, w in enumerate(hidden)]
    else:
        raise TypeError(
            f"`hidden` must be an integer or a list/tuple of integers, got {hidden!r} "
            f"({type(hidden).__name__})."
        )
    num_classes = check_int("num_classes", num_classes, low=2)
    layers: list[keras.layers.Layer] = [keras.Input(shape=(inputs,))]
    layers += [
        keras.layers.Dense(width, activation="relu", name=f"hidden{i + 1}")
        for i, width in enumerate(widths)
    ]
    layers.append(keras.layers.Dense(num_classes, name="logits"))
    return keras.Sequential(layers, name=name)


def logistic_regression(num_features: int, use_bias: bool = True) -> keras.Sequential:
    """Binary logistic regression: one `Dense(1)` layer giving the logit `z = w.x + b`.

    `p(y = 1 | x) = sigmoid(z)`. Train with
    `keras.losses.BinaryCrossentropy(from_logits=True)` on labels in `{0, 1}`; the per-example
    loss is then `log(1 + exp(-s z))` with `s = 2y - 1`, the likelihood of the logistic
    regression experiments of Wei & Shang (2026, eq. 31) and Shang et al. (2015). A single
    logit (not two softmax logits) keeps the model identifiable: two logits carry a redundant
    direction that a flat prior leaves unconstrained. `use_bias=False` gives the papers'
    `theta^T x` exactly (append a constant feature for an intercept there).

    Args:
        num_features: Input dimension.
        use_bias: Include an intercept `b`.

    Example:
        >>> logistic_regression(64).count_params()
        65
    """
    num_features = check_int("num_features", num_features, low=1)
    return keras.Sequential(
        [
            keras.Input(shape=(num_features,)),
            keras.layers.Dense(1, use_bias=bool(use_bias), name="logit"),
        ],
        name="logistic_regression",
    )
