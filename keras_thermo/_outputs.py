"""Whether a model returns logits or probabilities, read from its compiled loss's `from_logits`
and its last layer's activation (used by the posterior predictions and by `fit`'s checks)."""

from __future__ import annotations

import inspect
from typing import Any

import keras

# What a last layer's activation says the net returns.
ACTIVATION_OUTPUTS = {
    "softmax": "probabilities",
    "sigmoid": "probabilities",
    "linear": "logits",
    "log_softmax": "logits",
}


def _from_logits(loss: Any) -> bool | None:
    """The `from_logits` of a Keras loss (object, function or name), None if it has none."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except (ValueError, TypeError):
            return None
    if isinstance(loss, keras.losses.Loss):
        value = getattr(loss, "from_logits", None)
        if value is None:
            try:
                value = loss.get_config().get("from_logits")
            except (NotImplementedError, TypeError, ValueError):  # a custom loss's config
                return None
    elif callable(loss):
        try:
            parameter = inspect.signature(loss).parameters.get("from_logits")
        except (TypeError, ValueError):
            return None
        value = None if parameter is None else parameter.default
    else:  # None, or one loss per output
        return None
    return value if isinstance(value, bool) else None


def loss_hint(model: keras.Model) -> tuple[str, str] | None:
    """(kind, reason) from the compiled loss's `from_logits`, or None."""
    loss = getattr(model, "loss", None)
    from_logits = _from_logits(loss)
    if from_logits is None:
        return None
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or type(loss).__name__
    kind = "logits" if from_logits else "probabilities"
    return kind, f"its compiled loss {name!r} has from_logits={from_logits} (reads {kind})"


def _produces(layer: keras.layers.Layer, tensor: Any) -> bool:
    try:
        return layer.output is tensor
    except (AttributeError, ValueError):  # not called, or called more than once
        return False


def _output_layer(model: keras.Model) -> keras.layers.Layer | None:
    """The layer that computes `model`'s single output, inside nested models; None if unknown."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, keras.Sequential):
            layer = model.layers[-1] if model.layers else None
        elif isinstance(getattr(model, "net", None), keras.Model):  # a BayesianModel's net
            layer = model.net
        else:
            try:
                outputs = model.outputs
            except (AttributeError, ValueError):
                outputs = None
            if not outputs or len(outputs) != 1:
                return None
            layer = next((ly for ly in reversed(model.layers) if _produces(ly, outputs[0])), None)
        if not isinstance(layer, keras.Model):
            return layer
        model = layer
    return None


def activation_hint(model: keras.Model) -> tuple[str, str] | None:
    """(kind, reason) from the activation of the net's last layer, or None."""
    layer = _output_layer(model)
    if layer is None:
        return None
    if isinstance(layer, keras.layers.Softmax):
        return "probabilities", f"its last layer {layer.name!r} is a Softmax layer (probabilities)"
    activation = getattr(layer, "activation", None)
    for name, kind in ACTIVATION_OUTPUTS.items():
        if activation is not None and activation is keras.activations.get(name):
            return kind, f"its last layer {layer.name!r} has activation {name!r} ({kind})"
    return None


def check_outputs_match_loss(model: keras.Model) -> str | None:
    """A warning text when the compiled loss's `from_logits` contradicts the last layer's
    activation (a softmax output scored as logits, or logits as probabilities), else None."""
    hints = [loss_hint(model), activation_hint(model)]
    if None in hints or hints[0][0] == hints[1][0]:
        return None
    return (
        f"{hints[0][1]}, but {hints[1][1]}: the likelihood of every example is computed from "
        "the wrong quantity, so the sampled target is not the posterior of this model. Set "
        "from_logits to match what the last layer returns."
    )
