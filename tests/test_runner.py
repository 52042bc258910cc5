"""The benchmark runner and its configs: schema, unit conversions, quick runs on mock data."""

import io
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt

from benchmarks import demo, run
from keras_thermo.testing import load_strict_json

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TASKS = {"emnist": 112_800, "fashion_mnist": 60_000, "cifar10": 50_000}  # training-set sizes N
# Luo et al. (2018), sec. 5.2: TACT-HMC's (eta_theta, c_theta, K) per task, in the paper's units.
PAPER_TACT = {"emnist": (0.0015, 0.05, 50), "fashion_mnist": (0.0012, 0.15, 50), "cifar10": (0.0010, 0.10, 50)}
METHODS = ["adam", "sgd", "sghmc", "sgnht", "ccadl", "mccadl", "tact_hmc"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_outputs(out, labels):
    results = load_strict_json(out / "results.json")
    table = (out / "table.md").read_text()
    assert "| % permuted labels | 0% |" in table
    for label in labels:
        assert f"| {label} |" in table
    for name in ("accuracy.png", "nll.png", "reliability.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    return results


# ---------------------------------------------------------------------------------------------
# Configs


@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_configs_parse_and_convert_the_papers_units(task):
    everything = run.load_config(CONFIGS / f"{task}_all.yaml")
    assert list(everything["methods"]) == METHODS
    assert everything["data"]["label_noise"] == [0.0, 0.2, 0.3]
    assert everything["training"]["epochs"] == 1000
    n = TASKS[task]
    eta_paper, c_paper, period = PAPER_TACT[task]
    tact = everything["methods"]["tact_hmc"]["options"]
    # The paper's step sizes are per mean loss: eta = eta_paper / N.
    assert tact["step_size"] * n == pytest.approx(eta_paper, rel=1e-3)
    assert tact["xi_step_size"] * n == pytest.approx(eta_paper, rel=1e-3)
    assert (tact["noise"], tact["sample_every"]) == (c_paper, period)
    for key in ("sghmc", "sgnht", "ccadl", "mccadl"):
        options = everything["methods"][key]["options"]
        # Same learning rate h^2 N and momentum decay A h as TACT-HMC.
        assert options["step_size"] ** 2 * n == pytest.approx(eta_paper, rel=1e-3)
        assert options["friction"] * options["step_size"] == pytest.approx(c_paper, rel=1e-3)
    # Posterior samples must be able to fall on TACT's sampling steps.
    assert everything["evaluation"]["every_n_steps"] % period == 0
    # Each per-method config is exactly one method of the task config.
    for key in METHODS:
        single = run.load_config(CONFIGS / f"{task}_{key}.yaml")
        assert single["methods"] == {key: everything["methods"][key]}
        assert single["name"] == f"{task}_{key}"
        assert {k: v for k, v in single.items() if k not in ("methods", "name")} == {
            k: v for k, v in everything.items() if k not in ("methods", "name")
        }


def test_digits_config_parses():
    config = run.load_config(CONFIGS / "digits.yaml")
    assert config["data"]["dataset"] == "digits"
    samplers = {m["sampler"]: m for m in config["methods"].values() if "sampler" in m}
    assert set(samplers) == {"sgnht", "ccadl", "mccadl"}
    # The demo's samplers run as the README's quick start does: every sampler argument at its
    # default (automatic step size, friction following it), prior N(0, 1), T = 1.
    for method in samplers.values():
        assert not method.get("options") and method.get("temperature", 1.0) == 1.0 and method["prior_std"] == 1.0
        assert run.build_sampler(method).get_config()["step_size"] == "auto"
    assert any(m.get("optimizer") == "adam" for m in config["methods"].values())


def test_config_errors_name_the_key(tmp_path):
    base = (CONFIGS / "digits.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "\nepochs: 3\n")
    with pytest.raises(run.ConfigError, match=r"unknown keys \['epochs'\]"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\nonly: [nope]\n")
    with pytest.raises(run.ConfigError, match="nope"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\nmethods: {adam: {sampler: sgnht}}\n")
    with pytest.raises(run.ConfigError, match="exactly one of `optimizer` and `sampler`"):
        run.load_config(bad)
    bad.write_text("extends: " + str(CONFIGS / "digits.yaml") + "\ntraining: {epochs: 1, batch_size: 32, num_chains: 0}\n")
    with pytest.raises(run.ConfigError, match=r"`training.num_chains` must be a positive integer, got 0"):
        run.load_config(bad)
    # TACT-HMC yields samples only every K steps: a thinning that never meets them is refused.
    config = run.load_config(CONFIGS / "emnist_tact_hmc.yaml")
    config["evaluation"]["every_n_steps"] = 75
    sampler = run.build_sampler(config["methods"]["tact_hmc"])
    with pytest.raises(run.ConfigError, match="multiple of the sampler's sample_every=50"):
        run._evaluation_schedule(config, config["methods"]["tact_hmc"], 10, sampler)


class _Stream:
    def __init__(self, terminal):
        self.terminal = terminal

    def isatty(self):
        return self.terminal


def test_fit_verbosity_resolves_auto_by_the_terminal_and_refuses_other_values():
    assert run.fit_verbosity("auto", _Stream(True)) == 1  # a progress bar
    assert run.fit_verbosity("auto", _Stream(False)) == 2  # a log file: one line per epoch
    for level in (0, 1, 2):
        assert run.fit_verbosity(level, _Stream(True)) == level
    for bad in ("loud", 3, -1, None, True):
        with pytest.raises(ValueError, match=rf"verbose must be one of 'auto', 0, 1, 2, got {bad!r}"):
            run.fit_verbosity(bad)


def test_run_config_resolves_auto_verbosity_before_any_run(monkeypatch, tmp_path):
    # The default "auto" reaches every run as a level (the runner compares it with 0).
    seen = []

    class Seen(Exception):
        pass

    def fake_run(key, method, config, task, noise, out, verbose, strategy=None, *, log_dir=None):
        seen.append(verbose)
        raise Seen

    monkeypatch.setattr(run, "run_method", fake_run)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal
    with pytest.raises(Seen):
        run.run_config(run.load_config(CONFIGS / "digits.yaml"), tmp_path / "out", quick=True, methods="sgnht",
                       log=lambda *_: None)
    assert seen == [2]


def test_missing_data_gives_the_preparation_message_not_a_traceback(tmp_path, capsys):
    status = run.main([str(CONFIGS / "emnist_adam.yaml"), "--quick", "--data-dir", str(tmp_path),
                       "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == run.EXIT_ERROR
    assert "emnist/balanced" in captured.err and "tfds build" in captured.err
    assert "--mock-data" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "out" / "results.json").exists()


# ---------------------------------------------------------------------------------------------
# End to end, a few steps each


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_configured_sampler_is_registered(task, method):
    config = run.load_config(CONFIGS / f"{task}_{method}.yaml")
    spec = config["methods"][method]
    if "sampler" in spec:
        assert run.sampler_is_registered(spec["sampler"]), f"{task}_{method}.yaml: {spec['sampler']!r}"
        run.build_sampler(spec)  # the configured hyperparameters are accepted
    else:
        run.build_optimizer(spec)


# Per-example gradients through the unrolled LSTM take about a minute to trace on 2 CPU cores:
# the default suite runs the other Fashion-MNIST methods, the slow suite these two.
HEAVY = {("fashion_mnist", "ccadl"), ("fashion_mnist", "mccadl")}


@pytest.mark.parametrize(
    "task, heavy",
    # Slow: the default suite runs every task from the command line (tests/test_runner_cli.py),
    # the EMNIST MLP with every method.
    [pytest.param(task, False, marks=pytest.mark.slow) for task in sorted(TASKS)]
    + [pytest.param("fashion_mnist", True, marks=pytest.mark.slow)],
)
def test_task_configs_run_quick_on_mock_data(task, heavy, tmp_path):
    # One run of the task config covers its per-method configs (equal by the test above).
    path = CONFIGS / f"{task}_all.yaml"
    config = run.load_config(path)
    available = [k for k, m in config["methods"].items() if ((task, k) in HEAVY) == heavy]
    out = tmp_path / "out"
    status = run.main([str(path), "--quick", "--mock-data", "--data-dir", str(tmp_path / "tfds"),
                       "--out", str(out), "--verbose", "0", "--methods", ",".join(available)])
    assert status == 0
    results = _check_outputs(out, [config["methods"][k]["label"] for k in available])
    assert [r["method"] for r in results["runs"]] == available
    for record in results["runs"]:
        assert record["num_examples"] == config["quick"]["mock_examples"]
        assert record["status"] == "ok", (record["method"], record["message"])
        metrics = record["metrics"]
        assert metrics["num_samples"] >= 1
        assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["nll"] > 0 and 0 <= metrics["ece"] <= 1
        # Two quick epochs: one entry per epoch in each curve the plots use.
        curve = "posterior_accuracy" if record["kind"] == "sampler" else "test_accuracy"
        assert len(record["history"][curve]) == config["quick"]["epochs"]


def _event_tags(folder):
    tags = set()
    for path in Path(folder).rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_demo_quick_writes_table_plots_and_tensorboard(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "| Adam |" in printed and "posterior average vs Adam" in printed
    results = _check_outputs(out, ["Adam", "SGNHT"])
    runs = {r["method"]: r for r in results["runs"]}
    sgnht = runs["sgnht"]
    assert sgnht["status"] == "ok" and sgnht["metrics"]["num_samples"] >= 1
    # The table and the JSON agree.
    assert f"{100 * sgnht['metrics']['accuracy']:.2f}%" in (out / "table.md").read_text()
    # The averaged predictive's NLL never exceeds the mean per-sample log loss (Jensen).
    assert sgnht["metrics"]["nll"] <= sgnht["metrics"]["expected_log_loss"] + 1e-9
    # TensorBoard receives the sampler's diagnostics and the posterior metrics.
    tags = _event_tags(sgnht["tensorboard"])
    for name in ("kinetic_temperature", "xi", "potential", "step_size", "posterior_accuracy", "posterior_nll", "ece"):
        assert f"epoch_{name}" in tags, sorted(tags)
    assert math.isfinite(runs["adam"]["metrics"]["nll"])
    # The OOD study ran for both and is printed.
    assert "OOD AUROC, test digits [5, 6, 7, 8, 9]" in printed
    ood = {r["method"]: r["ood"] for r in results["ood_runs"]}
    assert list(ood) == ["adam", "sgnht"] and ood["adam"]["auroc_mutual_information"] is None
    assert 0.0 <= ood["sgnht"]["auroc_predictive_entropy"] <= 1.0
    # Each sampler run's temperature verdict, from its EquilibrationCheck, one line each.
    for record, where in [(sgnht, "0% permuted labels"), (results["ood_runs"][1], "OOD study")]:
        summary = record["temperatures"]["summary"]
        assert summary.split(" ")[0] in ("at", "NOT", "undetermined"), summary
        assert f"  SGNHT, {where}: {summary}" in printed.splitlines()


def test_demo_prints_each_sampler_runs_temperature_verdict():
    def record(label, kind, noise, summary=None):
        return {"label": label, "kind": kind, "label_noise": noise,
                **({"temperatures": {"summary": summary}} if kind == "sampler" else {})}

    results = {
        "runs": [record("Adam", "optimizer", 0.0),
                 record("SGNHT", "sampler", 0.0, "at T=0.1 (kinetic 0.1 +- 0.001, configurational 0.098 +- 0.003; "
                                                "in band from step 420)"),
                 record("mCCAdL", "sampler", 0.3, "NOT at T=0.1 (...). The chain runs hot, ...")],
        "ood_runs": [record("Adam", "optimizer", 0.0), record("SGNHT", "sampler", 0.0, "at T=0.1 (...)")],
    }
    assert demo.temperature_lines(results) == [
        "SGNHT, 0% permuted labels: at T=0.1 (kinetic 0.1 +- 0.001, configurational 0.098 +- 0.003; in band from step 420)",
        "mCCAdL, 30% permuted labels: NOT at T=0.1 (...). The chain runs hot, ...",
        "SGNHT, OOD study: at T=0.1 (...)",
    ]


# ---------------------------------------------------------------------------------------------
# Tuning on a validation split, and the OOD study

TUNED = CONFIGS / "digits_tuned.yaml"


def _tuned_config_text(tmp_path, extra: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"extends: {TUNED}\n{extra}")
    return path


@pytest.mark.parametrize(
    "extra, match",
    [
        ("tune: {grids: {adam: {epochs: [10, 20]}}}", r"epochs are not a grid key"),
        ("tune: {grids: {nope: {learning_rate: [1.0e-3]}}}", r"`tune.grids.nope` names no method"),
        ("tune: {grids: {adam: {learning_rate: []}}}", r"`tune.grids.adam.learning_rate` must be a non-empty list"),
        ("tune: {grids: {adam: {learning_rate: 1.0e-3}}}", r"must be a non-empty list of values, got 0.001"),
        ("tune: {validation_fraction: 1.0}", r"`tune.validation_fraction` must be a number in \(0, 1\), got 1.0"),
        ("tune: {validation_fraction: 0}", r"`tune.validation_fraction` must be a number in \(0, 1\)"),
        ("tune: {label_noise: 2}", r"`tune.label_noise` must be a number in \[0, 1\], got 2"),
        ("tune: {search: random}", r"`tune.search` must be one of \['grid', 'axes'\], got 'random'"),
        ("tune: {seed: -1}", r"`tune.seed` must be a non-negative integer"),
        ("tune: {folds: 5}", r"`tune` has unknown keys \['folds'\]"),
        ("tune: {share: {sgnht_layerwise: nope}}", r"`tune.share.sgnht_layerwise: nope` must map"),
        ("tune: {share: {adam: adam}}", r"`tune.share.adam: adam` must map"),
        ("quick: {tune: {grids: {adam: {momentum: []}}}}", r"`quick.tune.grids.adam.momentum` must be a non-empty"),
        ("ood: {in_classes: [0, 1], out_classes: [1, 2]}", r"must not share a digit"),
        ("ood: {in_classes: [0], out_classes: [5, 6]}", r"`ood.in_classes` must be a list of at least 2 distinct digits"),
        ("ood: {in_classes: [0, 1], out_classes: [5, 10]}", r"`ood.out_classes` must be a list of at least 2"),
        ("ood: {in_classes: [0, 1], out_classes: [5, 6], label_noise: -0.1}", r"`ood.label_noise` must be a number"),
        ("ood: {in_classes: [0, 1], out_classes: [5, 6], test: 1}", r"`ood` has unknown keys \['test'\]"),
        ("data: {dataset: fashion_mnist}", r"`ood` with `in_classes`/`out_classes` needs `data.dataset: digits`"),
        ("ood: {dataset: fashion_mnist}", r"`ood` takes either `dataset` or `in_classes` and `out_classes`"),
        ("methods: {adam: {epochs: 0}}", r"`methods.adam.epochs` must be a positive integer, got 0"),
        # A method's `prior:` mapping, and the grid keys that tune it.
        ("methods: {adam: {prior: {kind: gaussian, std: 1.0}}}", r"`methods.adam.prior` applies to samplers only"),
        ("methods: {sgnht: {prior: {kind: hierarchical}}}",
         r"`methods.sgnht` sets both `prior_std` \(3.0\) and `prior`"),
        ("methods: {sgnht: {prior_std: null, prior: {kind: wide}}}",
         r"`methods.sgnht.prior` must be a mapping with `kind` one of \['fan_in', 'gaussian', 'hierarchical', 'laplace'\], "
         r"got 'wide'"),
        ("methods: {sgnht: {prior_std: null, prior: hierarchical}}",
         r"`methods.sgnht.prior` must be a mapping .* got 'hierarchical'"),
        ("methods: {sgnht: {prior_std: null, prior: {kind: hierarchical, std: 2.0}}}",
         r"`methods.sgnht.prior` has unknown keys \['std'\]"),
        ("training: {epochs: 1, batch_size: 32, num_chains: 2}\n"
         "methods: {sgnht: {prior_std: null, prior: {kind: hierarchical}}}",
         r"kind 'hierarchical' keeps a state of its own .* needs `training.num_chains: 1`, got 2"),
        ("tune: {grids: {sgnht: {prior.beta: [1.0]}}}",
         r"`tune.grids.sgnht.prior.beta` tunes the `prior:` mapping of method 'sgnht', which has none"),
        ("methods: {sgnht: {prior_std: null, prior: {kind: hierarchical}}}",  # the sgnht grid has prior_std
         r"`tune.grids.sgnht.prior_std` tunes `prior_std` of method 'sgnht', which has a `prior:` mapping"),
        ("methods: {hier: {sampler: sgnht, prior: {kind: hierarchical}}}\ntune: {grids: {hier: {prior.std: [1.0]}}}",
         r"`tune.grids.hier.prior.std`: 'std' is not an argument of method 'hier''s 'hierarchical' prior; "
         r"allowed: \['prior.alpha', 'prior.beta', 'prior.resample_every', 'prior.initial_std'\]"),
        # A sampler's step-size and temperature schedules, and the grid keys that tune them.
        ("methods: {adam: {step_size_schedule: {kind: cyclical, cycles: 4}}}",
         r"`methods.adam.step_size_schedule` applies to samplers only"),
        ("methods: {sgnht: {step_size_schedule: {kind: cosine}}}",
         r"`methods.sgnht.step_size_schedule` must be a mapping with `kind` one of \['cyclical'\], got 'cosine'"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 4, period: 3}}}",
         r"`methods.sgnht.step_size_schedule` has unknown keys \['period'\]"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical}}}",
         r"`methods.sgnht.step_size_schedule` needs exactly one of `cycles` .* and `cycle_epochs`"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 4, cycle_epochs: 5}}}",
         r"needs exactly one of `cycles`"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 0}}}",
         r"`methods.sgnht.step_size_schedule.cycles` must be a positive integer, got 0"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 2.5}}}",
         r"`methods.sgnht.step_size_schedule.cycles` must be a positive integer, got 2.5"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycle_epochs: 40}}}",
         r"`methods.sgnht.step_size_schedule.cycle_epochs` must be a positive number at most 30, got 40"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 4, exploration_fraction: 1.0}}}",
         r"`methods.sgnht.step_size_schedule.exploration_fraction` must be a number in \[0, 1\), got 1.0"),
        ("methods: {sgnht: {options: {step_size: null}, step_size_schedule: {kind: cyclical, cycles: 4}}}",
         r"`methods.sgnht.step_size_schedule` starts every cycle at the sampler's `options.step_size`, which "
         r"must be a positive number, got None"),
        ("methods: {sgnht: {temperature_schedule: {kind: anneal}}}",
         r"`methods.sgnht.temperature_schedule` must be a mapping with `kind` one of \['ramp'\], got 'anneal'"),
        ("methods: {sgnht: {temperature_schedule: {kind: ramp, ramp_epochs: 5}}}",
         r"`methods.sgnht.temperature_schedule` of kind 'ramp' needs \['initial_temperature'\]"),
        ("methods: {sgnht: {temperature_schedule: {kind: ramp, initial_temperature: -1, ramp_epochs: 5}}}",
         r"`methods.sgnht.temperature_schedule.initial_temperature` must be a positive number, got -1"),
        ("methods: {sgnht: {temperature_schedule: {kind: ramp, initial_temperature: 1.0, ramp_epochs: 30}}}",
         r"`methods.sgnht.temperature_schedule.ramp_epochs` must be a positive number below 30, got 30"),
        ("methods: {sgnht: {temperature_schedule: {kind: ramp, initial_temperature: 1.0, ramp_epochs: 5, "
         "interpolation: cubic}}}",
         r"`methods.sgnht.temperature_schedule.interpolation` must be one of \['geometric', 'linear'\], got 'cubic'"),
        ("tune: {grids: {sgnht: {step_size_schedule.cycles: [2, 4]}}}",
         r"`tune.grids.sgnht.step_size_schedule.cycles` tunes the `step_size_schedule:` mapping of method 'sgnht', "
         r"which has none; give the method a `step_size_schedule:` mapping"),
        ("methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 4}}}\n"
         "tune: {grids: {sgnht: {step_size_schedule.initial_step_size: [0.1]}}}",
         r"'initial_step_size' is not an argument of method 'sgnht''s 'cyclical' step size schedule; allowed: "
         r"\['step_size_schedule.cycles', 'step_size_schedule.cycle_epochs', 'step_size_schedule.exploration_fraction'\]"),
    ],
)
def test_tune_and_ood_bad_input_names_the_key(tmp_path, extra, match):
    with pytest.raises(run.ConfigError, match=match):
        run.load_config(_tuned_config_text(tmp_path, extra))


