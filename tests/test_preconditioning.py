"""Diagonal masses from the force: the estimates, one-step hand computations of every sampler
under a diagonal mass (CCAdL and mCCAdL's Sigma with M^-1/2 on both sides), frozen state in fit.

References are float64 numpy (and `scipy.linalg.expm`), written from the update rules of
`keras_thermo.samplers.preconditioning`'s module doc, independently of the samplers' code. The
mCCAdL reference uses the friction `(h/2) beta B M^-1` (B the force covariance) that the
fluctuation-dissipation relation gives, not the code's `M^1/2 Sigma M^-1/2` form.
"""

import math
import os

import keras
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo import random as kt_random
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.preconditioning import Preconditioner, PreconditionerState

from helpers import tanh_net

SEED = 11
NUM_EXAMPLES = 100
BATCH = 4
STEP = 5  # past the warm-up of the states below: the masses are frozen
PER_EXAMPLE = np.array(
    [[0.3, -1.2, 0.10], [-0.5, 2.0, 0.05], [0.9, 0.4, -0.20], [0.1, -2.5, 0.00]], np.float32
)
RELATIVE_MASS = (2.5, 0.4)  # kernel, bias


def _params():
    return [tf.constant([[0.5, -1.0]], tf.float32), tf.constant([2.0], tf.float32)]


def _force():
    return [tf.constant([[1.0, 2.0]], tf.float32), tf.constant([-4.0], tf.float32)]


def _context(temperature):
    return StepContext(
        temperature=temperature, num_examples=NUM_EXAMPLES, batch_size=tf.constant(float(BATCH)),
        potential=tf.constant(0.0), seed=SEED, per_example_gradients=tf.constant(PER_EXAMPLE),
    )


def _flat(tensors):
    return np.concatenate([np.asarray(t, np.float64).reshape(-1) for t in tensors])


def _noise(stream):
    key = kt_random.step_key(SEED, tf.constant(STEP, tf.int64), stream)
    return _flat(kt_random.normal_like(key, _params()))


def _frozen_state(sampler, temperature):
    """The initial state moved to step STEP, its layerwise masses set to RELATIVE_MASS."""
    state = sampler.init(_params(), temperature=temperature, seed=SEED)
    masses = [tf.constant(m, tf.float32) for m in RELATIVE_MASS]
    preconditioner = state.preconditioner._replace(mass=masses)
    return state._replace(step=tf.constant(STEP, tf.int64), preconditioner=preconditioner)


def _mass_vector(base=1.0):
    return base * np.array([RELATIVE_MASS[0]] * 2 + [RELATIVE_MASS[1]], np.float64)


def _layerwise():
    return Preconditioner("layerwise", warmup_steps=2)


# --- the estimates ----------------------------------------------------------------------------


def test_layerwise_masses_are_the_normalised_warmup_rms_then_frozen():
    damping = 0.1
    preconditioner = Preconditioner("layerwise", warmup_steps=3, damping=damping)
    params = _params()
    state = preconditioner.init(params)
    forces = [[tf.constant([[3.0, -1.0]]) * (k + 1), tf.constant([0.5 * (k - 1)])] for k in range(6)]
    history = []
    for step, force in enumerate(forces):
        state = preconditioner.update(state, force, tf.constant(step, tf.int64))
        history.append([float(m) for m in state.mass])
    assert history[0] == history[1] == history[2] == [1.0, 1.0]  # warm-up: unit masses
    # Step 3 freezes sqrt(mean over the warm-up of each variable's mean squared force).
    warmup = forces[:3]
    rms = np.array([math.sqrt(np.mean([np.mean(np.square(f[v].numpy())) for f in warmup])) for v in range(2)])
    sizes = np.array([2.0, 1.0])
    damped = rms + damping * (rms @ sizes) / 3
    expected = damped / ((damped @ sizes) / 3)
    np.testing.assert_allclose(history[3], expected, rtol=1e-6)
    assert history[3] == history[4] == history[5]  # frozen, bit for bit
    assert float(np.asarray(history[3]) @ sizes) == pytest.approx(3.0, rel=1e-6)  # mean mass 1


@pytest.mark.parametrize("damping", [0.0, 0.1])
def test_rmsprop_masses_follow_the_moving_average_of_squared_force(damping):
    preconditioner = Preconditioner("rmsprop", decay=0.9, damping=damping)
    state = preconditioner.init(_params())
    moving = np.zeros(3)
    for step in range(3):
        force = [f * (step + 1.0) for f in _force()]
        state = preconditioner.update(state, force, tf.constant(step, tf.int64))
        moving = 0.9 * moving + 0.1 * _flat(force) ** 2
    # pSGLD's G = diag(1 / (lambda + sqrt(V))) as a mass lambda + sqrt(V), lambda = damping
    # times the mean rms, normalised to mean 1 over the scalars.
    damped = np.sqrt(moving) + damping * np.sqrt(moving).mean()
    np.testing.assert_allclose(_flat(state.mass), damped / damped.mean(), rtol=1e-6)


