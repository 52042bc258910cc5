"""The recording base of the callbacks that collect what a sampling run produces, and
`SampleCollector` (public through `keras_thermo.callbacks`).

Keras calls callbacks once per execution, which is `steps_per_execution` steps. Callbacks that
must see individual steps (`SampleCollector`) therefore record inside the compiled train step,
into a small buffer of variables that the callback drains after each execution
(`ParameterRecorder`). Recording only happens on steps the sampler marks as samples.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_thermo._distribute import is_distributed, replica_local_variable
from keras_thermo._validation import check_int
from keras_thermo.equilibration import furthest_miss


class ParameterRecorder:
    """In-graph buffer of flattened parameters, written on due steps of the compiled train step.

    A step `s` (counted from 1, i.e. the number of completed steps) is due when
    `s > burn_in_steps` and `(s - burn_in_steps) % every_n_steps == 0`; a due step is recorded
    when the sampler marks it as a sample, for several chains when any chain does, together
    with the mask of the chains that do (TACT-HMC's chains reach their plateaus at different
    steps; every other sampler's chains agree, and their masks are all True).

    Args:
        num_params: Nd, the length of a flattened parameter vector.
        capacity: Rows in the buffer; at least the number of due steps in one execution.
        burn_in_steps: Steps skipped before recording starts.
        every_n_steps: Recording period after burn-in.
        num_chains: None for rows `[Nd]` of one chain; C for rows `[C, Nd]` of C chains that
            step together (`BayesianModel(num_chains=C)`), each with a mask `[C]`.
    """

    def __init__(
        self, num_params: int, capacity: int, burn_in_steps: int, every_n_steps: int, num_chains: int | None = None
    ):
        self.every_n_steps = every_n_steps
        self.capacity = capacity
        self.num_chains = num_chains
        row_shape = [num_params] if num_chains is None else [num_chains, num_params]
        # A variable, so an `EquilibrationCheck` can start the recording during `fit`.
        self.burn_in_steps = replica_local_variable(tf.constant(burn_in_steps, tf.int64), name="recording_burn_in")
        # Per-replica copies under tf.distribute: only the first replica of each worker writes.
        self.values = replica_local_variable(tf.zeros([capacity, *row_shape]), name="recorded_values")
        self.steps = replica_local_variable(tf.zeros([capacity], tf.int64), name="recorded_steps")
        self.masks = None
        if num_chains is not None:
            self.masks = replica_local_variable(tf.zeros([capacity, num_chains], tf.bool), name="recorded_masks")
        self.count = replica_local_variable(tf.constant(0, tf.int32), name="recorded_count")

    def is_due(self, step: tf.Tensor) -> tf.Tensor:
        after = step - self.burn_in_steps
        return tf.logical_and(after > 0, tf.equal(after % self.every_n_steps, 0))

    def maybe_record(self, step: tf.Tensor, is_sample: tf.Tensor, variables: Sequence[tf.Variable]) -> None:
        """Appends the flattened `variables` if `step` is due and `is_sample` holds for some
        chain. `is_sample` is a scalar (every chain alike) or `[C]`, one flag per chain; for C
        chains, `variables` are `[C, *shape]` tensors and each chain is flattened."""
        row_shape = [-1] if self.num_chains is None else [self.num_chains, -1]
        flags = tf.reshape(tf.convert_to_tensor(is_sample), [-1])
        if self.num_chains is not None:
            flags = tf.broadcast_to(flags, [self.num_chains])

        def write(buffer, index, value):
            if is_distributed(buffer):
                # Per-replica variables have no scatter; rewrite the buffer instead.
                buffer.assign(tf.tensor_scatter_nd_update(buffer, [[index]], value[None]))
            else:
                buffer.scatter_nd_update([[index]], value[None])

        def record():
            flat = tf.concat([tf.reshape(tf.cast(v, tf.float32), row_shape) for v in variables], axis=-1)
            # The capacity covers one execution; the clamp only guards against misuse.
            index = tf.minimum(self.count, self.capacity - 1)
            write(self.values, index, flat)
            write(self.steps, index, step)
            if self.masks is not None:
                write(self.masks, index, flags)
            self.count.assign(index + 1)
            return tf.constant(True)

        tf.cond(tf.logical_and(self.is_due(step), tf.reduce_any(flags)), record, lambda: tf.constant(False))

    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Returns and clears what was recorded since the last drain: `(values [k, Nd]` or
        `[k, C, Nd], steps [k], masks)`, masks `[k, C]` bool (which chains yielded each row) or
        None for one chain."""
        count = int(self.count.numpy())
        values = self.values[:count].numpy() if count else np.zeros((0, *self.values.shape[1:]), np.float32)
        steps = self.steps[:count].numpy()
        masks = None if self.masks is None else self.masks[:count].numpy()
        self.count.assign(0)
        return values, steps, masks


class RecordingCallback(keras.callbacks.Callback):
    """Base of callbacks that record parameters inside the compiled train step.

    `BayesianModel.fit` calls `attach(model)` before the step is compiled; subclasses implement
    `consume(values, steps, masks)`, called with each execution's recordings (`masks` `[k, C]`:
    which chains yielded a sample in each row; None for one chain, or when every chain did).
    """

    #: Burn-in of a recorder waiting for its `EquilibrationCheck` (no step is due before it).
    NOT_STARTED = 2**62

    def __init__(self, burn_in_steps=0, every_n_steps: int = 1):
        super().__init__()
        from keras_thermo.equilibration import EquilibrationCheck  # noqa: PLC0415 (import cycle)

        self.equilibration_check = None
        if isinstance(burn_in_steps, EquilibrationCheck):
            self.equilibration_check = burn_in_steps
            burn_in_steps = self.NOT_STARTED
        self.burn_in_steps = check_int("burn_in_steps", burn_in_steps, low=0)
        self.every_n_steps = check_int("every_n_steps", every_n_steps, low=1)
        self.recorder: ParameterRecorder | None = None
        self._sampling_period = 1
        self._recorded_this_fit = 0

    def attach(self, model) -> ParameterRecorder:
        self._check_sampling_period(model.sampler)
        self._sampling_period = int(getattr(model.sampler, "sample_every", None) or 1)
        steps_per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        capacity = math.ceil(steps_per_execution / self.every_n_steps) + 1
        with model.distribute_strategy.scope():
            chains = int(getattr(model, "num_chains", 1))
            self.recorder = ParameterRecorder(
                model.num_params, capacity, self.burn_in_steps, self.every_n_steps,
                num_chains=chains if chains > 1 else None,
            )
        if self.equilibration_check is not None:
            self.equilibration_check.link(self)
        return self.recorder

    def burn_in_description(self) -> str:
        """`burn_in_steps=...`, or that the recording waits for its `EquilibrationCheck`."""
        if self.burn_in_steps == self.NOT_STARTED:
            return "burn_in_steps=EquilibrationCheck, which has not yet found the run in band"
        return f"burn_in_steps={self.burn_in_steps}"

    def start_recording_at(self, step: int) -> None:
        """Sets the burn-in to `step`, rounded up to a multiple of `every_n_steps` and of the
        sampler's period, so the due steps still land on samples (called by the check)."""
        period = math.lcm(self.every_n_steps, self._sampling_period)
        self.burn_in_steps = -(-int(step) // period) * period
        if self.recorder is not None:
            self.recorder.burn_in_steps.assign(self.burn_in_steps)

    def _check_sampling_period(self, sampler) -> None:
        """Refuses settings under which no due step is ever a sample (samplers with a period K).

        Due steps are `burn_in + k * every_n`; some is a multiple of K exactly when
        gcd(every_n, K) divides burn_in.
        """
        period = getattr(sampler, "sample_every", None)
        if not period or self.equilibration_check is not None:
            return
        common = math.gcd(self.every_n_steps, int(period))
        if self.burn_in_steps % common:
            raise ValueError(
                f"{type(self).__name__}(burn_in_steps={self.burn_in_steps}, every_n_steps="
                f"{self.every_n_steps}) never lands on a step that {type(sampler).__name__} "
                f"(sample_every={period}) yields as a sample; make burn_in_steps a multiple of "
                f"gcd(every_n_steps, sample_every) = {common}, e.g. every_n_steps=1."
            )

    def consume(self, values: np.ndarray, steps: np.ndarray, masks: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def _drain(self) -> None:
        if self.recorder is None:
            return
        values, steps, masks = self.recorder.drain()
        if len(steps):
            self.consume(values, steps, masks)
            self._recorded_this_fit += len(steps)

    def on_train_begin(self, logs=None):
        self._recorded_this_fit = 0

    def on_train_batch_end(self, batch, logs=None):
        self._drain()

    def on_train_end(self, logs=None):
        self._drain()
        self._warn_if_not_at_temperature()

    def _warn_if_not_at_temperature(self) -> None:
        """Warns when this fit recorded samples while the model's temperature check (see
        `BayesianModel.temperature_check`) finds the run out of band at its end."""
        report = getattr(self.model, "temperature_report", lambda: None)()
        if not self._recorded_this_fit or report is None or report["equilibrated"] is not False:
            return
        # The comparison furthest out of band: the whole net's may be in band when a variable is not.
        where, kind, figure = furthest_miss(report) or ("the whole net", "configurational", report["overall"]["configurational"])
        warnings.warn(
            f"{type(self).__name__} recorded {self._recorded_this_fit} samples in this fit from a "
            f"chain that is not at its temperature (the {kind} temperature of {where}: "
            f"{figure['mean']:.4g} +- {figure['standard_error']:.2g} for T = {report['temperature']:g} "
            "after the burn-in): its averages are not the posterior's. The likely cause and what to "
            "change: the temperature check's warning, or keras_thermo.equilibration.summary of its report.",
            UserWarning,
            stacklevel=2,
        )


class SampleCollector(RecordingCallback):
    """Keeps posterior samples of the trainable weights, flattened, with bounded memory.

    Samples are the weights after every `every_n_steps`-th step following `burn_in_steps`, on
    steps the sampler marks as samples, exactly also when `steps_per_execution > 1`. At most
    `max_samples` are kept per chain: when a chain's store is full, every other sample is
    dropped and from then on only every second incoming sample of that chain is kept (the kept
    samples stay evenly spaced over the whole run; `steps` says which step each came from).

    Several chains (`BayesianModel(num_chains=C)`): each chain keeps its own samples, those of
    the due steps at which that chain yields one. With every sampler but TACT-HMC the chains
    yield at the same steps, so they hold as many samples from the same steps: `samples` is
    `[C, S, Nd]` (chain axis first, as `keras_thermo.diagnostics` and
    `keras_thermo.predict_posterior` take it) and `steps` `[S]`. TACT-HMC's chains yield a
    sample when their own tempering variable is on its plateau, at different steps and in
    different numbers: then `samples` is each chain's most recent `S` samples, `S` the smallest
    count over the chains, and `steps` `[C, S]` their steps (only when the chains' steps
    differ); `chain_samples(k)` and `chain_steps(k)` give chain k's full set and
    `chain_counts` every chain's count.

    Args:
        burn_in_steps: Steps to skip before collecting.
        every_n_steps: Collection period (thinning) after burn-in.
        max_samples: Upper bound on stored samples per chain (memory
            `max_samples * C * Nd * 4` bytes).

    Attributes:
        samples: `np.ndarray [S, Nd]` (or `[C, S, Nd]`) float32, flattened in
            `model.trainable_variables` order.
        steps: `np.ndarray [S]` (or `[C, S]`, see above), the step (number of completed steps)
            of each sample.

    Example:
        >>> collector = SampleCollector(burn_in_steps=1000, every_n_steps=10, max_samples=500)
    """

    def __init__(self, burn_in_steps: int = 0, every_n_steps: int = 1, max_samples: int = 1000):
        super().__init__(burn_in_steps, every_n_steps)
        self.max_samples = check_int("max_samples", max_samples, low=2)
        self._chains: int | None = None  # None: one chain, rows [Nd]; else C, rows [C, Nd]
        self._values: np.ndarray | None = None  # [C or 1, max_samples, Nd]
        self._steps = np.zeros([1, self.max_samples], np.int64)
        self._size = np.zeros([1], np.int64)
        self._seen = np.zeros([1], np.int64)  # recordings received per chain, kept or not
        self._keep_every = np.ones([1], np.int64)

    def attach(self, model) -> ParameterRecorder:
        recorder = super().attach(model)
        record_shape = tuple(int(d) for d in recorder.values.shape[1:])  # [Nd] or [C, Nd]
        chains = record_shape[0] if len(record_shape) == 2 else None
        if self._values is None or self._chains != chains or self._values.shape[2] != record_shape[-1]:
            self.allocate(record_shape[-1], chains)
        return recorder

    def allocate(self, num_params: int, num_chains: int | None = None) -> None:
        """Empties the store and sizes it for rows of `num_params` of one chain (None) or of
        `num_chains` chains (done by `attach`; called directly to feed `consume` by hand)."""
        count = num_chains or 1
        self._chains = num_chains
        self._values = np.zeros([count, self.max_samples, num_params], np.float32)
        self._steps = np.zeros([count, self.max_samples], np.int64)
        self._size = np.zeros([count], np.int64)
        self._seen = np.zeros([count], np.int64)
        self._keep_every = np.ones([count], np.int64)

    def consume(self, values: np.ndarray, steps: np.ndarray, masks: np.ndarray | None = None) -> None:
        for index, (value, step) in enumerate(zip(values, steps)):
            rows = value[None] if self._chains is None else value
            for chain, row in enumerate(rows):
                if masks is None or masks[index][chain]:
                    self._keep(chain, row, step)

    def _keep(self, chain: int, value: np.ndarray, step) -> None:
        """Offers one sample of `chain` to its store (thinned by halving when full)."""
        keep = self._seen[chain] % self._keep_every[chain] == 0
        self._seen[chain] += 1
        if not keep:
            return
        if self._size[chain] == self.max_samples:
            self._halve(chain)
            if (self._seen[chain] - 1) % self._keep_every[chain]:
                return
        self._values[chain, self._size[chain]] = value
        self._steps[chain, self._size[chain]] = step
        self._size[chain] += 1

    def _halve(self, chain: int) -> None:
        size = int(self._size[chain])
        count = (size + 1) // 2
        self._values[chain, :count] = self._values[chain, 0:size:2]
        self._steps[chain, :count] = self._steps[chain, 0:size:2]
        self._size[chain] = count
        self._keep_every[chain] *= 2

    def _check_chain(self, chain: int) -> int:
        count = 1 if self._chains is None else self._chains
        if not isinstance(chain, (int, np.integer)) or not 0 <= chain < count:
            raise ValueError(f"`chain` must be an integer in [0, {count}), got {chain!r}.")
        return int(chain)

    @property
    def chain_counts(self) -> np.ndarray:
        """`[C]` (or `[1]`) number of samples each chain holds."""
        return self._size.copy()

    def chain_samples(self, chain: int) -> np.ndarray:
        """`[S_k, Nd]`: every sample chain `chain` holds (a copy), oldest first."""
        chain = self._check_chain(chain)
        if self._values is None:
            return np.zeros((0, 0), np.float32)
        return self._values[chain, : self._size[chain]].copy()

    def chain_steps(self, chain: int) -> np.ndarray:
        """`[S_k]`: the step of each of `chain_samples(chain)`."""
        chain = self._check_chain(chain)
        return self._steps[chain, : self._size[chain]].copy()

    @property
    def samples(self) -> np.ndarray:
        """`[S, Nd]`, or `[C, S, Nd]` for C chains: each chain's most recent `S` samples, `S`
        the smallest count over the chains (all of them when the chains agree; a copy)."""
        if self._values is None:
            return np.zeros((0, 0), np.float32)
        if self._chains is None:
            return self._values[0, : self._size[0]].copy()
        common = int(self._size.min())
        return np.stack([self._values[k, self._size[k] - common : self._size[k]] for k in range(self._chains)])

    @property
    def steps(self) -> np.ndarray:
        """`[S]`, the step of each sample; `[C, S]` for chains whose `samples` come from
        different steps (TACT-HMC's)."""
        if self._chains is None:
            return self._steps[0, : self._size[0]].copy()
        common = int(self._size.min())
        steps = np.stack([self._steps[k, self._size[k] - common : self._size[k]] for k in range(self._chains)])
        return steps[0].copy() if np.all(steps == steps[:1]) else steps

    def get_config(self) -> dict:
        return {
            "burn_in_steps": self.burn_in_steps,
            "every_n_steps": self.every_n_steps,
            "max_samples": self.max_samples,
        }
