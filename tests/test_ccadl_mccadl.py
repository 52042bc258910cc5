"""CCAdL and mCCAdL: one-step exact values, the C step, posterior sampling, stability, configs.

One-step references are computed here in float64 numpy (and `scipy.linalg.expm` for the C step)
from the per-example gradients passed in the step context, independently of `keras_thermo.per_example`
and `keras_thermo.linalg`. The sampling tests go through `BayesianModel.fit` with the shared
statistical check of `keras_thermo.testing`.
"""

import math
import re

import keras
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import equilibration
from keras_thermo.temperature_advice import sampler_traits
from keras_thermo import linalg as kt_linalg
from keras_thermo import random as kt_random
from keras_thermo import testing
from keras_thermo.model import SamplerDivergedError
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.ccadl import CCAdL
from keras_thermo.samplers.mccadl import MCCAdL, covariance_step
from keras_thermo.samplers.sgnht import SGNHT

SEED = 11
NUM_EXAMPLES = 100
BATCH = 4

# Per-example gradients of a 4-example minibatch for a model with Nd = 3 ([1, 2] kernel, [1]
# bias); the columns have different spreads, so Sigma is neither isotropic nor diagonal.
PER_EXAMPLE = np.array(
    [[0.3, -1.2, 0.10], [-0.5, 2.0, 0.05], [0.9, 0.4, -0.20], [0.1, -2.5, 0.00]], np.float32
)


def _params():
    return [tf.constant([[0.5, -1.0]], tf.float32), tf.constant([2.0], tf.float32)]


def _force():
    return [tf.constant([[1.0, 2.0]], tf.float32), tf.constant([-4.0], tf.float32)]


def _context(temperature, per_example=PER_EXAMPLE):
    return StepContext(
        temperature=temperature, num_examples=NUM_EXAMPLES, batch_size=tf.constant(float(BATCH)),
        potential=tf.constant(0.0), seed=SEED,
        per_example_gradients=None if per_example is None else tf.constant(per_example),
    )


def _flat(tensors):
    return np.concatenate([np.asarray(t, np.float64).reshape(-1) for t in tensors])


def _noise(step, stream):
    key = kt_random.step_key(SEED, tf.constant(step, tf.int64), stream)
    return _flat(kt_random.normal_like(key, _params()))


def _sigma(per_example, mass=1.0):
    """The papers' `Sigma = (N^2 / n) V / M` in float64, V the (n - 1) empirical covariance.

    The papers define Sigma by `F~ = -grad U + sqrt(Sigma) M^1/2 R`, so it is the covariance of
    the force divided by the mass.
    """
    force_covariance = NUM_EXAMPLES**2 / BATCH * np.cov(np.asarray(per_example, np.float64), rowvar=False, ddof=1)
    return force_covariance / mass


# --- CCAdL: one step --------------------------------------------------------------------------


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_ccadl_one_step_matches_hand_computation(covariance):
    h, a, temp, mass, mu = 0.01, 1.5, 2.0, 2.0, 5.0
    sampler = CCAdL(h, friction=a, covariance=covariance, thermal_mass=mu, mass=mass, per_variable_thermostat=False)
    state = sampler.init(_params(), temperature=temp, seed=SEED)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))

    sigma = _sigma(PER_EXAMPLE, mass)
    if covariance == "diag":
        sigma = np.diag(np.diag(sigma))
    p0, theta0, force = _flat(state.momentum), _flat(_params()), _flat(_force())
    noise = _noise(0, kt_random.STREAM_MOMENTUM)
    p1 = (
        p0 + h * force - (h / 2) / temp * (sigma @ p0) * h - a * p0 * h
        + math.sqrt(2 * a * temp * h * mass) * noise
    )
    theta1 = theta0 + h / mass * p1
    # The thermostat reads p.M^-1.p net of the explicit friction's first-order excess,
    # p.M^-1.C.p / 2 with C = (h^2/2) beta Sigma (ccadl.py, module doc).
    reading = p1 @ p1 / mass - (h * h / 4) / temp * (p1 @ sigma @ p1) / mass
    xi1 = a + h / mu * (reading - 3 * temp)

    np.testing.assert_allclose(_flat(new_state.momentum), p1, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(_flat(new_params), theta1, rtol=2e-5, atol=1e-6)
    assert float(new_state.xi) == pytest.approx(xi1, rel=2e-5)
    assert float(logs["noise_scale"]) == pytest.approx(np.trace(sigma) / 3, rel=1e-5)
    assert float(logs["kinetic_temperature"]) == pytest.approx(reading / 3, rel=2e-5)
    assert abs(reading - p1 @ p1 / mass) > 1e-3 * abs(reading)  # the correction is not negligible here
    assert float(logs["xi"]) == float(np.float32(new_state.xi))  # logged in float32
    assert int(new_state.step) == 1
    # The friction term matters at this step size: without it p1 would differ visibly.
    assert np.max(np.abs((h / 2) / temp * (sigma @ p0) * h)) > 0.05


@pytest.mark.parametrize("covariance", ["diag", "full"])
@pytest.mark.parametrize("per_variable_thermostat", [False, True])
@pytest.mark.parametrize("preconditioner", [None, "layerwise"])
def test_ccadl_per_variable_kinetic_temperatures_are_its_thermostats_reading(covariance, per_variable_thermostat,
                                                                             preconditioner):
    """What the per-variable check reads is what the thermostat reads and CCAdL logs: their
    size-weighted mean is the logged kinetic temperature, not the listing's p.M^-1.p / Nd."""
    temp, mass = 2.0, 2.0
    sampler = CCAdL(0.01, friction=1.5, covariance=covariance, mass=mass, per_variable_thermostat=per_variable_thermostat,
                    preconditioner=preconditioner)
    state = sampler.init(_params(), temperature=temp, seed=SEED)
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))
    per_variable = sampler.variable_kinetic_temperatures(new_state, _params(), new_params)
    sizes = [int(np.prod(p.shape)) for p in _params()]
    mean = np.dot([float(t) for t in per_variable], sizes) / sum(sizes)
    assert mean == pytest.approx(float(logs["kinetic_temperature"]), rel=1e-5)
    masses = [mass] * len(sizes) if preconditioner is None else sampler.masses(new_state.preconditioner)
    listing = sum(float(np.sum(np.square(p) / m)) for p, m in zip(new_state.momentum, masses)) / sum(sizes)
    assert abs(mean - listing) > 1e-3 * listing


