"""Every sampler under `tf.distribute.MirroredStrategy` on two logical CPU devices.

A run with global batch B on two replicas (B/2 examples each) must equal the single-device run
with batch B and the same seed: the force and potential are all-reduced sums, the per-example
statistics are those of the global batch, and the noise is keyed by (seed, step). The two runs
differ only in the order of float32 sums (a batch mean over B versus two means over B/2 and an
all-reduce), a relative difference of a few ulp (~1e-7) per step; over the 200 steps below the
chains carry it to ~1e-6 (mCCAdL, CCAdL) to ~7e-6 (SGHMC) in the weights, which are O(1), and
~1e-5 in TACT-HMC's ABF table, whose entries reach tens; so variables and per-step logs are
compared with `rtol = 1e-4, atol = 1e-5`. A run with another seed is ~1e-2 away (checked), so the comparison
can fail. Replicas must hold bit-identical copies of every variable after every execution: they
apply the same operations to the same reduced inputs.

`tests/conftest.py` splits the CPU into two logical devices before TensorFlow starts.
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo.callbacks import TACTHistograms

from helpers import NUM_EXAMPLES, StepLogs, assert_mirrored_variables_match, regression_arrays, regression_model

GLOBAL_BATCH = 16
STEPS = 200  # one epoch over the data repeated: a new epoch costs a distributed iterator
STEPS_PER_EXECUTION = 1  # Keras 3 cannot run steps_per_execution > 1 under MirroredStrategy
RTOL, ATOL = 1e-4, 1e-5

SAMPLER_CONFIGS = {
    "sgld": lambda: kt.samplers.SGLD(kt.schedules.PolynomialDecay(1e-4, 1.0, 0.55)),
    "sghmc": lambda: kt.samplers.SGHMC(3e-3, friction=2.0),
    "sgnht": lambda: kt.samplers.SGNHT(3e-3),
    "sgnht-symmetric": lambda: kt.samplers.SGNHT(3e-3, integrator="symmetric"),
    "ccadl-diag": lambda: kt.samplers.CCAdL(1e-3, covariance="diag"),
    "ccadl-full": lambda: kt.samplers.CCAdL(1e-3, covariance="full"),
    "mccadl-taylor": lambda: kt.samplers.MCCAdL(3e-3, covariance="minibatch", expm="taylor"),
    "mccadl-gram": lambda: kt.samplers.MCCAdL(3e-3, covariance="minibatch", expm="gram"),
    "mccadl-diag": lambda: kt.samplers.MCCAdL(3e-3),  # the default, the moving average
    # xi moves slowly and its plateau is narrow. Off the plateau, while the ABF table is still
    # learning, xi runs down a concave potential of mean force that multiplies a difference in
    # xi ~3x every two steps at the default xi_step_size: 200 steps then carried the two runs'
    # rounding past the tolerance on seeds 11-13 of either noise stream, from step 36 on.
    # At xi_step_size 1e-5 the runs stay within 0.15 of the tolerance, and with xi0 = 0.05 xi
    # still leaves the plateau, so the ABF table's cross-replica sums are compared (asserted).
    "tact-hmc": lambda: kt.samplers.TACTHMC(1e-3, xi_step_size=1e-5, xi0=0.05, sample_every=2, num_bins=10),
}


def _strategy():
    # A new strategy for every test, as a user re-running a cell would create: strategies
    # created one after another number their collectives from the same keys, and BayesianModel
    # gives each one keys of its own (tests/test_distribute_strategies.py).
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPU devices set up by tests/conftest.py")
    return tf.distribute.MirroredStrategy(devices)


class _ReplicasAgree(keras.callbacks.Callback):
    """Every `every` steps, each variable's replica copies must be bit-identical."""

    def __init__(self, strategy, every=10):
        super().__init__()
        self.strategy = strategy
        self.every = every
        self.checks = 0

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every:
            return
        for variable in self.model.variables:
            copies = self.strategy.experimental_local_results(getattr(variable, "value", variable))
            for copy in copies[1:]:
                np.testing.assert_array_equal(
                    copy.numpy(), copies[0].numpy(), err_msg=f"replicas differ in {variable.path}"
                )
        self.checks += 1


def _dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat(
        STEPS * GLOBAL_BATCH // NUM_EXAMPLES
    )


def _fit(model, callbacks=()):
    steps = StepLogs()
    model.fit(_dataset(*regression_arrays()), epochs=1, verbose=0, callbacks=[steps, *callbacks])
    return steps


def _distributed_model(strategy, make_sampler, seed=11):
    with strategy.scope():
        return regression_model(make_sampler, seed)


# Default-suite time: these four cover every kind of cross-replica sum (thermostat, covariance
# diagonal, the C step's Gram products, the ABF table); the rest run with `-m slow`.
MIRRORED_DEFAULT = {"sgnht-symmetric", "ccadl-diag", "mccadl-gram", "tact-hmc"}


