"""Regression likelihoods (`kt.losses`) and predictive mixtures (`kt.regression`): exact values
against scipy and numerical integration, shapes, the loss read from the compiled model, target
scaling and argument errors."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import integrate, optimize, special, stats

import keras_thermo as kt
from keras_thermo import regression_metrics
from keras_thermo.regression import RegressionPrediction, TargetScaler


def _random_mixture(seed, num_samples=5, num_examples=3, num_targets=2, weighted=True):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(num_samples, num_examples, num_targets))
    stds = rng.uniform(0.1, 1.5, size=means.shape)
    weights = rng.uniform(0.2, 1.0, size=num_samples) if weighted else np.ones(num_samples)
    return means, stds, weights / weights.sum()


def _mixture_cdf(z, means, stds, weights):
    return float(np.sum(weights * stats.norm.cdf(z, means, stds)))


def _mixture_pdf(z, means, stds, weights):
    return float(np.sum(weights * stats.norm.pdf(z, means, stds)))


# ---------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("seed", [0, 1])
def test_mixture_quantiles_are_exact(seed):
    means, stds, weights = _random_mixture(seed)
    prediction = RegressionPrediction.from_components(means, stds, weights)
    levels = [1e-3, 0.05, 0.3, 0.5, 0.9, 0.95, 0.999]
    quantiles = prediction.quantile(levels)
    assert quantiles.shape == (len(levels), 3, 2)
    for k, q in enumerate(levels):
        for i, d in np.ndindex(3, 2):
            m, s = means[:, i, d], stds[:, i, d]
            root = optimize.brentq(lambda z: _mixture_cdf(z, m, s, weights) - q, -50, 50, xtol=1e-14)
            np.testing.assert_allclose(quantiles[k, i, d], root, atol=1e-9)
            # The probability below it, integrated numerically from the density.
            mass = integrate.quad(_mixture_pdf, -np.inf, quantiles[k, i, d], args=(m, s, weights), epsabs=1e-12)[0]
            np.testing.assert_allclose(mass, q, atol=1e-8)
    lower, upper = prediction.interval(0.9)
    np.testing.assert_allclose(lower, quantiles[1], atol=1e-12)
    np.testing.assert_allclose(upper, quantiles[5], atol=1e-12)
    np.testing.assert_allclose(prediction.cdf(upper) - prediction.cdf(lower), 0.9, atol=1e-10)


def test_quantile_of_a_bimodal_mixture_far_apart():
    """Two separated modes: the median falls in the gap, where Newton's steps overshoot."""
    prediction = RegressionPrediction.from_components([[[-20.0]], [[20.0]]], [[[0.5]], [[0.5]]])
    np.testing.assert_allclose(prediction.quantile(0.5), 0.0, atol=1e-9)
    np.testing.assert_allclose(prediction.quantile(0.25), -20.0, atol=1e-9)  # the first mode's median
    np.testing.assert_allclose(prediction.quantile(0.75), 20.0, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_crps_is_the_integral_of_the_squared_cdf_difference(seed):
    means, stds, weights = _random_mixture(seed, num_examples=2)
    y = np.random.default_rng(seed + 10).normal(scale=2.0, size=(2, 2))
    crps = RegressionPrediction.from_components(means, stds, weights).crps(y)
    for i, d in np.ndindex(2, 2):
        m, s, target = means[:, i, d], stds[:, i, d], y[i, d]
        below = integrate.quad(lambda z: _mixture_cdf(z, m, s, weights) ** 2, -np.inf, target, epsabs=1e-12)[0]
        above = integrate.quad(lambda z: (1 - _mixture_cdf(z, m, s, weights)) ** 2, target, np.inf, epsabs=1e-12)[0]
        np.testing.assert_allclose(crps[i, d], below + above, rtol=1e-8)


def test_crps_pair_term_in_blocks_equals_one_block(monkeypatch):
    means, stds, weights = _random_mixture(3, num_samples=7)
    y = np.zeros((3, 2))
    whole = RegressionPrediction.from_components(means, stds, weights).crps(y)
    monkeypatch.setattr(regression_metrics, "_PAIR_BLOCK_ELEMENTS", 1)  # one sample a block
    np.testing.assert_allclose(RegressionPrediction.from_components(means, stds, weights).crps(y), whole, rtol=1e-12)


def test_log_density_is_the_mixture_density_of_all_targets():
    means, stds, weights = _random_mixture(4)
    y = np.random.default_rng(0).normal(size=(3, 2))
    direct = np.log(np.sum(weights[:, None] * np.prod(stats.norm.pdf(y, means, stds), axis=-1), axis=0))
    prediction = RegressionPrediction.from_components(means, stds, weights)
    np.testing.assert_allclose(prediction.log_density(y), direct, rtol=1e-12)
    # Far in the tail, where every density underflows, logsumexp stays finite.
    far = prediction.log_density(y + 1e3)
    log_terms = np.sum(stats.norm.logpdf(y + 1e3, means, stds), axis=-1) + np.log(weights)[:, None]
    np.testing.assert_allclose(far, special.logsumexp(log_terms, axis=0), rtol=1e-12)
    assert np.all(np.isfinite(far))


def test_law_of_total_variance():
    means, stds, weights = _random_mixture(5)
    means = means + 1e4  # large common offset: the running sums must not cancel
    prediction = RegressionPrediction.from_components(means, stds, weights)
    mean = np.einsum("s,snd->nd", weights, means)
    epistemic = np.einsum("s,snd->nd", weights, (means - mean) ** 2)
    aleatoric = np.einsum("s,snd->nd", weights, stds**2)
    np.testing.assert_allclose(prediction.mean, mean, rtol=1e-14)
    np.testing.assert_allclose(prediction.epistemic_std, np.sqrt(epistemic), rtol=1e-8)
    np.testing.assert_allclose(prediction.aleatoric_std, np.sqrt(aleatoric), rtol=1e-12)
    # The total is the mixture's own variance, integrated numerically.
    m, s = means[:, 0, 0], stds[:, 0, 0]
    variance = integrate.quad(lambda z: (z - mean[0, 0]) ** 2 * _mixture_pdf(z, m, s, weights), 1e4 - 30, 1e4 + 30,
                              points=[1e4], limit=200)[0]
    np.testing.assert_allclose(prediction.std[0, 0] ** 2, variance, rtol=1e-8)


def test_moments_only_mode_refuses_quantiles():
    prediction = RegressionPrediction(keep_components=False)
    prediction.add(np.zeros((2, 1)), np.ones((2, 1)))
    np.testing.assert_allclose(prediction.std, 1.0)
    with pytest.raises(ValueError, match="keep_components=False"):
        prediction.interval(0.9)


# ---------------------------------------------------------------------------------- losses


def test_gaussian_nll_fixed_scale_is_the_exact_negative_log_density():
    rng = np.random.default_rng(0)
    y, mu = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    per_example = kt.losses.GaussianNLL(scale=0.7, reduction=None)(y, mu)
    np.testing.assert_allclose(per_example, -stats.norm.logpdf(y, mu, 0.7).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(kt.losses.GaussianNLL(scale=0.7)(y, mu), np.mean(per_example), rtol=1e-6)
    # One target given as [n] against outputs [n, 1].
    np.testing.assert_allclose(
        kt.losses.GaussianNLL(scale=0.7, reduction=None)(y[:, 0], mu[:, :1]), -stats.norm.logpdf(y[:, 0], mu[:, 0], 0.7),
        rtol=1e-5,
    )


def test_gaussian_nll_learned_scale_uses_softplus_plus_floor():
    rng = np.random.default_rng(1)
    y, mu, raw = rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), rng.normal(scale=3.0, size=(5, 2))
    sigma = np.log1p(np.exp(raw)) + 1e-3
    loss = kt.losses.GaussianNLL(reduction=None)
    np.testing.assert_allclose(
        loss(y, np.concatenate([mu, raw], axis=1)), -stats.norm.logpdf(y, mu, sigma).sum(axis=1), rtol=1e-5
    )
    # The floor keeps the loss finite where softplus underflows.
    assert np.all(np.isfinite(loss(np.zeros((1, 1)), np.array([[0.0, -200.0]]))))


def test_student_t_nll_is_the_exact_negative_log_density():
    rng = np.random.default_rng(2)
    y, mu, raw = rng.normal(size=(4, 1)), rng.normal(size=(4, 1)), rng.normal(size=(4, 1))
    np.testing.assert_allclose(
        kt.losses.StudentTNLL(df=3.0, scale=0.5, reduction=None)(y, mu),
        -stats.t.logpdf(y[:, 0], 3.0, mu[:, 0], 0.5), rtol=1e-5,
    )
    sigma = np.log1p(np.exp(raw)) + 1e-3
    np.testing.assert_allclose(
        kt.losses.StudentTNLL(df=4.5, reduction=None)(y, np.concatenate([mu, raw], axis=1)),
        -stats.t.logpdf(y[:, 0], 4.5, mu[:, 0], sigma[:, 0]), rtol=1e-5,
    )


@pytest.mark.parametrize(
    "loss",
    [kt.losses.GaussianNLL(), kt.losses.GaussianNLL(scale=0.3, min_scale=1e-2, name="g"),
     kt.losses.StudentTNLL(df=5.0, scale=2.0)],
    ids=["learned", "fixed", "student_t"],
)
def test_losses_round_trip_their_config(loss):
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(restored) is type(loss)
    assert restored.get_config() == loss.get_config()
    y, y_pred = np.ones((2, 1)), np.full((2, loss.units_per_target), 0.3)
    np.testing.assert_allclose(restored(y, y_pred), loss(y, y_pred))


def test_a_model_with_the_loss_saves_and_loads(tmp_path):
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    net.compile(loss=kt.losses.GaussianNLL(min_scale=0.01))
    path = str(tmp_path / "net.keras")
    net.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, kt.losses.GaussianNLL) and loaded.loss.min_scale == 0.01


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: kt.losses.GaussianNLL(scale=-1.0), r"`scale` must be in \(0, inf\), got -1.0"),
        (lambda: kt.losses.GaussianNLL(scale="1"), r"`scale` must be a real number, got '1'"),
        (lambda: kt.losses.GaussianNLL(min_scale=0.0), r"`min_scale` must be in \(0, inf\), got 0.0"),
        (lambda: kt.losses.StudentTNLL(df=0), r"`df` must be in \(0, inf\), got 0"),
    ],
)
def test_loss_arguments_are_checked(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_loss_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"two outputs per target.*\(4, 3\)"):
        kt.losses.GaussianNLL()(np.zeros((4, 1)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"`y_true` of shape \(4, 2\).*`y_pred` of shape \(4, 2\)"):
        kt.losses.GaussianNLL()(np.zeros((4, 2)), np.zeros((4, 2)))


# ---------------------------------------------------------------------------------- from samples


def _net(units):
    # Seeded: the initialisation must not depend on which tests ran before in the same process.
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])


