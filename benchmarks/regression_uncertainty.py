"""Predictive uncertainty for regression: SG-MCMC samplers against ordinary least squares, a MAP
fit of the same net and a deep ensemble of MAP nets.

    PYTHONPATH=. python -m benchmarks.regression_uncertainty --out benchmarks/results/regression_uncertainty

Two data sets, both available offline:

- scikit-learn's bundled diabetes data (442 rows, 10 features), 5 random splits, half of the
  rows held out for testing (`--test-fraction`; 0.2 gave the committed 80/20 run). Inputs
  are standardized with the training split's statistics and targets with
  `kt.regression.TargetScaler`; every metric is reported on the targets' own scale.
- a 1-D toy, `y = x sin(x) + N(0, 0.3^2)`, with its inputs in two clusters `[-4, -2.5]` and
  `[2.5, 4]` (`--toy-clusters 2.5 4`): between them (`|x| < 2`) there is no data, and the
  epistemic standard deviation (the spread of the samples' means) must grow there. Its
  predictive bands are plotted. `--toy-clusters 1.5 4` gives the earlier reports' toy, whose
  clusters are wider than the gap between them (`|x| < 1`).

One protocol for every data set and method (no constant is tuned per data set or sampler):

- The net: `d -> 50 relu -> 2` (a mean and a raw noise scale, `kt.losses.GaussianNLL()`;
  `--noise shared`: `d -> 50 relu -> 1` and one learned raw scale for every input),
  the prior `kt.priors.FanInGaussian()` (`--prior`: kernels `N(0, 1 / fan_in)`, biases
  `N(0, 1)`; `fan_in:S` scales the kernels' std by S; a number s gives `kt.priors.Gaussian(s)` on
  every weight).
- MAP: full-batch Adam (learning rate 1e-2, `--map-steps` steps) on `U / N`, the same
  posterior's negative log density per example. Deep ensemble: 5 MAP nets from different
  initialisations, their Gaussians mixed with equal weights.
- Samplers (`SGNHT`, `CCAdL`, `mCCAdL`, `SGHMC`): the library's defaults (`--step-size auto`:
  the automatic step size and the friction that follows it, the thermostats' warm-up, CCAdL's
  diagonal noise covariance; a number gives that step with friction 1), minibatches of 32
  drawn with replacement, started from Keras' initialisation of the net (`--start map`: from
  the first MAP net), `--steps` steps of which the first `--burn-in` are discarded, a sample
  every `--every` steps. Each run records the default temperature check's verdict.
- OLS: least squares with an intercept; its predictive is the Gaussian
  `N(x b, s^2 (1 + x (X^T X)^-1 x^T))`, `s^2` the residual variance with `n - p` degrees of
  freedom.
- Metrics (`kt.regression`): RMSE of the predictive mean, NLL (the predictive mixture's negative
  log density per test example), the coverage and width of its central 90% interval (exact
  mixture quantiles) and the CRPS.

Writes `results.json` (protocol, per-split figures, their means and standard deviations, which
of the targets each method meets on every split) and `toy_bands.png` under `--out`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_thermo as kt  # noqa: E402

SAMPLERS = {
    "sgnht": kt.samplers.SGNHT,
    "ccadl": kt.samplers.CCAdL,
    # The paper's minibatch C step, as in the committed results (the library's default is the average).
    "mccadl": functools.partial(kt.samplers.MCCAdL, covariance="minibatch"),
    "sghmc": kt.samplers.SGHMC,
}
HIDDEN = 50
BATCH_SIZE = 32
ENSEMBLE_SIZE = 5
MAP_LEARNING_RATE = 1e-2
LEVEL = 0.9
#: The toy's two clusters of inputs, `[-outer, -inner]` and `[inner, outer]` (`--toy-clusters`):
#: a gap more than three times as wide as each cluster. Reports before the option existed used
#: (1.5, 4.0), clusters wider than the gap between them (`--toy-clusters 1.5 4`).
TOY_CLUSTERS = (2.5, 4.0)
GAP_MARGIN = 0.5  # the gap's ratio is averaged over |x| < inner - GAP_MARGIN

# The targets of the comparison, on every diabetes split.
RMSE_TOLERANCE = 0.05  # posterior mean RMSE within 5% of OLS
COVERAGE_BAND = (0.85, 0.95)
GAP_RATIO = 2.0
DIABETES_ROWS = 442  # scikit-learn's diabetes data set


def _auto_or_positive(name: str, keyword: str):
    """An argparse type: `keyword` as itself, else a positive number, with an error naming the
    option, the value and what is allowed."""

    def parse(text: str):
        if text == keyword:
            return text
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{name} must be {keyword!r} or a positive number, got {text!r}")
        return value

    return parse


def make_sampler(name: str, step_size):
    """The library's defaults (automatic step, friction that follows it) for `"auto"`, else the
    given step with friction 1."""
    if step_size == "auto":
        return SAMPLERS[name]()
    return SAMPLERS[name](step_size, friction=1.0)


def parse_prior(text: str):
    """`--prior`: `"fan_in"`, `"fan_in:S"` (a fan-in prior of scale S) or a Gaussian std, with an
    error naming the option, the value and what is allowed."""
    if text == "fan_in":
        return text
    fan_in = text.startswith("fan_in:")
    try:
        value = float(text.partition(":")[2] if fan_in else text)
    except ValueError:
        value = float("nan")
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(
            f"--prior must be 'fan_in', 'fan_in:S' with S a positive number, or a positive number, got {text!r}")
    return f"fan_in:{value!r}" if fan_in else value


def _fan_in_scale(prior) -> str | None:
    """The scale S of a parsed `"fan_in:S"` as written, else None."""
    return prior.partition(":")[2] if isinstance(prior, str) and prior != "fan_in" else None


def make_prior(prior) -> kt.priors.Prior:
    """`"fan_in"`: `kt.priors.FanInGaussian()`; `"fan_in:S"`: `FanInGaussian(scale=S)`; a number s:
    `kt.priors.Gaussian(s)`."""
    if prior == "fan_in":
        return kt.priors.FanInGaussian()
    scale = _fan_in_scale(prior)
    return kt.priors.FanInGaussian(scale=float(scale)) if scale else kt.priors.Gaussian(prior)


def describe_prior(prior) -> str:
    """How `results.json` names the prior."""
    if prior == "fan_in":
        return "kt.priors.FanInGaussian()"
    scale = _fan_in_scale(prior)
    return f"kt.priors.FanInGaussian(scale={scale})" if scale else f"kt.priors.Gaussian({prior})"


def calibrated_band_probability(num_rows: int, level: float = LEVEL, band=COVERAGE_BAND) -> float:
    """The probability that an exactly calibrated central interval of probability `level`
    covers a fraction inside `band` of `num_rows` independent test targets: the coverage count
    is Binomial(num_rows, level)."""
    return sum(math.comb(num_rows, k) * level**k * (1 - level) ** (num_rows - k)
               for k in range(num_rows + 1) if band[0] <= k / num_rows <= band[1])


#: `--noise`: the noise scale learned per input (the net's second output) or one for all inputs.
NOISE_MODELS = ("input", "shared")


def _net(num_features: int, noise: str = "input") -> keras.Model:
    hidden = [keras.Input((num_features,)), keras.layers.Dense(HIDDEN, activation="relu")]
    if noise == "shared":
        return keras.Sequential(hidden + [keras.layers.Dense(1), kt.regression.SharedNoiseScale()])
    return keras.Sequential(hidden + [keras.layers.Dense(2)])


def _vector(net: keras.Model) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in net.trainable_variables]).astype(np.float32)


def fit_map(x: np.ndarray, y: np.ndarray, seed: int, steps: int, prior: kt.priors.Prior, noise: str = "input") -> keras.Model:
    """The MAP net: full-batch Adam on the posterior's negative log density per example."""
    keras.utils.set_random_seed(seed)
    net = _net(x.shape[1], noise)
    loss = kt.losses.GaussianNLL()
    optimizer = keras.optimizers.Adam(MAP_LEARNING_RATE)
    x_t, y_t, n = tf.constant(x), tf.constant(y), float(x.shape[0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            objective = loss(y_t, net(x_t, training=True)) + prior(net.trainable_variables) / n
        variables = net.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(objective, variables), variables))

    for _ in range(steps):
        step()
    return net


