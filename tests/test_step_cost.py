"""Smoke test of `benchmarks.step_cost`: the quick mode runs and writes complete, strict JSON.

No timing is asserted (the machine is shared); only that every number exists, is positive and
finite, and that the derived fields (ratios, targets, the C step's tau) follow from the measured
ones.
"""

import math

import numpy as np
import pytest

from benchmarks import step_cost
from keras_thermo.testing import load_strict_json

SAMPLERS = ["sgld", "sghmc", "sgnht", "sgnht_symmetric", "tact_hmc", "ccadl_diag", "mccadl",
            "ccadl_diag_vectorized", "mccadl_vectorized", "mccadl_without_c_step"]
PIECES = ["forward_backward", "noise_draws", "per_example_gradients", "per_example_gradients_vectorized",
          "diagonal_covariance", "covariance_factor", "c_step"]


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("step_cost")
    returned = step_cost.main(["--quick", "--out", str(out)])
    return out, returned


@pytest.mark.slow  # the quick benchmark run takes ~30 s on 2 cores
def test_quick_mode_times_every_method(quick_run):
    out, returned = quick_run
    results = load_strict_json(out / "results.json")
    assert list(results["networks"]) == ["digits_mlp"]
    settings = results["settings"]
    assert settings["methods"] == ["keras_sgd", *SAMPLERS]
    assert (settings["steps_per_execution"], settings["repeats"], settings["jit_compile"]) == (5, 2, False)
    assert results["machine"]["cpu_count"] >= 1 and results["machine"]["tensorflow"]
    digits = results["networks"]["digits_mlp"]
    assert digits["timed_steps"] == 10
    for method in settings["methods"]:
        entry = digits["timing"][method]
        assert entry["error"] is None, (method, entry["error"])
        # Every repetition ran all its steps (no NaN-guard stop).
        assert entry["steps_completed"] == [10, 10] and entry["all_steps_completed"]
        for key in ("median_ms_per_step", "median_ratio_to_sgd", "loop_median_ms_per_step",
                    "loop_median_ratio_to_sgd"):
            assert _positive_finite(entry[key]), (method, key, entry[key])
        assert len(entry["per_step_seconds"]) == len(entry["ratio_to_sgd"]) == 2
        # Each ratio pairs the method with SGD of the same repetition.
        sgd = digits["timing"]["keras_sgd"]["per_step_seconds"]
        for seconds, sgd_seconds, ratio in zip(entry["per_step_seconds"], sgd, entry["ratio_to_sgd"]):
            assert ratio == pytest.approx(seconds / sgd_seconds, rel=1e-12)
    assert digits["timing"]["keras_sgd"]["ratio_to_sgd"] == [1.0, 1.0]
    assert returned["networks"]["digits_mlp"]["timing"]["mccadl"]["median_ms_per_step"] == pytest.approx(
        digits["timing"]["mccadl"]["median_ms_per_step"])


