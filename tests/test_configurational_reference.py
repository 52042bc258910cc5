"""`benchmarks.lab.configurational_reference`: the minibatch forces it rebuilds are the loop's
own, and about the warm-up's end the configurational temperature is far less noisy than about 0
on the same chain (the lab's point; its committed run has the figures)."""

from __future__ import annotations

import numpy as np

from benchmarks.lab import configurational_reference as lab


def test_the_rebuilt_forces_give_the_loops_potential_gradient_and_the_reference_cuts_the_noise():
    (row,) = lab.run(chains=1, steps=3000, block=100)
    assert row["steps_after_warmup"] == 2000
    for name in ("origin", "reference"):
        assert np.isfinite(row[name]["mean"]) and row[name]["standard_error"] > 0
    # Both estimate the same T = 1 (4 batch-means errors: a 1e-4 two-sided normal tail); about the
    # reference the error is several times smaller (about 1 if the reference did nothing).
    assert abs(row["reference"]["mean"] - 1.0) < 4 * row["reference"]["standard_error"]
    assert row["error_ratio"] > 3.0


def test_the_forces_are_those_of_the_drawn_minibatch():
    """At theta = 0 the force of a minibatch is `N mean(2 y_i x_i)`: rebuilt from the same
    stateless draw it matches a direct computation."""
    import tensorflow as tf  # noqa: PLC0415

    rng = np.random.default_rng(0)
    design = rng.normal(size=(50, 3))
    targets = rng.normal(size=50)
    (force,) = lab.minibatch_forces(design, targets, np.zeros((1, 3)), np.array([7]), chain_seed=4)
    rows = tf.random.stateless_uniform([lab.BATCH], seed=tf.constant([4, 7 + 2**20], tf.int32), maxval=50,
                                       dtype=tf.int32).numpy()
    expected = 50 * np.mean(2.0 * targets[rows][:, None] * design[rows], axis=0)
    np.testing.assert_allclose(force, expected, rtol=1e-10)
