"""2-Wasserstein accuracy and stability of SGHMC, SGNHT, CCAdL and mCCAdL (Wei & Shang 2026, sec. 3.1).

Bayesian linear regression with a Gaussian posterior in closed form: `N` examples `x ~ N(0, I)` in
`Nd` dimensions, `y = theta_true . x + N(0, 1)`, prior `N(0, lambda I)`. The per-example loss is
`l_i = (y_i - theta . x_i)^2 / 2` (noise variance 1; Keras' `mse` would mean variance 1/2), so with
the project's units `U = N * mean_i l_i + |theta|^2 / (2 lambda)` and the posterior is
`N(S X^T y, S)`, `S = (X^T X + I / lambda)^-1`.

Chains start at `init`: `posterior_mean` (default; W2 then measures the stationary error and
stability) or `zeros` (W2 also shows the transient). From zeros with `theta_true ~ N(0, I)` the
residuals, hence the gradient noise, are ~100x their posterior level at the start: CCAdL's moving
average (weights 1/t) keeps that estimate for many steps, and its explicit covariance friction
is unstable from the first pass at every step size of the sweep.

Each step draws a subset of `n` examples with replacement (the paper's protocol). After a burn-in,
the Gaussian fitted to all samples so far is compared with the exact posterior by the closed-form
2-Wasserstein distance, once per pass through the data. A run that produces a non-finite value
is marked as blown up at that pass; the largest step size of the sweep with no blow-up is recorded
per method and friction.

How the samplers are driven: for speed the benchmark calls each sampler's own `update` (the
functions `BayesianModel.train_step` calls) in a `tf.function` loop, with the force
`F = -(N mean_i g_i + theta / lambda)` and the per-example gradients `g_i = -(y_i - theta . x_i) x_i`
computed in closed form for the linear model instead of by automatic differentiation; everything
else (noise streams, state, diagnostics) is the library's.

    python -m benchmarks.regression_w2 --config configs/regression_w2.yaml --out runs/w2 [--quick]

Writes `results.json` (W2 curves, final W2, blow-up pass, largest stable step per method) and
`w2.png` (W2 against passes, one panel per friction and step size) under `--out`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import time
from typing import Callable

import numpy as np
import tensorflow as tf
import yaml

import keras_thermo as kt
from keras_thermo.samplers.base import StepContext
from keras_thermo.samplers.ccadl import CCAdL
from keras_thermo.samplers.mccadl import MCCAdL

METHODS = ("sghmc", "sgnht", "ccadl", "mccadl")
LABELS = {"sghmc": "SGHMC", "sgnht": "SGNHT", "ccadl": "CCAdL", "mccadl": "mCCAdL"}


def make_sampler(method: str, step_size: float, friction: float, options: dict) -> kt.samplers.Sampler:
    """The sampler of `method` with the benchmark's options (`options[method]` are extra kwargs)."""
    extra = dict(options.get(method) or {})
    constructors = {
        "sghmc": kt.samplers.SGHMC,
        "sgnht": kt.samplers.SGNHT,
        "ccadl": CCAdL,
        "mccadl": functools.partial(MCCAdL, covariance="minibatch"),  # the paper's C step (its experiment)
    }
    if method not in constructors:
        raise ValueError(f"`method` must be one of {list(constructors)}, got {method!r}.")
    return constructors[method](step_size, friction=friction, **extra)


# --- the shared driver (also used by benchmarks.logistic_regression) -------------------------


