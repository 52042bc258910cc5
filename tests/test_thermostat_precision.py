"""Running averages and thermostats that must keep moving over paper-length runs (float64 state).

Each test fails with the float32 state the samplers had before: the increments below are smaller
than half a float32 ulp of the value they are added to.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo.samplers import integrators
from keras_thermo.samplers.base import StepContext


def _context(per_example=None, temperature=1.0):
    return StepContext(temperature=temperature, num_examples=100, batch_size=tf.constant(2.0),
                       potential=tf.constant(0.0), seed=5, per_example_gradients=per_example)


def _rows_with_variance(variance):
    """Two per-example gradient rows +-g whose (n - 1)-normalised variance is `variance`."""
    g = math.sqrt(variance / 2.0)
    return tf.constant([[g, g], [-g, -g]], tf.float32)


def _ccadl_step(sampler, step, average, variance):
    params = [tf.constant([0.1, -0.2])]
    state = sampler.init(params, temperature=1.0, seed=5)
    state = state._replace(step=tf.constant(step, tf.int64), covariance=[tf.constant(average, tf.float64)])
    _, new_state, _ = sampler.update(state, params, [tf.zeros([2])], _context(_rows_with_variance(variance)))
    return new_state.covariance[0].numpy()


def test_ccadl_running_mean_still_moves_after_a_million_steps():
    """At t = 1e6 a 5% change of V moves I_t by 5e-8 (float32: half an ulp of 1 is 6e-8)."""
    step = 1_000_000
    new = _ccadl_step(kt.samplers.CCAdL(1e-4, warmup_steps=0), step, [1.0, 1.0], 1.05)
    # V itself is a float32 estimate (relative error ~1e-7 of 1.05, i.e. ~2e-6 of V - 1).
    np.testing.assert_allclose(new - 1.0, 0.05 / (step + 1), rtol=1e-5)


@pytest.mark.parametrize("window, step, weight", [(None, 9, 0.1), (None, 999, 1e-3), (100, 9, 0.1), (100, 999, 0.01)])
def test_ccadl_average_weight(window, step, weight):
    """`k_t = 1/t` (t = step + 1), floored at 1/W with `covariance_window=W`."""
    sampler = kt.samplers.CCAdL(1e-4, covariance_window=window, warmup_steps=0)
    assert float(sampler.average_weight(tf.constant(step, tf.int64))) == pytest.approx(weight, rel=1e-12)


def test_ccadl_covariance_window_forgets_the_burn_in_covariance():
    """After the noise level drops from 100 to 1, a window of 50 steps forgets the old level by
    exp(-200/50) in 200 steps; the paper's 1/t average still remembers about 100 * 1000/1200."""
    results = {}
    for window in (None, 50):
        sampler = kt.samplers.CCAdL(1e-4, covariance_window=window, warmup_steps=0)
        average = [100.0, 100.0]
        for step in range(1000, 1200):
            average = _ccadl_step(sampler, step, average, 1.0)
        results[window] = average[0]
    assert results[None] == pytest.approx(1.0 + 99.0 * 1000 / 1200, rel=1e-6)
    assert results[50] == pytest.approx(1.0 + 99.0 * (1 - 1 / 50) ** 200, rel=1e-6)


def test_tact_z_theta_responds_to_a_one_percent_temperature_error_at_the_paper_config():
    """EMNIST config: eta = 1.33e-8, c = 0.05. A 1% hot r moves z_theta by 0.01 eta T = 1.3e-10,
    which float32 rounds away at z = 0.05 (half an ulp: 1.9e-9)."""
    eta, noise = 1.3298e-08, 0.05
    sampler = kt.samplers.TACTHMC(eta, xi_step_size=eta, noise=noise, xi_noise=noise, sample_every=50)
    params = [tf.zeros([1000])]
    state = sampler.init(params, temperature=1.0, seed=5)
    state = state._replace(momentum=[tf.fill([1000], tf.constant(math.sqrt(1.01 * eta), tf.float32))])
    _, new_state, _ = sampler.update(state, params, [tf.zeros([1000])], _context())
    assert float(new_state.z_theta) - noise == pytest.approx(0.01 * eta, rel=1e-4)
    assert new_state.z_theta.dtype == integrators.THERMOSTAT_DTYPE
