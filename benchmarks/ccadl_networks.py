"""CCAdL and mCCAdL against SGNHT on two small networks from Keras' default initialisation.

- `conv`: Conv2D(16, 3x3) + Dense(10) on scikit-learn's 8x8 digits (1797 images, batch 64,
  Gaussian prior std 1), T = 1;
- `mlp`: the digits MLP 64-50-10 (ReLU) on the same images, split and settings;
- `diabetes`: a 10-50-2 ReLU MLP (the docs' regression example) on scikit-learn's diabetes (first 353 rows train, last 89 test,
  features and targets standardised on the training rows), `kt.losses.GaussianNLL()` with a
  learned noise scale, batch 64, prior std 1, T = 1.

Per run: the mean of each logged diagnostic (kinetic and configurational temperature, xi,
noise_scale, step_size_limit for CCAdL) over each block of `--block` steps, the verdict of the
library's `EquilibrationCheck` (every variable judged, blocks of `--block` steps), and the test metric
at the end (NLL of the posterior predictive mean on the digits' last 297 images, which are held
out; RMSE of the posterior mean on the diabetes test rows, in standardised units, against the
mean's 1.0), from samples every 10 steps after the warm-up.

    python -m benchmarks.ccadl_networks --problem conv --samplers sgnht ccadl mccadl --steps 2000 \
        --step-size 1e-3 --out benchmarks/results/ccadl_networks_conv.json
    python -m benchmarks.ccadl_networks --problem diabetes --samplers sgnht ccadl mccadl --steps 6000 \
        --step-size 3e-4 --out benchmarks/results/ccadl_networks_diabetes.json

`--seeds 0 1 2` repeats every sampler from each seed's initialisation and noise; the printed
summary (`summary`, also `--summarize FILE`) gives each sampler's test metric per seed, its ratio
to SGNHT's on the same seed, and the mean over seeds.

A run that the model stops (`SamplerDivergedError`) is recorded with its message.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import keras
import numpy as np

import keras_thermo as kt

CLASSIFIERS = ("conv", "mlp")
PROBLEMS = (*CLASSIFIERS, "diabetes")
LOGGED = ("kinetic_temperature", "configurational_temperature", "xi", "noise_scale", "step_size_limit", "potential")


def problem(name: str, seed: int = 0):
    """`(net, loss, x_train, y_train, x_test, y_test, batch_size)`."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    if name in CLASSIFIERS:
        from sklearn.datasets import load_digits  # noqa: PLC0415

        data = load_digits()
        x = data.images.astype(np.float32)[..., None] / 16.0
        y = data.target.astype(np.int32)
        if name == "conv":
            net = keras.Sequential([
                keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.Flatten(), keras.layers.Dense(10),
            ])
        else:
            x = x.reshape(len(x), 64)
            net = keras.Sequential([
                keras.Input((64,)), keras.layers.Dense(50, activation="relu"), keras.layers.Dense(10),
            ])
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return net, loss, x[:1500], y[:1500], x[1500:], y[1500:], 64
    if name == "diabetes":
        from sklearn.datasets import load_diabetes  # noqa: PLC0415

        features, targets = load_diabetes(return_X_y=True)
        features = features.astype(np.float32)
        targets = targets.astype(np.float32)
        train = slice(0, 353)
        test = slice(353, None)
        mean, std = features[train].mean(0), features[train].std(0)
        features = (features - mean) / std
        targets = (targets - targets[train].mean()) / targets[train].std()
        net = keras.Sequential([
            keras.Input((10,)), keras.layers.Dense(50, activation="relu"), keras.layers.Dense(2),
        ])
        return net, kt.losses.GaussianNLL(), features[train], targets[train], features[test], targets[test], 64
    raise ValueError(f"`problem` must be one of {PROBLEMS}, got {name!r}.")


SAMPLERS = {
    "sgnht": lambda h, w, **kw: kt.samplers.SGNHT(step_size=h, friction=1.0, warmup_steps=w, **kw),
    "ccadl": lambda h, w, **kw: kt.samplers.CCAdL(step_size=h, friction=1.0, warmup_steps=w, **kw),
    # `mccadl` is the paper's minibatch C step, as in the committed results; `mccadl-diag` the
    # library's default covariance (CCAdL's moving average, integrated exactly).
    "mccadl": lambda h, w, **kw: kt.samplers.MCCAdL(step_size=h, friction=1.0, warmup_steps=w, covariance="minibatch", **kw),
    "mccadl-diag": lambda h, w, **kw: kt.samplers.MCCAdL(step_size=h, friction=1.0, warmup_steps=w, covariance="diag", **kw),
}


