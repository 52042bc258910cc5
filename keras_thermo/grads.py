"""Deprecated: per-example gradients and their covariance live in `keras_thermo.per_example`
(`flatten` / `unflatten` in `keras_thermo._tree`, also named by `keras_thermo.per_example`); this
module re-exports every public name of `keras_thermo.per_example` for one release."""

from keras_thermo._deprecation import warn_moved_module
from keras_thermo.per_example import *  # noqa: F403 (the re-export)
from keras_thermo.per_example import __all__  # noqa: F401

warn_moved_module("keras_thermo.grads", "keras_thermo.per_example")
