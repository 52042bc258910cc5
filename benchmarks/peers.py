"""Step cost against other SG-MCMC libraries: an MLP 784-w-w-10 on random data, swept over the
width w and the batch size, each library's step run its own way.

    python -m benchmarks.peers --out benchmarks/results/peers [--cells 128x128 2048x128 512x32 512x512]
        [--libraries keras blackjax posteriors] [--methods ...] [--steps 200] [--repeats 5] [--jit-compile]
    python -m benchmarks.peers --table-from benchmarks/results/peers/peers.json

Methods (the same MLP, ReLU hidden layers, sparse softmax cross-entropy, N = 60,000 so that the
likelihood weight is realistic, a N(0, 1) prior on every weight):

- `keras`, in one process (TensorFlow, 2 threads; `fit` on a `tf.data` pipeline of 10 distinct
  random batches, repeated, `steps_per_execution=10`):
  `keras_sgd` (`keras.optimizers.SGD`, the framework's floor), `keras_sgld_handwritten` (SGLD as
  a user would write it as a Keras `train_step`: tape, gradient of `N * mean loss + prior`, one
  `tf.random.normal` and one `assign_add` per weight; the baseline every ratio is taken against),
  `keras_uniform_floor` (the hand-written step with its normals replaced by the Philox uniforms
  an exact normal draw is made from: a floor for any SGLD step on TensorFlow's generators),
  and keras_thermo's `kt_sgld`, `kt_sghmc`, `kt_sgnht`, `kt_ccadl`, `kt_mccadl` (a given step
  size, everything else at its default, the default temperature check included). With
  `--jit-compile` every Keras method's step is compiled by XLA (`compile(jit_compile=True)`).
- `blackjax` (optional: JAX, jitted, the steps under `jax.lax.scan`): `blackjax_sgld` and
  `blackjax_sghmc` (blackjax's SGHMC diffusion with the momentum carried across steps, one
  gradient per step, as keras_thermo's SGHMC), with `blackjax.sgmcmc.gradients.grad_estimator`.
- `posteriors` (optional: PyTorch, eager, `torch.set_num_threads(2)`): `posteriors_sgld`,
  `posteriors_sghmc`.

Timing. Each library runs in its own process (`--worker`), once per repetition, the libraries in
an order rotated every repetition. A process warms its methods up (tracing, compilation, first
execution; untimed), then times `--steps` steps of each (the keras methods in an order rotated
every repetition, the garbage collector off in the timed region) and prints milliseconds per
step. Reported per cell and method: the median over repetitions, and the median of the ratio to
`keras_sgld_handwritten` (within the same process for keras_thermo's methods; across processes
of the same repetition for the peers). A library that is not installed is reported as skipped;
`pip install -e '.[peers]'` (after a CPU build of PyTorch for posteriors, docs/benchmarks.md)
installs them.

Writes `<out>/peers.json` (every repetition's figures, the medians, the environment) and
`<out>/table.md`, both rewritten after every repetition (a run stopped early keeps what it
measured; each figure says over how many repetitions it is the median).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

NUM_EXAMPLES = 60_000
INPUTS = 784
CLASSES = 10
PRIOR_STD = 1.0
DISTINCT_BATCHES = 10
STEPS_PER_EXECUTION = 10
THREADS = 2
#: h for the momentum samplers; SGLD's eps = h^2 (the same force step, `lr = h^2 N`). Small, so that no
#: chain diverges on random data over the timed steps (the cost of a step does not depend on it).
STEP_SIZE = 1e-5
#: The width x batch cells of the sweep.
CELLS = ("128x128", "512x32", "512x512", "2048x128")
LIBRARIES = ("keras", "blackjax", "posteriors")
KERAS_METHODS = ("keras_sgd", "keras_uniform_floor", "keras_sgld_handwritten", "kt_sgld", "kt_sghmc", "kt_sgnht", "kt_ccadl", "kt_mccadl")
BASELINE = "keras_sgld_handwritten"
PEER_METHODS = ("blackjax_sgld", "blackjax_sghmc", "posteriors_sgld", "posteriors_sghmc")
ALL_METHODS = KERAS_METHODS + PEER_METHODS


def parse_cell(text: str) -> tuple[int, int]:
    """`"WIDTHxBATCH"` -> (width, batch), with an error naming the value."""
    try:
        width, batch = (int(part) for part in text.lower().split("x"))
    except ValueError:
        width = batch = 0
    if width <= 0 or batch <= 0:
        raise argparse.ArgumentTypeError(f"a cell is WIDTHxBATCH with positive integers, e.g. 512x32; got {text!r}")
    return width, batch


def random_batches(width_batch: tuple[int, int], seed: int = 0):
    """`DISTINCT_BATCHES` random batches `(x [B, 784] float32, y [B] int32)` as numpy arrays."""
    import numpy as np  # noqa: PLC0415

    _, batch = width_batch
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(DISTINCT_BATCHES, batch, INPUTS)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(DISTINCT_BATCHES, batch)).astype(np.int32)
    return x, y


# --------------------------------------------------------------------------------------------
# keras: Keras SGD, the hand-written SGLD step, keras_thermo's samplers


def keras_worker(width: int, batch: int, steps: int, repeat: int, methods=KERAS_METHODS, jit_compile: bool = False) -> dict:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_inter_op_parallelism_threads(THREADS)
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    import keras_thermo as kt  # noqa: PLC0415

    x, y = random_batches((width, batch))
    # Autotuning off: its polling held up the end of each `fit` (wall times snapped to 0.31, 0.63,
    # 1.27, 2.55 s; `benchmarks.step_cost.make_dataset`). The batches are cached: nothing to tune.
    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache().repeat().with_options(options)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def net():
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((INPUTS,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(CLASSES),
        ])

    class HandwrittenSGLD(keras.Model):
        """SGLD as a user writes it in a `train_step` (the baseline)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.eps = STEP_SIZE**2

        def call(self, inputs, training=False):
            return self.inner(inputs, training=training)

        def train_step(self, data):
            inputs, labels = data
            weights = self.trainable_variables
            with tf.GradientTape() as tape:
                mean_loss = loss(labels, self(inputs, training=True))
                prior = tf.add_n([tf.reduce_sum(tf.square(w)) for w in weights]) / (2 * PRIOR_STD**2)
                potential = NUM_EXAMPLES * mean_loss + prior
            for w, g, r in zip(weights, tape.gradient(potential, weights), self.noise(weights)):
                w.assign_add(-0.5 * self.eps * g + self.eps**0.5 * r)
            return {"loss": mean_loss}

        def noise(self, weights):
            return [tf.random.normal(tf.shape(w)) for w in weights]

    class UniformFloor(HandwrittenSGLD):
        """The hand-written step with its normals replaced by the Philox uniforms they would be
        made from (one draw of all Nd, split per weight): not a sampler (uncentred noise), a
        floor. An exact normal draw on TensorFlow's generators takes at least these random bits,
        so a TensorFlow SGLD step in `fit` costs about this much or more."""

        def __init__(self, inner):
            super().__init__(inner)
            self._step = tf.Variable(0, dtype=tf.int32, trainable=False)  # the draws' counter

        def noise(self, weights):
            sizes = [int(np.prod(w.shape)) for w in weights]
            uniforms = tf.random.stateless_uniform([sum(sizes)], seed=[0, self._step], alg="philox")
            self._step.assign_add(1)
            return [tf.reshape(u, w.shape) for u, w in zip(tf.split(uniforms, sizes), weights)]

    samplers = {
        "kt_sgld": lambda: kt.samplers.SGLD(STEP_SIZE**2),
        "kt_sghmc": lambda: kt.samplers.SGHMC(STEP_SIZE),
        "kt_sgnht": lambda: kt.samplers.SGNHT(STEP_SIZE),
        "kt_ccadl": lambda: kt.samplers.CCAdL(STEP_SIZE),
        "kt_mccadl": lambda: kt.samplers.MCCAdL(STEP_SIZE),
    }
    models = {}
    for method in methods:
        if method == "keras_sgd":
            model = net()
            model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=loss, steps_per_execution=STEPS_PER_EXECUTION,
                          jit_compile=jit_compile)
        elif method in (BASELINE, "keras_uniform_floor"):
            model = (HandwrittenSGLD if method == BASELINE else UniformFloor)(net())
            model.compile(loss=loss, steps_per_execution=STEPS_PER_EXECUTION, jit_compile=jit_compile)
        else:
            model = kt.BayesianModel(net(), samplers[method](), num_examples=NUM_EXAMPLES,
                                     prior=kt.priors.Gaussian(PRIOR_STD), seed=0)
            model.compile(loss=loss, steps_per_execution=STEPS_PER_EXECUTION, jit_compile=jit_compile)
        models[method] = model

    if any(getattr(model, "jit_compile", jit_compile) != jit_compile for model in models.values()):
        raise RuntimeError(f"a Keras method was not compiled with jit_compile={jit_compile}")

    def fit(model, count):
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        try:
            model.fit(dataset, epochs=1, steps_per_epoch=count, verbose=0)
        finally:
            seconds = time.perf_counter() - start
            gc.enable()
        return seconds

    warm = 2 * STEPS_PER_EXECUTION
    for model in models.values():  # tracing and compilation, then first-execution costs
        fit(model, warm)
        fit(model, warm)
    order = list(models)
    shift = repeat % len(order)
    order = order[shift:] + order[:shift]
    return {method: 1e3 * fit(models[method], steps) / steps for method in order}


