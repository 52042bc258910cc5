"""BayesianModel under MultiWorkerMirroredStrategy: two worker processes on localhost.

Each worker (tests/multi_worker_worker.py) joins a two-worker cluster (one CPU replica each),
samples a tiny regression posterior with SGHMC and with mCCAdL (whose C step gathers both
workers' per-example statistics: the centered rows, or the Dense layers' factors), and writes its
final state. The replicas must end with
bit-identical weights (every input to the update is all-reduced, gathered or keyed by
(seed, step)), and together they must reproduce the single-process run on the same global batches;
so must `evaluate` after it. A worker killed mid-run and restarted with both workers through
`keras.callbacks.BackupAndRestore` must end bit-identical to the uninterrupted run.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import multi_worker_worker as worker

REPO = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = Path(__file__).with_name("multi_worker_worker.py")
SAMPLERS = list(worker.SAMPLERS)
NUM_WORKERS = 2
TIMEOUT_S = 120
# The cluster alone takes 40 s on 2 cores; the default suite's distributed path is
# tests/test_distribute.py (MirroredStrategy, the same cross-replica reductions in one process).
pytestmark = pytest.mark.slow


def _free_ports(count: int) -> list[int]:
    """Ports the OS reports free on 127.0.0.1 (all held open together, so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for handle in sockets:
            handle.bind(("127.0.0.1", 0))
        return [handle.getsockname()[1] for handle in sockets]
    finally:
        for handle in sockets:
            handle.close()


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _run_cluster(tmp: Path, samplers=SAMPLERS, worker_args=None, tag="", expected_exit=None) -> list[dict | None]:
    """Starts the workers, waits up to TIMEOUT_S, and returns their JSON results in task order.

    `worker_args[i]` are extra arguments of worker i. `expected_exit` maps a worker to the exit
    code it must end with (a worker told to die); once it has, the others, left waiting in a
    collective, are killed, and their results are None. Every worker still running at the end,
    or on any failure, is killed: no process outlives the call.
    """
    worker_args = worker_args or [[] for _ in range(NUM_WORKERS)]
    expected_exit = expected_exit or {}
    ports = _free_ports(NUM_WORKERS)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes, logs, outputs = [], [], []
    for index in range(NUM_WORKERS):
        env = dict(os.environ)
        env.update(
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
            CUDA_VISIBLE_DEVICES="",
            KERAS_BACKEND="tensorflow",
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        )
        outputs.append(tmp / f"worker{index}{tag}.json")
        logs.append(tmp / f"worker{index}{tag}.log")
        with open(logs[-1], "wb") as log:  # files, not pipes: a full pipe would stall a worker
            processes.append(subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), "--out", str(outputs[-1]), "--samplers", ",".join(samplers),
                 *worker_args[index]],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            ))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in processes):
            # A worker that died leaves the other waiting forever on a collective.
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in processes):
                break
            time.sleep(0.2)
    finally:
        timed_out = [i for i, p in enumerate(processes) if p.poll() is None]
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    report = "\n\n".join(f"--- worker {i} (exit {p.returncode}):\n{_tail(logs[i])}" for i, p in enumerate(processes))
    if expected_exit:
        # The told worker must have died as told; the others were killed waiting for it.
        wrong = {i: processes[i].returncode for i, code in expected_exit.items() if processes[i].returncode != code}
        if wrong:
            pytest.fail(f"workers {wrong} did not exit with {expected_exit}:\n{report}")
        return [None] * NUM_WORKERS
    failed = [i for i, p in enumerate(processes) if p.returncode != 0 and i not in timed_out]
    if failed or timed_out:
        pytest.fail(f"workers failed {failed} or ran past {TIMEOUT_S} s {timed_out}:\n{report}")
    return [json.loads(path.read_text()) for path in outputs]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    return _run_cluster(tmp_path_factory.mktemp("multi_worker"))


@pytest.fixture(scope="module")
def reference():
    """The same training in this process with no strategy."""
    return worker.train_all(SAMPLERS)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_workers_take_every_step_and_hold_identical_weights(workers, sampler):
    results = [w[sampler] for w in workers]
    for result in results:
        assert result["num_replicas"] == NUM_WORKERS
        if sampler != "sghmc":  # mCCAdL took the per-example path the run asks for
            assert result["per_example_path"] == worker.SAMPLERS[sampler][1]
        assert result["sampler_step"] == worker.STEPS
        assert len(result["history"]["potential"]) == worker.EPOCHS
    weights = [np.array(r["weights"]) for r in results]
    assert np.all(np.isfinite(weights[0]))
    # Bit-identical: any unsynchronised input (noise, statistics, a replica's own force) would
    # make the copies drift apart.
    np.testing.assert_array_equal(weights[0], weights[1])
    assert results[0]["history"] == results[1]["history"]
    # The noise alone moves each weight by ~h * sqrt(2 A T h) * sqrt(steps) >> 1e-3.
    assert np.max(np.abs(weights[0] - np.array(results[0]["initial_weights"]))) > 1e-2


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_worker_records_every_sample(workers, sampler):
    # SampleCollector(every_n_steps=1) writes on each worker's first local replica.
    for result in (w[sampler] for w in workers):
        assert result["sample_steps"] == list(range(1, worker.STEPS + 1))
        np.testing.assert_array_equal(result["last_sample"], result["weights"])


