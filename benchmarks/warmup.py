"""From Keras' default initialisation to T: how many steps each sampler needs, with and without
the thermostat samplers' warm-up.

Every run starts a freshly built Keras net (Keras' default initialisation, drawn from the seed)
and runs one chain at T = 1 with minibatches drawn with replacement. The thermostat samplers
(SGNHT, CCAdL, mCCAdL) run twice: BEFORE, with `warmup_steps=0` (the papers' algorithms from the
first step), and AFTER, with the default warm-up (`warmup_steps` left at its default). SGLD and
SGHMC, which have no thermostat and no warm-up, run once as references.

Networks (`NETWORKS`; one step size h per network, friction A = 1 for every momentum sampler,
SGLD at eps = 2 h^2, the same force step per update as SGHMC's `lr = h^2 N`):

- `linear`: Bayesian linear regression, N = 2000, d = 5 Gaussian features, batch 1000,
  `GaussianNLL(scale=1)`, prior N(0, 10 I), h = 1e-3 (`keras_thermo.testing`'s problem);
- `digits_mlp`: `models.digits_mlp(50)` (64-50-10) on the 1,346 training digits
  (`data.digits_arrays`), batch 64, prior N(0, I), h = 1e-3;
- `digits_conv`: Conv2D(16, 3x3) ReLU, Flatten, Dense(10) on the same digits as 8x8x1 images,
  batch 64, prior N(0, I), h = 1e-3;
- `lstm`: `models.fashion_mnist_lstm()` (89,290 weights) on 256 mock 28x28 images (uniform
  pixels, uniform labels), batch 16, prior N(0, I), h = 1e-3.

"At T" (`DEFINITION`): the default temperature check (`equilibration.default_check()`: blocks of
100 steps, MSER burn-in, batch-means band `max(z se, 0.05 T)` at 99% familywise) runs alongside
every fit, and its report is read at every block boundary (`VerdictTrace`). `steps_to_T` is the
first block boundary at which that report, on the blocks seen so far, finds the whole net's
kinetic and configurational temperatures in band with a burn-in that ends after the warm-up (the
check's rule that warm-up steps never count: its report lets them count while fewer than 3 blocks
follow the warm-up, which its `equilibrated_at_step` then takes at face value). It needs 10 blocks
after the burn-in, so it is never below 1000 steps (2000 after a 1000-step warm-up). None means
"not reached within the run's steps". Each run also reports the check's final verdict (every variable
of >= 100 weights too) and its MSER burn-in, whether fit warned that the run is not at T, and the
mean kinetic and configurational temperature over the last half of the run (batch-means errors).

    python -m benchmarks.warmup --out benchmarks/results/warmup/warmup.json \
        [--networks linear digits_mlp digits_conv lstm] [--samplers sgnht ccadl mccadl sgld sghmc] \
        [--seeds 0] [--steps S]
    python -m benchmarks.warmup --summarize benchmarks/results/warmup/warmup.json

`--steps` overrides every network's step count. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import keras
import numpy as np

import keras_thermo as kt
from benchmarks.step_cost import write_json
from keras_thermo import testing

TEMPERATURE = 1.0
FRICTION = 1.0
STEPS_PER_EXECUTION = 100  # one block of the default check
THERMOSTATS = ("sgnht", "ccadl", "mccadl")
REFERENCES = ("sgld", "sghmc")
NOT_AT_T = "is not sampling at its temperature"  # the default check's warning

DEFINITION = (
    "steps_to_T: the first block boundary (blocks of 100 steps) at which the report of the default "
    "temperature check (keras_thermo.equilibration.default_check(): MSER burn-in on the block means, "
    "then the whole net's mean kinetic and configurational temperature within max(z * batch-means "
    "standard error, 0.05 T) of T, z for 99% familywise confidence, at least 10 blocks after the "
    "burn-in), on the steps seen so far, finds the whole net at T with a burn-in that ends at or "
    "after the end of the sampler's warm-up; counted from Keras' default initialisation, warm-up "
    "steps included; null: not reached within the run's steps. check_equilibrated_at_step: the "
    "check's own equilibrated_at_step (where a linked PosteriorAverage starts). final_equilibrated: the same check's verdict at the end of the run, every "
    "variable of >= 100 weights included; final_burn_in_step: its MSER burn-in then. last_half: "
    "mean temperatures over the second half of the run, with batch-means standard errors."
)


@dataclass(frozen=True)
class Network:
    """A benchmark problem: `build(seed) -> (net, x, y, loss)`, net freshly initialised."""

    build: Callable
    step_size: float
    batch_size: int
    prior_std: float
    steps: int
    steps_per_epoch: int
    description: str


def _linear(seed: int):
    x, y = testing.linear_regression_data(2000, 5, seed=0)
    keras.utils.set_random_seed(seed)
    return testing.linear_regression_net(5), x, y, kt.losses.GaussianNLL(scale=1.0)


def _classification_loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _digits_mlp(seed: int):
    x, y = kt.data.digits_arrays("train")
    keras.utils.set_random_seed(seed)
    return kt.models.digits_mlp(hidden=50), x, y, _classification_loss()


def _digits_conv(seed: int):
    x, y = kt.data.digits_arrays("train", flatten=False)
    keras.utils.set_random_seed(seed)
    net = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Flatten(), keras.layers.Dense(10)],
        name="digits_conv",
    )
    return net, x, y, _classification_loss()


def _lstm(seed: int):
    rng = np.random.default_rng(1000 + seed)
    x = rng.uniform(size=(256, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=256)
    keras.utils.set_random_seed(seed)
    return kt.models.fashion_mnist_lstm(), x, y, _classification_loss()


NETWORKS = {
    "linear": Network(_linear, 1e-3, 1000, 10**0.5, 10_000, 1000,
                      "Bayesian linear regression, N=2000, d=5, batch 1000, GaussianNLL(scale=1), prior N(0, 10 I)"),
    "digits_mlp": Network(_digits_mlp, 1e-3, 64, 1.0, 4000, 500,
                          "digits MLP 64-50-10, 1346 training digits, batch 64, prior N(0, I)"),
    "digits_conv": Network(_digits_conv, 1e-3, 64, 1.0, 4000, 500,
                           "digits Conv2D(16, 3x3)-Dense(10), 1346 training digits, batch 64, prior N(0, I)"),
    "lstm": Network(_lstm, 1e-3, 16, 1.0, 2000, 500,
                    "Fashion-MNIST LSTM (89,290 weights) on 256 mock 28x28 images, batch 16, prior N(0, I)"),
}


def make_sampler(name: str, step_size: float, warmup_steps: int | None):
    """The sampler `name` at the network's h; `warmup_steps=None` keeps the default warm-up."""
    warmup = {} if warmup_steps is None else {"warmup_steps": warmup_steps}
    if name == "sgld":
        return kt.samplers.SGLD(step_size=2.0 * step_size**2)
    if name == "sghmc":
        return kt.samplers.SGHMC(step_size=step_size, friction=FRICTION)
    # mCCAdL with the paper's minibatch C step, as in the committed results.
    samplers = {"sgnht": kt.samplers.SGNHT, "ccadl": kt.samplers.CCAdL,
                "mccadl": functools.partial(kt.samplers.MCCAdL, covariance="minibatch")}
    if name not in samplers:
        raise ValueError(f"`sampler` must be one of {list(samplers) + list(REFERENCES)}, got {name!r}.")
    return samplers[name](step_size=step_size, friction=FRICTION, **warmup)


