"""The sampler interface shared by every method.

A sampler is a small, serializable description of an update rule. It never owns variables: the
`BayesianModel` creates one non-trainable Keras variable per leaf of the state that `init`
returns (so checkpoints capture it), and on every training step calls `update` with plain
tensors. `update` is a pure function of its inputs, which is what the one-step tests rely on.
"""

from __future__ import annotations

import inspect

from typing import Any, NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_positive
from keras_thermo.samplers import auto_step, integrators
from keras_thermo.samplers import preconditioning as kt_preconditioning
from keras_thermo.samplers import units

Tensors = list[tf.Tensor]


class StepContext(NamedTuple):
    """What the trainer knows about the current step, besides parameters, state and force.

    Attributes:
        temperature: T (a float, or the model's float32 scalar tensor); the target density is
            `exp(-U / T)`.
        num_examples: N, the training-set size (times the model's `loss_elements_per_example`):
            the factor of the batch loss in U.
        batch_size: n of this minibatch (float32 scalar tensor).
        potential: U of this minibatch (float32 scalar tensor).
        seed: The model's integer seed; noise is keyed by (seed, step, stream).
        per_example_gradients: The per-example gradients of the minibatch when the sampler asks
            for them (a `per_example.PerExampleGradients`, or a raw `[n, Nd]` tensor in the order of
            the trainable variables); else None.
    """

    temperature: float
    num_examples: int
    batch_size: tf.Tensor
    potential: tf.Tensor
    seed: int
    per_example_gradients: Any = None

    def normal(self, step: tf.Tensor, like: Sequence[tf.Tensor], stream: int) -> Tensors:
        """Standard normal draws shaped like `like`, keyed by this step and `stream`."""
        return kt_random.normal_like(kt_random.step_key(self.seed, step, stream), like)


def num_scalars(tensors: Sequence[tf.Tensor]) -> int:
    """Nd: the total number of scalars (static shapes)."""
    total = 0
    for tensor in tensors:
        shape = tensor.shape
        if not shape.is_fully_defined():
            name = getattr(tensor, "path", getattr(tensor, "name", "?"))
            raise ValueError(f"Trainable variable {name!r} has unknown shape {shape}; it cannot be sampled.")
        total += shape.num_elements()
    return total


def sample_momentum(params: Sequence[tf.Tensor], *, seed: int, temperature: float, mass: float) -> Tensors:
    """`p_0 ~ N(0, T M)`, drawn from the initialisation stream."""
    noise = kt_random.normal_like(
        kt_random.step_key(seed, tf.constant(0, tf.int64), kt_random.STREAM_INIT), params
    )
    scale = (temperature * mass) ** 0.5
    return [scale * r for r in noise]


class FloatSetting:
    """A float hyperparameter that the compiled step reads (a data descriptor on a sampler class).

    Unbound, it is a plain float (a Python constant in the traced step). Once a `BayesianModel`
    has bound it to a variable (`Sampler.bind_settings`), the step reads the variable: a value set
    later (between or during `fit` calls) takes effect at the next step, and checkpoints keep it.
    An optional setting (None = its default) is stored as 0 in its variable.

    Args:
        check: `check(name, value)` validates and returns the value (`keras_thermo._validation`).
        optional: Whether None is allowed.
        dtype: Of the variable: float64 for what enters the float64 thermostat arithmetic.
    """

    def __init__(self, check, *, optional: bool = False, dtype: tf.DType = tf.float32):
        self.check, self.optional, self.dtype = check, optional, dtype
        self.name = None

    def __set_name__(self, owner, name) -> None:
        self.name = name

    def __get__(self, sampler, owner=None):
        if sampler is None:
            return self
        variable = sampler._setting_variables.get(self.name)
        if variable is None:
            return vars(sampler)[self.name]
        value = float(variable.numpy())
        return None if self.optional and value == 0.0 else value

    def __set__(self, sampler, value) -> None:
        value = self.check(self.name, value)
        variable = sampler._setting_variables.get(self.name)
        if variable is not None:
            variable.assign(0.0 if value is None else value)
        elif sampler.has_bound_settings and value != vars(sampler).get(self.name):
            raise ValueError(
                f"`{self.name}` of {type(sampler).__name__} was compiled into its model's step as the "
                f"constant {vars(sampler).get(self.name)!r} (the model bound only "
                f"{sorted(sampler._setting_variables)} to variables), so {value!r} would be ignored. "
                "Build a new sampler and BayesianModel with the new value."
            )
        vars(sampler)[self.name] = value

    def initial_value(self, sampler) -> tf.Tensor:
        """The value a model's variable starts from (0 for an optional setting left at None)."""
        value = getattr(sampler, self.name)
        return tf.constant(0.0 if value is None else value, self.dtype)


