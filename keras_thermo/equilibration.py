"""Is the chain at its temperature? Batch-means checks of the kinetic and configurational
temperatures, overall and per variable, and the burn-in they imply.

At equilibrium of `exp(-U/T)` two averages equal T for any sampler:

* the kinetic temperature `p_v . M^-1 . p_v / n_v` of each variable v (n_v scalars), which a
  thermostat drives to T by construction, so it says little on its own;
* the configurational temperature `theta_v . grad_v U / n_v`, by integrating `theta_i d_i U`
  against `exp(-U/T)` by parts, coordinate by coordinate. Nothing forces it to T: a run that is
  too hot, too cold or not yet equilibrated shows here first. With the step's own minibatch
  force it costs nothing and stays unbiased (the minibatch force is unbiased given theta).

`EquilibrationCheck` sums both, per variable, inside the compiled train step
(`TemperatureRecorder`), cuts the run into blocks of `block_steps` steps, picks the burn-in by
the MSER rule on the block means, and compares the post-burn-in means with T using batch-means
standard errors. It says in the epoch logs whether the run is in band, warns once with the
figures when not, writes per-variable block means to TensorBoard, and can start the recording
callbacks (`PosteriorAverage`, `SampleCollector`) once the run is in band.

References:
    S. Nose, "A unified formulation of the constant temperature molecular dynamics methods",
    J. Chem. Phys. 81 (1984): the configurational temperature by integration by parts.
    C. J. Geyer, "Practical Markov chain Monte Carlo", Statist. Sci. 7 (1992): batch means.
    K. P. White, "An effective truncation heuristic for bias reduction in simulation output",
    Simulation 69 (1997): the MSER truncation rule.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_thermo._distribute import replica_local_variable
from keras_thermo.block_statistics import batch_means, critical_value, merge_correlated_blocks, mser_truncation
from keras_thermo._validation import check_bool, check_int, check_non_negative, check_number, check_positive

# The verdict in words lives in `temperature_advice`; its names are this module's too.
from keras_thermo.temperature_advice import (  # noqa: F401
    CONFIGURATIONAL,
    KINDS,
    KINETIC,
    cause,
    furthest_miss,
    misses,
    never_at_t,
    sampler_traits,
    summary,
    unsettled,
)


# --- in-graph sums ------------------------------------------------------------------------------


class TemperatureRecorder:
    """Per-variable temperature sums written by the compiled train step, drained by the callback.

    `sums[k, v]` accumulates `w_t * temperature_k,v(t)` (k: kinetic, configurational) and
    `weight` the `w_t`, in float64, since the last drain; `steps` counts the steps.
    """

    def __init__(self, num_variables: int, whole_net: bool = False):
        self.whole_net = whole_net  # fed the step's logged whole-net temperatures (one "variable")
        self.sums = replica_local_variable(tf.zeros([2, num_variables], tf.float64), name="temperature_sums")
        self.weight = replica_local_variable(tf.constant(0.0, tf.float64), name="temperature_weight")
        self.steps = replica_local_variable(tf.constant(0, tf.int64), name="temperature_steps")

    def record(self, weight: tf.Tensor, kinetic: Sequence[tf.Tensor], configurational: Sequence[tf.Tensor]) -> None:
        """Adds one step: `weight` a scalar and one scalar per variable, or, for C chains
        stepping together, `weight [C]` and one `[C]` tensor per variable (the chains are
        pooled: their weighted values add up into the same sums)."""
        w = tf.cast(weight, tf.float64)
        values = tf.stack([
            tf.cast(tf.stack(list(kinetic), axis=-1), tf.float64),
            tf.cast(tf.stack(list(configurational), axis=-1), tf.float64),
        ])
        if w.shape.rank == 1:  # [C] chains: values [2, C, V]
            self.sums.assign_add(tf.einsum("c,kcv->kv", w, values))
            self.weight.assign_add(tf.reduce_sum(w))
        else:
            self.sums.assign_add(w * values)
            self.weight.assign_add(w)
        self.steps.assign_add(tf.constant(1, tf.int64))

    def drain(self) -> tuple[np.ndarray, float, int]:
        """Returns and clears `(sums [2, V], weight, steps)` since the last drain."""
        sums, weight, steps = self.sums.numpy(), float(self.weight.numpy()), int(self.steps.numpy())
        self.sums.assign(tf.zeros_like(self.sums))
        self.weight.assign(tf.constant(0.0, tf.float64))
        self.steps.assign(tf.constant(0, tf.int64))
        return sums, weight, steps


# --- the callback ---------------------------------------------------------------------------


class EquilibrationCheck(keras.callbacks.Callback):
    """Checks, while `fit` runs, that the chain samples at its temperature T.

    After each epoch it compares the post-burn-in means of the kinetic and configurational
    temperatures, overall and for every variable of at least `min_variable_size` scalars, with
    T. A mean is in band when `|mean - T| <= max(z * standard error, rtol * T)`, the standard
    error from batch means over blocks of `block_steps` steps and z the normal quantile for
    `confidence` split (Bonferroni) over all the comparisons. The burn-in is the MSER
    truncation of the overall block means (`burn_in_steps="auto"`) or a fixed count; blocks
    holding steps of a temperature ramp are always dropped. For
    samplers that temper theta (TACT-HMC) only the steps at T (on the plateau) count.

    Epoch logs gain `equilibrated` (1 in band, 0 out of band, NaN while fewer than
    `min_blocks` blocks follow the burn-in or while the whole net's configurational temperature
    is unresolved), `equilibration_step`, `mean_kinetic_temperature`
    and `mean_configurational_temperature`. The first verdict out of band warns once, naming
    the variables and figures. With `log_dir`, each block's means per variable go to
    TensorBoard under `temperature/<kind>/<variable>` (run `temperatures`), with the custom
    scalars layout of `keras_thermo.dashboard`.

    Give it to a `PosteriorAverage` or `SampleCollector` as `burn_in_steps=check` to start
    recording at the first block boundary where the whole net's configurational temperature is
    resolved and in band and its kinetic one not out of band (`equilibrated_at_step`), or at
    `max_burn_in_steps` if that comes first; never before a
    temperature schedule's T settles (`TemperatureSchedule.constant_from_step`, the end of a
    `TemperatureRamp`), since until then the chain does not sample the target posterior.

    Args:
        burn_in_steps: `"auto"` (MSER) or the number of steps to drop.
        block_steps: Steps per block (batch-means block; longer than the autocorrelation time).
        min_blocks: Blocks after the burn-in needed for a verdict (>= 2).
        confidence: Probability that an equilibrated run passes every comparison.
        rtol: Deviations below `rtol * T` pass even when significant (0 = strict test).
        max_band: Comparisons whose band `z * standard error` is wider than `max_band * T` are
            undetermined (`in_band` None): they could not tell T from a run that far off it. The
            verdict is False once a resolved comparison is out of band, and otherwise None while
            the whole net's configurational temperature is unresolved (the kinetic one alone
            cannot pass a run: a thermostat holds it at T). None: no gate.
        min_variable_size: Variables with fewer scalars are reported but not judged (their
            temperatures fluctuate too much to say anything).
        log_dir: Optional TensorBoard directory.
        warn: When to warn that the run is out of band: `True` or `"epoch"` at the first
            epoch whose verdict is out of band, `"end"` at the end of `fit` if its final verdict
            is, `False` never.
        temperature: The T to compare with; None (default) takes the model's temperature.
        max_burn_in_steps: Linked recording callbacks start at this step at the latest, even if
            the run is not at T by then (`recording_started_by` says which happened); None waits.
        per_variable: True (default): judge every variable too, from per-variable sums the step
            computes for it. False: the whole net only, from the temperatures the step logs
            anyway (no extra work in the step; what the default check does).

    Example:
        >>> check = EquilibrationCheck(block_steps=50, min_blocks=10)
        >>> # model.fit(x, y, epochs=20, callbacks=[check]); check.report()["equilibrated"]

    Reference:
        K. P. White, Simulation 69 (1997) (MSER); C. J. Geyer, Statist. Sci. 7 (1992) (batch
        means).
    """

    def __init__(
        self,
        burn_in_steps: int | str = "auto",
        block_steps: int = 100,
        min_blocks: int = 10,
        confidence: float = 0.99,
        rtol: float = 0.05,
        max_band: float | None = 0.25,
        min_variable_size: int = 100,
        log_dir: str | None = None,
        warn: bool | str = True,
        temperature: float | None = None,
        max_burn_in_steps: int | None = None,
        per_variable: bool = True,
    ):
        super().__init__()
        if burn_in_steps != "auto":
            if isinstance(burn_in_steps, str):
                raise ValueError(f"`burn_in_steps` must be 'auto' or an int >= 0, got {burn_in_steps!r}.")
            burn_in_steps = check_int("burn_in_steps", burn_in_steps, low=0)
        self.burn_in_steps = burn_in_steps
        self._sampler_hint = ""
        self._traits = sampler_traits(None)
        self.block_steps = check_int("block_steps", block_steps, low=1)
        self.min_blocks = check_int("min_blocks", min_blocks, low=2)
        self.confidence = check_number("confidence", confidence, low=0.0, high=1.0, high_inclusive=False)
        self.rtol = check_non_negative("rtol", rtol)
        self.max_band = None if max_band is None else check_positive("max_band", max_band)
        self.min_variable_size = check_int("min_variable_size", min_variable_size, low=1)
        self.log_dir = log_dir
        if warn not in (True, False, "epoch", "end"):
            raise ValueError(f"`warn` must be True, False, 'epoch' or 'end', got {warn!r}.")
        self.warn = "epoch" if warn is True else warn
        self.temperature = None if temperature is None else check_number("temperature", temperature, low=0.0)
        self.max_burn_in_steps = (
            None if max_burn_in_steps is None else check_int("max_burn_in_steps", max_burn_in_steps, low=0)
        )
        self.per_variable = check_bool("per_variable", per_variable)
        self.recorder: TemperatureRecorder | None = None
        self._attached_to = None
        self._linked: list = []
        self._names: list[str] = []
        self._sizes = np.zeros(0)
        self._earliest_recording_step = 0  # the end of the model's temperature ramp (attach)
        self._reset()

    def _reset(self) -> None:
        self._blocks: list[tuple[int, int, float, np.ndarray]] = []  # (first step, last step, weight, sums)
        self._open = None  # [first step, last step, weight, sums, steps]
        self._step = 0
        self._warned = False
        self.equilibrated_at_step: int | None = None
        self.recording_started_at: int | None = None
        self.recording_started_by: str | None = None  # "equilibrium" or "max_burn_in_steps"
        self._writer = None

    # wiring ------------------------------------------------------------------------------

    def attach(self, model) -> TemperatureRecorder:
        """Called by `BayesianModel.fit` before the train step is compiled. A check attached
        to the same model again (a later `fit`) keeps its recorder, so the compiled step stays."""
        variables = model.trainable_variables
        if self.recorder is None or self._attached_to is not model:
            if self.per_variable:
                self._names = [getattr(v, "path", v.name) for v in variables]
                self._sizes = np.array([int(np.prod(v.shape)) for v in variables], np.float64)
            else:
                self._names, self._sizes = [], np.zeros(0)
            with model.distribute_strategy.scope():
                self.recorder = TemperatureRecorder(max(1, len(self._names)), whole_net=not self.per_variable)
            self._attached_to = model
        self._step = int(model.sampler_step)
        schedule = getattr(model, "temperature_schedule", None)
        ramp_end = (schedule.constant_from_step() if schedule is not None else None) or 0
        # Before the end of a temperature ramp or of the sampler's warm-up the chain does not
        # yet run the papers' dynamics at T: those steps never count, nor start a recording.
        self._earliest_recording_step = max(int(ramp_end), model.sampler.adaptation_steps)
        # A sampler's own advice for a run off T (`MCCAdL.not_at_temperature_hint`), if it has one.
        hint = getattr(model.sampler, "not_at_temperature_hint", "")
        self._sampler_hint = f"{hint} " if hint else ""
        # Advice that names what the run already uses is left out of the warning.
        self._traits = sampler_traits(model.sampler)
        return self.recorder

    def link(self, callback) -> None:
        """Starts `callback` (a recording callback) when the run is first in band."""
        if callback not in self._linked:
            self._linked.append(callback)
        if self.recording_started_at is not None:
            callback.start_recording_at(self.recording_started_at)

    def on_train_begin(self, logs=None):
        if self.warn == "end":
            self._warned = False  # one verdict per fit
        if self.log_dir and self._writer is None:
            from keras_thermo import dashboard  # noqa: PLC0415 (TensorBoard imports are heavy)

            dashboard.write_layout(self.log_dir)
            self._writer = tf.summary.create_file_writer(f"{self.log_dir}/temperatures")

    def on_epoch_begin(self, epoch, logs=None):
        self._drained_in_epoch = 0

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the epoch's index of the execution's last step: read the sums back only
        # once a block's worth of steps has run (blocks close at drains), not after every step.
        if batch + 1 - getattr(self, "_drained_in_epoch", 0) >= self.block_steps:
            self._drained_in_epoch = batch + 1
            self._drain()

    def on_train_end(self, logs=None):
        self._drain()
        if self._writer is not None:
            self._writer.flush()
        start = self.recording_started_at
        if self._linked and (start is None or start > self._step):
            names = ", ".join(sorted({type(cb).__name__ for cb in self._linked}))
            waits = f"is due to start at step {start}" if start is not None else "has not started"
            warnings.warn(
                f"{names}: the recording {waits}, and the run ended at step {self._step}: no sample "
                f"was taken. It starts when the run is at T, never before step "
                f"{self._earliest_recording_step} (the end of the sampler's warm-up or of the "
                "temperature ramp); run longer, or give the sampler a shorter warmup_steps.",
                UserWarning,
                stacklevel=2,
            )
        if self.warn in ("end", "epoch") and not self._warned:
            report = self.report()
            if report["equilibrated"] is False and self.warn == "end":
                self._warned = True
                warnings.warn(self._describe_failures(report), UserWarning, stacklevel=2)
            elif never_at_t(report, self.min_blocks) or unsettled(report):
                self._warned = True
                warnings.warn(f"EquilibrationCheck: {summary(report)}", UserWarning, stacklevel=2)

    def on_epoch_end(self, epoch, logs=None):
        self._drain()
        self._drained_in_epoch = 0
        report = self.report()
        if logs is not None:
            verdict = report["equilibrated"]
            logs["equilibrated"] = math.nan if verdict is None else float(verdict)
            logs["equilibration_step"] = float(report["equilibration_step"])
            logs["mean_kinetic_temperature"] = report["overall"]["kinetic"]["mean"]
            logs["mean_configurational_temperature"] = report["overall"]["configurational"]["mean"]
        if report["equilibrated"] is False and self.warn == "epoch" and not self._warned:
            self._warned = True
            warnings.warn(self._describe_failures(report, provisional=True), UserWarning, stacklevel=2)

    # accumulation ------------------------------------------------------------------------

    def _drain(self) -> None:
        if self.recorder is None:
            return
        sums, weight, steps = self.recorder.drain()
        if steps == 0:
            return
        first = self._step + 1
        self._step += steps
        if self._open is None:
            self._open = [first, self._step, 0.0, np.zeros_like(sums), 0]
        if self.max_burn_in_steps is not None and self._step >= self.max_burn_in_steps:
            self._start_linked(self.max_burn_in_steps, "max_burn_in_steps")
        self._open[1] = self._step
        self._open[2] += weight
        self._open[3] += sums
        self._open[4] += steps
        if self._open[4] >= self.block_steps:
            first, last, weight, sums, _ = self._open
            self._blocks.append((first, last, weight, sums))
            self._open = None
            self._on_block_closed(first, last, weight, sums)

    def _on_block_closed(self, first: int, last: int, weight: float, sums: np.ndarray) -> None:
        if self._writer is not None and weight > 0:
            with self._writer.as_default(step=last):
                means = sums / weight
                for kind, row in zip(KINDS, means):
                    for name, value in zip(self._names, row):
                        tf.summary.scalar(f"temperature/{kind}/{name}", value)
                    overall = row @ self._sizes / self._sizes.sum() if self.per_variable else row[0]
                    tf.summary.scalar(f"temperature/{kind}/overall", float(overall))
                tf.summary.scalar("temperature/target", float(self._temperature()))
        if self.equilibrated_at_step is None and self._whole_net_in_band(self.report()):
            self.equilibrated_at_step = last
            self._start_linked(last, "equilibrium")

    def _start_linked(self, step: int, reason: str) -> None:
        if self.recording_started_at is not None:
            return
        step = max(step, self._earliest_recording_step)
        self.recording_started_at, self.recording_started_by = step, reason
        for callback in self._linked:
            callback.start_recording_at(step)

    @staticmethod
    def _whole_net_in_band(report: dict[str, Any]) -> bool:
        """Whether the whole net's configurational temperature is resolved and in band and its
        kinetic one not out of band (what starts linked recording: per-variable misses are
        reported and warned about, but need not hold the average back). An unresolved
        configurational temperature never passes: the thermostat samplers hold the kinetic one
        at T whatever the positions do."""
        overall = report["overall"]
        return overall["configurational"]["in_band"] is True and overall["kinetic"]["in_band"] is not False

    def _temperature(self) -> float:
        return self.temperature if self.temperature is not None else float(self.model.temperature)

    # verdict -----------------------------------------------------------------------------

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`(first steps [B], weights [B], sums [B, 2, 1 + V])`: column 0 is the whole net
        (size-weighted over variables), then each variable."""
        if not self._blocks:
            return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros((0, 2, 1 + len(self._sizes)))
        first = np.array([b[0] for b in self._blocks], np.int64)
        last = np.array([b[1] for b in self._blocks], np.int64)
        weights = np.array([b[2] for b in self._blocks])
        per_variable = np.stack([b[3] for b in self._blocks])
        if not self.per_variable:  # the recorder's one column is the whole net
            return first, last, weights, per_variable
        overall = per_variable @ self._sizes / self._sizes.sum()
        return first, last, weights, np.concatenate([overall[:, :, None], per_variable], axis=2)

    def _first_countable_block(self, first: np.ndarray) -> int:
        """The index of the first block past the warm-up and any temperature ramp. Blocks holding
        any step of a ramp (step s runs at T(s - 1)) or of the warm-up never count: their
        temperatures were recorded at another T, or under another kernel, than the one tested."""
        return int(np.searchsorted(first, self._earliest_recording_step, side="right"))

    def _burn_in_blocks(self, first: np.ndarray, weights: np.ndarray, sums: np.ndarray) -> int:
        ramp = self._first_countable_block(first)
        if self.burn_in_steps != "auto":
            return max(ramp, int(np.searchsorted(first, self.burn_in_steps + 1)))
        used = np.flatnonzero((weights > 0) & (np.arange(len(first)) >= ramp))
        if len(used) < 3:
            return ramp  # too few blocks for MSER; the warm-up's or ramp's never count
        means = sums[used, :, 0] / weights[used, None]
        drop = max(mser_truncation(means[:, kind]) for kind in (KINETIC, CONFIGURATIONAL))
        return int(used[drop])

    def report(self) -> dict[str, Any]:
        """The current figures: `equilibrated` (True, False, or None while pending or while the
        whole net's configurational temperature is unresolved), `equilibration_step`,
        `num_blocks` after the burn-in, `pending` (fewer than `min_blocks`), `temperature`, and for `overall`
        and each entry of `variables` the `mean`, `standard_error` and `in_band` of each kind."""
        temperature = self._temperature() if self.model is not None or self.temperature is not None else math.nan
        first, last, weights, sums = self._columns()
        drop = self._burn_in_blocks(first, weights, sums) if len(first) else 0
        kept_weights, kept_sums = weights[drop:], sums[drop:]
        num_blocks = int(np.count_nonzero(kept_weights > 0))
        if num_blocks >= self.min_blocks:
            kept_weights, kept_sums = merge_correlated_blocks(kept_weights, kept_sums, self.min_blocks)
        mean, error = batch_means(kept_sums, kept_weights) if num_blocks else (
            np.full(sums.shape[1:], np.nan), np.full(sums.shape[1:], np.inf))
        sizes = np.concatenate([[self._sizes.sum()], self._sizes])
        judged = sizes >= self.min_variable_size
        judged[0] = True
        z = critical_value(self.confidence, 2 * int(judged.sum()))
        band = np.maximum(z * error, self.rtol * temperature)
        in_band = np.abs(mean - temperature) <= band
        # A band wider than max_band * T cannot tell T from a run that far off it: undetermined.
        max_band = math.inf if self.max_band is None else self.max_band
        resolved = judged[None, :] & (z * error <= max_band * temperature)
        pending = num_blocks < self.min_blocks

        def entry(column: int) -> dict[str, Any]:
            return {
                kind: {
                    "mean": float(mean[k, column]),
                    "standard_error": float(error[k, column]),
                    "in_band": None if pending or not resolved[k, column] else bool(in_band[k, column]),
                }
                for k, kind in enumerate(KINDS)
            }

        # Any resolved comparison out of band fails the run; passing needs the whole net's
        # configurational temperature resolved (a thermostat holds the kinetic one at T anyway).
        verdict = None if pending else False if not np.all(in_band[resolved]) else (
            True if resolved[CONFIGURATIONAL, 0] else None)
        # Blocks past the warm-up or ramp in which no step counted: a tempering sampler off its
        # plateau for the whole block (TACT-HMC's steps count only where theta is at T).
        countable = weights[self._first_countable_block(first):]
        return {
            "equilibrated": verdict,
            "equilibration_step": int(first[drop] - 1) if drop < len(first) else (int(last[-1]) if len(last) else 0),
            "num_blocks": num_blocks,
            "pending": pending,  # fewer than `min_blocks` blocks after the burn-in
            "num_blocks_without_steps_at_t": int(np.count_nonzero(countable == 0)),
            "temperature": temperature,
            # What `cause` advises from (`sampler_traits`): it leaves out what the run already uses.
            "sampler": dict(self._traits),
            "overall": entry(0),
            "variables": [
                {"name": name, "size": int(size), **entry(i + 1)}
                for i, (name, size) in enumerate(zip(self._names, self._sizes))
            ],
        }

    def _describe_failures(self, report: dict[str, Any], provisional: bool = False) -> str:
        temperature = report["temperature"]
        so_far = ("So far the run is not sampling at its temperature (checked again at every epoch's end; the final "
                  "verdict goes to History's `equilibrated` and the check's report): " if provisional else
                  "The run is not sampling at its temperature: ")
        lines = [
            f"{kind} temperature of {where}: {figure['mean']:.4g} +- {figure['standard_error']:.2g} (T = {temperature:g})"
            for where, kind, figure in misses(report)
        ]
        return (
            so_far + "its samples do not follow the posterior "
            f"it was asked for. After step {report['equilibration_step']} ({report['num_blocks']} "
            f"blocks of {self.block_steps} steps): " + "; ".join(lines) + ". "
            + cause(report) + " " + self._sampler_hint +
            "(keras_thermo.equilibration.EquilibrationCheck; BayesianModel(temperature_check=False) "
            "turns the default check off.)"
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "burn_in_steps": self.burn_in_steps,
            "block_steps": self.block_steps,
            "min_blocks": self.min_blocks,
            "confidence": self.confidence,
            "rtol": self.rtol,
            "max_band": self.max_band,
            "min_variable_size": self.min_variable_size,
            "log_dir": self.log_dir,
            "warn": self.warn,
            "temperature": self.temperature,
            "max_burn_in_steps": self.max_burn_in_steps,
            "per_variable": self.per_variable,
        }


def default_check() -> EquilibrationCheck:
    """The check `BayesianModel(temperature_check=True)` runs in every `fit` that has none:
    the whole net's logged temperatures (no extra work in the step; an `EquilibrationCheck` of
    your own judges every variable), blocks of 100 steps, a verdict once 10 blocks follow the
    burn-in (MSER, never before the sampler's warm-up ends), and one warning at the end of a
    `fit` whose verdict is out of band."""
    return EquilibrationCheck(warn="end", per_variable=False)
