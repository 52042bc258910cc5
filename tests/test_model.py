"""BayesianModel: units of the potential, Keras integration, state, saving, recording, NaN guard."""

import glob
import math
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt

from helpers import tanh_net

N = 64


def _data(n=N, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    y = (x @ rng.normal(size=(d, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _net(d=3, regularizer=None, seed=1):
    return tanh_net(inputs=d, seed=seed, kernel_regularizer=regularizer)


def _model(sampler=None, net=None, **kwargs):
    kwargs.setdefault("num_examples", N)
    kwargs.setdefault("seed", 3)
    model = kt.BayesianModel(net or _net(), sampler or kt.samplers.SGNHT(1e-3), **kwargs)
    return model


def _ordered_dataset(x, y, batch_size, sample_weight=None):
    parts = (x, y) if sample_weight is None else (x, y, sample_weight)
    return tf.data.Dataset.from_tensor_slices(parts).repeat().batch(batch_size)


def _weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


SAMPLERS = {
    "sgld": lambda: kt.samplers.SGLD(kt.schedules.PolynomialDecay(1e-3, 1.0, 0.55)),
    "sghmc": lambda: kt.samplers.SGHMC(1e-2, friction=2.0),
    "sgnht": lambda: kt.samplers.SGNHT(1e-2),
    "sgnht-symmetric": lambda: kt.samplers.SGNHT(1e-2, integrator="symmetric"),
}


# --- units ------------------------------------------------------------------------------------


def test_potential_is_n_times_keras_loss_plus_prior_with_regularizer_and_sample_weight():
    x, y = _data()
    l2 = 0.01
    model = _model(net=_net(regularizer=keras.regularizers.L2(l2)), prior=kt.priors.Gaussian(2.0))
    model.compile(loss="mse")
    w = np.linspace(0.5, 1.5, 16).astype("float32")
    xb, yb = x[:16], y[:16]
    history = model.fit(
        _ordered_dataset(xb, yb, 16, w), steps_per_epoch=1, epochs=1, verbose=0
    )
    # Hand computation at the initial weights (the logged potential is the pre-update one).
    model2 = _model(net=_net(regularizer=keras.regularizers.L2(l2)))
    weights = model2.net.get_weights()
    kernel1, bias1, kernel2, bias2 = weights
    out = np.tanh(xb @ kernel1 + bias1) @ kernel2 + bias2
    mean_loss = np.sum(w * (out[:, 0] - yb[:, 0]) ** 2) / 16  # Keras: sum(w l) / batch size
    regularization = l2 * np.sum(kernel1**2)
    prior = sum(np.sum(v**2) / (2 * 4.0) + v.size * 0.5 * math.log(2 * math.pi * 4.0) for v in weights)
    expected = N * (mean_loss + regularization) + prior
    assert history.history["potential"][0] == pytest.approx(expected, rel=1e-5)


def test_compute_potential_matches_fit_log():
    x, y = _data()
    model = _model(prior=kt.priors.Gaussian(1.0))
    model.compile(loss="mse")
    model.build()
    potential, loss, _ = model.compute_potential(x[:8], y[:8])
    history = model.fit(_ordered_dataset(x[:8], y[:8], 8), steps_per_epoch=1, epochs=1, verbose=0)
    assert history.history["potential"][0] == pytest.approx(float(potential), rel=1e-6)
    assert history.history["loss"][0] == pytest.approx(float(loss), rel=1e-6)


# --- Keras integration ------------------------------------------------------------------------


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def _functional():
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4)(inputs)))


@pytest.mark.parametrize(
    "make_net",
    [_net, _functional, _Subclassed, lambda: keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(1)])],
    ids=["sequential", "functional", "subclassed", "sequential-unbuilt"],
)
def test_fit_works_for_every_kind_of_keras_model(make_net):
    x, y = _data()
    model = kt.BayesianModel(make_net(), kt.samplers.SGHMC(1e-3), num_examples=N, seed=0)
    model.compile(loss="mse", metrics=["mae"])
    before = None
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert model.sampler_step == 8
    assert set(history.history) >= {"loss", "mae", "potential", "kinetic_temperature", "step_size"}
    before = _weights(model)
    # evaluate and predict use the current parameters.
    np.testing.assert_allclose(model.predict(x, verbose=0), model.net(x).numpy(), rtol=1e-5, atol=1e-6)
    mse = float(np.mean((model.net(x).numpy() - y) ** 2))
    assert model.evaluate(x, y, verbose=0, return_dict=True)["loss"] == pytest.approx(mse, rel=1e-4)
    for a, b in zip(before, _weights(model)):
        np.testing.assert_array_equal(a, b)


