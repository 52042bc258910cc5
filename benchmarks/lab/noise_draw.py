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
    (`box_muller_normal`);
  - `box_muller_aligned`: `box_muller_fused` with each variable's share starting at a multiple
    of 32 values, so that the split copies nothing: the samplers' draw, `normal_like`;
  - `inverse_cdf_fused`: one Philox uniform draw on the open interval, `tf.math.ndtri` of each
    (one normal per uniform), split per variable (measured, not adopted);
  - `philox_uniforms_only`: the Philox uniforms of `kernel_fused` alone, not normals: a lower
    bound on any exact draw built on these random bits;
  - `library_normal_like`: `keras_thermo.random.normal_like`, whatever the installed version
    does (the recorded noise_draw.json ran while it was `box_muller_fused`; now it is
    `box_muller_aligned`);
* with `--samplers`, SGLD, SGHMC and SGNHT through `fit` (their whole step).

Each is reported in ms per step and as the median over repetitions of its ratio to the SGD step
of the same repetition.

    python -m benchmarks.lab.noise_draw --out benchmarks/results/noise_draw.json [--networks emnist_mlp]
        [--repeats 7] [--draws 200] [--samplers]
"""

from __future__ import annotations

import argparse
import gc
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


#: One `stateless_normal` per variable, keyed by `fold_in(key, index)`: the samplers' draw before
#: the fused one.
kernel_per_variable = kt_random.kernel_normal_like


def kernel_fused(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """One `stateless_normal` of all Nd values, split and reshaped per variable."""
    sizes = [variable.shape.num_elements() for variable in variables]
    flat = tf.random.stateless_normal([sum(sizes)], seed=key)
    return [tf.reshape(piece, variable.shape) for piece, variable in zip(tf.split(flat, sizes), variables)]


box_muller_normal = kt_random.box_muller_normal


def box_muller_fused(key: tf.Tensor, variables) -> list[tf.Tensor]:
    """One `box_muller_normal` draw of all Nd values, split and reshaped per variable."""
    sizes = [variable.shape.num_elements() for variable in variables]
    flat = box_muller_normal(key, sum(sizes))
    return [tf.reshape(piece, variable.shape) for piece, variable in zip(tf.split(flat, sizes), variables)]


ALIGNMENT = kt_random.ALIGNMENT
#: `box_muller_fused` with each variable's share starting at a multiple of `ALIGNMENT` values (no
#: copy in the split), float64 variables drawn apart: the samplers' draw, `normal_like`.
box_muller_aligned = kt_random.normal_like


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
