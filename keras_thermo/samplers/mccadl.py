"""Modified CCAdL: the BAODCDOAB splitting with an exact covariance step (Wei & Shang, 2026).

CCAdL's covariance friction `dp = -(h/2) beta Sigma(theta) p dt` is integrated exactly over the
step (the C step, DESIGN section 4),

    p <- exp(-h (h/2) beta Sigma) p,   Sigma = (N^2 / n) Gc^T Gc / (n - 1),

with `Gc` the centered per-example gradients `[n, Nd]` of the current minibatch in the paper's
listing (`covariance="minibatch"`; the default is a moving average, below). Writing
`exp(-h (h/2) beta Sigma) = exp(-tau Gc^T Gc)` gives

    tau = h * (h/2) * beta * N^2 / (n (n - 1)),

and `keras_thermo.linalg.expm_action` applies it with products by `Gc` only: the `Nd x Nd`
matrix is never formed. The step contracts `p` along the directions of large gradient noise,
by at most a factor 1 (an exact exponential of a negative semi-definite matrix), so unlike CCAdL's
Euler friction it cannot go unstable however large `h^2 ||Sigma||` is; it leaves directions with
no gradient noise untouched.

The splitting is B A O D C D O A B (half steps except C). One force per step: the closing half
kick of step t and the opening half kick of step t+1 use the same force, so each `update` applies
one kick `h F(theta_t)` (a half kick on the very first step), then A O D C D O A. The covariance of
the C step is that of the minibatch whose force opened the step, as in the paper's listing, where
the force closing one iteration (and its minibatch) is reused at the start of the next.

`covariance="diag"`, the default, replaces that minibatch covariance by CCAdL's moving average
of the per-coordinate variances `I_t` (`keras_thermo.samplers.covariance_average`), still
integrated exactly, now elementwise: `p <- exp(-h (h/2) beta (N^2/n) I_t / M) p`. Two reasons
the minibatch's own covariance fails on networks: it is large exactly when its kick is where a
few examples carry most of the gradient noise, and the exact exponential responds to it far from
linearly (the covariance_average module doc); and it has rank n - 1, so its whole trace sits in
n - 1 directions, where `h^2 beta Sigma` is far above 1 at step sizes where the average's
entries are not: the C step then stops the momentum there, but the kick has already moved theta
through the half drift before it (B A O D C), so the positions heat along those directions. On
real Fashion-MNIST the logits kernel's configurational temperature was 3.3 T with it (26.7 T at
a step of 1.95e-4, near SGNHT's); with the average mCCAdL matches CCAdL (`docs/real_data.md`).
The average holds the step's own minibatch with weight `k_t` only (`1/t` from the restart after
the warm-up, at most `1/W` with a window), so it is nearly independent of any one kick. It drops
the off-diagonal covariance, as CCAdL's default does.

Under `step_size="auto"` no C step runs inside the adaptation window
(`ThermostatSampler.covariance_friction_weight`, as CCAdL's friction).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import tensorflow as tf

from keras_thermo import _tree
from keras_thermo import linalg as kt_linalg
from keras_thermo.linalg.operators import CenteredRows, symmetrized
from keras_thermo._validation import check_choice, check_int
from keras_thermo.samplers import auto_step, covariance_average, integrators
from keras_thermo.samplers.base import StepContext, force_noise_scale, num_scalars, require_per_example_gradients
from keras_thermo.samplers.thermostat import (
    DEFAULT_PER_VARIABLE_THERMOSTAT, DEFAULT_WARMUP_STEPS, ThermostatSampler,
)


COVARIANCES = ("minibatch", "diag")

#: `expm_method` logged by `covariance="diag"`: an elementwise exponential, no matrix products.
ELEMENTWISE = -1


class MCCAdLState(NamedTuple):
    step: tf.Tensor
    momentum: list
    xi: tf.Tensor
    preconditioner: tuple = ()
    friction: tf.Tensor = 0.0  # A of the last step (`ThermostatSampler.follow_friction`), float64
    covariance: list | tuple = ()  # `covariance="diag"`: the moving-average variances I_t, float64


class ScaledColumns(CenteredRows):
    """`Gc diag(d)`: the columns of a `CenteredRows` operator scaled by a vector `d` `[D]`.

    With `d = diag(M)^-1/2` it is the factor of `M^-1/2 Gc^T Gc M^-1/2`, the covariance in the
    mass-weighted momentum `q = M^-1/2 p` (the C step under a diagonal mass, see `MCCAdL`).
    Products cost one product of the wrapped operator; the Gram matrix `Gc diag(d^2) Gc^T`
    takes the `[D, n]` block `Gc^T` once.

    Example:
        >>> import tensorflow as tf
        >>> from keras_thermo.linalg.operators import MatrixRows
        >>> rows = ScaledColumns(MatrixRows(tf.constant([[1.0, 2.0], [-1.0, -2.0]])), tf.constant([2.0, 0.5]))
        >>> rows.gram().numpy().tolist()
        [[5.0, -5.0], [-5.0, 5.0]]
    """

    def __init__(self, inner: CenteredRows, scale: tf.Tensor):
        self.inner = inner
        self.scale = scale

    @property
    def num_rows(self):
        return self.inner.num_rows

    @property
    def num_cols(self):
        return self.inner.num_cols

    @property
    def dtype(self) -> tf.DType:
        return self.inner.dtype

    def matvec(self, block):
        return self.inner.matvec(tf.cast(self.scale, block.dtype)[:, None] * block)

    def rmatvec(self, block):
        return tf.cast(self.scale, block.dtype)[:, None] * self.inner.rmatvec(block)

    def gram(self):
        transposed = self.inner.rmatvec(tf.eye(self.inner.num_rows, dtype=self.dtype))  # Gc^T, [D, n]
        weighted = tf.square(tf.cast(self.scale, self.dtype))[:, None] * transposed
        return symmetrized(self.inner.matvec(weighted))

    def frobenius_squared(self):
        return tf.linalg.trace(self.gram())

    def __tf_flatten__(self):
        metadata, components = self.inner.__tf_flatten__()
        return (type(self.inner), metadata, len(components)), (*components, self.scale)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        inner_type, inner_metadata, count = metadata
        rows = cls.__new__(cls)
        rows.inner = inner_type.__tf_unflatten__(inner_metadata, list(components[:count]))
        rows.scale = components[count]
        return rows


def scale_columns(centered, scale: tf.Tensor):
    """`Gc diag(scale)` for a `[n, D]` tensor (scaled in place) or a `CenteredRows` operator."""
    if isinstance(centered, CenteredRows):
        return ScaledColumns(centered, scale)
    centered = tf.convert_to_tensor(centered)
    return centered * tf.cast(scale, centered.dtype)[None, :]


def covariance_step(
    momentum: Sequence[tf.Tensor],
    centered_gradients: tf.Tensor,
    tau,
    method: str = "auto",
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """C: `p <- exp(-tau Gc^T Gc) p` on the flattened momentum, without forming `Gc^T Gc`.

    Args:
        momentum: p, one tensor per trainable variable.
        centered_gradients: `Gc`, `[n, Nd]`, columns in the order of the flattened momentum.
        tau: scalar >= 0; for mCCAdL `h (h/2) beta N^2 / (n (n - 1))`.
        method: `"auto"`, `"taylor"` or `"gram"` (see `keras_thermo.linalg.expm_action`).

    Returns:
        `(momentum, matvecs, method_code)`: the new momenta shaped like the old, the work spent
        (products with `Gc^T Gc`) and which method ran (`linalg.TAYLOR` or `linalg.GRAM`).

    Example:
        >>> import tensorflow as tf
        >>> gc = tf.constant([[1.0, 0.0], [-1.0, 0.0]])   # noise along the first coordinate only
        >>> p, _, _ = covariance_step([tf.constant([1.0, 1.0])], gc, 0.5)
        >>> [round(float(x), 4) for x in p[0]]             # exp(-0.5 * 2) = 0.3679
        [0.3679, 1.0]
    """
    flat = _tree.flatten(momentum)
    result, matvecs, code = kt_linalg.expm_action(centered_gradients, flat, tau, method=method)
    return _tree.unflatten(result, momentum), matvecs, code


@keras.saving.register_keras_serializable(package="keras_thermo")
class MCCAdL(ThermostatSampler):
    """mCCAdL: CCAdL whose covariance friction is integrated exactly, in a symmetric splitting.

    Compared with CCAdL it integrates the covariance friction exactly, so it stays stable at
    step sizes where CCAdL's explicit friction blows up, in a second-order splitting (BAODCDOAB)
    with one force evaluation per step. By default (`covariance="diag"`) the C step uses CCAdL's
    moving average of the per-coordinate gradient-noise variances; `covariance="minibatch"` is
    the paper's listing, the full covariance of the current minibatch through the action of its
    matrix exponential (products with the `[n, Nd]` per-example gradients). On networks the
    minibatch covariance runs hot (module doc), so it is not the default.

    Args:
        step_size: h, a positive float, a `LearningRateSchedule`, or `"auto"` (the default:
            measured from the curvature during the warm-up, then frozen; `samplers.auto_step`).
        friction: A > 0: the injected-noise amplitude `sqrt(2 A T)` and `xi_0`; None (the
            default) follows the step size, `A = 0.01 / h` (SGD momentum 0.99, `samplers.auto_step`).
        thermal_mass: mu > 0; default `Nd`, the number of trainable scalars.
        mass: Scalar mass M > 0.
        expm: How the C step of `covariance="minibatch"` applies the matrix exponential:
            `"taylor"` (scaled Taylor series of Al-Mohy & Higham, the paper's method), `"gram"`
            (exact to rounding, through the smaller of the `n x n` and `Nd x Nd` Gram matrices,
            by Lanczos steps) or `"auto"` (the default: the cheaper of the two for each step).
            `"diag"` takes only `"auto"`: its exponential is elementwise.
        preconditioner: None, `"layerwise"` (exact after its warm-up), `"rmsprop"` (approximate)
            or a `preconditioning.Preconditioner`: the mass becomes `M diag(m)`.
        per_variable_thermostat: True (the default): one xi per trainable tensor; False: the
            papers' one for the net (as `SGNHT`; `ThermostatSampler`); logged `xi` is the mean.
        covariance: `"diag"` (the default: CCAdL's moving average of the per-coordinate
            variances, integrated exactly and elementwise) or `"minibatch"` (the paper's listing:
            the full covariance of the step's minibatch, by `expm`; module doc).
        covariance_window: With `"diag"`: None averages with weights 1/t from the restart after
            the warm-up; W >= 1 gives `max(1/t, 1/W)`, as `CCAdL`.
        warmup_steps: W >= 0 (default 1000): the papers' update restarts at step W with `xi = A`
            and fresh `p ~ N(0, T M)` (as `SGNHT`; `ThermostatSampler`).

    Example:
        >>> from keras_thermo.samplers.mccadl import MCCAdL
        >>> sampler = MCCAdL(step_size=1e-3, friction=1.0, expm="auto")
        >>> sampler.get_config()["expm"]
        'auto'

    Reference:
        J. Wei and X. Shang, "Improving the stability of the covariance-controlled adaptive
        Langevin thermostat for large-scale Bayesian sampling", 2026, Algorithm 1;
        A. H. Al-Mohy and N. J. Higham, "Computing the action of the matrix exponential",
        SIAM J. Sci. Comput. 33(2), 2011.
    """

    name = "mccadl"

    #: Its step is the symmetric BAODCDOAB splitting (second order).
    symmetric_step = True
    needs_per_example_gradients = True

    def __init__(
        self,
        step_size=auto_step.AUTO,
        friction: float | None = None,
        thermal_mass: float | None = None,
        mass: float = 1.0,
        expm: str = "auto",
        preconditioner=None,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        per_variable_thermostat: bool = DEFAULT_PER_VARIABLE_THERMOSTAT,
        covariance: str = "diag",
        covariance_window: int | None = None,
    ):
        super().__init__(
            step_size, friction=friction, thermal_mass=thermal_mass, mass=mass, preconditioner=preconditioner,
            warmup_steps=warmup_steps, per_variable_thermostat=per_variable_thermostat,
        )
        self.expm = check_choice("expm", expm, kt_linalg.dispatch.METHODS)
        if covariance == "full":
            raise ValueError("MCCAdL: covariance='full' is not an option: 'minibatch' (the paper's listing) already "
                             "uses the full covariance of the step's minibatch; 'diag' uses CCAdL's moving average.")
        self.covariance = check_choice("covariance", covariance, COVARIANCES)
        if self.covariance == "diag" and self.expm != "auto":
            raise ValueError(f"MCCAdL: expm applies only to covariance='minibatch' (the matrix exponential of the "
                             f"minibatch covariance); covariance='diag' integrates elementwise. Got expm={expm!r} "
                             f"with covariance='diag': pass covariance='minibatch' to choose the method.")
        if covariance_window is not None and self.covariance != "diag":
            raise ValueError(f"MCCAdL: covariance_window applies only to covariance='diag' (the moving average), "
                             f"got covariance_window={covariance_window!r} with covariance={self.covariance!r}.")
        self.covariance_window = (
            None if covariance_window is None else check_int("covariance_window", covariance_window, low=1)
        )

    @property
    def not_at_temperature_hint(self) -> str:
        """What the temperature check's warning adds for this sampler (`EquilibrationCheck`)."""
        if self.covariance != "minibatch":
            return ""
        return ("mCCAdL's C step uses the covariance of the step's own minibatch, which is biased where a "
                "few examples carry most of the gradient noise (a classifier's logits once most examples are "
                "fitted): MCCAdL(covariance='diag') uses CCAdL's moving average instead.")

    def init(self, params: Sequence[tf.Tensor], *, temperature: float, seed: int) -> MCCAdLState:
        momentum, xi, friction = self.initial_momentum_and_xi(params, temperature=temperature, seed=seed)
        return MCCAdLState(
            step=tf.constant(0, tf.int64), momentum=momentum, xi=xi, preconditioner=self.init_preconditioner(params),
            friction=friction,
            covariance=covariance_average.zeros_like_variables(params) if self.covariance == "diag" else (),
        )

    def update(self, state: MCCAdLState, params, force, context: StepContext):
        per_example = require_per_example_gradients(context, "MCCAdL")
        h = self.step_size_at(state.step)
        num_params = num_scalars(params)
        beta = 1.0 / context.temperature

        rows = per_example.count
        state, mass, preconditioner, restarted = self.start_step(state, params, force, context)
        average = state.covariance
        # No C step inside the automatic step's window: tau = 0 makes the exponential the identity
        # (the minibatch C step still runs, and logs, its products there: it is not branched on,
        # since its factor's cross-replica gather must run at every step).
        on = self.covariance_friction_weight(state.step)
        if self.covariance == "diag":
            weight = covariance_average.sampler_weight(self, state.step)
            average = covariance_average.diagonal_average(state.covariance, per_example, params, weight)
            # Sigma = (N^2/n) I_t / M per coordinate (M the scalar or diagonal mass): the exact flow
            # of dp = -(h/2) beta Sigma p dt over h is elementwise (derivation as below).
            inverse_mass = [1.0 / m for m in integrators.per_tensor(mass, len(params))]
            rate = h * (0.5 * h) * beta * force_noise_scale(context) * on

            def c_step(momentum):
                # A scalar mass joins the scalar rate (one product per weight fewer).
                return [p * (tf.exp(integrators.as_float32(v) * (-rate * w)) if isinstance(w, float)
                             else tf.exp(-rate * integrators.as_float32(v) * w))
                        for p, v, w in zip(momentum, average, inverse_mass)], (0, ELEMENTWISE)

            noise_trace = force_noise_scale(context) * tf.add_n(
                [tf.reduce_sum(integrators.as_float32(v) * w) for v, w in zip(average, inverse_mass)])
        elif self.preconditioner is None:
            centered = per_example.covariance_factor()
            # The papers' Sigma is the force covariance over the mass, (N^2/n) Gc^T Gc / ((n-1) M),
            # so h (h/2) beta Sigma = tau Gc^T Gc with:
            sigma_scale = force_noise_scale(context) / self.mass
            tau = h * (0.5 * h) * beta * sigma_scale / (rows - 1.0) * on

            def c_step(momentum):
                momentum, matvecs, method_code = covariance_step(momentum, centered, tau, self.expm)
                return momentum, (matvecs, method_code)

            noise_trace = sigma_scale * per_example.covariance_trace()
        else:
            centered = per_example.covariance_factor()
            # Diagonal mass M: Sigma = M^-1/2 B M^-1/2 with B = (N^2/n) Gc^T Gc / (n-1), the force
            # noise seen by q = M^-1/2 p (derived in `keras_thermo.samplers.ccadl`). The C step is
            # the exact flow of dq = -(h/2) beta Sigma q dt over h: q <- exp(-tau Gs^T Gs) q with
            # Gs = Gc M^-1/2 and the tau of a unit mass; p = M^1/2 q.
            sigma_scale = force_noise_scale(context)
            tau = h * (0.5 * h) * beta * sigma_scale / (rows - 1.0) * on
            inverse_sqrt = [tf.broadcast_to(tf.math.rsqrt(m), p.shape) for m, p in zip(mass, params)]
            flat_inverse_sqrt = _tree.flatten(inverse_sqrt)
            scaled = scale_columns(centered, flat_inverse_sqrt)

            def c_step(momentum):
                q = [p * s for p, s in zip(momentum, inverse_sqrt)]
                q, matvecs, method_code = covariance_step(q, scaled, tau, self.expm)
                return [x / s for x, s in zip(q, inverse_sqrt)], (matvecs, method_code)

            diagonal = tf.cast(per_example.diagonal_covariance(), tf.float32)
            noise_trace = sigma_scale * tf.reduce_sum(diagonal * tf.square(flat_inverse_sqrt))

        thermostat_kwargs = self.thermostat_kwargs(params, context, mass)
        new_params, momentum, xi, kinetic, (matvecs, method_code) = integrators.symmetric_step(
            state, params, force, h, context, ou_kwargs=self.ou_kwargs(context, mass, h=h),
            thermostat_kwargs=thermostat_kwargs, covariance_step=c_step,
            fresh_start=restarted,
        )

        diagnostics = {
            # The mean of the D steps' values (before and after C), which xi holds at T.
            "kinetic_temperature": integrators.whole_net_kinetic(kinetic, thermostat_kwargs["variable_sizes"]),
            "step_size": h,
            "xi": self.logged_xi(xi),
            "noise_scale": noise_trace / float(num_params),
            "expm_matvecs": tf.cast(matvecs, tf.float32),
            "expm_method": tf.cast(method_code, tf.float32),
        }
        new_state = MCCAdLState(
            step=state.step + 1, momentum=momentum, xi=xi, preconditioner=preconditioner, friction=state.friction,
            covariance=average,
        )
        return new_params, new_state, diagnostics

    def get_config(self):
        return {**super().get_config(), "expm": self.expm, "covariance": self.covariance,
                "covariance_window": self.covariance_window}

    @classmethod
    def from_config(cls, config):
        # `get_config` has always written `expm`; one with `expm` but no `covariance` was saved
        # before that argument existed, when every mCCAdL ran the minibatch C step, and loads as
        # what it ran rather than as today's default.
        if "expm" in config and "covariance" not in config:
            config = {**config, "covariance": "minibatch"}
        return super().from_config(config)
