"""One thermostat per trainable tensor (`per_variable_thermostat=True`, the default) for SGNHT,
CCAdL and mCCAdL, against the papers' single one (`False`).

The statistical check is a linear regression whose gradient noise is constant and isotropic
inside each tensor but four times stronger in the kernel than in the bias: one random-sign
feature scaled by 2 (`x_i^2 = 4`), 16 outputs of pure noise (a posterior at the origin) and a
summed squared error, so the per-example gradients `-2 r_io [x_i, 1]` have variance `16 r^2` per
kernel scalar and `4 r^2` per bias scalar. Kernel and bias have 16 scalars each. The papers'
single xi holds the net's mean kinetic temperature at T with the kernel hot and the bias cold
(`xi = A + (h/2) * noise variance` per coordinate predicts 1.43 T and 0.57 T at these settings);
one xi per tensor absorbs each tensor's own noise. The verdict is the library's
`EquilibrationCheck` judging each tensor's kinetic and configurational temperatures (the latter a
function of the positions alone) against T with batch-means bands; the shared thermostat on the
same problem is the case that fails.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import data as kt_data
from keras_thermo import testing
from keras_thermo.equilibration import EquilibrationCheck
from keras_thermo.samplers import integrators

NUM_EXAMPLES = 500
OUTPUTS = 16
# h = 2e-3, n = 100: the force noise per bias scalar is (N^2 / n) 4 * 0.49 = 4900, raising its
# xi by (h/2) 4900 = 4.9 above A = 5, the kernel's by 19.6; the Euler bias h xi / 2 stays
# below 2.5%. Thermal mass Nd / 10, so that xi settles within the warm-up.
STEP_SIZE = 2e-3
FRICTION = 5.0
THERMAL_MASS = 3.2
NUM_STEPS = 4_000

SAMPLERS = {
    "sgnht": kt.samplers.SGNHT,
    "ccadl": kt.samplers.CCAdL,
    "mccadl": kt.samplers.MCCAdL,
}


def _summed_squared_error(target, prediction):
    return keras.ops.sum(keras.ops.square(target - prediction), axis=-1)


def _run(name, per_variable, seed=3):
    rng = np.random.default_rng(0)
    x = (2.0 * rng.choice([-1.0, 1.0], size=(NUM_EXAMPLES, 1))).astype(np.float32)
    y = (0.7 * rng.normal(size=(NUM_EXAMPLES, OUTPUTS))).astype(np.float32)
    net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(OUTPUTS, kernel_initializer="zeros")])
    sampler = SAMPLERS[name](
        STEP_SIZE, friction=FRICTION, thermal_mass=THERMAL_MASS, per_variable_thermostat=per_variable
    )
    model = kt.BayesianModel(
        net, sampler, num_examples=NUM_EXAMPLES, prior=kt.priors.Gaussian(1.0), seed=seed, temperature_check=False
    )
    model.compile(loss=_summed_squared_error, steps_per_execution=100)
    check = EquilibrationCheck(block_steps=100, min_blocks=10, min_variable_size=1, warn=False)
    data = kt_data.random_minibatches(x, y, 100, seed=seed)
    model.fit(data, steps_per_epoch=NUM_STEPS, epochs=1, verbose=0, callbacks=[check])
    return check.report()


def _temperatures(report):
    return {v["name"].split("/")[-1]: (v["kinetic"], v["configurational"]) for v in report["variables"]}


# SGNHT, whose thermostat is all it has against gradient noise, in the default suite; CCAdL and
# mCCAdL (whose covariance friction removes most of that noise first) in the slow one.
@pytest.mark.parametrize("name", [n if n == "sgnht" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(SAMPLERS)])
def test_one_thermostat_per_tensor_holds_every_tensor_at_temperature(name):
    report = _run(name, per_variable=True)
    assert report["equilibrated"] is True, report
    for kinetic, configurational in _temperatures(report).values():
        assert kinetic["in_band"] is True and configurational["in_band"] is True, report


def test_the_shared_thermostat_leaves_the_noisier_tensor_hot_and_the_other_cold():
    """The papers' single xi on the same problem (module doc): out of band, in the predicted direction."""
    report = _run("sgnht", per_variable=False)
    assert report["equilibrated"] is False, report
    temperatures = _temperatures(report)
    for kind in (0, 1):  # kinetic, configurational
        assert temperatures["kernel"][kind]["in_band"] is False and temperatures["kernel"][kind]["mean"] > 1.2
        assert temperatures["bias"][kind]["in_band"] is False and temperatures["bias"][kind]["mean"] < 0.8


def test_per_variable_d_step_matches_a_hand_computation():
    """Tensor v: `xi_v + (tau Nd / mu) (p_v.p_v / n_v - T)`."""
    momentum = [tf.constant([[1.0, 2.0], [0.0, 1.0]]), tf.constant([3.0])]
    xi = tf.constant([0.5, 0.5], tf.float64)
    new = integrators.thermostat(
        xi, momentum, 0.1, thermal_mass=10.0, num_params=5, temperature=2.0, mass=1.0, variable_sizes=(4.0, 1.0)
    )
    expected = [0.5 + 0.1 * 5 / 10.0 * (6.0 / 4 - 2.0), 0.5 + 0.1 * 5 / 10.0 * (9.0 - 2.0)]
    np.testing.assert_allclose(new.numpy(), expected, rtol=1e-7)  # p.p is summed in float32
    # The shared thermostat is the same formula over the whole net.
    shared = integrators.thermostat(0.5, momentum, 0.1, thermal_mass=10.0, num_params=5, temperature=2.0, mass=1.0)
    np.testing.assert_allclose(shared.numpy(), 0.5 + 0.1 / 10.0 * (15.0 - 10.0), rtol=1e-7)


@pytest.mark.parametrize("per_variable", [True, False], ids=["default", "single"])
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_state_has_one_xi_per_tensor_with_several_chains_and_round_trips(name, per_variable, tmp_path):
    x, y = testing.linear_regression_data(64, 3, seed=1)
    keras.utils.set_random_seed(0)
    net = testing.linear_regression_net(3)
    sampler = SAMPLERS[name](1e-3) if per_variable else SAMPLERS[name](1e-3, per_variable_thermostat=False)
    model = kt.BayesianModel(net, sampler, num_examples=64, num_chains=2)
    model.compile(loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    xi = model.sampler_state().xi
    # [chains, tensors] by default, [chains] with the papers' single xi
    assert tuple(xi.shape) == ((2, 2) if per_variable else (2,)) and xi.dtype == tf.float64
    assert np.all(np.isfinite(history.history["xi"]))
    config = sampler.get_config()
    assert config["per_variable_thermostat"] is per_variable
    assert type(sampler).from_config(config).per_variable_thermostat is per_variable
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(loaded.sampler_state().xi), np.asarray(xi))


def test_per_variable_thermostat_must_be_a_bool():
    with pytest.raises(TypeError, match="per_variable_thermostat"):
        kt.samplers.SGNHT(per_variable_thermostat="yes")
