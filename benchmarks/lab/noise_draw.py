"""Cost of the Nd standard normals a noisy sampler draws per step, against a Keras SGD step.

SGLD, SGHMC, SGNHT (and CCAdL, mCCAdL, TACT-HMC) draw one standard normal per trainable scalar
every step; on small networks that draw is most of what they add to SGD. For each network of
`benchmarks.step_cost` this times, in one run and interleaved:

* the Keras SGD step: `fit` of `steps_per_execution`-step executions, as in `benchmarks.step_cost`
  (median wall time per step);
* the draw of one step's noise for the network's trainable variables by each method below, as
  `--draws` draws inside one `tf.function` (a `tf.while_loop`, draw i keyed by i, one element of
  every variable's draw read so that nothing is pruned), compiled like the train step, less the
  same loop without the draw:
  - `kernel_per_variable`: `tf.random.stateless_normal` once per variable, each with its own
    folded key: the draw of `keras_thermo.random.normal_like` before it was replaced;
  - `kernel_fused`: one `stateless_normal` of Nd values, split per variable;
  - `box_muller_fused`: one Philox uniform draw, vectorised Box-Muller, split per variable
    (`box_muller_normal`; measured, not adopted: see `keras_thermo.random.normal_like`);
  - `box_muller_aligned`: `box_muller_fused` with each variable's share starting at a multiple
    of 32 values, so that the split copies nothing (the candidate for the samplers' draw);
  - `inverse_cdf_fused`: one Philox uniform draw on the open interval, `tf.math.ndtri` of each
    (one normal per uniform), split per variable (measured, not adopted);
  - `philox_uniforms_only`: the Philox uniforms of `kernel_fused` alone, not normals: a lower
    bound on any exact draw built on these random bits;
  - `library_normal_like`: `keras_thermo.random.normal_like`, whatever the installed version
    does (the recorded noise_draw.json ran while it was `box_muller_fused`; now it is
    `kernel_per_variable`);
* with `--samplers`, SGLD, SGHMC and SGNHT through `fit` (their whole step).

Each is reported in ms per step and as the median over repetitions of its ratio to the SGD step
of the same repetition.

    python -m benchmarks.lab.noise_draw --out benchmarks/results/noise_draw.json [--networks emnist_mlp]
        [--repeats 7] [--draws 200] [--samplers]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import step_cost
from keras_thermo import random as kt_random

DRAW_METHODS = ("kernel_per_variable", "kernel_fused", "box_muller_fused", "box_muller_aligned",
                "inverse_cdf_fused", "philox_uniforms_only", "library_normal_like")
SAMPLERS = ("sgld", "sghmc", "sgnht")


def kernel_per_variable(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """One `stateless_normal` per variable, keyed by `fold_in(key, index)`."""
    return [
        tf.random.stateless_normal(
            tf.shape(variable), seed=tf.random.experimental.stateless_fold_in(key, index),
            dtype=variable.dtype,
        )
        for index, variable in enumerate(variables)
    ]


def kernel_fused(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """One `stateless_normal` of all Nd values, split and reshaped per variable."""
    sizes = [variable.shape.num_elements() for variable in variables]
    flat = tf.random.stateless_normal([sum(sizes)], seed=key)
    return [tf.reshape(piece, variable.shape) for piece, variable in zip(tf.split(flat, sizes), variables)]


def box_muller_normal(key: tf.Tensor, count, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """`count` i.i.d. N(0, 1) draws `[count]` from the stateless key `key`.

    Box-Muller (Box & Muller 1958, "A note on the generation of random normal deviates", Ann.
    Math. Stat. 29(2)): from uniforms `u1, u2` on `[0, 1)`, `r = sqrt(-2 log(1 - u1))` and
    `theta = 2 pi u2` give the independent normals `r cos(theta)` and `r sin(theta)`. The first
    half of the result holds the cosines, the second the sines (`sin(theta) =
    cos(theta - pi/2)`, so one `cos` covers both). Uniforms have the resolution of `dtype`
    (`2^-23` in float32, as for TensorFlow's own normal kernel, whose largest normal is then
    `sqrt(-2 log(2^-23)) = 5.6`); `1 - u1` lies in `(0, 1]`, so the logarithm is finite.

    Args:
        key: a stateless key, e.g. from `step_key`.
        count: number of draws (int or scalar int tensor).
        dtype: float32 or float64.

    Example:
        >>> z = box_muller_normal(kt_random.step_key(0, tf.constant(0), kt_random.STREAM_INIT), 100_000)
        >>> abs(float(tf.reduce_mean(z))) < 0.02, abs(float(tf.math.reduce_std(z)) - 1) < 0.02
        (True, True)
    """
    pairs = (count + 1) // 2
    uniform = tf.random.stateless_uniform(tf.stack([2, pairs]), seed=key, dtype=dtype)
    radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniform[0]))
    # Row 0: theta, row 1: theta - pi/2, so that one cos gives [cos(theta); sin(theta)].
    angles = (2.0 * math.pi) * uniform[1] - tf.constant([[0.0], [0.5 * math.pi]], dtype)
    return tf.reshape(radius * tf.cos(angles), [-1])[:count]


def box_muller_fused(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """One `box_muller_normal` draw of all Nd values, split and reshaped per variable."""
    sizes = [variable.shape.num_elements() for variable in variables]
    flat = box_muller_normal(key, sum(sizes))
    return [tf.reshape(piece, variable.shape) for piece, variable in zip(tf.split(flat, sizes), variables)]


#: `box_muller_aligned` starts each variable's share at a multiple of this many values (128 bytes
#: of float32), so that splitting the draw shares its buffer instead of copying it.
ALIGNMENT = 32


def box_muller_aligned(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """`box_muller_fused` with each variable's share rounded up to `ALIGNMENT` values (no copy
    in the split) and float64 variables drawn in float64 from `fold_in(key, 1)`, the others in
    float32 (cast to their dtype); the variables' shapes must be known. The candidate for the
    samplers' draw: timed in the step by
    `benchmarks.peers` (`benchmarks/results/peers_box_muller_draw/`, docs/notes/normal_draws.md)."""
    draws = [None] * len(variables)
    for group, dtype in enumerate((tf.float32, tf.float64)):
        members = [i for i, v in enumerate(variables) if (v.dtype == tf.float64) == (dtype == tf.float64)]
        if not members:
            continue
        sizes = [variables[i].shape.num_elements() for i in members]
        shares = [-(-n // ALIGNMENT) * ALIGNMENT for n in sizes]
        group_key = key if group == 0 else tf.random.experimental.stateless_fold_in(key, group)
        flat = box_muller_normal(group_key, sum(shares), dtype)
        for i, piece, size, share in zip(members, tf.split(flat, shares), sizes, shares):
            value = tf.reshape(piece if size == share else piece[:size], variables[i].shape)
            draws[i] = value if variables[i].dtype == dtype else tf.cast(value, variables[i].dtype)
    return draws


def _split_like(flat: tf.Tensor, variables) -> list[tf.Tensor]:
    sizes = [variable.shape.num_elements() for variable in variables]
    return [tf.reshape(piece, variable.shape) for piece, variable in zip(tf.split(flat, sizes), variables)]


def inverse_cdf_fused(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """`ndtri(u)` of one uniform per value, `u` moved off 0 by half its resolution (`2^-24`)."""
    count = sum(variable.shape.num_elements() for variable in variables)
    uniform = tf.random.stateless_uniform([count], seed=key)
    return _split_like(tf.math.ndtri(uniform * (1.0 - 2.0**-24) + 2.0**-25), variables)


def philox_uniforms_only(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """The uniforms alone (not normals): what the random bits cost."""
    count = sum(variable.shape.num_elements() for variable in variables)
    return _split_like(tf.random.stateless_uniform([count], seed=key), variables)


def library_normal_like(key: tf.Tensor, variables) -> list[tf.Tensor]:
    return kt_random.normal_like(key, variables)


DRAWS = {"kernel_per_variable": kernel_per_variable, "kernel_fused": kernel_fused,
         "box_muller_fused": box_muller_fused, "box_muller_aligned": box_muller_aligned,
         "inverse_cdf_fused": inverse_cdf_fused, "philox_uniforms_only": philox_uniforms_only,
         "library_normal_like": library_normal_like}


def draw_loop(method, variables, count: int, jit_compile: bool):
    """`count` draws of `method` in one compiled call; `method=None` is the empty loop."""

    def loop(seed):
        def body(index, total):
            key = kt_random.step_key(0, index, kt_random.STREAM_MOMENTUM) + seed
            if method is None:
                return index + 1, total + tf.cast(key[0], tf.float32)
            draws = method(key, variables)
            return index + 1, total + tf.add_n([tf.reshape(draw, [-1])[0] for draw in draws])

        return tf.while_loop(lambda index, total: index < count, body,
                             (tf.constant(0), tf.constant(0.0)))[1]

    return tf.function(loop, jit_compile=jit_compile)


def time_network(network: step_cost.Network, args) -> dict:
    """SGD steps, draw loops (and samplers) of one network, interleaved over repetitions."""
    steps = step_cost.timed_steps(network, args.steps, args.steps_per_execution)
    weights = step_cost.initial_weights(network)
    dataset = step_cost.make_dataset(network)
    methods = [step_cost.SGD] + (list(SAMPLERS) if args.samplers else [])
    models = {
        method: step_cost.make_model(network, method, steps_per_execution=args.steps_per_execution,
                                     jit_compile=args.jit_compile, weights=weights)
        for method in methods
    }
    for model in models.values():  # tracing, then first-execution costs
        for _ in range(2):
            step_cost.timed_fit(model, dataset, min(steps, 2 * args.steps_per_execution))
    variables = models[step_cost.SGD].trainable_variables
    loops = {name: draw_loop(DRAWS[name], variables, args.draws, args.jit_compile) for name in DRAW_METHODS}
    loops["empty"] = draw_loop(None, variables, args.draws, args.jit_compile)
    seed = tf.constant(0, tf.int32)
    for fn in loops.values():
        float(fn(seed))
    per_step = {name: [] for name in [*methods, *DRAW_METHODS]}
    ratios = {name: [] for name in per_step if name != step_cost.SGD}
    for repeat in range(args.repeats):
        measured = {}
        for method, model in models.items():
            run = step_cost.timed_fit(model, dataset, steps)
            if run["steps_completed"] == steps:
                measured[method] = run["seconds"] / steps
        gc.collect()
        gc.disable()
        try:
            loop_seconds = {}
            names = list(loops)
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                float(loops[name](seed))
                loop_seconds[name] = (time.perf_counter() - start) / args.draws
        finally:
            gc.enable()
        for name in DRAW_METHODS:
            measured[name] = max(loop_seconds[name] - loop_seconds["empty"], 0.0)
        for name, seconds in measured.items():
            per_step[name].append(seconds)
        sgd = measured.get(step_cost.SGD)
        for name in ratios:
            value = measured.get(name)
            ratios[name].append(None if value is None or sgd is None else value / sgd)
    num_params = sum(v.shape.num_elements() for v in variables)
    return {
        "num_params": num_params,
        "timed_steps": steps,
        "median_ms_per_step": {name: None if not values else 1e3 * float(np.median(values))
                               for name, values in per_step.items()},
        "median_ratio_to_sgd": {name: step_cost._median(values) for name, values in ratios.items()},
        "per_step_seconds": per_step,
        "ratio_to_sgd": ratios,
    }


def markdown(results: dict) -> str:
    names = list(results["networks"])
    lines = [
        "Per step: ms, and in brackets the median ratio to the Keras SGD step of the same "
        f"repetition ({results['settings']['repeats']} repetitions; draws timed as "
        f"{results['settings']['draws']} per call).", "",
        "| method | " + " | ".join(f"{n} (Nd = {results['networks'][n]['num_params']})" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    rows = [step_cost.SGD, *DRAW_METHODS, *(SAMPLERS if results["settings"]["samplers"] else ())]
    for row in rows:
        cells = []
        for n in names:
            entry = results["networks"][n]
            ms = entry["median_ms_per_step"].get(row)
            ratio = entry["median_ratio_to_sgd"].get(row)
            cells.append("n/a" if ms is None else f"{ms:.3g}" + ("" if ratio is None else f" ({ratio:.2f}x)"))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/noise_draw.json")
    parser.add_argument("--networks", nargs="+", choices=sorted(step_cost.NETWORKS),
                        default=["emnist_mlp", "fashion_mnist_lstm", "cifar10_cnn"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--draws", type=int, default=200, help="draws per timed call")
    parser.add_argument("--steps", type=int, default=None, help="SGD steps per timed fit")
    parser.add_argument("--steps-per-execution", type=int, default=50)
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--samplers", action="store_true", help="also time SGLD, SGHMC, SGNHT")
    args = parser.parse_args(argv)
    results = {
        "machine": step_cost.machine_info(),
        "settings": {"repeats": args.repeats, "draws": args.draws, "steps": args.steps,
                     "steps_per_execution": args.steps_per_execution, "jit_compile": args.jit_compile,
                     "samplers": args.samplers},
        "networks": {},
    }
    for name in args.networks:
        print(f"{name}: timing", flush=True)
        results["networks"][name] = time_network(step_cost.NETWORKS[name], args)
        keras.backend.clear_session()
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    step_cost.write_json(args.out, results)
    table = markdown(results)
    pathlib.Path(args.out).with_suffix(".md").write_text(table)
    print(table)
    return results


if __name__ == "__main__":
    main()
