"""benchmarks/lab/c_step_heat_balance.py: the quick run writes complete JSON, and its model is the
splitting it describes (a coordinate without gradient noise samples its target)."""

import json
import math

from benchmarks.lab import c_step_heat_balance as lab


def test_quick_run_writes_every_figure(tmp_path):
    out = tmp_path / "balance.json"
    lab.main(["--out", str(out), "--xs", "0.1", "1", "--chains", "50", "--steps", "200", "--burn-in", "50"])
    report = json.loads(out.read_text())
    assert [(run["splitting"], run["x"]) for run in report["runs"]] == [
        (splitting, x) for x in (0.1, 1.0) for splitting in lab.SPLITTINGS]
    for run in report["runs"]:
        kinds = {"kinetic", "configurational"} | ({"kinetic_around_c"} if run["splitting"] == "mccadl" else set())
        assert set(run) - {"splitting", "x"} == kinds
        assert all(math.isfinite(run[k]["mean"]) and run[k]["standard_error"] > 0 for k in kinds)


def test_without_gradient_noise_both_splittings_sample_the_target():
    # x -> 0: no covariance friction, only the scheme's own O(h) bias (h = 0.05 here); 2000 chains
    # give standard errors of about 0.004, so a 2% band is 5 errors wide.
    for splitting in lab.SPLITTINGS:
        result = lab.simulate(splitting, 1e-9, h=0.05, friction=1.0, lam=1.0, temperature=1.0,
                              chains=2000, steps=1500, burn_in=500, seed=1)
        assert abs(result["configurational"]["mean"] - 1.0) < 0.02, (splitting, result)


def test_the_band_sees_mccadls_position_error_at_large_covariance_friction():
    # The negative control of the check above: at x = 3 mCCAdL's exact C step leaves the positions
    # about 19% hot (benchmarks/results/c_step_heat_balance.json), far outside the same 2% band.
    result = lab.simulate("mccadl", 3.0, h=0.05, friction=1.0, lam=1.0, temperature=1.0,
                          chains=2000, steps=1500, burn_in=500, seed=1)
    assert result["configurational"]["mean"] - 1.0 > 0.02, result