def _forward(net, vector, x):
    """The net's outputs at a flattened sample, the plain Keras way (weights set, then restored)."""
    saved = net.get_weights()
    kernel_size = int(np.prod(net.trainable_variables[0].shape))
    net.set_weights([vector[:kernel_size].reshape(net.trainable_variables[0].shape), vector[kernel_size:]])
    outputs = net.predict(x, verbose=0).astype(np.float64)
    net.set_weights(saved)
    return outputs


def test_predict_posterior_with_a_learned_scale_mixes_the_samples_gaussians():
    net = _net(4)  # two targets: two means, then two raw scales
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(2, 3, net.count_params())).astype(np.float32)  # [C, S, Nd]
    x = rng.normal(size=(5, 3)).astype(np.float32)
    loss = kt.losses.GaussianNLL()
    prediction = kt.regression.predict_posterior(net, samples, x, loss=loss, batch_size=2, verbose=0)
    outputs = np.stack([_forward(net, v, x) for v in samples.reshape(6, -1)])
    expected = RegressionPrediction.from_components(outputs[..., :2], np.log1p(np.exp(outputs[..., 2:])) + 1e-3)
    assert prediction.num_samples == 6
    np.testing.assert_allclose(prediction.mean, expected.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prediction.std, expected.std, rtol=1e-5)
    np.testing.assert_allclose(prediction.interval(0.8), expected.interval(0.8), rtol=1e-5, atol=1e-6)


