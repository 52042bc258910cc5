"""`benchmarks.peers`: the cell argument, the summary's within-repetition ratios, the table, and
one tiny sweep end to end (slow). The timings themselves are never asserted (benchmarks measure)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import peers


def test_a_cell_is_width_x_batch_and_a_bad_one_is_named():
    assert peers.parse_cell("512x32") == (512, 32)
    for bad in ("512", "0x32", "ax3", "512x-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            peers.parse_cell(bad)


def test_the_ratio_is_the_median_of_within_repetition_ratios():
    """A slow repetition slows every method of it: the ratio taken within each repetition
    stays 2 where the ratio of the medians would not."""
    repetitions = [
        {peers.BASELINE: 1.0, "kt_sgld": 2.0},
        {peers.BASELINE: 10.0, "kt_sgld": 20.0},
        {peers.BASELINE: 1.5, "kt_sgld": 3.0, "blackjax_sgld": 1.5},
    ]
    summary = peers.summarize(repetitions)
    assert summary["kt_sgld"]["ratio_to_handwritten_sgld"] == pytest.approx(2.0)
    assert summary["kt_sgld"]["ms_per_step"] == pytest.approx(3.0)
    assert summary["blackjax_sgld"] == {"ms_per_step": 1.5, "ratio_to_handwritten_sgld": 1.0, "repetitions": 1}


def test_the_table_names_a_library_that_did_not_run():
    report = {"cells": {"8x4": {
        "summary": peers.summarize([{peers.BASELINE: 1.0, "kt_sgld": 1.2}]),
        "skipped": {"blackjax": "blackjax not installed (pip install -e '.[peers]')"},
    }}}
    table = peers.markdown(report)
    assert "| kt_sgld | 1.2 (1.20x) |" in table
    assert "Skipped: blackjax not installed" in table


@pytest.mark.slow
def test_a_tiny_sweep_runs_end_to_end(tmp_path):
    """The command as documented, on one tiny cell with two keras_thermo samplers: every
    requested method is timed against the hand-written step in each repetition."""
    out = tmp_path / "peers"
    assert peers.main(["--out", str(out), "--libraries", "keras", "--cells", "16x8", "--steps", "20",
                       "--repeats", "2", "--methods", "keras_sgd", "keras_uniform_floor", "kt_sgld", "kt_sgnht"]) == 0
    report = json.loads((out / "peers.json").read_text())
    cell = report["cells"]["16x8"]
    assert len(cell["repetitions"]) == 2
    assert set(cell["summary"]) == {"keras_sgd", "keras_uniform_floor", peers.BASELINE, "kt_sgld", "kt_sgnht"}
    assert all(figures["ms_per_step"] > 0 and figures["repetitions"] == 2 for figures in cell["summary"].values())
    assert "width 16, batch 8" in (out / "table.md").read_text()


@pytest.mark.slow
def test_the_sweep_compiles_the_keras_methods_with_xla_when_asked(tmp_path):
    out = tmp_path / "peers"
    assert peers.main(["--out", str(out), "--libraries", "keras", "--cells", "16x8", "--steps", "20",
                       "--repeats", "1", "--methods", "kt_sgld", "--jit-compile"]) == 0
    report = json.loads((out / "peers.json").read_text())
    assert "jit_compile=True" in report["protocol"]["keras"]
    assert set(report["cells"]["16x8"]["summary"]) == {peers.BASELINE, "kt_sgld"}
