"""HierarchicalGaussian: the Gibbs draw of the precisions, the joint potential, state in a model."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import keras_thermo as kt
from keras_thermo import testing

from helpers import tanh_net

NUM_DRAWS = 5_000
# Bonferroni over the 2 moments x 2 variables of a check, familywise 1e-3.
Z_THRESHOLD = float(stats.norm.ppf(1 - 1e-3 / (2 * 4)))


def _weights():
    # Sizes 6 and 1 (a bias of one unit): alpha + n/2 >= 1 holds for alpha = 1.
    return [tf.constant(np.linspace(-1.0, 1.5, 6).reshape(2, 3), tf.float32), tf.constant([0.7], tf.float32)]


def _draws(prior, weights, temperature, num_draws=NUM_DRAWS):
    """`[num_draws, V]` Gibbs draws at steps 1..num_draws (independent keys)."""

    @tf.function
    def run():
        return tf.map_fn(
            lambda step: tf.stack(prior.draw(weights, step=step, seed=11, temperature=temperature)),
            tf.range(1, num_draws + 1, dtype=tf.int64), fn_output_signature=tf.float32,
        )

    return run().numpy().astype(np.float64)


def _moment_z_scores(draws, shape, rate):
    """z of the sample mean and variance of Gamma(shape, rate) draws, per column.

    Standard errors: mean sqrt(var / S); variance var * sqrt(2 / (S - 1) + kurtosis / S), with
    the Gamma's excess kurtosis 6 / shape."""
    shape, rate = np.asarray(shape), np.asarray(rate)
    count = draws.shape[0]
    mean, var = shape / rate, shape / rate**2
    z_mean = (draws.mean(axis=0) - mean) / np.sqrt(var / count)
    z_var = (draws.var(axis=0, ddof=1) - var) / (var * np.sqrt(2 / (count - 1) + 6 / shape / count))
    return np.concatenate([z_mean, z_var])


def _exact_conditional(weights, alpha, beta, temperature):
    sizes = np.array([w.numpy().size for w in weights], np.float64)
    squares = np.array([np.sum(w.numpy().astype(np.float64) ** 2) for w in weights])
    return (alpha + sizes / 2 - 1) / temperature + 1, (beta + squares / 2) / temperature


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_gibbs_draws_have_the_conjugate_gamma_moments(temperature):
    alpha, beta = 1.5, 0.5
    prior = kt.priors.HierarchicalGaussian(alpha=alpha, beta=beta)
    weights = _weights()
    draws = _draws(prior, weights, temperature)
    shape, rate = _exact_conditional(weights, alpha, beta, temperature)
    if temperature == 1.0:  # the textbook form
        np.testing.assert_allclose(shape, [alpha + 3, alpha + 0.5])
        np.testing.assert_allclose(rate, beta + 0.5 * np.array([np.sum(w.numpy().astype(np.float64) ** 2) for w in weights]))
    z = _moment_z_scores(draws, shape, rate)
    assert np.all(np.abs(z) < Z_THRESHOLD), z
    # The same check rejects the conditional of another temperature (T = 1 vs 0.5 and back):
    # the test can fail.
    other_shape, other_rate = _exact_conditional(weights, alpha, beta, 1.5 - temperature)
    assert np.any(np.abs(_moment_z_scores(draws, other_shape, other_rate)) > 3 * Z_THRESHOLD)


def test_update_state_draws_only_after_every_kth_step():
    prior = kt.priors.HierarchicalGaussian(resample_every=5, initial_std=0.5)
    weights = _weights()
    state = prior.initial_state(weights)
    assert [float(p) for p in state] == [4.0, 4.0]
    for step in range(1, 11):
        new = prior.update_state(state, weights, step=tf.constant(step, tf.int64), seed=0, temperature=1.0)
        drawn = prior.draw(weights, step=tf.constant(step, tf.int64), seed=0, temperature=1.0)
        expected = drawn if step % 5 == 0 else state
        assert [float(v) for v in new] == [float(v) for v in expected], step


def test_potential_is_the_joint_negative_log_density():
    prior = kt.priors.HierarchicalGaussian(alpha=2.0, beta=3.0)
    weights = [keras.Variable(w) for w in _weights()]
    precisions = [keras.Variable(np.float32(p)) for p in (0.5, 4.0)]
    prior.bind_state(precisions)
    want = 0.0
    for w, lam in zip(weights, (0.5, 4.0)):
        values = w.numpy().astype(np.float64).ravel()
        want -= np.sum(stats.norm.logpdf(values, scale=1 / math.sqrt(lam)))
        want -= stats.gamma.logpdf(lam, a=2.0, scale=1 / 3.0)
    assert float(prior(weights)) == pytest.approx(want, rel=1e-6)


