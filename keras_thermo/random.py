"""Step-keyed Gaussian noise.

Every random draw is a pure function of (seed, step, stream) and of the shapes drawn together,
drawn with TensorFlow's stateless generators. The only random state is therefore the seed (in
the model config) and the step counter (a model variable): a resumed run continues the exact
noise sequence, and replicas that share the step draw identical noise.

Normals come from one Philox uniform draw per call, turned into normals by Box-Muller and split
into the tensors (`normal_like`); TensorFlow's own normal kernel, one keyed draw per tensor, is
kept as `kernel_normal_like` (the samplers' stream before; tests can still run on it).
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf

# Streams keep draws made in the same step independent of one another.
STREAM_INIT = 0
STREAM_MOMENTUM = 1
STREAM_MOMENTUM_2 = 2
STREAM_TEMPERING = 3
STREAM_TEMPERING_INIT = 4
STREAM_DATA = 5  # minibatch indices drawn by `BayesianModel.fit` from arrays
STREAM_PRIOR = 16  # hyperparameter draws of priors (`keras_thermo.priors.HierarchicalGaussian`)
STREAM_CHAIN = 6  # seeds of the chains of a several-chain model (`chain_seed`)
STREAM_CURVATURE = 7  # the start of the automatic step size's power iteration (`samplers.auto_step`)

_MASK_64 = (1 << 64) - 1


def step_key(seed: int, step: tf.Tensor, stream: int) -> tf.Tensor:
    """Returns a stateless RNG key `[2] int32` for `(seed, step, stream)`.

    Example:
        >>> k = step_key(0, tf.constant(3, tf.int64), STREAM_MOMENTUM)
        >>> k.shape
        TensorShape([2])
    """
    base = tf.constant([seed, stream], dtype=tf.int32)
    step = tf.cast(step, tf.int32)
    return tf.random.experimental.stateless_fold_in(base, step)


#: `normal_like` starts each tensor's share of its draw at a multiple of this many values (128
#: bytes of float32), so that splitting the draw shares its buffer instead of copying it.
ALIGNMENT = 32


def box_muller_normal(key: tf.Tensor, count, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """`count` i.i.d. N(0, 1) draws `[count]` from the stateless key `key`.

    Box-Muller (Box & Muller 1958, "A note on the generation of random normal deviates", Ann.
    Math. Stat. 29(2)): from uniforms `u1, u2` on `[0, 1)`, `r = sqrt(-2 log(1 - u1))` and
    `theta = 2 pi u2` give two independent normals, `r cos(theta)` and `r sin(theta)`. The first
    half of the result holds the cosines, the second the sines (`sin(theta) = cos(theta - pi/2)`,
    so one `cos` serves both). The uniforms have the resolution of `dtype` (`2^-23` in float32,
    as in TensorFlow's own normal kernel, whose largest normal is then also
    `sqrt(-2 log(2^-23)) = 5.6`); `1 - u1` lies in `(0, 1]`, so the logarithm is finite.

    Args:
        key: a stateless key, e.g. from `step_key`.
        count: number of draws (int or scalar int tensor).
        dtype: float32 or float64.

    Example:
        >>> z = box_muller_normal(step_key(0, tf.constant(0), STREAM_INIT), 100_000)
        >>> abs(float(tf.reduce_mean(z))) < 0.02, abs(float(tf.math.reduce_std(z)) - 1) < 0.02
        (True, True)
    """
    pairs = (count + 1) // 2
    # Philox named: without XLA the same numbers as the default "auto_select", and under XLA on a
    # CPU a far faster draw than the default compiles to (other numbers there, as for the kernel
    # draw; `benchmarks/results/step_cost_emnist_mlp_xla_*` measured the kernel draw's case).
    uniform = tf.random.stateless_uniform(tf.stack([2, pairs]), seed=key, dtype=dtype, alg="philox")
    radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniform[0]))
    angles = (2.0 * math.pi) * uniform[1] - tf.constant([[0.0], [0.5 * math.pi]], dtype)
    return tf.reshape(radius * tf.cos(angles), [-1])[:count]


def _size(tensor) -> "int | tf.Tensor":
    shape = tensor.shape
    return shape.num_elements() if shape.is_fully_defined() else tf.size(tensor)


def normal_like(key: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Independent standard normal draws shaped like each tensor in `tensors`.

    One `box_muller_normal` draw for all float32 (and narrower) tensors, keyed by `key`, and one
    in float64 for the float64 tensors, keyed by `fold_in(key, 1)`; each tensor takes its
    share in order, every share starting at a multiple of `ALIGNMENT` values (the split shares
    the draw's buffer; a share longer than its tensor is cut, a copy of that tensor's size).
    One fused draw instead of one kernel call per tensor took SGLD's step from 1.10-1.22x to
    0.80-0.87x of a hand-written Keras SGLD step at widths 512-2048 on a CPU
    (`benchmarks/results/peers/` against `benchmarks/results/peers_fused_draw/`); its distribution passes the same high-power checks as the
    kernel's (`benchmarks/results/normal_draw_quality.json`, tests/test_random.py). It holds
    about three weight-sized arrays at once while it draws (uniforms, angles, normals).

    A tensor's draw depends on the sizes of the tensors before it in the list (its offset), and
    the call consumes `key` and `fold_in(key, 1)`: key any other draw of the same step from a
    stream of its own (`step_key`).

    Args:
        key: A stateless key from `step_key`.
        tensors: Tensors (or variables) whose shapes and float dtypes the draws copy.

    Returns:
        A list of tensors, one per input, with i.i.d. N(0, 1) entries.

    Example:
        >>> key = step_key(0, tf.constant(1), STREAM_MOMENTUM)
        >>> [r.shape for r in normal_like(key, [tf.zeros([2, 3]), tf.zeros([4])])]
        [TensorShape([2, 3]), TensorShape([4])]
    """
    draws = [None] * len(tensors)
    for group, dtype in enumerate((tf.float32, tf.float64)):
        members = [i for i, like in enumerate(tensors) if (like.dtype == tf.float64) == (dtype == tf.float64)]
        if not members:
            continue
        sizes = [_size(tensors[i]) for i in members]
        shares = [-(-size // ALIGNMENT) * ALIGNMENT for size in sizes]
        group_key = key if group == 0 else tf.random.experimental.stateless_fold_in(key, group)
        static = all(isinstance(size, int) for size in sizes)
        total = sum(shares) if static else tf.add_n([tf.cast(share, tf.int32) for share in shares])
        flat = box_muller_normal(group_key, total, dtype)
        pieces = tf.split(flat, shares) if len(shares) > 1 else [flat]
        for i, piece, size, share in zip(members, pieces, sizes, shares):
            like = tensors[i]
            shape = like.shape if like.shape.is_fully_defined() else tf.shape(like)
            value = tf.reshape(piece if static and size == share else piece[:size], shape)
            draws[i] = value if like.dtype == dtype else tf.cast(value, like.dtype)
    return draws


def kernel_normal_like(key: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """`normal_like` through TensorFlow's `stateless_normal` kernel: one draw per tensor, keyed by
    `fold_in(key, index)` (the samplers' stream until the fused draw replaced it).

    Example:
        >>> key = step_key(0, tf.constant(1), STREAM_MOMENTUM)
        >>> [r.shape for r in kernel_normal_like(key, [tf.zeros([2, 3]), tf.zeros([4])])]
        [TensorShape([2, 3]), TensorShape([4])]
    """
    return [
        tf.random.stateless_normal(tf.shape(like), seed=tf.random.experimental.stateless_fold_in(key, index),
                                   dtype=like.dtype, alg="philox")
        for index, like in enumerate(tensors)
    ]


def _mix64(value: int) -> int:
    """The splitmix64 finaliser (Steele, Lea & Flood 2014): a bijection of 64-bit integers whose
    outputs for consecutive inputs look independent."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK_64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK_64
    return value ^ (value >> 31)


def chain_seed(seed: int, chain: int) -> int:
    """The seed of chain `chain` of a model seeded `seed`, in [0, 2**31).

    Chain 0 keeps `seed` itself, so chain 0 of a several-chain run is the one-chain run with the
    same seed; every other chain's seed is a hash of (seed, STREAM_CHAIN, chain). A chain's noise,
    momentum draws and redrawn initial weights are all keyed by its seed, so chain k of a C-chain
    run is the one-chain run seeded `chain_seed(seed, k)` (given the same batches and start).

    Example:
        >>> chain_seed(7, 0), chain_seed(7, 1) == chain_seed(7, 1), chain_seed(7, 1) != chain_seed(7, 2)
        (7, True, True)
    """
    if chain == 0:
        return int(seed)
    mixed = _mix64((int(seed) << 32 | STREAM_CHAIN << 24 | int(chain)) & _MASK_64)
    return int(mixed & 0x7FFFFFFF)
