"""The README's quick start, run as a user runs it: its two code blocks, as written, in order."""

import re
from pathlib import Path

import numpy as np

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
    assert scope["check"].report()["equilibrated"] is not None
    result = scope["result"]
    assert result.probs.shape == (len(scope["x_test"]), 10)
    np.testing.assert_allclose(result.probs.sum(axis=1), 1.0, rtol=1e-5)
