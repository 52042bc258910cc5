"""`BayesianModel`: a Keras model whose `fit` samples the posterior instead of minimising the loss.

Each training step computes the potential of the minibatch (DESIGN section 3)

    U(theta) = N * L(theta; batch) + R(theta),

where `L` is exactly what Keras' `compute_loss` returns (the mean per-example loss plus the layers'
regularization losses) and `R = -log prior(theta)`, takes the force `F = -grad U`, and hands both
to the sampler's update rule. The sampler's state (momenta, thermostats, step counter) lives in
non-trainable variables of this model, so `model.save`, `save_weights` and `ModelCheckpoint`
capture it, and the noise is keyed by (seed, step), so a restored run continues exactly.

The step itself is `keras_thermo.step` (`SamplingStep`, which `BayesianModel` inherits), the
chains' weights `keras_thermo.chains.ChainWeights`; `fit`'s argument checks are in `_fit_checks`,
and what it hands to Keras' `fit` (minibatches, callbacks) in `_fit_setup`.
"""

from __future__ import annotations

import inspect
import random as py_random

import keras
import tensorflow as tf

from keras_thermo import _fit_checks, _fit_setup
from keras_thermo import chains as kt_chains
from keras_thermo import per_example as kt_per_example
from keras_thermo import priors as kt_priors
from keras_thermo import random as kt_random
from keras_thermo import samplers as kt_samplers
from keras_thermo import schedules as kt_schedules
from keras_thermo._distribute import CrossReplica, batch_spec, check_even_batches, isolate_collectives
from keras_thermo._validation import check_bool, check_choice, check_int, check_positive, check_seed
from keras_thermo.step import SamplingStep, _Runtime

# Importable from here too, where they were first defined.
from keras_thermo._fit_checks import check_float32_variables  # noqa: F401
from keras_thermo.step import SamplerCollapsedError, SamplerDivergedError, all_finite, configurational_temperature  # noqa: F401

#: How per-example gradient statistics are computed (samplers that need them: CCAdL, mCCAdL).
PER_EXAMPLE_METHODS = ("auto", "layers", "vectorized", "dense_layers")

# Keras loss reductions that keep the `N * mean` convention of the potential.
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


