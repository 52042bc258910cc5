"""The layer-rule engine: per-example gradient statistics from one forward and one backward pass.

For every layer whose weight is shared over `T` positions (`T = 1` for `Dense`, the output
pixels of a convolution, the time steps of a recurrent cell) example i's gradient is
`A_i^T Delta_i`, with `A_i` the layer's input rows and `Delta_i` the gradient of example i's loss
at the layer's pre-activation. The engine

1. replaces, for the duration of one forward pass, the `call` of every layer that owns trainable
   variables by its rule's `forward`, which computes the same outputs while saving the input
   rows and handing the pre-activation to the tape (`Call.save`, `Call.watch`). Because the
   hook sits on the layer object, Sequential, functional and subclassed models all work, and a
   layer used twice records two calls;
2. back-propagates every example's own output gradient (`losses.output_gradients`) to all
   watched tensors in one backward pass: example i's loss depends only on row i, so the
   gradient of the sum at row i is `Delta_i`;
3. gathers the recorded tensors over the replicas of a `tf.distribute` strategy (one all-gather
   per dtype) and lets each rule turn its calls into column blocks
   (`keras_thermo.per_example.blocks`), in the cheaper of the factor and the explicit form;
4. returns a `LayerStatistics` over the blocks.

The engine knows no layer's maths: rules (`keras_thermo.per_example.rules`) are registered by
layer type (`register`). A layer is handled by the rule of the nearest registered class in its
MRO, provided it does not override that class's `call`. Layers without trainable variables run
unchanged and are differentiated through (activations, pooling, `Flatten`, `Reshape`, frozen
layers, a frozen `BatchNormalization` in inference mode); a layer without trainable variables of
its own is entered (nested models, custom blocks). A layer that owns trainable variables and has
no rule makes the whole network fall back to the vectorized path (`incompatibility` says why).

Example:
    >>> import keras, tensorflow as tf
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> stats = layer_statistics(net, "mse", tf.random.normal([5, 3]), tf.zeros([5, 2]))
    >>> stats.diagonal_covariance().shape   # 3 * 2 kernel + 2 bias entries
    TensorShape([8])
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from keras_thermo.per_example import checks, losses
from keras_thermo.per_example import rules as _rules  # noqa: F401 (registers every rule)
from keras_thermo.per_example.blocks import ZeroBlock
from keras_thermo.per_example.registry import Call, LayerRule, rule_for
from keras_thermo.per_example.statistics import LayerRows, LayerStatistics

# Layers that call their sublayers on reshaped batches (the sublayer's rows are not examples).
_BATCH_RESHAPING_WRAPPERS = (keras.layers.TimeDistributed,)


def _own_trainable_variables(layer: keras.layers.Layer) -> list:
    """The trainable variables `layer` created itself (not those of its sublayers)."""
    if not layer.trainable:
        return []
    own = getattr(layer, "_trainable_variables", None)
    if own is None:
        nested = {id(v) for sub in _sublayers(layer) for v in sub.trainable_variables}
        return [v for v in layer.trainable_variables if id(v) not in nested]
    return [v for v in own if v.trainable]


def _sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    if hasattr(layer, "_flatten_layers"):
        return list(layer._flatten_layers(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []))


def hooked_layers(net: keras.layers.Layer) -> tuple[list[tuple[keras.layers.Layer, LayerRule]], str | None]:
    """The layers the engine hooks, with their rules, or the reason it cannot handle `net`."""
    found: list[tuple[keras.layers.Layer, LayerRule]] = []
    seen: set[int] = set()

    def visit(layer) -> str | None:
        if id(layer) in seen or not layer.trainable_variables:
            return None
        seen.add(id(layer))
        if isinstance(layer, _BATCH_RESHAPING_WRAPPERS):
            return (
                f"layer '{layer.name}' ({type(layer).__name__}) calls its layer on a reshaped "
                "batch, whose rows are not examples"
            )
        rule = rule_for(layer)
        if rule is not None:
            reason = rule.unsupported(layer)
            if reason is not None:
                return f"layer '{layer.name}' ({type(layer).__name__}): {reason}"
            found.append((layer, rule))
            return None
        if _own_trainable_variables(layer):
            return (
                f"layer '{layer.name}' ({type(layer).__name__}) has trainable variables and no "
                "per-example rule"
            )
        for sub in _sublayers(layer):
            reason = visit(sub)
            if reason is not None:
                return reason
        return None

    reason = visit(net)
    if reason is None:
        covered = [id(v) for layer, _ in found for v in layer.trainable_variables]
        if len(covered) != len(set(covered)):
            reason = "a trainable variable is shared by two layers with rules"
    return found, reason


def incompatibility(net: keras.layers.Layer) -> str | None:
    """Why the engine cannot give `net`'s per-example statistics (one line), or None.

    Example:
        >>> import keras
        >>> incompatibility(keras.Sequential([keras.Input((4, 1)), keras.layers.Conv1D(2, 3)])) is None
        True
    """
    try:
        checks.check_per_example_compatible(net, recurrent_loops=True)
    except ValueError as error:
        return " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    if not net.trainable_variables:
        return (
            f"model '{net.name}' has no trainable variables (build it, e.g. with a keras.Input, "
            "before asking for per-example gradients)"
        )
    return hooked_layers(net)[1]


class _Hooks:
    """Replaces the hooked layers' `call` during one forward pass (restored on exit)."""

    def __init__(self, layers: list[tuple[keras.layers.Layer, LayerRule]], tape: tf.GradientTape):
        self._layers = layers
        self._tape = tape
        self.calls: list[tuple[keras.layers.Layer, LayerRule, Call]] = []

    def __enter__(self):
        # An instance attribute shadows the class's `call` for this object only; one the layer
        # already had (a user's own patch) is put back on exit.
        self._previous = {id(layer): vars(layer).get("call") for layer, _ in self._layers}
        for layer, rule in self._layers:
            object.__setattr__(layer, "call", self._hooked(layer, rule))
        return self

    def _hooked(self, layer, rule):
        def call(*args, **kwargs):
            record = Call(self._tape)
            outputs = rule.forward(layer, record, *args, **kwargs)
            self.calls.append((layer, rule, record))
            return outputs

        return call

    def __exit__(self, *exc):
        for layer, _ in self._layers:
            previous = self._previous.get(id(layer))
            if previous is not None:
                object.__setattr__(layer, "call", previous)
            elif "call" in vars(layer):
                object.__delattr__(layer, "call")
        return False