def run_sampler(name, x, y, start: keras.Model, args, seed: int) -> tuple[keras.Model, np.ndarray, dict]:
    """`(model, samples [C, S, Nd], info)` for `args.chains` = C chains run together in one fit
    (each from its own initialisation, with its own minibatches of `BATCH_SIZE`); after a
    divergence, the samples taken before it."""
    keras.utils.set_random_seed(seed)
    net = _net(x.shape[1], args.noise)
    if args.start == "map":
        net.set_weights(start.get_weights())
    model = kt.BayesianModel(net, make_sampler(name, args.step_size), num_examples=x.shape[0],
                             prior=make_prior(args.prior), seed=seed, num_chains=args.chains)
    model.compile(loss=kt.losses.GaussianNLL(), steps_per_execution=50)
    collector = kt.callbacks.SampleCollector(burn_in_steps=args.burn_in, every_n_steps=args.every)
    steps_per_epoch = math.ceil(x.shape[0] / BATCH_SIZE)
    epochs = math.ceil(args.steps / steps_per_epoch)
    info = {"steps": epochs * steps_per_epoch, "chains": args.chains}
    start_time = time.perf_counter()
    try:
        history = model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, callbacks=[collector], verbose=0)
        info["diverged"] = False
        for key in ("kinetic_temperature", "configurational_temperature", "xi", "step_size"):
            if key in history.history:
                info[f"final_{key}"] = float(history.history[key][-1])
        # The default temperature check's verdict on the run (1 at T, 0 not, NaN no verdict).
        for key in ("equilibrated", "mean_kinetic_temperature", "mean_configurational_temperature"):
            if key in history.history:
                info[key] = float(history.history[key][-1])
    except kt.SamplerDivergedError as error:
        info["diverged"] = True
        info["error"] = str(error).splitlines()[0]
    info["seconds"] = time.perf_counter() - start_time
    samples = np.asarray(collector.samples) if collector.steps.size else np.zeros((args.chains, 0, 0), np.float32)
    if samples.ndim == 2:  # one chain: rows [S, Nd]
        samples = samples[None]
    info["num_samples"] = int(samples.shape[0] * samples.shape[1])
    return model, samples, info


