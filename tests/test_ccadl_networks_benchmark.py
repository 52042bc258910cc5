"""`benchmarks.ccadl_networks`: the summary's per-seed ratios and means, and one short run of the
digits MLP end to end (the test metrics themselves are the benchmark's to measure)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import ccadl_networks


def _run(sampler, seed, nll, kinetic=1.0, configurational=1.0):
    blocks = [{"step": 100 * (i + 1), "kinetic_temperature": kinetic, "configurational_temperature": configurational}
              for i in range(3)]
    return {"sampler": sampler, "seed": seed, "test_nll": nll, "error": None, "blocks": blocks}


def test_the_summary_gives_per_seed_ratios_to_sgnht_and_the_ratio_of_the_means():
    runs = [_run("sgnht", 0, 0.4, 0.9, 0.8), _run("ccadl", 0, 0.5), _run("sgnht", 1, 0.6), _run("ccadl", 1, 0.3)]
    sgnht, ccadl = ccadl_networks.summary(runs)
    assert sgnht.startswith("sgnht test_nll: seed 0: 0.4000, T_kin 0.90 / T_conf 0.80; seed 1: 0.6000")
    assert sgnht.endswith("mean 0.5000")
    assert "seed 0: 0.5000 (1.25x SGNHT)" in ccadl
    assert "seed 1: 0.3000 (0.50x SGNHT)" in ccadl
    assert ccadl.endswith("mean 0.4000 (0.80x SGNHT's mean)")


def test_a_run_without_a_metric_is_named_and_leaves_out_the_mean():
    failed = {"sampler": "ccadl", "seed": 0, "error": "SamplerDivergedError: ...", "blocks": []}
    lines = ccadl_networks.summary([_run("sgnht", 0, 0.4), failed])
    assert lines[1] == "ccadl test_nll: seed 0: SamplerDivergedError: ..."


def test_the_digits_mlp_runs_end_to_end():
    result = ccadl_networks.run("mlp", "sgnht", 1e-3, steps=40, warmup=20, seed=0, block=10)
    assert result["error"] is None and result["steps"] >= 40
    assert result["num_samples"] > 0 and np.isfinite(result["test_nll"])
    assert 0.0 <= result["test_accuracy"] <= 1.0
    # The library's check judged the run; 20 blocks after a 20-step warm-up are too few for a verdict.
    assert result["temperature_check"]["equilibrated"] is None
    assert result["temperature_check"]["summary"].startswith("undetermined at T=1")
    result["seed"] = 0
    assert ", undetermined; mean" in ccadl_networks.summary([result])[0]
    assert ccadl_networks.verdict({**result, "temperature_check": {"equilibrated": False}}) == ", not at T"
    with pytest.raises(ValueError, match="'mnist'"):
        ccadl_networks.problem("mnist")