def make_chunk_runner(
    sampler: kt.samplers.Sampler,
    per_example_gradients: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    *,
    num_examples: int,
    batch_size: int,
    prior_precision: float,
    seed: int,
    temperature: float = 1.0,
):
    """Returns `run(state, theta, first_step, num_steps) -> (theta, state, samples, logs)`.

    Each step draws `batch_size` indices uniformly with replacement (stateless, keyed by
    `(seed, step)`), evaluates `G = per_example_gradients(theta, indices)` (`[n, Nd]`, gradients of
    the per-example losses), the force `F = -(N mean(G) + prior_precision theta)`, and applies
    `sampler.update` with a `StepContext` like the one `BayesianModel` builds. `samples` holds
    theta after every step, `[num_steps, Nd]`.
    """
    needs_rows = sampler.needs_per_example_gradients

    def one_step(step, state, theta):
        indices = tf.random.stateless_uniform(
            [batch_size], seed=tf.stack([tf.constant(seed, tf.int32), step]),
            minval=0, maxval=num_examples, dtype=tf.int32,
        )
        rows = per_example_gradients(theta, indices)
        force = -(num_examples * tf.reduce_mean(rows, axis=0) + prior_precision * theta)
        context = StepContext(
            temperature=temperature, num_examples=num_examples,
            batch_size=tf.constant(float(batch_size)), potential=tf.constant(0.0), seed=seed,
            per_example_gradients=rows if needs_rows else None,
        )
        (theta,), state, logs = sampler.update(state, [theta], [force], context)
        return theta, state, logs

    @tf.function(reduce_retracing=True)
    def run(state, theta, first_step, num_steps):
        first_step = tf.cast(first_step, tf.int32)
        # The first step outside the loop fixes the structure of the diagnostics it carries.
        theta, state, logs = one_step(first_step, state, theta)
        samples = tf.TensorArray(tf.float32, size=num_steps).write(0, theta)
        for i in tf.range(1, num_steps):
            theta, state, logs = one_step(first_step + i, state, theta)
            samples = samples.write(i, theta)
        return theta, state, samples.stack(), logs

    return run


def run_passes(run, state, theta, *, passes: int, steps_per_pass: int, on_pass) -> int | None:
    """Drives `run` (from `make_chunk_runner`) one pass of `steps_per_pass` steps at a time,
    calling `on_pass(pass_index, samples, logs)` (passes counted from 1, `samples` a numpy
    `[steps_per_pass, Nd]`) after each pass whose samples are all finite. Returns the first pass
    with a non-finite sample, where it stops, or None."""
    for pass_index in range(1, passes + 1):
        theta, state, samples, logs = run(
            state, theta, tf.constant((pass_index - 1) * steps_per_pass), tf.constant(steps_per_pass)
        )
        samples = samples.numpy()
        if not np.all(np.isfinite(samples)):
            return pass_index
        on_pass(pass_index, samples, logs)
    return None


def sweep(config: dict, run_one, describe) -> list[dict]:
    """`run_one(method, step_size, friction)` for every friction, step size and method of the
    config (in that nesting), each printed as it finishes: its blow-up pass or `describe(result)`."""
    runs = []
    for friction in config["frictions"]:
        for step_size in config["step_sizes"]:
            for method in config["methods"]:
                result = run_one(method, step_size, friction)
                runs.append(result)
                status = (
                    f"blew up at pass {result['blew_up_at_pass']}" if result["blew_up_at_pass"]
                    else describe(result)
                )
                print(f"A={friction:g} h={step_size:g} {method:7s} {status} ({result['seconds']:.1f} s)",
                      flush=True)
    return runs


def machine() -> str:
    """The processor and its core count, for the results."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def write_results(out: str, results: dict) -> None:
    """`results` as `results.json` under `out` (created if missing)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)


class RunningGaussian:
    """Mean and covariance of all vectors added so far (float64 sums)."""

    def __init__(self, dim: int):
        self.count = 0
        self.total = np.zeros(dim)
        self.outer = np.zeros((dim, dim))

    def add(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.float64)
        self.count += len(rows)
        self.total += rows.sum(axis=0)
        self.outer += rows.T @ rows

    def mean_and_covariance(self) -> tuple[np.ndarray, np.ndarray]:
        mean = self.total / self.count
        covariance = (self.outer - self.count * np.outer(mean, mean)) / max(self.count - 1, 1)
        return mean, covariance


