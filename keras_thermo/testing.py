"""The shared correctness check every sampler's test uses: Bayesian linear regression.

The model is `y = [x, 1] . theta + noise` fitted with `loss="mse"` (mean squared error) and a
Gaussian prior `N(0, prior_std^2 I)`. With the project's units the potential is

    U(theta) = N * mean_i (y_i - a_i . theta)^2 + |theta|^2 / (2 prior_std^2) + const
             = sum_i (y_i - a_i . theta)^2 + |theta|^2 / (2 prior_std^2) + const,

so the target `exp(-U / T)` is Gaussian with precision `P = (2 A^T A + I / prior_std^2) / T` and
mean `P^-1 (2 A^T y) / T`, in closed form (`linear_regression_posterior`). (`mse` is the negative
log-likelihood of Gaussian noise of variance 1/2, up to a constant.)

`run_chains` runs independent chains through `BayesianModel.fit`; `compare_with_gaussian`
turns them into a statistical verdict whose tolerance is the Monte Carlo error: each chain gives
one estimate of every mean and variance, the chains are independent, so the spread of the
per-chain estimates gives their standard error without any autocorrelation model, and the
deviation of their average from the exact value is a Student-t statistic with `C - 1` degrees of
freedom. The threshold is the t quantile at a familywise false-alarm rate `alpha`, Bonferroni-
corrected over all the quantities checked.

The same numbers say what a check can see: an error is detected (with about even odds) once it
reaches `threshold * standard error`. `GaussianCheck.detectable_mean_error` (in posterior
standard deviations) and `detectable_variance_error` (relative) report that resolution, so a test
can state, and assert, the size of the error it would catch.

Weighted data: `run_chains(sample_weight=w)` feeds `(x, y, w)` minibatches. With Keras' default
mean reduction the potential is `N mean_batch(w_i l_i) + R`, whose expectation with `N = len(x)`
is `sum_i w_i l_i + R`: an example of integer weight k counts as k copies of it, so the exact
posterior is `linear_regression_posterior(np.repeat(x, w, 0), np.repeat(y, w, 0))`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

import keras_thermo as kt
from keras_thermo import data as kt_data


def linear_regression_data(
    num_examples: int,
    num_features: int,
    *,
    noise_std: float = 0.7,
    weight_scale: float = 1.0,
    binary_features: bool = False,
    seed: int = 0,
):
    """Synthetic regression data `y = x . w + b + noise` (float32), `x ~ N(0, I)` or, with
    `binary_features`, independent random signs.

    `w ~ N(0, weight_scale^2 I)` and `b = weight_scale / 2`. With `weight_scale=0` and binary
    features the minibatch gradient noise `-2 r_i [x_i, 1]` has the same variance in every
    coordinate (`x_ij^2 = 1`) and does not depend on theta near the posterior (the curvature part
    scales with |theta|): the isotropic, constant noise SGNHT's scalar thermostat assumes.
    """
    rng = np.random.default_rng(seed)
    if binary_features:
        x = rng.choice([-1.0, 1.0], size=(num_examples, num_features))
    else:
        x = rng.normal(size=(num_examples, num_features))
    w = weight_scale * rng.normal(size=num_features)
    y = x @ w + 0.5 * weight_scale + noise_std * rng.normal(size=num_examples)
    return x.astype(np.float32), y[:, None].astype(np.float32)


def small_regression_dataset() -> tf.data.Dataset:
    """64 examples of 3 standard-normal features and a noiseless linear target (fixed seed), as a
    repeating dataset of batches of 8: the small stream the resume and schedule tests fit on."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ rng.normal(size=(3, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)


def linear_regression_posterior(x, y, *, prior_std: float, temperature: float = 1.0, num_examples: float | None = None):
    """Exact mean and covariance of `theta = [kernel..., bias]` under `exp(-U / T)` (see module
    doc); `num_examples` N other than `len(x)` weighs every row by `N / len(x)`."""
    design = np.concatenate([np.asarray(x, np.float64), np.ones((len(x), 1))], axis=1)
    targets = np.asarray(y, np.float64).reshape(-1)
    weight = 1.0 if num_examples is None else num_examples / len(x)
    precision = 2.0 * weight * design.T @ design + np.eye(design.shape[1]) / prior_std**2
    covariance = temperature * np.linalg.inv(precision)
    mean = np.linalg.solve(precision, 2.0 * weight * design.T @ targets)
    return mean, covariance