def score(prediction: kt.regression.RegressionPrediction, y: np.ndarray) -> dict:
    """RMSE, NLL, 90% coverage and width, CRPS of a predictive mixture at targets `y` [n, 1]."""
    lower, upper = prediction.interval(LEVEL)
    return {
        "rmse": float(np.sqrt(np.mean((prediction.mean - y) ** 2))),
        "nll": float(-np.mean(prediction.log_density(y))),
        "coverage_90": float(np.mean((lower <= y) & (y <= upper))),
        "interval_width_90": float(np.mean(upper - lower)),
        "crps": float(np.mean(prediction.crps(y))),
    }


def ols_prediction(x_train, y_train, x_test) -> kt.regression.RegressionPrediction:
    design = np.hstack([x_train, np.ones((x_train.shape[0], 1))])
    test_design = np.hstack([x_test, np.ones((x_test.shape[0], 1))])
    coefficients, *_ = np.linalg.lstsq(design, y_train, rcond=None)
    residual_variance = float(np.sum((y_train - design @ coefficients) ** 2) / (design.shape[0] - design.shape[1]))
    leverage = np.einsum("ij,jk,ik->i", test_design, np.linalg.inv(design.T @ design), test_design)
    std = np.sqrt(residual_variance * (1.0 + leverage))
    return kt.regression.RegressionPrediction.from_components((test_design @ coefficients)[None], std[None, :, None])


def net_prediction(model, samples, x, scaler) -> kt.regression.RegressionPrediction:
    return kt.regression.predict_posterior(model, samples, x, loss=kt.losses.GaussianNLL(), scaler=scaler, verbose=0)


