"""Resident memory over a long run with PosteriorAverage and SampleCollector attached.

Runs 10^5 steps of a small model (`Dense(8) -> Dense(3)` on 4 features) with SGNHT, a
`SampleCollector` (bounded by `max_samples`) and a `PosteriorAverage` over 256 held-out points,
and records the process's resident set size (VmRSS, Linux) every few executions. Memory should
be flat after warm-up: both callbacks keep a fixed-size store however long the run.

    python -m benchmarks.memory --out runs/memory [--steps 100000]
"""

from __future__ import annotations

import argparse
import json
import os

import keras
import numpy as np

import keras_thermo as kt
from keras_thermo import data as kt_data


def resident_megabytes() -> float:
    """VmRSS of this process in MiB (Linux /proc)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status")


class _MemoryTrace(keras.callbacks.Callback):
    def __init__(self, every_n_batches: int):
        super().__init__()
        self.every_n_batches = every_n_batches
        self.points: list[tuple[int, float]] = []
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.every_n_batches == 0:
            self.points.append((self.model.sampler_step, resident_megabytes()))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/memory")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--steps-per-execution", type=int, default=500)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4)).astype("float32")
    labels = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    train = kt_data.random_minibatches(x[:1744], labels[:1744], 32, seed=0)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model = kt.BayesianModel(net, kt.samplers.SGNHT(1e-3), num_examples=1744, prior=kt.priors.Gaussian(1.0), seed=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=args.steps_per_execution)
    collector = kt.callbacks.SampleCollector(burn_in_steps=1000, every_n_steps=10, max_samples=500)
    average = kt.callbacks.PosteriorAverage((x[1744:], labels[1744:]), burn_in_steps=1000, every_n_steps=100)
    trace = _MemoryTrace(every_n_batches=max(1, 5000 // args.steps_per_execution))
    model.fit(train, steps_per_epoch=args.steps // 10, epochs=10, verbose=0,
              callbacks=[collector, average, trace])
    steps, megabytes = zip(*trace.points)
    warm = [m for s, m in trace.points if s >= args.steps // 10]
    results = {
        "steps": args.steps,
        "samples_kept": int(len(collector.samples)),
        "posterior_samples": int(average.num_samples),
        "rss_mib": [{"step": int(s), "rss_mib": round(m, 1)} for s, m in trace.points],
        "rss_after_warmup_min_mib": round(min(warm), 1),
        "rss_after_warmup_max_mib": round(max(warm), 1),
        "growth_after_warmup_mib": round(warm[-1] - warm[0], 1),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    print(f"RSS after warm-up: {results['rss_after_warmup_min_mib']}..{results['rss_after_warmup_max_mib']} MiB, "
          f"growth {results['growth_after_warmup_mib']} MiB over {args.steps} steps; "
          f"{results['samples_kept']} samples kept, {results['posterior_samples']} averaged.")
    return results


if __name__ == "__main__":
    main()
