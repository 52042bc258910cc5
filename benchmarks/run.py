"""The benchmark runner: one YAML config in, results.json + Markdown table + plots + TensorBoard out.

    python -m benchmarks.run configs/<name>.yaml [--quick] [--mock-data] [--out DIR]
                             [--data-dir DIR] [--methods a,b] [--verbose 0|1|2]
                             [--strategy none|mirrored|multi_worker] [--logical-cpus N]

A config names a classification task (dataset, network, label noise levels), a training budget
and a list of methods. Point-estimate baselines (`optimizer:`) train the network with plain
`keras.Model.compile(optimizer=...)`; samplers (`sampler:`) wrap the same network, from the same
initial weights, in `kt.BayesianModel` with `kt.samplers.get(name, **options)`, a Gaussian prior
and `num_examples` from the data, and are evaluated by the posterior average over their samples
(`PosteriorAverage`). Results follow the layout of Luo et al. (2018), Table 1: one row per
method, one column per fraction of training labels permuted at every epoch.

Config schema (keys not listed are errors):

    name: digits                       # used in titles and the default output folder
    title: "MLP on 8x8 digits"         # optional; the table's caption
    extends: other.yaml                # optional; this file's keys override the other's
    only: [sgnht]                      # optional; keep only these methods (after `extends`)
    data:
      dataset: digits                  # digits | emnist_balanced | fashion_mnist | mnist | cifar10
      data_dir: data/real              # optional: IDX files (emnist_balanced, fashion_mnist, mnist;
                                       # `make real-data`), else a TFDS data directory; --data-dir wins
      options: {}                      # passed to the loader (flatten, squeeze_channels, ...)
      label_noise: [0.0, 0.2]          # fractions permuted each epoch (Table 1's columns)
      eval_batch_size: 1000            # batch size for test-set predictions
      train_limit: null                # optional (not digits): only the first examples of the
      test_limit: null                 # training / test split (and of `ood.dataset`'s test split)
    model:
      builder: digits_mlp              # a function of keras_thermo.networks
      options: {hidden: 50}
    training:
      epochs: 60
      batch_size: 32
      steps_per_execution: 1
      seed: 0
      num_chains: 1                    # samplers: C chains in one fit (each its own batch_size
                                       # examples per step; the posterior average pools them)
    evaluation:
      burn_in_epochs: 10               # or burn_in_steps; "auto": from an EquilibrationCheck
      check_block_epochs: 5            # the check's batch-means block (default 5 epochs)
      max_burn_in_epochs: 20           # with "auto": start averaging by then even if not at T
      every_n_steps: 10                # thinning of the posterior average
      weighting: uniform               # or step_size (SGLD)
      num_bins: 15                     # ECE / reliability diagram bins
    methods:                           # key -> method; the key names outputs and --methods
      adam: {label: Adam, optimizer: adam, options: {learning_rate: 1.0e-3}}
      sgnht:
        label: SGNHT
        sampler: sgnht
        options: {step_size: 5.0e-3, friction: 10.0}
        prior_std: 1.0                 # Gaussian prior N(0, std^2); null for a flat prior
        temperature: 1.0
      sgnht_hierarchical:
        sampler: sgnht
        options: {step_size: 5.0e-3, friction: 10.0}
        prior:                         # instead of prior_std: a prior of keras_thermo.priors
          kind: hierarchical           # gaussian {std} | fan_in {scale, bias_std} | laplace {scale} | hierarchical: each
          alpha: 1.0                   # variable's precision ~ Gamma(alpha, beta), redrawn by a
          beta: 1.0                    # Gibbs step every resample_every steps, starting from
          resample_every: 100          # 1 / initial_std^2 (HierarchicalGaussian's arguments;
          initial_std: 1.0             # those left out take its defaults)
        evaluation: {every_n_steps: 50}   # optional per-method evaluation overrides
        epochs: 40                     # optional: this method's budget instead of training.epochs
      sgnht_cyclical:
        sampler: sgnht
        options: {step_size: 2.0e-2, friction: 10.0}   # the step size at the start of every cycle
        prior_std: 1.0
        step_size_schedule:            # optional: kt.schedules.Cyclical (cSG-MCMC) over the run
          kind: cyclical
          cycles: 4                    # cycles over the run's K steps (ceil(K / cycles) each),
                                       # or cycle_epochs: 7.5 (epochs per cycle, <= the budget)
          exploration_fraction: 0.5    # [0, 1): each cycle's first part, never averaged
        evaluation: {burn_in_epochs: 0}   # the phases can stand for the burn-in (cSG-MCMC)
      sgnht_ramp:
        sampler: sgnht
        options: {step_size: 1.0e-2, friction: 10.0}
        temperature: 0.1               # where the ramp ends
        temperature_schedule:          # optional: kt.schedules.TemperatureRamp to `temperature`
          kind: ramp
          initial_temperature: 1.0     # T0 > 0 at the first step
          ramp_epochs: 10              # > 0 and below the budget; no averaging before it ends
          interpolation: geometric     # or linear (default geometric)
    tune:                              # optional: choose hyperparameters on a validation split
      validation_fraction: 0.2         # stratified part of the TRAINING split held out (clean labels)
      seed: null                       # seed of that hold-out (null: training.seed)
      label_noise: each                # tune at every noise level, or at this one level for all
      search: grid                     # every combination, or `axes`: one axis at a time
      grids:                           # under a method key, or a sampler/optimizer name
        adam: {learning_rate: [1.0e-3, 3.0e-3]}
        sgnht: {step_size: [5.0e-3, 1.0e-2], prior_std: [1.0, 3.0], temperature: [1.0]}
        sgnht_hierarchical: {prior.beta: [0.1, 1.0, 10.0]}   # an argument of its `prior:`
        sgnht_cyclical: {step_size_schedule.exploration_fraction: [0.5, 0.8]}   # and of a schedule
      share: {sgnht_layerwise: sgnht}  # runs with the settings chosen for sgnht, untuned itself
    ood:                               # optional (digits): an out-of-distribution study
      in_classes: [0, 1, 2, 3, 4]      # trained on, and their test images held out
      out_classes: [5, 6, 7, 8, 9]     # test images scored as out-of-distribution
      label_noise: 0.0                 # trained at this noise level, with its tuned settings
    # or (emnist_balanced, fashion_mnist, mnist): another of them, whose test split the reported
    # runs at `label_noise` (one of data.label_noise) score as out-of-distribution:
    #   ood: {dataset: fashion_mnist, label_noise: 0.0}
    quick:                             # applied by --quick (a few minutes on a CPU)
      epochs: 2
      train_limit: 2000                # TFDS tasks: first examples of each split
      test_limit: 1000
      mock_examples: 64                # examples per split under --mock-data
      burn_in_epochs: 0
      every_n_steps: 1
      label_noise: [0.0]
      methods: {tact_hmc: {sample_every: 1}}   # per-method hyperparameter overrides: options,
        # or a schedule's arguments, e.g. {sgnht_ramp: {temperature_schedule: {ramp_epochs: 1}}}
      tune: {grids: {adam: {learning_rate: [1.0e-3]}}}   # replaces tune's keys (grids whole)

A sampler's prior is `prior_std` (a shorthand for `prior: {kind: gaussian, std: ...}`) or a
`prior:` mapping, not both; grids tune a `prior:` mapping's arguments as `prior.<argument>`.
A stateful prior (`hierarchical`) needs `training.num_chains: 1`.

Schedules (samplers): `step_size_schedule: {kind: cyclical, ...}` runs the sampler with
`kt.schedules.Cyclical`, whose cycles start at the method's `options.step_size`; the sampler
flags as samples only the steps of each cycle's sampling phase, so the posterior average (and
the OOD study's) uses those alone, from the burn-in on (any burn-in still applies: set
`burn_in_epochs: 0` to let the phases alone decide). `temperature_schedule: {kind: ramp, ...}`
gives `BayesianModel` a `kt.schedules.TemperatureRamp` from `initial_temperature` to the
method's `temperature` over `ramp_epochs`; the posterior average never starts before the ramp
ends (a fixed burn-in is raised to it, and with `auto` the EquilibrationCheck waits for it).
Grid keys `step_size_schedule.<argument>` and `temperature_schedule.<argument>` tune their
arguments (a tuned `step_size` and `temperature` move the cycles' start and the ramp's end).

Tuning (`tune:`), for every method with a grid: (1) each trial trains on the training split
less a stratified validation part and is scored by the validation NLL; optimizers by the
best epoch of their run (early stopping, which sets `epochs`), samplers by their posterior
average at the end of the budget. Validation labels are clean, like the test split's: the
label noise belongs to the training procedure (permuted afresh each epoch). (2) The chosen
settings run on the whole training split and are scored on the test split, which step (1)
never reads; results.json keeps every trial and the choice (`runs[i].tuning`), table.md the
choice. (3) Where the chosen settings' run diverges (the trials ran on ~80% of the examples,
and a sampler's force grows with N, so a step size at the edge of stability there can be past
it on the whole split), the next-best validated setting that did not diverge in tuning is run
instead, and so on through every such trial until one does not diverge; `runs[i].fallback`
(and the chosen column of table.md) records the first choice, where it diverged and what was
reported; if every setting diverges, the first choice's run is reported as "diverged". The
OOD study (`ood:`) then trains each method, with its chosen settings, on
`in_classes` and reports the AUROC of the predictive entropy and (samplers) the mutual
information of the `out_classes` test images against the `in_classes` ones
(`ood_runs[i].ood`).

Outputs in `--out` (default `runs/<name>`): `results.json` (the resolved config, the machine,
metrics and per-epoch history of every run, its tuning trials and choice, the OOD study's runs;
NaN written as null), `table.md`, `accuracy.png`, `nll.png`, `reliability.png`, and
`tensorboard/<method>/noise<pct>/` logs (`tensorboard/tuning/...` and `tensorboard/ood/...` for
the trials and the OOD study).

Where the data come from: the digits ship with scikit-learn. EMNIST Balanced, Fashion-MNIST and
MNIST are read from their original IDX files when the data directory (`--data-dir`, else
`data.data_dir`) holds them, directly or in its subfolder `emnist/`, `fashion_mnist/` or `mnist/`
(`make real-data` installs real MNIST and Fashion-MNIST into `data/real`, docs/real_data.md);
otherwise, like CIFAR-10, from TensorFlow Datasets (in that directory, or TFDS' default). Data
found by neither route stops the runner with a message that says how to get it by each route
(or to pass `--mock-data`), exit status 2. `--mock-data` always uses TFDS' mock data.

Scaling out (`--strategy`): how a config runs is not part of it, so the same config runs on one
device or many. `mirrored` replicates every model over this machine's GPUs (or, with no GPU, its
CPU devices: `--logical-cpus N` splits the CPU into N for a try-out); `multi_worker` joins the
cluster described by the `TF_CONFIG` environment variable (start the same command on every
worker). Networks and models are built and compiled under `strategy.scope()`;
`training.batch_size` stays the global batch and must divide evenly among the replicas. Worker 0
writes to `--out`, worker i > 0 to `--out/worker<i>` (same machine or not, nothing collides).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

TOP_LEVEL_KEYS = {
    "name", "title", "extends", "only", "data", "model", "training", "evaluation", "methods", "quick", "tune", "ood",
}
DATA_KEYS = {"dataset", "data_dir", "options", "label_noise", "eval_batch_size", "train_limit", "test_limit"}
MODEL_KEYS = {"builder", "options"}
TRAINING_KEYS = {"epochs", "batch_size", "steps_per_execution", "seed", "num_chains"}
EVALUATION_KEYS = {"burn_in_epochs", "burn_in_steps", "every_n_steps", "weighting", "num_bins", "check_block_epochs",
                   "max_burn_in_epochs"}
METHOD_KEYS = {"label", "optimizer", "sampler", "options", "prior_std", "prior", "temperature", "evaluation",
               "epochs", "step_size_schedule", "temperature_schedule"}
QUICK_KEYS = {
    "epochs", "train_limit", "test_limit", "mock_examples", "burn_in_epochs", "burn_in_steps",
    "every_n_steps", "label_noise", "methods", "tune",
}
TUNE_KEYS = {"validation_fraction", "seed", "label_noise", "search", "grids", "share"}
TUNE_SEARCHES = ("grid", "axes")
# Grid keys set on the method itself; every other grid key is an option of its sampler or optimizer.
METHOD_LEVEL_PARAMETERS = ("prior_std", "temperature")
# A method's `prior:` mapping: `kind` -> (the class of keras_thermo.priors, the arguments it takes).
# Grid keys `prior.<argument>` set those arguments.
PRIOR_KINDS = {
    "gaussian": ("Gaussian", ("std",)),
    "fan_in": ("FanInGaussian", ("scale", "bias_std")),
    "laplace": ("Laplace", ("scale",)),
    "hierarchical": ("HierarchicalGaussian", ("alpha", "beta", "resample_every", "initial_std")),
}
PRIOR_GRID_PREFIX = "prior."
SCHEDULE_KEYS = ("step_size_schedule", "temperature_schedule")
# A sampler's schedules (module doc): `kind` -> the arguments its mapping takes, and those it needs.
STEP_SIZE_SCHEDULE_KINDS = {"cyclical": ("cycles", "cycle_epochs", "exploration_fraction")}
TEMPERATURE_SCHEDULE_KINDS = {"ramp": ("initial_temperature", "ramp_epochs", "interpolation")}
REQUIRED_SCHEDULE_ARGUMENTS = {"ramp": ("initial_temperature", "ramp_epochs")}
# Method keys that hold a `kind:` mapping -> {kind: its arguments}; the grid key
# `<method key>.<argument>` (e.g. `step_size_schedule.exploration_fraction`) sets an argument.
MAPPING_PARAMETERS = {
    "prior": {kind: arguments for kind, (_, arguments) in PRIOR_KINDS.items()},
    "step_size_schedule": STEP_SIZE_SCHEDULE_KINDS,
    "temperature_schedule": TEMPERATURE_SCHEDULE_KINDS,
}
OOD_KEYS = {"in_classes", "out_classes", "dataset", "label_noise"}
# Datasets of one image shape: a net trained on one scores another's test split as OOD.
OOD_DATASETS = ("emnist_balanced", "fashion_mnist", "mnist")
DATASETS = ("digits", "emnist_balanced", "fashion_mnist", "mnist", "cifar10")
DEFAULT_MOCK_EXAMPLES = 64
STRATEGIES = ("none", "mirrored", "multi_worker")
EXIT_ERROR = 2  # missing data or a bad config, like argparse usage errors


class ConfigError(ValueError):
    """A config file that does not follow the schema of this module."""


# --------------------------------------------------------------------------------------------
# Config: load, inherit, validate, shrink for --quick


def _merge(base: dict, override: dict) -> dict:
    """`override` on top of `base`, recursively for mappings (other values are replaced)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"`extends` loops back to {path}.")
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle) or {}
    if not isinstance(config, dict):
        raise ConfigError(f"Config {str(path)!r} must be a mapping at the top level, got {type(config).__name__}.")
    parent = config.pop("extends", None)
    if parent is None:
        return config
    if not isinstance(parent, str):
        raise ConfigError(f"`extends` in {str(path)!r} must be a file name, got {parent!r}.")
    base = _read_yaml(path.parent / parent, seen + (path,))
    base.pop("only", None)  # a selection applies to the file that states it
    return _merge(base, config)


