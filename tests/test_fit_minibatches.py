"""`BayesianModel.fit(x, y, batch_size=...)` on arrays draws minibatches with replacement.

The check is the CCAdL paper's first experiment (Shang et al. 2015, sec. 4.1): N = 100 draws
from N(0, 1), likelihood N(x | mu, 1/gamma), prior N(mu | 0, 1/gamma) Gam(gamma | 1, 1),
batch 10, h = 0.01, A = 1. The posterior of mu is Student-t with 2 alpha_N degrees of freedom,
mean mu_N and variance beta_N / (kappa_N (alpha_N - 1)) (sd 0.097 here). Through Keras'
reshuffled epochs (10 batches an epoch, without replacement) the covariance samplers subtract
gradient noise the epoch has already cancelled and sample mu with about a third of that variance
(sd ~0.056); drawn with replacement they sample it.

Verdict: batch means of one chain (8 segments of 1500 steps after burn-in), one Student-t
statistic each for the mean and the variance of mu (`keras_thermo.testing.compare_with_gaussian`
on mu alone), at familywise level ALPHA. The segments' variance estimates of mu spread by 21%
(mCCAdL), so at the threshold t = 4.03 the test detects a variance error of 30%; the reshuffled
run's error (6 segments of 1000 steps), -71%, is far beyond it
(`test_the_check_rejects_keras_reshuffled_epochs`).
`python tests/test_fit_minibatches.py` prints these figures.
"""

import logging
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing

N, BATCH, STEP_SIZE = 100, 10, 0.01
ALPHA = 0.01


class MeanAndPrecision(keras.layers.Layer):
    """Two scalars, mu and gamma, predicted for every example."""

    def build(self, input_shape):
        self.mu = self.add_weight(shape=(1,), initializer="zeros", name="mu")
        self.gamma = self.add_weight(shape=(1,), initializer="ones", name="gamma")

    def call(self, x):
        ones = tf.ones_like(x[:, :1])
        return tf.concat([ones * self.mu, ones * self.gamma], axis=1)


def gaussian_nll(y, prediction):
    """-log N(y | mu, 1/gamma) up to a constant."""
    mu, gamma = prediction[:, :1], prediction[:, 1:]
    return tf.reduce_mean(0.5 * gamma * tf.square(y - mu) - 0.5 * tf.math.log(gamma), axis=-1)


class NormalGammaPrior(kt.priors.Prior):
    """`-log N(mu | 0, 1/gamma) Gam(gamma | 1, 1)` up to a constant."""

    def __call__(self, variables):
        mu, gamma = variables
        return tf.reduce_sum(0.5 * gamma * tf.square(mu) - 0.5 * tf.math.log(gamma) + gamma)


def _data():
    return np.random.default_rng(0).normal(size=(N, 1)).astype("float32")


def _posterior_of_mu(x):
    mean = x.mean()
    kappa, alpha = 1.0 + N, 1.0 + N / 2
    beta = 1.0 + 0.5 * np.sum((x - mean) ** 2) + N * mean**2 / (2.0 * (1.0 + N))
    return N * mean / (N + 1.0), beta / (kappa * (alpha - 1.0))


def _model(sampler, seed):
    net = keras.Sequential([keras.Input((1,)), MeanAndPrecision()])
    # mCCAdL with the paper's minibatch C step: the figures of the module doc were measured on it.
    options = {"covariance": "minibatch"} if sampler == "mccadl" else {}
    model = kt.BayesianModel(net, kt.samplers.get(sampler, step_size=STEP_SIZE, friction=1.0, **options),
                             num_examples=N, prior=NormalGammaPrior(), seed=seed)
    model.compile(loss=gaussian_nll, steps_per_execution=100)
    return model


def _chains_of_mu(sampler, *, num_chains, num_steps, with_replacement):
    """`num_chains` consecutive segments of `num_steps` steps of one chain of mu (batch means:
    a segment is ~10 autocorrelation times of mu, so the segments' estimates are nearly
    independent, and one model is traced instead of one per chain), after a burn-in of
    `num_steps // 4`. Through `fit(x, y)` on arrays, or, with `with_replacement=False`, through
    reshuffled epochs of 10 batches drawn without replacement (what Keras' own epochs do, as one
    long stream: Keras' per-epoch overhead would dominate these sub-millisecond steps)."""
    x = _data()
    burn_in = num_steps // 4
    total = burn_in + num_chains * num_steps
    model = _model(sampler, seed=0)
    collector = kt.callbacks.SampleCollector(burn_in, 1, max_samples=total)
    if with_replacement:
        data = dict(x=x, y=x, batch_size=BATCH)
    else:
        data = dict(x=kt.data.random_minibatches(x, x, BATCH, seed=0, with_replacement=False))
    model.fit(**data, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[collector])
    samples = collector.samples[: num_chains * num_steps, :1]
    return samples.reshape(num_chains, num_steps, 1), _posterior_of_mu(x)


@pytest.mark.parametrize("sampler", ["mccadl", pytest.param("ccadl", marks=pytest.mark.slow)])
def test_fit_on_arrays_samples_the_normal_gamma_posterior(sampler):
    samples, (mean, variance) = _chains_of_mu(sampler, num_chains=8, num_steps=1500, with_replacement=True)
    check = testing.compare_with_gaussian(samples, np.array([mean]), np.array([[variance]]), alpha=ALPHA)
    assert check.passed, check.summary()


