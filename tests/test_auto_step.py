"""The automatic step size (`step_size="auto"`) and the friction that follows it
(`keras_thermo.samplers.auto_step`).

On the shared linear-regression check (`keras_thermo.testing`) with its likelihood weighted by N
from 10 to 10^7, the posterior precision spans six orders of magnitude: one default must serve
them all. The largest curvature there is known in closed form, so the measurement is checked
exactly; the chains are checked against the exact posterior within their Monte Carlo error.
"""

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing
from keras_thermo.samplers import auto_step

FEATURES = 3
ROWS = 20
PRIOR_STD = 1.0


def _data():
    return testing.linear_regression_data(ROWS, FEATURES, noise_std=0.5, seed=3)


def _largest_eigenvalue(x, num_examples):
    """Of the Hessian of U: `2 (N / n) A^T A + I / s^2` (`testing.linear_regression_posterior`)."""
    _, covariance = testing.linear_regression_posterior(x, np.zeros((len(x), 1)), prior_std=PRIOR_STD, num_examples=num_examples)
    return 1.0 / np.linalg.eigvalsh(covariance).min()


def _fit_steps(sampler, num_examples, steps, *, seed=0):
    x, y = _data()
    model = kt.BayesianModel(
        testing.linear_regression_net(FEATURES), sampler, num_examples=num_examples,
        prior=kt.priors.Gaussian(PRIOR_STD), seed=seed,
    )
    model.compile(loss="mse", steps_per_execution=min(steps, 50))
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    steps_seen = []

    class Logs(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps_seen.append((float(logs["step_size"]), float(logs["curvature"])))

    history = model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Logs()])
    return model, history, steps_seen


def test_power_iteration_finds_the_largest_curvature_in_the_mass_metric():
    hessian = tf.constant([2.0, 50.0, 400.0])
    force_at = lambda theta: [-hessian * theta[0]]  # noqa: E731
    params = [tf.constant([0.3, -1.0, 2.0])]
    step = tf.constant(0, tf.int64)
    assert float(auto_step.largest_curvature(force_at, params, 1.0, seed=0, step=step)) == pytest.approx(400.0, rel=1e-3)
    # With masses m the eigenvalues of M^-1 H are H / m.
    masses = tf.constant([1.0, 1.0, 100.0])
    lam = auto_step.largest_curvature(force_at, params, [1.0 / masses], seed=0, step=step)
    assert float(lam) == pytest.approx(50.0, rel=1e-3)


@pytest.mark.parametrize("num_examples", [10, 10**7])
def test_auto_step_size_follows_the_curvature_over_six_orders_of_magnitude(num_examples):
    x, _ = _data()
    lam = _largest_eigenvalue(x, num_examples)
    model, history, steps = _fit_steps(kt.samplers.SGNHT(), num_examples, 2)
    step_size, curvature = steps[-1]
    assert curvature == pytest.approx(lam, rel=1e-2)
    assert step_size == pytest.approx(auto_step.STABILITY_FRACTION / np.sqrt(lam), rel=1e-2)
    # The chosen values are the sampler's, the History's and the checkpoint's.
    assert model.sampler.step_size == pytest.approx(step_size)
    assert history.history["step_size"][-1] == pytest.approx(step_size)
    assert any(v.name == "curvature" for v in model.variables)
    # The friction follows: SGD momentum 1 - A h = DEFAULT_MOMENTUM.
    assert float(model.sampler.friction_at(step_size)) * step_size == pytest.approx(1.0 - auto_step.DEFAULT_MOMENTUM)


def test_squared_step_sizes_take_the_square_of_the_fraction():
    x, _ = _data()
    lam = _largest_eigenvalue(x, 1000)
    _, _, steps = _fit_steps(kt.samplers.SGLD(), 1000, 2)
    assert steps[-1][0] == pytest.approx(auto_step.STABILITY_FRACTION**2 / lam, rel=1e-2)