def evaluate_methods(x_train, y_train, x_eval_sets, args, seed: int, samplers) -> dict:
    """Every method's predictions at each of `x_eval_sets` (name -> inputs), on y's scale.

    Returns `{method: {"predictions": {name: RegressionPrediction}, "info": {...}}}`; a sampler
    run with several chains also has `"chain_predictions"`: `{name: [one RegressionPrediction per
    chain]}` (its `"predictions"` pool the chains)."""
    x_mean, x_std = x_train.mean(axis=0), x_train.std(axis=0)
    standardize = lambda x: ((x - x_mean) / x_std).astype(np.float32)  # noqa: E731
    scaler = kt.regression.TargetScaler().fit(y_train)
    xs, ys = standardize(x_train), scaler.transform(y_train).astype(np.float32)
    results = {"ols": {"predictions": {k: ols_prediction(xs, y_train, standardize(v)) for k, v in x_eval_sets.items()},
                       "info": {}}}
    start = time.perf_counter()
    maps = [fit_map(xs, ys, seed * 100 + member, args.map_steps, make_prior(args.prior), args.noise)
            for member in range(ENSEMBLE_SIZE)]
    map_seconds = time.perf_counter() - start
    vectors = np.stack([_vector(net) for net in maps])
    results["map"] = {
        "predictions": {k: net_prediction(maps[0], vectors[:1], standardize(v), scaler) for k, v in x_eval_sets.items()},
        "info": {"seconds": map_seconds / ENSEMBLE_SIZE},
    }
    results["ensemble"] = {
        "predictions": {k: net_prediction(maps[0], vectors, standardize(v), scaler) for k, v in x_eval_sets.items()},
        "info": {"seconds": map_seconds},
    }
    for name in samplers:
        model, samples, info = run_sampler(name, xs, ys, maps[0], args, seed)
        predictions, chain_predictions = {}, {}
        if samples.shape[1]:
            predictions = {k: net_prediction(model, samples, standardize(v), scaler) for k, v in x_eval_sets.items()}
            if samples.shape[0] > 1:
                chain_predictions = {k: [net_prediction(model, chain, standardize(v), scaler) for chain in samples]
                                     for k, v in x_eval_sets.items()}
        results[name] = {"predictions": predictions, "chain_predictions": chain_predictions, "info": info}
        print(f"  {name}: {info}", flush=True)
    return results


# --------------------------------------------------------------------------------------------
# Diabetes


#: The diabetes rows held out for testing. Half: on 221 test rows an exactly calibrated 90%
#: interval covers a fraction inside COVERAGE_BAND on all five splits with probability 0.94; on
#: the 88 rows of an 80/20 split, 0.57 (`calibrated_band_probability`), a target that a correct
#: posterior misses on some split about every other run.
DEFAULT_TEST_FRACTION = 0.5
#: The test fraction of reports written before it was recorded (the 80/20 runs).
EARLIER_TEST_FRACTION = 0.2
#: The fewest rows `--test-fraction` may leave on either side of a split (a variance needs two).
MIN_SPLIT_ROWS = 2


def train_rows(num_rows: int, test_fraction: float = DEFAULT_TEST_FRACTION) -> int:
    """The rows of a split holding out `test_fraction` of `num_rows` that train."""
    return int(round((1.0 - test_fraction) * num_rows))


def split_name(test_fraction: float) -> str:
    """`"50/50"` for 0.5, `"80/20"` for 0.2: train / test percentages."""
    test = round(100 * test_fraction)
    return f"{100 - test}/{test}"


def diabetes(args) -> dict:
    from sklearn.datasets import load_diabetes  # noqa: PLC0415

    data = load_diabetes()
    x_all, y_all = data.data.astype(np.float64), data.target.astype(np.float64)[:, None]
    assert x_all.shape[0] == DIABETES_ROWS, x_all.shape
    splits = []
    for split in range(args.splits):
        order = np.random.default_rng(split).permutation(x_all.shape[0])
        kept = train_rows(x_all.shape[0], args.test_fraction)
        train, test = order[:kept], order[kept:]
        print(f"diabetes split {split}", flush=True)
        results = evaluate_methods(x_all[train], y_all[train], {"test": x_all[test]}, args, split, args.samplers)
        splits.append({
            method: {**(score(r["predictions"]["test"], y_all[test]) if r["predictions"] else {}), **r["info"]}
            for method, r in results.items()
        })
    return diabetes_report(splits, args.samplers, args.test_fraction)


#: The methods every run has besides its samplers, and the test figures of each.
BASELINES = ("ols", "map", "ensemble")
SCORES = ("rmse", "nll", "coverage_90", "interval_width_90", "crps")


def diabetes_report(splits: list, samplers: list, test_fraction: float) -> dict:
    """Every split's figures, their mean +- sd per method and, per sampler and baseline, on how
    many splits it meets each target."""
    methods = list(splits[0])
    summary = {}
    for method in methods:
        summary[method] = {}
        for metric in SCORES:
            values = np.array([s[method].get(metric, np.nan) for s in splits])
            summary[method][metric] = {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1))}
    targets = {}
    for method in samplers + ["ensemble", "map"]:
        per_split = []
        for s in splits:
            m = s[method]
            if "rmse" not in m:
                per_split.append({"rmse_within_5pct_of_ols": False, "coverage_in_band": False, "nll_at_most_map": False})
                continue
            per_split.append({
                "rmse_within_5pct_of_ols": bool(m["rmse"] <= (1 + RMSE_TOLERANCE) * s["ols"]["rmse"]),
                "coverage_in_band": bool(COVERAGE_BAND[0] <= m["coverage_90"] <= COVERAGE_BAND[1]),
                "nll_at_most_map": bool(m["nll"] <= s["map"]["nll"]),
            })
        targets[method] = {key: sum(p[key] for p in per_split) for key in per_split[0]}
    return {"test_fraction": test_fraction, "splits": splits, "summary": summary, "targets_met_on_splits": targets}