def test_numpy_and_dataset_inputs_give_the_same_trajectory():
    x, y = _data()
    a = _model()
    a.compile(loss="mse")
    a.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    b = _model()
    b.compile(loss="mse")
    b.fit(_ordered_dataset(x, y, 16), steps_per_epoch=4, epochs=1, verbose=0)
    for u, v in zip(_weights(a), _weights(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_steps_per_execution_gives_the_identical_trajectory(name):
    x, y = _data()
    runs = []
    for spe in (1, 5):
        model = _model(SAMPLERS[name]())
        model.compile(loss="mse", steps_per_execution=spe)
        model.fit(_ordered_dataset(x, y, 8), steps_per_epoch=20, epochs=1, verbose=0)
        runs.append(_weights(model) + [v.numpy() for v in model.non_trainable_variables])
    for u, v in zip(*runs):
        np.testing.assert_array_equal(u, v)


def test_same_seed_same_trajectory_and_different_seed_different():
    x, y = _data()

    def run(seed):
        model = _model(seed=seed)
        model.compile(loss="mse")
        model.fit(_ordered_dataset(x, y, 8), steps_per_epoch=10, epochs=1, verbose=0)
        return _weights(model)

    first, again, other = run(5), run(5), run(6)
    for u, v in zip(first, again):
        np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(u, v) for u, v in zip(first, other))


def test_sampler_state_lives_in_non_trainable_variables_created_once():
    x, y = _data()
    model = _model(kt.samplers.SGNHT(1e-3))
    model.compile(loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    count = len(model.non_trainable_variables)
    # step + one momentum per trainable variable + xi + the warm-up's heat + the last step's A,
    # then the temperature, the sampler's settings (step size, friction, thermal mass) and the
    # measured curvature
    assert count == 1 + len(model.trainable_variables) + 3 + 1 + len(model.sampler.setting_values()) + 1
    assert sorted(model.sampler.setting_values()) == ["friction", "step_size", "thermal_mass"]
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[kt.callbacks.SampleCollector()])
    assert len(model.non_trainable_variables) == count
    assert model.sampler_step == 8


# --- compile and construction errors --------------------------------------------------------

BAD_MODEL_INPUTS = [
    (dict(num_examples=0), ValueError, ["num_examples", "0"]),
    (dict(num_examples=10.5), TypeError, ["num_examples", "10.5"]),
    (dict(temperature=-1.0), ValueError, ["temperature", "-1.0"]),
    (dict(temperature="hot"), TypeError, ["temperature", "'hot'", "TemperatureSchedule"]),
    (dict(seed=-3), ValueError, ["seed", "-3"]),
    (dict(loss_elements_per_example=0), ValueError, ["loss_elements_per_example", "0"]),
    (dict(loss_elements_per_example="tokens"), TypeError, ["loss_elements_per_example", "'tokens'"]),
    (dict(prior=lambda w: 0.0), TypeError, ["prior"]),
    (dict(sampler="hmc"), ValueError, ["`sampler` must be one of", "'hmc'", "'sgnht'"]),
    (dict(sampler=kt.samplers.SGNHT), TypeError, ["`sampler`", "the class SGNHT", "SGNHT()"]),
    (dict(sampler=keras.optimizers.Adam()), TypeError, ["`sampler`", "Keras optimizer Adam", "'sgnht'"]),
    (dict(sampler=1e-3), TypeError, ["`sampler`", "float", "0.001"]),
    (dict(sampler=keras.optimizers.serialize(keras.optimizers.Adam())), TypeError, ["`sampler`", "config dict of Adam"]),
    (dict(net="not a model"), TypeError, ["net", "str"]),
    (dict(num_chains=0), ValueError, ["num_chains", "0", ">= 1"]),
    (dict(num_chains="two"), TypeError, ["num_chains", "'two'", "integer"]),
    (dict(num_chains=2.5), TypeError, ["num_chains", "2.5"]),
    (dict(num_chains=2, prior=kt.priors.HierarchicalGaussian()), ValueError, ["prior", "HierarchicalGaussian", "num_chains=2"]),
    (dict(chain_method="parallel"), ValueError, ["chain_method", "parallel", "vectorized", "loop"]),
    (dict(chain_minibatches="half"), ValueError, ["chain_minibatches", "half", "split", "shared"]),
]


@pytest.mark.parametrize("kwargs, error, words", BAD_MODEL_INPUTS)
def test_bad_model_arguments(kwargs, error, words):
    base = dict(net=_net(), sampler=kt.samplers.SGLD(1e-3), num_examples=N)
    base.update(kwargs)
    with pytest.raises(error) as info:
        kt.BayesianModel(**base)
    for word in words:
        assert word in str(info.value)


def test_compile_refuses_optimizer_missing_loss_and_sum_reduction():
    model = _model()
    with pytest.raises(ValueError, match="`optimizer` must be None"):
        model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="`loss` is required"):
        model.compile()
    with pytest.raises(ValueError, match="reduction='sum'"):
        model.compile(loss=keras.losses.MeanSquaredError(reduction="sum"))


