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

The variants are not samplers (without noise nothing is sampled); they exist to be timed, under
`step_cost`'s names (`sgld_without_noise`, `mccadl_without_noise_and_c_step`, ...:
`step_cost.LEFT_OUT_SUFFIXES`). All run through `step_cost.time_methods`, interleaved with Keras
SGD (`--repeats` rotated rounds of `fit`, median per-step time and median ratio to SGD within a
round). The cost of a
piece is the full step less the variant without it (in ms and as a multiple of the SGD step),
with whatever overlap TensorFlow's executor finds. It bounds what any implementation that keeps
the piece as it is can reach: a cheap sampler's step is at least SGD's plus its draw,
`floor_ratio = 1 + draw / SGD`, to compare with the step-cost targets.

    python -m benchmarks.lab.step_ablation --out benchmarks/results/step_ablation [--networks emnist_mlp]
        [--repeats 5] [--steps-per-execution 25]

Outputs in `--out`: `results.json` and `table.md`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import step_cost

METHODS = ("sgld", "sghmc", "sgnht", "tact_hmc", "ccadl_diag", "mccadl")
#: Variant -> its name suffix in `step_cost` (`step_cost.LEFT_OUT_SUFFIXES`).
VARIANTS = {"no_noise": "_without_noise", "no_c_step": "_without_c_step",
            "no_noise_no_c_step": "_without_noise_and_c_step"}


def variants_of(method: str) -> list[str]:
    return list(VARIANTS) if method == "mccadl" else ["no_noise"]


def time_network(network: step_cost.Network, *, repeats: int, steps_per_execution: int) -> dict:
    """Every method and its variants through `step_cost.time_methods` (interleaved rounds with SGD)."""
    steps = step_cost.timed_steps(network, None, steps_per_execution)
    names = [step_cost.SGD] + [
        name for method in METHODS for name in [method] + [method + VARIANTS[v] for v in variants_of(method)]
    ]
    timing, _ = step_cost.time_methods(network, names, steps=steps, repeats=repeats,
                                       steps_per_execution=steps_per_execution, jit_compile=False,
                                       per_example_method=None)
    median_ms = {name: timing[name]["median_ms_per_step"] for name in names}
    median_ratio = {name: timing[name]["median_ratio_to_sgd"] for name in names}
    sgd_ms = median_ms[step_cost.SGD]
    pieces = {}
    for method in METHODS:
        full = median_ms[method]
        entry = {"full_ms": full, "full_ratio": median_ratio[method]}
        for variant in variants_of(method):
            piece = variant.removeprefix("no_")
            without = median_ms[method + VARIANTS[variant]]
            entry[f"without_{piece}_ms"] = without
            entry[f"without_{piece}_ratio"] = median_ratio[method + VARIANTS[variant]]
            entry[f"cost_of_{piece}_ms"] = full - without
            entry[f"cost_of_{piece}_over_sgd"] = (full - without) / sgd_ms
        entry["noise_floor_ratio"] = 1.0 + entry["cost_of_noise_ms"] / sgd_ms
        if method == "mccadl":
            entry["c_step_fraction_of_step"] = entry["cost_of_c_step_ms"] / full
        pieces[method] = entry
    return {"timed_steps": steps, "timing": timing, "pieces": pieces}


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
            c_step = ("n/a", "n/a")
            if method == "mccadl":
                c_step = (f"{entry['without_c_step_ms']:.3g} ms ({entry['without_c_step_ratio']:.2f}x)",
                          f"{entry['c_step_fraction_of_step']:.2f}")
            lines.append(
                f"| {name} | {method} | {entry['full_ms']:.3g} ms ({entry['full_ratio']:.2f}x) "
                f"| {entry['without_noise_ms']:.3g} ms ({entry['without_noise_ratio']:.2f}x) "
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
