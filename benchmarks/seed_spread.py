"""The spread over seeds of runner results: the same config run with different `training.seed`s
(initial weights, minibatch order, label permutations and the validation hold-out all follow
it), each method's test metrics per seed, their mean and standard deviation, and each method's
difference from a reference method paired by seed (the pairing removes what a seed does to
every method alike).

    python -m benchmarks.seed_spread benchmarks/results/digits_tuned_schedules \\
        benchmarks/results/digits_tuned_schedules_seed1 benchmarks/results/digits_tuned_schedules_seed2 \\
        --reference sgnht --out benchmarks/results/digits_tuned_schedules/seed_spread.md

Writes a Markdown table (or prints it without `--out`). A run that did not end `ok` counts as
missing (NaN) for its seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

#: (results key, column title, decimals, scale) for the test metrics and the OOD AUROCs.
METRICS = (
    ("accuracy", "accuracy (%)", 2, 100.0),
    ("nll", "NLL", 4, 1.0),
    ("ece", "ECE", 4, 1.0),
    ("brier", "Brier", 4, 1.0),
)
OOD_METRICS = (
    ("auroc_predictive_entropy", "OOD AUROC, entropy", 3, 1.0),
    ("auroc_mutual_information", "OOD AUROC, MI", 3, 1.0),
)


def _value(value) -> float:
    return math.nan if value is None else float(value)


def collect(folders: list[Path]) -> tuple[dict, dict, list[int]]:
    """`(values, labels, seeds)`: `values[(method, level, metric)]` is the list of one value
    per folder (level "ood" for the OOD study), `labels[method]` the table label."""
    values: dict = {}
    labels: dict = {}
    seeds = []
    for index, folder in enumerate(folders):
        results = json.loads((Path(folder) / "results.json").read_text())
        seeds.append(int(results["config"]["training"]["seed"]))
        for run in results["runs"]:
            labels.setdefault(run["method"], run["label"])
            ok = run["status"] == "ok"
            for key, *_ in METRICS:
                cell = values.setdefault((run["method"], run["label_noise"], key), [math.nan] * len(folders))
                cell[index] = _value(run["metrics"].get(key)) if ok else math.nan
        for run in results.get("ood_runs") or []:
            ok = run["status"] == "ok"
            for key, *_ in OOD_METRICS:
                cell = values.setdefault((run["method"], "ood", key), [math.nan] * len(folders))
                cell[index] = _value(run["ood"].get(key)) if ok else math.nan
    return values, labels, seeds


def _mean_sd(values: np.ndarray, decimals: int) -> str:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return "n/a"
    sd = f" +- {np.std(finite, ddof=1):.{decimals}f}" if len(finite) > 1 else ""
    missing = f" ({len(values) - len(finite)} missing)" if len(finite) < len(values) else ""
    return f"{np.mean(finite):.{decimals}f}{sd}{missing}"


def markdown(values: dict, labels: dict, seeds: list[int], reference: str | None) -> str:
    """Per level and metric: each seed's value, mean +- sd, and the paired difference from
    `reference` (mean +- sd over seeds)."""
    levels = sorted({level for (_, level, _) in values if level != "ood"}) + (
        ["ood"] if any(level == "ood" for (_, level, _) in values) else [])
    seed_columns = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"Seeds {seeds}; mean +- standard deviation over seeds; `- {reference}`: the method's value minus "
        f"{labels.get(reference, reference)}'s with the same seed (mean +- sd of the paired differences)."
        if reference else f"Seeds {seeds}; mean +- standard deviation over seeds.",
        "",
        f"| metric | level | method | {seed_columns} | mean +- sd |" + (f" - {reference} |" if reference else ""),
        "|---|---|---|" + "---:|" * (len(seeds) + 1) + ("---:|" if reference else ""),
    ]
    for level in levels:
        metrics = OOD_METRICS if level == "ood" else METRICS
        for key, title, decimals, scale in metrics:
            for method, label in labels.items():
                cell = values.get((method, level, key))
                if cell is None:
                    continue
                row = np.array(cell) * scale
                shown = " | ".join("n/a" if not np.isfinite(v) else f"{v:.{decimals}f}" for v in row)
                level_name = "OOD" if level == "ood" else f"{round(100 * level)}%"
                line = f"| {title} | {level_name} | {label} | {shown} | {_mean_sd(row, decimals)} |"
                if reference:
                    base = values.get((reference, level, key))
                    difference = "" if base is None or method == reference else _mean_sd(
                        row - np.array(base) * scale, decimals)
                    line += f" {difference} |"
                lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="runner output folders (results.json), one per seed")
    parser.add_argument("--reference", default=None, help="method key that the paired differences are taken from")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to write (default: print)")
    args = parser.parse_args(argv)
    values, labels, seeds = collect(args.folders)
    if args.reference is not None and args.reference not in labels:
        parser.error(f"--reference {args.reference!r} is not a method of these results; they have {sorted(labels)}.")
    text = markdown(values, labels, seeds, args.reference)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