def test_ccadl_moving_average_weights_each_step_by_one_over_t():
    sampler = CCAdL(0.001, covariance="full")
    params = _params()
    state = sampler.init(params, temperature=1.0, seed=SEED)
    batches = [PER_EXAMPLE, 2.0 * PER_EXAMPLE[::-1], PER_EXAMPLE + np.float32(1.5) * PER_EXAMPLE**2]
    for batch in batches:
        _, state, _ = sampler.update(state, params, _force(), _context(1.0, batch))
    expected = np.mean([np.cov(b.astype(np.float64), rowvar=False, ddof=1) for b in batches], axis=0)
    np.testing.assert_allclose(state.covariance.numpy(), expected, rtol=1e-5, atol=1e-7)

    diag_sampler = CCAdL(0.001, covariance="diag")
    diag_state = diag_sampler.init(params, temperature=1.0, seed=SEED)
    for batch in batches:
        _, diag_state, _ = diag_sampler.update(diag_state, params, _force(), _context(1.0, batch))
    np.testing.assert_allclose(_flat(diag_state.covariance), np.diag(expected), rtol=1e-5, atol=1e-7)


# --- mCCAdL: one step and the C step ----------------------------------------------------------


def _o_step(p, xi, h, a, temp, mass, noise):
    std = math.sqrt(a * temp * (1 - math.exp(-xi * h)) / xi * mass)
    return math.exp(-xi * h / 2) * p + std * noise


