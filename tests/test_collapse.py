"""A chain whose net collapses to one output for every example stops `fit` with a clear error.

The collapse of the issue's real-scale runs (a ReLU layer inactive on the whole batch, the
chain at chance accuracy) is driven here directly: after a healthy epoch a callback moves the
hidden layer's biases to -1e3, where no example activates a unit and the sampler's noise cannot
bring one back. The healthy run of the same net, seed and data stays quiet.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo.step import COLLAPSED_RELATIVE_SPREAD, output_spread

NUM_EXAMPLES, CLASSES = 256, 3


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((NUM_EXAMPLES, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return x, y


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    net = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"), keras.layers.Dense(CLASSES),
    ])
    model = kt.BayesianModel(net, kt.samplers.SGHMC(1e-2, friction=10.0), num_examples=None,
                             prior=kt.priors.Gaussian(std=1.0), seed=seed)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    return model


class _KillHiddenLayer(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            bias = self.model.net.get_layer("hidden").bias
            bias.assign(np.full(bias.shape, -1e3, np.float32))


def test_a_collapsed_net_stops_fit_naming_the_step_size_and_keeps_its_state():
    model = _model()
    x, y = _data()
    with pytest.raises(kt.SamplerCollapsedError) as caught:
        model.fit(x, y, batch_size=32, epochs=5, callbacks=[_KillHiddenLayer()], verbose=0)
    message = str(caught.value)
    assert "same output for every example" in message
    assert "step_size=0.01" in message and "try step_size=0.0025" in message
    assert "learning rate 0.0256 with momentum 0.9" in message  # h^2 N = 1e-4 * 256, 1 - A h
    assert isinstance(caught.value, kt.SamplerDivergedError)
    assert caught.value.step == model.sampler_step == 16  # stopped after the second epoch
    assert np.all(model.net.get_layer("hidden").bias.numpy() < -900)  # the state it reached


def test_a_healthy_run_and_identical_inputs_stay_quiet():
    model = _model()
    x, y = _data()
    history = model.fit(x, y, batch_size=32, epochs=5, verbose=0)
    assert min(history.history["output_spread"]) > 100 * COLLAPSED_RELATIVE_SPREAD
    # Identical inputs give identical outputs: no verdict (NaN), no error.
    same = np.repeat(x[:1], NUM_EXAMPLES, axis=0)
    history = model.fit(same, y, batch_size=32, epochs=2, verbose=0)
    assert np.isnan(history.history["output_spread"]).all()


def test_output_spread_is_relative_and_ignores_identical_rows():
    x = np.array([[0.0], [1.0]], np.float32)
    assert float(output_spread(x, np.array([[100.0, 1.0], [100.0, 3.0]], np.float32))) == pytest.approx(2.0 / 101.0)
    assert float(output_spread(x, np.array([[5.0], [5.0]], np.float32))) == 0.0
    identical = np.zeros((2, 1), np.float32)
    # Equal outputs of identical inputs say nothing; outputs that differ (noise layers) still show.
    assert np.isnan(float(output_spread(identical, np.array([[5.0], [5.0]], np.float32))))
    assert float(output_spread(identical, np.array([[1.0], [2.0]], np.float32))) == pytest.approx(1.0 / 3.0)


class _KillHiddenLayerAtTheWall(_KillHiddenLayer):
    """Kills the hidden layer as above, with TACT-HMC's tempering variable moved near its wall
    (theta at about 8 T) or left where it is."""

    def __init__(self, xi=None):
        super().__init__()
        self.xi = xi

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == 0 and self.xi is not None:
            # The state variables in the order of the sampler's typed state.
            model = self.model
            variables = tf.nest.pack_sequence_as(model._runtime.state_structure, model._state_variables)
            variables.xi.assign(self.xi)
            variables.xi_momentum.assign(0.0)


def _tact_model(tempering=True):
    keras.utils.set_random_seed(0)
    net = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"), keras.layers.Dense(CLASSES),
    ])
    sampler = kt.samplers.TACTHMC(1e-6, xi_step_size=1e-12, noise=0.1, xi_noise=0.1, thermal_inertia=1.0,
                                  xi_thermal_inertia=1.0, sample_every=1, tempering=tempering)
    model = kt.BayesianModel(net, sampler, num_examples=None, prior=kt.priors.Gaussian(std=1.0), seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    return model


def test_a_tempered_collapse_names_the_tempering_and_an_untempered_one_the_step_size():
    x, y = _data()
    # xi near the wall (5/3 by default): theta at 1 + ((1.6 - 1/3) / (2/3))^3 = 7.9 T.
    model = _tact_model()
    with pytest.raises(kt.SamplerCollapsedError) as caught:
        model.fit(x, y, batch_size=32, epochs=5, callbacks=[_KillHiddenLayerAtTheWall(1.6)], verbose=0)
    message = str(caught.value)
    assert "Likely cause: the tempering. Its tempering variable xi is at 1.6 now" in message, message
    assert "theta runs at 7.86 T (up to 9 T at the wall" in message
    assert "tempering=False" in message and "Otherwise: step_size=1e-06 is too large" in message
    # On the plateau (and without tempering) theta is at T there: the step size is the cause named.
    for tempering in (True, False):
        model = _tact_model(tempering)
        with pytest.raises(kt.SamplerCollapsedError) as caught:
            model.fit(x, y, batch_size=32, epochs=5, callbacks=[_KillHiddenLayerAtTheWall(0.0 if tempering else None)],
                      verbose=0)
        message = str(caught.value)
        assert "tempering" not in message and "Likely cause: step_size=1e-06 is too large" in message, message


def test_the_tempering_hint_reads_every_chain_and_stays_quiet_on_the_plateau():
    # Several chains: the state's xi is [C]; the hint names the chain furthest off the plateau.
    sampler = kt.samplers.TACTHMC(1e-6, sample_every=1)
    state = type("State", (), {})()
    state.xi = np.array([0.1, -1.6], np.float32)
    assert "xi is at 1.6 now" in sampler.collapse_hint(state)
    state.xi = np.array([0.1, -0.3], np.float32)  # both on the plateau |xi| <= 1/3: theta at T
    assert sampler.collapse_hint(state) == ""
    state.xi = np.array([1.6], np.float32)
    assert kt.samplers.TACTHMC(1e-6, sample_every=1, tempering=False).collapse_hint(state) == ""