@pytest.mark.slow  # the quick benchmark run takes ~30 s on 2 cores
def test_quick_mode_breakdown_and_targets(quick_run):
    out, _ = quick_run
    results = load_strict_json(out / "results.json")
    digits = results["networks"]["digits_mlp"]
    breakdown = digits["breakdown"]
    assert breakdown["per_example_path"] == "layers"  # digits_mlp: all Dense, every layer has a rule
    for piece in PIECES:
        if piece == "covariance_factor":
            # On the engine path `Gc` is an operator over the blocks: no separate piece.
            assert breakdown["pieces_ms"][piece] is None
            continue
        assert breakdown["pieces_ms"][piece] >= 0 and math.isfinite(breakdown["pieces_ms"][piece])
        assert _positive_finite(breakdown["pieces_raw_ms"][piece])
        mccadl_ms = digits["timing"]["mccadl"]["median_ms_per_step"]
        assert breakdown["fraction_of_mccadl_step"][piece] == pytest.approx(
            breakdown["pieces_ms"][piece] / mccadl_ms)
    # digits_mlp(50) has 64*50 + 50 + 50*10 + 10 = 3760 weights; batch 32.
    assert (breakdown["num_params"], breakdown["batch_size"]) == (3760, 32)
    # tau = h (h/2) N^2 / (n (n-1)) with h = 5e-3, N = 1346, n = 32 (T = M = 1), by hand.
    assert breakdown["tau"] == pytest.approx(5e-3 * 2.5e-3 * 1346**2 / (32 * 31), rel=1e-12)
    assert breakdown["c_step_method"] in ("taylor", "gram") and breakdown["c_step_matvecs"] >= 1

    targets = {row["quantity"]: row for row in results["targets"]}
    with_targets = [m for m in SAMPLERS if not m.endswith(("_vectorized", "_without_c_step"))]
    assert len(targets) == len(with_targets) + 2
    for method in with_targets:
        row = targets[f"{method} / keras_sgd step time"]
        bound = {"ccadl_diag": 2.0, "mccadl": 2.5}.get(method, 1.3)  # digits is an MLP
        assert row["target"] == f"<= {bound}"
        assert row["measured"] == digits["timing"][method]["median_ratio_to_sgd"]
        assert row["met"] == (row["measured"] <= bound)
    # The C step's share in the step: 1 - t(without it) / t(mCCAdL), per repetition, median.
    full, without = (digits["timing"][m]["per_step_seconds"] for m in ("mccadl", "mccadl_without_c_step"))
    c_row = targets["C step / mCCAdL step (in the step)"]
    assert c_row["measured"] == pytest.approx(float(np.median([1 - b / a for a, b in zip(full, without)])))
    assert c_row["met"] == (c_row["measured"] <= 0.25)
    reference = targets["C step / mCCAdL step (timed apart)"]
    assert reference["measured"] == breakdown["fraction_of_mccadl_step"]["c_step"] and reference["met"] is None

    # Each layer's rule on the engine path: both Dense layers as factors, every piece timed.
    rules = digits["rule_costs"]
    assert [(r["layer"], r["forms"]) for r in rules] == [("hidden1", ["FactorBlock"]), ("logits", ["FactorBlock"])]
    assert [r["num_params"] for r in rules] == [64 * 50 + 50, 50 * 10 + 10]
    for rule in rules:
        assert set(rule["ms"]) == {"blocks", "variances", "product", "gram"}
        assert all(ms >= 0 and math.isfinite(ms) for ms in rule["ms"].values())
    # The vectorized comparison has no target; the engine runs have theirs.
    quantities = [row["quantity"] for row in results["targets"]]
    assert "ccadl_diag / keras_sgd step time" in quantities
    assert not any("vectorized" in quantity or "without" in quantity for quantity in quantities)

    table = (out / "table.md").read_text()
    for method in ["keras_sgd", *SAMPLERS]:
        assert f"| {method} |" in table
    assert "| c_step |" in table


def test_timed_steps_round_up_to_whole_executions():
    assert step_cost.timed_steps(step_cost.NETWORKS["emnist_mlp"], None, 50) == 200
    assert step_cost.timed_steps(step_cost.NETWORKS["cifar10_cnn"], None, 30) == 120
    assert step_cost.timed_steps(step_cost.NETWORKS["cifar10_cnn"], 60, 30) == 60


def test_steps_must_be_whole_executions():
    with pytest.raises(ValueError, match="--steps.*multiple of --steps-per-execution"):
        step_cost.parse_args(["--steps", "25", "--steps-per-execution", "10"])
    with pytest.raises(ValueError, match="--repeats"):
        step_cost.parse_args(["--repeats", "0"])


def test_memory_report_takes_the_larger_window_and_marks_what_was_not_read():
    warm_up = {"vm_hwm_mib": 900.0, "vm_rss_mib": 890.0, "ru_maxrss_mib": 900.0}
    end = {"vm_hwm_mib": 880.0, "vm_rss_mib": 860.0, "ru_maxrss_mib": 880.0}  # both reset
    report = step_cost.memory_report(warm_up, {"vm_rss_mib": 850.0}, end, end)
    assert report == {"vm_hwm_mib": 900.0, "ru_maxrss_mib": 900.0, "vm_hwm_through_warm_up_mib": 900.0,
                      "vm_rss_held_mib": 850.0, "vm_hwm_steps_mib": 880.0}
    # Neither released nor reset: the end reading is the whole process's peak.
    unreset = step_cost.memory_report(warm_up, None, None, {"vm_hwm_mib": 910.0, "ru_maxrss_mib": 910.0})
    assert unreset["vm_hwm_mib"] == 910.0
    assert unreset["vm_rss_held_mib"] is None and unreset["vm_hwm_steps_mib"] is None
    table = step_cost.memory_table({"net": {
        "repeats": 1, "median_vm_hwm_mib": {"keras_sgd": 700.0},
        "extra_peak_over_sgd_mib": {"ccadl_diag": 30.0, "mccadl": 60.0}, "g_size_mib": 4.0,
        "target_extra_mccadl_mib": 100, "extra_held_over_sgd_mib": {"ccadl_diag": None, "mccadl": None},
        "extra_steps_peak_over_sgd_mib": {"ccadl_diag": 12.0, "mccadl": None}}})
    assert "| net | 700 | 30 | 60 (<= 100) | 4.0 | n/a | n/a | 12 | n/a |" in table


