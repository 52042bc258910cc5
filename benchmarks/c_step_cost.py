"""Cost of mCCAdL's C step (Taylor vs Gram) as a fraction of the whole sampler step, on an MLP.

The whole step is timed through `BayesianModel.fit` (forward and backward pass, per-example
gradients, the sampler update) with `steps_per_execution`, on scikit-learn's digits with
`keras_thermo.models.digits_mlp` (Nd = 3760) and batches of 128, for `MCCAdL(expm=...)` with each
method and, for reference, `SGNHT(integrator="symmetric")` (the same splitting without the C step
and without per-example gradients). The C step alone is timed as a loop of `covariance_step`
calls inside one `tf.function` (compiled like the train step), on a real per-example gradient
matrix of the same model and batch, with the `tau` of the configured step size. Medians of interleaved repeats.

    python -m benchmarks.c_step_cost --out runs/c_step_cost [--step-size 1e-3] [--repeats 5]
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
from keras_thermo import data as kt_data
from keras_thermo import grads as kt_grads
from keras_thermo import models as kt_models
from keras_thermo.samplers.mccadl import MCCAdL, covariance_step


def _model(sampler, num_examples, steps_per_execution):
    keras.utils.set_random_seed(0)
    model = kt.BayesianModel(
        kt_models.digits_mlp(50), sampler, num_examples=num_examples, prior=kt.priors.Gaussian(1.0), seed=0
    )
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/c_step_cost")
    parser.add_argument("--step-size", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    x, y = kt_data.digits_arrays("train")
    batch = args.batch_size
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(batch, drop_remainder=True)
    spe = 50
    samplers = {
        "mccadl_taylor": MCCAdL(args.step_size, expm="taylor"),
        "mccadl_gram": MCCAdL(args.step_size, expm="gram"),
        "mccadl_auto": MCCAdL(args.step_size, expm="auto"),
        "sgnht_symmetric": kt.samplers.SGNHT(args.step_size, integrator="symmetric"),
    }
    models = {}
    for name, sampler in samplers.items():  # build and compile outside the timed region
        models[name] = _model(sampler, len(x), spe)
        models[name].fit(dataset, steps_per_epoch=spe, epochs=1, verbose=0)

    # The C step alone, on a real Gc of this model and batch.
    xb, yb = next(iter(dataset))
    net = models["mccadl_taylor"].net
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    centered = kt_grads.centered(kt_grads.per_example_gradients(net, loss, xb, yb))
    n = float(batch)
    tau = args.step_size * (args.step_size / 2) * len(x) ** 2 / (n * (n - 1))
    momentum = [tf.random.normal(v.shape) for v in net.trainable_variables]
    jit = bool(models["mccadl_taylor"].jit_compile)

    def c_step_loop(method):
        # `steps` C steps in one call, each on the previous result (nothing to hoist), compiled
        # like the model's train step, so per-call overhead does not count.
        def loop(p, g):
            def body(i, p):
                return i + 1, covariance_step(p, g, tau, method)[0]
            return tf.while_loop(lambda i, p: i < args.steps, body, (tf.constant(0), p))[1]
        return tf.function(loop, jit_compile=jit)

    c_steps = {}
    for method in ("taylor", "gram"):
        c_steps[method] = c_step_loop(method)
        c_steps[method](momentum, centered)
    _, taylor_matvecs, _ = covariance_step(momentum, centered, tau, "taylor")

    step_seconds = {name: [] for name in samplers}
    c_seconds = {m: [] for m in c_steps}
    for _ in range(args.repeats):
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0)
            step_seconds[name].append((time.perf_counter() - start) / args.steps)
        for method, fn in c_steps.items():
            start = time.perf_counter()
            result = fn(momentum, centered)
            float(tf.reduce_sum(result[0]))  # wait for the result
            c_seconds[method].append((time.perf_counter() - start) / args.steps)
    step_ms = {k: 1e3 * float(np.median(v)) for k, v in step_seconds.items()}
    c_ms = {k: 1e3 * float(np.median(v)) for k, v in c_seconds.items()}
    results = {
        "model": "digits_mlp(50)",
        "num_params": int(models["mccadl_taylor"].num_params),
        "batch_size": batch,
        "step_size": args.step_size,
        "tau_times_frobenius_norm_sq": float(tau * tf.reduce_sum(tf.square(centered))),
        "taylor_matvecs": int(taylor_matvecs),
        "train_step_jit_compile": jit,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "step_ms": step_ms,
        "c_step_ms": c_ms,
        "c_step_fraction_of_mccadl_step": {
            "taylor": c_ms["taylor"] / step_ms["mccadl_taylor"],
            "gram": c_ms["gram"] / step_ms["mccadl_gram"],
        },
        "mccadl_over_sgnht_symmetric": {
            k: step_ms[k] / step_ms["sgnht_symmetric"] for k in ("mccadl_taylor", "mccadl_gram", "mccadl_auto")
        },
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