def _check_keys(where: str, mapping: Any, allowed: set[str]) -> dict:
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"`{where}` must be a mapping, got {mapping!r}.")
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ConfigError(f"`{where}` has unknown keys {unknown}; allowed: {sorted(allowed)}.")
    return mapping


def load_config(path: str | os.PathLike) -> dict:
    """Reads a config, resolves `extends` and `only`, and checks it against the schema.

    Returns:
        The resolved config (a plain dict), ready for `run_config`.

    Raises:
        ConfigError: A key is unknown, a required one is missing, or a value is malformed.
    """
    config = _read_yaml(Path(path))
    _check_keys("config", config, TOP_LEVEL_KEYS)
    for key in ("name", "data", "model", "training", "methods"):
        if key not in config:
            raise ConfigError(f"Config {str(path)!r} lacks the required key `{key}`.")
    data = _check_keys("data", config["data"], DATA_KEYS)
    if data.get("dataset") not in DATASETS:
        raise ConfigError(f"`data.dataset` must be one of {list(DATASETS)}, got {data.get('dataset')!r}.")
    noise = data.setdefault("label_noise", [0.0])
    data["label_noise"] = [float(v) for v in (noise if isinstance(noise, list) else [noise])]
    if not data["label_noise"] or any(not 0.0 <= v <= 1.0 for v in data["label_noise"]):
        raise ConfigError(f"`data.label_noise` must be fractions in [0, 1], got {noise!r}.")
    data.setdefault("options", {})
    data.setdefault("eval_batch_size", 1000)
    data.setdefault("data_dir", None)
    if data["data_dir"] is not None and (not isinstance(data["data_dir"], str) or not data["data_dir"]):
        raise ConfigError(f"`data.data_dir` must be a directory name or null, got {data['data_dir']!r}.")
    for key in ("train_limit", "test_limit"):
        limit = data.setdefault(key, None)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ConfigError(f"`data.{key}` must be a positive integer (the first examples of the split) or null, "
                              f"got {limit!r}.")
    model = _check_keys("model", config["model"], MODEL_KEYS)
    model.setdefault("options", {})
    training = _check_keys("training", config["training"], TRAINING_KEYS)
    for key in ("epochs", "batch_size"):
        if not isinstance(training.get(key), int) or training[key] < 1:
            raise ConfigError(f"`training.{key}` must be a positive integer, got {training.get(key)!r}.")
    training.setdefault("steps_per_execution", 1)
    training.setdefault("seed", 0)
    training.setdefault("num_chains", 1)
    if not isinstance(training["num_chains"], int) or isinstance(training["num_chains"], bool) or training["num_chains"] < 1:
        raise ConfigError(f"`training.num_chains` must be a positive integer, got {training['num_chains']!r}.")
    config["evaluation"] = _check_keys("evaluation", config.get("evaluation"), EVALUATION_KEYS)
    config["quick"] = _check_keys("quick", config.get("quick"), QUICK_KEYS)

    methods = config["methods"]
    if not isinstance(methods, dict) or not methods:
        raise ConfigError(f"`methods` must be a non-empty mapping of key -> method, got {methods!r}.")
    for key, method in methods.items():
        _check_keys(f"methods.{key}", method, METHOD_KEYS)
        if ("optimizer" in method) == ("sampler" in method):
            raise ConfigError(f"`methods.{key}` must have exactly one of `optimizer` and `sampler`.")
        method.setdefault("label", key)
        method.setdefault("options", {})
        if "epochs" in method and (isinstance(method["epochs"], bool) or not isinstance(method["epochs"], int)
                                   or method["epochs"] < 1):
            raise ConfigError(f"`methods.{key}.epochs` must be a positive integer, got {method['epochs']!r}.")
        _check_keys(f"methods.{key}.evaluation", method.get("evaluation"), EVALUATION_KEYS)
        if "prior" in method:
            check_prior(f"methods.{key}", method, training["num_chains"])
        check_schedules(f"methods.{key}", method, int(method.get("epochs", training["epochs"])))
    config["title"] = config.get("title") or str(config["name"])
    if config.get("tune") is not None:
        config["tune"] = check_tune(config["tune"], config["methods"], "tune")
    if config["quick"].get("tune") is not None:
        if config.get("tune") is None:
            raise ConfigError("`quick.tune` shrinks the `tune:` block, which this config lacks.")
        quick_tune(config["tune"], config["quick"]["tune"], config["methods"])
    if config.get("ood") is not None:
        config["ood"] = check_ood(config["ood"], config["data"])
    only = config.pop("only", None)
    return config if only is None else with_methods(config, only)


def with_methods(config: dict, keys: list[str] | str) -> dict:
    """The config with only the methods named in `keys`, and the tuning grids that apply to
    them; a method whose `tune.share` source is not among them is tuned on its own grid."""
    methods = select_methods(config["methods"], keys)
    names = set(methods) | {m.get("sampler", m.get("optimizer")) for m in methods.values()}
    config = dict(config, methods=methods)

    def narrowed(tune: dict) -> dict:
        tune = dict(tune, grids={k: v for k, v in (tune.get("grids") or {}).items() if k in names})
        if "share" in tune:
            tune["share"] = {k: v for k, v in tune["share"].items() if k in methods and v in methods}
        return tune

    if config.get("tune") is not None:
        config["tune"] = narrowed(config["tune"])
    if (config.get("quick") or {}).get("tune") is not None:
        config["quick"] = dict(config["quick"], tune=narrowed(config["quick"]["tune"]))
    return config


def _fraction(where: str, value: Any, *, open_low: bool, open_high: bool) -> float:
    """`value` as a float in [0, 1] (ends excluded as asked), or a config error naming `where`."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value))
    if not bad:
        value = float(value)
        bad = value < 0 or value > 1 or (open_low and value == 0) or (open_high and value == 1)
    if bad:
        ends = ("(" if open_low else "[") + "0, 1" + (")" if open_high else "]")
        raise ConfigError(f"`{where}` must be a number in {ends}, got {value!r}.")
    return value


def grid_for(tune: dict, key: str, method: dict) -> dict | None:
    """The grid of `tune.grids` for a method: under its key, else under its sampler/optimizer
    name; None for a method that is not tuned or takes another's choice (`tune.share`)."""
    if key in (tune.get("share") or {}):
        return None
    grids = tune.get("grids") or {}
    return grids.get(key, grids.get(method.get("sampler", method.get("optimizer"))))


def check_prior(where: str, method: dict, num_chains: int = 1) -> dict:
    """A method's `prior:` mapping: a known `kind` and only that kind's arguments, on a sampler
    with no `prior_std` (one prior per method). The values are checked when the prior is built."""
    prior = method["prior"]
    if "sampler" not in method:
        raise ConfigError(f"`{where}.prior` applies to samplers only; `{where}` is an optimizer.")
    if method.get("prior_std") is not None:
        raise ConfigError(
            f"`{where}` sets both `prior_std` ({method['prior_std']!r}) and `prior`; give one (`prior_std: s` "
            "is `prior: {kind: gaussian, std: s}`).")
    if not isinstance(prior, dict) or prior.get("kind") not in PRIOR_KINDS:
        got = prior.get("kind") if isinstance(prior, dict) else prior
        raise ConfigError(
            f"`{where}.prior` must be a mapping with `kind` one of {sorted(PRIOR_KINDS)}, got {got!r}.")
    _check_keys(f"{where}.prior", prior, {"kind", *PRIOR_KINDS[prior["kind"]][1]})
    if prior["kind"] == "hierarchical" and num_chains != 1:
        raise ConfigError(
            f"`{where}.prior` kind 'hierarchical' keeps a state of its own (the precisions), which is not "
            f"kept per chain; it needs `training.num_chains: 1`, got {num_chains!r}.")
    return prior


def _positive(where: str, value: Any, *, integer: bool = False, below: float | None = None,
              at_most: float | None = None) -> None:
    """A config error naming `where` unless `value` is a positive number (an int if `integer`),
    less than `below` and at most `at_most` where given."""
    kinds = int if integer else (int, float)
    if (isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0
            or (below is not None and value >= below) or (at_most is not None and value > at_most)):
        bound = f" below {below!r}" if below is not None else (f" at most {at_most!r}" if at_most is not None else "")
        allowed = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"`{where}` must be {allowed}{bound}, got {value!r}.")


