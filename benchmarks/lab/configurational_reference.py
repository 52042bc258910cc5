"""The configurational temperature about a reference point: how much of its noise is the origin's.

The check's configurational temperature is `-theta . F / Nd` with the step's minibatch force:
its mean is T at equilibrium (integration by parts of `theta . grad U` against `exp(-U/T)`).
The same holds for `-(theta - c) . F / Nd` about any constant point `c`. Where the posterior
mean `mu` is far from 0, `theta . grad U` carries the term `mu . grad U`, whose fluctuations
dwarf the `Nd T` it is compared with; about a point near `mu` that term is gone. This measures
both estimators on the same chains, to size what a reference point would buy the check.

The chains run the linear regression of `tests/test_temperature_check.py` (the same data, batch,
step, friction, prior and warm-up) with the likelihood of `loss="mse"`, the one
`keras_thermo.testing.simulate_regression_chains` implements (the sampler's own update in one
compiled loop): N = 2000, d = 5 (+ bias), batches of 1000 drawn with replacement, prior
N(0, 10), SGNHT at h = 1e-3, A = 1 with its default 1000-step warm-up, from Keras' default
starts (`testing.default_initial_params`). After the warm-up, every step's minibatch force is
recomputed from the loop's own minibatch draws (stateless, keyed by chain and step) at the
weights the step started from, and both estimators are formed; `c` is the chain's weights at
the end of the warm-up. Per chain: each estimator's mean and batch-means error (blocks of
`--block` steps), and the ratio of the errors. (A chain's own snapshot is not independent of the
weights that follow it: for about its autocorrelation time the estimate about it is biased
towards 0, exactly 0 at the snapshot. Short on this regression; on a network a check would need
another chain's snapshot, or to leave those steps out.)

    python -m benchmarks.lab.configurational_reference --out benchmarks/results/configurational_reference.json \
        [--chains 3] [--steps 41000] [--block 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.block_statistics import batch_means

NUM_EXAMPLES, NUM_FEATURES, BATCH, PRIOR_STD, WARMUP = 2000, 5, 1000, 10**0.5, 1000


def minibatch_forces(design, targets, thetas, steps, chain_seed: int, chunk: int = 5000) -> np.ndarray:
    """The force of the minibatch that `simulate_regression_chains` drew at each loop index in
    `steps`, at the weights `thetas` the step started from (`[S, Nd]`)."""
    num_examples = design.shape[0]
    design_t, targets_t = tf.constant(design), tf.constant(targets)

    @tf.function
    def forces_of(indices, theta):
        rows = tf.map_fn(
            lambda index: tf.random.stateless_uniform([BATCH], seed=tf.stack([chain_seed, index + 2**20]),
                                                      maxval=num_examples, dtype=tf.int32),
            indices, fn_output_signature=tf.int32)
        x, y = tf.gather(design_t, rows), tf.gather(targets_t, rows)  # [S, n, Nd], [S, n]
        residual = tf.einsum("snd,sd->sn", x, theta) - y
        gradient = num_examples * tf.reduce_mean(2.0 * residual[:, :, None] * x, axis=1)
        return -(gradient + theta / PRIOR_STD**2)

    pieces = [forces_of(tf.constant(steps[i:i + chunk], tf.int32), tf.constant(thetas[i:i + chunk])).numpy()
              for i in range(0, len(steps), chunk)]
    return np.concatenate(pieces)


def run(chains: int, steps: int, block: int, seed: int = 0) -> list[dict]:
    x, y = testing.linear_regression_data(NUM_EXAMPLES, NUM_FEATURES, seed=0)
    starts = testing.default_initial_params(NUM_FEATURES, chains, seed=seed)
    result = testing.simulate_regression_chains(
        lambda: kt.samplers.SGNHT(1e-3, friction=1.0, warmup_steps=WARMUP), x, y, starts,
        num_steps=steps, batch_size=BATCH, burn_in_steps=WARMUP - 1, prior_std=PRIOR_STD, seed=seed,
    )
    design = np.concatenate([x, np.ones((len(x), 1), np.float32)], axis=1).astype(np.float64)
    targets = y.reshape(-1).astype(np.float64)
    dim = design.shape[1]
    rows = []
    for chain in range(chains):
        samples = result.samples[chain].astype(np.float64)  # weights after steps WARMUP .. steps
        reference = samples[0]                                # at the end of the warm-up
        before = samples[:-1]                                 # the weights each later step started from
        indices = np.arange(WARMUP, steps)                    # loop index of those steps
        forces = minibatch_forces(design, targets, before, indices, seed + chain)
        origin = -np.sum(before * forces, axis=1) / dim
        about_reference = -np.sum((before - reference) * forces, axis=1) / dim
        usable = (len(origin) // block) * block
        weights = np.full(usable // block, float(block))
        row = {"chain": chain, "steps_after_warmup": int(usable)}
        for name, series in (("origin", origin), ("reference", about_reference)):
            sums = series[:usable].reshape(-1, block).sum(axis=1)
            mean, error = batch_means(sums, weights)
            row[name] = {"mean": float(mean), "standard_error": float(error)}
        row["error_ratio"] = row["origin"]["standard_error"] / row["reference"]["standard_error"]
        rows.append(row)
        print(f"chain {chain}: about 0 {row['origin']['mean']:.3f} +- {row['origin']['standard_error']:.3f}; "
              f"about the warm-up's end {row['reference']['mean']:.3f} +- {row['reference']['standard_error']:.3f} "
              f"(error ratio {row['error_ratio']:.1f}) over {usable} steps", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=3)
    parser.add_argument("--steps", type=int, default=41_000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.chains < 1:
        parser.error(f"--chains must be a positive integer, got {args.chains}")
    if args.block < 1:
        parser.error(f"--block must be a positive integer, got {args.block}")
    if args.steps <= WARMUP + 2 * args.block:
        parser.error(f"--steps must exceed the warm-up ({WARMUP}) by at least two blocks, got {args.steps}")
    rows = run(args.chains, args.steps, args.block)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump({"command": "python -m benchmarks.lab.configurational_reference "
                       + " ".join(sys.argv[1:] if argv is None else argv),
                       "platform": platform.platform(), "chains": rows}, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
