"""Several chains in one `fit` (`BayesianModel(num_chains=C)`): independence, equivalence with
one-chain runs, pooled statistics, R-hat, resume, logs, recording and distribution.

Every `fit` here compiles a train step of C chains (one to a few seconds on 2 CPU cores), so
the default suite keeps what carries the design: distinct starts and seeds, the equivalence of a
chain with the one-chain run (SGNHT, loop), the two-well R-hat check, bit-exact resume and the
argument checks. Every other sampler and path, the recording callbacks, the logs, the
distributed run and the statistical check on the linear-regression posterior are marked slow.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import testing as kt_testing
from keras_thermo.random import chain_seed

from helpers import tanh_net

N = 64
C = 4


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = (x @ rng.normal(size=(3, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _model(sampler=None, num_chains=C, seed=3, net=None, **kwargs):
    model = kt.BayesianModel(
        net or tanh_net(), sampler or kt.samplers.SGNHT(1e-2), num_examples=N, prior=kt.priors.Gaussian(1.0),
        seed=seed, num_chains=num_chains, **kwargs,
    )
    model.compile(loss="mse")
    model.build((None, 3))
    return model


def _batches(x, y, batch_size):
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size)


SAMPLERS = {
    "sgnht": lambda: kt.samplers.SGNHT(1e-2),
    "sgld": lambda: kt.samplers.SGLD(1e-3),
    "mccadl": lambda: kt.samplers.MCCAdL(1e-3),
    "ccadl": lambda: kt.samplers.CCAdL(1e-3),
    "tact_hmc": lambda: kt.samplers.TACTHMC(1e-4, sample_every=2),
}


# --- independence and equivalence with one-chain runs -------------------------------------------


def test_chains_start_apart_with_their_own_momenta_and_seeds_matter():
    model = _model()
    starts = [model.chain_weights(k) for k in range(C)]
    np.testing.assert_array_equal(starts[0][0], model.net.layers[0].kernel.numpy())  # chain 0: the net's
    for k in range(1, C):
        assert not np.allclose(starts[k][0], starts[0][0])  # kernels redrawn
        np.testing.assert_array_equal(starts[k][1], 0.0)  # biases: the zeros initializer, redrawn
    state = model.sampler_state()  # each chain's momentum from its own seed
    assert len({float(state.momentum[0][k, 0, 0]) for k in range(C)}) == C
    other = _model(seed=4)
    assert other.chain_seeds != model.chain_seeds and other.chain_seeds[0] == 4
    assert not np.allclose(other.chain_weights(1)[0], starts[1][0])  # other seeds, other starts


def _single_chain_like(model, chain, make_sampler):
    """The one-chain model with chain `chain`'s seed and start."""
    single = _model(make_sampler(), num_chains=1, seed=chain_seed(model.seed, chain))
    single.set_chain_weights(0, model.chain_weights(chain))
    return single


_SLOW = pytest.mark.slow  # the default suite runs the first case of each parametrized test


@pytest.mark.parametrize(
    "name, method",
    [("sgnht", "loop"), ("ccadl", "loop"), *[pytest.param(n, m, marks=_SLOW) for n, m in
                                             [("sgnht", "vectorized"), ("mccadl", "loop"),
                                              ("tact_hmc", "loop"), ("tact_hmc", "vectorized")]]],
)
def test_each_chain_of_a_shared_batch_run_is_the_one_chain_run_with_its_seed_and_start(name, method):
    x, y = _data()
    model = _model(SAMPLERS[name](), chain_method=method, chain_minibatches="shared")
    starts = [model.chain_weights(k) for k in range(C)]
    model.fit(_batches(x, y, 8), steps_per_epoch=12, epochs=1, verbose=0)
    for k in (0, 2):
        single = _model(SAMPLERS[name](), num_chains=1, seed=chain_seed(model.seed, k))
        single.set_chain_weights(0, starts[k])
        single.fit(_batches(x, y, 8), steps_per_epoch=12, epochs=1, verbose=0)
        for a, b in zip(model.chain_weights(k), single.chain_weights(0)):
            if method == "loop" and name != "mccadl":
                np.testing.assert_array_equal(a, b)  # the same operations on the same values
            else:
                # Batched or reordered float32 products: a few ulp per step, carried over 12 steps.
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # ... and the comparison can fail: another chain's run is far away.
    assert not np.allclose(model.chain_weights(1)[0], single.chain_weights(0)[0], atol=1e-3)


