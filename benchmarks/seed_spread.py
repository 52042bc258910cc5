"""The spread over seeds of runner results: the same config run with different `training.seed`s
(initial weights, minibatch order, label permutations and the validation hold-out all follow
it), each method's test metrics per seed, their mean and standard deviation, and each method's
difference from a reference method paired by seed (the pairing removes what a seed does to
every method alike).

    python -m benchmarks.seed_spread \\
        benchmarks/results/digits_tuned_schedules,benchmarks/results/digits_tuned_schedules_burn_in \\
        benchmarks/results/digits_tuned_schedules_seed1,benchmarks/results/digits_tuned_schedules_burn_in_seed1 \\
        benchmarks/results/digits_tuned_schedules_seed2,benchmarks/results/digits_tuned_schedules_burn_in_seed2 \\
        --reference sgnht --out benchmarks/results/digits_tuned_schedules/seed_spread.md

Each argument is one seed: a runner output folder, or several joined by commas (runs of the
same seed from different configs, e.g. a variant run later), whose methods are pooled. Methods
are told apart by their labels (a variant may reuse a method key under another label).
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


def _seed_results(group: str | Path) -> tuple[int, list[dict], list[dict]]:
    """`(seed, runs, ood_runs)` of one seed's folders (comma-separated); they must share the seed."""
    runs, ood_runs, seeds = [], [], set()
    for folder in str(group).split(","):
        results = json.loads((Path(folder) / "results.json").read_text())
        seeds.add(int(results["config"]["training"]["seed"]))
        runs += results["runs"]
        ood_runs += results.get("ood_runs") or []
    if len(seeds) != 1:
        raise ValueError(
            f"The folders {str(group)!r} were run with different seeds {sorted(seeds)}; give one seed each.")
    return seeds.pop(), runs, ood_runs


def collect(folders: list[str | Path]) -> tuple[dict, dict, list[int]]:
    """`(values, labels, seeds)`: `values[(label, level, metric)]` is the list of one value
    per seed (level "ood" for the OOD study), `labels[label]` the method key first seen under
    that label. Each entry of `folders` is one seed: a folder, or several joined by commas."""
    values: dict = {}
    labels: dict = {}
    seeds = []
    for index, group in enumerate(folders):
        seed, runs, ood_runs = _seed_results(group)
        seeds.append(seed)
        for run in runs:
            labels.setdefault(run["label"], run["method"])
            ok = run["status"] == "ok"
            for key, *_ in METRICS:
                cell = values.setdefault((run["label"], run["label_noise"], key), [math.nan] * len(folders))
                cell[index] = _value(run["metrics"].get(key)) if ok else math.nan
        for run in ood_runs:
            ok = run["status"] == "ok"
            for key, *_ in OOD_METRICS:
                cell = values.setdefault((run["label"], "ood", key), [math.nan] * len(folders))
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
    the method labelled `reference` (mean +- sd over seeds)."""
    levels = sorted({level for (_, level, _) in values if level != "ood"}) + (
        ["ood"] if any(level == "ood" for (_, level, _) in values) else [])
    seed_columns = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"Seeds {seeds}; mean +- standard deviation over seeds; `- {reference}`: the method's value minus "
        f"{reference}'s with the same seed (mean +- sd of the paired differences)."
        if reference else f"Seeds {seeds}; mean +- standard deviation over seeds.",
        "",
        f"| metric | level | method | {seed_columns} | mean +- sd |" + (f" - {reference} |" if reference else ""),
        "|---|---|---|" + "---:|" * (len(seeds) + 1) + ("---:|" if reference else ""),
    ]
    for level in levels:
        metrics = OOD_METRICS if level == "ood" else METRICS
        for key, title, decimals, scale in metrics:
            for label in labels:
                cell = values.get((label, level, key))
                if cell is None:
                    continue
                row = np.array(cell) * scale
                shown = " | ".join("n/a" if not np.isfinite(v) else f"{v:.{decimals}f}" for v in row)
                level_name = "OOD" if level == "ood" else f"{round(100 * level)}%"
                line = f"| {title} | {level_name} | {label} | {shown} | {_mean_sd(row, decimals)} |"
                if reference:
                    base = values.get((reference, level, key))
                    difference = "" if base is None or label == reference else _mean_sd(
                        row - np.array(base) * scale, decimals)
                    line += f" {difference} |"
                lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+",
                        help="runner output folders (results.json), one per seed; several of a seed joined by commas")
    parser.add_argument("--reference", default=None,
                        help="method key or label that the paired differences are taken from")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to write (default: print)")
    args = parser.parse_args(argv)
    values, labels, seeds = collect(args.folders)
    reference = args.reference
    if reference is not None and reference not in labels:
        by_key = [label for label, key in labels.items() if key == reference]
        if not by_key:
            parser.error(f"--reference {reference!r} is neither a method key nor a label of these results; they have "
                         f"{sorted(labels.items())}.")
        reference = by_key[0]
    text = markdown(values, labels, seeds, reference)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
