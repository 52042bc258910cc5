"""Column blocks of `G`: the per-example gradients of one layer's variables, kept in the cheapest form.

`G` (`[n, Nd]`, one row per example) splits by columns into one block per layer: the
per-example gradients of that layer's trainable variables. A block gives what the statistics
need from its columns, never centered (the centering over the batch is done once for all blocks
by `keras_thermo.per_example.statistics.LayerRows`):

* `matvec(v)` (`G_l v`, `[n, k]`), `rmatvec(z)` (`G_l^T z`, `[D_l, k]`), `gram()` (`G_l G_l^T`);
* `centered_column_squares()` (each column's sum of squared deviations from its batch mean) and
  `centered_frobenius_squared()` (their sum), in forms that keep float32 accuracy;
* `rows()`, the `[n, D_l]` matrix itself (full covariances and tests only).

Three forms:

* `FactorBlock`: a weight shared over `T` positions (`T = 1` for `Dense`, the output pixels of a
  convolution, the time steps of a recurrent cell). Example i's kernel gradient is
  `A_i^T Delta_i` with `A_i` (`[T, d]`) the layer's input rows and `Delta_i` (`[T, p]`) the
  gradient of the loss at the pre-activation, its bias gradient `sum_t Delta_it`. Only the
  factors are stored (`n T (d + p)` floats); products cost `2 n T d p`, the Gram matrix
  `sum_{t,t'} (a_it . a_jt')(delta_it . delta_jt')` costs `2 n^2 T^2 (d + p)` ("ghost" form).
* `ExplicitBlock`: the rows themselves, `[n, D_l]` (for example `einsum('ntd,ntp->ndp')` of the
  factors): products cost `2 n D_l`, the Gram matrix `2 n^2 D_l`.
* `SparseRowsBlock`: explicit rows over a subset of a variable's leading rows (an `Embedding`'s
  tokens present in the batch), scattered into the variable when a product needs it.

`factor_or_explicit` chooses per layer: the factor form for `T = 1` (no statistic costs more
than with explicit rows, and the Gram matrix costs `2 n^2 (d + p)` instead of `2 n^2 d p`); for
`T > 1` the factor form only while its Gram matrix is cheaper than forming the rows,
`n T (d + p) < d p` (Dense layers on short sequences with wide weights), else explicit rows.

Reference: Goodfellow (2015), "Efficient Per-Example Gradient Computations", arXiv:1510.01799
(outer products); Rochette, Manoel & Tramel (2019), "Efficient Per-Example Gradient
Computations in Convolutional Neural Networks" (patches); Li et al. (2022) and Bu et al. (2023)
for the Gram ("ghost") form of shared weights.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import tensorflow as tf

from keras_thermo.linalg.operators import RowProducts, dimension, row_gram

#: Largest explicit per-example tensor formed at once, in float32 entries (chunks beyond: 64 MiB).
CHUNK_ENTRIES = 16 * 2**20
#: Gram matrices of explicit rows stream `[n, D]` from memory until `n` exceeds this (flops per
#: entry read), so they cost `max(1, 2 n / balance) / 2` products, as for a dense matrix in
#: `keras_thermo.linalg.gram`.
MACHINE_BALANCE = 16.0


def centered_over_rows(block: tf.Tensor) -> tf.Tensor:
    """Each column minus its mean over the rows (axis 0)."""
    return block - tf.reduce_mean(block, axis=0, keepdims=True)


class ColumnBlock(RowProducts):
    """The per-example gradients of some trainable variables: a column block `G_l` of `G`.

    Its `RowProducts` products are those of `G_l` itself, uncentered (`gram()` is `G_l G_l^T`).
    `sizes` gives each variable's number of scalars, in the block's own variable order; the
    columns are the variables flattened row-major and concatenated in that order.
    """

    sizes: tuple[int, ...]

    @property
    def num_cols(self) -> int:
        return int(sum(self.sizes))

    @abc.abstractmethod
    def centered_column_squares(self) -> tf.Tensor:
        """`diag(Gc_l^T Gc_l)`, `[D_l]`: each column's sum of squared deviations."""

    def centered_column_squares_by_slot(self) -> list[tf.Tensor]:
        """`centered_column_squares` per variable of the block (flat, in slot order)."""
        squares = self.centered_column_squares()
        return [squares] if len(self.sizes) == 1 else tf.split(squares, list(self.sizes), axis=0)

    def centered_frobenius_squared(self) -> tf.Tensor:
        """`||Gc_l||_F^2`."""
        return tf.reduce_sum(self.centered_column_squares())

    @abc.abstractmethod
    def rows(self) -> tf.Tensor:
        """`G_l`, `[n, D_l]` (small models and tests)."""

    @abc.abstractmethod
    def product_flops(self, n: float) -> float:
        """Flops of `G_l u` plus `G_l^T z` for one column each."""

    @abc.abstractmethod
    def gram_flops(self, n: float) -> float:
        """Cost of `gram()`, in the flops of `product_flops`."""


