"""What a net returns, logits or probabilities, read from its compiled loss and last activation.

Posterior predictions of softmax and sigmoid nets, and of logit nets, against numpy forward
passes at hand-set parameter vectors; the hints, their contradictions and their absence.
"""

import warnings

import keras
import numpy as np
import pytest
from scipy.special import expit, softmax

import keras_thermo as kt
from keras_thermo import posterior
from keras_thermo.callbacks import SampleCollector
from keras_thermo.posterior import PosteriorAverage, evaluate_posterior, predict_posterior, predict_samples

NUM_FEATURES, N = 2, 24
# Forward passes run in float32: relative errors ~1e-7 on probabilities and log losses.
RTOL = 1e-5


def _data(num_classes, n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, NUM_FEATURES)).astype("float32")
    return x, (np.arange(n) % max(num_classes, 2)).astype("int64")


def _dense_net(units, activation=None, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(units, activation=activation)])


def _vectors(units, count=3, seed=2):
    """`count` parameter vectors [kernel (2 x units), bias (units)] of moderate size."""
    return np.random.default_rng(seed).normal(size=(count, NUM_FEATURES * units + units)).astype("float32")


def _scores(vector, x, units):
    """Numpy pre-activation `x W + b` of a Dense(units) net at `vector`, float64."""
    vector = np.asarray(vector, np.float64)
    kernel = vector[: NUM_FEATURES * units].reshape(NUM_FEATURES, units)
    return np.asarray(x, np.float64) @ kernel + vector[NUM_FEATURES * units :]


def _reference(vectors, x, y, units):
    """(per-sample probabilities [S, n, K], NLL of their average) by numpy."""
    if units == 1:
        ones = np.stack([expit(_scores(v, x, 1)[:, 0]) for v in vectors])
        probs = np.stack([1 - ones, ones], axis=-1)
    else:
        probs = np.stack([softmax(_scores(v, x, units), axis=1) for v in vectors])
    mean = probs.mean(axis=0)
    return probs, -np.mean(np.log(mean[np.arange(len(y)), y]))


