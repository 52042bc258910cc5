"""Steady-state cost of one step of every sampler against plain Keras SGD, on the benchmark networks.

For each network (the EMNIST MLP, the Fashion-MNIST LSTM, the CIFAR-10 CNN of Luo et al. (2018),
and the digits MLP) this builds a plain Keras model with `keras.optimizers.SGD` and one
`kt.BayesianModel` per sampler configuration, all from the same initial weights, compiled with
the same loss, `steps_per_execution` and `jit_compile`. Inputs and labels are random arrays of
the right shapes (no dataset is read): a `tf.data.Dataset` of a few distinct batches, repeated.

Timing. Two warm-up `fit`s per model (tracing and compilation, then first-execution costs) are
excluded. Then `--repeats` repetitions each time `fit(dataset, epochs=1, steps_per_epoch=S)` once
per method, in an order rotated every repetition, so that load on a shared machine falls on all
methods alike; the garbage collector is kept out of the timed region. Per method: the median
per-step time (wall / S) and the median over repetitions of the ratio method / SGD taken within
the same repetition; the same for the training loop alone (first batch to end of epoch, without
`fit`'s fixed set-up of ~15-20 ms per call), as a check that S is long enough. Every run is
checked to have completed all its steps (a sampler whose NaN guard trips stops `fit` early); the
count is recorded. `steps_per_execution` defaults to 50, the value of the task configs.

Engine against vectorized rows. CCAdL (diag) and mCCAdL run twice in the same run: on the
default path (`per_example_method="auto"`, the layer-rule engine of `keras_thermo.per_example`
wherever every trainable layer has a rule) and as `ccadl_diag_vectorized` / `mccadl_vectorized`
on the `tf.vectorized_map` rows. The LSTM is `LSTM(128)` as users write it (`unroll=False`); the
vectorized path needs `unroll=True`, so its runs use the unrolled copy (same weights).

Breakdown (CCAdL and mCCAdL). The pieces of their step, each timed as a separate warm
`tf.function` (same `jit_compile`) on the same batch, less the time of an empty call: forward +
backward pass (the gradient of the batch loss), the per-example statistics by the path the
model uses (`BayesianModel.per_example_path`: the engine's column blocks from
`per_example.layer_statistics`, or the rows `G` from `per_example.per_example_gradients`), and
on the engine path the vectorized rows as well, for comparison; the covariance statistic (CCAdL:
the diagonal; mCCAdL: the centered factor `Gc`, an operator over the blocks on the engine path,
so no separate piece there), and mCCAdL's C step (`mccadl.covariance_step` with the `tau` mCCAdL
uses at this step size, N and batch size, on the model's current momentum; the method chosen
and the matrix-vector products are recorded). Each piece is reported in ms and as a fraction of
the measured step. On the engine path, `rule_costs` times each layer's rule: forming its blocks,
its variances, one product pair and its Gram contribution.

Memory (`--with-memory` after the timing, into the same outputs; `--memory` alone, into
`memory.json`). For each network, separate processes fit only SGD, only CCAdL (diag) and only
mCCAdL (`--memory-repeats` processes each: a warm-up execution, then one timed-length fit), and
each reports its peak resident set size (VmHWM, and `ru_maxrss`). Every process pays the same
fixed memory (TensorFlow, the data, the model), so the difference of the median peaks of a
method and SGD is what the method adds at its peak: its compiled step and the tensors live in
it (per-example factors or rows, the C step's Krylov basis). Reported next to the size of `G`,
`n * Nd * 4` bytes, with the target for mCCAdL (100 MiB on the MLPs and the CNN,
150 MiB on the LSTM). The whole process's peak is the target's measure. Each process also
reports the memory it holds between steps (`vm_rss_held_mib`: its resident size after the
warm-up execution once glibc's `malloc_trim(0)` has returned the allocator's free memory, i.e.
the compiled step, the variables and caches) and, where Linux lets it reset its high-water mark
(`/proc/self/clear_refs`), the peak of the later steps alone (`vm_hwm_steps_mib`): the later
steps' peak less the held memory is what the tensors of a step add while it runs.

The step-cost targets are written next to the measured values, with met / not met: SGLD, SGHMC,
SGNHT (both integrators) and TACT-HMC within 1.3x SGD on the MLPs and 1.15x on the LSTM and the
CNN; CCAdL (diag) within 2x (MLP, CNN) and 3x (LSTM); mCCAdL within 2.5x (MLP), 4x (LSTM) and
3x (CNN); the C step at most 25% of the mCCAdL step. The vectorized comparison runs have none.
The C step's share is measured in the step as executed: `mccadl_without_c_step`, mCCAdL whose
traced step leaves the C step out (`left_out`; not a sampler), runs in the same rounds, and the
share is `1 - t(without) / t(mCCAdL)` (median over rounds). The breakdown's C-step piece, timed
apart as its own function call, is listed beside it for reference: it pays a call of its own
and overlaps nothing, so it reads higher.

    python -m benchmarks.step_cost --out runs/step_cost [--networks emnist_mlp cifar10_cnn]
        [--steps 100] [--repeats 5] [--steps-per-execution 50] [--jit-compile]
        [--per-example-method auto|layers|vectorized|dense_layers] [--note "CPU, 2 shared cores"]
    python -m benchmarks.step_cost --memory --out runs/step_cost [--memory-repeats 2] [--expm gram]
    python -m benchmarks.step_cost --with-memory --methods ccadl_diag mccadl --out runs/step_cost
    python -m benchmarks.step_cost --quick --out runs/step_cost_quick   # seconds; digits only

`--expm` sets mCCAdL's C-step method (default `"auto"`, which on some nets keeps both methods in
the traced step and chooses per step; `"gram"` or `"taylor"` trace one).

Outputs in `--out`: `results.json` and `table.md` (timing, and memory with `--with-memory`), or
`memory.json` and `memory.md` (`--memory`). `--methods` times a subset of the samplers (with SGD).

Reference: Luo et al. (2018), "Thermostat-assisted continuously-tempered Hamiltonian Monte
Carlo for Bayesian learning", NeurIPS, section 5.2 (networks and hyperparameters).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import inspect
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import per_example
from keras_thermo.per_example import engine as kt_engine
from keras_thermo import random as kt_random
from keras_thermo import linalg as kt_linalg
from keras_thermo import networks as kt_networks
from keras_thermo.samplers import mccadl as kt_mccadl
from keras_thermo.samplers.mccadl import covariance_step

SGD = "keras_sgd"
#: The covariance samplers on the vectorized rows (`per_example_method="vectorized"`), timed in
#: the same run as on the default path (the layer-rule engine) for comparison.
VECTORIZED_SUFFIX = "_vectorized"
#: Timing-only variants of a method (not samplers): `<method><suffix>` traces its step with these
#: pieces left out (`left_out`). The longest suffix is matched first.
LEFT_OUT_SUFFIXES = {
    "_without_noise_and_c_step": ("noise", "c_step"),
    "_without_noise": ("noise",),
    "_without_c_step": ("c_step",),
}
#: mCCAdL with its C step left out, timed with the samplers for the C step's share of the step.
WITHOUT_C_STEP = "mccadl_without_c_step"
SAMPLER_METHODS = (
    "sgld", "sghmc", "sgnht", "sgnht_symmetric", "tact_hmc", "ccadl_diag", "mccadl",
    "ccadl_diag" + VECTORIZED_SUFFIX, "mccadl" + VECTORIZED_SUFFIX, WITHOUT_C_STEP,
)
METHODS = (SGD, *SAMPLER_METHODS)
# The step-cost targets, as the largest allowed ratio to SGD's step time.
CHEAP_SAMPLERS = ("sgld", "sghmc", "sgnht", "sgnht_symmetric", "tact_hmc")
CHEAP_TARGET = {"mlp": 1.3, "lstm": 1.15, "cnn": 1.15}
COVARIANCE_SAMPLERS = ("ccadl_diag", "mccadl")
COVARIANCE_TARGET = {"ccadl_diag": {"mlp": 2.0, "lstm": 3.0, "cnn": 2.0},
                     "mccadl": {"mlp": 2.5, "lstm": 4.0, "cnn": 3.0}}
C_STEP_TARGET_FRACTION = 0.25
# Memory: the extra peak resident memory of mCCAdL over SGD, in MiB (CCAdL is reported too).
MEMORY_METHODS = (SGD, "ccadl_diag", "mccadl")
MEMORY_TARGET_MIB = {"mlp": 100, "lstm": 150, "cnn": 100}
# Distinct random batches per network; the dataset repeats them.
DISTINCT_BATCHES = 4
_CHILD_MARKER = "STEP_COST_MEMORY_JSON "


@contextlib.contextmanager
def left_out(pieces):
    """Patches the library so that a train step traced inside leaves `pieces` out: `"noise"`
    (every standard normal draw replaced by zeros) and/or `"c_step"` (mCCAdL's C step replaced
    by the identity). For timing only: such a step samples nothing."""
    saved = (kt_random.normal_like, kt_mccadl.covariance_step)
    if "noise" in pieces:
        kt_random.normal_like = lambda key, tensors: [tf.zeros_like(t) for t in tensors]
    if "c_step" in pieces:
        kt_mccadl.covariance_step = lambda momentum, *args, **kwargs: (
            list(momentum), tf.constant(0, tf.int32), tf.constant(0, tf.int32))
    try:
        yield
    finally:
        kt_random.normal_like, kt_mccadl.covariance_step = saved


def split_variant(method: str) -> tuple[str, tuple[str, ...]]:
    """`(method, pieces)`: the method a timing variant is built from and what its step leaves out.

    Example:
        >>> split_variant("mccadl_without_noise_and_c_step")
        ('mccadl', ('noise', 'c_step'))
    """
    for suffix, pieces in LEFT_OUT_SUFFIXES.items():
        if method.endswith(suffix):
            return method.removesuffix(suffix), pieces
    return method, ()


@dataclasses.dataclass(frozen=True)
class Network:
    """One benchmark network with its data shapes and sampler hyperparameters.

    `step_size` (h) and `friction` (A) follow the project's task configs: for the paper's
    networks `h = sqrt(eta / N)` and `A = c / h` from TACT-HMC's reported learning rate `eta`
    and noise `c` (so every sampler takes the same per-step learning rate `h^2 N`).
    """

    name: str
    build: Callable[[], keras.Model]
    input_shape: tuple[int, ...]
    num_classes: int
    batch_size: int
    num_examples: int
    step_size: float
    friction: float
    kind: str  # "mlp", "lstm" or "cnn": selects the targets
    # Steps per timed fit: enough that the fixed cost of a `fit` call (~15-20 ms on 2 CPU cores:
    # data adapter, iterator, callbacks) stays a few percent of the SGD run.
    timed_steps: int = 100
    # The same network for the vectorized path where it needs another form (an unrolled LSTM).
    build_vectorized: Callable[[], keras.Model] | None = None

    def make_sampler(self, method: str, expm: str = "auto"):
        """The sampler of `method` with this network's hyperparameters."""
        method = split_variant(method)[0].removesuffix(VECTORIZED_SUFFIX)
        h, friction = self.step_size, self.friction
        if method == "sgld":
            return kt.samplers.SGLD(h * h)
        if method == "sghmc":
            return kt.samplers.SGHMC(h, friction)
        if method == "sgnht":
            return kt.samplers.SGNHT(h, friction)
        if method == "sgnht_symmetric":
            return kt.samplers.SGNHT(h, friction, integrator="symmetric")
        if method == "tact_hmc":
            # eta = h^2 and c = A h (the conversions of keras_thermo/samplers/tact_hmc.py).
            return kt.samplers.TACTHMC(h * h, h * h, noise=friction * h, xi_noise=friction * h)
        if method == "ccadl_diag":
            return kt.samplers.CCAdL(h, friction, covariance="diag")
        if method == "mccadl":
            return kt.samplers.MCCAdL(h, friction, covariance="minibatch", expm=expm)
        raise ValueError(f"`method` must be one of {list(SAMPLER_METHODS)}, got {method!r}.")

    def c_step_tau(self, temperature: float = 1.0, mass: float = 1.0) -> float:
        """mCCAdL's `tau = h (h/2) beta N^2 / (M n (n - 1))` for one full batch."""
        n = float(self.batch_size)
        h = self.step_size
        return h * (0.5 * h) / temperature * self.num_examples**2 / (mass * n * (n - 1.0))


