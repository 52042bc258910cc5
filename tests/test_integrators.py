"""Exact values and properties of the shared integrator pieces (A, B, O, D, Euler momentum)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_thermo.samplers import integrators
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.sgnht import SGNHTState


def _t(values):
    return [tf.constant(np.asarray(v, np.float32)) for v in values]


def test_kick_and_drift_exact_values():
    p = _t([[1.0, -2.0], [0.5]])
    f = _t([[3.0, 1.0], [-1.0]])
    kicked = integrators.kick(p, f, 0.1)
    np.testing.assert_allclose(kicked[0], [1.3, -1.9], rtol=1e-6)
    np.testing.assert_allclose(kicked[1], [0.4], rtol=1e-6)
    theta = _t([[0.0, 1.0], [2.0]])
    moved = integrators.drift(theta, p, 0.1, mass=2.0)
    np.testing.assert_allclose(moved[0], [0.05, 0.9], rtol=1e-6)
    np.testing.assert_allclose(moved[1], [2.025], rtol=1e-6)


def test_ornstein_uhlenbeck_exact_value():
    p, r = _t([[2.0]]), _t([[0.5]])
    xi, tau, a, temp, mass = 0.8, 0.05, 1.5, 2.0, 3.0
    out = integrators.ornstein_uhlenbeck(p, r, xi, tau, noise_friction=a, temperature=temp, mass=mass)
    expected = math.exp(-xi * tau) * 2.0 + math.sqrt(a * temp * (1 - math.exp(-2 * xi * tau)) / xi * mass) * 0.5
    np.testing.assert_allclose(out[0], [expected], rtol=1e-6)


@pytest.mark.parametrize("xi", [0.0, 1e-9, -1e-9, 1e-3, -0.5])
def test_ou_noise_std_is_continuous_through_zero_friction(xi):
    tau, a, temp = 0.01, 2.0, 1.0
    got = float(integrators.ou_noise_std(xi, tau, a, temp))
    exact = math.sqrt(2 * a * temp * tau) if xi == 0 else math.sqrt(a * temp * -math.expm1(-2 * xi * tau) / xi)
    assert got == pytest.approx(exact, rel=1e-5)


def test_ou_preserves_the_maxwell_distribution():
    """O's exact flow keeps p ~ N(0, T M) invariant: the variance after one step is T M."""
    xi, tau, a, temp, mass = 2.0, 0.3, 2.0, 1.7, 0.5
    # With friction xi == A the stationary variance of dp = -xi p dt + sqrt(2 A T) M^1/2 dW is T M.
    var_in = temp * mass
    decay = math.exp(-xi * tau)
    std = float(integrators.ou_noise_std(xi, tau, a, temp)) * math.sqrt(mass)
    assert decay**2 * var_in + std**2 == pytest.approx(var_in, rel=1e-6)


def test_friction_decays_momentum_without_noise():
    p = _t([[1.0, -3.0]])
    zero = _t([[0.0, 0.0]])
    out = integrators.ornstein_uhlenbeck(p, zero, 2.0, 0.1, noise_friction=1.0, temperature=1.0, mass=1.0)
    np.testing.assert_allclose(out[0], np.exp(-0.2) * np.array([1.0, -3.0]), rtol=1e-6)
    euler = integrators.euler_momentum(p, zero, zero, 2.0, 0.1, noise_friction=1.0, temperature=0.0, mass=1.0)
    np.testing.assert_allclose(euler[0], 0.8 * np.array([1.0, -3.0]), rtol=1e-6)


def test_thermostat_rises_when_too_hot_and_falls_when_too_cold():
    hot, cold = _t([[3.0, 3.0]]), _t([[0.1, 0.1]])
    kwargs = dict(thermal_mass=2.0, num_params=2, temperature=1.0, mass=1.0)
    assert float(integrators.thermostat(0.5, hot, 0.1, **kwargs)) > 0.5
    assert float(integrators.thermostat(0.5, cold, 0.1, **kwargs)) < 0.5
    # Exact value: xi + (tau / mu) (p.p / M - Nd T) = 0.5 + 0.05 * (18 - 2).
    assert float(integrators.thermostat(0.5, hot, 0.1, **kwargs)) == pytest.approx(1.3)