def test_model_without_trainable_weights_is_refused():
    net = _net()
    net.trainable = False
    model = kt.BayesianModel(net, kt.samplers.SGLD(1e-3), num_examples=N)
    model.compile(loss="mse")
    x, y = _data()
    with pytest.raises(ValueError, match="no trainable weights"):
        model.fit(x, y, verbose=0)


# --- saving and resuming ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_save_load_and_resume_is_bit_exact(name, tmp_path):
    x, y = _data()
    data = _ordered_dataset(x, y, 8)  # 8 batches per pass: 2 x 8 steps replay the same data
    straight = _model(SAMPLERS[name](), prior=kt.priors.Gaussian(1.0))
    straight.compile(loss="mse")
    straight.fit(data, steps_per_epoch=16, epochs=1, verbose=0)

    first = _model(SAMPLERS[name](), prior=kt.priors.Gaussian(1.0))
    first.compile(loss="mse")
    first.fit(data, steps_per_epoch=8, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    first.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, kt.BayesianModel)
    assert restored.get_config()["sampler"] == first.get_config()["sampler"]
    assert restored.sampler_step == 8
    restored.fit(data, steps_per_epoch=8, epochs=1, verbose=0)
    for u, v in zip(_weights(straight), _weights(restored)):
        np.testing.assert_array_equal(u, v)
    for u, v in zip(straight.non_trainable_variables, restored.non_trainable_variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_a_model_saved_before_its_first_fit_loads_and_fits_as_the_original(tmp_path):
    x, y = _data()
    data = _ordered_dataset(x, y, 8)
    original = _model(kt.samplers.SGNHT(1e-3), prior=kt.priors.Gaussian(1.0))
    original.compile(loss="mse")
    path = os.path.join(tmp_path, "model.keras")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are saving a model that has not yet been built")
        original.save(path)  # the net is built, the sampler state not yet
    restored = keras.saving.load_model(path)
    for model in (original, restored):
        model.fit(data, steps_per_epoch=8, epochs=1, verbose=0)
    assert restored.sampler_step == original.sampler_step == 8
    for u, v in zip(_weights(original), _weights(restored)):
        np.testing.assert_array_equal(u, v)


def test_a_build_config_without_the_built_key_builds_the_sampler_state():
    # Files saved before the key existed were saved after a fit: their state is created to load into.
    model = _model(kt.samplers.SGNHT(1e-3))
    model.compile(loss="mse")
    model.build_from_config({"net_built": True})
    assert model.built and model._state_variables
    unbuilt = _model(kt.samplers.SGNHT(1e-3))
    unbuilt.build_from_config({"net_built": True, "built": False})
    assert not unbuilt._state_variables


def test_get_config_round_trip():
    model = _model(kt.samplers.SGNHT(1e-3, integrator="symmetric"), prior=kt.priors.Gaussian([1.0, 2.0, 1.0, 0.5]), temperature=0.5)
    config = model.get_config()
    clone = kt.BayesianModel.from_config(config)
    assert clone.get_config() == config
    assert clone.seed == model.seed == 3


def test_seed_none_is_drawn_and_kept():
    model = kt.BayesianModel(_net(), kt.samplers.SGLD(1e-3), num_examples=N)
    assert 0 <= model.get_config()["seed"] < 2**31


# --- recording --------------------------------------------------------------------------------


class _EveryStepWeights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.concatenate([v.numpy().ravel() for v in self.model.trainable_variables]))


