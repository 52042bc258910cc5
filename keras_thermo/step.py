"""The sampling step of `BayesianModel`: one step of C >= 1 chains (DESIGN section 3).

Per chain: the potential `U = N * L + R` of its minibatch, the force `F = -grad U` and, for the
samplers that need them (CCAdL, mCCAdL), the per-example statistics from the same forward and
backward pass; the replicas' shares summed; the sampler's update of each chain; the results
assigned together, or none when a value is non-finite (then `fit` stops and raises
`SamplerDivergedError`); then what the recording callbacks and the logs read. A one-chain model
is C = 1 of the same code.

`SamplingStep` holds these methods; `BayesianModel` inherits them, and holds the variables they
read and write (weights, chain weights, sampler state, settings) and the per-session `_runtime`.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

from keras_thermo import chains as kt_chains
from keras_thermo import per_example as kt_per_example
from keras_thermo import samplers as kt_samplers
from keras_thermo._distribute import CrossReplica, replica_local_variable
from keras_thermo._step_checks import COLLAPSED_RELATIVE_SPREAD, all_finite, output_spread  # noqa: F401 (public here)
from keras_thermo.temperatures import configurational_temperature, variable_configurational_temperatures


class SamplerDivergedError(FloatingPointError):
    """Raised by `fit` when a sampler step produced a non-finite value.

    The weights and the sampler state are left at the last finite step; `step` is the number
    of finite steps taken before it (None where not known).
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class SamplerCollapsedError(SamplerDivergedError):
    """Raised by `fit` when the net's outputs became the same for every example of a batch
    whose inputs differ (a ReLU layer inactive on the whole batch, a saturated layer): a chain
    there has lost what it learned and rarely comes back. The model keeps the state it reached."""


class _Runtime:
    """Per-session objects the train step uses but that are not part of the saved model.

    Kept in a plain object so Keras does not track them as model weights: attaching a callback
    must not change what a checkpoint holds.
    """

    def __init__(self):
        self.recorders: list = []
        self.temperature_recorders: list = []
        self.temperature_checks: list = []  # the EquilibrationChecks of the current fit
        self.default_check = None  # the check `temperature_check=True` adds, kept across fits
        self.warned_about_layers = False
        self.warned_unstable_step = False  # a given step size above the measured stability bound
        self.noted_pipeline = False
        self.noted_per_example_fallback = False
        # One copy per replica (they agree): written inside the step, read by the callbacks.
        self.diverged_at = replica_local_variable(tf.constant(-1, tf.int64), name="diverged_at")
        # The size of a batch that did not split over the chains (-1: none yet), see `fit`.
        self.uneven_batch = replica_local_variable(tf.constant(-1, tf.int64), name="uneven_batch")
        self.state_structure = None
        # Collapse detection (`DivergenceGuard`): whether the outputs have differed across a
        # batch in this session, and the step at which they stopped differing (None: not seen).
        self.outputs_have_differed = False
        self.collapsed_at: int | None = None
        # `(value, step)`: the last finite `step_size_limit` a fit logged (CCAdL), else None.
        self.last_step_size_limit = None


def _negative_gradient(tape: tf.GradientTape, target: tf.Tensor, sources) -> list:
    """`-grad target` (None where `target` does not depend on a source): the backward pass
    started from -1 instead of 1, so the force costs no pass over the weights of its own."""
    return tape.gradient(target, sources, output_gradients=-tf.ones_like(target))


def _chain_mean(values: list) -> tf.Tensor:
    """The mean of one value per chain (the value itself for one chain)."""
    return values[0] if len(values) == 1 else tf.reduce_mean(tf.stack(values))