def _gather(records: list[dict[str, tf.Tensor]], cross) -> list[dict[str, tf.Tensor]]:
    """Every recorded tensor over the global batch: one all-gather per dtype."""
    if cross is None or not cross.distributed:
        return records
    keys = [(index, name) for index, record in enumerate(records) for name in record]
    by_dtype: dict[tf.DType, list] = {}
    for key in keys:
        by_dtype.setdefault(records[key[0]][key[1]].dtype, []).append(key)
    gathered = [dict() for _ in records]
    for dtype, group in by_dtype.items():
        tensors = [records[i][name] for i, name in group]
        if not all(t.shape[1:].is_fully_defined() for t in tensors):
            for (i, name), tensor in zip(group, tensors):
                gathered[i][name] = cross.gather_rows(tensor)
                gathered[i][name].set_shape([None] + tensor.shape[1:].as_list())
            continue
        widths = [int(t.shape[1:].num_elements()) for t in tensors]
        flat = [tf.reshape(t, [-1, width]) for t, width in zip(tensors, widths)]
        pieces = tf.split(cross.gather_rows(tf.concat(flat, axis=1)), widths, axis=1)
        for (i, name), tensor, piece in zip(group, tensors, pieces):
            gathered[i][name] = tf.reshape(piece, [-1, *tensor.shape[1:].as_list()])
    return gathered


