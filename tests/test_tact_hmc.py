"""Tests of TACT-HMC (keras_thermo/samplers/tact_hmc.py) and its TensorBoard histograms.

Statistical checks use fixed seeds and tolerances from the Monte Carlo error: batch means of one
long chain (batches much longer than the autocorrelation time, so nearly independent) or
independent chains, with the Student-t machinery of `keras_thermo.testing`, or an ESS-based
binomial error for mode masses.
"""

from __future__ import annotations

import glob
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from benchmarks.tact_synthetic import GaussianMixture, simulate
from keras_thermo import diagnostics, testing
from keras_thermo import random as kt_random
from keras_thermo.tact_histograms import TACTHistograms
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.tact_hmc import (
    TACTHMC,
    bin_index,
    coupling,
    reflect_into_well,
    running_mean_update,
)

PAPER = {"xi0": 1.0 / 3.0, "xi1": 1.0, "power": 3}


def make_tact(**overrides) -> TACTHMC:
    options = dict(
        step_size=0.02, xi_step_size=3e-3, noise=0.05, xi_noise=0.1, thermal_inertia=1.0,
        xi_thermal_inertia=1.0, sample_every=1, num_bins=50,
    )
    options.update(overrides)
    return TACTHMC(**options)


def batch_t_statistics(series: np.ndarray, exact, num_batches: int = 10) -> np.ndarray:
    """Student-t statistics of batch means `[B, ...]` of a long chain against `exact`."""
    batches = np.array_split(np.asarray(series, np.float64), num_batches)
    return testing.chain_t_statistic(np.stack([b.mean(axis=0) for b in batches]), np.asarray(exact, np.float64))


# --- the coupling function ---------------------------------------------------------------------


def test_coupling_matches_the_papers_check_values():
    xi = tf.constant([0.0, 0.2, 1.0 / 3.0, -1.0, 1.0, 5.0 / 3.0, -5.0 / 3.0], tf.float64)
    lam, dlam = coupling(xi, **PAPER)
    np.testing.assert_allclose(1.0 / lam.numpy(), [1.0, 1.0, 1.0, 2.0, 2.0, 9.0, 9.0], rtol=1e-12)
    assert np.all(dlam.numpy()[:3] == 0.0)
    # Hand derivative at |xi| = xi1 (u = 1): -n u^(n-1) / (xi1 - xi0) / (1 + u^n)^2 = -9/8.
    np.testing.assert_allclose(dlam.numpy()[3:5], [9.0 / 8.0, -9.0 / 8.0], rtol=1e-12)
    assert make_tact().max_temperature_factor() == pytest.approx(9.0)


@pytest.mark.parametrize("power", [1, 2, 3, 5])
def test_coupling_derivative_matches_finite_differences(power):
    xi0, xi1 = 0.25, 0.9
    grid = np.linspace(-2.0, 2.0, 801)
    grid = grid[np.abs(np.abs(grid) - xi0) > 1e-3]  # lambda' jumps at xi0 when power == 1
    step = 1e-6
    lam_plus, _ = coupling(tf.constant(grid + step), xi0=xi0, xi1=xi1, power=power)
    lam_minus, _ = coupling(tf.constant(grid - step), xi0=xi0, xi1=xi1, power=power)
    _, dlam = coupling(tf.constant(grid), xi0=xi0, xi1=xi1, power=power)
    numeric = (lam_plus.numpy() - lam_minus.numpy()) / (2 * step)
    np.testing.assert_allclose(dlam.numpy(), numeric, atol=1e-7)
    # Independent closed form of lambda itself.
    u = np.maximum(np.abs(grid) - xi0, 0.0) / (xi1 - xi0)
    lam, _ = coupling(tf.constant(grid), xi0=xi0, xi1=xi1, power=power)
    np.testing.assert_allclose(lam.numpy(), 1.0 / (1.0 + u**power), rtol=1e-12)


# --- the well, the ABF table, one step ----------------------------------------------------------


def reflect_reference(x: float, v: float, wall: float) -> tuple[float, float]:
    """Bounce by bounce, in plain Python."""
    while abs(x) > wall:
        x = 2 * wall - x if x > wall else -2 * wall - x
        v = -v
    return x, v