def test_step_size_is_frozen_after_the_adaptation_window():
    """After the window the step size never changes, even when the data's curvature does (a
    second fit on features 3x larger: 9x the curvature), so the chain is one fixed kernel."""
    x, y = _data()
    sampler = kt.samplers.SGHMC()
    window = sampler.adaptation_steps
    model = kt.BayesianModel(
        testing.linear_regression_net(FEATURES), sampler, num_examples=1000, prior=kt.priors.Gaussian(PRIOR_STD), seed=0,
    )
    model.compile(loss="mse", steps_per_execution=50)
    model.fit(tf.data.Dataset.from_tensors((x, y)).repeat(), steps_per_epoch=window + 50, epochs=1, verbose=0)
    frozen = model.sampler.step_size
    history = model.fit(tf.data.Dataset.from_tensors((3 * x, y)).repeat(), steps_per_epoch=300, epochs=1, verbose=0)
    assert history.history["step_size"][-1] == frozen
    assert model.sampler.step_size == frozen
    # Within the window the same change of data is measured (the test can fail).
    fresh = kt.BayesianModel(
        testing.linear_regression_net(FEATURES), kt.samplers.SGHMC(), num_examples=1000,
        prior=kt.priors.Gaussian(PRIOR_STD), seed=0,
    )
    fresh.compile(loss="mse", steps_per_execution=50)
    fresh.fit(tf.data.Dataset.from_tensors((x, y)).repeat(), steps_per_epoch=100, epochs=1, verbose=0)
    before = fresh.sampler.step_size
    fresh.fit(tf.data.Dataset.from_tensors((3 * x, y)).repeat(), steps_per_epoch=window, epochs=1, verbose=0)
    assert fresh.sampler.step_size < 0.5 * before


def test_auto_round_trips_in_the_config_and_rejects_other_strings():
    sampler = kt.samplers.CCAdL()
    config = sampler.get_config()
    assert config["step_size"] == "auto" and config["friction"] is None
    assert kt.samplers.CCAdL.from_config(config).is_auto_step_size
    with pytest.raises(ValueError, match="step_size.*'auto'.*'fast'"):
        kt.samplers.SGHMC(step_size="fast")
    with pytest.raises(ValueError, match="BayesianModel"):
        kt.samplers.SGLD().step_size_at(tf.constant(0, tf.int64))


# --- the chains: stable, and at the posterior, from N = 10 to 10^7 -------------------------------

# Full batch: no gradient noise. CCAdL and mCCAdL estimate a noise from the per-example gradients
# (N^2/n V) that a weighted full batch does not have, so they run on minibatches below.
FULL_BATCH_SAMPLERS = {"sghmc": (kt.samplers.SGHMC, 6000), "sgnht": (kt.samplers.SGNHT, 6000), "sgld": (kt.samplers.SGLD, 20000)}
NOISY_SAMPLERS = {"ccadl": kt.samplers.CCAdL, "mccadl": kt.samplers.MCCAdL}
CHAINS = 8
# The full-batch check's resolution (`detectable_variance_error`) must reach 0.3: with 8 chains
# its Student-t threshold (7 degrees of freedom, Bonferroni over 8 moments) is 7.6, with 24 it is
# 4.6, so 3x the chains see a 3x smaller error where 6x the steps would see a 2.4x smaller one.
FULL_BATCH_CHAINS = 24


def _chains(make_sampler, x, y, *, num_examples, batch_size, num_steps, num_chains=CHAINS):
    window = make_sampler().adaptation_steps
    result = testing.run_chains(
        make_sampler, x, y, num_chains=num_chains, num_steps=window + num_steps, batch_size=batch_size,
        burn_in_steps=window + num_steps // 5, every_n_steps=5, prior_std=PRIOR_STD, num_examples=num_examples,
    )
    mean, covariance = testing.linear_regression_posterior(x, y, prior_std=PRIOR_STD, num_examples=num_examples)
    return testing.compare_with_gaussian(result.samples, mean, covariance)