def _model(prior, seed=3):
    net = tanh_net(2)
    # A layerwise mass frozen after 5 steps: this test also covers its resume (one set of fits
    # for both states, for the default suite's time).
    sampler = kt.samplers.SGHMC(1e-2, friction=2.0, preconditioner=kt.samplers.Preconditioner("layerwise", warmup_steps=5))
    model = kt.BayesianModel(net, sampler, num_examples=64, prior=prior, seed=seed)
    model.compile(loss="mse")
    return model


_data = testing.small_regression_dataset


def _precisions(model):
    return [float(v.numpy()) for v in model._prior_state_variables]


def test_precisions_and_layerwise_masses_live_in_variables_and_resume_bit_for_bit(tmp_path):
    prior = kt.priors.HierarchicalGaussian(alpha=1.0, beta=1.0, resample_every=4, initial_std=2.0)
    straight = _model(prior)
    straight.fit(_data(), steps_per_epoch=16, epochs=1, verbose=0)
    # After step 16 (a multiple of K) the precisions are the draw from the weights of step 16.
    final_draw = prior.draw(straight.trainable_variables, step=tf.constant(16, tf.int64), seed=3, temperature=1.0)
    assert _precisions(straight) == [float(v) for v in final_draw]
    assert straight.prior is prior and prior.is_bound

    first = _model(prior)  # the same instance again: this model binds its own copy
    first.fit(_data(), steps_per_epoch=3, epochs=1, verbose=0)
    assert first.prior is not prior and first.prior.get_config() == prior.get_config()
    assert _precisions(first) == [0.25] * 4  # no draw before step 4
    first.fit(_data().skip(3), steps_per_epoch=3, epochs=1, verbose=0)
    drawn_at_4 = _precisions(first)
    assert all(p != 0.25 for p in drawn_at_4)
    masses_at_6 = [float(m) for m in first.sampler_state().preconditioner.mass]
    assert len(set(masses_at_6)) == 4  # estimated at step 5, one per variable
    path = os.path.join(tmp_path, "hierarchical.keras")
    first.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored.prior, kt.priors.HierarchicalGaussian)
    assert _precisions(restored) == drawn_at_4
    restored.fit(_data().skip(6), steps_per_epoch=10, epochs=1, verbose=0)
    assert [float(m) for m in restored.sampler_state().preconditioner.mass] == masses_at_6  # frozen
    for u, v in zip(straight.trainable_variables + straight.non_trainable_variables,
                    restored.trainable_variables + restored.non_trainable_variables):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_config_round_trip():
    prior = kt.priors.HierarchicalGaussian(alpha=2.0, beta=0.1, resample_every=50, initial_std=0.3)
    restored = kt.priors.get(keras.saving.serialize_keras_object(prior))
    assert isinstance(restored, kt.priors.HierarchicalGaussian)
    assert restored.get_config() == prior.get_config()


def test_alpha_too_small_for_a_scalar_variable_is_refused():
    prior = kt.priors.HierarchicalGaussian(alpha=0.25)
    with pytest.raises(ValueError, match=r"`alpha` 0.25 .* 1 scalar\(s\).*alpha >= 0.5"):
        prior.initial_state(_weights())


