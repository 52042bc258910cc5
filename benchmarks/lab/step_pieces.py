"""What the cheap samplers' step adds to SGD's, piece by piece, on a benchmark network.

SGLD, SGHMC and SGNHT take the gradient as SGD does, then per step: draw Nd standard normals,
update weights (and momenta) elementwise, check that everything is finite before assigning, and
log the kinetic and configurational temperatures. For the trainable variables of a network of
`benchmarks.step_cost` this times each piece as `--loop` iterations of a `tf.while_loop` inside
one `tf.function` (every iteration on fresh inputs, so nothing is hoisted out of the loop), less
the same loop doing only the input perturbation, interleaved over `--repeats` rounds (median ms
per step), next to the Keras SGD step (`fit`, median per step) of the same rounds:

* `noise_draw`: `keras_thermo.random.normal_like` of the variables (what every noisy sampler
  draws per step; SGNHT's symmetric integrator and TACT-HMC draw twice);
* `finite_check_boolean`: `reduce_all(is_finite(t))` per tensor, the check before;
* `finite_check_sum`: `keras_thermo.model.all_finite`, the check now (a plain sum per tensor
  since the step's pass cuts; the committed `step_pieces.json` timed its earlier `sum(0 * t)`);
* `configurational_temperature_float64_products`: `-theta . F / Nd` with both factors cast to
  float64 (the log before);
* `configurational_temperature_float64_sums`: float32 products, each cast to float64 and summed
  (the log before the row sums);
* `configurational_temperature`: `keras_thermo.model.configurational_temperature` (now: float32
  products summed along the last axis in float32, the rows in float64);
* `kinetic_energy`: `p . p` in float32 (the kinetic temperature and the thermostat's input);
* `guarded_assign_select`: one `tf.where(ok, new, old)` per variable, as the NaN guard applied
  it before (now only under a distribution strategy; one replica assigns under `tf.cond`).

The tensors checked are the weights and one momentum-sized tensor (SGHMC, SGNHT: weights and
momenta).

    python -m benchmarks.lab.step_pieces --out benchmarks/results/step_pieces.json [--networks emnist_mlp]
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import step_cost
from keras_thermo import random as kt_random
from keras_thermo.model import all_finite, configurational_temperature

PIECES = ("noise_draw", "finite_check_boolean", "finite_check_sum", "configurational_temperature_float64_products",
          "configurational_temperature_float64_sums", "configurational_temperature", "kinetic_energy", "guarded_assign_select")


def piece_functions(weights: list[np.ndarray]) -> dict:
    """`name -> fn(i)` of each piece on tensors shaped like `weights`, perturbed by the step `i`."""
    rng = np.random.default_rng(1)
    params = [tf.constant(w) for w in weights]
    force = [tf.constant(rng.standard_normal(w.shape).astype("float32")) for w in weights]

    def moved(i):
        return [t + tf.cast(i, tf.float32) for t in params]

    def first(tensors):
        return tf.add_n([tf.reshape(t, [-1])[0] for t in tensors])

    def boolean_check(i):
        tensors = moved(i) + force
        return tf.cast(tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]), tf.float32)

    def float64_products(i):
        total = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float64) * tf.cast(f, tf.float64)) for t, f in zip(moved(i), force)])
        return tf.cast(-total, tf.float32)

    def float64_sums(i):
        total = tf.add_n([tf.reduce_sum(tf.cast(t * f, tf.float64)) for t, f in zip(moved(i), force)])
        return tf.cast(-total, tf.float32)

    def select(i):
        ok = tf.cast(i, tf.float32) > -1.0
        return first([tf.where(ok, new, old) for new, old in zip(moved(i), force)])

    return {
        "baseline": lambda i: first(moved(i)),
        "noise_draw": lambda i: first(kt_random.normal_like(kt_random.step_key(0, i, kt_random.STREAM_MOMENTUM),
                                                            params)) + first(moved(i)),
        "finite_check_boolean": boolean_check,
        "finite_check_sum": lambda i: tf.cast(all_finite(moved(i) + force), tf.float32),
        "configurational_temperature_float64_products": float64_products,
        "configurational_temperature_float64_sums": float64_sums,
        "configurational_temperature": lambda i: configurational_temperature(moved(i), force),
        "kinetic_energy": lambda i: tf.add_n([tf.reduce_sum(tf.square(t)) for t in moved(i)]),
        "guarded_assign_select": select,
    }


def looped(fn, count: int):
    def run():
        def body(i, total):
            return i + 1, total + tf.cast(fn(i), tf.float32)

        return tf.while_loop(lambda i, total: i < count, body, (tf.constant(0), tf.constant(0.0)))[1]

    return tf.function(run)


def time_network(network: step_cost.Network, args) -> dict:
    weights = step_cost.initial_weights(network)
    dataset = step_cost.make_dataset(network)
    sgd = step_cost.make_model(network, step_cost.SGD, steps_per_execution=args.steps_per_execution,
                               jit_compile=False, weights=weights)
    steps = step_cost.timed_steps(network, None, args.steps_per_execution)
    for _ in range(2):
        step_cost.timed_fit(sgd, dataset, steps)
    loops = {name: looped(fn, args.loop) for name, fn in piece_functions(weights).items()}
    for fn in loops.values():
        fn().numpy()
    seconds = {name: [] for name in [step_cost.SGD, *PIECES]}
    for repeat in range(args.repeats):
        run = step_cost.timed_fit(sgd, dataset, steps)
        seconds[step_cost.SGD].append(run["seconds"] / steps)
        names = list(loops)
        names = names[repeat % len(names):] + names[:repeat % len(names)]
        measured = {}
        gc.collect()
        gc.disable()
        try:
            for name in names:
                start = time.perf_counter()
                loops[name]().numpy()
                measured[name] = (time.perf_counter() - start) / args.loop
        finally:
            gc.enable()
        for name in PIECES:
            seconds[name].append(max(measured[name] - measured["baseline"], 0.0))
    sgd_ms = 1e3 * float(np.median(seconds[step_cost.SGD]))
    ms = {name: 1e3 * float(np.median(values)) for name, values in seconds.items()}
    return {"num_params": int(sum(w.size for w in weights)), "median_ms_per_step": ms,
            "fraction_of_sgd_step": {name: ms[name] / sgd_ms for name in PIECES},
            "per_step_seconds": seconds}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/step_pieces.json")
    parser.add_argument("--networks", nargs="+", choices=sorted(step_cost.NETWORKS), default=["emnist_mlp"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--loop", type=int, default=100, help="iterations per timed call")
    parser.add_argument("--steps-per-execution", type=int, default=50)
    args = parser.parse_args(argv)
    results = {"machine": step_cost.machine_info(),
               "settings": {"repeats": args.repeats, "loop": args.loop,
                            "steps_per_execution": args.steps_per_execution},
               "networks": {}}
    for name in args.networks:
        results["networks"][name] = time_network(step_cost.NETWORKS[name], args)
        entry = results["networks"][name]
        print(f"{name} (Nd = {entry['num_params']}): " + ", ".join(
            f"{piece} {ms:.3g} ms" for piece, ms in entry["median_ms_per_step"].items()), flush=True)
        keras.backend.clear_session()
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    step_cost.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