# --- one step of every sampler under a diagonal mass -------------------------------------------


def test_sgld_one_step():
    eps, temp = 0.01, 2.0
    sampler = kt.samplers.SGLD(eps, preconditioner=_layerwise())
    state = _frozen_state(sampler, temp)
    new_params, _, logs = sampler.update(state, _params(), _force(), _context(temp))
    m = _mass_vector()
    theta1 = _flat(_params()) + eps / 2 * _flat(_force()) / m + np.sqrt(eps * temp / m) * _noise(kt_random.STREAM_MOMENTUM)
    np.testing.assert_allclose(_flat(new_params), theta1, rtol=1e-6)
    step = theta1 - _flat(_params())
    assert float(logs["kinetic_temperature"]) == pytest.approx(step @ (m * step) / eps / 3, rel=1e-5)


def test_sghmc_one_step():
    h, a, mass, temp = 0.05, 2.0, 1.5, 0.7
    sampler = kt.samplers.SGHMC(h, friction=a, mass=mass, preconditioner=_layerwise())
    state = _frozen_state(sampler, temp)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))
    m = _mass_vector(mass)
    p0 = _flat(state.momentum)
    p1 = p0 + h * _flat(_force()) - h * a * p0 + np.sqrt(2 * a * temp * h * m) * _noise(kt_random.STREAM_MOMENTUM)
    np.testing.assert_allclose(_flat(new_state.momentum), p1, rtol=1e-5)
    np.testing.assert_allclose(_flat(new_params), _flat(_params()) + h * p1 / m, rtol=1e-5)
    assert float(logs["kinetic_temperature"]) == pytest.approx(p1 @ (p1 / m) / 3, rel=1e-5)


def test_sgnht_one_step():
    h, a, mass, temp, mu = 0.05, 1.5, 2.0, 1.0, 4.0
    sampler = kt.samplers.SGNHT(h, friction=a, thermal_mass=mu, mass=mass, preconditioner=_layerwise(),
                                per_variable_thermostat=False)
    state = _frozen_state(sampler, temp)
    new_params, new_state, _ = sampler.update(state, _params(), _force(), _context(temp))
    m = _mass_vector(mass)
    p0 = _flat(state.momentum)
    p1 = p0 - a * p0 * h + h * _flat(_force()) + np.sqrt(2 * a * temp * h * m) * _noise(kt_random.STREAM_MOMENTUM)
    np.testing.assert_allclose(_flat(new_params), _flat(_params()) + h * p1 / m, rtol=1e-5)
    assert float(new_state.xi) == pytest.approx(a + h / mu * (p1 @ (p1 / m) - 3 * temp), rel=1e-5)


