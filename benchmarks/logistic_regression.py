"""Bayesian logistic regression with SGHMC, SGNHT, CCAdL and mCCAdL (Wei & Shang 2026, sec. 3.2).

The paper's protocol: likelihood `prod_i sigmoid(s_i theta . x_i)` with labels `s_i = +-1`, prior
`N(0, I)`, subsets of `n` examples drawn with replacement every step; reported are the test log
likelihood of the posterior mean against passes through the data (their Figures 2-3) and the
posterior expected log loss, the mean over posterior samples of each sample's test log loss (their
Table 1; NaN where the sampler blew up). Samples before `burn_in_fraction` of the passes are
discarded.

Datasets (`dataset` in the config):

* `digits`: scikit-learn's 8x8 digits, 7 vs 9 (`keras_thermo.data.digits_arrays`, pixels / 16,
  plus a constant feature for the bias: Nd = 65), offline. It has ~270 training images instead of
  the paper's 12,214, so the subset size keeps the paper's ratio N / n = 12214 / 500 ~ 24
  (`batch_size: 12`). The gradient-noise covariance `Sigma ~ (N^2 / n) V` then shrinks with N
  like the Hessian, so step sizes with the same stability margin are about
  `sqrt(12214 / 270) ~ 6.7` times the paper's (the configured sweep follows this).
* `mnist`: MNIST 7 vs 9 (12,214 / 2,037 images), pixels / 255, projected to 100 dimensions by a
  fixed Gaussian random matrix and standardised with the training statistics (the paper's random
  projection; its scale is not given). Read from the IDX files in `data_dir` (`make real-data`
  puts real MNIST in `data/real/mnist`), else from TFDS (`keras_thermo.data.load_classification`);
  without either the script says how to get them and skips.

The samplers are driven exactly as in `benchmarks.regression_w2` (their own `update` in a
`tf.function` loop; per-example gradients `-s_i x_i sigmoid(-s_i theta . x_i)` in closed form).

    python -m benchmarks.logistic_regression --config configs/logistic_digits.yaml --out runs/logistic_digits [--quick]
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import tensorflow as tf

from keras_thermo import data as kt_data
from keras_thermo import metrics as kt_metrics
from benchmarks.regression_w2 import (
    make_chunk_runner, make_sampler, machine, parse_arguments, plot, run_passes, sweep, write_results,
)


def load_dataset(config: dict):
    """`(x_train, s_train, x_test, s_test)`: float32 features, labels in {-1, +1} (+1 = digit 9)."""
    name = config["dataset"]
    if name == "digits":
        x_train, y_train = kt_data.digits_arrays("train", classes=(7, 9))
        x_test, y_test = kt_data.digits_arrays("test", classes=(7, 9))
        add_bias = lambda x: np.concatenate([x, np.ones((len(x), 1), np.float32)], axis=1)  # noqa: E731
        x_train, x_test = add_bias(x_train), add_bias(x_test)
    elif name == "mnist":
        x_train, y_train = _mnist_7_vs_9("train", config)
        x_test, y_test = _mnist_7_vs_9("test", config)
        rng = np.random.default_rng(config.get("projection_seed", 0))
        projection = rng.normal(size=(x_train.shape[1], config.get("projection_dim", 100)))
        x_train, x_test = x_train @ projection, x_test @ projection
        center, scale = x_train.mean(axis=0), x_train.std(axis=0) + 1e-8
        x_train, x_test = (x_train - center) / scale, (x_test - center) / scale
    else:
        raise ValueError(f"`dataset` must be 'digits' or 'mnist', got {name!r}.")
    to_sign = lambda y: (2 * np.asarray(y) - 1).astype(np.float32)  # noqa: E731
    return (x_train.astype(np.float32), to_sign(y_train), x_test.astype(np.float32), to_sign(y_test))


def _mnist_7_vs_9(split: str, config: dict):
    data = kt_data.load_classification(
        "mnist", split, batch_size=4096, data_dir=config.get("data_dir"), shuffle=False, flatten=True,
    )
    xs, ys = [], []
    for x, y in data.dataset:
        keep = (y.numpy() == 7) | (y.numpy() == 9)
        xs.append(x.numpy()[keep])
        ys.append((y.numpy()[keep] == 9).astype(np.int64))
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys)


def logistic_problem(x_train, s_train):
    x_tf, s_tf = tf.constant(x_train), tf.constant(s_train)

    def per_example_gradients(theta, indices):
        xb, sb = tf.gather(x_tf, indices), tf.gather(s_tf, indices)
        margin = sb * tf.linalg.matvec(xb, theta)
        return -(sb * tf.sigmoid(-margin))[:, None] * xb  # grad of log(1 + exp(-s theta.x))

    return per_example_gradients


def _mean_log_loss(theta_rows: np.ndarray, x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Test log loss `mean_i log(1 + exp(-s_i theta . x_i))` of each row of `theta_rows`."""
    margins = (np.asarray(theta_rows, np.float64) @ x.T.astype(np.float64)) * s
    return np.mean(np.logaddexp(0.0, -margins), axis=1)


