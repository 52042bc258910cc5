"""Several `tf.distribute.MirroredStrategy` objects in one process (a re-run notebook cell).

Every MirroredStrategy numbers its collectives from the same keys, and the process keeps one
collective runtime that remembers what each key was first used for; a later strategy's mCCAdL
all-gather then landed on a key an earlier strategy had used for an all-reduce and failed with
`InternalError` at `allgather/CollectiveGatherV2`. `BayesianModel` gives each strategy it runs
under a group key of its own (`keras_thermo._distribute.isolate_collectives`).

`tests/conftest.py` splits the CPU into two logical devices before TensorFlow starts.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import _distribute

from helpers import assert_mirrored_variables_match, regression_arrays, regression_model

GLOBAL_BATCH = 16
RTOL, ATOL = 1e-4, 1e-5  # as tests/test_distribute.py: a few ulp of summation order per step
REPO = Path(__file__).resolve().parent.parent


def _devices():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPU devices set up by tests/conftest.py")
    return devices


def _model(sampler, seed=11):
    """The shared regression model (tests/helpers.py), with this sampler instance."""
    return regression_model(lambda: sampler, seed)


def _fit(model, steps):
    dataset = tf.data.Dataset.from_tensor_slices(regression_arrays()).batch(GLOBAL_BATCH).repeat().take(steps)
    model.fit(dataset, epochs=1, verbose=0)


def _group_key(strategy):
    return strategy.extended._collective_ops._launchers[0]._group_key


@pytest.mark.slow  # ~40 s on 2 cores; the default suite still builds one strategy per test in test_distribute.py, which needs the isolated collective keys too
def test_mccadl_under_a_second_strategy_matches_one_device():
    devices = _devices()
    first = tf.distribute.MirroredStrategy(devices)
    with first.scope():
        earlier = _model(kt.samplers.SGNHT(3e-3))
    _fit(earlier, 20)  # all-reduces on the first strategy's keys

    second = tf.distribute.MirroredStrategy(devices)
    with second.scope():
        distributed = _model(kt.samplers.MCCAdL(3e-3, covariance="minibatch", expm="taylor"))
    _fit(distributed, 60)  # all-gathers: failed with InternalError before the keys were isolated
    single = _model(kt.samplers.MCCAdL(3e-3, covariance="minibatch", expm="taylor"))
    _fit(single, 60)

    assert distributed.sampler_step == single.sampler_step == 60
    assert_mirrored_variables_match(single, distributed, rtol=RTOL, atol=ATOL)
    # Each strategy got a group key of its own, away from TensorFlow's default start (1).
    assert len({_group_key(first), _group_key(second), 1}) == 3


def test_isolation_happens_once_per_strategy_and_skips_other_strategies():
    strategy = tf.distribute.MirroredStrategy(_devices())
    assert _group_key(strategy) == 1  # what every new strategy starts with: the clash
    assert _distribute.isolate_collectives(strategy)
    key = _group_key(strategy)
    assert key >= _distribute._GROUP_KEY_BASE
    assert not _distribute.isolate_collectives(strategy)  # a second model under it keeps its keys
    assert _group_key(strategy) == key
    with strategy.scope():
        _model(kt.samplers.SGLD(1e-4))
    assert _group_key(strategy) == key
    assert not _distribute.isolate_collectives(tf.distribute.get_strategy())  # the default strategy
    assert not _distribute.isolate_collectives(tf.distribute.OneDeviceStrategy("/cpu:0"))


_CLASH_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tests")
    import conftest  # noqa: F401  (two logical CPUs)
    import tensorflow as tf
    import keras_thermo as kt
    from keras_thermo import _distribute
    import test_distribute_strategies as t

    if sys.argv[1] == "without":
        _distribute.isolate_collectives = lambda strategy: False
        import keras_thermo.model as model_module
        model_module.isolate_collectives = _distribute.isolate_collectives
    devices = t._devices()
    with tf.distribute.MirroredStrategy(devices).scope():
        earlier = t._model(kt.samplers.SGNHT(3e-3))
    t._fit(earlier, 20)
    with tf.distribute.MirroredStrategy(devices).scope():
        later = t._model(kt.samplers.MCCAdL(3e-3, covariance="minibatch", expm="taylor"))
    try:
        t._fit(later, 5)
    except tf.errors.InternalError as error:
        print("CLASH", str(error).splitlines()[-3:])
        sys.exit(3)
    print("RAN", later.sampler_step)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["with", "without"])
def test_second_strategy_clash_is_the_collective_keys(isolation, tmp_path):
    """The negative control, in fresh processes (a clash aborts the process's collectives): with
    the isolation switched off the same two-strategy sequence fails at the all-gather."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    script = tmp_path / "clash.py"
    script.write_text(_CLASH_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), isolation], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr[-3000:]
    if isolation == "with":
        assert result.returncode == 0 and "RAN 5" in result.stdout, output
    else:
        assert result.returncode == 3 and "CollectiveGatherV2" in result.stdout, output