def _bayesian_model(loss, units=1):
    model = kt.BayesianModel(_net(units), kt.samplers.SGLD(1e-4), num_examples=8, prior=kt.priors.Gaussian(1.0), seed=0)
    model.compile(loss=loss)
    return model


def test_evaluate_posterior_reads_the_compiled_loss_and_scores_the_mixture():
    model = _bayesian_model(kt.losses.GaussianNLL(scale=0.5))
    x = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    y = np.random.default_rng(2).normal(size=(8, 1)).astype(np.float32)
    collector = kt.callbacks.SampleCollector(every_n_steps=1, max_samples=10)
    model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[collector])
    metrics = kt.regression.evaluate_posterior(model, collector, (x, y), levels=(0.5, 0.9), verbose=0)
    prediction = kt.regression.predict_posterior(model, collector, x, verbose=0)
    assert metrics["num_samples"] == prediction.num_samples == 4
    np.testing.assert_allclose(metrics["rmse"], np.sqrt(np.mean((y - prediction.mean) ** 2)), rtol=1e-10)
    np.testing.assert_allclose(metrics["nll"], -np.mean(prediction.log_density(y)), rtol=1e-10)
    np.testing.assert_allclose(metrics["crps"], np.mean(prediction.crps(y)), rtol=1e-10)
    for level, name in [(0.5, "50"), (0.9, "90")]:
        lower, upper = prediction.interval(level)
        assert metrics[f"coverage_{name}"] == np.mean((lower <= y) & (y <= upper))
        np.testing.assert_allclose(metrics[f"interval_width_{name}"], np.mean(upper - lower), rtol=1e-10)
    # The same from a tf.data pipeline of (x, y) batches, and the streamed metrics alone.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(3)
    from_dataset = kt.regression.evaluate_posterior(model, collector, dataset, levels=(0.5, 0.9), verbose=0)
    assert from_dataset.keys() == metrics.keys()
    np.testing.assert_allclose(list(from_dataset.values()), list(metrics.values()), rtol=1e-6)
    streamed = kt.regression.evaluate_posterior(model, collector, (x, y[:, 0]), levels=(), crps=False, verbose=0)
    assert sorted(streamed) == ["nll", "num_samples", "rmse"]
    np.testing.assert_allclose(streamed["nll"], metrics["nll"], rtol=1e-10)


