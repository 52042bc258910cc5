"""The sampling step on fixed seeds against values stored from an earlier version of the step.

`tests/data/step_reference.npz` holds, for every sampler, the weights and sampler state after a
few steps of a one-chain run (and of a two-chain run) on fixed data and seeds. A change to the
step that is meant to keep its numbers (a refactoring, a faster kernel with the same arithmetic)
must reproduce them bit for bit; regenerate the file (`python -m tests.test_step_reference`)
only when a change of the numbers is intended, and say why in the commit.
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
    "sgnht": dict(step_size=1e-2, friction=1.0),
    "ccadl": dict(step_size=1e-2, friction=1.0),
    "mccadl": dict(step_size=1e-2, friction=1.0),
    "tact_hmc": dict(step_size=1e-2),
}
STEPS = 12


def run(name: str, num_chains: int) -> dict[str, np.ndarray]:
    """Weights and sampler state of chain(s) after `STEPS` steps of a tiny classifier."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype("float32")
    y = rng.integers(0, 3, size=48)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
    model = kt.BayesianModel(net, kt.samplers.get(name, **SAMPLERS[name]), num_examples=len(x),
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
    got = run(name, num_chains)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=f"{name}, {num_chains} chains: {key}")


def test_the_reference_comparison_sees_a_one_ulp_change():
    """The comparison is exact: one ulp on one weight is a failure."""
    stored = np.load(REFERENCE)
    key = _key("sgld", 1) + "/chain0_weight0"
    changed = stored[key].copy()
    changed.flat[0] = np.nextafter(changed.flat[0], np.float32(np.inf))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(changed, stored[key])


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
