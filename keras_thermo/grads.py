"""Per-example gradients and the gradient-noise covariance of a minibatch.

The covariance-controlled samplers (CCAdL, mCCAdL) need the covariance of the
stochastic force, which they estimate from the gradients of the individual
examples of the current minibatch. With the potential

    U(theta) = N * L(theta; batch) + R(theta),    L = (1/n) sum_i l_i(theta),

the per-example gradient ``g_i = grad l_i`` (times the example's sample weight,
if any) is one row of ``G`` with shape ``[n, Nd]``; its columns follow the order
of ``model.trainable_variables``, each variable flattened in row-major order
(see :func:`flatten`). Layer regularization losses and the prior ``R`` are the
same for every example: they shift every row by the same vector, which cancels
in ``Gc = G - mean(G)``, so they are deliberately left out of ``G``. The
empirical covariance is then ``V = Gc^T Gc / (n - 1)``
(:func:`full_covariance`), or its diagonal (:func:`diagonal_covariance`).

How the gradients are computed: ``tf.vectorized_map`` (the ``pfor``
vectorizer) runs the forward and backward pass of one example, given to the
model as a batch of one with ``training=True``, and turns it into batched ops.
This works in eager mode, inside ``tf.function``, with ``jit_compile=True`` and
inside the ``steps_per_execution`` loop of ``model.fit``.

What breaks per-example gradients, and what happens then:

* Layers that couple or randomise the examples would give numbers that are
  not the gradients of the batch loss, so :func:`check_per_example_compatible`
  refuses them up front with a ``ValueError`` naming the layer:
  ``BatchNormalization`` in training mode (batch statistics couple the
  examples; a frozen one, ``trainable=False``, runs in inference mode and is
  accepted), the dropout family with a nonzero rate (``Dropout``,
  ``SpatialDropout*``, ``GaussianDropout``, ``AlphaDropout``,
  ``GaussianNoise``; also ``dropout``/``recurrent_dropout`` of RNN and
  attention layers), any other layer that owns a ``keras.random.SeedGenerator``
  (random augmentation such as ``RandomFlip``, ``MixUp``: move it into the
  ``tf.data`` pipeline), and activity regularizers (a loss that depends on
  each example's activations, which ``G`` would miss). Randomness drawn
  without a ``SeedGenerator`` in a custom layer cannot be detected.
* Recurrent layers (``LSTM``, ``GRU``, ``SimpleRNN``, ``ConvLSTM*``) must be
  built with ``unroll=True``; ``unroll=False`` is refused, see below.
* Outputs that carry a Keras mask are refused too: Keras averages a masked
  loss over the valid entries of the whole batch, which is not the mean of
  per-example losses. Pass the mask as ``sample_weight`` instead.
* An op that ``pfor`` has no vectorization for raises a ``ValueError`` that
  names the op. The policy is ``fallback_to_while_loop=False`` by default: a
  silent fallback would turn one batched pass into ``n`` sequential ones.
  Passing ``fallback_to_while_loop=True`` accepts that cost; the numbers are
  the same, because every layer that could make them differ is refused.
* ``Embedding`` gradients (``tf.IndexedSlices``) are densified, so each row
  of ``G`` has all ``Nd`` entries.

Recurrent layers. With ``unroll=False`` a Keras RNN runs a symbolic
``while_loop``. pfor vectorizes it only when nothing trainable comes before
the RNN: the gradient with respect to the RNN's inputs (needed by an
``Embedding``, a ``Dense`` or another RNN below it) fails to convert, with
or without the while-loop fallback, and under ``jit_compile=True`` even the
first-layer case does not compile. ``unroll=True`` works in all these cases
(and never takes the cuDNN path on a GPU, which pfor could not vectorize
either), so it is required. Measured on 2 shared CPU cores (TF 2.21, Keras
3.15; ``LSTM(32)`` on 28 steps x 28 features, ``Dense(10)`` head, batch 32,
sparse categorical cross-entropy; median of 30 calls of a warm
``tf.function``; ranges over four runs on a loaded machine, so read them as
rough)::

                                      unroll=False       unroll=True
    batch gradient (reference)        2.8-7.6 ms         1.9-3.0 ms
    per-example, vectorized_map       15-26 ms           10.5-15 ms
    per-example, jit_compile=True     does not compile   35-79 ms
    per-example, tf.map_fn loop       61-70 ms           33-57 ms

(``unroll=False`` was timed with the LSTM as first layer, the one case pfor
handles, bypassing the layer check.) All variants agree with the loop to
2e-7. Per-example gradients cost about 4-6 batch gradients here, and the
vectorized map is 3-5 times faster than a loop over examples. On this CPU,
XLA makes the per-example pass slower, not faster.

A cheaper path for models made only of ``Dense`` layers (per-example
gradients as outer products of the layer inputs and the back-propagated
output gradients, without vectorizing the whole backward pass) would go in
:func:`per_example_gradients`, before the ``vectorized_map`` call.

Reference: the per-example-gradient covariance estimate follows
Shang, Zhu, Leimkuhler & Storkey (2015), "Covariance-Controlled Adaptive
Langevin Thermostat for Large-Scale Bayesian Sampling" (NeurIPS), Sec. 3.1,
eq. (19).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import keras
import tensorflow as tf

LossLike = Union[keras.losses.Loss, Callable[..., Any], str]

# Reductions for which the loss of a batch is the mean of its per-example
# losses, so per-example losses computed on batches of one average to it.
PER_EXAMPLE_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")

# Layers whose random noise is switched off by one attribute being 0.
_NOISE_LEVEL_ATTRIBUTE = (
    (keras.layers.Dropout, "rate"),  # also the SpatialDropout* subclasses
    (keras.layers.GaussianDropout, "rate"),
    (keras.layers.AlphaDropout, "rate"),
    (keras.layers.GaussianNoise, "stddev"),
)

# Attributes of RNN layers, RNN cells and attention layers that switch on
# their internal dropout.
_DROPOUT_ATTRIBUTES = ("dropout", "recurrent_dropout")


def _all_layers(model: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The model itself and all its nested layers, each once."""
    # Keras 3 has no public recursive walk; ``model.layers`` is one level only.
    if hasattr(model, "_flatten_layers"):
        return list(model._flatten_layers(include_self=True, recursive=True))
    return [model, *getattr(model, "layers", [])]