@pytest.mark.parametrize("expm, code", [("taylor", kt_linalg.TAYLOR), ("gram", kt_linalg.GRAM)])
@pytest.mark.parametrize("step", [0, 4])
def test_mccadl_one_step_matches_hand_computation(expm, code, step):
    h, a, temp, mass, mu = 0.02, 1.5, 2.0, 2.0, 5.0
    sampler = MCCAdL(h, friction=a, thermal_mass=mu, mass=mass, covariance="minibatch", expm=expm,
                     per_variable_thermostat=False)
    state = sampler.init(_params(), temperature=temp, seed=SEED)._replace(step=tf.constant(step, tf.int64))
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))

    sigma = _sigma(PER_EXAMPLE, mass)
    c_matrix = scipy.linalg.expm(-h * (h / 2) / temp * sigma)
    p, theta, force = _flat(state.momentum), _flat(_params()), _flat(_force())

    def d_step(xi, p):
        return xi + (h / 2) / mu * (p @ p / mass - 3 * temp)

    kick = h / 2 if step == 0 else h  # the closing half kick of the previous step is merged in
    p = p + kick * force
    theta = theta + (h / 2) / mass * p
    p = _o_step(p, a, h, a, temp, mass, _noise(step, kt_random.STREAM_MOMENTUM))
    xi = d_step(a, p)
    p = c_matrix @ p
    xi = d_step(xi, p)
    p = _o_step(p, xi, h, a, temp, mass, _noise(step, kt_random.STREAM_MOMENTUM_2))
    theta = theta + (h / 2) / mass * p

    np.testing.assert_allclose(_flat(new_state.momentum), p, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(_flat(new_params), theta, rtol=2e-5, atol=1e-6)
    assert float(new_state.xi) == pytest.approx(xi, rel=2e-5)
    assert float(logs["noise_scale"]) == pytest.approx(np.trace(sigma) / 3, rel=1e-5)
    assert float(logs["expm_method"]) == code
    assert float(logs["expm_matvecs"]) >= 1
    # The C step is far from the identity here, so this checks it was applied.
    assert np.linalg.norm(c_matrix - np.eye(3)) > 0.3


@pytest.mark.parametrize("step", [0, 4])
def test_mccadl_averaged_diagonal_one_step_matches_hand_computation(step):
    # covariance="diag": the C step is exp(-h (h/2) beta (N^2/n) I_t / M) elementwise, I_t the
    # moving average of the per-coordinate variances (weight 1/(t+1) on this batch's, from zeros).
    h, a, temp, mass, mu = 0.02, 1.5, 2.0, 2.0, 5.0
    sampler = MCCAdL(h, friction=a, thermal_mass=mu, mass=mass, covariance="diag", per_variable_thermostat=False)
    state = sampler.init(_params(), temperature=temp, seed=SEED)._replace(step=tf.constant(step, tf.int64))
    new_params, new_state, logs = sampler.update(state, _params(), _force(), _context(temp))

    average = np.diag(np.cov(PER_EXAMPLE.astype(np.float64), rowvar=False, ddof=1)) / (step + 1)
    sigma = NUM_EXAMPLES**2 / BATCH * average / mass
    c_factor = np.exp(-h * (h / 2) / temp * sigma)
    p, theta, force = _flat(state.momentum), _flat(_params()), _flat(_force())

    def d_step(xi, p):
        return xi + (h / 2) / mu * (p @ p / mass - 3 * temp)

    p = p + (h / 2 if step == 0 else h) * force
    theta = theta + (h / 2) / mass * p
    p = _o_step(p, a, h, a, temp, mass, _noise(step, kt_random.STREAM_MOMENTUM))
    xi = d_step(a, p)
    p = c_factor * p
    xi = d_step(xi, p)
    p = _o_step(p, xi, h, a, temp, mass, _noise(step, kt_random.STREAM_MOMENTUM_2))
    theta = theta + (h / 2) / mass * p

    np.testing.assert_allclose(_flat(new_state.covariance), average, rtol=1e-6)
    np.testing.assert_allclose(_flat(new_state.momentum), p, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(_flat(new_params), theta, rtol=2e-5, atol=1e-6)
    assert float(new_state.xi) == pytest.approx(xi, rel=2e-5)
    assert float(logs["noise_scale"]) == pytest.approx(np.sum(sigma) / 3, rel=1e-5)
    assert float(logs["expm_method"]) == -1 and float(logs["expm_matvecs"]) == 0
    assert np.min(c_factor) < 0.95  # away from the identity: the C step was applied


def test_mccadl_averaged_diagonal_keeps_a_windowed_average_and_restarts_it_after_the_warm_up():
    sampler = MCCAdL(0.02, friction=1.5, covariance="diag", covariance_window=2, warmup_steps=3)
    params = _params()
    state = sampler.init(params, temperature=1.0, seed=SEED)
    batches = [PER_EXAMPLE, 2.0 * PER_EXAMPLE[::-1], PER_EXAMPLE + np.float32(1.5) * PER_EXAMPLE**2]
    variances = [np.diag(np.cov(b.astype(np.float64), rowvar=False, ddof=1)) for b in batches]
    for batch in batches:
        _, state, _ = sampler.update(state, params, _force(), _context(1.0, batch))
    # Weights max(1/t, 1/2): 1, 1/2, 1/2.
    expected = 0.5 * (0.5 * variances[0] + 0.5 * variances[1]) + 0.5 * variances[2]
    np.testing.assert_allclose(_flat(state.covariance), expected, rtol=1e-6)
    # Step 3 is the restart after the warm-up: the average starts again from this minibatch.
    _, state, _ = sampler.update(state, params, _force(), _context(1.0, batches[1]))
    np.testing.assert_allclose(_flat(state.covariance), variances[1], rtol=1e-6)


@pytest.mark.parametrize("preconditioner", [None, "layerwise"])
def test_mccadl_averaged_and_minibatch_c_steps_agree_on_one_scalar_at_the_first_step(preconditioner):
    # With one trainable scalar the covariance is its variance, and at the first step the average
    # is this minibatch's: both C steps are then the same exponential, masses included.
    params, force = [tf.constant([0.5])], [tf.constant([1.0])]
    per_example = np.array([[0.3], [-1.1], [2.0], [0.4]], np.float32)
    results = []
    for covariance in ("minibatch", "diag"):
        sampler = MCCAdL(0.05, friction=1.5, mass=2.0, covariance=covariance, preconditioner=preconditioner)
        state = sampler.init(params, temperature=1.0, seed=SEED)
        results.append(sampler.update(state, params, force, _context(1.0, per_example)))
    (p_mini, s_mini, _), (p_diag, s_diag, _) = results
    np.testing.assert_allclose(_flat(s_diag.momentum), _flat(s_mini.momentum), rtol=1e-5)
    np.testing.assert_allclose(_flat(p_diag), _flat(p_mini), rtol=1e-6)


def test_mccadl_covariance_must_be_minibatch_or_diag():
    with pytest.raises(ValueError, match="'minibatch' .* already uses the full covariance"):
        MCCAdL(1e-3, covariance="full")
    with pytest.raises(ValueError, match="covariance.*'dense'"):
        MCCAdL(1e-3, covariance="dense")
    with pytest.raises((TypeError, ValueError), match="covariance_window"):
        MCCAdL(1e-3, covariance="diag", covariance_window=0)
    with pytest.raises(ValueError, match="covariance_window applies only to covariance='diag'"):
        MCCAdL(1e-3, covariance="minibatch", covariance_window=50)
    # The default is the moving average; the matrix exponential's method belongs to 'minibatch'.
    assert MCCAdL(1e-3).covariance == "diag" and MCCAdL(1e-3, covariance_window=50).covariance_window == 50
    with pytest.raises(ValueError, match="expm applies only to covariance='minibatch'.*expm='gram'"):
        MCCAdL(1e-3, expm="gram")
    assert MCCAdL(1e-3, covariance="minibatch", expm="gram").expm == "gram"


def test_c_step_shrinks_noisy_directions_and_leaves_quiet_ones():
    rng = np.random.default_rng(0)
    # Gc = a u^T + b v^T with u, v orthonormal directions of a 6-dimensional space and a, b
    # centered, orthogonal per-example coefficients: Gc^T Gc = |a|^2 u u^T + |b|^2 v v^T, so u and
    # v are the noisy eigen-directions and the other four see no gradient noise at all.
    basis, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    u, v, quiet = basis[:, 0], basis[:, 1], basis[:, 2:]
    a = rng.normal(size=40) * 3.0
    a -= a.mean()
    b = rng.normal(size=40) * 0.5
    b -= b.mean()
    b -= (a @ b) / (a @ a) * a
    gc = np.outer(a, u) + np.outer(b, v)
    momentum = rng.normal(size=6)
    tau = 0.01
    for method in ("taylor", "gram", "auto"):
        (p_new,), _, _ = covariance_step([tf.constant(momentum, tf.float64)], tf.constant(gc), tau, method)
        p_new = p_new.numpy()
        np.testing.assert_allclose(quiet.T @ p_new, quiet.T @ momentum, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(u @ p_new, math.exp(-tau * (a @ a)) * (u @ momentum), rtol=1e-10)
        np.testing.assert_allclose(v @ p_new, math.exp(-tau * (b @ b)) * (v @ momentum), rtol=1e-10)
    assert tau * (a @ a) > 2 and tau * (b @ b) < 0.2  # a strong and a weak contraction


@pytest.mark.parametrize("integrator_pair", ["euler", "symmetric"])
def test_without_gradient_noise_both_reduce_to_sgnht(integrator_pair):
    # Identical per-example gradients: Sigma = 0, so CCAdL is SGNHT (Euler) and mCCAdL is
    # SGNHT's symmetric BAODDOAB, to rounding.
    no_noise = np.tile(PER_EXAMPLE[:1], (BATCH, 1))
    if integrator_pair == "euler":
        ours, reference = CCAdL(0.05, friction=1.3), SGNHT(0.05, friction=1.3)
    else:
        ours, reference = MCCAdL(0.05, friction=1.3), SGNHT(0.05, friction=1.3, integrator="symmetric")
    params = _params()
    state_ours = ours.init(params, temperature=1.0, seed=SEED)
    state_ref = reference.init(params, temperature=1.0, seed=SEED)
    params_ours = params_ref = params
    for _ in range(3):
        params_ours, state_ours, logs = ours.update(state_ours, params_ours, _force(), _context(1.0, no_noise))
        params_ref, state_ref, _ = reference.update(state_ref, params_ref, _force(), _context(1.0, no_noise))
    np.testing.assert_allclose(_flat(params_ours), _flat(params_ref), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(state_ours.xi), np.asarray(state_ref.xi), rtol=1e-6)
    assert float(logs["noise_scale"]) == 0.0


# --- Sampling the Bayesian linear regression posterior through fit ---------------------------


def _regression_problem(num_examples=4096, noise_std=0.19, seed=3):
    """Weak signal, so zero (where `run_chains` starts) is near the posterior.

    CCAdL's moving average weighs the first steps like all others: a start far from the posterior,
    where the residuals (hence the gradient noise) are much larger, would bias Sigma for
    thousands of steps. With `noise_std = 0.19`, n = 16 and N = 4096, Sigma ~ 1.5e5 per coordinate:
    the gradient noise h^2 Sigma per step dominates the injected noise 2 A h (16x for A = 10,
    h = 2e-3), so a wrong covariance term would show as a large temperature error.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 2)).astype(np.float32)
    y = (x @ np.array([0.1, -0.1]) + noise_std * rng.normal(size=num_examples))[:, None]
    return x, y.astype(np.float32)


# The posterior, thermostat, temperature, mass and sample-weight checks of both samplers are in
# tests/test_statistical_ccadl.py.


# --- Stability: where CCAdL's explicit friction breaks, and mCCAdL does not -------------------


def _critical_step_size(x, y, batch_size):
    """h at which `(h^2 / 2) beta lambda_max(Sigma) = 2`, Sigma at the posterior mean."""
    mean, _ = testing.linear_regression_posterior(x, y, prior_std=1.0)
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    residual = design @ mean - y[:, 0]
    per_example = 2.0 * residual[:, None] * design  # gradient of (a . theta - y)^2
    sigma = len(x) ** 2 / batch_size * np.cov(per_example, rowvar=False, ddof=1)
    return math.sqrt(4.0 / np.linalg.eigvalsh(sigma)[-1])


def _fit(sampler, x, y, batch_size, steps):
    keras.utils.set_random_seed(0)  # the batch order, so the run does not depend on earlier tests
    net = testing.linear_regression_net(x.shape[1])
    for variable in net.trainable_variables:  # start near the posterior, where Sigma was predicted
        variable.assign(np.zeros(variable.shape, np.float32))
    model = kt.BayesianModel(net, sampler, num_examples=len(x), prior=kt.priors.Gaussian(1.0), seed=1)
    model.compile(loss="mse", steps_per_execution=50)
    model.fit(x, y, batch_size=batch_size, epochs=steps // (len(x) // batch_size), shuffle=True, verbose=0)
    return model


def test_ccadl_diverges_above_the_predicted_step_size_and_mccadl_does_not():
    x, y = _regression_problem()
    batch_size = 16
    critical = _critical_step_size(x, y, batch_size)
    assert 3e-3 < critical < 8e-3  # ~5e-3; the force alone would allow h up to 2 / omega ~ 2e-2

    model = _fit(CCAdL(0.6 * critical, friction=1.0), x, y, batch_size, steps=1024)
    assert all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)

    with pytest.raises(SamplerDivergedError, match="CCAdL") as info:
        _fit(CCAdL(1.4 * critical, friction=1.0), x, y, batch_size, steps=1024)
    # The error names the last finite step_size_limit, below the step that diverged.
    assert _named_step_sizes(str(info.value))[0] < 1.4 * critical

    # Stability only: at twice CCAdL's limit mCCAdL (either covariance: both C steps are exact
    # exponentials) does not diverge, but its discretisation bias is large (with the minibatch
    # covariance, over 8 batch orders its end points had an RMS of ~2.2 posterior stds per
    # coordinate), so no accuracy is claimed here; tests/test_statistical_ccadl.py checks
    # accuracy at ordinary step sizes.
    for covariance in ("diag", "minibatch"):
        model = _fit(MCCAdL(2.0 * critical, friction=1.0, covariance=covariance), x, y, batch_size, steps=1024)
        assert model.sampler_step == 1024
    assert all(np.isfinite(v.numpy()).all() for v in model.variables if v.dtype != "int64")


# --- Through the model: logs, state, saving ---------------------------------------------------


def test_fit_logs_diagnostics_and_saves_sampler_state(tmp_path):
    x, y = testing.linear_regression_data(64, 2, seed=0)
    for sampler, keys in [
        (CCAdL(1e-3, covariance="full"), {"xi", "noise_scale"}),
        (MCCAdL(1e-3, covariance="minibatch", expm="gram"), {"xi", "noise_scale", "expm_matvecs", "expm_method"}),
        (MCCAdL(1e-3, covariance="diag", covariance_window=50), {"xi", "noise_scale", "expm_method"}),
    ]:
        net = testing.linear_regression_net(2)
        model = kt.BayesianModel(net, sampler, num_examples=64, prior=kt.priors.Gaussian(1.0), seed=0)
        model.compile(loss="mse")
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        assert keys | {"kinetic_temperature", "step_size", "potential"} <= set(history.history)
        assert all(v > 0 for v in history.history["noise_scale"])
        path = str(tmp_path / f"{sampler.name}.keras")
        model.save(path)
        restored = keras.saving.load_model(path)
        assert restored.sampler.get_config() == sampler.get_config()
        saved_state, loaded_state = tf.nest.flatten(model.sampler_state()), tf.nest.flatten(restored.sampler_state())
        assert len(saved_state) == len(loaded_state)
        for saved, loaded in zip(saved_state, loaded_state):
            np.testing.assert_array_equal(saved.numpy(), loaded.numpy())
        if getattr(sampler, "covariance", None) == "diag" and sampler.name == "mccadl":
            assert np.all(_flat(restored.sampler_state().covariance) > 0)  # the average was saved
        assert restored.sampler_step == 8


def test_update_without_per_example_gradients_is_refused():
    for sampler in (CCAdL(1e-3), MCCAdL(1e-3)):
        assert sampler.needs_per_example_gradients
        state = sampler.init(_params(), temperature=1.0, seed=SEED)
        with pytest.raises(ValueError, match="per_example_gradients"):
            sampler.update(state, _params(), _force(), _context(1.0, per_example=None))
        with pytest.raises(ValueError, match="at least 2; got per-example gradients for 1"):
            sampler.update(state, _params(), _force(), _context(1.0, per_example=PER_EXAMPLE[:1]))


def test_full_covariance_refuses_models_above_the_limit():
    sampler = CCAdL(1e-3, covariance="full", max_full_params=2)
    with pytest.raises(ValueError) as info:
        sampler.init(_params(), temperature=1.0, seed=SEED)
    for word in ["Nd = 3", "max_full_params = 2", "covariance='diag'"]:
        assert word in str(info.value)
    # Same refusal when the model creates the sampler state.
    net = testing.linear_regression_net(2)
    model = kt.BayesianModel(net, sampler, num_examples=10, seed=0)
    with pytest.raises(ValueError, match="max_full_params = 2"):
        model.build()
    # At the limit it is accepted.
    CCAdL(1e-3, covariance="full", max_full_params=3).init(_params(), temperature=1.0, seed=SEED)


def _mlp_fit(per_example_method, make_sampler, steps=12):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(96, 5)).astype("float32")
    labels = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    keras.utils.set_random_seed(2)
    net = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)]
    )
    model = kt.BayesianModel(
        net, make_sampler(), num_examples=96, prior=kt.priors.Gaussian(1.0), seed=SEED,
        per_example_method=per_example_method,
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(16).repeat()
    history = model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    return model, history


@pytest.mark.parametrize(
    "make_sampler",
    [lambda: CCAdL(1e-3),
     # Default-suite time: the full covariance and the Gram C step run with `-m slow` (their
     # one-step hand computations above stay in the default suite).
     pytest.param(lambda: CCAdL(1e-3, covariance="full"), marks=pytest.mark.slow),
     lambda: MCCAdL(1e-2, covariance="minibatch", expm="taylor"),
     pytest.param(lambda: MCCAdL(1e-2, covariance="minibatch", expm="gram"), marks=pytest.mark.slow)],
    ids=["ccadl-diag", "ccadl-full", "mccadl-taylor", "mccadl-gram"],
)
def test_dense_layer_statistics_give_the_same_chain_as_vectorized_rows(make_sampler):
    """Both per-example paths estimate the same covariance of the same minibatch, so the chains
    agree up to float32 rounding (~1e-6 relative per step in the statistics; 12 steps)."""
    fast, fast_history = _mlp_fit("dense_layers", make_sampler)
    rows, rows_history = _mlp_fit("vectorized", make_sampler)
    assert fast.per_example_path == "dense_layers" and rows.per_example_path == "vectorized"
    for a, b in zip(fast.variables, rows.variables):
        np.testing.assert_allclose(np.asarray(a.numpy()), np.asarray(b.numpy()), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fast_history.history["noise_scale"], rows_history.history["noise_scale"], rtol=1e-4)


def test_auto_per_example_method_picks_the_layer_rules_and_dense_layers_stays_dense_only():
    dense = kt.BayesianModel(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), CCAdL(1e-3), num_examples=8)
    conv = kt.BayesianModel(
        keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(2)]),
        CCAdL(1e-3), num_examples=8,
    )
    assert dense.per_example_path == "layers"
    assert conv.per_example_path == "layers"  # Conv2D has a rule (keras_thermo.per_example.rules.conv)
    forced = kt.BayesianModel(conv.net, CCAdL(1e-3), num_examples=8, per_example_method="dense_layers")
    forced.compile(loss="mse")
    with pytest.raises(ValueError, match="per_example_method.*Conv2D"):
        forced.fit(np.zeros((8, 6, 6, 1), "float32"), np.zeros((8, 2), "float32"), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="per_example_method.*'sideways'"):
        kt.BayesianModel(dense.net, CCAdL(1e-3), num_examples=8, per_example_method="sideways")


def test_ccadl_logs_the_step_size_its_covariance_estimate_allows():
    # One weight: Sigma is the scalar `noise_scale`, so the explicit friction's limit
    # (h^2/2) beta Sigma < 2 is h < sqrt(4 / (beta Sigma)) exactly; at T = 2, beta = 1/2.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1)).astype("float32")
    y = (3.0 * x + rng.standard_normal((64, 1))).astype("float32")
    net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model = kt.BayesianModel(net, kt.samplers.CCAdL(1e-3, covariance="diag"), num_examples=640, temperature=2.0, seed=0)
    model.compile(loss="mse")
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["noise_scale"] > 0
    np.testing.assert_allclose(logs["step_size_limit"], np.sqrt(4.0 / (0.5 * logs["noise_scale"])), rtol=1e-5)


def _named_step_sizes(message: str) -> tuple[float, float]:
    """`(limit, suggestion)`: the step sizes a CCAdL divergence error names."""
    assert "step_size_limit" in message, message
    named = float(re.search(r"use step_size below ([0-9.e+-]+)", message).group(1))
    suggested = float(re.search(r"\(e\.g\. ([0-9.e+-]+),", message).group(1))
    return named, suggested


@pytest.mark.slow
def test_ccadl_divergence_error_names_a_step_size_that_works():
    """The error of a diverged CCAdL run names its last finite `step_size_limit`, below the step
    size that diverged, and half of it, with which the same problem runs (the default suite
    checks the named limit in `test_ccadl_diverges_above_the_predicted_step_size_...`)."""
    x, y = _regression_problem()
    batch_size = 16
    step_size = 1.4 * _critical_step_size(x, y, batch_size)
    with pytest.raises(SamplerDivergedError) as info:
        _fit(CCAdL(step_size, friction=1.0), x, y, batch_size, steps=256)
    named, suggested = _named_step_sizes(str(info.value))
    assert named < step_size
    assert suggested == pytest.approx(0.5 * named, rel=1e-2)
    model = _fit(CCAdL(suggested, friction=1.0), x, y, batch_size, steps=256)
    assert model.sampler_step == 256



def _failure_messages(samplers: dict, configurational: float, kinetic: float = 1.0, variables=()) -> dict:
    """The temperature check's warning text for a run of each sampler whose whole net reads
    `configurational` and `kinetic`, with the report's per-variable entries `variables`, by label."""
    from keras_thermo.equilibration import EquilibrationCheck

    report = {"temperature": 1.0, "equilibration_step": 100, "num_blocks": 10,
              "overall": {"kinetic": {"mean": kinetic, "standard_error": 0.01, "in_band": abs(kinetic - 1.0) < 0.05},
                          "configurational": {"mean": configurational, "standard_error": 0.01,
                                              "in_band": abs(configurational - 1.0) < 0.05}},
              "variables": list(variables)}
    messages = {}
    for label, sampler in samplers.items():
        x, y = testing.linear_regression_data(32, 2, seed=0)
        model = kt.BayesianModel(testing.linear_regression_net(2), sampler, num_examples=32, temperature_check=False)
        model.compile(loss="mse")
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        check = EquilibrationCheck(warn=False)
        check.attach(model)
        messages[label] = check._describe_failures({**report, "sampler": check.report()["sampler"]})
    return messages


def test_the_temperature_warning_names_the_averaged_covariance_for_mccadl_with_the_minibatch_one_only():
    messages = _failure_messages({"minibatch": MCCAdL(1e-3, covariance="minibatch"), "diag": MCCAdL(1e-3),
                                  "sgnht": SGNHT(1e-3)}, configurational=0.8)
    assert "MCCAdL(covariance='diag')" in messages["minibatch"]
    assert "MCCAdL(covariance='diag')" not in messages["diag"] and "MCCAdL(covariance='diag')" not in messages["sgnht"]


def test_the_warning_does_not_advise_what_the_run_already_uses():
    one_xi = dict(per_variable_thermostat=False)  # the papers' single thermostat
    samplers = {"sgnht": SGNHT(1e-3, **one_xi), "sgnht_symmetric": SGNHT(1e-3, integrator="symmetric", **one_xi),
                "mccadl": MCCAdL(1e-3, **one_xi), "ccadl": CCAdL(1e-3, **one_xi),
                "mccadl_per_tensor": MCCAdL(1e-3), "sghmc": kt.samplers.SGHMC(1e-3)}
    suggests_noise_samplers = "use a sampler that corrects for gradient noise (CCAdL, mCCAdL)"
    per_tensor = "per_variable_thermostat=True gives each trainable tensor its own thermostat"
    second_order = "take a second-order step (SGNHT(integrator='symmetric'), mCCAdL)"
    # Both temperatures hot: a step too long for the curvature or the noise.
    messages = _failure_messages(samplers, configurational=1.2, kinetic=1.2)
    assert suggests_noise_samplers in messages["sgnht"] and suggests_noise_samplers in messages["sghmc"]
    assert suggests_noise_samplers not in messages["mccadl"] and "reduce step_size" in messages["mccadl"]
    # The positions hot with the momenta at T: the step's own error; a second-order step where the
    # run's is first order (SGNHT's Euler step), not where it already is one.
    messages = _failure_messages(samplers, configurational=1.2)
    for label, message in messages.items():
        assert "positions run hotter than its momenta" in message and "reduce step_size" in message, label
        assert (second_order in message) == (label in ("sgnht", "sghmc")), label
        # CCAdL already corrects the noise: its second-order counterpart is mCCAdL.
        assert ("take a second-order step (mCCAdL)" in message) == (label == "ccadl"), label
        assert ("first-order step" in message) == (label in ("sgnht", "sghmc", "ccadl")), label
        assert per_tensor not in message and suggests_noise_samplers not in message, label
    # One tensor's momenta hot while the whole net's are held at T: one thermostat per tensor,
    # for the samplers with the papers' single thermostat only (SGHMC has none).
    logits = {"name": "net/logits/kernel", "size": 500,
              "kinetic": {"mean": 1.3, "standard_error": 0.01, "in_band": False},
              "configurational": {"mean": 1.31, "standard_error": 0.01, "in_band": False}}
    messages = _failure_messages(samplers, configurational=1.02, variables=[logits])
    # Hot in both temperatures within a wide kinetic band (no resolved gap): the same advice.
    wide = {**logits, "kinetic": {"mean": 1.08, "standard_error": 0.025, "in_band": True},
            "configurational": {"mean": 1.10, "standard_error": 0.015, "in_band": False}}
    assert per_tensor in _failure_messages({"sgnht": SGNHT(1e-3, **one_xi)}, configurational=1.02, variables=[wide])["sgnht"]
    for label, message in messages.items():
        assert "the kinetic temperature of 'net/logits/kernel'" in message or "configurational temperature of 'net/logits" in message
        assert (per_tensor in message) == (label in ("sgnht", "sgnht_symmetric", "mccadl", "ccadl")), label
    assert suggests_noise_samplers in messages["sgnht"] and suggests_noise_samplers not in messages["mccadl"]
    # The one-line summary of a report (the demo's lines) reads the same from the report itself.
    hot = {"temperature": 1.0, "equilibrated": False, "equilibration_step": 100, "num_blocks": 10,
           "overall": {"kinetic": {"mean": 1.2, "standard_error": 0.01, "in_band": False},
                       "configurational": {"mean": 1.2, "standard_error": 0.01, "in_band": False}},
           "variables": []}
    assert suggests_noise_samplers in equilibration.summary(hot)
    assert suggests_noise_samplers not in equilibration.summary({**hot, "sampler": sampler_traits(MCCAdL(1e-3))})
    # A report saved before it carried the sampler's traits.
    assert suggests_noise_samplers not in equilibration.summary({**hot, "sampler_corrects_noise": True})


def test_mccadl_averaged_covariance_with_keras_fit_arguments_and_chains():
    # From Keras' default initialisation, two chains, sample weights and a validation split: the
    # average is per chain ([chains, ...] leaves) and every logged value finite.
    x, y = testing.linear_regression_data(96, 3, seed=2)
    keras.utils.set_random_seed(0)
    model = kt.BayesianModel(testing.linear_regression_net(3), MCCAdL(covariance="diag"), num_examples=80,
                             num_chains=2, seed=1, temperature_check=False)
    model.compile(loss=kt.losses.GaussianNLL(scale=0.5))
    weights = np.linspace(0.5, 1.5, 96).astype(np.float32)
    history = model.fit(x, y, sample_weight=weights, validation_split=1 / 6, batch_size=16, epochs=2, verbose=0)
    assert {"val_loss", "noise_scale", "xi"} <= set(history.history)
    assert all(np.all(np.isfinite(v)) for v in history.history.values())
    kernel_average = model.sampler_state().covariance[0]
    assert tuple(kernel_average.shape) == (2, 3, 1) and np.all(np.asarray(kernel_average) > 0)