def test_sample_collector_is_exact_with_steps_per_execution():
    x, y = _data()
    reference = _model()
    reference.compile(loss="mse", steps_per_execution=1)
    every_step = _EveryStepWeights()
    reference.fit(_ordered_dataset(x, y, 8), steps_per_epoch=42, epochs=1, verbose=0, callbacks=[every_step])

    model = _model()
    model.compile(loss="mse", steps_per_execution=7)
    collector = kt.callbacks.SampleCollector(burn_in_steps=5, every_n_steps=3, max_samples=100)
    # 42 = 6 executions of 7 steps (Keras runs whole executions).
    model.fit(_ordered_dataset(x, y, 8), steps_per_epoch=42, epochs=1, verbose=0, callbacks=[collector])
    np.testing.assert_array_equal(collector.steps, np.arange(8, 43, 3))
    expected = np.stack([every_step.weights[s - 1] for s in collector.steps])
    np.testing.assert_array_equal(collector.samples, expected)
    assert collector.samples.shape == (12, model.num_params)


def test_sample_collector_memory_is_bounded_and_stays_evenly_spaced():
    x, y = _data()
    model = _model()
    model.compile(loss="mse", steps_per_execution=10)
    collector = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=1, max_samples=8)
    model.fit(_ordered_dataset(x, y, 8), steps_per_epoch=100, epochs=1, verbose=0, callbacks=[collector])
    steps = collector.steps
    assert len(steps) <= 8
    gaps = np.diff(steps)
    assert np.all(gaps == gaps[0]) and steps[0] == 1
    assert steps[-1] > 80  # covers the whole run, not just its start


def test_sample_collector_argument_errors():
    with pytest.raises(ValueError, match="every_n_steps"):
        kt.callbacks.SampleCollector(every_n_steps=0)
    with pytest.raises(TypeError, match="burn_in_steps"):
        kt.callbacks.SampleCollector(burn_in_steps=1.5)
    with pytest.raises(ValueError, match="max_samples"):
        kt.callbacks.SampleCollector(max_samples=1)


# --- diagnostics ------------------------------------------------------------------------------


