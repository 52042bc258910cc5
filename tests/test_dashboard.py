"""The TensorBoard view of a run, read back through a real TensorBoard server on 127.0.0.1.

A short run writes Keras' scalars, the EquilibrationCheck's per-variable temperatures and the
custom-scalars layout; TensorBoard is started as a user starts it (its command line, port 0),
and its HTTP data API must serve the layout and the same numbers the run logged.
"""

import json
import subprocess
import sys
import time
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import dashboard, testing


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tensorboard")
    x, y = testing.linear_regression_data(200, 2, seed=0)
    model = kt.BayesianModel(
        testing.linear_regression_net(2), kt.samplers.SGNHT(2e-3, friction=5.0), num_examples=200, seed=0
    )
    model.compile(loss="mse", steps_per_execution=10)
    check = kt.callbacks.EquilibrationCheck(block_steps=20, min_blocks=2, log_dir=str(log_dir), warn=False)
    # The check is listed after TensorBoard: fit puts it first, so its epoch logs reach TensorBoard.
    history = model.fit(
        x, y, batch_size=20, epochs=4, steps_per_epoch=20, verbose=0,
        callbacks=[keras.callbacks.TensorBoard(str(log_dir)), check],
    )
    return log_dir, history, model


def test_the_layout_is_written_where_tensorboard_reads_it(logged_run):
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata  # noqa: PLC0415

    log_dir = logged_run[0]
    layouts = []
    for path in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == metadata.CONFIG_SUMMARY_TAG:
                    layouts.append(layout_pb2.Layout.FromString(tf.make_ndarray(value.tensor).item()))
    assert layouts == [dashboard.layout_proto()]


# Starting TensorBoard costs ~10-25 s on 2 cores; the default suite checks the written layout
# above and the per-variable scalars in test_equilibration.py.
@pytest.fixture(scope="module")
def server(logged_run):
    log_dir = logged_run[0]
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir), "--host", "127.0.0.1",
         "--port", "0", "--load_fast", "false", "--reload_interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = None
    deadline = time.monotonic() + 60
    try:
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
            if "http://127.0.0.1:" in line:
                url = line[line.index("http://"):].split()[0].rstrip("/")
        assert url, "TensorBoard did not print its address"
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def _get(url: str, path: str):
    with urllib.request.urlopen(url + path, timeout=10) as response:
        return json.loads(response.read())


def _wait_for_tags(url: str, runs: set[str]) -> dict:
    deadline = time.monotonic() + 30
    while True:
        tags = _get(url, "/data/plugin/scalars/tags")
        if runs <= set(tags) or time.monotonic() > deadline:
            return tags
        time.sleep(0.5)


@pytest.mark.slow
def test_tensorboard_serves_the_logged_temperatures(server, logged_run):
    _, history, _ = logged_run
    tags = _wait_for_tags(server, {"train", "temperatures"})
    assert {"epoch_kinetic_temperature", "epoch_configurational_temperature", "epoch_xi",
            "epoch_equilibrated", "epoch_mean_configurational_temperature"} <= set(tags["train"])
    served = _get(server, "/data/plugin/scalars/scalars?run=train&tag=epoch_configurational_temperature")
    assert [step for _, step, _ in served] == [0, 1, 2, 3]
    np.testing.assert_allclose([value for _, _, value in served], history.history["configurational_temperature"], rtol=1e-6)
    assert "temperature/configurational/overall" in tags["temperatures"]
    assert any(tag.startswith("temperature/kinetic/") and tag.endswith("kernel") for tag in tags["temperatures"])


@pytest.mark.slow
def test_tensorboard_serves_the_custom_scalars_layout(server, logged_run):
    _wait_for_tags(server, {"train", "temperatures"})
    layout = _get(server, "/data/plugin/custom_scalars/layout")
    titles = [category["title"] for category in layout["category"]]
    assert titles == [title for title, _ in dashboard.LAYOUT]
    first_chart = layout["category"][0]["chart"][0]["multiline"]["tag"]
    assert first_chart == dashboard.LAYOUT[0][1][0][1]
