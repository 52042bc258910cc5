"""What `BayesianModel.fit` hands to Keras' `fit`: the batch that builds the model, arrays drawn
in minibatches with replacement, and the callbacks arranged (the default temperature check, the
checks first, the recorders wired into the compiled step, the guard that stops a diverged run)."""

from __future__ import annotations

import math
import warnings

import keras
import tensorflow as tf

from keras_thermo import data as kt_data
from keras_thermo import equilibration as kt_equilibration
from keras_thermo._distribute import symbolic_inputs
from keras_thermo._recording import RecordingCallback
from keras_thermo.samplers import auto_step
from keras_thermo._step_checks import COLLAPSED_RELATIVE_SPREAD


def first_batch_inputs(x, y, batch_size):
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


def draw_array_minibatches_with_replacement(model, arguments) -> None:
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
    if model.num_chains > 1 and model.chain_minibatches == "split":
        batch_size *= model.num_chains  # batch_size examples of its own for every chain
    step = model._state_variables[0]  # the sampler's step counter
    if model.distribute_strategy.num_replicas_in_sync == 1:
        # One epoch's batches, from the step counter read when Keras starts the epoch's
        # iterator: epochs continue the stream, also after BackupAndRestore, and an epoch
        # ends after its batches whatever steps_per_execution is, as with Keras' arrays.
        batches = kt_data.keyed_minibatches(arrays, batch_size, seed=model.seed, first_batch=step)
        arguments["x"] = batches.take(steps_per_epoch).apply(
            tf.data.experimental.assert_cardinality(steps_per_epoch)
        )
        arguments.pop("steps_per_epoch", None)
    else:
        # A distributed dataset keeps one iterator over the epochs: one endless stream.
        arguments["x"] = kt_data.keyed_minibatches(arrays, batch_size, seed=model.seed, first_batch=int(step.numpy()))
        arguments["steps_per_epoch"] = steps_per_epoch


def checks_first(callbacks):
    """Moves `EquilibrationCheck`s to the front, so the epoch logs they add reach TensorBoard,
    History and the progress bar (Keras passes one logs dict through the callbacks in order)."""
    if callbacks is None or isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    callbacks = list(callbacks)
    is_check = [isinstance(cb, kt_equilibration.EquilibrationCheck) for cb in callbacks]
    return [cb for cb, c in zip(callbacks, is_check) if c] + [cb for cb, c in zip(callbacks, is_check) if not c]


def with_default_check(model, callbacks):
    """`callbacks` with the default `EquilibrationCheck` in front when `temperature_check`
    is on and the user gave none (one check per model, kept across fits)."""
    given = callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) else list(callbacks or [])
    if not model.temperature_check or any(isinstance(cb, kt_equilibration.EquilibrationCheck) for cb in given):
        return callbacks
    if model._runtime.default_check is None:
        model._runtime.default_check = kt_equilibration.default_check()
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks.callbacks.insert(0, model._runtime.default_check)
        model._runtime.default_check.set_model(model)
        return callbacks
    return [model._runtime.default_check] + given


def attach_recorders(model, callbacks) -> None:
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
    temperature_recorders = [cb.attach(model) for cb in checks]
    recorders = [cb.attach(model) for cb in recording]
    same = [id(r) for r in recorders + temperature_recorders] == [
        id(r) for r in model._runtime.recorders + model._runtime.temperature_recorders
    ]
    if not same:
        # The compiled step captures the recorders it writes to: rebuild it for this set.
        model.train_function = None
    model._runtime.recorders = recorders
    model._runtime.temperature_recorders = temperature_recorders
    model._runtime.temperature_checks = checks


class DivergenceGuard(keras.callbacks.Callback):
    """Stops `fit` cleanly at the end of the execution in which a step went non-finite (keeping
    the last finite `step_size_limit` logged, CCAdL, for the error that names it), and at the end
    of an epoch whose last step found the net collapsed (`step.output_spread`)."""

    def on_train_batch_end(self, batch, logs=None):
        runtime = self.model._runtime
        limit = (logs or {}).get("step_size_limit")
        if limit is not None and math.isfinite(float(limit)) and float(limit) > 0:
            runtime.last_step_size_limit = (float(limit), int(self.model.sampler_step))
        if int(runtime.diverged_at.numpy()) >= 0 or int(runtime.uneven_batch.numpy()) >= 0:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        """Warns once when a step size the user gave is above the stability bound of the
        curvature the run measured (`samplers.auto_step.stability_bound`)."""
        model, runtime = self.model, self.model._runtime
        variable = getattr(model, "_curvature_variable", None)
        if variable is None or model.sampler.is_auto_step_size or runtime.warned_unstable_step:
            return
        curvature, step_size = float(variable.numpy()), model.sampler.step_size
        if curvature > 0 and step_size > auto_step.stability_bound(model.sampler, curvature):
            runtime.warned_unstable_step = True
            name = type(model.sampler).__name__
            warnings.warn(
                f"{name}: step_size={step_size:.4g} is above the stability bound "
                f"{auto_step.stability_bound(model.sampler, curvature):.4g} of the largest curvature the run "
                f"measured ({curvature:.4g}); the run is likely to diverge or to sample a distorted "
                f"posterior. step_size='auto' would choose about {auto_step.step_for_curvature(model.sampler, curvature):.4g}.",
                stacklevel=2,
            )

    def on_epoch_end(self, epoch, logs=None):
        spread = float((logs or {}).get("output_spread", float("nan")))
        runtime = self.model._runtime
        if spread > COLLAPSED_RELATIVE_SPREAD:
            runtime.outputs_have_differed = True
        elif spread <= COLLAPSED_RELATIVE_SPREAD and runtime.outputs_have_differed:
            runtime.collapsed_at = int(self.model.sampler_step)
            self.model.stop_training = True
