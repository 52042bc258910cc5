"""`BayesianModel`: a Keras model whose `fit` samples the posterior instead of minimising the loss.

Each training step computes the potential of the minibatch (DESIGN section 3)

    U(theta) = N * L(theta; batch) + R(theta),

where `L` is exactly what Keras' `compute_loss` returns (the mean per-example loss plus the layers'
regularization losses) and `R = -log prior(theta)`, takes the force `F = -grad U`, and hands both
to the sampler's update rule. The sampler's state (momenta, thermostats, step counter) lives in
non-trainable variables of this model, so `model.save`, `save_weights` and `ModelCheckpoint`
capture it, and the noise is keyed by (seed, step), so a restored run continues exactly.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import random as py_random
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import _fit_checks
from keras_thermo import chains as kt_chains
from keras_thermo import data as kt_data
from keras_thermo import dense_gradients as kt_dense_gradients
from keras_thermo import equilibration as kt_equilibration
from keras_thermo import per_example as kt_per_example
from keras_thermo import priors as kt_priors
from keras_thermo import random as kt_random
from keras_thermo import samplers as kt_samplers
from keras_thermo import schedules as kt_schedules
from keras_thermo._distribute import (
    CrossReplica,
    batch_spec,
    check_even_batches,
    isolate_collectives,
    replica_local_variable,
    symbolic_inputs,
)
from keras_thermo._recording import RecordingCallback
from keras_thermo._validation import check_bool, check_choice, check_int, check_positive, check_seed

#: How per-example gradient statistics are computed (samplers that need them: CCAdL, mCCAdL).
PER_EXAMPLE_METHODS = ("auto", "layers", "vectorized", "dense_layers")

# Keras loss reductions that keep the `N * mean` convention of the potential.
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


# What each kind of `grads.stochastic_setting` does to the sampled target.
_TARGET_EFFECTS = {
    "batch_statistics": (
        "normalises each example with its minibatch's statistics, so U depends on which examples "
        "share a batch and the chain samples a batch-dependent target, not exp(-U/T). Its moving "
        "mean and variance are not sampled weights: SampleCollector's samples hold none of them, "
        "so a stored sample is evaluated later with the final moving statistics. Freeze it "
        "(layer.trainable = False) or use LayerNormalization"
    ),
    "noise": (
        "multiplies or perturbs activations with fresh noise at every step, so U is random and the "
        "chain samples a noise-averaged target, not exp(-U/T) (predict and evaluate run without "
        "the noise). Set the rate to 0: the sampler injects its own noise"
    ),
    "random_draws": (
        "draws random numbers in training mode (e.g. a random augmentation), so U is random and "
        "the target is an average over those draws. Move augmentation into the tf.data pipeline "
        "if the augmented examples are meant as data"
    ),
}


class SamplerDivergedError(FloatingPointError):
    """Raised by `fit` when a sampler step produced a non-finite value.

    The weights and the sampler state are left at the last finite step; `step` is the number
    of finite steps taken before it (None where not known).
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class _Runtime:
    """Per-session objects the train step uses but that are not part of the saved model.

    Kept in a plain object so Keras does not track them as model weights: attaching a callback
    must not change what a checkpoint holds.
    """

    def __init__(self):
        self.recorders: list = []
        self.temperature_recorders: list = []
        self.warned_about_layers = False
        self.noted_pipeline = False
        self.noted_per_example_fallback = False
        # One copy per replica (they agree): written inside the step, read by the callbacks.
        self.diverged_at = replica_local_variable(tf.constant(-1, tf.int64), name="diverged_at")
        # The size of a batch that did not split over the chains (-1: none yet), see `fit`.
        self.uneven_batch = replica_local_variable(tf.constant(-1, tf.int64), name="uneven_batch")
        self.state_structure = None


def configurational_temperature(params, force) -> tf.Tensor:
    """`-theta . F / Nd` with the step's own force: averages T at equilibrium for any sampler
    (integration by parts of `theta . grad U` against `exp(-U/T)`), unlike the kinetic temperature,
    which a thermostat holds at T by construction. One step's value is noisy (minibatch force);
    its running average is the check.

    The terms cancel (the value crosses zero while they reach `|theta . F| / Nd`), so they are
    summed in float64; each product is rounded to float32 first (an error of at most `2^-24`
    of `sum |theta_i F_i|`, far below one step's minibatch noise), which halves the cost of
    casting both factors (`python -m benchmarks.step_pieces`)."""
    total = tf.add_n([tf.reduce_sum(tf.cast(theta * tf.cast(f, theta.dtype), tf.float64)) for theta, f in zip(params, force)])
    return tf.cast(-total / float(kt_samplers.base.num_scalars(params)), tf.float32)


def all_finite(tensors) -> tf.Tensor:
    """Whether every entry of every float tensor is finite (a boolean scalar).

    `0 * t` is 0 for finite `t` and NaN for an infinite or NaN entry, so one sum per tensor,
    cast to float64 (NaN stays NaN), answers it: the same answer as
    `reduce_all(is_finite(t))` with arithmetic reductions, which on a CPU cost a fraction of
    the boolean ones (`python -m benchmarks.step_pieces`).

    Example:
        >>> bool(all_finite([tf.constant([1.0, -2.0]), tf.constant(3.0, tf.float64)]))
        True
        >>> bool(all_finite([tf.constant([1.0, float("inf")])]))
        False
    """
    sums = [tf.cast(tf.reduce_sum(tensor * tf.zeros([], tensor.dtype)), tf.float64) for tensor in tensors]
    return tf.math.is_finite(tf.add_n(sums))


def _chain_mean(values: list) -> tf.Tensor:
    """The mean of one value per chain (the value itself for one chain)."""
    return values[0] if len(values) == 1 else tf.reduce_mean(tf.stack(values))


def _checks_first(callbacks):
    """Moves `EquilibrationCheck`s to the front, so the epoch logs they add reach TensorBoard,
    History and the progress bar (Keras passes one logs dict through the callbacks in order)."""
    if callbacks is None or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    callbacks = list(callbacks)
    is_check = [isinstance(cb, kt_equilibration.EquilibrationCheck) for cb in callbacks]
    return [cb for cb, c in zip(callbacks, is_check) if c] + [cb for cb, c in zip(callbacks, is_check) if not c]


def _is_array_data(x) -> bool:
    """Whether `fit`'s `x` is in-memory arrays (numpy or tensors, possibly nested), not a
    `tf.data.Dataset`, `PyDataset` or generator."""
    if x is None or isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)):
        return False
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in leaves)


def check_float32_variables(variables) -> None:
    """Refuses weights that are not float32: the samplers' noise, momenta and step sizes are
    float32, and a float64 (or float16) weight would fail deep inside the traced step."""
    for variable in variables:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        if dtype != "float32":
            raise TypeError(
                f"BayesianModel samples float32 weights, but trainable variable "
                f"{getattr(variable, 'path', variable.name)!r} has dtype {dtype!r}. Build the net "
                "with dtype='float32' (or keras.config.set_floatx('float32')); a mixed-precision "
                "policy such as 'mixed_bfloat16' keeps float32 weights and is accepted."
            )


