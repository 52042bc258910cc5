"""Step size and friction from SGD's learning rate and momentum (keras_thermo.samplers.units)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import keras_thermo as kt
from keras_thermo.samplers import units

from helpers import tanh_net

NUM_EXAMPLES = 64


def test_the_conversion_round_trips_and_refuses_what_has_no_sgd_form():
    for lr, momentum, mass in [(0.05, 0.9, 1.0), (1e-3, 0.0, 4.0), (0.3, 0.999, 0.5)]:
        converted = units.from_learning_rate(lr, momentum, 50_000, mass)
        back = units.to_learning_rate(converted["step_size"], converted["friction"], 50_000, mass)
        assert back == pytest.approx({"learning_rate": lr, "momentum": momentum}, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match=r"momentum.*\[0, 1\).*1.0"):
        units.from_learning_rate(0.1, 1.0, 100)
    with pytest.raises(ValueError, match="learning_rate"):
        units.from_learning_rate(-0.1, 0.9, 100)
    with pytest.raises(TypeError, match="SGLD has no friction"):
        kt.samplers.SGLD.from_learning_rate(0.1, 0.9, num_examples=100)
    sampler = kt.samplers.SGNHT.from_learning_rate(0.05, 0.9, num_examples=50_000, warmup_steps=0)
    assert (sampler.step_size, sampler.friction, sampler.warmup_steps) == (0.001, 100.0, 0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sghmc_without_noise_is_keras_sgd_with_that_learning_rate_and_momentum(momentum):
    """At T = 1e-30 the noise (sqrt(2 A h T) per step) and the initial momenta vanish, and
    SGHMC's Euler step is SGD with momentum on the mean loss, step for step; with the exact
    conversion the trajectories agree to float32 rounding. The wrong units (lr = h N, the
    SGLD scaling) would be off by a factor of h in the learning rate."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((NUM_EXAMPLES, 3)).astype("float32")
    y = rng.standard_normal((NUM_EXAMPLES, 1)).astype("float32")

    reference = tanh_net()
    reference.compile(optimizer=keras.optimizers.SGD(0.05, momentum=momentum), loss="mse")
    reference.fit(x, y, batch_size=NUM_EXAMPLES, epochs=20, shuffle=False, verbose=0)

    sampler = kt.samplers.SGHMC.from_learning_rate(0.05, momentum, num_examples=NUM_EXAMPLES)
    model = kt.BayesianModel(tanh_net(), sampler, num_examples=NUM_EXAMPLES, temperature=1e-30, seed=0, temperature_check=False)
    model.compile(loss="mse")
    with pytest.warns(UserWarning, match="variance 1/2"):
        model.fit(x, y, batch_size=NUM_EXAMPLES, epochs=20, shuffle=False, verbose=0)
    for ours, theirs in zip(model.net.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