@pytest.mark.slow
@pytest.mark.parametrize("num_examples", [10, 10**4, 10**7])
@pytest.mark.parametrize("name", sorted(FULL_BATCH_SAMPLERS))
def test_auto_step_size_samples_the_posterior(name, num_examples, request):
    if name == "sgnht" and num_examples == 10**7:
        # A known defect of the default (one xi per tensor): SGNHT's restart sets each xi_v from
        # its own tensor's heat over the warm-up's second half, and on this net's tiny tensors
        # (a kernel of 3 scalars, a bias of 1) that estimate is noisy; an xi_v set high falls by
        # at most h T per step, slow at A = 0.01 / h, so every variance reads 8-13% low
        # (t -2.3 to -5.9 against 4.6). `per_variable_thermostat=False` passes; restarting every
        # xi_v at the net's pooled balance passes here but fails
        # tests/test_per_variable_thermostat.py (the tensors' noises 4x apart).
        request.applymarker(pytest.mark.xfail(strict=True, reason="SGNHT's per-tensor restart on tensors of 1-3 scalars"))
    make_sampler, num_steps = FULL_BATCH_SAMPLERS[name]
    x, y = _data()
    check = _chains(make_sampler, x, y, num_examples=num_examples, batch_size=ROWS, num_steps=num_steps,
                    num_chains=FULL_BATCH_CHAINS)
    assert check.passed, check.summary()
    assert np.all(check.detectable_variance_error < 0.3), check.summary()


# Scaling the inputs by s multiplies the kernel's precision by s^2 but not the bias's, so the
# posterior's condition number grows as s^2 and the bias, its softest direction, oscillates about
# s times slower than the stiffest one, which sets the automatic step. At s = 30 the 6,000 steps
# hold only a handful of its periods: 32 chains resolve its variance only to 0.48 (the target is 0.3),
# and at that power mCCAdL's mean of the first kernel coefficient is off by about 0.05 posterior
# sd (t = -6.5 against a threshold of 4.4). At s = 1000 (condition number ~10^6) the default
# friction, A = 0.01 / h, overdamps the bias (relaxation time about A / lambda_bias, a quarter of
# the condition number in steps): the chains do not reach it.
# At s = 1, 24 chains (threshold 4.6) resolve the variances to about 0.1 of the posterior's; 8
# (threshold 7.6) resolved them only to 0.15-0.27 and passed CCAdL's cold positions unseen, before
# its thermostat read the kinetic energy net of its explicit friction's excess (the listing's
# reading is rejected by tests/test_ccadl_thermostat_reading.py at this problem's step).
NOISY_CHAINS = {1.0: 24, 30.0: 32}
SLOW_BIAS = pytest.mark.xfail(strict=True, reason="condition number ~10^3: the bias's variance is not resolved in 6,000 steps")
OVERDAMPED = pytest.mark.xfail(
    strict=True, reason="condition number ~10^6: the default friction overdamps the soft direction (the bias)"
)


@pytest.mark.slow
@pytest.mark.parametrize("scale", [1.0, pytest.param(30.0, marks=SLOW_BIAS), pytest.param(1000.0, marks=OVERDAMPED)])
@pytest.mark.parametrize("name", sorted(NOISY_SAMPLERS))
def test_auto_step_size_with_gradient_noise_samples_the_posterior(name, scale):
    x, y = testing.linear_regression_data(200, FEATURES, noise_std=0.5, seed=3)
    check = _chains(NOISY_SAMPLERS[name], scale * x, y, num_examples=None, batch_size=20, num_steps=6000,
                    num_chains=NOISY_CHAINS.get(scale, CHAINS))
    assert check.passed, check.summary()
    assert np.all(check.detectable_variance_error < 0.3), check.summary()


@pytest.mark.slow
def test_the_small_data_step_size_fails_at_large_n():
    """The case that shows the check can fail: the step size chosen at N = 10, used at N = 10^7
    (a thousand times too long for that curvature), does not give the posterior."""
    x, y = _data()
    small = auto_step.STABILITY_FRACTION / np.sqrt(_largest_eigenvalue(x, 10))
    with pytest.raises((AssertionError, kt.SamplerDivergedError)):
        check = _chains(lambda: kt.samplers.SGNHT(small), x, y, num_examples=10**7, batch_size=ROWS, num_steps=1000)
        assert check.passed, check.summary()