class ExplicitBlock(ColumnBlock):
    """Explicit per-example gradients `[n, D_l]` of the variables of `sizes` (in that order).

    Example:
        >>> import tensorflow as tf
        >>> block = ExplicitBlock(tf.constant([[1.0, 2.0], [3.0, 6.0]]), (2,))
        >>> block.centered_column_squares().numpy().tolist()
        [2.0, 8.0]
    """

    def __init__(self, rows: tf.Tensor, sizes: Sequence[int]):
        self._rows = rows
        self.sizes = tuple(int(s) for s in sizes)

    @property
    def num_rows(self) -> Any:
        return dimension(self._rows, 0)

    def matvec(self, block):
        return tf.matmul(self._rows, block)

    def rmatvec(self, block):
        return tf.matmul(self._rows, block, transpose_a=True)

    def gram(self):
        return row_gram(self._rows)

    def centered_column_squares(self):
        return tf.reduce_sum(tf.square(centered_over_rows(self._rows)), axis=0)  # two-pass

    def rows(self):
        return self._rows

    def product_flops(self, n):
        return 4.0 * n * self.num_cols

    def gram_flops(self, n):
        # Memory-bound below the machine balance: as many passes over the rows as a product.
        return self.product_flops(n) * 0.5 * max(1.0, 2.0 * n / MACHINE_BALANCE)

    def __tf_flatten__(self):
        return self.sizes, (self._rows,)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        block = cls.__new__(cls)
        block._rows, block.sizes = components[0], metadata
        return block


