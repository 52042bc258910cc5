"""Samplers whose step size changes during a run (schedules, or a float set between fits).

TACT-HMC keeps per-step variables: the displacement `r = h p / M = sqrt(eta / M) p`. When eta
changes, the momentum p must be kept, i.e. r rescaled by `sqrt(eta_t / eta_{t-1})`
(`keras_thermo.samplers.tact_hmc`). The other samplers keep p itself (and xi as a physical
friction, SGLD no momentum), so a step-size change needs no rescaling there.

Two checks: a free particle without friction or noise travels at a constant velocity whatever
the step sizes (exact, for theta's r and xi's r_xi), and on a Gaussian target under a
`Cyclical` schedule the sampled variance matches the exact periodic steady state of the
intended discrete dynamics (a linear recursion, propagated in closed form), with a tolerance
from batch means.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from benchmarks.tact_synthetic import GaussianMixture, simulate
from keras_thermo import testing
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.tact_hmc import TACTHMC

FREE_STEP_SIZES = [1e-4, 1e-4, 4e-4, 4e-4, 2.5e-5, 9e-4]


def free_particle_sampler(step_size) -> TACTHMC:
    """No friction, no noise, no thermostat, no ABF: only the step size moves r."""
    return TACTHMC(step_size, noise=0.0, xi_noise=0.0, thermostat=False, abf=False, sample_every=1)


@pytest.mark.parametrize("how", ["schedule", "float set between steps"])
def test_tact_free_particle_keeps_its_velocity_when_the_step_size_changes(how):
    boundaries = list(range(len(FREE_STEP_SIZES) - 1))
    if how == "schedule":
        sampler = free_particle_sampler(keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, FREE_STEP_SIZES))
    else:
        sampler = free_particle_sampler(FREE_STEP_SIZES[0])
        sampler.bind_step_size(tf.Variable(FREE_STEP_SIZES[0]))
    params = [tf.constant([0.5, -1.0, 2.0])]
    state = sampler.init(params, temperature=1.0, seed=4)
    # Velocities p / M = r / h with h = sqrt(eta) (unit mass).
    velocity = state.momentum[0].numpy() / math.sqrt(FREE_STEP_SIZES[0])
    xi_velocity = float(state.xi_momentum) / math.sqrt(FREE_STEP_SIZES[0])
    context = StepContext(temperature=1.0, num_examples=1, batch_size=tf.constant(1.0),
                          potential=tf.constant(0.0), seed=4)
    force = [tf.zeros([3])]
    theta = params
    for eta in FREE_STEP_SIZES:
        if how != "schedule":
            sampler.step_size = eta
        theta, state, logs = sampler.update(state, theta, force, context)
        np.testing.assert_allclose(float(logs["step_size"]), eta, rtol=1e-6)
    elapsed = sum(math.sqrt(eta) for eta in FREE_STEP_SIZES)
    # xi stays on the plateau (lambda' = 0 there, so no force on it).
    assert abs(float(state.xi)) < sampler.xi0
    np.testing.assert_allclose(theta[0].numpy(), params[0].numpy() + velocity * elapsed, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(state.xi), xi_velocity * elapsed, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(float(state.momentum_step_size), FREE_STEP_SIZES[-1], rtol=1e-6)
    # The kinetic temperature |r|^2 / (Nd eta) is that of the unchanged momentum.
    np.testing.assert_allclose(float(logs["kinetic_temperature"]), np.mean(velocity**2), rtol=1e-5)


def test_tact_fixed_xi_step_size_is_not_rescaled_by_the_theta_schedule():
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [1e-4, 4e-4])
    sampler = TACTHMC(schedule, xi_step_size=1e-4, noise=0.0, xi_noise=0.0, thermostat=False, abf=False)
    params = [tf.constant([0.0])]
    state = sampler.init(params, temperature=1.0, seed=2)
    context = StepContext(temperature=1.0, num_examples=1, batch_size=tf.constant(1.0),
                          potential=tf.constant(0.0), seed=2)
    r_xi = float(state.xi_momentum)
    for _ in range(2):
        params, state, _ = sampler.update(state, params, [tf.zeros([1])], context)
    np.testing.assert_allclose(float(state.xi), 2 * r_xi, rtol=1e-5)


# --- the variance on a Gaussian under a cyclical schedule --------------------------------------

STD = 0.5  # target N(0, STD^2 I)
NOISE = 0.05  # c: friction per step, fixed (thermostat off)
CYCLE = 500
INITIAL_STEP_SIZE = 0.005


def exact_sampled_variance(schedule, friction: float, stiffness: float, temperature: float = 1.0) -> float:
    """The mean over a cycle's sampling steps of theta's variance in the periodic steady state of

        r <- exp(-c) sqrt(eta_t / eta_{t-1}) r - eta_t k theta + sqrt(2 c eta_t T) R,
        theta <- theta + r,

    TACT-HMC on `U = k theta^2 / 2` with z fixed at c and xi off, one coordinate: the
    covariance of (theta, r) is propagated step by step (`C <- A C A^T + b b^T`) over cycles
    until it repeats.
    """
    steps = np.arange(schedule.cycle_length)
    etas = np.array([float(schedule(int(t))) for t in steps], np.float64)
    sampled = np.array([bool(schedule.in_sampling_phase(int(t))) for t in steps])
    previous = np.roll(etas, 1)
    covariance = np.diag([temperature / stiffness, temperature * etas[-1]])
    decay = math.exp(-friction)
    for _ in range(200):
        start = covariance.copy()
        variances = np.empty(len(steps))
        for t, (eta, eta_before) in enumerate(zip(etas, previous)):
            keep = decay * math.sqrt(eta / eta_before)
            step = np.array([[1.0 - eta * stiffness, keep], [-eta * stiffness, keep]])
            noise = math.sqrt(2.0 * friction * eta * temperature) * np.ones(2)
            covariance = step @ covariance @ step.T + np.outer(noise, noise)
            variances[t] = covariance[0, 0]
        if np.allclose(covariance, start, rtol=1e-12, atol=0.0):
            return float(variances[sampled].mean())
    raise AssertionError("the covariance recursion did not reach its periodic steady state")


def sampled_variance_t_statistic(num_steps: int, dim: int, seed: int, num_batches: int = 10):
    """The sampled `mean theta^2` of a TACT-HMC chain (thermostat and tempering off, Cyclical
    step size) against the exact steady state: (batch-means t statistic, ratio, exact ratio)."""
    schedule = kt.schedules.Cyclical(INITIAL_STEP_SIZE, CYCLE, exploration_fraction=0.8)
    sampler = TACTHMC(schedule, noise=NOISE, tempering=False, thermostat=False, sample_every=1)
    target = GaussianMixture([1.0], [[0.0] * dim], [STD])
    output = simulate(sampler, target.potential, [0.0] * dim, num_steps=num_steps, seed=seed)
    keep = output["is_sample"].copy()
    keep[:CYCLE] = False  # the first cycle relaxes from theta = 0
    squares = np.mean(output["theta"][keep].astype(np.float64) ** 2, axis=1)
    exact = exact_sampled_variance(schedule, NOISE, 1.0 / STD**2)
    # Batches of consecutive samples span several cycles; without a thermostat the chain forgets
    # within ~1 / c = 20 steps, so cycles are nearly independent.
    batch_means = np.array([b.mean() for b in np.array_split(squares, num_batches)])
    t_stat = float(testing.chain_t_statistic(batch_means[:, None], np.array([exact]))[0])
    return t_stat, squares.mean() / STD**2, exact / STD**2


def _check_cyclical_variance(num_steps: int, dim: int, seed: int) -> None:
    t_stat, ratio, exact_ratio = sampled_variance_t_statistic(num_steps, dim, seed)
    threshold = testing.t_threshold(10, 1, 1e-3)
    print(f"variance ratio {ratio:.4f} (exact {exact_ratio:.4f}), t = {t_stat:.2f}")  # pytest -s
    # Keeping r instead of p heats the chain in every sampling phase (eta falls fastest there):
    # ratio ~1.3 against ~1.03, t ~ 15 at the default length.
    assert abs(t_stat) < threshold, (t_stat, threshold, ratio, exact_ratio)


def test_tact_variance_on_a_gaussian_under_a_cyclical_step_size():
    _check_cyclical_variance(num_steps=20_000, dim=64, seed=1)


@pytest.mark.slow
def test_tact_variance_on_a_gaussian_under_a_cyclical_step_size_long():
    _check_cyclical_variance(num_steps=200_000, dim=64, seed=2)
