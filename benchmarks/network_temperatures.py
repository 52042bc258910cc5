"""Does each sampler sample a network at its temperature? Kinetic and configurational
temperatures, overall and per variable, on three small nets of scikit-learn's 8x8 digits.

Nets (all 1797 digits, batch 64, 29 steps an epoch, Gaussian prior std 1, minibatches drawn
with replacement):

- `mlp`: 64-50-10 MLP (the demo's net);
- `conv`: Conv2D(16, 3x3) on the 8x8 image, flattened into Dense(10);
- `lstm`: the image as 16 tokens (2x2 block sums, 17 levels), Embedding(17, 8), LSTM(16), Dense(10).

For every (net, sampler, T) an `EquilibrationCheck` (strict: `rtol=0`, 99% familywise) reports
the post-burn-in means with batch-means errors and the MSER burn-in it found. The samplers' step
sizes are the ones listed in `SAMPLERS`; their epochs in `EPOCHS`.

    python -m benchmarks.network_temperatures --out benchmarks/results/network_temperatures.json \
        [--nets mlp conv lstm] [--samplers sgnht ...] [--temperatures 1 0.3] [--epoch-scale 1] \
        [--step-size H] [--warm-up-epochs E]
    python -m benchmarks.network_temperatures --summarize benchmarks/results/network_temperatures_*.json

The JSON is rewritten after every run, so a long sweep can be read while it goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import keras
import numpy as np

import keras_thermo as kt

BATCH_SIZE = 64
BLOCK_STEPS = 145  # 5 epochs
PRIOR_STD = 1.0

# The papers' single thermostat (`per_variable_thermostat=False`) and mCCAdL's minibatch C step:
# the committed results and the slow tests' tolerances were measured with them.
ONE_XI = {"per_variable_thermostat": False}
SAMPLERS = {
    "sgld": lambda: kt.samplers.SGLD(step_size=1e-5),
    "sgnht": lambda: kt.samplers.SGNHT(step_size=2e-3, friction=1.0, **ONE_XI),
    "sgnht-symmetric": lambda: kt.samplers.SGNHT(step_size=2e-3, friction=1.0, integrator="symmetric", **ONE_XI),
    "ccadl": lambda: kt.samplers.CCAdL(step_size=2e-3, friction=1.0, **ONE_XI),
    "mccadl": lambda: kt.samplers.MCCAdL(step_size=2e-3, friction=1.0, covariance="minibatch", **ONE_XI),  # the paper's C step
    # eta = h^2 and c = A h with h = 2e-3, A = 1 (the units of tact_hmc.py).
    "tact_hmc": lambda: kt.samplers.TACTHMC(step_size=4e-6, xi_step_size=1e-7, noise=2e-3, sample_every=10),
    # A deliberately wrong run for the check to flag: no noise correction, large step.
    "sghmc-large-step": lambda: kt.samplers.SGHMC(step_size=1e-2, friction=1.0),
}
EPOCHS = {"sgld": 150, "sgnht": 150, "sgnht-symmetric": 150, "ccadl": 150, "mccadl": 300, "tact_hmc": 300,
          "sghmc-large-step": 100}


def digits():
    from sklearn.datasets import load_digits  # noqa: PLC0415 (the data ship with scikit-learn)

    data = load_digits()
    return data.images.astype(np.float32), data.target.astype(np.int32)


def tokens(images: np.ndarray) -> np.ndarray:
    """16 tokens per image: 2x2 block sums of the 0..16 pixels, in 17 levels."""
    blocks = images.reshape(-1, 4, 2, 4, 2).sum(axis=(2, 4))
    return np.round(blocks.reshape(-1, 16) / 4.0).astype(np.int32)


def build(net: str, seed: int = 0):
    """`(keras model, inputs)` for a net name."""
    keras.backend.clear_session()  # layer names restart, so variables read the same in every run
    keras.utils.set_random_seed(seed)
    images, labels = digits()
    if net == "mlp":
        inputs = images.reshape(-1, 64) / 16.0
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(50, activation="relu"), keras.layers.Dense(10)])
    elif net == "conv":
        inputs = images[..., None] / 16.0
        model = keras.Sequential([
            keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(), keras.layers.Dense(10),
        ])
    elif net == "lstm":
        inputs = tokens(images)
        model = keras.Sequential([
            keras.Input((16,), dtype="int32"), keras.layers.Embedding(17, 8),
            keras.layers.LSTM(16, unroll=True), keras.layers.Dense(10),
        ])
    else:
        raise ValueError(f"`net` must be one of 'mlp', 'conv', 'lstm', got {net!r}.")
    return model, inputs, labels


WARM_UP_SAMPLER = lambda: kt.samplers.SGNHT(step_size=2e-3, friction=1.0, **ONE_XI)  # noqa: E731
_warm_weights: dict = {}


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def warm_up(net: str, temperature: float, epochs: int, seed: int = 0) -> list:
    """Weights after `epochs` of SGNHT (h = 2e-3, A = 1) at `temperature` from the net's
    initialisation; cached per process, so every sampler of a sweep starts from the same state."""
    key = (net, temperature, epochs, seed)
    if key not in _warm_weights:
        model_net, x, y = build(net, seed)
        if epochs:
            model = kt.BayesianModel(
                model_net, sampler=WARM_UP_SAMPLER(), num_examples=len(x), prior=kt.priors.Gaussian(PRIOR_STD),
                temperature=temperature, seed=seed + 1000,
            )
            model.compile(loss=_loss(), steps_per_execution=29)
            model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, verbose=0)
        _warm_weights[key] = [w.copy() for w in model_net.get_weights()]
    return _warm_weights[key]


def run(net: str, sampler: str, temperature: float, *, epochs: int | None = None, seed: int = 0,
        check_temperature: float | None = None, step_size: float | None = None,
        warm_up_epochs: int = 0, min_variable_size: int = 100, rtol: float = 0.0) -> dict:
    """One run from the warm-up state (`warm_up`); returns the check's report with the settings
    and the wall time. `step_size` overrides the sampler's."""
    weights = warm_up(net, temperature, warm_up_epochs, seed)
    model_net, x, y = build(net, seed)
    model_net.set_weights(weights)
    chosen = SAMPLERS[sampler]()
    if step_size is not None:
        chosen.step_size = step_size
    model = kt.BayesianModel(
        model_net, sampler=chosen, num_examples=len(x), prior=kt.priors.Gaussian(PRIOR_STD),
        temperature=temperature, seed=seed,
    )
    model.compile(loss=_loss(), steps_per_execution=29)
    check = kt.callbacks.EquilibrationCheck(
        block_steps=BLOCK_STEPS, min_blocks=10, rtol=rtol, warn=False, temperature=check_temperature,
        min_variable_size=min_variable_size,
    )
    epochs = epochs or EPOCHS[sampler]
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, callbacks=[check], verbose=0)
    report = check.report()
    report.update(
        net=net, sampler=sampler, sampler_config=model.sampler.get_config(), epochs=epochs,
        warm_up_epochs=warm_up_epochs, steps=model.sampler_step, seconds=time.perf_counter() - start,
        num_params=model.num_params,
    )
    return report