class SamplingStep:
    """`train_step` and what it calls, for `BayesianModel` (a mixin: the model's variables,
    sampler and `_runtime` are the model's own)."""

    def compute_potential(self, x, y, sample_weight=None, training=True, *, differentiate_prior=True):
        """Returns `(U, L, y_pred)` for a batch: `U = N * L + R` (DESIGN section 3).

        Under a `tf.distribute` strategy with r replicas this is the replica's share: Keras
        divides the loss of each replica's slice by r, and the prior is divided by r here, so the
        replicas' `U` (and their gradients) sum to the global batch's. With
        `differentiate_prior=False` R enters U's value but not its gradient (the step then adds
        the prior's closed-form force, `_prior_force`).
        """
        y_pred = self(x, training=training)
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        potential = tf.cast(self.likelihood_weight, loss.dtype) * loss
        if self.prior is not None:
            prior = self._prior_share(loss.dtype)
            potential += prior if differentiate_prior else tf.stop_gradient(prior)
        return potential, loss, y_pred

    def _prior_share(self, dtype) -> tf.Tensor:
        """The prior term R of U, divided by the replicas under a strategy (see compute_potential)."""
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        prior = tf.cast(self.prior(self.trainable_variables), dtype)
        return prior / replicas if replicas > 1 else prior

    def _prior_force(self) -> list | None:
        """`-grad R` of the prior in closed form (`Prior.force`), this replica's share, or None:
        no prior, one without a closed form, or a `compute_potential` of a subclass's own (whose
        U the tape then differentiates whole)."""
        own_potential = getattr(type(self).compute_potential, "__func__", type(self).compute_potential)
        if self.prior is None or own_potential is not SamplingStep.compute_potential:
            return None
        variables = self.trainable_variables
        force = self.prior.force(variables)
        if force is None:
            return None
        force = list(force)
        shapes = [None if f is None else tuple(tf.convert_to_tensor(f).shape) for f in force]
        if shapes != [tuple(v.shape) for v in variables]:
            raise ValueError(f"{type(self.prior).__name__}.force returned shapes {shapes} for trainable variables of "
                             f"shapes {[tuple(v.shape) for v in variables]}; it must give one tensor per variable, shaped "
                             "like it, in model.trainable_variables order, or None to have the step differentiate the prior.")
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return [f / replicas for f in force] if replicas > 1 else force

    def _shares_backward_pass(self, recording, cross) -> bool:
        """Whether the force's loss term comes from the engine's backward pass (the sum of the
        rows of G), leaving the train step's own tape only the prior and the layers' losses.
        Needs Keras' own `compute_loss` (compiled loss plus `self.losses`, nothing else) on one
        replica."""
        return (
            recording is not None
            and cross.num_replicas == 1
            and getattr(self, "_compile_loss", None) is not None
            and type(self).compute_loss is keras.Model.compute_loss
        )

    def _force_and_statistics(self, x, y, sample_weight, cross, recording, wrt=None):
        """`(F, U, L, y_pred, per-example statistics or None)` of one batch (this replica's
        share of F and U), differentiated with respect to `wrt`: the tensors a
        `keras.StatelessScope` maps the trainable variables to (None: the variables).

        With the engine (`recording`), one backward pass gives both the per-example statistics
        and the gradient of the compiled loss: `grad (N L_data) = (N / n) sum_i g_i`, the rows
        of G summed; the train step's tape then differentiates only `N * sum(self.losses)` (and
        R), which involves the network only through activity regularizers. Otherwise the tape
        differentiates U itself and the statistics, if needed, come after. A prior with a
        closed-form force (`Prior.force`) enters U's value only; its force is added to the
        tape's.
        """
        variables = self.trainable_variables if wrt is None else list(wrt)
        shared = self._shares_backward_pass(recording, cross)
        prior_force = self._prior_force()  # the chain's own values under its StatelessScope
        closed_form = prior_force is not None
        with tf.GradientTape() as tape:
            if wrt is not None:
                tape.watch(variables)
            with recording if recording is not None else contextlib.nullcontext():
                options = {"differentiate_prior": False} if closed_form else {}  # (a subclass's own keeps its signature)
                potential, loss, y_pred = self.compute_potential(x, y, sample_weight, **options)
            if shared:  # U less its data term: N times the layers' own losses (summed as Keras does), and R if differentiated
                terms = [tf.cast(self.likelihood_weight, loss.dtype) * tf.reduce_sum(tf.cast(extra, loss.dtype))
                         for extra in self.losses]
                if self.prior is not None and not closed_form:
                    terms.append(self._prior_share(loss.dtype))
                rest = tf.add_n(terms) if terms else None
        per_example = None
        if shared:
            per_example, sums = recording.statistics_and_gradients(
                self.loss, y, y_pred, sample_weight, cross_replica=cross, loss_scale=self._example_loss_scale
            )
            count = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float32)
            data_scale = tf.cast(self.likelihood_weight, tf.float32) / count
            rest_force = _negative_gradient(tape, rest, variables) if rest is not None else [None] * len(variables)
            force = [
                -data_scale * tf.cast(g, tf.float32) + (tf.cast(r, tf.float32) if r is not None else 0.0)
                for g, r in zip(sums, rest_force)
            ]
            force = [tf.cast(f, v.dtype) for f, v in zip(force, variables)]
        else:
            force = _negative_gradient(tape, potential, variables)
            if self.sampler.needs_per_example_gradients:
                per_example = self._per_example_gradients(x, y, sample_weight, cross, recording, y_pred, wrt)
        if closed_form:
            force = [p if f is None else f + tf.cast(p, f.dtype) for f, p in zip(force, prior_force)]
        force = [tf.convert_to_tensor(f) if f is not None else tf.zeros_like(v) for f, v in zip(force, variables)]
        return force, potential, loss, y_pred, per_example

    def train_step(self, data):
        """One sampling step of every chain; a one-chain model is C = 1 of the same code.

        Per chain: the force of its minibatch and, for CCAdL and mCCAdL, the per-example
        statistics from the same forward and backward pass (`_chain_passes`), summed over
        replicas; then the sampler's update of each chain. All chains' results are assigned
        together, or none when a value is non-finite or the batch did not split over the chains
        (`_assign_if_finite`), and recorded for the callbacks.
        """
        data = keras.utils.unpack_x_y_sample_weight(data)
        chains = range(self.num_chains)
        cross = CrossReplica()
        batches, uneven = self._chain_batches(data)
        params = self._chain_params()
        passes = self._chain_passes(batches, params, cross)
        force, potential, loss, y_pred, per_example = (list(column) for column in zip(*passes))
        local_batch_size = tf.shape(tf.nest.flatten(batches[0][0])[0])[0]  # one chain's
        self._loss_tracker.update_state(_chain_mean(loss) * cross.num_replicas, sample_weight=local_batch_size)
        potential = [tf.cast(u, tf.float32) for u in potential]
        force, potential, batch_size = cross.sum((force, potential, tf.cast(local_batch_size, tf.float32)))
        # Every update is computed from these, so a batch the replicas cannot split moves nothing.
        force, potential, batch_size = cross.check_even_split(batch_size, (force, potential, batch_size))

        state = self.sampler_state()
        temperature = self._step_temperature(state.step, cross)
        if self._curvature_variable is not None:  # measured on chain 0 and its batch, before any update
            contexts = [kt_samplers.StepContext(temperature, self.likelihood_weight, batch_size, potential[k], self.chain_seeds[k], per_example[k])
                        for k in chains]
            kt_samplers.auto_step.choose_step_size(
                self.sampler, self._chain_state(state, 0), lambda theta: self._force_at(theta, batches[0]), params[0], contexts[0], cross,
                step_size_variable=self.sampler._step_size_variable if self.sampler.is_auto_step_size else None,
                curvature_variable=self._curvature_variable,
                # The noise bound holds for every chain (each has its own start, batch and noise).
                other_chains=[(self._chain_state(state, k), params[k], contexts[k]) for k in chains[1:]],
            )
        per_variable = [r for r in self._runtime.temperature_recorders if not r.whole_net]
        results = []
        for k in chains:
            context = kt_samplers.StepContext(
                temperature=temperature,
                num_examples=self.likelihood_weight,
                batch_size=batch_size,
                potential=potential[k],
                seed=self.chain_seeds[k],
                per_example_gradients=per_example[k],
            )
            results.append(self._chain_update(self._chain_state(state, k), params[k], force[k], context,
                                              per_variable=bool(per_variable)))
        new_params, chain_states, diagnostics, variable_temperatures, whole_net_configurational, chain_finite = (
            list(column) for column in zip(*results)
        )
        new_state = self._stacked_state(chain_states)

        # Chain 0 in the net's variables, chains 1..C-1 in the chain variables.
        variables = self.trainable_variables
        new_leaves = tf.nest.flatten(new_state)
        targets = list(variables) + list(self._chain_variables) + list(self._state_variables)
        values = list(new_params[0]) + [
            tf.stack([new_params[k][i] for k in chains][1:]) for i in range(len(self._chain_variables))
        ] + new_leaves
        finite = tf.reduce_all(tf.stack(chain_finite + [all_finite(potential)]))
        ok = self._assign_if_finite(targets, values, finite, state.step, cross, uneven)
        if self._prior_state_variables:
            self._update_prior_state(new_state.step, self.sampler.parameter_temperature(chain_states[0], temperature), cross)
        if self._runtime.recorders:
            completed = tf.cast(new_state.step, tf.int64)
            is_sample = tf.stack([self.sampler.is_sample(s) for s in chain_states])  # [C], each chain's own
            is_sample = tf.logical_and(tf.logical_and(ok, is_sample), cross.is_first_local_replica())
            recorded = self._stacked_params() if self.num_chains > 1 else variables  # read after the assignment
            for recorder in self._runtime.recorders:
                recorder.maybe_record(completed, is_sample, recorded)
        if self._runtime.temperature_recorders:
            weight = tf.stack([self._temperature_weight(self._chain_state(state, k)) for k in chains])
            if per_variable:
                kinetic, configurational = (tf.stack(column) for column in zip(*variable_temperatures))
                for recorder in per_variable:
                    recorder.record(weight, tf.unstack(kinetic, axis=1), tf.unstack(configurational, axis=1))
            whole_net = [r for r in self._runtime.temperature_recorders if r.whole_net]
            if whole_net:  # the logged values themselves: nothing more to compute
                kinetic = tf.stack([tf.cast(d["kinetic_temperature"], tf.float64) for d in diagnostics])
                configurational = tf.cast(tf.stack(whole_net_configurational), tf.float64)
                for recorder in whole_net:
                    recorder.record(weight, [kinetic], [configurational])

        for k in chains:
            x, y, sample_weight = batches[k]
            logs = self.compute_metrics(x, y, y_pred[k], sample_weight=sample_weight)  # chain means
        logs = dict(logs)
        logs["potential"] = _chain_mean(potential)
        # The least of the chains: one collapsed chain shows (see `output_spread`).
        spreads = [output_spread(batches[k][0], y_pred[k]) for k in chains]
        logs["output_spread"] = spreads[0] if len(spreads) == 1 else tf.reduce_min(tf.stack(spreads))
        if self.temperature_schedule is not None:
            logs["temperature"] = temperature
        if self._curvature_variable is not None:
            logs["curvature"] = tf.convert_to_tensor(self._curvature_variable)
        per_chain_logs = {"configurational_temperature": whole_net_configurational}
        for name in diagnostics[0]:
            per_chain_logs[name] = [d[name] for d in diagnostics]
        for name, values in per_chain_logs.items():
            logs[name] = _chain_mean(values)
            if 1 < self.num_chains <= kt_chains.MAX_LOGGED_CHAINS and name in kt_chains.PER_CHAIN_LOGS:
                logs.update({kt_chains.chain_log_name(name, k): values[k] for k in chains})
        return cross.per_worker_logs(logs)  # Keras' multi-worker reduction needs vectors

    def _chain_update(self, state, params, force, context, *, per_variable: bool):
        """One chain's update and what the step reads of it: `(new params, new state,
        diagnostics, (kinetic [V], configurational [V]) or None, whole-net configurational
        temperature, whether the new params and state are finite)`; the per-variable
        temperatures only for `per_variable` (an `EquilibrationCheck` that judges each variable).
        Each is one reduction over arrays the update has just computed."""
        new_params, new_state, diagnostics = self.sampler.update(state, params, force, context)
        temperatures = None
        if per_variable:
            temperatures = self._variable_temperatures(new_state, params, new_params, force)
            # The logged whole-net value from the same sums (no second pass over the weights).
            sizes = tf.constant([float(np.prod(p.shape)) for p in params], tf.float64)
            configurational = tf.cast(tf.reduce_sum(temperatures[1] * sizes) / tf.reduce_sum(sizes), tf.float32)
        else:
            configurational = configurational_temperature(params, force)
        leaves = [t for t in tf.nest.flatten(new_state) if t.dtype.is_floating]
        finite = all_finite(list(new_params) + leaves)
        return new_params, new_state, diagnostics, temperatures, configurational, finite

    def _force_at(self, theta, batch) -> list[tf.Tensor]:
        """The force of `batch` with the trainable variables at `theta` (this replica's share;
        nothing the pass writes is kept)."""
        with tf.GradientTape() as tape:
            tape.watch(theta)
            with keras.StatelessScope(state_mapping=list(zip(self.trainable_variables, theta))):
                potential, _, _ = self.compute_potential(*batch)
        return [f if f is not None else tf.zeros_like(t) for f, t in zip(_negative_gradient(tape, potential, theta), theta)]

    def _chain_params(self) -> list[list[tf.Tensor]]:
        """Every chain's weights as tensors, one list per chain (chain 0: the net's own)."""
        own = [tf.convert_to_tensor(v) for v in self.trainable_variables]
        others = [tf.convert_to_tensor(c) for c in self._chain_variables]
        return [own] + [[c[k - 1] for c in others] for k in range(1, self.num_chains)]

    def _chain_state(self, state, chain: int):
        """Chain `chain`'s sampler state out of the stored state (one chain's is the state)."""
        if self.num_chains == 1:
            return state
        leaves = tf.nest.flatten(state)
        return tf.nest.pack_sequence_as(state, [leaves[0]] + [leaf[chain] for leaf in leaves[1:]])

    def _stacked_state(self, chain_states):
        """The sampler state of every chain in the stored layout: chain 0's own for one chain;
        for several, the shared step counter and every other leaf stacked on a chain axis."""
        if self.num_chains == 1:
            return chain_states[0]
        leaves = [tf.nest.flatten(s) for s in chain_states]
        stacked = [leaves[0][0]] + [tf.stack(column) for column in list(zip(*leaves))[1:]]
        return tf.nest.pack_sequence_as(chain_states[0], stacked)

    def _chain_batches(self, data):
        """`([(x, y, sample_weight)] per chain, uneven)`: the whole batch for every chain
        (`"shared"`), or C equal parts of it, one per chain (`"split"`). `uneven` is the batch's
        size when C does not divide it, else -1; the step then applies nothing and `fit` raises
        (a batch size known before the first step is checked there, `_fit_checks.check_chain_batch_size`)."""
        if self.num_chains == 1 or self.chain_minibatches == "shared":
            return [data] * self.num_chains, tf.constant(-1, tf.int64)
        chains = self.num_chains
        size = tf.shape(tf.nest.flatten(data[0])[0])[0]
        part = size // chains

        def piece(k):
            return tuple(
                None if item is None else tf.nest.map_structure(lambda t: t[k * part:(k + 1) * part], item)
                for item in data
            )

        uneven = tf.where(tf.equal(size % chains, 0), tf.constant(-1, tf.int64), tf.cast(size, tf.int64))
        return [piece(k) for k in range(chains)], uneven

    def _chain_passes(self, batches, params, cross):
        """`(F, U, L, y_pred, per-example statistics or None)` of every chain on its batch
        (this replica's share of F and U).

        One chain runs on the net's own variables. With several, each chain's pass runs the net
        under a `keras.StatelessScope` that maps its trainable variables to that chain's values
        (a loop of C passes, with the per-example engine recording each; or, for samplers
        without per-example statistics, `chain_method="vectorized"`'s one `tf.vectorized_map`);
        what a pass writes to non-trainable variables (moving statistics, seed generators) is
        kept from chain 0.
        """
        if self.num_chains == 1:
            return [self._force_and_statistics(*batches[0], cross, self._recording(None))]
        if self.chain_path == "vectorized":
            return self._vectorized_chain_passes(batches, params)
        variables = self.trainable_variables
        non_trainable = self.net.non_trainable_variables
        passes, updated = [], None
        for k, (batch, chain_params) in enumerate(zip(batches, params)):
            with keras.StatelessScope(state_mapping=list(zip(variables, chain_params))) as scope:
                passes.append(self._force_and_statistics(*batch, cross, self._recording(chain_params), wrt=chain_params))
                if k == 0:
                    updated = [scope.get_current_value(v) for v in non_trainable]
        for variable, value in zip(non_trainable, updated):
            if value is not None:
                variable.assign(value)
        return passes

    def _recording(self, wrt):
        """The per-example engine's recording of the next forward pass, for samplers that need
        per-example statistics on a net every layer of which has a rule (else None); `wrt`
        are the tensors standing for the trainable variables (None: the variables)."""
        if not self.sampler.needs_per_example_gradients or self.per_example_path not in ("layers", "dense_layers"):
            return None
        return kt_per_example.Recording(self.net, self.trainable_variables if wrt is None else wrt)

    def _vectorized_chain_passes(self, batches, params):
        """`_chain_passes` as one `tf.vectorized_map` over the chain axis (no per-example
        statistics: CCAdL and mCCAdL refuse `chain_method="vectorized"`)."""
        variables = self.trainable_variables

        def one_chain(chain_params, batch):
            x, y, sample_weight = batch
            chain_params = list(chain_params)
            with tf.GradientTape() as tape:
                tape.watch(chain_params)
                with keras.StatelessScope(state_mapping=list(zip(variables, chain_params))):
                    potential, loss, y_pred = self.compute_potential(x, y, sample_weight)
            force = [tf.convert_to_tensor(f) if f is not None else tf.zeros_like(p)
                     for f, p in zip(_negative_gradient(tape, potential, chain_params), chain_params)]
            return force, tf.cast(potential, tf.float32), loss, y_pred

        stacked_params = [tf.stack(column) for column in zip(*params)]
        if self.chain_minibatches == "shared":
            stacked = tf.vectorized_map(lambda p: one_chain(p, batches[0]), stacked_params)
        else:
            present = [i for i, item in enumerate(batches[0]) if item is not None]  # y, weights may be None
            stacked_batches = [
                tf.nest.map_structure(lambda *parts: tf.stack(parts), *[batch[i] for batch in batches]) for i in present
            ]

            def chain_with_batch(args):
                chain_params, items = args
                batch = [None] * len(batches[0])
                for i, item in zip(present, items):
                    batch[i] = item
                return one_chain(chain_params, tuple(batch))

            stacked = tf.vectorized_map(chain_with_batch, (stacked_params, stacked_batches))
        return [
            tuple(tf.nest.map_structure(lambda t: t[k], part) for part in stacked) + (None,)
            for k in range(self.num_chains)
        ]

    @property
    def per_example_path(self) -> str:
        """The per-example method in use: `"layers"`, `"vectorized"` or `"dense_layers"`
        (resolves "auto")."""
        if self.per_example_method != "auto":
            return self.per_example_method
        if kt_per_example.incompatibility(self.net) is None:
            return "layers"
        return "vectorized"

    def _per_example_gradients(self, x, y, sample_weight, cross, recording=None, y_pred=None, wrt=None):
        scale = self._example_loss_scale  # `loss_weights`: the rows are gradients of the batch loss
        if recording is not None:  # "layers" or "dense_layers": the engine on the recorded pass
            return recording.statistics(
                self.loss, y, y_pred, sample_weight, cross_replica=cross, loss_scale=scale
            )
        rows = kt_per_example.per_example_gradients(
            self.net, self.loss, x, y, sample_weight, loss_scale=scale, wrt=wrt
        )
        return kt_per_example.PerExampleGradients(tf.cast(rows, tf.float32), cross)

    def _step_temperature(self, step, cross) -> tf.Tensor:
        """T of the step that starts at `step` (float32 scalar): the schedule's value, also
        written to the temperature variable (checkpoints and callbacks see it), or the variable."""
        if self.temperature_schedule is None:
            return tf.convert_to_tensor(self._temperature_variable)
        temperature = tf.cast(self.temperature_schedule(step), tf.float32)
        cross.assign([self._temperature_variable], [temperature])
        return temperature

    def _update_prior_state(self, completed_step, temperature, cross) -> None:
        """The prior's own move after a sampler step (a Gibbs draw of hyperparameters), from the
        weights that step produced; nothing moves when the step was not applied."""
        current = [tf.convert_to_tensor(v) for v in self._prior_state_variables]
        params = [tf.convert_to_tensor(v) for v in self.trainable_variables]
        updated = self.prior.update_state(
            current, params, step=completed_step, seed=self.seed, temperature=temperature
        )
        applied = self._runtime.diverged_at < 0
        cross.assign(self._prior_state_variables, [tf.where(applied, new, old) for new, old in zip(updated, current)])

    def _assign_if_finite(self, targets, values, finite, step, cross, uneven) -> tf.Tensor:
        """Assigns `values` to `targets` unless `finite` (a boolean scalar: whether every value
        the step computed is finite) is false or the batch did not split over the chains
        (`uneven` its size, else -1); then nothing moves, and `diverged_at` keeps `step` (or
        `uneven_batch` the batch size). Returns whether they were assigned."""
        runtime = self._runtime
        even = uneven < 0
        healthy = tf.logical_and(runtime.diverged_at < 0, runtime.uneven_batch < 0)
        ok = tf.logical_and(tf.logical_and(finite, even), healthy)
        if cross.num_replicas == 1:
            # Assigned under a condition: a `tf.where(ok, value, target)` per variable would read
            # and write every weight-sized array once more (`benchmarks.peers`).
            def assign():
                cross.assign(targets, values)
                return tf.constant(True)

            tf.cond(ok, assign, lambda: tf.constant(False))
        else:  # replicas write their own copies inside a cross-replica call: no condition there
            cross.assign(targets, [tf.where(ok, value, target) for target, value in zip(targets, values)])
        runtime.diverged_at.assign(
            tf.where(tf.logical_and(tf.logical_not(finite), healthy), tf.cast(step, tf.int64), runtime.diverged_at)
        )
        runtime.uneven_batch.assign(
            tf.where(tf.logical_and(tf.logical_not(even), healthy), uneven, runtime.uneven_batch)
        )
        return ok

    def _temperature_weight(self, state) -> tf.Tensor:
        """1.0 for a completed step that counts towards the temperature checks, 0.0 for a step
        that did not apply or where the sampler is not at T (TACT-HMC off its plateau)."""
        applied = self._runtime.diverged_at < 0
        return tf.cast(tf.logical_and(applied, self.sampler.at_target_temperature(state)), tf.float64)

    def _variable_temperatures(self, new_state, params, new_params, force):
        """`(kinetic [V], configurational [V])` of a completed step: per-variable temperatures
        for the `EquilibrationCheck` callbacks that judge each variable."""
        kinetic = self.sampler.variable_kinetic_temperatures(new_state, params, new_params)
        configurational = variable_configurational_temperatures(params, force)
        return tf.cast(tf.stack(kinetic), tf.float64), tf.cast(tf.stack(configurational), tf.float64)

    def _raise_if_diverged(self) -> None:
        uneven = int(self._runtime.uneven_batch.numpy())
        if uneven >= 0:
            raise ValueError(
                f"BayesianModel(num_chains={self.num_chains}, chain_minibatches='split') cuts every "
                f"batch into {self.num_chains} equal parts, one per chain, but a batch of {uneven} "
                f"examples came; that step and every later one was not applied. Fit on arrays (each "
                f"chain then draws `batch_size` examples of its own), or batch the pipeline in "
                f"multiples of num_chains={self.num_chains} with drop_remainder=True, or use "
                "chain_minibatches='shared'."
            )
        step = int(self._runtime.diverged_at.numpy())
        if step < 0 and self._runtime.collapsed_at is not None:
            collapsed_at, self._runtime.collapsed_at = self._runtime.collapsed_at, None
            raise SamplerCollapsedError(self._collapse_message(collapsed_at), step=collapsed_at)
        if step >= 0:
            raise SamplerDivergedError(
                f"Sampler {type(self.sampler).__name__} produced a non-finite value at step {step} "
                f"(force, momentum, thermostat or weights); the model holds the last finite state, "
                f"reached after {step} steps. " + self._divergence_advice(),
                step=step,
            )

    def _collapse_message(self, step: int) -> str:
        h = self.sampler.step_size
        fixed = isinstance(h, (int, float))
        sgd = ""
        friction = getattr(self.sampler, "friction", None)
        if fixed and isinstance(friction, (int, float)) and self.num_examples:
            terms = kt_samplers.units.to_learning_rate(h, friction, self.num_examples, getattr(self.sampler, "mass", 1.0) or 1.0)
            sgd = (
                f" In SGD's terms this step is learning rate {terms['learning_rate']:.4g} with momentum "
                f"{terms['momentum']:.4g} (keras_thermo.samplers.units.to_learning_rate)."
            )
        advice = f"try step_size={h / 4:.3g} (a quarter)" if fixed else "lower the step-size schedule"
        # A sampler that heats theta on purpose (TACT-HMC's tempering) names that first when theta
        # was above T at the collapse.
        hint = getattr(self.sampler, "collapse_hint", None)
        hint = hint(self.sampler_state()) if hint is not None else ""
        return (
            f"Sampler {type(self.sampler).__name__} collapsed by step {step}: the net now predicts the "
            "same output for every example of a batch whose inputs differ (a ReLU layer inactive "
            "on the whole batch, or a saturated layer), after its outputs had differed; such a "
            "chain has lost what it learned and rarely comes back. The model holds the state it "
            f"reached. {hint}{'Otherwise' if hint else 'Likely cause'}: "
            f"step_size={f'{h:.4g}' if fixed else repr(h)} is too large for this net and data size.{sgd} "
            f"Restart from a fresh net and {advice}, or increase friction."
        )

    def _divergence_advice(self) -> str:
        """What to change after a divergence: for a sampler that logs `step_size_limit` (CCAdL),
        the last finite value, the largest step its covariance friction can integrate."""
        step_size = self.sampler.step_size
        step_size = f"{step_size:.4g}" if isinstance(step_size, (int, float)) else repr(step_size)
        limit = self._runtime.last_step_size_limit
        if limit is None:
            return (
                f"Likely cause: the step size {step_size} is too large for the gradient-noise "
                "level; reduce step_size or increase friction."
            )
        value, at = limit
        return (
            f"Its covariance estimate's step_size_limit was {value:.3g} when last logged (after "
            f"{at} steps): the explicit covariance friction multiplies the momentum by "
            "1 - (h^2/2) beta lambda along the noisiest direction, and grows it once h is above "
            f"that limit. step_size is {step_size}; use step_size below {value:.3g} (e.g. "
            f"{0.5 * value:.3g}, which leaves room for the noise estimate to grow), a larger "
            "batch, or MCCAdL, whose covariance step is exact and has no such limit."
        )
