"""Deprecated: per-example gradients and their covariance live in `keras_thermo.per_example`
(`flatten` / `unflatten` in `keras_thermo._tree`, also named by `keras_thermo.per_example`); this
module re-exports `per_example_gradients`, `PerExampleGradients`, `diagonal_covariance`,
`full_covariance`, `centered`, `flatten`, `unflatten`, the layer checks
(`check_per_example_compatible`, `stochastic_setting`, `stochastic_layers`) and `example_loss`
for one release."""

from keras_thermo._deprecation import warn_moved_module
from keras_thermo._tree import flatten, unflatten
from keras_thermo.per_example.checks import check_per_example_compatible, stochastic_layers, stochastic_setting
from keras_thermo.per_example.losses import PER_EXAMPLE_MEAN_REDUCTIONS, LossLike, example_loss
from keras_thermo.per_example.statistics import (
    PerExampleGradients,
    centered,
    diagonal_covariance,
    full_covariance,
)
from keras_thermo.per_example.vectorized import per_example_gradients

warn_moved_module("keras_thermo.grads", "keras_thermo.per_example")

__all__ = [
    "LossLike",
    "PER_EXAMPLE_MEAN_REDUCTIONS",
    "PerExampleGradients",
    "centered",
    "check_per_example_compatible",
    "diagonal_covariance",
    "example_loss",
    "flatten",
    "full_covariance",
    "per_example_gradients",
    "stochastic_layers",
    "stochastic_setting",
    "unflatten",
]
