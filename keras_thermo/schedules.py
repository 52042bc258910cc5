"""Step-size schedules.

Any `keras.optimizers.schedules.LearningRateSchedule` can drive a sampler's step size; this module
adds the SGLD paper's polynomial decay.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo._validation import check_number, check_positive


@keras.saving.register_keras_serializable(package="keras_thermo")
class PolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`eps_t = a * (b + t) ** (-gamma)`, the schedule of Welling & Teh (2011), section 3.

    The SGLD conditions `sum eps_t = inf`, `sum eps_t^2 < inf` hold for `gamma` in (0.5, 1].

    Args:
        a: Scale, > 0.
        b: Offset, > 0 (keeps the first steps finite).
        gamma: Decay exponent in [0, 1]; 0 gives a constant step `a * b**0`.

    Example:
        >>> schedule = PolynomialDecay(a=0.01, b=1.0, gamma=0.55)
        >>> round(float(schedule(0)), 6)
        0.01

    Reference:
        M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
        ICML 2011.
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55):
        self.a = check_positive("a", a)
        self.b = check_positive("b", b)
        self.gamma = check_number("gamma", gamma, low=0.0, high=1.0, low_inclusive=True)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        return self.a * tf.pow(self.b + step, -self.gamma)

    def get_config(self) -> dict:
        return {"a": self.a, "b": self.b, "gamma": self.gamma}
