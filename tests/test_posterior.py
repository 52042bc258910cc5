"""PosteriorAverage, predict_posterior and evaluate_posterior against numpy forward passes."""

import gc
import weakref

import numpy as np
import pytest
import keras
import tensorflow as tf
from scipy.special import log_softmax, softmax

import keras_thermo as kt
from keras_thermo import metrics, posterior
from keras_thermo.callbacks import RecordingCallback, SampleCollector
from keras_thermo.posterior import (
    PosteriorAverage,
    PosteriorPrediction,
    evaluate_posterior,
    predict_posterior,
    predict_samples,
)

NUM_FEATURES, NUM_CLASSES, N = 2, 3, 48


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, NUM_FEATURES)).astype("float32")
    y = (np.arange(n) % NUM_CLASSES).astype("int64")
    return x, y


def _net(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(NUM_CLASSES)])


def _logits(vector, x):
    """Numpy forward pass of `_net` at a flattened [kernel (2x3), bias (3)] vector."""
    vector = np.asarray(vector, np.float64)
    kernel = vector[: NUM_FEATURES * NUM_CLASSES].reshape(NUM_FEATURES, NUM_CLASSES)
    bias = vector[NUM_FEATURES * NUM_CLASSES :]
    return np.asarray(x, np.float64) @ kernel + bias


def _reference(vectors, x, y, weights=None):
    """Averaged probabilities, NLL of the average, and weighted mean of per-sample log losses."""
    weights = np.ones(len(vectors)) if weights is None else np.asarray(weights, np.float64)
    probs = np.stack([softmax(_logits(v, x), axis=1) for v in vectors])
    mean = np.tensordot(weights, probs, axes=1) / weights.sum()
    losses = [-np.mean(log_softmax(_logits(v, x), axis=1)[np.arange(len(y)), y]) for v in vectors]
    return mean, -np.mean(np.log(mean[np.arange(len(y)), y])), np.dot(weights, losses) / weights.sum()