def test_a_model_without_a_gaussian_loss_is_refused_with_what_to_do():
    model = _bayesian_model("mse")
    model(np.zeros((1, 3), np.float32))
    samples = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"'mse', not a keras_thermo.losses.GaussianNLL.*scale=0.5 \*\* 0.5"):
        kt.regression.predict_posterior(model, samples, np.zeros((1, 3), np.float32), verbose=0)
    with pytest.raises(ValueError, match="StudentTNLL"):
        kt.regression.predict_posterior(
            model, samples, np.zeros((1, 3), np.float32), loss=kt.losses.StudentTNLL(df=3.0, scale=1.0), verbose=0
        )
    with pytest.raises(ValueError, match=r"outputs 1 units per example.*needs 2 per target"):
        kt.regression.predict_posterior(model, samples, np.zeros((1, 3), np.float32),
                                        loss=kt.losses.GaussianNLL(), verbose=0)
    with pytest.raises(ValueError, match=r"`levels` must be in \(0, 1\), got 90"):
        kt.regression.evaluate_posterior(model, samples, (np.zeros((1, 3), np.float32), np.zeros(1)),
                                         loss=kt.losses.GaussianNLL(scale=1.0), levels=(90,), verbose=0)


@pytest.mark.parametrize("loss", [kt.losses.GaussianNLL(), kt.losses.StudentTNLL(df=3.0)])
def test_the_classification_functions_refuse_a_regression_net_and_name_the_regression_ones(loss):
    model = _bayesian_model(loss, units=2)
    x = np.zeros((3, 3), np.float32)
    model(x)
    samples = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match=rf"compiled with {type(loss).__name__}, a regression likelihood.*"
                                         r"keras_thermo.regression.predict_posterior \(pass `scaler="):
        kt.predict_posterior(model, samples, x, verbose=0)
    with pytest.raises(ValueError, match=r"a regression likelihood.*each sample's own outputs.*keras_thermo.regression"):
        kt.posterior.predict_samples(model, samples, x, verbose=0)
    with pytest.raises(ValueError, match=r"keras_thermo.regression.evaluate_posterior"):
        kt.evaluate_posterior(model, samples, (x, np.zeros(3)), verbose=0)
    # A classifier is unaffected.
    classifier = _bayesian_model(keras.losses.SparseCategoricalCrossentropy(from_logits=True), units=2)
    classifier(x)
    assert kt.predict_posterior(classifier, samples, x, verbose=0).shape == (3, 2)