class BlockLog(keras.callbacks.Callback):
    """Means of the logged diagnostics over blocks of `block` steps (one log per execution)."""

    def __init__(self, block: int):
        super().__init__()
        self.block, self.rows, self._sums, self._count, self._last = block, [], {}, 0, 0

    def on_train_batch_end(self, batch, logs=None):
        for name in LOGGED:
            if logs and name in logs:
                self._sums[name] = self._sums.get(name, 0.0) + float(logs[name])
        self._count += 1
        step = int(self.model.sampler_step)
        if step // self.block > self._last // self.block:
            self._last = step
            self.rows.append({"step": step, **{k: v / self._count for k, v in self._sums.items()}})
            self._sums, self._count = {}, 0


def run(name: str, sampler: str, step_size: float, steps: int, warmup: int, seed: int = 0, block: int = 100,
        per_example_method: str | None = None, per_variable_thermostat: bool | None = None) -> dict:
    net, loss, x, y, x_test, y_test, batch_size = problem(name, seed)
    model_kwargs = {} if per_example_method is None else {"per_example_method": per_example_method}
    # None: the samplers' default (one xi per tensor); False: the papers' single xi.
    sampler_kwargs = {} if per_variable_thermostat is None else {"per_variable_thermostat": per_variable_thermostat}
    model = kt.BayesianModel(
        net, sampler=SAMPLERS[sampler](step_size, warmup, **sampler_kwargs), num_examples=len(x),
        prior=kt.priors.Gaussian(1.0), temperature=1.0, seed=seed, temperature_check=False, **model_kwargs,
    )
    model.compile(loss=loss, steps_per_execution=10)
    log = BlockLog(block)
    collector = kt.callbacks.SampleCollector(burn_in_steps=warmup, every_n_steps=10)
    # The library's verdict on the run (every variable judged, blocks of `block` steps).
    check = kt.callbacks.EquilibrationCheck(block_steps=block, warn=False)
    steps_per_epoch = int(np.ceil(len(x) / batch_size))
    epochs = int(np.ceil(steps / steps_per_epoch))
    start = time.perf_counter()
    error = None
    try:
        model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=[log, collector, check], verbose=0)
    except Exception as exc:  # noqa: BLE001 (a diverged run is a result)
        error = f"{type(exc).__name__}: {exc}"
    result = {
        "problem": name, "sampler": sampler, "sampler_config": model.sampler.get_config(), "steps": int(model.sampler_step),
        "blocks": log.rows, "error": error, "seconds": time.perf_counter() - start,
    }
    report = check.report()
    result["temperature_check"] = {"equilibrated": report["equilibrated"],
                                   "equilibration_step": report["equilibration_step"],
                                   "summary": kt.equilibration.summary(report)}
    samples = None if model.sampler_step <= warmup else collector.samples
    count = 0 if samples is None else len(samples)
    result["num_samples"] = count
    if count and error is None:
        result.update(test_metric(name, net, loss, samples, x_test, y_test))
    return result


