"""Cross-replica sums, gathers and assignments for a train step run under `tf.distribute`.

A `BayesianModel` created under `strategy.scope()` runs its train step once per replica, each on
its slice of the global batch. Every replica must then apply the same update: the force is the
all-reduced sum of the replicas' forces, the per-example statistics are reduced or gathered over
the global batch, and the noise is keyed by (seed, step), so it is the same on every replica
without any communication. `CrossReplica` is the one place that talks to the strategy; on a single
device (no strategy, or one replica) every method is the identity.

Why gathers and not all-reduces inside loops: `MirroredStrategy` synchronises replicas through
`merge_call`, which TensorFlow refuses inside a `tf.while_loop` body. The adaptive Taylor method
of the C step is such a loop, so its products cannot all-reduce per iteration; the per-example
quantities it needs are gathered once per step instead (see `keras_thermo.per_example`).
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib


def _replica_context():
    """The replica context of a multi-replica strategy, or None when there is one replica."""
    context = tf.distribute.get_replica_context()  # None in a cross-replica context
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    return context


class CrossReplica:
    """Reductions across the replicas of the strategy the current train step runs under.

    Create it inside the replica function (the train step). With one replica every method returns
    its input, so single-device code pays nothing.

    Example:
        >>> import tensorflow as tf
        >>> cross = CrossReplica()            # no strategy: one replica
        >>> cross.num_replicas, float(cross.sum(tf.constant(2.0)))
        (1, 2.0)
    """

    def __init__(self):
        self._context = _replica_context()

    @property
    def num_replicas(self) -> int:
        return 1 if self._context is None else int(self._context.num_replicas_in_sync)

    @property
    def distributed(self) -> bool:
        return self._context is not None

    @property
    def multi_worker(self) -> bool:
        """Whether the replicas span several workers (MultiWorkerMirroredStrategy with a cluster)."""
        if self._context is None:
            return False
        strategy = tf.distribute.get_strategy()
        return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
            strategy.extended._in_multi_worker_mode()
        )

    def per_worker_logs(self, logs: dict) -> dict:
        """A step's logs shaped for Keras' multi-worker reduction, which averages every log along
        axis 0 and so refuses scalars (keras-team/keras#20585): each becomes a length-1 vector.
        Unchanged on one worker."""
        if not self.multi_worker:
            return logs
        return {name: tf.reshape(value, [1]) for name, value in logs.items()}

    def sum(self, value: Any) -> Any:
        """Sum over replicas of a tensor or nested structure of tensors (one all-reduce)."""
        if self._context is None:
            return value
        return self._context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    def gather_rows(self, value: tf.Tensor) -> tf.Tensor:
        """The replicas' `value`s concatenated along axis 0, in replica order (one all-gather).

        With Keras' distributed datasets replica `r` holds the `r`-th slice of the global batch,
        so gathered per-example rows are in the order of the single-device batch.
        """
        if self._context is None:
            return value
        return self._context.all_gather(value, axis=0)

    def check_even_split(self, global_batch_size: tf.Tensor, values: Any) -> Any:
        """Fails the step (at run time) unless the global batch splits evenly over the replicas.

        Returns `values` (a nest of tensors) behind the check: what is computed from them runs
        only once the check passed, so a refused batch moves no variable.

        Each replica's potential is its slice's mean loss over r, so the replicas' sum is the
        global batch's mean only when the slices are equal; TensorFlow splits a global batch of
        B examples evenly exactly when r divides B (else e.g. 8 + 7, or an empty slice).
        `global_batch_size` is the all-reduced sum of the slices, the same on every replica, so
        all replicas fail together and none is left waiting in a collective.
        """
        if self._context is None:
            return values
        replicas = self.num_replicas
        size = tf.cast(global_batch_size, tf.int64)
        check = tf.debugging.Assert(
            tf.equal(size % replicas, 0),
            [
                "BayesianModel: a global batch of",
                size,
                f"examples does not split evenly over the {replicas} replicas of the tf.distribute "
                f"strategy; every batch, the last of an epoch included, must hold a multiple of "
                f"{replicas} examples (a batch_size and a number of training examples that are "
                f"multiples of {replicas}, or drop_remainder=True in a tf.data pipeline).",
            ],
            name="check_even_split",
        )
        with tf.control_dependencies([check]):
            return tf.nest.map_structure(tf.identity, values)

    def is_first_local_replica(self) -> tf.Tensor:
        """True on the first replica of this worker (where per-worker callbacks' buffers are
        written); always True on one device."""
        if self._context is None:
            return tf.constant(True)
        local_replicas = len(tf.distribute.get_strategy().extended.worker_devices)
        replica = tf.convert_to_tensor(self._context.replica_id_in_sync_group)
        return tf.equal(replica % local_replicas, 0)

    def assign(self, variables, values) -> None:
        """`variable.assign(value)` for each pair, on every replica's copy.

        Under a strategy the values must already be identical on all replicas (they are: every
        input to the update was reduced or keyed by step). Each replica then writes its own
        copy, as Keras' optimizers do, with no communication.
        """
        variables, values = list(variables), list(values)
        if self._context is None:
            for variable, value in zip(variables, values):
                variable.assign(value)
            return

        def assign_on_each_device(strategy, pairs):
            for variable, value in pairs:
                strategy.extended.update(
                    variable, lambda var, new: var.assign(new), args=(value,), group=False
                )

        pairs = [(_tf_variable(variable), value) for variable, value in zip(variables, values)]
        self._context.merge_call(assign_on_each_device, args=(pairs,))


# Group keys handed to single-worker MirroredStrategy objects by `isolate_collectives`: far above
# the small keys TensorFlow starts every strategy at (1, 2, ...), one block per strategy.
_GROUP_KEY_BASE = 1 << 20
_GROUP_KEY_STRIDE = 1 << 8
_group_key_blocks = itertools.count(0)
_isolation_lock = threading.Lock()
_ISOLATED_ATTRIBUTE = "_keras_thermo_isolated_collectives"


def isolate_collectives(strategy) -> bool:
    """Gives a single-worker `MirroredStrategy` collective keys no other strategy in the process uses.

    Every `MirroredStrategy` numbers its collectives from the same start: group key 1, instance
    keys 100, 101, ... counting up with each step. The process keeps one collective runtime,
    which remembers the kind (all-reduce, gather), dtype and shape registered for each
    (group key, instance key). A second strategy over the same devices (a re-run notebook cell,
    a second test) reuses the first one's keys for other collectives, and the runtime refuses
    them, e.g. `InternalError: Collective instance 101 expected type 0 and data_type 1 but got
    type 2 and data_type 3` at mCCAdL's all-gather. Here the strategy's collective ops are
    rebuilt on a group key of their own, so its instance keys start a fresh table.

    Done once per strategy, before its collectives are traced for a `BayesianModel`; functions
    traced earlier keep the keys they captured (still distinct from every other strategy's).
    Strategies spanning several workers are left alone: their keys must agree across processes.
    Returns whether the strategy's keys were changed.
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return False
    extended = strategy.extended
    collective_ops = getattr(extended, "_collective_ops", None)
    if not isinstance(collective_ops, cross_device_ops_lib.CollectiveAllReduce):
        return False  # a fallback (mixed CPU and GPU devices) that uses no collective keys
    with _isolation_lock:
        if getattr(extended, _ISOLATED_ATTRIBUTE, False):
            return False
        extended._collective_key_base = _GROUP_KEY_BASE + _GROUP_KEY_STRIDE * next(_group_key_blocks)
        extended._collective_ops = extended._make_collective_ops_with_fallbacks()
        if extended._cross_device_ops is collective_ops:  # the default: collectives for everything
            extended._cross_device_ops = extended._collective_ops
        setattr(extended, _ISOLATED_ATTRIBUTE, True)
    return True


def replica_local_variable(initial_value, name: str) -> tf.Variable:
    """A non-trainable variable with one independent copy per replica of the current strategy.

    Each replica writes its own copy inside the train step with no synchronisation (a mirrored
    variable refuses such writes); reading it outside the step returns the first replica's copy.
    Outside a strategy it is a plain variable. Used for buffers and flags that callbacks read.
    """
    return tf.Variable(
        initial_value,
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def is_distributed(variable) -> bool:
    """Whether `variable` has per-replica copies (it then supports only whole assignments)."""
    return isinstance(variable, tf.distribute.DistributedValues)


def _tf_variable(variable):
    """The `tf.Variable` behind a Keras variable (what `strategy.extended.update` expects)."""
    return getattr(variable, "value", variable) if hasattr(variable, "_value") else variable


def _replica_spec(spec):
    """One replica's spec from a distributed dataset's element spec (a per-replica spec holds
    one spec per local replica; they differ at most in the batch size)."""
    value_specs = getattr(spec, "_value_specs", None)
    return value_specs[0] if value_specs else spec


def batch_spec(epoch_iterator):
    """The structure of `tf.TensorSpec`s of one replica's batch, read from the dataset that a
    Keras epoch iterator distributes, without creating an iterator over it.

    Creating an iterator draws the next order of a reshuffled `tf.data` pipeline (and of numpy
    inputs fitted with `shuffle=True`), so a batch drawn only to learn shapes would make epoch e
    see the order of epoch e + 1. Returns None when the spec is not a structure of plain
    tensor specs (the caller then falls back to drawing a batch).
    """
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is None:
        return None
    spec = tf.nest.map_structure(_replica_spec, dataset.element_spec)
    if not all(isinstance(leaf, tf.TensorSpec) for leaf in tf.nest.flatten(spec)):
        return None
    return spec


def symbolic_inputs(dataset: tf.data.Dataset):
    """Symbolic model inputs (`keras.KerasTensor`s) shaped like the `x` of `dataset`'s elements,
    or None when they are not plain tensors. Reads the element spec only, so, unlike drawing a
    first batch, it leaves the order of a reshuffled pipeline's epochs as it was."""
    import keras  # noqa: PLC0415 (keras imports this module's users, not the other way)
    inputs, _, _ = keras.utils.unpack_x_y_sample_weight(dataset.element_spec)
    leaves = tf.nest.flatten(inputs)
    if not leaves or not all(isinstance(leaf, tf.TensorSpec) for leaf in leaves):
        return None
    return tf.nest.map_structure(lambda leaf: keras.KerasTensor(leaf.shape, leaf.dtype.name), inputs)


def check_even_batches(replicas: int, x, batch_size=None, validation_split=0.0, steps_per_epoch=None) -> None:
    """Refuses, before `fit` starts, global batches that cannot split evenly over `replicas`.

    Checks what is known up front: `batch_size` and the last partial batch of array inputs, and
    the static batch size of a `tf.data` pipeline batched with `drop_remainder=True`. Batches
    whose size shows only at run time are checked in the train step (`check_even_split`).
    """
    if replicas <= 1:
        return
    allowed = f"a multiple of the {replicas} replicas of the tf.distribute strategy"
    if isinstance(x, tf.data.Dataset):
        sizes = {
            leaf.shape[0]
            for leaf in tf.nest.flatten(x.element_spec)
            if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank and leaf.shape[0] is not None
        }
        for size in sizes:
            if size % replicas:
                raise ValueError(
                    f"The tf.data pipeline's batches hold {size} examples; under a strategy each "
                    f"global batch must be {allowed}, so that every replica gets an equal slice. "
                    f"Batch it with a multiple of {replicas}."
                )
        return
    leaves = tf.nest.flatten(x)
    if not leaves or not all(hasattr(leaf, "shape") and len(leaf.shape) > 0 for leaf in leaves):
        return  # a generator or PyDataset: checked step by step
    if batch_size is None:
        batch_size = 32  # Keras' default for array inputs
    if batch_size % replicas:
        raise ValueError(
            f"`batch_size` must be {allowed}, so that every replica gets an equal slice of each "
            f"global batch; got batch_size={batch_size}."
        )
    if steps_per_epoch is not None:
        return  # an epoch may stop before the last partial batch: checked step by step
    num_examples = int(leaves[0].shape[0])
    if validation_split:
        num_examples = int(math.floor(num_examples * (1.0 - validation_split)))  # Keras' split point
    remainder = num_examples % batch_size
    if remainder % replicas:
        raise ValueError(
            f"The last batch of each epoch would hold {remainder} examples ({num_examples} "
            f"training examples in batches of {batch_size}), which is not {allowed}. Use a "
            f"`batch_size` that divides {num_examples}, or a number of training examples whose "
            f"remainder by `batch_size` is a multiple of {replicas}."
        )