def _owns_seed_generator(layer: keras.layers.Layer) -> bool:
    """Whether the layer keeps a ``keras.random.SeedGenerator`` (draws noise)."""
    return any(
        isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values()
    )


def stochastic_setting(layer: keras.layers.Layer) -> tuple[str, str] | None:
    """How ``layer`` makes the training-mode loss random or couples the examples.

    Returns ``(kind, setting)`` or None. ``kind`` is ``"batch_statistics"``
    (BatchNormalization in training mode), ``"noise"`` (dropout and noise
    layers with a nonzero rate, internal RNN/attention dropout) or
    ``"random_draws"`` (any other layer that owns a ``keras.random.SeedGenerator``,
    such as a random augmentation); ``setting`` names the layer type and the
    attribute responsible. The one place these layers are recognised, for the
    per-example check below and for the samplers' warning in ``BayesianModel``.
    """
    if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
        return "batch_statistics", "BatchNormalization in training mode"
    for layer_type, attribute in _NOISE_LEVEL_ATTRIBUTE:
        if isinstance(layer, layer_type):
            level = getattr(layer, attribute)
            return ("noise", f"{type(layer).__name__} ({attribute}={level})") if level > 0 else None
    for attribute in _DROPOUT_ATTRIBUTES:
        level = getattr(layer, attribute, None)
        if isinstance(level, (int, float)) and level > 0:
            return "noise", f"{type(layer).__name__} with {attribute}={level}"
    has_dropout_attributes = any(hasattr(layer, a) for a in _DROPOUT_ATTRIBUTES)
    if _owns_seed_generator(layer) and not has_dropout_attributes:
        # RNN cells own a generator for their dropout, which is off (above).
        return "random_draws", f"{type(layer).__name__} (it owns a keras.random.SeedGenerator)"
    return None