def _symmetric_sqrt(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(0.5 * (matrix + matrix.T))
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


class GaussianW2:
    """2-Wasserstein distance from Gaussians to a fixed Gaussian `N(mean, covariance)`.

    `W2^2 = |m1 - m2|^2 + tr(S1) + tr(S2) - 2 tr((S2^1/2 S1 S2^1/2)^1/2)` (Givens & Shortt, 1984).
    """

    def __init__(self, mean: np.ndarray, covariance: np.ndarray):
        self.mean = mean
        self.covariance = covariance
        self.root = _symmetric_sqrt(covariance)

    def __call__(self, mean: np.ndarray, covariance: np.ndarray) -> float:
        cross = np.linalg.eigvalsh(self.root @ covariance @ self.root)
        squared = (
            np.sum((mean - self.mean) ** 2) + np.trace(covariance) + np.trace(self.covariance)
            - 2.0 * np.sum(np.sqrt(np.clip(cross, 0.0, None)))
        )
        return float(math.sqrt(max(squared, 0.0)))


# --- the linear-regression problem -------------------------------------------------------------


def regression_problem(num_examples: int, num_features: int, prior_variance: float, seed: int):
    """Data, exact posterior mean and covariance (float64), and the per-example gradient function."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, num_features))
    theta_true = rng.normal(size=num_features)
    y = x @ theta_true + rng.normal(size=num_examples)
    precision = x.T @ x + np.eye(num_features) / prior_variance
    covariance = np.linalg.inv(precision)
    mean = covariance @ (x.T @ y)
    x_tf, y_tf = tf.constant(x, tf.float32), tf.constant(y, tf.float32)

    def per_example_gradients(theta, indices):
        xb, yb = tf.gather(x_tf, indices), tf.gather(y_tf, indices)
        residual = yb - tf.linalg.matvec(xb, theta)
        return -residual[:, None] * xb  # grad of (y - theta.x)^2 / 2

    return per_example_gradients, mean, covariance


def run_one(method, step_size, friction, problem, settings, options) -> dict:
    """One chain: W2 after each pass from `burn_in_passes` on; stops at the first non-finite value."""
    gradients, mean, covariance = problem
    num_examples, batch_size = settings["num_examples"], settings["batch_size"]
    steps_per_pass = num_examples // batch_size
    sampler = make_sampler(method, step_size, friction, options)
    run = make_chunk_runner(
        sampler, gradients, num_examples=num_examples, batch_size=batch_size,
        prior_precision=1.0 / settings["prior_variance"], seed=settings["seed"],
    )
    if settings["init"] == "posterior_mean":
        theta = tf.constant(mean, tf.float32)
    elif settings["init"] == "zeros":
        theta = tf.zeros([len(mean)], tf.float32)
    else:
        raise ValueError(f"`init` must be 'zeros' or 'posterior_mean', got {settings['init']!r}.")
    state = sampler.init([theta], temperature=1.0, seed=settings["seed"])
    w2 = GaussianW2(mean, covariance)
    fitted = RunningGaussian(len(mean))
    passes, distances, diagnostics = [], [], {}

    def on_pass(pass_index, samples, logs):
        if pass_index > settings["burn_in_passes"]:
            fitted.add(samples)
            if fitted.count > len(mean):  # a full-rank empirical covariance
                passes.append(pass_index)
                distances.append(w2(*fitted.mean_and_covariance()))
        for key, value in logs.items():
            diagnostics.setdefault(key, []).append(float(value))

    start = time.perf_counter()
    blew_up_at = run_passes(run, state, theta, passes=settings["passes"], steps_per_pass=steps_per_pass, on_pass=on_pass)
    seconds = time.perf_counter() - start
    # A chain that stays finite but wanders off by orders of magnitude is unstable too.
    if blew_up_at is None and distances and distances[-1] > settings["blow_up_w2"]:
        blew_up_at = passes[-1]
    return {
        "method": method,
        "step_size": step_size,
        "friction": friction,
        "passes": passes,
        "w2": distances,
        "final_w2": distances[-1] if distances and blew_up_at is None else None,
        "blew_up_at_pass": blew_up_at,
        "seconds": seconds,
        "mean_diagnostics": {k: float(np.mean(v[len(v) // 2:])) for k, v in diagnostics.items()},
    }


def largest_stable_step(runs: list[dict], methods, frictions) -> dict:
    """Per method and friction: the largest step size whose run did not blow up, and the smallest
    that did (None when none did)."""
    table = {}
    for method in methods:
        for friction in frictions:
            mine = [r for r in runs if r["method"] == method and r["friction"] == friction]
            stable = [r["step_size"] for r in mine if r["blew_up_at_pass"] is None]
            unstable = [r["step_size"] for r in mine if r["blew_up_at_pass"] is not None]
            table[f"{method}@A={friction:g}"] = {
                "largest_stable": max(stable) if stable else None,
                "smallest_unstable": min(unstable) if unstable else None,
            }
    return table


def plot(runs, frictions, step_sizes, path, *, key="w2", ylabel="W2 to the posterior", log_y=True, title=None) -> None:
    """One panel per (friction, step size): `run[key]` against passes, one line per method."""
    import matplotlib  # noqa: PLC0415 (optional dependency, only for the picture)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(
        len(frictions), len(step_sizes), figsize=(3.2 * len(step_sizes), 2.8 * len(frictions)),
        squeeze=False, sharey=True,
    )
    for row, friction in enumerate(frictions):
        for col, step_size in enumerate(step_sizes):
            ax = axes[row][col]
            for run in runs:
                if run["friction"] == friction and run["step_size"] == step_size and run[key]:
                    label = LABELS[run["method"]] + (" (blew up)" if run["blew_up_at_pass"] else "")
                    ax.plot(run["passes"], run[key], label=label)
            if log_y:
                ax.set_yscale("log")
            ax.set_title(f"h = {step_size:g}, A = {friction:g}", fontsize=9)
            if row == len(frictions) - 1:
                ax.set_xlabel("passes through the data")
            if col == 0:
                ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_config(path: str, quick: bool) -> dict:
    with open(path) as handle:
        config = yaml.safe_load(handle)
    if quick:
        config.update(config.pop("quick", {}) or {})
    else:
        config.pop("quick", None)
    return config


def parse_arguments(argv, description: str, *, config: str, out: str) -> tuple[argparse.Namespace, dict]:
    """`(args, config)` of a script run as `--config PATH --out DIR [--quick]` (defaults
    `config` and `out`), with the config read by `load_config`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=config)
    parser.add_argument("--out", default=out)
    parser.add_argument("--quick", action="store_true", help="the config's short `quick` variant")
    args = parser.parse_args(argv)
    return args, load_config(args.config, args.quick)


