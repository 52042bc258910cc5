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
quantities it needs are gathered once per step instead (see `keras_thermo.grads`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


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