def test_diagnostics_reach_tensorboard_event_files(tmp_path):
    x, y = _data()
    model = _model(kt.samplers.SGNHT(1e-3))
    model.compile(loss="mse")
    logdir = str(tmp_path)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[keras.callbacks.TensorBoard(logdir)])
    tags = set()
    for path in glob.glob(os.path.join(logdir, "train", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.add(value.tag)
    assert {"epoch_kinetic_temperature", "epoch_xi", "epoch_potential", "epoch_step_size"} <= tags


# --- divergence -------------------------------------------------------------------------------


def test_divergence_stops_with_a_clear_error_and_keeps_the_last_finite_state():
    x, y = _data()
    x = x * 100.0
    model = _model(kt.samplers.SGHMC(1.0, friction=1.0), num_examples=10_000)
    model.compile(loss="mse", steps_per_execution=3)
    every_step = _EveryStepWeights()
    with pytest.raises(kt.SamplerDivergedError) as info:
        model.fit(_ordered_dataset(x, y, 8), steps_per_epoch=200, epochs=1, verbose=0, callbacks=[every_step])
    message = str(info.value)
    assert "SGHMC" in message and "step size" in message and "step_size" in message
    for variable in model.variables:
        value = variable.numpy()
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.isfinite(value))
    step = model.sampler_step
    assert f"step {step}" in message  # the failing step's index equals the completed-step count
    assert info.value.step == step
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    assert np.all(np.isfinite(flat)) and np.max(np.abs(flat)) > 1.0  # it had moved


def test_train_on_batch_and_evaluate_before_fit():
    x, y = _data()
    model = kt.BayesianModel(keras.Sequential([keras.layers.Dense(1)]), kt.samplers.SGNHT(1e-3), num_examples=N, seed=0)
    model.compile(loss="mse")
    model.evaluate(x, y, verbose=0)  # builds the net (and the state) from the data
    logs = model.train_on_batch(x[:8], y[:8], return_dict=True)
    assert {"potential", "kinetic_temperature", "xi", "step_size"} <= set(logs)
    assert model.sampler_step == 1
    fresh = kt.BayesianModel(keras.Sequential([keras.layers.Dense(1)]), kt.samplers.SGHMC(1e-3), num_examples=N, seed=0)
    fresh.compile(loss="mse")
    fresh.train_on_batch(x[:8], y[:8])
    assert fresh.sampler_step == 1


def test_per_example_samplers_refuse_a_weighted_mean_reduction():
    model = _model(kt.samplers.MCCAdL(1e-3))
    with pytest.raises(ValueError, match="mean_with_sample_weight.*MCCAdL"):
        model.compile(loss=keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"))
    _model(kt.samplers.SGNHT(1e-3)).compile(loss=keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"))


def test_recording_refuses_a_schedule_that_never_meets_tact_samples():
    x, y = _data()
    model = _model(kt.samplers.TACTHMC(1e-4, sample_every=10))
    model.compile(loss="mse")
    collector = kt.callbacks.SampleCollector(burn_in_steps=5, every_n_steps=10)
    with pytest.raises(ValueError, match="gcd"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[collector])
    # burn_in 20 with every_n 4 and K 10: gcd 2 divides 20, so steps 40, 60, ... are recorded.
    kt.callbacks.SampleCollector(burn_in_steps=20, every_n_steps=4)._check_sampling_period(model.sampler)


# --- settings the compiled step reads from variables ------------------------------------------


class _LogMeans(keras.callbacks.Callback):
    def __init__(self, key):
        super().__init__()
        self.key, self.values = key, []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(logs[self.key]))


def test_changing_temperature_after_the_first_fit_takes_effect():
    """SGLD's kinetic temperature is ~T when the noise dominates the drift (eps |F|^2 / 4 Nd is
    ~1e-3 here): it must follow T from 1 to 4 in the second fit. Each fit averages 50 steps of a
    chi2 over Nd = 21 scalars (relative sd ~ sqrt(2 / (21 * 50)) = 4%), so a 30% band is 7 sd."""
    x, y = _data()
    model = _model(kt.samplers.SGLD(1e-4))
    model.compile(loss="mse")
    first, second = _LogMeans("kinetic_temperature"), _LogMeans("kinetic_temperature")
    model.fit(x, y, batch_size=16, epochs=50 // 4, verbose=0, callbacks=[first])
    model.temperature = 4.0
    model.fit(x, y, batch_size=16, epochs=50 // 4, verbose=0, callbacks=[second])
    assert np.mean(first.values) == pytest.approx(1.0, rel=0.3)
    assert np.mean(second.values) == pytest.approx(4.0, rel=0.3)


class _SetStepSize(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 2:
            self.model.sampler.step_size = 5e-3


def test_step_size_set_from_a_callback_takes_effect_at_the_next_step_and_is_checkpointed(tmp_path):
    x, y = _data()
    model = _model(kt.samplers.SGNHT(1e-3))
    model.compile(loss="mse")
    logged = _LogMeans("step_size")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[_SetStepSize(), logged])
    np.testing.assert_allclose(logged.values, [1e-3, 1e-3, 5e-3, 5e-3], rtol=1e-6)
    model.temperature = 0.5
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    fresh = _model(kt.samplers.SGNHT(1e-3))  # the original settings, then the saved weights
    fresh.compile(loss="mse")
    fresh.build((None, 3))
    fresh.load_weights(path)
    assert fresh.sampler.step_size == pytest.approx(5e-3) and fresh.temperature == 0.5
    assert fresh.get_config()["temperature"] == 0.5
    assert fresh.sampler.get_config()["step_size"] == pytest.approx(5e-3)


def test_a_sampler_shared_by_two_models_keeps_their_step_sizes_apart():
    x, y = _data()
    sampler = kt.samplers.SGHMC(1e-3)
    first, second = _model(sampler), _model(sampler)
    for model in (first, second):
        model.compile(loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    second.sampler.step_size = 2e-3
    assert first.sampler.step_size == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "callback", [keras.callbacks.LearningRateScheduler(lambda epoch: 1e-3), keras.callbacks.ReduceLROnPlateau()],
    ids=["LearningRateScheduler", "ReduceLROnPlateau"],
)
def test_learning_rate_callbacks_are_refused_with_what_to_do(callback):
    x, y = _data()
    model = _model()
    model.compile(loss="mse")
    with pytest.raises(ValueError, match=f"{type(callback).__name__}.*no optimizer.*sampler.step_size"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])


def test_float64_weights_are_refused_naming_the_variable_and_dtype():
    net = keras.Sequential([keras.Input((3,), dtype="float64"), keras.layers.Dense(1, dtype="float64")])
    model = _model(net=net)
    model.compile(loss="mse")
    x, y = _data()
    with pytest.raises(TypeError, match=r"float32 weights.*kernel.*'float64'"):
        model.fit(x.astype("float64"), y.astype("float64"), batch_size=16, epochs=1, verbose=0)


def test_temperature_setter_checks_its_value():
    model = _model()
    with pytest.raises(ValueError, match=r"`temperature` must be in \(0, inf\), got -2.0"):
        model.temperature = -2.0
    assert model.temperature == 1.0


# --- the likelihood scale of the per-example samplers -------------------------------------------


@pytest.mark.parametrize("path", ["vectorized", "dense_layers"])
@pytest.mark.parametrize("sampler", ["ccadl", "mccadl"])
def test_loss_weights_scale_the_per_example_noise_covariance_by_their_square(path, sampler):
    """`loss_weights=w` makes U's data term w N L, so the force noise covariance is w^2 times
    larger; the first step's logged noise_scale (tr Sigma / Nd of the first batch) must show it."""
    x, y = _data()
    noise_scales = []
    for weight in (None, 3.0):
        model = _model(kt.samplers.get(sampler, step_size=1e-4), net=_net(), per_example_method=path)
        model.compile(loss="mse", loss_weights=weight)
        logs = model.train_on_batch(x[:16], y[:16], return_dict=True)
        noise_scales.append(logs["noise_scale"])
    assert noise_scales[1] == pytest.approx(9.0 * noise_scales[0], rel=1e-4)


def test_per_example_samplers_refuse_multi_output_losses_at_compile():
    inputs = keras.Input((3,))
    net = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs), "b": keras.layers.Dense(1, name="b")(inputs)})
    model = _model(kt.samplers.MCCAdL(1e-4), net=net)
    with pytest.raises(ValueError, match=r"MCCAdL takes per-example gradients of a single-output loss.*SGNHT"):
        model.compile(loss={"a": "mse", "b": "mse"})
    plain = _model(kt.samplers.SGNHT(1e-4), net=net)
    plain.compile(loss={"a": "mse", "b": "mse"}, loss_weights={"a": 1.0, "b": 2.0})  # no per-example pass