def check_schedules(where: str, method: dict, epochs: int) -> None:
    """A sampler's `step_size_schedule:` and `temperature_schedule:` mappings (module doc): a
    known `kind` with its arguments only, and values in range, so that a bad one, configured or
    set by a grid, stops the runner before anything trains. `epochs`: the method's budget."""
    for name, kinds in (("step_size_schedule", STEP_SIZE_SCHEDULE_KINDS),
                        ("temperature_schedule", TEMPERATURE_SCHEDULE_KINDS)):
        spec = method.get(name)
        if spec is None:
            continue
        if "sampler" not in method:
            raise ConfigError(f"`{where}.{name}` applies to samplers only; `{where}` is an optimizer.")
        if not isinstance(spec, dict) or spec.get("kind") not in kinds:
            got = spec.get("kind") if isinstance(spec, dict) else spec
            raise ConfigError(f"`{where}.{name}` must be a mapping with `kind` one of {sorted(kinds)}, got {got!r}.")
        _check_keys(f"{where}.{name}", spec, {"kind", *kinds[spec["kind"]]})
        missing = [a for a in REQUIRED_SCHEDULE_ARGUMENTS.get(spec["kind"], ()) if a not in spec]
        if missing:
            raise ConfigError(f"`{where}.{name}` of kind {spec['kind']!r} needs {missing}.")
    cyclical = method.get("step_size_schedule")
    if cyclical is not None:
        if ("cycles" in cyclical) == ("cycle_epochs" in cyclical):
            raise ConfigError(
                f"`{where}.step_size_schedule` needs exactly one of `cycles` (cycles over the run) and "
                f"`cycle_epochs` (epochs per cycle), got {cyclical!r}.")
        if "cycles" in cyclical:
            _positive(f"{where}.step_size_schedule.cycles", cyclical["cycles"], integer=True)
        else:
            _positive(f"{where}.step_size_schedule.cycle_epochs", cyclical["cycle_epochs"], at_most=epochs)
        if "exploration_fraction" in cyclical:
            _fraction(f"{where}.step_size_schedule.exploration_fraction", cyclical["exploration_fraction"],
                      open_low=False, open_high=True)
        step_size = method["options"].get("step_size")
        if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not step_size > 0:
            raise ConfigError(
                f"`{where}.step_size_schedule` starts every cycle at the sampler's `options.step_size`, which "
                f"must be a positive number, got {step_size!r}.")
    ramp = method.get("temperature_schedule")
    if ramp is not None:
        from keras_thermo.schedules import RAMP_INTERPOLATIONS  # noqa: PLC0415 (TensorFlow import is slow)

        _positive(f"{where}.temperature_schedule.initial_temperature", ramp["initial_temperature"])
        # The posterior average starts after the ramp, so the ramp must end within the budget.
        _positive(f"{where}.temperature_schedule.ramp_epochs", ramp["ramp_epochs"], below=epochs)  # epochs: budget
        if ramp.get("interpolation", "geometric") not in RAMP_INTERPOLATIONS:
            raise ConfigError(
                f"`{where}.temperature_schedule.interpolation` must be one of {list(RAMP_INTERPOLATIONS)}, "
                f"got {ramp['interpolation']!r}.")
        _positive(f"{where}.temperature", method.get("temperature", 1.0))  # where the ramp ends


def _mapping_argument(name: str) -> tuple[str, str] | None:
    """`(method key, argument)` of a grid key such as `prior.beta`; None for another name."""
    head, dot, argument = name.partition(".")
    return (head, argument) if dot and head in MAPPING_PARAMETERS else None


def _check_grid_parameter(where: str, parameter: str, key: str, method: dict) -> None:
    """A grid key fits the method it tunes: `prior.<argument>` (and `step_size_schedule.`,
    `temperature_schedule.`) needs that mapping, of a kind with that argument, and
    `prior_std` a method without a `prior:` mapping."""
    prior = method.get("prior")
    mapped = _mapping_argument(parameter)
    if mapped is not None:
        name, argument = mapped
        spec = method.get(name)
        if spec is None:
            instead = (" (it uses `prior_std`); give the method a `prior:` mapping or tune `prior_std`"
                       if name == "prior" else f"; give the method a `{name}:` mapping")
            raise ConfigError(f"`{where}` tunes the `{name}:` mapping of method {key!r}, which has none{instead}.")
        allowed = MAPPING_PARAMETERS[name][spec["kind"]]
        if argument not in allowed:
            raise ConfigError(
                f"`{where}`: {argument!r} is not an argument of method {key!r}'s {spec['kind']!r} "
                f"{name.replace('_', ' ')}; allowed: {[f'{name}.{a}' for a in allowed]}.")
    elif parameter == "prior_std" and prior is not None:
        raise ConfigError(
            f"`{where}` tunes `prior_std` of method {key!r}, which has a `prior:` mapping; tune its "
            f"arguments as {[PRIOR_GRID_PREFIX + a for a in PRIOR_KINDS[prior['kind']][1]]}.")


def check_tune(tune: Any, methods: dict, where: str = "tune") -> dict:
    """The `tune:` block with defaults filled in; refuses unknown keys and malformed grids.

    Each grid maps a hyperparameter to the list of values to try: `prior_std` and `temperature`
    (samplers) set the method's own keys, `prior.<argument>` an argument of its `prior:` mapping,
    any other name an option of its sampler or optimizer.
    `epochs` is not a grid key: optimizers choose it by validation NLL, samplers keep the
    training budget.
    """
    tune = dict(_check_keys(where, tune, TUNE_KEYS))
    tune["validation_fraction"] = _fraction(
        f"{where}.validation_fraction", tune.get("validation_fraction", 0.2), open_low=True, open_high=True)
    seed = tune.setdefault("seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"`{where}.seed` must be a non-negative integer or null, got {seed!r}.")
    noise = tune.setdefault("label_noise", "each")
    if noise != "each":
        tune["label_noise"] = _fraction(f"{where}.label_noise", noise, open_low=False, open_high=False)
    if tune.setdefault("search", "grid") not in TUNE_SEARCHES:
        raise ConfigError(f"`{where}.search` must be one of {list(TUNE_SEARCHES)}, got {tune['search']!r}.")
    grids = tune.setdefault("grids", {})
    if not isinstance(grids, dict):
        raise ConfigError(f"`{where}.grids` must be a mapping of method -> grid, got {grids!r}.")
    names = set(methods) | {m.get("sampler", m.get("optimizer")) for m in methods.values()}
    for name, grid in grids.items():
        if name not in names:
            raise ConfigError(
                f"`{where}.grids.{name}` names no method key, sampler or optimizer of this config; "
                f"allowed: {sorted(names)}.")
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(
                f"`{where}.grids.{name}` must be a non-empty mapping of hyperparameter -> values, got {grid!r}.")
        for parameter, values in grid.items():
            if parameter == "epochs":
                raise ConfigError(
                    f"`{where}.grids.{name}.epochs`: epochs are not a grid key; optimizers choose them by "
                    "validation NLL, samplers keep `training.epochs`.")
            if not isinstance(values, list) or not values:
                raise ConfigError(
                    f"`{where}.grids.{name}.{parameter}` must be a non-empty list of values, got {values!r}.")
    share = tune.setdefault("share", {})
    if not isinstance(share, dict):
        raise ConfigError(f"`{where}.share` must be a mapping of method key -> method key, got {share!r}.")
    for key, source in share.items():
        if key not in methods or source not in methods or source in share or source == key:
            raise ConfigError(
                f"`{where}.share.{key}: {source}` must map a method key to another method key that is tuned "
                f"itself; methods: {sorted(methods)}.")
    for key, method in methods.items():  # each grid key fits every method that its grid tunes
        grid = grid_for(tune, key, method)
        name = key if key in grids else method.get("sampler", method.get("optimizer"))
        for parameter in grid or {}:
            _check_grid_parameter(f"{where}.grids.{name}.{parameter}", parameter, key, method)
    return tune


def check_ood(ood: Any, data: dict) -> dict:
    """The `ood:` block: digits classes to train on and to score as out-of-distribution, or
    (MNIST-like datasets) another dataset whose test split the reported runs score as OOD."""
    ood = dict(_check_keys("ood", ood, OOD_KEYS))
    ood["label_noise"] = _fraction("ood.label_noise", ood.get("label_noise", 0.0), open_low=False, open_high=False)
    if "dataset" in ood:
        if ood.keys() & {"in_classes", "out_classes"}:
            raise ConfigError("`ood` takes either `dataset` or `in_classes` and `out_classes`, not both.")
        if data["dataset"] not in OOD_DATASETS or ood["dataset"] not in OOD_DATASETS or ood["dataset"] == data["dataset"]:
            raise ConfigError(
                f"`ood.dataset` must be one of {list(OOD_DATASETS)} other than `data.dataset`, and `data.dataset` "
                f"one of them too (same image shape); got ood.dataset {ood['dataset']!r} with data.dataset "
                f"{data['dataset']!r}.")
        levels = data.get("label_noise") or []
        if ood["label_noise"] not in levels:
            raise ConfigError(
                f"`ood.label_noise` {ood['label_noise']} must be one of `data.label_noise` {levels}: the reported "
                f"runs at that level score {ood['dataset']!r}.")
        return ood
    if data["dataset"] != "digits":
        raise ConfigError(
            f"`ood` with `in_classes`/`out_classes` needs `data.dataset: digits` (it selects digit classes), got "
            f"{data['dataset']!r}; for {list(OOD_DATASETS)} give `ood.dataset`, another of them.")
    for key, least in (("in_classes", 2), ("out_classes", 2)):
        classes = ood.get(key)
        if (not isinstance(classes, list) or len(classes) < least or len(set(classes)) != len(classes)
                or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 9 for c in classes)):
            raise ConfigError(
                f"`ood.{key}` must be a list of at least {least} distinct digits in 0..9, got {classes!r}.")
    if set(ood["in_classes"]) & set(ood["out_classes"]):
        raise ConfigError(
            f"`ood.in_classes` {ood['in_classes']} and `ood.out_classes` {ood['out_classes']} must not share a digit.")
    return ood


def select_methods(methods: dict, keys: list[str] | str) -> dict:
    """The methods named in `keys` (a list or a comma-separated string), in config order."""
    wanted = [k.strip() for k in (keys.split(",") if isinstance(keys, str) else keys) if k.strip()]
    unknown = sorted(set(wanted) - set(methods))
    if unknown or not wanted:
        raise ConfigError(f"Methods {unknown or wanted} are not in the config; it has {list(methods)}.")
    return {key: method for key, method in methods.items() if key in wanted}


def apply_quick(config: dict) -> dict:
    """The config shrunk by its `quick:` section (a run of minutes on a CPU)."""
    config = copy.deepcopy(config)
    quick = config["quick"]
    if "epochs" in quick:
        config["training"]["epochs"] = int(quick["epochs"])
    if "label_noise" in quick:
        config["data"]["label_noise"] = [float(v) for v in quick["label_noise"]]
    else:
        config["data"]["label_noise"] = config["data"]["label_noise"][:1]
    evaluation = config["evaluation"]
    for key, alternative in (("burn_in_epochs", "burn_in_steps"), ("burn_in_steps", "burn_in_epochs")):
        if key in quick:  # the quick burn-in replaces the config's, in whichever unit it has
            evaluation.pop(alternative, None)
            evaluation[key] = quick[key]
    if "every_n_steps" in quick:
        evaluation["every_n_steps"] = quick["every_n_steps"]
    for method in config["methods"].values():
        method.pop("evaluation", None)  # the quick evaluation schedule applies to every method
        method.pop("epochs", None)  # and the quick budget
    for key, options in (quick.get("methods") or {}).items():
        if key in config["methods"]:
            method = config["methods"][key]
            for name in SCHEDULE_KEYS:  # a schedule's arguments (e.g. a shorter ramp), else options
                if name in options:
                    options = dict(options)
                    method[name] = _merge(method.get(name) or {}, options.pop(name))
            method["options"] = _merge(method["options"], options)
    if config.get("tune") is not None and quick.get("tune") is not None:
        config["tune"] = quick_tune(config["tune"], quick["tune"], config["methods"])
    return config


def quick_tune(tune: dict, override: Any, methods: dict) -> dict:
    """The `tune:` block under `quick.tune`: its keys replace the block's, and its `grids`
    replace the block's grids whole (merged key by key they would keep the long lists)."""
    override = dict(_check_keys("quick.tune", override, TUNE_KEYS))
    merged = copy.deepcopy(tune)
    merged.update(copy.deepcopy(override))
    return check_tune(merged, methods, "quick.tune")


# --------------------------------------------------------------------------------------------
# Data and networks


@dataclasses.dataclass
class TaskData:
    """What one run trains on and is scored on.

    `test` is the clean test split for reported runs, and for tuning runs the validation part
    held out of the training split (`holdout` then records the two parts' indices into the
    training split). `ood` holds out-of-distribution examples for the OOD study (their labels
    are placeholders).
    """

    train: Any  # keras_thermo.data.ClassificationData
    test: Any
    ood: Any = None
    holdout: dict | None = None


