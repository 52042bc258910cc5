"""`benchmarks.lab.curvature_spread`: one short run end to end. The power iteration it calls is
checked against closed forms in `tests/test_auto_step.py`; here, that the quantiles it records
order the minibatch values and that the step size it reports is the automatic rule's for the
model's own curvature variable."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lab import curvature_spread
from keras_thermo.samplers import auto_step


def test_a_short_run_records_ordered_quantiles_and_the_models_own_curvature():
    result = curvature_spread.run("digits_ood", "sgnht", seed=0, at_steps=[15], minibatches=4)
    (point,) = result["points"]
    assert point["step"] >= 15 and len(point["minibatch_curvatures"]) == 4
    quantiles = list(point["quantiles"].values())
    assert quantiles == sorted(quantiles)
    assert quantiles[0] == min(point["minibatch_curvatures"]) and quantiles[-1] == max(point["minibatch_curvatures"])
    assert point["max_over_min"] == pytest.approx(quantiles[-1] / quantiles[0])
    assert np.isfinite(point["full_batch"]) and point["full_batch"] > 0
    # The automatic step the run froze so far is the library's rule applied to its own variable.
    assert point["step_size"] == pytest.approx(auto_step.STABILITY_FRACTION / np.sqrt(point["curvature_variable"]), rel=1e-5)