def test_loss_elements_per_example_makes_a_sequence_likelihood_the_per_example_sum():
    """A per-token loss on [n, T] targets: Keras averages over n T elements, so with k = T the
    potential's data term is (N / n) sum_i sum_t l_it, and the covariance samplers' noise (N k)^2/n.
    """
    steps, n = 5, 8
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, steps, 2)).astype("float32")
    y = rng.normal(size=(n, steps, 1)).astype("float32")
    net = keras.Sequential([keras.Input((steps, 2)), keras.layers.Dense(1)])
    model = _model(kt.samplers.CCAdL(1e-5), net=net, loss_elements_per_example=steps, num_examples=40)
    model.compile(loss="mse")
    model.build((None, steps, 2))
    potential, loss, y_pred = model.compute_potential(x, y)
    per_token = (y - y_pred.numpy()) ** 2
    np.testing.assert_allclose(float(potential), 40 / n * per_token.sum(), rtol=1e-5)
    restored = kt.BayesianModel.from_config(model.get_config())
    assert restored.loss_elements_per_example == steps
    noise, start = [], net.get_weights()
    for k in (1, steps):
        net.set_weights(start)  # the first step's covariance is that of the same weights
        other = _model(kt.samplers.CCAdL(1e-5), net=net, loss_elements_per_example=k, num_examples=40)
        other.compile(loss="mse")
        noise.append(other.train_on_batch(x, y, return_dict=True)["noise_scale"])
    assert noise[1] == pytest.approx(steps**2 * noise[0], rel=1e-4)


