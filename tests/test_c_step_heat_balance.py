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


def test_per_example_noise_run_records_tail_and_pairing(tmp_path):
    out = tmp_path / "pairing.json"
    lab.main(["--out", str(out), "--xs", "0.1", "--chains", "20", "--steps", "60", "--burn-in", "20",
              "--per-example", "4", "--tail-fraction", "1", "0.1", "--pairing", "same", "independent"])
    report = json.loads(out.read_text())
    assert report["per_example"] == 4
    assert [(run["tail_fraction"], run["pairing"], run["splitting"]) for run in report["runs"]] == [
        (q, pairing, splitting) for q in (1.0, 0.1) for pairing in ("same", "independent") for splitting in lab.SPLITTINGS]


def test_per_example_terms_have_unit_variance_and_the_tail_carries_most_of_it():
    import numpy as np

    terms = lab.per_example_terms(np.random.default_rng(0), 1, 400_000, 0.05)[0]
    # Variance 1 (sd of the sample variance of this mixture: sqrt(kurtosis excess / n) ~ 0.01).
    assert abs(terms.var() - 1.0) < 0.05
    largest = np.sort(terms**2)[::-1]
    assert largest[: int(0.05 * terms.size)].sum() / largest.sum() > 0.8


def test_paired_estimate_with_heavy_tails_runs_mccadl_cold_and_the_exact_or_averaged_one_does_not():
    # A layer where 1% of the examples carry 90% of the gradient noise (x = 0.5): mCCAdL's C step,
    # fed the estimate of the minibatch whose kick it has just taken, damps that kick and leaves
    # the positions well below T (about 0.73, benchmarks/results/c_step_estimate_pairing.json);
    # with the exact covariance or the moving average the same chains sample T to within the
    # scheme's own bias (~2% at x = 0.5). 600 chains give standard errors of about 0.01.
    common = dict(h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=600, steps=1500, burn_in=500, seed=3,
                  per_example=32, tail_fraction=0.01)
    paired = lab.simulate("mccadl", 0.5, pairing="same", **common)["configurational"]["mean"]
    exact = lab.simulate("mccadl", 0.5, pairing="exact", **common)["configurational"]["mean"]
    averaged = lab.simulate("mccadl", 0.5, pairing="averaged", **common)["configurational"]["mean"]
    assert abs(exact - 1.0) < 0.05, exact
    # CCAdL's moving average of the same estimates (what MCCAdL(covariance="diag") uses).
    assert abs(averaged - 1.0) < 0.05, averaged
    assert paired < 0.85, paired


def test_simulate_refuses_an_unknown_pairing_or_a_one_example_batch():
    import pytest

    with pytest.raises(ValueError, match="pairing"):
        lab.simulate("mccadl", 0.1, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=2, steps=2,
                     burn_in=0, seed=0, per_example=4, pairing="previous")
    with pytest.raises(ValueError, match="per_example"):
        lab.simulate("mccadl", 0.1, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=2, steps=2,
                     burn_in=0, seed=0, per_example=1)
    with pytest.raises(ValueError, match="need per_example"):
        lab.simulate("mccadl", 0.1, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=2, steps=2,
                     burn_in=0, seed=0, pairing="same")
    with pytest.raises(ValueError, match="tail_fraction must lie"):
        lab.simulate("mccadl", 0.1, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=2, steps=2,
                     burn_in=0, seed=0, per_example=4, tail_fraction=0.0)


def test_the_thermostat_holds_the_reading_its_d_steps_take_around_c():
    # mCCAdL's xi reads the momentum on both sides of C; at x = 1 that reading and the positions
    # disagree without a thermostat (1.07 against 1.03, benchmarks/results/c_step_heat_balance.json).
    # With one, xi rises above A until the reading averages T (standard error ~0.001 here).
    result = lab.simulate("mccadl", 1.0, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=400,
                          steps=3000, burn_in=1000, seed=4, thermal_mass=1.0)
    assert abs(result["kinetic_around_c"]["mean"] - 1.0) < 0.01, result
    assert result["xi"]["mean"] > 1.3, result  # above A = 1: it removes the reading's excess
    import pytest

    with pytest.raises(ValueError, match="thermal_mass"):
        lab.simulate("ccadl", 1.0, h=0.05, friction=1.0, lam=1.0, temperature=1.0, chains=2, steps=2,
                     burn_in=0, seed=0, thermal_mass=1.0)
