"""What a `tf.distribute.MirroredStrategy` run is fed: the order of shuffled epochs, and global
batches that must split evenly over the replicas.

Order: Keras draws a batch from a new iterator to build a model under a strategy (and
`BayesianModel` used to draw one to build its net); each new iterator over a reshuffled pipeline
draws the next order, so epoch e saw order e + 1 and a mirrored run left the single-device
chain. Both builds now read the dataset's element spec instead.

Uneven batches: each replica's potential is its slice's mean loss over r, so the replicas' sum is
the global mean only for equal slices; TensorFlow splits a global batch evenly exactly when r
divides it. `fit` refuses what it can see up front, the train step the rest.

`tests/conftest.py` splits the CPU into two logical devices before TensorFlow starts.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt

from helpers import tanh_net

N = 128
BATCH = 16
EPOCHS = 3
RTOL, ATOL = 1e-4, 1e-5  # as tests/test_distribute.py: a few ulp of summation order per step


def _strategy():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPU devices set up by tests/conftest.py")
    return tf.distribute.MirroredStrategy(devices)


def _arrays(n=N):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _model(strategy=None, n=N):
    scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
    with scope:
        model = kt.BayesianModel(
            tanh_net(), kt.samplers.SGHMC(3e-3, friction=2.0), num_examples=n, prior=kt.priors.Gaussian(1.0), seed=11
        )
        model.compile(loss="mse")
    return model


def _shuffled_dataset():
    # A fixed op seed: every process and every run draws the same sequence of orders.
    return tf.data.Dataset.from_tensor_slices(_arrays()).shuffle(N, seed=3, reshuffle_each_iteration=True).batch(BATCH)


def _weights(model):
    return [np.asarray(v.numpy()) for v in model.trainable_variables]


def _fit_dataset(model, dataset):
    model.fit(dataset, epochs=EPOCHS, verbose=0)
    return _weights(model)


def _fit_arrays(model):
    x, y = _arrays()
    keras.utils.set_random_seed(2)  # the seed of Keras' own shuffle of the arrays
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=True, verbose=0)
    return _weights(model)


def _assert_close(actual, expected):
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def _max_gap(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second))


def test_mirrored_run_sees_the_single_device_order_of_a_reshuffled_pipeline():
    single_model = _model()
    single = _fit_dataset(single_model, _shuffled_dataset())
    mirrored = _fit_dataset(_model(_strategy()), _shuffled_dataset())
    assert single_model.sampler_step == EPOCHS * N // BATCH
    _assert_close(mirrored, single)

    # Negative control: one order drawn before fit (what the extra iterator did) moves the chain
    # far outside the tolerance.
    shifted_dataset = _shuffled_dataset()
    next(iter(shifted_dataset))
    shifted = _fit_dataset(_model(), shifted_dataset)
    assert _max_gap(shifted, single) > 100 * ATOL


def _batch_sequence(bayesian, strategy=None):
    """The examples of each global batch a 3-epoch `fit` on the reshuffled pipeline trained on,
    one sorted array per step (replicas record their slices in no fixed order)."""
    seen = []

    class _Recorder(keras.layers.Layer):
        def call(self, inputs):
            tf.py_function(lambda v: seen.append(v.numpy()[:, 0].copy()), [inputs], [])
            return inputs

    replicas = 1 if strategy is None else strategy.num_replicas_in_sync
    with (strategy or tf.distribute.get_strategy()).scope():
        keras.utils.set_random_seed(1)
        net = keras.Sequential([keras.Input((3,)), _Recorder(), keras.layers.Dense(1)])
        if bayesian:
            # A constant schedule, not a float: a float step size is checked against the curvature
            # the step measures, whose forward passes on the step's batch the recorder would count.
            constant = keras.optimizers.schedules.ExponentialDecay(1e-5, decay_steps=1, decay_rate=1.0)
            model = kt.BayesianModel(net, kt.samplers.SGLD(constant), num_examples=N, seed=1)
            model.compile(loss="mse")
        else:
            model = net
            model.compile(loss="mse", optimizer="sgd")
    model.fit(_shuffled_dataset(), epochs=EPOCHS, verbose=0)
    assert len(seen) == replicas * EPOCHS * N // BATCH
    return np.stack([np.sort(np.concatenate(seen[i : i + replicas])) for i in range(0, len(seen), replicas)])


def test_every_run_trains_on_the_batches_of_a_plain_single_device_keras_fit():
    """The batch sequence itself: BayesianModel, on one device and mirrored, sees exactly the
    global batches of a plain Keras `fit` on one device. Plain Keras under the strategy (its
    symbolic build draws a batch from an extra iterator) sees the next order in every epoch:
    the shift this guards against, and the proof that the comparison can fail."""
    reference = _batch_sequence(bayesian=False)
    np.testing.assert_array_equal(_batch_sequence(bayesian=True), reference)
    np.testing.assert_array_equal(_batch_sequence(bayesian=True, strategy=_strategy()), reference)
    shifted = _batch_sequence(bayesian=False, strategy=_strategy())
    steps_per_epoch = N // BATCH
    for epoch in range(EPOCHS):
        epoch_steps = slice(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        assert not np.array_equal(shifted[epoch_steps], reference[epoch_steps])


def test_mirrored_run_sees_the_single_device_order_of_shuffled_arrays():
    single = _fit_arrays(_model())
    mirrored = _fit_arrays(_model(_strategy()))
    _assert_close(mirrored, single)


@pytest.mark.parametrize(
    "batch_size, num_examples, message",
    [
        (15, 120, "batch_size=15"),
        (16, 117, "last batch of each epoch would hold 5 examples"),
        (None, 101, "would hold 5 examples"),  # Keras' default batch of 32
    ],
)
def test_fit_refuses_array_batches_that_do_not_split_evenly(batch_size, num_examples, message):
    model = _model(_strategy(), n=num_examples)
    x, y = _arrays(num_examples)
    with pytest.raises(ValueError, match=message) as error:
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    assert "multiple of the 2 replicas" in str(error.value)
    assert model.sampler_step == 0


def test_fit_refuses_a_pipeline_with_an_odd_static_batch():
    model = _model(_strategy())
    dataset = tf.data.Dataset.from_tensor_slices(_arrays()).batch(15, drop_remainder=True)
    with pytest.raises(ValueError, match="batches hold 15 examples.*multiple of the 2 replicas"):
        model.fit(dataset, epochs=1, verbose=0)


def test_a_last_partial_batch_that_cannot_split_fails_the_step_and_moves_nothing():
    n = 117  # 7 batches of 16, then 5 examples: 3 + 2 on two replicas
    model = _model(_strategy(), n=n)
    dataset = tf.data.Dataset.from_tensor_slices(_arrays(n)).batch(BATCH)  # static batch size None
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"global batch of\] \[5\]"):
        model.fit(dataset, epochs=1, verbose=0)
    assert model.sampler_step == n // BATCH  # the full batches were taken, the odd one was not


def test_even_partial_batches_are_accepted():
    """The negative control of the checks: a last batch of 8 (4 + 4) is fine, in arrays and in
    a pipeline, and the run matches one device."""
    n = 120
    x, y = _arrays(n)
    mirrored = _model(_strategy(), n=n)
    # Keras' own epochs (with_replacement=False): the last batch of 120 at 16 is partial.
    mirrored.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, with_replacement=False)
    single = _model(n=n)
    single.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, with_replacement=False)
    assert mirrored.sampler_step == single.sampler_step == 8
    _assert_close(_weights(mirrored), _weights(single))
    _model(_strategy(), n=n).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=1, verbose=0)