def test_a_given_step_size_above_the_stability_bound_warns_and_names_the_automatic_one():
    x, _ = _data()
    lam = _largest_eigenvalue(x, 1000)
    with pytest.warns(UserWarning, match=r"step_size=.* above the stability bound .* step_size='auto' would choose about"):
        _fit_steps(kt.samplers.SGHMC(3.0 / np.sqrt(lam)), 1000, 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*stability bound.*")
        _, _, steps = _fit_steps(kt.samplers.SGHMC(1.0 / np.sqrt(lam)), 1000, 1)
    assert steps[-1][1] == pytest.approx(lam, rel=1e-2)  # measured, and logged, for a given step size too


def _without_window(sampler_class):
    """CCAdL or mCCAdL with `warmup_steps=0`: its noise correction (friction or C step) then runs
    from the first step under the automatic step size too, as it does under a given one."""
    return functools.partial(sampler_class, warmup_steps=0)


@pytest.mark.parametrize("make_sampler", [kt.samplers.SGHMC, kt.samplers.SGNHT, _without_window(kt.samplers.CCAdL),
                                          _without_window(kt.samplers.MCCAdL)],
                         ids=["SGHMC", "SGNHT", "CCAdL", "MCCAdL"])
def test_a_given_friction_keeps_its_value_under_the_automatic_step_size(make_sampler):
    """`friction=2.0` with the default `step_size="auto"` runs (the thermostat starts at the
    given A, without waiting for the measured step) and is the same chain as the measured step
    size given by hand with that friction."""
    x, _ = _data()
    lam = _largest_eigenvalue(x, 10)
    keras.utils.set_random_seed(1)  # the same Keras initialisation for both runs
    auto, _, steps = _fit_steps(make_sampler(friction=2.0), 10, 3)
    step_size, curvature = steps[-1]
    assert curvature == pytest.approx(lam, rel=1e-2)
    assert 0.0 < step_size <= auto_step.STABILITY_FRACTION / np.sqrt(lam) * 1.01
    assert float(auto.sampler.friction_at(step_size)) == 2.0
    keras.utils.set_random_seed(1)
    given, _, _ = _fit_steps(make_sampler(step_size=step_size, friction=2.0), 10, 3)
    for a, b in zip(auto.get_weights(), given.get_weights()):
        np.testing.assert_array_equal(a, b)  # the same steps, bit for bit


def test_the_noise_bound_of_the_automatic_step_holds_for_every_chain():
    """Two CCAdL chains of a small regression with the automatic step run finite and below the
    covariance friction's logged limit. (With the bound taken from the first chain alone and held
    through the window, the second chain diverged at step 5; the bound is now taken where the
    friction starts, at the window's end, and its minimum over the chains is checked exactly by
    `test_a_cap_held_at_the_end_of_the_window_is_the_smallest_over_every_chain`.)"""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = (x @ [0.5, -1.0, 0.0, 0.3] + 0.3 * rng.normal(size=32)).astype("float32")[:, None]
    y = kt.regression.TargetScaler().fit(y).transform(y)
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)])
    model = kt.BayesianModel(net, kt.samplers.CCAdL(warmup_steps=4), num_examples=32, prior=kt.priors.FanInGaussian(),
                             seed=5, num_chains=2)
    model.compile(loss=kt.losses.GaussianNLL(), steps_per_execution=2)
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert np.all(np.isfinite(history.history["potential"]))
    assert model.sampler.step_size <= min(history.history["step_size_limit"])


def test_the_covariance_friction_starts_at_the_end_of_the_automatic_steps_window():
    """Inside the automatic step size's window CCAdL runs without its covariance friction and
    mCCAdL without its C step: two covariance estimates (CCAdL's diagonal and full, mCCAdL's
    average and minibatch) give the same chain through the window's last step, bit for bit, and
    part at its end, where the correction starts. With a given step size (no window) they part
    from the first step."""
    x, y = _data()
    window = 12
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()

    def weights_after(make_sampler, covariance, steps, step_size="auto"):
        sampler = make_sampler(step_size=step_size, covariance=covariance, warmup_steps=window)
        keras.utils.set_random_seed(0)
        model = kt.BayesianModel(testing.linear_regression_net(FEATURES), sampler, num_examples=ROWS,
                                 prior=kt.priors.Gaussian(PRIOR_STD), seed=0)
        model.compile(loss="mse", steps_per_execution=1)
        model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)
        return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])

    for make_sampler, variants in [(kt.samplers.CCAdL, ("diag", "full")), (kt.samplers.MCCAdL, ("diag", "minibatch"))]:
        def both(steps, **kwargs):
            return [weights_after(make_sampler, c, steps, **kwargs) for c in variants]

        np.testing.assert_array_equal(*both(window))          # steps 0 .. W-1
        assert not np.allclose(*both(window + 1), rtol=1e-5, atol=0)   # step W: the correction starts
        assert not np.allclose(*both(1, step_size=1e-3), rtol=1e-5, atol=0)