@pytest.mark.slow
def test_split_batches_give_each_chain_its_own_part():
    x, y = _data()
    model = _model(chain_minibatches="split")
    starts = [model.chain_weights(k) for k in range(C)]
    model.fit(_batches(x, y, 4 * C), steps_per_epoch=6, epochs=1, verbose=0)
    for k in (0, 3):
        # Chain k sees rows [4k, 4k + 4) of every batch of 16.
        parts = _batches(x, y, 4 * C).map(lambda a, b, k=k: (a[4 * k:4 * k + 4], b[4 * k:4 * k + 4]))
        single = _model(num_chains=1, seed=chain_seed(model.seed, k))
        single.set_chain_weights(0, starts[k])
        single.fit(parts, steps_per_epoch=6, epochs=1, verbose=0)
        for a, b in zip(model.chain_weights(k), single.chain_weights(0)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_batch_that_does_not_split_over_the_chains_stops_fit_and_moves_nothing(jit_compile):
    x, y = _data()
    model = _model(num_chains=2)
    model.compile(loss="mse", jit_compile=jit_compile)
    with pytest.raises(ValueError, match="batch_size` is 5 examples.*num_chains=2"):  # known up front
        model.fit(x, y, batch_size=5, shuffle=False, epochs=1, verbose=0)
    # A pipeline whose last batch is partial (unknown batch size up front): 63 = 7 * 8 + 7.
    with pytest.raises(ValueError, match="a batch of 7 examples came.*num_chains=2"):
        model.fit(tf.data.Dataset.from_tensor_slices((x[:63], y[:63])).batch(8), epochs=1, verbose=0)
    assert model.sampler_step == 7  # the seven even batches applied, the odd one not


@pytest.mark.slow
def test_split_on_arrays_draws_batch_size_examples_per_chain():
    x, y = _data()
    model = _model(chain_minibatches="split")
    seen = []

    class Sizes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Sizes()])
    assert len(seen) == N // 8  # Keras' epoch length is kept
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_sampler_runs_several_chains(name):
    x, y = _data()
    model = _model(SAMPLERS[name]())
    collector = kt.callbacks.SampleCollector()
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[collector])
    assert model.sampler_step == N // 8
    assert collector.samples.shape[0] == C and collector.samples.shape[2] == model.num_params
    # The temperature check's verdict and means are NaN while it has too few blocks (one short
    # epoch here): "undetermined", not a failed step.
    undetermined = {"equilibrated", "mean_kinetic_temperature", "mean_configurational_temperature"}
    assert np.isnan(history.history["equilibrated"][-1])
    assert all(np.isfinite(v[-1]) for k, v in history.history.items() if k not in undetermined)


# --- logs ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_logs_are_chain_means_with_per_chain_temperatures_and_xi_kept_off_the_progress_bar(capsys):
    x, y = _data()
    model = _model()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=1)
    logs = history.history
    for name in ("kinetic_temperature", "configurational_temperature", "xi"):
        per_chain = np.array([logs[f"{name}_chain_{k}"] for k in range(C)])
        np.testing.assert_allclose(logs[name], per_chain.mean(axis=0), rtol=1e-5)
    assert "potential_chain_0" not in logs
    printed = capsys.readouterr().out
    assert "kinetic_temperature:" in printed and "_chain_" not in printed


@pytest.mark.slow
def test_many_chains_log_only_means():
    model = _model(num_chains=kt.chains.MAX_LOGGED_CHAINS + 1)
    x, y = _data()
    history = model.fit(x, y, batch_size=8 * (kt.chains.MAX_LOGGED_CHAINS + 1), epochs=1, verbose=0)
    assert "xi" in history.history and not any("_chain_" in name for name in history.history)


