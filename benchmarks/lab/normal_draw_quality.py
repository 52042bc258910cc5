"""Is a normal draw N(0, 1) and independent? High-power checks of the kernel draw and the fused Box-Muller one (the samplers').

`keras_thermo.random.kernel_normal_like` (TensorFlow's `stateless_normal` kernel, one keyed draw
per tensor: the samplers' draw when this was written) and `keras_thermo.random.box_muller_normal`
(one Philox uniform draw turned into normals by whole-tensor Box-Muller: the samplers' draw now,
`normal_like`, splits one such draw into the tensors) are put
through the same checks, on `--keys` step keys of `--count` draws each (2^26 draws in all by
default, 256 times the 2^18 of tests/test_random.py):

* moments: the mean, variance, skewness and excess kurtosis of the pooled draws as z-scores
  (standard errors `1/sqrt(n)`, `sqrt(2/n)`, `sqrt(6/n)`, `sqrt(24/n)`);
* shape: a chi-square test on `--bins` equiprobable bins of N(0, 1) (pooled), and a
  Kolmogorov-Smirnov test on the first key's draws;
* tails: the counts beyond 3, 4 and 5 against their exact expectations (z-scores);
* dependence, within a key: entries `i` and `i + count/2` (the cosine and the sine of one
  Box-Muller pair, sharing its radius), and neighbours `i`, `i + 1`: the correlation of the
  values, of their squares and of their absolute values (z = r sqrt(m)), and a chi-square test
  of independence of the pair on a 20 x 20 grid of equiprobable cells; across keys: entry `i`
  of consecutive keys, the same way.

Every statistic is reported with its two-sided p-value; under a correct draw each p-value is
uniform on [0, 1], so among the ~20 checks per draw one below 0.05 is expected, and the smallest
is compared with the Bonferroni level `0.01 / checks`. Two negative controls show the checks'
power at this size: the kernel draw scaled by 1.001 (variance 0.2% high) and the Box-Muller
draw with each sine mixed with its cosine at correlation 0.001.

    python -m benchmarks.lab.normal_draw_quality --out benchmarks/results/normal_draw_quality.json
        [--keys 16] [--count 4194304] [--first-step 0] [--methods kernel_normal_like box_muller_fused]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.stats
import tensorflow as tf

from benchmarks import step_cost
from benchmarks.lab.noise_draw import box_muller_normal
from keras_thermo import random as kt_random

GRID = 20


#: Negative controls (the checks must flag them): the kernel draw with a variance 0.2% too large,
#: and the Box-Muller draw with each sine correlated 0.1% with its cosine (marginals still exact).
CONTROLS = {"control_variance_0.2%_high": 1.001, "control_halves_correlated_0.1%": 1e-3}


def draw(method: str, step: int, count: int) -> np.ndarray:
    key = kt_random.step_key(0, tf.constant(step, tf.int64), kt_random.STREAM_MOMENTUM)
    if method in ("kernel_normal_like", "control_variance_0.2%_high"):
        (values,) = kt_random.kernel_normal_like(key, [tf.zeros([count])])
        scale = CONTROLS.get(method, 1.0)
        return scale * values.numpy().astype(np.float64)
    values = box_muller_normal(key, count).numpy().astype(np.float64)
    if method == "control_halves_correlated_0.1%":
        rho, half = CONTROLS[method], count // 2
        values[half:2 * half] = rho * values[:half] + np.sqrt(1.0 - rho**2) * values[half:2 * half]
    return values


def z_p(z: float) -> dict:
    return {"z": float(z), "p": float(2.0 * scipy.stats.norm.sf(abs(z)))}


class Pairs:
    """Running sums for the dependence of pairs `(a, b)`: correlations and a 2-D chi-square."""

    def __init__(self):
        self.count = 0
        self.sums = {kind: np.zeros(5) for kind in ("value", "square", "absolute")}
        self.cells = np.zeros((GRID, GRID))

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        self.count += a.size
        for kind, (x, y) in {"value": (a, b), "square": (a * a, b * b),
                             "absolute": (np.abs(a), np.abs(b))}.items():
            self.sums[kind] += [x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum()]
        edges = scipy.stats.norm.ppf(np.arange(1, GRID) / GRID)
        cells = np.searchsorted(edges, a) * GRID + np.searchsorted(edges, b)
        self.cells += np.bincount(cells, minlength=GRID * GRID).reshape(GRID, GRID)

    def result(self) -> dict:
        out = {}
        m = self.count
        for kind, (sx, sy, sxx, syy, sxy) in self.sums.items():
            covariance = sxy / m - sx * sy / m**2
            correlation = covariance / np.sqrt((sxx / m - (sx / m) ** 2) * (syy / m - (sy / m) ** 2))
            out[f"correlation_{kind}"] = {"r": float(correlation), **z_p(correlation * np.sqrt(m))}
        expected = m / GRID**2
        statistic = float(((self.cells - expected) ** 2 / expected).sum())
        dof = GRID**2 - 1
        out["independence_chi_square"] = {"statistic": statistic, "dof": dof,
                                          "p": float(scipy.stats.chi2.sf(statistic, dof))}
        return out


def check(method: str, keys: int, count: int, bins: int, first_step: int = 0) -> dict:
    edges = scipy.stats.norm.ppf(np.arange(1, bins) / bins)
    histogram = np.zeros(bins)
    powers = np.zeros(5)  # n, sum z, z^2, z^3, z^4
    tails = {3: 0, 4: 0, 5: 0}
    pairs = {"half_apart": Pairs(), "neighbours": Pairs(), "consecutive_keys": Pairs()}
    previous, ks = None, None
    half = count // 2
    for step in range(first_step, first_step + keys):
        z = draw(method, step, count)
        if ks is None:
            ks = scipy.stats.kstest(z, "norm")
        powers += [z.size, z.sum(), (z**2).sum(), (z**3).sum(), (z**4).sum()]
        histogram += np.bincount(np.searchsorted(edges, z), minlength=bins)
        for bound in tails:
            tails[bound] += int(np.sum(np.abs(z) > bound))
        pairs["half_apart"].add(z[:half], z[half:2 * half])
        pairs["neighbours"].add(z[0:-1:2], z[1::2])
        if previous is not None:
            pairs["consecutive_keys"].add(previous, z)
        previous = z
    n = powers[0]
    mean = powers[1] / n
    central = [powers[2] / n - mean**2]
    variance = central[0]
    third = powers[3] / n - 3 * mean * powers[2] / n + 2 * mean**3
    fourth = powers[4] / n - 4 * mean * powers[3] / n + 6 * mean**2 * powers[2] / n - 3 * mean**4
    skewness, kurtosis = third / variance**1.5, fourth / variance**2 - 3.0
    expected = n / bins
    chi_square = float(((histogram - expected) ** 2 / expected).sum())
    results = {
        "draws": int(n),
        "mean": {"value": float(mean), **z_p(mean * np.sqrt(n))},
        "variance": {"value": float(variance), **z_p((variance - 1.0) / np.sqrt(2.0 / n))},
        "skewness": {"value": float(skewness), **z_p(skewness / np.sqrt(6.0 / n))},
        "excess_kurtosis": {"value": float(kurtosis), **z_p(kurtosis / np.sqrt(24.0 / n))},
        "bins_chi_square": {"statistic": chi_square, "dof": bins - 1,
                            "p": float(scipy.stats.chi2.sf(chi_square, bins - 1))},
        "kolmogorov_smirnov_first_key": {"statistic": float(ks.statistic), "p": float(ks.pvalue), "draws": count},
    }
    for bound, observed in tails.items():
        probability = 2.0 * scipy.stats.norm.sf(bound)
        expected_count = n * probability
        results[f"beyond_{bound}"] = {"observed": observed, "expected": float(expected_count),
                                      **z_p((observed - expected_count) / np.sqrt(expected_count))}
    for name, pair in pairs.items():
        for statistic, value in pair.result().items():
            results[f"{name}_{statistic}"] = value
    p_values = {name: value["p"] for name, value in results.items() if isinstance(value, dict) and "p" in value}
    level = 0.01 / len(p_values)
    results["summary"] = {"checks": len(p_values), "smallest_p": min(p_values.values()),
                          "smallest_p_check": min(p_values, key=p_values.get), "bonferroni_level": level,
                          "passes_at_bonferroni_level": bool(min(p_values.values()) > level),
                          "below_0.05": sorted(name for name, p in p_values.items() if p < 0.05)}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/normal_draw_quality.json")
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--count", type=int, default=2**22, help="draws per key (even)")
    parser.add_argument("--bins", type=int, default=1000)
    parser.add_argument("--first-step", type=int, default=0,
                        help="keys are those of steps first-step, first-step + 1, ... (a replication uses new keys)")
    parser.add_argument("--methods", nargs="+", default=["kernel_normal_like", "box_muller_fused", *CONTROLS],
                        choices=["kernel_normal_like", "box_muller_fused", *CONTROLS])
    args = parser.parse_args(argv)
    results = {"machine": step_cost.machine_info(),
               "settings": {"keys": args.keys, "count": args.count, "bins": args.bins, "grid": GRID,
                            "first_step": args.first_step},
               "draws": {}}
    for method in args.methods:
        results["draws"][method] = check(method, args.keys, args.count, args.bins, args.first_step)
        summary = results["draws"][method]["summary"]
        print(f"{method}: {summary}", flush=True)
    step_cost.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
