"""The sampling step on fixed seeds against values stored from an earlier version of the step.

`tests/data/step_reference.npz` holds, for every sampler, the weights and sampler state after a
few steps of a one-chain run (and of a two-chain run) on fixed data and seeds. A change to the
step that is meant to keep its numbers (a refactoring, a faster kernel with the same arithmetic)
must reproduce them to float32 round-off; regenerate the file (`python -m tests.test_step_reference`)
only when a change of the numbers is intended, and say why in the commit.

Round-off, not bit identity: the stored numbers are bit-exact only on a processor like the one
that wrote them. TensorFlow's CPU kernels (oneDNN and Eigen, AVX2 or AVX-512 paths) round the
same matrix products differently on other processors (on an AMD EPYC with AVX-512 a few float32
ulps off the stored file, the integer state exact). The band is `ROUND_OFF = 1e-5` of each
array's largest magnitude; a change of the update itself moves the numbers far more
(`test_the_comparison_sees_a_change_of_the_update`).
Bit-exact resume on one machine is tested where it belongs (`tests/test_model.py`).
"""

from __future__ import annotations

import pathlib

import keras
import numpy as np
import pytest

import keras_thermo as kt

REFERENCE = pathlib.Path(__file__).parent / "data" / "step_reference.npz"
SAMPLERS = {
    "sgld": dict(step_size=1e-3),
    "sghmc": dict(step_size=1e-2, friction=1.0),
    # The papers' single thermostat and C step, as stored.
    "sgnht": dict(step_size=1e-2, friction=1.0, per_variable_thermostat=False),
    "ccadl": dict(step_size=1e-2, friction=1.0, per_variable_thermostat=False),
    "mccadl": dict(step_size=1e-2, friction=1.0, covariance="minibatch", per_variable_thermostat=False),
    "tact_hmc": dict(step_size=1e-2),
    # One thermostat per tensor (the default).
    "sgnht_per_tensor": dict(step_size=1e-2, friction=1.0),
    "ccadl_per_tensor": dict(step_size=1e-2, friction=1.0),
    "mccadl_per_tensor": dict(step_size=1e-2, friction=1.0),
}
STEPS = 12


def run(name: str, num_chains: int) -> dict[str, np.ndarray]:
    """Weights and sampler state of chain(s) after `STEPS` steps of a tiny classifier."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype("float32")
    y = rng.integers(0, 3, size=48)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
    sampler = kt.samplers.get(name.removesuffix("_per_tensor"), **SAMPLERS[name])
    model = kt.BayesianModel(net, sampler, num_examples=len(x),
                             prior=kt.priors.Gaussian(1.0), seed=11, num_chains=num_chains)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    values = {}
    for k in range(num_chains):
        for i, w in enumerate(model.chain_weights(k)):
            values[f"chain{k}_weight{i}"] = w
    for i, leaf in enumerate(model._state_variables):
        values[f"state{i}"] = np.asarray(leaf.numpy())
    return values


def _key(name: str, num_chains: int) -> str:
    return f"{name}_c{num_chains}"


CASES = [(name, 1) for name in SAMPLERS] + [(name, 2) for name in SAMPLERS]


@pytest.mark.parametrize("name,num_chains", CASES)
def test_step_reproduces_the_stored_reference(name, num_chains):
    stored = np.load(REFERENCE)
    prefix = _key(name, num_chains) + "/"
    expected = {k[len(prefix):]: stored[k] for k in stored.files if k.startswith(prefix)}
    if not expected:
        pytest.fail(f"no stored reference for {name} with {num_chains} chains; regenerate {REFERENCE.name}")
    assert_reproduces(run(name, num_chains), expected, f"{name}, {num_chains} chains")


#: Relative to each stored array's largest magnitude: float32 round-off of other processors' kernels.
ROUND_OFF = 1e-5


def assert_reproduces(got: dict, expected: dict, what: str) -> None:
    """Every stored array reproduced: integers exactly, floats within `ROUND_OFF` of the array's
    largest magnitude (module doc)."""
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if value.dtype.kind == "f":
            scale = float(np.max(np.abs(value))) if value.size else 0.0
            np.testing.assert_allclose(got[key], value, rtol=0, atol=ROUND_OFF * max(scale, 1e-30),
                                       err_msg=f"{what}: {key}")
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=f"{what}: {key}")


def test_the_comparison_sees_a_change_of_the_update(monkeypatch):
    """The band catches a small change of the step: SGLD at a step size 1% larger than the
    stored run's fails the comparison after 12 steps."""
    stored = np.load(REFERENCE)
    prefix = _key("sgld", 1) + "/"
    expected = {k[len(prefix):]: stored[k] for k in stored.files if k.startswith(prefix)}
    monkeypatch.setitem(SAMPLERS, "sgld", dict(step_size=1.01e-3))
    with pytest.raises(AssertionError):
        assert_reproduces(run("sgld", 1), expected, "sgld at a 1% larger step")


if __name__ == "__main__":
    import sys

    # `python -m tests.test_step_reference [NAME_cC ...]`: (re)stores those cases, keeps the others.
    cases = CASES if len(sys.argv) < 2 else [c for c in CASES if _key(*c) in sys.argv[1:]]
    results = dict(np.load(REFERENCE)) if REFERENCE.exists() and len(sys.argv) > 1 else {}
    for name, chains in cases:
        try:
            for key, value in run(name, chains).items():
                results[f"{_key(name, chains)}/{key}"] = value
            print("ok", name, chains)
        except Exception as error:  # a combination the stored version could not run
            print("skipped", name, chains, type(error).__name__, str(error)[:200])
    np.savez(REFERENCE, **results)
