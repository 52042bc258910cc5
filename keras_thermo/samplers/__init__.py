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
    if isinstance(identifier, Sampler):
        if kwargs:
            raise ValueError(
                f"Keyword arguments {sorted(kwargs)} were given with the sampler instance "
                f"{identifier!r}; pass either an instance, or a name with keyword arguments."
            )
        return identifier
    if isinstance(identifier, dict):
        return keras.saving.deserialize_keras_object(identifier)
    if isinstance(identifier, str):
        key = identifier.lower().replace("-", "_")
        if key not in _REGISTRY:
            raise ValueError(f"`identifier` must be one of {sorted(_REGISTRY)}, got {identifier!r}.")
        return _REGISTRY[key](**kwargs)
    raise TypeError(
        f"`identifier` must be a sampler name, a config dict or a Sampler, got {identifier!r}."
    )


__all__ = [
    "Sampler", "StepContext", "SGLD", "SGHMC", "SGNHT", "CCAdL", "MCCAdL", "TACTHMC",
    "Preconditioner", "available", "get", "preconditioning", "register",
]