class Recording:
    """Records a forward pass of `net` for the engine: `with Recording(net): y_pred = net(x)`.

    Inside the block the hooked layers record their calls (and a tape records the pass), so any
    code that runs `net` once, for example a train step computing its loss and its own
    gradients under another tape, shares that forward pass with the per-example statistics.
    Afterwards `statistics(...)` (or `calls(...)`) runs the one backward pass they need.

    The same backward pass can also give the gradient of the batch's summed loss with respect to
    `variables` (`statistics_and_gradients`): a train step then needs no backward pass of its
    own for the loss term.

    Args:
        net: a Keras model for which `incompatibility(net)` is None.
        variables: variables (for example `net.trainable_variables`) whose gradients
            `statistics_and_gradients` returns; the tape watches them from the start.

    Raises:
        ValueError: the engine does not apply to `net` (the reason).

    Example:
        >>> import keras, tensorflow as tf
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> x, y = tf.random.normal([5, 3]), tf.zeros([5, 2])
        >>> with Recording(net) as recording:
        ...     y_pred = net(x, training=True)
        >>> recording.statistics("mse", y, y_pred).diagonal_covariance().shape
        TensorShape([8])
    """

    def __init__(self, net: keras.layers.Layer, variables: Sequence[Any] = ()):
        reason = incompatibility(net)
        if reason is not None:
            raise ValueError(f"layer_statistics: the per-example engine does not apply: {reason}.")
        self._net = net
        self._layers, _ = hooked_layers(net)
        self._tape = tf.GradientTape(watch_accessed_variables=False)
        self._hooks = _Hooks(self._layers, self._tape)
        self._variables = list(variables)
        self._used = False

    def __enter__(self) -> "Recording":
        if self._used:
            raise RuntimeError("Recording: a recording records one forward pass; create another.")
        self._used = True
        self._tape.__enter__()
        if self._variables:  # the backend's variables under Keras' (what the forward pass reads)
            self._tape.watch([getattr(v, "value", v) for v in self._variables])
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        self._tape.__exit__(*exc)
        return False

    def calls(
        self, loss_fn: losses.LossLike, y: Any, y_pred: Any, sample_weight: Any = None, *,
        cross_replica: Any = None, loss_scale: float = 1.0,
    ) -> list[tuple[keras.layers.Layer, LayerRule, list[dict[str, tf.Tensor]]]]:
        """Per hooked layer, its rule and its calls' recorded tensors (global batch; floating
        ones in float32; the gradient at a watched tensor under `d_<name>`). A hooked layer the
        forward pass never called has no calls. Arguments as for `layer_statistics`."""
        return self._backward(loss_fn, y, y_pred, sample_weight, cross_replica, loss_scale, with_variables=False)[0]

    def _backward(self, loss_fn, y, y_pred, sample_weight, cross_replica, loss_scale, with_variables):
        """`(calls, variable gradients)`: the one backward pass (see `calls`), also to the
        recording's `variables` when `with_variables` (else None)."""
        from keras_thermo._distribute import CrossReplica  # noqa: PLC0415 (tiny module)

        loss_fn = losses.resolve_loss(loss_fn, "layer_statistics")
        y, sample_weight = losses.check_targets(y, sample_weight, loss_fn, "layer_statistics")
        cross = cross_replica if cross_replica is not None else CrossReplica()
        for output in tf.nest.flatten(y_pred):
            if getattr(output, "_keras_mask", None) is not None:
                raise ValueError(
                    f"layer_statistics: an output of model '{self._net.name}' carries a Keras mask; "
                    "a masked loss is averaged over the valid entries of the whole batch, not per "
                    "example. Apply the mask through `sample_weight` instead."
                )
        hooks = self._hooks
        # Example i's loss depends only on row i of the outputs, so back-propagating the stacked
        # per-example output gradients gives every example's Delta in one pass.
        seeds = losses.output_gradients(loss_fn, y, y_pred, sample_weight, loss_scale)
        watched = [(i, name) for i, (_, _, call) in enumerate(hooks.calls) for name in call.watched]
        variables = self._variables if with_variables else []
        gradients = self._tape.gradient(
            tf.nest.flatten(y_pred),
            [hooks.calls[i][2].watched[name] for i, name in watched] + variables,
            output_gradients=tf.nest.flatten(seeds),
            unconnected_gradients=tf.UnconnectedGradients.ZERO,
        )
        variable_gradients = gradients[len(watched):] if with_variables else None
        records = [dict(call.saved) for _, _, call in hooks.calls]
        for (i, name), gradient in zip(watched, gradients):
            records[i]["d_" + name] = gradient
        _check_rows(records, tf.nest.flatten(y_pred)[0], hooks.calls)
        records = [
            {k: tf.cast(t, tf.float32) if t.dtype.is_floating else t for k, t in record.items()}
            for record in _gather(records, cross)
        ]
        calls_by_layer: dict[int, list] = {}
        for (layer, _, _), record in zip(hooks.calls, records):
            calls_by_layer.setdefault(id(layer), []).append(record)
        calls = [(layer, rule, calls_by_layer.get(id(layer), [])) for layer, rule in self._layers]
        return calls, variable_gradients

    def statistics(
        self, loss_fn: losses.LossLike, y: Any, y_pred: Any, sample_weight: Any = None, *,
        cross_replica: Any = None, loss_scale: float = 1.0,
    ) -> LayerStatistics:
        """The `LayerStatistics` of the recorded pass (arguments as for `layer_statistics`)."""
        recorded, _ = self._backward(loss_fn, y, y_pred, sample_weight, cross_replica, loss_scale, with_variables=False)
        return self._statistics(recorded)

    def statistics_and_gradients(
        self, loss_fn: losses.LossLike, y: Any, y_pred: Any, sample_weight: Any = None, *,
        cross_replica: Any = None, loss_scale: float = 1.0,
    ) -> tuple[LayerStatistics, list[tf.Tensor]]:
        """`statistics(...)` and, from the same backward pass, the gradients of
        `sum_i loss_scale w_i l_i` over this replica's examples (the sum of its rows of `G`) with
        respect to the recording's `variables` (zeros where a variable does not affect the
        outputs). For a loss averaged over `n` examples, the loss's gradient is these over `n`.

        Example:
            >>> import keras, tensorflow as tf
            >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> x, y = tf.random.normal([5, 3]), tf.zeros([5, 2])
            >>> with Recording(net, net.trainable_variables) as recording:
            ...     y_pred = net(x, training=True)
            >>> stats, sums = recording.statistics_and_gradients("mse", y, y_pred)
            >>> [g.shape.as_list() for g in sums]
            [[3, 2], [2]]
        """
        recorded, gradients = self._backward(
            loss_fn, y, y_pred, sample_weight, cross_replica, loss_scale, with_variables=True
        )
        return self._statistics(recorded), gradients

    def _statistics(self, recorded) -> LayerStatistics:
        blocks, owner = [], {}
        for layer, rule, calls in recorded:
            if not calls:
                continue  # never called: its variables get zero columns below
            for variables, block in rule.blocks(layer, calls):
                for slot, variable in enumerate(variables):
                    owner[id(variable)] = (len(blocks), slot)
                blocks.append(block)
        variables = self._net.trainable_variables
        missing = [v for v in variables if id(v) not in owner]
        if missing:
            if not blocks:
                raise ValueError(f"layer_statistics: no layer of model '{self._net.name}' was called.")
            for slot, variable in enumerate(missing):
                owner[id(variable)] = (len(blocks), slot)
            blocks.append(ZeroBlock(blocks[0].num_rows, [int(v.shape.num_elements()) for v in missing]))
        placement = tuple(owner[id(v)] for v in variables)
        return LayerStatistics(LayerRows(blocks, placement))


