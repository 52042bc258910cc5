"""Which layers make per-example gradients differ from the gradients of the batch loss.

Layers that couple or randomise the examples would give numbers that are not the gradients of
the batch loss, whichever way they are computed, so both per-example paths (the layer-rule
engine of `keras_thermo.per_example.engine` and the `tf.vectorized_map` fallback of
`keras_thermo.per_example.vectorized`) refuse them up front with a `ValueError` naming the
layer: `BatchNormalization` in training mode (batch statistics couple the examples; a frozen
one, `trainable=False`, runs in inference mode and is accepted), the dropout family with a
nonzero rate (`Dropout`, `SpatialDropout*`, `GaussianDropout`, `AlphaDropout`, `GaussianNoise`;
also `dropout`/`recurrent_dropout` of RNN and attention layers), any other layer that owns a
`keras.random.SeedGenerator` (random augmentation such as `RandomFlip`, `MixUp`: move it into the
`tf.data` pipeline), and activity regularizers (a loss that depends on each example's
activations, which the per-example gradients would miss). Randomness drawn without a
`SeedGenerator` in a custom layer cannot be detected.

The vectorized path also refuses recurrent layers with `unroll=False` (see
`keras_thermo.per_example.vectorized`); the engine runs them through its own recurrence.
"""

from __future__ import annotations

import keras

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


def all_layers(model: keras.layers.Layer) -> list[keras.layers.Layer]:
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
    for layer in all_layers(model):
        setting = stochastic_setting(layer)
        if setting is not None:
            found.append((layer, *setting))
    return found


def _incompatibility(layer: keras.layers.Layer, recurrent_loops: bool) -> str | None:
    """Why ``layer`` breaks per-example gradients, or None if it does not (``recurrent_loops``:
    whether RNNs with ``unroll=False`` are fine, as they are for the engine)."""
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
    if not recurrent_loops and isinstance(layer, keras.layers.RNN) and not layer.unroll:
        return (
            f"{type(layer).__name__} with unroll=False runs a symbolic while "
            "loop, which tf.vectorized_map cannot differentiate with respect "
            "to the layer's inputs (a trainable layer before it fails) nor "
            "compile with XLA. Construct it with unroll=True (needs a fixed "
            "sequence length)."
        )
    return None


def check_per_example_compatible(model: keras.layers.Layer, *, recurrent_loops: bool = False) -> None:
    """Refuses models whose layers couple or randomise the examples.

    Walks all layers of ``model``, nested ones included, and raises one error
    that lists every offending layer. The check is plain Python and runs once
    when a ``tf.function`` is traced.

    Args:
        model: a Keras model or layer.
        recurrent_loops: accept RNNs with ``unroll=False`` (the engine runs their recurrence
            itself); False (default) refuses them, as the vectorized path must.

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
    for layer in all_layers(model):
        reason = _incompatibility(layer, recurrent_loops)
        if reason is not None:
            problems.append(f"  - layer '{layer.name}': {reason}")
    if problems:
        raise ValueError(
            "Per-example gradients (needed by the covariance-controlled "
            f"samplers) cannot be computed for model '{model.name}':\n"
            + "\n".join(problems)
        )

