"""Step size and friction in the units users know from SGD with momentum.

With `v = h M^-1 p`, the Euler step of SGHMC (and of the thermostat samplers at `xi = A`),
`p += h F - h A p + noise; theta += h M^-1 p`, reads `v = (1 - A h) v + (h^2 / M) F + noise;
theta += v`. The force of the mean minibatch loss L is `F = -N grad L` (DESIGN section 3), so
without the noise this is `keras.optimizers.SGD(learning_rate, momentum)` on L exactly, with

    learning_rate = h^2 N / M,    momentum = 1 - A h.

The injected noise (`sqrt(2 A h T)` per step in p) is what turns the optimizer into a sampler at
temperature T; a prior adds its force `-grad R` to F, i.e. `grad R / N` to the loss gradient.
"""

from __future__ import annotations

import math

from keras_thermo._validation import check_int, check_number, check_positive


def from_learning_rate(learning_rate: float, momentum: float, num_examples: int, mass: float = 1.0) -> dict:
    """`{"step_size": h, "friction": A}` of SGD with `learning_rate` and `momentum` on the mean
    loss of `num_examples` examples (module doc).

    Example:
        >>> from_learning_rate(0.05, 0.9, num_examples=50_000)
        {'step_size': 0.001, 'friction': 100.0}
    """
    learning_rate = check_positive("learning_rate", learning_rate)
    momentum = check_number("momentum", momentum, low=0.0, high=1.0, low_inclusive=True, high_inclusive=False)
    num_examples = check_int("num_examples", num_examples, low=1)
    mass = check_positive("mass", mass)
    step_size = math.sqrt(learning_rate * mass / num_examples)
    return {"step_size": _round(step_size), "friction": _round((1.0 - momentum) / step_size)}


def to_learning_rate(step_size: float, friction: float, num_examples: int, mass: float = 1.0) -> dict:
    """`{"learning_rate": h^2 N / M, "momentum": 1 - A h}`: the SGD that a sampler's step is,
    without its noise (module doc). A momentum below 0 means the friction damps more than
    completely in one step.

    Example:
        >>> to_learning_rate(1e-3, 1.0, num_examples=54_000)
        {'learning_rate': 0.054, 'momentum': 0.999}
    """
    step_size = check_positive("step_size", step_size)
    friction = check_positive("friction", friction)
    num_examples = check_int("num_examples", num_examples, low=1)
    mass = check_positive("mass", mass)
    return {"learning_rate": _round(step_size**2 * num_examples / mass), "momentum": _round(1.0 - friction * step_size)}


def _round(value: float) -> float:
    """Drops the last bits of a float's decimal expansion (0.054000000000000006 -> 0.054)."""
    return float(f"{value:.12g}")