def test_the_check_rejects_keras_reshuffled_epochs():
    samples, (mean, variance) = _chains_of_mu("mccadl", num_chains=6, num_steps=1000, with_replacement=False)
    check = testing.compare_with_gaussian(samples, np.array([mean]), np.array([[variance]]), alpha=ALPHA)
    assert not check.passed
    assert check.relative_variance_error[0] < -0.4, check.summary()


def test_array_minibatches_keep_keras_epochs_and_continue_across_fits():
    x = _data()
    model = _model("sghmc", seed=3)
    history = model.fit(x, x, batch_size=BATCH, epochs=2, verbose=0)
    assert model.sampler_step == 2 * N // BATCH and len(history.history["loss"]) == 2
    # Two fits of one epoch each draw the same batches as one fit of two epochs.
    a, b = _model("sghmc", seed=5), _model("sghmc", seed=5)
    b.net.set_weights(a.net.get_weights())
    a.fit(x, x, batch_size=BATCH, epochs=2, verbose=0)
    b.fit(x, x, batch_size=BATCH, epochs=1, verbose=0)
    b.fit(x, x, batch_size=BATCH, epochs=1, verbose=0)
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(u, v)


def test_backup_and_restore_resumes_array_fits_exactly(tmp_path):
    x = _data()

    class Preempt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt

    straight = _model("sgnht", seed=4)
    start = straight.net.get_weights()
    straight.fit(x, x, batch_size=BATCH, epochs=4, verbose=0)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    interrupted = _model("sgnht", seed=4)
    interrupted.net.set_weights(start)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(x, x, batch_size=BATCH, epochs=4, verbose=0, callbacks=[backup, Preempt()])
    restarted = _model("sgnht", seed=4)
    restarted.net.set_weights(start)
    restarted.fit(x, x, batch_size=BATCH, epochs=4, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    assert restarted.sampler_step == straight.sampler_step == 4 * N // BATCH
    for u, v in zip(straight.get_weights(), restarted.get_weights()):
        np.testing.assert_array_equal(u, v)


def test_a_pipeline_for_a_thermostat_sampler_is_noted_once(caplog):
    x = _data()
    model = _model("sgnht", seed=0)
    dataset = tf.data.Dataset.from_tensor_slices((x, x)).shuffle(N).batch(BATCH)
    with caplog.at_level(logging.WARNING, logger="keras_thermo"):
        model.fit(dataset, epochs=1, verbose=0)
        model.fit(dataset, epochs=1, verbose=0)
    notes = [r.getMessage() for r in caplog.records if "independent minibatches" in r.getMessage()]
    assert len(notes) == 1 and "SGNHT" in notes[0]
    caplog.clear()
    drawn = _model("sgnht", seed=1)
    with caplog.at_level(logging.WARNING, logger="keras_thermo"):
        drawn.fit(kt.data.random_minibatches(x, x, BATCH, seed=0), steps_per_epoch=5, epochs=1, verbose=0)
    assert not [r for r in caplog.records if "independent minibatches" in r.getMessage()]


def test_random_minibatches_hold_no_epoch_of_rows():
    """Drawn with replacement without end, they say nothing about N: fit neither warns that N
    disagrees with their rows nor takes N from them (it asks for `num_examples`). Their
    cardinality was once 2^62 batches, and fit warned that it trained on 2^62 x 10 examples."""
    x = _data()
    minibatches = kt.data.random_minibatches(x, x, BATCH, seed=0)
    assert int(minibatches.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*weights the likelihood as if.*")
        _model("sgnht", seed=1).fit(minibatches, steps_per_epoch=5, epochs=1, verbose=0)
    unsized = kt.BayesianModel(keras.Sequential([keras.Input((1,)), MeanAndPrecision()]), kt.samplers.SGNHT(STEP_SIZE),
                               num_examples=None, prior=NormalGammaPrior(), seed=0)
    unsized.compile(loss=gaussian_nll)
    with pytest.raises(ValueError, match="num_examples"):
        unsized.fit(minibatches, steps_per_epoch=5, epochs=1, verbose=0)


if __name__ == "__main__":
    for replacement in (True, False):
        chains, (exact_mean, exact_variance) = _chains_of_mu(
            "mccadl", num_chains=8 if replacement else 6, num_steps=1500 if replacement else 1000,
            with_replacement=replacement)
        result = testing.compare_with_gaussian(chains, np.array([exact_mean]), np.array([[exact_variance]]), alpha=ALPHA)
        spread = (chains.var(axis=1, ddof=1) / exact_variance).std(ddof=1)
        print(f"with_replacement={replacement}: passed={result.passed}; {result.summary()}; "
              f"per-chain variance relative sd {spread:.3f}")


def test_with_replacement_must_be_a_bool():
    model = _model("sghmc", seed=0)
    with pytest.raises(TypeError, match="`with_replacement` must be True or False, got 'yes'"):
        model.fit(_data(), _data(), batch_size=BATCH, epochs=1, verbose=0, with_replacement="yes")