# --------------------------------------------------------------------------------------------
# blackjax (JAX)


def blackjax_worker(width: int, batch: int, steps: int, repeat: int, methods=None) -> dict:
    import blackjax  # noqa: PLC0415
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    x, y = random_batches((width, batch))
    x, y = jnp.asarray(x), jnp.asarray(y)
    sizes = [(INPUTS, width), (width, width), (width, CLASSES)]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    params = [
        {"kernel": jax.random.normal(k, shape) * (2.0 / sum(shape)) ** 0.5, "bias": jnp.zeros(shape[1])}
        for k, shape in zip(keys, sizes)
    ]

    def logits(position, inputs):
        hidden = inputs
        for layer in position[:-1]:
            hidden = jax.nn.relu(hidden @ layer["kernel"] + layer["bias"])
        return hidden @ position[-1]["kernel"] + position[-1]["bias"]

    def logprior(position):
        return -0.5 * sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(position)) / PRIOR_STD**2

    def loglikelihood(position, datum):  # one example: grad_estimator maps it over the minibatch
        inputs, label = datum
        return jax.nn.log_softmax(logits(position, inputs[None]))[0, label]

    gradients = blackjax.sgmcmc.gradients.grad_estimator(logprior, loglikelihood, NUM_EXAMPLES)
    sgld = blackjax.sgld(gradients)
    # SGHMC as keras_thermo (and Chen et al.) run it: the momentum carried from step to step, one
    # gradient per step, through blackjax's own SGHMC diffusion. `blackjax.sghmc(...).step`
    # redraws the momentum at every call; with one integration step the gradient it computes
    # feeds only the momentum it then drops (blackjax's `diffusions.sghmc` moves the position
    # with the momentum it was given), and XLA removes it: that step moves the weights by noise
    # alone and costs no gradient.
    sghmc = blackjax.sgmcmc.diffusions.sghmc()

    def sgld_step(carry, key, minibatch):
        return sgld.step(key, carry, minibatch, STEP_SIZE**2)

    def sghmc_step(carry, key, minibatch):
        position, momentum = carry
        return sghmc(key, position, momentum, gradients(position, minibatch), STEP_SIZE**2)

    kernels = {
        "blackjax_sgld": (sgld_step, lambda position: position),
        "blackjax_sghmc": (sghmc_step, lambda position: (position, jax.tree.map(jnp.zeros_like, position))),
    }

    def run(method, count):
        step, init = kernels[method]

        @jax.jit
        def chain(position, key):
            def one(carry, inputs):
                index, step_key = inputs
                minibatch = (x[index % DISTINCT_BATCHES], y[index % DISTINCT_BATCHES])
                return step(carry, step_key, minibatch), None

            carry, _ = jax.lax.scan(one, init(position), (jnp.arange(count), jax.random.split(key, count)))
            return carry

        return chain

    results = {}
    for method in [m for m in kernels if methods is None or m in methods]:
        chain = run(method, steps)
        jax.block_until_ready(chain(params, jax.random.PRNGKey(1)))  # compilation and first execution
        jax.block_until_ready(chain(params, jax.random.PRNGKey(2)))
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        jax.block_until_ready(chain(params, jax.random.PRNGKey(3 + repeat)))
        results[method] = 1e3 * (time.perf_counter() - start) / steps
        gc.enable()
    return results


