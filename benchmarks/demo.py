"""The offline demo (`make demo`): the benchmark runner on scikit-learn's 8x8 digits.

    python -m benchmarks.demo --out runs/demo [--quick] [--num-chains C]

Runs `configs/digits.yaml` through `benchmarks.run`: a 64-50-10 MLP trained with Adam and
momentum SGD (point estimates, at the settings that the tuned benchmark `configs/digits_tuned.yaml`
chose on a validation split) and sampled with the samplers the config lists (those registered in
`keras_thermo.samplers`) at their defaults, as the README's quick start runs them, at 0% and 30%
permuted labels; each sampler is evaluated by its posterior-averaged predictive distribution. Then the OOD study: trained on digits 0-4, how well
each method's predictive entropy (and a sampler's mutual information) separates the test images
of 5-9 from held-out ones of 0-4 (AUROC). No download: the data ships with scikit-learn. Prints
the tables (accuracy, NLL, expected log loss, ECE, Brier, OOD AUROC), one line per sampler run
saying whether its temperature check found it at T, and writes `results.json`,
`table.md`, plots and TensorBoard logs (with the samplers' diagnostics: kinetic_temperature, xi,
potential, step_size) to `--out`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchmarks import run

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "digits.yaml"
REAL_DATA_DIR = ROOT / "data" / "real"  # where `make real-data` puts real MNIST and Fashion-MNIST


def real_data_hint(data_dir: Path = REAL_DATA_DIR) -> str | None:
    """One line on running the real-data comparison, where real MNIST is in `data_dir`; else None."""
    from keras_thermo import data as kt_data  # noqa: PLC0415 (TensorFlow import is slow)

    if kt_data.idx_files(data_dir, kt_data.MNIST, "train") is None:
        return None
    return (f"Real MNIST found in {data_dir}: the comparisons on it, `python -m benchmarks.run "
            f"configs/mnist_mlp_real.yaml --data-dir {data_dir} --out runs/mnist_mlp_real` (tuned Adam/SGD against "
            f"every sampler, OOD on Fashion-MNIST) and `python -m benchmarks.logistic_regression "
            f"--config configs/logistic_mnist.yaml --out runs/logistic_mnist` (docs/real_data.md).")


def temperature_lines(results: dict) -> list[str]:
    """One line per sampler run with the verdict of its `EquilibrationCheck` (the library's
    `keras_thermo.equilibration.summary` of the check's report, stored by the runner), e.g.
    `mCCAdL, 0% permuted labels: at T=1 (kinetic ..., configurational ...; in band from step 2856)`,
    or `NOT at T` with the check's cause."""
    lines = []
    for record in results["runs"] + results["ood_runs"]:
        if record["kind"] != "sampler":
            continue
        where = ("OOD study" if any(record is r for r in results["ood_runs"])
                 else f"{round(100 * record['label_noise'])}% permuted labels")
        summary = (record.get("temperatures") or {}).get("summary") or "no temperature check ran"
        lines.append(f"{record['label']}, {where}: {summary}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    parser.add_argument("--quick", action="store_true",
                        help="a few epochs of the first optimizer and the first sampler only (smoke test)")
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
    if args.quick:
        kinds = {key: "sampler" if "sampler" in config["methods"][key] else "optimizer" for key in keys}
        keys = [next(k for k in keys if kinds[k] == kind) for kind in ("optimizer", "sampler")
                if kind in kinds.values()]
    results = run.run_config(config, args.out, quick=args.quick, methods=keys, verbose=args.verbose)

    print()
    print((Path(args.out) / "table.md").read_text(encoding="utf-8"))
    for record in results["runs"]:
        # Each sampler against the first optimizer at the same label noise.
        baseline = next((r for r in results["runs"] if r["kind"] == "optimizer"
                         and r["label_noise"] == record["label_noise"]), None)
        if baseline is None or record["kind"] != "sampler" or record["metrics"]["nll"] is None:
            continue
        ours, theirs = record["metrics"], baseline["metrics"]
        print(
            f"{round(100 * record['label_noise'])}% permuted: {record['label']} posterior average vs "
            f"{baseline['label']}: NLL {ours['nll']:.4f} vs {theirs['nll']:.4f}, ECE {ours['ece']:.4f} vs "
            f"{theirs['ece']:.4f}, accuracy {100 * ours['accuracy']:.2f}% vs {100 * theirs['accuracy']:.2f}% "
            f"({ours['num_samples']} samples; configurational temperature "
            f"{run._temperature(record['temperatures'], 'configurational')}, T = "
            f"{record['temperatures']['target']:g})."
        )
    ood = results["config"].get("ood")
    if results["ood_runs"]:
        print(f"\nOOD AUROC, test digits {ood['out_classes']} against held-out {ood['in_classes']} "
              f"(trained on {ood['in_classes']}):")
        for record in results["ood_runs"]:
            scores = record["ood"]
            mutual = scores["auroc_mutual_information"]
            print(f"  {record['label']}: predictive entropy {run._number(scores['auroc_predictive_entropy'], 3)}"
                  + ("" if mutual is None else f", mutual information {mutual:.3f}"))
    lines = temperature_lines(results)
    if lines:
        print("\nIs each sampler at its temperature T? (the EquilibrationCheck of every sampler run, every weight "
              "variable judged after the burn-in; the figures in brackets are the whole net's, the cause names the "
              "variable furthest off; the averages above started where the whole net was first at T. What these "
              "runs give at the library's defaults, and with the change each cause names: docs/benchmarks.md, "
              "'The demo', and docs/temperature.md, 'One thermostat per tensor' and 'What the warning advises'.)")
        for line in lines:
            print(f"  {line}")
    minutes = results["seconds"] / 60
    print(f"\nDone in {math.floor(minutes)} min {results['seconds'] % 60:.0f} s. Plots and results in "
          f"{args.out}/; TensorBoard: tensorboard --logdir {args.out}/tensorboard")
    hint = real_data_hint()
    if hint:
        print(hint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
