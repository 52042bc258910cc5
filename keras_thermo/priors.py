"""Priors over the trainable weights.

A prior contributes `R(theta) = -log prior(theta)` to the potential `U = N * L + R`. It is not
scaled by the number of examples (DESIGN section 3). The normalising constant is included, so
`R` is the exact negative log density and the logged `potential` is a true negative log
posterior up to the likelihood's own constant.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import keras
import tensorflow as tf

from keras_thermo._validation import check_positive


@keras.saving.register_keras_serializable(package="keras_thermo")
class Prior:
    """Base class: a callable mapping the list of trainable variables to `R = -log prior`."""

    def __call__(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict) -> "Prior":
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_thermo")
class Gaussian(Prior):
    """Independent zero-mean Gaussian prior `N(0, std^2)` on every trainable scalar.

    `R(theta) = sum_i theta_i^2 / (2 std_i^2) + (1/2) log(2 pi std_i^2)`.

    Args:
        std: Standard deviation. A positive float applies to every weight; a list gives one
            value per trainable variable, in `model.trainable_variables` order; a dict maps a
            variable's `path` (e.g. `"sequential/dense/kernel"`) to its std, with the key
            `"default"` for the rest.

    Example:
        >>> import numpy as np
        >>> prior = Gaussian(std=2.0)
        >>> w = [keras.Variable(np.array([1.0, -1.0], "float32"))]
        >>> bool(np.isclose(float(prior(w)), 2 * (1 / 8 + 0.5 * np.log(2 * np.pi * 4)), rtol=1e-6))
        True
    """

    def __init__(self, std: float | Sequence[float] | dict = 1.0):
        if isinstance(std, dict):
            self.std = {str(k): check_positive(f"std[{k!r}]", v) for k, v in std.items()}
        elif isinstance(std, (list, tuple)):
            if not std:
                raise ValueError("`std` must be a positive float, a non-empty list or a dict, got [].")
            self.std = [check_positive(f"std[{i}]", v) for i, v in enumerate(std)]
        else:
            self.std = check_positive("std", std)

    def stds_for(self, variables: Sequence[tf.Variable]) -> list[float]:
        """The std that applies to each variable, in order."""
        if isinstance(self.std, float):
            return [self.std] * len(variables)
        if isinstance(self.std, list):
            if len(self.std) != len(variables):
                raise ValueError(
                    f"`std` has {len(self.std)} entries but the model has {len(variables)} "
                    "trainable variables; give one std per variable or a single float."
                )
            return list(self.std)
        stds = []
        for variable in variables:
            path = getattr(variable, "path", variable.name)
            if path in self.std:
                stds.append(self.std[path])
            elif "default" in self.std:
                stds.append(self.std["default"])
            else:
                raise ValueError(
                    f"`std` has no entry for variable {path!r} and no 'default' key; "
                    f"keys given: {sorted(self.std)}."
                )
        return stds

    def __call__(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        total = tf.constant(0.0, tf.float32)
        for variable, std in zip(variables, self.stds_for(variables)):
            value = tf.cast(tf.convert_to_tensor(variable), tf.float32)
            size = tf.cast(tf.size(value), tf.float32)
            total += tf.reduce_sum(tf.square(value)) / (2.0 * std**2)
            total += size * 0.5 * math.log(2.0 * math.pi * std**2)
        return total

    def get_config(self) -> dict:
        return {"std": self.std}


@keras.saving.register_keras_serializable(package="keras_thermo")
class Laplace(Prior):
    """Independent zero-mean Laplace prior with scale `b`: `R = sum |theta_i| / b + log(2 b)`.

    Args:
        scale: Positive float `b`.

    Example:
        >>> prior = Laplace(scale=1.0)
    """

    def __init__(self, scale: float = 1.0):
        self.scale = check_positive("scale", scale)

    def __call__(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        total = tf.constant(0.0, tf.float32)
        for variable in variables:
            value = tf.cast(tf.convert_to_tensor(variable), tf.float32)
            total += tf.reduce_sum(tf.abs(value)) / self.scale
            total += tf.cast(tf.size(value), tf.float32) * math.log(2.0 * self.scale)
        return total

    def get_config(self) -> dict:
        return {"scale": self.scale}


def get(identifier: Prior | dict | None) -> Prior | None:
    """Returns a prior from an instance, a serialized config, or None (flat prior)."""
    if identifier is None or isinstance(identifier, Prior):
        return identifier
    if isinstance(identifier, dict):
        return keras.saving.deserialize_keras_object(identifier)
    if isinstance(identifier, Callable):
        raise TypeError(
            f"`prior` must be a keras_thermo.priors.Prior, a serialized prior dict or None, got "
            f"the callable {identifier!r}; wrap it in a Prior subclass so it can be saved."
        )
    raise TypeError(
        "`prior` must be a keras_thermo.priors.Prior, a serialized prior dict or None, got "
        f"{identifier!r}."
    )