def test_workers_reproduce_the_single_process_run(workers, reference):
    """Same global batches, seed and noise: only the float32 summation order differs.

    Each step sums two half-batch forces instead of one full-batch force (a few ulps, ~1e-7
    relative); over 12 steps that stays near 1e-7 (measured 7e-8 for SGHMC, 8e-8 and 1.1e-7
    for mCCAdL's vectorized and dense-layer paths).
    A sharding error is far larger: workers that each read whole batches instead of their
    halves end ~1e-1 (relative) away. 1e-5 separates the two with margin on both sides.
    """
    for sampler in SAMPLERS:
        distributed = np.array(workers[0][sampler]["weights"])
        single = np.array(reference[sampler]["weights"])
        assert reference[sampler]["sampler_step"] == worker.STEPS
        np.testing.assert_allclose(distributed, single, rtol=0, atol=1e-5 * np.max(np.abs(single)))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_evaluate_under_the_strategy_matches_the_single_process_evaluate(workers, reference, sampler):
    """`evaluate` after the run: both workers report the same loss, the loss of the whole
    evaluation set (each worker evaluates its half of every global batch and Keras reduces the
    metrics across workers), equal to the single-process evaluate up to summation order. A
    worker reporting only its own half is off by far more (checked against the halves below)."""
    results = [w[sampler]["evaluation"] for w in workers]
    assert results[0] == results[1]
    single = reference[sampler]["evaluation"]
    assert set(results[0]) == set(single) and "loss" in single
    # Same weights to ~1e-7 relative: the evaluation differs by as little.
    np.testing.assert_allclose(results[0]["loss"], single["loss"], rtol=1e-5)
    x, y = (t.numpy() for t in next(iter(worker.regression_dataset().unbatch().batch(worker.NUM_EXAMPLES))))
    weights = np.array(workers[0][sampler]["weights"])
    halves = _half_batch_losses(x, y, weights)
    assert min(abs(h - single["loss"]) for h in halves) > 1e-3 * single["loss"]


def _half_batch_losses(x, y, flat_weights):
    """The mse of each worker's halves of the global batches (what an unreduced evaluate gives)."""
    w1, b1, w2, b2 = np.split(flat_weights, np.cumsum([worker.NUM_FEATURES * 3, 3, 3]))
    prediction = np.tanh(x @ w1.reshape(worker.NUM_FEATURES, 3) + b1) @ w2.reshape(3, 1) + b2
    errors = ((prediction - y) ** 2).reshape(-1, worker.GLOBAL_BATCH)
    half = worker.GLOBAL_BATCH // NUM_WORKERS
    return [float(errors[:, :half].mean()), float(errors[:, half:].mean())]


FAULT_SAMPLER = "mccadl_vectorized"  # all-reduces, all-gathers and float64 thermostat state
FAULT_STEP = 6  # mid-epoch 2 (4 steps an epoch): the restart resumes from the end of epoch 1


@pytest.mark.slow  # three two-process phases: 16-55 s on 2 cores
def test_a_killed_worker_restarted_from_backup_ends_bit_identical(workers, tmp_path):
    """Worker 1 dies abruptly after step 6; both workers are then restarted on new ports with
    `BackupAndRestore`, resume from the end of epoch 1 and must end bit-identical (weights and
    sampler state) to the uninterrupted run of the `workers` fixture: the state is restored
    exactly and the noise is keyed by (seed, step)."""
    backups = [tmp_path / f"backup{i}" for i in range(NUM_WORKERS)]  # one per worker: no shared files
    crash_args = [["--backup-dir", str(backups[0])], ["--backup-dir", str(backups[1]), "--exit-at-step", str(FAULT_STEP)]]
    _run_cluster(tmp_path, [FAULT_SAMPLER], crash_args, tag="-crash", expected_exit={1: worker.EXIT_CODE})
    for backup in backups:  # what the restart resumes from: the end of epoch 1
        metadata = json.loads((backup / FAULT_SAMPLER / "training_metadata.json").read_text())
        assert metadata["epoch"] == 1, metadata

    restart_args = [["--backup-dir", str(backup)] for backup in backups]
    restarted = _run_cluster(tmp_path, [FAULT_SAMPLER], restart_args, tag="-restart")
    uninterrupted = workers[0][FAULT_SAMPLER]
    for result in (r[FAULT_SAMPLER] for r in restarted):
        assert result["sampler_step"] == worker.STEPS
        assert len(result["history"]["potential"]) == worker.EPOCHS - 1  # epochs 2 and 3 only
        np.testing.assert_array_equal(result["weights"], uninterrupted["weights"])
        for leaf, expected in zip(result["sampler_state"], uninterrupted["sampler_state"], strict=True):
            np.testing.assert_array_equal(leaf, expected)
        assert result["evaluation"] == uninterrupted["evaluation"]