def _entropy(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _uncertainty_reference(vectors, x, weights=None):
    """(predictive entropy, expected entropy, mutual information) per example, by numpy."""
    weights = np.ones(len(vectors)) if weights is None else np.asarray(weights, np.float64)
    probs = np.stack([softmax(_logits(v, x), axis=1) for v in vectors])
    mean = np.tensordot(weights, probs, axes=1) / weights.sum()
    expected = weights @ _entropy(probs) / weights.sum()
    return _entropy(mean), expected, _entropy(mean) - expected


# Forward passes run in float32: probabilities carry relative errors ~1e-7, entropies
# absolute errors ~1e-7 log K; 2e-6 leaves a margin and is far below the hand values' size.
FLOAT32_ENTROPY_ATOL = 2e-6


def _model(sampler=None, seed=3):
    model = kt.BayesianModel(
        _net(), sampler or kt.samplers.SGNHT(step_size=2e-2, friction=1.0), num_examples=N,
        prior=kt.priors.Gaussian(1.0), seed=seed,
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _ordered(x, y, batch_size=8):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def _weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


def test_two_hand_set_samples_give_the_hand_computed_average():
    x, y = _data(6)
    model = _model()
    model.build((None, NUM_FEATURES))
    before = _weights(model)
    average = PosteriorAverage((x, y), batch_size=4)  # batches of 4 + 2: exercises the seam
    average.attach(model)
    first = np.linspace(-1.0, 1.0, 9).astype("float32")
    second = np.array([0.5, 0.0, -0.5, 1.0, 2.0, -1.0, 0.1, 0.2, 0.3], "float32")
    average.consume(np.stack([first, second]), np.array([10, 20]))

    # By hand: p_s = softmax(x W_s + b_s), average (p_1 + p_2) / 2.
    p1 = softmax(x.astype(np.float64) @ first[:6].reshape(2, 3) + first[6:], axis=1)
    p2 = softmax(x.astype(np.float64) @ second[:6].reshape(2, 3) + second[6:], axis=1)
    mean = (p1 + p2) / 2
    np.testing.assert_allclose(average.predictions, mean, rtol=1e-5, atol=1e-7)
    result = average.result()
    rows = np.arange(6)
    assert result["num_samples"] == 2
    assert result["nll"] == pytest.approx(-np.mean(np.log(mean[rows, y])), rel=1e-5)
    expected_loss = -(np.mean(np.log(p1[rows, y])) + np.mean(np.log(p2[rows, y]))) / 2
    assert result["expected_log_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert result["accuracy"] == pytest.approx(np.mean(mean.argmax(1) == y))
    assert result["brier"] == pytest.approx(np.mean(np.sum((mean - np.eye(3)[y]) ** 2, axis=1)), rel=1e-5)
    assert result["ece"] == pytest.approx(metrics.expected_calibration_error(mean, y), rel=1e-6)
    # Per example: H[(p_1 + p_2) / 2], (H[p_1] + H[p_2]) / 2 and their difference.
    expected_entropy = (_entropy(p1) + _entropy(p2)) / 2
    np.testing.assert_allclose(average.predictive_entropy, _entropy(mean), rtol=0, atol=FLOAT32_ENTROPY_ATOL)
    np.testing.assert_allclose(average.expected_entropy, expected_entropy, rtol=0, atol=FLOAT32_ENTROPY_ATOL)
    np.testing.assert_allclose(
        average.mutual_information, _entropy(mean) - expected_entropy, rtol=0, atol=FLOAT32_ENTROPY_ATOL
    )
    assert average.mutual_information.min() > 1e-3  # the two samples disagree on every example
    # Predictions at other weights leave the model's own weights bit-for-bit unchanged.
    for old, new in zip(before, _weights(model)):
        np.testing.assert_array_equal(old, new)


def test_fit_averages_exactly_the_collected_samples_and_logs_into_history():
    x, y = _data()
    x_test, y_test = _data(20, seed=5)
    model = _model()
    average = PosteriorAverage(_ordered(x_test, y_test, 7), burn_in_steps=8, every_n_steps=3)
    collector = SampleCollector(burn_in_steps=8, every_n_steps=3)
    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                        callbacks=[average, collector])
    # 18 steps: samples after steps 11, 14, 17 (none during epoch 1, which ends at step 6).
    np.testing.assert_array_equal(collector.steps, [11, 14, 17])
    mean, nll, expected_loss = _reference(collector.samples, x_test, y_test)
    np.testing.assert_allclose(average.predictions, mean, rtol=1e-5, atol=1e-7)
    result = average.result()
    assert result["nll"] == pytest.approx(nll, rel=1e-5)
    assert result["expected_log_loss"] == pytest.approx(expected_loss, rel=1e-5)
    # Jensen: the NLL of the average never exceeds the average NLL.
    assert result["nll"] <= result["expected_log_loss"] + 1e-12
    predictive, expected, mutual = _uncertainty_reference(collector.samples, x_test)
    np.testing.assert_allclose(average.predictive_entropy, predictive, rtol=0, atol=FLOAT32_ENTROPY_ATOL)
    np.testing.assert_allclose(average.expected_entropy, expected, rtol=0, atol=FLOAT32_ENTROPY_ATOL)
    np.testing.assert_allclose(average.mutual_information, mutual, rtol=0, atol=FLOAT32_ENTROPY_ATOL)
    assert history.history["num_samples"] == [0, 1, 3]
    assert np.isnan(history.history["posterior_accuracy"][0])
    for name in ("posterior_accuracy", "posterior_nll", "expected_log_loss", "ece", "brier"):
        assert len(history.history[name]) == 3
    key = {"posterior_accuracy": "accuracy", "posterior_nll": "nll"}
    for name in ("posterior_accuracy", "posterior_nll", "expected_log_loss", "ece", "brier"):
        assert history.history[name][-1] == pytest.approx(result[key.get(name, name)])


def test_steps_per_execution_does_not_change_the_average():
    x, y = _data()
    x_test, y_test = _data(20, seed=5)
    results = {}
    for steps_per_execution in (1, 4):
        model = kt.BayesianModel(
            _net(), kt.samplers.SGNHT(step_size=2e-2), num_examples=N,
            prior=kt.priors.Gaussian(1.0), seed=3,
        )
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
        average = PosteriorAverage((x_test, y_test), burn_in_steps=2, every_n_steps=3)
        model.fit(_ordered(x, y), epochs=2, verbose=0, callbacks=[average])
        results[steps_per_execution] = (average.predictions, average.result())
    # 12 steps: samples after steps 5, 8, 11; with 4 steps per execution 2 fall in one execution.
    assert results[1][1]["num_samples"] == results[4][1]["num_samples"] == 3
    np.testing.assert_allclose(results[4][0], results[1][0], rtol=1e-6, atol=1e-9)
    assert results[4][1]["expected_log_loss"] == pytest.approx(results[1][1]["expected_log_loss"], rel=1e-6)


class _EvenStepsSGLD(kt.samplers.SGLD):
    """SGLD that yields samples only after even-numbered steps, like TACT-HMC's plateau flag."""

    def is_sample(self, state):
        return tf.equal(state.step % 2, 0)


def test_sample_flag_and_step_size_weights():
    x, y = _data()
    x_test, y_test = _data(20, seed=5)
    schedule = kt.schedules.PolynomialDecay(5e-2, 1.0, 0.55)
    sampler = _EvenStepsSGLD(step_size=schedule)
    model = _model(sampler)
    average = PosteriorAverage((x_test, y_test), burn_in_steps=1, every_n_steps=1, weighting="step_size")
    collector = SampleCollector(burn_in_steps=1, every_n_steps=1)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[average, collector])
    np.testing.assert_array_equal(collector.steps, [2, 4, 6, 8, 10, 12])
    # The weight of the sample after step s is the step size of the step that produced it, s - 1.
    weights = [float(schedule(s - 1)) for s in collector.steps]
    assert len(set(np.round(weights, 8))) == 6  # the decay makes them distinct
    mean, nll, expected_loss = _reference(collector.samples, x_test, y_test, weights)
    np.testing.assert_allclose(average.predictions, mean, rtol=1e-5, atol=1e-7)
    assert average.result()["expected_log_loss"] == pytest.approx(expected_loss, rel=1e-5)
    uniform, _, _ = _reference(collector.samples, x_test, y_test)
    assert np.max(np.abs(uniform - mean)) > 1e-4  # the weighting is visible


def test_memory_is_one_running_sum_whatever_the_number_of_samples():
    x, y = _data(30)
    model = _model()
    model.build((None, NUM_FEATURES))

    def array_bytes(obj, depth=0):
        if isinstance(obj, np.ndarray):
            return obj.nbytes
        if depth > 3 or not hasattr(obj, "__dict__"):
            return 0
        total = 0
        for value in vars(obj).values():
            if isinstance(value, (list, tuple)):
                total += sum(array_bytes(item, depth + 1) for item in value)
            elif not isinstance(value, (keras.Model, tf.Variable)):
                total += array_bytes(value, depth + 1)
        return total

    sizes = []
    rng = np.random.default_rng(0)
    for count in (2, 40):
        average = PosteriorAverage((x, y))
        average.attach(model)
        average.consume(rng.normal(size=(count, 9)).astype("float32"), np.arange(1, count + 1))
        assert average.num_samples == count
        sizes.append(array_bytes(average))
    assert sizes[0] == sizes[1]
    # The running sum itself is one [n, K] float64 array.
    assert average._averager._weighted_probs.shape == (30, NUM_CLASSES)


def test_predict_posterior_from_every_kind_of_store(tmp_path):
    x, _ = _data(10)
    net = _net()
    before = _weights(net)
    samples = np.random.default_rng(2).normal(size=(5, 9)).astype("float32")
    expected, _, _ = _reference(samples, x, np.zeros(10, "int64"))
    path = tmp_path / "samples.npy"
    np.save(path, samples)
    for store in (samples, str(path), path, (row for row in samples), list(samples)):
        got = predict_posterior(net, store, x, batch_size=3, verbose=0)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    got = predict_posterior(net, samples, tf.data.Dataset.from_tensor_slices(x).batch(4), verbose=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    weights = np.array([1.0, 0.0, 0.0, 3.0, 0.0])
    weighted, _, _ = _reference(samples, x, np.zeros(10, "int64"), weights)
    np.testing.assert_allclose(predict_posterior(net, samples, x, weights=weights, verbose=0), weighted, rtol=1e-5)
    for old, new in zip(before, _weights(net)):
        np.testing.assert_array_equal(old, new)


def test_predict_posterior_returns_the_uncertainty_split_and_pools_chains(tmp_path):
    x, _ = _data(10)
    net = _net()
    samples = np.random.default_rng(3).normal(size=(6, 9)).astype("float32")
    weights = np.array([1.0, 2.0, 0.5, 0.0, 1.0, 3.0])
    result = predict_posterior(net, samples, x, weights=weights, return_uncertainty=True, verbose=0)
    assert isinstance(result, PosteriorPrediction)
    mean, _, _ = _reference(samples, x, np.zeros(10, "int64"), weights)
    np.testing.assert_allclose(result.probs, mean, rtol=1e-5, atol=1e-7)
    for got, expected in zip(result[1:], _uncertainty_reference(samples, x, weights)):
        assert got.shape == (10,)
        np.testing.assert_allclose(got, expected, rtol=0, atol=FLOAT32_ENTROPY_ATOL)

    # Chains [C, S, Nd] are pooled: the same as their [C * S, Nd] rows, weights [C, S] or flat.
    chains = samples.reshape(2, 3, 9)
    path = tmp_path / "chains.npy"
    np.save(path, chains)
    for store in (chains, path, tf.constant(chains)):
        for chain_weights in (weights.reshape(2, 3), weights):
            pooled = predict_posterior(net, store, x, weights=chain_weights, return_uncertainty=True, verbose=0)
            for got, expected in zip(pooled, result):
                np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)

    # A single sample, or several identical ones: no disagreement, no mutual information.
    for agreeing in (samples[:1], np.repeat(samples[:1], 4, axis=0)):
        single = predict_posterior(net, agreeing, x, return_uncertainty=True, verbose=0)
        np.testing.assert_allclose(single.mutual_information, 0.0, atol=1e-12)
        np.testing.assert_allclose(single.expected_entropy, single.predictive_entropy, atol=1e-12)


def test_predict_samples_keeps_each_samples_probabilities_and_the_chain_axis():
    x, _ = _data(7)
    net = _net()
    samples = np.random.default_rng(4).normal(size=(2, 3, 9)).astype("float32")
    probs = predict_samples(net, samples, x, batch_size=4, verbose=0)
    assert probs.shape == (2, 3, 7, NUM_CLASSES)
    for c in range(2):
        for s in range(3):
            np.testing.assert_allclose(probs[c, s], softmax(_logits(samples[c, s], x), axis=1), rtol=1e-5, atol=1e-7)
    flat = predict_samples(net, samples.reshape(6, 9), x, verbose=0)
    np.testing.assert_array_equal(flat, probs.reshape(6, 7, NUM_CLASSES))


class _ChainRecorder:
    """Stands in for a ParameterRecorder of C chains: rows of [C, Nd]."""

    def __init__(self, num_chains, num_params):
        self.values = tf.zeros([4, num_chains, num_params])


def test_sample_collector_keeps_chains_first_and_halves_them_together(monkeypatch):
    num_chains, num_params = 3, 9
    monkeypatch.setattr(RecordingCallback, "attach", lambda self, model: _ChainRecorder(num_chains, num_params))
    collector = SampleCollector(max_samples=8)
    collector.attach(model=None)
    rng = np.random.default_rng(5)
    records = rng.normal(size=(10, num_chains, num_params)).astype("float32")
    collector.consume(records, np.arange(1, 11))
    # Ten recordings into eight slots: halved once, keeping recordings 0, 2, 4, 6, 8.
    np.testing.assert_array_equal(collector.steps, [1, 3, 5, 7, 9])
    assert collector.samples.shape == (num_chains, 5, num_params)
    np.testing.assert_array_equal(collector.samples, np.swapaxes(records[::2], 0, 1))
    # The collector goes straight to predict_posterior (chains pooled) and to summary.
    x, _ = _data(4)
    np.testing.assert_array_equal(
        predict_posterior(_net(), collector, x, verbose=0),
        predict_posterior(_net(), np.swapaxes(records[::2], 0, 1).reshape(-1, num_params), x, verbose=0),
    )
    report = kt.diagnostics.summary(collector)["parameters"]
    assert (report["num_chains"], report["num_draws"], report["num_scalars"]) == (3, 5, 9)


def test_evaluate_posterior_matches_the_callback_on_the_same_samples():
    x, y = _data()
    x_test, y_test = _data(20, seed=5)
    model = _model()
    average = PosteriorAverage((x_test, y_test), burn_in_steps=3, every_n_steps=2)
    collector = SampleCollector(burn_in_steps=3, every_n_steps=2)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[average, collector])
    # Stored samples evaluated afterwards on the net alone give the callback's numbers.
    offline = evaluate_posterior(model.net, collector, _ordered(x_test, y_test, 6), verbose=0)
    online = average.result()
    assert offline["num_samples"] == online["num_samples"] == 4
    for name in ("accuracy", "nll", "expected_log_loss", "ece", "brier"):
        assert offline[name] == pytest.approx(online[name], rel=1e-6, abs=1e-9)


