"""Samplers: one module per method, each a small class over an explicit state.

`get(name, **kwargs)` builds one by name: `sgld`, `sghmc`, `sgnht`, `ccadl`, `mccadl`,
`tact_hmc`; `available()` lists the names.
"""

from __future__ import annotations

import keras

from keras_thermo.samplers import auto_step, preconditioning, thermostat
from keras_thermo.samplers.base import Sampler, StepContext
from keras_thermo.samplers.preconditioning import Preconditioner
from keras_thermo.samplers.ccadl import CCAdL
from keras_thermo.samplers.mccadl import MCCAdL
from keras_thermo.samplers.sghmc import SGHMC
from keras_thermo.samplers.sgld import SGLD
from keras_thermo.samplers.sgnht import SGNHT
from keras_thermo.samplers.tact_hmc import TACTHMC

_REGISTRY: dict[str, type[Sampler]] = {
    "sgld": SGLD,
    "sghmc": SGHMC,
    "sgnht": SGNHT,
    "ccadl": CCAdL,
    "mccadl": MCCAdL,
    "tact_hmc": TACTHMC,
}


def available() -> list[str]:
    """The names `get` accepts."""
    return sorted(_REGISTRY)


def register(name: str, cls: type[Sampler]) -> None:
    """Makes `cls` available to `get(name)`."""
    _REGISTRY[name] = cls


def get(identifier, **kwargs) -> Sampler:
    """Returns a sampler from a name (with keyword hyperparameters), a config dict or an instance.

    Example:
        >>> import keras_thermo as kt
        >>> kt.samplers.get("sgnht", step_size=1e-3).name
        'sgnht'
    """
    return _resolve(identifier, kwargs, argument="identifier")


def _resolve(value, kwargs: dict, *, argument: str) -> Sampler:
    """`get`, with errors that name `argument` (`BayesianModel`'s `sampler`): a Keras optimizer
    or a sampler class instead of an instance are the common slips."""
    if isinstance(value, Sampler):
        if kwargs:
            raise ValueError(
                f"Keyword arguments {sorted(kwargs)} were given with the sampler instance "
                f"{value!r}; pass either an instance, or a name with keyword arguments."
            )
        return value
    if isinstance(value, dict):
        class_name = value.get("class_name")
        library_classes = {cls.__name__ for cls in _REGISTRY.values() if cls.__module__.startswith("keras_thermo.")}
        if isinstance(class_name, str) and class_name in library_classes:
            # Keras registers them as "keras_thermo>Name"; the plain name is what users write.
            value = {**value, "class_name": f"keras_thermo>{class_name}"}
        sampler = keras.saving.deserialize_keras_object(value)
        if not isinstance(sampler, Sampler):
            raise TypeError(
                f"`{argument}` was a config dict of {type(sampler).__name__}, not of a keras_thermo sampler "
                f"(one of {available()})."
            )
        return sampler
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
        if key not in _REGISTRY:
            raise ValueError(f"`{argument}` must be one of {sorted(_REGISTRY)}, got {value!r}.")
        return _REGISTRY[key](**kwargs)
    if isinstance(value, type) and issubclass(value, Sampler):
        raise TypeError(
            f"`{argument}` must be a sampler instance, a name or a config dict, got the class "
            f"{value.__name__}: pass an instance, {value.__name__}()."
        )
    if isinstance(value, keras.optimizers.Optimizer):
        raise TypeError(
            f"`{argument}` must be a keras_thermo sampler (an instance such as kt.samplers.SGNHT(), or one "
            f"of {available()}), got the Keras optimizer {type(value).__name__}: a BayesianModel draws "
            "samples with a sampler in place of an optimizer."
        )
    raise TypeError(
        f"`{argument}` must be a sampler instance, one of {available()} or a config dict, got "
        f"{type(value).__name__}: {value!r}."
    )


__all__ = [
    "Sampler", "StepContext", "SGLD", "SGHMC", "SGNHT", "CCAdL", "MCCAdL", "TACTHMC",
    "Preconditioner", "available", "get", "preconditioning", "register",
]