def _single_output_loss_weight(loss, loss_weights, sampler_name: str) -> float:
    """The factor `loss_weights` puts on a single-output loss (1 when None).

    Per-example gradients are those of one loss per example; Keras' multi-output losses (a list
    or dict of losses) would need the per-example pass to reproduce Keras' matching of targets
    to outputs, so they are refused here with what to do instead.
    """
    losses = [loss] if isinstance(loss, (str, keras.losses.Loss)) or callable(loss) else tf.nest.flatten(loss)
    weights = [] if loss_weights is None else (
        [loss_weights] if isinstance(loss_weights, (int, float)) else tf.nest.flatten(loss_weights)
    )
    if len(losses) > 1 or len(weights) > 1:
        raise ValueError(
            f"{sampler_name} takes per-example gradients of a single-output loss, but `loss` is "
            f"{loss!r} with `loss_weights` {loss_weights!r}. Combine the outputs' losses into one "
            "keras.losses.Loss (a subclass whose `call` returns each example's weighted sum), or "
            "use a sampler without per-example gradients (SGLD, SGHMC, SGNHT, TACT-HMC)."
        )
    if not weights:
        return 1.0
    return check_positive("loss_weights", weights[0])


def _loss_reductions(loss) -> list[tuple[str, Any]]:
    """(description, reduction) for every Keras loss object inside a compile `loss` argument."""
    found = []
    for item in tf.nest.flatten(loss) if not isinstance(loss, keras.losses.Loss) else [loss]:
        if isinstance(item, keras.losses.Loss):
            found.append((type(item).__name__, item.reduction))
    return found


def _first_batch_inputs(x, y, batch_size):
    """A small batch of model inputs taken from `fit`'s data, used to build the model eagerly."""
    del y
    if isinstance(x, tf.data.Dataset):
        inputs = symbolic_inputs(x)  # shapes only: drawing a batch would use up a shuffle order
        if inputs is not None:
            return inputs
        data = next(iter(x.take(1)))
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return inputs
    if isinstance(x, keras.utils.PyDataset):
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(x[0])
        return inputs
    leaves = tf.nest.flatten(x)
    if leaves and all(hasattr(leaf, "shape") and len(leaf.shape) > 0 for leaf in leaves):
        count = batch_size or 2
        return tf.nest.map_structure(lambda leaf: leaf[:count], x)
    return None


