"""Exact resume through Keras' own checkpointing callbacks, for every sampler."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt

from helpers import tanh_net

N = 64
STEPS_PER_EPOCH = 6

# Every sampler with a configuration that exercises its whole state (schedules, thermostats,
# moving averages, ABF tables).
SAMPLER_CONFIGS = {
    "sgld": lambda: kt.samplers.SGLD(kt.schedules.PolynomialDecay(1e-3, 1.0, 0.55)),
    "sghmc": lambda: kt.samplers.SGHMC(1e-2, friction=2.0),
    "sgnht": lambda: kt.samplers.SGNHT(1e-2),
    "sgnht-symmetric": lambda: kt.samplers.SGNHT(1e-2, integrator="symmetric"),
    "ccadl-full": lambda: kt.samplers.CCAdL(1e-3, covariance="full"),
    "mccadl": lambda: kt.samplers.MCCAdL(1e-3, covariance="minibatch", expm="taylor"),
    "tact-hmc": lambda: kt.samplers.TACTHMC(1e-4, sample_every=2, num_bins=10),
}


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 3)).astype("float32")
    y = (x @ rng.normal(size=(3, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()


def _model(make_sampler):
    model = kt.BayesianModel(tanh_net(), make_sampler(), num_examples=N, prior=kt.priors.Gaussian(1.0), seed=11)
    model.compile(loss="mse", steps_per_execution=2)
    return model


def _state(model):
    return [v.numpy() for v in model.variables]


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            raise KeyboardInterrupt("simulated preemption")


def _cases(default: set[str]):
    """Every sampler; those outside `default` run in the slow suite. Each sampler's whole state
    round trip is checked in the default suite by test_model.py's save/load/resume test: these
    tests add Keras' checkpointing callbacks, whose mechanism is the same for every sampler."""
    return [name if name in default else pytest.param(name, marks=pytest.mark.slow) for name in sorted(SAMPLER_CONFIGS)]


@pytest.mark.parametrize("name", _cases({"tact-hmc"}))
def test_model_checkpoint_weights_resume_exactly(name, tmp_path):
    make = SAMPLER_CONFIGS[name]
    straight = _model(make)
    straight.fit(_data(), steps_per_epoch=STEPS_PER_EPOCH, epochs=2, verbose=0)

    path = os.path.join(tmp_path, "ckpt.weights.h5")
    first = _model(make)
    first.fit(
        _data(), steps_per_epoch=STEPS_PER_EPOCH, epochs=1, verbose=0,
        callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)],
    )
    resumed = _model(make)
    resumed.build()
    resumed.load_weights(path)
    assert resumed.sampler_step == STEPS_PER_EPOCH
    # The dataset restarts; skip what the first run consumed so both see the same batches.
    resumed.fit(_data().skip(STEPS_PER_EPOCH), steps_per_epoch=STEPS_PER_EPOCH, epochs=1, verbose=0)
    _assert_same(_state(straight), _state(resumed))


@pytest.mark.parametrize("name", _cases({"sgld"}))
def test_backup_and_restore_resumes_exactly_after_preemption(name, tmp_path):
    make = SAMPLER_CONFIGS[name]
    straight = _model(make)
    straight.fit(_data(), steps_per_epoch=STEPS_PER_EPOCH, epochs=2, verbose=0)

    backup = str(tmp_path / "backup")
    interrupted = _model(make)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(
            _data(), steps_per_epoch=STEPS_PER_EPOCH, epochs=2, verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), _Interrupt()],
        )
    restarted = _model(make)
    restarted.fit(
        _data().skip(STEPS_PER_EPOCH), steps_per_epoch=STEPS_PER_EPOCH, epochs=2, verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(backup)],
    )
    assert restarted.sampler_step == 2 * STEPS_PER_EPOCH
    _assert_same(_state(straight), _state(restarted))
