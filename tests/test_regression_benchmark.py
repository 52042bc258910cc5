"""benchmarks/regression_uncertainty.py: its arguments, the binomial line under its table, and
the committed tables matching the committed results."""

import argparse
import json
from pathlib import Path

import pytest
from scipy import stats

from benchmarks import regression_uncertainty as bench

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "regression_uncertainty"


@pytest.mark.parametrize("rows", [20, 88, 400])
def test_calibrated_band_probability_is_the_binomial_mass_inside_the_band(rows):
    counts = [k for k in range(rows + 1) if 0.85 <= k / rows <= 0.95]
    expected = stats.binom.pmf(counts, rows, 0.9).sum()
    assert bench.calibrated_band_probability(rows) == pytest.approx(expected, rel=1e-9)
    # A wider band holds more of the mass.
    assert bench.calibrated_band_probability(rows, band=(0.8, 1.0)) > expected


@pytest.mark.parametrize("option", ["--prior", "--step-size"])
@pytest.mark.parametrize("value", ["wide", "0", "-1", "inf"])
def test_bad_prior_or_step_size_names_the_option_and_what_is_allowed(option, value, capsys):
    with pytest.raises(SystemExit):
        bench.main([option, value, "--table-from", "unused.json"])
    error = capsys.readouterr().err
    assert f"{option} must be" in error and "a positive number" in error and repr(value) in error


def test_option_parsers_keep_the_keyword_and_read_numbers():
    parse = bench._auto_or_positive("--prior", "fan_in")
    assert parse("fan_in") == "fan_in" and parse("0.3") == 0.3
    with pytest.raises(argparse.ArgumentTypeError, match=r"--prior must be 'fan_in' or a positive number, got 'wide'"):
        parse("wide")
    assert isinstance(bench.make_prior("fan_in"), bench.kt.priors.FanInGaussian)
    assert bench.make_prior(0.3).get_config() == {"std": 0.3}


def test_committed_tables_are_those_of_the_committed_results():
    report = json.loads((RESULTS / "results.json").read_text())
    assert (RESULTS / "tables.md").read_text() == bench.markdown_tables(report)