def main(argv=None) -> dict:
    args, config = parse_arguments(
        argv, __doc__.splitlines()[0], config="configs/regression_w2.yaml", out="runs/w2"
    )
    settings = {
        key: config[key]
        for key in ("num_examples", "num_features", "prior_variance", "batch_size", "passes",
                    "burn_in_passes", "seed", "blow_up_w2", "init")
    }
    methods, frictions, step_sizes = config["methods"], config["frictions"], config["step_sizes"]
    options = config.get("sampler_options", {})
    problem = regression_problem(
        settings["num_examples"], settings["num_features"], settings["prior_variance"], config["data_seed"]
    )
    runs = sweep(
        config, lambda method, step_size, friction: run_one(method, step_size, friction, problem, settings, options),
        lambda result: f"W2 {result['final_w2']:.4g}",
    )
    results = {
        "config": config,
        "quick": args.quick,
        "machine": machine(),
        "posterior_std_mean": float(np.sqrt(np.diag(problem[2])).mean()),
        "largest_stable_step": largest_stable_step(runs, methods, frictions),
        "final_w2_table": {
            f"A={f:g}": {
                f"h={h:g}": {r["method"]: r["final_w2"] for r in runs if r["friction"] == f and r["step_size"] == h}
                for h in step_sizes
            }
            for f in frictions
        },
        "runs": runs,
    }
    write_results(args.out, results)
    plot(runs, frictions, step_sizes, os.path.join(args.out, "w2.png"))
    print(json.dumps({"largest_stable_step": results["largest_stable_step"],
                      "final_w2_table": results["final_w2_table"]}, indent=1))
    return results


if __name__ == "__main__":
    main()