def layer_statistics(
    net: keras.layers.Layer,
    loss_fn: losses.LossLike,
    x: Any,
    y: Any,
    sample_weight: Any = None,
    *,
    cross_replica: Any = None,
    loss_scale: float = 1.0,
) -> LayerStatistics:
    """Per-example gradient statistics of `net` from its layers' inputs and output errors.

    Equivalent to `PerExampleGradients(per_example_gradients(net, loss_fn, x, y,
    sample_weight))` (same losses, weights, reductions and column order) up to float32 rounding,
    at the cost of one forward and one backward pass plus what the statistics need of each
    layer's factors (see `keras_thermo.per_example.blocks`).

    Args:
        net: a Keras model for which `incompatibility(net)` is None.
        loss_fn: a `keras.losses.Loss` (reduction `sum_over_batch_size` or `mean`), a loss
            name, or a callable whose mean over a batch of one is the example's loss.
        x: inputs with a leading batch axis (a tensor or a nest).
        y: targets with the same leading axis.
        sample_weight: optional weights `[n]` (or `[n, ...]` for loss objects).
        cross_replica: a `keras_thermo._distribute.CrossReplica` (None: one for the current
            context).
        loss_scale: factor of every example's loss (compile's single-output `loss_weights`).

    Returns:
        A `LayerStatistics` for the global batch.

    Raises:
        ValueError: the engine does not apply (the reason, see `incompatibility`), `y` is None,
            an output carries a Keras mask, or a global batch of fewer than 2 examples.
        TypeError: `loss_fn` is not a loss.
    """
    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    with Recording(net) as recording:
        y_pred = net(x, training=True)
    return recording.statistics(
        loss_fn, y, y_pred, sample_weight, cross_replica=cross_replica, loss_scale=loss_scale
    )


def _check_rows(records, output, calls) -> None:
    """Every recorded tensor has one row per example (a layer called on a reshaped batch would
    not): checked now where shapes are static."""
    examples = output.shape[0]
    if examples is None:
        return
    for record, (layer, _, _) in zip(records, calls):
        for name, tensor in record.items():
            if tensor.shape.rank and tensor.shape[0] is not None and tensor.shape[0] != examples:
                raise ValueError(
                    f"layer_statistics: layer '{layer.name}' was called on {tensor.shape[0]} rows "
                    f"for a batch of {examples} examples; the engine needs one row per example."
                )
