"""How much one minibatch's largest curvature varies: the figure the automatic step size reads.

`step_size="auto"` measures the largest eigenvalue `lambda` of the minibatch potential's Hessian
(`keras_thermo.samplers.auto_step.largest_curvature`, on the step's own minibatch) at a few steps
of its adaptation window and, from the window's middle on, keeps the largest. This measures, at
points of a default chain on the digits MLP, the spread of that figure over many minibatches at
the same weights, next to the full batch's: how much the frozen step depends on which
minibatches the window happened to measure, and what a mean or a quantile of the spread would
choose instead.

Per problem, sampler and seed: a freshly built `models.digits_mlp(50)` (Keras' default
initialisation) sampled at the defaults (`step_size="auto"`, `friction=None`, the default
warm-up, prior N(0, 1), T = 1, batch 64), stopped at the first epoch end past each of
`--at-steps`; there, `--minibatches` minibatches of 64 drawn with replacement from the training
set (their own generator, fixed by the seed) and the full training set are measured with the
library's power iteration through the model's own force. Problems: `digits` (10 classes, the
1,346 training digits) and `digits_ood` (the OOD study's digits 0-4, 675 images, 5 outputs).

    python -m benchmarks.lab.curvature_spread --out benchmarks/results/curvature_spread.json \
        [--problems digits digits_ood] [--samplers sgnht mccadl] [--seeds 0] \
        [--at-steps 250 500 1000] [--minibatches 30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import networks
from keras_thermo.data.digits import digits_arrays
from keras_thermo.samplers import auto_step

PROBLEMS = {"digits": None, "digits_ood": (0, 1, 2, 3, 4)}
BATCH_SIZE = 64
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def build(problem: str, sampler: str, seed: int):
    classes = PROBLEMS[problem]
    x, y = digits_arrays("train", classes=classes)
    keras.utils.set_random_seed(seed)
    net = networks.digits_mlp(50, num_classes=10 if classes is None else len(classes))
    model = kt.BayesianModel(net, kt.samplers.get(sampler), num_examples=len(x), prior=kt.priors.Gaussian(1.0),
                             seed=seed, temperature_check=False)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=1)
    return model, x, y


def curvature_on(model, x, y, seed: int, step: int) -> float:
    """The library's largest-curvature figure for `(x, y)` at the model's current weights."""
    params = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    batch = (tf.constant(x), tf.constant(y), None)
    return float(auto_step.largest_curvature(lambda theta: model._force_at(theta, batch), params, 1.0, seed=seed,
                                             step=tf.constant(step, tf.int64)))


def run(problem: str, sampler: str, seed: int, at_steps: list[int], minibatches: int) -> dict:
    model, x, y = build(problem, sampler, seed)
    rng = np.random.default_rng(10_000 + seed)
    steps_per_epoch = int(np.ceil(len(x) / BATCH_SIZE))
    points = []
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)  # builds the sampler state
    for target in at_steps:
        while int(model.sampler_step) < target:
            model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
        step = int(model.sampler_step)
        values = []
        for k in range(minibatches):
            rows = rng.integers(0, len(x), BATCH_SIZE)
            values.append(curvature_on(model, x[rows], y[rows], seed=k, step=step))
        values = np.array(values)
        full = curvature_on(model, x, y, seed=0, step=step)
        quantiles = {f"q{round(100 * q)}": float(np.quantile(values, q)) for q in QUANTILES}
        points.append({
            "step": step,
            "step_size": float(model.sampler.step_size),
            "curvature_variable": float(model._curvature_variable.numpy()),
            "minibatch_curvatures": values.tolist(),
            "quantiles": quantiles,
            "geometric_mean": float(np.exp(np.mean(np.log(values)))),
            "full_batch": full,
            "max_over_min": float(values.max() / values.min()),
        })
        print(f"{problem} {sampler} seed {seed} step {step}: minibatch lambda "
              + ", ".join(f"{k} {v:.4g}" for k, v in quantiles.items())
              + f"; geometric mean {points[-1]['geometric_mean']:.4g}; full batch {full:.4g}; "
              f"step size {points[-1]['step_size']:.4g} (lambda {points[-1]['curvature_variable']:.4g})", flush=True)
    return {"problem": problem, "sampler": sampler, "seed": seed, "num_examples": len(x),
            "steps_per_epoch": steps_per_epoch, "points": points}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS), default=list(PROBLEMS))
    parser.add_argument("--samplers", nargs="+", default=["sgnht", "mccadl"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--at-steps", type=int, nargs="+", default=[250, 500, 1000])
    parser.add_argument("--minibatches", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.minibatches < 2:
        parser.error(f"--minibatches must be at least 2, got {args.minibatches}")
    if min(args.at_steps) < 1:
        parser.error(f"--at-steps must be positive step counts, got {args.at_steps}")
    runs = []
    for problem in args.problems:
        for sampler in args.samplers:
            for seed in args.seeds:
                runs.append(run(problem, sampler, seed, sorted(args.at_steps), args.minibatches))
                if args.out:
                    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
                    with open(args.out, "w") as handle:
                        json.dump({"command": "python -m benchmarks.lab.curvature_spread "
                                   + " ".join(sys.argv[1:] if argv is None else argv),
                                   "platform": platform.platform(), "batch_size": BATCH_SIZE,
                                   "power_iterations": auto_step.POWER_ITERATIONS,
                                   "stability_fraction": auto_step.STABILITY_FRACTION, "runs": runs}, handle, indent=1)
    return runs


if __name__ == "__main__":
    main()
