"""Several chains of one network in one `fit` (`BayesianModel(num_chains=C)`).

Layout. Chain 0 lives in the net's own trainable variables, so `predict`, `evaluate`, `save_weights`
and everything else that reads the net sees chain 0 (the *active chain*). Chains 1..C-1 live in one
non-trainable variable per trainable variable, shaped `[C - 1, *shape]`; the sampler state keeps a
leading chain axis `[C, ...]` on every leaf except the shared step counter. Everything is a model
variable, so checkpoints, `model.save` and exact resume work as with one chain.

Starts and noise. Chain k's noise is keyed by `keras_thermo.random.chain_seed(seed, k)` (chain 0:
the model seed), and chains 1..C-1 start from the net's initializers redrawn with seeds derived
from theirs (`redrawn_initial_weights`); chain 0 keeps the net's weights. Chain k of a C-chain run
is therefore the one-chain run seeded `chain_seed(seed, k)` from chain k's start, given the same
minibatches.

Minibatches. By default (`chain_minibatches="split"`) every chain gets examples of its own at each
step: `fit` on arrays draws `batch_size` examples per chain (C * batch_size per step), and a
pipeline's batch is cut into C equal parts, so each chain's gradient noise is that of a
one-chain run with the same batch size. A batch that does not split into C equal parts is
refused before the first step where its size is known (`batch_size`, a pipeline batched with
`drop_remainder=True`), and otherwise stops `fit` at that batch with a `ValueError` naming
`batch_size` and `num_chains`, nothing of that step applied. `"shared"` gives every chain the whole
batch; that correlates the chains' gradient noise, which can make them look more alike than
independent runs and bias R-hat towards 1 (`benchmarks/chains.py` measures it).

Under tf.distribute every replica runs every chain on its slice of the batch (data parallel);
with split batches each replica cuts its own slice into C parts, so chain k's examples are
replica-wise parts (the same examples as on one device only with shared batches).

Cost. One train step serves one and C chains. The C forward and backward passes run as a loop of
C passes in the compiled step, each under a `keras.StatelessScope` that maps the net's variables
to the chain's values (the per-example engine of CCAdL/mCCAdL records each pass), or, for
samplers without per-example statistics, as one `tf.vectorized_map` over the chain axis
(`chain_method="vectorized"`); the sampler updates run as a loop over chains.
`benchmarks/chains.py` measures both.

Recording. `SampleCollector` and `PosteriorAverage` get one `[C, Nd]` row per due step at which
some chain yields a sample, with a mask `[C]` of the chains that do, and keep each chain's own
samples. With every sampler but TACT-HMC the chains agree (`SampleCollector.samples`
`[C, S, Nd]`, `steps` `[S]`); TACT-HMC's chains yield samples on the plateau of their own
tempering variable, at different steps and in different numbers (`SampleCollector.chain_samples(k)`
and `chain_steps(k)` give chain k's; `samples` each chain's most recent `S`, the smallest count).

Logs. The usual names (`kinetic_temperature`, `configurational_temperature`, `xi`, `potential`,
`loss`, compiled metrics...) hold chain means; for C <= `MAX_LOGGED_CHAINS` the per-chain
`kinetic_temperature_chain_k`, `configurational_temperature_chain_k` and `xi_chain_k` go to the
logs too (History, TensorBoard), and the progress bar leaves them out.
"""

from __future__ import annotations

import re
import warnings
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_int

#: How the C forward/backward passes are computed (`BayesianModel(chain_method=...)`).
CHAIN_METHODS = ("auto", "vectorized", "loop")

#: Whether the chains share each minibatch or split it (`BayesianModel(chain_minibatches=...)`).
CHAIN_MINIBATCHES = ("split", "shared")

#: Largest C for which each chain's temperatures and xi are logged under their own names.
MAX_LOGGED_CHAINS = 8

#: Logged quantities that also get one entry per chain.
PER_CHAIN_LOGS = ("kinetic_temperature", "configurational_temperature", "xi")