def _protocol_less_samplers(report: dict) -> dict:
    return {k: v for k, v in report.get("protocol", {}).items() if k != "samplers"}


def _scores(figures: dict) -> dict:
    """A method's test figures on one split, without its timings."""
    return {k: figures.get(k) for k in SCORES}


def merge_diabetes_reports(reports: list[dict]) -> dict:
    """One diabetes report from several runs of the same protocol and splits with different
    samplers (run side by side, one sampler each): their baselines must agree figure for figure
    (they do for the same protocol and seeds), and every sampler's per-split figures are kept."""
    if any("diabetes" not in r or "toy" in r for r in reports):
        raise ValueError("only diabetes runs (--skip-toy) can be merged")
    first = reports[0]["diabetes"]
    samplers = []
    for report in reports:
        diabetes = report["diabetes"]
        if diabetes.get("test_fraction") != first.get("test_fraction") or len(diabetes["splits"]) != len(first["splits"]):
            raise ValueError("the runs differ in their splits (--test-fraction or --splits)")
        if _protocol_less_samplers(report) != _protocol_less_samplers(reports[0]):
            raise ValueError("the runs' protocols differ (beyond their samplers): they are not runs of one protocol")
        for split, first_split in zip(diabetes["splits"], first["splits"]):
            if any(_scores(split[b]) != _scores(first_split[b]) for b in BASELINES):
                raise ValueError("the runs' baselines differ: they are not runs of one protocol")
        found = [m for m in diabetes["splits"][0] if m not in BASELINES]
        if set(found) & set(samplers):
            raise ValueError(f"{sorted(set(found) & set(samplers))} appear in more than one run")
        samplers += found
    splits = [
        {**{b: split[b] for b in BASELINES},
         **{m: v for report in reports for m, v in report["diabetes"]["splits"][index].items() if m not in BASELINES}}
        for index, split in enumerate(first["splits"])
    ]
    return {"diabetes": diabetes_report(splits, samplers, first.get("test_fraction", EARLIER_TEST_FRACTION))}


# --------------------------------------------------------------------------------------------
# The 1-D toy with a gap


def toy_data(rng, n, clusters=TOY_CLUSTERS):
    """`n` inputs, half uniform on `[-outer, -inner]` and half on `[inner, outer]` for
    `clusters = (inner, outer)`, with targets `x sin x + N(0, 0.3^2)`."""
    inner, outer = clusters
    half = n // 2
    x = np.concatenate([rng.uniform(-outer, -inner, half), rng.uniform(inner, outer, n - half)])[:, None]
    y = x * np.sin(x) + 0.3 * rng.normal(size=x.shape)
    return x, y


def toy_gap(clusters=TOY_CLUSTERS) -> float:
    """The half-width of the gap the ratio is measured over: it stops half a unit short of the
    clusters."""
    return clusters[0] - GAP_MARGIN


