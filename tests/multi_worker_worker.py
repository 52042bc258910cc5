"""One worker of the MultiWorkerMirroredStrategy smoke test (tests/test_multi_worker.py).

Run as a script, it joins the cluster described by `TF_CONFIG`, samples a tiny Bayesian
regression with each sampler named on the command line under one `MultiWorkerMirroredStrategy`,
and writes what it ended with to a JSON file:

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:P0", "127.0.0.1:P1"]},
                "task": {"type": "worker", "index": 0}}' \\
    python tests/multi_worker_worker.py --out worker0.json --samplers sghmc,mccadl_vectorized

With `--backup-dir DIR` each sampler's `fit` runs under `keras.callbacks.BackupAndRestore`
(DIR/<sampler>, saved every epoch), so a restarted worker resumes from the last epoch it saved;
with `--exit-at-step K` the worker dies (`os._exit`, no clean-up, like a kill) right after its
K-th sampler step, the fault the restart recovers from.

Imported, `train_all(run_names)` runs the same training with no strategy: the single-process
reference the workers are compared with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

NUM_EXAMPLES = 64
NUM_FEATURES = 4
GLOBAL_BATCH = 16
EPOCHS = 3
STEPS = EPOCHS * NUM_EXAMPLES // GLOBAL_BATCH
SEED = 7
EXIT_CODE = 17  # what a worker told to die with `--exit-at-step` exits with


# name -> (sampler, BayesianModel's per_example_method). mCCAdL's Taylor C step runs a
# tf.while_loop, which cannot all-reduce, so both per-example paths gather across workers: the
# [n, Nd] centered rows ("vectorized") or the Dense layers' factors ("dense_layers").
SAMPLERS = {
    "sghmc": ("sghmc", "auto"),
    "mccadl_vectorized": ("mccadl", "vectorized"),
    "mccadl_dense_layers": ("mccadl", "dense_layers"),
}


def _sampler(name: str):
    import keras_thermo as kt  # noqa: PLC0415 (TensorFlow import is slow)

    if name == "sghmc":
        return kt.samplers.SGHMC(step_size=1e-2, friction=1.0)
    return kt.samplers.MCCAdL(step_size=1e-2, friction=1.0, covariance="minibatch", expm="taylor")


def regression_dataset():
    """The same `tf.data` pipeline of global batches on every worker (no shuffling).

    The source is in-memory tensors, so there are no files to shard: DATA sharding makes each
    worker read every global batch and keep its replica's slice of it, so the replicas together
    see exactly the single-process batches (OFF would hand every worker whole batches, and AUTO
    would fall back to DATA with a warning).
    """
    import tensorflow as tf  # noqa: PLC0415

    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32") + 0.1 * rng.normal(size=(NUM_EXAMPLES, 1))).astype(
        "float32"
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def _exit_at_step(step: int):
    import keras  # noqa: PLC0415

    class ExitAtStep(keras.callbacks.Callback):
        """Ends the process abruptly after the sampler's `step`-th step (a crash, not a stop)."""

        def on_train_batch_end(self, batch, logs=None):
            if self.model.sampler_step == step:
                sys.stdout.flush()
                os._exit(EXIT_CODE)

    return ExitAtStep()


def train(run_name: str, strategy=None, backup_dir: str | None = None, exit_at_step: int | None = None) -> dict[str, Any]:
    """Samples the regression posterior with one of `SAMPLERS`; returns the final state as plain data."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import keras_thermo as kt  # noqa: PLC0415

    if run_name not in SAMPLERS:
        raise ValueError(f"`run_name` must be one of {list(SAMPLERS)}, got {run_name!r}.")
    sampler_name, per_example_method = SAMPLERS[run_name]
    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(SEED)  # same initial weights in every process
    with strategy.scope():
        net = keras.Sequential(
            [keras.Input((NUM_FEATURES,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)]
        )
        model = kt.BayesianModel(
            net, _sampler(sampler_name), num_examples=NUM_EXAMPLES, prior=kt.priors.Gaussian(1.0), seed=SEED,
            per_example_method=per_example_method,
        )
        model.compile(loss="mse")
    initial = np.concatenate([np.ravel(w) for w in net.get_weights()])
    samples = kt.callbacks.SampleCollector(burn_in_steps=0, every_n_steps=1, max_samples=100)
    callbacks = [samples]
    if backup_dir is not None:
        callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(backup_dir, run_name), save_freq="epoch"))
    if exit_at_step is not None:
        callbacks.append(_exit_at_step(exit_at_step))
    history = model.fit(regression_dataset(), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    # Keras reduces evaluate's per-replica metrics across the workers.
    evaluation = model.evaluate(regression_dataset(), verbose=0, return_dict=True)
    return {
        "sampler": sampler_name,
        "per_example_path": model.per_example_path,
        "num_replicas": int(strategy.num_replicas_in_sync),
        "initial_weights": initial.tolist(),
        "weights": np.concatenate([np.ravel(w) for w in net.get_weights()]).tolist(),
        "sampler_step": model.sampler_step,
        "sampler_state": [np.ravel(np.asarray(leaf)).tolist() for leaf in tf.nest.flatten(model.sampler_state())],
        "evaluation": {name: float(value) for name, value in evaluation.items()},
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
        "sample_steps": np.asarray(samples.steps).tolist(),
        "last_sample": np.asarray(samples.samples[-1]).tolist() if len(samples.steps) else None,
    }


def train_all(run_names: list[str], strategy=None, **options) -> dict[str, dict[str, Any]]:
    return {name: train(name, strategy, **options) for name in run_names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help=f"comma-separated, of {list(SAMPLERS)}")
    parser.add_argument("--backup-dir", help="resume from / back up to DIR/<sampler> (BackupAndRestore)")
    parser.add_argument("--exit-at-step", type=int, help=f"die (exit {EXIT_CODE}) after this sampler step")
    args = parser.parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        parser.error("TF_CONFIG must describe the cluster and this worker's index.")
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    keras.config.disable_traceback_filtering()  # full tracebacks in the test's failure report
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    run_names = [s.strip() for s in args.samplers.split(",") if s.strip()]
    results = train_all(run_names, strategy, backup_dir=args.backup_dir, exit_at_step=args.exit_at_step)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
