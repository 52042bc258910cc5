"""Step-size and temperature schedules.

Any `keras.optimizers.schedules.LearningRateSchedule` can drive a sampler's step size; this module
adds the SGLD paper's polynomial decay and the cyclical cosine schedule of cSG-MCMC, whose
exploration phases a sampler does not collect samples from. `TemperatureSchedule`s drive a
`BayesianModel`'s temperature step by step (`TemperatureRamp`).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from keras_thermo._validation import check_choice, check_int, check_number, check_positive


@keras.saving.register_keras_serializable(package="keras_thermo")
class PolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`eps_t = a * (b + t) ** (-gamma)`, the schedule of Welling & Teh (2011), section 3.

    The SGLD conditions `sum eps_t = inf`, `sum eps_t^2 < inf` hold for `gamma` in (0.5, 1].

    Args:
        a: Scale, > 0.
        b: Offset, > 0 (keeps the first steps finite).
        gamma: Decay exponent in [0, 1]; 0 gives a constant step `a * b**0`.

    Example:
        >>> schedule = PolynomialDecay(a=0.01, b=1.0, gamma=0.55)
        >>> round(float(schedule(0)), 6)
        0.01

    Reference:
        M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
        ICML 2011.
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55):
        self.a = check_positive("a", a)
        self.b = check_positive("b", b)
        self.gamma = check_number("gamma", gamma, low=0.0, high=1.0, low_inclusive=True)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        return self.a * tf.pow(self.b + step, -self.gamma)

    def get_config(self) -> dict:
        return {"a": self.a, "b": self.b, "gamma": self.gamma}


@keras.saving.register_keras_serializable(package="keras_thermo")
class Cyclical(keras.optimizers.schedules.LearningRateSchedule):
    """The cyclical cosine step size of cSG-MCMC (Zhang et al. 2020, eq. 1), with its phases.

    `h(t) = (h0 / 2) (cos(pi mod(t, L) / L) + 1)` at step t (counted from 0): each cycle of L
    steps starts at `h0` and decays to ~0. The first `exploration_fraction` of every cycle is the
    exploration phase, the rest the sampling phase; a sampler given this schedule marks only the
    steps of sampling phases as samples (`Sampler.is_sample`), so `SampleCollector` and
    `PosteriorAverage` keep those alone. The paper runs plain SGD (no noise) while exploring;
    here the sampler keeps its noise in both phases (every step still targets `exp(-U / T)`),
    only the sample flags differ. With K steps in all and M cycles, `cycle_length = ceil(K / M)`.

    Args:
        initial_step_size: h0 > 0, the step size at the start of every cycle.
        cycle_length: L >= 1 steps per cycle.
        exploration_fraction: beta in [0, 1): the fraction of each cycle not sampled (the paper
            uses 0.8 for SGLD-based runs; 0 samples every step).

    Example:
        >>> schedule = Cyclical(initial_step_size=0.1, cycle_length=4, exploration_fraction=0.5)
        >>> [round(float(schedule(t)), 4) for t in range(5)]
        [0.1, 0.0854, 0.05, 0.0146, 0.1]
        >>> [bool(schedule.in_sampling_phase(t)) for t in range(5)]
        [False, False, True, True, False]

    Reference:
        R. Zhang, C. Li, J. Zhang, C. Chen and A. G. Wilson, "Cyclical stochastic gradient MCMC
        for Bayesian deep learning", ICLR 2020, eq. 1 and Algorithm 1.
    """

    def __init__(self, initial_step_size: float, cycle_length: int, exploration_fraction: float = 0.8):
        self.initial_step_size = check_positive("initial_step_size", initial_step_size)
        self.cycle_length = check_int("cycle_length", cycle_length, low=1)
        self.exploration_fraction = check_number(
            "exploration_fraction", exploration_fraction, low=0.0, high=1.0, low_inclusive=True,
            high_inclusive=False,
        )
        if self._first_sampling_position() >= self.cycle_length:
            raise ValueError(
                f"`exploration_fraction` {self.exploration_fraction!r} with `cycle_length` "
                f"{self.cycle_length} leaves no step of a cycle to sample (the sampling phase "
                f"starts at step ceil(beta L) = {self._first_sampling_position()} of {self.cycle_length}); "
                "lower exploration_fraction or lengthen the cycle."
            )

    def _first_sampling_position(self) -> int:
        """`ceil(beta L)`: the first step of a cycle in its sampling phase (a float product such
        as 0.7 * 10 = 7.000000000000001 is taken as the integer it stands for)."""
        return math.ceil(self.exploration_fraction * self.cycle_length - 1e-9)

    def cycle_position(self, step) -> tf.Tensor:
        """`mod(t, L) / L` in [0, 1) (float32); exact for any int64 step."""
        step = tf.cast(step, tf.int64)
        return tf.cast(tf.math.floormod(step, self.cycle_length), tf.float32) / float(self.cycle_length)

    def __call__(self, step):
        position = self.cycle_position(step)
        return 0.5 * self.initial_step_size * (tf.cos(math.pi * position) + 1.0)

    def in_sampling_phase(self, step) -> tf.Tensor:
        """Whether step t (counted from 0) is in its cycle's sampling phase.

        Decided on integers, `mod(t, L) >= ceil(beta L)`, so no rounding can move a boundary.
        """
        return tf.math.floormod(tf.cast(step, tf.int64), self.cycle_length) >= self._first_sampling_position()

    def get_config(self) -> dict:
        return {
            "initial_step_size": self.initial_step_size,
            "cycle_length": self.cycle_length,
            "exploration_fraction": self.exploration_fraction,
        }


@keras.saving.register_keras_serializable(package="keras_thermo")
class TemperatureSchedule:
    """Base class of a temperature `T(t) > 0` as a function of the sampler step t (from 0).

    Given as `BayesianModel(temperature=...)`, it sets the temperature of every step inside the
    compiled train step; the train logs then carry `temperature`. Subclasses implement
    `__call__(step)` (a float32 scalar tensor) and `get_config`.
    """

    def __call__(self, step) -> tf.Tensor:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {}

    def constant_from_step(self) -> int | None:
        """The first step from which T stays constant (the end of a ramp), or None when the
        schedule does not say; `EquilibrationCheck` starts no recording before it."""
        return None

    @classmethod
    def from_config(cls, config: dict) -> "TemperatureSchedule":
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


#: How `TemperatureRamp` interpolates between its end points.
RAMP_INTERPOLATIONS = ("geometric", "linear")


@keras.saving.register_keras_serializable(package="keras_thermo")
class TemperatureRamp(TemperatureSchedule):
    """A temperature ramp from `initial_temperature` to `temperature` over `ramp_steps` steps,
    then constant: e.g. a hot start that explores while the chain burns in, ending at T = 1 (the
    Bayes posterior) or at a cold posterior's T < 1.

    With `u = min(t / ramp_steps, 1)`: `"geometric"` (default) is `T0 (T / T0)^u`, the same
    factor per step (the usual annealing ladder, e.g. from T0 = 10 to 1); `"linear"` is
    `T0 + (T - T0) u`. Steps from `ramp_steps` on sample `exp(-U / T)`; the ones before are
    burn-in, so start recording callbacks (`burn_in_steps`) no earlier than `ramp_steps` (an
    `EquilibrationCheck` given as their burn-in starts them no earlier by itself).

    Args:
        initial_temperature: T0 > 0 at step 0.
        temperature: T > 0 from step `ramp_steps` on.
        ramp_steps: Steps of the ramp, >= 1.
        interpolation: `"geometric"` or `"linear"`.

    Example:
        >>> ramp = TemperatureRamp(initial_temperature=4.0, temperature=1.0, ramp_steps=2)
        >>> [float(ramp(t)) for t in range(4)]
        [4.0, 2.0, 1.0, 1.0]
        >>> ramp.constant_from_step()  # no recording before this step
        2
    """

    def __init__(
        self,
        initial_temperature: float,
        temperature: float = 1.0,
        ramp_steps: int = 1000,
        interpolation: str = "geometric",
    ):
        self.initial_temperature = check_positive("initial_temperature", initial_temperature)
        self.temperature = check_positive("temperature", temperature)
        self.ramp_steps = check_int("ramp_steps", ramp_steps, low=1)
        self.interpolation = check_choice("interpolation", interpolation, RAMP_INTERPOLATIONS)

    def __call__(self, step) -> tf.Tensor:
        progress = tf.minimum(tf.cast(step, tf.float64) / float(self.ramp_steps), 1.0)
        start, end = self.initial_temperature, self.temperature
        if self.interpolation == "geometric":
            value = start * tf.pow(tf.constant(end / start, tf.float64), progress)
        else:
            value = start + (end - start) * progress
        # The end point exactly, whatever the rounding of the power.
        value = tf.where(progress >= 1.0, tf.constant(end, tf.float64), value)
        return tf.cast(value, tf.float32)

    def constant_from_step(self) -> int:
        return self.ramp_steps

    def get_config(self) -> dict:
        return {
            "initial_temperature": self.initial_temperature,
            "temperature": self.temperature,
            "ramp_steps": self.ramp_steps,
            "interpolation": self.interpolation,
        }