@pytest.mark.parametrize(
    "units, activation, loss",
    [
        (3, "softmax", keras.losses.SparseCategoricalCrossentropy(from_logits=False)),
        (3, "softmax", "sparse_categorical_crossentropy"),
        (3, None, keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        (1, "sigmoid", "binary_crossentropy"),
        (1, None, keras.losses.BinaryCrossentropy(from_logits=True)),
    ],
    ids=["softmax-object", "softmax-name", "logits", "sigmoid", "binary-logit"],
)
def test_stored_sample_predictions_read_the_nets_output_kind(units, activation, loss):
    x, y = _data(units)
    net = _dense_net(units, activation)
    net.compile(loss=loss)
    vectors = _vectors(units)
    probs, nll = _reference(vectors, x, y, units)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the hints agree
        result = evaluate_posterior(net, vectors, (x, y), batch_size=10, verbose=0)
        averaged = predict_posterior(net, vectors, x, verbose=0)
        each = predict_samples(net, vectors, x, verbose=0)
    assert result["nll"] == pytest.approx(nll, rel=RTOL)
    np.testing.assert_allclose(averaged, probs.mean(axis=0), rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(each, probs, rtol=RTOL, atol=1e-7)


def test_posterior_average_of_a_softmax_net_during_fit():
    x, y = _data(3, n=32)
    x_test, y_test = _data(3, n=12, seed=5)
    model = kt.BayesianModel(
        _dense_net(3, "softmax"), kt.samplers.SGLD(step_size=1e-3), num_examples=32,
        prior=kt.priors.Gaussian(1.0), seed=0,
    )
    model.compile(loss="sparse_categorical_crossentropy")
    average = PosteriorAverage((x_test, y_test), burn_in_steps=2, every_n_steps=2)
    collector = SampleCollector(burn_in_steps=2, every_n_steps=2)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[average, collector])
    probs, nll = _reference(collector.samples, x_test, y_test, 3)
    assert average.num_samples == len(collector.samples) == 3
    np.testing.assert_allclose(average.predictions, probs.mean(axis=0), rtol=RTOL, atol=1e-7)
    assert average.result()["nll"] == pytest.approx(nll, rel=RTOL)


def _functional(activation):
    inputs = keras.Input((NUM_FEATURES,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation=activation)(hidden))


def _wrapped(inner):
    return keras.Sequential([keras.Input((NUM_FEATURES,)), inner])


@pytest.mark.parametrize(
    "make_net, loss, expected",
    [
        (lambda: _dense_net(3), None, "logits"),  # linear last layer
        (lambda: _dense_net(3, "log_softmax"), None, "logits"),
        (lambda: _dense_net(3, "softmax"), None, "probabilities"),
        (lambda: _dense_net(1, "sigmoid"), None, "probabilities"),
        (lambda: _functional("softmax"), None, "probabilities"),
        (lambda: _functional(None), "categorical_crossentropy", "contradiction"),
        (lambda: _wrapped(_dense_net(3, "softmax")), None, "probabilities"),  # nested model
        (lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Softmax()]), None, "probabilities"),
        (lambda: _dense_net(3, "relu"), keras.losses.sparse_categorical_crossentropy, "probabilities"),
        (lambda: _dense_net(3, "relu"), keras.losses.CategoricalFocalCrossentropy(from_logits=True), "logits"),
        (lambda: _dense_net(3, "relu"), "mse", "no hint"),
        (lambda: _dense_net(3, "relu"), None, "no hint"),
    ],
    ids=["linear", "log_softmax", "softmax", "sigmoid", "functional", "contradiction", "nested",
         "softmax-layer", "loss-function", "focal-object", "mse", "relu"],
)
def test_output_kind_from_loss_and_last_activation(make_net, loss, expected):
    net = make_net()
    if loss is not None:
        net.compile(loss=loss)
    if expected == "no hint":
        with pytest.raises(ValueError, match=r"Cannot tell whether `model` .* Pass outputs='logits' or outputs='probabilities'"):
            posterior._resolve_outputs(net, None)
    elif expected == "contradiction":
        with pytest.raises(ValueError, match=r"Cannot tell what `model` .* from_logits=False .* but .* activation 'linear'"):
            posterior._resolve_outputs(net, None)
    else:
        assert posterior._resolve_outputs(net, None) == expected


def test_the_compiled_loss_of_a_bayesian_model_and_its_nets_activation_are_read():
    model = kt.BayesianModel(
        _dense_net(3, "softmax"), kt.samplers.SGLD(step_size=1e-3), num_examples=8,
        prior=kt.priors.Gaussian(1.0),
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.build((None, NUM_FEATURES))
    with pytest.raises(ValueError, match=r"from_logits=True \(reads logits\) but its last layer .* 'softmax'"):
        posterior._resolve_outputs(model, None)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    assert posterior._resolve_outputs(model, None) == "probabilities"


def test_an_explicit_outputs_wins_and_a_contradiction_warns():
    x, y = _data(3)
    net = _dense_net(3, "softmax")
    net.compile(loss="sparse_categorical_crossentropy")
    vectors = _vectors(3)
    _, nll = _reference(vectors, x, y, 3)
    with pytest.warns(UserWarning, match=r"`outputs='logits'` is used as given, but .* from_logits=False .* and .* 'softmax'"):
        forced = evaluate_posterior(net, vectors, (x, y), outputs="logits", verbose=0)
    # As given: the softmax outputs are read as logits, a different (wrong) NLL.
    assert abs(forced["nll"] - nll) > 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agreed = evaluate_posterior(net, vectors, (x, y), outputs="probabilities", verbose=0)
    assert agreed["nll"] == pytest.approx(nll, rel=RTOL)
    with pytest.raises(ValueError, match=r"`outputs` must be one of \['logits', 'probabilities'\].*'probs'"):
        predict_posterior(net, vectors, x, outputs="probs", verbose=0)
    with pytest.raises(ValueError, match=r"`outputs` must be one of"):
        PosteriorAverage((x, y), outputs="softmax")
