"""Step-keyed Gaussian noise.

Every random draw is a pure function of (seed, step, stream) and of the shapes drawn for in the
same call, drawn with TensorFlow's stateless generators. The only random state is therefore the seed (in the model config) and the step
counter (a model variable): a resumed run continues the exact noise sequence, and replicas that
share the step draw identical noise.

Normals come from one Philox uniform draw per call turned into normals by Box-Muller
(`normal_like`): on a CPU about half the cost of TensorFlow's own normal kernel
(`benchmarks/lab/noise_draw.py`), whose draw is most of what a cheap sampler adds to an SGD step.
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


# Each tensor's share of a fused draw starts at a multiple of this many values (128 bytes of
# float32), so splitting the draw into tensors shares its buffer instead of copying it, and the
# pair count of a draw is a multiple of 16 (its two uniform rows are shared, not copied, too).
ALIGNMENT = 32


def box_muller(key: tf.Tensor, count, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """`count` i.i.d. N(0, 1) values `[count]` (`count` even) from the stateless key `key`.

    Box-Muller: from independent uniforms `u1, u2` on `[0, 1)`, `r = sqrt(-2 log(1 - u1))` and
    `theta = 2 pi u2` give two independent standard normals, `r cos(theta)` and `r sin(theta)`.
    The first half of the result holds the cosines, the second the sines (`sin(theta) =
    cos(theta - pi/2)`, so one `cos` over both rows). The uniforms have the resolution of `dtype`
    (`2^-23` in float32, as in TensorFlow's own normal kernel, which is Box-Muller too: its
    largest value is then `sqrt(-2 log(2^-23)) = 5.6`); `1 - u1` lies in `(0, 1]`, so the
    logarithm is finite.

    Args:
        key: A stateless key from `step_key`.
        count: An even number of values (int or scalar int tensor; an odd int is refused).
        dtype: float32 or float64.

    Example:
        >>> z = box_muller(step_key(0, tf.constant(0), STREAM_INIT), 100_000)
        >>> abs(float(tf.reduce_mean(z))) < 0.02, abs(float(tf.math.reduce_std(z)) - 1) < 0.02
        (True, True)

    Reference:
        G. E. P. Box, M. E. Muller, "A note on the generation of random normal deviates",
        Ann. Math. Statist. 29(2), 1958.
    """
    if isinstance(count, int) and count % 2:
        raise ValueError(f"box_muller draws pairs: `count` must be even, got {count}.")
    uniform = tf.random.stateless_uniform(tf.stack([2, count // 2]), seed=key, dtype=dtype, alg="philox")
    radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniform[0]))
    shift = tf.constant([[0.0], [0.5 * math.pi]], dtype)  # row 1: theta - pi/2, whose cosine is sin(theta)
    return tf.reshape(radius * tf.cos((2.0 * math.pi) * uniform[1] - shift), [-1])


def _size(tensor) -> int | tf.Tensor:
    """The number of entries: a Python int where the shape is known, else a scalar tensor."""
    known = tf.TensorShape(tensor.shape).num_elements()
    return known if known is not None else tf.size(tensor)


def _fused_draw(key: tf.Tensor, tensors: Sequence[tf.Tensor], dtype: tf.DType) -> list[tf.Tensor]:
    """One `box_muller` draw for all of `tensors`, split into their shapes (in `dtype`)."""
    sizes = [_size(t) for t in tensors]
    shares = [(n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT for n in sizes]
    flat = box_muller(key, sum(shares[1:], shares[0]), dtype)
    static = all(isinstance(n, int) for n in sizes)
    pieces = tf.split(flat, shares if static else tf.stack(shares), num=len(tensors))
    draws = []
    for piece, size, share, like in zip(pieces, sizes, shares, tensors):
        if not (isinstance(size, int) and size == share):
            piece = piece[:size]
        static_shape = tf.TensorShape(like.shape)
        shape = static_shape if static_shape.is_fully_defined() else tf.shape(like)
        draws.append(tf.reshape(piece, shape))
    return draws


def normal_like(key: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Independent standard normal draws shaped like each tensor in `tensors`.

    One `box_muller` draw for all float64 tensors and one for all the others (drawn in float32
    and cast to their dtype, e.g. float16), keyed by `key` and `fold_in(key, 1)`, split into the
    tensors in order (each tensor's share rounded up to `ALIGNMENT` values). The values depend
    on the key and on the shapes of all the tensors of the call.

    This replaced one `tf.random.stateless_normal` (TensorFlow's Box-Muller kernel) per tensor:
    the same distribution (`benchmarks/lab/normal_draw_quality.py` runs high-power checks of
    both), about half the cost on a CPU (`benchmarks/lab/noise_draw.py`), other numbers. Under
    XLA (`jit_compile=True`) the uniforms XLA compiles are other numbers than TensorFlow's kernel
    draws for the same key: a run compiled with XLA is a different, equally valid chain.

    Args:
        key: A stateless key from `step_key`.
        tensors: Tensors, variables or arrays of a float dtype, whose shapes and dtypes the
            draws copy (another dtype is refused with a ValueError).

    Returns:
        A list of tensors, one per input, with i.i.d. N(0, 1) entries.

    Example:
        >>> key = step_key(0, tf.constant(1), STREAM_MOMENTUM)
        >>> [r.shape for r in normal_like(key, [tf.zeros([2, 3]), tf.zeros([4])])]
        [TensorShape([2, 3]), TensorShape([4])]
    """
    tensors = list(tensors)
    for index, like in enumerate(tensors):
        if not tf.as_dtype(like.dtype).is_floating:
            raise ValueError(f"normal_like draws floats: tensor {index} has dtype {tf.as_dtype(like.dtype).name}; "
                             "pass tensors of a float dtype (float16, bfloat16, float32, float64).")
    draws: list = [None] * len(tensors)
    for group, dtype in enumerate((tf.float32, tf.float64)):
        members = [i for i, t in enumerate(tensors) if (tf.as_dtype(t.dtype) == tf.float64) == (dtype == tf.float64)]
        if not members:
            continue
        group_key = key if group == 0 else tf.random.experimental.stateless_fold_in(key, group)
        for i, draw in zip(members, _fused_draw(group_key, [tensors[i] for i in members], dtype)):
            target = tf.as_dtype(tensors[i].dtype)
            draws[i] = draw if target == dtype else tf.cast(draw, target)
    return draws


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
