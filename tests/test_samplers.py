"""One-step exact values, properties, configs and argument checks of SGLD, SGHMC and SGNHT."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import random as kt_random
from keras_thermo.samplers.base import StepContext

SEED = 7


def _context(temperature=1.0):
    return StepContext(
        temperature=temperature, num_examples=100, batch_size=tf.constant(10.0),
        potential=tf.constant(0.0), seed=SEED,
    )


def _params():
    return [tf.constant([[0.5, -1.0]], tf.float32), tf.constant([2.0], tf.float32)]


def _force():
    return [tf.constant([[1.0, 2.0]], tf.float32), tf.constant([-4.0], tf.float32)]


def _noise(step, stream):
    key = kt_random.step_key(SEED, tf.constant(step, tf.int64), stream)
    return [r.numpy() for r in kt_random.normal_like(key, _params())]


def _step(sampler, temperature=1.0, state=None):
    params = _params()
    if state is None:
        state = sampler.init(params, temperature=temperature, seed=SEED)
    new_params, new_state, logs = sampler.update(state, params, _force(), _context(temperature))
    return state, [p.numpy() for p in new_params], new_state, logs


def test_sgld_one_step_matches_hand_computation():
    eps, temp = 0.01, 2.0
    _, new_params, state, logs = _step(kt.samplers.SGLD(eps), temperature=temp)
    r = _noise(0, kt_random.STREAM_MOMENTUM)
    for theta, f, noise, got in zip(_params(), _force(), r, new_params):
        np.testing.assert_allclose(got, theta + eps / 2 * f + math.sqrt(eps * temp) * noise, rtol=1e-6)
    increments = [g - t.numpy() for g, t in zip(new_params, _params())]
    expected_kt = sum(float(np.sum(d**2)) for d in increments) / eps / 3
    assert float(logs["kinetic_temperature"]) == pytest.approx(expected_kt, rel=1e-4)
    assert int(state.step) == 1


def test_sgld_schedule_sets_the_step_size():
    schedule = kt.schedules.PolynomialDecay(a=0.1, b=2.0, gamma=0.5)
    sampler = kt.samplers.SGLD(schedule)
    state = sampler.init(_params(), temperature=1.0, seed=SEED)._replace(step=tf.constant(7, tf.int64))
    _, _, _, logs = _step(sampler, state=state)
    assert float(logs["step_size"]) == pytest.approx(0.1 * (2.0 + 7) ** -0.5, rel=1e-6)


def test_sghmc_one_step_matches_hand_computation():
    h, a, mass, temp = 0.05, 2.0, 1.5, 0.7
    sampler = kt.samplers.SGHMC(h, friction=a, mass=mass)
    state, new_params, new_state, _ = _step(sampler, temperature=temp)
    r = _noise(0, kt_random.STREAM_MOMENTUM)
    for i, (theta, f) in enumerate(zip(_params(), _force())):
        p0 = state.momentum[i].numpy()
        p1 = p0 + h * f.numpy() - h * a * p0 + math.sqrt(2 * a * temp * h * mass) * r[i]
        np.testing.assert_allclose(new_state.momentum[i], p1, rtol=1e-5)
        np.testing.assert_allclose(new_params[i], theta.numpy() + h / mass * p1, rtol=1e-5)


def test_sgnht_euler_one_step_matches_hand_computation():
    h, a, temp = 0.05, 1.5, 1.0
    sampler = kt.samplers.SGNHT(h, friction=a, thermal_mass=4.0, per_variable_thermostat=False)
    state, new_params, new_state, logs = _step(sampler, temperature=temp)
    assert float(state.xi) == a  # xi_0 = A
    r = _noise(0, kt_random.STREAM_MOMENTUM)
    p1 = [
        p.numpy() - a * p.numpy() * h + h * f.numpy() + math.sqrt(2 * a * temp * h) * noise
        for p, f, noise in zip(state.momentum, _force(), r)
    ]
    for theta, p, got in zip(_params(), p1, new_params):
        np.testing.assert_allclose(got, theta.numpy() + h * p, rtol=1e-5)
    pp = sum(float(np.sum(p**2)) for p in p1)
    assert float(new_state.xi) == pytest.approx(a + h / 4.0 * (pp - 3 * temp), rel=1e-5)
    assert float(logs["xi"]) == float(np.float32(new_state.xi))  # logged in float32


def test_sgnht_symmetric_one_step_matches_hand_computation():
    h, a, temp, mu = 0.1, 1.0, 1.0, 3.0
    sampler = kt.samplers.SGNHT(h, friction=a, thermal_mass=mu, integrator="symmetric", per_variable_thermostat=False)
    state, new_params, new_state, _ = _step(sampler, temperature=temp)
    r1 = _noise(0, kt_random.STREAM_MOMENTUM)
    r2 = _noise(0, kt_random.STREAM_MOMENTUM_2)

    def o_step(p, xi, noise):
        std = math.sqrt(a * temp * (1 - math.exp(-xi * h)) / xi)
        return [math.exp(-xi * h / 2) * q + std * z for q, z in zip(p, noise)]

    def d_step(xi, p):
        return xi + (h / 2) / mu * (sum(float(np.sum(q**2)) for q in p) - 3 * temp)

    p = [q.numpy() + (h / 2) * f.numpy() for q, f in zip(state.momentum, _force())]  # first step: half kick
    theta = [t.numpy() + (h / 2) * q for t, q in zip(_params(), p)]
    p = o_step(p, a, r1)
    xi = d_step(d_step(a, p), p)
    p = o_step(p, xi, r2)
    theta = [t + (h / 2) * q for t, q in zip(theta, p)]
    for got, want in zip(new_params, theta):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(new_state.xi) == pytest.approx(xi, rel=1e-5)


def test_sgnht_symmetric_merges_half_kicks_after_the_first_step():
    # A huge thermal mass freezes xi, so the step is linear in the kick.
    sampler = kt.samplers.SGNHT(0.1, thermal_mass=1e12, integrator="symmetric")
    params = _params()
    state = sampler.init(params, temperature=0.0, seed=SEED)
    zero_noise_context = _context(temperature=0.0)
    # T = 0: no noise and p_0 = 0, so after one step at xi = A the drift is fully determined.
    first, state1, _ = sampler.update(state, params, _force(), zero_noise_context)
    later_state = state._replace(step=tf.constant(5, tf.int64))
    later, _, _ = sampler.update(later_state, params, _force(), zero_noise_context)
    for p0, p1, theta in zip(first, later, params):
        # The later step kicks with h F instead of h F / 2: twice the displacement.
        np.testing.assert_allclose(p1 - theta, 2 * (p0 - theta), rtol=1e-5)


@pytest.mark.parametrize(
    "sampler",
    [
        kt.samplers.SGLD(0.01),
        kt.samplers.SGHMC(0.01),
        kt.samplers.SGNHT(0.01),
        kt.samplers.SGNHT(0.01, integrator="symmetric"),
    ],
    ids=["sgld", "sghmc", "sgnht", "sgnht-symmetric"],
)
def test_zero_temperature_and_zero_force_leave_theta_fixed(sampler):
    params = _params()
    state = sampler.init(params, temperature=0.0, seed=SEED)
    zero = [tf.zeros_like(p) for p in params]
    for _ in range(3):
        params_next, state, _ = sampler.update(state, params, zero, _context(temperature=0.0))
        for before, after in zip(params, params_next):
            np.testing.assert_array_equal(before.numpy(), after.numpy())
        params = params_next


def test_sghmc_friction_decays_momentum():
    sampler = kt.samplers.SGHMC(0.1, friction=5.0)
    params = _params()
    state = sampler.init(params, temperature=1.0, seed=SEED)
    zero = [tf.zeros_like(p) for p in params]
    _, new_state, _ = sampler.update(state, params, zero, _context(temperature=0.0))
    for before, after in zip(state.momentum, new_state.momentum):
        np.testing.assert_allclose(after, 0.5 * before.numpy(), rtol=1e-6)


def test_sgnht_thermostat_rises_when_hotter_than_target():
    for per_variable_thermostat in (True, False):  # one xi per tensor (the default), the papers' one
        sampler = kt.samplers.SGNHT(0.01, friction=1.0, per_variable_thermostat=per_variable_thermostat)
        params = _params()
        state = sampler.init(params, temperature=1.0, seed=SEED)
        hot = state._replace(momentum=[10.0 * tf.ones_like(p) for p in params])
        cold = state._replace(momentum=[0.01 * tf.ones_like(p) for p in params])
        zero = [tf.zeros_like(p) for p in params]
        _, hot_next, _ = sampler.update(hot, params, zero, _context())
        _, cold_next, _ = sampler.update(cold, params, zero, _context())
        assert np.shape(hot_next.xi) == ((len(params),) if per_variable_thermostat else ())
        assert np.all(np.asarray(hot_next.xi) > 1.0) and np.all(np.asarray(cold_next.xi) < 1.0)


def test_initial_momentum_is_maxwellian():
    big = [tf.zeros([20000])]
    state = kt.samplers.SGHMC(0.01, mass=2.0).init(big, temperature=3.0, seed=SEED)
    p = state.momentum[0].numpy()
    # Sample variance of 20000 normals: relative standard error sqrt(2/20000) = 1%; allow 5 sigma.
    assert np.var(p) == pytest.approx(6.0, rel=0.05)


@pytest.mark.parametrize(
    "sampler",
    [
        kt.samplers.SGLD(kt.schedules.PolynomialDecay(0.01, 1.0, 0.6)),
        kt.samplers.SGHMC(0.01, friction=2.0, mass=3.0),
        kt.samplers.SGNHT(0.02, friction=0.5, thermal_mass=7.0, mass=2.0, integrator="symmetric"),
        kt.samplers.CCAdL(2e-3, friction=3.0, covariance="full", thermal_mass=9.0, mass=2.0, max_full_params=50),
        kt.samplers.CCAdL(keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9), covariance_window=500),
        kt.samplers.MCCAdL(2e-3, friction=0.5, thermal_mass=4.0, mass=3.0, covariance="minibatch", expm="taylor"),
        kt.samplers.MCCAdL(covariance_window=100),
    ],
    ids=["sgld", "sghmc", "sgnht", "ccadl", "ccadl-schedule", "mccadl", "mccadl-default"],
)
def test_get_config_round_trip(sampler):
    config = keras.saving.serialize_keras_object(sampler)
    restored = keras.saving.deserialize_keras_object(config)
    assert type(restored) is type(sampler)
    assert restored.get_config() == sampler.get_config()
    assert kt.samplers.get(config).get_config() == sampler.get_config()


def test_an_mccadl_config_saved_before_the_covariance_argument_loads_as_the_minibatch_c_step():
    # Such configs are committed in benchmarks/results (every key but `covariance`); they ran the
    # minibatch C step, which was then the only one.
    saved = {"step_size": 1e-3, "preconditioner": None, "friction": 1.0, "thermal_mass": None, "mass": 1.0,
             "warmup_steps": 1000, "per_variable_thermostat": False, "expm": "taylor"}
    restored = kt.samplers.MCCAdL.from_config(saved)
    assert restored.covariance == "minibatch" and restored.expm == "taylor"
    # A config naming only some arguments (no `expm`) takes today's default.
    assert kt.samplers.MCCAdL.from_config({"step_size": 1e-3}).covariance == "diag"


def test_get_takes_a_config_dict_with_the_plain_class_name():
    sampler = kt.samplers.get({"class_name": "MCCAdL", "config": {"step_size": 1e-3, "covariance": "minibatch"}})
    assert isinstance(sampler, kt.samplers.MCCAdL) and sampler.covariance == "minibatch"
    assert isinstance(kt.samplers.get({"class_name": "SGNHT", "config": {}}), kt.samplers.SGNHT)


def test_get_by_name():
    sampler = kt.samplers.get("sgnht", step_size=0.01, integrator="symmetric")
    assert isinstance(sampler, kt.samplers.SGNHT) and sampler.integrator == "symmetric"
    assert isinstance(kt.samplers.get("SGHMC", step_size=0.1), kt.samplers.SGHMC)
    with pytest.raises(ValueError, match="`identifier` must be one of .*'nuts'"):
        kt.samplers.get("nuts", step_size=0.1)


# Bad inputs: (constructor, kwargs, error type, words the message must contain).
BAD_INPUTS = [
    (kt.samplers.SGLD, {"step_size": 0.0}, ValueError, ["step_size", "0.0", "(0, inf)"]),
    (kt.samplers.SGLD, {"step_size": -1e-3}, ValueError, ["step_size", "-0.001"]),
    (kt.samplers.SGLD, {"step_size": float("nan")}, ValueError, ["step_size", "finite"]),
    (kt.samplers.SGLD, {"step_size": "big"}, ValueError, ["step_size", "'big'", "LearningRateSchedule", "'auto'"]),
    (kt.samplers.SGHMC, {"step_size": 0.1, "friction": 0.0}, ValueError, ["friction", "0.0"]),
    (kt.samplers.SGHMC, {"step_size": 0.1, "mass": -2}, ValueError, ["mass", "-2"]),
    (kt.samplers.SGNHT, {"step_size": 0.1, "thermal_mass": 0}, ValueError, ["thermal_mass", "0"]),
    (kt.samplers.SGNHT, {"step_size": 0.1, "integrator": "leapfrog"}, ValueError, ["integrator", "leapfrog", "symmetric"]),
    (kt.samplers.SGNHT, {"step_size": 0.1, "friction": True}, TypeError, ["friction", "True"]),
    (kt.samplers.SGHMC, {"step_size": 0.1, "preconditioner": "adam"}, ValueError, ["preconditioner", "'adam'", "'layerwise'", "'rmsprop'"]),
    (kt.samplers.SGLD, {"step_size": 0.1, "preconditioner": 3}, TypeError, ["preconditioner", "3", "None"]),
    (kt.samplers.preconditioning.Preconditioner, {"kind": "full"}, ValueError, ["kind", "'full'", "'layerwise'"]),
    (kt.samplers.preconditioning.Preconditioner, {"warmup_steps": 0}, ValueError, ["warmup_steps", "0", ">= 1"]),
    (kt.samplers.preconditioning.Preconditioner, {"decay": 1.0}, ValueError, ["decay", "1.0", "[0, 1)"]),
    (kt.samplers.preconditioning.Preconditioner, {"damping": -0.1}, ValueError, ["damping", "-0.1"]),
    (kt.schedules.PolynomialDecay, {"a": 0.1, "gamma": 1.5}, ValueError, ["gamma", "1.5", "[0, 1]"]),
    (kt.schedules.Cyclical, {"initial_step_size": 0.0, "cycle_length": 10}, ValueError, ["initial_step_size", "0.0", "(0, inf)"]),
    (kt.schedules.Cyclical, {"initial_step_size": 1e-3, "cycle_length": 0}, ValueError, ["cycle_length", "0", ">= 1"]),
    (kt.schedules.Cyclical, {"initial_step_size": 1e-3, "cycle_length": 10.0}, TypeError, ["cycle_length", "10.0", "integer"]),
    (kt.schedules.Cyclical, {"initial_step_size": 1e-3, "cycle_length": 10, "exploration_fraction": 1.0}, ValueError, ["exploration_fraction", "1.0", "[0, 1)"]),
    (kt.schedules.Cyclical, {"initial_step_size": 1e-3, "cycle_length": 3, "exploration_fraction": 0.9}, ValueError, ["exploration_fraction", "0.9", "cycle_length", "3", "no step"]),
    (kt.schedules.TemperatureRamp, {"initial_temperature": 0.0}, ValueError, ["initial_temperature", "0.0", "(0, inf)"]),
    (kt.schedules.TemperatureRamp, {"initial_temperature": 2.0, "temperature": -1}, ValueError, ["temperature", "-1"]),
    (kt.schedules.TemperatureRamp, {"initial_temperature": 2.0, "ramp_steps": 0}, ValueError, ["ramp_steps", "0", ">= 1"]),
    (kt.schedules.TemperatureRamp, {"initial_temperature": 2.0, "interpolation": "cosine"}, ValueError, ["interpolation", "'cosine'", "'geometric'", "'linear'"]),
    (kt.priors.Gaussian, {"std": 0.0}, ValueError, ["std", "0.0"]),
    (kt.priors.HierarchicalGaussian, {"alpha": 0.0}, ValueError, ["alpha", "0.0", "(0, inf)"]),
    (kt.priors.HierarchicalGaussian, {"beta": -1.0}, ValueError, ["beta", "-1.0"]),
    (kt.priors.HierarchicalGaussian, {"resample_every": 0}, ValueError, ["resample_every", "0", ">= 1"]),
    (kt.priors.HierarchicalGaussian, {"resample_every": 1.5}, TypeError, ["resample_every", "1.5", "integer"]),
    (kt.priors.HierarchicalGaussian, {"initial_std": 0}, ValueError, ["initial_std", "0"]),
    (kt.priors.Gaussian, {"std": [1.0, -1.0]}, ValueError, ["std[1]", "-1.0"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "friction": -1.0}, ValueError, ["friction", "-1.0", "(0, inf)"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "covariance": "block"}, ValueError, ["covariance", "'block'", "'diag'", "'full'"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "thermal_mass": 0.0}, ValueError, ["thermal_mass", "0.0"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "mass": float("inf")}, ValueError, ["mass", "finite"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "max_full_params": 0}, ValueError, ["max_full_params", "0", ">= 1"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "max_full_params": 2.5}, TypeError, ["max_full_params", "2.5", "integer"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "covariance_window": 0}, ValueError, ["covariance_window", "0", ">= 1"]),
    (kt.samplers.CCAdL, {"step_size": 1e-3, "covariance_window": 1e3}, TypeError, ["covariance_window", "1000.0", "integer"]),
    (kt.samplers.MCCAdL, {"step_size": -1e-3}, ValueError, ["step_size", "-0.001"]),
    (kt.samplers.MCCAdL, {"step_size": 1e-3, "friction": "high"}, TypeError, ["friction", "'high'"]),
    (kt.samplers.MCCAdL, {"step_size": 1e-3, "mass": 0}, ValueError, ["mass", "0"]),
    (kt.samplers.MCCAdL, {"step_size": 1e-3, "expm": "pade"}, ValueError, ["expm", "'pade'", "'taylor'", "'gram'"]),
]


@pytest.mark.parametrize("constructor, kwargs, error, words", BAD_INPUTS)
def test_bad_inputs_name_argument_value_and_range(constructor, kwargs, error, words):
    with pytest.raises(error) as info:
        constructor(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_a_float_step_size_can_be_changed_but_not_swapped_for_a_schedule_once_bound():
    sampler = kt.samplers.SGHMC(0.01)
    variable = tf.Variable(0.01)
    sampler.bind_step_size(variable)
    sampler.step_size = 0.02
    assert float(variable.numpy()) == pytest.approx(0.02) and sampler.step_size == pytest.approx(0.02)
    assert float(sampler.step_size_at(tf.constant(5, tf.int64))) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="step_size.*0.0"):
        sampler.step_size = 0.0
    with pytest.raises(ValueError, match="schedule"):
        sampler.step_size = kt.schedules.PolynomialDecay(0.1, 1.0, 0.5)
    assert sampler.get_config()["step_size"] == pytest.approx(0.02)