@pytest.mark.parametrize(
    "name",
    [n if n in MIRRORED_DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in sorted(SAMPLER_CONFIGS)],
)
def test_mirrored_run_equals_single_device_run(name):
    strategy = _strategy()
    make_sampler = SAMPLER_CONFIGS[name]
    single = regression_model(make_sampler)
    single_history = _fit(single)

    distributed = _distributed_model(strategy, make_sampler)
    agree = _ReplicasAgree(strategy)
    distributed_history = _fit(distributed, [agree])

    assert agree.checks == STEPS // agree.every
    assert distributed.sampler_step == single.sampler_step == STEPS
    assert_mirrored_variables_match(single, distributed, rtol=RTOL, atol=ATOL)
    if name == "tact-hmc":  # xi spent steps off its plateau, so the ABF table's comparison is not of zeros
        assert np.sum(np.abs(single_history.series("xi")) > single.sampler.xi0) >= 10
        assert np.any(single.sampler_state().abf_mean_force.numpy() != 0)
    assert set(distributed_history.logs[0]) == set(single_history.logs[0])
    for key in single_history.logs[0]:
        if key in ("output_spread", "curvature"):  # each replica's share has its own range; above
            continue
        expected = np.asarray(single_history.series(key))
        # -theta.F/Nd is a sum of terms that cancel (it crosses zero while its terms reach
        # |theta.F|/Nd ~ max|value|): its summation-order error scales with the terms.
        atol = RTOL * np.max(np.abs(expected)) if key == "configurational_temperature" else ATOL
        np.testing.assert_allclose(
            distributed_history.series(key), expected, rtol=RTOL, atol=atol, err_msg=key,
        )


def test_another_seed_is_far_outside_the_tolerance():
    """The negative control of the comparison above: a different noise seed moves the chain."""
    make_sampler = SAMPLER_CONFIGS["sghmc"]
    first, second = regression_model(make_sampler, seed=11), regression_model(make_sampler, seed=12)
    _fit(first)
    _fit(second)
    gaps = [np.max(np.abs(a.numpy() - b.numpy())) for a, b in zip(first.trainable_variables, second.trainable_variables)]
    assert max(gaps) > 100 * ATOL


def test_recording_callbacks_match_single_device():
    strategy = _strategy()
    make_sampler = SAMPLER_CONFIGS["sghmc"]
    x, y = regression_arrays()
    labels = (y[:, 0] > 0).astype("int32")

    def run(model):
        # A classifier head on the same features, so PosteriorAverage has labels to score.
        collector = kt.callbacks.SampleCollector(burn_in_steps=40, every_n_steps=10)
        average = kt.callbacks.PosteriorAverage((x[:32], labels[:32]), burn_in_steps=40, every_n_steps=10)
        model.fit(_dataset(x, labels), epochs=1, verbose=0, callbacks=[collector, average])
        return collector, average

    def classifier():
        keras.utils.set_random_seed(1)
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model = kt.BayesianModel(
            net, make_sampler(), num_examples=NUM_EXAMPLES, prior=kt.priors.Gaussian(1.0), seed=5
        )
        model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=STEPS_PER_EXECUTION,
        )
        return model

    single_collector, single_average = run(classifier())
    with strategy.scope():
        distributed_model = classifier()
    collector, average = run(distributed_model)

    expected_steps = np.arange(50, STEPS + 1, 10)
    np.testing.assert_array_equal(single_collector.steps, expected_steps)
    np.testing.assert_array_equal(collector.steps, expected_steps)
    np.testing.assert_allclose(collector.samples, single_collector.samples, rtol=RTOL, atol=ATOL)
    assert average.num_samples == single_average.num_samples == len(expected_steps)
    np.testing.assert_allclose(average.predictions, single_average.predictions, rtol=RTOL, atol=ATOL)


def test_divergence_under_a_strategy_keeps_the_last_finite_state():
    strategy = _strategy()
    x, y = regression_arrays()
    with strategy.scope():
        model = regression_model(lambda: kt.samplers.SGHMC(1.0, friction=0.1))
    with pytest.raises(kt.SamplerDivergedError):
        model.fit(_dataset(100 * x, 100 * y), epochs=1, verbose=0)
    for variable in model.variables:
        for copy in strategy.experimental_local_results(getattr(variable, "value", variable)):
            if copy.dtype.is_floating:
                assert np.all(np.isfinite(copy.numpy())), variable.path


def _events(log_dir):
    """{tag: (step, value)} of the last event of each tag under `log_dir`."""
    written = {}
    for path in glob.glob(os.path.join(str(log_dir), "**", "events.out.tfevents.*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                written[value.tag] = (event.step, tf.make_ndarray(value.tensor))
    return written


def test_tensorboard_diagnostics_and_tact_histograms_match_single_device(tmp_path):
    strategy = _strategy()
    make_sampler = SAMPLER_CONFIGS["tact-hmc"]

    def run(model, log_dir):
        callbacks = [
            keras.callbacks.TensorBoard(str(log_dir), update_freq=50),
            TACTHistograms(str(log_dir / "histograms"), update_freq="epoch"),
        ]
        _fit(model, callbacks)
        return _events(log_dir)

    single = run(regression_model(make_sampler), tmp_path / "single")
    distributed = run(_distributed_model(strategy, make_sampler), tmp_path / "distributed")

    for tag in ("batch_xi", "batch_effective_temperature", "batch_potential", "tact_hmc/abf_mean_force", "tact_hmc/xi"):
        assert tag in single, sorted(single)
        assert distributed[tag][0] == single[tag][0], tag
        np.testing.assert_allclose(distributed[tag][1], single[tag][1], rtol=RTOL, atol=ATOL, err_msg=tag)