# --------------------------------------------------------------------------------------------
# posteriors (PyTorch)


def posteriors_worker(width: int, batch: int, steps: int, repeat: int, methods=None) -> dict:
    import posteriors  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    x, y = random_batches((width, batch))
    batches = [(torch.from_numpy(x[i]), torch.from_numpy(y[i]).long()) for i in range(DISTINCT_BATCHES)]
    net = torch.nn.Sequential(
        torch.nn.Linear(INPUTS, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, CLASSES),
    )
    start_params = {name: p.detach().clone() for name, p in net.named_parameters()}

    def log_posterior(params, minibatch):
        inputs, labels = minibatch
        output = torch.func.functional_call(net, params, (inputs,))
        log_likelihood = -torch.nn.functional.cross_entropy(output, labels)  # per-example mean
        log_prior = -0.5 * sum(torch.sum(p**2) for p in params.values()) / PRIOR_STD**2
        # posteriors' samplers take the log posterior per example: N times it is log p(theta | D).
        return log_likelihood + log_prior / NUM_EXAMPLES, output

    # The per-example log posterior with temperature 1 / N, as posteriors recommends.
    transforms = {
        "posteriors_sgld": posteriors.sgmcmc.sgld.build(log_posterior, lr=STEP_SIZE**2 * NUM_EXAMPLES / 2,
                                                         temperature=1.0 / NUM_EXAMPLES),
        "posteriors_sghmc": posteriors.sgmcmc.sghmc.build(log_posterior, lr=STEP_SIZE * NUM_EXAMPLES**0.5,
                                                           temperature=1.0 / NUM_EXAMPLES),
    }
    results = {}
    for method, transform in transforms.items():
        if methods is not None and method not in methods:
            continue
        state = transform.init({k: v.clone() for k, v in start_params.items()})
        for i in range(2 * STEPS_PER_EXECUTION):  # warm-up
            state, _ = transform.update(state, batches[i % DISTINCT_BATCHES])
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        for i in range(steps):
            state, _ = transform.update(state, batches[i % DISTINCT_BATCHES])
        results[method] = 1e3 * (time.perf_counter() - start) / steps
        gc.enable()
    return results


