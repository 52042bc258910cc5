"""How SGLD, SGHMC and SGNHT degrade as minibatch gradient noise grows.

Bayesian linear regression (the closed-form posterior of `keras_thermo.testing`), each sampler at
the fixed step size where it is exact with low noise, run through `BayesianModel.fit` with batch
sizes from the full batch down to a few examples. The gradient-noise variance grows like
`N^2 / n`. For each (sampler, batch size) the script records the error of the posterior mean (in
posterior standard deviations), the relative error of the marginal variances, and the
2-Wasserstein distance between the Gaussian fitted to the samples and the exact posterior.
This is the gap CCAdL and mCCAdL are built to close.

    python -m benchmarks.noise_degradation --out runs/noise [--quick]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import keras_thermo as kt
from keras_thermo import testing

NUM_EXAMPLES = 500
SAMPLERS = {
    "sgld": lambda: kt.samplers.SGLD(2e-5),
    "sghmc": lambda: kt.samplers.SGHMC(3e-3, friction=5.0),
    "sgnht": lambda: kt.samplers.SGNHT(2e-3, friction=5.0),
}


def gaussian_w2(mean_a, cov_a, mean_b, cov_b) -> float:
    """2-Wasserstein distance between two Gaussians."""
    from scipy.linalg import sqrtm  # noqa: PLC0415 (dev dependency)

    root_b = np.real(sqrtm(cov_b))
    cross = np.real(sqrtm(root_b @ cov_a @ root_b))
    squared = np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a + cov_b - 2.0 * cross)
    return float(np.sqrt(max(squared, 0.0)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/noise")
    parser.add_argument("--quick", action="store_true", help="2 chains x 3000 steps, 3 batch sizes")
    args = parser.parse_args(argv)
    chains, steps = (2, 3000) if args.quick else (6, 20_000)
    batch_sizes = [500, 50, 5] if args.quick else [500, 200, 50, 20, 5]
    x, y = testing.linear_regression_data(NUM_EXAMPLES, 2, seed=0)
    mean, cov = testing.linear_regression_posterior(x, y, prior_std=1.0)
    std = np.sqrt(np.diag(cov))
    rows = []
    for name, make in SAMPLERS.items():
        for batch_size in batch_sizes:
            result = testing.run_chains(
                make, x, y, num_chains=chains, num_steps=steps, batch_size=batch_size,
                burn_in_steps=steps // 10, every_n_steps=5, prior_std=1.0,
            )
            flat = result.samples.reshape(-1, result.samples.shape[-1]).astype(np.float64)
            finite = bool(np.all(np.isfinite(flat)))
            row = {"sampler": name, "batch_size": batch_size, "finite": finite}
            if finite:
                fitted_mean, fitted_cov = flat.mean(axis=0), np.cov(flat, rowvar=False)
                row.update(
                    mean_error_in_std=float(np.max(np.abs(fitted_mean - mean) / std)),
                    relative_variance_error=float(np.max(np.abs(np.diag(fitted_cov) / std**2 - 1))),
                    w2=gaussian_w2(fitted_mean, fitted_cov, mean, cov),
                )
            rows.append(row)
            print(row, flush=True)
    results = {"num_examples": NUM_EXAMPLES, "chains": chains, "steps": steps, "rows": rows,
               "posterior_std": std.tolist()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    _plot(rows, os.path.join(args.out, "noise_degradation.png"))
    return results


def _plot(rows, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in SAMPLERS:
        points = [(r["batch_size"], r["w2"]) for r in rows if r["sampler"] == name and r["finite"]]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("batch size n (gradient noise ~ N^2/n)")
    ax.set_ylabel("W2 to exact posterior")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