class Sampler:
    """Base class of all samplers.

    Subclasses define `init`, `update` and `get_config`, and set `name`. They may override
    `step_size_at` (schedules), `is_sample` (samplers that yield samples only on some steps),
    and `needs_per_example_gradients`.

    `preconditioner` (None, `"layerwise"`, `"rmsprop"` or a `preconditioning.Preconditioner`)
    gives the sampler a diagonal mass estimated from the force (`keras_thermo.samplers.
    preconditioning`); its state is the last field of the sampler state, `preconditioner`, an
    empty tuple (no variables) when None.

    Settings. The float hyperparameters the step reads (a float `step_size`, and each class's
    `FloatSetting`s such as `friction`) are bound by `BayesianModel` to variables when it builds
    the sampler state (`setting_values`, `bind_settings`): changing one afterwards takes effect
    at the next step, and checkpoints keep it. Every other hyperparameter (`mass`, which the
    momenta are scaled by, integer and structural options) fixes what the state means or what is
    traced; once bound, setting it to a new value raises an error.
    """

    name: str = "sampler"
    needs_per_example_gradients: bool = False

    def __init__(self, step_size: float | str | keras.optimizers.schedules.LearningRateSchedule = auto_step.AUTO, preconditioner=None):
        self._setting_variables = {}
        self.step_size = step_size
        self.preconditioner = kt_preconditioning.get(preconditioner)

    @classmethod
    def from_learning_rate(cls, learning_rate: float, momentum: float, *, num_examples: int, **options):
        """The sampler whose step, without its noise, is `keras.optimizers.SGD(learning_rate,
        momentum)` on the mean loss of `num_examples` examples: `h = sqrt(lr M / N)`, `A = (1 -
        momentum) / h` (`keras_thermo.samplers.units`). For the samplers with a `friction`
        (SGHMC, SGNHT, CCAdL, mCCAdL); `options` are the class's other arguments.

        Example:
            >>> import keras_thermo as kt
            >>> sampler = kt.samplers.SGHMC.from_learning_rate(0.05, 0.9, num_examples=50_000)
            >>> sampler.step_size, sampler.friction
            (0.001, 100.0)
        """
        if "friction" not in inspect.signature(cls.__init__).parameters:
            raise TypeError(
                f"{cls.__name__} has no friction, so it has no SGD-with-momentum form; "
                "from_learning_rate serves SGHMC, SGNHT, CCAdL and MCCAdL."
            )
        converted = units.from_learning_rate(learning_rate, momentum, num_examples, options.get("mass", 1.0))
        return cls(**converted, **options)

    def __setattr__(self, name: str, value) -> None:
        if (
            not name.startswith("_")
            and self.__dict__.get("_setting_variables")
            and not hasattr(type(self), name)  # settings and properties validate themselves
            and name in self.__dict__
            and self.__dict__[name] is not value
            and self.__dict__[name] != value
        ):
            raise ValueError(
                f"`{name}` of {type(self).__name__} fixes the meaning of the sampler state (or what "
                f"the compiled step does); it was {self.__dict__[name]!r} when a model built that "
                f"state and cannot become {value!r}. Build a new sampler and BayesianModel instead. "
                f"Settings that may change between steps: {self.setting_names()}."
            )
        object.__setattr__(self, name, value)

    @property
    def _step_size_variable(self):
        return self._setting_variables.get("step_size")

    @property
    def step_size(self) -> float | str | keras.optimizers.schedules.LearningRateSchedule:
        """h: a float, a `LearningRateSchedule`, or `"auto"` (the default): chosen from the
        curvature the model measures during its adaptation window, then frozen
        (`keras_thermo.samplers.auto_step`); once a model has chosen it, this reads the value.

        A float step size may be changed at any time, also between or during `fit` calls (e.g.
        from a callback): once a `BayesianModel` has bound it to a variable (`bind_settings`),
        the compiled step reads that variable, and checkpoints keep it. A schedule is traced into
        the step and cannot be swapped for a float (or back) after binding.
        """
        if self._step_size_variable is not None:
            return float(self._step_size_variable.numpy())
        return self._step_size

    @step_size.setter
    def step_size(self, value) -> None:
        is_schedule = isinstance(value, keras.optimizers.schedules.LearningRateSchedule)
        if isinstance(value, str):
            if value != auto_step.AUTO:
                raise ValueError(
                    f"`step_size` must be a positive float, a keras LearningRateSchedule or "
                    f"{auto_step.AUTO!r}, got {value!r}."
                )
            if self.has_bound_settings and not self.is_auto_step_size:
                raise ValueError(
                    f"`step_size` of {type(self).__name__} was fixed when a model built its state; it "
                    "cannot become 'auto' afterwards. Build a new sampler and BayesianModel."
                )
        elif not is_schedule:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(
                    f"`step_size` must be a positive float or a keras LearningRateSchedule, got "
                    f"{value!r} ({type(value).__name__})."
                )
            value = check_positive("step_size", value)
        if self.has_bound_settings and is_schedule != isinstance(self._step_size, keras.optimizers.schedules.LearningRateSchedule):
            kind = "schedule" if self._step_size_variable is None else "float bound to a model's variable"
            raise ValueError(
                f"`step_size` of {type(self).__name__} is a {kind}; it cannot become {value!r} once a "
                "model has built its state. Build a new sampler (and BayesianModel) to switch between "
                "a float and a schedule."
            )
        if self._step_size_variable is not None and not isinstance(value, str):
            self._step_size_variable.assign(value)
        self._step_size = value

    @property
    def is_auto_step_size(self) -> bool:
        """Whether the step size is chosen by the model (`step_size="auto"`)."""
        return isinstance(self.__dict__.get("_step_size"), str)

    @property
    def adaptation_steps(self) -> int:
        """W: the steps at the start of a run during which the kernel still changes (the
        thermostat samplers' warm-up; the automatic step size's measurements). Samples from
        before W are not from the papers' chain."""
        warmup = getattr(self, "warmup_steps", None)
        if warmup is not None:
            return int(warmup)
        return auto_step.DEFAULT_ADAPTATION_STEPS if self.is_auto_step_size else 0

    #: Whether `step_size` is a time step h (True) or a squared one, `h^2 / M` (SGLD's eps,
    #: TACT-HMC's eta): sets how the automatic step size follows from the curvature.
    step_size_is_time = True

    def step_size_cap(self, context: "StepContext", params, masses) -> tf.Tensor | None:
        """The largest automatic step size this step's own statistics allow, or None (no cap:
        the samplers whose stability depends on the curvature alone). Applied where the step size
        freezes, at the adaptation window's end, as the smallest over every chain
        (`auto_step.choose_step_size`)."""
        del context, params, masses
        return None

    # --- settings bound to a model's variables -----------------------------------------------

    @classmethod
    def setting_names(cls) -> list[str]:
        """The settings that may change between steps: `step_size` and the `FloatSetting`s."""
        return ["step_size"] + sorted(
            name for klass in cls.__mro__ for name, value in vars(klass).items() if isinstance(value, FloatSetting)
        )

    def setting_values(self) -> dict[str, tf.Tensor]:
        """The settings a model binds, with their initial values as tensors of the variables'
        dtypes (a step-size schedule is traced, not bound, so it is left out). A model creates
        one non-trainable variable per entry and passes them to `bind_settings`."""
        values = {}
        if self.is_auto_step_size:  # NaN until the model measures it at the first step
            values["step_size"] = tf.constant(float("nan"), tf.float32)
        elif not isinstance(self._step_size, keras.optimizers.schedules.LearningRateSchedule):
            values["step_size"] = tf.constant(self._step_size, tf.float32)
        for name in self.setting_names()[1:]:
            values[name] = getattr(type(self), name).initial_value(self)
        return values

    def bind_settings(self, variables: dict) -> None:
        """Makes the step read each setting in `variables` (name -> variable, created by the
        model from `setting_values`) and a later assignment write it."""
        unknown = sorted(set(variables) - set(self.setting_names()))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no settings {unknown}; its settings are {self.setting_names()}.")
        if "step_size" in variables and isinstance(self._step_size, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"{type(self).__name__} has a step-size schedule; there is no float to bind.")
        self._setting_variables = {**self._setting_variables, **variables}

    def bind_step_size(self, variable) -> None:
        """`bind_settings({"step_size": variable})`."""
        self.bind_settings({"step_size": variable})

    @property
    def has_bound_settings(self) -> bool:
        """Whether a model has bound any of this sampler's settings to its variables."""
        return bool(self.__dict__.get("_setting_variables"))

    @property
    def has_bound_step_size(self) -> bool:
        """Whether a model's variable holds this sampler's float step size."""
        return self._step_size_variable is not None

    def friction_at(self, h) -> tf.Tensor:
        """A at step size `h` (for the samplers with a friction): the `friction` setting, or
        `(1 - DEFAULT_MOMENTUM) / h` when it is None (`keras_thermo.samplers.auto_step`)."""
        return self.read_setting("friction", default=auto_step.default_friction(h))

    def read_setting(self, name: str, default=None):
        """The value of setting `name` for the step: its variable (a tensor) once bound, else the
        float; `default` stands for an optional setting left at None (0 in its variable). A
        callable default is called only where it is needed (it may read a step size that is not
        measured yet)."""
        resolve = default if callable(default) else (lambda: default)
        variable = self._setting_variables.get(name)
        if variable is None:
            value = getattr(self, name)
            return resolve() if value is None else value
        value = tf.convert_to_tensor(variable)
        if default is None:
            return value
        return tf.where(value > 0, value, tf.cast(resolve(), value.dtype))

    # --- to be provided by subclasses -------------------------------------------------------

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> NamedTuple:
        """Returns the initial state; its first field is always the int64 `step`."""
        raise NotImplementedError

    def update(
        self,
        state: NamedTuple,
        params: Sequence[tf.Tensor],
        force: Sequence[tf.Tensor],
        context: StepContext,
    ) -> tuple[Tensors, NamedTuple, dict[str, tf.Tensor]]:
        """One step: returns new parameters, new state and the step's diagnostics."""
        raise NotImplementedError

    # --- shared behaviour -------------------------------------------------------------------

    def step_size_at(self, step: tf.Tensor) -> tf.Tensor:
        """The step size h at `step` (float32 scalar)."""
        if isinstance(self._step_size, keras.optimizers.schedules.LearningRateSchedule):
            return tf.cast(self._step_size(step), tf.float32)
        if self._step_size_variable is not None:
            return tf.cast(tf.convert_to_tensor(self._step_size_variable), tf.float32)
        if self.is_auto_step_size:
            raise ValueError(
                f"{type(self).__name__}(step_size='auto') gets its step size from the BayesianModel "
                "that runs it; when calling `update` directly, give a float step_size."
            )
        return tf.constant(self._step_size, tf.float32)

    def is_sample(self, state: NamedTuple) -> tf.Tensor:
        """Whether the step that produced `state` yields a posterior sample (subclasses that
        yield samples only on some steps combine their rule with `in_sampling_phase`)."""
        return self.in_sampling_phase(state)

    def in_sampling_phase(self, state: NamedTuple) -> tf.Tensor:
        """False when the step that produced `state` lies in an exploration phase of the
        step-size schedule (a schedule with an `in_sampling_phase(step)` method, such as
        `keras_thermo.schedules.Cyclical`); True for any other step size."""
        phase = getattr(self._step_size, "in_sampling_phase", None)
        if phase is None:
            return tf.constant(True)
        return phase(state.step - 1)  # `state.step` counts the steps completed

    def variable_kinetic_temperatures(self, new_state: NamedTuple, params, new_params) -> Tensors:
        """Each variable's kinetic temperature after a step, `p_v . M^-1 . p_v / n_v` (float32
        scalars, one per variable in `params` order); each averages T at equilibrium.

        `params` and `new_params` are the weights before and after the step (samplers without
        momentum read their velocity from them)."""
        del params, new_params
        momentum = getattr(new_state, "momentum", None)
        if momentum is None:
            raise NotImplementedError(f"{type(self).__name__} has no momentum; override this method.")
        if self.preconditioner is None:
            mass = float(getattr(self, "mass", 1.0))
            return [tf.reduce_sum(tf.square(tf.cast(p, tf.float32))) / (mass * float(num_scalars([p]))) for p in momentum]
        masses = self.masses(new_state.preconditioner)
        return [integrators.twice_kinetic_energy([p], [m]) / float(num_scalars([p])) for p, m in zip(momentum, masses)]

    # --- preconditioning ----------------------------------------------------------------------

    def init_preconditioner(self, params) -> tuple:
        """The `preconditioner` field of the initial state (empty without one)."""
        if self.preconditioner is None:
            return ()
        return self.preconditioner.init(params)

    def masses(self, preconditioner_state):
        """The mass argument of `integrators`: the scalar `mass` (1 for samplers without one)
        without a preconditioner, else `mass * m_v` per variable."""
        base = float(getattr(self, "mass", 1.0))
        if self.preconditioner is None:
            return base
        return [base * m for m in preconditioner_state.mass]

    def precondition(self, state: NamedTuple, force) -> tuple[Any, Any, Tensors]:
        """`(mass, preconditioner state, momentum factors)` of the step that starts at `state`:
        the masses this step uses, the new preconditioner state, and the factors
        `sqrt(m_new / m_old)` to rescale the momentum by (None without a preconditioner)."""
        if self.preconditioner is None:
            return self.masses(()), (), None
        new = self.preconditioner.update(state.preconditioner, force, state.step)
        factors = kt_preconditioning.momentum_factors(state.preconditioner, new)
        return self.masses(new), new, factors

    def preconditioned_state(self, state: NamedTuple, force) -> tuple[NamedTuple, Any, Any]:
        """`(state, mass, preconditioner state)` of `precondition`, with the state's momenta
        rescaled by its factors to the new masses (for samplers whose `momentum` is `p`)."""
        mass, preconditioner, factors = self.precondition(state, force)
        if factors is not None:
            state = state._replace(momentum=[p * c for p, c in zip(state.momentum, factors)])
        return state, mass, preconditioner

    def parameter_temperature(self, state: NamedTuple, temperature) -> tf.Tensor:
        """The temperature the weights are sampled at when the chain is at `state`: `T` itself,
        except for samplers that temper them (TACT-HMC: `T / lambda(xi)`). A prior's Gibbs
        draw of its hyperparameters after a step uses it (the joint target the weights see is
        `exp(-U / T_eff)`, hyperparameters' part of U included)."""
        del state
        return tf.cast(temperature, tf.float32)

    def at_target_temperature(self, state: NamedTuple) -> tf.Tensor:
        """Whether theta is sampled at the temperature T when the chain is at `state` (samplers
        that temper theta, like TACT-HMC, say False off their plateau): the equilibration check
        compares only such steps with T."""
        del state
        return tf.constant(True)

    def get_config(self) -> dict[str, Any]:
        step_size = auto_step.AUTO if self.is_auto_step_size else self.step_size
        if isinstance(step_size, keras.optimizers.schedules.LearningRateSchedule):
            step_size = keras.saving.serialize_keras_object(step_size)
        preconditioner = None if self.preconditioner is None else self.preconditioner.get_config()
        return {"step_size": step_size, "preconditioner": preconditioner}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Sampler":
        config = dict(config)
        if isinstance(config.get("step_size"), dict):
            config["step_size"] = keras.saving.deserialize_keras_object(config["step_size"])
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def require_per_example_gradients(context: StepContext, sampler_name: str):
    """The per-example statistics of the step (a `per_example.PerExampleGradients` or an object
    with the same members); a raw `[n, Nd]` tensor is wrapped. A clear error when they are missing."""
    from keras_thermo.per_example.statistics import PerExampleGradients  # noqa: PLC0415 (loads the engine)

    given = context.per_example_gradients
    if given is None:
        raise ValueError(
            f"{sampler_name} needs the per-example gradients of the minibatch in "
            "`context.per_example_gradients` (shape [n, Nd]); BayesianModel supplies them "
            "because the sampler sets `needs_per_example_gradients = True`. When calling "
            "`update` directly, pass them in the StepContext."
        )
    if hasattr(given, "covariance_factor"):
        return given
    rows = tf.convert_to_tensor(given).shape[0]
    if rows is not None and rows < 2:
        raise ValueError(
            f"{sampler_name} estimates the gradient-noise covariance from the minibatch, which "
            f"needs a batch size of at least 2; got per-example gradients for {rows} example(s)."
        )
    return PerExampleGradients(tf.cast(given, tf.float32))


def force_noise_scale(context: StepContext) -> tf.Tensor:
    """`N^2 / n`: the covariance of the noisy force is this times that of one example's gradient."""
    return float(context.num_examples) ** 2 / tf.cast(context.batch_size, tf.float32)