def _force_covariance():
    """B = (N^2 / n) V: the covariance of the minibatch force, V with the (n - 1) denominator."""
    return NUM_EXAMPLES**2 / BATCH * np.cov(PER_EXAMPLE.astype(np.float64), rowvar=False, ddof=1)


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_ccadl_one_step(covariance):
    h, a, temp, mass, mu = 0.01, 1.5, 2.0, 2.0, 5.0
    sampler = kt.samplers.CCAdL(h, friction=a, covariance=covariance, thermal_mass=mu, mass=mass, preconditioner=_layerwise(),
                                per_variable_thermostat=False)
    state = _frozen_state(sampler, temp)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))
    # The running mean I_t with k_t = 1 / (STEP + 1) from a zero average: V / 6.
    b = _force_covariance() / (STEP + 1)
    if covariance == "diag":
        b = np.diag(np.diag(b))
    m = _mass_vector(mass)
    p0 = _flat(state.momentum)
    friction = (h / 2) / temp * b @ (p0 / m)  # = M^1/2 (h/2) beta Sigma M^-1/2 p, Sigma = M^-1/2 B M^-1/2
    p1 = p0 + h * _flat(_force()) - friction * h - a * p0 * h + np.sqrt(2 * a * temp * h * m) * _noise(kt_random.STREAM_MOMENTUM)
    np.testing.assert_allclose(_flat(new_state.momentum), p1, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(_flat(new_params), _flat(_params()) + h * p1 / m, rtol=2e-5, atol=1e-6)
    # The thermostat reads p.M^-1.p net of the explicit friction's excess, p.M^-1.C.p / 2 with
    # C p = (h^2/2) beta B M^-1 p (ccadl.py, module doc); it logs that reading.
    reading = p1 @ (p1 / m) - (h * h / 4) / temp * (p1 / m) @ b @ (p1 / m)
    assert float(new_state.xi) == pytest.approx(a + h / mu * (reading - 3 * temp), rel=2e-5)
    assert float(logs["kinetic_temperature"]) == pytest.approx(reading / 3, rel=2e-5)
    # The correction is ten times the tolerance above, so the logged value tells the two readings
    # apart (it is 0.03-0.04% of the reading here, depending on the step's noise draw).
    assert abs(reading - p1 @ (p1 / m)) > 10 * 2e-5 * abs(reading)
    sigma = np.diag(m**-0.5) @ b @ np.diag(m**-0.5)
    assert float(logs["noise_scale"]) == pytest.approx(np.trace(sigma) / 3, rel=1e-5)
    # The covariance friction matters in this step: without it the momentum would fail the check above.
    assert not np.allclose(_flat(new_state.momentum), p1 + friction * h, rtol=2e-5, atol=1e-6)


def _o_step(p, xi, h, a, temp, m, noise):
    std = np.sqrt(a * temp * (1 - math.exp(-xi * h)) / xi * m)
    return math.exp(-xi * h / 2) * p + std * noise


@pytest.mark.parametrize("expm", ["taylor", "gram"])
def test_mccadl_one_step(expm):
    h, a, temp, mass, mu = 0.02, 1.5, 2.0, 2.0, 5.0
    sampler = kt.samplers.MCCAdL(h, friction=a, thermal_mass=mu, mass=mass, covariance="minibatch", expm=expm,
                                 preconditioner=_layerwise(), per_variable_thermostat=False)
    state = _frozen_state(sampler, temp)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))
    m = _mass_vector(mass)
    b = _force_covariance()
    c_matrix = scipy.linalg.expm(-h * (h / 2) / temp * b @ np.diag(1 / m))  # exact flow of dp = -(h/2) beta B M^-1 p

    def d_step(xi, p):
        return xi + (h / 2) / mu * (p @ (p / m) - 3 * temp)

    p, theta = _flat(state.momentum), _flat(_params())
    p = p + h * _flat(_force())  # a later step: the two half kicks merged
    theta = theta + (h / 2) * p / m
    p = _o_step(p, a, h, a, temp, m, _noise(kt_random.STREAM_MOMENTUM))
    xi = d_step(a, p)
    p = c_matrix @ p
    xi = d_step(xi, p)
    p = _o_step(p, xi, h, a, temp, m, _noise(kt_random.STREAM_MOMENTUM_2))
    theta = theta + (h / 2) * p / m
    np.testing.assert_allclose(_flat(new_state.momentum), p, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(_flat(new_params), theta, rtol=2e-5, atol=1e-6)
    assert float(new_state.xi) == pytest.approx(xi, rel=2e-5)
    assert float(logs["noise_scale"]) == pytest.approx(np.sum(np.diag(b) / m) / 3, rel=1e-5)
    # The C step is far from the identity (0.18), and from the C step of the scalar mass M (0.21).
    assert np.linalg.norm(c_matrix - np.eye(3)) > 0.1
    assert np.linalg.norm(c_matrix - scipy.linalg.expm(-h * (h / 2) / temp * b / mass)) > 0.1


def test_tact_hmc_one_step_without_tempering_or_thermostats():
    eta, c, temp = 1e-3, 0.1, 1.5
    sampler = kt.samplers.TACTHMC(eta, noise=c, tempering=False, thermostat=False, preconditioner=_layerwise())
    state = _frozen_state(sampler, temp)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))
    m = _mass_vector()
    r0 = _flat(state.momentum)
    r1 = math.exp(-c) * r0 + eta / m * _flat(_force()) + np.sqrt(2 * c * eta / m * temp) * _noise(kt_random.STREAM_MOMENTUM)
    np.testing.assert_allclose(_flat(new_state.momentum), r1, rtol=2e-5)
    np.testing.assert_allclose(_flat(new_params), _flat(_params()) + r1, rtol=1e-6)
    assert float(logs["kinetic_temperature"]) == pytest.approx(r1 @ (m * r1) / (3 * eta), rel=1e-5)