@keras.saving.register_keras_serializable(package="keras_thermo")
class BayesianModel(keras.Model):
    """Turns `fit` on any Keras model into a stochastic-gradient MCMC sampler.

    Args:
        net: The Keras model whose trainable weights are sampled (Sequential, functional or
            subclassed).
        sampler: A `keras_thermo.samplers.Sampler` (or a name / config for
            `keras_thermo.samplers.get`).
        num_examples: N, the number of training examples; the potential is `N * mean loss`.
            None takes N from the first `fit`: the rows it trains on (arrays, less
            `validation_split`; a finite pipeline of fixed-size batches). `fit` warns when a
            given N disagrees with the rows it trains on.
            Keras' mean reductions average over every element of the loss, not only over the
            examples: a per-token loss on sequences of length T, or a per-pixel loss, is divided
            by T (or the pixels) too, so `N * L` weighs each example's likelihood as the *mean*
            of its elements' losses, T times flatter than their sum. See
            `loss_elements_per_example`.
        loss_elements_per_example: k > 0, default 1. The potential becomes `U = N k L + R`:
            with k = T (tokens per sequence, pixels per image...) each example's likelihood is
            the *sum* of its elements' losses (masked elements given sample weight 0 count as
            0), the usual likelihood of a sequence or dense-prediction model. Layer
            regularization losses, part of `L`, are scaled with it.
        prior: A `keras_thermo.priors.Prior`, or None for a flat prior.
        temperature: T > 0; the target is `exp(-U / T)` (1 = the Bayes posterior). Or a
            `keras_thermo.schedules.TemperatureSchedule` (e.g. `TemperatureRamp`) giving the T of
            every step from the step count; the train logs then also carry `temperature`.
        seed: Integer in [0, 2**31) keying all sampler noise; None draws one (kept in the config,
            so saving and resuming stay exact).
        per_example_method: How samplers that need per-example gradients (CCAdL, mCCAdL) get
            them: `"layers"` takes the statistics from each layer's inputs and output errors
            after one forward and one backward pass (`keras_thermo.per_example.engine`; every
            trainable layer needs a rule: Dense, EinsumDense-free nets of Conv1D/Conv2D,
            Embedding, LayerNormalization, LSTM, GRU, any parameter-free layer); `"vectorized"`
            forms the `[n, Nd]` rows with `tf.vectorized_map` (any compatible network, several
            times slower); `"dense_layers"` is `"layers"` restricted to `Sequential` nets of
            `Dense` layers (`keras_thermo.dense_gradients`); `"auto"` (default) uses `"layers"`
            where every trainable layer has a rule and `"vectorized"` otherwise, logging the
            reason once (logger `"keras_thermo"`).
        num_chains: C >= 1 independent chains of the net, updated together at every step of
            one `fit` (default 1). Chain k has its own noise (keyed by
            `keras_thermo.random.chain_seed(seed, k)`), its own start (the net's initializers
            redrawn; chain 0 keeps the net's weights) and, by default, its own minibatches
            (`chain_minibatches`). `predict`, `evaluate` and the net's weights are chain 0's
            (the active chain); `chain_weights(k)` and `set_chain_weights(k, ...)` read and
            set every chain; the recording callbacks keep every chain
            (`SampleCollector.samples` is `[C, S, Nd]`). Logged scalars are chain means, with
            per-chain temperatures and xi as `<name>_chain_<k>` for C <= 8. See
            `keras_thermo.chains`.
        chain_method: How the C forward/backward passes run when C > 1: `"vectorized"` (one
            `tf.vectorized_map` over the chain axis), `"loop"` (C passes in the compiled step)
            or `"auto"` (default: the loop, the faster on CPU in `benchmarks/chains.py`).
        chain_minibatches: `"split"` (default): each chain gets its own examples at every step;
            `fit` on arrays draws `num_chains * batch_size` examples per step, `batch_size` per
            chain, and a pipeline's batch is cut into C equal parts (its batch size must be a
            multiple of C). `"shared"`: every chain sees the whole batch. Shared batches
            correlate the chains' gradient noise, which pulls them together and biases R-hat
            towards 1 (measured in `benchmarks/chains.py`); see `keras_thermo.chains`.

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model = kt.BayesianModel(net, kt.samplers.SGHMC(step_size=1e-3), num_examples=64,
        ...                          prior=kt.priors.Gaussian(1.0), seed=0)
        >>> model.compile(loss="mse")
        >>> x, y = np.random.rand(64, 3), np.random.rand(64, 1)
        >>> history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        >>> sorted(k for k in history.history if k != "loss")
        ['configurational_temperature', 'kinetic_temperature', 'potential', 'step_size']
    """

    def __init__(
        self,
        net: keras.Model,
        sampler,
        num_examples: int | None,
        prior: kt_priors.Prior | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        per_example_method: str = "auto",
        loss_elements_per_example: float = 1.0,
        num_chains: int = 1,
        chain_method: str = "auto",
        chain_minibatches: str = "split",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(net, keras.Model):
            raise TypeError(f"`net` must be a keras.Model, got {type(net).__name__}: {net!r}.")
        self.net = net
        self.sampler = kt_samplers.get(sampler)
        self.num_examples = None if num_examples is None else check_int("num_examples", num_examples, low=1)
        self.loss_elements_per_example = check_positive("loss_elements_per_example", loss_elements_per_example)
        self.prior = kt_priors.get(prior)
        self._temperature_variable = None
        self.temperature_schedule = None
        self.temperature = temperature
        seed = check_seed("seed", seed)
        self.seed = py_random.randrange(2**31) if seed is None else seed
        self.per_example_method = check_choice("per_example_method", per_example_method, PER_EXAMPLE_METHODS)
        self.num_chains = check_int("num_chains", num_chains, low=1)
        self.chain_method = check_choice("chain_method", chain_method, kt_chains.CHAIN_METHODS)
        self.chain_minibatches = check_choice("chain_minibatches", chain_minibatches, kt_chains.CHAIN_MINIBATCHES)
        if self.num_chains > 1 and self.chain_method == "vectorized" and self.sampler.needs_per_example_gradients:
            raise ValueError(
                f"`chain_method` 'vectorized' maps the chains' forward and backward passes in one "
                f"tf.vectorized_map, which has no room for the per-example statistics "
                f"{type(self.sampler).__name__} needs; use chain_method='auto' or 'loop' (the "
                "per-example engine then records every chain's pass)."
            )
        if self.num_chains > 1 and self.prior is not None and type(self.prior).initial_state is not kt_priors.Prior.initial_state:
            raise ValueError(
                f"`prior` {type(self.prior).__name__} keeps a state of its own (resampled "
                f"hyperparameters), which is not kept per chain; with num_chains={self.num_chains} use "
                "a prior without state (Gaussian, Laplace) or run the chains as separate models."
            )
        #: The seed of each chain's noise and start (chain 0: `seed`).
        self.chain_seeds = [kt_random.chain_seed(self.seed, k) for k in range(self.num_chains)]
        # Collective keys of this strategy's own, so an earlier strategy's cannot clash with them.
        isolate_collectives(self.distribute_strategy)
        with self.distribute_strategy.scope():
            self._runtime = _Runtime()
        self._state_variables: list = []
        self._prior_state_variables: list = []
        self._chain_variables: list = []  # chains 1..C-1, one [C - 1, *shape] per trainable variable

    # --- Keras plumbing -----------------------------------------------------------------------

    def call(self, inputs, training=None):
        return self.net(inputs, training=training)

    def build(self, input_shape=None):
        if not self.net.built:
            if input_shape is None:
                raise ValueError(
                    "BayesianModel.build needs the input shape when `net` is not built; call the "
                    "network on a batch first or pass `input_shape`."
                )
            # Tracing the net on symbolic inputs builds every kind of model (a subclassed one
            # has no shape-driven build of its own).
            symbolic = keras.tree.map_shape_structure(keras.KerasTensor, input_shape)
            self.net(symbolic)
        self._create_sampler_state()
        self.built = True

    def get_build_config(self):
        return {"net_built": bool(self.net.built)}

    def build_from_config(self, config):
        # The net restores its own build config when it is deserialized; only the sampler state
        # remains to be created before the saved variables are loaded into it.
        del config
        self.build()

    def compile(self, optimizer=None, loss=None, **kwargs):
        """Configures the loss and metrics; takes no optimizer (the sampler updates the weights).

        Args:
            optimizer: Must be None.
            loss: A Keras loss whose reduction is a mean over the batch.
            **kwargs: Passed to `keras.Model.compile` (metrics, steps_per_execution, jit_compile...).
        """
        if optimizer is not None:
            raise ValueError(
                f"`optimizer` must be None for a BayesianModel (its sampler "
                f"{type(self.sampler).__name__} updates the weights), got {optimizer!r}."
            )
        if loss is None:
            raise ValueError(
                "`loss` is required: the potential is U = num_examples * loss + prior, so "
                "compile with the model's per-example loss, e.g. loss='mse'."
            )
        allowed = _MEAN_REDUCTIONS
        self._example_loss_scale = 1.0
        if self.sampler.needs_per_example_gradients:
            # The batch loss must be the plain mean of the per-example losses.
            allowed = kt_per_example.PER_EXAMPLE_MEAN_REDUCTIONS
            self._example_loss_scale = _single_output_loss_weight(
                loss, kwargs.get("loss_weights"), type(self.sampler).__name__
            )
        for description, reduction in _loss_reductions(loss):
            if reduction not in allowed:
                raise ValueError(
                    f"`loss` {description} has reduction={reduction!r}; the potential "
                    f"U = num_examples * loss with sampler {type(self.sampler).__name__} needs "
                    f"a batch mean, one of {list(allowed)}."
                )
        replicas = self.distribute_strategy.num_replicas_in_sync
        steps_per_execution = kwargs.get("steps_per_execution", 1)
        if replicas > 1 and steps_per_execution != 1:
            # Keras' multi-step loop wraps each step in a tf.cond, and cross-replica
            # synchronisation inside it fails at run time ("You must feed a value for
            # placeholder tensor"), for plain Keras optimizers too (keras-team/keras#19246).
            raise ValueError(
                f"`steps_per_execution` must be 1 under a tf.distribute strategy with {replicas} "
                f"replicas; got {steps_per_execution!r}. Keras cannot synchronise replicas inside "
                "its multi-step loop."
            )
        super().compile(optimizer=None, loss=loss, **kwargs)

    def compile_from_config(self, config):
        # Keras skips custom `compile` methods when loading unless told how: re-run ours.
        config = dict(keras.saving.deserialize_keras_object(config))
        config.pop("optimizer", None)
        self.compile(**config)

    def get_config(self):
        return {
            "name": self.name,
            "net": keras.saving.serialize_keras_object(self.net),
            "sampler": keras.saving.serialize_keras_object(self.sampler),
            "num_examples": self.num_examples,
            "prior": None if self.prior is None else keras.saving.serialize_keras_object(self.prior),
            "temperature": (
                self.temperature if self.temperature_schedule is None
                else keras.saving.serialize_keras_object(self.temperature_schedule)
            ),
            "seed": self.seed,
            "per_example_method": self.per_example_method,
            "loss_elements_per_example": self.loss_elements_per_example,
            "num_chains": self.num_chains,
            "chain_method": self.chain_method,
            "chain_minibatches": self.chain_minibatches,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["net"] = keras.saving.deserialize_keras_object(config["net"], custom_objects=custom_objects)
        config["sampler"] = keras.saving.deserialize_keras_object(
            config["sampler"], custom_objects=custom_objects
        )
        if config.get("prior") is not None:
            config["prior"] = keras.saving.deserialize_keras_object(
                config["prior"], custom_objects=custom_objects
            )
        if isinstance(config.get("temperature"), dict):
            config["temperature"] = keras.saving.deserialize_keras_object(
                config["temperature"], custom_objects=custom_objects
            )
        return cls(**config)

    # --- settings the compiled step reads from variables ----------------------------------------

    @property
    def temperature(self) -> float:
        """T > 0. May be changed at any time (between or during `fit` calls, e.g. from a
        callback): the compiled step reads it from a variable, which checkpoints keep. The
        sampler's step size works the same way (`sampler.step_size`). With a temperature
        schedule (`temperature_schedule`) this is the T of the next step."""
        if self.temperature_schedule is not None:
            next_step = int(self._state_variables[0].numpy()) if self._state_variables else 0
            return float(self.temperature_schedule(next_step))
        if self._temperature_variable is not None:
            return float(self._temperature_variable.numpy())
        return self._temperature

    @temperature.setter
    def temperature(self, value) -> None:
        is_schedule = isinstance(value, kt_schedules.TemperatureSchedule)
        if not is_schedule and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise TypeError(
                f"`temperature` must be a positive float or a keras_thermo.schedules."
                f"TemperatureSchedule, got {value!r} ({type(value).__name__})."
            )
        if self._temperature_variable is not None and is_schedule != (self.temperature_schedule is not None):
            # The compiled step reads either the variable or the schedule.
            raise ValueError(
                f"`temperature` of this model was a {'schedule' if self.temperature_schedule else 'float'} "
                f"when its state was built; it cannot become {value!r}. Build a new BayesianModel "
                "(or set a float temperature from a callback, which the compiled step reads)."
            )
        if is_schedule:
            self.temperature_schedule = value
            self._temperature = float(value(0))
            return
        value = check_positive("temperature", value)
        if self._temperature_variable is not None:
            self._temperature_variable.assign(value)
        self._temperature = value

    def _step_temperature(self, step, cross) -> tf.Tensor:
        """T of the step that starts at `step` (float32 scalar): the schedule's value, also
        written to the temperature variable (checkpoints and callbacks see it), or the variable."""
        if self.temperature_schedule is None:
            return tf.convert_to_tensor(self._temperature_variable)
        temperature = tf.cast(self.temperature_schedule(step), tf.float32)
        cross.assign([self._temperature_variable], [temperature])
        return temperature

    def _create_setting_variables(self) -> None:
        """Variables for the temperature and the sampler's settings, so that changing them after
        the step was traced takes effect, and checkpoints hold them."""
        self._temperature_variable = keras.Variable(
            self._temperature, dtype="float32", trainable=False, autocast=False, name="temperature"
        )
        if self.sampler.has_bound_settings:
            # One sampler instance given to a second model: that model gets its own copy, so the
            # two models' settings stay independent.
            self.sampler = type(self.sampler).from_config(self.sampler.get_config())
        # The step size (a float, not a schedule) and the sampler's float settings (friction,
        # thermal mass...): changed between or during fits, the next step uses them.
        self._sampler_setting_variables = {
            name: keras.Variable(value, dtype=value.dtype.name, trainable=False, autocast=False, name=name)
            for name, value in self.sampler.setting_values().items()
        }
        self.sampler.bind_settings(self._sampler_setting_variables)

    # --- sampler state ------------------------------------------------------------------------

    @property
    def likelihood_weight(self) -> float:
        """`N k`: what multiplies the batch loss in `U` (and sets the force noise `(N k)^2 / n`)."""
        if self.num_examples is None:
            raise ValueError(
                "`num_examples` is None and no fit has set it yet; pass num_examples=<number of "
                "training examples> to BayesianModel, or call fit (which takes the training rows)."
            )
        return self.num_examples * self.loss_elements_per_example

    @property
    def num_params(self) -> int:
        """Nd, the number of trainable scalars."""
        return kt_samplers.base.num_scalars(self.trainable_variables)

    def _create_sampler_state(self) -> None:
        if self._state_variables:
            return
        params = [tf.convert_to_tensor(v) for v in self.trainable_variables]
        if not params:
            raise ValueError(
                f"`net` {self.net.name!r} has no trainable weights to sample; a BayesianModel "
                "needs at least one trainable variable."
            )
        check_float32_variables(self.trainable_variables)
        with self.distribute_strategy.scope():
            if self.num_chains > 1:
                self._create_chain_variables()
            self._create_state_variables(params)
            self._create_setting_variables()
            self._create_prior_state_variables()

    def _create_chain_variables(self) -> None:
        """Chains 1..C-1 start from the net's initializers redrawn with their seeds."""
        variables = self.trainable_variables
        starts = [
            kt_chains.redrawn_initial_weights(self.net, variables, self.chain_seeds[k])
            for k in range(1, self.num_chains)
        ]
        self._chain_variables = [
            keras.Variable(
                np.stack([start[i] for start in starts]), dtype=variable.dtype, trainable=False,
                autocast=False, name=f"chain_weights_{i}",
            )
            for i, variable in enumerate(variables)
        ]

    def _create_state_variables(self, params) -> None:
        if self.num_chains == 1:
            initial = self.sampler.init(params, temperature=self.temperature, seed=self.seed)
            leaves = tf.nest.flatten(initial)
        else:
            # One state per chain, from its own weights and seed; every leaf but the shared step
            # counter gets a leading chain axis.
            stacked = self._stacked_params()
            chains = [
                self.sampler.init([p[k] for p in stacked], temperature=self.temperature, seed=self.chain_seeds[k])
                for k in range(self.num_chains)
            ]
            initial = chains[0]
            per_chain = [tf.nest.flatten(state) for state in chains]
            leaves = [per_chain[0][0]] + [tf.stack(column) for column in list(zip(*per_chain))[1:]]
        names = []
        for field, value in initial._asdict().items():
            if isinstance(value, (list, tuple)):
                names += [f"{self.sampler.name}_{field}_{i}" for i in range(len(tf.nest.flatten(value)))]
            else:
                names.append(f"{self.sampler.name}_{field}")
        self._state_variables = [
            keras.Variable(leaf, dtype=leaf.dtype.name, trainable=False, autocast=False, name=name)
            for leaf, name in zip(leaves, names)
        ]
        self._runtime.state_structure = initial

    def _create_prior_state_variables(self) -> None:
        """Variables for a prior's own state (e.g. `HierarchicalGaussian`'s precisions), bound
        to the prior so that the potential reads them."""
        if self.prior is None:
            return
        initial = self.prior.initial_state(self.trainable_variables)
        if not initial:
            return
        if self.prior.is_bound:
            # One prior instance given to a second model: that model gets its own copy.
            self.prior = type(self.prior).from_config(self.prior.get_config())
        self._prior_state_variables = [
            keras.Variable(value, dtype=value.dtype.name, trainable=False, autocast=False, name=f"prior_state_{i}")
            for i, value in enumerate(initial)
        ]
        self.prior.bind_state(self._prior_state_variables)

    def _update_prior_state(self, completed_step, temperature, cross) -> None:
        """The prior's own move after a sampler step (a Gibbs draw of hyperparameters), from the
        weights that step produced; nothing moves when the step was not applied."""
        current = [tf.convert_to_tensor(v) for v in self._prior_state_variables]
        params = [tf.convert_to_tensor(v) for v in self.trainable_variables]
        updated = self.prior.update_state(
            current, params, step=completed_step, seed=self.seed, temperature=temperature
        )
        applied = self._runtime.diverged_at < 0
        cross.assign(self._prior_state_variables, [tf.where(applied, new, old) for new, old in zip(updated, current)])

    def sampler_state(self):
        """The sampler state as the sampler's typed container of tensors (read-only view); with
        several chains every field but `step` has a leading chain axis `[C, ...]`."""
        if not self._state_variables:
            raise ValueError("The sampler state does not exist yet: build or fit the model first.")
        values = [tf.convert_to_tensor(v) for v in self._state_variables]
        return tf.nest.pack_sequence_as(self._runtime.state_structure, values)

    @property
    def sampler_step(self) -> int:
        """Number of sampler steps taken so far (restored with the weights)."""
        return int(self.sampler_state().step)

    # --- several chains -------------------------------------------------------------------------

    def _chain_state(self, state, chain: int):
        """Chain `chain`'s sampler state out of the stored state (one chain's is the state)."""
        if self.num_chains == 1:
            return state
        leaves = tf.nest.flatten(state)
        return tf.nest.pack_sequence_as(state, [leaves[0]] + [leaf[chain] for leaf in leaves[1:]])

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

    # --- the training step --------------------------------------------------------------------

    def compute_potential(self, x, y, sample_weight=None, training=True):
        """Returns `(U, L, y_pred)` for a batch: `U = N * L + R` (DESIGN section 3).

        Under a `tf.distribute` strategy with r replicas this is the replica's share: Keras
        divides the loss of each replica's slice by r, and the prior is divided by r here, so the
        replicas' `U` (and their gradients) sum to the global batch's.
        """
        y_pred = self(x, training=training)
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        potential = tf.cast(self.likelihood_weight, loss.dtype) * loss
        if self.prior is not None:
            potential += self._prior_share(loss.dtype)
        return potential, loss, y_pred

    def _prior_share(self, dtype) -> tf.Tensor:
        """The prior term R of U, divided by the replicas under a strategy (see compute_potential)."""
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        prior = tf.cast(self.prior(self.trainable_variables), dtype)
        return prior / replicas if replicas > 1 else prior

    def _shares_backward_pass(self, recording, cross) -> bool:
        """Whether the force's loss term comes from the engine's backward pass (the sum of the
        rows of G), leaving the train step's own tape only the prior and the layers' losses.
        Needs Keras' own `compute_loss` (compiled loss plus `self.losses`, nothing else) on one
        replica."""
        return (
            recording is not None
            and cross.num_replicas == 1
            and getattr(self, "_compile_loss", None) is not None
            and type(self).compute_loss is keras.Model.compute_loss
        )

    def _force_and_statistics(self, x, y, sample_weight, cross, recording, wrt=None):
        """`(F, U, L, y_pred, per-example statistics or None)` of one batch (this replica's
        share of F and U), differentiated with respect to `wrt`: the tensors a
        `keras.StatelessScope` maps the trainable variables to (None: the variables).

        With the engine (`recording`), one backward pass gives both the per-example statistics
        and the gradient of the compiled loss: `grad (N L_data) = (N / n) sum_i g_i`, the rows
        of G summed; the train step's tape then differentiates only `N * sum(self.losses) + R`,
        which involves the network only through activity regularizers. Otherwise the tape
        differentiates U itself and the statistics, if needed, come after.
        """
        variables = self.trainable_variables if wrt is None else list(wrt)
        shared = self._shares_backward_pass(recording, cross)
        with tf.GradientTape() as tape:
            if wrt is not None:
                tape.watch(variables)
            with recording if recording is not None else contextlib.nullcontext():
                potential, loss, y_pred = self.compute_potential(x, y, sample_weight)
            if shared:  # U less its data term: N times the layers' own losses (summed as Keras does), and R
                terms = [tf.cast(self.likelihood_weight, loss.dtype) * tf.reduce_sum(tf.cast(extra, loss.dtype))
                         for extra in self.losses]
                if self.prior is not None:
                    terms.append(self._prior_share(loss.dtype))
                rest = tf.add_n(terms) if terms else None
        per_example = None
        if shared:
            per_example, sums = recording.statistics_and_gradients(
                self.loss, y, y_pred, sample_weight, cross_replica=cross, loss_scale=self._example_loss_scale
            )
            count = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float32)
            data_scale = tf.cast(self.likelihood_weight, tf.float32) / count
            rest_gradients = tape.gradient(rest, variables) if rest is not None else [None] * len(variables)
            gradients = [
                data_scale * tf.cast(g, tf.float32) + (tf.cast(r, tf.float32) if r is not None else 0.0)
                for g, r in zip(sums, rest_gradients)
            ]
            gradients = [tf.cast(g, v.dtype) for g, v in zip(gradients, variables)]
        else:
            gradients = tape.gradient(potential, variables)
            if self.sampler.needs_per_example_gradients:
                per_example = self._per_example_gradients(x, y, sample_weight, cross, recording, y_pred, wrt)
        force = [
            -tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
            for g, v in zip(gradients, variables)
        ]
        return force, potential, loss, y_pred, per_example

    def train_step(self, data):
        """One sampling step of every chain; a one-chain model is C = 1 of the same code.

        Per chain: the force of its minibatch and, for CCAdL and mCCAdL, the per-example
        statistics from the same forward and backward pass (`_chain_passes`), summed over
        replicas; then the sampler's update of each chain. All chains' results are assigned
        together, or none when a value is non-finite or the batch did not split over the chains
        (`_assign_if_finite`), and recorded for the callbacks.
        """
        data = keras.utils.unpack_x_y_sample_weight(data)
        chains = range(self.num_chains)
        cross = CrossReplica()
        batches, uneven = self._chain_batches(data)
        params = self._chain_params()
        passes = self._chain_passes(batches, params, cross)
        force, potential, loss, y_pred, per_example = (list(column) for column in zip(*passes))
        local_batch_size = tf.shape(tf.nest.flatten(batches[0][0])[0])[0]  # one chain's
        self._loss_tracker.update_state(_chain_mean(loss) * cross.num_replicas, sample_weight=local_batch_size)
        potential = [tf.cast(u, tf.float32) for u in potential]
        force, potential, batch_size = cross.sum((force, potential, tf.cast(local_batch_size, tf.float32)))
        # Every update is computed from these, so a batch the replicas cannot split moves nothing.
        force, potential, batch_size = cross.check_even_split(batch_size, (force, potential, batch_size))

        state = self.sampler_state()
        temperature = self._step_temperature(state.step, cross)
        results = []
        for k in chains:
            context = kt_samplers.StepContext(
                temperature=temperature,
                num_examples=self.likelihood_weight,
                batch_size=batch_size,
                potential=potential[k],
                seed=self.chain_seeds[k],
                per_example_gradients=per_example[k],
            )
            results.append(self.sampler.update(self._chain_state(state, k), params[k], force[k], context))
        new_params, chain_states, diagnostics = (list(column) for column in zip(*results))
        new_state = self._stacked_state(chain_states)

        # Chain 0 in the net's variables, chains 1..C-1 in the chain variables.
        variables = self.trainable_variables
        new_leaves = tf.nest.flatten(new_state)
        targets = list(variables) + list(self._chain_variables) + list(self._state_variables)
        values = list(new_params[0]) + [
            tf.stack([new_params[k][i] for k in chains][1:]) for i in range(len(self._chain_variables))
        ] + new_leaves
        checked = [p for chain in new_params for p in chain] + [t for t in new_leaves if t.dtype.is_floating]
        ok = self._assign_if_finite(targets, values, checked + potential, state.step, cross, uneven)
        if self._prior_state_variables:
            self._update_prior_state(new_state.step, self.sampler.parameter_temperature(chain_states[0], temperature), cross)
        if self._runtime.recorders:
            completed = tf.cast(new_state.step, tf.int64)
            is_sample = tf.stack([self.sampler.is_sample(s) for s in chain_states])  # [C], each chain's own
            is_sample = tf.logical_and(tf.logical_and(ok, is_sample), cross.is_first_local_replica())
            recorded = self._stacked_params() if self.num_chains > 1 else variables  # read after the assignment
            for recorder in self._runtime.recorders:
                recorder.maybe_record(completed, is_sample, recorded)
        if self._runtime.temperature_recorders:
            per_chain = [
                self._variable_temperatures(self._chain_state(state, k), chain_states[k], params[k], new_params[k], force[k])
                for k in chains
            ]
            weight, kinetic, configurational = (tf.stack(column) for column in zip(*per_chain))
            for recorder in self._runtime.temperature_recorders:
                recorder.record(weight, tf.unstack(kinetic, axis=1), tf.unstack(configurational, axis=1))

        for k in chains:
            x, y, sample_weight = batches[k]
            logs = self.compute_metrics(x, y, y_pred[k], sample_weight=sample_weight)  # chain means
        logs = dict(logs)
        logs["potential"] = _chain_mean(potential)
        if self.temperature_schedule is not None:
            logs["temperature"] = temperature
        per_chain_logs = {"configurational_temperature": [configurational_temperature(p, f) for p, f in zip(params, force)]}
        for name in diagnostics[0]:
            per_chain_logs[name] = [d[name] for d in diagnostics]
        for name, values in per_chain_logs.items():
            logs[name] = _chain_mean(values)
            if 1 < self.num_chains <= kt_chains.MAX_LOGGED_CHAINS and name in kt_chains.PER_CHAIN_LOGS:
                logs.update({kt_chains.chain_log_name(name, k): values[k] for k in chains})
        return cross.per_worker_logs(logs)  # Keras' multi-worker reduction needs vectors

    def _chain_params(self) -> list[list[tf.Tensor]]:
        """Every chain's weights as tensors, one list per chain (chain 0: the net's own)."""
        own = [tf.convert_to_tensor(v) for v in self.trainable_variables]
        others = [tf.convert_to_tensor(c) for c in self._chain_variables]
        return [own] + [[c[k - 1] for c in others] for k in range(1, self.num_chains)]

    def _stacked_state(self, chain_states):
        """The sampler state of every chain in the stored layout: chain 0's own for one chain;
        for several, the shared step counter and every other leaf stacked on a chain axis."""
        if self.num_chains == 1:
            return chain_states[0]
        leaves = [tf.nest.flatten(s) for s in chain_states]
        stacked = [leaves[0][0]] + [tf.stack(column) for column in list(zip(*leaves))[1:]]
        return tf.nest.pack_sequence_as(chain_states[0], stacked)

    def _chain_batches(self, data):
        """`([(x, y, sample_weight)] per chain, uneven)`: the whole batch for every chain
        (`"shared"`), or C equal parts of it, one per chain (`"split"`). `uneven` is the batch's
        size when C does not divide it, else -1; the step then applies nothing and `fit` raises
        (a batch size known before the first step is checked there, `_check_chain_batch_size`)."""
        if self.num_chains == 1 or self.chain_minibatches == "shared":
            return [data] * self.num_chains, tf.constant(-1, tf.int64)
        chains = self.num_chains
        size = tf.shape(tf.nest.flatten(data[0])[0])[0]
        part = size // chains

        def piece(k):
            return tuple(
                None if item is None else tf.nest.map_structure(lambda t: t[k * part:(k + 1) * part], item)
                for item in data
            )

        uneven = tf.where(tf.equal(size % chains, 0), tf.constant(-1, tf.int64), tf.cast(size, tf.int64))
        return [piece(k) for k in range(chains)], uneven

    def _chain_passes(self, batches, params, cross):
        """`(F, U, L, y_pred, per-example statistics or None)` of every chain on its batch
        (this replica's share of F and U).

        One chain runs on the net's own variables. With several, each chain's pass runs the net
        under a `keras.StatelessScope` that maps its trainable variables to that chain's values
        (a loop of C passes, with the per-example engine recording each; or, for samplers
        without per-example statistics, `chain_method="vectorized"`'s one `tf.vectorized_map`);
        what a pass writes to non-trainable variables (moving statistics, seed generators) is
        kept from chain 0.
        """
        if self.num_chains == 1:
            return [self._force_and_statistics(*batches[0], cross, self._recording(None))]
        if self.chain_path == "vectorized":
            return self._vectorized_chain_passes(batches, params)
        variables = self.trainable_variables
        non_trainable = self.net.non_trainable_variables
        passes, updated = [], None
        for k, (batch, chain_params) in enumerate(zip(batches, params)):
            with keras.StatelessScope(state_mapping=list(zip(variables, chain_params))) as scope:
                passes.append(self._force_and_statistics(*batch, cross, self._recording(chain_params), wrt=chain_params))
                if k == 0:
                    updated = [scope.get_current_value(v) for v in non_trainable]
        for variable, value in zip(non_trainable, updated):
            if value is not None:
                variable.assign(value)
        return passes

    def _recording(self, wrt):
        """The per-example engine's recording of the next forward pass, for samplers that need
        per-example statistics on a net every layer of which has a rule (else None); `wrt`
        are the tensors standing for the trainable variables (None: the variables)."""
        if not self.sampler.needs_per_example_gradients or self.per_example_path not in ("layers", "dense_layers"):
            return None
        return kt_per_example.Recording(self.net, self.trainable_variables if wrt is None else wrt)

    def _vectorized_chain_passes(self, batches, params):
        """`_chain_passes` as one `tf.vectorized_map` over the chain axis (no per-example
        statistics: CCAdL and mCCAdL refuse `chain_method="vectorized"`)."""
        variables = self.trainable_variables

        def one_chain(chain_params, batch):
            x, y, sample_weight = batch
            chain_params = list(chain_params)
            with tf.GradientTape() as tape:
                tape.watch(chain_params)
                with keras.StatelessScope(state_mapping=list(zip(variables, chain_params))):
                    potential, loss, y_pred = self.compute_potential(x, y, sample_weight)
            gradients = tape.gradient(potential, chain_params)
            force = [-tf.convert_to_tensor(g) if g is not None else tf.zeros_like(p) for g, p in zip(gradients, chain_params)]
            return force, tf.cast(potential, tf.float32), loss, y_pred

        stacked_params = [tf.stack(column) for column in zip(*params)]
        if self.chain_minibatches == "shared":
            stacked = tf.vectorized_map(lambda p: one_chain(p, batches[0]), stacked_params)
        else:
            present = [i for i, item in enumerate(batches[0]) if item is not None]  # y, weights may be None
            stacked_batches = [
                tf.nest.map_structure(lambda *parts: tf.stack(parts), *[batch[i] for batch in batches]) for i in present
            ]

            def chain_with_batch(args):
                chain_params, items = args
                batch = [None] * len(batches[0])
                for i, item in zip(present, items):
                    batch[i] = item
                return one_chain(chain_params, tuple(batch))

            stacked = tf.vectorized_map(chain_with_batch, (stacked_params, stacked_batches))
        return [
            tuple(tf.nest.map_structure(lambda t: t[k], part) for part in stacked) + (None,)
            for k in range(self.num_chains)
        ]

    def test_step(self, data):
        # `evaluate` under a multi-worker strategy: Keras' logs need the same reshaping.
        return CrossReplica().per_worker_logs(super().test_step(data))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras builds the compiled metrics from the first batch after `strategy.reduce`-ing it,
        # which a multi-worker strategy refuses for an (x, y) structure (keras-team/keras#20585).
        # Shapes are all the build needs, so this worker's first replica's slice serves every
        # strategy.
        if iterator is not None and self._distribute_strategy is not None:
            # The dataset's element spec, not a drawn batch: an extra iterator would shift every
            # epoch to the next shuffle order (single-device Keras draws none here).
            data_batch = batch_spec(iterator)
            if data_batch is not None:
                iterator = None
        if iterator is not None and self._distribute_strategy is not None:
            batch = None
            for _, _, batches in iterator:
                batch = next(batches)
                break
            local = self._distribute_strategy.experimental_local_results
            data_batch = tf.nest.map_structure(
                lambda v: local(v)[0] if isinstance(v, tf.distribute.DistributedValues) else v, batch
            )
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    @property
    def per_example_path(self) -> str:
        """The per-example method in use: `"layers"`, `"vectorized"` or `"dense_layers"`
        (resolves "auto")."""
        if self.per_example_method != "auto":
            return self.per_example_method
        if kt_per_example.incompatibility(self.net) is None:
            return "layers"
        return "vectorized"

    def _check_per_example_method(self) -> None:
        if not self.sampler.needs_per_example_gradients:
            return
        if kt_per_example.stochastic_layers(self.net):
            # No per-example path takes these layers: refuse now rather than name a fallback.
            kt_per_example.check_per_example_compatible(self.net, recurrent_loops=True)
        if self.per_example_method == "dense_layers":
            reason = kt_dense_gradients.dense_layer_incompatibility(self.net)
        elif self.per_example_method in ("layers", "auto"):
            reason = kt_per_example.incompatibility(self.net)
        else:
            return
        if reason is None:
            return
        if self.per_example_method == "auto":
            if not self._runtime.noted_per_example_fallback:
                self._runtime.noted_per_example_fallback = True
                logging.getLogger("keras_thermo").warning(
                    "%s: per-example gradients of net %r come from tf.vectorized_map (several times "
                    "slower than the layer rules) because %s.",
                    type(self.sampler).__name__, self.net.name, reason,
                )
            return
        raise ValueError(
            f"`per_example_method` {self.per_example_method!r} does not apply to net {self.net.name!r}: "
            f"{reason}. Use 'auto' or 'vectorized'."
        )

    def _per_example_gradients(self, x, y, sample_weight, cross, recording=None, y_pred=None, wrt=None):
        scale = self._example_loss_scale  # `loss_weights`: the rows are gradients of the batch loss
        if recording is not None:  # "layers" or "dense_layers": the engine on the recorded pass
            return recording.statistics(
                self.loss, y, y_pred, sample_weight, cross_replica=cross, loss_scale=scale
            )
        rows = kt_per_example.per_example_gradients(
            self.net, self.loss, x, y, sample_weight, loss_scale=scale, wrt=wrt
        )
        return kt_per_example.PerExampleGradients(tf.cast(rows, tf.float32), cross)

    def _assign_if_finite(self, targets, values, checked, step, cross, uneven) -> tf.Tensor:
        """Assigns `values` to `targets` unless any of `checked` is non-finite or the batch did
        not split over the chains (`uneven` its size, else -1); then nothing moves, and
        `diverged_at` keeps `step` (or `uneven_batch` the batch size). Returns whether they were
        assigned."""
        runtime = self._runtime
        finite = all_finite(checked)
        even = uneven < 0
        healthy = tf.logical_and(runtime.diverged_at < 0, runtime.uneven_batch < 0)
        ok = tf.logical_and(tf.logical_and(finite, even), healthy)
        cross.assign(targets, [tf.where(ok, value, target) for target, value in zip(targets, values)])
        runtime.diverged_at.assign(
            tf.where(tf.logical_and(tf.logical_not(finite), healthy), tf.cast(step, tf.int64), runtime.diverged_at)
        )
        runtime.uneven_batch.assign(
            tf.where(tf.logical_and(tf.logical_not(even), healthy), uneven, runtime.uneven_batch)
        )
        return ok

    def _variable_temperatures(self, state, new_state, params, new_params, force):
        """`(weight, kinetic [V], configurational [V])` of a completed step: per-variable
        temperatures for the `EquilibrationCheck` callbacks; steps that did not apply, or where
        the sampler is not at T (TACT-HMC off its plateau), weigh 0."""
        kinetic = self.sampler.variable_kinetic_temperatures(new_state, params, new_params)
        configurational = kt_equilibration.variable_configurational_temperatures(params, force)
        applied = self._runtime.diverged_at < 0
        weight = tf.logical_and(applied, self.sampler.at_target_temperature(state))
        return (
            tf.cast(weight, tf.float64),
            tf.cast(tf.stack(kinetic), tf.float64),
            tf.cast(tf.stack(configurational), tf.float64),
        )

    # --- fit ----------------------------------------------------------------------------------

    def _build_from_data(self, x, y, batch_size) -> None:
        if self.built and self._state_variables:
            return
        inputs = _first_batch_inputs(x, y, batch_size)
        if inputs is None:
            if self.net.built:
                self.build()
                return
            raise ValueError(
                "Cannot build the BayesianModel from this kind of data; build `net` first (e.g. "
                "give it a keras.Input, or call it once on a batch) before `fit`."
            )
        self.net(inputs, training=False)
        self(inputs, training=False)
        if not self._state_variables:
            self.build()

    def _warn_about_stochastic_layers(self) -> None:
        """Warns once per model about layers that make U random or batch-coupled (samplers with
        per-example gradients refuse them instead, see `grads.check_per_example_compatible`)."""
        if self._runtime.warned_about_layers or self.sampler.needs_per_example_gradients:
            return
        self._runtime.warned_about_layers = True
        for layer, kind, setting in kt_per_example.stochastic_layers(self.net):
            warnings.warn(
                f"BayesianModel: layer {layer.name!r}, {setting}, {_TARGET_EFFECTS[kind]}.",
                UserWarning,
                stacklevel=3,
            )

    def _attach_recorders(self, callbacks) -> None:
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = callbacks.callbacks
        callbacks = list(callbacks or [])
        checks = [cb for cb in callbacks if isinstance(cb, kt_equilibration.EquilibrationCheck)]
        recording = [cb for cb in callbacks if isinstance(cb, RecordingCallback)]
        for cb in recording:
            if cb.equilibration_check is not None and cb.equilibration_check not in checks:
                raise ValueError(
                    f"{type(cb).__name__}(burn_in_steps=<EquilibrationCheck>) starts when that check "
                    "says the run is in band, but the check is not among fit's `callbacks`; pass it too."
                )
        temperature_recorders = [cb.attach(self) for cb in checks]
        recorders = [cb.attach(self) for cb in recording]
        if recorders or self._runtime.recorders or temperature_recorders or self._runtime.temperature_recorders:
            # The compiled step captures the recorders it writes to: rebuild it for this set.
            self.train_function = None
        self._runtime.recorders = recorders
        self._runtime.temperature_recorders = temperature_recorders

    def fit(self, *args, with_replacement: bool = True, **kwargs):
        """`keras.Model.fit`, plus: builds the sampler state before the step is compiled, wires
        recording callbacks into the compiled step, and raises `SamplerDivergedError` if a step
        went non-finite (the model then holds the last finite state).

        Arrays (`x`, `y`, `sample_weight` as numpy arrays or tensors) are drawn in minibatches
        *with replacement* (the papers' protocol): every minibatch is an independent draw, so
        the gradient noise is white, as the thermostats and CCAdL/mCCAdL's covariance estimate
        assume. Keras' reshuffled epochs draw without replacement, so the noise of one epoch sums
        to zero, and CCAdL/mCCAdL then subtract noise the epoch has already cancelled (on the
        CCAdL paper's Normal-Gamma posterior with 10 batches an epoch they sample mu with sd
        0.056 instead of 0.097). An epoch is still `ceil(N / batch_size)` steps, and batch k's
        draw depends only on (seed, k), so continued and resumed runs see the same batches.
        `with_replacement=False` (or `shuffle=False`) keeps Keras' own epochs. `tf.data`
        pipelines and `PyDataset`s are used as they are.
        """
        with_replacement = check_bool("with_replacement", with_replacement)
        bound = inspect.signature(keras.Model.fit).bind(self, *args, **kwargs)
        arguments = bound.arguments
        if not self.compiled:
            raise ValueError("Call `compile(loss=...)` on the BayesianModel before `fit`.")
        self._build_from_data(arguments.get("x"), arguments.get("y"), arguments.get("batch_size"))
        split = arguments.get("validation_split", 0.0)
        rows = _fit_checks.training_rows(arguments.get("x"), split)
        if self.num_examples is None:
            self.num_examples = _fit_checks.resolve_num_examples(rows)
        _fit_checks.check_num_examples(self.num_examples, rows, split)
        _fit_checks.warn_about_mse_likelihood(self)
        _fit_checks.warn_about_target_scale(self, arguments.get("y"))
        self._check_per_example_method()
        self._warn_about_stochastic_layers()
        check_even_batches(
            self.distribute_strategy.num_replicas_in_sync, arguments.get("x"), arguments.get("batch_size"),
            arguments.get("validation_split", 0.0), arguments.get("steps_per_epoch"),
        )
        draws_batches = with_replacement and arguments.get("shuffle", True) and _is_array_data(arguments.get("x"))
        self._check_chain_batch_size(arguments.get("x"), arguments.get("batch_size"), draws_batches)
        if draws_batches:
            self._draw_array_minibatches_with_replacement(arguments)
        elif not _is_array_data(arguments.get("x")) and not getattr(arguments.get("x"), "draws_with_replacement", False):
            self._note_pipeline_noise()
        callbacks = _checks_first(arguments.get("callbacks"))
        if self.num_chains > 1:
            callbacks = kt_chains.with_chain_progbar(callbacks)
        arguments["callbacks"] = callbacks
        _fit_checks.check_no_learning_rate_callbacks(callbacks)
        _fit_checks.warn_about_restoring_callbacks(callbacks)
        _fit_checks.warn_about_class_weight(arguments.get("class_weight"))
        _fit_checks.warn_about_output_kind(self)
        self._attach_recorders(callbacks)
        self._runtime.diverged_at.assign(-1)
        self._runtime.uneven_batch.assign(-1)
        guard = _DivergenceGuard()
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks.append(guard)
        else:
            arguments["callbacks"] = list(callbacks or []) + [guard]
        history = super().fit(*bound.args[1:], **bound.kwargs)
        self._raise_if_diverged()
        return history

    def _check_chain_batch_size(self, x, batch_size, draws_batches: bool) -> None:
        """Refuses, before the first step, batches of a known size that do not split into one
        equal part per chain (`chain_minibatches="split"`); sizes that show only at run time
        stop `fit` at the first such batch (`_chain_batches`). Batches `fit` draws itself
        (`draws_batches`) hold `batch_size` examples per chain."""
        if self.num_chains == 1 or self.chain_minibatches == "shared" or draws_batches:
            return
        if isinstance(x, tf.data.Dataset):
            sizes = {
                leaf.shape[0] for leaf in tf.nest.flatten(x.element_spec)
                if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank and leaf.shape[0] is not None
            }
            what = "the tf.data pipeline's batches hold"
        elif _is_array_data(x):
            sizes, what = {batch_size or 32}, "`batch_size` is"
        else:
            return
        for size in sizes:
            if size % self.num_chains:
                raise ValueError(
                    f"{what} {size} examples, which do not split into num_chains={self.num_chains} "
                    "equal parts (chain_minibatches='split' gives each chain one part): use a batch "
                    f"size that is a multiple of {self.num_chains}, fit on arrays with the default "
                    "shuffle (each chain then draws batch_size examples of its own), or "
                    "chain_minibatches='shared'."
                )

    def _draw_array_minibatches_with_replacement(self, arguments) -> None:
        """Replaces `fit`'s arrays by `data.keyed_minibatches` (see `fit`), keeping Keras' epoch
        length, `validation_split` (the last fraction, as Keras takes it) and `sample_weight`."""
        batch_size = arguments.pop("batch_size", None) or 32
        arrays = tuple(arguments.pop(name) for name in ("x", "y", "sample_weight") if arguments.get(name) is not None)
        split = arguments.pop("validation_split", 0.0) or 0.0
        if split:
            arrays, validation = kt_data.split_off_validation(arrays, split)
            arguments["validation_data"] = validation
        arguments["shuffle"] = False  # the draws are already random (Keras warns otherwise)
        num_examples = int(tf.nest.flatten(arrays)[0].shape[0])
        steps_per_epoch = arguments.get("steps_per_epoch") or math.ceil(num_examples / batch_size)
        if self.num_chains > 1 and self.chain_minibatches == "split":
            batch_size *= self.num_chains  # batch_size examples of its own for every chain
        step = self._state_variables[0]  # the sampler's step counter
        if self.distribute_strategy.num_replicas_in_sync == 1:
            # One epoch's batches, from the step counter read when Keras starts the epoch's
            # iterator: epochs continue the stream, also after BackupAndRestore, and an epoch
            # ends after its batches whatever steps_per_execution is, as with Keras' arrays.
            batches = kt_data.keyed_minibatches(arrays, batch_size, seed=self.seed, first_batch=step)
            arguments["x"] = batches.take(steps_per_epoch).apply(
                tf.data.experimental.assert_cardinality(steps_per_epoch)
            )
            arguments.pop("steps_per_epoch", None)
        else:
            # A distributed dataset keeps one iterator over the epochs: one endless stream.
            arguments["x"] = kt_data.keyed_minibatches(arrays, batch_size, seed=self.seed, first_batch=int(step.numpy()))
            arguments["steps_per_epoch"] = steps_per_epoch

    def _note_pipeline_noise(self) -> None:
        """Logs once that a pipeline's own batch order is used (thermostats assume white noise)."""
        if self._runtime.noted_pipeline or not getattr(self.sampler, "assumes_white_gradient_noise", False):
            return
        self._runtime.noted_pipeline = True
        logging.getLogger("keras_thermo").warning(
            "%s assumes independent minibatches (white gradient noise); this dataset's own batch "
            "order is used. Epochs drawn without replacement make the noise of an epoch sum to "
            "zero, which biases noise-absorbing thermostats and CCAdL/mCCAdL's covariance "
            "correction: draw batches with replacement (keras_thermo.data.random_minibatches, or "
            "fit on arrays, which does so by default).",
            type(self.sampler).__name__,
        )

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        """`keras.Model.train_on_batch` (one sampler step), building the sampler state first."""
        self._build_from_data(x, y, None)
        self._check_per_example_method()
        self._warn_about_stochastic_layers()
        self._runtime.diverged_at.assign(-1)
        self._runtime.uneven_batch.assign(-1)
        logs = super().train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=return_dict
        )
        self._raise_if_diverged()
        return logs

    def _raise_if_diverged(self) -> None:
        uneven = int(self._runtime.uneven_batch.numpy())
        if uneven >= 0:
            raise ValueError(
                f"BayesianModel(num_chains={self.num_chains}, chain_minibatches='split') cuts every "
                f"batch into {self.num_chains} equal parts, one per chain, but a batch of {uneven} "
                f"examples came; that step and every later one was not applied. Fit on arrays (each "
                f"chain then draws `batch_size` examples of its own), or batch the pipeline in "
                f"multiples of num_chains={self.num_chains} with drop_remainder=True, or use "
                "chain_minibatches='shared'."
            )
        step = int(self._runtime.diverged_at.numpy())
        if step >= 0:
            raise SamplerDivergedError(
                f"Sampler {type(self.sampler).__name__} produced a non-finite value at step {step} "
                f"(force, momentum, thermostat or weights); the model holds the last finite state, "
                f"reached after {step} steps. Likely cause: the step size "
                f"{self.sampler.step_size!r} is too large for the gradient-noise level; reduce "
                "step_size or increase friction.",
                step=step,
            )


class _DivergenceGuard(keras.callbacks.Callback):
    """Stops `fit` cleanly at the end of the execution in which a step went non-finite."""

    def on_train_batch_end(self, batch, logs=None):
        runtime = self.model._runtime
        if int(runtime.diverged_at.numpy()) >= 0 or int(runtime.uneven_batch.numpy()) >= 0:
            self.model.stop_training = True