_CHAIN_LOG = re.compile(r"_chain_\d+$")


def chain_log_name(name: str, chain: int) -> str:
    """The log name of chain `chain`'s value of `name`, e.g. `xi_chain_2`."""
    return f"{name}_chain_{chain}"


def is_chain_log(name: str) -> bool:
    """Whether a log entry is one chain's value (left out of the progress bar)."""
    return bool(_CHAIN_LOG.search(name))


# --- initial weights ----------------------------------------------------------------------------


def _owned_variables(layer) -> list:
    """The trainable variables `layer` created itself (not its sublayers')."""
    return list(getattr(layer, "_trainable_variables", []))


def _initializer_of(layer, variable):
    """The initializer `layer` keeps for `variable`, found by Keras' naming convention
    (`kernel` -> `kernel_initializer`, `recurrent_kernel` -> `recurrent_initializer`...), or None."""
    name = variable.name.split("/")[-1]
    candidates = [f"{name}_initializer"]
    if name.endswith("_kernel"):
        candidates.append(f"{name[: -len('_kernel')]}_initializer")
    for attribute in candidates:
        initializer = getattr(layer, attribute, None)
        if isinstance(initializer, keras.initializers.Initializer):
            return initializer
    return None


def _reseeded(initializer, seed: int):
    """A copy of `initializer` drawing with `seed` (deterministic initializers unchanged)."""
    config = initializer.get_config()
    if "seed" not in config:
        return initializer
    return type(initializer).from_config({**config, "seed": int(seed)})


def redrawn_initial_weights(net: keras.Model, variables: Sequence, seed: int) -> list[np.ndarray]:
    """Fresh initial values of `variables` (the net's trainable variables), drawn with the net's
    own initializers reseeded from `seed` (variable i with `chain_seed(seed, i + 1)`).

    A variable whose initializer cannot be found (a custom layer that does not keep it as
    `<name>_initializer`) keeps its current value, with a warning: set the chains' starts with
    `BayesianModel.set_chain_weights` then.

    Example:
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        >>> kernel, bias = redrawn_initial_weights(net, net.trainable_variables, seed=5)
        >>> kernel.shape, bool(np.any(kernel != net.layers[0].kernel.numpy())), bias.tolist()
        ((2, 3), True, [0.0, 0.0, 0.0])
    """
    owners = {}
    for layer in net._flatten_layers(include_self=True, recursive=True):
        for variable in _owned_variables(layer):
            owners.setdefault(id(variable), layer)
    values, missing = [], []
    for index, variable in enumerate(variables):
        layer = owners.get(id(variable))
        initializer = None if layer is None else _initializer_of(layer, variable)
        if initializer is None:
            missing.append(getattr(variable, "path", variable.name))
            values.append(np.asarray(variable.numpy()))
            continue
        draw = _reseeded(initializer, kt_random.chain_seed(seed, index + 1))
        values.append(np.asarray(keras.ops.convert_to_numpy(draw(tuple(variable.shape), dtype=variable.dtype))))
    if missing:
        warnings.warn(
            f"BayesianModel(num_chains > 1): no initializer found for {missing} (looked for a "
            "`<name>_initializer` attribute on the owning layer); every chain starts these at "
            "the net's current values. Give each chain its own start with "
            "`model.set_chain_weights(chain, weights)`.",
            UserWarning,
            stacklevel=3,
        )
    return values


# --- the chains' weights on the model ----------------------------------------------------------


