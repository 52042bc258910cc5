"""The table of per-example layer rules: what a rule is (`LayerRule`, recording into a `Call`),
`register` and `rule_for`. Rules (`keras_thermo.per_example.rules`) import this module only; the
engine imports the rules, so every rule is registered before the engine walks a model.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import keras
import tensorflow as tf

from keras_thermo.per_example.blocks import ColumnBlock


class Call:
    """What one call of a hooked layer recorded: tensors with one row per example.

    `save` keeps a tensor for the rule (input rows, token ids, gates); `watch` also hands it to
    the tape, and after the backward pass the rule finds the gradient of the loss with respect
    to it under the same name with the prefix `d_`.
    """

    def __init__(self, tape: tf.GradientTape):
        self._tape = tape
        self.saved: dict[str, tf.Tensor] = {}
        self.watched: dict[str, tf.Tensor] = {}

    def save(self, name: str, tensor: Any) -> tf.Tensor:
        self.saved[name] = tf.convert_to_tensor(tensor)
        return self.saved[name]

    def watch(self, name: str, tensor: Any) -> tf.Tensor:
        tensor = tf.convert_to_tensor(tensor)
        self._tape.watch(tensor)
        self.watched[name] = tensor
        return tensor


class LayerRule(abc.ABC):
    """How one layer family gives its per-example gradients; subclasses are registered by type.

    Attributes:
        layer_types: the Keras layer classes the rule handles.
    """

    layer_types: tuple[type, ...] = ()

    def unsupported(self, layer: keras.layers.Layer) -> str | None:
        """Why this layer's configuration is beyond the rule (None: it is handled)."""
        return None

    @abc.abstractmethod
    def forward(self, layer: keras.layers.Layer, call: Call, *args, **kwargs) -> Any:
        """The layer's `call(*args, **kwargs)`, recording into `call` what `blocks` needs."""

    @abc.abstractmethod
    def blocks(self, layer: keras.layers.Layer, calls: Sequence[dict[str, tf.Tensor]]) -> list[tuple[list, ColumnBlock]]:
        """Column blocks from the layer's recorded calls (global batch, float32 where floating).

        Returns `(variables, block)` pairs: each block's slots hold these variables, in order.
        """


_RULES: dict[type, LayerRule] = {}


def register(rule: LayerRule) -> LayerRule:
    """Registers `rule` for its `layer_types` (a later registration replaces an earlier one)."""
    for layer_type in rule.layer_types:
        _RULES[layer_type] = rule
    return rule


def rule_for(layer: keras.layers.Layer) -> LayerRule | None:
    """The rule of the nearest registered class in `type(layer).__mro__`, if `call` is its own."""
    for cls in type(layer).__mro__:
        rule = _RULES.get(cls)
        if rule is not None:
            return rule if type(layer).call is cls.call else None
    return None
