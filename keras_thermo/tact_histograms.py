"""TensorBoard histograms of TACT-HMC's tempering: the ABF mean force per bin and xi's visits.

Both are written in TensorBoard's histogram format, a `[num_bins, 3]` tensor of
`(left edge, right edge, value)` rows under the `histograms` plugin, with `tf.summary.write`
(so the TensorBoard package is not needed to write them):

- `tact_hmc/abf_mean_force`: the running mean of `lambda'(xi) U` in each bin of xi, i.e. the
  free-energy gradient that ABF cancels (the "counts" are these means and may be negative);
- `tact_hmc/xi`: how many steps xi spent in each bin since the previous write (a flat histogram
  is what a working ABF produces).

The step of each summary is the sampler's step counter.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from keras_thermo.samplers.tact_hmc import TACTHMC


def _histogram_metadata(description: str) -> summary_pb2.SummaryMetadata:
    metadata = summary_pb2.SummaryMetadata(summary_description=description)
    metadata.plugin_data.plugin_name = "histograms"
    return metadata


def _as_histogram(edges: np.ndarray, values: np.ndarray) -> tf.Tensor:
    return tf.constant(np.stack([edges[:-1], edges[1:], values], axis=1), tf.float64)


class TACTHistograms(keras.callbacks.Callback):
    """Writes the ABF mean force per xi bin and the histogram of xi to TensorBoard.

    Args:
        log_dir: TensorBoard log directory; summaries go to `log_dir/train`, next to the scalars of
            `keras.callbacks.TensorBoard(log_dir)`.
        update_freq: `"epoch"` (at the end of each epoch) or an integer n >= 1 (every n-th
            batch-end callback, i.e. every n executions of `steps_per_execution` steps).

    Example:
        >>> callback = TACTHistograms("/tmp/logs", update_freq="epoch")

    Reference:
        R. Luo et al., "Thermostat-assisted continuously-tempered Hamiltonian Monte Carlo for
        Bayesian learning", NeurIPS 2018, sec. 3.2 (ABF).
    """

    def __init__(self, log_dir: str, update_freq="epoch"):
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"`log_dir` must be a path, got {log_dir!r} ({type(log_dir).__name__}).")
        valid_int = isinstance(update_freq, int) and not isinstance(update_freq, bool) and update_freq >= 1
        if update_freq != "epoch" and not valid_int:
            raise ValueError(f"`update_freq` must be 'epoch' or an integer >= 1, got {update_freq!r}.")
        self.log_dir = os.fspath(log_dir)
        self.update_freq = update_freq
        self._writer = None
        self._last_visits = None
        self._batches = 0

    def on_train_begin(self, logs=None):
        sampler = getattr(self.model, "sampler", None)
        if not isinstance(sampler, TACTHMC):
            raise TypeError(
                "TACTHistograms needs a BayesianModel whose sampler is TACTHMC, got "
                f"{type(sampler).__name__ if sampler is not None else type(self.model).__name__}."
            )
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "train"))
        self._last_visits = _pooled(self.model.sampler_state())[1]
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self.update_freq != "epoch" and self._batches % self.update_freq == 0:
            self.write()

    def on_epoch_end(self, epoch, logs=None):
        if self.update_freq == "epoch":
            self.write()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()

    def write(self) -> None:
        """Writes both histograms for the model's current sampler state."""
        sampler = self.model.sampler
        state = self.model.sampler_state()
        edges = sampler.bin_edges()
        mean_force, visits = _pooled(state)
        step = int(state.step)
        with self._writer.as_default():
            tf.summary.write(
                "tact_hmc/abf_mean_force",
                _as_histogram(edges, mean_force),
                step=step,
                metadata=_histogram_metadata("ABF running mean of lambda'(xi) U per bin of xi"),
            )
            tf.summary.write(
                "tact_hmc/xi",
                _as_histogram(edges, (visits - self._last_visits).astype(np.float64)),
                step=step,
                metadata=_histogram_metadata("steps spent by xi in each bin since the last write"),
            )
        self._writer.flush()
        self._last_visits = visits


def _pooled(state) -> tuple[np.ndarray, np.ndarray]:
    """`(ABF mean force [bins], visits [bins])`; for several chains (`[C, bins]`) the visits are
    summed and the mean forces averaged with the chains' visits as weights."""
    mean_force = np.asarray(state.abf_mean_force.numpy(), np.float64)
    visits = np.asarray(state.abf_visits.numpy())
    if visits.ndim == 1:
        return mean_force, visits
    total = visits.sum(axis=0)
    weighted = (mean_force * visits).sum(axis=0)
    return np.divide(weighted, total, out=np.zeros_like(weighted), where=total > 0), total
