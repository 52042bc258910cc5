"""Several chains in one `fit`: the cost of C = 4 chains against one, and shared minibatches' effect
on R-hat.

Cost. For the digits MLP (64-50-10) and the EMNIST MLP (`keras_thermo.networks.emnist_mlp`) with
SGNHT and mCCAdL (the hyperparameters of `benchmarks.step_cost`), one model with one chain and one
with four chains for each `chain_method` ("vectorized": one `tf.vectorized_map` over the chain
axis for the forward/backward passes; "loop": C passes in the compiled step), all from the same
initial weights and on the same random data. The four-chain models share each batch, so every
chain processes a whole batch, the work of a one-chain run (as with the default split batches on
arrays, where each chain draws `batch_size` examples of its own). After two warm-up fits, `--repeats` repetitions time
one `fit` of each in a rotated order; the ratio four chains / one chain is taken within each
repetition and its median reported (the CPU target: <= 4.4).

Shared or split minibatches and R-hat. With `chain_minibatches="shared"` every chain sees the
same minibatch at each step; their gradient noise is then correlated, which pulls the chains
together and biases R-hat towards 1. With `"split"` (the default) each chain draws `batch_size`
examples of its own. On Bayesian linear regression (`keras_thermo.testing`; N = 200, batch 10, so
the gradient noise dominates the injected noise) each replicate runs C = 4 chains both ways from
the same overdispersed starts and seeds. Reported per arm over the replicates: the mean and
largest R-hat (TFP's split R-hat, a variance ratio, per parameter), and the mean correlation
across chains of the draws at the same step (about 0 for independent chains).

    python -m benchmarks.chains --out benchmarks/results/chains [--repeats 5] [--replicates 10]
    python -m benchmarks.chains --quick --out runs/chains_quick   # a smoke run: seconds

Writes `results.json` and `table.md` in `--out`.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import keras
import numpy as np

import keras_thermo as kt
from benchmarks import step_cost
from keras_thermo import testing as kt_testing

NUM_CHAINS = 4
NETWORKS = ("digits_mlp", "emnist_mlp")
SAMPLERS = ("sgnht", "mccadl")
CONFIGURATIONS = (("one_chain", 1, "auto"), ("vectorized", NUM_CHAINS, "vectorized"), ("loop", NUM_CHAINS, "loop"))
CPU_TARGET = 4.4


def make_model(network: step_cost.Network, sampler: str, num_chains: int, chain_method: str, weights,
               steps_per_execution: int) -> kt.BayesianModel:
    net = network.build()
    net.set_weights(weights)
    model = kt.BayesianModel(
        net, network.make_sampler(sampler), num_examples=network.num_examples, prior=kt.priors.Gaussian(1.0),
        seed=0, num_chains=num_chains, chain_method=chain_method, chain_minibatches="shared",
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def time_chains(network: step_cost.Network, sampler: str, *, steps: int, repeats: int,
                steps_per_execution: int) -> dict:
    """Seconds per step of each configuration and the within-repetition ratios to one chain."""
    dataset = step_cost.make_dataset(network)
    weights = step_cost.initial_weights(network)
    models = {
        name: make_model(network, sampler, chains, method, weights, steps_per_execution)
        for name, chains, method in CONFIGURATIONS
    }
    for model in models.values():  # tracing, then first-execution costs
        for _ in range(2):
            step_cost.timed_fit(model, dataset, steps_per_execution)
    seconds = {name: [] for name in models}
    names = list(models)
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for name in order:
            run = step_cost.timed_fit(models[name], dataset, steps)
            if run["steps_completed"] != steps:
                raise RuntimeError(f"{network.name}/{sampler}/{name}: {run['steps_completed']} of {steps} "
                                   f"steps ({run['diverged']}).")
            seconds[name].append(run["loop_seconds"] or run["seconds"])
    result = {"steps": steps, "ms_per_step": {n: 1e3 * float(np.median(s)) / steps for n, s in seconds.items()}}
    for name in names[1:]:
        ratios = [c / one for c, one in zip(seconds[name], seconds["one_chain"])]
        result[f"ratio_{name}"] = float(np.median(ratios))
        result[f"ratios_{name}"] = ratios
    result["best_method"] = min(names[1:], key=lambda n: result[f"ratio_{n}"])
    result["best_ratio"] = result[f"ratio_{result['best_method']}"]
    result["target"] = CPU_TARGET
    result["target_met"] = result["best_ratio"] <= CPU_TARGET
    result["auto_resolves_to"] = kt.BayesianModel(
        network.build(), network.make_sampler(sampler), num_examples=10, num_chains=NUM_CHAINS).chain_path
    result["auto_ratio"] = result[f"ratio_{result['auto_resolves_to']}"]
    return result


# --- shared against split minibatches ---------------------------------------------------------


def _linear_regression_model(x, seed: int, chain_minibatches: str, make_sampler) -> kt.BayesianModel:
    model = kt.BayesianModel(
        kt_testing.linear_regression_net(x.shape[1]), make_sampler(), num_examples=len(x),
        prior=kt.priors.Gaussian(1.0), seed=seed, num_chains=NUM_CHAINS, chain_minibatches=chain_minibatches,
    )
    model.compile(loss="mse", steps_per_execution=100)
    model.build((None, x.shape[1]))
    return model


def _cross_chain_correlation(samples: np.ndarray) -> float:
    """Mean over parameters and chain pairs of the correlation of two chains' draws at the same
    steps."""
    values = []
    for j, k in itertools.combinations(range(samples.shape[0]), 2):
        for d in range(samples.shape[2]):
            values.append(np.corrcoef(samples[j, :, d], samples[k, :, d])[0, 1])
    return float(np.mean(values))


def shared_against_split(replicates: int, steps: int, burn_in: int, batch_size: int) -> dict:
    """R-hat and cross-chain correlation of chains sharing each minibatch and of chains with
    their own (`chain_minibatches="split"`: `batch_size` examples drawn for each chain), from the
    same starts and seeds."""
    x, y = kt_testing.linear_regression_data(200, 4, seed=1)

    def make_sampler():
        return kt.samplers.SGNHT(5e-3, friction=1.0)

    arms = {"shared": [], "split": []}
    for replicate in range(replicates):
        seed = 100 + replicate
        # Overdispersed starts: N(0, 3^2) per weight (the posterior sds are ~0.05).
        rng = np.random.default_rng(seed)
        shapes = [(x.shape[1], 1), (1,)]
        starts = [[3.0 * rng.normal(size=shape).astype("float32") for shape in shapes] for _ in range(NUM_CHAINS)]
        for arm, rows in arms.items():
            model = _linear_regression_model(x, seed, arm, make_sampler)
            for k, start in enumerate(starts):
                model.set_chain_weights(k, start)
            collector = kt.callbacks.SampleCollector(burn_in, max_samples=steps)
            model.fit(x, y, batch_size=batch_size, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[collector])
            samples = collector.samples
            rhat = kt.diagnostics.potential_scale_reduction(samples)
            rows.append({"rhat_mean": float(np.mean(rhat)), "rhat_max": float(np.max(rhat)),
                         "correlation": _cross_chain_correlation(samples)})
    summary = {}
    for arm, rows in arms.items():
        summary[arm] = {
            "rhat_mean": float(np.mean([r["rhat_mean"] for r in rows])),
            "rhat_max_median": float(np.median([r["rhat_max"] for r in rows])),
            "rhat_max_largest": float(np.max([r["rhat_max"] for r in rows])),
            "correlation_mean": float(np.mean([r["correlation"] for r in rows])),
            "correlation_sd": float(np.std([r["correlation"] for r in rows], ddof=1)) if len(rows) > 1 else None,
            "replicates": rows,
        }
    return {"num_examples": len(x), "batch_size": batch_size, "steps": steps, "burn_in": burn_in,
            "sampler": "SGNHT(h=5e-3, A=1)", "num_chains": NUM_CHAINS, **summary}


def markdown(results: dict) -> str:
    lines = [
        f"Device: {results['machine']['device']}; {results['machine']['usable_cpus']} usable CPUs.",
        "",
        "| network | sampler | 1 chain ms/step | 4 vectorized ms/step | 4 loop ms/step | ratio vectorized "
        "| ratio loop | auto | target <= 4.4 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, row in results["cost"].items():
        network, sampler = key.split("/")
        ms = row["ms_per_step"]
        lines.append(
            f"| {network} | {sampler} | {ms['one_chain']:.3g} | {ms['vectorized']:.3g} | {ms['loop']:.3g} | "
            f"{row['ratio_vectorized']:.2f} | {row['ratio_loop']:.2f} | {row['auto_resolves_to']} "
            f"({row['auto_ratio']:.2f}) | {'met' if row['auto_ratio'] <= CPU_TARGET else 'not met'} |"
        )
    batches = results.get("minibatches")
    if batches:
        lines += ["", f"R-hat, {batches['num_chains']} chains, {batches['sampler']}, linear regression "
                  f"N = {batches['num_examples']}, batch {batches['batch_size']}, {batches['steps']} steps "
                  f"({batches['burn_in']} burn-in), {len(batches['shared']['replicates'])} replicates:", "",
                  "| minibatches | mean R-hat | median of max R-hat | largest max R-hat | cross-chain correlation |",
                  "|---|---|---|---|---|"]
        for arm in ("shared", "split"):
            row = batches[arm]
            lines.append(f"| {arm} | {row['rhat_mean']:.4f} | {row['rhat_max_median']:.4f} | "
                         f"{row['rhat_max_largest']:.4f} | {row['correlation_mean']:+.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/chains")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=sorted(step_cost.NETWORKS))
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps-per-execution", type=int, default=50)
    parser.add_argument("--replicates", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="digits and SGNHT only, short runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.networks, args.samplers, args.repeats, args.replicates = ["digits_mlp"], ["sgnht"], 1, 1
    results = {"machine": step_cost.machine_info(), "num_chains": NUM_CHAINS, "cost": {}}
    for name in args.networks:
        network = step_cost.NETWORKS[name]
        steps = 100 if args.quick else step_cost.timed_steps(network, None, args.steps_per_execution)
        for sampler in args.samplers:
            results["cost"][f"{name}/{sampler}"] = time_chains(
                network, sampler, steps=steps, repeats=args.repeats, steps_per_execution=args.steps_per_execution)
            row = results["cost"][f"{name}/{sampler}"]
            print(name, sampler, {k: v for k, v in row.items() if not k.startswith("ratios")}, flush=True)
    steps, burn_in = (600, 200) if args.quick else (3000, 1000)
    results["minibatches"] = shared_against_split(args.replicates, steps, burn_in, batch_size=10)
    table = markdown(results)
    print(table)
    step_cost._write(Path(args.out), "results.json", results, "table.md", table)
    return results


if __name__ == "__main__":
    main()
