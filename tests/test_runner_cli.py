"""Every shipped config, run the way README.md shows it: in a fresh process, at the default verbosity.

Runner configs: `python -m benchmarks.run <config> --quick --mock-data --out DIR` (no `--verbose`:
the default is what a user gets). The configs of other scripts run with their own `--config ...
--out DIR --quick`. The default suite runs the README's runner config (`DEFAULT`); the slow
suite runs them all.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run
from keras_thermo.testing import load_strict_json

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
# Configs that other scripts read, with the script README.md runs them with.
OTHER_SCRIPTS = {
    "logistic_digits": "benchmarks.logistic_regression",
    "logistic_mnist": "benchmarks.logistic_regression",
    "regression_w2": "benchmarks.regression_w2",
    "tact_synthetic": "benchmarks.tact_synthetic",
}
RUNNER_CONFIGS = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem not in OTHER_SCRIPTS)
# The runner config run from the command line in the default suite: the README's (every optimizer
# and sampler, TACT-HMC included, on the MLP task; test_default_configs_cover_every_runner_code_path).
DEFAULT = ["emnist_all"]
# Left to the slow suite, each 15-30 s more: tests/test_runner.py runs these paths in-process (the
# digits, a tune: block, SGLD and the schedules: test_tuning_never_reads_the_test_split...,
# test_schedules_reach_the_sampler..., test_demo_quick...), tests/test_data.py and
# tests/test_networks.py the CNN and LSTM tasks' data and networks, and tests/test_real_data.py
# MNIST from IDX files with another dataset's OOD scores.
SLOW_ONLY_FEATURES = {
    ("ood",), ("prior", "hierarchical"), ("prior", "fan_in"), ("schedule", "ramp"), ("dataset", "cifar10"),
    ("dataset", "fashion_mnist"), ("dataset", "mnist"), ("ood", "dataset"),
    ("dataset", "digits"), ("method", "sgld"), ("schedule", "cyclical"), ("tune",),
}
TIMEOUT_S = 900  # the longest, digits_tuned_each, takes about 2.5 minutes on 2 busy cores


def _run(module, *args):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert completed.returncode == 0, f"{module} {' '.join(map(str, args))}:\n{completed.stderr[-4000:]}"
    return completed


def _run_runner_config(name, out):
    completed = _run("benchmarks.run", f"configs/{name}.yaml", "--quick", "--mock-data", "--out", out)
    # Off a terminal the default verbosity writes one line per epoch (no progress bar).
    assert re.search(r"^Epoch 1/\d+\n\d+/\d+ - ", completed.stdout, re.MULTILINE), completed.stdout[-2000:]
    results = load_strict_json(out / "results.json")
    assert results["quick"] and results["mock_data"]
    runs = results["runs"] + results["ood_runs"]
    assert runs
    for record in runs:
        assert record["status"] == "ok", (name, record["method"], record["message"])
        metrics = record["metrics"]
        assert metrics["num_samples"] >= 1
        assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["nll"] > 0 and 0 <= metrics["ece"] <= 1
        # One entry per epoch in each curve the plots use.
        curve = "posterior_accuracy" if record["kind"] == "sampler" else "test_accuracy"
        assert len(record["history"][curve]) == len(record["history"]["epoch"]) >= 1
    table = (out / "table.md").read_text(encoding="utf-8")
    for record in results["runs"]:
        assert f"| {record['label']} |" in table
    for plot in results["plots"]:
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Wrote {out}/results.json" in completed.stdout
    return results


def _features(name):
    """What a runner config exercises: its dataset, methods, blocks, schedules and priors."""
    config = run.apply_quick(run.load_config(CONFIGS / f"{name}.yaml"))
    features = {("dataset", config["data"]["dataset"])}
    features |= {("tune",)} if config.get("tune") else set()
    if config.get("ood"):  # a digit-class study, or another dataset's test split
        features.add(("ood", "dataset") if "dataset" in config["ood"] else ("ood",))
    for method in config["methods"].values():
        features.add(("method", method.get("sampler") or method["optimizer"]))
        for key in run.SCHEDULE_KEYS:
            if method.get(key):
                features.add(("schedule", method[key]["kind"]))
        if method.get("prior"):
            features.add(("prior", method["prior"]["kind"]))
    return features


def test_every_config_is_a_runner_config_or_named_with_its_script():
    for name in RUNNER_CONFIGS:
        run.load_config(CONFIGS / f"{name}.yaml")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, module in OTHER_SCRIPTS.items():
        assert (CONFIGS / f"{name}.yaml").exists()
        source = (ROOT / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8")
        assert "--quick" in source  # how the slow test runs it
        with pytest.raises(run.ConfigError):  # not something the runner takes
            run.load_config(CONFIGS / f"{name}.yaml")
    assert "-m benchmarks.run configs/emnist_all.yaml --quick --mock-data --out" in readme


def test_default_configs_cover_every_runner_code_path():
    assert set(DEFAULT) <= set(RUNNER_CONFIGS)
    everything = set().union(*map(_features, RUNNER_CONFIGS))
    covered = set().union(*map(_features, DEFAULT))
    assert SLOW_ONLY_FEATURES <= everything
    assert everything - SLOW_ONLY_FEATURES <= covered, everything - SLOW_ONLY_FEATURES - covered


@pytest.mark.parametrize("name", DEFAULT)
def test_default_runner_configs_run_quick_on_mock_data_from_the_command_line(name, tmp_path):
    _run_runner_config(name, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNER_CONFIGS)
def test_every_runner_config_runs_quick_on_mock_data_from_the_command_line(name, tmp_path):
    _run_runner_config(name, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OTHER_SCRIPTS))
def test_other_scripts_configs_run_quick(name, tmp_path):
    out = tmp_path / "out"
    completed = _run(OTHER_SCRIPTS[name], "--config", f"configs/{name}.yaml", "--out", out, "--quick")
    if completed.stdout.startswith("Skipping"):  # a TFDS dataset that is not prepared here
        pytest.skip(completed.stdout.strip())
    assert (out / "results.json").exists()