def toy(args) -> tuple[dict, dict]:
    rng = np.random.default_rng(100)
    clusters = tuple(args.toy_clusters)
    x_train, y_train = toy_data(rng, 160, clusters)
    x_test, y_test = toy_data(rng, 200, clusters)
    grid = np.linspace(-6.0, 6.0, 241)[:, None]
    print("toy", flush=True)
    results = evaluate_methods(x_train, y_train, {"test": x_test, "grid": grid}, args, 0, args.samplers)
    in_gap = np.abs(grid[:, 0]) < toy_gap(clusters)
    on_data = (np.abs(grid[:, 0]) >= clusters[0]) & (np.abs(grid[:, 0]) <= clusters[1])

    def gap_ratio(epistemic):
        data = float(np.mean(epistemic[on_data]))
        return float(np.mean(epistemic[in_gap])) / data if data > 0 else None

    figures, bands = {}, {}
    for method, r in results.items():
        if not r["predictions"]:
            figures[method] = r["info"]
            continue
        g = r["predictions"]["grid"]
        epistemic = g.epistemic_std[:, 0]
        lower, upper = g.interval(LEVEL)
        figures[method] = {
            **score(r["predictions"]["test"], y_test),
            "epistemic_std_gap": float(np.mean(epistemic[in_gap])),
            "epistemic_std_data": float(np.mean(epistemic[on_data])),
            "aleatoric_std_gap": float(np.mean(g.aleatoric_std[in_gap, 0])),
            "aleatoric_std_data": float(np.mean(g.aleatoric_std[on_data, 0])),
            **r["info"],
        }
        figures[method]["gap_ratio"] = gap_ratio(epistemic)
        if r.get("chain_predictions"):
            # Each chain's own ratio: how much one chain's estimate varies (the pooled one above
            # is the posterior's, estimated from every chain's samples).
            figures[method]["chain_gap_ratios"] = [gap_ratio(p.epistemic_std[:, 0]) for p in r["chain_predictions"]["grid"]]
        bands[method] = (g.mean[:, 0], lower[:, 0], upper[:, 0], epistemic)
    return figures, {"grid": grid[:, 0], "x": x_train[:, 0], "y": y_train[:, 0], "bands": bands,
                     "gap": toy_gap(clusters)}


def plot_toy(plot: dict, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    methods = [m for m in plot["bands"] if m != "ols"]
    columns = 3
    rows = math.ceil(len(methods) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), sharex=True, sharey=True)
    grid = plot["grid"]
    for axis, method in zip(np.ravel(axes), methods):
        mean, lower, upper, epistemic = plot["bands"][method]
        axis.fill_between(grid, lower, upper, color="tab:blue", alpha=0.2, label="90% predictive interval")
        axis.fill_between(grid, mean - 2 * epistemic, mean + 2 * epistemic, color="tab:orange", alpha=0.4,
                          label="mean +- 2 epistemic sd")
        axis.plot(grid, mean, color="tab:blue", lw=1.2, label="predictive mean")
        axis.plot(grid, grid * np.sin(grid), color="black", lw=0.8, ls="--", label="x sin x")
        axis.scatter(plot["x"], plot["y"], s=4, color="black")
        axis.axvspan(-plot["gap"], plot["gap"], color="grey", alpha=0.1)
        axis.set_title(method)
        axis.set_ylim(-8, 8)
    for axis in np.ravel(axes)[len(methods):]:
        axis.axis("off")
    np.ravel(axes)[0].legend(fontsize=6, loc="upper center")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


DIVERGED_AT = re.compile(r"at (step \d+)")  # in `SamplerDivergedError`'s message


def markdown_tables(report: dict) -> str:
    """The diabetes summary (mean +- sd over splits, with how many splits meet each target) and
    the toy's figures, as Markdown (each where the report has it)."""
    lines = []
    if "diabetes" in report:
        lines += _diabetes_table(report["diabetes"])
    if "toy" in report:
        lines += _toy_table(report["toy"], blank_first=bool(lines))
    return "\n".join(lines) + "\n"