# ---------------------------------------------------------------------------------- during sampling


def test_posterior_average_of_a_regression_net_matches_evaluate_posterior():
    """The callback's streamed metrics (coverage from the mixture CDF at the targets, the CRPS from
    running sums) against `evaluate_posterior`'s (coverage from the mixture's quantiles) on the
    very samples a SampleCollector kept, on the targets' own scale via a TargetScaler."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(24, 3)).astype(np.float32)
    y = (100.0 + 20.0 * (x @ [1.0, -0.5, 0.2] + 0.3 * rng.normal(size=24)))[:, None]
    scaler = TargetScaler().fit(y)
    model = kt.BayesianModel(_net(2), kt.samplers.SGLD(1e-3), num_examples=24, prior=kt.priors.Gaussian(1.0), seed=0)
    model.compile(loss=kt.losses.GaussianNLL(), steps_per_execution=2)
    average = kt.callbacks.PosteriorAverage((x[:10], y[:10]), burn_in_steps=2, every_n_steps=1,
                                            levels=(0.5, 0.9), scaler=scaler)
    collector = kt.callbacks.SampleCollector(burn_in_steps=2, every_n_steps=1)
    history = model.fit(x, scaler.transform(y), batch_size=8, epochs=3, callbacks=[average, collector], verbose=0)
    assert average.is_regression and average.num_samples == collector.steps.size == 7
    expected = kt.regression.evaluate_posterior(model, collector, (x[:10], y[:10]), levels=(0.5, 0.9),
                                                scaler=scaler, verbose=0)
    result = average.result()
    assert list(result) == ["rmse", "nll", "coverage_50", "coverage_90", "crps", "num_samples"]
    for name in ["rmse", "nll", "crps"]:
        np.testing.assert_allclose(result[name], expected[name], rtol=1e-6, err_msg=name)
    for name in ["coverage_50", "coverage_90"]:
        assert result[name] == expected[name], name
    assert 0.0 <= result["coverage_50"] <= result["coverage_90"] <= 1.0
    np.testing.assert_allclose(
        average.predictions,
        kt.regression.predict_posterior(model, collector, x[:10], scaler=scaler, verbose=0).mean, rtol=1e-6
    )
    # Into History, one value per epoch.
    assert history.history["num_samples"] == [1, 4, 7]  # steps 3 to 9, after 2 of burn-in
    np.testing.assert_allclose(history.history["posterior_rmse"][-1], result["rmse"])
    np.testing.assert_allclose(history.history["posterior_nll"][-1], result["nll"])
    np.testing.assert_allclose(history.history["coverage_90"][-1], result["coverage_90"])
    np.testing.assert_allclose(history.history["crps"][-1], result["crps"])
    with pytest.raises(ValueError, match="classification metric"):
        _ = average.mutual_information
    average.reset()
    assert np.isnan(average.result()["crps"]) and average.result()["num_samples"] == 0


def test_regression_averager_thins_the_crps_store_to_its_bound():
    """Past `max_crps_samples` the pair term comes from every 2^k-th sample; the first term
    `E|X - y|` still from every sample (checked against scipy's folded normal)."""
    means, stds, weights = _random_mixture(5, num_samples=9)
    y = np.random.default_rng(6).normal(size=(3, 2))
    bounded = kt.regression.RegressionAverager(y, crps=True, max_crps_samples=4)
    exact = kt.regression.RegressionAverager(y, crps=True, max_crps_samples=None)
    for mean, std, weight in zip(means, stds, weights):
        bounded.update(mean, std, weight)
        exact.update(mean, std, weight)
    assert len(bounded._stored) == 3  # samples 0, 4 and 8: the store halved twice
    np.testing.assert_allclose(exact.result()["crps"],
                               np.mean(RegressionPrediction.from_components(means, stds, weights).crps(y)), rtol=1e-12)

    def expected_abs(m, s, w):  # E|X - y| of a mixture
        return np.einsum("s,snd->nd", w / w.sum(), stats.foldnorm.mean(np.abs(y - m) / s, scale=s))

    kept = [0, 4, 8]
    thinned = RegressionPrediction.from_components(means[kept], stds[kept], weights[kept])
    half_spread = expected_abs(means[kept], stds[kept], weights[kept]) - thinned.crps(y)
    np.testing.assert_allclose(bounded.result()["crps"], np.mean(expected_abs(means, stds, weights) - half_spread),
                               rtol=1e-10)
    for name in ["rmse", "nll", "coverage_90"]:
        assert bounded.result()[name] == exact.result()[name]
    with pytest.raises(ValueError, match="max_crps_samples"):
        kt.regression.RegressionAverager(y, max_crps_samples=1)
    with pytest.raises(ValueError, match="max_crps_samples"):
        kt.callbacks.PosteriorAverage((np.zeros((2, 3)), np.zeros(2)), max_crps_samples=0)


def test_posterior_average_regression_arguments_are_checked():
    x, y = np.zeros((4, 3), np.float32), np.zeros(4)
    with pytest.raises(ValueError, match=r"`levels` must be in \(0, 1\), got 90"):
        kt.callbacks.PosteriorAverage((x, y), levels=(90,))
    with pytest.raises(TypeError, match="`scaler` must be a keras_thermo.regression.TargetScaler"):
        kt.callbacks.PosteriorAverage((x, y), scaler=2.0)
    model = _bayesian_model(kt.losses.GaussianNLL(scale=1.0))
    model(x)
    with pytest.raises(ValueError, match="`outputs='logits'` is for classifiers"):
        kt.callbacks.PosteriorAverage((x, y), outputs="logits").attach(model)
    classifier = _bayesian_model(keras.losses.SparseCategoricalCrossentropy(from_logits=True), units=2)
    classifier(x)
    with pytest.raises(ValueError, match="`scaler` is for regression nets"):
        kt.callbacks.PosteriorAverage((x, y), scaler=TargetScaler().fit(y + 1.0)).attach(classifier)
    student = _bayesian_model(kt.losses.StudentTNLL(df=3.0, scale=1.0))
    student(x)
    with pytest.raises(ValueError, match="StudentTNLL"):
        kt.callbacks.PosteriorAverage((x, y)).attach(student)


# ---------------------------------------------------------------------------------- target scale


def test_a_shared_noise_scale_is_one_learned_scale_for_every_input_and_saves(tmp_path):
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), kt.regression.SharedNoiseScale()])
    assert net.output_shape == (None, 4)
    net.layers[-1].raw_scale.assign([0.5, -1.0])
    x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    outputs = net(x).numpy()
    np.testing.assert_array_equal(outputs[:, 2:], np.tile([0.5, -1.0], (6, 1)).astype(np.float32))
    np.testing.assert_allclose(outputs[:, :2], net.layers[-2](x).numpy())
    # Sampled under GaussianNLL() through fit, saved and loaded with its scale.
    model = kt.BayesianModel(net, kt.samplers.SGNHT(1e-3), num_examples=6, prior=kt.priors.FanInGaussian(), seed=0)
    model.compile(loss=kt.losses.GaussianNLL())
    model.fit(x, np.zeros((6, 2), np.float32), batch_size=6, epochs=2, verbose=0)
    assert not np.allclose(net.layers[-1].raw_scale.numpy(), [0.5, -1.0])  # it is sampled
    path = str(tmp_path / "shared.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(restored.net.layers[-1].raw_scale.numpy(), net.layers[-1].raw_scale.numpy())
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("sampler, chains", [(kt.samplers.CCAdL, 2),
                                             pytest.param(kt.samplers.MCCAdL, 1, marks=pytest.mark.slow)])
def test_a_shared_noise_scale_runs_under_the_covariance_samplers_with_its_layer_rule(sampler, chains):
    x = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    y = 2.0 * x[:, :1] + 0.1
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1),
                            kt.regression.SharedNoiseScale()])
    model = kt.BayesianModel(net, sampler(1e-3), num_examples=32, prior=kt.priors.FanInGaussian(), seed=0,
                             num_chains=chains, per_example_method="layers")  # refuses a layer without a rule
    model.compile(loss=kt.losses.GaussianNLL(), steps_per_execution=4)
    collector = kt.callbacks.SampleCollector(every_n_steps=2)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[collector])
    samples = np.asarray(collector.samples)
    assert samples.shape[-1] == net.count_params() and np.all(np.isfinite(samples))
    prediction = kt.regression.predict_posterior(model, collector, x[:4], verbose=0)
    assert prediction.mean.shape == (4, 1) and np.all(prediction.aleatoric_std > 0)


