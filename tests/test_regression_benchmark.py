"""benchmarks/regression_uncertainty.py: its arguments, the binomial line under its table, and
the committed tables matching the committed results."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks import regression_uncertainty as bench

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "regression_uncertainty"
DIABETES_TEST_ROWS = 221


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


@pytest.mark.parametrize("text, config, described", [
    ("fan_in", {"scale": 1.0, "bias_std": 1.0}, "kt.priors.FanInGaussian()"),
    ("fan_in:0.5", {"scale": 0.5, "bias_std": 1.0}, "kt.priors.FanInGaussian(scale=0.5)"),
    ("fan_in:0.1234567", {"scale": 0.1234567, "bias_std": 1.0}, "kt.priors.FanInGaussian(scale=0.1234567)"),
    ("2", {"std": 2.0}, "kt.priors.Gaussian(2.0)"),
])
def test_the_prior_option_takes_a_fan_in_scale(text, config, described):
    prior = bench.make_prior(bench.parse_prior(text))
    assert prior.get_config() == config
    assert bench.describe_prior(bench.parse_prior(text)) == described


@pytest.mark.parametrize("text", ["fan_in:", "fan_in:x", "fan_in:0", "fan_in:-2", "fan_in:inf", "fanin:1"])
def test_a_bad_fan_in_scale_names_the_option_and_what_is_allowed(text, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--prior", text, "--table-from", "unused.json"])
    error = capsys.readouterr().err
    assert "--prior must be 'fan_in', 'fan_in:S' with S a positive number, or a positive number" in error
    assert repr(text) in error


def test_committed_tables_are_those_of_the_committed_results():
    report = json.loads((RESULTS / "results.json").read_text())
    assert (RESULTS / "tables.md").read_text() == bench.markdown_tables(report)


@pytest.mark.parametrize("args, message", [
    (["--chains", "0"], "--chains must be a positive integer, got 0"),
    (["--splits", "-1"], "--splits must be 0 (the toy only) or more, got -1"),
    (["--splits", "0", "--skip-toy"], "--splits 0 with --skip-toy leaves nothing to run"),
    (["--test-fraction", "1"], "--test-fraction must lie strictly between 0 and 1 and leave at least 2 of the 442 "
                               "diabetes rows on each side, got 1.0"),
    (["--test-fraction", "0"], "got 0.0"),
    (["--test-fraction", "0.001"], "got 0.001"),
    (["--test-fraction", "0.999"], "got 0.999"),
    (["--toy-clusters", "0.5", "4"], "--toy-clusters must give 0.5 < INNER < OUTER <= 6 (the plotted grid), got 0.5 4.0"),
    (["--toy-clusters", "3", "2"], "got 3.0 2.0"),
    (["--toy-clusters", "2", "7"], "got 2.0 7.0"),
])
def test_bad_chains_or_splits_are_refused_with_the_value(args, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(args + ["--table-from", "unused.json"])
    assert message in capsys.readouterr().err


def test_a_toy_only_report_with_chains_lists_each_chains_ratio():
    pooled = {"rmse": 0.5, "nll": 1.0, "coverage_90": 0.9, "crps": 0.3, "epistemic_std_gap": 0.6,
              "epistemic_std_data": 0.2, "gap_ratio": 3.0}
    report = {"toy": {"ensemble": dict(pooled), "sgnht": {**pooled, "chain_gap_ratios": [2.5, None, 3.25]},
                      "sghmc": {"diverged": True}}}
    table = bench.markdown_tables(report)
    assert "Diabetes" not in table and table.startswith("Toy with a gap")
    assert "| sgnht | 0.500 | 1.000 | 0.900 | 0.300 | 0.600 | 0.200 | 3.00 | 2.50, -, 3.25 |" in table
    assert "| ensemble | 0.500 | 1.000 | 0.900 | 0.300 | 0.600 | 0.200 | 3.00 | - |" in table
    assert "| sghmc | diverged | | | | | | | |" in table



def test_committed_toy_with_chains_tables_are_those_of_its_results():
    results = RESULTS.parent / "regression_toy_chains"
    report = json.loads((results / "results.json").read_text())
    assert (results / "tables.md").read_text() == bench.markdown_tables(report)
    # Every sampler ran its chains together and pooled them.
    for method, figures in report["toy"].items():
        if method in bench.SAMPLERS and "rmse" in figures:
            assert figures["chains"] > 1 and len(figures["chain_gap_ratios"]) == figures["chains"]


def test_half_the_diabetes_rows_test_by_default_and_earlier_reports_keep_their_split():
    # 221 test rows: a calibrated interval passes the coverage band on all five splits with
    # probability 0.94 (0.57 on the 88 rows of an 80/20 split).
    assert DIABETES_TEST_ROWS == 442 - bench.train_rows(442) == 221
    assert bench.calibrated_band_probability(221) ** 5 > 0.93
    assert bench.calibrated_band_probability(442 - bench.train_rows(442, 0.2)) ** 5 < 0.6
    # The split a report states is the one it ran.
    report = {"diabetes": {"test_fraction": 0.5, "splits": [{}], "summary": {}, "targets_met_on_splits": {}}}
    assert "1 random 50/50 splits" in bench.markdown_tables(report) and "On 221 test rows" in bench.markdown_tables(report)
    earlier = json.loads((RESULTS / "results.json").read_text())
    assert "random 80/20 splits" in bench.markdown_tables(earlier)  # written before the fraction was recorded


def test_committed_half_split_diabetes_tables_are_those_of_its_results():
    results = RESULTS.parent / "regression_diabetes_half"
    report = json.loads((results / "results.json").read_text())
    assert report["diabetes"]["test_fraction"] == 0.5 and "toy" not in report
    assert (results / "tables.md").read_text() == bench.markdown_tables(report)


def test_the_toys_inputs_lie_in_their_clusters_and_the_gap_is_half_a_unit_inside():
    x, y = bench.toy_data(bench.np.random.default_rng(0), 161, (2.5, 4.0))
    assert x.shape == y.shape == (161, 1)
    assert bench.np.all((bench.np.abs(x) >= 2.5) & (bench.np.abs(x) <= 4.0))
    assert bench.np.sum(x < 0) == 80 and bench.np.sum(x > 0) == 81
    assert bench.toy_gap((2.5, 4.0)) == 2.0 and bench.toy_gap((1.5, 4.0)) == 1.0
    # The default toy: a gap (5 wide) more than three times each cluster's width (1.5).
    inner, outer = bench.TOY_CLUSTERS
    assert 2 * inner > 3 * (outer - inner)


def test_committed_wide_gap_toy_tables_are_those_of_its_results():
    results = RESULTS.parent / "regression_toy_wide_gap"
    report = json.loads((results / "results.json").read_text())
    assert "[-4, -2.5] and [2.5, 4]" in report["protocol"]["toy"] and "|x| < 2 (gap)" in report["protocol"]["toy"]
    assert (results / "tables.md").read_text() == bench.markdown_tables(report)


def test_committed_wide_gap_toy_with_chains_tables_are_those_of_its_results():
    results = RESULTS.parent / "regression_toy_wide_gap_chains"
    report = json.loads((results / "results.json").read_text())
    assert "[-4, -2.5] and [2.5, 4]" in report["protocol"]["toy"] and report["protocol"]["sampling"].startswith("4 chains")
    assert (results / "tables.md").read_text() == bench.markdown_tables(report)


def test_the_shared_noise_net_gives_every_input_the_same_raw_scale():
    net = bench._net(3, "shared")
    net.layers[-1].raw_scale.assign([0.7])
    outputs = net(np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)).numpy()
    assert outputs.shape == (5, 2)
    np.testing.assert_array_equal(outputs[:, 1], np.full(5, 0.7, np.float32))
    assert len(outputs[:, 0]) == len(set(outputs[:, 0].tolist()))  # the means differ by input
    assert bench._net(3).output_shape == (None, 2)  # the default: a raw scale per input


def test_an_unknown_noise_model_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--noise", "constant", "--table-from", "unused.json"])
    error = capsys.readouterr().err
    assert "--noise" in error and "'constant'" in error and "'input', 'shared'" in error


def _split_figures(rmse, nll, coverage):
    return {"rmse": rmse, "nll": nll, "coverage_90": coverage, "interval_width_90": 3.0, "crps": 1.0}


def _one_sampler_report(sampler, figures, seconds=1.0):
    baselines = {"ols": _split_figures(1.0, 2.0, 0.9), "map": {**_split_figures(1.0, 2.0, 0.8), "seconds": seconds},
                 "ensemble": {**_split_figures(1.0, 2.1, 0.8), "seconds": seconds}}
    splits = [{**baselines, sampler: _split_figures(*f)} for f in figures]
    return {"diabetes": bench.diabetes_report(splits, [sampler], 0.5)}


def test_runs_of_one_protocol_with_one_sampler_each_merge_into_one_table():
    a = _one_sampler_report("sgnht", [(1.0, 1.9, 0.9), (1.2, 2.1, 0.97)], seconds=1.0)
    b = _one_sampler_report("ccadl", [(1.0, 1.9, 0.9), (1.0, 1.9, 0.9)], seconds=7.0)  # timings may differ
    merged = bench.merge_diabetes_reports([a, b])["diabetes"]
    assert list(merged["splits"][0]) == ["ols", "map", "ensemble", "sgnht", "ccadl"]
    assert merged["targets_met_on_splits"]["sgnht"] == {"rmse_within_5pct_of_ols": 1, "coverage_in_band": 1, "nll_at_most_map": 1}
    assert merged["targets_met_on_splits"]["ccadl"] == {"rmse_within_5pct_of_ols": 2, "coverage_in_band": 2, "nll_at_most_map": 2}
    table = bench.markdown_tables({"diabetes": merged})
    assert "| sgnht |" in table and "| ccadl |" in table and table.count("| ols |") == 1


def test_runs_that_are_not_of_one_protocol_are_not_merged(tmp_path, capsys):
    a = _one_sampler_report("sgnht", [(1.0, 1.9, 0.9)])
    other_map = _one_sampler_report("ccadl", [(1.0, 1.9, 0.9)])
    other_map["diabetes"]["splits"][0]["map"]["nll"] = 2.5
    for other, message in [(other_map, "baselines differ"), (_one_sampler_report("sgnht", [(1.0, 1.9, 0.9)]), "more than one run"),
                           (_one_sampler_report("ccadl", [(1.0, 1.9, 0.9)] * 2), "differ in their splits"),
                           ({**a, "toy": {}}, "only diabetes runs"),
                           ({**_one_sampler_report("ccadl", [(1.0, 1.9, 0.9)]), "protocol": {"sampling": "other"}},
                            "protocols differ")]:
        with pytest.raises(ValueError, match=message):
            bench.merge_diabetes_reports([a, other])
    paths = []
    for index, report in enumerate([a, other_map]):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        bench.main(["--table-from", *map(str, paths)])
    assert "--table-from" in capsys.readouterr().err


def test_the_committed_shared_noise_table_merges_its_four_runs():
    folder = RESULTS.parent / "regression_diabetes_shared_noise"
    reports = [json.loads((folder / name / "results.json").read_text()) for name in ("sgnht", "ccadl", "mccadl", "sghmc")]
    assert (folder / "tables.md").read_text() == bench.markdown_tables(bench.merge_diabetes_reports(reports))
