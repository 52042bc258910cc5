"""Time of mCCAdL's C step by the Gram method (and `expm="auto"`), on two shapes.

* `emnist_mlp`: the EMNIST MLP of `benchmarks.step_cost` (n = 128, Nd = 83,247), its Dense-layer
  factors (`dense_gradients.dense_layer_gradients`) on a random batch, at the `tau` of its
  step size; also the products and Gram matrix alone, which every method needs, and the
  Lanczos part alone (`krylov.filter_action` on the float64 Gram matrix at the planned steps);
* `regression`: a dense centered `[500, 100]` matrix (the mCCAdL paper's regression: batches of
  n = 500 examples, Nd = 100 parameters; singular values 0.97^i), at `tau rho = 1` and `10`.

Each case is one warm `tf.function` of `expm_action` (no XLA), timed `--calls` times interleaved
with the others and with an empty function, whose median is subtracted. The script only uses
`keras_thermo.linalg.expm_action` and `krylov.filter_action`/`krylov_steps`, so the same file
measures any version of the library that has them.

    python -m benchmarks.gram_c_step --out benchmarks/results/gram_c_step.json [--calls 40]
"""

from __future__ import annotations

import argparse
import gc
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import step_cost
from keras_thermo import dense_gradients
from keras_thermo import linalg as kt_linalg
from keras_thermo.linalg import krylov


def _centered(seed: int, n: int, d: int, decay: float) -> np.ndarray:
    """A `[n, d]` float32 matrix with rows summing to 0 and singular values `decay^i`."""
    rng = np.random.default_rng(seed)
    rank = min(n - 1, d)
    left = np.linalg.qr(np.hstack([np.ones((n, 1)), rng.standard_normal((n, rank))]))[0][:, 1:]
    right = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    return ((left * decay ** np.arange(rank)) @ right.T).astype(np.float32)


def cases() -> dict:
    """name -> (function of nothing returning a tensor, description)."""
    network = step_cost.NETWORKS["emnist_mlp"]
    keras.utils.set_random_seed(0)
    net = network.build()
    x, y = next(iter(step_cost.make_dataset(network)))
    rows = dense_gradients.dense_layer_gradients(net, step_cost._loss(), x, y).covariance_factor()
    v = tf.random.stateless_normal([rows.num_cols, 1], seed=[0, 1])
    tau = tf.constant(network.c_step_tau(), tf.float32)
    # The Lanczos part alone: `f(K) (Gc v)` on the float64 Gram matrix, at the planned steps.
    gram64, block64 = tf.cast(rows.gram(), tf.float64), tf.cast(rows.matvec(v), tf.float64)
    tau64 = tf.cast(tau, tf.float64)
    steps = krylov.krylov_steps(
        tau64 * krylov.spectral_bound(gram64), gram64.shape[0], krylov.reach_table(tf.float32)
    )
    regression = tf.constant(_centered(0, 500, 100, 0.97))
    rho = float(np.linalg.eigvalsh(regression.numpy().astype(np.float64).T @ regression.numpy())[-1])
    v_regression = tf.random.stateless_normal([100, 1], seed=[0, 2])
    found = {
        "empty": lambda: v,
        "emnist_mlp_gram": lambda: kt_linalg.expm_action(rows, v, tau, method="gram")[0],
        "emnist_mlp_auto": lambda: kt_linalg.expm_action(rows, v, tau, method="auto")[0],
        "emnist_mlp_products_and_gram_matrix": lambda: rows.rmatvec(rows.matvec(v)) + tf.reduce_sum(rows.gram()),
        "emnist_mlp_lanczos_filter": lambda: krylov.filter_action(gram64, block64, tau64, steps)[0],
    }
    for tau_rho in (1.0, 10.0):
        regression_tau = tf.constant(tau_rho / rho, tf.float32)
        for method in ("gram", "auto"):
            found[f"regression_tau_rho_{tau_rho:g}_{method}"] = (
                lambda t=regression_tau, m=method: kt_linalg.expm_action(regression, v_regression, t, method=m)[0]
            )
    return found


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/gram_c_step.json")
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args(argv)
    functions = {name: tf.function(fn, autograph=False) for name, fn in cases().items()}
    for fn in functions.values():
        fn().numpy()
    seconds = {name: [] for name in functions}
    gc.collect()
    gc.disable()
    try:
        for call in range(args.calls):
            names = list(functions)
            shift = call % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                functions[name]().numpy()
                seconds[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    empty = float(np.median(seconds.pop("empty")))
    results = {
        "machine": step_cost.machine_info(),
        "calls": args.calls,
        "call_overhead_ms": 1e3 * empty,
        "median_ms": {name: 1e3 * (float(np.median(values)) - empty) for name, values in seconds.items()},
    }
    step_cost.write_json(args.out, results)
    for name, ms in results["median_ms"].items():
        print(f"{name}: {ms:.3f} ms")
    return results


if __name__ == "__main__":
    main()