def test_metric(name, net, loss, samples, x_test, y_test) -> dict:
    outputs = []
    shapes = [v.shape for v in net.trainable_variables]
    for row in samples:
        pieces = np.split(row, np.cumsum([int(np.prod(s)) for s in shapes])[:-1])
        for variable, piece, shape in zip(net.trainable_variables, pieces, shapes):
            variable.assign(piece.reshape(shape))
        outputs.append(np.asarray(net(x_test)))
    outputs = np.stack(outputs)
    if name in CLASSIFIERS:
        logits = outputs - outputs.max(-1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        mean = probs.mean(0)
        return {"test_nll": float(-np.mean(np.log(mean[np.arange(len(y_test)), y_test] + 1e-12))),
                "test_accuracy": float(np.mean(mean.argmax(-1) == y_test))}
    loc, scale = (np.asarray(t) for t in loss.parameters(outputs))
    mean = loc[..., 0].mean(0)
    return {"test_rmse": float(np.sqrt(np.mean((mean - y_test) ** 2))),
            "mean_noise_std": float(scale[..., 0].mean())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=PROBLEMS)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--step-size", type=float)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--per-example-method", default=None)
    thermostat = parser.add_mutually_exclusive_group()
    thermostat.add_argument("--per-variable-thermostat", dest="per_variable_thermostat", action="store_const", const=True,
                            help="one thermostat per trainable tensor for every sampler (the default)")
    thermostat.add_argument("--single-thermostat", dest="per_variable_thermostat", action="store_const", const=False,
                            help="the papers' single thermostat for the whole net (per_variable_thermostat=False)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--summarize", default=None, help="print the summary of a result file and exit")
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as handle:
            for line in summary(json.load(handle)["runs"]):
                print(line)
        return []
    if args.problem is None or args.step_size is None:
        parser.error("--problem and --step-size are required (unless --summarize)")
    runs = []
    for seed, sampler in ((seed, sampler) for seed in args.seeds for sampler in args.samplers):
        result = run(args.problem, sampler, args.step_size, args.steps, args.warmup, seed, args.block,
                     args.per_example_method, args.per_variable_thermostat)
        result["seed"] = seed
        runs.append(result)
        last = result["blocks"][-3:]
        print(sampler, {k: v for k, v in result.items() if k not in ("blocks", "sampler_config")}, flush=True)
        for row in result["blocks"]:
            print("   ", " ".join(f"{k}={v:.4g}" for k, v in row.items()), flush=True)
        if args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as handle:
                json.dump({"command": "python -m benchmarks.ccadl_networks " + " ".join(sys.argv[1:] if argv is None else argv),
                           "platform": platform.platform(), "runs": runs}, handle, indent=1)
    for line in summary(runs):
        print(line)
    return runs


def final_temperatures(run: dict, blocks: int = 3) -> str:
    """`, T_kin a / T_conf b`: the two temperatures averaged over the run's last `blocks` blocks."""
    rows = run["blocks"][-blocks:]
    if not rows or "configurational_temperature" not in rows[0]:
        return ""
    kinetic = np.mean([row["kinetic_temperature"] for row in rows])
    configurational = np.mean([row["configurational_temperature"] for row in rows])
    return f", T_kin {kinetic:.2f} / T_conf {configurational:.2f}"


def verdict(run: dict) -> str:
    """`, at T` / `, not at T` / `, undetermined`: the library check's verdict on the run (runs
    recorded before the check was added have none: "")."""
    check = run.get("temperature_check")
    if not check:
        return ""
    return {True: ", at T", False: ", not at T"}.get(check["equilibrated"], ", undetermined")


def summary(runs: list[dict]) -> list[str]:
    """One line per sampler: its test metric per seed (with the temperatures of its last three
    blocks) and, where SGNHT ran on the same seed, the ratio to SGNHT's (NLL for the classifiers,
    RMSE for the regression; lower is better), then the mean over seeds."""
    key = "test_nll" if any("test_nll" in r for r in runs) else "test_rmse"
    reference = {r.get("seed", 0): r.get(key) for r in runs if r["sampler"] == "sgnht"}
    lines = []
    for sampler in dict.fromkeys(r["sampler"] for r in runs):
        cells = []
        for r in (r for r in runs if r["sampler"] == sampler):
            value, base = r.get(key), reference.get(r.get("seed", 0))
            if value is None:
                cells.append(f"seed {r.get('seed', 0)}: {r.get('error') or 'no samples'}")
            else:
                ratio = f" ({value / base:.2f}x SGNHT)" if base and sampler != "sgnht" else ""
                cells.append(f"seed {r.get('seed', 0)}: {value:.4f}{ratio}{final_temperatures(r)}{verdict(r)}")
        values = [r.get(key) for r in runs if r["sampler"] == sampler]
        if values and None not in values:
            mean = float(np.mean(values))
            bases = [reference.get(r.get("seed", 0)) for r in runs if r["sampler"] == sampler]
            ratio = (f" ({mean / float(np.mean(bases)):.2f}x SGNHT's mean)"
                     if sampler != "sgnht" and bases and None not in bases else "")
            cells.append(f"mean {mean:.4f}{ratio}")
        lines.append(f"{sampler} {key}: " + "; ".join(cells))
    return lines


if __name__ == "__main__":
    main()
