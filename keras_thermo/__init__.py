"""keras_thermo: stochastic-gradient MCMC for Keras 3 `model.fit`.

Example:
    >>> import keras, keras_thermo as kt
    >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> model = kt.BayesianModel(net, kt.samplers.SGNHT(step_size=1e-3), num_examples=1000,
    ...                          prior=kt.priors.Gaussian(std=1.0), seed=0)
"""

import os as _os

_backend = _os.environ.get("KERAS_BACKEND", "tensorflow")
if _backend != "tensorflow":
    raise ImportError(
        f"keras_thermo needs the TensorFlow backend of Keras, but KERAS_BACKEND={_backend!r}; "
        "set KERAS_BACKEND=tensorflow."
    )

from keras_thermo import (  # noqa: E402
    callbacks, chains, data, diagnostics, losses, metrics, networks, per_example, priors, regression, samplers,
    schedules,
)
# `kt.random` (chain seeds), kept out of `__all__`: a star import must not shadow the standard module.
from keras_thermo import random  # noqa: E402,F401
from keras_thermo.model import BayesianModel, SamplerCollapsedError, SamplerDivergedError  # noqa: E402
from keras_thermo.posterior import evaluate_posterior, predict_posterior  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BayesianModel",
    "SamplerCollapsedError",
    "SamplerDivergedError",
    "callbacks",
    "chains",
    "data",
    "diagnostics",
    "evaluate_posterior",
    "losses",
    "metrics",
    "networks",
    "per_example",
    "predict_posterior",
    "priors",
    "regression",
    "samplers",
    "schedules",
]


def __getattr__(name):
    # `kt.models`, the old name of `kt.networks`, imported on first use (it warns when imported).
    if name == "models":
        import keras_thermo.models  # noqa: PLC0415

        return keras_thermo.models
    raise AttributeError(f"module 'keras_thermo' has no attribute {name!r}")
