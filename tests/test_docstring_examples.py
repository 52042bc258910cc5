"""The runnable examples in the docstrings of the prediction, diagnostics, schedule and prior
modules, of the preconditioners and of the benchmark runner, run and print what they show
(doctest)."""

import doctest

import pytest

from benchmarks import run
from keras_thermo import _recording, chains, diagnostics, posterior, priors, random, schedules
from keras_thermo.metrics import classification, mixture
from keras_thermo.samplers import preconditioning


@pytest.mark.parametrize(
    "module",
    [classification, mixture, diagnostics, posterior, _recording, schedules, priors, preconditioning, chains, random, run],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
