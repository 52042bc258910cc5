"""Every feature with every other: samplers x chains x preconditioner x schedule x layer type x
output kind x compile mode, each run through `fit`, `evaluate_posterior`, `save`/`load_model` and
a resumed `fit` that must continue bit for bit.

Two all-pairs coverings of the other six factors (every pair of levels of any two factors appears
in some row, `all_pairs`), one compiled by TensorFlow and one by XLA, together cover every pair of
all seven factors. The default suite runs the first without the resumed fit (two more traced
steps per row); the same covering with the resumed fit, the XLA covering and the full product are
slow tests, because XLA's compilation of the CCAdL and mCCAdL steps takes a minute or more per
row on a CPU (`pytest -m slow tests/test_composition.py --durations=0`). A combination the
library does not support must be refused at construction or compile with a clear error: those
are listed in `UNSUPPORTED`, and the test checks that they are refused there.
"""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

import keras_thermo as kt

FACTORS = {
    "sampler": ["sgld", "sghmc", "sgnht", "ccadl", "mccadl", "tact_hmc"],
    "num_chains": [1, 2],
    "preconditioner": [None, "layerwise"],
    "schedule": ["constant", "cyclical", "auto"],  # auto: the default step_size="auto" (and friction)
    "net": ["dense", "conv", "lstm"],
    "outputs": ["logits", "softmax"],
    "jit_compile": [False, True],
}

#: (predicate on a combination, the error's type and a pattern of its message).
UNSUPPORTED: list = []

ROWS, BATCH, CLASSES, STEP_SIZE = 32, 8, 3, 1e-3


def all_pairs(factors: dict[str, list]) -> list[dict]:
    """A small set of combinations that covers every pair of levels of every two factors
    (greedy: each new row takes, factor by factor, the level that covers most uncovered pairs)."""
    names = list(factors)
    uncovered = {
        (a, la, b, lb)
        for a, b in itertools.combinations(names, 2)
        for la in factors[a] for lb in factors[b]
    }
    rows = []
    while uncovered:
        first = next(iter(sorted(uncovered, key=repr)))
        row = {first[0]: first[1], first[2]: first[3]}
        for name in names:
            if name in row:
                continue

            def gain(level, name=name):
                return sum((a, row[a], name, level) in uncovered or (name, level, a, row[a]) in uncovered
                           for a in row)

            row[name] = max(factors[name], key=gain)
        rows.append(row)
        uncovered -= {
            (a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)
        }
    return rows


def _id(row: dict) -> str:
    return "-".join(f"{v}" if not isinstance(v, bool) else ("xla" if v else "graph") for v in row.values())


def _net(kind: str, outputs: str) -> tuple[keras.Model, np.ndarray]:
    rng = np.random.default_rng(0)
    head = keras.layers.Dense(CLASSES, activation="softmax" if outputs == "softmax" else None)
    if kind == "dense":
        x = rng.normal(size=(ROWS, 4))
        layers = [keras.Input((4,)), keras.layers.Dense(5, activation="relu")]
    elif kind == "conv":
        x = rng.normal(size=(ROWS, 6, 6, 1))
        layers = [keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, activation="relu"), keras.layers.Flatten()]
    else:
        x = rng.normal(size=(ROWS, 4, 3))
        layers = [keras.Input((4, 3)), keras.layers.LSTM(4)]
    return keras.Sequential(layers + [head]), x.astype("float32")


def _sampler(row: dict):
    step_size = {
        "constant": STEP_SIZE,
        "cyclical": kt.schedules.Cyclical(STEP_SIZE, cycle_length=4, exploration_fraction=0.5),
        "auto": kt.samplers.auto_step.AUTO,
    }[row["schedule"]]
    options = {}
    if row["preconditioner"] is not None:
        options["preconditioner"] = kt.samplers.preconditioning.Preconditioner(row["preconditioner"], warmup_steps=2)
    if row["sampler"] == "tact_hmc":
        options["sample_every"] = 1
    if "per_variable_thermostat" in row:
        options["per_variable_thermostat"] = row["per_variable_thermostat"]
    if row.get("covariance"):
        options["covariance"] = row["covariance"]
    return kt.samplers.get(row["sampler"], step_size=step_size, **options)


def _unsupported(row: dict):
    return next(((kind, pattern) for applies, kind, pattern in UNSUPPORTED if applies(row)), None)


def _build(row: dict):
    keras.utils.set_random_seed(0)
    net, x = _net(row["net"], row["outputs"])
    y = np.random.default_rng(1).integers(0, CLASSES, size=ROWS)
    model = kt.BayesianModel(net, _sampler(row), num_examples=ROWS, prior=kt.priors.Gaussian(1.0), seed=5,
                             num_chains=row["num_chains"])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=row["outputs"] == "logits"),
                  steps_per_execution=2, jit_compile=row["jit_compile"])
    return model, x, y


