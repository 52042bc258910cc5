"""`benchmarks.warmup` on the linear regression with 200 steps: the JSON it writes is strict and
has every field the docs' table reads (a few seconds)."""

from __future__ import annotations

import pytest

from benchmarks import warmup
from keras_thermo import testing


def test_linear_regression_runs_write_every_field(tmp_path):
    path = tmp_path / "warmup.json"
    warmup.run(["linear"], ["sgnht"], seeds=[0], steps=200, out=str(path))
    payload = testing.load_strict_json(path)  # NaN would not be JSON: undefined means are null
    assert "steps_to_T" in payload["definition"] and payload["temperature"] == 1.0
    assert payload["networks"]["linear"] == {
        "description": warmup.NETWORKS["linear"].description, "step_size": 1e-3, "batch_size": 1000,
        "prior_std": pytest.approx(10**0.5), "steps": 200,
    }
    before, after = payload["runs"]
    assert (before["warmup"], before["warmup_steps"]) == ("none", 0)
    assert (after["warmup"], after["warmup_steps"]) == ("default", 1000)
    for run in (before, after):
        assert run["steps"] == 200 and run["step_size"] == pytest.approx(1e-3)
        # The check needs 10 blocks of 100 steps after its burn-in: 200 steps cannot say "at T".
        assert run["steps_to_T"] is None and run["final_equilibrated"] is None
        assert [row[0] for row in run["trace"]["rows"]] == [100, 200]
        assert run["last_half"]["from_step"] == 100
        assert isinstance(run["warned_not_at_T"], bool) and run["num_params"] == 6
    # Without a warm-up the second half is judged; inside the warm-up no step counts.
    assert before["last_half"]["kinetic"]["mean"] > 0 and after["last_half"]["kinetic"]["mean"] is None
    table = warmup.markdown(payload).splitlines()
    assert len(table) == 4 and "| linear | 0.001 | sgnht | none | 0 | 200 | not within 200 | undetermined; undetermined" in table[2]
    assert table[3].endswith("| - | - |")


def test_too_few_steps_are_refused():
    with pytest.raises(SystemExit):
        warmup.main(["--steps", "50", "--out", "unused.json"])