def test_target_scaler_reports_predictions_and_metrics_on_the_targets_scale():
    rng = np.random.default_rng(3)
    y_train = rng.normal(loc=[100.0, -3.0], scale=[20.0, 0.1], size=(50, 2))
    scaler = TargetScaler().fit(y_train)
    np.testing.assert_allclose(scaler.transform(y_train).mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(scaler.transform(y_train).std(axis=0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(scaler.inverse_transform(scaler.transform(y_train)), y_train, rtol=1e-12)
    restored = TargetScaler.from_config(scaler.get_config())
    np.testing.assert_allclose(restored.inverse_transform(np.ones((1, 2))), scaler.inverse_transform(np.ones((1, 2))))

    net = _net(2)
    samples = rng.normal(size=(3, net.count_params())).astype(np.float32)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    y = rng.normal(loc=[100.0, -3.0], scale=[20.0, 0.1], size=(4, 2))
    loss = kt.losses.GaussianNLL(scale=0.5)
    standard = kt.regression.predict_posterior(net, samples, x, loss=loss, verbose=0)
    scaled = kt.regression.predict_posterior(net, samples, x, loss=loss, scaler=scaler, verbose=0)
    np.testing.assert_allclose(scaled.mean, scaler.inverse_transform(standard.mean), rtol=1e-12)
    np.testing.assert_allclose(scaled.std, scaler.inverse_transform_std(standard.std), rtol=1e-12)
    np.testing.assert_allclose(scaled.interval(0.9), scaler.inverse_transform(standard.interval(0.9)), rtol=1e-9)
    metrics = kt.regression.evaluate_posterior(net, samples, (x, y), loss=loss, scaler=scaler, verbose=0)
    on_standard_scale = kt.regression.evaluate_posterior(
        net, samples, (x, scaler.transform(y)), loss=loss, verbose=0
    )
    # The density's change of variables: log |dy / dz| = sum_d log std_d per example.
    np.testing.assert_allclose(metrics["nll"], on_standard_scale["nll"] + np.sum(np.log(scaler.std)), rtol=1e-9)
    assert metrics["coverage_90"] == on_standard_scale["coverage_90"]
    with pytest.raises(ValueError, match="not fitted"):
        TargetScaler().transform(y)
    with pytest.raises(ValueError, match=r"fitted on 2 target\(s\); values of shape \(4, 3\)"):
        scaler.inverse_transform(np.zeros((4, 3)))


def test_target_scaler_keeps_a_constant_target_unscaled():
    scaler = TargetScaler().fit(np.full((5, 1), 7.0))
    np.testing.assert_allclose(scaler.std, 1.0)
    np.testing.assert_allclose(scaler.transform(np.array([8.0])), 1.0)


def test_docstring_examples_run():
    import doctest  # noqa: PLC0415

    for module in (kt.losses, kt.regression, regression_metrics):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__
