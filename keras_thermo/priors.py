"""Priors over the trainable weights.

A prior contributes `R(theta) = -log prior(theta)` to the potential `U = N * L + R`. It is not
scaled by the number of examples (DESIGN section 3). The normalising constant is included, so
`R` is the exact negative log density and the logged `potential` is a true negative log
posterior up to the likelihood's own constant.

A prior may have state of its own (`HierarchicalGaussian`'s precisions): `initial_state` says
what it is, `BayesianModel` keeps it in non-trainable variables (so checkpoints hold it), binds
them to the prior, and after every sampler step calls `update_state`, a pure function of the
state, the weights, the step and the seed.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_int, check_positive


@keras.saving.register_keras_serializable(package="keras_thermo")
class Prior:
    """Base class: a callable mapping the list of trainable variables to `R = -log prior`."""

    def __call__(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        raise NotImplementedError

    def force(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor] | None:
        """`-grad R` per variable in closed form (each in its variable's dtype), or None (the
        default): the sampling step then differentiates `R` with the rest of `U`. A closed form
        is one product per weight where differentiating `R` costs three passes over it (a
        broadcast and two products) before the sum with the data's force. The library's priors
        give it only where `__call__` is their own: a subclass that changes the density without
        its force is differentiated."""
        del variables
        return None

    def _has_own_density(self, cls) -> bool:
        """Whether `__call__` is `cls`'s (not a subclass's other density)."""
        return type(self).__call__ is cls.__call__

    # --- state (none by default) ----------------------------------------------------------------

    def initial_state(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
        """The prior's own state for these weights (an empty list: stateless)."""
        del variables
        return []

    def bind_state(self, state_variables: Sequence[tf.Variable]) -> None:
        """Makes `__call__` read the state from `state_variables` (created by the model)."""
        del state_variables

    @property
    def is_bound(self) -> bool:
        """Whether a model's variables hold this prior's state."""
        return False

    def update_state(self, state, variables, *, step, seed: int, temperature) -> list[tf.Tensor]:
        """The state after the sampler step that completed `step` steps (weights `variables`)."""
        del variables, step, seed, temperature
        return list(state)

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

    def force(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor] | None:
        """`-theta / std^2`, in float32 as `__call__` computes R, with the coefficient rounded as
        the derivative of `theta^2 / (2 std^2)` is (`-2 / (2 std^2)`): for float32 weights on one
        replica, the numbers differentiation gives."""
        if not self._has_own_density(Gaussian):
            return None
        forces = []
        for variable, std in zip(variables, self.stds_for(variables)):
            value = tf.convert_to_tensor(variable)
            coefficient = tf.constant(-2.0, tf.float32) / tf.constant(2.0 * std**2, tf.float32)
            forces.append(tf.cast(tf.cast(value, tf.float32) * coefficient, value.dtype))
        return forces

    def get_config(self) -> dict:
        return {"std": self.std}


@keras.saving.register_keras_serializable(package="keras_thermo")
class FanInGaussian(Gaussian):
    """A Gaussian prior whose scale follows each layer's width: `N(0, scale^2 / fan_in)` on the
    entries of a kernel and `N(0, bias_std^2)` on vectors and scalars (biases, normalisation).

    A kernel's fan-in is the product of all its dimensions but the last (a Dense kernel's inputs;
    a convolution's window size times its input channels; an LSTM's inputs or units). With that
    scaling the prior's function keeps the same spread however wide the layers are (Neal 1996),
    where a fixed `N(0, 1)` on a layer of width H makes the next layer's pre-activations grow as
    `sqrt(H)`: a prior far wider than standardized targets call for. The rule reads only shapes:
    an Embedding's table `[vocabulary, dim]` counts its vocabulary as fan-in; give such a net a
    `Gaussian` with a per-variable `std` dict where that is not wanted.

    Args:
        scale: Positive float: the standard deviation of a kernel entry times `sqrt(fan_in)`.
        bias_std: Positive float: the standard deviation of every rank-0 or rank-1 variable.

    Example:
        >>> import numpy as np
        >>> prior = FanInGaussian(scale=1.0, bias_std=1.0)
        >>> kernel, bias = keras.Variable(np.zeros((4, 3), "float32")), keras.Variable(np.zeros(3, "float32"))
        >>> prior.stds_for([kernel, bias])
        [0.5, 1.0]

    Reference:
        R. M. Neal, "Bayesian Learning for Neural Networks", Springer 1996, chapter 2 (priors
        whose hidden-to-output scale falls as one over the square root of the width).
    """

    def __init__(self, scale: float = 1.0, bias_std: float = 1.0):
        # Gaussian's density, with the std of each variable from its shape (no `std` of its own).
        self.scale = check_positive("scale", scale)
        self.bias_std = check_positive("bias_std", bias_std)

    def stds_for(self, variables: Sequence[tf.Variable]) -> list[float]:
        stds = []
        for variable in variables:
            shape = tuple(variable.shape)
            fan_in = math.prod(shape[:-1]) if len(shape) >= 2 else 0
            stds.append(self.scale / math.sqrt(fan_in) if fan_in > 0 else self.bias_std)
        return stds

    def get_config(self) -> dict:
        return {"scale": self.scale, "bias_std": self.bias_std}


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

    def force(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor] | None:
        """`-sign(theta) / b` in float32 (0 at 0, as differentiation gives)."""
        if not self._has_own_density(Laplace):
            return None
        coefficient = tf.constant(-1.0, tf.float32) / tf.constant(self.scale, tf.float32)
        forces = []
        for variable in variables:
            value = tf.convert_to_tensor(variable)
            forces.append(tf.cast(tf.sign(tf.cast(value, tf.float32)) * coefficient, value.dtype))
        return forces

    def get_config(self) -> dict:
        return {"scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_thermo")