def linear_regression_net(num_features: int) -> keras.Model:
    """`Dense(1)` on `num_features` inputs: trainable order is [kernel (num_features), bias]."""
    return keras.Sequential([keras.Input((num_features,)), keras.layers.Dense(1)])


class _LogRecorder(keras.callbacks.Callback):
    """Keeps the logs of the last step of every execution."""

    def __init__(self, keys):
        super().__init__()
        self.keys = keys
        self.values = {k: [] for k in keys}

    def on_train_batch_end(self, batch, logs=None):
        for key in self.keys:
            if logs and key in logs:
                self.values[key].append(float(logs[key]))


@dataclasses.dataclass
class ChainResult:
    """Samples `[C, S, Nd]`, the step each came from `[C, S]` (number of completed steps) and
    per-chain step logs `{name: [C, K]}` (the last step of every execution) of `run_chains`."""

    samples: np.ndarray
    logs: dict
    steps: np.ndarray | None = None


def _minibatch_stream(arrays, batch_size: int, seed: int):
    """Endless independent minibatches (drawn with replacement) of a tuple of arrays, as
    `keras_thermo.data.random_minibatches` draws them for `(x, y)`; the full batch when
    `batch_size >= len`."""
    import tensorflow as tf  # noqa: PLC0415

    tensors = tuple(tf.constant(a) for a in arrays)
    num_examples = len(arrays[0])
    if batch_size >= num_examples:
        return tf.data.Dataset.from_tensors(tensors).repeat()

    def draw(batch_index):
        indices = tf.random.stateless_uniform(
            [batch_size], seed=tf.stack([tf.constant(seed, tf.int64), batch_index]),
            maxval=num_examples, dtype=tf.int64,
        )
        return tuple(tf.gather(t, indices) for t in tensors)

    return tf.data.Dataset.range(2**62).repeat().map(draw)  # infinite cardinality: no epoch of rows


def run_chains(
    make_sampler: Callable[[], kt.samplers.Sampler],
    x: np.ndarray,
    y: np.ndarray,
    *,
    num_chains: int,
    num_steps: int,
    batch_size: int,
    burn_in_steps: int,
    every_n_steps: int = 1,
    prior_std: float = 1.0,
    temperature: float = 1.0,
    steps_per_execution: int = 100,
    seed: int = 0,
    log_keys: tuple = ("kinetic_temperature",),
    with_replacement: bool = True,
    initial_params: np.ndarray | None = None,
    sample_weight: np.ndarray | None = None,
    num_examples: float | None = None,
) -> ChainResult:
    """Runs independent chains of a fresh `BayesianModel` each (different seed and data order).

    Every chain starts from the same weights, `initial_params` (`[kernel..., bias]`, default
    zeros), and takes `num_steps` sampler steps on minibatches from `keras_thermo.data.random_minibatches` (full batch
    when `batch_size == len(x)`). With `sample_weight` (`[len(x)]`) the minibatches are
    `(x, y, w)`, drawn with replacement (module doc: the exact posterior of weighted data).
    `num_examples` N other than `len(x)` scales the likelihood, `U = N mean_batch(l) + R`
    (`linear_regression_posterior(num_examples=N)`).
    """
    start = np.zeros(x.shape[1] + 1, np.float32) if initial_params is None else initial_params
    num_examples = len(x) if num_examples is None else num_examples
    max_samples = (num_steps - burn_in_steps) // every_n_steps
    all_samples, all_logs = [], {k: [] for k in log_keys}
    for chain in range(num_chains):
        chain_seed = seed * 1000 + chain
        net = linear_regression_net(x.shape[1])
        kernel, bias = net.trainable_variables
        kernel.assign(np.reshape(start[:-1], kernel.shape).astype(np.float32))
        bias.assign(np.reshape(start[-1:], bias.shape).astype(np.float32))
        model = kt.BayesianModel(
            net, make_sampler(), num_examples=num_examples, prior=kt.priors.Gaussian(prior_std),
            temperature=temperature, seed=chain_seed,
        )
        model.compile(loss="mse", steps_per_execution=steps_per_execution)
        collector = kt.callbacks.SampleCollector(burn_in_steps, every_n_steps, max_samples=max_samples)
        recorder = _LogRecorder(log_keys)
        if sample_weight is None:
            data = kt_data.random_minibatches(x, y, batch_size, seed=chain_seed, with_replacement=with_replacement)
        else:
            if not with_replacement:
                raise ValueError("run_chains: sample_weight is supported with with_replacement=True only.")
            weights = np.asarray(sample_weight, np.float32).reshape(len(x))
            data = _minibatch_stream((x, y, weights), batch_size, chain_seed)
        model.fit(data, steps_per_epoch=num_steps, epochs=1, verbose=0, callbacks=[collector, recorder])
        all_samples.append((collector.samples[:max_samples], collector.steps[:max_samples]))
        for key in log_keys:
            all_logs[key].append(recorder.values[key])
    size = min(len(s) for s, _ in all_samples)
    samples = np.stack([s[:size] for s, _ in all_samples])
    steps = np.stack([t[:size] for _, t in all_samples])
    logs = {}
    for key, per_chain in all_logs.items():
        length = min(map(len, per_chain))
        logs[key] = np.array([values[:length] for values in per_chain])
    return ChainResult(samples=samples, logs=logs, steps=steps)


