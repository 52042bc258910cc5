"""Cost of a Gram matrix `X X^T` (and `X^T X`) of wide per-example rows, by `tf.matmul` and `tf.einsum`.

The Gram method of mCCAdL's C step needs `K = Gc Gc^T` (`[n, n]`); on the engine path the
layers kept as explicit rows add `R_l R_l^T` (`R_l`: `[n, D_l]`, n in the tens to hundreds,
`D_l` up to ~10^5); the vectorized path forms it from all `[n, Nd]` rows at once. Both kernels
compute the same sums; they differ in how the long contraction (over `D`) is split across
threads. This times, for the shapes of the paper networks (batch sizes of `benchmarks.step_cost`),
as `--loop` products inside one `tf.while_loop` per call (every iteration on a perturbed input,
so nothing is hoisted), less the same loop without the product, interleaved over `--calls`
rounds (median ms per product):

* `matmul`: `tf.matmul(X, X, transpose_b=True)` (what `ExplicitBlock.gram` used before);
* `einsum`: `tf.einsum("nd,md->nm", X, X)` (`keras_thermo.linalg.operators.row_gram`, now);
* for the regression shape (`n > D`, where the Gram method works with `X^T X`):
  `tf.matmul(X, X, transpose_a=True)` and `tf.einsum("nd,ne->de", X, X)`.

The two results are checked to agree to float32 rounding (`max_relative_difference`, relative to
the largest entry).

    python -m benchmarks.row_gram --out benchmarks/results/row_gram.json [--calls 7]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import tensorflow as tf

from benchmarks import step_cost
from benchmarks.conv_patches import timed_calls
from keras_thermo.linalg import operators

#: (name, rows n, columns D, "rows" for X X^T or "columns" for X^T X).
CASES = (
    ("fashion_mnist_lstm: LSTM recurrent kernel (explicit rows)", 64, 65536, "rows"),
    ("fashion_mnist_lstm: LSTM kernel and bias (explicit rows)", 64, 14848, "rows"),
    ("cifar10_cnn: conv2 (explicit rows)", 64, 2320, "rows"),
    ("emnist_mlp: all rows (vectorized path)", 128, 83247, "rows"),
    ("fashion_mnist_lstm: all rows (vectorized path)", 64, 89290, "rows"),
    ("regression: n = 500, D = 100 (X^T X)", 500, 100, "columns"),
)


def kernels(kind: str) -> dict:
    if kind == "rows":
        return {
            "matmul": lambda x: tf.matmul(x, x, transpose_b=True),
            "einsum": operators.row_gram,
        }
    return {
        "matmul": lambda x: tf.matmul(x, x, transpose_a=True),
        "einsum": lambda x: tf.einsum("nd,ne->de", x, x),
    }


def _looped(product, loop: int):
    @tf.function
    def run(x):
        def body(i, total):
            perturbed = x + 1e-9 * tf.cast(i, x.dtype)
            return i + 1, total + product(perturbed)[0, 0]

        return tf.while_loop(lambda i, total: i < loop, body, (tf.constant(0), tf.constant(0.0, x.dtype)))[1]

    return run


def run(calls: int, loop: int) -> dict:
    rng = np.random.default_rng(0)
    results = {}
    for name, n, d, kind in CASES:
        x = tf.constant(rng.standard_normal((n, d)).astype("float32"))
        products = kernels(kind)
        reference = products["matmul"](x).numpy()
        other = products["einsum"](x).numpy()
        difference = float(np.max(np.abs(other - reference)) / np.max(np.abs(reference)))
        functions = {"empty": _looped(lambda t: t[:1, :1], loop)}
        functions.update({key: _looped(product, loop) for key, product in products.items()})
        per_call = timed_calls(functions, (x,), calls)
        ms = {key: (per_call[key] - per_call["empty"]) / loop for key in products}
        results[name] = {
            "shape": [n, d],
            "product": "X X^T" if kind == "rows" else "X^T X",
            "median_ms": ms,
            "matmul_over_einsum": ms["matmul"] / ms["einsum"],
            "max_relative_difference": difference,
        }
        print(f"{name}: matmul {ms['matmul']:.3f} ms, einsum {ms['einsum']:.3f} ms "
              f"({ms['matmul'] / ms['einsum']:.2f}x), difference {difference:.1e}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/row_gram.json", help="output JSON file")
    parser.add_argument("--calls", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--loop", type=int, default=20, help="products per timed call")
    args = parser.parse_args(argv)
    results = {"machine": step_cost.machine_info(), "settings": {"calls": args.calls, "loop": args.loop},
               "cases": run(args.calls, args.loop)}
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
