"""The offline demo (`make demo`): the benchmark runner on scikit-learn's 8x8 digits.

    python -m benchmarks.demo --out runs/demo [--quick] [--num-chains C]

Runs `configs/digits.yaml` through `benchmarks.run`: a 64-50-10 MLP trained with Adam (a point
estimate) and sampled with SGNHT, mCCAdL and TACT-HMC (those registered in
`keras_thermo.samplers`) on the same budget, each sampler evaluated by its posterior-averaged
predictive distribution. No download: the data ships with scikit-learn. Prints a table of test
accuracy, NLL, expected log loss, calibration error (ECE) and Brier score, and writes
`results.json`, `table.md`, plots and TensorBoard logs (with the samplers' diagnostics:
kinetic_temperature, xi, potential, step_size) to `--out`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchmarks import run

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "digits.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    parser.add_argument("--quick", action="store_true", help="a few epochs only (smoke test)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=0, help="Keras fit verbosity")
    parser.add_argument("--num-chains", type=int, default=None,
                        help="chains per sampler in one fit, pooled in the posterior average (config: training.num_chains)")
    args = parser.parse_args(argv)

    config = run.load_config(CONFIG)
    if args.num_chains is not None:
        if args.num_chains < 1:
            parser.error(f"--num-chains must be a positive integer, got {args.num_chains}")
        config["training"]["num_chains"] = args.num_chains
    keys = []
    for key, method in config["methods"].items():
        if "sampler" in method and not run.sampler_is_registered(method["sampler"]):
            print(f"(skipping {method['label']}: sampler {method['sampler']!r} is not available in this version)")
            continue
        keys.append(key)
    results = run.run_config(config, args.out, quick=args.quick, methods=keys, verbose=args.verbose)

    print()
    print((Path(args.out) / "table.md").read_text(encoding="utf-8"))
    baseline = next((r for r in results["runs"] if r["kind"] == "optimizer"), None)
    for record in results["runs"]:
        if baseline is None or record["kind"] != "sampler" or record["metrics"]["nll"] is None:
            continue
        ours, theirs = record["metrics"], baseline["metrics"]
        print(
            f"{record['label']} posterior average vs {baseline['label']}: NLL {ours['nll']:.4f} vs "
            f"{theirs['nll']:.4f}, ECE {ours['ece']:.4f} vs {theirs['ece']:.4f}, accuracy "
            f"{100 * ours['accuracy']:.2f}% vs {100 * theirs['accuracy']:.2f}% "
            f"({ours['num_samples']} samples; configurational temperature "
            f"{run._temperature(record['temperatures'], 'configurational')}, T = "
            f"{record['temperatures']['target']:g})."
        )
    minutes = results["seconds"] / 60
    print(f"\nDone in {math.floor(minutes)} min {results['seconds'] % 60:.0f} s. Plots and results in "
          f"{args.out}/; TensorBoard: tensorboard --logdir {args.out}/tensorboard")
    return 0


if __name__ == "__main__":
    sys.exit(main())