@dataclasses.dataclass
class GaussianCheck:
    """Outcome of `compare_with_gaussian`; `passed` is the verdict, the rest explains it."""

    passed: bool
    threshold: float
    mean_t: np.ndarray
    variance_t: np.ndarray
    mean_error: np.ndarray  # estimated minus exact mean, per coordinate
    relative_variance_error: np.ndarray  # estimated / exact marginal variance - 1
    # Resolution: threshold * standard error, per coordinate; an error this large is caught about
    # half the time, one 1.5x as large almost always.
    detectable_mean_error: np.ndarray  # in posterior standard deviations
    detectable_variance_error: np.ndarray  # relative to the exact variance

    def summary(self) -> str:
        return (
            f"|t| threshold {self.threshold:.2f}; mean t {np.round(self.mean_t, 2)}; variance t "
            f"{np.round(self.variance_t, 2)}; mean error {np.round(self.mean_error, 4)}; relative "
            f"variance error {np.round(self.relative_variance_error, 3)}; detectable: mean "
            f"{np.round(self.detectable_mean_error, 3)} sd, variance "
            f"{np.round(self.detectable_variance_error, 3)}"
        )


def chain_t_statistic(per_chain: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Student-t statistic of the average of independent per-chain estimates `[C, K]` vs `exact`."""
    return (per_chain.mean(axis=0) - exact) / standard_error(per_chain)


def t_threshold(num_chains: int, num_tests: int, alpha: float) -> float:
    """Two-sided Bonferroni-corrected Student-t quantile."""
    from scipy import stats  # noqa: PLC0415 (test-only dependency)

    return float(stats.t.ppf(1.0 - alpha / (2.0 * num_tests), df=num_chains - 1))


def standard_error(per_chain: np.ndarray) -> np.ndarray:
    """Standard error of the average of independent per-chain estimates `[C, K]`."""
    return per_chain.std(axis=0, ddof=1) / np.sqrt(per_chain.shape[0])


def chain_moments(samples: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-chain means and variances `[C, D]` of chains `[C, S, D]`, optionally weighted.

    The variance of a chain is its mean squared deviation from the mean of all chains, not from
    its own mean: a chain's own mean sits closer to its samples than the true mean does, which
    biases the variance low by the variance of that mean, `1 / ESS` relative (~5% for chains of
    20 effective samples, the short chains these tests prefer); about the pooled mean the bias
    is C times smaller.

    With `weights` `[C, S]` (e.g. SGLD's step sizes, Welling & Teh eq. 11) every average is
    weighted: `sum_s w_s f(theta_s) / sum_s w_s`, within each chain and, for the pooled mean,
    over all chains.
    """
    samples = np.asarray(samples, np.float64)
    if weights is None:
        weights = np.ones(samples.shape[:2])
    weights = np.asarray(weights, np.float64)[:, :, None]
    means = (weights * samples).sum(axis=1) / weights.sum(axis=1)
    pooled = (weights * samples).sum(axis=(0, 1)) / weights.sum(axis=(0, 1))
    variances = (weights * (samples - pooled) ** 2).sum(axis=1) / weights.sum(axis=1)
    return means, variances


def compare_with_gaussian(
    samples: np.ndarray,
    mean: np.ndarray,
    covariance: np.ndarray,
    *,
    alpha: float = 1e-3,
    weights: np.ndarray | None = None,
) -> GaussianCheck:
    """Tests chains `[C, S, D]` against a Gaussian's mean and marginal variances (module doc).

    `weights` `[C, S]`: per-sample weights of the chains' averages (`chain_moments`).
    """
    exact_var = np.diag(covariance)
    num_chains = np.shape(samples)[0]
    chain_means, chain_vars = chain_moments(samples, weights)
    mean_t = chain_t_statistic(chain_means, mean)
    variance_t = chain_t_statistic(chain_vars, exact_var)
    threshold = t_threshold(num_chains, 2 * len(mean), alpha)
    passed = bool(np.all(np.abs(mean_t) < threshold) and np.all(np.abs(variance_t) < threshold))
    return GaussianCheck(
        passed=passed,
        threshold=threshold,
        mean_t=mean_t,
        variance_t=variance_t,
        mean_error=chain_means.mean(axis=0) - mean,
        relative_variance_error=chain_vars.mean(axis=0) / exact_var - 1.0,
        detectable_mean_error=threshold * standard_error(chain_means) / np.sqrt(exact_var),
        detectable_variance_error=threshold * standard_error(chain_vars) / exact_var,
    )


def load_strict_json(path) -> object:
    """Reads a benchmark's JSON output, refusing NaN and Infinity (not standard JSON).

    Example:
        >>> import json, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "r.json")
        >>> with open(path, "w") as handle:
        ...     json.dump({"ratio": 1.5}, handle)
        >>> load_strict_json(path)
        {'ratio': 1.5}
    """

    def reject(constant):
        raise ValueError(f"{path}: non-standard JSON constant {constant}")

    with open(path, encoding="utf-8") as handle:
        return json.load(handle, parse_constant=reject)


def default_initial_params(num_features: int, num_chains: int, *, seed: int) -> np.ndarray:
    """`[C, num_features + 1]` starts `[kernel..., bias]` of `linear_regression_net` drawn with
    Keras' default initializers (Glorot-uniform kernel, zero bias), as `BayesianModel` draws its
    chains' starts (`keras_thermo.chains.redrawn_initial_weights`), chain k from seed `seed + k`."""
    from keras_thermo import chains as kt_chains  # noqa: PLC0415

    net = linear_regression_net(num_features)
    starts = []
    for chain in range(num_chains):
        kernel, bias = kt_chains.redrawn_initial_weights(net, net.trainable_variables, seed + chain)
        starts.append(np.concatenate([kernel.reshape(-1), bias.reshape(-1)]))
    return np.asarray(starts, np.float32)


def simulate_regression_chains(
    make_sampler: Callable[[], kt.samplers.Sampler],
    x: np.ndarray,
    y: np.ndarray,
    starts: np.ndarray,
    *,
    num_steps: int,
    batch_size: int,
    burn_in_steps: int,
    prior_std: float = 1.0,
    temperature: float = 1.0,
    seed: int = 0,
) -> ChainResult:
    """Chains of `sampler.update` on the linear regression of `run_chains` in one compiled loop,
    without `BayesianModel` (about 10x cheaper per step for a model this small).

    Every step draws a minibatch of `batch_size` examples with replacement, and gives the sampler
    what `BayesianModel.fit` gives it for `loss="mse"` and `kt.priors.Gaussian(prior_std)`: the
    force `-(N mean_batch grad l_i + theta / prior_std^2)`, the potential, and the per-example
    gradients `grad l_i` `[n, Nd]` (for CCAdL and mCCAdL). Chain c starts at `starts[c]` with its
    own noise (the sampler's, keyed by `seed + c`, and the minibatches').

    Returns:
        `ChainResult` with samples `[C, S, Nd]` (every step after `burn_in_steps`) and logs
        `{"kinetic_temperature", "xi"}` `[C, num_steps]` (xi only for samplers that log it).
    """
    from keras_thermo.samplers.base import StepContext  # noqa: PLC0415

    class TensorSeedContext(StepContext):
        """A context whose noise is keyed by a tensor seed (one compiled loop for all chains)."""

        def normal(self, step, like, stream):
            key = tf.random.experimental.stateless_fold_in(
                tf.stack([tf.cast(self.seed, tf.int32), tf.constant(stream, tf.int32)]), tf.cast(step, tf.int32)
            )
            return kt.random.normal_like(key, like)

    sampler = make_sampler()
    design = tf.constant(np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float32))
    targets = tf.constant(np.asarray(y, np.float32).reshape(-1))
    num_examples, dim = design.shape
    precision = 1.0 / prior_std**2
    starts = np.asarray(starts, np.float32)
    probe = sampler.init([tf.constant(starts[0])], temperature=temperature, seed=seed)
    logs = ["kinetic_temperature"] + (["xi"] if hasattr(probe, "xi") else [])

    @tf.function(jit_compile=True)
    def run(theta, chain_seed):
        state = sampler.init([theta], temperature=temperature, seed=seed)
        # The state's init draw is keyed by the integer seed; re-draw p_0 with this chain's key.
        if hasattr(state, "momentum"):
            draw = TensorSeedContext(temperature, 1, tf.constant(1.0), tf.constant(0.0), chain_seed)
            noise = draw.normal(tf.constant(0, tf.int64), [theta], kt.random.STREAM_INIT)
            state = state._replace(momentum=[float(temperature) ** 0.5 * noise[0] * float(getattr(sampler, "mass", 1.0)) ** 0.5])

        def body(index, state, theta, samples, traces):
            indices = tf.random.stateless_uniform(
                [batch_size], seed=tf.stack([chain_seed, index + 2**20]), maxval=num_examples, dtype=tf.int32
            )
            rows = tf.gather(design, indices)
            residual = tf.linalg.matvec(rows, theta) - tf.gather(targets, indices)
            per_example = 2.0 * residual[:, None] * rows
            force = -(num_examples * tf.reduce_mean(per_example, axis=0) + precision * theta)
            potential = num_examples * tf.reduce_mean(tf.square(residual)) + 0.5 * precision * tf.reduce_sum(tf.square(theta))
            context = TensorSeedContext(
                temperature, num_examples, tf.constant(float(batch_size)), potential, chain_seed, per_example,
            )
            params, state, diagnostics = sampler.update(state, [theta], [force], context)
            samples = samples.write(index, params[0])
            traces = [t.write(index, tf.cast(diagnostics[k], tf.float32)) for t, k in zip(traces, logs)]
            return index + 1, state, params[0], samples, traces

        arrays = (tf.TensorArray(tf.float32, size=num_steps), [tf.TensorArray(tf.float32, size=num_steps) for _ in logs])
        _, _, _, samples, traces = tf.while_loop(
            lambda index, *_: index < num_steps, body, (tf.constant(0), state, theta, *arrays)
        )
        return samples.stack(), [t.stack() for t in traces]

    all_samples, all_logs = [], {k: [] for k in logs}
    for chain, start in enumerate(starts):
        samples, traces = run(tf.constant(start), tf.constant(seed + chain, tf.int32))
        all_samples.append(samples.numpy()[burn_in_steps:])
        for key, trace in zip(logs, traces):
            all_logs[key].append(trace.numpy())
    steps = np.arange(burn_in_steps + 1, num_steps + 1)
    return ChainResult(
        samples=np.stack(all_samples), logs={k: np.stack(v) for k, v in all_logs.items()},
        steps=np.broadcast_to(steps, (len(starts), len(steps))).copy(),
    )
