"""Per-step overhead of the samplers on a two-parameter model, against plain Keras SGD.

Small models must not drown in per-step overhead: this times 10^5 steps of `Dense(1)` on one
feature with `steps_per_execution`, for each sampler and for `keras.optimizers.SGD` on the same
net and data, in interleaved repetitions, and writes the medians and their ratios as JSON.

    python -m benchmarks.overhead --out runs/overhead [--steps 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import keras
import numpy as np
import tensorflow as tf

import keras_thermo as kt

SAMPLERS = {
    "sgld": lambda: kt.samplers.SGLD(1e-4),
    "sghmc": lambda: kt.samplers.SGHMC(1e-3),
    "sgnht": lambda: kt.samplers.SGNHT(1e-3),
    "sgnht_symmetric": lambda: kt.samplers.SGNHT(1e-3, integrator="symmetric"),
}


def _data(batch_size: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 1)).astype("float32")
    y = (2.0 * x + rng.normal(size=(1000, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000, seed=0).repeat().batch(batch_size)


def _net():
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])


def _make(name: str, steps_per_execution: int):
    if name == "keras_sgd":
        model = _net()
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse", steps_per_execution=steps_per_execution)
        return model
    model = kt.BayesianModel(_net(), SAMPLERS[name](), num_examples=1000, seed=0)
    model.compile(loss="mse", steps_per_execution=steps_per_execution)
    return model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/overhead")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--steps-per-execution", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    spe = args.steps_per_execution
    data = _data(32)
    names = ["keras_sgd", *SAMPLERS]
    models = {}
    for name in names:  # warm up: build and compile outside the timed region
        models[name] = _make(name, spe)
        models[name].fit(data, steps_per_epoch=spe, epochs=1, verbose=0)
    seconds = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:  # interleaved, so machine load affects all alike
            start = time.perf_counter()
            models[name].fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0)
            seconds[name].append(time.perf_counter() - start)
    median = {name: float(np.median(v)) for name, v in seconds.items()}
    results = {
        "steps": args.steps,
        "steps_per_execution": spe,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "seconds": seconds,
        "median_seconds": median,
        "microseconds_per_step": {k: 1e6 * v / args.steps for k, v in median.items()},
        "ratio_to_keras_sgd": {k: v / median["keras_sgd"] for k, v in median.items()},
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    for name in names:
        print(f"{name:16s} {median[name]:7.2f} s for {args.steps} steps "
              f"({results['microseconds_per_step'][name]:6.1f} us/step, "
              f"{results['ratio_to_keras_sgd'][name]:.2f}x SGD)")
    return results


if __name__ == "__main__":
    main()
