"""`benchmarks.run --strategy`: building, compiling and fitting every method under tf.distribute."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from benchmarks import run

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


def _two_replica_strategy():
    # tests/conftest.py splits the CPU into two logical devices for the whole session.
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return tf.distribute.MirroredStrategy(devices)


@pytest.mark.slow  # every method under a 2-replica strategy through the CLI: ~17 s on 2 cores
def test_mirrored_run_builds_every_method_under_the_strategy(tmp_path):
    """A quick digits run on 2 logical CPUs: a baseline and mCCAdL (whose C step gathers rows)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(
        f"extends: {CONFIGS / 'digits.yaml'}\n"
        "only: [adam, mccadl]\n"
        "training: {batch_size: 64}\n"
        "quick: {epochs: 2, burn_in_epochs: 1, every_n_steps: 7}\n"
        "ood: null\n"
    )
    out = tmp_path / "out"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", str(config), "--quick", "--strategy", "mirrored",
         "--logical-cpus", "2", "--out", str(out), "--verbose", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "steps_per_execution 21 -> 1" in completed.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["distribute"] == {
        "strategy": "mirrored", "num_replicas": 2, "num_workers": 1, "worker_index": 0,
    }
    assert results["config"]["training"]["steps_per_execution"] == 1
    steps_per_epoch = 1346 // 64  # N = 1346 digits training examples; the runner drops a partial batch
    sampler_runs = 0
    for record in results["runs"]:
        assert record["status"] == "ok", record["message"]
        assert record["steps"] == 2 * steps_per_epoch
        assert len(record["history"]["loss"]) == 2
        assert 0.0 < record["metrics"]["nll"] < 2.5  # finite, and better than uniform (ln 10)
        if record["kind"] == "sampler":
            sampler_runs += 1
            # Burn-in of one epoch (21 steps), then every 7th step: 28, 35, 42.
            assert record["metrics"]["num_samples"] == len(range(steps_per_epoch + 7, 2 * steps_per_epoch + 1, 7))
    assert sampler_runs == 1


def test_adapt_to_strategy_checks_the_global_batch_and_resets_steps_per_execution():
    strategy = _two_replica_strategy()
    config = run.load_config(CONFIGS / "digits.yaml")
    configured = config["training"]["steps_per_execution"]
    assert configured > 1
    logged = []
    adapted = run.adapt_to_strategy(config, strategy, log=logged.append)
    assert adapted["training"]["steps_per_execution"] == 1
    assert config["training"]["steps_per_execution"] == configured  # the caller's config is untouched
    assert len(logged) == 1
    assert run.adapt_to_strategy(config, None) is config
    config["training"]["batch_size"] = 33
    with pytest.raises(run.ConfigError, match="batch_size.*2 replicas, got 33"):
        run.adapt_to_strategy(config, strategy)


def test_describe_strategy_and_output_folder():
    strategy = _two_replica_strategy()
    assert run.describe_strategy(strategy) == {
        "strategy": "mirrored", "num_replicas": 2, "num_workers": 1, "worker_index": 0,
    }
    assert run.output_folder("runs/x", strategy) == Path("runs/x")
    assert run.describe_strategy(None)["num_replicas"] == 1


def test_bad_strategy_arguments_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="`strategy` must be one of .*'ring'"):
        run.make_strategy("ring")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        run.make_strategy("multi_worker")
    assert run.make_strategy("none") is None
    with pytest.raises(ValueError, match="`num_devices` must be a positive integer, got 0"):
        run.split_cpu(0)
    with pytest.raises(SystemExit):
        run.parse_args(["configs/digits.yaml", "--logical-cpus", "0"])
    with pytest.raises(SystemExit):
        run.parse_args(["configs/digits.yaml", "--strategy", "ring"])