def _build_regression(row: dict):
    """A dense net with a learned-noise Gaussian likelihood (a mean and a raw scale, per input or,
    with `row["noise"] == "shared"`, one for every input) on standardized targets."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    y = (x @ [0.5, -1.0, 0.0, 0.3] + 0.3 * rng.normal(size=ROWS)).astype("float32")[:, None]
    y = kt.regression.TargetScaler().fit(y).transform(y)
    hidden = [keras.Input((4,)), keras.layers.Dense(5, activation="relu")]
    head = [keras.layers.Dense(1), kt.regression.SharedNoiseScale()] if row.get("noise") == "shared" else [keras.layers.Dense(2)]
    net = keras.Sequential(hidden + head)
    # The prior the regression docs recommend, so it is saved, resumed and run with chains too.
    model = kt.BayesianModel(net, _sampler(row), num_examples=ROWS, prior=kt.priors.FanInGaussian(), seed=5,
                             num_chains=row["num_chains"])
    model.compile(loss=kt.losses.GaussianNLL(), steps_per_execution=2, jit_compile=row.get("jit_compile", False))
    return model, x, y


def _check_classification(model, collector, x, y) -> None:
    report = kt.evaluate_posterior(model, collector, (x, y), verbose=0)
    assert np.isfinite(report["nll"]) and 0.0 <= report["accuracy"] <= 1.0


def _check_regression(model, collector, x, y) -> None:
    report = kt.regression.evaluate_posterior(model, collector, (x, y), verbose=0)
    assert np.isfinite(report["nll"]) and np.isfinite(report["crps"]) and 0.0 <= report["coverage_90"] <= 1.0


def check_combination(row: dict, tmp_path, resume: bool = True, task: str = "classification", callbacks=()) -> None:
    build, check = (_build, _check_classification) if task == "classification" else (_build_regression, _check_regression)
    refused = _unsupported(row)
    if refused is not None:
        with pytest.raises(refused[0], match=refused[1]):
            build(row)
        return
    model, x, y = build(row)
    collector = kt.callbacks.SampleCollector(every_n_steps=1)
    model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[collector, *callbacks], verbose=0)
    assert model.sampler_step == ROWS // BATCH
    assert collector.steps.size > 0, "no sample recorded"
    check(model, collector, x, y)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for chain in range(row["num_chains"]):
        for a, b in zip(model.chain_weights(chain), loaded.chain_weights(chain)):
            np.testing.assert_array_equal(a, b)
    if not resume:
        return
    # The resumed run continues the original bit for bit (same batches, noise and state).
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    for chain in range(row["num_chains"]):
        for a, b in zip(model.chain_weights(chain), loaded.chain_weights(chain)):
            np.testing.assert_array_equal(a, b)


_OTHER_FACTORS = {name: levels for name, levels in FACTORS.items() if name != "jit_compile"}
PAIRS = [{**row, "jit_compile": False} for row in all_pairs(_OTHER_FACTORS)]
XLA_PAIRS = [{**row, "jit_compile": True} for row in all_pairs(_OTHER_FACTORS)]


def test_the_two_coverings_hold_every_pair_of_the_seven_factors():
    rows = PAIRS + XLA_PAIRS
    for a, b in itertools.combinations(FACTORS, 2):
        for la, lb in itertools.product(FACTORS[a], FACTORS[b]):
            assert any(row[a] == la and row[b] == lb for row in rows), (a, la, b, lb)
    # ... and the check can fail: the TensorFlow-compiled covering alone lacks the XLA pairs.
    assert not any(row["jit_compile"] for row in PAIRS)


# The papers' single thermostat (`per_variable_thermostat=False`; the coverings run the default,
# one per tensor; an option of SGNHT, CCAdL and mCCAdL only, so not a factor of the coverings):
# each sampler once, the rows together covering chains, the layerwise preconditioner, the
# cyclical and automatic step sizes, every layer type and both outputs. Slow like the other
# resumed rows (about 100 s); the default suite fits, saves and loads both with chains in
# tests/test_per_variable_thermostat.py.
PER_VARIABLE_THERMOSTAT_ROWS = [
    {"sampler": "sgnht", "num_chains": 2, "preconditioner": "layerwise", "schedule": "cyclical", "net": "lstm",
     "outputs": "softmax", "jit_compile": False, "per_variable_thermostat": False},
    {"sampler": "ccadl", "num_chains": 1, "preconditioner": "layerwise", "schedule": "auto", "net": "conv",
     "outputs": "logits", "jit_compile": False, "per_variable_thermostat": False},
    {"sampler": "mccadl", "num_chains": 2, "preconditioner": None, "schedule": "auto", "net": "dense",
     "outputs": "softmax", "jit_compile": False, "per_variable_thermostat": False},
]


@pytest.mark.slow
@pytest.mark.parametrize("row", PER_VARIABLE_THERMOSTAT_ROWS, ids=[r["sampler"] for r in PER_VARIABLE_THERMOSTAT_ROWS])
def test_one_thermostat_for_the_net_composes_and_resumes(row, tmp_path):
    check_combination(row, tmp_path)


# mCCAdL's C step on the covariance of the step's own minibatch (`covariance="minibatch"`, the
# paper's listing; the rows above run the default, CCAdL's moving average): the rows together
# cover chains, both preconditioners, the cyclical and automatic steps, every layer type, both
# outputs and XLA. Slow like the rows above; the default suite runs it in the tests that name it
# (tests/test_ccadl_mccadl.py, test_distribute.py, test_reliability.py).
MCCADL_MINIBATCH_COVARIANCE_ROWS = [
    {"sampler": "mccadl", "num_chains": 2, "preconditioner": "layerwise", "schedule": "cyclical", "net": "lstm",
     "outputs": "logits", "jit_compile": False, "covariance": "minibatch"},
    {"sampler": "mccadl", "num_chains": 1, "preconditioner": "rmsprop", "schedule": "auto", "net": "conv",
     "outputs": "softmax", "jit_compile": True, "covariance": "minibatch", "per_variable_thermostat": False},
    {"sampler": "mccadl", "num_chains": 2, "preconditioner": None, "schedule": "constant", "net": "dense",
     "outputs": "softmax", "jit_compile": False, "covariance": "minibatch"},
]


@pytest.mark.slow
@pytest.mark.parametrize("row", MCCADL_MINIBATCH_COVARIANCE_ROWS, ids=[r["net"] for r in MCCADL_MINIBATCH_COVARIANCE_ROWS])
def test_mccadl_minibatch_covariance_composes_and_resumes(row, tmp_path):
    check_combination(row, tmp_path)


@pytest.mark.parametrize("row", PAIRS, ids=[_id(r) for r in PAIRS])
def test_every_pair_of_features_composes(row, tmp_path):
    # The resumed fit retraces two train steps per row: its check runs with the slow coverings
    # (and, per sampler, in test_model.py / test_chains.py's resume tests).
    check_combination(row, tmp_path, resume=False)


@pytest.mark.slow
@pytest.mark.parametrize("row", PAIRS, ids=[_id(r) for r in PAIRS])
def test_every_pair_of_features_composes_and_resumes(row, tmp_path):
    check_combination(row, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("row", XLA_PAIRS, ids=[_id(r) for r in XLA_PAIRS])
def test_every_pair_of_features_composes_under_xla(row, tmp_path):
    check_combination(row, tmp_path)


FULL = [dict(zip(FACTORS, levels)) for levels in itertools.product(*FACTORS.values())]


@pytest.mark.slow
@pytest.mark.parametrize("row", FULL, ids=[_id(r) for r in FULL])
def test_every_combination_of_features_composes(row, tmp_path):
    check_combination(row, tmp_path)


# Regression: a Gaussian likelihood with learned noise (`kt.losses.GaussianNLL()`, per input or
# shared by every input) with the features that make sense for it: every sampler, chains,
# preconditioning, schedules, save/load.
REGRESSION_FACTORS = {**{name: FACTORS[name] for name in ("sampler", "num_chains", "preconditioner", "schedule")},
                      "noise": ["input", "shared"]}
REGRESSION_PAIRS = [{name: row[name] for name in REGRESSION_FACTORS} for row in all_pairs(REGRESSION_FACTORS)]


def test_a_gaussian_likelihood_composes_with_chains_preconditioning_a_schedule_and_save_load(tmp_path):
    row = {"sampler": "sgnht", "num_chains": 2, "preconditioner": "layerwise", "schedule": "cyclical"}
    average = kt.callbacks.PosteriorAverage(_build_regression(row)[1:], every_n_steps=1)
    check_combination(row, tmp_path, resume=False, task="regression", callbacks=[average])
    # The callback scores both chains' samples; the cyclical schedule samples in half of each
    # cycle, 2 of the 4 steps.
    assert average.is_regression and [r["num_samples"] for r in average.chain_results()] == [2, 2]
    assert average.num_samples == 4 and np.isfinite(average.result()["crps"])


@pytest.mark.slow
@pytest.mark.parametrize("row", REGRESSION_PAIRS, ids=[_id(r) for r in REGRESSION_PAIRS])
def test_every_pair_of_regression_features_composes_and_resumes(row, tmp_path):
    check_combination(row, tmp_path, task="regression")