def _loader(config: dict, *, quick: bool, data_dir: str | None, dataset: str | None = None):
    """`load(split, **kwargs)` for the config's dataset (or `dataset`, read with the same
    options), with its options, seed and quick limits."""
    from keras_thermo import data as kt_data  # noqa: PLC0415 (TensorFlow import is slow)

    spec = config["data"]
    dataset = dataset or spec["dataset"]
    common = {"seed": int(config["training"]["seed"]), **spec["options"]}
    if dataset == "digits":
        load = kt_data.load_digits
    else:
        load = {
            "emnist_balanced": kt_data.load_emnist_balanced,
            "fashion_mnist": kt_data.load_fashion_mnist,
            "mnist": kt_data.load_mnist,
            "cifar10": kt_data.load_cifar10,
        }[dataset]
        common["data_dir"] = data_dir
    limits = {}
    if dataset != "digits":  # the data block's subset, which --quick's limits replace
        limits = {split: spec.get(f"{split}_limit") for split in ("train", "test")}
        if quick:
            limits = {split: config["quick"].get(f"{split}_limit", limit) for split, limit in limits.items()}

    def load_split(split: str, **kwargs):
        limit = limits.get(split)
        return load(split, **common, **({} if limit is None else {"limit": int(limit)}), **kwargs)

    return load_split


def load_task_data(config: dict, label_noise: float, *, quick: bool, mock_data: bool, data_dir: str | None,
                   part: str = "test") -> TaskData:
    """The training data (with label noise) and the clean, unshuffled data a run is scored on.

    Args:
        part: `"test"`: the training split and the test split. `"validation"`: the training
            split cut by `stratified_holdout` (fraction and seed of `tune:`) into the part
            trained on and the validation part scored on; the test split is not read. `"ood"`:
            the training and test examples of `ood.in_classes`, and the test examples of
            `ood.out_classes` as out-of-distribution data. With `ood.dataset` (another
            dataset), `"test"` at `ood.label_noise` also holds that dataset's test split as
            out-of-distribution data.
    """
    from keras_thermo import data as kt_data  # noqa: PLC0415

    spec = config["data"]
    # The command line's directory, else the config's; mock data never reads a real file.
    data_dir = None if mock_data else data_dir or spec.get("data_dir")
    load = _loader(config, quick=quick, data_dir=data_dir)
    batch_size = int(config["training"]["batch_size"])
    # Minibatches drawn with replacement (independent draws, the papers' protocol): reshuffled
    # epochs make an epoch's gradient noise sum to zero, which biases the thermostats and
    # CCAdL/mCCAdL's covariance correction. The last, smaller batch of a pass is dropped: the
    # draws are independent anyway, and a batch of a few examples scaled up to N is a kick of
    # gradient noise once per epoch.
    training = {"batch_size": batch_size, "shuffle": True, "with_replacement": True, "label_noise": label_noise}
    scoring = {"batch_size": int(spec["eval_batch_size"]), "shuffle": False, "label_noise": 0.0}

    def train_split(**kwargs):
        data = load("train", **training, **kwargs)
        if data.num_examples > batch_size and data.num_examples % batch_size:
            data = load("train", **training, drop_remainder=True, **kwargs)
        return data

    def build() -> TaskData:
        if part == "test":
            ood = config.get("ood") or {}
            other = None
            if ood.get("dataset") and label_noise == ood["label_noise"]:
                other = _loader(config, quick=quick, data_dir=data_dir, dataset=ood["dataset"])("test", **scoring)
            return TaskData(train_split(), load("test", **scoring), ood=other)
        if part == "validation":
            tune = config["tune"]
            labels = load("train", **scoring).labels
            seed = int(config["training"]["seed"] if tune["seed"] is None else tune["seed"])
            kept, held_out = kt_data.stratified_holdout(labels, tune["validation_fraction"], seed)
            # Validation labels stay clean, like the test split's: the label noise is the training
            # procedure's (permuted afresh every epoch), not the data's.
            return TaskData(train_split(examples=kept), load("train", **scoring, examples=held_out),
                            holdout={"fit": kept, "validation": held_out, "train_examples": len(labels)})
        if part == "ood":
            ood = config["ood"]
            return TaskData(train_split(classes=ood["in_classes"]),
                            load("test", **scoring, classes=ood["in_classes"]),
                            ood=load("test", **scoring, classes=ood["out_classes"]))
        raise ValueError(f"`part` must be 'test', 'validation' or 'ood', got {part!r}.")

    if mock_data and spec["dataset"] != "digits":
        import tensorflow_datasets as tfds  # noqa: PLC0415

        num_examples = int(config["quick"].get("mock_examples", DEFAULT_MOCK_EXAMPLES))
        with tfds.testing.mock_data(num_examples=num_examples):
            return build()
    return build()


def build_net(config: dict, seed: int):
    """The config's network with the initial weights fixed by `seed` (same for every method)."""
    import keras  # noqa: PLC0415

    from keras_thermo import networks as kt_networks  # noqa: PLC0415

    builder = getattr(kt_networks, str(config["model"]["builder"]), None)
    if builder is None or not callable(builder):
        raise ConfigError(f"`model.builder` {config['model']['builder']!r} is not a function of keras_thermo.networks.")
    keras.utils.set_random_seed(seed)
    return builder(**config["model"]["options"])


def build_sampler(method: dict, step_size=None):
    """`kt.samplers.get(name, **options)`, with a config error that names the method;
    `step_size` (a schedule) replaces `options.step_size` where given."""
    import keras_thermo as kt  # noqa: PLC0415

    options = dict(method["options"]) if step_size is None else dict(method["options"], step_size=step_size)
    try:
        return kt.samplers.get(method["sampler"], **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"Method {method['label']!r}: cannot build sampler {method['sampler']!r}: {error}") from error


def build_prior(method: dict):
    """The method's prior: its `prior:` mapping, else `Gaussian(prior_std)`, else None (flat),
    with a config error that names the method."""
    import keras_thermo as kt  # noqa: PLC0415

    spec = method.get("prior")
    try:
        if spec is None:
            std = method.get("prior_std")
            return None if std is None else kt.priors.Gaussian(float(std))
        class_name, _ = PRIOR_KINDS[spec["kind"]]
        return getattr(kt.priors, class_name)(**{k: v for k, v in spec.items() if k != "kind"})
    except (TypeError, ValueError) as error:
        described = spec if spec is not None else {"prior_std": method.get("prior_std")}
        raise ConfigError(f"Method {method['label']!r}: cannot build the prior {described!r}: {error}") from error


def build_step_size_schedule(method: dict, steps_per_epoch: int, epochs: int):
    """The method's `step_size_schedule:` as a `kt.schedules.Cyclical` over its run of
    `epochs * steps_per_epoch` steps, each cycle starting at `options.step_size`; None without
    one. `cycles: M` gives cycles of ceil(K / M) steps for K steps in all (Zhang et al. 2020)."""
    import keras_thermo as kt  # noqa: PLC0415

    spec = method.get("step_size_schedule")
    if spec is None:
        return None
    total = epochs * steps_per_epoch
    if "cycles" in spec:
        if spec["cycles"] > total:
            raise ConfigError(f"Method {method['label']!r}: `step_size_schedule.cycles` {spec['cycles']!r} is more "
                              f"than the run's {total} steps.")
        length = math.ceil(total / spec["cycles"])
    else:
        length = max(1, round(spec["cycle_epochs"] * steps_per_epoch))
    fraction = {"exploration_fraction": spec["exploration_fraction"]} if "exploration_fraction" in spec else {}
    try:
        return kt.schedules.Cyclical(float(method["options"]["step_size"]), length, **fraction)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"Method {method['label']!r}: cannot build the step-size schedule {spec!r} "
                          f"({length} of the run's {total} steps per cycle): {error}") from error


def build_temperature(method: dict, steps_per_epoch: int):
    """The method's temperature: a `kt.schedules.TemperatureRamp` from `initial_temperature` to
    the method's `temperature` over `ramp_epochs` (its `temperature_schedule:`), else that float."""
    import keras_thermo as kt  # noqa: PLC0415

    temperature = float(method.get("temperature", 1.0))
    spec = method.get("temperature_schedule")
    if spec is None:
        return temperature
    try:
        return kt.schedules.TemperatureRamp(
            float(spec["initial_temperature"]), temperature, max(1, round(spec["ramp_epochs"] * steps_per_epoch)),
            spec.get("interpolation", "geometric"))
    except (TypeError, ValueError) as error:
        raise ConfigError(f"Method {method['label']!r}: cannot build the temperature schedule {spec!r}: {error}") \
            from error


def sampler_is_registered(name: str) -> bool:
    """Whether `kt.samplers.get(name)` knows the sampler (some may be added later)."""
    import keras_thermo as kt  # noqa: PLC0415

    return str(name).lower().replace("-", "_") in kt.samplers.available()


def build_optimizer(method: dict):
    import keras  # noqa: PLC0415

    try:
        return keras.optimizers.get({"class_name": method["optimizer"], "config": dict(method["options"])})
    except (TypeError, ValueError) as error:
        raise ConfigError(f"Method {method['label']!r}: cannot build optimizer {method['optimizer']!r}: {error}") from error


# --------------------------------------------------------------------------------------------
# tf.distribute


