"""Diagonal mass (preconditioning) estimated from the gradients: layerwise and RMSprop forms.

A sampler given `preconditioner=...` runs with a diagonal mass `M = mass * diag(m)`, where the
relative masses `m` come from the force seen during the run. Every piece of the update then uses
`M^-1 p` (drift), `p . M^-1 . p` (kinetic energy, thermostats) and `M^1/2` noise, so the target
`exp(-U / T)` is unchanged: only how fast each coordinate moves (a stiff coordinate, with large
gradients, gets a large mass and moves slowly; a flat one a small mass and moves fast). For SGLD
the mass is the inverse of the position-space preconditioner: `theta += (eps/2) M^-1 F +
sqrt(eps T) M^-1/2 R`.

Two forms:

- `"layerwise"`: one mass per trainable variable, `m_v` proportional to the root mean square of
  that variable's force over the first `warmup_steps` steps, then **frozen**, so from then on the
  chain is an exact sampler with a constant mass (cf. the layerwise preconditioner of Wenzel et
  al. 2020, estimated during burn-in). During the warm-up `m = 1`.
- `"rmsprop"`: one mass per scalar, `m_i` proportional to `sqrt(V_i)`, `V` the exponential moving
  average of the squared force (pSGLD, Li et al. 2016), updated at every step. Li et al.'s chain
  drops the correction term `Gamma(theta)` (the divergence of the position-dependent
  preconditioner), and so does this one: it is **approximate** (biased by O(the change of V per
  step)), like pSGLD itself. Use `"layerwise"` where exactness matters.

Both are normalised so that the mean relative mass over all Nd scalars is 1 (`sum_v n_v m_v =
Nd`): the step size keeps its meaning for a typical coordinate, and the statistic's scale (which
grows like N) drops out. `damping` adds `damping * mean(rms)` to every rms before normalising,
bounding the lightest mass (a variable with no gradient, such as a dead unit, would otherwise get
a mass near 0 and an unbounded velocity).

When a mass changes (at the end of the warm-up, or every step for `"rmsprop"`), the momentum is
rescaled by `sqrt(m_new / m_old)`, which keeps each coordinate's kinetic energy `p^2 / m`, so a
thermalised momentum stays thermalised.

References:
    C. Li, C. Chen, D. Carlson and L. Carin, "Preconditioned stochastic gradient Langevin dynamics
    for deep neural networks", AAAI 2016 (pSGLD);
    F. Wenzel et al., "How good is the Bayes posterior in deep neural networks really?", ICML
    2020 (layerwise preconditioning estimated during burn-in).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo._validation import check_choice, check_int, check_non_negative, check_number

#: The forms a sampler's `preconditioner` argument names.
KINDS = ("layerwise", "rmsprop")

Tensors = list[tf.Tensor]


class PreconditionerState(NamedTuple):
    """Relative masses `m` (float32: a scalar per variable for "layerwise", shaped like the
    variable for "rmsprop") and the force statistic they come from (layerwise: float64 sums of
    each variable's mean squared force over the warm-up; rmsprop: the moving average V)."""

    mass: list
    moment: list


@keras.saving.register_keras_serializable(package="keras_thermo")
class Preconditioner:
    """A diagonal mass estimated from the force (module doc).

    Args:
        kind: `"layerwise"` (exact after the warm-up) or `"rmsprop"` (approximate, pSGLD).
        warmup_steps: Layerwise: steps whose force sets the frozen masses (>= 1).
        decay: RMSprop: the moving average's decay rho in [0, 1) (`V <- rho V + (1 - rho) F^2`).
        damping: >= 0, added to every rms as a fraction of their mean before normalising.

    Example:
        >>> import keras_thermo as kt
        >>> sampler = kt.samplers.SGHMC(1e-3, preconditioner=Preconditioner("layerwise", warmup_steps=500))
        >>> sampler.preconditioner.kind
        'layerwise'
    """

    def __init__(self, kind: str = "layerwise", warmup_steps: int = 100, decay: float = 0.99, damping: float = 1e-2):
        self.kind = check_choice("kind", kind, KINDS)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, low=1)
        self.decay = check_number("decay", decay, low=0.0, high=1.0, low_inclusive=True, high_inclusive=False)
        self.damping = check_non_negative("damping", damping)

    def init(self, params: Sequence[tf.Tensor]) -> PreconditionerState:
        if self.kind == "layerwise":
            mass = [tf.constant(1.0, tf.float32) for _ in params]
            moment = [tf.constant(0.0, tf.float64) for _ in params]
        else:
            mass = [tf.ones(p.shape, tf.float32) for p in params]
            moment = [tf.zeros(p.shape, tf.float32) for p in params]
        return PreconditionerState(mass=mass, moment=moment)

    def _normalised(self, rms: Sequence[tf.Tensor], sizes: Sequence[float]) -> Tensors:
        """`(rms + damping * mean) / mean(rms + damping * mean)`, means over all scalars."""
        total = float(sum(sizes))

        def mean_over_scalars(values):
            # A layerwise value stands for all n_v scalars of its variable.
            if self.kind == "layerwise":
                return tf.add_n([v * size for v, size in zip(values, sizes)]) / total
            return tf.add_n([tf.reduce_sum(v) for v in values]) / total

        mean_rms = mean_over_scalars(rms)
        damped = [r + self.damping * mean_rms for r in rms]
        mean_damped = mean_over_scalars(damped)
        # A force identically zero everywhere leaves the masses at 1.
        safe = mean_damped > 0
        return [tf.where(safe, d / tf.where(safe, mean_damped, 1.0), tf.ones_like(d)) for d in damped]

    def update(self, state: PreconditionerState, force: Sequence[tf.Tensor], step: tf.Tensor) -> PreconditionerState:
        """The masses of step `step` (counted from 0) and the updated statistic."""
        sizes = [float(f.shape.num_elements()) for f in force]
        if self.kind == "layerwise":
            warming = step < self.warmup_steps
            moment = [
                m + tf.where(warming, tf.reduce_mean(tf.square(tf.cast(f, tf.float64))), tf.constant(0.0, tf.float64))
                for m, f in zip(state.moment, force)
            ]
            rms = [tf.cast(tf.sqrt(m / float(self.warmup_steps)), tf.float32) for m in moment]
            estimate = self._normalised(rms, sizes)
            freeze_now = tf.equal(step, self.warmup_steps)
            mass = [tf.where(freeze_now, new, old) for new, old in zip(estimate, state.mass)]
            return PreconditionerState(mass=mass, moment=moment)
        moment = [self.decay * v + (1.0 - self.decay) * tf.square(tf.cast(f, tf.float32)) for v, f in zip(state.moment, force)]
        mass = self._normalised([tf.sqrt(v) for v in moment], sizes)
        return PreconditionerState(mass=mass, moment=moment)

    def get_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "warmup_steps": self.warmup_steps, "decay": self.decay, "damping": self.damping}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Preconditioner":
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"Preconditioner({args})"


def get(identifier) -> Preconditioner | None:
    """None, a kind name (`"layerwise"`, `"rmsprop"`), a `Preconditioner` or its config dict."""
    if identifier is None or isinstance(identifier, Preconditioner):
        return identifier
    if isinstance(identifier, str):
        return Preconditioner(check_choice("preconditioner", identifier, KINDS))
    if isinstance(identifier, dict):
        config = identifier.get("config", identifier)
        return Preconditioner.from_config(config)
    raise TypeError(
        f"`preconditioner` must be None, one of {list(KINDS)}, a keras_thermo.samplers."
        f"preconditioning.Preconditioner or its config dict, got {identifier!r}."
    )


def momentum_factors(old: PreconditionerState, new: PreconditionerState) -> Tensors:
    """`sqrt(m_new / m_old)` per variable: multiplying p by it keeps `p^2 / m` (module doc);
    exactly 1 where the mass did not change."""
    return [tf.sqrt(n / o) for n, o in zip(new.mass, old.mass)]