def stochastic_layers(model: keras.layers.Layer) -> list[tuple[keras.layers.Layer, str, str]]:
    """``(layer, kind, setting)`` for every nested layer with a ``stochastic_setting``."""
    found = []
    for layer in _all_layers(model):
        setting = stochastic_setting(layer)
        if setting is not None:
            found.append((layer, *setting))
    return found


def _incompatibility(layer: keras.layers.Layer) -> str | None:
    """Why ``layer`` breaks per-example gradients, or None if it does not."""
    setting = stochastic_setting(layer)
    if setting is not None:
        kind, what = setting
        if kind == "batch_statistics":
            return (
                f"{what} normalises with the statistics of the whole batch, which "
                "couples the examples. Replace it with LayerNormalization or "
                "GroupNormalization, or freeze it (layer.trainable = False runs it "
                "in inference mode)."
            )
        if kind == "noise":
            return (
                f"{what} draws fresh random noise in training mode, so each "
                "example would see other noise than in the batch pass. Set the "
                "rate to 0: the sampler injects its own noise."
            )
        return (
            f"{what} draws random numbers in training mode, for example a "
            "random augmentation, so each example would be transformed "
            "differently than in the batch pass. Move data augmentation into "
            "the tf.data pipeline."
        )
    if isinstance(layer, keras.layers.ActivityRegularization) or (
        getattr(layer, "activity_regularizer", None) is not None
    ):
        return (
            "an activity regularizer adds a loss that depends on each "
            "example's activations, which per-example gradients do not "
            "include. Remove it or regularize the weights instead."
        )
    if isinstance(layer, keras.layers.RNN) and not layer.unroll:
        return (
            f"{type(layer).__name__} with unroll=False runs a symbolic while "
            "loop, which tf.vectorized_map cannot differentiate with respect "
            "to the layer's inputs (a trainable layer before it fails) nor "
            "compile with XLA. Construct it with unroll=True (needs a fixed "
            "sequence length)."
        )
    return None


def check_per_example_compatible(model: keras.layers.Layer) -> None:
    """Refuses models whose layers couple or randomise the examples.

    Walks all layers of ``model``, nested ones included, and raises one error
    that lists every offending layer. The check is plain Python and runs once
    when a ``tf.function`` is traced.

    Args:
        model: a Keras model or layer.

    Raises:
        ValueError: naming each layer that would make per-example gradients
            differ from the gradients of the batch loss (BatchNormalization in
            training mode, dropout and noise layers with a nonzero rate,
            internal RNN/attention dropout, other layers that own a
            ``keras.random.SeedGenerator``, activity regularizers) or that
            cannot be vectorized (RNNs with ``unroll=False``), with what to
            do about it.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> check_per_example_compatible(net)  # passes silently
    """
    problems = []
    for layer in _all_layers(model):
        reason = _incompatibility(layer)
        if reason is not None:
            problems.append(f"  - layer '{layer.name}': {reason}")
    if problems:
        raise ValueError(
            "Per-example gradients (needed by the covariance-controlled "
            f"samplers) cannot be computed for model '{model.name}':\n"
            + "\n".join(problems)
        )


