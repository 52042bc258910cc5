"""The runnable examples in the docstrings of the prediction, diagnostics, temperature-check,
block-statistics, schedule and prior modules, of the automatic step size, of BayesianModel, the sampler base and units, the preconditioners
and the benchmark runner, run and print what they show (doctest)."""

import doctest

import pytest

from benchmarks import run
from keras_thermo import (
    _recording,
    block_statistics,
    chains,
    diagnostics,
    equilibration,
    model,
    posterior,
    posterior_average,
    priors,
    random,
    schedules,
    temperatures,
)
from keras_thermo.metrics import classification, mixture
from keras_thermo.samplers import auto_step, base, preconditioning, units


@pytest.mark.parametrize(
    "module",
    [classification, mixture, diagnostics, posterior, posterior_average, _recording, schedules, priors,
     preconditioning, chains, random, run, equilibration, block_statistics, temperatures, model, base, auto_step, units],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
