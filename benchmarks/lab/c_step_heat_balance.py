"""The covariance step against the gradient noise it corrects: kinetic and configurational temperature.

A model of one coordinate, in numpy (not the library's step): the target `exp(-U / T)` with
`U = lam theta^2 / 2`, unit mass, a noisy force `F = -lam theta + sigma z` (z standard normal,
new every step), friction A with its fluctuation-dissipation noise, and no thermostat (xi held at
A), so that any heat the covariance step fails to balance shows in the temperatures instead of
being absorbed. `x = h^2 beta sigma^2` is the covariance friction per step, `(h/2) beta Sigma h`
twice over: the kick `h F` adds `x T` of heat per step to `p^2` on average, and the covariance
step is there to take it out. Two splittings:

- `ccadl`: CCAdL's Euler update (DESIGN section 4): `p += h F - (h/2) beta Sigma p h - A p h +
  sqrt(2 A T h) R` (the frictions act on the momentum before the kick), `theta += h p`;
- `mccadl`: mCCAdL's BAODCDOAB with one force per step (`keras_thermo.samplers.mccadl`): the kick
  `h F`, then A O C O A with `C: p <- exp(-x / 2) p` and `O: p <- exp(-A h / 2) p + sqrt(T (1 -
  exp(-A h))) R` (the D steps are no-ops without a thermostat).

Reports the stationary kinetic temperature `<p^2> / T` read at the end of a step (where the
library's per-variable check read it before CCAdL's reading subtracted its friction's excess; for mCCAdL also `kinetic_around_c`, the mean of `p^2 / T`
just before and just after C, which its D steps, and its logged `kinetic_temperature`, read) and
the configurational one `lam <theta^2> / T` (the sampled variance over the
target's), with standard errors over independent chains, for x from 0.01 to 3. Where the two
disagree, the position can be sampled at T while the step-end momentum reads otherwise: a
thermostat or a temperature check fed the step-end kinetic temperature then acts on a reading,
not on the positions.

    python -m benchmarks.lab.c_step_heat_balance --out benchmarks/results/c_step_heat_balance.json

With `--per-example n` the force noise is a minibatch mean instead: `n` per-example terms `e_i`
(variance `x / h^2` for their mean), drawn from a mixture in which a fraction `--tail-fraction q`
of the examples carries 90% of the variance (`q = 1`: Gaussian). This is the per-example
gradient noise of a layer where a few examples dominate (a net's logits at low training loss: the
misclassified examples). The covariance friction then uses an estimate, the unbiased sample
variance of the `e_i`, from the minibatch `--pairing` names: `same`, the minibatch whose kick
the step has just taken (mCCAdL's listing, `keras_thermo.samplers.mccadl`; for CCAdL's Euler
update the friction acts on the momentum before the kick, so the same minibatch is still
independent of what it damps); `independent`, another minibatch of the same size; `averaged`,
the same minibatch's estimate averaged over the steps with CCAdL's weights `max(1/t, 1/W)`,
W = 100 (`keras_thermo.samplers.ccadl`); `exact`, the true variance (the Gaussian runs above).

With `--thermal-mass mu` mCCAdL runs with its Nose-Hoover thermostat (one xi per chain, the D
steps reading the momentum on both sides of C, as `keras_thermo.samplers.mccadl`): the xi then
holds that reading at T, and the positions' temperature shows what that does where the reading
and the positions disagree (large x).

    python -m benchmarks.lab.c_step_heat_balance --thermal-mass 1 --out benchmarks/results/c_step_heat_balance_thermostat.json
    python -m benchmarks.lab.c_step_heat_balance --per-example 32 --tail-fraction 1 0.05 0.01 \
        --pairing exact same independent averaged --xs 0.1 0.5 --out benchmarks/results/c_step_estimate_pairing.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

SPLITTINGS = ("ccadl", "mccadl")
PAIRINGS = ("exact", "same", "independent", "averaged")
AVERAGE_WINDOW = 100  # the `averaged` pairing: weights max(1/t, 1/W), as CCAdL's `covariance_window`


def per_example_terms(rng, chains: int, count: int, tail_fraction: float) -> np.ndarray:
    """`[chains, count]` per-example noise terms of unit variance: Gaussian for `tail_fraction`
    1, else a mixture where a fraction `tail_fraction` of the examples carries 90% of it."""
    normal = rng.normal(size=(chains, count))
    if tail_fraction >= 1.0:
        return normal
    heavy = rng.random((chains, count)) < tail_fraction
    return normal * np.where(heavy, np.sqrt(0.9 / tail_fraction), np.sqrt(0.1 / (1.0 - tail_fraction)))


def simulate(splitting: str, x: float, *, h: float, friction: float, lam: float, temperature: float,
             chains: int, steps: int, burn_in: int, seed: int, per_example: int = 0, tail_fraction: float = 1.0,
             pairing: str = "exact", thermal_mass: float = 0.0) -> dict:
    """Runs `chains` independent chains of one splitting; returns the temperatures' means and
    standard errors (over chains) after `burn_in` steps. `per_example` > 0: the force noise is
    the mean of that many `per_example_terms` and the covariance friction uses the estimate that
    `pairing` names (module doc). `thermal_mass` mu > 0 (mCCAdL only): a Nose-Hoover xi per chain
    (from A) whose D steps read the momentum before and after C, `xi += (h/2) (p^2 - T) / mu`
    each, as mCCAdL's, and whose O steps damp with xi and inject A's noise."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    if thermal_mass < 0 or (thermal_mass > 0 and splitting != "mccadl"):
        raise ValueError(f"thermal_mass must be 0, or > 0 with the mccadl splitting, got {thermal_mass} ({splitting})")
    if per_example == 1 or per_example < 0:
        raise ValueError(f"per_example must be 0 (Gaussian force noise) or at least 2, got {per_example}")
    if not per_example and (pairing != "exact" or tail_fraction != 1.0):
        raise ValueError(f"pairing and tail_fraction need per_example >= 2, got pairing={pairing!r}, "
                         f"tail_fraction={tail_fraction}")
    if not 0.0 < tail_fraction <= 1.0:
        raise ValueError(f"tail_fraction must lie in (0, 1], got {tail_fraction}")
    rng = np.random.default_rng(seed)
    beta = 1.0 / temperature
    sigma = np.sqrt(x / (h * h * beta))  # x = h^2 beta sigma^2
    # x of each step: the exact one, or h^2 beta times the estimated variance of the force noise.
    x_step = np.full(chains, x)
    theta = rng.normal(0.0, np.sqrt(temperature / lam), chains)
    p = rng.normal(0.0, np.sqrt(temperature), chains)
    kinetic = np.zeros(chains)
    around_c = np.zeros(chains)  # mCCAdL: the mean of p^2 before and after C, what its D steps read
    configurational = np.zeros(chains)
    xi = np.full(chains, friction)
    xi_sum = np.zeros(chains)

    def ornstein_uhlenbeck(p):
        # Half an O step with friction xi and the noise of A: the library's `ornstein_uhlenbeck`.
        if not thermal_mass:
            return np.exp(-friction * h / 2) * p + np.sqrt(temperature * (1.0 - np.exp(-friction * h))) * rng.normal(size=chains)
        variance = friction * temperature * -np.expm1(-xi * h) / xi
        return np.exp(-xi * h / 2) * p + np.sqrt(variance) * rng.normal(size=chains)

    def thermostat(p):
        return xi + (h / 2) * (p * p - temperature) / thermal_mass if thermal_mass else xi

    for step in range(steps):
        if per_example:
            terms = per_example_terms(rng, chains, per_example, tail_fraction)
            force = -lam * theta + sigma * np.sqrt(per_example) * terms.mean(axis=1)
            if pairing != "exact":
                if pairing == "independent":
                    terms = per_example_terms(rng, chains, per_example, tail_fraction)
                estimate = x * terms.var(axis=1, ddof=1)
                if pairing == "averaged":
                    weight = max(1.0 / (step + 1), 1.0 / AVERAGE_WINDOW)
                    estimate = (1.0 - weight) * x_step + weight * estimate
                x_step = estimate
        else:
            force = -lam * theta + sigma * rng.normal(size=chains)
        if splitting == "ccadl":
            p = p + h * force - (x_step / 2) * p - friction * h * p + np.sqrt(2 * friction * temperature * h) * rng.normal(size=chains)
            theta = theta + h * p
        else:
            p = p + h * force
            theta = theta + (h / 2) * p
            p = ornstein_uhlenbeck(p)
            before_c = p * p
            xi = thermostat(p)
            p = np.exp(-x_step / 2) * p
            xi = thermostat(p)
            if step >= burn_in:
                around_c += (before_c + p * p) / 2
                xi_sum += xi
            p = ornstein_uhlenbeck(p)
            theta = theta + (h / 2) * p
        if step >= burn_in:
            kinetic += p * p
            configurational += lam * theta * theta
    kept = steps - burn_in
    per_chain = {"kinetic": kinetic / (kept * temperature), "configurational": configurational / (kept * temperature)}
    if splitting == "mccadl":
        per_chain["kinetic_around_c"] = around_c / (kept * temperature)
    if thermal_mass:
        per_chain["xi"] = xi_sum / kept
    return {kind: {"mean": float(v.mean()), "standard_error": float(v.std(ddof=1) / np.sqrt(chains))}
            for kind, v in per_chain.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/c_step_heat_balance.json")
    parser.add_argument("--xs", nargs="+", type=float, default=[0.01, 0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--step-size", type=float, default=0.05)
    parser.add_argument("--friction", type=float, default=1.0)
    parser.add_argument("--chains", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--burn-in", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-example", type=int, default=0,
                        help="examples per minibatch of the force noise (0: Gaussian noise, exact covariance)")
    parser.add_argument("--tail-fraction", nargs="+", type=float, default=[1.0],
                        help="with --per-example: fractions q in (0, 1] of examples carrying 90%% of the noise")
    parser.add_argument("--pairing", nargs="+", choices=PAIRINGS, default=["exact"],
                        help="with --per-example: whose minibatch the covariance estimate comes from")
    parser.add_argument("--thermal-mass", type=float, default=0.0,
                        help="> 0: mCCAdL with a Nose-Hoover xi of this thermal mass (its D steps' reading)")
    args = parser.parse_args(argv)
    if args.per_example == 1 or args.per_example < 0:
        parser.error(f"--per-example must be 0 or at least 2, got {args.per_example}")
    if any(not 0.0 < q <= 1.0 for q in args.tail_fraction):
        parser.error(f"--tail-fraction values must lie in (0, 1], got {args.tail_fraction}")
    if args.thermal_mass < 0:
        parser.error(f"--thermal-mass must be 0 (no thermostat) or positive, got {args.thermal_mass}")
    splittings = ("mccadl",) if args.thermal_mass else SPLITTINGS
    if not args.per_example and (args.tail_fraction != [1.0] or args.pairing != ["exact"]):
        parser.error("--tail-fraction and --pairing need --per-example")
    start = time.perf_counter()
    runs = []
    for q in args.tail_fraction:
        for pairing in args.pairing:
            for x in args.xs:
                for index, splitting in enumerate(splittings):
                    result = simulate(splitting, x, h=args.step_size, friction=args.friction, lam=1.0, temperature=1.0,
                                      chains=args.chains, steps=args.steps, burn_in=args.burn_in, seed=args.seed + index,
                                      per_example=args.per_example, tail_fraction=q, pairing=pairing,
                                      thermal_mass=args.thermal_mass)
                    noise = {"tail_fraction": q, "pairing": pairing} if args.per_example else {}
                    runs.append({"splitting": splitting, "x": x, **noise, **result})
                    label = f"q = {q:g} {pairing:11s} " if args.per_example else ""
                    print(f"{label}x = {x:g} {splitting:8s} " + "  ".join(
                        f"{kind} {figures['mean']:.4f} +- {figures['standard_error']:.4f}"
                        for kind, figures in result.items()), flush=True)
    report = {
        "command": "python -m benchmarks.lab.c_step_heat_balance " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "model": "one coordinate, U = theta^2 / 2, T = 1, unit mass, force noise variance x / h^2"
                 + ("" if args.thermal_mass else ", no thermostat")
                 + (f"; force noise the mean of {args.per_example} per-example terms, a fraction tail_fraction of "
                    "them carrying 90% of the variance; covariance friction from the estimate `pairing` names"
                    if args.per_example else "")
                 + ("; mCCAdL with a Nose-Hoover xi of thermal mass `thermal_mass` (D steps around C)"
                    if args.thermal_mass else ""),
        "per_example": args.per_example,
        "thermal_mass": args.thermal_mass,
        "step_size": args.step_size, "friction": args.friction, "chains": args.chains, "steps": args.steps,
        "burn_in": args.burn_in,
        "runs": runs, "seconds": time.perf_counter() - start,
        "machine": f"{platform.machine()}, numpy {np.__version__}",
    }
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