def flatten(tensors: Sequence[Any]) -> tf.Tensor:
    """Concatenates a list of tensors into one flat vector.

    Each tensor is flattened in row-major (C) order and the pieces are
    concatenated in list order; :func:`unflatten` inverts this exactly.

    Args:
        tensors: non-empty sequence of tensors or variables, all of one dtype.

    Returns:
        A rank-1 tensor with ``sum(size(t))`` entries.

    Raises:
        ValueError: if ``tensors`` is empty.
        TypeError: if the dtypes differ.

    Example:
        >>> import tensorflow as tf
        >>> flatten([tf.ones([2, 2]), tf.zeros([3])]).shape
        TensorShape([7])
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("flatten: `tensors` is empty; expected at least one tensor.")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(
            "flatten: all tensors must share one dtype; got "
            f"{sorted(d.name for d in dtypes)}."
        )
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(vector: Any, like: Sequence[Any]) -> list[tf.Tensor]:
    """Splits a flat vector into tensors shaped like ``like`` (inverse of flatten).

    Args:
        vector: rank-1 tensor with as many entries as ``like`` has in total.
        like: sequence of tensors or variables with fully known static shapes
            (for example ``model.trainable_variables``).

    Returns:
        A list of tensors with the shapes of ``like``, in its order, and the
        dtype of ``vector``.

    Raises:
        ValueError: if ``vector`` is not rank 1, a shape in ``like`` is not
            fully known, or the sizes do not add up.

    Example:
        >>> import tensorflow as tf
        >>> parts = unflatten(tf.range(7.0), [tf.ones([2, 2]), tf.ones([3])])
        >>> [p.shape.as_list() for p in parts]
        [[2, 2], [3]]
    """
    vector = tf.convert_to_tensor(vector)
    if vector.shape.rank != 1:
        raise ValueError(
            f"unflatten: `vector` must be rank 1; got shape {vector.shape}."
        )
    shapes = [tf.TensorShape(t.shape) for t in like]
    for index, shape in enumerate(shapes):
        if not shape.is_fully_defined():
            raise ValueError(
                f"unflatten: `like[{index}]` has shape {shape}; all shapes "
                "must be fully known."
            )
    sizes = [shape.num_elements() for shape in shapes]
    length = vector.shape[0]
    if length is not None and length != sum(sizes):
        raise ValueError(
            f"unflatten: `vector` has {length} entries but `like` holds "
            f"{sum(sizes)}."
        )
    pieces = tf.split(vector, sizes) if sizes else []
    return [tf.reshape(piece, shape) for piece, shape in zip(pieces, shapes)]


def _resolve_loss(loss_fn: LossLike) -> Callable[..., Any]:
    """Turns a loss identifier into a callable and checks its reduction."""
    if isinstance(loss_fn, str):
        loss_fn = keras.losses.get(loss_fn)
    if not callable(loss_fn):
        raise TypeError(
            "per_example_gradients: `loss_fn` must be a keras.losses.Loss, a "
            f"callable or a loss name; got {loss_fn!r}."
        )
    if isinstance(loss_fn, keras.losses.Loss):
        if loss_fn.reduction not in PER_EXAMPLE_MEAN_REDUCTIONS:
            raise ValueError(
                "per_example_gradients: `loss_fn.reduction` must be one of "
                f"{PER_EXAMPLE_MEAN_REDUCTIONS}, so that the batch loss is the mean of "
                f"the per-example losses; got {loss_fn.reduction!r}."
            )
    return loss_fn


def example_loss(
    loss_fn: Callable[..., Any], y_i: Any, y_pred_i: Any, weight_i: Any = None, loss_scale: float = 1.0
) -> tf.Tensor:
    """The loss `c w_i l_i` of one example given as a batch of one (the row of `G` is its
    gradient); `c = loss_scale` is the compile-time `loss_weights` factor of the batch loss.

    A Keras loss object gets the example's weight; a plain callable's mean over the batch of one
    is multiplied by it (one scalar per example).
    """
    if isinstance(loss_fn, keras.losses.Loss):
        loss = loss_fn(y_i, y_pred_i, sample_weight=weight_i)
        # Under tf.distribute a Keras loss divides itself by the number of replicas (so that
        # summed replica gradients average); a per-example loss must not.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss * tf.cast(replicas * loss_scale, loss.dtype)
    loss = tf.reduce_mean(loss_fn(y_i, y_pred_i))
    if weight_i is not None:
        loss = loss * tf.cast(tf.reshape(weight_i, []), loss.dtype)
    return loss * tf.cast(loss_scale, loss.dtype) if loss_scale != 1.0 else loss


def _dense_gradient(gradient: Any, variable: Any) -> tf.Tensor:
    """The gradient as a dense tensor of the variable's shape."""
    if isinstance(gradient, tf.IndexedSlices):
        # Embedding rows: sum the slices into their rows (repeated ids add up).
        return tf.math.unsorted_segment_sum(
            gradient.values, gradient.indices, variable.shape[0]
        )
    return tf.convert_to_tensor(gradient)