def test_quick_tune_needs_a_tune_block(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(f"extends: {CONFIGS / 'digits.yaml'}\nquick: {{tune: {{search: grid}}}}\n")
    with pytest.raises(run.ConfigError, match="`quick.tune` shrinks the `tune:` block"):
        run.load_config(path)


def test_axes_and_grid_searches_visit_the_expected_settings(monkeypatch, tmp_path):
    # A stand-in for training: the validation NLL is a known function of the settings.
    def fake_run(key, method, config, task, noise, out, verbose, strategy=None, *, log_dir=None):
        h, std = method["options"]["step_size"], method.get("prior_std")
        return {"kind": "sampler", "status": "ok", "seconds": 0.0, "history": {},
                "metrics": {"nll": (h - 0.02) ** 2 + (std - 3.0) ** 2 + 1.0, "accuracy": 0.5}}

    monkeypatch.setattr(run, "run_method", fake_run)
    config = run.load_config(TUNED)
    method = config["methods"]["sgnht"]
    grid = {"step_size": [0.01, 0.02, 0.04], "prior_std": [1.0, 3.0]}
    task = run.TaskData(train=type("D", (), {"num_examples": 8})(), test=type("D", (), {"num_examples": 2})())
    for search, count in (("grid", 6), ("axes", 4)):  # axes: 3 step sizes, then the other prior_std
        config["tune"] = dict(config["tune"], search=search, grids={"sgnht": grid})
        record = run.tune_method("sgnht", method, config, lambda: task, 0.0, tmp_path, 0, log=lambda *_: None)
        assert len(record["trials"]) == count
        assert record["chosen"] == {"step_size": 0.02, "prior_std": 3.0}
        assert record["validation_nll"] == pytest.approx(1.0)


def test_prior_values_are_checked_before_training(tmp_path):
    hierarchical = {"label": "H", "sampler": "sgnht", "prior": {"kind": "hierarchical", "beta": -1.0}}
    with pytest.raises(run.ConfigError, match=r"Method 'H': cannot build the prior .*`beta` must be"):
        run.build_prior(hierarchical)
    with pytest.raises(run.ConfigError, match=r"Method 'H': cannot build the prior \{'prior_std': 'wide'\}"):
        run.build_prior({"label": "H", "sampler": "sgnht", "prior_std": "wide"})
    assert run.build_prior({"label": "H", "sampler": "sgnht", "prior_std": None}) is None  # flat prior
    fan_in = run.build_prior({"label": "F", "sampler": "sgnht", "prior": {"kind": "fan_in", "scale": 2.0}})
    assert isinstance(fan_in, kt.priors.FanInGaussian) and fan_in.get_config() == {"scale": 2.0, "bias_std": 1.0}
    # A bad value in a grid stops the run before anything trains or any data is read.
    path = _tuned_config_text(tmp_path, (
        "methods: {hier: {label: H, sampler: sgnht, options: {step_size: 1.0e-2}, prior: {kind: hierarchical}}}\n"
        "tune: {grids: {hier: {prior.resample_every: [10, 0]}}}\n"
    ))
    with pytest.raises(run.ConfigError, match=r"Method 'H': cannot build the prior .*`resample_every`"):
        run.run_config(run.load_config(path), tmp_path / "out", methods="hier", verbose=0, log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_schedule_values_are_checked_before_training(tmp_path):
    method = {"label": "C", "sampler": "sgnht", "options": {"step_size": 0.02},
              "step_size_schedule": {"kind": "cyclical", "cycles": 4, "exploration_fraction": 0.5}}
    schedule = run.build_step_size_schedule(method, steps_per_epoch=21, epochs=30)
    assert schedule.get_config() == {"initial_step_size": 0.02, "cycle_length": 158, "exploration_fraction": 0.5}
    by_epochs = dict(method, step_size_schedule={"kind": "cyclical", "cycle_epochs": 7.5})
    assert run.build_step_size_schedule(by_epochs, 21, 30).cycle_length == 158  # round(7.5 x 21)
    with pytest.raises(run.ConfigError, match=r"Method 'C': `step_size_schedule.cycles` 700 is more than the "
                                              r"run's 630 steps"):
        run.build_step_size_schedule(dict(method, step_size_schedule={"kind": "cyclical", "cycles": 700}), 21, 30)
    short = dict(method, step_size_schedule={"kind": "cyclical", "cycle_epochs": 0.1, "exploration_fraction": 0.8})
    with pytest.raises(run.ConfigError, match=r"Method 'C': cannot build the step-size schedule .*\(2 of the run's "
                                              r"630 steps per cycle\): .*leaves no step of a cycle to sample"):
        run.build_step_size_schedule(short, 21, 30)
    ramp = run.build_temperature(dict(method, temperature=0.1, temperature_schedule={
        "kind": "ramp", "initial_temperature": 1.0, "ramp_epochs": 10}), steps_per_epoch=21)
    assert ramp.get_config() == {"initial_temperature": 1.0, "temperature": 0.1, "ramp_steps": 210,
                                 "interpolation": "geometric"}
    assert run.build_temperature({"temperature": 0.3}, 21) == 0.3
    # A bad value in a grid stops the run before anything trains or any data is read.
    path = _tuned_config_text(tmp_path, (
        "methods: {sgnht: {step_size_schedule: {kind: cyclical, cycles: 4}}}\n"
        "tune: {grids: {sgnht: {step_size_schedule.exploration_fraction: [0.5, 1.5]}}}\n"
    ))
    with pytest.raises(run.ConfigError, match=r"`methods.sgnht.step_size_schedule.exploration_fraction` must be a "
                                              r"number in \[0, 1\), got 1.5 \(a setting of the tuning grid: "
                                              r".*step_size_schedule.exploration_fraction=1.5\)"):
        run.run_config(run.load_config(path), tmp_path / "out", methods="sgnht", verbose=0, log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_schedules_reach_the_sampler_and_the_model_and_set_what_is_averaged(monkeypatch, tmp_path):
    from keras_thermo.posterior import PosteriorAverage

    averaged = []  # the steps of every sample the posterior averages took
    real_consume = PosteriorAverage.consume

    def consume(self, values, steps, masks=None):
        averaged.append(np.asarray(steps).tolist())
        return real_consume(self, values, steps, masks)

    monkeypatch.setattr(PosteriorAverage, "consume", consume)
    config = run.apply_quick(run.load_config(CONFIGS / "digits_tuned_schedules.yaml"))  # 2 epochs of 21 steps
    assert config["methods"]["sgnht_ramp"]["temperature_schedule"]["ramp_epochs"] == 1  # quick's override
    config["evaluation"] = dict(config["evaluation"], burn_in_epochs=0, every_n_steps=1)
    task = run.load_task_data(config, 0.0, quick=True, mock_data=False, data_dir=None)

    # Cyclical: 4 cycles over 42 steps, 11 steps each, the first ceil(0.5 x 11) = 6 exploring. A
    # step counted from 0 is recorded as the count of steps completed, so step s (from 1) is
    # averaged when (s - 1) mod 11 >= 6.
    method = run.apply_settings(config["methods"]["sgnht_cyclical"], {"step_size_schedule.exploration_fraction": 0.5})
    record = run.run_method("sgnht_cyclical", method, config, task, 0.0, tmp_path, 0)
    assert record["status"] == "ok"
    assert record["sampler"]["step_size"]["config"] == {
        "initial_step_size": 0.02, "cycle_length": 11, "exploration_fraction": 0.5}
    expected = [s for s in range(1, 43) if (s - 1) % 11 >= 6]
    assert sum(averaged, []) == expected and record["metrics"]["num_samples"] == len(expected) == 18

    # Ramp: 1 epoch (21 steps) from T = 1 to 0.1; a fixed burn-in of 0 is raised to its end.
    averaged.clear()
    task = run.load_task_data(config, 0.0, quick=True, mock_data=False, data_dir=None)
    record = run.run_method("sgnht_ramp", config["methods"]["sgnht_ramp"], config, task, 0.0, tmp_path, 0)
    assert record["status"] == "ok" and record["evaluation"]["burn_in_steps"] == 21
    assert record["temperature_schedule"] == {"name": "TemperatureRamp", "initial_temperature": 1.0,
                                              "temperature": 0.1, "ramp_steps": 21, "interpolation": "geometric"}
    assert sum(averaged, []) == list(range(22, 43))
    # The epoch logs carry T of each epoch's last step: T(20) = 1 x 0.1^(20/21) on the ramp, then
    # 0.1 (float32 rounding).
    assert record["history"]["temperature"] == pytest.approx([0.1 ** (20 / 21), 0.1], rel=1e-6)


def test_axes_search_tunes_the_prior_arguments(monkeypatch, tmp_path):
    def fake_run(key, method, config, task, noise, out, verbose, strategy=None, *, log_dir=None):
        beta = method["prior"]["beta"]
        return {"kind": "sampler", "status": "ok", "seconds": 0.0, "history": {},
                "metrics": {"nll": (math.log10(beta) - 1.0) ** 2 + 1.0, "accuracy": 0.5}}

    monkeypatch.setattr(run, "run_method", fake_run)
    config = run.load_config(TUNED)
    method = dict(config["methods"]["sgnht"], prior_std=None, prior={"kind": "hierarchical", "beta": 1.0})
    tuned = run.apply_settings(method, {"prior.beta": 100.0, "step_size": 0.02})
    assert tuned["prior"] == {"kind": "hierarchical", "beta": 100.0} and tuned["options"]["step_size"] == 0.02
    assert method["prior"]["beta"] == 1.0  # the configured method is left as it was
    config["tune"] = dict(config["tune"], search="axes", grids={"sgnht": {"prior.beta": [1.0, 10.0, 100.0]}})
    task = run.TaskData(train=type("D", (), {"num_examples": 8})(), test=type("D", (), {"num_examples": 2})())
    record = run.tune_method("sgnht", method, config, lambda: task, 0.0, tmp_path, 0, log=lambda *_: None)
    assert [t["settings"] for t in record["trials"]] == [{"prior.beta": b} for b in (1.0, 10.0, 100.0)]
    assert record["chosen"] == {"prior.beta": 10.0}
    assert run._describe(record["chosen"]) == "prior.beta=10"


def test_hierarchical_prior_reaches_the_model_and_is_resampled(monkeypatch, tmp_path):
    import keras_thermo as kt

    models = []

    class RecordingModel(kt.BayesianModel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            models.append(self)

    monkeypatch.setattr(kt, "BayesianModel", RecordingModel)
    config = run.apply_quick(run.load_config(TUNED))  # 2 epochs of 21 steps
    method = dict(config["methods"]["sgnht"], prior_std=None,
                  prior={"kind": "hierarchical", "alpha": 1.0, "beta": 1.0, "resample_every": 21, "initial_std": 3.0})
    method = run.apply_settings(method, {"prior.beta": 100.0})  # as a tuning trial sets it
    task = run.load_task_data(config, 0.0, quick=True, mock_data=False, data_dir=None)
    record = run.run_method("sgnht", method, config, task, 0.0, tmp_path, 0)
    assert record["status"] == "ok" and task.train.steps_per_epoch == 21
    expected = {"alpha": 1.0, "beta": 100.0, "resample_every": 21, "initial_std": 3.0}
    assert record["prior"] == {"name": "HierarchicalGaussian", **expected}
    assert run._settings(record).items() >= {"prior": "hierarchical", "prior.beta": 100.0}.items()  # the table's
    (model,) = models
    assert isinstance(model.prior, kt.priors.HierarchicalGaussian) and model.prior.get_config() == expected
    # The last Gibbs draw came after the final step (42 = 2 x 21): each precision is a draw
    # from its conditional Gamma(shape, rate) given the final weights, so it lies within 5
    # standard deviations sqrt(shape) / rate of the mean shape / rate.
    variables = model.trainable_variables
    precisions = [float(p) for p in model.prior.precisions(variables)]
    conditionals = [(float(a), float(b)) for a, b in model.prior.conditional(variables, method["temperature"])]
    for (shape, rate), precision, std in zip(conditionals, precisions, record["prior_final_std"].values()):
        assert abs(precision - shape / rate) < 5 * math.sqrt(shape) / rate, (precision, shape, rate)
        assert std == pytest.approx(precision ** -0.5, rel=1e-6)
    # The first kernel's 3200 weights pin its precision down: the initial 1 / 3^2 lies far outside
    # that band, so a prior whose state never moved would fail the check above.
    shape, rate = conditionals[0]
    assert abs(1.0 / 9.0 - shape / rate) > 20 * math.sqrt(shape) / rate


def test_tuning_never_reads_the_test_split_and_the_choice_is_reported(monkeypatch, tmp_path):
    from keras_thermo import data as kt_data

    events = []
    real_load, real_run = kt_data.load_digits, run.run_method

    def load_digits(split="train", **kwargs):
        events.append(("load", split, kwargs.get("examples")))
        return real_load(split, **kwargs)

    def run_method(key, method, config, task, noise, out, verbose, strategy=None, *, log_dir=None):
        record = real_run(key, method, config, task, noise, out, verbose, strategy, log_dir=log_dir)
        events.append(("run", key, task.test.split, task.holdout, record))
        return record

    monkeypatch.setattr(kt_data, "load_digits", load_digits)
    monkeypatch.setattr(run, "run_method", run_method)
    path = _tuned_config_text(tmp_path, (
        "quick: {epochs: 2, burn_in_epochs: 1, label_noise: [0.0],\n"
        "        tune: {grids: {adam: {learning_rate: [1.0e-4, 1.0e-2]}}, share: {sgd: adam}}}\n"
        "ood: null\n"
    ))
    out = tmp_path / "out"
    results = run.run_config(run.load_config(path), out, quick=True, methods="adam,sgd", verbose=0,
                             log=lambda *_: None)

    run_positions = [i for i, e in enumerate(events) if e[0] == "run"]
    runs = [events[i] for i in run_positions]
    trials, reported = runs[:2], runs[2:]
    first_test_load = next(i for i, e in enumerate(events) if e[0] == "load" and e[1] == "test")
    # Every trial ended before the test split was first read, and scored on a part of "train".
    assert run_positions[1] < first_test_load < run_positions[2]
    train_size = len(kt_data.digits_arrays("train")[1])
    for _, _, split, holdout, _ in trials:
        assert split == "train" and holdout is not None
        fit, validation = set(holdout["fit"].tolist()), set(holdout["validation"].tolist())
        assert not fit & validation and fit | validation == set(range(train_size))
        assert len(validation) == pytest.approx(0.2 * train_size, abs=10)  # rounding per class
    assert [r[2] for r in reported] == ["test", "test"] and reported[0][3] is None

    # The choice is the trial with the lowest validation NLL (lr 1e-2 learns in two epochs,
    # 1e-4 barely moves), its best epoch sets the reported run's epochs, and both are reported.
    record = results["runs"][0]
    tuning = record["tuning"]
    nlls = [t["validation_nll"] for t in tuning["trials"]]
    assert nlls[1] < nlls[0]
    assert tuning["chosen"]["learning_rate"] == 1.0e-2
    assert tuning["chosen"]["epochs"] == tuning["trials"][1]["epochs"]
    assert len(record["history"]["epoch"]) == tuning["chosen"]["epochs"]
    assert record["optimizer"]["learning_rate"] == 1.0e-2
    assert tuning["validation"]["validation_examples"] + tuning["validation"]["fit_examples"] == train_size
    written = load_strict_json(out / "results.json")["runs"][0]["tuning"]
    assert written["chosen"] == tuning["chosen"]
    table = (out / "table.md").read_text()
    assert f"| Adam | 0% | {100 * record['metrics']['accuracy']:.2f}%" in table
    assert f"learning_rate=0.01, epochs={tuning['chosen']['epochs']}" in table
    # `share`: SGD is not tuned itself but runs with the settings chosen for Adam.
    shared = results["runs"][1]
    assert shared["tuning"]["shared_from"] == "adam" and shared["tuning"]["trials"] == []
    assert shared["optimizer"]["learning_rate"] == 1.0e-2
    assert len(shared["history"]["epoch"]) == tuning["chosen"]["epochs"]
    assert f"epochs={tuning['chosen']['epochs']} (chosen for adam)" in table


def test_ood_study_scores_out_of_distribution_digits(tmp_path):
    from keras_thermo import data as kt_data

    config = run.apply_quick(run.load_config(TUNED))
    ood_config = dict(config, model={**config["model"], "options": {**config["model"]["options"], "num_classes": 5}})
    task = run.load_task_data(ood_config, 0.0, quick=True, mock_data=False, data_dir=None, part="ood")
    assert task.train.num_classes == task.test.num_classes == 5
    # The held-out in-distribution images and the OOD images are the test images of each group.
    _, y_test = kt_data.digits_arrays("test")
    assert task.test.num_examples == int(np.isin(y_test, [0, 1, 2, 3, 4]).sum())
    assert task.ood.num_examples == int(np.isin(y_test, [5, 6, 7, 8, 9]).sum())
    ood_config["training"] = dict(config["training"], epochs=5)
    adam = run.apply_settings(config["methods"]["adam"], {"learning_rate": 1.0e-2})
    record = run.run_method("adam", adam, ood_config, task, 0.0, tmp_path, 0)
    scores = record["ood"]
    assert record["metrics"]["accuracy"] > 0.9
    # Five epochs already rank unseen digits as more uncertain than held-out seen ones.
    assert 0.6 < scores["auroc_predictive_entropy"] <= 1.0
    assert scores["auroc_mutual_information"] is None  # one set of weights: no disagreement


def load_config_epochs() -> int:
    return int(run.load_config(CONFIGS / "digits.yaml")["quick"]["epochs"])


@pytest.mark.slow  # ~1 min; tests/test_chains.py covers the chains themselves in the default suite
def test_demo_with_several_chains_pools_them_and_logs_each_chain(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--quick", "--num-chains", "2"]) == 0
    capsys.readouterr()
    results = _check_outputs(out, ["Adam", "SGNHT"])
    sgnht = {r["method"]: r for r in results["runs"]}["sgnht"]
    assert sgnht["status"] == "ok" and sgnht["num_chains"] == 2
    assert sgnht["metrics"]["num_samples"] % 2 == 0 and sgnht["metrics"]["num_samples"] >= 2  # both chains pooled
    assert len(sgnht["history"]["posterior_accuracy"]) == load_config_epochs()
    tags = _event_tags(sgnht["tensorboard"])
    for name in ("kinetic_temperature_chain_0", "kinetic_temperature_chain_1", "xi_chain_1", "xi"):
        assert f"epoch_{name}" in tags, sorted(tags)


# ---------------------------------------------------------------------------------------------
# Falling back when the chosen settings diverge on the whole training split


def _tuning(chosen_step, trials):
    """A tuning record over step sizes: trials are (step size, status, validation NLL)."""
    records = [{"settings": {"step_size": h}, "status": status, "validation_nll": nll} for h, status, nll in trials]
    chosen = next(t for t in records if t["settings"]["step_size"] == chosen_step)
    return {"chosen": {"step_size": chosen_step}, "validation_nll": chosen["validation_nll"], "trials": records}


def _fake_runs(diverging):
    """A stand-in for training: a step size in `diverging` diverges after 24 steps."""
    calls = []

    def run_once(method, attempt):
        h = method["options"].get("step_size")
        calls.append((h, attempt))
        if h in diverging:
            return {"status": "diverged", "diverged_at_step": 24, "metrics": {"accuracy": 0.1}}
        return {"status": "ok", "metrics": {"accuracy": 0.9}}

    return run_once, calls


def test_fallback_goes_down_the_validated_settings_and_leaves_stable_runs_alone():
    method = {"label": "S", "sampler": "sgnht", "options": {"step_size": 1.0}}
    trials = [(0.04, "diverged", math.inf), (0.005, "ok", 0.5), (0.02, "ok", 0.3), (0.01, "ok", 0.4),
              (0.001, "no_samples", math.inf)]
    quiet = {"log": lambda *_: None}
    # A chosen setting that does not diverge: one run, returned as it is (no fallback field).
    run_once, calls = _fake_runs(diverging=set())
    record = run.run_with_fallback(method, _tuning(0.02, trials), run_once, **quiet)
    assert calls == [(0.02, 0)] and record == {"status": "ok", "metrics": {"accuracy": 0.9}}
    # An untuned method runs as configured, once.
    run_once, calls = _fake_runs(diverging={1.0})
    assert run.run_with_fallback(method, None, run_once, **quiet)["status"] == "diverged" and calls == [(1.0, 0)]
    # 0.02 diverges: the next-best validated setting (0.01, NLL 0.4) is reported; the diverged
    # and unscored trials (0.04, 0.001) are never tried.
    run_once, calls = _fake_runs(diverging={0.02})
    record = run.run_with_fallback(method, _tuning(0.02, trials), run_once, **quiet)
    assert calls == [(0.02, 0), (0.01, 1)] and record["status"] == "ok"
    assert record["fallback"] == {
        "first_choice": {"step_size": 0.02}, "reported": {"step_size": 0.01}, "validation_nll": 0.4,
        "attempts": [
            {"settings": {"step_size": 0.02}, "validation_nll": 0.3, "status": "diverged", "diverged_at_step": 24},
            {"settings": {"step_size": 0.01}, "validation_nll": 0.4, "status": "ok", "diverged_at_step": None},
        ]}
    # Every setting diverges: all validated ones are tried, best first, and the first choice's
    # run is reported as diverged.
    run_once, calls = _fake_runs(diverging={0.02, 0.01, 0.005})
    record = run.run_with_fallback(method, _tuning(0.02, trials), run_once, **quiet)
    assert calls == [(0.02, 0), (0.01, 1), (0.005, 2)]
    assert record["status"] == "diverged" and record["fallback"]["reported"] is None
    assert [a["status"] for a in record["fallback"]["attempts"]] == ["diverged"] * 3
    note = run._fallback_note(record["fallback"])
    assert note.startswith("(diverged; so did every other validated setting: step_size=0.01 diverged after 24 steps")
    # An optimizer's trial stands for its grid point and its best epoch.
    assert run.trial_settings({"settings": {"learning_rate": 0.1}, "epochs": 7}) == {"learning_rate": 0.1, "epochs": 7}


def test_reported_and_ood_runs_fall_back_when_the_choice_diverges(monkeypatch, tmp_path):
    real_run = run.run_method

    def run_method(key, method, config, task, noise, out, verbose, strategy=None, *, log_dir=None):
        # The first reported and the first OOD run (not a tuning trial, not a fallback) get a
        # step size far past stability, so whatever was chosen really diverges there.
        first_final_run = "tuning" not in log_dir.parts and not log_dir.name.startswith("fallback")
        if first_final_run:
            method = run.apply_settings(method, {"step_size": 10.0})
        return real_run(key, method, config, task, noise, out, verbose, strategy, log_dir=log_dir)

    monkeypatch.setattr(run, "run_method", run_method)
    path = _tuned_config_text(tmp_path, (
        "quick: {epochs: 2, burn_in_epochs: 1, label_noise: [0.0],\n"
        "        tune: {grids: {sgnht: {step_size: [5.0e-3, 1.0e-2, 10.0]}}}}\n"
    ))
    out = tmp_path / "out"
    results = run.run_config(run.load_config(path), out, quick=True, methods="sgnht", verbose=0, log=lambda *_: None)
    (record,), (ood_record,) = results["runs"], results["ood_runs"]
    tuning = record["tuning"]
    assert [t["status"] for t in tuning["trials"]] == ["ok", "ok", "diverged"]  # 10.0 diverges in tuning too
    other = next(t for t in tuning["trials"][:2] if t["settings"] != tuning["chosen"])
    for final in (record, ood_record):
        fallback = final["fallback"]
        assert fallback["first_choice"] == tuning["chosen"] and fallback["reported"] == other["settings"]
        first, second = fallback["attempts"]
        assert first["status"] == "diverged" and 0 <= first["diverged_at_step"] < 42  # 2 epochs of 21 steps
        assert second["status"] == "ok" and final["status"] == "ok"
        assert final["sampler"]["step_size"] == other["settings"]["step_size"]
    assert load_strict_json(out / "results.json")["runs"][0]["fallback"] == record["fallback"]
    table = (out / "table.md").read_text()
    note = (f"(diverged after {record['fallback']['attempts'][0]['diverged_at_step']} steps; "
            f"fallback: step_size={other['settings']['step_size']:g})")
    assert f"| step_size={tuning['chosen']['step_size']:g} {note} |" in table
    assert f"| SGNHT {run._fallback_note(ood_record['fallback'])} |" in table  # the OOD study's row


def test_a_thermostat_samplers_warmup_ends_by_the_burn_in_unless_the_method_sets_it():
    method = {"label": "SGNHT", "sampler": "sgnht", "options": {"step_size": 1e-2}}
    for schedule, expected in [
        ({"burn_in_steps": "auto", "max_burn_in_steps": 210}, 210),
        ({"burn_in_steps": 300, "max_burn_in_steps": None}, 300),
        ({"burn_in_steps": 5000, "max_burn_in_steps": None}, 1000),  # the default, shorter already
        ({"burn_in_steps": "auto", "max_burn_in_steps": None}, 1000),
    ]:
        sampler = run.build_sampler(method)
        run._tie_warmup_to_burn_in(sampler, method, schedule)
        assert sampler.warmup_steps == expected, schedule
    given = dict(method, options={"step_size": 1e-2, "warmup_steps": 700})
    sampler = run.build_sampler(given)
    run._tie_warmup_to_burn_in(sampler, given, {"burn_in_steps": 100, "max_burn_in_steps": None})
    assert sampler.warmup_steps == 700
