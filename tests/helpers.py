"""Small data sets and nets that several test modules share (no test module imports another)."""

import keras
import numpy as np

import keras_thermo as kt

NUM_EXAMPLES = 128  # of `regression_arrays()`


def regression_arrays():
    """`(x [128, 3], y [128, 1])` float32: a noisy linear target, the same on every call."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3 * rng.normal(size=(NUM_EXAMPLES, 1))).astype("float32")
    return x, y


def tanh_net(hidden=4, *, inputs=3, outputs=1, seed=1, **hidden_options):
    """The small regression net: `inputs` -> `hidden` tanh units -> `outputs` linear units, its
    initial weights drawn by Keras from `seed` (the same on every call); `hidden_options` go to
    the hidden `Dense` (e.g. a `kernel_regularizer`)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(hidden, activation="tanh", **hidden_options),
        keras.layers.Dense(outputs),
    ])


def regression_model(make_sampler, seed=11):
    """The 3-4-1 `tanh_net` for `regression_arrays()` in a `BayesianModel` with `make_sampler()`,
    compiled with mse and one step per execution (Keras 3 cannot run more under
    MirroredStrategy); the same initial weights on every call, the noise keyed by `seed`."""
    model = kt.BayesianModel(
        tanh_net(), make_sampler(), num_examples=NUM_EXAMPLES, prior=kt.priors.Gaussian(1.0), seed=seed
    )
    model.compile(loss="mse", steps_per_execution=1)
    return model


def assert_close_to_scale(actual, expected, rtol: float) -> None:
    """Equal shapes and every entry within `rtol * max |expected|` (a nonzero scale): the
    comparison of per-example statistics whose entries span many orders of magnitude."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    scale = np.max(np.abs(expected))
    assert scale > 0
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


class StepLogs(keras.callbacks.Callback):
    """Every step's logs (potential, temperature, thermostat...), to compare trajectories."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(dict(logs))

    def series(self, key):
        return np.array([entry[key] for entry in self.logs], dtype=np.float64)


def assert_mirrored_variables_match(single, distributed, *, rtol: float, atol: float) -> None:
    """A mirrored run's variables equal a single-device run's, to `rtol`/`atol`, except the
    largest curvature: a given step size is only checked against it, and under a strategy it is
    the sum of the replicas' shares' curvatures (`samplers.auto_step.choose_step_size`), the same
    quantity estimated from halves of the batch. Its factor-2 bound is a sanity bound on a
    different estimator, not a Monte Carlo tolerance (measured: 1.25)."""
    for a, b in zip(single.variables, distributed.variables):
        if a.path.endswith("/curvature"):
            continue
        np.testing.assert_allclose(np.asarray(b.numpy()), np.asarray(a.numpy()), rtol=rtol, atol=atol, err_msg=b.path)
    if single._curvature_variable is not None:  # a step-size schedule is not measured
        ratio = float(distributed._curvature_variable.numpy()) / float(single._curvature_variable.numpy())
        assert 0.5 < ratio < 2.0, ratio
