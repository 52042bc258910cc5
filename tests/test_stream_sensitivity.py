"""benchmarks/lab/stream_sensitivity.py: choosing controls, and one control's run end to end."""

import json

import pytest

from benchmarks.lab import stream_sensitivity
from keras_thermo import random as kt_random


def test_an_unknown_control_is_refused_with_the_allowed_names(tmp_path):
    with pytest.raises(ValueError, match=r"--controls: unknown \['nope'\]; allowed: .*equilibration-wrong-T-30-epochs"):
        stream_sensitivity.main(["--controls", "nope", "--out", str(tmp_path / "out.json")])


def test_one_control_on_one_draw_reports_its_seeds_and_restores_the_draw(tmp_path):
    original = kt_random.normal_like
    out = tmp_path / "out.json"
    stream_sensitivity.main(["--controls", "equilibration-wrong-T-30-epochs", "--draws", "kernel_normal_like",
                             "--seeds", "1", "--out", str(out)])
    assert kt_random.normal_like is original
    results = json.loads(out.read_text())
    assert list(results["controls"]) == ["equilibration-wrong-T-30-epochs"]
    entry = results["controls"]["equilibration-wrong-T-30-epochs"]["kernel_normal_like"]
    assert sorted(entry["runs"]) == ["0", "1"]
    # Seed 0 is the test's own run (tests/test_equilibration.py), which is flagged.
    assert entry["rejected_with_the_tests_seed_0"] is True
    assert entry["rejection_rate_seeds_1_on"] in (0.0, 1.0)
    assert results["settings"]["chains_x_steps"]["equilibration-wrong-T-30-epochs"] == [1, 3000]