def test_a_mass_change_rescales_the_momentum_to_keep_its_kinetic_energy():
    sampler = kt.samplers.SGHMC(0.01, preconditioner=Preconditioner("layerwise", warmup_steps=1))
    state = sampler.init(_params(), temperature=1.0, seed=SEED)
    state = state._replace(step=tf.constant(1, tf.int64), preconditioner=PreconditionerState(
        mass=[tf.constant(1.0), tf.constant(1.0)], moment=[tf.constant(4.0, tf.float64), tf.constant(1.0, tf.float64)],
    ))
    mass, new, factors = sampler.precondition(state, _force())
    rescaled = [p * f for p, f in zip(state.momentum, factors)]
    for old, p, m in zip(state.momentum, rescaled, new.mass):
        np.testing.assert_allclose(np.square(p.numpy()) / float(m), np.square(old.numpy()), rtol=1e-6)
    assert [float(m) for m in mass] != [1.0, 1.0]


# --- through fit: frozen, checkpointed -------------------------------------------------------


def _model(seed=3):
    net = tanh_net(2)
    sampler = kt.samplers.SGNHT(1e-2, preconditioner=Preconditioner("layerwise", warmup_steps=5))
    model = kt.BayesianModel(net, sampler, num_examples=64, prior=kt.priors.Gaussian(1.0), seed=seed)
    model.compile(loss="mse")
    return model


_data = testing.small_regression_dataset


# Slow (3 fits and a save): the default suite covers the frozen masses' resume in
# tests/test_priors.py, whose resumed model runs a layerwise-preconditioned SGHMC.
@pytest.mark.slow
def test_layerwise_mass_is_frozen_after_warmup_and_resumes_bit_for_bit(tmp_path):
    straight = _model()
    straight.fit(_data(), steps_per_epoch=14, epochs=1, verbose=0)
    first = _model()
    first.fit(_data(), steps_per_epoch=8, epochs=1, verbose=0)
    masses_at_8 = [float(m) for m in first.sampler_state().preconditioner.mass]
    assert len(set(masses_at_8)) == 4  # one per variable, estimated
    path = os.path.join(tmp_path, "preconditioned.keras")
    first.save(path)
    restored = keras.saving.load_model(path)
    assert restored.sampler.preconditioner.get_config() == first.sampler.preconditioner.get_config()
    restored.fit(_data().skip(8), steps_per_epoch=6, epochs=1, verbose=0)
    assert [float(m) for m in restored.sampler_state().preconditioner.mass] == masses_at_8  # frozen
    for u, v in zip(straight.trainable_variables + straight.non_trainable_variables,
                    restored.trainable_variables + restored.non_trainable_variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


@pytest.mark.parametrize("name", ["sgld", "sghmc", "sgnht", "ccadl", "mccadl", "tact_hmc"])
def test_config_round_trip(name):
    preconditioner = Preconditioner("rmsprop", decay=0.95, damping=0.05)
    sampler = kt.samplers.get(name, step_size=1e-3, preconditioner=preconditioner)
    restored = kt.samplers.get(keras.saving.serialize_keras_object(sampler))
    assert restored.get_config() == sampler.get_config()
    assert restored.preconditioner.get_config() == preconditioner.get_config()
    assert kt.samplers.get(name, step_size=1e-3, preconditioner="layerwise").preconditioner.kind == "layerwise"
    assert kt.samplers.get(name, step_size=1e-3).get_config()["preconditioner"] is None


def test_scaled_columns_operator_matches_the_scaled_matrix():
    from keras_thermo.linalg.operators import MatrixRows
    from keras_thermo.samplers.mccadl import ScaledColumns, scale_columns

    rows = np.random.default_rng(0).normal(size=(5, 4))
    scale = np.array([0.5, 2.0, 1.0, 3.0])
    dense = rows * scale[None, :]
    operator = scale_columns(MatrixRows(tf.constant(rows)), tf.constant(scale))
    assert isinstance(operator, ScaledColumns)
    u, z = np.ones((4, 2)), np.arange(10.0).reshape(5, 2)
    np.testing.assert_allclose(operator.matvec(tf.constant(u)), dense @ u, rtol=1e-12)
    np.testing.assert_allclose(operator.rmatvec(tf.constant(z)), dense.T @ z, rtol=1e-12)
    np.testing.assert_allclose(operator.gram(), dense @ dense.T, rtol=1e-12)
    assert float(operator.frobenius_squared()) == pytest.approx(np.sum(dense**2), rel=1e-12)
    # It travels through tf.function as a nested structure.
    doubled = tf.function(lambda op: op.matvec(tf.constant(u)) * 2.0)(operator)
    np.testing.assert_allclose(doubled, 2 * dense @ u, rtol=1e-12)
    np.testing.assert_allclose(scale_columns(tf.constant(rows), tf.constant(scale)), dense, rtol=1e-12)