class VerdictTrace(keras.callbacks.Callback):
    """Reads `check`'s report at every block boundary (placed after the check among the callbacks,
    which `fit` ensures) and keeps the first step at which the whole net is in band with a burn-in
    that ends after the sampler's warm-up."""

    def __init__(self, check: kt.callbacks.EquilibrationCheck, warmup_steps: int):
        super().__init__()
        self.check, self.warmup_steps = check, warmup_steps
        self.at_t_step: int | None = None
        self.trace: list[list] = []  # [step, kinetic mean, configurational mean, whole net in band]

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.sampler_step)
        if self.trace and self.trace[-1][0] == step:
            return
        report = self.check.report()
        overall = report["overall"]
        in_band = all(overall[kind]["in_band"] for kind in ("kinetic", "configurational"))
        self.trace.append([step, overall["kinetic"]["mean"], overall["configurational"]["mean"], in_band])
        if self.at_t_step is None and in_band and report["equilibration_step"] >= self.warmup_steps:
            self.at_t_step = step


def _temperatures(entry: dict) -> dict:
    return {kind: {"mean": entry[kind]["mean"], "standard_error": entry[kind]["standard_error"]}
            for kind in ("kinetic", "configurational")}


def run_one(network: str, sampler: str, *, warmup: str, seed: int = 0, steps: int | None = None) -> dict:
    """One chain from the net's default initialisation; `warmup` is `"none"` (`warmup_steps=0`),
    `"default"` (the sampler's default warm-up) or `"n/a"` (a sampler without thermostat)."""
    spec = NETWORKS[network]
    steps = spec.steps if steps is None else steps
    keras.backend.clear_session()  # variable names restart, so every run's report reads the same
    net, x, y, loss = spec.build(seed)
    chosen = make_sampler(sampler, spec.step_size, 0 if warmup == "none" else None)
    model = kt.BayesianModel(net, chosen, num_examples=len(x), prior=kt.priors.Gaussian(spec.prior_std),
                             temperature=TEMPERATURE, seed=seed)
    model.compile(loss=loss, steps_per_execution=STEPS_PER_EXECUTION)
    check = kt.equilibration.default_check()
    last_half = kt.callbacks.EquilibrationCheck(burn_in_steps=steps // 2, warn=False)
    warmup_steps = int(getattr(chosen, "warmup_steps", 0))
    trace = VerdictTrace(check, warmup_steps)
    steps_per_epoch = min(spec.steps_per_epoch, steps)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=spec.batch_size, epochs=max(1, steps // steps_per_epoch),
                  steps_per_epoch=steps_per_epoch, callbacks=[check, last_half, trace], verbose=0)
    seconds = time.perf_counter() - start
    final, half = check.report(), last_half.report()
    return {
        "network": network,
        "sampler": sampler,
        "warmup": warmup,
        "warmup_steps": warmup_steps,
        "seed": seed,
        "steps": int(model.sampler_step),
        "step_size": float(model.sampler.step_size),
        "sampler_config": {k: v for k, v in model.sampler.get_config().items() if isinstance(v, (int, float, str, type(None)))},
        "steps_to_T": trace.at_t_step,
        "check_equilibrated_at_step": check.equilibrated_at_step,
        "final_equilibrated": final["equilibrated"],
        "final_burn_in_step": final["equilibration_step"],
        "final": _temperatures(final["overall"]),
        "last_half": {"from_step": int(steps // 2), **_temperatures(half["overall"])},
        "warned_not_at_T": any(NOT_AT_T in str(w.message) for w in caught),
        "trace": {"columns": ["step", "kinetic", "configurational", "whole_net_in_band"], "rows": trace.trace},
        "num_params": int(model.num_params),
        "seconds": seconds,
    }


def run(networks=tuple(NETWORKS), samplers=THERMOSTATS + REFERENCES, seeds=(0,), steps: int | None = None,
        out: str | None = None, command: str = "") -> dict:
    """Every (network, sampler, warm-up, seed) run; written to `out` (JSON) after each run."""
    payload = {
        "definition": DEFINITION,
        "temperature": TEMPERATURE,
        "friction": FRICTION,
        "sgld_step_size": "2 h^2",
        "networks": {
            name: {"description": NETWORKS[name].description, "step_size": NETWORKS[name].step_size,
                   "batch_size": NETWORKS[name].batch_size, "prior_std": NETWORKS[name].prior_std,
                   "steps": NETWORKS[name].steps if steps is None else steps}
            for name in networks
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "command": command,
        "runs": [],
    }
    for network in networks:
        for sampler in samplers:
            for warmup in (("none", "default") if sampler in THERMOSTATS else ("n/a",)):
                for seed in seeds:
                    record = run_one(network, sampler, warmup=warmup, seed=seed, steps=steps)
                    print(summary_line(record), flush=True)
                    payload["runs"].append(record)
                    if out:
                        write_json(out, payload)
    return payload


def _steps_to_t(record: dict) -> str:
    reached = record["steps_to_T"]
    return f"not within {record['steps']}" if reached is None else str(reached)


def summary_line(record: dict) -> str:
    half = record["last_half"]
    return (
        f"{record['network']:11s} {record['sampler']:6s} warm-up {record['warmup']:7s} seed {record['seed']} "
        f"steps to T: {_steps_to_t(record):>15s}  final {record['final_equilibrated']!s:5s} "
        f"last half kin {half['kinetic']['mean']:.3f} conf {half['configurational']['mean']:.3f} "
        f"({record['seconds']:.0f} s)"
    )


def _figure(entry: dict) -> str:
    """`mean +- standard error`; "-" where no step counted (null in the JSON, NaN before)."""
    mean, error = entry["mean"], entry["standard_error"]
    if mean is None or not math.isfinite(mean):
        return "-"
    return f"{mean:.3f}" if error is None or not math.isfinite(error) else f"{mean:.3f} +- {error:.3f}"


def markdown(payload: dict) -> str:
    """The table of a payload's runs, one row per run."""
    lines = [
        "| network | h | sampler | warm-up | seed | steps | steps to T | at the end: whole net; every variable (MSER burn-in) | kinetic T, last half | configurational T, last half |",
        "|---|---:|---|---|---:|---:|---:|---|---:|---:|",
    ]
    words = {True: "at T", False: "not at T", None: "undetermined"}
    for r in payload["runs"]:
        half = r["last_half"]
        rows = r["trace"]["rows"]
        whole_net = words[bool(rows[-1][3])] if rows and r["final_equilibrated"] is not None else words[None]
        verdict = f"{whole_net}; {words[r['final_equilibrated']]}"
        lines.append(
            f"| {r['network']} | {r['step_size']:.3g} | {r['sampler']} | "
            f"{r['warmup'] if r['warmup'] != 'default' else str(r['warmup_steps'])} | {r['seed']} | {r['steps']} | "
            f"{_steps_to_t(r)} | {verdict} ({r['final_burn_in_step']}) | "
            f"{_figure(half['kinetic'])} | {_figure(half['configurational'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/warmup/warmup.json")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--samplers", nargs="+", default=list(THERMOSTATS + REFERENCES), choices=list(THERMOSTATS + REFERENCES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=None, help="steps of every run (default: each network's own)")
    parser.add_argument("--summarize", metavar="JSON", help="print the table of a recorded run and exit")
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as handle:
            print(markdown(json.load(handle)))
        return {}
    if args.steps is not None and args.steps < STEPS_PER_EXECUTION:
        parser.error(f"--steps must be at least {STEPS_PER_EXECUTION} (one block), got {args.steps}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    command = "python -m benchmarks.warmup " + " ".join(sys.argv[1:] if argv is None else argv)
    payload = run(args.networks, args.samplers, args.seeds, args.steps, out=args.out, command=command)
    print(markdown(payload))
    return payload


if __name__ == "__main__":
    main()