class _EveryStepPrior(keras.callbacks.Callback):
    """The weights, TACT-HMC's xi and the prior's precisions after every step."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_batch_end(self, batch, logs=None):
        model = self.model
        self.rows.append((
            [v.numpy() for v in model.trainable_variables],
            float(model.sampler_state().xi),
            [float(p) for p in model._prior_state_variables],
            int(model.sampler_state().step),
        ))


def test_gibbs_draw_under_tact_hmc_uses_the_weights_effective_temperature():
    # TACT-HMC's joint target is exp(-lambda(xi) U / T - W(xi) / T): given the weights and xi,
    # the precisions' conditional is the Gibbs draw at theta's effective temperature
    # T / lambda(xi), not at T (they agree only on the plateau).
    x, y = testing.linear_regression_data(32, 2, seed=0)
    prior = kt.priors.HierarchicalGaussian(alpha=1.0, beta=1.0, resample_every=1)
    sampler = kt.samplers.TACTHMC(step_size=2e-3, xi_step_size=2e-3, noise=0.1, xi_noise=0.1, sample_every=1, num_bins=20)
    keras.utils.set_random_seed(0)  # the net's start (else it follows whatever ran before in the process)
    model = kt.BayesianModel(testing.linear_regression_net(2), sampler, num_examples=32, prior=prior, seed=3)
    model.compile(loss="mse")
    every = _EveryStepPrior()
    model.fit(x, y, batch_size=8, epochs=20, verbose=0, callbacks=[every])
    factors = []
    for weights, xi, precisions, step in every.rows:
        temperature = 1.0 / float(sampler.coupling(tf.constant(xi))[0])  # T / lambda(xi), T = 1
        factors.append(temperature)
        expected = prior.draw([tf.constant(w) for w in weights], step=tf.constant(step, tf.int64), seed=3, temperature=temperature)
        np.testing.assert_allclose(precisions, [float(e) for e in expected], rtol=1e-5)
    # The check covers tempered steps, where T / lambda(xi) differs from T: at least 10 of the 80
    # (their number follows xi's path from the net's start).
    assert np.sum(np.array(factors) > 1.5) >= 10, np.quantile(factors, [0.1, 0.5, 0.9])


# --- FanInGaussian ---------------------------------------------------------------------------


def test_fan_in_gaussian_scales_each_kernel_by_its_fan_in():
    net = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3),
        keras.layers.Flatten(),
        keras.layers.Dense(5),
    ])
    prior = kt.priors.FanInGaussian(scale=2.0, bias_std=0.5)
    # Conv kernel (3, 3, 3, 4): fan-in 27; its bias; Dense kernel (144, 5): fan-in 144; its bias.
    assert prior.stds_for(net.trainable_variables) == pytest.approx([2.0 / math.sqrt(27), 0.5, 2.0 / 12.0, 0.5])
    # The density is the Gaussian's at those stds, normalising constant included.
    expected = sum(
        -np.sum(stats.norm.logpdf(v.numpy().astype(np.float64), scale=std))
        for v, std in zip(net.trainable_variables, prior.stds_for(net.trainable_variables))
    )
    assert float(prior(net.trainable_variables)) == pytest.approx(expected, rel=1e-5)


def test_fan_in_gaussian_config_round_trip_and_bad_scale():
    prior = kt.priors.FanInGaussian(scale=0.5, bias_std=2.0)
    restored = kt.priors.get(keras.saving.serialize_keras_object(prior))
    assert isinstance(restored, kt.priors.FanInGaussian)
    assert restored.get_config() == {"scale": 0.5, "bias_std": 2.0}
    with pytest.raises(ValueError, match="scale"):
        kt.priors.FanInGaussian(scale=0.0)


def _differentiated_force(prior, weights):
    with tf.GradientTape() as tape:
        tape.watch(weights)
        value = prior(weights)
    return [-g for g in tape.gradient(value, weights)]


@pytest.mark.parametrize("prior", [
    kt.priors.Gaussian(std=1.0), kt.priors.Gaussian(std=0.3), kt.priors.Gaussian(std=[10.0, 0.7]),
    kt.priors.FanInGaussian(scale=1.3, bias_std=0.2), kt.priors.Laplace(scale=0.37),
], ids=["gaussian-1", "gaussian-0.3", "gaussian-per-variable", "fan-in", "laplace"])
def test_a_closed_form_prior_force_is_the_differentiated_one_bit_for_bit(prior):
    weights = [tf.constant(np.linspace(-1.3, 1.7, 6).reshape(2, 3), tf.float32), tf.constant([0.0, 0.37], tf.float32)]
    closed, expected = prior.force(weights), _differentiated_force(prior, weights)
    assert len(closed) == len(expected) == len(weights)
    for mine, differentiated in zip(closed, expected):
        np.testing.assert_array_equal(mine.numpy(), differentiated.numpy())


def test_the_hierarchical_prior_force_follows_its_current_precisions():
    prior = kt.priors.HierarchicalGaussian(alpha=2.0, beta=3.0)
    weights = _weights()
    precisions = [tf.Variable(2.5), tf.Variable(0.3)]
    prior.bind_state(precisions)
    for values in ([2.5, 0.3], [7.0, 0.01]):
        for variable, value in zip(precisions, values):
            variable.assign(value)
        closed, differentiated = prior.force(weights), _differentiated_force(prior, weights)
        assert len(closed) == len(differentiated) == len(weights)
        for mine, expected, weight, value in zip(closed, differentiated, weights, values):
            np.testing.assert_array_equal(mine.numpy(), expected.numpy())
            np.testing.assert_allclose(mine.numpy(), -value * weight.numpy(), rtol=1e-6)


class _ShiftedGaussian(kt.priors.Gaussian):
    """A subclass with a density of its own (mean 1) and no force of its own."""

    def __call__(self, variables):
        return super().__call__([tf.convert_to_tensor(v) - 1.0 for v in variables])


def test_a_subclass_with_its_own_density_is_differentiated_not_given_the_parents_force():
    assert _ShiftedGaussian(std=1.0).force(_weights()) is None
    assert kt.priors.FanInGaussian().force(_weights()) is not None  # the same density, its own stds


class _DifferentiatedGaussian(kt.priors.Prior):
    """A Gaussian prior without a closed-form force: the step differentiates it."""

    def __init__(self, std):
        self.gaussian = kt.priors.Gaussian(std=std)

    def __call__(self, variables):
        return self.gaussian(variables)


class _DoubledForceGaussian(kt.priors.Gaussian):
    """A wrong closed form (twice the force), to show the step reads `Prior.force`."""

    def force(self, variables):
        return [2.0 * f for f in super().force(variables)]


@pytest.mark.parametrize("make_sampler", [lambda: kt.samplers.SGHMC(1e-2, friction=1.0),
                                          lambda: kt.samplers.CCAdL(1e-2, friction=1.0, warmup_steps=0)],
                         ids=["sghmc", "ccadl"])
def test_the_step_with_the_closed_form_prior_force_moves_as_the_differentiated_prior(make_sampler):
    """The step adds `Prior.force` to the data's force instead of differentiating R; a prior
    without a closed form is differentiated. Both give the same chain, bit for bit (CCAdL: the
    per-example engine's shared backward pass)."""
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
    chains = []
    for prior in (kt.priors.Gaussian(std=0.3), _DifferentiatedGaussian(std=0.3), _DoubledForceGaussian(std=0.3)):
        model = kt.BayesianModel(tanh_net(), make_sampler(), num_examples=32, prior=prior, seed=3,
                                 temperature_check=False)
        model.compile(loss="mse")
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
        chains.append(([w.numpy() for w in model.trainable_variables], history.history["potential"]))
    (closed, closed_potential), (differentiated, differentiated_potential), (doubled, _) = chains
    for a, b in zip(closed, differentiated):
        np.testing.assert_array_equal(a, b)
    assert closed_potential == differentiated_potential
    # The control: the step reads `Prior.force` (a wrong one moves the chain elsewhere).
    assert not all(np.array_equal(a, b) for a, b in zip(closed, doubled))


class _ShortForceGaussian(kt.priors.Gaussian):
    def force(self, variables):
        return super().force(variables)[:1]


def test_a_prior_force_of_the_wrong_length_is_refused_by_name():
    model = kt.BayesianModel(tanh_net(), kt.samplers.SGLD(1e-4), num_examples=8, prior=_ShortForceGaussian(1.0),
                             seed=0, temperature_check=False)
    model.compile(loss="mse")
    x = np.zeros((8, 3), "float32")
    with pytest.raises(ValueError, match=r"_ShortForceGaussian.force returned shapes \[\(3, 4\)\] for trainable variables of shapes"):
        model.fit(x, np.zeros((8, 1), "float32"), batch_size=8, epochs=1, verbose=0)


class _FlatForceGaussian(kt.priors.Gaussian):
    def force(self, variables):
        return [tf.reshape(f, [-1]) for f in super().force(variables)]


def test_a_prior_force_of_the_wrong_shape_is_refused_by_name():
    model = kt.BayesianModel(tanh_net(), kt.samplers.SGLD(1e-4), num_examples=8, prior=_FlatForceGaussian(1.0),
                             seed=0, temperature_check=False)
    model.compile(loss="mse")
    with pytest.raises(ValueError, match=r"_FlatForceGaussian.force returned shapes \[\(12,\), \(4,\), \(4,\), \(1,\)\]"):
        model.fit(np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32"), batch_size=8, epochs=1, verbose=0)
