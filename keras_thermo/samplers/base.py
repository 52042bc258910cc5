"""The sampler interface shared by every method.

A sampler is a small, serializable description of an update rule. It never owns variables: the
`BayesianModel` creates one non-trainable Keras variable per leaf of the state that `init`
returns (so checkpoints capture it), and on every training step calls `update` with plain
tensors. `update` is a pure function of its inputs, which is what the one-step tests rely on.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_positive

Tensors = list[tf.Tensor]


class StepContext(NamedTuple):
    """What the trainer knows about the current step, besides parameters, state and force.

    Attributes:
        temperature: T; the target density is `exp(-U / T)`.
        num_examples: N, the training-set size.
        batch_size: n of this minibatch (float32 scalar tensor).
        potential: U of this minibatch (float32 scalar tensor).
        seed: The model's integer seed; noise is keyed by (seed, step, stream).
        per_example_gradients: `[n, Nd]` gradients of the per-example losses, in the order of
            the trainable variables, when the sampler asks for them; else None.
    """

    temperature: float
    num_examples: int
    batch_size: tf.Tensor
    potential: tf.Tensor
    seed: int
    per_example_gradients: tf.Tensor | None = None

    def normal(self, step: tf.Tensor, like: Sequence[tf.Tensor], stream: int) -> Tensors:
        """Standard normal draws shaped like `like`, keyed by this step and `stream`."""
        return kt_random.normal_like(kt_random.step_key(self.seed, step, stream), like)


def num_scalars(tensors: Sequence[tf.Tensor]) -> int:
    """Nd: the total number of scalars (static shapes)."""
    total = 0
    for tensor in tensors:
        shape = tensor.shape
        if not shape.is_fully_defined():
            raise ValueError(f"Trainable variable with unknown shape {shape} cannot be sampled.")
        total += shape.num_elements()
    return total


def sample_momentum(params: Sequence[tf.Tensor], *, seed: int, temperature: float, mass: float) -> Tensors:
    """`p_0 ~ N(0, T M)`, drawn from the initialisation stream."""
    noise = kt_random.normal_like(
        kt_random.step_key(seed, tf.constant(0, tf.int64), kt_random.STREAM_INIT), params
    )
    scale = (temperature * mass) ** 0.5
    return [scale * r for r in noise]


class Sampler:
    """Base class of all samplers.

    Subclasses define `init`, `update` and `get_config`, and set `name`. They may override
    `step_size_at` (schedules), `is_sample` (samplers that yield samples only on some steps),
    and `needs_per_example_gradients`.
    """

    name: str = "sampler"
    needs_per_example_gradients: bool = False

    def __init__(self, step_size: float | keras.optimizers.schedules.LearningRateSchedule):
        if isinstance(step_size, keras.optimizers.schedules.LearningRateSchedule):
            self.step_size = step_size
        else:
            self.step_size = check_positive("step_size", step_size)

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
        if isinstance(self.step_size, keras.optimizers.schedules.LearningRateSchedule):
            return tf.cast(self.step_size(step), tf.float32)
        return tf.constant(self.step_size, tf.float32)

    def is_sample(self, state: NamedTuple) -> tf.Tensor:
        """Whether the step that produced `state` yields a posterior sample."""
        del state
        return tf.constant(True)

    def get_config(self) -> dict[str, Any]:
        step_size = self.step_size
        if isinstance(step_size, keras.optimizers.schedules.LearningRateSchedule):
            step_size = keras.saving.serialize_keras_object(step_size)
        return {"step_size": step_size}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Sampler":
        config = dict(config)
        if isinstance(config.get("step_size"), dict):
            config["step_size"] = keras.saving.deserialize_keras_object(config["step_size"])
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"
