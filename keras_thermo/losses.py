"""Likelihoods for regression, as Keras losses whose per-example terms are exact negative log densities.

`BayesianModel`'s potential is `U = N * mean_batch(loss) + prior`, so a loss that returns
each example's exact `-log p(y_i | x_i, theta)` makes `U` the exact negative log posterior (up
to a constant that does not depend on `theta`). Keras' `"mse"` is the Gaussian likelihood with
noise variance 1/2 and its constant dropped; these losses name the noise model instead:

- `GaussianNLL(scale=s)`: Gaussian noise of fixed standard deviation `s`; the net emits one
  unit per target, the mean.
- `GaussianNLL()`: heteroscedastic Gaussian noise learned with the weights; the net emits two
  units per target, `D` means then `D` raw scales (`y_pred[..., :D]`, `y_pred[..., D:]`; for one
  target `y_pred[..., 0]` is the mean and `y_pred[..., 1]` the raw scale), and the standard
  deviation is `softplus(raw) + min_scale`.
- `StudentTNLL(df, scale=...)`: the same with Student-t noise of `df` degrees of freedom (heavy
  tails, robust to outliers); `scale` is the t scale, not the standard deviation.

The floor `min_scale` (default 1e-3, in the targets' units) keeps `log sigma` and `1 / sigma`
finite when the raw scale runs to -inf; with standardized targets
(`keras_thermo.regression.TargetScaler`) it is 0.1% of the targets' spread, well below any
noise level a model should report. It is part of the likelihood: the predictive distributions
of `keras_thermo.regression` use the same `parameters()` map.

Shapes: `y_true` is `[..., D]` (or `[...]`, one target), `y_pred` is `[..., D]` with a fixed
scale or `[..., 2 D]` with a learned one. The per-example term is the negative log density of
the example's `D` targets (the sum over the last axis), so with Keras' default mean reduction
`num_examples * loss` is the negative log likelihood of the data set.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_thermo._validation import check_optional_positive, check_positive

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


class _LocationScaleNLL(keras.losses.Loss):
    """Negative log density of a location-scale family; subclasses give `_standard_nll(z)`,
    the negative log density of the standard member at `z` (without the `log sigma` term)."""

    def __init__(self, scale=None, min_scale=1e-3, *, name, reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.scale = check_optional_positive("scale", scale)
        self.min_scale = check_positive("min_scale", min_scale)

    @property
    def learned_scale(self) -> bool:
        """True when the net emits the scale (two units per target), False for a fixed `scale`."""
        return self.scale is None

    @property
    def units_per_target(self) -> int:
        return 2 if self.learned_scale else 1

    def parameters(self, y_pred):
        """`(loc, scale)`, each `[..., D]`, from the net's outputs `y_pred` (`[..., D]` with a
        fixed scale, `[..., 2 D]` with a learned one: `softplus(raw) + min_scale`)."""
        y_pred = ops.convert_to_tensor(y_pred)
        if not self.learned_scale:
            return y_pred, ops.full_like(y_pred, self.scale)
        units = y_pred.shape[-1]
        if units is not None and units % 2:
            raise ValueError(
                f"{type(self).__name__}() with a learned scale needs two outputs per target "
                f"(D means, then D raw scales), but `y_pred` has shape {tuple(y_pred.shape)} with "
                f"{units} (odd) in its last axis. Give the last layer 2 * D units, or pass a fixed "
                "`scale=` for one unit per target."
            )
        loc, raw = ops.split(y_pred, 2, axis=-1)
        return loc, ops.softplus(raw) + ops.cast(self.min_scale, raw.dtype)

    def call(self, y_true, y_pred):
        y_pred = ops.convert_to_tensor(y_pred)
        loc, scale = self.parameters(y_pred)
        y_true = ops.cast(y_true, loc.dtype)
        if len(y_true.shape) == len(loc.shape) - 1:  # targets [n] against outputs [n, 1 or 2]
            y_true = ops.expand_dims(y_true, -1)
        if len(y_true.shape) != len(loc.shape) or (
            None not in (y_true.shape[-1], loc.shape[-1]) and y_true.shape[-1] != loc.shape[-1]
        ):
            raise ValueError(
                f"{type(self).__name__}: `y_true` of shape {tuple(y_true.shape)} does not match "
                f"`y_pred` of shape {tuple(y_pred.shape)}: with "
                f"{'a learned' if self.learned_scale else 'a fixed'} scale the net emits "
                f"{self.units_per_target} unit(s) per target, so y_pred's last axis must be "
                f"{self.units_per_target} * y_true's."
            )
        z = (y_true - loc) / scale
        return ops.sum(self._standard_nll(z) + ops.log(scale), axis=-1)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"scale": self.scale, "min_scale": self.min_scale})
        return config


@keras.saving.register_keras_serializable(package="keras_thermo")
class GaussianNLL(_LocationScaleNLL):
    """Negative log density of Gaussian noise: `0.5 z^2 + log sigma + 0.5 log(2 pi)`, `z = (y - mu) / sigma`.

    Args:
        scale: Fixed noise standard deviation `sigma > 0` (the net emits one unit per target,
            the mean); None (default) learns it: the net emits `D` means then `D` raw scales and
            `sigma = softplus(raw) + min_scale`.
        min_scale: Floor added to the learned standard deviation (> 0, default 1e-3, in the
            targets' units); unused with a fixed `scale`.
        name, reduction, dtype: As for `keras.losses.Loss`; `BayesianModel` needs a mean
            reduction (the default).

    Example:
        >>> import numpy as np
        >>> loss = GaussianNLL(scale=1.0)
        >>> round(float(loss(np.zeros((2, 1)), np.zeros((2, 1)))), 4)  # 0.5 log(2 pi)
        0.9189
        >>> learned = GaussianNLL()  # outputs [mean, raw scale]
        >>> y_pred = np.array([[0.0, 0.0]], "float32")  # sigma = softplus(0) + 1e-3 = 0.6941
        >>> round(float(learned(np.zeros((1, 1)), y_pred)), 4)  # 0.9189 + log(0.6941)
        0.5539
    """

    def __init__(self, scale=None, min_scale=1e-3, name="gaussian_nll", reduction="sum_over_batch_size", dtype=None):
        super().__init__(scale, min_scale, name=name, reduction=reduction, dtype=dtype)

    def _standard_nll(self, z):
        return 0.5 * ops.square(z) + _HALF_LOG_TWO_PI


@keras.saving.register_keras_serializable(package="keras_thermo")
class StudentTNLL(_LocationScaleNLL):
    """Negative log density of Student-t noise with `df` degrees of freedom and scale `sigma`.

    `(df + 1) / 2 log(1 + z^2 / df) + log sigma - log Gamma((df + 1) / 2) + log Gamma(df / 2)
    + 0.5 log(df pi)`, `z = (y - mu) / sigma`. Heavier tails than `GaussianNLL`: an outlier
    costs `log |z|` rather than `z^2`. `sigma` is the t scale (the standard deviation is
    `sigma sqrt(df / (df - 2))` for `df > 2`).

    Args:
        df: Degrees of freedom, > 0.
        scale, min_scale, name, reduction, dtype: As for `GaussianNLL`.

    Example:
        >>> import numpy as np
        >>> round(float(StudentTNLL(df=1.0, scale=1.0)(np.zeros((1, 1)), np.zeros((1, 1)))), 4)  # log pi
        1.1447
    """

    def __init__(
        self, df, scale=None, min_scale=1e-3, name="student_t_nll", reduction="sum_over_batch_size", dtype=None
    ):
        super().__init__(scale, min_scale, name=name, reduction=reduction, dtype=dtype)
        self.df = check_positive("df", df)
        self._constant = (
            math.lgamma(self.df / 2.0) - math.lgamma((self.df + 1.0) / 2.0) + 0.5 * math.log(self.df * math.pi)
        )

    def _standard_nll(self, z):
        return 0.5 * (self.df + 1.0) * ops.log1p(ops.square(z) / self.df) + self._constant

    def get_config(self) -> dict:
        config = super().get_config()
        config["df"] = self.df
        return config


# One noise scale for every input: the raw-scale column GaussianNLL() reads, as a layer.


@keras.saving.register_keras_serializable(package="keras_thermo")
class SharedNoiseScale(keras.layers.Layer):
    """Appends one learned raw noise scale, the same for every input, to each row of means: the
    `[mean, raw scale]` pairs that `keras_thermo.losses.GaussianNLL()` reads, for homoscedastic
    noise learned with the weights (a prior on the weights covers the raw scale too; the fan-in
    prior treats it as a bias).

    Put it after a `Dense(D)` of D means; the net then emits `2 D` columns.

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1), kt.regression.SharedNoiseScale()])
        >>> outputs = net(np.ones((4, 3), "float32")).numpy()
        >>> outputs.shape, outputs[:, 1].tolist()        # the raw scale starts at 0 for every row
        ((4, 2), [0.0, 0.0, 0.0, 0.0])

    Reference: the homoscedastic Gaussian likelihood of Bayesian neural-network regression, as
    in the UCI benchmarks of Hernandez-Lobato and Adams (2015).
    """

    def build(self, input_shape):
        self.raw_scale_initializer = keras.initializers.Zeros()  # what each chain of several starts from
        self.raw_scale = self.add_weight(shape=(int(input_shape[-1]),), initializer=self.raw_scale_initializer,
                                         name="raw_scale")

    def call(self, means):
        return keras.ops.concatenate([means, keras.ops.zeros_like(means) + self.raw_scale], axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 2 * input_shape[-1])


__all__ = ["GaussianNLL", "StudentTNLL"]