# --- layers that change the target ----------------------------------------------------------------


@pytest.mark.parametrize(
    "layer, words",
    [
        (keras.layers.Dropout(0.3), ["Dropout (rate=0.3)", "noise-averaged target"]),
        (keras.layers.GaussianNoise(0.1), ["GaussianNoise (stddev=0.1)", "noise-averaged target"]),
        (keras.layers.RandomFlip("horizontal"), ["RandomFlip", "SeedGenerator", "augmentation"]),
        (keras.layers.BatchNormalization(), ["BatchNormalization in training mode", "batch-dependent", "final moving statistics"]),
    ],
    ids=["dropout", "gaussian_noise", "augmentation", "batch_norm"],
)
def test_layers_that_make_the_potential_random_or_batch_coupled_warn_once(layer, words):
    x, y = _data()
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), layer, keras.layers.Dense(1)])
    if isinstance(layer, keras.layers.RandomFlip):
        net = keras.Sequential([keras.Input((3, 1, 1)), layer, keras.layers.Flatten(), keras.layers.Dense(1)])
        x = x.reshape(-1, 3, 1, 1)
    model = _model(kt.samplers.SGHMC(1e-3), net=net)
    model.compile(loss="mse")
    with pytest.warns(UserWarning) as record:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    messages = [str(w.message) for w in record if "BayesianModel: layer" in str(w.message)]
    assert len(messages) == 1 and all(word in messages[0] for word in words), messages
    assert layer.name in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # once per model
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_frozen_batch_norm_and_zero_rate_dropout_do_not_warn():
    x, y = _data()
    frozen = keras.layers.BatchNormalization()
    frozen.trainable = False
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), frozen, keras.layers.Dropout(0.0),
                            keras.layers.Dense(1)])
    model = _model(kt.samplers.SGHMC(1e-3), net=net)
    model.compile(loss=kt.losses.GaussianNLL(scale=1.0))  # "mse" warns about its noise variance
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_configurational_temperature_is_minus_theta_dot_force_over_nd():
    """One SGHMC step from known weights: the log is -theta.F/Nd of the step's own force,
    computed here independently from U = N * mse + |theta|^2 / 2."""
    x, y = _data()
    model = _model(kt.samplers.SGHMC(1e-4), prior=kt.priors.Gaussian(1.0))
    model.compile(loss="mse")
    model.build((None, 3))
    theta = [v.numpy().copy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        potential, _, _ = model.compute_potential(x[:16], y[:16])
    gradients = tape.gradient(potential, model.trainable_variables)
    expected = sum(float(np.sum(t * g.numpy())) for t, g in zip(theta, gradients)) / model.num_params
    logs = model.train_on_batch(x[:16], y[:16], return_dict=True)
    assert logs["configurational_temperature"] == pytest.approx(expected, rel=1e-5)


def test_modules_users_reach_for_are_package_attributes():
    for name in ("data", "metrics", "diagnostics", "models", "callbacks", "priors", "samplers", "schedules"):
        assert hasattr(kt, name), name
