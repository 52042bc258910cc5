"""What a temperature check's verdict says in words: one line per run (`summary`), the likely
cause of a run off T and what to change (`cause`), from an `EquilibrationCheck.report()` and the
traits of the sampler that ran (`sampler_traits`). `keras_thermo.equilibration` computes the
figures and re-exports these.
"""

from __future__ import annotations

import math
from typing import Any

KINETIC, CONFIGURATIONAL = 0, 1
KINDS = ("kinetic", "configurational")


def sampler_traits(sampler) -> dict[str, Any]:
    """What the advice for a run off T needs to know of its sampler: `corrects_noise` (CCAdL and
    mCCAdL remove the gradient noise's heat per weight), `thermostat` (`"one"` for the papers'
    single thermostat, `"per_variable"` for one per tensor, None for a sampler without the
    option) and `symmetric_step` (a second-order step: SGNHT's `integrator="symmetric"`,
    mCCAdL's). `sampler=None` gives a sampler of none of these.

    Example:
        >>> import keras_thermo as kt
        >>> sampler_traits(kt.samplers.SGNHT(integrator="symmetric"))
        {'corrects_noise': False, 'thermostat': 'one', 'symmetric_step': True}
    """
    per_variable = getattr(sampler, "per_variable_thermostat", None)
    if getattr(sampler, "thermostat", True) is False:  # TACT-HMC's ablation without thermostats
        per_variable = None
    return {
        "corrects_noise": bool(getattr(sampler, "needs_per_example_gradients", False)),
        "thermostat": None if per_variable is None else "per_variable" if per_variable else "one",
        "symmetric_step": bool(getattr(sampler, "symmetric_step", False)),
    }