WORKERS = {"keras": keras_worker, "blackjax": blackjax_worker, "posteriors": posteriors_worker}
REQUIRES = {"keras": "keras_thermo", "blackjax": "blackjax", "posteriors": "posteriors"}


def installed(library: str) -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec(REQUIRES[library]) is not None


def run_worker(library: str, width: int, batch: int, steps: int, repeat: int, methods, jit_compile: bool = False) -> dict:
    """One worker process; returns its `{method: ms per step}` or `{"error": ...}`."""
    command = [sys.executable, "-m", "benchmarks.peers", "--worker", library, "--cells", f"{width}x{batch}",
               "--steps", str(steps), "--repeat-index", str(repeat), "--methods", *methods]
    if jit_compile:
        command.append("--jit-compile")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def summarize(repetitions: list[dict]) -> dict:
    """Per method: the median ms per step, and the median ratio to the baseline of the same
    repetition."""
    timed = {m for r in repetitions for m in r if isinstance(r[m], float)}
    methods = [m for m in ALL_METHODS if m in timed] + sorted(timed - set(ALL_METHODS))
    summary = {}
    for method in methods:
        times = [r[method] for r in repetitions if isinstance(r.get(method), float)]
        ratios = [r[method] / r[BASELINE] for r in repetitions
                  if isinstance(r.get(method), float) and isinstance(r.get(BASELINE), float)]
        summary[method] = {
            "ms_per_step": statistics.median(times),
            "ratio_to_handwritten_sgld": statistics.median(ratios) if ratios else None,
            "repetitions": len(times),
        }
    return summary


