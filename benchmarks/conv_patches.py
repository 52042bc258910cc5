"""Cost of a convolution's per-example kernel gradients: per-offset products, patches by slices, `extract_patches`.

A convolution's per-example kernel gradient is `P_i^T Delta_i`, with `P_i` (`[T, kh kw c_in]`)
example i's patches and `Delta_i` (`[T, c_out]`) its output errors.
For the convolutions of the CIFAR-10 CNN of `benchmarks.step_cost` (batch 64) and a strided
"same" and a dilated variant, this times, as warm `tf.function`s on random inputs, interleaved
over `--calls` rounds (median ms per call):

* `extract_patches`: the patches by `tf.image.extract_patches` (what the rule used before);
* `slices`: the patches by `kh kw` strided slices of the padded input (`conv.patches`, now);
* `rows_extract_patches` / `rows_slices`: the patches then the explicit rows
  (`blocks.explicit_gradients`, one batched product of the patches), what the rule's `blocks`
  did for one call before;
* `rows_per_offset`: `conv.kernel_rows`, one batched product `[c_in, T] x [T, c_out]` per kernel
  offset of that offset's input slice, the patches never formed (the rule now).

The two patch tensors are checked to be equal (they are copies of the same input values), and
the per-offset rows against the patches' rows to float32 rounding (`rows_max_relative_difference`).

    python -m benchmarks.conv_patches --out benchmarks/results/conv_patches.json [--calls 50]
"""

from __future__ import annotations

import argparse
import gc
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import step_cost
from keras_thermo.per_example import blocks as kt_blocks
from keras_thermo.per_example.rules import conv as conv_rule

#: (name, layer arguments, input shape without the batch).
CASES = (
    ("cifar10_cnn conv1", dict(filters=16, kernel_size=3), (32, 32, 3)),
    ("cifar10_cnn conv2", dict(filters=16, kernel_size=3), (15, 15, 16)),
    ("conv 3x3 stride 2 same", dict(filters=16, kernel_size=3, strides=2, padding="same"), (32, 32, 16)),
    ("conv 3x3 dilation 2", dict(filters=16, kernel_size=3, dilation_rate=2), (32, 32, 16)),
)
BATCH = 64


def extracted_patches(layer, inputs: tf.Tensor) -> tf.Tensor:
    """`[n, T, kh kw c_in]` by `tf.image.extract_patches` (Conv2D, `valid`/`same`)."""
    extracted = tf.image.extract_patches(
        inputs, sizes=[1, *layer.kernel_size, 1], strides=[1, *layer.strides, 1],
        rates=[1, *layer.dilation_rate, 1], padding="SAME" if layer.padding == "same" else "VALID",
    )
    return tf.reshape(extracted, [int(inputs.shape[0]), -1, int(extracted.shape[-1])])


def timed_calls(functions: dict, args: tuple, calls: int) -> dict:
    """Median ms per call of each warm function of `args`, interleaved over `calls` rounds."""
    for fn in functions.values():
        fn(*args).numpy()  # trace and warm up
    seconds = {name: [] for name in functions}
    gc.collect()
    gc.disable()
    try:
        for _ in range(calls):
            for name, fn in functions.items():
                start = time.perf_counter()
                fn(*args).numpy()
                seconds[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    return {name: 1e3 * float(np.median(values)) for name, values in seconds.items()}


def run(calls: int) -> dict:
    rng = np.random.default_rng(0)
    results = {}
    for name, options, shape in CASES:
        layer = keras.layers.Conv2D(**options)
        outputs = layer.compute_output_shape((BATCH, *shape))
        layer.build((None, *shape))
        x = tf.constant(rng.standard_normal((BATCH, *shape)).astype("float32"))
        positions = int(np.prod(outputs[1:-1]))
        delta = tf.constant(rng.standard_normal((BATCH, positions, layer.filters)).astype("float32"))
        equal = bool(np.array_equal(extracted_patches(layer, x).numpy(), conv_rule.patches(layer, x).numpy()))
        functions = {
            "extract_patches": tf.function(lambda x, d, layer=layer: extracted_patches(layer, x)),
            "slices": tf.function(lambda x, d, layer=layer: conv_rule.patches(layer, x)),
            "rows_extract_patches": tf.function(
                lambda x, d, layer=layer: kt_blocks.explicit_gradients(extracted_patches(layer, x), d)),
            "rows_slices": tf.function(
                lambda x, d, layer=layer: kt_blocks.explicit_gradients(conv_rule.patches(layer, x), d)),
            "rows_per_offset": tf.function(lambda x, d, layer=layer: conv_rule.kernel_rows(layer, (x,), d)),
        }
        whole = functions["rows_slices"](x, delta).numpy()
        difference = float(np.max(np.abs(functions["rows_per_offset"](x, delta).numpy() - whole)) / np.max(np.abs(whole)))
        ms = timed_calls(functions, (x, delta), calls)
        results[name] = {"layer": layer.get_config(), "input_shape": [BATCH, *shape], "positions": positions,
                         "patch_width": int(np.prod(layer.kernel_size)) * shape[-1], "patches_equal": equal,
                         "ms": ms, "slices_over_extract_patches": ms["slices"] / ms["extract_patches"],
                         "rows_slices_over_rows_extract_patches": ms["rows_slices"] / ms["rows_extract_patches"],
                         "rows_per_offset_over_rows_slices": ms["rows_per_offset"] / ms["rows_slices"],
                         "rows_max_relative_difference": difference}
        print(f"{name}: " + ", ".join(f"{k} {v:.3g} ms" for k, v in ms.items()) + f" (patches equal: {equal})",
              flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/conv_patches.json")
    parser.add_argument("--calls", type=int, default=50, help="timed rounds (median)")
    args = parser.parse_args(argv)
    results = {"machine": step_cost.machine_info(), "batch": BATCH, "calls": args.calls, "cases": run(args.calls)}
    step_cost.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