def misses(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """`(where, kind, figure)` of every comparison `report` finds out of band, the whole net's
    first (`where`: "the whole net" or a variable's quoted name)."""
    entries = [("the whole net", report["overall"])] + [(repr(v["name"]), v) for v in report.get("variables", [])]
    return [(where, kind, entry[kind]) for where, entry in entries for kind in KINDS if entry[kind]["in_band"] is False]


def furthest_miss(report: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """The entry of `misses` furthest from T, or None when no comparison is out of band."""
    return max(misses(report), key=lambda miss: abs(miss[2]["mean"] - report["temperature"]), default=None)


def cause(report: dict[str, Any]) -> str:
    """Why a run that `report` finds out of band is off T, and what to change, from the comparison
    furthest out of band (the whole net's or one variable's; without one, the whole net's
    configurational temperature) and the sampler's traits in `report["sampler"]`
    (`sampler_traits`):

    - cold: still descending from its start, or a thermostat holding the start's energy;
    - one tensor hot in both temperatures while the papers' single thermostat holds the whole
      net's momenta at T: that tensor's gradient noise is stronger than the rest's (one
      thermostat per tensor);
    - hot positions with momenta at T (configurational above kinetic by three standard errors):
      the step's own error in the stiffest directions, larger for a first-order step (a shorter
      step, or a second-order one);
    - otherwise hot: a step too long for the curvature or the gradient noise.

    Advice that names what the run already uses is left out (a noise-correcting sampler for CCAdL
    and mCCAdL, a second-order step for a symmetric one). A report saved before it carried
    `sampler` gives only `sampler_corrects_noise`."""
    traits = {**sampler_traits(None), **(report.get("sampler") or
                                          {"corrects_noise": bool(report.get("sampler_corrects_noise", False))})}
    corrects_noise = traits["corrects_noise"]
    temperature = report["temperature"]
    miss = furthest_miss(report)
    if miss is None:
        where, entry = "", report["overall"]
        mean = entry[KINDS[CONFIGURATIONAL]]["mean"]
    else:
        where, kind, figure = miss
        entry = _entry(report, where)
        mean = figure["mean"]
        where = (f" (furthest off: the {kind} temperature of {where}, {mean:.3g} +- "
                 f"{figure['standard_error']:.2g} for T = {temperature:g})")
    if mean < temperature:
        return (
            f"The chain runs cold{where}: it is still descending from its start, or a thermostat "
            "soaked up the start's energy and has not given it back. Run longer, or give the "
            "sampler a longer warm-up (warmup_steps)."
        )
    noise_samplers = "" if corrects_noise else ", or use a sampler that corrects for gradient noise (CCAdL, mCCAdL)"
    kinetic = entry["kinetic"]
    positions_above_momenta = _positions_above_momenta(entry, temperature)
    # A tensor hot in both temperatures (its momenta out of band above T, or above T within a
    # wide band with no resolved gap to its positions) while the papers' single thermostat holds
    # the whole net's momenta at T: its own gradient noise is the likely source.
    tensor_hot = kinetic["mean"] > temperature and (kinetic["in_band"] is False or not positions_above_momenta)
    net_held = report["overall"]["kinetic"]["in_band"] is True
    if tensor_hot and entry is not report["overall"] and net_held and traits["thermostat"] == "one":
        return (
            f"The chain runs hot{where}: this tensor's momenta run hot too (kinetic "
            f"{kinetic['mean']:.3g} +- {kinetic['standard_error']:.2g}) while the papers' single "
            "thermostat holds the whole net's kinetic temperature at T, so its gradient noise is "
            "likely stronger than the rest of the net's. per_variable_thermostat=True gives each "
            f"trainable tensor its own thermostat{noise_samplers}."
        )
    if positions_above_momenta:
        # A second-order step where the run's is first order: mCCAdL for a sampler that already
        # corrects the noise (CCAdL), SGNHT's symmetric step or mCCAdL otherwise.
        alternatives = "mCCAdL" if corrects_noise else "SGNHT(integrator='symmetric'), mCCAdL"
        first_order = "" if traits["symmetric_step"] else ", larger for this sampler's first-order step"
        second_order = ("" if traits["symmetric_step"] else
                        f", or take a second-order step ({alternatives}), whose error at the same step is smaller")
        return (
            f"The chain runs hot{where}: its positions run hotter than its momenta (configurational "
            f"{entry['configurational']['mean']:.3g} against kinetic {kinetic['mean']:.3g}, the "
            "momenta within their band of T), the error of the step itself in the stiffest "
            f"directions{first_order}: reduce step_size (and run as much longer: a shorter step "
            f"relaxes more slowly){second_order}."
        )
    if corrects_noise:
        return (
            f"The chain runs hot{where}, a sign that the step is too long for the curvature or the "
            "gradient noise: this sampler already removes the noise's heat from the momentum, so "
            "reduce step_size (or increase friction)."
        )
    return (
        f"The chain runs hot{where}, a sign that the step is too long for the curvature or the "
        "gradient noise: reduce step_size, increase friction" + noise_samplers + "."
    )


def _positions_above_momenta(entry: dict[str, Any], temperature: float) -> bool:
    """Whether an entry's configurational temperature is out of band above T while its kinetic
    one is in band, by a gap three of their combined standard errors wide (a kinetic temperature
    in band only for its wide error does not count as at T)."""
    kinetic, configurational = entry["kinetic"], entry["configurational"]
    gap = configurational["mean"] - kinetic["mean"]
    error = math.hypot(configurational["standard_error"], kinetic["standard_error"])
    return (configurational["in_band"] is False and configurational["mean"] > temperature
            and kinetic["in_band"] is True and gap > 3.0 * error)


def _entry(report: dict[str, Any], where: str) -> dict[str, Any]:
    """The report entry (whole net or variable) that `misses` names `where`."""
    if where == "the whole net":
        return report["overall"]
    return next(v for v in report.get("variables", []) if repr(v["name"]) == where)


def summary(report: dict[str, Any]) -> str:
    """One plain line on an `EquilibrationCheck.report()` (or `model.temperature_report()`):
    whether the whole net is at T, with its mean kinetic and configurational temperatures after
    the burn-in (+- batch-means error; "unresolved" for one whose band is wider than
    `max_band * T`), and for a run out of band the `cause`.

    Example:
        >>> summary(model.temperature_report())  # doctest: +SKIP
        'at T=1 (whole net: kinetic 1.00 +- 0.01, configurational 0.98 +- 0.03; in band from step 1200)'
    """
    temperature = report["temperature"]

    def figure(kind: str) -> str:
        entry = report["overall"][kind]
        if not math.isfinite(entry["mean"]):
            return f"{kind} n/a"
        text = f"{kind} {entry['mean']:.3g} +- {entry['standard_error']:.2g}"
        return text + (" unresolved" if entry["in_band"] is None else "")

    figures = "whole net: " + ", ".join(figure(kind) for kind in KINDS)
    verdict = report["equilibrated"]
    if verdict is True:
        return f"at T={temperature:g} ({figures}; in band from step {report['equilibration_step']})"
    if verdict is False:
        return (f"NOT at T={temperature:g} ({figures}; after step {report['equilibration_step']}). "
                + cause(report))
    if report["num_blocks"] == 0 and report.get("num_blocks_without_steps_at_t", 0):
        return (f"undetermined at T={temperature:g}: none of the {report['num_blocks_without_steps_at_t']} "
                f"blocks after step {report['equilibration_step']} had a step at T. A tempering sampler's "
                "steps count only where theta is at T (TACT-HMC: its tempering variable xi on the plateau "
                "|xi| <= xi0), and it takes samples only there: this run stayed off it and took none. Run "
                "longer, or sample with a sampler that does not temper (SGNHT, CCAdL).")
    head = (f"undetermined at T={temperature:g} ({figures}; {report['num_blocks']} blocks after step "
            f"{report['equilibration_step']})")
    if unsettled(report):
        return (head + ": the whole net's configurational temperature is still too unsettled to tell whether "
                "the positions are at T (the kinetic temperature cannot: a thermostat holds it at T whatever "
                "the positions do); run longer.")
    return head + ": too few blocks, or errors too wide, to tell; run longer."


def unsettled(report: dict[str, Any]) -> bool:
    """Whether a run past its pending blocks is undetermined for want of a resolved configurational T."""
    return (report["equilibrated"] is None and not report.get("pending", True)
            and report["overall"]["configurational"]["in_band"] is None)


def never_at_t(report: dict[str, Any], min_blocks: int) -> bool:
    """Whether a run has had at least `min_blocks` blocks past its warm-up and not one step at
    T in any of them (a tempering sampler that never came back to its plateau): no verdict can
    come, and no sample either."""
    return report["num_blocks"] == 0 and report.get("num_blocks_without_steps_at_t", 0) >= min_blocks


