"""The vectorized per-example path: explicit rows of `G` from `tf.vectorized_map`.

The fallback of the layer-rule engine (`keras_thermo.per_example.engine`) for a network with a
layer that has no rule, and the reference the engine is tested against.

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

The engine (`keras_thermo.per_example.engine`) takes the statistics from each layer's
inputs and output errors after one ordinary backward pass instead, several times cheaper.

Reference: the per-example-gradient covariance estimate follows
Shang, Zhu, Leimkuhler & Storkey (2015), "Covariance-Controlled Adaptive
Langevin Thermostat for Large-Scale Bayesian Sampling" (NeurIPS), Sec. 3.1,
eq. (19).
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from keras_thermo._tree import flatten
from keras_thermo.per_example.checks import check_per_example_compatible
from keras_thermo.per_example.losses import LossLike, example_loss, resolve_loss


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
    wrt: Sequence[tf.Tensor] | None = None,
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
        wrt: tensors standing for ``model.trainable_variables`` (same order
            and shapes) when the model runs under a ``keras.StatelessScope``
            that maps its variables to them (the gradients are taken with
            respect to these); None: the variables themselves.

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
    loss_fn = resolve_loss(loss_fn)
    variables = list(model.trainable_variables) if wrt is None else list(wrt)
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
            if wrt is not None:
                tape.watch(variables)
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
