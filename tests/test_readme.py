"""The README's code, run as a user runs it: the quick start's two blocks in order, and the regression example."""

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_start_blocks() -> list[str]:
    """The Python blocks of the README's "Quick start" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_quick_start_runs_as_written(tmp_path, monkeypatch):
    blocks = quick_start_blocks()
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)  # its TensorBoard logs go to runs/tb
    scope: dict = {}
    exec(compile(blocks[0], "README quick start", "exec"), scope)  # noqa: S102
    model, samples = scope["model"], scope["samples"]
    assert model.sampler.is_auto_step_size and model.sampler.step_size > 0
    assert samples.samples.shape[1] == scope["net"].count_params() and len(samples.samples) > 0
    assert np.all(np.isfinite(samples.samples)) and samples.steps[0] >= 2000
    assert (tmp_path / "runs" / "tb").is_dir()
    exec(compile(blocks[1], "README quick start, second block", "exec"), scope)  # noqa: S102
    assert scope["avg"].result()["num_samples"] > 0
    # What the README says of this check: every variable at T (one thermostat per tensor).
    report = scope["check"].report()
    assert report["equilibrated"] is True, report
    (output_kernel,) = [v for v in report["variables"] if v["name"] == scope["net"].layers[-1].kernel.path]
    assert all(output_kernel[kind]["in_band"] for kind in ("kinetic", "configurational")), output_kernel
    result = scope["result"]
    assert result.probs.shape == (len(scope["x_test"]), 10)
    np.testing.assert_allclose(result.probs.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_the_regression_example_runs_as_written(capsys):
    """The README's diabetes regression, as written (106 s on 2 cores): samples after its burn-in,
    intervals around the predictive mean, the metrics printed on y's own scale."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Regression", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    scope: dict = {}
    exec(compile(block, "README regression", "exec"), scope)  # noqa: S102
    samples, prediction = scope["samples"], scope["prediction"]
    assert abs(len(samples.samples) - (20_020 - 5_000) // 50) <= 1 and samples.steps[0] >= 5000
    lower, upper = scope["lower"], scope["upper"]
    assert np.all(lower < prediction.mean) and np.all(prediction.mean < upper)
    assert prediction.mean.shape == scope["y_test"].shape
    # On y's own scale (targets 25-346), not the standardized one.
    assert 50 < float(np.mean(prediction.mean)) < 300
    assert "coverage_90" in capsys.readouterr().out
