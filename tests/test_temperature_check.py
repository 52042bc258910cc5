"""The default temperature check (`BayesianModel(temperature_check=True)`).

Every `fit` without an `EquilibrationCheck` of its own runs one: the verdict lands in History,
a run that ends out of band warns once in plain words, and the recording callbacks warn that
their samples come from a chain that is not at T. The runs are test_warmup.py's linear
regression from Keras' default initialisation (N = 2000, d = 5, batches of 1000, h = 1e-3,
A = 1): SGNHT without its warm-up stays far colder than T there for tens of thousands of steps
(its configurational temperature is a few percent of T), with the default warm-up it samples at T.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo import testing

NUM_EXAMPLES, NUM_FEATURES, BATCH = 2000, 5, 1000
# 201000 steps: the 1000-step warm-up, then 2000 blocks of 100 steps. A run passes only on its
# configurational temperature (the thermostat holds the kinetic one at T), and here that figure
# is noisy: -theta . F weighs the force by weights far from 0 (the posterior mean), and at
# 21000 steps its band was wider than the resolution gate's 0.25 T on all three seeds (the
# verdict undetermined). SGNHT's thermostat on six weights also oscillates with a period of a
# few thousand steps, so a verdict needs many periods.
# The cold run is far from T at once: 3000 steps.
STEPS_AT_T, STEPS_COLD, STEPS_PER_EPOCH = 201_000, 3_000, 1000
SEEDS = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]


def _model(warmup_steps: int, seed: int, **options):
    keras.utils.set_random_seed(seed)  # Keras' default initialisation, drawn from this seed
    net = testing.linear_regression_net(NUM_FEATURES)
    sampler = kt.samplers.SGNHT(1e-3, friction=1.0, warmup_steps=warmup_steps)
    model = kt.BayesianModel(net, sampler, num_examples=NUM_EXAMPLES, prior=kt.priors.Gaussian(std=10**0.5), seed=seed, **options)
    model.compile(loss=kt.losses.GaussianNLL(scale=1.0), steps_per_execution=100)
    return model


def _fit(model, num_steps, callbacks=()):
    x, y = testing.linear_regression_data(NUM_EXAMPLES, NUM_FEATURES, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            x, y, batch_size=BATCH, epochs=num_steps // STEPS_PER_EPOCH, steps_per_epoch=STEPS_PER_EPOCH,
            callbacks=list(callbacks), verbose=0,
        )
    return history, [str(w.message) for w in caught if "temperature" in str(w.message)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_run_at_temperature_says_so_and_stays_quiet(seed):
    model = _model(warmup_steps=1000, seed=seed)
    collector = kt.callbacks.SampleCollector(burn_in_steps=1000, every_n_steps=10)
    history, messages = _fit(model, STEPS_AT_T, [collector])
    assert history.history["equilibrated"][-1] == 1.0, model.temperature_report()
    assert messages == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cold_run_warns_once_with_its_cause_and_so_does_its_collector(seed):
    model = _model(warmup_steps=0, seed=seed)
    collector = kt.callbacks.SampleCollector(burn_in_steps=1000)
    history, messages = _fit(model, STEPS_COLD, [collector])
    report = model.temperature_report()
    assert history.history["equilibrated"][-1] == 0.0, report
    assert report["overall"]["configurational"]["mean"] < 0.5 * report["temperature"]
    check_messages = [m for m in messages if "is not sampling at its temperature" in m]
    assert len(check_messages) == 1, messages
    assert "runs cold" in check_messages[0] and "warmup_steps" in check_messages[0]
    assert "temperature_check=False" in check_messages[0]
    collector_messages = [m for m in messages if m.startswith("SampleCollector recorded")]
    assert len(collector_messages) == 1, messages
    assert "temperature of the whole net" in collector_messages[0]


def test_a_collector_names_the_variable_furthest_off_when_the_whole_net_is_in_band():
    """A check that judges every variable can find the run out of band through one variable
    alone: the collector's warning quotes that variable's figure, not the whole net's."""
    def entry(mean, in_band):
        return {"mean": mean, "standard_error": 0.01, "in_band": in_band}

    report = {
        "temperature": 1.0, "equilibrated": False,
        "overall": {"kinetic": entry(1.01, True), "configurational": entry(1.03, True)},
        "variables": [{"name": "dense/kernel", "kinetic": entry(1.0, True), "configurational": entry(1.12, False)}],
    }

    class Reporting:
        def temperature_report(self):
            return report

    collector = kt.callbacks.SampleCollector(burn_in_steps=0)
    collector.set_model(Reporting())
    collector._recorded_this_fit = 3
    with pytest.warns(UserWarning, match=r"configurational temperature of 'dense/kernel': 1\.12 \+- 0\.01"):
        collector._warn_if_not_at_temperature()


def test_the_check_can_be_turned_off_and_round_trips_in_the_config():
    model = _model(warmup_steps=0, seed=0, temperature_check=False)
    history, messages = _fit(model, STEPS_PER_EPOCH)
    assert "equilibrated" not in history.history and messages == [] and model.temperature_report() is None
    assert kt.BayesianModel.from_config(model.get_config()).temperature_check is False
    with pytest.raises(TypeError, match="temperature_check"):
        _model(warmup_steps=0, seed=0, temperature_check="yes")


def test_a_user_check_replaces_the_default_and_a_second_fit_keeps_the_compiled_step():
    model = _model(warmup_steps=1000, seed=0)
    own = kt.callbacks.EquilibrationCheck(block_steps=50)
    _fit(model, STEPS_COLD, [own])
    assert model.temperature_report()["num_blocks"] == own.report()["num_blocks"]
    model.fit(np.zeros((BATCH, NUM_FEATURES), np.float32), np.zeros((BATCH, 1), np.float32), batch_size=BATCH, epochs=1, verbose=0)
    step_function = model.train_function
    model.fit(np.zeros((BATCH, NUM_FEATURES), np.float32), np.zeros((BATCH, 1), np.float32), batch_size=BATCH, epochs=1, verbose=0)
    assert model.train_function is step_function  # the default check kept its recorder


def test_a_recording_linked_to_a_check_that_the_warmup_holds_back_says_so():
    model = _model(warmup_steps=5000, seed=0)
    check = kt.callbacks.EquilibrationCheck(max_burn_in_steps=500)
    collector = kt.callbacks.SampleCollector(burn_in_steps=check)
    history, messages = _fit(model, STEPS_COLD, [check, collector])
    assert collector.samples.shape[0] == 0
    assert any("is due to start at step 5000" in m and "warmup_steps" in m for m in messages), messages