@pytest.mark.slow
def test_predict_and_evaluate_use_chain_zero():
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    chain0 = keras.models.clone_model(model.net)
    chain0.set_weights(model.chain_weights(0))
    expected = chain0(x).numpy()
    # float32 rounding of two batchings of the same product, relative to the outputs' scale.
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, rtol=1e-6, atol=1e-6 * np.max(np.abs(expected)))
    chain1 = keras.models.clone_model(model.net)
    chain1.set_weights(model.chain_weights(1))
    assert not np.allclose(model.predict(x, verbose=0), chain1(x).numpy(), atol=1e-3)


# --- recording callbacks ------------------------------------------------------------------------


class _EveryStepChains(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append(np.stack([np.concatenate([w.ravel() for w in self.model.chain_weights(k)]) for k in range(C)]))


@pytest.mark.slow
def test_sample_collector_keeps_every_chain_exactly_and_posterior_average_pools_them():
    x, y = _data()
    reference = _model()
    every = _EveryStepChains()
    reference.fit(_batches(x, y, 8), steps_per_epoch=12, epochs=1, verbose=0, callbacks=[every])

    model = _model()
    model.compile(loss="mse", steps_per_execution=4)
    collector = kt.callbacks.SampleCollector(burn_in_steps=2, every_n_steps=3)
    labels = (y[:, 0] > 0).astype("int32")
    average = kt.callbacks.PosteriorAverage((x, labels), burn_in_steps=2, every_n_steps=3, outputs="logits")
    model.fit(_batches(x, y, 8), steps_per_epoch=12, epochs=1, verbose=0, callbacks=[collector, average])
    np.testing.assert_array_equal(collector.steps, [5, 8, 11])
    expected = np.stack([every.rows[s - 1] for s in collector.steps], axis=1)  # [C, S, Nd]
    np.testing.assert_array_equal(collector.samples, expected)
    assert average.num_samples == C * 3
    # The pooled average is the one predict_posterior computes from the collected chains.
    pooled = kt.predict_posterior(model, collector.samples, x, verbose=0)
    np.testing.assert_allclose(average.predictions, pooled, rtol=1e-6)
    per_chain = average.chain_results()
    assert len(per_chain) == C and all(r["num_samples"] == 3 for r in per_chain)
    own = kt.evaluate_posterior(model, collector.samples[2], (x, labels), verbose=0)
    assert per_chain[2]["nll"] == pytest.approx(own["nll"], rel=1e-6)


@pytest.mark.slow
def test_equilibration_check_pools_the_chains_temperatures():
    x, y = _data()
    model = _model(kt.samplers.SGNHT(1e-2, warmup_steps=0))  # the check counts no block of a warm-up
    check = kt.callbacks.EquilibrationCheck(burn_in_steps=0, block_steps=4, min_blocks=2, warn=False)
    history = model.fit(_batches(x, y, 8), steps_per_epoch=16, epochs=1, verbose=0, callbacks=[check])
    report = check.report()
    assert report["num_blocks"] == 4
    # Pooled: the kinetic mean over steps and chains is the mean of the logged chain means.
    kinetic = report["overall"]["kinetic"]["mean"]
    assert np.isfinite(kinetic) and np.isfinite(history.history["mean_kinetic_temperature"][0])


# --- R-hat ---------------------------------------------------------------------------------------


class DoubleWell(kt.priors.Prior):
    """`U(theta) = height * (theta^2 - 1)^2` per scalar: wells at +-1 and a barrier `height`
    (in units of T) between them."""

    def __init__(self, height):
        self.height = height

    def __call__(self, variables):
        return tf.add_n([self.height * tf.reduce_sum(tf.square(tf.square(v) - 1.0)) for v in variables])


def _one_weight_chains(prior, starts, step_size, steps=3000, burn_in=500):
    """C chains of one scalar weight under `prior` alone (the data carry no information)."""
    net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model = kt.BayesianModel(net, kt.samplers.SGHMC(step_size, friction=1.0), num_examples=8, prior=prior, seed=0,
                             num_chains=len(starts))
    model.compile(loss="mse", steps_per_execution=100)
    model.build((None, 1))
    for k, start in enumerate(starts):
        model.set_chain_weights(k, [np.full((1, 1), start, "float32")])
    collector = kt.callbacks.SampleCollector(burn_in, max_samples=steps)
    zeros = np.zeros((8, 1), "float32")
    model.fit(zeros, zeros, batch_size=8, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[collector])
    return collector.samples


def test_rhat_is_about_one_for_one_posterior_and_far_above_for_chains_stuck_in_two_wells():
    starts = [-1.0, -1.0, 1.0, 1.0]
    # A barrier of 1 T: the chains cross it often and sample one posterior. R-hat - 1 is of
    # order 1 / ESS (here ESS ~ 170 over the chains; R-hat 1.01), far below the 0.1 of the check.
    mixing = _one_weight_chains(DoubleWell(1.0), starts, step_size=0.1)
    mixed_rhat = kt.diagnostics.summary(mixing)["parameters"]["rhat"]["worst"]
    # A barrier of 30 T: crossings have probability ~e^-30; each chain stays in its start's well
    # (a smaller step: the wells' curvature is 30 times larger).
    stuck = _one_weight_chains(DoubleWell(30.0), starts, step_size=0.05)
    assert np.all(np.sign(stuck[:, :, 0]) == np.array(starts)[:, None])
    stuck_rhat = kt.diagnostics.summary(stuck)["parameters"]["rhat"]["worst"]
    print(f"R-hat: mixing chains {mixed_rhat:.4f}, chains stuck in two wells {stuck_rhat:.1f}")
    assert mixed_rhat < 1.1
    assert stuck_rhat > 1.1


@pytest.mark.slow  # ~1 min; the default suite checks equivalence with one-chain runs instead
def test_pooled_chains_pass_the_linear_regression_check_and_a_wrong_temperature_fails():
    # tests/test_statistical.py's isotropic-noise SGNHT regime (N = 500, batch 100, random-sign
    # features), as 8 chains of one model with split batches: each chain draws its own 100
    # examples per step, so the chains are independent, as the check assumes. As there, the
    # chains start at the posterior mean (0): from the net's random starts this light thermostat
    # is still far from equilibrium after the 600 burn-in steps (xi ~ 20, configurational
    # temperature ~ 2), one chain or eight alike.
    x, y = kt_testing.linear_regression_data(500, 2, weight_scale=0.0, binary_features=True, seed=0)
    mean, covariance = kt_testing.linear_regression_posterior(x, y, prior_std=1.0)
    results = {}
    for temperature in (1.0, 2.0):
        model = kt.BayesianModel(
            kt_testing.linear_regression_net(2), kt.samplers.SGNHT(2e-3, friction=5.0, thermal_mass=0.3),
            num_examples=len(x), prior=kt.priors.Gaussian(1.0), temperature=temperature, seed=0, num_chains=8,
        )
        model.compile(loss="mse", steps_per_execution=100)
        model.build((None, 2))
        for k in range(8):
            model.set_chain_weights(k, [np.zeros((2, 1), "float32"), np.zeros(1, "float32")])
        collector = kt.callbacks.SampleCollector(burn_in_steps=600, every_n_steps=5, max_samples=1000)
        model.fit(x, y, batch_size=100, steps_per_epoch=3000, epochs=1, verbose=0, callbacks=[collector])
        results[temperature] = kt_testing.compare_with_gaussian(collector.samples, mean, covariance, alpha=0.01)
        print(temperature, results[temperature].summary())
    assert results[1.0].passed, results[1.0].summary()
    assert not results[2.0].passed  # twice the temperature: variances about +100%
    np.testing.assert_array_less(0.5, results[2.0].relative_variance_error)


# --- state, saving, configuration -----------------------------------------------------------------


# Both slow (~8-20 s each): chain variables are ordinary model variables, and the default suite's
# resume tests (test_model.py) cover their save/load path with one chain.
@pytest.mark.parametrize("name", [pytest.param("sgnht", marks=_SLOW), pytest.param("mccadl", marks=_SLOW)])
def test_save_load_and_resume_is_bit_exact_with_four_chains(name, tmp_path):
    x, y = _data()
    straight = _model(SAMPLERS[name]())
    straight.fit(_batches(x, y, 8), steps_per_epoch=16, epochs=1, verbose=0)
    first = _model(SAMPLERS[name]())
    first.fit(_batches(x, y, 8), steps_per_epoch=8, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    first.save(path)
    restored = keras.saving.load_model(path)
    assert restored.num_chains == C and restored.sampler_step == 8
    restored.fit(_batches(x, y, 8), steps_per_epoch=8, epochs=1, verbose=0)
    for u, v in zip(straight.weights, restored.weights):
        np.testing.assert_array_equal(u.numpy(), v.numpy())
    for k in range(C):
        for u, v in zip(straight.chain_weights(k), restored.chain_weights(k)):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", ["ccadl", "mccadl"])
def test_vectorized_chains_are_refused_for_samplers_with_per_example_statistics(name):
    with pytest.raises(ValueError, match="chain_method.*'vectorized'.*per-example"):
        _model(SAMPLERS[name](), chain_method="vectorized")


def test_state_has_a_chain_axis_and_one_step_counter():
    model = _model(kt.samplers.SGNHT(1e-2))
    state = model.sampler_state()
    # One thermostat per trainable tensor (the default) per chain; the papers' one per chain.
    assert state.step.shape == () and state.xi.shape == (C, 4)
    assert _model(kt.samplers.SGNHT(1e-2, per_variable_thermostat=False)).sampler_state().xi.shape == (C,)
    assert [tuple(m.shape) for m in state.momentum] == [(C, 3, 4), (C, 4), (C, 4, 1), (C, 1)]


def test_get_config_round_trip_with_chains():
    model = _model(num_chains=3, chain_method="vectorized", chain_minibatches="shared")
    config = model.get_config()
    clone = kt.BayesianModel.from_config(config)
    assert clone.get_config() == config
    assert (clone.num_chains, clone.chain_method, clone.chain_minibatches) == (3, "vectorized", "shared")


def test_chain_weights_arguments_are_checked():
    model = _model()
    with pytest.raises(ValueError, match=r"`chain` must be in \[0, 4\), got 4"):
        model.chain_weights(4)
    with pytest.raises(ValueError, match="one array per trainable variable"):
        model.set_chain_weights(1, [np.zeros((3, 4))])


def test_one_chain_model_has_no_chain_variables():
    model = _model(num_chains=1)
    assert model._chain_variables == [] and model.sampler_state().xi.shape == (4,)


# --- tf.distribute --------------------------------------------------------------------------------


@pytest.mark.slow
def test_chains_under_a_mirrored_strategy_match_one_device():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPU devices set up by tests/conftest.py")
    x, y = _data()
    single = _model(chain_minibatches="split")
    single.fit(_batches(x, y, 16), steps_per_epoch=8, epochs=1, verbose=0)
    with tf.distribute.MirroredStrategy(devices).scope():
        model = _model(chain_minibatches="split")
    model.fit(_batches(x, y, 16), steps_per_epoch=8, epochs=1, verbose=0)
    # Split: replica r holds rows [8r, 8r + 8) of each batch and cuts its own rows into C parts,
    # so chain k sees other examples than on one device (rows [4k, 4k + 4)); the runs differ.
    # With shared batches every chain sees the global batch, as on one device: the runs agree.
    shared_single = _model(chain_minibatches="shared")
    shared_single.fit(_batches(x, y, 16), steps_per_epoch=8, epochs=1, verbose=0)
    with tf.distribute.MirroredStrategy(devices).scope():
        shared = _model(chain_minibatches="shared")
    shared.fit(_batches(x, y, 16), steps_per_epoch=8, epochs=1, verbose=0)
    for k in range(C):
        assert all(np.all(np.isfinite(w)) for w in model.chain_weights(k))
        for a, b in zip(shared.chain_weights(k), shared_single.chain_weights(k)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # float32 sum order, as test_distribute