def _paper_network(name, build, input_shape, num_classes, batch_size, num_examples, eta, noise, kind,
                   timed_steps, build_vectorized=None):
    step_size = math.sqrt(eta / num_examples)
    return Network(name, build, input_shape, num_classes, batch_size, num_examples,
                   step_size, noise / step_size, kind, timed_steps, build_vectorized)


NETWORKS: dict[str, Network] = {
    network.name: network
    for network in (
        # Luo et al. (2018), sec. 5.2: (eta, c) = (0.0015, 0.05), (0.0012, 0.15), (0.0010, 0.10).
        _paper_network("emnist_mlp", kt_networks.emnist_mlp, (784,), 47, 128, 112_800, 0.0015, 0.05, "mlp",
                       timed_steps=200),
        # LSTM(128) as users write it (unroll=False); the vectorized path needs it unrolled.
        _paper_network("fashion_mnist_lstm", lambda: kt_networks.fashion_mnist_lstm(unroll=False), (28, 28), 10,
                       64, 60_000, 0.0012, 0.15, "lstm", timed_steps=100,
                       build_vectorized=lambda: kt_networks.fashion_mnist_lstm(unroll=True)),
        _paper_network("cifar10_cnn", kt_networks.cifar10_cnn, (32, 32, 3), 10, 64, 50_000, 0.0010, 0.10, "cnn",
                       timed_steps=100),
        # The digits MLP at h = 5e-3, A = 10 on N = 1346 (a step the tuned digits benchmark tried). Its SGD step takes
        # well under a millisecond, hence the longer timed fits.
        Network("digits_mlp", kt_networks.digits_mlp, (64,), 10, 32, 1346, 5e-3, 10.0, "mlp", timed_steps=1000),
    )
}


