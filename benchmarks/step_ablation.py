"""What the noise draws and mCCAdL's C step cost inside a sampler's step: each left out in turn.

The pieces of `benchmarks.step_cost`'s breakdown are timed as separate functions; this measures
them where they run, in the compiled training step. For each network of `benchmarks.step_cost`
every sampler is built from the same weights, and its step is traced (two warm-up `fit`s) in
variants that leave a piece out:

* `full`: the sampler as it is;
* `no_noise`: every standard normal draw of the step replaced by zeros
  (`keras_thermo.random.normal_like`, patched while the step is traced: `step_cost.left_out`);
* `no_c_step` (mCCAdL): the C step replaced by the identity (`samplers.mccadl.covariance_step`),
  so neither the Gram matrix, the products with `Gc` nor the Lanczos steps run (`step_cost`
  times this variant too, for the C step's share of the step);
* `no_noise_no_c_step` (mCCAdL): both.

The variants are not samplers (without noise nothing is sampled); they exist to be timed. All
models then run interleaved with Keras SGD, as in `benchmarks.step_cost` (`--repeats` rotated
rounds of `fit`, median per-step time and median ratio to SGD within a round). The cost of a
piece is the full step less the variant without it (in ms and as a multiple of the SGD step),
with whatever overlap TensorFlow's executor finds. It bounds what any implementation that keeps
the piece as it is can reach: a cheap sampler's step is at least SGD's plus its draw,
`floor_ratio = 1 + draw / SGD`, to compare with the step-cost targets.

    python -m benchmarks.step_ablation --out benchmarks/results/step_ablation [--networks emnist_mlp]
        [--repeats 5] [--steps-per-execution 25]

Outputs in `--out`: `results.json` and `table.md`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks import step_cost
from benchmarks.step_cost import left_out

METHODS = ("sgld", "sghmc", "sgnht", "tact_hmc", "ccadl_diag", "mccadl")
VARIANTS = {"full": (), "no_noise": ("noise",), "no_c_step": ("c_step",), "no_noise_no_c_step": ("noise", "c_step")}


def variants_of(method: str) -> list[str]:
    return list(VARIANTS) if method == "mccadl" else ["full", "no_noise"]


def time_network(network: step_cost.Network, *, repeats: int, steps_per_execution: int) -> dict:
    dataset = step_cost.make_dataset(network)
    weights = step_cost.initial_weights(network)
    steps = step_cost.timed_steps(network, None, steps_per_execution)
    names = [step_cost.SGD] + [f"{m}:{v}" for m in METHODS for v in variants_of(m)]
    models = {}
    for name in names:
        method, _, variant = name.partition(":")
        models[name] = step_cost.make_model(network, method, steps_per_execution=steps_per_execution,
                                            jit_compile=False, weights=weights)
        with left_out(VARIANTS.get(variant, ())):  # the step is traced by the first fit
            for _ in range(2):
                step_cost.timed_fit(models[name], dataset, 2 * steps_per_execution)
    per_step = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        seconds = {}
        for name in order:
            run = step_cost.timed_fit(models[name], dataset, steps)
            if run["steps_completed"] == steps:
                seconds[name] = run["seconds"] / steps
        for name in names:
            if name in seconds and step_cost.SGD in seconds:
                per_step[name].append(seconds[name])
                ratios[name].append(seconds[name] / seconds[step_cost.SGD])
    median_ms = {name: 1e3 * float(np.median(v)) if v else None for name, v in per_step.items()}
    median_ratio = {name: float(np.median(v)) if v else None for name, v in ratios.items()}
    sgd_ms = median_ms[step_cost.SGD]
    pieces = {}
    for method in METHODS:
        full = median_ms[f"{method}:full"]
        entry = {"full_ms": full, "full_ratio": median_ratio[f"{method}:full"]}
        for variant in variants_of(method)[1:]:
            cost = full - median_ms[f"{method}:{variant}"]
            entry[f"without_{variant.removeprefix('no_')}_ms"] = median_ms[f"{method}:{variant}"]
            entry[f"cost_of_{variant.removeprefix('no_')}_ms"] = cost
            entry[f"cost_of_{variant.removeprefix('no_')}_over_sgd"] = cost / sgd_ms
        entry["noise_floor_ratio"] = 1.0 + entry["cost_of_noise_ms"] / sgd_ms
        if method == "mccadl":
            entry["c_step_fraction_of_step"] = entry["cost_of_c_step_ms"] / full
        pieces[method] = entry
    return {"timed_steps": steps, "median_ms_per_step": median_ms, "median_ratio_to_sgd": median_ratio,
            "per_step_seconds": per_step, "ratio_to_sgd": ratios, "pieces": pieces}


def markdown(results: dict) -> str:
    lines = [
        "Each sampler's step with a piece left out (`--repeats` rotated rounds, median ms per step; in "
        "brackets the median ratio to Keras SGD within a round). Cost of a piece: full step less the "
        "step without it, as a multiple of the SGD step; floor: 1 + the draws' cost over SGD.", "",
        "| network | method | full | without noise | draws' cost / SGD | floor (SGD + draws) | target "
        "| without C step | C step / step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, network in results["networks"].items():
        for method, entry in network["pieces"].items():
            target = step_cost.ratio_target(step_cost.NETWORKS[name], method)
            ms, ratio = network["median_ms_per_step"], network["median_ratio_to_sgd"]
            c_step = ("n/a", "n/a")
            if method == "mccadl":
                c_step = (f"{ms['mccadl:no_c_step']:.3g} ms ({ratio['mccadl:no_c_step']:.2f}x)",
                          f"{entry['c_step_fraction_of_step']:.2f}")
            lines.append(
                f"| {name} | {method} | {entry['full_ms']:.3g} ms ({entry['full_ratio']:.2f}x) "
                f"| {ms[method + ':no_noise']:.3g} ms ({ratio[method + ':no_noise']:.2f}x) "
                f"| {entry['cost_of_noise_over_sgd']:.2f} | {entry['noise_floor_ratio']:.2f} "
                f"| {'' if target is None else f'<= {target}'} | {c_step[0]} | {c_step[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/step_ablation", help="output folder")
    parser.add_argument("--networks", nargs="+", choices=sorted(step_cost.NETWORKS),
                        default=["emnist_mlp", "fashion_mnist_lstm", "cifar10_cnn"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps-per-execution", type=int, default=25)
    args = parser.parse_args(argv)
    results = {"machine": step_cost.machine_info(),
               "settings": {"repeats": args.repeats, "steps_per_execution": args.steps_per_execution},
               "networks": {}}
    for name in args.networks:
        results["networks"][name] = time_network(step_cost.NETWORKS[name], repeats=args.repeats,
                                                 steps_per_execution=args.steps_per_execution)
        print(f"{name} done", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(step_cost._json_safe(results), indent=1))
    table = markdown(results)
    (out / "table.md").write_text(table)
    print(table)
    return results


if __name__ == "__main__":
    main()
