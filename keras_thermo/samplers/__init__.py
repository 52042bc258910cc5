"""Samplers: one module per method, each a small class over an explicit state.

`get(name, **kwargs)` builds one by name: `sgld`, `sghmc`, `sgnht` (and, as they are added,
`ccadl`, `mccadl`, `tact_hmc`).
"""

from __future__ import annotations

import keras

from keras_thermo.samplers.base import Sampler, StepContext
from keras_thermo.samplers.sghmc import SGHMC
from keras_thermo.samplers.sgld import SGLD
from keras_thermo.samplers.sgnht import SGNHT

_REGISTRY: dict[str, type[Sampler]] = {
    "sgld": SGLD,
    "sghmc": SGHMC,
    "sgnht": SGNHT,
}


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
            raise ValueError(f"Keyword arguments {sorted(kwargs)} given with a sampler instance.")
        return identifier
    if isinstance(identifier, dict):
        return keras.saving.deserialize_keras_object(identifier)
    if isinstance(identifier, str):
        key = identifier.lower().replace("-", "_")
        if key not in _REGISTRY:
            raise ValueError(f"`name` must be one of {sorted(_REGISTRY)}, got {identifier!r}.")
        return _REGISTRY[key](**kwargs)
    raise TypeError(
        f"`identifier` must be a sampler name, a config dict or a Sampler, got {identifier!r}."
    )


__all__ = ["Sampler", "StepContext", "SGLD", "SGHMC", "SGNHT", "get", "register"]