def summary_line(report: dict) -> str:
    overall = report["overall"]
    worst = max(
        (abs(v[kind]["mean"] - report["temperature"]) / report["temperature"], v["name"], kind)
        for v in report["variables"] if v["size"] >= 100 for kind in ("kinetic", "configurational")
    )
    return (
        f"{report['net']:5s} {report['sampler']:16s} T={report['temperature']:<4g} "
        f"kin {overall['kinetic']['mean']:.3f}+-{overall['kinetic']['standard_error']:.3f} "
        f"conf {overall['configurational']['mean']:.3f}+-{overall['configurational']['standard_error']:.3f} "
        f"worst var {worst[2][:4]} {worst[1]} {100 * worst[0]:+.1f}% "
        f"equilibrated={report['equilibrated']} burn-in {report['equilibration_step']} "
        f"({report['seconds']:.0f} s)"
    )


def markdown(paths: list[str]) -> str:
    """A table of the runs recorded in the given JSON files: whole-net temperatures and the
    variable (>= 100 scalars) whose configurational mean is furthest from T."""
    lines = [
        "| net | sampler | T | h | warm-up | steps | kinetic (net) | configurational (net) | furthest variable: kinetic, configurational | equilibrated | burn-in (MSER) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for path in paths:
        with open(path) as handle:
            runs = json.load(handle)["runs"]
        for r in runs:
            t = r["temperature"]
            big = [v for v in r["variables"] if v["size"] >= 100]
            worst = max(big, key=lambda v: abs(v["configurational"]["mean"] - t))
            o = r["overall"]
            h = r["sampler_config"]["step_size"]
            lines.append(
                f"| {r['net']} | {r['sampler']} | {t:.3g} | {h:.3g} | {r.get('warm_up_epochs', 0)} | {r['steps']} | "
                f"{o['kinetic']['mean']:.3f} +- {o['kinetic']['standard_error']:.3f} | "
                f"{o['configurational']['mean']:.3f} +- {o['configurational']['standard_error']:.3f} | "
                f"{worst['name'].split('/', 1)[-1]}: {worst['kinetic']['mean']:.3f}, "
                f"{worst['configurational']['mean']:.3f} +- {worst['configurational']['standard_error']:.3f} | "
                f"{r['equilibrated']} | {r['equilibration_step']} |"
            )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/network_temperatures.json")
    parser.add_argument("--nets", nargs="+", default=["mlp", "conv", "lstm"])
    parser.add_argument("--samplers", nargs="+", default=[s for s in SAMPLERS if s != "sghmc-large-step"])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.3])
    parser.add_argument("--epoch-scale", type=float, default=1.0, help="multiplies every run's epochs")
    parser.add_argument("--step-size", type=float, default=None, help="overrides the samplers' step size")
    parser.add_argument("--warm-up-epochs", type=int, default=0,
                        help="epochs of SGNHT (h 2e-3, A 1) every run starts from")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="print a table of recorded runs and exit")
    args = parser.parse_args(argv)
    if args.summarize:
        print(markdown(args.summarize))
        return []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    reports = []
    for temperature in args.temperatures:
        for net in args.nets:
            for sampler in args.samplers:
                epochs = max(1, round(EPOCHS[sampler] * args.epoch_scale))
                report = run(net, sampler, temperature, epochs=epochs, step_size=args.step_size,
                             warm_up_epochs=args.warm_up_epochs)
                print(summary_line(report), flush=True)
                reports.append(report)
                with open(args.out, "w") as handle:
                    json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
                               "command": "python -m benchmarks.network_temperatures " + " ".join(argv or sys.argv[1:]),
                               "runs": reports},
                              handle, indent=1)
    return reports


if __name__ == "__main__":
    main()