def test_kinetic_temperature_exact_value():
    p = _t([[1.0, 2.0], [2.0]])
    assert float(integrators.kinetic_temperature(p, 2.0, 3)) == pytest.approx(9.0 / 2.0 / 3.0)


# (friction A, step size h) of the paper-task configs: configs/{emnist,cifar10,fashion_mnist}_all.yaml.
PAPER_THERMOSTATS = [(433.6, 1.1532e-4), (707.1, 1.4142e-4), (1060.7, 1.4142e-4)]


@pytest.mark.parametrize("friction, h", PAPER_THERMOSTATS)
@pytest.mark.parametrize("tau_fraction", [1.0, 0.5])  # Euler step, symmetric half step
def test_thermostat_responds_to_a_one_percent_temperature_error_at_the_paper_configs(friction, h, tau_fraction):
    """xi starts at A ~ 1e3; a 1% hot momentum must move it by tau (K - T) = 1e-2 tau.

    In float32 the increment (6e-7 to 1.6e-6) is below half an ulp of xi (1.5e-5 to 3e-5), so a
    float32 thermostat stays at A and this fails."""
    num_params, temperature = 1000, 1.0
    momentum = [tf.fill([num_params], tf.constant(math.sqrt(1.01), tf.float32))]
    tau = tau_fraction * h
    kwargs = dict(thermal_mass=float(num_params), num_params=num_params, temperature=temperature, mass=1.0)
    xi = tf.constant(friction, integrators.THERMOSTAT_DTYPE)
    hot = integrators.thermostat(xi, momentum, tf.constant(tau, tf.float32), **kwargs)
    cold = integrators.thermostat(xi, [p * math.sqrt(0.99 / 1.01) for p in momentum], tau, **kwargs)
    # The float32 kinetic energy carries a relative error ~1e-7, i.e. 1e-5 of the 1% excess.
    assert float(hot) - friction == pytest.approx(0.01 * np.float32(tau), rel=1e-4)
    assert float(cold) - friction == pytest.approx(-0.01 * np.float32(tau), rel=1e-4)


@pytest.mark.parametrize("scale", [0.0, 1.0, math.sqrt(3.0)])
def test_symmetric_step_logs_the_mean_of_the_kinetic_temperatures_its_d_steps_see(scale):
    """With a C step that scales p by s, the D steps see K and s^2 K: the logged value (the one
    whose average the thermostat holds at T) is (1 + s^2) K / 2, not the K before C."""
    params = [tf.constant([0.5, -1.0, 2.0])]
    force = [tf.constant([1.0, 0.0, -2.0])]
    state = SGNHTState(step=tf.constant(3, tf.int64), momentum=[tf.constant([0.3, 1.2, -0.7])],
                       xi=tf.constant(1.0, tf.float64))
    context = StepContext(temperature=1.0, num_examples=10, batch_size=tf.constant(5.0),
                          potential=tf.constant(0.0), seed=11)
    kwargs = dict(ou_kwargs=dict(noise_friction=1.0, temperature=1.0, mass=2.0),
                  thermostat_kwargs=dict(thermal_mass=3.0, num_params=3, temperature=1.0, mass=2.0))

    def run(c_scale):
        return integrators.symmetric_step(state, params, force, 0.1, context,
                                          covariance_step=lambda p: ([c_scale * q for q in p], None), **kwargs)

    before_c = float(run(1.0)[3])
    assert float(run(scale)[3]) == pytest.approx(0.5 * (1.0 + scale**2) * before_c, rel=1e-6)