class HierarchicalGaussian(Prior):
    """A zero-mean Gaussian prior per weight variable whose precision is sampled too.

    Each trainable variable v (a layer's kernel, its bias...) with n_v scalars has
    `w_v ~ N(0, I / lambda_v)` and a hyperprior `lambda_v ~ Gamma(alpha, beta)` (shape, rate), so
    no prior scale needs tuning: the data set each layer's. The sampler moves the weights at fixed
    lambda; every `resample_every` steps lambda is drawn from its exact conditional (a Gibbs
    step, as in the Bayesian neural network experiment of Chen et al. 2014). At T = 1

        lambda_v | w ~ Gamma(alpha + n_v / 2, beta + |w_v|^2 / 2).

    The joint target is `exp(-U(w, lambda) / T)` with
    `U = N L + sum_v [lambda_v |w_v|^2 / 2 - (n_v / 2) log(lambda_v / 2 pi) - log Gamma(lambda_v;
    alpha, beta)]` (the last two terms are `R`'s part that does not move the weights), whose
    conditional at temperature T is

        lambda_v | w ~ Gamma((alpha + n_v / 2 - 1) / T + 1, (beta + |w_v|^2 / 2) / T),

    the form used here (it is the one above at T = 1). T is the temperature the weights are
    sampled at after the step, `sampler.parameter_temperature`: under TACT-HMC, whose joint
    target is `exp(-lambda(xi) U / T - W(xi) / T)`, the conditional given the weights and xi is
    the one above at `T / lambda(xi)` (T on the plateau, up to 9 T at the walls). Its shape is
    positive at every T when
    `alpha + n_v / 2 >= 1`, which is required of every variable (a scalar variable needs
    `alpha >= 1/2`).

    The precisions live in model variables (`prior_precision_<i>`), the draws are keyed by
    (seed, step), so checkpoints and resumed runs continue the same chain. The first
    `resample_every` steps use `initial_std`.

    Args:
        alpha: Shape of the Gamma hyperprior, > 0 (default 1).
        beta: Rate of the Gamma hyperprior, > 0 (default 1).
        resample_every: K >= 1: lambda is redrawn after every K-th sampler step.
        initial_std: The prior std `1 / sqrt(lambda)` of every variable before the first draw.

    Example:
        >>> import numpy as np
        >>> prior = HierarchicalGaussian(alpha=1.0, beta=1.0, resample_every=100, initial_std=2.0)
        >>> w = [keras.Variable(np.array([1.0, -1.0], "float32"))]
        >>> [float(p) for p in prior.initial_state(w)]
        [0.25]

    Reference:
        T. Chen, E. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo",
        ICML 2014, the Bayesian neural network experiments (Gamma hyperpriors on the weight
        precisions, sampled by Gibbs steps between SGHMC updates).
    """

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, resample_every: int = 100, initial_std: float = 1.0):
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self.resample_every = check_int("resample_every", resample_every, low=1)
        self.initial_std = check_positive("initial_std", initial_std)
        self._precision_variables = None

    def initial_state(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
        """One float32 precision per variable, `1 / initial_std^2`; refuses variables whose
        tempered conditional could be improper (class doc)."""
        for index, variable in enumerate(variables):
            size = int(math.prod(variable.shape))
            if self.alpha + size / 2 < 1:
                raise ValueError(
                    f"HierarchicalGaussian: `alpha` {self.alpha!r} is too small for variable "
                    f"{getattr(variable, 'path', f'#{index}')!r} with {size} scalar(s): the "
                    "conditional Gamma((alpha + n/2 - 1)/T + 1, ...) of its precision needs "
                    "alpha + n/2 >= 1 to be proper at every temperature; use alpha >= "
                    f"{1 - size / 2:g}."
                )
        return [tf.constant(1.0 / self.initial_std**2, tf.float32) for _ in variables]

    def bind_state(self, state_variables: Sequence[tf.Variable]) -> None:
        self._precision_variables = list(state_variables)

    @property
    def is_bound(self) -> bool:
        return self._precision_variables is not None

    def precisions(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
        """The current precision of each variable (the bound state, else the initial one)."""
        if self._precision_variables is None:
            return self.initial_state(variables)
        if len(self._precision_variables) != len(variables):
            raise ValueError(
                f"HierarchicalGaussian holds {len(self._precision_variables)} precisions but was "
                f"given {len(variables)} variables."
            )
        return [tf.convert_to_tensor(p) for p in self._precision_variables]

    def __call__(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        total = tf.constant(0.0, tf.float32)
        log_normaliser = math.lgamma(self.alpha) - self.alpha * math.log(self.beta)
        for variable, precision in zip(variables, self.precisions(variables)):
            value = tf.cast(tf.convert_to_tensor(variable), tf.float32)
            size = float(math.prod(value.shape))
            log_precision = tf.math.log(precision)
            total += 0.5 * precision * tf.reduce_sum(tf.square(value))
            total -= 0.5 * size * (log_precision - math.log(2.0 * math.pi))
            # -log Gamma(lambda; alpha, beta): constant in the weights, part of the joint U.
            total += log_normaliser - (self.alpha - 1.0) * log_precision + self.beta * precision
        return total

    def force(self, variables: Sequence[tf.Variable]) -> list[tf.Tensor] | None:
        """`-lambda_v theta` in float32 with each variable's current precision."""
        if not self._has_own_density(HierarchicalGaussian):
            return None
        values = [tf.convert_to_tensor(variable) for variable in variables]
        return [tf.cast(tf.cast(value, tf.float32) * -tf.cast(precision, tf.float32), value.dtype)
                for value, precision in zip(values, self.precisions(variables))]

    def conditional(self, variables, temperature) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """`(shape, rate)` (float64) of each precision's conditional at temperature T."""
        temperature = tf.cast(temperature, tf.float64)
        result = []
        for variable in variables:
            value = tf.cast(tf.convert_to_tensor(variable), tf.float64)
            size = float(math.prod(value.shape))
            shape = (self.alpha + 0.5 * size - 1.0) / temperature + 1.0
            rate = (self.beta + 0.5 * tf.reduce_sum(tf.square(value))) / temperature
            result.append((shape, rate))
        return result

    def draw(self, variables, *, step, seed: int, temperature) -> list[tf.Tensor]:
        """One Gibbs draw of every precision given the weights, keyed by (seed, step)."""
        key = kt_random.step_key(seed, step, kt_random.STREAM_PRIOR)
        draws = []
        for index, (shape, rate) in enumerate(self.conditional(variables, temperature)):
            sub_key = tf.random.experimental.stateless_fold_in(key, index)
            gamma = tf.random.stateless_gamma([], seed=sub_key, alpha=shape, dtype=tf.float64)
            draws.append(tf.cast(gamma / rate, tf.float32))
        return draws

    def update_state(self, state, variables, *, step, seed: int, temperature) -> list[tf.Tensor]:
        """A fresh draw after every `resample_every`-th step, else the state unchanged."""
        due = tf.equal(tf.math.floormod(tf.cast(step, tf.int64), self.resample_every), 0)
        drawn = self.draw(variables, step=step, seed=seed, temperature=temperature)
        return [tf.where(due, new, old) for new, old in zip(drawn, state)]

    def get_config(self) -> dict:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "resample_every": self.resample_every,
            "initial_std": self.initial_std,
        }


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
