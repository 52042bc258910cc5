"""Step-size and temperature schedules: exact values, phases, sample flags through fit, configs."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing

from helpers import StepLogs, tanh_net

# float32 cosine of a float32 argument: a few ulps of 1, relative to h0.
COSINE_ATOL = 1e-6


def _cyclical_reference(h0, cycle_length, step):
    return h0 / 2 * (math.cos(math.pi * (step % cycle_length) / cycle_length) + 1)


@pytest.mark.parametrize("cycle_length", [1, 4, 7, 50])
def test_cyclical_step_size_matches_the_formula(cycle_length):
    h0 = 3e-3
    schedule = kt.schedules.Cyclical(h0, cycle_length, exploration_fraction=0.0)
    steps = np.arange(3 * cycle_length + 2)
    got = np.array([float(schedule(tf.constant(t, tf.int64))) for t in steps])
    want = np.array([_cyclical_reference(h0, cycle_length, t) for t in steps])
    np.testing.assert_allclose(got, want, rtol=0, atol=COSINE_ATOL * h0)
    # Every cycle restarts at h0 exactly.
    assert all(got[t] == np.float32(h0) for t in range(0, len(steps), cycle_length))


def test_cyclical_step_size_is_exact_at_large_step_counts():
    schedule = kt.schedules.Cyclical(1.0, 10, exploration_fraction=0.0)
    # 2**40 + 5 is not a float32: the phase is taken on int64 first.
    step = 2**40 + 5
    got = float(schedule(tf.constant(step, tf.int64)))
    assert got == pytest.approx(_cyclical_reference(1.0, 10, step), abs=COSINE_ATOL)


@pytest.mark.parametrize(
    "cycle_length, fraction, sampled",
    [
        (4, 0.5, [2, 3]),
        (10, 0.8, [8, 9]),
        (10, 0.73, [8, 9]),  # ceil(7.3): the 8th step of a cycle is still exploring
        (10, 0.7, [7, 8, 9]),  # 0.7 * 10 is 7.000000000000001 in floating point
        (5, 0.0, [0, 1, 2, 3, 4]),
        (3, 0.6, [2]),
    ],
)
def test_cyclical_sampling_phase_positions(cycle_length, fraction, sampled):
    schedule = kt.schedules.Cyclical(1e-3, cycle_length, exploration_fraction=fraction)
    flags = [bool(schedule.in_sampling_phase(tf.constant(t, tf.int64))) for t in range(2 * cycle_length)]
    expected = [t % cycle_length in sampled for t in range(2 * cycle_length)]
    assert flags == expected


def _all_samplers(schedule):
    return {
        "sgld": kt.samplers.SGLD(schedule),
        "sghmc": kt.samplers.SGHMC(schedule),
        "sgnht": kt.samplers.SGNHT(schedule, integrator="symmetric"),
        "ccadl": kt.samplers.CCAdL(schedule),
        "mccadl": kt.samplers.MCCAdL(schedule),
        "tact_hmc": kt.samplers.TACTHMC(schedule, sample_every=1),
    }


@pytest.mark.parametrize("name", sorted(_all_samplers(1e-3)))
def test_every_sampler_flags_samples_only_in_sampling_phases(name):
    schedule = kt.schedules.Cyclical(1e-3, 5, exploration_fraction=0.6)
    sampler = _all_samplers(schedule)[name]
    state = sampler.init([tf.zeros([2, 3]), tf.zeros([3])], temperature=1.0, seed=0)
    for completed in range(1, 16):
        probe = state._replace(step=tf.constant(completed, tf.int64))
        # The state after `completed` steps was produced by step `completed - 1`.
        assert bool(sampler.is_sample(probe)) is ((completed - 1) % 5 >= 3), completed
    # A float step size keeps every step a sample.
    plain = _all_samplers(1e-3)[name]
    assert bool(plain.is_sample(state._replace(step=tf.constant(2, tf.int64))))


def _fit_with_collector(sampler, num_steps, steps_per_execution):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([[1.0], [-1.0], [0.5]], "float32")
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model = kt.BayesianModel(net, sampler, num_examples=64, prior=kt.priors.Gaussian(1.0), seed=0)
    model.compile(loss="mse", steps_per_execution=steps_per_execution)
    collector = kt.callbacks.SampleCollector(every_n_steps=1, max_samples=1000)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    history = model.fit(data, steps_per_epoch=num_steps, epochs=1, verbose=0, callbacks=[collector])
    return model, collector, history


def test_fit_collects_samples_only_from_sampling_phases():
    # Through fit for SGLD; the flags of every sampler are checked one step at a time above.
    schedule = kt.schedules.Cyclical(1e-3, 10, exploration_fraction=0.6)
    sampler = kt.samplers.SGLD(schedule)
    _, collector, _ = _fit_with_collector(sampler, num_steps=35, steps_per_execution=7)
    # Completed step s was taken at t = s - 1, in the sampling phase when mod(t, 10) >= 6.
    expected = [s for s in range(1, 36) if (s - 1) % 10 >= 6]
    np.testing.assert_array_equal(collector.steps, expected)
    assert collector.samples.shape == (len(expected), 4)


def test_cyclical_config_round_trip_and_through_a_sampler():
    schedule = kt.schedules.Cyclical(2e-3, 100, exploration_fraction=0.25)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, kt.schedules.Cyclical) and restored.get_config() == schedule.get_config()
    sampler = kt.samplers.SGHMC(schedule, friction=2.0)
    again = kt.samplers.get(keras.saving.serialize_keras_object(sampler))
    assert again.get_config() == sampler.get_config()
    assert bool(again.is_sample(again.init([tf.zeros([1])], temperature=1.0, seed=0)._replace(step=tf.constant(90, tf.int64))))


# --- temperature schedules --------------------------------------------------------------------


@pytest.mark.parametrize("interpolation", ["geometric", "linear"])
def test_temperature_ramp_values(interpolation):
    ramp = kt.schedules.TemperatureRamp(10.0, 0.5, ramp_steps=8, interpolation=interpolation)
    for t in range(12):
        u = min(t / 8, 1.0)
        want = 10.0 * (0.05**u) if interpolation == "geometric" else 10.0 + (0.5 - 10.0) * u
        # Formed in float64, rounded once to float32.
        assert float(ramp(tf.constant(t, tf.int64))) == pytest.approx(want, rel=2**-23)
    assert float(ramp(8)) == 0.5 and float(ramp(10**9)) == 0.5 and float(ramp(0)) == 10.0


def _regression_model(temperature, seed=3):
    net = tanh_net(2)
    model = kt.BayesianModel(
        # No warm-up: these runs are about the temperature ramp, which alone should hold back
        # an EquilibrationCheck (a warm-up would too, see tests/test_temperature_check.py).
        net, kt.samplers.SGNHT(1e-2, warmup_steps=0), num_examples=64, prior=kt.priors.Gaussian(1.0),
        temperature=temperature, seed=seed,
    )
    model.compile(loss="mse")
    return model


_regression_data = testing.small_regression_dataset


class _SetTemperature(keras.callbacks.Callback):
    """Sets a float temperature before each step: the way to vary T without a schedule."""

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule

    def on_train_batch_begin(self, batch, logs=None):
        self.model.temperature = float(self.schedule(self.model.sampler_step))


def test_a_temperature_schedule_sets_every_steps_temperature():
    ramp = kt.schedules.TemperatureRamp(5.0, 1.0, ramp_steps=6)
    scheduled = _regression_model(ramp)
    batch_logs = StepLogs()
    scheduled.fit(_regression_data(), steps_per_epoch=10, epochs=1, verbose=0, callbacks=[batch_logs])
    assert [log["temperature"] for log in batch_logs.logs] == [float(ramp(t)) for t in range(10)]
    assert scheduled.temperature == 1.0 and scheduled.temperature_schedule is ramp

    # The same chain driven step by step through the float temperature's variable (which the
    # existing tests check), starting at T(0) as the schedule does (p_0 ~ N(0, T(0) M)).
    driven = _regression_model(5.0)
    driven_logs = StepLogs()
    driven.fit(_regression_data(), steps_per_epoch=10, epochs=1, verbose=0, callbacks=[_SetTemperature(ramp), driven_logs])
    assert "temperature" not in driven_logs.logs[0]  # logged only when scheduled
    for u, v in zip(scheduled.trainable_variables + scheduled.non_trainable_variables,
                    driven.trainable_variables + driven.non_trainable_variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_temperature_schedule_config_round_trip():
    ramp = kt.schedules.TemperatureRamp(3.0, 0.5, ramp_steps=12, interpolation="linear")
    model = _regression_model(ramp)
    config = model.get_config()
    restored = type(model).from_config(config)
    assert restored.get_config()["temperature"] == config["temperature"]
    assert restored.temperature_schedule.get_config() == ramp.get_config()
    assert restored.temperature == 3.0  # T of the next step, step 0


# Slow (3 fits and a save, ~10 s): the default suite checks the config round trip above and, in
# tests/test_model.py, resuming bit for bit with a float temperature; the ramp adds no state
# beyond the step counter.
@pytest.mark.slow
def test_temperature_schedule_save_and_resume_is_bit_exact(tmp_path):
    ramp = kt.schedules.TemperatureRamp(3.0, 0.5, ramp_steps=12, interpolation="linear")
    straight = _regression_model(ramp)
    straight.fit(_regression_data(), steps_per_epoch=16, epochs=1, verbose=0)
    first = _regression_model(ramp)
    first.fit(_regression_data(), steps_per_epoch=8, epochs=1, verbose=0)
    path = str(tmp_path / "ramp.keras")
    first.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored.temperature_schedule, kt.schedules.TemperatureRamp)
    assert restored.temperature == pytest.approx(float(ramp(8)))
    # The data restarts, so replay the second half's batches on the restored model.
    restored.fit(_regression_data().skip(8), steps_per_epoch=8, epochs=1, verbose=0)
    for u, v in zip(straight.trainable_variables + straight.non_trainable_variables,
                    restored.trainable_variables + restored.non_trainable_variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_a_built_model_keeps_the_kind_of_its_temperature():
    model = _regression_model(kt.schedules.TemperatureRamp(2.0, 1.0, ramp_steps=5))
    model.build()  # creates the temperature variable the compiled step reads
    with pytest.raises(ValueError, match="`temperature`.*schedule.*cannot become 0.5"):
        model.temperature = 0.5
    plain = _regression_model(1.0)
    plain.build()
    with pytest.raises(ValueError, match="`temperature`.*float.*cannot become TemperatureRamp"):
        plain.temperature = kt.schedules.TemperatureRamp(2.0)


@pytest.mark.parametrize("ramp", [True, False])
def test_an_equilibration_check_starts_no_recording_before_the_ramp_ends(ramp):
    # `max_burn_in_steps=0` starts the linked recording at the first drain (the check reads its
    # sums back once a block's worth of steps has run: after step 2, so step 3 is the first one
    # recorded); a ramp holds it back until its T has settled: step 6 is the last burn-in step
    # and step 7 (which ran at T(6) = 1) the first recorded.
    temperature = kt.schedules.TemperatureRamp(5.0, 1.0, ramp_steps=6) if ramp else 1.0
    model = _regression_model(temperature)
    check = kt.callbacks.EquilibrationCheck(block_steps=2, max_burn_in_steps=0, warn=False)
    collector = kt.callbacks.SampleCollector(burn_in_steps=check, every_n_steps=1)
    model.fit(_regression_data(), steps_per_epoch=10, epochs=1, verbose=0, callbacks=[check, collector])
    first_recorded = 7 if ramp else 3
    assert check.recording_started_at == (6 if ramp else 0)
    np.testing.assert_array_equal(collector.steps, np.arange(first_recorded, 11))


def test_an_equilibration_check_tests_only_blocks_after_the_ramp():
    # Blocks of 2 steps over 10 steps: (1-2), (3-4), (5-6) ran (partly) during the ramp of 6
    # steps, whose temperatures would be compared with the final T; only (7-8) and (9-10) count.
    # Without the ramp all five blocks count.
    for temperature, kept in ((kt.schedules.TemperatureRamp(5.0, 1.0, ramp_steps=6), 2), (1.0, 5)):
        model = _regression_model(temperature)
        check = kt.callbacks.EquilibrationCheck(block_steps=2, burn_in_steps=0, warn=False)
        model.fit(_regression_data(), steps_per_epoch=10, epochs=1, verbose=0, callbacks=[check])
        assert check.report()["num_blocks"] == kept
