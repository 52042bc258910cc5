"""benchmarks.seed_spread: per-seed values, mean +- sd, and differences paired by seed."""

import json

import pytest

from benchmarks import seed_spread


def _results(folder, seed, nll_a, nll_b, status_b="ok"):
    def run(method, nll, status="ok"):
        return {"method": method, "label": method.upper(), "label_noise": 0.2, "status": status,
                "metrics": {"accuracy": 0.5, "nll": nll, "ece": 0.1, "brier": 0.2}}

    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({
        "config": {"training": {"seed": seed}},
        "runs": [run("a", nll_a), run("b", nll_b, status_b)],
        "ood_runs": [{"method": "a", "label": "A", "status": "ok",
                      "ood": {"auroc_predictive_entropy": 0.9, "auroc_mutual_information": None}}],
    }))
    return folder


def test_means_spreads_and_paired_differences(tmp_path):
    folders = [_results(tmp_path / "s0", 0, 0.30, 0.40), _results(tmp_path / "s1", 1, 0.50, 0.56),
               _results(tmp_path / "s2", 2, 0.70, 0.90, status_b="diverged")]
    values, labels, seeds = seed_spread.collect(folders)
    assert seeds == [0, 1, 2] and labels == {"A": "a", "B": "b"}
    text = seed_spread.markdown(values, labels, seeds, reference="A")
    # A: mean 0.5, sd 0.2; B: 0.40, 0.56 and a diverged run; B - A paired: 0.10, 0.06 -> 0.08 +- 0.0283.
    assert "| NLL | 20% | A | 0.3000 | 0.5000 | 0.7000 | 0.5000 +- 0.2000 |  |" in text
    assert ("| NLL | 20% | B | 0.4000 | 0.5600 | n/a | 0.4800 +- 0.1131 (1 missing) | 0.0800 +- 0.0283 (1 missing) |"
            in text)
    assert "| OOD AUROC, entropy | OOD | A | 0.900 | 0.900 | 0.900 | 0.900 +- 0.000 |  |" in text
    assert "| OOD AUROC, MI | OOD | A | n/a | n/a | n/a | n/a |  |" in text


def test_folders_of_one_seed_are_pooled_and_must_share_it(tmp_path):
    main = _results(tmp_path / "main", 0, 0.30, 0.40)
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "results.json").write_text(json.dumps({"config": {"training": {"seed": 0}}, "runs": [
        {"method": "b", "label": "B, variant", "label_noise": 0.2, "status": "ok",
         "metrics": {"accuracy": 0.5, "nll": 0.35, "ece": 0.1, "brier": 0.2}}]}))
    values, labels, seeds = seed_spread.collect([f"{main},{variant}"])
    assert seeds == [0] and labels == {"A": "a", "B": "b", "B, variant": "b"}
    assert values[("B, variant", 0.2, "nll")] == [0.35] and values[("B", 0.2, "nll")] == [0.40]
    other = _results(tmp_path / "other", 1, 0.30, 0.40)
    with pytest.raises(ValueError, match=r"run with different seeds \[0, 1\]"):
        seed_spread.collect([f"{main},{other}"])