@keras.saving.register_keras_serializable(package="keras_thermo")
class BayesianModel(SamplingStep, kt_chains.ChainWeights, keras.Model):
    """Turns `fit` on any Keras model into a stochastic-gradient MCMC sampler.

    Args:
        net: The Keras model whose trainable weights are sampled (Sequential, functional or
            subclassed).
        sampler: A `keras_thermo.samplers.Sampler` (or a name / config for
            `keras_thermo.samplers.get`).
        num_examples: N, the number of training examples; the potential is `N * mean loss`.
            None (the default) takes N from the first `fit`: the rows it trains on (arrays, less
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
            `Dense` layers (`keras_thermo.per_example.dense_layers`); `"auto"` (default) uses `"layers"`
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
        temperature_check: True (default): every `fit` without an `EquilibrationCheck` among its
            callbacks runs a default one (`keras_thermo.equilibration.default_check`, kept from
            one `fit` to the next): its verdict goes to the epoch logs and History
            (`equilibrated`: 1 at T, 0 not, NaN while the run is too short to judge or its
            configurational temperature too unsettled) and, when
            the run ends out of band, a warning says so in plain words with the likely cause;
            `SampleCollector` and `PosteriorAverage` then warn that their samples come from a
            chain that is not at T. False turns it off.

    Example:
        >>> import keras, numpy as np, keras_thermo as kt
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model = kt.BayesianModel(net, kt.samplers.SGHMC(step_size=1e-3), num_examples=64,
        ...                          prior=kt.priors.Gaussian(1.0), seed=0)
        >>> model.compile(loss=kt.losses.GaussianNLL(scale=0.5))
        >>> x, y = np.random.rand(64, 3), np.random.rand(64, 1)
        >>> history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        >>> sorted(k for k in history.history if k != "loss")  # the step's, then the temperature check's
        ['configurational_temperature', 'curvature', 'equilibrated', 'equilibration_step',
         'kinetic_temperature', 'mean_configurational_temperature', 'mean_kinetic_temperature',
         'output_spread', 'potential', 'step_size']
    """

    def __init__(
        self,
        net: keras.Model,
        sampler,
        num_examples: int | None = None,
        prior: kt_priors.Prior | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        per_example_method: str = "auto",
        loss_elements_per_example: float = 1.0,
        num_chains: int = 1,
        chain_method: str = "auto",
        chain_minibatches: str = "split",
        temperature_check: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(net, keras.Model):
            raise TypeError(f"`net` must be a keras.Model, got {type(net).__name__}: {net!r}.")
        self.net = net
        self.sampler = kt_samplers._resolve(sampler, {}, argument="sampler")
        self.num_examples = None if num_examples is None else check_int("num_examples", num_examples, low=1)
        self.loss_elements_per_example = check_positive("loss_elements_per_example", loss_elements_per_example)
        self.prior = kt_priors.get(prior)
        self._temperature_variable = None
        self.temperature_schedule = None
        self.temperature = temperature
        seed = check_seed("seed", seed)
        self.seed = py_random.randrange(2**31) if seed is None else seed
        self.temperature_check = check_bool("temperature_check", temperature_check)
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
        return {"net_built": bool(self.net.built), "built": bool(self.built)}

    def build_from_config(self, config):
        # The net restores its own build config when it is deserialized; only the sampler state
        # remains to be created before the saved variables are loaded into it. A model saved
        # before it was built (before its first fit) saved no sampler state: it loads unbuilt,
        # and its first fit builds it. Files written before the "built" key are taken as built
        # (so one of those saved before its first fit still does not load).
        if config.get("built", True):
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
            self._example_loss_scale = _fit_checks.single_output_loss_weight(
                loss, kwargs.get("loss_weights"), type(self.sampler).__name__
            )
        for description, reduction in _fit_checks.loss_reductions(loss):
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
            "temperature_check": self.temperature_check,
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
        # The largest curvature measured (logged): the automatic step size follows it; a float one
        # is checked against it (`samplers.auto_step`). A schedule is not measured.
        self._curvature_variable = None
        if "step_size" in self._sampler_setting_variables:
            self._curvature_variable = keras.Variable(0.0, dtype="float32", trainable=False, autocast=False, name="curvature")

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
        _fit_checks.check_float32_variables(self.trainable_variables)
        with self.distribute_strategy.scope():
            if self.num_chains > 1:
                self._create_chain_variables()
            self._create_state_variables(params)
            self._create_setting_variables()
            self._create_prior_state_variables()

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

    # --- Keras' evaluate and build under a strategy ---------------------------------------------

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

    # --- fit ----------------------------------------------------------------------------------

    def _build_from_data(self, x, y, batch_size) -> None:
        if self.built and self._state_variables:
            return
        inputs = _fit_setup.first_batch_inputs(x, y, batch_size)
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

    def temperature_report(self) -> dict | None:
        """The report of the `EquilibrationCheck` of the last `fit` (its own or the default one,
        see `temperature_check`), or None without one. See `EquilibrationCheck.report`."""
        checks = self._runtime.temperature_checks
        return checks[0].report() if checks else None

    def fit(self, *args, with_replacement: bool = True, **kwargs):
        """`keras.Model.fit`, plus: builds the sampler state before the step is compiled, wires
        recording callbacks into the compiled step, and raises `SamplerDivergedError` if a step
        went non-finite (the model then holds the last finite state), or its subclass
        `SamplerCollapsedError` at the end of an epoch whose last batch the net, after
        predicting different outputs before, predicts the same output for every example of
        (train logs: `output_spread`, `keras_thermo.step.output_spread`).

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
        _fit_checks.check_array_rows(arguments)
        self._build_from_data(arguments.get("x"), arguments.get("y"), arguments.get("batch_size"))
        split = arguments.get("validation_split", 0.0)
        rows = _fit_checks.training_rows(arguments.get("x"), split)
        if self.num_examples is None:
            self.num_examples = _fit_checks.resolve_num_examples(rows)
        _fit_checks.check_num_examples(self.num_examples, rows, split,
                                       slack=_fit_checks.dropped_remainder(arguments.get("x")))
        _fit_checks.warn_about_mse_likelihood(self)
        _fit_checks.warn_about_target_scale(self, arguments.get("y"))
        _fit_checks.check_per_example_method(self)
        _fit_checks.warn_about_stochastic_layers(self)
        check_even_batches(
            self.distribute_strategy.num_replicas_in_sync, arguments.get("x"), arguments.get("batch_size"),
            arguments.get("validation_split", 0.0), arguments.get("steps_per_epoch"),
        )
        draws_batches = with_replacement and arguments.get("shuffle", True) and _fit_checks.is_array_data(arguments.get("x"))
        _fit_checks.check_chain_batch_size(self, arguments.get("x"), arguments.get("batch_size"), draws_batches)
        if draws_batches:
            _fit_setup.draw_array_minibatches_with_replacement(self, arguments)
        elif not _fit_checks.is_array_data(arguments.get("x")) and not getattr(arguments.get("x"), "draws_with_replacement", False):
            _fit_checks.note_pipeline_noise(self)
        callbacks = _fit_setup.checks_first(_fit_setup.with_default_check(self, arguments.get("callbacks")))
        if self.num_chains > 1:
            callbacks = kt_chains.with_chain_progbar(callbacks)
        arguments["callbacks"] = callbacks
        _fit_checks.check_no_learning_rate_callbacks(callbacks)
        _fit_checks.warn_about_restoring_callbacks(callbacks)
        _fit_checks.warn_about_class_weight(arguments.get("class_weight"))
        _fit_checks.warn_about_output_kind(self)
        _fit_setup.attach_recorders(self, callbacks)
        self._runtime.diverged_at.assign(-1)
        self._runtime.uneven_batch.assign(-1)
        self._runtime.last_step_size_limit = None
        guard = _fit_setup.DivergenceGuard()
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks.append(guard)
        else:
            arguments["callbacks"] = list(callbacks or []) + [guard]
        history = super().fit(*bound.args[1:], **bound.kwargs)
        self._raise_if_diverged()
        return history

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        """`keras.Model.train_on_batch` (one sampler step), building the sampler state first."""
        self._build_from_data(x, y, None)
        _fit_checks.check_per_example_method(self)
        _fit_checks.warn_about_stochastic_layers(self)
        self._runtime.diverged_at.assign(-1)
        self._runtime.uneven_batch.assign(-1)
        logs = super().train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=return_dict
        )
        self._raise_if_diverged()
        return logs
