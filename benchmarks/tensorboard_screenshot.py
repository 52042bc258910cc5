"""A picture of what a user sees in TensorBoard: a digits-MLP run's custom-scalars page.

Runs mCCAdL on the digits MLP of `benchmarks.network_temperatures` with Keras' TensorBoard
callback and an `EquilibrationCheck(log_dir=...)`, starts TensorBoard on 127.0.0.1, and takes a
headless-Chromium screenshot of the "Custom Scalars" tab (temperatures against T, xi, noise,
per-variable temperatures).

    python -m benchmarks.tensorboard_screenshot --out docs/tensorboard_custom_scalars.png

Needs a Chromium binary (`--chromium`, default /usr/bin/chromium; Debian's `chromium` package).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import keras

import keras_thermo as kt
from benchmarks import network_temperatures


def write_run(log_dir: str, epochs: int) -> None:
    net, x, y = network_temperatures.build("mlp")
    model = kt.BayesianModel(
        net, sampler=kt.samplers.MCCAdL(step_size=2e-3, friction=1.0), num_examples=len(x),
        prior=kt.priors.Gaussian(1.0), seed=0,
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=29)
    check = kt.callbacks.EquilibrationCheck(block_steps=145, log_dir=log_dir, warn=False)
    model.fit(x, y, batch_size=64, epochs=epochs, verbose=0, callbacks=[keras.callbacks.TensorBoard(log_dir), check])


def serve(log_dir: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", "127.0.0.1", "--port", "0",
         "--load_fast", "false"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "http://127.0.0.1:" in line:
            return process, line[line.index("http://"):].split()[0].rstrip("/")
    process.terminate()
    raise RuntimeError("TensorBoard did not start")


def screenshot(chromium: str, url: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,1300",
             "--virtual-time-budget=20000", f"--screenshot={os.path.abspath(out)}", url],
            check=True, capture_output=True, timeout=180,
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/tensorboard_custom_scalars.png")
    parser.add_argument("--log-dir", default=None, help="an existing run to show (default: run one)")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="kt_tensorboard_")
    if args.log_dir is None:
        write_run(log_dir, args.epochs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    process, url = serve(log_dir)
    try:
        for _ in range(60):  # until the scalars are loaded
            with urllib.request.urlopen(url + "/data/plugin/scalars/tags", timeout=10) as response:
                if b"temperatures" in response.read():
                    break
            time.sleep(0.5)
        screenshot(args.chromium, url + "/#custom_scalars", args.out)
    finally:
        process.terminate()
        process.wait(timeout=20)
    print(f"wrote {args.out} from {log_dir}")


if __name__ == "__main__":
    main()