def _diabetes_table(diabetes: dict) -> list[str]:
    summary, met = diabetes["summary"], diabetes["targets_met_on_splits"]
    splits = len(diabetes["splits"])
    test_fraction = diabetes.get("test_fraction", EARLIER_TEST_FRACTION)
    lines = [
        f"Diabetes, {splits} random {split_name(test_fraction)} splits, original scale (mean +- sd over splits); the last three "
        "columns count the splits meeting each target.",
        "",
        "| method | RMSE | NLL | 90% coverage | 90% width | CRPS | RMSE <= 1.05 OLS | coverage in [0.85, 0.95] | NLL <= MAP |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, figures in summary.items():
        cells = [f"{figures[k]['mean']:.3g} +- {figures[k]['std']:.2g}" if k != "coverage_90"
                 else f"{figures[k]['mean']:.3f} +- {figures[k]['std']:.3f}"
                 for k in ("rmse", "nll", "coverage_90", "interval_width_90", "crps")]
        targets = met.get(method)
        counts = ["-"] * 3 if targets is None else [f"{targets[k]}/{splits}" for k in targets]
        lines.append(f"| {method} | " + " | ".join(cells + counts) + " |")
    diverged = [f"{method} on split {index} ({DIVERGED_AT.search(figures['error']).group(1)})"
                for index, split in enumerate(diabetes["splits"])
                for method, figures in split.items() if figures.get("diverged")]
    if diverged:
        lines += ["", "Diverged (`SamplerDivergedError`; scored above on the samples taken before it): "
                  + "; ".join(diverged) + "."]
    test_rows = DIABETES_ROWS - train_rows(DIABETES_ROWS, test_fraction)
    per_split = calibrated_band_probability(test_rows)
    lines += [
        "",
        f"On {test_rows} test rows an exactly calibrated 90% interval covers a fraction in "
        f"[{COVERAGE_BAND[0]}, {COVERAGE_BAND[1]}] with probability {per_split:.3f} on one split (binomial), "
        f"{per_split ** splits:.3f} on all {splits}.",
    ]
    return lines


def _toy_table(toy: dict, blank_first: bool) -> list[str]:
    chains = any(f.get("chain_gap_ratios") for f in toy.values())
    lines = [""] if blank_first else []
    lines += [
        "Toy with a gap (one data set): test metrics, and the epistemic standard deviation averaged over the "
        "gap and over the clusters" + ("; a sampler's figures pool its chains, and the last column gives each "
               "chain's own ratio." if chains else "."),
        "",
        "| method | RMSE | NLL | 90% coverage | CRPS | epistemic sd, gap | epistemic sd, data | ratio |"
        + (" ratio per chain |" if chains else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if chains else ""),
    ]
    for method, f in toy.items():
        if "rmse" not in f:
            lines.append(f"| {method} | diverged | | | | | | |" + (" |" if chains else ""))
            continue
        ratio = "-" if f.get("gap_ratio") is None else f"{f['gap_ratio']:.2f}"
        row = (f"| {method} | {f['rmse']:.3f} | {f['nll']:.3f} | {f['coverage_90']:.3f} | {f['crps']:.3f} | "
               f"{f['epistemic_std_gap']:.3f} | {f['epistemic_std_data']:.3f} | {ratio} |")
        if chains:
            per_chain = f.get("chain_gap_ratios") or []
            row += " " + (", ".join("-" if r is None else f"{r:.2f}" for r in per_chain) or "-") + " |"
        lines.append(row)
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/regression_uncertainty")
    parser.add_argument("--splits", type=int, default=5,
                        help="how many random diabetes splits to run (0: none, the toy only)")
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    parser.add_argument("--step-size", default="auto", type=_auto_or_positive("--step-size", "auto"),
                        help='"auto" (the samplers\' defaults) or a step size, used with friction 1')
    parser.add_argument("--prior", default="fan_in", type=parse_prior,
                        help='"fan_in" (kt.priors.FanInGaussian()), "fan_in:S" (FanInGaussian(scale=S)) or a Gaussian std')
    parser.add_argument("--noise", choices=NOISE_MODELS, default="input",
                        help='the noise scale: "input" (learned per input, the net\'s second output; default) or '
                             '"shared" (one learned scale for every input)')
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--burn-in", type=int, default=5000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--map-steps", type=int, default=2000)
    parser.add_argument("--start", choices=("init", "map"), default="init",
                        help="start the samplers at Keras' initialisation (seeded) or at the first MAP net")
    parser.add_argument("--skip-toy", action="store_true")
    parser.add_argument("--toy-clusters", type=float, nargs=2, default=list(TOY_CLUSTERS), metavar=("INNER", "OUTER"),
                        help="the toy's inputs lie on [-OUTER, -INNER] and [INNER, OUTER]; the gap's figures average "
                             f"|x| < INNER - {GAP_MARGIN} (default {TOY_CLUSTERS[0]} {TOY_CLUSTERS[1]})")
    parser.add_argument("--test-fraction", type=float, default=DEFAULT_TEST_FRACTION,
                        help="the diabetes rows held out for testing, in (0, 1) (default 0.5)")
    parser.add_argument("--chains", type=int, default=1,
                        help="chains per sampler, run together in one fit and pooled (default 1)")
    parser.add_argument("--table-from", metavar="RESULTS_JSON", nargs="+",
                        help="only print the Markdown tables of an earlier run's results.json; several "
                             "diabetes runs of one protocol (one sampler each, say) give one table")
    args = parser.parse_args(argv)
    if args.chains < 1:
        parser.error(f"--chains must be a positive integer, got {args.chains}")
    if args.splits < 0:
        parser.error(f"--splits must be 0 (the toy only) or more, got {args.splits}")
    test_rows = DIABETES_ROWS - train_rows(DIABETES_ROWS, args.test_fraction) if 0.0 < args.test_fraction < 1.0 else 0
    if not MIN_SPLIT_ROWS <= test_rows <= DIABETES_ROWS - MIN_SPLIT_ROWS:
        parser.error(f"--test-fraction must lie strictly between 0 and 1 and leave at least {MIN_SPLIT_ROWS} of the "
                     f"{DIABETES_ROWS} diabetes rows on each side, got {args.test_fraction}")
    inner, outer = args.toy_clusters
    if not GAP_MARGIN < inner < outer <= 6.0:
        parser.error(f"--toy-clusters must give {GAP_MARGIN} < INNER < OUTER <= 6 (the plotted grid), got {inner} {outer}")
    if args.splits == 0 and args.skip_toy:
        parser.error("--splits 0 with --skip-toy leaves nothing to run")
    if args.table_from:
        reports = [json.loads(Path(path).read_text()) for path in args.table_from]
        try:
            report = reports[0] if len(reports) == 1 else merge_diabetes_reports(reports)
        except ValueError as error:
            parser.error(f"--table-from {' '.join(args.table_from)}: {error}")
        print(markdown_tables(report), end="")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(2)
    start = time.perf_counter()
    report = {
        "command": "PYTHONPATH=. python -m benchmarks.regression_uncertainty " + " ".join(sys.argv[1:] if argv is None else argv),
        "protocol": {
            "net": (f"d -> {HIDDEN} relu -> 2 (mean, raw scale), kt.losses.GaussianNLL()" if args.noise == "input" else
                    f"d -> {HIDDEN} relu -> 1 (mean) and one learned raw scale for every input, kt.losses.GaussianNLL()"),
            "prior": describe_prior(args.prior),
            "inputs": "standardized with the training split's mean and std",
            "targets": "kt.regression.TargetScaler on the training split; metrics on the original scale",
            "map": f"full-batch Adam, learning rate {MAP_LEARNING_RATE}, {args.map_steps} steps on U / N",
            "ensemble": f"{ENSEMBLE_SIZE} MAP nets from different initialisations, equal-weight mixture",
            "samplers": {name: ("library defaults (automatic step size, friction that follows it)"
                                if args.step_size == "auto" else
                                f"{name}(step_size={args.step_size}, friction=1.0), library defaults otherwise")
                         for name in args.samplers},
            "sampling": f"{args.chains} chain{'s' if args.chains > 1 else ''} per sampler in one fit (pooled), "
                        f"batch {BATCH_SIZE} with replacement, start at "
                        f"{'the first MAP net' if args.start == 'map' else 'Keras initialisation (seeded)'}, {args.steps} steps "
                        f"(whole epochs), burn-in {args.burn_in}, a sample every {args.every} steps",
            "ols": "least squares with intercept, Gaussian predictive N(x b, s^2 (1 + x (X^T X)^-1 x^T))",
            "diabetes": f"sklearn load_diabetes, {args.splits} random {split_name(args.test_fraction)} splits "
                        "(numpy default_rng(split))",
            "toy": f"y = x sin x + N(0, 0.3^2), 80 + 80 inputs uniform on [-{outer:g}, -{inner:g}] and "
                   f"[{inner:g}, {outer:g}], 200 test points the same way; epistemic std averaged over a grid in "
                   f"|x| < {toy_gap((inner, outer)):g} (gap) and in the clusters (data)",
            "goals": {"rmse_within_of_ols": RMSE_TOLERANCE, "coverage_90_band": COVERAGE_BAND,
                        "nll": "at most the MAP fit's", "toy_gap_ratio": GAP_RATIO},
        },
        "environment": {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
                        "machine": platform.machine(), "cpu_threads": 2},
    }
    if args.splits:
        report["diabetes"] = diabetes(args)
    if not args.skip_toy:
        figures, plot = toy(args)
        report["toy"] = figures
        plot_toy(plot, out / "toy_bands.png")
    report["seconds"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "tables.md").write_text(markdown_tables(report))
    if "diabetes" in report:
        print(json.dumps(report["diabetes"]["summary"], indent=1))
        print(json.dumps(report["diabetes"]["targets_met_on_splits"], indent=1))
    if "toy" in report:
        print(json.dumps({m: {k: v for k, v in f.items() if "gap" in k or "data" in k} for m, f in report["toy"].items()},
                         indent=1))
    print(f"{report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