class ChainWeights:
    """The chains' weights on `BayesianModel` (a mixin): chain 0 in the net's trainable
    variables, chains 1..C-1 in `_chain_variables`, one `[C - 1, *shape]` variable each."""

    def _create_chain_variables(self) -> None:
        """Chains 1..C-1 start from the net's initializers redrawn with their seeds."""
        variables = self.trainable_variables
        starts = [
            redrawn_initial_weights(self.net, variables, self.chain_seeds[k])
            for k in range(1, self.num_chains)
        ]
        self._chain_variables = [
            keras.Variable(
                np.stack([start[i] for start in starts]), dtype=variable.dtype, trainable=False,
                autocast=False, name=f"chain_weights_{i}",
            )
            for i, variable in enumerate(variables)
        ]

    def _stacked_params(self) -> list[tf.Tensor]:
        """Every chain's weights, one `[C, *shape]` tensor per trainable variable."""
        variables = self.trainable_variables
        if self.num_chains == 1:
            return [tf.convert_to_tensor(v)[None] for v in variables]
        return [
            tf.concat([tf.convert_to_tensor(v)[None], tf.convert_to_tensor(c)], axis=0)
            for v, c in zip(variables, self._chain_variables)
        ]

    def _check_chain(self, chain) -> int:
        if not self._state_variables:
            raise ValueError("The chains do not exist yet: build or fit the model first.")
        chain = check_int("chain", chain, low=0)
        if chain >= self.num_chains:
            raise ValueError(f"`chain` must be in [0, {self.num_chains}), got {chain}.")
        return chain

    def chain_weights(self, chain: int) -> list[np.ndarray]:
        """Chain `chain`'s current weights, one array per trainable variable (chain 0: the
        net's own)."""
        chain = self._check_chain(chain)
        if chain == 0:
            return [np.asarray(v.numpy()) for v in self.trainable_variables]
        return [np.asarray(c[chain - 1].numpy()) for c in self._chain_variables]

    def set_chain_weights(self, chain: int, weights) -> None:
        """Sets chain `chain`'s weights (e.g. its start), one array per trainable variable in
        `trainable_variables` order; chain 0's are the net's own."""
        chain = self._check_chain(chain)
        variables = self.trainable_variables
        weights = list(weights)
        if len(weights) != len(variables) or any(
            tuple(np.shape(w)) != tuple(v.shape) for w, v in zip(weights, variables)
        ):
            raise ValueError(
                f"`weights` must hold one array per trainable variable, shaped "
                f"{[tuple(v.shape) for v in variables]}; got {[tuple(np.shape(w)) for w in weights]}."
            )
        for i, (variable, value) in enumerate(zip(variables, weights)):
            if chain == 0:
                variable.assign(value)
            else:
                self._chain_variables[i].assign(
                    tf.tensor_scatter_nd_update(self._chain_variables[i], [[chain - 1]], np.asarray(value)[None])
                )

    @property
    def chain_path(self) -> str:
        """How the C forward/backward passes run: `"vectorized"` or `"loop"` (resolves "auto")."""
        if self.chain_method != "auto":
            return self.chain_method
        # Measured by benchmarks/chains.py on CPU: the loop was the faster for every network and
        # sampler there (one vectorized map of small layers costs more than C plain passes).
        return "loop"


# --- the progress bar ---------------------------------------------------------------------------


class ProgbarWithoutChainLogs(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, without the per-chain log entries (History and TensorBoard keep
    them)."""

    @staticmethod
    def _without_chains(logs):
        if logs is None:
            return None
        return {name: value for name, value in logs.items() if not is_chain_log(name)}

    def _update_progbar(self, batch, logs=None):
        super()._update_progbar(batch, self._without_chains(logs))

    def _finalize_progbar(self, logs):
        super()._finalize_progbar(self._without_chains(logs))


def with_chain_progbar(callbacks):
    """`callbacks` with a `ProgbarWithoutChainLogs` standing in for Keras' default progress bar
    (kept as given when the caller supplies a `CallbackList` or a progress bar of their own)."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    callbacks = list(callbacks or [])
    if any(isinstance(cb, keras.callbacks.ProgbarLogger) for cb in callbacks):
        return callbacks
    return callbacks + [ProgbarWithoutChainLogs()]


__all__ = [
    "CHAIN_METHODS",
    "CHAIN_MINIBATCHES",
    "ChainWeights",
    "MAX_LOGGED_CHAINS",
    "PER_CHAIN_LOGS",
    "ProgbarWithoutChainLogs",
    "chain_log_name",
    "is_chain_log",
    "redrawn_initial_weights",
]
