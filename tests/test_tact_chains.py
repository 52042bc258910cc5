"""Several TACT-HMC chains (`BayesianModel(num_chains=C)`): every chain keeps its own samples, the
weights of its own plateau steps, and `PosteriorAverage` pools the chains that yield one.

Each chain's tempering variable reaches its plateau at its own steps, so recording only steps at
which every chain is on its plateau at once would keep about `0.2^C` of the due steps."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.callbacks import RecordingCallback, SampleCollector
from keras_thermo.samplers.tact_hmc import TACTHMC

C = 3
N = 64
# Short enough for the run with 8 steps per execution to retrace the one-step run bit for bit:
# TACT-HMC amplifies a rounding difference fast while its ABF table learns, and at 1500 steps the
# two runs' plateau steps had parted. In 400 steps a chain's xi may never come back to its
# plateau (one chain of three on one seed in six, on either of two noise streams), so the test
# asks for many more plateau steps than joint ones of the busiest chain, not of every chain.
STEPS = 400


def _tact():
    # The chains cross their plateaus at different times (STEPS above).
    return TACTHMC(step_size=2e-3, xi_step_size=2e-3, noise=0.1, xi_noise=0.1, sample_every=1, num_bins=20)


def _model(steps_per_execution=1):
    keras.utils.set_random_seed(1)
    model = kt.BayesianModel(
        testing.linear_regression_net(2), _tact(), num_examples=N, prior=kt.priors.Gaussian(1.0), seed=5, num_chains=C
    )
    model.compile(loss="mse", steps_per_execution=steps_per_execution)
    return model


def _fit(model, x, y, callbacks):
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16 * C)  # 16 examples per chain
    model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=callbacks)


class _EveryStep(keras.callbacks.Callback):
    """Every chain's weights `[C, Nd]` and xi `[C]` after every step."""

    def __init__(self):
        super().__init__()
        self.weights, self.xi = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.stack([np.concatenate([w.ravel() for w in self.model.chain_weights(k)]) for k in range(C)]))
        self.xi.append(self.model.sampler_state().xi.numpy())


def test_each_tact_chain_keeps_the_weights_of_its_own_plateau_steps():
    x, y = testing.linear_regression_data(N, 2, seed=0)
    reference = _model()
    every = _EveryStep()
    _fit(reference, x, y, [every])
    weights, xi = np.stack(every.weights), np.stack(every.xi)  # [STEPS, C, Nd], [STEPS, C]
    burn_in = 50
    steps = np.arange(1, STEPS + 1)
    on_plateau = (np.abs(xi) <= reference.sampler.xi0) & (steps[:, None] > burn_in)

    model = _model(steps_per_execution=8)
    collector = SampleCollector(burn_in_steps=burn_in, max_samples=STEPS)
    labels = (y[:, 0] > 0).astype("int32")
    average = kt.callbacks.PosteriorAverage((x, labels), burn_in_steps=burn_in, outputs="logits")
    _fit(model, x, y, [collector, average])

    counts = on_plateau.sum(axis=0)
    all_at_once = int(np.all(on_plateau, axis=1).sum())  # what recording only joint plateau steps kept
    np.testing.assert_array_equal(collector.chain_counts, counts)
    for k in range(C):
        np.testing.assert_array_equal(collector.chain_steps(k), steps[on_plateau[:, k]])
        np.testing.assert_array_equal(collector.chain_samples(k), weights[on_plateau[:, k], k])
    # Each chain keeps its own plateau steps: the busiest many more than the steps on which every
    # chain is on its plateau at once (all that a row needing every chain would keep).
    assert counts.max() > 5 * max(all_at_once, 1), (counts, all_at_once)
    # `samples`: each chain's most recent min-count samples (none if a chain has none), with their steps [C, S].
    common = counts.min()
    assert collector.samples.shape == (C, common, weights.shape[-1])
    # `steps` is [S] where every chain's samples share their steps (as they vacuously do when S = 0).
    chain_steps = collector.steps if collector.steps.ndim == 2 else np.broadcast_to(collector.steps, (C, common))
    for k in range(C):
        np.testing.assert_array_equal(collector.samples[k], weights[on_plateau[:, k], k][counts[k] - common:])
        np.testing.assert_array_equal(chain_steps[k], steps[on_plateau[:, k]][counts[k] - common:])
    # The average pools every chain's own samples.
    assert average.num_samples == counts.sum()
    assert [r["num_samples"] for r in average.chain_results()] == list(counts)
    pooled = np.concatenate([weights[on_plateau[:, k], k] for k in range(C)])
    np.testing.assert_allclose(average.predictions, kt.predict_posterior(model, pooled, x, verbose=0), rtol=1e-5)


class _Recorder:
    """Stands in for a ParameterRecorder of C chains: rows of [C, Nd]."""

    def __init__(self, num_chains, num_params):
        self.values = np.zeros([4, num_chains, num_params], np.float32)


@pytest.mark.parametrize("max_samples", [4, 7, 1000])
def test_collector_thins_each_chain_as_a_one_chain_collector_of_its_own_samples(monkeypatch, max_samples):
    num_params, count = 2, 50
    rng = np.random.default_rng(0)
    values = rng.normal(size=(count, C, num_params)).astype("float32")
    masks = rng.random(size=(count, C)) < [0.2, 0.5, 1.0]
    steps = np.arange(1, count + 1) * 3
    monkeypatch.setattr(RecordingCallback, "attach", lambda self, model: _Recorder(C, num_params))
    chains = SampleCollector(max_samples=max_samples)
    chains.attach(model=None)
    chains.consume(values[:20], steps[:20], masks[:20])  # two executions
    chains.consume(values[20:], steps[20:], masks[20:])
    for k in range(C):
        monkeypatch.setattr(RecordingCallback, "attach", lambda self, model: _OneChainRecorder(num_params))
        one = SampleCollector(max_samples=max_samples)
        one.attach(model=None)
        one.consume(values[masks[:, k], k], steps[masks[:, k]])
        np.testing.assert_array_equal(chains.chain_samples(k), one.samples)
        np.testing.assert_array_equal(chains.chain_steps(k), one.steps)
        assert len(one.steps) <= max_samples
    with pytest.raises(ValueError, match="chain"):
        chains.chain_samples(C)


class _OneChainRecorder:
    def __init__(self, num_params):
        self.values = np.zeros([4, num_params], np.float32)
