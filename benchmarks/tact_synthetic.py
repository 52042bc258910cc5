"""TACT-HMC's synthetic study (Luo et al., 2018, sec. 5.1): multimodal mixtures, noisy gradients.

Each target is a Gaussian mixture `exp(-U)`; every step the samplers get `F + force_std * eps` and
`U + potential_std * eps'` (noise they do not know about, as in the paper). Compared on the same
target, start and noise:

- `tact`: TACT-HMC (Algorithm 1, this project's units);
- `no_tempering`: thermostats without tempering (xi fixed on the plateau);
- `no_thermostat`: tempering without thermostats (z fixed at c);
- `tact_euler`: TACT-HMC with the listing's Euler friction `r - lambda^2 z r`;
- `sghmc`, `sgnht`: the baselines, with the same per-step learning rate and momentum decay
  (`h = sqrt(eta)`, `A = c / h`, SGNHT's `mu = gamma Nd`).

All samplers run their own `update` in one XLA-compiled `tf.while_loop` (the same function
`BayesianModel.fit` calls). `simulate_chains` runs many independent chains at once (the update
vectorised over them) and counts their samples per mode; `mode_occupancy` gives a mode's mass
with its standard error from the spread between chains (`tests/test_tact_modes.py`). Written to `--out`: `results.json` (mode masses against the mixture
weights, histogram total-variation distance, ESS as the paper reports it, i.e. over the collected
samples via `tfp.mcmc.effective_sample_size`, and ESS ratios against SGHMC and SGNHT),
`hist_<target>.png` (histograms against the target) and `trace_<target>.png` (xi and
effective temperature).

Usage:
    python -m benchmarks.tact_synthetic --config configs/tact_synthetic.yaml --out runs/tact [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Callable, Sequence

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_thermo as kt  # noqa: E402
from keras_thermo import diagnostics  # noqa: E402
from keras_thermo.samplers.base import Sampler, StepContext  # noqa: E402
from keras_thermo.samplers.tact_hmc import TACTHMC  # noqa: E402

# Stream of the synthetic gradient and potential noise (apart from the samplers' own streams).
_STREAM_SYNTHETIC_NOISE = 90


class GaussianMixture:
    """`U(x) = -log sum_k w_k N(x; mu_k, s_k^2 I)` on R^d (isotropic components).

    Example:
        >>> target = GaussianMixture([0.5, 0.5], [[-1.0], [1.0]], [0.3, 0.3])
        >>> round(float(target.potential(tf.constant([1.0]))), 3)
        0.408
    """

    def __init__(self, weights: Sequence[float], means: Sequence[Sequence[float]], stds: Sequence[float]):
        self.weights = np.asarray(weights, np.float64) / np.sum(weights)
        self.means = np.asarray(means, np.float64)
        self.stds = np.asarray(stds, np.float64)
        if self.means.ndim != 2 or len(self.means) != len(self.weights) or len(self.stds) != len(self.weights):
            raise ValueError(
                f"`means` must be [K, d] and `weights`, `stds` [K], got shapes {self.means.shape}, "
                f"{self.weights.shape}, {self.stds.shape}."
            )
        self.dim = self.means.shape[1]

    def log_density(self, x) -> tf.Tensor:
        """`log p(x)` for `x` of shape `[..., d]` (float32)."""
        x = tf.convert_to_tensor(x, tf.float32)
        means = tf.constant(self.means, tf.float32)
        stds = tf.constant(self.stds, tf.float32)
        squared = tf.reduce_sum(tf.square(x[..., None, :] - means), axis=-1) / tf.square(stds)
        log_norm = -self.dim * (tf.math.log(stds) + 0.5 * math.log(2.0 * math.pi))
        return tf.reduce_logsumexp(tf.constant(np.log(self.weights), tf.float32) + log_norm - 0.5 * squared, axis=-1)

    def potential(self, x) -> tf.Tensor:
        return -self.log_density(x)

    def nearest_mode(self, samples: np.ndarray) -> np.ndarray:
        """Index of the nearest component mean of each sample `[S, d]`."""
        distance = np.linalg.norm(np.asarray(samples)[:, None, :] - self.means[None], axis=-1)
        return np.argmin(distance, axis=1)


def simulate(
    sampler: Sampler,
    potential: Callable[[tf.Tensor], tf.Tensor],
    start: Sequence[float],
    *,
    num_steps: int,
    seed: int,
    force_std: float = 0.0,
    potential_std: float = 0.0,
    temperature: float = 1.0,
    record: Sequence[str] = (),
) -> dict:
    """Runs `sampler.update` for `num_steps` on `potential` with Gaussian gradient/potential noise.

    Args:
        sampler: Any sampler of this project.
        potential: `U(theta)` for a flat float32 vector theta.
        start: Initial theta.
        num_steps: Steps to run (one XLA-compiled loop).
        seed: Keys the sampler's noise and the synthetic noise.
        force_std: Std of the noise added to every component of `F = -grad U`.
        potential_std: Std of the noise added to U (what TACT's xi sees).
        temperature: T.
        record: Names of scalar diagnostics to record at every step.

    Returns:
        `{"theta": [S, d], "is_sample": [S] bool, <record name>: [S], "state": final state}`, with
        theta after each step.
    """
    params = [tf.constant(np.asarray(start, np.float32))]
    state = sampler.init(params, temperature=temperature, seed=seed)
    context_args = {"temperature": temperature, "num_examples": 1, "batch_size": tf.constant(1.0), "seed": seed}

    def body(index, state, params, thetas, flags, traces):
        with tf.GradientTape() as tape:
            tape.watch(params[0])
            exact = potential(params[0])
        gradient = tape.gradient(exact, params[0])
        key = tf.random.experimental.stateless_fold_in(tf.constant([seed, _STREAM_SYNTHETIC_NOISE]), index)
        noise = tf.random.stateless_normal([gradient.shape[0] + 1], key)
        force = [-gradient + force_std * noise[:-1]]
        context = StepContext(potential=exact + potential_std * noise[-1], **context_args)
        params, state, logs = sampler.update(state, params, force, context)
        thetas = thetas.write(index, params[0])
        flags = flags.write(index, sampler.is_sample(state))
        traces = [trace.write(index, tf.cast(logs[name], tf.float32)) for trace, name in zip(traces, record)]
        return index + 1, state, params, thetas, flags, traces

    @tf.function(jit_compile=True)
    def loop(state, params):
        arrays = (
            tf.TensorArray(tf.float32, size=num_steps),
            tf.TensorArray(tf.bool, size=num_steps),
            [tf.TensorArray(tf.float32, size=num_steps) for _ in record],
        )
        _, state, _, thetas, flags, traces = tf.while_loop(
            lambda index, *_: index < num_steps, body, (tf.constant(0), state, params, *arrays)
        )
        return state, thetas.stack(), flags.stack(), [trace.stack() for trace in traces]

    state, thetas, flags, traces = loop(state, params)
    result = {"theta": thetas.numpy(), "is_sample": flags.numpy(), "state": state}
    result.update({name: trace.numpy() for name, trace in zip(record, traces)})
    return result


class _GivenDraws(StepContext):
    """A `StepContext` whose normal draws are given (`draws[stream]`, one list per stream): one
    chain's share of the draws `simulate_chains` makes for every chain at once, outside
    `tf.vectorized_map`, whose stateless generators take no key per chain."""

    def normal(self, step, like, stream):
        del step
        return [tf.reshape(draw, tf.shape(tensor)) for draw, tensor in zip(self.draws[stream], like)]


def _with_draws(context: StepContext, draws: dict) -> _GivenDraws:
    given = _GivenDraws(*context)
    given.draws = draws
    return given


def _draw_shapes(sampler: Sampler, state, params, context_args: dict) -> dict:
    """`{stream: [shape, ...]}` of the normal draws one `sampler.update` makes (one eager step)."""
    shapes: dict = {}

    class Probe(StepContext):
        def normal(self, step, like, stream):
            del step
            shapes[stream] = [tuple(tensor.shape) for tensor in like]
            return [tf.zeros_like(tensor) for tensor in like]

    sampler.update(state, params, [tf.zeros_like(p) for p in params], Probe(potential=tf.constant(0.0), **context_args))
    return shapes


def simulate_chains(
    sampler: Sampler,
    potential: Callable[[tf.Tensor], tf.Tensor],
    starts,
    *,
    num_steps: int,
    seed: int,
    classify: Callable[[tf.Tensor], tf.Tensor],
    num_classes: int,
    burn_in_steps: int = 0,
    force_std: float = 0.0,
    potential_std: float = 0.0,
    temperature: float = 1.0,
    temperature_edges: Sequence[float] = (1.0, 1.0 + 1e-6, 2.0, 4.0, math.inf),
    initial_state=None,
    minibatch_noise: bool = False,
) -> dict:
    """Runs C independent chains of `sampler.update` at once (vectorised over the chains, one
    XLA-compiled loop), with the noise of `simulate`, and counts what they visit after burn-in.

    Args:
        sampler: Any sampler of this project.
        potential: `U(theta)` for `theta [C, d]`, returning `[C]`.
        starts: `[C, d]` initial theta of each chain (C independent chains).
        num_steps: Steps of every chain.
        seed: Keys every draw (per step, a draw for all chains at once).
        classify: Maps `theta [C, d]` to a class index `[C]` (int32), e.g. the nearest mode.
        num_classes: Number of classes.
        burn_in_steps: Steps (per chain) before counting starts.
        force_std, potential_std, temperature: As in `simulate`.
        temperature_edges: Edges of the bins of theta's temperature factor
            `sampler.parameter_temperature(state, T) / T` (TACT-HMC: `1 / lambda(xi)`).
        minibatch_noise: False: the independent force and potential noise of `simulate`; True:
            the noise of a minibatch of the linear loss `x_i . theta` that `BayesianModel.fit`
            sees in the tests (force `-force_std eps`, potential `force_std eps . theta`, so the
            potential's noise grows with `|theta|`; `potential_std` unused).
        initial_state: Optional state of the C chains (every leaf with a leading chain axis);
            None gives every chain the `sampler.init` state of the first start.

    Returns:
        `{"sample_counts": [C, num_classes]` samples (`sampler.is_sample`) of each class per
        chain, `"temperature_counts": [len(edges) - 1, num_classes]` steps of all chains per
        temperature bin and class, `"state"`: the final states, `"theta": [C, d]` the final
        theta}`.
    """
    starts = np.asarray(starts, np.float32)
    chains, dim = starts.shape
    context_args = {"temperature": temperature, "num_examples": 1, "batch_size": tf.constant(1.0), "seed": seed}
    if initial_state is None:
        # One init for all (one eager init per chain would cost more than the run): the chains
        # part through their starts and their own noise.
        one = sampler.init([tf.constant(starts[0])], temperature=temperature, seed=seed)
        initial_state = tf.nest.map_structure(lambda leaf: tf.stack([leaf] * chains), one)
    one_state = tf.nest.map_structure(lambda leaf: leaf[0], initial_state)
    shapes = _draw_shapes(sampler, one_state, [tf.constant(starts[0])], context_args)
    edges = tf.constant(np.asarray(temperature_edges, np.float32))
    num_bins = len(temperature_edges) - 1

    def one_chain(args):
        state, theta, force, chain_potential, draws = args
        context = _with_draws(StepContext(potential=chain_potential, **context_args), draws)
        params, state, _ = sampler.update(state, [theta], [force], context)
        factor = sampler.parameter_temperature(state, temperature) / temperature
        return params[0], state, sampler.is_sample(state), factor

    def body(index, state, theta, sample_counts, temperature_counts):
        with tf.GradientTape() as tape:
            tape.watch(theta)
            exact = potential(theta)
            total = tf.reduce_sum(exact)  # the chains' potentials are independent
        gradient = tape.gradient(total, theta)
        key = tf.random.experimental.stateless_fold_in(tf.constant([seed, _STREAM_SYNTHETIC_NOISE]), index)
        noise = tf.random.stateless_normal([chains, dim + 1], key)
        draws = {}
        for stream, stream_shapes in shapes.items():
            stream_key = tf.random.experimental.stateless_fold_in(tf.constant([seed, stream]), index)
            draws[stream] = [
                tf.random.stateless_normal([chains, *shape], tf.random.experimental.stateless_fold_in(stream_key, i))
                for i, shape in enumerate(stream_shapes)
            ]
        if minibatch_noise:
            # The noise of a minibatch of the loss `V(theta) / N + x_i . theta` with `sum_i x_i = 0`:
            # the force gets `-force_std eps`, the potential `force_std eps . theta`.
            force = -gradient - force_std * noise[:, :dim]
            noisy = exact + force_std * tf.reduce_sum(noise[:, :dim] * theta, axis=1)
        else:
            force = -gradient + force_std * noise[:, :dim]
            noisy = exact + potential_std * noise[:, dim]
        theta, state, is_sample, factor = tf.vectorized_map(
            one_chain, (state, theta, force, noisy, draws),
            fallback_to_while_loop=False,
        )
        counting = index >= burn_in_steps
        classes = tf.one_hot(classify(theta), num_classes, dtype=tf.int32)
        flags = tf.cast(tf.logical_and(is_sample, counting), tf.int32)
        sample_counts += flags[:, None] * classes
        bins = tf.clip_by_value(tf.searchsorted(edges[None], factor[None], side="right")[0] - 1, 0, num_bins - 1)
        temperature_counts += tf.cast(counting, tf.int32) * tf.einsum("cb,ck->bk", tf.one_hot(bins, num_bins, dtype=tf.int32), classes)
        return index + 1, state, theta, sample_counts, temperature_counts

    @tf.function(jit_compile=True)
    def loop(state, theta):
        initial = (tf.constant(0), state, theta, tf.zeros([chains, num_classes], tf.int32), tf.zeros([num_bins, num_classes], tf.int32))
        _, state, theta, sample_counts, temperature_counts = tf.while_loop(lambda index, *_: index < num_steps, body, initial)
        return state, theta, sample_counts, temperature_counts

    state, theta, sample_counts, temperature_counts = loop(initial_state, tf.constant(starts))
    return {
        "sample_counts": sample_counts.numpy(),
        "temperature_counts": temperature_counts.numpy(),
        "state": state,
        "theta": theta.numpy(),
    }


def mode_occupancy(sample_counts: np.ndarray, mode: int) -> tuple[float, float]:
    """The fraction of samples in `mode` pooled over independent chains, and its standard error
    from the spread between chains (the ratio estimator's delta method): the samples of one
    chain are correlated, its total is not.

    Args:
        sample_counts: `[C, K]` samples of each chain in each mode.
        mode: The mode's index.
    """
    counts = np.asarray(sample_counts, np.float64)
    totals = counts.sum(axis=1)
    fraction = counts[:, mode].sum() / totals.sum()
    residuals = counts[:, mode] - fraction * totals
    chains = len(counts)
    error = math.sqrt(np.sum(residuals**2) / (chains * (chains - 1))) / totals.mean()
    return float(fraction), float(error)


def make_samplers(options: dict, dim: int) -> dict[str, Sampler]:
    """The compared samplers, TACT's options converted for the baselines (module docstring)."""
    h = math.sqrt(options["step_size"])
    friction = options["noise"] / h
    return {
        "tact": TACTHMC(**options),
        "no_tempering": TACTHMC(**options, tempering=False),
        "no_thermostat": TACTHMC(**options, thermostat=False),
        "tact_euler": TACTHMC(**options, friction_integrator="euler"),
        "sghmc": kt.samplers.SGHMC(step_size=h, friction=friction),
        "sgnht": kt.samplers.SGNHT(step_size=h, friction=friction, thermal_mass=options["thermal_inertia"] * dim),
    }


def _summarize(target: GaussianMixture, samples: list[np.ndarray], num_steps: int, bins: int) -> dict:
    """Mode masses, histogram TV distance and ESS of per-chain samples `[S_c, d]`."""
    pooled = np.concatenate(samples)
    summary: dict = {"num_samples": int(len(pooled))}
    if len(pooled) < 4 or not np.all(np.isfinite(pooled)):
        summary["diverged"] = bool(len(pooled) and not np.all(np.isfinite(pooled)))
        return summary
    masses = np.bincount(target.nearest_mode(pooled), minlength=len(target.weights)) / len(pooled)
    summary["mode_masses"] = masses.round(4).tolist()
    summary["max_mode_mass_error"] = float(np.max(np.abs(masses - target.weights)))
    if target.dim == 1:
        lo, hi = target.means.min() - 4 * target.stds.max(), target.means.max() + 4 * target.stds.max()
        counts, edges = np.histogram(pooled[:, 0], bins=bins, range=(lo, hi))
        centers = 0.5 * (edges[1:] + edges[:-1])
        exact = np.exp(target.log_density(centers[:, None].astype(np.float32)).numpy()) * (edges[1] - edges[0])
        summary["histogram_tv"] = float(0.5 * np.sum(np.abs(counts / len(pooled) - exact / exact.sum())))
    per_chain = [s for s in samples if len(s) >= 4]
    ess = [diagnostics.effective_sample_size(s) for s in per_chain]
    summary["ess"] = float(np.sum([np.mean(e) for e in ess]))
    summary["ess_per_1000_steps"] = 1000.0 * summary["ess"] / (num_steps * len(samples))
    summary["ess_fraction"] = summary["ess"] / max(sum(len(s) for s in per_chain), 1)
    return summary


def _plot(out: str, name: str, target: GaussianMixture, runs: dict, trace: dict | None) -> list[str]:
    import matplotlib  # noqa: PLC0415 (optional dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    written = []
    methods = list(runs)
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.0), squeeze=False)
    for axis, method in zip(axes[0], methods):
        pooled = runs[method]
        finite = pooled[np.all(np.isfinite(pooled), axis=1)] if len(pooled) else pooled
        if target.dim == 1:
            lo, hi = target.means.min() - 4 * target.stds.max(), target.means.max() + 4 * target.stds.max()
            grid = np.linspace(lo, hi, 400)
            axis.plot(grid, np.exp(target.log_density(grid[:, None].astype(np.float32)).numpy()), "C0")
            if len(finite):
                axis.hist(finite[:, 0], bins=120, range=(lo, hi), density=True, color="C1", alpha=0.7)
        else:
            lo, hi = target.means.min() - 3 * target.stds.max(), target.means.max() + 3 * target.stds.max()
            if len(finite):
                axis.hist2d(finite[:, 0], finite[:, 1], bins=80, range=[[lo, hi], [lo, hi]], cmap="magma")
            axis.scatter(target.means[:, 0], target.means[:, 1], c="C0", marker="x")
        axis.set_title(f"{method} ({len(finite)})", fontsize=9)
    fig.suptitle(f"{name}: samples against the target")
    fig.tight_layout()
    path = os.path.join(out, f"hist_{name}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    if trace is not None:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4), sharex=True)
        steps = np.arange(len(trace["xi"]))
        top.plot(steps, trace["xi"], lw=0.5)
        top.axhspan(-trace["xi0"], trace["xi0"], color="C2", alpha=0.2)
        top.set_ylabel("xi")
        bottom.plot(steps, trace["effective_temperature"], lw=0.5, color="C3")
        bottom.axhline(1.0, color="k", lw=0.8)
        bottom.set_ylabel("T / lambda(xi)")
        bottom.set_xlabel("step")
        fig.tight_layout()
        path = os.path.join(out, f"trace_{name}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def run_study(config: dict, out: str, quick: bool = False) -> dict:
    """Runs every target and sampler of `config`; writes results.json and PNGs into `out`."""
    os.makedirs(out, exist_ok=True)
    run = dict(config["run"])
    targets = config["targets"]
    if quick:
        run.update(config.get("quick", {}).get("run", {}))
        names = config.get("quick", {}).get("targets", list(targets))
        targets = {name: targets[name] for name in names}
    results: dict = {"config": config, "quick": quick, "targets": {}}
    for name, spec in targets.items():
        target = GaussianMixture(spec["weights"], spec["means"], spec["stds"])
        samplers = make_samplers(dict(config["tact"]), target.dim)
        pooled, trace, target_results = {}, None, {}
        for method, sampler in samplers.items():
            started = time.time()
            chains, diverged_at = [], []
            for chain in range(run["chains"]):
                record = ("xi", "effective_temperature") if isinstance(sampler, TACTHMC) else ()
                output = simulate(
                    sampler, target.potential, spec["start"], num_steps=run["num_steps"],
                    seed=config["seed"] * 1000 + chain, force_std=config["noise"]["force_std"],
                    potential_std=config["noise"]["potential_std"], record=record,
                )
                finite = np.all(np.isfinite(output["theta"]), axis=1)
                diverged_at.append(int(np.argmin(finite)) if not finite.all() else None)
                keep = output["is_sample"] & finite
                keep[: run["burn_in_steps"]] = False
                chains.append(output["theta"][keep])
                if method == "tact" and chain == 0:
                    window = slice(run["burn_in_steps"], run["burn_in_steps"] + run["trace_steps"])
                    trace = {
                        "xi": output["xi"][window],
                        "effective_temperature": output["effective_temperature"][window],
                        "xi0": sampler.xi0,
                    }
                    target_results["xi_histogram"] = (
                        np.histogram(output["xi"][run["burn_in_steps"]:], bins=10, range=(-sampler.wall, sampler.wall))[0]
                        / max(run["num_steps"] - run["burn_in_steps"], 1)
                    ).round(4).tolist()
                    target_results["final_z_theta"] = float(np.mean(output["state"].z_theta))
                    target_results["final_z_xi"] = float(output["state"].z_xi)
            summary = _summarize(target, chains, run["num_steps"], bins=60)
            summary["diverged_at_step"] = diverged_at
            summary["seconds"] = round(time.time() - started, 2)
            target_results[method] = summary
            pooled[method] = np.concatenate(chains) if chains else np.zeros((0, target.dim))
        for baseline in ("sghmc", "sgnht"):
            ess_tact = target_results["tact"].get("ess")
            ess_base = target_results[baseline].get("ess")
            if ess_tact and ess_base:
                # The paper's ratio: ESS over the same number of collected samples.
                ratio = target_results["tact"]["ess_fraction"] / target_results[baseline]["ess_fraction"]
                target_results[f"ess_fraction_ratio_tact_over_{baseline}"] = round(ratio, 4)
                target_results[f"ess_per_step_ratio_tact_over_{baseline}"] = round(ess_tact / ess_base, 4)
        target_results["weights"] = target.weights.round(4).tolist()
        target_results["plots"] = _plot(out, name, target, pooled, trace)
        results["targets"][name] = target_results
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2, default=str)
    return results


def main(argv: Sequence[str] | None = None) -> dict:
    import yaml  # noqa: PLC0415 (benchmark dependency)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tact_synthetic.yaml")
    parser.add_argument("--out", default="runs/tact")
    parser.add_argument("--quick", action="store_true", help="one short chain per sampler (< 1 minute)")
    args = parser.parse_args(argv)
    with open(args.config) as handle:
        config = yaml.safe_load(handle)
    results = run_study(config, args.out, quick=args.quick)
    for name, target_results in results["targets"].items():
        print(f"== {name}: weights {target_results['weights']}")
        for method in ("tact", "no_tempering", "no_thermostat", "tact_euler", "sghmc", "sgnht"):
            summary = target_results[method]
            print(
                f"  {method:14s} masses {summary.get('mode_masses')} tv {summary.get('histogram_tv', float('nan')):.3f} "
                f"ess {summary.get('ess', float('nan')):.0f} ({summary.get('ess_fraction', float('nan')):.3f} of "
                f"{summary['num_samples']}) diverged {summary['diverged_at_step']}"
            )
        for key, value in target_results.items():
            if key.startswith("ess_") and "ratio" in key:
                print(f"  {key}: {value}")
    return results


if __name__ == "__main__":
    main()