def split_cpu(num_devices: int) -> None:
    """Splits the first physical CPU into `num_devices` logical devices.

    Lets `--strategy mirrored` run (slowly) on a machine without GPUs. TensorFlow fixes its
    devices when it first uses them, so this must run before anything else touches TensorFlow.

    Raises:
        ValueError: `num_devices` is not a positive integer.
        RuntimeError: TensorFlow has already initialised its devices.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"`num_devices` must be a positive integer, got {num_devices!r}.")
    import tensorflow as tf  # noqa: PLC0415

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def make_strategy(kind: str):
    """The `tf.distribute` strategy named by `--strategy`, or None for `"none"`.

    `"mirrored"` uses every GPU, or every (logical) CPU device when there is no GPU;
    `"multi_worker"` reads the cluster and this worker's index from `TF_CONFIG`.

    Raises:
        ValueError: `kind` is not one of `STRATEGIES`, or `"multi_worker"` without `TF_CONFIG`.
    """
    if kind not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {list(STRATEGIES)}, got {kind!r}.")
    if kind == "none":
        return None
    import tensorflow as tf  # noqa: PLC0415

    if kind == "mirrored":
        if tf.config.list_logical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    if not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "`strategy` 'multi_worker' needs the TF_CONFIG environment variable, e.g. "
            '{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}.'
        )
    return tf.distribute.MultiWorkerMirroredStrategy()


def describe_strategy(strategy) -> dict:
    """What results.json records about how the run was distributed."""
    if strategy is None:
        return {"strategy": "none", "num_replicas": 1, "num_workers": 1, "worker_index": 0}
    import tensorflow as tf  # noqa: PLC0415

    kinds = ((tf.distribute.MultiWorkerMirroredStrategy, "multi_worker"), (tf.distribute.MirroredStrategy, "mirrored"))
    kind = next((name for cls, name in kinds if isinstance(strategy, cls)), type(strategy).__name__)
    resolver = getattr(strategy, "cluster_resolver", None)
    workers = len((resolver.cluster_spec().as_dict() if resolver else {}).get("worker", [])) or 1
    return {
        "strategy": kind,
        "num_replicas": int(strategy.num_replicas_in_sync),
        "num_workers": workers,
        "worker_index": int(resolver.task_id) if resolver and resolver.task_id is not None else 0,
    }


def describe_machine() -> dict:
    """What results.json records about the hardware the figures come from."""
    import platform  # noqa: PLC0415

    import tensorflow as tf  # noqa: PLC0415

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_cores": len(affinity) if affinity else os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "gpus": [device.name for device in tf.config.list_physical_devices("GPU")],
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def output_folder(out: str | os.PathLike, strategy) -> Path:
    """`out` for worker 0 (or no strategy), `out/worker<i>` for worker i > 0 of a cluster."""
    index = describe_strategy(strategy)["worker_index"]
    return Path(out) / f"worker{index}" if index > 0 else Path(out)


def adapt_to_strategy(config: dict, strategy, log=print) -> dict:
    """The config as it can run under `strategy`; fails before training on what cannot.

    Keras cannot synchronise replicas inside its multi-step loop (keras-team/keras#19246), so
    `training.steps_per_execution` becomes 1 when there is more than one replica.

    Raises:
        ConfigError: The global batch does not divide evenly among the replicas, or a plain
            Keras baseline is asked to run on several workers.
    """
    if strategy is None:
        return config
    replicas = int(strategy.num_replicas_in_sync)
    batch = int(config["training"]["batch_size"])
    if batch % replicas:
        raise ConfigError(
            f"`training.batch_size` is the global batch and must divide evenly among the {replicas} "
            f"replicas, got {batch}."
        )
    if describe_strategy(strategy)["num_workers"] > 1:
        baselines = [key for key, method in config["methods"].items() if "optimizer" in method]
        if baselines:
            # Keras 3 reduces a plain model's first batch and scalar logs in ways a multi-worker
            # strategy refuses (keras-team/keras#20585).
            raise ConfigError(
                f"Methods {baselines} train a plain Keras model, which Keras 3 cannot `fit` under "
                "a multi-worker strategy (keras-team/keras#20585); select samplers with --methods."
            )
    if replicas > 1 and int(config["training"]["steps_per_execution"]) != 1:
        log(f"steps_per_execution {config['training']['steps_per_execution']} -> 1: Keras cannot "
            f"synchronise {replicas} replicas inside its multi-step loop.")
        config = copy.deepcopy(config)
        config["training"]["steps_per_execution"] = 1
    return config


# --------------------------------------------------------------------------------------------
# Runs


def _point_estimate_callback(test, num_bins: int):
    """A Keras callback writing the current weights' test metrics into the epoch logs."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from keras_thermo import metrics as kt_metrics  # noqa: PLC0415

    class PointEstimateEvaluation(keras.callbacks.Callback):
        """`test_accuracy`, `test_nll`, `test_ece`, `test_brier` of the current weights."""

        def __init__(self):
            super().__init__()
            self._logits = None
            self.last_probs = None

        def evaluate(self) -> dict:
            if self._logits is None:
                self._logits = tf.function(lambda x: self.model(x, training=False), reduce_retracing=True)
            logits = np.concatenate([self._logits(x).numpy() for x, _ in test.dataset])
            averager = kt_metrics.PredictiveAverager(test.labels, num_bins)
            averager.update(logits=logits)
            self.last_probs = averager.mean_probs
            return averager.result()

        def on_epoch_end(self, epoch, logs=None):
            result = self.evaluate()
            if logs is not None:
                logs.update({f"test_{k}": result[k] for k in ("accuracy", "nll", "ece", "brier")})

    return PointEstimateEvaluation()


def _evaluation_schedule(config: dict, method: dict, steps_per_epoch: int, sampler, earliest_burn_in: int = 0) -> dict:
    """`earliest_burn_in`: no averaging before this step (the end of a temperature ramp; with
    `auto`, the EquilibrationCheck keeps to it by itself)."""
    evaluation = _merge(config["evaluation"], method.get("evaluation") or {})
    if evaluation.get("burn_in_steps") == "auto" or evaluation.get("burn_in_epochs") == "auto":
        burn_in = "auto"  # from the EquilibrationCheck (run_method)
    elif "burn_in_steps" in evaluation:
        burn_in = max(int(evaluation["burn_in_steps"]), earliest_burn_in)
    else:
        burn_in = max(int(round(float(evaluation.get("burn_in_epochs", 0)) * steps_per_epoch)), earliest_burn_in)
    every = int(evaluation.get("every_n_steps", 1))
    period = getattr(sampler, "sample_every", None)
    if period:
        # Samplers that yield samples only every K steps (TACT-HMC): due steps must be multiples of K.
        if every % period:
            raise ConfigError(
                f"Method {method['label']!r}: every_n_steps={every} must be a multiple of the "
                f"sampler's sample_every={period}, or no step is ever both due and a sample."
            )
        if burn_in != "auto":
            burn_in = -(-burn_in // period) * period
    max_burn_in = evaluation.get("max_burn_in_epochs")
    return {
        "burn_in_steps": burn_in,
        "max_burn_in_steps": None if max_burn_in is None else int(round(float(max_burn_in) * steps_per_epoch)),
        "check_block_steps": max(1, int(round(float(evaluation.get("check_block_epochs", 5)) * steps_per_epoch))),
        "every_n_steps": every,
        "weighting": evaluation.get("weighting", "uniform"),
        "num_bins": int(evaluation.get("num_bins", 15)),
    }


def _tie_warmup_to_burn_in(sampler, method: dict, schedule: dict) -> None:
    """A thermostat sampler's warm-up ends by the burn-in (the fixed one, or `max_burn_in` with
    `auto`) unless the method's options give `warmup_steps`: averaging then starts on the
    papers' dynamics, also in runs shorter than the default warm-up."""
    if not hasattr(sampler, "warmup_steps") or "warmup_steps" in method.get("options", {}):
        return
    burn_in = schedule["max_burn_in_steps"] if schedule["burn_in_steps"] == "auto" else schedule["burn_in_steps"]
    if burn_in is not None:
        sampler.warmup_steps = min(sampler.warmup_steps, int(burn_in))


def _json_safe(value: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN and infinities to None."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    return value


def chain_batches(dataset, num_chains: int):
    """The training pipeline for a sampler with `num_chains` chains: C passes per epoch, batched
    C times larger, so every chain gets `batch_size` examples of its own per step (the model
    splits each batch in C parts) and an epoch keeps its number of steps."""
    if num_chains == 1:
        return dataset
    import tensorflow as tf  # noqa: PLC0415

    batch = int(tf_batch_size(dataset))
    steps = int(dataset.cardinality())  # ceil(C N / (C n)): the same as one chain's
    rebatched = dataset.repeat(num_chains).unbatch().batch(num_chains * batch)
    return rebatched.apply(tf.data.experimental.assert_cardinality(steps)) if steps > 0 else rebatched


def tf_batch_size(dataset) -> int:
    """The (first) batch size of a batched `(x, y)` dataset, from its element spec or a batch."""
    import tensorflow as tf  # noqa: PLC0415

    size = tf.nest.flatten(dataset.element_spec)[0].shape[0]
    if size is None:
        size = int(tf.shape(tf.nest.flatten(next(iter(dataset)))[0])[0])
    return int(size)


def _distributable(dataset, strategy):
    """The training dataset, sharded by DATA across workers.

    Every worker builds the same pipeline (same seed, same order) from in-memory arrays, which
    have no files to shard by: each worker reads every global batch and keeps its replicas'
    slices, so the replicas together see exactly the single-device batches.
    """
    if strategy is None:
        return dataset
    import tensorflow as tf  # noqa: PLC0415

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _ood_scores(average, ood_average, probs, net, ood_data) -> dict:
    """OOD AUROC (`kt.metrics.ood_auroc`) of the predictive entropy, and for a posterior
    average of the mutual information, of the out-of-distribution examples against the
    in-distribution test examples; None where there is nothing to score."""
    import keras  # noqa: PLC0415

    from keras_thermo import metrics as kt_metrics  # noqa: PLC0415

    scores: dict[str, Any] = {"auroc_predictive_entropy": None, "auroc_mutual_information": None}
    if average is not None:
        if not (average.num_samples and ood_average.num_samples):
            return scores
        scores["auroc_predictive_entropy"] = kt_metrics.ood_auroc(average.predictive_entropy,
                                                                  ood_average.predictive_entropy)
        if average.num_samples >= 2:  # one sample has no disagreement to measure
            scores["auroc_mutual_information"] = kt_metrics.ood_auroc(average.mutual_information,
                                                                      ood_average.mutual_information)
    elif probs is not None:
        logits = np.concatenate([net(x, training=False).numpy() for x, _ in ood_data])
        ood_probs = keras.ops.convert_to_numpy(keras.ops.softmax(logits.astype(np.float64), axis=-1))
        if np.all(np.isfinite(probs)) and np.all(np.isfinite(ood_probs)):
            scores["auroc_predictive_entropy"] = kt_metrics.ood_auroc(kt_metrics.entropy(probs),
                                                                      kt_metrics.entropy(ood_probs))
    return scores


def run_method(key: str, method: dict, config: dict, task: TaskData, label_noise: float, out: Path, verbose: int,
               strategy=None, *, log_dir: Path | None = None) -> dict:
    """Trains or samples one method at one label-noise level; returns its record for results.json.

    With a `tf.distribute` strategy, the network and the model are built and compiled under its
    scope (so `fit` replicates them); None runs on the default device. With `task.ood`, the
    record's `ood` holds the OOD AUROC of the predictive entropy (and, for samplers, of the
    mutual information) of those examples against `task.test`'s. `log_dir`: TensorBoard folder
    (default `out/tensorboard/<key>/noise<pct>`).
    """
    import keras  # noqa: PLC0415

    import keras_thermo as kt  # noqa: PLC0415
    from keras_thermo import equilibration as kt_equilibration  # noqa: PLC0415
    from keras_thermo.posterior_average import PosteriorAverage  # noqa: PLC0415

    training = config["training"]
    seed = int(training["seed"])
    epochs = int(method.get("epochs", training["epochs"]))

    def scope():  # a fresh context each time: a strategy's scope cannot be re-entered
        return strategy.scope() if strategy is not None else contextlib.nullcontext()

    with scope():
        net = build_net(config, seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    log_dir = log_dir or out / "tensorboard" / key / f"noise{round(100 * label_noise)}"
    # Out-of-distribution examples have no label among the trained classes: placeholders.
    ood_data = None if task.ood is None else task.ood.dataset.map(lambda x, y: (x, y * 0))
    num_bins = int(config["evaluation"].get("num_bins", 15))
    point = _point_estimate_callback(task.test, num_bins)
    callbacks: list = [point]
    average = ood_average = None
    record: dict[str, Any] = {"method": key, "label": method["label"], "label_noise": label_noise,
                              "method_config": copy.deepcopy(method)}
    if "sampler" in method:
        steps_per_epoch = task.train.steps_per_epoch
        sampler = build_sampler(method, build_step_size_schedule(method, steps_per_epoch, epochs))
        temperature = build_temperature(method, steps_per_epoch)
        ramp_end = temperature.constant_from_step() if not isinstance(temperature, float) else 0
        schedule = _evaluation_schedule(config, method, steps_per_epoch, sampler, earliest_burn_in=ramp_end)
        _tie_warmup_to_burn_in(sampler, method, schedule)
        num_bins = schedule["num_bins"]
        with scope():
            model = kt.BayesianModel(
                net, sampler, num_examples=task.train.num_examples,
                prior=build_prior(method),
                temperature=temperature, seed=seed,
                num_chains=int(training["num_chains"]),
            )
            model.compile(loss=loss, steps_per_execution=int(training["steps_per_execution"]))
        # Every sampler run reports its temperatures; `burn_in_steps: auto` also takes its
        # burn-in from this check (averaging starts once the whole net is at T).
        check = kt.callbacks.EquilibrationCheck(
            block_steps=schedule["check_block_steps"], log_dir=str(log_dir), warn=verbose > 0,
            max_burn_in_steps=schedule["max_burn_in_steps"],
        )
        burn_in = check if schedule["burn_in_steps"] == "auto" else schedule["burn_in_steps"]
        average = PosteriorAverage(
            task.test, burn_in, schedule["every_n_steps"], weighting=schedule["weighting"], num_bins=num_bins,
        )
        callbacks[:0] = [check, average]
        if ood_data is not None:  # the same samples, scored on the out-of-distribution examples
            ood_average = PosteriorAverage(ood_data, burn_in, schedule["every_n_steps"],
                                           weighting=schedule["weighting"])
            callbacks.insert(2, ood_average)
        record.update(kind="sampler", sampler=sampler.get_config() | {"name": sampler.name}, evaluation=schedule,
                      temperature_schedule=(None if isinstance(temperature, float)
                                            else {"name": type(temperature).__name__, **temperature.get_config()}),
                      num_chains=int(training["num_chains"]),
                      prior=None if model.prior is None else {"name": type(model.prior).__name__,
                                                               **model.prior.get_config()})
    else:
        model = net
        with scope():
            model.compile(optimizer=build_optimizer(method), loss=loss,
                          steps_per_execution=int(training["steps_per_execution"]))
        callbacks.append(keras.callbacks.TerminateOnNaN())
        record.update(kind="optimizer", optimizer={"name": method["optimizer"], **method["options"]})
    callbacks.append(keras.callbacks.TensorBoard(str(log_dir), write_graph=False, profile_batch=0))

    status, message = "ok", ""
    started = time.perf_counter()
    history = None
    try:
        train = task.train.dataset
        if "sampler" in method:
            train = chain_batches(train, int(training["num_chains"]))
        history = model.fit(_distributable(train, strategy), epochs=epochs,
                            callbacks=callbacks, shuffle=False, verbose=verbose)  # the dataset shuffles itself
    except kt.SamplerDivergedError as error:
        status, message = "diverged", str(error)
        record["diverged_at_step"] = error.step
    seconds = time.perf_counter() - started
    history_dict = dict(history.history) if history is not None else dict(model.history.history or {})

    if average is not None:
        metrics = average.result()
        probs = average.predictions if average.num_samples else None
        report = check.report()
        record["temperatures"] = {
            "target": report["temperature"],
            "equilibrated": report["equilibrated"],
            "equilibration_step": report["equilibration_step"],
            "averaging_started_at_step": average.burn_in_steps if average.num_samples else None,
            "averaging_started_by": check.recording_started_by if burn_in is check else "burn_in_epochs",
            **{f"{kind}_{part}": report["overall"][kind][part] for kind in ("kinetic", "configurational")
               for part in ("mean", "standard_error")},
            "variables": report["variables"],
            "summary": kt_equilibration.summary(report),  # the check's verdict in one line
        }
        if status == "ok" and not average.num_samples:
            status, message = "no_samples", (
                "No posterior sample was taken: lower burn-in or run longer"
                + (" (the equilibration check never found the whole net at T)." if burn_in is check else ".")
            )
        if hasattr(model.prior, "precisions"):  # a hierarchical prior: the std it ended at, per variable
            record["prior_final_std"] = {
                getattr(v, "path", v.name): float(1.0 / np.sqrt(float(p)))
                for v, p in zip(model.trainable_variables, model.prior.precisions(model.trainable_variables))
            }
    else:
        metrics = point.evaluate()
        metrics["num_samples"] = 1
        probs = point.last_probs
        if not np.isfinite(history_dict.get("loss", [0.0])[-1]):
            status, message = "diverged", "The training loss became NaN."
    if ood_data is not None:
        record["ood"] = _ood_scores(average, ood_average, probs, net, ood_data)
    record.update(
        status=status, message=message, seconds=seconds, num_examples=task.train.num_examples,
        steps=epochs * task.train.steps_per_epoch, metrics=metrics,
        history={"epoch": list(range(1, len(next(iter(history_dict.values()), [])) + 1)), **history_dict},
        tensorboard=str(log_dir),
    )
    record["_probs"] = probs  # for the reliability diagram; not written to JSON
    record["_labels"] = task.test.labels
    return record


# --------------------------------------------------------------------------------------------
# Tuning on a validation split of the training data


def apply_settings(method: dict, settings: dict) -> dict:
    """A copy of `method` with tuned values set: `prior_std`, `temperature` and `epochs` on the
    method, `prior.<argument>` in its `prior:` mapping (`step_size_schedule.<argument>`,
    `temperature_schedule.<argument>` in those), anything else in its `options`."""
    method = copy.deepcopy(method)
    for name, value in settings.items():
        if name in METHOD_LEVEL_PARAMETERS or name == "epochs":
            method[name] = value
        elif _mapping_argument(name) is not None:
            mapping, argument = _mapping_argument(name)
            method[mapping][argument] = value
        else:
            method["options"][name] = value
    return method


def _configured_value(method: dict, name: str) -> Any:
    if _mapping_argument(name) is not None:
        mapping, argument = _mapping_argument(name)
        return method[mapping].get(argument)
    if name in METHOD_LEVEL_PARAMETERS:
        return method.get(name, 1.0 if name == "temperature" else None)
    return method["options"].get(name)


def grid_points(grid: dict) -> list[dict]:
    """Every combination of the grid's values, the last key varying fastest."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


def validation_score(record: dict) -> tuple[float, int | None]:
    """(validation NLL, epochs) of a tuning run; NLL inf when it gives nothing to score.

    Optimizers: the lowest NLL of the weights after any epoch, and that epoch (early stopping
    by validation NLL); samplers: the NLL of the posterior average at the end of the run.
    """
    if record["kind"] == "optimizer":
        curve = np.array([np.nan if v is None else v for v in record["history"].get("test_nll", [])], dtype=float)
        if not np.any(np.isfinite(curve)):
            return math.inf, None
        best = int(np.nanargmin(np.where(np.isfinite(curve), curve, np.nan)))
        return float(curve[best]), best + 1
    nll = record["metrics"]["nll"]
    if record["status"] != "ok" or nll is None or not math.isfinite(nll):
        return math.inf, None
    return float(nll), None


def tune_method(key: str, method: dict, config: dict, new_task, label_noise: float, out: Path, verbose: int,
                strategy=None, log=print) -> dict:
    """Chooses a method's hyperparameters by validation NLL; returns the tuning record.

    Every trial trains on the `train` of a fresh `new_task()` (the training split less the
    validation part; fresh, so every trial draws the same minibatches and label noise) and is
    scored on its `test` (the validation part); nothing here reads the test split. `search:
    grid` tries every combination of the method's grid; `search: axes` tries one axis at a
    time in the grid's order, the others held at the best values so far (starting from the
    method's configured value where the grid lists it, else the first), re-using repeated
    settings. Ties go to the earlier trial.
    """
    tune = config["tune"]
    grid = grid_for(tune, key, method)
    trials: list[dict] = []
    scored: dict[str, dict] = {}

    def evaluate(settings: dict) -> dict:
        signature = json.dumps(settings, sort_keys=True, default=str)
        if signature in scored:
            return scored[signature]
        log(f"    tuning {method['label']} ({round(100 * label_noise)}% permuted), trial {len(trials) + 1}: "
            + _describe(settings))
        task = new_task()
        record = run_method(key, apply_settings(method, settings), config, task, label_noise, out, verbose, strategy,
                            log_dir=out / "tensorboard" / "tuning" / key / f"noise{round(100 * label_noise)}"
                            / f"trial{len(trials) + 1}")
        nll, epochs = validation_score(record)
        trial = {"settings": settings, "status": record["status"], "validation_nll": nll,
                 "validation_accuracy": record["metrics"]["accuracy"], "seconds": record["seconds"]}
        if record["kind"] == "optimizer":
            trial["epochs"] = epochs
        log(f"      validation NLL {_number(nll)}" + (f" after {epochs} epochs" if epochs else ""))
        trials.append(trial)
        scored[signature] = trial
        return trial

    if tune["search"] == "grid":
        for settings in grid_points(grid):
            evaluate(settings)
    else:
        current = {name: (_configured_value(method, name) if _configured_value(method, name) in values else values[0])
                   for name, values in grid.items()}
        for name, values in grid.items():
            best = min((evaluate(dict(current, **{name: v})) for v in values), key=lambda t: t["validation_nll"])
            current = dict(best["settings"])
    best = min(trials, key=lambda t: t["validation_nll"])  # min keeps the first of equal scores
    chosen = trial_settings(best)
    task = new_task()
    holdout = task.holdout or {}
    return {
        "label_noise": label_noise,
        "search": tune["search"],
        "grid": grid,
        "validation": {
            "fraction": tune["validation_fraction"],
            "train_examples": holdout.get("train_examples"),
            "fit_examples": int(task.train.num_examples),
            "validation_examples": int(task.test.num_examples),
        },
        "chosen": chosen,
        "validation_nll": best["validation_nll"],
        "all_trials_failed": not math.isfinite(best["validation_nll"]),
        "trials": trials,
    }


def trial_settings(trial: dict) -> dict:
    """The settings a tuning trial stands for: its grid point, and an optimizer's best epoch."""
    settings = dict(trial["settings"])
    if trial.get("epochs") is not None:
        settings["epochs"] = trial["epochs"]
    return settings


def fallback_candidates(tuning: dict) -> list[tuple[dict, float]]:
    """(settings, validation NLL) to fall back on, in order, when the chosen settings' final run
    diverges: every other trial that ran to the end (status ok) with a finite validation NLL,
    best first (ties in trial order, like the choice itself)."""
    ranked = sorted((t for t in tuning["trials"] if t["status"] == "ok" and math.isfinite(t["validation_nll"])),
                    key=lambda t: t["validation_nll"])
    candidates = [(trial_settings(t), t["validation_nll"]) for t in ranked]
    return [(settings, nll) for settings, nll in candidates if settings != tuning["chosen"]]


def run_with_fallback(method: dict, tuning: dict | None, run_once, log=print) -> dict:
    """The reported run of a tuned method, falling back when the chosen settings diverge.

    `method` is the configured (untuned) method; `run_once(method, attempt)` trains it once
    (attempt 0 with the chosen settings, 1, 2, ... with the fallbacks) and returns its record.
    The tuning trials ran on the fit part of the training split, the reported run on the whole
    split: the force grows with N, so a step size at the edge of stability on the fit part can
    be past it on the whole split. When the chosen settings' run diverges, the runner tries
    every other validated setting (`fallback_candidates`), best validation NLL first, until one
    does not diverge, and reports that run; if all diverge, the first choice's run is reported
    (status "diverged"). Either way `record["fallback"]` keeps the first choice, every attempt
    (settings, status, step of divergence) and the settings reported (None if none). A run
    that does not diverge, or of an untuned method, is returned as it is.

    >>> tuning = {"chosen": {"step_size": 0.02}, "validation_nll": 0.3, "trials": [
    ...     {"settings": {"step_size": 0.01}, "status": "ok", "validation_nll": 0.4},
    ...     {"settings": {"step_size": 0.02}, "status": "ok", "validation_nll": 0.3}]}
    >>> def run_once(method, attempt):  # a stand-in for training: 0.02 diverges after 24 steps
    ...     h = method["options"]["step_size"]
    ...     return {"status": "diverged", "diverged_at_step": 24} if h > 0.015 else {"status": "ok"}
    >>> record = run_with_fallback({"options": {}}, tuning, run_once, log=lambda *_: None)
    >>> record["status"], record["fallback"]["reported"], record["fallback"]["attempts"][0]["diverged_at_step"]
    ('ok', {'step_size': 0.01}, 24)
    """
    if tuning is None:
        return run_once(method, 0)
    first = run_once(apply_settings(method, tuning["chosen"]), 0)
    if first["status"] != "diverged":
        return first

    def attempt(settings: dict, nll: float, record: dict) -> dict:
        return {"settings": settings, "validation_nll": nll, "status": record["status"],
                "diverged_at_step": record.get("diverged_at_step")}

    attempts = [attempt(tuning["chosen"], tuning["validation_nll"], first)]
    reported, reported_settings = first, None
    for number, (settings, nll) in enumerate(fallback_candidates(tuning), start=1):
        log(f"    {_diverged_at(attempts[-1])}; falling back to the next-best validated setting: "
            + _describe(settings))
        record = run_once(apply_settings(method, settings), number)
        attempts.append(attempt(settings, nll, record))
        if record["status"] != "diverged":
            reported, reported_settings = record, settings
            break
    reported["fallback"] = {"first_choice": tuning["chosen"], "attempts": attempts, "reported": reported_settings,
                            "validation_nll": attempts[-1]["validation_nll"] if reported_settings else None}
    return reported


def _diverged_at(attempt: dict) -> str:
    step = attempt["diverged_at_step"]
    return "diverged" if step is None else f"diverged after {step} steps"


def tuning_levels(config: dict) -> list[float]:
    """The label-noise levels tuned at: each run level (and the OOD study's) or the one named."""
    tune = config["tune"]
    if tune["label_noise"] != "each":
        return [float(tune["label_noise"])]
    levels = list(config["data"]["label_noise"])
    if config.get("ood") is not None and config["ood"]["label_noise"] not in levels:
        levels.append(config["ood"]["label_noise"])
    return levels


def _describe(settings: dict) -> str:
    return ", ".join(f"{name}={_value(value)}" for name, value in settings.items()) or "configured"


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# --------------------------------------------------------------------------------------------
# Reports


def _percent(value: Any) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.2f}%"


def _number(value: Any, digits: int = 4) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


_STARTED_BY = {"equilibrium": "at T", "max_burn_in_steps": "max burn-in, not at T", "burn_in_epochs": "fixed"}


def _temperature(temperatures: dict, kind: str) -> str:
    mean, error = temperatures[f"{kind}_mean"], temperatures[f"{kind}_standard_error"]
    return "n/a" if mean is None or not math.isfinite(mean) else f"{mean:.3f} +- {error:.3f}"


def markdown_table(config: dict, runs: list[dict], ood_runs: list[dict] | None = None) -> str:
    """Table 1 layout (accuracy, methods x % permuted labels); with `tune:` or `ood:` a summary
    with the chosen hyperparameters and the OOD AUROC; then every metric per run."""
    noises = list(dict.fromkeys(r["label_noise"] for r in runs))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    by_key = {(r["method"], r["label_noise"]): r for r in runs}
    label = {r["method"]: r["label"] for r in runs}
    lines = [f"### {config['title']}: test accuracy", ""]
    lines.append("| % permuted labels | " + " | ".join(f"{round(100 * n)}%" for n in noises) + " |")
    lines.append("|---|" + "---:|" * len(noises))
    for method in methods:
        cells = []
        for noise in noises:
            run = by_key.get((method, noise))
            cell = _percent(run["metrics"]["accuracy"]) if run else ""
            if run and run["status"] != "ok":
                cell += f" ({run['status']})"
            cells.append(cell)
        lines.append(f"| {label[method]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Samplers: accuracy of the posterior-averaged predictive distribution; optimizers: of "
        "the final weights.",
    ]
    if config.get("tune") is not None or ood_runs:
        lines += ["", *_summary_table(config, runs, ood_runs or [])]
    lines += [
        "",
        f"### {config['title']}: all metrics",
        "",
        "| method | % permuted | accuracy | NLL | expected log loss | ECE | Brier | samples | "
        "kinetic T | configurational T | averaging from step | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        m = run["metrics"]
        t = run.get("temperatures")
        temperatures = (
            f"{_temperature(t, 'kinetic')} | {_temperature(t, 'configurational')} | "
            + (f"{t['averaging_started_at_step']} ({_STARTED_BY.get(t['averaging_started_by'], t['averaging_started_by'])})"
               if t["averaging_started_at_step"] is not None else "n/a")
            if t else "n/a | n/a | n/a"
        )
        lines.append(
            f"| {run['label']} | {round(100 * run['label_noise'])}% | {_percent(m['accuracy'])} | "
            f"{_number(m['nll'])} | {_number(m['expected_log_loss'])} | {_number(m['ece'])} | "
            f"{_number(m['brier'])} | {m['num_samples']} | {temperatures} | {run['seconds']:.1f} |"
        )
    lines += [
        "",
        "Temperatures: post-burn-in means of the whole net's kinetic and configurational "
        "temperatures +- batch-means error (`EquilibrationCheck`); the configurational one "
        "averages T at equilibrium whatever the sampler. Averaging starts when the check finds "
        "the whole net at T, or at the configured maximum burn-in.",
    ]
    return "\n".join(lines) + "\n"


def _summary_table(config: dict, runs: list[dict], ood_runs: list[dict]) -> list[str]:
    """Test metrics with the OOD AUROC and the chosen hyperparameters, and the protocol."""
    ood = config.get("ood")
    ood_by_method = {r["method"]: r for r in ood_runs}
    lines = [
        f"### {config['title']}: tuned settings, test metrics and OOD AUROC",
        "",
        "| method | % permuted | accuracy | NLL | ECE | Brier | OOD AUROC, entropy | OOD AUROC, MI | "
        "chosen hyperparameters | validation NLL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for run in runs:
        m = run["metrics"]
        scores = {}
        if ood and run["label_noise"] == ood["label_noise"]:
            scores = ood_by_method.get(run["method"], {}).get("ood") or {}
        tuning = run.get("tuning")
        chosen = "configured: " + _describe(_settings(run))
        if tuning:
            chosen = _describe(tuning["chosen"]) + (" (all trials failed)" if tuning["all_trials_failed"] else "")
            if tuning.get("shared_from"):
                chosen += f" (chosen for {tuning['shared_from']})"
        validation_nll = _number(tuning["validation_nll"]) if tuning else ""
        if run.get("fallback"):
            chosen += " " + _fallback_note(run["fallback"])
            if run["fallback"]["reported"] is not None:
                validation_nll += f" (fallback {_number(run['fallback']['validation_nll'])})"
        lines.append(
            f"| {run['label']} | {round(100 * run['label_noise'])}% | {_percent(m['accuracy'])}"
            + ("" if run["status"] == "ok" else f" ({run['status']})")
            + f" | {_number(m['nll'])} | {_number(m['ece'])} | {_number(m['brier'])} | "
            f"{_number(scores.get('auroc_predictive_entropy'), 3) if scores else ''} | "
            f"{_number(scores.get('auroc_mutual_information'), 3) if scores else ''} | {chosen} | "
            f"{validation_nll} |"
        )
    lines.append("")
    if config.get("tune") is not None:
        tune = config["tune"]
        level = ("at each noise level" if tune["label_noise"] == "each"
                 else f"once, at {round(100 * tune['label_noise'])}% permuted labels, for every level")
        lines.append(
            f"Tuning ({tune['search']} search, {level}): each method's grid is tried on the training split "
            f"less a stratified {round(100 * tune['validation_fraction'])}% validation part (clean labels), "
            "and scored by validation NLL: optimizers by their best epoch (which sets `epochs`), samplers by "
            "their posterior average. The chosen settings are then run on the whole training split and "
            "scored on the test split, which the tuning never reads. Where that run diverged, the next-best "
            "validated setting that did not diverge in tuning is run instead (\"fallback:\" in the chosen "
            "column, which names the first choice and where it diverged; results.json: `runs[i].fallback`)."
        )
    lines += ["", *_comparisons(runs, ood_runs)]
    if ood is not None and "dataset" in ood:
        lines.append(
            f"OOD: each reported run at {round(100 * ood['label_noise'])}% permuted labels scores the test images "
            f"of {ood['dataset']} against those of {config['data']['dataset']} (AUROC, OOD = positive, higher = "
            "better; the columns above): by the predictive entropy, and for samplers also by the mutual "
            "information between label and weights. Optimizers have no mutual information (one set of weights)."
        )
    elif ood is not None:
        lines.append(
            f"OOD: each method (with the settings chosen at {round(100 * ood['label_noise'])}% permuted labels) "
            f"is trained on digits {ood['in_classes']} and the test images of {ood['out_classes']} are scored "
            f"against the test images of {ood['in_classes']} (AUROC, OOD = positive, higher = better): by the "
            "predictive entropy, and for samplers also by the mutual information between label and weights. "
            "Optimizers have no mutual information (one set of weights)."
        )
        lines += [
            "",
            f"| OOD study | accuracy on {ood['in_classes']} | NLL | AUROC, entropy | AUROC, MI | samples |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for run in ood_runs:
            m, scores = run["metrics"], run["ood"]
            label = run["label"] + (f" {_fallback_note(run['fallback'])}" if run.get("fallback") else "")
            lines.append(
                f"| {label} | {_percent(m['accuracy'])}" + ("" if run["status"] == "ok" else f" ({run['status']})")
                + f" | {_number(m['nll'])} | "
                f"{_number(scores['auroc_predictive_entropy'], 3)} | "
                f"{_number(scores['auroc_mutual_information'], 3)} | "
                f"{m['num_samples']} |"
            )
    return lines


def _fallback_note(fallback: dict) -> str:
    """The chosen-settings column's marker for a run that fell back from its first choice."""
    failed = [f"{_describe(a['settings'])} {_diverged_at(a)}" for a in fallback["attempts"]
              if a["status"] == "diverged"]
    if fallback["reported"] is None:
        return f"(diverged; so did every other validated setting: {'; '.join(failed[1:]) or 'none left'})"
    return (f"({_diverged_at(fallback['attempts'][0])}; fallback: {_describe(fallback['reported'])}"
            + (f", after {'; '.join(failed[1:])}" if len(failed) > 1 else "") + ")")


def _comparisons(runs: list[dict], ood_runs: list[dict]) -> list[str]:
    """Samplers against the best optimizer, per noise level: accuracy (at least as accurate?),
    NLL and OOD AUROC (ahead?). The best optimizer is picked on the test split, so each
    sampler is held to the strongest baseline that was run."""
    lines = []
    samplers = [r for r in runs if r["kind"] == "sampler"]
    for noise in dict.fromkeys(r["label_noise"] for r in runs):
        optimizers = [r for r in runs if r["kind"] == "optimizer" and r["label_noise"] == noise and r["status"] == "ok"]
        here = [r for r in samplers if r["label_noise"] == noise]
        if not optimizers or not here:
            continue
        best_accuracy = max(optimizers, key=lambda r: r["metrics"]["accuracy"])
        best_nll = min(optimizers, key=lambda r: r["metrics"]["nll"])
        n = len(best_accuracy["_labels"]) if best_accuracy.get("_labels") is not None else None
        bar = best_accuracy["metrics"]["accuracy"]
        as_accurate = [r["label"] for r in here if (r["metrics"]["accuracy"] or 0) >= bar]
        lower_nll = [r["label"] for r in here if (r["metrics"]["nll"] or math.inf) < best_nll["metrics"]["nll"]]
        lines.append(
            f"- {round(100 * noise)}% permuted: best optimizer accuracy {best_accuracy['label']} "
            f"{_percent(best_accuracy['metrics']['accuracy'])}"
            + (f" (one test image = {100 / n:.2f}%)" if n else "")
            + f"; samplers at least as accurate: {len(as_accurate)}/{len(here)} ({', '.join(as_accurate) or 'none'}). "
            f"Best optimizer NLL {best_nll['label']} {_number(best_nll['metrics']['nll'])}; samplers below it: "
            f"{len(lower_nll)}/{len(here)} ({', '.join(lower_nll) or 'none'})."
        )
    optimizers = [r for r in ood_runs if r["kind"] == "optimizer" and r["ood"]["auroc_predictive_entropy"] is not None]
    sampled = [r for r in ood_runs if r["kind"] == "sampler"]
    if optimizers and sampled:
        best = max(optimizers, key=lambda r: r["ood"]["auroc_predictive_entropy"])
        bar = best["ood"]["auroc_predictive_entropy"]
        by_entropy = [r["label"] for r in sampled if (r["ood"]["auroc_predictive_entropy"] or 0) > bar]
        by_mutual = [r["label"] for r in sampled if (r["ood"]["auroc_mutual_information"] or 0) > bar]
        lines.append(
            f"- OOD: best optimizer AUROC {best['label']} {bar:.3f} (predictive entropy); samplers above it by "
            f"predictive entropy: {len(by_entropy)}/{len(sampled)} ({', '.join(by_entropy) or 'none'}); by mutual "
            f"information: {len(by_mutual)}/{len(sampled)} ({', '.join(by_mutual) or 'none'})."
        )
    return lines


def _settings(run: dict) -> dict:
    """The hyperparameters a run's config set (the sampler's or optimizer's options, and a
    sampler's prior std and temperature)."""
    method = run.get("method_config") or {}
    settings = {k: v for k, v in (method.get("options") or {}).items() if k not in ("preconditioner",)}
    if run["kind"] == "sampler":
        if method.get("prior") is not None:
            settings.update({"prior": method["prior"]["kind"]},
                            **{PRIOR_GRID_PREFIX + k: v for k, v in method["prior"].items() if k != "kind"})
        else:
            settings["prior_std"] = method.get("prior_std")
        settings["temperature"] = method.get("temperature", 1.0)
        for name in SCHEDULE_KEYS:
            if method.get(name) is not None:
                settings.update({name: method[name]["kind"]},
                                **{f"{name}.{k}": v for k, v in method[name].items() if k != "kind"})
    if "epochs" in method:
        settings["epochs"] = method["epochs"]
    return settings


def _curve(history: dict, name: str) -> list[float]:
    """The posterior-average curve of a sampler, or the test curve of a point estimate."""
    values = history.get(f"posterior_{name}") or history.get(f"test_{name}") or []
    return [np.nan if v is None else float(v) for v in values]


def write_plots(config: dict, runs: list[dict], out: Path) -> list[str]:
    """accuracy.png and nll.png against epochs (one panel per noise level), reliability.png."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from keras_thermo import metrics as kt_metrics  # noqa: PLC0415

    written = []
    noises = list(dict.fromkeys(r["label_noise"] for r in runs))
    for name, ylabel in (("accuracy", "test accuracy"), ("nll", "test NLL (nats)")):
        figure, axes = plt.subplots(1, len(noises), figsize=(5 * len(noises), 3.6), squeeze=False)
        for axis, noise in zip(axes[0], noises):
            for run in (r for r in runs if r["label_noise"] == noise):
                values = _curve(run["history"], name)
                style = "-" if run["kind"] == "sampler" else "--"
                axis.plot(range(1, len(values) + 1), values, style, marker=".", label=run["label"])
            axis.set_title(f"{config['title']}, {round(100 * noise)}% permuted")
            axis.set_xlabel("epoch")
            axis.set_ylabel(ylabel)
            axis.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        figure.tight_layout()
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(str(path))

    first = [r for r in runs if r["label_noise"] == noises[0]]
    columns = min(4, len(first))
    rows = -(-len(first) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.4 * rows), squeeze=False)
    for axis in axes.flat[len(first):]:
        axis.set_visible(False)
    for axis, run in zip(axes.flat, first):
        axis.plot([0, 1], [0, 1], ":", color="gray")
        if run["_probs"] is not None:
            diagram = kt_metrics.reliability_diagram_data(run["_probs"], run["_labels"])
            centers = (diagram.bin_edges[:-1] + diagram.bin_edges[1:]) / 2
            width = diagram.bin_edges[1] - diagram.bin_edges[0]
            filled = diagram.counts > 0
            axis.bar(centers[filled], diagram.accuracy[filled], width=width, alpha=0.7, edgecolor="black")
            ece = diagram.expected_calibration_error()
            axis.set_title(f"{run['label']} (ECE {ece:.3f})", fontsize=9)
        else:
            axis.set_title(f"{run['label']} (no samples)", fontsize=9)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xlabel("confidence")
        axis.set_ylabel("accuracy")
    figure.suptitle(f"Reliability, {config['title']}, {round(100 * noises[0])}% permuted", fontsize=10)
    figure.tight_layout()
    path = out / "reliability.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(str(path))
    return written


# --------------------------------------------------------------------------------------------
# Entry points

VERBOSITIES = ("auto", 0, 1, 2)


def fit_verbosity(verbose: int | str, stream=None) -> int:
    """The Keras `fit` verbosity 0, 1 or 2 that `verbose` stands for.

    "auto" is a progress bar (1) when `stream` (default stdout) is a terminal, else one line per
    epoch (2): a log file gets no carriage-return progress bars. The runner resolves it once,
    here, because it also reads the level (EquilibrationCheck warns only when it is above 0).
    """
    if isinstance(verbose, bool) or verbose not in VERBOSITIES:
        raise ValueError(f"verbose must be one of {', '.join(map(repr, VERBOSITIES))}, got {verbose!r}.")
    if verbose != "auto":
        return int(verbose)
    stream = sys.stdout if stream is None else stream
    return 1 if getattr(stream, "isatty", lambda: False)() else 2


def run_config(
    config: dict,
    out: str | os.PathLike,
    *,
    quick: bool = False,
    mock_data: bool = False,
    data_dir: str | None = None,
    methods: str | list[str] | None = None,
    verbose: int | str = "auto",
    log=print,
    strategy=None,
) -> dict:
    """Runs every method of a loaded config at every label-noise level and writes the reports.

    With a `tune:` block, each method with a grid is first tuned on a validation part of the
    training split (`tune_method`), and the reported runs use the chosen settings; with an
    `ood:` block, the OOD study follows (module doc).

    Args:
        config: From `load_config`.
        out: Output folder (created).
        quick: Apply the config's `quick:` section.
        mock_data: Load TFDS datasets from `tfds.testing.mock_data` (random images).
        data_dir: Directory of IDX files, else TFDS data directory (module doc); None: the
            config's `data.data_dir`, else TFDS' default.
        methods: Keep only these method keys.
        verbose: Keras `fit` verbosity 0, 1, 2 or "auto" (`fit_verbosity`); above 0, every
            sampler run's EquilibrationCheck also warns when the net is not at T.
        log: Where progress lines go.
        strategy: A `tf.distribute.Strategy` (see `make_strategy`) to build and fit every model
            under, or None. `training.batch_size` is the global batch. Worker i > 0 of a
            multi-worker cluster writes to `out/worker<i>`.

    Returns:
        The results dict that was written to `results.json`.
    """
    verbose = fit_verbosity(verbose)
    if quick:
        config = apply_quick(config)
    if methods:
        config = with_methods(config, methods)
    tune = config.get("tune")
    for key, method in config["methods"].items():  # fail on a bad method or grid before training anything
        source = tune["share"].get(key, key) if tune else key
        grid = grid_for(tune, source, config["methods"][source]) if tune else None
        for settings in grid_points(grid) if grid else [{}]:
            trial = apply_settings(method, settings)
            if "sampler" in trial:
                try:
                    check_schedules(f"methods.{key}", trial, int(trial.get("epochs", config["training"]["epochs"])))
                except ConfigError as error:
                    raise ConfigError(f"{str(error).rstrip('.')} (a setting of the tuning grid: {_describe(settings)})."
                                      if settings
                                      else str(error)) from error
                build_sampler(trial)
                build_prior(trial)
            else:
                build_optimizer(trial)
    config = adapt_to_strategy(config, strategy, log)
    out = output_folder(out, strategy)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if data_dir is not None and not mock_data:  # results.json records where the data came from
        config = _merge(config, {"data": {"data_dir": str(data_dir)}})
    loading = {"quick": quick, "mock_data": mock_data, "data_dir": data_dir}
    if (config.get("ood") or {}).get("dataset") and not mock_data:  # missing OOD data stops us before training
        _loader(config, quick=quick, data_dir=data_dir or config["data"]["data_dir"],
                dataset=config["ood"]["dataset"])("test", batch_size=int(config["data"]["eval_batch_size"]))

    # 1. Tuning: every trial is scored on a validation part of the training split. The test
    # split is first read in step 2, after every choice is made.
    tuned: dict[float, dict] = {}
    if tune:
        for noise in tuning_levels(config):
            def new_task(noise=noise):
                return load_task_data(config, noise, part="validation", **loading)

            tuning_task = new_task()
            log(f"Tuning at {round(100 * noise)}% permuted labels on {tuning_task.train.num_examples} training "
                f"examples, scored on {tuning_task.test.num_examples} held out of the training split")
            for key, method in config["methods"].items():
                if grid_for(tune, key, method):
                    tuned.setdefault(noise, {})[key] = tune_method(
                        key, method, config, new_task, noise, out, verbose, strategy, log)
                    log(f"    {method['label']}: chosen {_describe(tuned[noise][key]['chosen'])}")

    def tuning_for(key: str, noise: float) -> dict | None:
        """The tuning record that sets this method's settings at this noise level (for a method
        under `tune.share`, that of the method it names), or None for an untuned method."""
        if tune is None:
            return None
        level = noise if tune["label_noise"] == "each" else float(tune["label_noise"])
        return tuned.get(level, {}).get(tune["share"].get(key) or key)

    def shown(key: str, tuning: dict | None) -> dict | None:
        """The tuning record as a run reports it (a shared choice without the trials)."""
        source = tune["share"].get(key) if tune else None
        return dict(tuning, shared_from=source, trials=[]) if tuning and source else tuning

    # 2. Reported runs: the whole training split, scored on the test split.
    runs = []
    total = len(config["methods"]) * len(config["data"]["label_noise"])
    for noise in config["data"]["label_noise"]:
        for key, method in config["methods"].items():
            # Data loaded afresh for every run: each run draws the same minibatches and label
            # noise whatever runs before it (a dataset counts its passes).
            tuning = tuning_for(key, noise)
            log(f"[{len(runs) + 1}/{total}] {method['label']}, {round(100 * noise)}% permuted labels"
                + (f"; tuned: {_describe(tuning['chosen'])}" if tuning else ""))

            def reported_run(chosen_method, attempt, key=key, noise=noise):
                task = load_task_data(config, noise, **loading)
                log_dir = out / "tensorboard" / key / f"noise{round(100 * noise)}"
                return run_method(key, chosen_method, config, task, noise, out, verbose, strategy,
                                  log_dir=log_dir / f"fallback{attempt}" if attempt else log_dir)

            run = run_with_fallback(method, tuning, reported_run, log)
            if tuning is not None:
                run["tuning"] = shown(key, tuning)
            m = run["metrics"]
            log(f"    {run['status']} in {run['seconds']:.1f} s: accuracy {_percent(m['accuracy'])}, "
                f"NLL {_number(m['nll'])}, ECE {_number(m['ece'])}, samples {m['num_samples']}")
            runs.append(run)

    # 3. The OOD study: train on ood.in_classes, score the test images of ood.out_classes
    # against the held-out test images of ood.in_classes.
    ood_runs = []
    if config.get("ood") is not None and "dataset" not in config["ood"]:
        ood = config["ood"]
        ood_config = copy.deepcopy(config)
        ood_config["model"]["options"]["num_classes"] = len(ood["in_classes"])
        for key, method in config["methods"].items():
            tuning = tuning_for(key, ood["label_noise"])
            log(f"[OOD {len(ood_runs) + 1}/{len(config['methods'])}] {method['label']}: digits {ood['in_classes']} "
                f"against {ood['out_classes']}")

            def ood_run(chosen_method, attempt, key=key):
                task = load_task_data(ood_config, ood["label_noise"], part="ood", **loading)
                log_dir = out / "tensorboard" / "ood" / key
                return run_method(key, chosen_method, ood_config, task, ood["label_noise"], out, verbose, strategy,
                                  log_dir=log_dir / f"fallback{attempt}" if attempt else log_dir)

            run = run_with_fallback(method, tuning, ood_run, log)
            if tuning is not None:
                run["tuning"] = {k: tuning[k] for k in ("label_noise", "chosen")}
            scores = run["ood"]
            log(f"    {run['status']}: OOD AUROC predictive entropy {_number(scores['auroc_predictive_entropy'])}, "
                f"mutual information {_number(scores['auroc_mutual_information'])}")
            ood_runs.append(run)
    # A cross-dataset OOD score is in its reported run (`runs[i].ood`): no separate study.
    table = markdown_table(config, runs, ood_runs or [run for run in runs if "ood" in run])
    (out / "table.md").write_text(table, encoding="utf-8")
    plots = write_plots(config, runs, out)
    results = {
        "name": config["name"],
        "title": config["title"],
        "quick": quick,
        "mock_data": mock_data,
        "distribute": describe_strategy(strategy),
        "machine": describe_machine(),
        "seconds": time.perf_counter() - started,
        "config": config,
        "runs": [{k: v for k, v in run.items() if not k.startswith("_")} for run in runs],
        "ood_runs": [{k: v for k, v in run.items() if not k.startswith("_")} for run in ood_runs],
        "table": "table.md",
        "plots": [Path(p).name for p in plots],
    }
    with open(out / "results.json", "w", encoding="utf-8") as handle:
        json.dump(_json_safe(results), handle, indent=2, allow_nan=False)
    return results


def parse_args(argv: list[str] | None = None, *, description: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("config", help="YAML config, e.g. configs/digits.yaml")
    parser.add_argument("--out", help="output folder (default runs/<config name>)")
    parser.add_argument("--quick", action="store_true", help="apply the config's quick: section")
    parser.add_argument("--mock-data", action="store_true", help="TFDS mock data (random images, offline)")
    parser.add_argument("--data-dir", help="directory of IDX files (EMNIST, Fashion-MNIST, MNIST; `make real-data` "
                                           "fills data/real), else a TFDS data directory; overrides data.data_dir")
    parser.add_argument("--methods", help="comma-separated method keys to run")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None,
                        help="Keras fit verbosity (default: a progress bar on a terminal, else a line per epoch)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="none",
                        help="tf.distribute strategy: mirrored = this machine's GPUs (or CPU devices); "
                             "multi_worker = the cluster in TF_CONFIG (run the same command on every worker)")
    parser.add_argument("--logical-cpus", type=int, default=None, metavar="N",
                        help="split the CPU into N logical devices first (try --strategy mirrored without GPUs)")
    args = parser.parse_args(argv)
    if args.logical_cpus is not None and args.logical_cpus < 1:
        parser.error(f"--logical-cpus must be a positive integer, got {args.logical_cpus}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.logical_cpus is not None:
        split_cpu(args.logical_cpus)  # before anything else touches TensorFlow
    from keras_thermo.data import DatasetNotPreparedError  # noqa: PLC0415

    try:
        strategy = make_strategy(args.strategy)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        config = load_config(args.config)
        base_out = args.out or os.path.join("runs", str(config["name"]))
        results = run_config(
            config, base_out, quick=args.quick, mock_data=args.mock_data, data_dir=args.data_dir,
            methods=args.methods, verbose="auto" if args.verbose is None else args.verbose,
            strategy=strategy,
        )
    except DatasetNotPreparedError as error:
        print(f"error: {error}\n(For a smoke test without the data, pass --mock-data.)", file=sys.stderr)
        return EXIT_ERROR
    except ConfigError as error:
        print(f"error in config {args.config}: {error}", file=sys.stderr)
        return EXIT_ERROR
    out = output_folder(base_out, strategy)
    print()
    print((out / "table.md").read_text(encoding="utf-8"))
    print(f"Wrote {out}/results.json, table.md, {', '.join(results['plots'])} and tensorboard/ "
          f"in {results['seconds']:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