def explicit_gradients(inputs: Any, deltas: tf.Tensor,
                       contract: Callable[[Any, tf.Tensor], tf.Tensor] | None = None,
                       input_width: int | None = None) -> tf.Tensor:
    """`[n, d * p]`: example i's `A_i^T Delta_i` (`einsum('ntd,ntp->ndp')`), flattened row-major.

    Formed in chunks of examples when `n d p` (or the factors) would exceed `CHUNK_ENTRIES`.

    Args:
        inputs: `A`, `[n, T, d]`; with `contract`, any nest of tensors whose leading axis is the
            examples (a convolution's inputs).
        deltas: `Delta`, `[n, T, p]`.
        contract: maps the first `m` examples of `inputs` (the same nest, sliced) and of
            `deltas` to their `[m, d * p]` rows, so that a factor much larger than `inputs`
            (convolution patches) is never formed for more than one chunk, or not at all.
        input_width: `d`, required with `contract`.
    """
    if contract is None:
        input_width = int(inputs.shape[2])
    n, positions = deltas.shape[0], deltas.shape[1]
    d, p = int(input_width), int(deltas.shape[2])

    def one(a, delta):
        if contract is not None:
            return contract(a, delta)
        # Contract over positions as one batched matmul: [m, d, T] x [m, T, p].
        return tf.reshape(tf.matmul(a, delta, transpose_a=True), [-1, d * p])

    def examples(start, stop):
        return tf.nest.map_structure(lambda tensor: tensor[start:stop], inputs)

    if positions is None:
        return one(inputs, deltas)
    per_example = max(d * p, positions * (d + p))
    chunk = max(1, CHUNK_ENTRIES // per_example)
    if n is not None:
        if n <= chunk:
            return one(inputs, deltas)
        return tf.concat(
            [one(examples(start, start + chunk), deltas[start:start + chunk]) for start in range(0, n, chunk)],
            axis=0,
        )
    # Batch size known at run time only: pad to whole chunks and map over them.
    count = tf.shape(deltas)[0]
    padding = (-count) % chunk

    def chunked(tensor):
        padded = tf.pad(tensor, [[0, padding]] + [[0, 0]] * (tensor.shape.rank - 1))
        return tf.reshape(padded, tf.concat([[-1, chunk], tf.shape(tensor)[1:]], axis=0))

    rows = tf.map_fn(lambda pair: one(*pair), (tf.nest.map_structure(chunked, inputs), chunked(deltas)),
                     fn_output_signature=deltas.dtype)
    return tf.reshape(rows, [-1, d * p])[:count]


class FactorBlock(ColumnBlock):
    """A kernel shared over `T` positions (and optionally its bias), kept as factors.

    Example i's kernel gradient is `A_i^T Delta_i` (`[d, p]`, flattened row-major), its bias
    gradient `sum_t Delta_it` (`[p]`).

    Args:
        inputs: `A`, `[n, T, d]`.
        deltas: `Delta`, `[n, T, p]`, same dtype.
        has_bias: whether the block's columns end with the bias.

    Example:
        >>> import tensorflow as tf
        >>> block = FactorBlock(tf.constant([[[1.0]], [[2.0]]]), tf.constant([[[1.0]], [[3.0]]]), True)
        >>> block.rows().numpy().tolist()   # [a delta, delta] per example
        [[1.0, 1.0], [6.0, 3.0]]
    """

    def __init__(self, inputs: tf.Tensor, deltas: tf.Tensor, has_bias: bool):
        self._inputs, self._deltas = inputs, deltas
        self._layout = (int(inputs.shape[1]), int(inputs.shape[2]), int(deltas.shape[2]), bool(has_bias))
        positions, d, p, bias = self._layout
        self.sizes = (d * p, p) if bias else (d * p,)

    @property
    def num_rows(self) -> Any:
        return dimension(self._inputs, 0)

    @property
    def positions(self) -> int:
        return self._layout[0]

    def _flat(self) -> tuple[tf.Tensor, tf.Tensor]:
        """`A` and `Delta` as `[n T, d]` and `[n T, p]`."""
        _, d, p, _ = self._layout
        return tf.reshape(self._inputs, [-1, d]), tf.reshape(self._deltas, [-1, p])

    def _delta_sums(self) -> tf.Tensor:
        return tf.reduce_sum(self._deltas, axis=1)  # [n, p]: the bias rows

    def matvec(self, block):
        positions, d, p, bias = self._layout
        columns = tf.shape(block)[1]
        a, delta = self._flat()
        kernel = tf.reshape(block[: d * p], [d, -1])  # [d, p k]
        projected = tf.reshape(tf.matmul(a, kernel), [-1, p, columns])  # [n T, p, k]
        total = tf.reduce_sum(projected * delta[:, :, tf.newaxis], axis=1)  # [n T, k]
        if positions > 1:
            total = tf.reduce_sum(tf.reshape(total, [-1, positions, columns]), axis=1)
        if bias:
            total += tf.matmul(self._delta_sums(), block[d * p:])
        return total

    def rmatvec(self, block):
        positions, d, p, bias = self._layout
        columns = tf.shape(block)[1]
        a, delta = self._flat()
        weights = block if positions == 1 else tf.repeat(block, positions, axis=0)  # [n T, k]
        weighted = tf.reshape(delta[:, :, tf.newaxis] * weights[:, tf.newaxis, :], [-1, p * columns])
        pieces = [tf.reshape(tf.matmul(a, weighted, transpose_a=True), [-1, columns])]
        if bias:
            pieces.append(tf.matmul(self._delta_sums(), block, transpose_a=True))
        return tf.concat(pieces, axis=0)

    def gram(self):
        positions, _, _, bias = self._layout
        a, delta = self._flat()
        products = tf.matmul(a, a, transpose_b=True) * tf.matmul(delta, delta, transpose_b=True)
        if positions > 1:  # [n T, n T] -> sum over the position pairs of each example pair
            n = tf.shape(self._inputs)[0]
            products = tf.reduce_sum(tf.reshape(products, [n, positions, n, positions]), axis=[1, 3])
        if bias:
            sums = self._delta_sums()
            products += tf.matmul(sums, sums, transpose_b=True)
        return products

    def centered_column_squares(self):
        positions, _, _, bias = self._layout
        if positions > 1:
            return tf.reduce_sum(tf.square(centered_over_rows(self.rows())), axis=0)
        return tf.concat(_dense_column_squares(self._inputs[:, 0], self._deltas[:, 0], bias), axis=0)

    def centered_column_squares_by_slot(self):
        positions, _, _, bias = self._layout
        if positions > 1:
            return super().centered_column_squares_by_slot()
        return _dense_column_squares(self._inputs[:, 0], self._deltas[:, 0], bias)  # no joined copy

    def centered_frobenius_squared(self):
        positions, _, _, bias = self._layout
        if positions > 1:
            return tf.reduce_sum(self.centered_column_squares())
        return _dense_frobenius_squared(self._inputs[:, 0], self._deltas[:, 0], bias)

    def rows(self):
        pieces = [explicit_gradients(self._inputs, self._deltas)]
        if self._layout[3]:
            pieces.append(self._delta_sums())
        return tf.concat(pieces, axis=1)

    def product_flops(self, n):
        positions, d, p, _ = self._layout
        return 4.0 * n * positions * d * p

    def gram_flops(self, n):
        positions, d, p, _ = self._layout
        return 2.0 * (n * positions) ** 2 * (d + p)

    def __tf_flatten__(self):
        return self._layout, (self._inputs, self._deltas)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        block = cls.__new__(cls)
        block._inputs, block._deltas = components
        block._layout = metadata
        _, d, p, bias = metadata
        block.sizes = (d * p, p) if bias else (d * p,)
        return block


def _dense_column_squares(a: tf.Tensor, delta: tf.Tensor, bias: bool) -> list[tf.Tensor]:
    """`diag(Gc^T Gc)` of one position (`T = 1`) from the factors `a` `[n, d]`, `delta` `[n, p]`.

    With `Delta` centered over the batch (`Delta = 1 dbar^T + Delta'`) the kernel entry `(p, q)`
    of `g_i - gbar` is `a_ip delta'_iq + (a_ip - abar_p) dbar_q - c_pq`, `c = (1/n) A^T Delta'`.
    Its sum of squares over `i` is

        (A*A)^T (Delta'*Delta') + dbar^2 * sum_i (a_ip - abar_p)^2
          + 2 dbar * ((A*A')^T Delta') - n c^2        (A' = A - abar, all entrywise in p, q)

    which, unlike `sum_i g_i^2 - n gbar^2`, has no cancellation between the `abar dbar` part of
    the mean and the sum of squares: what remains to cancel is `n c^2`, the batch covariance of
    inputs and centered errors. Clipped at 0. On an MLP regressing targets at 50 from positive
    inputs (mean^2 / variance up to 3e3) the largest relative error of a variance against
    float64 was 1.8e-3 for the plain moment form, 2e-6 for this one and 1.3e-6 for the two-pass
    form on explicit rows.
    """
    count = tf.cast(tf.shape(a)[0], a.dtype)
    delta_mean = tf.reduce_mean(delta, axis=0)
    delta_centered = delta - delta_mean
    a_centered = centered_over_rows(a)
    input_spread = tf.reduce_sum(tf.square(a_centered), axis=0)  # [d]
    coupling = tf.matmul(a, delta_centered, transpose_a=True) / count  # c, [d, p]
    squares = (
        tf.matmul(tf.square(a), tf.square(delta_centered), transpose_a=True)
        + input_spread[:, tf.newaxis] * tf.square(delta_mean)
        + 2.0 * delta_mean * tf.matmul(a * a_centered, delta_centered, transpose_a=True)
        - count * tf.square(coupling)
    )
    pieces = [tf.reshape(tf.maximum(squares, 0.0), [-1])]
    if bias:
        pieces.append(tf.reduce_sum(tf.square(delta_centered), axis=0))
    return pieces


def _dense_frobenius_squared(a: tf.Tensor, delta: tf.Tensor, bias: bool) -> tf.Tensor:
    """`||Gc||_F^2` of one position from its factors, with one `[d, p]` product.

    With `s = abar dbar^T`, `g_i - s = a'_i delta_i^T + abar delta'_i^T` (primes: centered over
    the batch), whose squared norm is a few row reductions, and `gbar - s = c = A^T Delta' / n`;
    so `||Gc||_F^2 = sum_i ||g_i - s||^2 - n ||c||^2`. Shifting by `s` first (variances do not
    change) removes the mean part that would otherwise cancel. Clipped at 0.
    """
    count = tf.cast(tf.shape(a)[0], a.dtype)
    a_mean = tf.reduce_mean(a, axis=0)
    a_centered, delta_centered = a - a_mean, centered_over_rows(delta)
    delta_deviation = tf.reduce_sum(tf.square(delta_centered), axis=1)  # [n]
    shifted = (
        tf.reduce_sum(tf.square(a_centered), axis=1) * tf.reduce_sum(tf.square(delta), axis=1)
        + tf.reduce_sum(tf.square(a_mean)) * delta_deviation
        + 2.0 * tf.linalg.matvec(a_centered, a_mean) * tf.reduce_sum(delta * delta_centered, axis=1)
    )
    coupling = tf.matmul(a, delta_centered, transpose_a=True) / count
    total = tf.reduce_sum(shifted) - count * tf.reduce_sum(tf.square(coupling))
    if bias:
        total += tf.reduce_sum(delta_deviation)
    return tf.maximum(total, 0.0)


def uses_factor_form(deltas: tf.Tensor, input_width: int) -> bool:
    """Whether a kernel shared over `T` positions keeps its factors (see the module docstring):
    `T = 1`, or `n T (d + p) < d p` with `n` and `T` static. `deltas` is `[n, T, p]`, `d` the
    input width."""
    n, positions, p = deltas.shape[0], deltas.shape[1], int(deltas.shape[2])
    return positions == 1 or (None not in (n, positions) and n * positions * (input_width + p) < input_width * p)


def factor_or_explicit(inputs: tf.Tensor, deltas: tf.Tensor, has_bias: bool) -> ColumnBlock:
    """The cheaper form of a shared kernel's per-example gradients (see the module docstring).

    Args:
        inputs: `A`, `[n, T, d]` with static `T` and `d`.
        deltas: `Delta`, `[n, T, p]` with static `p`.
        has_bias: whether the layer's bias (gradient `sum_t Delta_t`) follows the kernel.

    Example:
        >>> import tensorflow as tf
        >>> type(factor_or_explicit(tf.ones([8, 1, 30]), tf.ones([8, 1, 20]), True)).__name__
        'FactorBlock'
        >>> type(factor_or_explicit(tf.ones([8, 900, 27]), tf.ones([8, 900, 16]), True)).__name__
        'ExplicitBlock'
    """
    d, p = int(inputs.shape[2]), int(deltas.shape[2])
    if uses_factor_form(deltas, d):
        return FactorBlock(inputs, deltas, has_bias)
    pieces = [explicit_gradients(inputs, deltas)]
    if has_bias:
        pieces.append(tf.reduce_sum(deltas, axis=1))
    return ExplicitBlock(tf.concat(pieces, axis=1), (d * p, p) if has_bias else (d * p,))


class SparseRowsBlock(ColumnBlock):
    """Explicit per-example gradients of the rows `row_ids` of one `[V, p]` variable.

    The other rows of the variable have zero gradient for every example of the batch (an
    `Embedding`'s tokens that do not occur), so they add nothing to any statistic: products
    gather and scatter the present rows only, and their variances are 0.

    Args:
        rows: `[n, U, p]`, example i's gradient of row `row_ids[u]` (zero for padding slots).
        row_ids: `[U]` int32, distinct except for padding slots, whose rows are zero.
        num_ids: `V`, the variable's number of rows.

    Example:
        >>> import tensorflow as tf
        >>> block = SparseRowsBlock(tf.constant([[[1.0]], [[3.0]]]), tf.constant([2]), 4)
        >>> block.rows().numpy().tolist()
        [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 3.0, 0.0]]
    """

    def __init__(self, rows: tf.Tensor, row_ids: tf.Tensor, num_ids: int):
        self._rows, self._ids = rows, row_ids
        self._layout = (int(num_ids), int(rows.shape[2]))
        self.sizes = (self._layout[0] * self._layout[1],)

    @property
    def num_rows(self) -> Any:
        return dimension(self._rows, 0)

    def _flat(self) -> tf.Tensor:
        return tf.reshape(self._rows, [tf.shape(self._rows)[0], -1])  # [n, U p]

    def _scatter(self, present: tf.Tensor) -> tf.Tensor:
        """`[U, p, ...]` -> `[V, p, ...]` with zeros for the rows not present."""
        shape = tf.concat([[self._layout[0]], tf.shape(present)[1:]], axis=0)
        return tf.scatter_nd(self._ids[:, tf.newaxis], present, shape)

    def matvec(self, block):
        num_ids, width = self._layout
        table = tf.reshape(block, [num_ids, width, -1])
        present = tf.reshape(tf.gather(table, self._ids), [-1, tf.shape(block)[1]])
        return tf.matmul(self._flat(), present)

    def rmatvec(self, block):
        num_ids, width = self._layout
        present = tf.matmul(self._flat(), block, transpose_a=True)  # [U p, k]
        present = tf.reshape(present, [-1, width, tf.shape(block)[1]])
        return tf.reshape(self._scatter(present), [num_ids * width, -1])

    def gram(self):
        return row_gram(self._flat())

    def centered_column_squares(self):
        squares = tf.reduce_sum(tf.square(centered_over_rows(self._rows)), axis=0)  # [U, p]
        return tf.reshape(self._scatter(squares), [-1])

    def centered_frobenius_squared(self):
        return tf.reduce_sum(tf.square(centered_over_rows(self._rows)))

    def rows(self):
        per_id = tf.transpose(self._rows, [1, 2, 0])  # [U, p, n]
        return tf.transpose(tf.reshape(self._scatter(per_id), [-1, tf.shape(self._rows)[0]]))

    def product_flops(self, n):
        return 4.0 * n * int(self._rows.shape[1] or self._layout[0]) * self._layout[1]

    def gram_flops(self, n):
        return self.product_flops(n) * 0.5 * max(1.0, 2.0 * n / MACHINE_BALANCE)

    def __tf_flatten__(self):
        return self._layout, (self._rows, self._ids)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        block = cls.__new__(cls)
        block._rows, block._ids = components
        block._layout = metadata
        block.sizes = (metadata[0] * metadata[1],)
        return block


class ZeroBlock(ColumnBlock):
    """Variables no example's loss depends on (a layer the forward pass never called)."""

    def __init__(self, num_rows: Any, sizes: Sequence[int], dtype: tf.DType = tf.float32):
        self._count = tf.convert_to_tensor(num_rows, tf.int32)
        self.sizes = tuple(int(s) for s in sizes)
        self._dtype = dtype

    @property
    def num_rows(self) -> Any:
        static = tf.get_static_value(self._count)
        return int(static) if static is not None else self._count

    def matvec(self, block):
        return tf.zeros([self._count, tf.shape(block)[1]], block.dtype)

    def rmatvec(self, block):
        return tf.zeros([self.num_cols, tf.shape(block)[1]], block.dtype)

    def gram(self):
        return tf.zeros([self._count, self._count], self._dtype)

    def centered_column_squares(self):
        return tf.zeros([self.num_cols], self._dtype)

    def rows(self):
        return tf.zeros([self._count, self.num_cols], self._dtype)

    def product_flops(self, n):
        return 0.0

    def gram_flops(self, n):
        return 0.0

    def __tf_flatten__(self):
        return (self.sizes, self._dtype), (self._count,)

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        block = cls.__new__(cls)
        block._count = components[0]
        block.sizes, block._dtype = metadata
        return block