def test_reflection_matches_bounce_by_bounce_reference_and_stays_inside():
    rng = np.random.default_rng(0)
    wall = 5.0 / 3.0
    x = rng.uniform(-12.0, 12.0, size=500)
    v = rng.normal(size=500)
    folded, velocity = reflect_into_well(tf.constant(x), tf.constant(v), wall)
    expected = np.array([reflect_reference(a, b, wall) for a, b in zip(x, v)])
    np.testing.assert_allclose(folded.numpy(), expected[:, 0], atol=1e-9)
    np.testing.assert_array_equal(velocity.numpy(), expected[:, 1])
    assert np.all(np.abs(folded.numpy()) <= wall)
    inside = np.array([-wall, -0.3, 0.0, 1.2, wall])
    unchanged, same_velocity = reflect_into_well(tf.constant(inside), tf.ones(5, tf.float64), wall)
    np.testing.assert_array_equal(unchanged.numpy(), inside)
    np.testing.assert_array_equal(same_velocity.numpy(), np.ones(5))


def test_abf_table_keeps_a_running_mean_per_bin():
    rng = np.random.default_rng(1)
    num_bins, wall = 7, 1.5
    positions = rng.uniform(-wall, wall, size=300)
    values = rng.normal(size=300) + positions
    mean, visits = tf.zeros([num_bins]), tf.zeros([num_bins], tf.int64)
    for x, value in zip(positions, values):
        mean, visits = running_mean_update(mean, visits, bin_index(x, wall=wall, num_bins=num_bins), value)
    bins = np.minimum(((positions + wall) / (2 * wall) * num_bins).astype(int), num_bins - 1)
    np.testing.assert_array_equal(visits.numpy(), np.bincount(bins, minlength=num_bins))
    expected = [values[bins == j].mean() for j in range(num_bins)]
    np.testing.assert_allclose(mean.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert int(bin_index(wall, wall=wall, num_bins=num_bins)) == num_bins - 1
    assert int(bin_index(-wall, wall=wall, num_bins=num_bins)) == 0


@pytest.mark.parametrize("friction_integrator", ["exact", "euler"])
def test_one_step_matches_a_hand_computation(friction_integrator):
    sampler = make_tact(num_bins=10, friction_integrator=friction_integrator, per_variable_thermostat=True)
    temperature, seed = 1.5, 3
    params = [tf.constant([0.3, -0.2]), tf.constant([[1.0]])]
    state = sampler.init(params, temperature=temperature, seed=seed)
    xi, r_xi = 1.2, 0.04
    abf_mean = np.linspace(-1.0, 1.0, 10).astype(np.float32)
    state = state._replace(
        # Thermostats and ABF means are float64 (keras_thermo.samplers.integrators).
        xi=tf.constant(xi), xi_momentum=tf.constant(r_xi),
        z_theta=[tf.constant(0.2, tf.float64), tf.constant(0.3, tf.float64)], z_xi=tf.constant(0.7, tf.float64),
        abf_mean_force=tf.constant(abf_mean, tf.float64), abf_visits=tf.fill([10], tf.constant(4, tf.int64)),
    )
    force = [tf.constant([1.0, 2.0]), tf.constant([[-0.5]])]
    potential = 7.0
    context = StepContext(temperature=temperature, num_examples=10, batch_size=tf.constant(5.0),
                          potential=tf.constant(potential), seed=seed)
    new_params, new_state, logs = sampler.update(state, params, force, context)

    # The same step by hand, in float64 numpy, with the sampler's own noise draws.
    eta, eta_xi = 0.02, 3e-3
    u = (xi - 1 / 3) / (2 / 3)
    lam = 1 / (1 + u**3)
    dlam = -3 * u**2 / (2 / 3) * lam**2
    friction = (lambda rate: np.exp(-rate)) if friction_integrator == "exact" else (lambda rate: 1 - rate)
    noise = context.normal(state.step, params, kt_random.STREAM_MOMENTUM)
    xi_noise = float(context.normal(state.step, [state.xi], kt_random.STREAM_TEMPERING)[0])
    z_theta, momenta = [], []
    for z, r, f, n in zip([0.2, 0.3], state.momentum, force, noise):
        r = r.numpy().astype(np.float64)
        z = z + lam**2 * (np.mean(r**2) - eta * temperature) / 1.0
        z_theta.append(z)
        momenta.append(friction(lam**2 * z) * r + lam * (eta * f.numpy() + math.sqrt(2 * 0.05 * eta * temperature) * n.numpy()))
    z_xi = 0.7 + dlam**2 * (r_xi**2 - eta_xi * temperature)
    j = int((xi + 5 / 3) / (10 / 3) * 10)
    new_r_xi = (friction(dlam**2 * z_xi) * r_xi
                - dlam * (eta_xi * potential + math.sqrt(2 * 0.1 * eta_xi * temperature) * xi_noise)
                + eta_xi * abf_mean[j])
    new_xi = xi + new_r_xi
    if new_xi > 5 / 3:
        new_xi, new_r_xi = 10 / 3 - new_xi, -new_r_xi
    for got, theta, r in zip(new_params, params, momenta):
        np.testing.assert_allclose(got.numpy(), theta.numpy() + r, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose([float(z) for z in new_state.z_theta], z_theta, rtol=1e-5)
    np.testing.assert_allclose(float(new_state.z_xi), z_xi, rtol=1e-5)
    np.testing.assert_allclose(float(new_state.xi_momentum), new_r_xi, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(float(new_state.xi), new_xi, rtol=1e-5)
    expected_mean = abf_mean.astype(np.float64)
    expected_mean[j] += (dlam * potential - expected_mean[j]) / 5
    np.testing.assert_allclose(new_state.abf_mean_force.numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    assert int(new_state.abf_visits[j]) == 5 and int(new_state.step) == 1
    kinetic = sum(np.sum(r**2) for r in momenta) / 3 / eta
    np.testing.assert_allclose(float(logs["kinetic_temperature"]), kinetic, rtol=1e-4)
    new_lam = 1 / (1 + max((abs(new_xi) - 1 / 3) / (2 / 3), 0) ** 3)
    np.testing.assert_allclose(float(logs["effective_temperature"]), temperature / new_lam, rtol=1e-5)
    np.testing.assert_allclose(float(logs["z_theta"]), np.mean(z_theta), rtol=1e-5)
    assert float(logs["on_plateau"]) == float(abs(new_xi) <= 1 / 3)
    assert set(logs) == {"kinetic_temperature", "step_size", "xi", "effective_temperature", "z_theta", "z_xi", "on_plateau"}


def test_ablations_freeze_what_they_switch_off():
    params = [tf.constant([0.5, -0.5])]
    context = StepContext(temperature=1.0, num_examples=1, batch_size=tf.constant(1.0),
                          potential=tf.constant(3.0), seed=0)
    force = [tf.constant([1.0, 1.0])]
    no_tempering = make_tact(tempering=False)
    state = no_tempering.init(params, temperature=1.0, seed=0)
    for _ in range(5):
        params_next, state, logs = no_tempering.update(state, params, force, context)
    assert float(state.xi) == 0.0 and float(logs["effective_temperature"]) == 1.0
    assert int(tf.reduce_sum(state.abf_visits)) == 0
    assert float(state.z_theta) != pytest.approx(0.05)  # the theta thermostat still works
    no_thermostat = make_tact(thermostat=False)
    state = no_thermostat.init(params, temperature=1.0, seed=0)
    for _ in range(5):
        _, state, _ = no_thermostat.update(state, params, force, context)
    assert float(state.z_theta) == pytest.approx(0.05) and float(state.z_xi) == pytest.approx(0.1)
    assert float(state.xi) != 0.0


def test_is_sample_needs_the_period_and_the_plateau():
    sampler = make_tact(sample_every=5)
    state = sampler.init([tf.zeros([2])], temperature=1.0, seed=0)
    cases = [(10, 0.0, True), (10, 1 / 3, True), (10, -0.34, False), (11, 0.0, False), (0, 0.1, True), (15, 1.6, False)]
    for step, xi, expected in cases:
        probe = state._replace(step=tf.constant(step, tf.int64), xi=tf.constant(xi, tf.float32))
        assert bool(sampler.is_sample(probe)) is expected, (step, xi)


# --- configuration -------------------------------------------------------------------------------


def test_config_round_trip_and_serialization():
    sampler = make_tact(per_variable_thermostat=True, wall=2.0, power=2, abf=False)
    clone = TACTHMC.from_config(sampler.get_config())
    assert clone.get_config() == sampler.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(sampler))
    assert isinstance(restored, TACTHMC) and restored.get_config() == sampler.get_config()
    scheduled = TACTHMC(keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.5))
    again = TACTHMC.from_config(scheduled.get_config())
    assert float(again.step_size_at(tf.constant(100))) == pytest.approx(5e-4)
    assert float(again.xi_step_size_at(tf.constant(100))) == pytest.approx(5e-4)


def test_a_given_xi_step_size_with_the_automatic_step_size():
    """`TACTHMC(xi_step_size=...)` keeps the automatic theta step (the default) and uses its own
    xi step as given; it used to fail at build, asking for a float `step_size`."""
    x, y = testing.linear_regression_data(64, 2, seed=0)
    model = kt.BayesianModel(testing.linear_regression_net(2), TACTHMC(xi_step_size=1e-7), num_examples=64,
                             prior=kt.priors.Gaussian(1.0), seed=4)
    model.compile(loss="mse", steps_per_execution=8)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    state = model.sampler_state()
    assert float(state.xi_momentum_step_size) == pytest.approx(1e-7)
    assert model.sampler.is_auto_step_size and float(state.momentum_step_size) != pytest.approx(1e-7)
    # Without it, xi follows the measured step size.
    follows = kt.BayesianModel(testing.linear_regression_net(2), TACTHMC(), num_examples=64,
                               prior=kt.priors.Gaussian(1.0), seed=4)
    follows.compile(loss="mse", steps_per_execution=8)
    follows.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert float(follows.sampler_state().xi_momentum_step_size) == float(follows.sampler_state().momentum_step_size)


@pytest.mark.parametrize(
    "overrides, error, fragment",
    [
        ({"step_size": -1.0}, ValueError, "step_size"),
        ({"xi_step_size": 0.0}, ValueError, "xi_step_size"),
        ({"noise": -0.1}, ValueError, "noise"),
        ({"thermal_inertia": 0.0}, ValueError, "thermal_inertia"),
        ({"xi_thermal_inertia": float("inf")}, ValueError, "xi_thermal_inertia"),
        ({"sample_every": 0}, ValueError, "sample_every"),
        ({"sample_every": 2.5}, TypeError, "sample_every"),
        ({"xi1": 0.2}, ValueError, "xi1"),
        ({"wall": 0.3}, ValueError, "wall"),
        ({"power": 0}, ValueError, "power"),
        ({"power": 2.0}, TypeError, "power"),
        ({"num_bins": 1}, ValueError, "num_bins"),
        ({"abf": "yes"}, TypeError, "abf"),
        ({"tempering": 1}, TypeError, "tempering"),
        ({"friction_integrator": "rk4"}, ValueError, "friction_integrator"),
    ],
)
def test_invalid_hyperparameters_are_named(overrides, error, fragment):
    with pytest.raises(error, match=fragment) as raised:
        make_tact(**overrides)
    assert repr(list(overrides.values())[0])[:4] in str(raised.value)


# --- statistical behaviour (direct update loop, XLA) --------------------------------------------


def xi_region_fractions(xi: np.ndarray, wall: float, regions: int = 5) -> np.ndarray:
    """`[S, regions]` indicators of which of `regions` equal parts of the well xi is in."""
    index = np.minimum(((xi + wall) / (2 * wall) * regions).astype(int), regions - 1)
    return np.eye(regions)[index]


def test_abf_flattens_the_xi_histogram():
    # theta ~ N(0, 0.25 I_4): without ABF, xi's marginal is ~ lambda(xi)^(-2), piled at the walls.
    target = GaussianMixture([1.0], [[0.0] * 4], [0.5])
    steps, burn_in = 150_000, 20_000
    results = {}
    for abf in (True, False):
        sampler = make_tact(abf=abf, step_size=0.01, num_bins=40)
        output = simulate(sampler, target.potential, [0.0] * 4, num_steps=steps, seed=11, record=("xi",))
        xi = output["xi"][burn_in:]
        assert np.all(np.abs(xi) <= sampler.wall)
        results[abf] = xi_region_fractions(xi, sampler.wall)
    # Flat: each fifth of the well (the middle one is the plateau) holds 1/5 of the time, within
    # the batch-means Student-t error (Bonferroni over 5 regions, 0.1% familywise).
    t_flat = batch_t_statistics(results[True], np.full(5, 0.2))
    threshold = testing.t_threshold(10, 5, 1e-3)
    assert np.all(np.abs(t_flat) < threshold), (t_flat, results[True].mean(axis=0))
    without = results[False].mean(axis=0)
    t_without = batch_t_statistics(results[False], np.full(5, 0.2))
    assert np.max(np.abs(t_without)) > 3 * threshold and without[2] < 0.1, without


def test_thermostats_absorb_gradient_noise():
    target = GaussianMixture([1.0], [[0.0, 0.0, 0.0]], [0.6])
    eta, c, force_std, steps = 0.02, 0.05, 3.0, 100_000
    kinetic = {}
    for name, overrides in {
        "thermostat": {"tempering": False},
        "tact": {},
        "no_thermostat": {"tempering": False, "thermostat": False},
    }.items():
        sampler = make_tact(step_size=eta, noise=c, **overrides)
        output = simulate(sampler, target.potential, [0.0] * 3, num_steps=steps, seed=5, force_std=force_std,
                          potential_std=2.0, record=("kinetic_temperature",))
        kinetic[name] = output["kinetic_temperature"][10_000:]
    threshold = testing.t_threshold(10, 3, 1e-3)
    for name in ("thermostat", "tact"):
        t_stat = batch_t_statistics(kinetic[name], 1.0)
        assert abs(t_stat) < threshold, (name, kinetic[name].mean(), t_stat)
    # Without thermostat the noise heats the system to its stationary value
    # T_kin = (2 c T + eta sigma^2) / (1 - exp(-2 c)) (exact friction), far from T = 1.
    predicted = (2 * c + eta * force_std**2) / (1 - math.exp(-2 * c))
    t_hot = batch_t_statistics(kinetic["no_thermostat"], predicted)
    assert abs(t_hot) < threshold and predicted > 2.5, (kinetic["no_thermostat"].mean(), predicted)


def test_euler_friction_diverges_where_exact_friction_recovers_the_modes():
    # Potential noise of std 18 drives the xi thermostat to z_xi ~ 2 > 2 / max(lambda'^2) ~ 1.26.
    target = GaussianMixture([0.25, 0.4, 0.35], [[-5.0], [0.0], [5.0]], [0.6, 0.6, 0.6])
    common = dict(num_steps=150_000, seed=0, force_std=3.0, potential_std=18.0, record=("xi", "z_xi"))
    euler = simulate(make_tact(friction_integrator="euler"), target.potential, [-5.0], **common)
    exact_sampler = make_tact()
    exact = simulate(exact_sampler, target.potential, [-5.0], **common)
    assert not np.all(np.isfinite(euler["xi"])), "the Euler friction should have diverged"
    assert np.all(np.isfinite(exact["xi"])) and np.all(np.isfinite(exact["theta"]))
    grid = tf.constant(np.linspace(-5 / 3, 5 / 3, 2001))
    max_slope_sq = float(tf.reduce_max(tf.square(exact_sampler.coupling(grid)[1])))
    assert np.max(exact["z_xi"]) > 2.0 / max_slope_sq
    keep = exact["is_sample"].copy()
    keep[:20_000] = False
    masses = np.bincount(target.nearest_mode(exact["theta"][keep]), minlength=3) / keep.sum()
    # Recovered: every mode is visited and holds at least half its weight (Euler: none).
    assert np.all(masses > 0.5 * target.weights), masses


# --- through BayesianModel.fit -------------------------------------------------------------------


class MixtureLoss(keras.layers.Layer):
    """One weight theta; per-example loss `V(theta) / N + x_i theta` with sum_i x_i = 0.

    So `U = N * batch mean = V(theta) + N mean_batch(x) theta`: exact on the full data, with
    minibatch noise in both the force and the potential.
    """

    def __init__(self, mixture: GaussianMixture, num_examples: int, start: float, **kwargs):
        super().__init__(**kwargs)
        self.mixture, self.num_examples, self.start = mixture, num_examples, start

    def build(self, input_shape):
        self.theta = self.add_weight(shape=(1,), initializer=keras.initializers.Constant(self.start), name="theta")

    def call(self, x):
        return self.mixture.potential(self.theta) / self.num_examples + x * self.theta[0]


def per_example_loss(y_true, y_pred):
    del y_true
    return y_pred[:, 0]


def mixture_fit(sampler, mixture, start, *, steps, seed, callbacks=(), num_examples=1000, batch_size=50):
    """Runs `steps` sampler steps through `BayesianModel.fit`; returns the model."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 1))
    x = (0.02 * (x - x.mean())).astype(np.float32)  # force noise std ~ 3 with batches of 50
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros_like(x)))
    data = data.repeat().shuffle(num_examples, seed=seed).batch(batch_size, drop_remainder=True)
    net = keras.Sequential([keras.Input((1,)), MixtureLoss(mixture, num_examples, start)])
    model = kt.BayesianModel(net, sampler, num_examples=num_examples, seed=seed)
    model.compile(loss=per_example_loss, steps_per_execution=1000)
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=list(callbacks))
    return model


BIMODAL = GaussianMixture([0.3, 0.7], [[-2.683], [2.683]], [0.6, 0.6])  # barrier 10 nats at T = 1
# A slower theta thermostat: with one weight, gamma = 1 lets z_theta swing negative and heat the
# system in bursts, which carries even the untempered chain over a 10-nat barrier.
BIMODAL_OPTIONS = {"thermal_inertia": 10.0}


def right_mode_check(samples: np.ndarray) -> tuple[float, float, int]:
    """Fraction of samples in the right mode, its ESS-based standard error, and mode switches."""
    indicator = (samples[:, 0] > 0).astype(np.float64)
    ess = diagnostics.effective_sample_size(indicator)
    fraction = float(indicator.mean())
    return fraction, math.sqrt(fraction * (1 - fraction) / ess), int(np.sum(np.diff(indicator) != 0))


# ~17 s: the slow set (with `test_bimodal_fit_independent_chains`, 8 chains of this run, the
# stronger check) keeps the default suite within its 10-minute budget.
@pytest.mark.slow
def test_bimodal_fit_tact_finds_the_right_masses_no_tempering_stays():
    start = float(BIMODAL.means[0, 0])
    collector = kt.callbacks.SampleCollector(burn_in_steps=3000, every_n_steps=1, max_samples=50_000)
    mixture_fit(make_tact(**BIMODAL_OPTIONS), BIMODAL, start, steps=45_000, seed=1, callbacks=[collector])
    fraction, error, switches = right_mode_check(collector.samples)
    assert switches >= 8, switches
    assert abs(fraction - 0.7) < 4 * error, (fraction, error)
    stuck = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=1, max_samples=20_000)
    mixture_fit(make_tact(tempering=False, **BIMODAL_OPTIONS), BIMODAL, start, steps=10_000, seed=1, callbacks=[stuck])
    assert len(stuck.samples) == 10_000 and np.all(stuck.samples[:, 0] < 0)


@pytest.mark.slow
def test_bimodal_fit_independent_chains():
    start = float(BIMODAL.means[0, 0])
    fractions = []
    for chain in range(8):
        collector = kt.callbacks.SampleCollector(burn_in_steps=5000, every_n_steps=1, max_samples=100_000)
        mixture_fit(make_tact(**BIMODAL_OPTIONS), BIMODAL, start, steps=60_000, seed=100 + chain, callbacks=[collector])
        fractions.append((collector.samples[:, 0] > 0).mean())
        stuck = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=10, max_samples=10_000)
        mixture_fit(make_tact(tempering=False, **BIMODAL_OPTIONS), BIMODAL, start, steps=60_000, seed=100 + chain, callbacks=[stuck])
        assert np.all(stuck.samples[:, 0] < 0)
    t_stat = testing.chain_t_statistic(np.array(fractions)[:, None], np.array([0.7]))
    assert abs(t_stat[0]) < testing.t_threshold(8, 1, 1e-3), (fractions, t_stat)


def test_fit_samples_only_on_plateau_steps_and_state_lives_in_variables(tmp_path):
    sampler = make_tact(sample_every=4)
    collector = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=1, max_samples=5000)
    histograms = TACTHistograms(str(tmp_path / "logs"), update_freq="epoch")
    model = mixture_fit(sampler, BIMODAL, -2.683, steps=4000, seed=2, callbacks=[collector, histograms])
    assert len(collector.steps) > 20 and np.all(collector.steps % 4 == 0)
    # One variable per state leaf, named after the field: the checkpoint carries the TACT state.
    names = [v.name for v in model._state_variables]
    for field in ("step", "momentum_0", "xi", "xi_momentum", "z_theta", "z_xi", "abf_mean_force", "abf_visits"):
        assert f"tact_hmc_{field}" in names, names
    state = model.sampler_state()
    assert int(state.step) == 4000 and int(tf.reduce_sum(state.abf_visits)) == 4000
    assert 0.0 < collector.samples.shape[0] * 4 / 4000 < 0.6  # about 20% of due steps are on the plateau

    # The histogram callback wrote the ABF mean force and the xi visits, read back from the events.
    written = {}
    for path in glob.glob(str(tmp_path / "logs" / "**" / "events.out.tfevents.*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                written[value.tag] = (event.step, tf.make_ndarray(value.tensor), value.metadata.plugin_data.plugin_name)
    step, table, plugin = written["tact_hmc/abf_mean_force"]
    assert step == 4000 and plugin == "histograms" and table.shape == (50, 3)
    np.testing.assert_allclose(table[:, 0], sampler.bin_edges()[:-1], rtol=1e-6)
    np.testing.assert_allclose(table[:, 2], state.abf_mean_force.numpy(), rtol=1e-6)
    _, visits, _ = written["tact_hmc/xi"]
    np.testing.assert_array_equal(visits[:, 2], state.abf_visits.numpy())


def test_model_save_and_load_keeps_the_tact_state(tmp_path):
    x, y = testing.linear_regression_data(64, 2, seed=0)
    model = kt.BayesianModel(testing.linear_regression_net(2), make_tact(step_size=1e-4, xi_step_size=1e-4),
                             num_examples=64, prior=kt.priors.Gaussian(1.0), seed=4)
    model.compile(loss="mse")
    model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    path = str(tmp_path / "tact.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.sampler, TACTHMC) and loaded.sampler.get_config() == model.sampler.get_config()
    for before, after in zip(tf.nest.flatten(model.sampler_state()), tf.nest.flatten(loaded.sampler_state())):
        np.testing.assert_array_equal(before.numpy(), after.numpy())


@pytest.mark.slow
def test_linear_regression_posterior_with_tempering():
    x, y = testing.linear_regression_data(200, 2, seed=3)
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=1.0)
    result = testing.run_chains(
        lambda: TACTHMC(step_size=2e-4, xi_step_size=2e-4, noise=0.02, xi_noise=0.1, sample_every=1),
        x, y, num_chains=8, num_steps=20_000, batch_size=200, burn_in_steps=4000, every_n_steps=1,
        steps_per_execution=1000,
    )
    check = testing.compare_with_gaussian(result.samples, mean, covariance)
    assert check.passed, check.summary()


def test_histogram_callback_refuses_other_samplers(tmp_path):
    model = kt.BayesianModel(testing.linear_regression_net(2), kt.samplers.SGHMC(1e-3), num_examples=8, seed=0)
    model.compile(loss="mse")
    x, y = testing.linear_regression_data(8, 2)
    with pytest.raises(TypeError, match="TACTHMC"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[TACTHistograms(str(tmp_path))])
    with pytest.raises(ValueError, match="update_freq"):
        TACTHistograms(str(tmp_path), update_freq=0)


@pytest.mark.parametrize("on_plateau", [False, True])
def test_the_default_check_says_when_xi_never_comes_back_to_the_plateau(on_plateau):
    """A run whose tempering variable stays off its plateau has no step at T and takes no sample:
    the default check warns once at the end of fit, in plain words; a run that starts on the
    plateau and stays there (xi barely moves) does not get that warning."""
    x, y = testing.linear_regression_data(64, 2, seed=0)
    sampler = make_tact(step_size=1e-3, xi_step_size=1e-12, xi_noise=0.0, sample_every=1)
    model = kt.BayesianModel(testing.linear_regression_net(2), sampler, num_examples=64,
                             prior=kt.priors.Gaussian(1.0), seed=0)
    model.compile(loss=kt.losses.GaussianNLL(scale=1.0), steps_per_execution=100)
    model.build((None, 2))
    xi = next(v for v in model._state_variables if v.name == "tact_hmc_xi")
    xi.assign(0.0 if on_plateau else 0.9 * sampler.wall)  # 0.9 wall: 1/lambda = 1.8 there
    collector = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=16, epochs=12, steps_per_epoch=100, verbose=0, callbacks=[collector])
    messages = [str(w.message) for w in caught if "had a step at T" in str(w.message)]
    report = model.temperature_report()
    if on_plateau:
        assert not messages and report["num_blocks"] > 0 and len(collector.steps) > 0
        return
    assert len(messages) == 1, [str(w.message) for w in caught]
    assert "none of the 12 blocks after step 0 had a step at T" in messages[0] and "took none" in messages[0]
    assert report["num_blocks"] == 0 and len(collector.steps) == 0
    assert np.isnan(history.history["equilibrated"][-1])
