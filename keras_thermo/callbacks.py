"""Every callback of keras_thermo in one place.

Keras calls callbacks once per execution (`steps_per_execution` steps); the callbacks that must
see individual steps record inside the compiled train step into a small buffer of variables
that they drain after each execution (`ParameterRecorder`, `keras_thermo._recording`).
"""

from keras_thermo._recording import ParameterRecorder, RecordingCallback, SampleCollector
from keras_thermo.equilibration import EquilibrationCheck
from keras_thermo.posterior_average import PosteriorAverage
from keras_thermo.tact_histograms import TACTHistograms

__all__ = [
    "EquilibrationCheck",
    "ParameterRecorder",
    "PosteriorAverage",
    "RecordingCallback",
    "SampleCollector",
    "TACTHistograms",
]