def test_repeated_predictions_reuse_one_compiled_forward_pass(caplog):
    x, y = _data(12)
    net = _net()
    vectors = np.zeros((2, 9), "float32")
    with caplog.at_level("WARNING", logger="tensorflow"):
        for _ in range(6):
            predict_posterior(net, vectors, x, verbose=0)
            predict_samples(net, vectors, x, batch_size=5, verbose=0)  # batches of 5, 5 and 2
            evaluate_posterior(net, vectors, (x, y), verbose=0)
    assert not [record.getMessage() for record in caplog.records if "retracing" in record.getMessage()]
    # Traced for [12, 2] and once more for other batch sizes, which that trace generalises.
    assert posterior._BATCH_FUNCTIONS[net][1].experimental_get_tracing_count() == 2
    # The cache does not keep a model alive.
    reference = weakref.ref(net)
    del net
    gc.collect()
    assert reference() is None


def test_bad_inputs_name_the_argument():
    x, y = _data(12)
    with pytest.raises(ValueError, match="weighting"):
        PosteriorAverage((x, y), weighting="linear")
    with pytest.raises(ValueError, match="labels"):
        PosteriorAverage(x)
    with pytest.raises(ValueError, match="infinite"):
        PosteriorAverage(_ordered(x, y).repeat())
    net = _net()
    with pytest.raises(ValueError, match="length 9"):
        predict_posterior(net, np.zeros((2, 8), "float32"), x, verbose=0)
    with pytest.raises(ValueError, match="empty"):
        predict_posterior(net, np.zeros((0, 9), "float32"), x, verbose=0)
    with pytest.raises(TypeError, match="samples"):
        predict_posterior(net, 3.0, x, verbose=0)
    with pytest.raises(ValueError, match=r"\[num_chains, num_samples, num_params\], got shape \(1, 2, 3, 9\)"):
        predict_posterior(net, np.zeros((1, 2, 3, 9), "float32"), x, verbose=0)
    with pytest.raises(ValueError, match=r"`weights` .* one weight per sample \(6\), or shape \(2, 3\) .* got shape \(3, 2\)"):
        predict_posterior(net, np.zeros((2, 3, 9), "float32"), x, weights=np.ones((3, 2)), verbose=0)
    with pytest.raises(ValueError, match="`weights` must have a positive sum"):
        predict_posterior(net, np.zeros((2, 9), "float32"), x, weights=[0.0, 0.0], verbose=0)
    with pytest.raises(TypeError, match="`return_uncertainty` must be True or False, got 'yes'"):
        predict_posterior(net, np.zeros((2, 9), "float32"), x, return_uncertainty="yes", verbose=0)
    with pytest.raises(ValueError, match="No posterior sample"):
        _ = PosteriorAverage((x, y)).predictions
    # Shuffled evaluation data would mix up examples between samples: refused.
    model = _model()
    model.build((None, NUM_FEATURES))
    shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(12, seed=None).batch(4)
    average = PosteriorAverage(shuffled)
    average.attach(model)
    vectors = np.zeros((6, 9), "float32")
    with pytest.raises(ValueError, match="same order"):
        average.consume(vectors, np.arange(1, 7))
