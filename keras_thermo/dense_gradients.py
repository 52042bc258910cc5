"""Deprecated: the `Dense`-network per-example names live in `keras_thermo.per_example.dense_layers`;
this module re-exports them for one release."""

from keras_thermo._deprecation import warn_moved_module
from keras_thermo.per_example.dense_layers import (
    DenseLayerGradients,
    DenseLayerRows,
    dense_layer_gradients,
    dense_layer_incompatibility,
)

warn_moved_module("keras_thermo.dense_gradients", "keras_thermo.per_example.dense_layers")

__all__ = ["DenseLayerGradients", "DenseLayerRows", "dense_layer_gradients", "dense_layer_incompatibility"]
