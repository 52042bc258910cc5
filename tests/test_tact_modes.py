"""TACT-HMC's mode masses on the three-mode mixture of its synthetic study (Luo et al. 2018,
sec. 5.1; `configs/tact_synthetic.yaml`), measured over many independent chains.

A chain's samples are correlated (it hops between modes only while tempered), so the standard
error of a mode's mass comes from the spread of the mode counts between independent chains,
not from the number of samples (`benchmarks.tact_synthetic.mode_occupancy`). The chains run
`TACTHMC.update` vectorised in one compiled loop (`simulate_chains`), with the study's
hyperparameters and its force and potential noise of std 3.

Measured: no bias. The slow test (200 chains of 150 000 steps started in the leftmost mode, the
first 20 000 not counted, 26 000 samples per chain) gives the masses 0.2463 +- 0.0041,
0.3995 +- 0.0043, 0.3542 +- 0.0041 against 0.25, 0.40, 0.35 (the middle mode within 0.1
standard error); the default test (200 chains of 8000 steps started from the target) has
errors of ~0.016.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.tact_synthetic import GaussianMixture, mode_occupancy, simulate_chains
from keras_thermo import testing
from keras_thermo.samplers.tact_hmc import TACTHMC

# The study's target and TACT-HMC settings (configs/tact_synthetic.yaml).
THREE_MODES = GaussianMixture([0.25, 0.4, 0.35], [[-5.0], [0.0], [5.0]], [0.6, 0.6, 0.6])
STUDY = dict(
    step_size=0.02, xi_step_size=3e-3, noise=0.05, xi_noise=0.1, thermal_inertia=1.0, xi_thermal_inertia=1.0,
    sample_every=1, num_bins=50,
)
NOISE_STD = 3.0


def nearest_mode(theta: tf.Tensor) -> tf.Tensor:
    means = tf.constant(THREE_MODES.means[:, 0], tf.float32)
    return tf.cast(tf.argmin(tf.abs(theta[:, :1] - means[None]), axis=1), tf.int32)


def mode_masses(starts, *, num_steps: int, burn_in_steps: int, seed: int, **options):
    """`[(mass, standard error)]` of each mode over the chains' samples, and the run's counts."""
    sampler = TACTHMC(**{**STUDY, **options})
    output = simulate_chains(
        sampler, THREE_MODES.potential, starts, num_steps=num_steps, seed=seed, classify=nearest_mode,
        num_classes=3, burn_in_steps=burn_in_steps, force_std=NOISE_STD, potential_std=NOISE_STD,
    )
    counts = output["sample_counts"]
    return [mode_occupancy(counts, mode) for mode in range(3)], output


def target_draws(num_chains: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    component = rng.choice(3, size=num_chains, p=THREE_MODES.weights)
    return THREE_MODES.means[component] + THREE_MODES.stds[component, None] * rng.normal(size=(num_chains, 1))


def assert_masses(masses, num_chains: int):
    print("mode masses (mass, standard error):", [(round(m, 4), round(e, 4)) for m, e in masses],  # pytest -s
          "target", list(THREE_MODES.weights))
    threshold = testing.t_threshold(num_chains, 3, 1e-3)
    for mode, (mass, error) in enumerate(masses):
        assert abs(mass - THREE_MODES.weights[mode]) < threshold * error, (mode, masses, threshold)


def test_mode_masses_over_independent_chains_started_from_the_target():
    # 200 chains x 8000 steps (~6 s, most of it compiling): the error of each mass is ~0.016, so
    # a bias of 0.1 in a mode's mass would be 6 standard errors.
    masses, output = mode_masses(target_draws(200, seed=3), num_steps=8000, burn_in_steps=1500, seed=7)
    assert_masses(masses, 200)
    assert max(error for _, error in masses) < 0.025, masses
    # Every chain leaves its start: the chains hop while tempered.
    assert np.mean(np.count_nonzero(output["sample_counts"], axis=1) >= 2) > 0.5


@pytest.mark.slow
def test_mode_masses_of_long_runs_from_the_leftmost_mode():
    # The study's start (all chains in the lightest mode, ABF learning from scratch).
    masses, _ = mode_masses(np.full([200, 1], -5.0), num_steps=150_000, burn_in_steps=20_000, seed=11)
    assert_masses(masses, 200)
    assert max(error for _, error in masses) < 0.01, masses