def timed_steps(network: Network, steps: int | None, steps_per_execution: int) -> int:
    """Steps per timed fit: `steps`, or the network's default rounded up to whole executions.

    Example:
        >>> timed_steps(NETWORKS["cifar10_cnn"], None, 30)
        120
    """
    if steps is not None:
        return steps
    return steps_per_execution * math.ceil(network.timed_steps / steps_per_execution)


def _loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_dataset(network: Network, seed: int = 0) -> tf.data.Dataset:
    """`DISTINCT_BATCHES` batches of random inputs and labels of the network's shapes, repeated.

    Example:
        >>> x, y = next(iter(make_dataset(NETWORKS["digits_mlp"])))
        >>> x.shape.as_list(), y.shape.as_list()
        ([32, 64], [32])
    """
    rng = np.random.default_rng(seed)
    count = DISTINCT_BATCHES * network.batch_size
    x = rng.normal(size=(count, *network.input_shape)).astype("float32")
    y = rng.integers(0, network.num_classes, size=count).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(network.batch_size, drop_remainder=True)
    # Without autotuning: its model thread, whose polling interval doubles from 10 ms, held up the
    # end of each `fit` until the next poll, so wall times snapped to ~0.31, 0.63, 1.27, 2.55 s
    # (the training loop was not affected). The batches are cached: there is nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.cache().repeat().with_options(options)


def per_example_method_support() -> tuple[bool, Any]:
    """Whether `BayesianModel` takes `per_example_method`, and that argument's default."""
    parameters = inspect.signature(kt.BayesianModel.__init__).parameters
    if "per_example_method" not in parameters:
        return False, None
    default = parameters["per_example_method"].default
    return True, None if default is inspect.Parameter.empty else default


def initial_weights(network: Network, seed: int = 0) -> list[np.ndarray]:
    """The network's initial weights for `seed`, shared by every method's model.

    Seeding once per network matters: `keras.utils.set_random_seed` clears TensorFlow's eager
    kernel caches, which would make the next run of every model built before it slow again.
    """
    keras.utils.set_random_seed(seed)
    return network.build().get_weights()


