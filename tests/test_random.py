"""Tests of keras_thermo.random: step-keyed standard normal draws, the samplers' fused Box-Muller
draw and TensorFlow's kernel draw kept beside it (benchmarks/lab/noise_draw.py times both).

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
from keras_thermo.random import ALIGNMENT, box_muller_normal

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
@pytest.mark.parametrize("draw", [kt_random.normal_like, kt_random.kernel_normal_like], ids=["fused", "kernel"])
def test_draws_are_standard_normal(dtype, draw):
    (draws,) = draw(_key(), [tf.zeros([COUNT], dtype)])
    assert draws.dtype == dtype and draws.shape == (COUNT,)
    assert all(normal_checks(draws.numpy()).values()), normal_checks(draws.numpy())


def test_the_box_muller_draw_is_standard_normal():
    draws = box_muller_normal(_key(), COUNT)
    assert all(normal_checks(draws.numpy()).values()), normal_checks(draws.numpy())
    # The two halves (cosines and sines of the same pairs) are independent normals too.
    halves = draws.numpy().reshape(2, -1).astype(np.float64)
    assert abs(np.corrcoef(halves)[0, 1]) <= BOUND / np.sqrt(COUNT / 2)
    assert abs(np.corrcoef(halves[0] ** 2, halves[1] ** 2)[0, 1]) <= BOUND / np.sqrt(COUNT / 2)


def test_the_fused_draw_gives_each_tensor_its_aligned_share_per_dtype():
    """`normal_like`: float32 (and narrower) tensors share one Box-Muller draw keyed by the key,
    float64 tensors one keyed by `fold_in(key, 1)`; each tensor's share starts at a multiple of
    `ALIGNMENT`, and the draws are standard normal."""
    like = [tf.zeros([3, 4]), tf.zeros([5], tf.float64), tf.zeros([]), tf.zeros([40], tf.float16),
            tf.zeros([33], tf.float64), tf.zeros([COUNT])]
    draws = kt_random.normal_like(_key(), like)
    assert [d.shape for d in draws] == [(3, 4), (5,), (), (40,), (33,), (COUNT,)]
    assert [d.dtype for d in draws] == [tf.float32, tf.float64, tf.float32, tf.float16, tf.float64, tf.float32]
    single = box_muller_normal(_key(), 4 * ALIGNMENT + COUNT).numpy()  # shares 32, 32, 64, COUNT
    np.testing.assert_array_equal(draws[0].numpy().ravel(), single[:12])
    np.testing.assert_array_equal(draws[2].numpy().ravel(), single[ALIGNMENT:ALIGNMENT + 1])
    np.testing.assert_array_equal(draws[3].numpy(), single[2 * ALIGNMENT:2 * ALIGNMENT + 40].astype(np.float16))
    np.testing.assert_array_equal(draws[5].numpy(), single[4 * ALIGNMENT:])
    double = box_muller_normal(tf.random.experimental.stateless_fold_in(_key(), 1), 3 * ALIGNMENT, tf.float64).numpy()
    np.testing.assert_array_equal(draws[1].numpy(), double[:5])
    np.testing.assert_array_equal(draws[4].numpy(), double[ALIGNMENT:ALIGNMENT + 33])
    assert all(normal_checks(draws[5].numpy()).values()), normal_checks(draws[5].numpy())


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


def test_the_kernel_draw_gives_each_tensor_its_own_keyed_draw_in_its_dtype():
    like = [tf.zeros([3, 4], tf.float32), tf.Variable(tf.zeros([5], tf.float64)), tf.zeros([], tf.float32)]
    draws = kt_random.kernel_normal_like(_key(), like)
    assert [d.shape for d in draws] == [(3, 4), (5,), ()]
    assert [d.dtype for d in draws] == [tf.float32, tf.float64, tf.float32]
    for index, (draw, tensor) in enumerate(zip(draws, like)):
        key = tf.random.experimental.stateless_fold_in(_key(), index)
        expected = tf.random.stateless_normal(tf.shape(tensor), seed=key, dtype=tensor.dtype)
        np.testing.assert_array_equal(draw.numpy(), expected.numpy())


def test_the_named_philox_draw_is_the_default_algorithms_under_xla_too():
    """The kernel draw names Philox (faster to compile on a CPU) without changing any number: under
    XLA it draws what the default "auto_select" draw compiled with XLA does (and without XLA,
    the test above, what the kernel's default does)."""
    like = [tf.zeros([40, 3]), tf.zeros([6], tf.float64)]

    def default_algorithm(key):
        return [tf.random.stateless_normal(tf.shape(t), seed=tf.random.experimental.stateless_fold_in(key, i),
                                           dtype=t.dtype) for i, t in enumerate(like)]

    ours = tf.function(lambda key: kt_random.kernel_normal_like(key, like), jit_compile=True)(_key())
    default = tf.function(default_algorithm, jit_compile=True)(_key())
    for a, b in zip(ours, default):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_the_fused_draw_compiled_with_xla_is_standard_normal(dtype):
    """Under XLA the Philox uniforms behind the fused draw are XLA's own (other numbers than the
    graph's, as for the kernel draw), so their normals are checked again."""
    (draws,) = tf.function(lambda key: kt_random.normal_like(key, [tf.zeros([COUNT], dtype)]), jit_compile=True)(_key())
    assert draws.dtype == dtype
    assert all(normal_checks(draws.numpy()).values()), normal_checks(draws.numpy())


@pytest.mark.parametrize("normal_like", [kt_random.normal_like, kt_random.kernel_normal_like], ids=["fused", "kernel"])
def test_unknown_shapes_in_a_traced_function(normal_like):
    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def draw(like):
        return normal_like(_key(), [like, tf.zeros([2]), tf.zeros([4], tf.float64)])

    first, second, third = draw(tf.zeros([5, 3]))
    assert first.shape == (5, 3) and second.shape == (2,) and third.shape == (4,)
    eager = normal_like(_key(), [tf.zeros([5, 3]), tf.zeros([2]), tf.zeros([4], tf.float64)])
    for traced, expected in zip((first, second, third), eager):
        np.testing.assert_array_equal(traced.numpy(), expected.numpy())