def per_example_gradients(
    model: keras.layers.Layer,
    loss_fn: LossLike,
    x: Any,
    y: Any,
    sample_weight: Any = None,
    *,
    fallback_to_while_loop: bool = False,
    loss_scale: float = 1.0,
) -> tf.Tensor:
    """Gradients of the per-example losses, one row per example.

    Row ``i`` is ``w_i * grad l_i`` flattened over ``model.trainable_variables``
    (in that order, as :func:`flatten` does), where ``l_i`` is the loss of
    example ``i`` run through the model alone (a batch of one) with
    ``training=True`` and ``w_i`` its sample weight. With the default
    ``sum_over_batch_size`` reduction the mean of the rows is the gradient of
    the batch loss ``L`` (without regularization losses, which are the same for
    every example and cancel in the covariance).

    Args:
        model: a Keras model. It must pass :func:`check_per_example_compatible`.
        loss_fn: a ``keras.losses.Loss`` (reduction ``sum_over_batch_size`` or
            ``mean``; sample weights are passed to it, so per-timestep weights
            work), a loss name understood by ``keras.losses.get``, or a
            callable ``loss_fn(y_true, y_pred)`` whose mean over the batch of
            one is the example's loss (its sample weight, if any, must then be
            one scalar per example and multiplies that loss).
        x: model inputs with a leading batch axis: a tensor or a nested
            structure (dict, list, tuple) of tensors.
        y: targets with the same leading batch axis, a tensor or a structure.
        sample_weight: optional weights, shape ``[n]`` (or ``[n, ...]`` for
            loss objects).
        fallback_to_while_loop: if False (default), an op that pfor cannot
            vectorize raises a ValueError; if True, such ops run in a
            sequential loop over the examples (same numbers, slower).
        loss_scale: factor of every example's loss (compile's single-output
            ``loss_weights``), so that the rows stay gradients of the batch loss.

    Returns:
        ``G``, a tensor of shape ``[n, Nd]`` in the dtype of the variables.

    Raises:
        ValueError: if the model has layers that couple or randomise examples,
            the model has no trainable variables, the output carries a mask,
            or (with ``fallback_to_while_loop=False``) an op cannot be
            vectorized.
        TypeError: if ``loss_fn`` is not a loss.

    Example:
        >>> import keras, tensorflow as tf
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> g = per_example_gradients(
        ...     net, keras.losses.MeanSquaredError(),
        ...     tf.ones([5, 3]), tf.zeros([5, 2]))
        >>> g.shape  # 5 examples, 3 * 2 kernel + 2 bias entries
        TensorShape([5, 8])

    Reference:
        Shang et al. (2015), "Covariance-Controlled Adaptive Langevin
        Thermostat for Large-Scale Bayesian Sampling", NeurIPS, Sec. 3.1.
    """
    check_per_example_compatible(model)
    loss_fn = _resolve_loss(loss_fn)
    variables = list(model.trainable_variables)
    if not variables:
        raise ValueError(
            f"per_example_gradients: model '{model.name}' has no trainable "
            "variables."
        )
    is_loss_object = isinstance(loss_fn, keras.losses.Loss)

    def as_batch_of_one(structure: Any) -> Any:
        return tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), structure)

    def gradient_row(example: tuple) -> tf.Tensor:
        x_i, y_i = as_batch_of_one(example[:2])
        weight_i = as_batch_of_one(example[2]) if len(example) == 3 else None
        with tf.GradientTape() as tape:
            y_pred = model(x_i, training=True)
            for output in tf.nest.flatten(y_pred):
                # Keras keeps an output's mask on this attribute (TF backend).
                if getattr(output, "_keras_mask", None) is not None:
                    raise ValueError(
                        f"per_example_gradients: an output of model "
                        f"'{model.name}' carries a Keras mask; a masked loss "
                        "is averaged over the valid entries of the whole "
                        "batch, not per example. Apply the mask through "
                        "`sample_weight` instead."
                    )
            loss = example_loss(loss_fn, y_i, y_pred, weight_i, loss_scale)
        gradients = tape.gradient(
            loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return flatten(
            [_dense_gradient(g, v) for g, v in zip(gradients, variables)]
        )

    if y is None:
        raise ValueError(
            "per_example_gradients: `y` is None; per-example gradients need "
            "targets for `loss_fn`."
        )

    def to_tensor(structure: Any) -> Any:
        return tf.nest.map_structure(tf.convert_to_tensor, structure)

    examples = (to_tensor(x), to_tensor(y))
    if sample_weight is not None:
        sample_weight = tf.convert_to_tensor(sample_weight)
        if not is_loss_object and sample_weight.shape.rank != 1:
            raise ValueError(
                "per_example_gradients: with a plain callable `loss_fn`, "
                "`sample_weight` must have shape [n] (one weight per "
                f"example); got shape {sample_weight.shape}. Use a "
                "keras.losses.Loss for per-timestep weights."
            )
        examples += (sample_weight,)
    try:
        return tf.vectorized_map(
            gradient_row, examples, fallback_to_while_loop=fallback_to_while_loop
        )
    except ValueError as error:
        reason = [
            line.strip()
            for line in str(error).splitlines()
            if "No pfor vectorization defined" in line
        ]
        if not reason:
            raise
        raise ValueError(
            "per_example_gradients: tf.vectorized_map cannot vectorize an op "
            f"of model '{model.name}' ({reason[0]})."
            + " Pass fallback_to_while_loop=True to loop over the examples "
            "instead (same numbers, one example at a time)."
        ) from error


def _check_rows(g: tf.Tensor, name: str) -> tf.Tensor:
    g = tf.convert_to_tensor(g)
    if g.shape.rank != 2:
        raise ValueError(
            f"{name}: `g` must have shape [n, Nd] (rank 2); got shape {g.shape}."
        )
    return g


def centered(g: Any) -> tf.Tensor:
    """``G - mean(G)``: each column minus its mean over the examples.

    Args:
        g: per-example gradients, shape ``[n, Nd]``.

    Returns:
        ``Gc`` of the same shape; the sum of its rows is zero.

    Example:
        >>> import tensorflow as tf
        >>> centered(tf.constant([[1.0, 2.0], [3.0, 6.0]])).numpy().tolist()
        [[-1.0, -2.0], [1.0, 2.0]]
    """
    g = _check_rows(g, "centered")
    return g - tf.reduce_mean(g, axis=0, keepdims=True)


def diagonal_covariance(g: Any) -> tf.Tensor:
    """Per-coordinate empirical variance of the rows, ``(n - 1)`` denominator.

    This is the diagonal of :func:`full_covariance` without forming it. Both are
    ``PerExampleGradients(g)``'s statistics: inside a ``tf.distribute`` replica
    context they are those of the global batch.

    Args:
        g: per-example gradients, shape ``[n, Nd]`` with ``n >= 2``.

    Returns:
        Variances, shape ``[Nd]``.

    Raises:
        ValueError: if ``g`` is not rank 2 or has fewer than 2 rows.

    Example:
        >>> import tensorflow as tf
        >>> diagonal_covariance(tf.constant([[1.0, 0.0], [3.0, 0.0]])).numpy()
        array([2., 0.], dtype=float32)
    """
    return PerExampleGradients(g).diagonal_covariance()


def full_covariance(g: Any) -> tf.Tensor:
    """Empirical covariance ``V = Gc^T Gc / (n - 1)`` of the rows.

    Forms a ``[Nd, Nd]`` matrix: meant for small models and tests. The C step
    of mCCAdL never forms it (see ``keras_thermo.linalg``).

    Args:
        g: per-example gradients, shape ``[n, Nd]`` with ``n >= 2``.

    Returns:
        The covariance, shape ``[Nd, Nd]``, symmetric positive semidefinite
        with rank at most ``n - 1``.

    Raises:
        ValueError: if ``g`` is not rank 2 or has fewer than 2 rows.

    Example:
        >>> import tensorflow as tf
        >>> full_covariance(tf.constant([[1.0, 2.0], [3.0, 6.0]])).numpy()
        array([[2., 4.],
               [4., 8.]], dtype=float32)
    """
    return PerExampleGradients(g).full_covariance()


class PerExampleGradients:
    """The per-example gradients of one minibatch and the statistics samplers take from them.

    Samplers never touch the rows directly: they ask for the covariance estimate they need, so the
    same sampler code runs on one device and under `tf.distribute`, where each replica holds the
    rows of its slice of the global batch. Statistics are always those of the global batch:

    * `diagonal_covariance()`: two all-reduces of an `[Nd]` vector (the global mean, then the
      centered sums of squares), so the result equals the single-device one;
    * `full_covariance()`: the global mean plus one all-reduce of `[Nd, Nd]`;
    * `covariance_factor()`: the global `Gc` (`[n, Nd]`, every replica's centered rows gathered
      in replica order), the operand of mCCAdL's C step. One all-gather of `n * Nd` floats per
      step: the adaptive Taylor loop cannot all-reduce inside its `tf.while_loop` under
      `MirroredStrategy`, so the rows travel once instead.

    Other representations (for example the per-layer factors of `Dense` networks) provide the
    same members: `count`, `diagonal_covariance()`, `full_covariance()`, `covariance_factor()`
    (anything `keras_thermo.linalg.expm_action` accepts as `gc`) and `covariance_trace()`.

    Args:
        rows: `G`, `[n, Nd]` per-example gradients of this replica's examples (cast to float32).
        cross_replica: A `keras_thermo._distribute.CrossReplica`; None creates one for the current
            context (the identity outside a strategy).

    Example:
        >>> import tensorflow as tf
        >>> g = PerExampleGradients(tf.constant([[1.0, 2.0], [3.0, 6.0]]))
        >>> float(g.count), g.diagonal_covariance().numpy().tolist()
        (2.0, [2.0, 8.0])
    """

    def __init__(self, rows: Any, cross_replica: Any = None):
        from keras_thermo._distribute import CrossReplica  # noqa: PLC0415 (tiny module)

        self._rows = _check_rows(rows, "PerExampleGradients")
        if not self._rows.dtype.is_floating:
            raise TypeError(
                "PerExampleGradients: `rows` must be a floating tensor [n, Nd]; got dtype "
                f"{self._rows.dtype.name}."
            )
        self._cross = cross_replica if cross_replica is not None else CrossReplica()
        local = self._rows.shape[0]
        self._static_count = None if local is None else local * self._cross.num_replicas
        if self._static_count is not None and self._static_count < 2:
            raise ValueError(
                "PerExampleGradients: estimating a covariance needs a (global) batch of at "
                f"least 2 examples (rows); got n={self._static_count}."
            )
        self._mean = None
        self._factor = None

    @property
    def count(self) -> tf.Tensor:
        """n, the number of examples in the global batch (scalar in the rows' dtype)."""
        dtype = self._rows.dtype
        if self._static_count is not None:
            return tf.constant(float(self._static_count), dtype)
        count = self._cross.sum(tf.cast(tf.shape(self._rows)[0], dtype))
        # Unknown batch size at trace time: checked when the graph runs (XLA drops asserts;
        # the batch size there is static in practice).
        check = tf.debugging.assert_greater_equal(
            count, tf.constant(2.0, dtype), message="PerExampleGradients: needs at least 2 examples"
        )
        with tf.control_dependencies([check]):
            return tf.identity(count)

    def _centered_local(self) -> tf.Tensor:
        if self._mean is None:
            self._mean = self._cross.sum(tf.reduce_sum(self._rows, axis=0)) / self.count
        return self._rows - self._mean

    def diagonal_covariance(self) -> tf.Tensor:
        """`diag(V)`, `[Nd]`, with `V = Gc^T Gc / (n - 1)` over the global batch."""
        squares = tf.reduce_sum(tf.square(self._centered_local()), axis=0)
        return self._cross.sum(squares) / (self.count - 1.0)

    def full_covariance(self) -> tf.Tensor:
        """`V`, `[Nd, Nd]` (small models only)."""
        local = self._centered_local()
        product = tf.matmul(local, local, transpose_a=True)
        return self._cross.sum(product) / (self.count - 1.0)

    def covariance_factor(self) -> tf.Tensor:
        """`Gc`, the `[n, Nd]` centered rows of the global batch: `V = Gc^T Gc / (n - 1)`."""
        if self._factor is None:
            self._factor = self._cross.gather_rows(self._centered_local())
        return self._factor

    def covariance_trace(self) -> tf.Tensor:
        """`tr(V) = ||Gc||_F^2 / (n - 1)` (from the gathered factor: no further communication)."""
        return tf.reduce_sum(tf.square(self.covariance_factor())) / (self.count - 1.0)
