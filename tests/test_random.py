"""Tests of keras_thermo.random: step-keyed standard normal draws (one fused Box-Muller draw per
call, split into the tensors).

The distribution checks use 2^18 draws and five-standard-error bounds on statistics whose
standard errors are known in closed form for N(0, 1) (mean: 1/sqrt(n); variance: sqrt(2/n);
fourth moment: sqrt(96/n), since E z^8 - (E z^4)^2 = 105 - 9), plus a Kolmogorov-Smirnov test;
`test_the_checks_reject_a_wrong_distribution` shows each check failing on a slightly wrong one.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from keras_thermo import random as kt_random

COUNT = 2**18
BOUND = 5.0  # standard errors


def _key(step: int = 0, stream: int = kt_random.STREAM_MOMENTUM, seed: int = 0) -> tf.Tensor:
    return kt_random.step_key(seed, tf.constant(step, tf.int64), stream)


def normal_checks(draws: np.ndarray) -> dict[str, bool]:
    """Which of the N(0, 1) checks `draws` passes."""
    z = draws.astype(np.float64)
    n = z.size
    return {
        "mean": abs(z.mean()) <= BOUND / np.sqrt(n),
        "variance": abs(z.var() - 1.0) <= BOUND * np.sqrt(2.0 / n),
        "fourth_moment": abs(np.mean(z**4) - 3.0) <= BOUND * np.sqrt(96.0 / n),
        "kolmogorov_smirnov": scipy.stats.kstest(z, "norm").pvalue >= 1e-5,
    }


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_draws_are_standard_normal(dtype):
    (draws,) = kt_random.normal_like(_key(), [tf.zeros([COUNT], dtype)])
    assert draws.dtype == dtype and draws.shape == (COUNT,)
    assert all(normal_checks(draws.numpy()).values()), normal_checks(draws.numpy())


def test_the_two_halves_of_a_box_muller_draw_are_independent_normals():
    """The cosines and the sines of the same pairs share their radius: each half is N(0, 1), and
    neither the values nor their squares are correlated across halves."""
    draws = kt_random.box_muller(_key(), COUNT)
    assert all(normal_checks(draws.numpy()).values()), normal_checks(draws.numpy())
    halves = draws.numpy().reshape(2, -1).astype(np.float64)
    for half in halves:
        assert abs(half.mean()) <= BOUND / np.sqrt(COUNT / 2) and abs(half.var() - 1) <= BOUND * np.sqrt(4.0 / COUNT)
    assert abs(np.corrcoef(halves)[0, 1]) <= BOUND / np.sqrt(COUNT / 2)
    assert abs(np.corrcoef(halves[0] ** 2, halves[1] ** 2)[0, 1]) <= BOUND / np.sqrt(COUNT / 2)


def test_the_independence_checks_reject_dependent_halves():
    """Power of the two checks above on two wrong draws with exact N(0, 1) halves: halves
    correlated at 0.05 (the values' check), and halves that share their radius but take
    independent angles (uncorrelated values, squares correlated at 0.5: the squares' check)."""
    halves = kt_random.box_muller(_key(), COUNT).numpy().reshape(2, -1).astype(np.float64)
    bound = BOUND / np.sqrt(COUNT / 2)
    correlated = 0.05 * halves[0] + np.sqrt(1 - 0.05**2) * halves[1]
    assert abs(np.corrcoef(halves[0], correlated)[0, 1]) > bound
    radius = np.hypot(halves[0], halves[1])
    angles = 2 * np.pi * np.random.default_rng(0).uniform(size=radius.size)
    shared_radius = radius * np.cos(angles)
    assert abs(np.corrcoef(halves[0], shared_radius)[0, 1]) <= bound  # the values' check misses it
    assert abs(np.corrcoef(halves[0] ** 2, shared_radius**2)[0, 1]) > bound


def test_draws_refuse_non_float_dtypes_and_odd_pair_counts():
    with pytest.raises(ValueError, match="tensor 1 has dtype int32"):
        kt_random.normal_like(_key(), [tf.zeros([2]), tf.zeros([3], tf.int32)])
    with pytest.raises(ValueError, match="must be even, got 5"):
        kt_random.box_muller(_key(), 5)
    assert kt_random.normal_like(_key(), []) == []
    (from_array,) = kt_random.normal_like(_key(), [np.zeros((2, 3), np.float32)])
    np.testing.assert_array_equal(from_array.numpy(), kt_random.normal_like(_key(), [tf.zeros([2, 3])])[0].numpy())


def test_the_named_philox_uniforms_are_the_default_algorithms_without_xla():
    """The draw names Philox: without XLA the same uniforms as the default "auto_select"
    algorithm (TensorFlow's CPU kernel resolves it to Philox), so naming it changed no number
    there; under XLA the default resolves otherwise and the named draw is the one compiled
    (`test_draws_compiled_with_xla_are_standard_normal`)."""
    named = tf.random.stateless_uniform([2, 48], seed=_key(), alg="philox")
    default = tf.random.stateless_uniform([2, 48], seed=_key(), alg="auto_select")
    np.testing.assert_array_equal(named.numpy(), default.numpy())


def test_the_checks_reject_a_wrong_distribution():
    (draws,) = kt_random.normal_like(_key(), [tf.zeros([COUNT])])
    draws = draws.numpy().astype(np.float64)
    assert not normal_checks(1.01 * draws)["variance"]
    assert not normal_checks(draws + 0.02)["mean"]
    uniform = np.random.default_rng(0).uniform(-np.sqrt(3.0), np.sqrt(3.0), COUNT)  # mean 0, var 1
    assert not normal_checks(uniform)["fourth_moment"]
    assert not normal_checks(uniform)["kolmogorov_smirnov"]


def test_draws_are_a_pure_function_of_seed_step_and_stream():
    like = [tf.zeros([300, 7]), tf.zeros([7])]
    first = kt_random.normal_like(_key(step=5), like)
    again = tf.function(kt_random.normal_like)(_key(step=5), like)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    others = [_key(step=6), _key(stream=kt_random.STREAM_MOMENTUM_2), _key(seed=1)]
    flat = np.concatenate([d.numpy().ravel() for d in first])
    for key in others:
        other = np.concatenate([d.numpy().ravel() for d in kt_random.normal_like(key, like)])
        assert abs(np.corrcoef(flat, other)[0, 1]) <= BOUND / np.sqrt(flat.size)


def test_each_tensor_gets_its_aligned_share_of_one_draw_per_dtype():
    """float32 (and narrower) tensors share one Box-Muller draw keyed by the key, float64 tensors
    one keyed by `fold_in(key, 1)`; each tensor's share starts at a multiple of `ALIGNMENT`."""
    like = [tf.zeros([3, 4], tf.float32), tf.Variable(tf.zeros([5], tf.float64)), tf.zeros([], tf.float32),
            tf.zeros([40], tf.float16), tf.zeros([0, 3]), tf.zeros([33], tf.float64)]
    draws = kt_random.normal_like(_key(), like)
    assert [d.shape for d in draws] == [(3, 4), (5,), (), (40,), (0, 3), (33,)]
    assert [d.dtype for d in draws] == [tf.float32, tf.float64, tf.float32, tf.float16, tf.float32, tf.float64]
    align = kt_random.ALIGNMENT
    single = kt_random.box_muller(_key(), 4 * align).numpy()  # shares of 12, 1, 40, 0 values: 32, 32, 64, 0
    np.testing.assert_array_equal(draws[0].numpy().ravel(), single[:12])
    np.testing.assert_array_equal(draws[2].numpy().ravel(), single[align:align + 1])
    np.testing.assert_array_equal(draws[3].numpy(), single[2 * align:2 * align + 40].astype(np.float16))
    double = kt_random.box_muller(tf.random.experimental.stateless_fold_in(_key(), 1), 3 * align, tf.float64).numpy()
    np.testing.assert_array_equal(draws[1].numpy(), double[:5])
    np.testing.assert_array_equal(draws[5].numpy(), double[align:align + 33])


def test_draws_compiled_with_xla_are_standard_normal():
    """XLA compiles other uniforms than TensorFlow's kernel for a key (so another chain), with the
    same distribution."""
    like = [tf.zeros([COUNT // 2]), tf.zeros([COUNT // 2 - 7])]
    draws = tf.function(lambda key: kt_random.normal_like(key, like), jit_compile=True)(_key())
    assert [d.shape for d in draws] == [(COUNT // 2,), (COUNT // 2 - 7,)]
    values = np.concatenate([d.numpy() for d in draws])
    assert all(normal_checks(values).values()), normal_checks(values)


def test_unknown_shapes_in_a_traced_function():
    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def draw(like):
        return kt_random.normal_like(_key(), [like, tf.zeros([2])])

    first, second = draw(tf.zeros([5, 3]))
    assert first.shape == (5, 3) and second.shape == (2,)
    eager = kt_random.normal_like(_key(), [tf.zeros([5, 3]), tf.zeros([2])])
    np.testing.assert_array_equal(first.numpy(), eager[0].numpy())