def test_reset_peak_memory_says_whether_it_took_effect(monkeypatch):
    monkeypatch.setattr(step_cost, "peak_memory_mib", lambda: {"vm_hwm_mib": 900.0, "vm_rss_mib": 700.0})
    assert step_cost.reset_peak_memory() is False  # the mark stayed above the resident size


@pytest.mark.slow  # five processes of ~10 s each
def test_memory_mode_reports_every_process(tmp_path):
    results = step_cost.main(["--memory", "--networks", "digits_mlp", "--steps", "10", "--memory-repeats", "1",
                              "--steps-per-execution", "5", "--out", str(tmp_path)])
    entry = load_strict_json(tmp_path / "memory.json")["networks"]["digits_mlp"]
    for method in ("keras_sgd", "ccadl_diag", "mccadl"):
        (run,) = entry["runs"][method]
        assert "error" not in run, run
        assert _positive_finite(run["vm_hwm_mib"]) and run["steps_completed"] == 10
        assert entry["median_vm_hwm_mib"][method] == run["vm_hwm_mib"]
        # Linux with glibc: the held memory and the later steps' peak are read, and the steps
        # start from the held memory.
        assert 0 < run["vm_rss_held_mib"] <= run["vm_hwm_steps_mib"] <= run["vm_hwm_mib"]
        assert entry["median_vm_hwm_steps_mib"][method] == run["vm_hwm_steps_mib"]
        assert entry["median_vm_rss_held_mib"][method] == run["vm_rss_held_mib"]
    assert entry["g_size_mib"] == pytest.approx(32 * 3760 * 4 / 2**20)
    for method in ("ccadl_diag", "mccadl"):
        assert entry["extra_peak_over_sgd_mib"][method] == pytest.approx(
            entry["runs"][method][0]["vm_hwm_mib"] - entry["runs"]["keras_sgd"][0]["vm_hwm_mib"])
        assert entry["extra_steps_peak_over_sgd_mib"][method] == pytest.approx(
            entry["runs"][method][0]["vm_hwm_steps_mib"] - entry["runs"]["keras_sgd"][0]["vm_hwm_steps_mib"])
    assert entry["mccadl_minus_sgd_peak_mib"] == entry["extra_peak_over_sgd_mib"]["mccadl"]
    (row,) = results["targets"]
    assert row["target"] == "<= 100" and row["measured"] == entry["mccadl_minus_sgd_peak_mib"]
    assert row["met"] == (row["measured"] <= 100)
    assert results["networks"]["digits_mlp"]["num_params"] == 3760
    assert "| digits_mlp |" in (tmp_path / "memory.md").read_text()


def test_methods_subset_keeps_sgd():
    args = step_cost.parse_args(["--methods", "mccadl", "sgld"])
    assert args.methods == ["mccadl", "sgld"] and args.memory_repeats == 2
    with pytest.raises(SystemExit):
        step_cost.parse_args(["--methods", "keras_sgd"])
    with pytest.raises(ValueError, match="--memory-repeats"):
        step_cost.parse_args(["--memory-repeats", "0"])


@pytest.mark.slow  # builds and times 11 models of the digits MLP, ~1 min on 2 cores
def test_step_ablation_leaves_pieces_out_and_restores_the_library(tmp_path):
    from benchmarks.lab import step_ablation
    from keras_thermo import random as kt_random
    from keras_thermo.samplers import mccadl as kt_mccadl

    originals = (kt_random.normal_like, kt_mccadl.covariance_step)
    results = step_ablation.main(["--out", str(tmp_path), "--networks", "digits_mlp", "--repeats", "1"])
    assert (kt_random.normal_like, kt_mccadl.covariance_step) == originals
    network = results["networks"]["digits_mlp"]
    assert set(network["pieces"]) == set(step_ablation.METHODS)
    assert "sgld_without_noise" in network["timing"] and "mccadl_without_noise_and_c_step" in network["timing"]
    for name, entry in network["timing"].items():
        assert entry["error"] is None and entry["all_steps_completed"], name
        assert _positive_finite(entry["median_ms_per_step"]), name
    assert set(network["pieces"]["mccadl"]) >= {"cost_of_noise_ms", "cost_of_c_step_ms", "c_step_fraction_of_step"}
    assert (tmp_path / "table.md").read_text().count("| digits_mlp |") == len(step_ablation.METHODS)