def markdown(report: dict) -> str:
    cells = list(report["cells"])
    timed = {m for cell in cells for m in report["cells"][cell]["summary"]}
    methods = [m for m in ALL_METHODS if m in timed] + sorted(timed - set(ALL_METHODS))
    lines = [
        "Milliseconds per step (median over repetitions), and in brackets the median ratio to the "
        "hand-written Keras SGLD step of the same repetition.",
        "",
        "| method | " + " | ".join(f"width {c.split('x')[0]}, batch {c.split('x')[1]}" for c in cells) + " |",
        "|---|" + "---:|" * len(cells),
        "| repetitions | " + " | ".join(
            str(max((f["repetitions"] for f in report["cells"][c]["summary"].values()), default=0)) for c in cells
        ) + " |",
    ]
    for method in methods:
        row = []
        for cell in cells:
            figures = report["cells"][cell]["summary"].get(method)
            if figures is None:
                row.append(report["cells"][cell]["skipped"].get(method.split("_")[0], "n/a"))
                continue
            ratio = figures["ratio_to_handwritten_sgld"]
            row.append(f"{figures['ms_per_step']:.3g}" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    skipped = sorted({v for c in cells for v in report["cells"][c]["skipped"].values()})
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/peers")
    parser.add_argument("--cells", nargs="+", default=list(CELLS), type=str)
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per method and repetition")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", nargs="+", default=list(ALL_METHODS), choices=ALL_METHODS,
                        help=f"the methods to time (default all; {BASELINE} is always timed, every ratio is to it)")
    parser.add_argument("--table-from", metavar="PEERS_JSON",
                        help="only rewrite table.md beside an earlier run's peers.json (and print it)")
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile every Keras method's step with XLA (`compile(jit_compile=True)`), as blackjax's is")
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    parser.add_argument("--repeat-index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table_from:
        table = markdown(json.loads(Path(args.table_from).read_text()))
        (Path(args.table_from).parent / "table.md").write_text(table)
        print(table, end="")
        return 0
    cells = [parse_cell(c) for c in args.cells]
    if args.steps <= 0 or args.repeats <= 0:
        parser.error(f"--steps and --repeats must be positive, got {args.steps} and {args.repeats}")
    if args.worker:
        width, batch = cells[0]
        methods = [m for m in ALL_METHODS if m in args.methods or m == BASELINE]
        options = {}
        if args.worker == "keras":
            methods = [m for m in methods if m in KERAS_METHODS]
            options = {"jit_compile": args.jit_compile}
        print(json.dumps(WORKERS[args.worker](width, batch, args.steps, args.repeat_index, methods, **options)), flush=True)
        return 0

    libraries = [lib for lib in args.libraries if lib == "keras" or any(m.startswith(lib) for m in args.methods)]
    available = [lib for lib in libraries if installed(lib)]
    missing = {lib: f"{lib} not installed (pip install -e '.[peers]')" for lib in libraries if lib not in available}
    report = {
        "command": "python -m benchmarks.peers " + " ".join(sys.argv[1:] if argv is None else argv),
        "protocol": {
            "net": f"MLP {INPUTS}-w-w-{CLASSES}, ReLU, sparse softmax cross-entropy, N = {NUM_EXAMPLES}, prior N(0, {PRIOR_STD}^2)",
            "step_size": f"h = {STEP_SIZE} (SGLD eps = h^2), everything else at each library's default",
            "keras": f"fit on {DISTINCT_BATCHES} distinct random batches repeated, steps_per_execution={STEPS_PER_EXECUTION}, "
                     f"{THREADS} TensorFlow threads" + (", jit_compile=True (XLA)" if args.jit_compile else ""),
            "blackjax": "jax.jit of jax.lax.scan over the steps",
            "posteriors": f"eager PyTorch, torch.set_num_threads({THREADS})",
            "steps": args.steps, "repeats": args.repeats,
        },
        "environment": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "cells": {},
    }
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for width, batch in cells:
        name = f"{width}x{batch}"
        repetitions = []
        report["cells"][name] = {"repetitions": repetitions}
        for repeat in range(args.repeats):
            shift = repeat % len(available)
            merged = {}
            for library in available[shift:] + available[:shift]:
                figures = run_worker(library, width, batch, args.steps, repeat, args.methods, args.jit_compile)
                if "error" in figures:
                    missing[library] = f"{library} failed: {figures['error']}"
                    print(f"{name} repeat {repeat}: {library} failed: {figures['error']}", flush=True)
                    continue
                merged.update(figures)
            repetitions.append(merged)
            print(f"{name} repeat {repeat}: " + ", ".join(f"{m} {v:.3g}" for m, v in merged.items()), flush=True)
            # Written after every repetition, so a run stopped early keeps what it measured.
            report["cells"][name].update(summary=summarize(repetitions), skipped=dict(missing))
            report["seconds"] = time.perf_counter() - start
            (out / "peers.json").write_text(json.dumps(report, indent=1))
            (out / "table.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
