"""Per-example gradients and their covariance: the names of `keras_thermo.per_example`.

Kept for existing code: `per_example_gradients` (the vectorized rows), `PerExampleGradients`,
`diagonal_covariance`, `full_covariance`, `centered`, `flatten`, `unflatten`, the layer checks
(`check_per_example_compatible`, `stochastic_setting`, `stochastic_layers`) and the per-example
loss (`example_loss`). Each lives in one module of `keras_thermo.per_example`, documented there.

Example:
    >>> import tensorflow as tf
    >>> diagonal_covariance(tf.constant([[1.0, 0.0], [3.0, 0.0]])).numpy()
    array([2., 0.], dtype=float32)
"""

from keras_thermo.per_example.checks import check_per_example_compatible, stochastic_layers, stochastic_setting
from keras_thermo.per_example.losses import PER_EXAMPLE_MEAN_REDUCTIONS, LossLike, example_loss
from keras_thermo.per_example.losses import resolve_loss as _resolve_loss
from keras_thermo.per_example.statistics import (
    PerExampleGradients,
    centered,
    diagonal_covariance,
    flatten,
    full_covariance,
    unflatten,
)
from keras_thermo.per_example.vectorized import per_example_gradients

__all__ = [
    "LossLike",
    "PER_EXAMPLE_MEAN_REDUCTIONS",
    "PerExampleGradients",
    "_resolve_loss",
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