def make_model(network: Network, method: str, *, steps_per_execution: int, jit_compile: bool,
               weights: list[np.ndarray], per_example_method: str | None = None,
               expm: str = "auto") -> keras.Model:
    """A compiled model for `method` (`"keras_sgd"` or a sampler) starting from `weights`.

    A method ending in `VECTORIZED_SUFFIX` runs its sampler with `per_example_method="vectorized"`
    on `network.build_vectorized` (when set)."""
    vectorized = method.endswith(VECTORIZED_SUFFIX)
    net = (network.build_vectorized or network.build)() if vectorized else network.build()
    net.set_weights(weights)
    if vectorized:
        per_example_method = "vectorized"
    if method == SGD:
        net.compile(optimizer=keras.optimizers.SGD(network.step_size**2 * network.num_examples),
                    loss=_loss(), steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        return net
    sampler = network.make_sampler(method, expm=expm)
    extra = {}
    if per_example_method is not None and sampler.needs_per_example_gradients:
        extra["per_example_method"] = per_example_method
    model = kt.BayesianModel(net, sampler, num_examples=network.num_examples,
                             prior=kt.priors.Gaussian(1.0), seed=0, **extra)
    model.compile(loss=_loss(), steps_per_execution=steps_per_execution, jit_compile=jit_compile)
    return model


def steps_taken(model: keras.Model) -> int:
    """Sampler steps (BayesianModel) or optimizer iterations (plain Keras) taken so far."""
    if isinstance(model, kt.BayesianModel):
        return model.sampler_step if model.built else 0
    return int(model.optimizer.iterations.numpy()) if model.optimizer.built else 0


class _LoopClock(keras.callbacks.Callback):
    """Time from the start of the first execution to the end of the epoch (the training loop
    without `fit`'s set-up and tear-down).

    Marked `async_safe` and without a batch-end hook, so it leaves Keras' dispatch of batch-end
    callbacks as it would be without it.
    """

    async_safe = True

    def __init__(self):
        super().__init__()
        self.start: float | None = None
        self.end: float | None = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.end = time.perf_counter()


def timed_fit(model: keras.Model, dataset: tf.data.Dataset, steps: int) -> dict:
    """Times one `fit` of `steps` steps.

    Returns the wall time of the `fit` call, the time of its training loop alone, the steps
    completed and the divergence message if the sampler's NaN guard stopped the run.
    """
    before = steps_taken(model)
    diverged = None
    clock = _LoopClock()
    # A garbage-collection pass over the many objects of several compiled models can take tens
    # of ms; collect now and keep the collector out of the timed region.
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    except kt.SamplerDivergedError as error:
        diverged = str(error)
    finally:
        seconds = time.perf_counter() - start
        gc.enable()
    loop = None if clock.start is None or clock.end is None else clock.end - clock.start
    return {"seconds": seconds, "loop_seconds": loop, "steps_completed": steps_taken(model) - before,
            "diverged": diverged}


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def time_methods(network: Network, methods, *, steps: int, repeats: int, steps_per_execution: int,
                 jit_compile: bool, per_example_method: str | None, expm: str = "auto") -> tuple[dict, dict]:
    """Warm-up, then interleaved timed fits; returns (per-method results, the models)."""
    dataset = make_dataset(network)
    weights = initial_weights(network)
    models, results = {}, {}
    for method in methods:
        results[method] = {"per_step_seconds": [], "ratio_to_sgd": [], "loop_per_step_seconds": [],
                           "loop_ratio_to_sgd": [], "steps_completed": [], "error": None}
        try:
            models[method] = make_model(network, method, steps_per_execution=steps_per_execution,
                                        jit_compile=jit_compile, weights=weights,
                                        per_example_method=per_example_method, expm=expm)
        except Exception as error:  # noqa: BLE001 (recorded: one method failing must not end the run)
            results[method]["error"] = f"{type(error).__name__}: {error}"
    for method in list(models):
        start = time.perf_counter()
        # Tracing and compilation, then a second run for the first-execution costs (allocations,
        # kernel caches), outside the timed region.
        try:
            with left_out(split_variant(method)[1]):  # the step is traced by the first fit
                for _ in range(2):
                    warm = timed_fit(models[method], dataset, min(steps, 2 * steps_per_execution))
                    if warm["diverged"]:
                        raise kt.SamplerDivergedError(warm["diverged"])
        except Exception as error:  # noqa: BLE001 (as above)
            results[method]["error"] = f"{type(error).__name__}: {error}"
            del models[method]
        results[method]["warmup_seconds"] = time.perf_counter() - start
    for method, entry in results.items():
        if entry["error"]:
            print(f"  {network.name} {method}: {entry['error'].splitlines()[0]}", flush=True)
    timed = [m for m in methods if m in models]
    for repeat in range(repeats if timed else 0):
        shift = repeat % len(timed)
        order = timed[shift:] + timed[:shift]  # rotated, so no method always runs first
        this_repeat, this_repeat_loop = {}, {}
        for method in order:
            run = timed_fit(models[method], dataset, steps)
            entry = results[method]
            entry["steps_completed"].append(run["steps_completed"])
            if run["diverged"] and entry["error"] is None:
                entry["error"] = f"SamplerDivergedError: {run['diverged']}"
            # Only complete runs count: a run stopped by the NaN guard did less work.
            if run["steps_completed"] == steps:
                this_repeat[method] = run["seconds"] / steps
                if run["loop_seconds"] is not None:
                    this_repeat_loop[method] = run["loop_seconds"] / steps
        for method in timed:
            for per_step_key, ratio_key, measured in (
                ("per_step_seconds", "ratio_to_sgd", this_repeat),
                ("loop_per_step_seconds", "loop_ratio_to_sgd", this_repeat_loop),
            ):
                per_step, sgd = measured.get(method), measured.get(SGD)
                results[method][per_step_key].append(per_step)
                results[method][ratio_key].append(
                    per_step / sgd if per_step is not None and sgd is not None else None
                )
    for method, entry in results.items():
        entry["all_steps_completed"] = bool(entry["steps_completed"]) and all(
            count == steps for count in entry["steps_completed"]
        )
        for per_step_key, ratio_key, prefix in (
            ("per_step_seconds", "ratio_to_sgd", "median"), ("loop_per_step_seconds", "loop_ratio_to_sgd", "loop_median"),
        ):
            seconds = _median(entry[per_step_key])
            entry[f"{prefix}_ms_per_step"] = None if seconds is None else 1e3 * seconds
            entry[f"{prefix}_ratio_to_sgd"] = _median(entry[ratio_key])
    return results, models


# --- breakdown of the covariance samplers' step ------------------------------------------------


def _forced(fn: Callable, jit_compile: bool) -> Callable:
    """`fn` as a `tf.function` returning its results and a scalar that depends on all of them.

    Returned tensors are always computed; reading the scalar (`.numpy()`) waits for them, also
    on an accelerator, at the cost of one element per result.
    """

    def run(*args):
        results = fn(*args)
        leaves = tf.nest.flatten(results)
        done = tf.add_n([tf.cast(tf.reshape(leaf, [-1])[0], tf.float32) for leaf in leaves])
        return results, done

    return tf.function(run, jit_compile=jit_compile)


def time_pieces(pieces: dict[str, tuple[Callable, tuple]], calls: int) -> dict[str, float]:
    """Median ms per call of each warm piece, with the pieces interleaved over `calls` rounds."""
    for fn, args in pieces.values():
        fn(*args)[1].numpy()  # trace, compile and warm up
    seconds = {name: [] for name in pieces}
    gc.collect()
    gc.disable()  # as in `timed_fit`
    try:
        for _ in range(calls):
            for name, (fn, args) in pieces.items():
                start = time.perf_counter()
                fn(*args)[1].numpy()
                seconds[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    return {name: 1e3 * float(np.median(values)) for name, values in seconds.items()}


def per_example_path(model: kt.BayesianModel) -> str:
    """How `model` gets per-example statistics: `"vectorized"` or `"dense_layers"`."""
    return getattr(model, "per_example_path", "vectorized")


def _noise_draws(variables) -> Callable:
    """A function of the step drawing one standard normal per trainable scalar, as samplers do."""

    def draws(step):
        key = kt_random.step_key(0, step, kt_random.STREAM_MOMENTUM)
        return kt_random.normal_like(key, variables)

    return draws


def covariance_breakdown(network: Network, mccadl_model: kt.BayesianModel, *, jit_compile: bool,
                         calls: int, vectorized_model: kt.BayesianModel | None = None) -> dict:
    """Times the pieces of the CCAdL and mCCAdL steps on the first batch of the dataset.

    The pieces follow the model's per-example path. `"vectorized"`: the rows `G`
    (`per_example.per_example_gradients`), then `PerExampleGradients(G).diagonal_covariance()` (CCAdL)
    and `.covariance_factor()` (`Gc`, mCCAdL). `"dense_layers"`: the per-layer factors
    (`per_example.dense_layers.dense_layer_gradients`, whose `covariance_factor()` is an operator over
    them, so there is no separate factor piece), then their `column_sums_of_squares()`. The C
    step acts on the model's current momentum with the `tau` of a full batch.
    """
    x, y = next(iter(make_dataset(network)))
    net, loss_fn = mccadl_model.net, _loss()
    variables = net.trainable_variables
    path = per_example_path(mccadl_model)
    momentum = list(mccadl_model.sampler_state().momentum)
    tau = network.c_step_tau(temperature=mccadl_model.temperature, mass=mccadl_model.sampler.mass)
    expm = mccadl_model.sampler.expm

    def forward_backward(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        return tape.gradient(loss, variables)

    pieces = {
        # The cost of calling a tf.function at all (argument passing, dispatch, the `done`
        # scalar), subtracted from the pieces below: inside the train step there is no such call.
        "call_overhead": (_forced(lambda x, y: x[0], jit_compile), (x, y)),
        "forward_backward": (_forced(forward_backward, jit_compile), (x, y)),
        # The Nd standard normals every noisy sampler draws per step (once for SGLD, SGHMC,
        # SGNHT, CCAdL; TACT-HMC and the symmetric integrators draw them twice): what the cheap
        # samplers add to SGD's step, besides elementwise updates.
        "noise_draws": (_forced(_noise_draws(variables), jit_compile), (tf.constant(1, tf.int64),)),
    }
    if path in ("layers", "dense_layers"):

        def factors(x, y):
            return per_example.layer_statistics(net, loss_fn, x, y).covariance_factor()

        centered = factors(x, y)  # an operator over eager blocks, captured below
        count = float(network.batch_size)
        pieces["per_example_gradients"] = (_forced(factors, jit_compile), (x, y))
        pieces["diagonal_covariance"] = (
            _forced(lambda: centered.column_sums_of_squares() / (count - 1.0), jit_compile), ())
        frobenius_sq = float(centered.frobenius_squared())
    else:
        rows = per_example.per_example_gradients(net, loss_fn, x, y)
        centered = per_example.PerExampleGradients(rows).covariance_factor()
        pieces["per_example_gradients"] = (
            _forced(lambda x, y: per_example.per_example_gradients(net, loss_fn, x, y), jit_compile), (x, y))
        pieces["diagonal_covariance"] = (
            _forced(lambda g: per_example.PerExampleGradients(g).diagonal_covariance(), jit_compile), (rows,))
        pieces["covariance_factor"] = (
            _forced(lambda g: per_example.PerExampleGradients(g).covariance_factor(), jit_compile), (rows,))
        frobenius_sq = float(tf.reduce_sum(tf.square(centered)))
    if path in ("layers", "dense_layers") and vectorized_model is not None:
        # The same piece on the vectorized rows, for comparison (its own, unrolled net).
        reference_net = vectorized_model.net
        pieces["per_example_gradients_vectorized"] = (
            _forced(lambda x, y: per_example.per_example_gradients(reference_net, loss_fn, x, y), jit_compile),
            (x, y))
    pieces["c_step"] = (_forced(lambda p: covariance_step(p, centered, tau, expm), jit_compile), (momentum,))
    raw_ms = time_pieces(pieces, calls)
    overhead_ms = raw_ms.pop("call_overhead")
    raw_ms.setdefault("covariance_factor", None)
    raw_ms.setdefault("per_example_gradients_vectorized", None)
    (_, matvecs, code), _ = pieces["c_step"][0](momentum)
    method_names = {kt_linalg.TAYLOR: "taylor", kt_linalg.GRAM: "gram"}
    return {
        "per_example_path": path,
        "pieces_ms": {piece: None if ms is None else max(ms - overhead_ms, 0.0) for piece, ms in raw_ms.items()},
        "pieces_raw_ms": raw_ms,
        "call_overhead_ms": overhead_ms,
        "num_params": int(mccadl_model.num_params),
        "batch_size": network.batch_size,
        "tau": tau,
        "tau_frobenius_norm_sq": tau * frobenius_sq,
        "c_step_expm": expm,
        "c_step_method": method_names[int(code)],
        "c_step_matvecs": int(matvecs),
        "calls": calls,
    }


def rule_costs(network: Network, model: kt.BayesianModel, *, jit_compile: bool, calls: int) -> list[dict]:
    """What each layer's rule costs on the engine path, on the first batch of the dataset.

    The engine's forward and backward pass is run once (`engine.Recording`); then, per
    hooked layer, as warm `tf.function`s over those recorded tensors: forming its blocks
    (`rule.blocks`: patches, explicit rows, token segment sums), its variances
    (`centered_column_squares`, CCAdL's statistic), one product pair (`G_l u` and `G_l^T z`, the
    unit of mCCAdL's C step) and its Gram contribution (`G_l G_l^T`). Milliseconds, less the cost
    of an empty call; with the layer's form (block types, positions T).
    """
    x, y = next(iter(make_dataset(network)))
    net = model.net
    with kt_engine.Recording(net) as recording:
        y_pred = net(x, training=True)
    recorded = recording.calls(_loss(), y, y_pred)
    rng = np.random.default_rng(0)
    results = []
    pieces = {"call_overhead": (_forced(lambda: tf.constant(0.0), jit_compile), ())}
    for index, (layer, rule, layer_calls) in enumerate(recorded):
        blocks = [block for _, block in rule.blocks(layer, layer_calls)]
        vectors = [tf.constant(rng.standard_normal((b.num_cols, 1)), tf.float32) for b in blocks]
        rows = tf.constant(rng.standard_normal((network.batch_size, 1)), tf.float32)

        def form(rule=rule, layer=layer, layer_calls=layer_calls):
            return [block for _, block in rule.blocks(layer, layer_calls)]

        pieces[f"{index}:blocks"] = (_forced(form, jit_compile), ())
        pieces[f"{index}:variances"] = (
            _forced(lambda blocks=blocks: [b.centered_column_squares() for b in blocks], jit_compile), ())
        pieces[f"{index}:product"] = (_forced(
            lambda blocks=blocks, vectors=vectors: [(b.matvec(v), b.rmatvec(rows)) for b, v in zip(blocks, vectors)],
            jit_compile), ())
        pieces[f"{index}:gram"] = (_forced(lambda blocks=blocks: [b.gram() for b in blocks], jit_compile), ())
        results.append({
            "layer": layer.name, "type": type(layer).__name__,
            "forms": [type(b).__name__ for b in blocks],
            "positions": [getattr(b, "positions", None) for b in blocks],
            "num_params": int(sum(b.num_cols for b in blocks)),
        })
    raw_ms = time_pieces(pieces, calls)
    overhead = raw_ms.pop("call_overhead")
    for index, entry in enumerate(results):
        entry["ms"] = {piece: max(raw_ms[f"{index}:{piece}"] - overhead, 0.0)
                       for piece in ("blocks", "variances", "product", "gram")}
    return results


# --- targets and tables ------------------------------------------------------------------------


def ratio_target(network: Network, method: str) -> float | None:
    """The largest allowed ratio to SGD for `method` on `network` (None: no target)."""
    if method in CHEAP_SAMPLERS:
        return CHEAP_TARGET[network.kind]
    if method in COVARIANCE_SAMPLERS:
        return COVARIANCE_TARGET[method][network.kind]
    return None


def evaluate_targets(network: Network, timing: dict, breakdown: dict | None) -> list[dict]:
    """One row per target: what was measured, the bound, and whether it is met."""
    rows = []
    for method in SAMPLER_METHODS:
        if method not in timing:
            continue
        bound = ratio_target(network, method)
        if bound is None:  # the vectorized comparison runs and the C-step ablation: no target
            continue
        measured = timing[method]["median_ratio_to_sgd"]
        rows.append({
            "network": network.name, "quantity": f"{method} / {SGD} step time", "target": f"<= {bound}",
            "measured": measured, "met": None if measured is None else bool(measured <= bound),
        })
    fraction = in_step_c_step_fraction(timing)
    if fraction is not None:
        rows.append({
            "network": network.name, "quantity": "C step / mCCAdL step (in the step)",
            "target": f"<= {C_STEP_TARGET_FRACTION}", "measured": fraction,
            "met": bool(fraction <= C_STEP_TARGET_FRACTION),
        })
    if breakdown is not None:
        separate = breakdown["fraction_of_mccadl_step"].get("c_step")
        rows.append({
            "network": network.name, "quantity": "C step / mCCAdL step (timed apart)",
            "target": "(reference)", "measured": separate, "met": None,
        })
    return rows


def in_step_c_step_fraction(timing: dict) -> float | None:
    """The C step's share of the mCCAdL step as executed: `1 - t(without C step) / t(mCCAdL)`,
    the median over the repetitions of both (None unless both were timed)."""
    if "mccadl" not in timing or WITHOUT_C_STEP not in timing:
        return None
    pairs = zip(timing["mccadl"]["per_step_seconds"], timing[WITHOUT_C_STEP]["per_step_seconds"])
    shares = [1.0 - without / full for full, without in pairs if full is not None and without is not None]
    return _median(shares)


def _cell(ms: float | None, ratio: float | None, loop_ratio: float | None) -> str:
    if ms is None:
        return "failed"
    if ratio is None:
        return f"{ms:.3g} ms"
    loop = "" if loop_ratio is None else f"; loop {loop_ratio:.2f}x"
    return f"{ms:.3g} ms ({ratio:.2f}x{loop})"


def _met(value: bool | None) -> str:
    return {True: "met", False: "not met", None: "n/a"}[value]


def markdown_tables(results: dict) -> str:
    """The step-time table, the targets and the covariance breakdown, as Markdown."""
    names = list(results["networks"])
    settings = results["settings"]
    steps = ", ".join(f"{name} {results['networks'][name]['timed_steps']}" for name in names)
    lines = [
        f"Per-step time (wall time of `fit` / steps), median of {settings['repeats']} repetitions "
        f"(steps per fit: {steps}; steps_per_execution={settings['steps_per_execution']}, "
        f"jit_compile={settings['jit_compile']}); in brackets the median ratio to Keras SGD "
        "within a repetition, and the same ratio for the training loop alone (without fit's "
        "set-up).",
        "",
        "| method | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for method in settings["methods"]:
        cells = []
        for name in names:
            entry = results["networks"][name]["timing"].get(method, {})
            cell = _cell(entry.get("median_ms_per_step"), entry.get("median_ratio_to_sgd"),
                         entry.get("loop_median_ratio_to_sgd"))
            if entry and not entry.get("all_steps_completed", False):
                cell += " (incomplete)"
            cells.append(cell)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "| network | quantity | target | measured | |", "|---|---|---|---|---|"]
    for row in results["targets"]:
        measured = "n/a" if row["measured"] is None else f"{row['measured']:.3g}"
        lines.append(f"| {row['network']} | {row['quantity']} | {row['target']} | {measured} | "
                     f"{_met(row['met'])} |")
    with_breakdown = [n for n in names if results["networks"][n].get("breakdown")]
    if with_breakdown:
        lines += ["", "Pieces of the covariance samplers' step (warm tf.functions, same batch, median "
                  "per call less the cost of an empty call): ms, and in brackets the fraction of "
                  "the measured mCCAdL step.", "",
                  "| piece | " + " | ".join(with_breakdown) + " |", "|---|" + "---|" * len(with_breakdown)]
        pieces = ("forward_backward", "noise_draws", "per_example_gradients", "per_example_gradients_vectorized",
                  "diagonal_covariance", "covariance_factor", "c_step")
        for piece in pieces:
            cells = []
            for name in with_breakdown:
                breakdown = results["networks"][name]["breakdown"]
                fraction = breakdown["fraction_of_mccadl_step"].get(piece)
                ms = breakdown["pieces_ms"].get(piece)
                if ms is None:
                    cells.append("n/a")
                else:
                    cells.append(f"{ms:.3g} ({fraction:.0%})" if fraction is not None else f"{ms:.3g}")
            lines.append(f"| {piece} | " + " | ".join(cells) + " |")
        lines.append("| per-example path | " + " | ".join(
            results["networks"][n]["breakdown"]["per_example_path"] for n in with_breakdown) + " |")
        cells = [
            f"{b['c_step_method']}, {b['c_step_matvecs']} matvecs, tau ||Gc||^2 = {b['tau_frobenius_norm_sq']:.3g}"
            for b in (results["networks"][n]["breakdown"] for n in with_breakdown)
        ]
        lines.append("| C step method | " + " | ".join(cells) + " |")
        steps = [results["networks"][n]["timing"]["mccadl"].get("median_ms_per_step") for n in with_breakdown]
        lines.append("| mCCAdL step (fit) | " + " | ".join(
            "failed" if ms is None else f"{ms:.3g}" for ms in steps) + " |")
    with_rules = [n for n in names if results["networks"][n].get("rule_costs")]
    if with_rules:
        lines += ["", "What each layer's rule costs (engine path, warm tf.functions on the recorded tensors of "
                  "one batch, ms less an empty call): forming its blocks, its variances (CCAdL), one product "
                  "pair G u and G^T z (the unit of mCCAdL's C step), its Gram contribution G G^T.", "",
                  "| network | layer | form | params | blocks | variances | product | gram |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in with_rules:
            for layer in results["networks"][name]["rule_costs"]:
                forms = ", ".join(f"{f}" + (f" (T={t})" if t and t > 1 else "")
                                  for f, t in zip(layer["forms"], layer["positions"]))
                ms = layer["ms"]
                lines.append(f"| {name} | {layer['layer']} ({layer['type']}) | {forms} | {layer['num_params']} | "
                             f"{ms['blocks']:.3g} | {ms['variances']:.3g} | {ms['product']:.3g} | {ms['gram']:.3g} |")
    return "\n".join(lines) + "\n"


def machine_info() -> dict:
    """CPU count, library versions, the device TensorFlow computes on, and the load average."""
    gpus = tf.config.list_physical_devices("GPU")
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "device": ", ".join(g.name for g in gpus) if gpus else "CPU",
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _json_safe(value: Any) -> Any:
    """NaN and infinities become None, so the file is strict JSON."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path, results: dict) -> None:
    """Writes `results` as strict JSON to `path`, creating its folder (the benchmarks' one way)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(results), indent=1, default=float))  # numpy scalars too


def _write(out: Path, json_name: str, results: dict, table_name: str, table: str) -> None:
    write_json(out / json_name, results)
    (out / table_name).write_text(table)


# --- memory mode -------------------------------------------------------------------------------


def peak_memory_mib() -> dict:
    """This process's peak resident set size: VmHWM (Linux /proc) and `ru_maxrss`, in MiB, and
    its current resident size (VmRSS).

    VmHWM starts afresh at `exec`; Linux keeps `ru_maxrss` across `fork` and `exec`, so in a child
    process started by this benchmark it is at least the parent's peak: only VmHWM is compared."""
    peak = {"ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    peak["vm_hwm_mib"] = int(line.split()[1]) / 1024.0
                elif line.startswith("VmRSS:"):
                    peak["vm_rss_mib"] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak


def reset_peak_memory() -> bool:
    """Resets this process's VmHWM to its current resident size (Linux: writing 5 to
    /proc/self/clear_refs); False where that is not possible or did not take effect."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        return False
    now = peak_memory_mib()
    # A reset that took effect leaves the high-water mark at the resident size.
    return "vm_hwm_mib" in now and now["vm_hwm_mib"] <= now.get("vm_rss_mib", 0.0) + 1.0


def release_free_memory() -> bool:
    """Returns the C allocator's free memory to the system (glibc `malloc_trim(0)`), so that the
    resident size counts memory in use only; False where that is not available."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def memory_report(through_warm_up: dict, held: dict | None, steps: dict | None, end: dict) -> dict:
    """The memory child's readings (`peak_memory_mib`) as its report.

    Args:
        through_warm_up: read after the warm-up execution (tracing included).
        held: read after `release_free_memory`, before the timed steps (None: not released).
        steps: read after the timed steps if the high-water mark was reset before them, else None.
        end: read at the end (without a reset, the whole process's peak).

    Example:
        >>> memory_report({"vm_hwm_mib": 900.0}, {"vm_rss_mib": 850.0}, {"vm_hwm_mib": 880.0},
        ...               {"vm_hwm_mib": 880.0, "ru_maxrss_mib": 900.0})["vm_hwm_mib"]
        900.0
    """
    peaks = [value for value in (through_warm_up.get("vm_hwm_mib"), end.get("vm_hwm_mib")) if value is not None]
    return {
        "vm_hwm_mib": max(peaks) if peaks else None,
        # Linux resets ru_maxrss with VmHWM: the larger reading is the process's.
        "ru_maxrss_mib": max((value for value in (through_warm_up.get("ru_maxrss_mib"), end.get("ru_maxrss_mib"))
                              if value is not None), default=None),
        "vm_hwm_through_warm_up_mib": through_warm_up.get("vm_hwm_mib"),
        "vm_rss_held_mib": None if held is None else held.get("vm_rss_mib"),
        "vm_hwm_steps_mib": None if steps is None else steps.get("vm_hwm_mib"),
    }


def memory_child(network_name: str, method: str, args: argparse.Namespace) -> None:
    """Runs one method's warm-up and one timed-length fit, then prints its peak memory."""
    network = NETWORKS[network_name]
    model = make_model(network, method, steps_per_execution=args.steps_per_execution,
                       jit_compile=args.jit_compile, weights=initial_weights(network),
                       per_example_method=args.per_example_method, expm=args.expm)
    dataset = make_dataset(network)
    timed_fit(model, dataset, args.steps_per_execution)
    through_warm_up = peak_memory_mib()
    held = peak_memory_mib() if release_free_memory() else None
    reset = reset_peak_memory()
    run = timed_fit(model, dataset, args.steps)
    end = peak_memory_mib()
    report = {**memory_report(through_warm_up, held, end if reset else None, end),
              "steps_completed": run["steps_completed"], "diverged": run["diverged"],
              "num_params": int(model.count_params() if method == SGD else model.num_params)}
    print(_CHILD_MARKER + json.dumps(report), flush=True)


def _child_command(network: str, method: str, args: argparse.Namespace) -> list[str]:
    steps = timed_steps(NETWORKS[network], args.steps, args.steps_per_execution)
    command = [sys.executable, "-m", "benchmarks.step_cost", "--memory-child", f"{network}:{method}",
               "--steps", str(steps), "--steps-per-execution", str(args.steps_per_execution)]
    if args.jit_compile:
        command.append("--jit-compile")
    if args.per_example_method is not None:
        command += ["--per-example-method", args.per_example_method]
    command += ["--expm", args.expm]
    return command


def measure_memory(args: argparse.Namespace, name: str) -> dict:
    """Peak RSS of processes fitting only SGD, only CCAdL (diag) or only mCCAdL on network `name`.

    Each method runs `--memory-repeats` times, each in a fresh process (same imports, data and
    initial weights), so the difference of two methods' peaks is what the method adds: its
    train function's graph and the tensors of its step. The median peak per method is compared.
    """
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    network = NETWORKS[name]
    runs = {}
    for method in MEMORY_METHODS:
        runs[method] = []
        for _ in range(args.memory_repeats):
            completed = subprocess.run(_child_command(name, method, args), cwd=root, env=env,
                                       capture_output=True, text=True, check=False)
            lines = [l for l in completed.stdout.splitlines() if l.startswith(_CHILD_MARKER)]
            if completed.returncode != 0 or not lines:
                runs[method].append({"error": f"exit {completed.returncode}: {completed.stderr[-2000:]}"})
            else:
                runs[method].append(json.loads(lines[-1][len(_CHILD_MARKER):]))
            print(f"  {name} {method}: {runs[method][-1]}", flush=True)
    def medians(key):
        return {method: _median(run.get(key) for run in method_runs) for method, method_runs in runs.items()}

    def over_sgd(peaks):
        return {method: (None if peaks[method] is None or peaks[SGD] is None else peaks[method] - peaks[SGD])
                for method in MEMORY_METHODS if method != SGD}

    peaks, steps_peaks, held = medians("vm_hwm_mib"), medians("vm_hwm_steps_mib"), medians("vm_rss_held_mib")
    num_params = next((run["num_params"] for method_runs in runs.values() for run in method_runs
                       if "num_params" in run), None)
    extra = over_sgd(peaks)
    return {
        "runs": runs, "median_vm_hwm_mib": peaks, "extra_peak_over_sgd_mib": extra,
        "median_vm_hwm_steps_mib": steps_peaks, "extra_steps_peak_over_sgd_mib": over_sgd(steps_peaks),
        "median_vm_rss_held_mib": held, "extra_held_over_sgd_mib": over_sgd(held),
        "mccadl_minus_sgd_peak_mib": extra["mccadl"],
        "g_size_mib": None if num_params is None else network.batch_size * num_params * 4 / 2**20,
        "batch_size": network.batch_size, "num_params": num_params, "repeats": args.memory_repeats,
        "target_extra_mccadl_mib": MEMORY_TARGET_MIB[network.kind],
    }


def memory_target_row(name: str, memory: dict) -> dict:
    """The memory target (mCCAdL's extra peak over SGD) as a row of `results["targets"]`."""
    measured, bound = memory["mccadl_minus_sgd_peak_mib"], memory["target_extra_mccadl_mib"]
    return {"network": name, "quantity": "mccadl - keras_sgd peak RSS (MiB)", "target": f"<= {bound}",
            "measured": measured, "met": None if measured is None else bool(measured <= bound)}


def memory_table(per_network: dict) -> str:
    """Markdown: median peak RSS per method and what CCAdL and mCCAdL add over SGD."""
    repeats = {entry["repeats"] for entry in per_network.values()}
    lines = [f"Peak resident memory (VmHWM, median of {', '.join(map(str, sorted(repeats)))} processes per "
             "method, each fitting one method only), the extra of CCAdL (diag) and mCCAdL over SGD, "
             "and the size of G = n x Nd float32, in MiB. Then the same differences for the memory "
             "held between steps (the resident size after the warm-up execution once the allocator "
             "has returned its free memory: the compiled step, variables and caches) and for the "
             "peak of the later steps (high-water mark reset after the warm-up); n/a where the "
             "process could not release or reset.", "",
             "| network | SGD peak | CCAdL diag - SGD | mCCAdL - SGD (target) | size of G "
             "| held: CCAdL diag - SGD | held: mCCAdL - SGD "
             "| later steps' peak: CCAdL diag - SGD | later steps' peak: mCCAdL - SGD |",
             "|---|---|---|---|---|---|---|---|---|"]

    def mib(value, missing="failed"):
        return missing if value is None else f"{value:.0f}"

    for name, entry in per_network.items():
        extra, g_mib = entry["extra_peak_over_sgd_mib"], entry["g_size_mib"]
        held = entry.get("extra_held_over_sgd_mib") or {}
        steps = entry.get("extra_steps_peak_over_sgd_mib") or {}
        lines.append(f"| {name} | {mib(entry['median_vm_hwm_mib'][SGD])} | {mib(extra['ccadl_diag'])} | "
                     f"{mib(extra['mccadl'])} (<= {entry['target_extra_mccadl_mib']}) | "
                     f"{'n/a' if g_mib is None else f'{g_mib:.1f}'} | "
                     + " | ".join(mib(column.get(method), "n/a") for column in (held, steps)
                                  for method in ("ccadl_diag", "mccadl")) + " |")
    return "\n".join(lines) + "\n"


def run_memory(args: argparse.Namespace, networks: list[str]) -> dict:
    """Memory only (`--memory`): `measure_memory` per network, written to memory.json/memory.md."""
    per_network = {name: measure_memory(args, name) for name in networks}
    results = {
        "machine": machine_info(),
        "settings": {"steps": args.steps, "steps_per_execution": args.steps_per_execution,
                     "jit_compile": args.jit_compile, "per_example_method": args.per_example_method,
                     "expm": args.expm,
                     "memory_repeats": args.memory_repeats},
        "networks": per_network,
        "targets": [memory_target_row(name, entry) for name, entry in per_network.items()],
    }
    table = memory_table(per_network)
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    _write(Path(args.out), "memory.json", results, "memory.md", table)
    print(table)
    return results


# --- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/step_cost", help="output folder")
    parser.add_argument("--networks", nargs="+", choices=sorted(NETWORKS), default=None,
                        help="default: all four (digits_mlp only with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed fit, a multiple of --steps-per-execution (default: per "
                             "network, 1000 for digits_mlp, 200 for emnist_mlp, 100 for the others)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    # 50 is what the task configs train with. It amortises the per-execution host work of fit
    # (callbacks, logs) over enough steps that the device-side step dominates even for the
    # digits MLP, whose SGD step takes well under a millisecond.
    parser.add_argument("--steps-per-execution", type=int, default=None, help="default 50")
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile every train step and piece with XLA (off by default: on a "
                             "CPU XLA made the per-example gradients slower)")
    parser.add_argument("--per-example-method", choices=("auto", "layers", "vectorized", "dense_layers"), default=None,
                        help="passed to BayesianModel(per_example_method=...) when it has that argument; "
                             "default: BayesianModel's default")
    parser.add_argument("--expm", choices=("auto", "taylor", "gram"), default="auto",
                        help="mCCAdL's C-step method (MCCAdL(covariance='minibatch', expm=...): the paper's "
                             "C step, which the 'mccadl' row times); default auto")
    parser.add_argument("--breakdown-calls", type=int, default=None,
                        help="timed calls per breakdown piece (default 20)")
    parser.add_argument("--memory", action="store_true",
                        help="measure peak memory (one subprocess per network and method) instead of time")
    parser.add_argument("--with-memory", action="store_true",
                        help="time, then measure peak memory as --memory does, into results.json and table.md")
    parser.add_argument("--memory-repeats", type=int, default=None,
                        help="processes per method for the peak memory (median; default 2)")
    parser.add_argument("--methods", nargs="+", choices=SAMPLER_METHODS, default=None,
                        help="time only these samplers (and Keras SGD); default: all")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: digits MLP, steps_per_execution 5, 10 steps, 2 repeats")
    parser.add_argument("--note", default=None,
                        help="free text stored in the JSON (for example the machine: 'CPU, 2 shared cores')")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = {"steps": 10, "repeats": 2, "steps_per_execution": 5, "breakdown_calls": 3, "memory_repeats": 1}
    full = {"repeats": 5, "steps_per_execution": 50, "breakdown_calls": 20, "memory_repeats": 2}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.networks is None:
        args.networks = ["digits_mlp"] if args.quick else list(NETWORKS)
    for key in ("steps", "repeats", "steps_per_execution", "breakdown_calls", "memory_repeats"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise ValueError(f"`--{key.replace('_', '-')}` must be a positive integer, got {getattr(args, key)}.")
    if args.steps is not None and args.steps % args.steps_per_execution:
        raise ValueError(
            f"`--steps` must be a multiple of --steps-per-execution ({args.steps_per_execution}) so "
            f"that every timed fit runs whole executions, got {args.steps}."
        )
    return args


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark and writes the JSON and Markdown outputs; returns the results.

    Example:
        >>> results = main(["--quick", "--out", "/tmp/step_cost_quick"])  # doctest: +SKIP
        >>> results["networks"]["digits_mlp"]["timing"]["mccadl"]["median_ratio_to_sgd"]  # doctest: +SKIP
        7.5
    """
    args = parse_args(argv)
    if args.memory_child is not None:
        network_name, method = args.memory_child.split(":")
        memory_child(network_name, method, args)
        return {}
    supported, default_method = per_example_method_support()
    if args.per_example_method is not None and not supported:
        print("BayesianModel has no `per_example_method` argument: --per-example-method ignored.")
        args.per_example_method = None
    if args.memory:
        return run_memory(args, args.networks)
    methods = [SGD, *args.methods] if args.methods else list(METHODS)
    per_example = {
        "requested": args.per_example_method,
        "supported_by_bayesian_model": supported,
        "used": args.per_example_method if args.per_example_method is not None else (
            default_method if supported else "vectorized (tf.vectorized_map; no per_example_method argument)"
        ),
        "breakdown_path": "BayesianModel.per_example_path of the mCCAdL model",
        "vectorized_comparison": [m for m in methods if m.endswith(VECTORIZED_SUFFIX)],
    }
    results = {
        "machine": machine_info(),
        "note": args.note,
        "settings": {
            "steps": args.steps, "repeats": args.repeats, "steps_per_execution": args.steps_per_execution,
            "jit_compile": args.jit_compile, "quick": args.quick, "methods": methods,
            "memory_repeats": args.memory_repeats if args.with_memory else None,
            "distinct_batches": DISTINCT_BATCHES, "breakdown_calls": args.breakdown_calls,
            "per_example_method": per_example, "expm": args.expm, "prior": "Gaussian(1.0)", "temperature": 1.0,
        },
        "targets_definition": {
            "cheap_samplers": {"methods": list(CHEAP_SAMPLERS), "max_ratio_to_sgd": CHEAP_TARGET},
            "covariance_samplers": {"methods": list(COVARIANCE_SAMPLERS), "max_ratio_to_sgd": COVARIANCE_TARGET},
            "c_step_max_fraction_of_mccadl_step": C_STEP_TARGET_FRACTION,
        },
        "networks": {},
        "targets": [],
    }
    for name in args.networks:
        network = NETWORKS[name]
        print(f"{name}: timing {len(methods)} methods", flush=True)
        steps = timed_steps(network, args.steps, args.steps_per_execution)
        timing, models = time_methods(
            network, methods, steps=steps, repeats=args.repeats,
            steps_per_execution=args.steps_per_execution, jit_compile=args.jit_compile,
            per_example_method=args.per_example_method, expm=args.expm,
        )
        entry = {
            "timed_steps": steps, "batch_size": network.batch_size, "num_examples": network.num_examples,
            "step_size": network.step_size, "friction": network.friction, "kind": network.kind,
            "num_params": int(models[SGD].count_params()) if SGD in models else None,
            "per_example_path": per_example_path(models["mccadl"]) if "mccadl" in models else None,
            "timing": timing, "breakdown": None,
        }
        if "mccadl" in models:
            print(f"{name}: breakdown", flush=True)
            breakdown = covariance_breakdown(network, models["mccadl"], jit_compile=args.jit_compile,
                                             calls=args.breakdown_calls,
                                             vectorized_model=models.get("mccadl" + VECTORIZED_SUFFIX))
            if breakdown["per_example_path"] == "layers":
                print(f"{name}: per-layer rule costs", flush=True)
                entry["rule_costs"] = rule_costs(network, models["mccadl"], jit_compile=args.jit_compile,
                                                 calls=args.breakdown_calls)
            for method, key in (("mccadl", "fraction_of_mccadl_step"), ("ccadl_diag", "fraction_of_ccadl_step")):
                step_ms = timing[method]["median_ms_per_step"] if method in models else None
                breakdown[key] = {
                    piece: (ms / step_ms if step_ms and ms is not None else None)
                    for piece, ms in breakdown["pieces_ms"].items()
                }
            entry["breakdown"] = breakdown
        results["networks"][name] = entry
        results["targets"] += evaluate_targets(network, timing, entry["breakdown"])
        del models
        keras.backend.clear_session()  # free this network's graphs before the next
        if args.with_memory:
            print(f"{name}: peak memory", flush=True)
            entry["memory"] = measure_memory(args, name)
            results["targets"].append(memory_target_row(name, entry["memory"]))
    results["machine"]["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    table = markdown_tables(results)
    with_memory = {name: entry["memory"] for name, entry in results["networks"].items() if entry.get("memory")}
    if with_memory:
        table += "\n" + memory_table(with_memory)
    _write(Path(args.out), "results.json", results, "table.md", table)
    print(table)
    return results


if __name__ == "__main__":
    main()
