"""How often do the fixed-seed negative controls of the statistical tests reject, over noise streams?

Under another noise stream (TensorFlow's kernel draw, the samplers' draw before, against the fused
Box-Muller draw, `keras_thermo.random.box_muller_normal`), some fixed-seed assertions of the
statistical tests change outcome: negative controls (a wrong sampler the check must reject) and a resolution
bound, not the checks of correct samplers. A negative control with few chains has limited
power: over noise streams it rejects with some probability below 1, and a new stream can make it
pass. This measures that probability: it reruns the negative controls of
tests/test_statistical_ccadl.py (CCAdL without beta at T = 2, mCCAdL without the mass at M = 4:
`NEGATIVE_CHAINS[name] x NEGATIVE_STEPS`, the thermostat check at alpha = 0.01) and of
tests/test_statistical_sgld.py (SGLD with the 12x schedule: `NEGATIVE_CHAINS_STEPS`, the
posterior check at alpha = 0.01), at the sizes the tests use now (stream_sensitivity.json was
run at 3 x 600 and 8 x 1000), with
`run_chains(seed=s)` for seeds `1..--seeds` (seed 0, the tests' own, is reported apart: the tests
were validated on it), and of tests/test_equilibration.py (`EquilibrationCheck` at T = 1 on an
SGNHT run at T = 2, model seed s, at 15 and 30 epochs), under both draws, and reports the
rejection rate of each (with its binomial standard error) and the statistics behind it.

    python -m benchmarks.lab.stream_sensitivity --out benchmarks/results/stream_sensitivity.json [--seeds 8]
        [--controls equilibration-wrong-T-15-epochs ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import step_cost
from benchmarks.lab.noise_draw import box_muller_normal
from keras_thermo import random as kt_random
from keras_thermo import testing

TESTS = Path(__file__).resolve().parents[2] / "tests"


def _test_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_stream_sensitivity_{name}", TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fused_box_muller_normal_like(key, tensors):
    """`normal_like` as it was with the fused draw: one Box-Muller draw of every tensor's entries
    (in the widest dtype), split and reshaped in order."""
    import tensorflow as tf  # noqa: PLC0415

    if not tensors:
        return []
    sizes = [like.shape.num_elements() if like.shape.is_fully_defined() else tf.size(like) for like in tensors]
    dtype = tf.float64 if any(like.dtype == tf.float64 for like in tensors) else tf.float32
    flat = box_muller_normal(key, sum(sizes[1:], sizes[0]), dtype)
    pieces = tf.split(flat, sizes) if len(tensors) > 1 else [flat]
    return [tf.cast(tf.reshape(piece, tf.shape(like)), like.dtype) for piece, like in zip(pieces, tensors)]


DRAWS = {"kernel_normal_like": kt_random.kernel_normal_like, "box_muller_fused": fused_box_muller_normal_like,
         "normal_like": kt_random.normal_like}


def ccadl_control(module, name: str, seed: int) -> dict:
    config, factor = module.NEGATIVE[name]
    x, y = module._regression_problem()
    mean, _ = module._exact(config, x, y)
    result = testing.run_chains(
        module._make_sampler(config, factor), x, y, num_chains=module.NEGATIVE_CHAINS[name],
        num_steps=module.NEGATIVE_STEPS, batch_size=module.BATCH,
        burn_in_steps=200, every_n_steps=2, prior_std=module.PRIOR_STD, temperature=config.temperature,
        initial_params=mean.astype(np.float32), log_keys=("kinetic_temperature", "xi"), seed=seed,
    )
    check = module._thermostat_check(result, config, module._noise_friction_scale(config, x, y, mean),
                                     alpha=module.DEFAULT_ALPHA)
    return {"rejected": not check.passed, "kinetic_t": check.kinetic_t, "threshold": check.threshold,
            "xi_error": check.xi_error, "xi_allowance": check.allowance}


def sgld_control(module, seed: int) -> dict:
    import keras_thermo as kt  # noqa: PLC0415

    x, y, mean, covariance = module._problem()
    schedule = module._schedule(1000, 12.0)
    result = testing.run_chains(
        lambda: kt.samplers.SGLD(schedule), x, y, num_chains=module.NEGATIVE_CHAINS_STEPS[0],
        num_steps=module.NEGATIVE_CHAINS_STEPS[1], batch_size=module.BATCH,
        burn_in_steps=100, every_n_steps=2, prior_std=module.PRIOR_STD, initial_params=mean.astype(np.float32),
        log_keys=(), seed=seed,
    )
    weights = kt.samplers.SGLD(schedule).step_size_at(result.steps - 1).numpy()
    check = testing.compare_with_gaussian(result.samples, mean, covariance, alpha=0.01, weights=weights)
    return {"rejected": not check.passed, "max_abs_variance_t": float(np.max(np.abs(check.variance_t))),
            "max_abs_mean_t": float(np.max(np.abs(check.mean_t))), "threshold": float(check.threshold)}


def equilibration_control(module, epochs: int, seed: int) -> dict:
    """tests/test_equilibration.py's negative control: SGNHT sampling at T = 2, checked at T = 1
    by `EquilibrationCheck` (rejected: not equilibrated, the configurational temperature out of
    band), after `epochs` epochs of 100 steps."""
    check, _, _ = module._fit_with_check(2.0, check_temperature=1.0, epochs=epochs, seed=seed)
    report = check.report()
    configurational = report["overall"]["configurational"]
    return {"rejected": report["equilibrated"] is False and configurational["in_band"] is False,
            "num_blocks": report["num_blocks"], "configurational_mean": configurational["mean"],
            "configurational_standard_error": configurational["standard_error"]}


#: Epochs of the equilibration control measured: the test's former length and its length now
#: (`WRONG_TEMPERATURE_EPOCHS` in tests/test_equilibration.py).
EQUILIBRATION_EPOCHS = (15, 30)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/stream_sensitivity.json")
    parser.add_argument("--seeds", type=int, default=8, help="seeds 1..seeds (and the tests' own seed 0)")
    parser.add_argument("--draws", nargs="+", choices=sorted(DRAWS), default=["box_muller_fused", "kernel_normal_like"],
                        help="noise draws to compare (default: the kernel draw and the unaligned fused one, as "
                             "the committed results ran; normal_like: the samplers' own)")
    parser.add_argument("--controls", nargs="+", default=None,
                        help="the controls to run (default: all; names as in the output)")
    args = parser.parse_args(argv)
    ccadl, sgld = _test_module("test_statistical_ccadl"), _test_module("test_statistical_sgld")
    equilibration = _test_module("test_equilibration")
    controls = {name: (lambda seed, name=name: ccadl_control(ccadl, name, seed)) for name in sorted(ccadl.NEGATIVE)}
    controls["sgld-12x-schedule"] = lambda seed: sgld_control(sgld, seed)
    sizes = {name: [chains, ccadl.NEGATIVE_STEPS] for name, chains in ccadl.NEGATIVE_CHAINS.items()}
    sizes["sgld-12x-schedule"] = list(sgld.NEGATIVE_CHAINS_STEPS)
    for epochs in EQUILIBRATION_EPOCHS:
        name = f"equilibration-wrong-T-{epochs}-epochs"
        controls[name] = lambda seed, epochs=epochs: equilibration_control(equilibration, epochs, seed)
        sizes[name] = [1, 100 * epochs]
    if args.controls is not None:
        unknown = sorted(set(args.controls) - set(controls))
        if unknown:
            raise ValueError(f"--controls: unknown {unknown}; allowed: {sorted(controls)}")
        controls = {name: run for name, run in controls.items() if name in args.controls}
    original = kt_random.normal_like
    results = {"machine": step_cost.machine_info(),
               "settings": {"seeds": list(range(args.seeds + 1)), "chains_x_steps": sizes},
               "controls": {}}
    try:
        for control, run in controls.items():
            results["controls"][control] = {}
            for draw in args.draws:
                normal_like = DRAWS[draw]
                kt_random.normal_like = normal_like
                runs = {}
                for seed in range(args.seeds + 1):
                    start = time.perf_counter()
                    runs[seed] = run(seed)
                    print(f"{control} {draw} seed {seed}: {runs[seed]} ({time.perf_counter() - start:.0f} s)", flush=True)
                other = [runs[seed]["rejected"] for seed in range(1, args.seeds + 1)]
                rate = float(np.mean(other))
                results["controls"][control][draw] = {
                    "runs": runs, "rejected_with_the_tests_seed_0": runs[0]["rejected"],
                    "rejection_rate_seeds_1_on": rate,
                    "rejection_rate_standard_error": float(np.sqrt(max(rate * (1 - rate), 1e-12) / len(other))),
                }
    finally:
        kt_random.normal_like = original
    step_cost.write_json(args.out, results)
    for control, draws in results["controls"].items():
        for draw, entry in draws.items():
            print(f"{control} {draw}: seed 0 rejected {entry['rejected_with_the_tests_seed_0']}, "
                  f"rate over seeds 1-{args.seeds} {entry['rejection_rate_seeds_1_on']:.2f}")
    return results


if __name__ == "__main__":
    main()