class _ChainCappedSGHMC(kt.samplers.SGHMC):
    """SGHMC with a cap `0.01 / U` from each chain's own potential: the hook of CCAdL's noise
    bound."""

    def step_size_cap(self, context, params, masses):
        return 0.01 / context.potential


def test_a_cap_held_at_the_end_of_the_window_is_the_smallest_over_every_chain():
    """Inside the window the cap leaves the measured step alone; where the step freezes it is the
    smallest of every chain's (the second chain's here, then the first's); after that the step
    stays frozen, cap or not."""
    sampler = _ChainCappedSGHMC()
    params = [tf.ones([3])]
    state = sampler.init(params, temperature=1.0, seed=0)
    window = sampler.adaptation_steps
    step_size, curvature = tf.Variable(float("nan")), tf.Variable(0.0)

    class Cross:  # one replica
        sum = staticmethod(lambda value: value)

    def step_at(step, potentials):
        at = state._replace(step=tf.constant(step, tf.int64))
        first, *others = [kt.samplers.base.StepContext(temperature=1.0, num_examples=10, batch_size=tf.constant(5.0),
                                                        potential=tf.constant(u), seed=0) for u in potentials]
        auto_step.choose_step_size(sampler, at, lambda theta: [-t for t in theta], params, first, Cross(),
                                   step_size_variable=step_size, curvature_variable=curvature,
                                   other_chains=[(at, params, other) for other in others])
        return float(step_size.numpy())

    measured = auto_step.STABILITY_FRACTION / 1.0  # the Hessian is the identity
    assert step_at(0, [1.0, 2.0]) == pytest.approx(measured, rel=1e-4)
    assert step_at(1, [1.0, 2.0]) == pytest.approx(measured, rel=1e-4)
    assert step_at(window, [1.0, 2.0]) == pytest.approx(0.005, rel=1e-6)
    assert step_at(window, [4.0, 2.0]) == pytest.approx(0.0025, rel=1e-6)
    assert step_at(window + 1, [100.0, 100.0]) == pytest.approx(0.0025, rel=1e-6)


def test_inside_the_window_ccadl_is_sgnht_step_for_step():
    """Under the automatic step size CCAdL's window is SGNHT's (no covariance friction, no noise
    cap), bit for bit, on minibatches noisy enough that the cap binds: at the window's end it
    lowers CCAdL's step below SGNHT's. CCAdL takes its per-example statistics by
    `per_example_method="vectorized"` here, so that its force comes from the same backward pass as
    SGNHT's (the layer engine sums the force's rows in another order: float32 rounding, which the
    window's curvature measurement amplifies by finite differences)."""
    x, y = _data()
    window = 12
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(2).repeat()

    def run(make_sampler, steps):
        keras.utils.set_random_seed(0)
        model = kt.BayesianModel(testing.linear_regression_net(FEATURES), make_sampler(warmup_steps=window),
                                 num_examples=1000, prior=kt.priors.Gaussian(PRIOR_STD), seed=0,
                                 per_example_method="vectorized")
        model.compile(loss="mse", steps_per_execution=1)
        model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)
        return np.concatenate([v.numpy().ravel() for v in model.trainable_variables]), model.sampler.step_size

    (ccadl, _), (sgnht, _) = run(kt.samplers.CCAdL, window), run(kt.samplers.SGNHT, window)
    np.testing.assert_array_equal(ccadl, sgnht)
    (_, ccadl_step), (_, sgnht_step) = run(kt.samplers.CCAdL, window + 1), run(kt.samplers.SGNHT, window + 1)
    assert ccadl_step < sgnht_step
