"""How many times each sampler's step writes and reads a weight-sized array, counted in its graph.

Without XLA every TensorFlow operation on a weight-sized array is a pass over memory of its own,
so the number of such operations in a step is what its cost grows with on wide layers, apart
from the forward and backward pass it shares with SGD. This traces the training step of each
method on a network of `benchmarks.step_cost` as `fit` runs it (during the first batch of a
`fit`, with the default temperature check's recorders attached) and counts, for the network's
largest weight array (Nd_max scalars), the operations of the step's graph that

* write an array of Nd_max values or more (elementwise arithmetic, casts, broadcasts, the
  matrix products whose result is a weight's gradient or statistic, the noise draw over all Nd
  and its split, concatenations);
* read one and write less (reductions: the sums behind the logged temperatures and the NaN
  guard).

The counts are of the traced graph, before TensorFlow's graph optimiser (which may merge
identical operations), at the top level: what runs inside a `tf.cond` is not counted (the
warm-up's restart and the automatic step size's measurement, which run on some steps only, and
the guarded assignment of the new values, which runs on every step), and neither are the
assignments of SGD's update, for a like comparison. Machine-independent, so the counts say where
a step's passes come from where timings on a shared machine cannot.

    python -m benchmarks.lab.step_passes --out benchmarks/results/step_passes.json [--networks emnist_mlp]
"""

from __future__ import annotations

import argparse
import collections
import sys

import keras
import numpy as np
import tensorflow as tf

from benchmarks import step_cost

METHODS = (step_cost.SGD, "sgld", "sghmc", "sgnht", "tact_hmc", "ccadl_diag", "mccadl")
#: Operations that move no data (or only read a variable's handle).
FREE = frozenset({"Const", "Identity", "ReadVariableOp", "Placeholder", "Reshape", "NoOp", "Shape",
                  "VarHandleOp", "StopGradient"})
#: Assignments (SGD's at the top level, the samplers' inside their guard's `tf.cond`): not counted.
ASSIGNMENTS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def _size(tensor) -> int | None:
    shape = tensor.shape
    return shape.num_elements() if shape.is_fully_defined() else None


def count_passes(graph, size: int) -> dict:
    """`{"writes": {op type: count}, "reads": {op type: count}, ...}` over `graph`'s top-level
    operations for arrays of `size` values or more (module doc)."""
    writes, reads = collections.Counter(), collections.Counter()

    def large(tensors):
        return any((_size(t) or 0) >= size for t in tensors)

    for op in graph.get_operations():
        if op.type in FREE or op.type in ASSIGNMENTS:
            continue
        if large(op.outputs):
            writes[op.type] += 1
        elif large(op.inputs):
            reads[op.type] += 1
    return {"writes": dict(sorted(writes.items())), "reads": dict(sorted(reads.items())),
            "total_writes": sum(writes.values()), "total_reads": sum(reads.values())}


class _TraceStep(keras.callbacks.Callback):
    """Traces the model's `train_step` at the first batch of `fit` (every recorder attached)."""

    def __init__(self, element_spec):
        super().__init__()
        self.element_spec = element_spec
        self.graph = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.graph is None:
            self.graph = tf.function(self.model.train_step).get_concrete_function(self.element_spec).graph


def method_passes(network: step_cost.Network, method: str, weights: list[np.ndarray]) -> dict:
    model = step_cost.make_model(network, method, steps_per_execution=1, jit_compile=False, weights=weights)
    dataset = step_cost.make_dataset(network)
    tracer = _TraceStep(dataset.element_spec)
    model.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0, callbacks=[tracer])
    size = max(w.size for w in weights)
    counts = count_passes(tracer.graph, size)
    keras.backend.clear_session()
    return counts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/step_passes.json")
    parser.add_argument("--networks", nargs="+", choices=sorted(step_cost.NETWORKS), default=["emnist_mlp"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args = parser.parse_args(argv)
    results = {"command": "python -m benchmarks.lab.step_passes " + " ".join(sys.argv[1:] if argv is None else argv),
               "counted": "top-level operations of the traced step on the largest weight array", "networks": {}}
    for name in args.networks:
        network = step_cost.NETWORKS[name]
        weights = step_cost.initial_weights(network)
        entry = {"largest_weight_size": int(max(w.size for w in weights)), "methods": {}}
        for method in args.methods:
            entry["methods"][method] = method_passes(network, method, weights)
            counts = entry["methods"][method]
            print(f"{name} {method}: writes {counts['total_writes']} {counts['writes']}; "
                  f"reads {counts['total_reads']} {counts['reads']}", flush=True)
        results["networks"][name] = entry
    step_cost.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