def run_one(method, step_size, friction, data, settings, options) -> dict:
    x_train, s_train, x_test, s_test = data
    num_examples, batch_size = len(x_train), settings["batch_size"]
    steps_per_pass = max(num_examples // batch_size, 1)
    sampler = make_sampler(method, step_size, friction, options)
    run = make_chunk_runner(
        sampler, logistic_problem(x_train, s_train), num_examples=num_examples, batch_size=batch_size,
        prior_precision=1.0, seed=settings["seed"],
    )
    theta = tf.zeros([x_train.shape[1]], tf.float32)
    state = sampler.init([theta], temperature=1.0, seed=settings["seed"])
    burn_in = int(settings["burn_in_fraction"] * settings["passes"])
    total, count, per_sample_losses = np.zeros(x_train.shape[1]), 0, []
    passes, test_log_likelihood = [], []

    def on_pass(pass_index, samples, _):
        nonlocal total, count
        if pass_index > burn_in:
            total += samples.sum(axis=0)
            count += len(samples)
            per_sample_losses.extend(_mean_log_loss(samples[:: settings["thin"]], x_test, s_test).tolist())
            passes.append(pass_index)
            test_log_likelihood.append(-float(_mean_log_loss((total / count)[None], x_test, s_test)[0]))

    start = time.perf_counter()
    blew_up_at = run_passes(run, state, theta, passes=settings["passes"], steps_per_pass=steps_per_pass, on_pass=on_pass)
    expected_loss = (
        kt_metrics.expected_log_loss(per_sample_losses) if blew_up_at is None and per_sample_losses
        else float("nan")
    )
    return {
        "method": method,
        "step_size": step_size,
        "friction": friction,
        "passes": passes,
        "test_log_likelihood_of_mean": test_log_likelihood,
        "expected_log_loss": expected_loss,
        "num_samples": len(per_sample_losses),
        "blew_up_at_pass": blew_up_at,
        "seconds": time.perf_counter() - start,
    }


def main(argv=None) -> dict | None:
    args, config = parse_arguments(
        argv, __doc__.splitlines()[0], config="configs/logistic_digits.yaml", out="runs/logistic_digits"
    )
    try:
        data = load_dataset(config)
    except kt_data.DatasetNotPreparedError as error:
        print(f"Skipping {config['dataset']}: {error}")
        return None
    settings = {k: config[k] for k in ("batch_size", "passes", "burn_in_fraction", "seed", "thin")}
    frictions, step_sizes = config["frictions"], config["step_sizes"]
    options = config.get("sampler_options", {})
    runs = sweep(
        config, lambda method, step_size, friction: run_one(method, step_size, friction, data, settings, options),
        lambda result: f"expected log loss {result['expected_log_loss']:.4f}, test log lik. of mean "
        f"{result['test_log_likelihood_of_mean'][-1]:.4f}",
    )
    table = {
        f"h={h:g}": {
            f"A={f:g}": {r["method"]: r["expected_log_loss"] for r in runs if r["friction"] == f and r["step_size"] == h}
            for f in frictions
        }
        for h in step_sizes
    }
    results = {
        "config": config,
        "quick": args.quick,
        "num_train": int(len(data[0])),
        "num_test": int(len(data[2])),
        "num_params": int(data[0].shape[1]),
        "machine": machine(),
        "expected_log_loss_table": table,
        "runs": runs,
    }
    write_results(args.out, results)
    plot(runs, frictions, step_sizes, os.path.join(args.out, "test_log_likelihood.png"),
         key="test_log_likelihood_of_mean", ylabel="test log lik. of posterior mean", log_y=False,
         title=f"{config['dataset']} 7 vs 9")
    print(json.dumps(table, indent=1))
    return results


if __name__ == "__main__":
    main()
