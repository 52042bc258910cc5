"""Deprecated: `TACTHistograms` lives in `keras_thermo.tact_histograms` (and `keras_thermo.callbacks`);
this module re-exports it for one release."""

from keras_thermo._deprecation import warn_moved_module
from keras_thermo.tact_histograms import TACTHistograms

warn_moved_module("keras_thermo._histograms", "keras_thermo.tact_histograms")

__all__ = ["TACTHistograms"]
