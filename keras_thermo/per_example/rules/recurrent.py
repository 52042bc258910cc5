"""`LSTM` and `GRU` (any `unroll`, masks, `go_backwards`, initial states, `reset_after`).

The input projection is moved out of the recurrence: `xw = x K + b` for all time steps at once
is the one watched tensor, and the recurrence (Keras' own `rnn` loop, so masks, `go_backwards`
and `unroll` mean what they mean for the layer) adds `h_{t-1} U` inside. The gradient at `xw_t`
is then the gradient at step t's gate pre-activations, `Delta_t`, for every step from one
backward pass, and each step also emits the state `h_{t-1}` it started from. Example i's
gradients are

* LSTM (gates i, f, c, o): kernel `sum_t x_t^T Delta_t`, recurrent kernel
  `sum_t h_{t-1}^T Delta_t`, bias `sum_t Delta_t`;
* GRU with `reset_after=True` (Keras' default; gates z, r, h; bias `[2, 3u]`, input and
  recurrent): the recurrent pre-activation of the candidate is multiplied by the reset gate, so
  the recurrent kernel and bias see `Delta^rec = (Delta_z, Delta_r, r * Delta_h)`: kernel
  `sum_t x_t^T Delta_t`, recurrent kernel `sum_t h_{t-1}^T Delta^rec_t`, bias
  `(sum_t Delta_t, sum_t Delta^rec_t)`;
* GRU with `reset_after=False`: the candidate's recurrent kernel multiplies `r * h_{t-1}`, so
  its columns take `sum_t (r_t * h_{t-1})^T Delta_h,t` and the gate columns
  `sum_t h_{t-1}^T Delta_zr,t`.

Masked steps leave the state unchanged, so their `Delta_t` is zero and they add nothing.
Kernel and recurrent kernel are each kept in the cheaper form (`blocks.factor_or_explicit`):
explicit rows for the usual sizes (`T^2 (d + p) > d p`).

Example:
    >>> import keras
    >>> from keras_thermo.per_example.engine import rule_for
    >>> type(rule_for(keras.layers.LSTM(4))).__name__
    'RecurrentRule'
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_thermo.per_example import registry
from keras_thermo.per_example.blocks import ExplicitBlock, explicit_gradients, factor_or_explicit


def _is_lstm(layer) -> bool:
    return isinstance(layer, keras.layers.LSTM)


def _recurrence(step, inputs, initial_state, *, width, go_backwards=False, mask=None, zero_output_for_mask=False):
    """`(last output, outputs [n, T, width], final states)` of `step(inputs_t, states)` run over
    the time axis of `inputs` `[n, T, d]`, as Keras' recurrent layers run their cell: in reverse
    time order when `go_backwards` (outputs then in processing order), and where `mask` `[n, T]`
    is False an example keeps its states and repeats its previous output (or outputs zeros)."""
    dtype = inputs.dtype
    steps = tf.transpose(inputs, [1, 0, 2])  # time-major
    n = tf.shape(inputs)[0]
    keep = tf.ones([tf.shape(steps)[0], n], tf.bool) if mask is None else tf.transpose(tf.cast(mask, tf.bool))
    if go_backwards:
        steps, keep = tf.reverse(steps, [0]), tf.reverse(keep, [0])

    def advance(carry, elements):
        previous, states = carry
        inputs_t, keep_t = elements
        output, new_states = step(inputs_t, list(states))
        if mask is not None:
            kept = keep_t[:, None]
            new_states = [tf.where(kept, new, old) for new, old in zip(new_states, states)]
            output = tf.where(kept, output, tf.zeros_like(output) if zero_output_for_mask else previous)
        return output, list(new_states)

    outputs, states = tf.scan(advance, (steps, keep), initializer=(tf.zeros([n, width], dtype), list(initial_state)))
    final_states = [s[-1] for s in states]
    return outputs[-1], tf.transpose(outputs, [1, 0, 2]), final_states


class RecurrentRule(registry.LayerRule):
    layer_types = (keras.layers.LSTM, keras.layers.GRU)

    def unsupported(self, layer):
        if layer.stateful:
            return "stateful=True (the state carried between batches couples them)"
        return None

    def forward(self, layer, call, sequences, initial_state=None, mask=None, training=False):
        cell = layer.cell
        units = cell.units
        dtype = layer.compute_dtype
        sequences = call.save("inputs", tf.cast(sequences, dtype))
        reset_after = not _is_lstm(layer) and cell.reset_after
        xw = tf.matmul(sequences, tf.cast(cell.kernel, dtype))
        recurrent_bias = None
        if cell.use_bias:
            bias = tf.cast(cell.bias, dtype)
            if reset_after:
                bias, recurrent_bias = bias[0], bias[1]
            xw = xw + bias
        xw = call.watch("xw", xw)
        recurrent = tf.cast(cell.recurrent_kernel, dtype)

        if initial_state is None:
            n = tf.shape(sequences)[0]
            initial_state = [tf.zeros([n, units], dtype) for _ in range(2 if _is_lstm(layer) else 1)]
        elif not isinstance(initial_state, (list, tuple)):
            initial_state = [initial_state]
        initial_state = [tf.cast(s, dtype) for s in initial_state]

        def step(inputs, states):
            h_prev = states[0]
            if _is_lstm(layer):
                z = inputs + tf.matmul(h_prev, recurrent)
                z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
                carry = cell.recurrent_activation(z_f) * states[1] + cell.recurrent_activation(z_i) * cell.activation(z_c)
                h = cell.recurrent_activation(z_o) * cell.activation(carry)
                return tf.concat([h, h_prev], axis=-1), [h, carry]
            x_z, x_r, x_h = tf.split(inputs, 3, axis=-1)
            if reset_after:
                inner = tf.matmul(h_prev, recurrent)
                if recurrent_bias is not None:
                    inner = inner + recurrent_bias
                r_z, r_r, r_h = tf.split(inner, 3, axis=-1)
                update = cell.recurrent_activation(x_z + r_z)
                reset = cell.recurrent_activation(x_r + r_r)
                candidate = cell.activation(x_h + reset * r_h)
                extra = reset
            else:
                inner = tf.matmul(h_prev, recurrent[:, : 2 * units])
                r_z, r_r = tf.split(inner, 2, axis=-1)
                update = cell.recurrent_activation(x_z + r_z)
                reset = cell.recurrent_activation(x_r + r_r)
                extra = reset * h_prev
                candidate = cell.activation(x_h + tf.matmul(extra, recurrent[:, 2 * units:]))
            h = update * h_prev + (1.0 - update) * candidate
            return tf.concat([h, h_prev, extra], axis=-1), [h]

        last, outputs, states = _recurrence(
            step, xw, initial_state, width=(2 if _is_lstm(layer) else 3) * units,
            go_backwards=layer.go_backwards, mask=mask, zero_output_for_mask=layer.zero_output_for_mask,
        )
        recorded = tf.reverse(outputs, [1]) if layer.go_backwards else outputs  # to xw's time order
        call.save("previous", recorded[..., units: 2 * units])
        if not _is_lstm(layer):
            call.save("extra", recorded[..., 2 * units:])
        output = outputs[..., :units] if layer.return_sequences else last[..., :units]
        output = tf.cast(output, layer.compute_dtype)
        if layer.return_state:
            return output, *[tf.cast(s, layer.compute_dtype) for s in states]
        return output

    def blocks(self, layer, calls):
        cell = layer.cell
        units = cell.units

        def joined(name):
            return tf.concat([call[name] for call in calls], axis=1)  # positions of every call

        inputs, deltas, previous = joined("inputs"), joined("d_xw"), joined("previous")
        if _is_lstm(layer):
            kernel_variables = [cell.kernel] + ([cell.bias] if cell.use_bias else [])
            return [
                (kernel_variables, factor_or_explicit(inputs, deltas, cell.use_bias)),
                ([cell.recurrent_kernel], factor_or_explicit(previous, deltas, False)),
            ]
        extra = joined("extra")
        if cell.reset_after:
            recurrent_deltas = tf.concat([deltas[..., : 2 * units], extra * deltas[..., 2 * units:]], axis=-1)
            found = [
                ([cell.kernel], factor_or_explicit(inputs, deltas, False)),
                ([cell.recurrent_kernel], factor_or_explicit(previous, recurrent_deltas, False)),
            ]
            if cell.use_bias:
                bias_rows = tf.concat(
                    [tf.reduce_sum(deltas, axis=1), tf.reduce_sum(recurrent_deltas, axis=1)], axis=1
                )
                found.append(([cell.bias], ExplicitBlock(bias_rows, (6 * units,))))
            return found
        gates = explicit_gradients(previous, deltas[..., : 2 * units])  # [n, u * 2u]
        candidate = explicit_gradients(extra, deltas[..., 2 * units:])  # [n, u * u]
        recurrent_rows = tf.concat(
            [tf.reshape(gates, [-1, units, 2 * units]), tf.reshape(candidate, [-1, units, units])], axis=2
        )
        kernel_variables = [cell.kernel] + ([cell.bias] if cell.use_bias else [])
        return [
            (kernel_variables, factor_or_explicit(inputs, deltas, cell.use_bias)),
            ([cell.recurrent_kernel], ExplicitBlock(tf.reshape(recurrent_rows, [-1, 3 * units * units]), (3 * units * units,))),
        ]


registry.register(RecurrentRule())
