"""Input checking shared by the expm-action routines of `keras_thermo.linalg`.

Every public routine takes the same operands: a matrix `gc` of shape `[n, D]` (centered
per-example gradients, one row per example), a vector `v` of shape `[D]` (or a block `[D, k]`)
and a scalar `tau >= 0`; the operator is `S = -tau * gc^T gc`. `gc` is a tensor (or array) or a
`keras_thermo.linalg.operators.CenteredRows`; a tensor is wrapped in `MatrixRows`, so the
methods only ever see the operator interface. This module turns the operands into one floating
dtype, with `v` as a 2-D block, and rejects anything else with a message that names the
argument, the value given and what is allowed.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from keras_thermo.linalg.operators import CenteredRows, MatrixRows

SUPPORTED_DTYPES = (tf.float32, tf.float64)


class Operands(NamedTuple):
    """Checked operands of an expm action.

    Attributes:
        gc: the `[n, D]` matrix as a `CenteredRows` operator, float32 or float64.
        v: `[D, k]` tensor of the same dtype (a vector input becomes one column).
        tau: scalar tensor of the same dtype.
        vector_input: whether `v` was given as a vector; results are returned in the same form.
    """

    gc: CenteredRows
    v: tf.Tensor
    tau: tf.Tensor
    vector_input: bool


def _describe(value: Any) -> str:
    """Short description of a value for error messages (shape and dtype for arrays)."""
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        shape, dtype = tuple(value.shape), value.dtype.name
        return f"{type(value).__name__} with shape {shape} and dtype {dtype}"
    if isinstance(value, CenteredRows):
        shape = (value.num_rows, value.num_cols)
        return f"{type(value).__name__} with shape {shape} and dtype {value.dtype.name}"
    return repr(value)


def _to_float_tensor(value: Any, name: str, dtype_hint: tf.DType | None = None) -> tf.Tensor:
    try:
        tensor = tf.convert_to_tensor(value, dtype_hint=dtype_hint)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"`{name}` must be convertible to a float32 or float64 tensor; got {_describe(value)}"
        ) from error
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"`{name}` must have dtype float32 or float64; got {_describe(value)}"
        )
    return tensor


def check_non_negative_scalar(value: Any, name: str, dtype: tf.DType) -> tf.Tensor:
    """Converts a scalar that must be finite and >= 0 (checked now if it is a Python number).

    Tensors are checked when the graph runs with `tf.debugging.assert_non_negative` (XLA drops
    such assertions, so a compiled caller must pass valid values).
    """
    if isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number) or number < 0.0:
            raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}")
        return tf.constant(number, dtype=dtype)
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"`{name}` must be a real scalar (Python number or rank-0 tensor); "
            f"got {_describe(value)}"
        ) from error
    if not (tensor.dtype.is_floating or tensor.dtype.is_integer):
        raise TypeError(f"`{name}` must be a real scalar; got {_describe(value)}")
    if tensor.shape.rank != 0:
        raise ValueError(f"`{name}` must be a scalar (rank 0); got {_describe(value)}")
    tensor = tf.cast(tensor, dtype)
    with tf.control_dependencies(
        [tf.debugging.assert_non_negative(tensor, message=f"`{name}` must be >= 0")]
    ):
        return tf.identity(tensor)


def prepare_operands(gc: Any, v: Any, tau: Any) -> Operands:
    """Checks and converts `(gc, v, tau)`; see the module docstring for what is allowed.

    `gc` may be a tensor-like `[n, D]` matrix or a `CenteredRows` operator. Arrays and lists
    given as `v` are converted to the dtype of `gc`; a tensor `v` must already have it. A
    tensor `tau` is cast to the dtype of `gc` (a float32 `tau` with float64 `gc` keeps only
    float32 precision).

    Raises:
        TypeError: a dtype other than float32/float64, or `v` and `gc` of different dtypes.
        ValueError: `gc` not rank 2, `v` not rank 1 or 2, lengths that do not match, `tau`
            negative, not finite or not a scalar.
    """
    gc = as_operator(gc)
    v = _to_float_tensor(v, "v", dtype_hint=gc.dtype)
    if v.dtype != gc.dtype:
        raise TypeError(
            f"`v` must have the dtype of `gc` ({gc.dtype.name}); got {_describe(v)}"
        )
    if v.shape.rank not in (1, 2):
        raise ValueError(f"`v` must be a vector [D] or a block [D, k]; got {_describe(v)}")
    columns = gc.num_cols if isinstance(gc.num_cols, int) else None
    if not v.shape[:1].is_compatible_with([columns]):
        raise ValueError(
            f"`v` must have length D = {columns} (the number of columns of `gc`) along its "
            f"first axis; got {_describe(v)}"
        )
    vector_input = v.shape.rank == 1
    if vector_input:
        v = v[:, tf.newaxis]
    tau = check_non_negative_scalar(tau, "tau", gc.dtype)
    return Operands(gc=gc, v=v, tau=tau, vector_input=vector_input)


def as_operator(gc: Any) -> CenteredRows:
    """`gc` as a `CenteredRows`: operators pass through (dtype checked), matrices are wrapped.

    Raises:
        TypeError: a dtype other than float32/float64.
        ValueError: a matrix that is not rank 2.
    """
    if isinstance(gc, CenteredRows):
        if gc.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"`gc` must have dtype float32 or float64; got {_describe(gc)}")
        return gc
    gc = _to_float_tensor(gc, "gc")
    if gc.shape.rank != 2:
        raise ValueError(
            f"`gc` must be a rank-2 tensor [n, D] (one row per example); got {_describe(gc)}"
        )
    return MatrixRows(gc)


def restore_layout(block: tf.Tensor, vector_input: bool) -> tf.Tensor:
    """Returns `block` ([D, k]) in the layout the caller gave `v` in."""
    return block[:, 0] if vector_input else block


def frobenius_rho_bound(gc: CenteredRows) -> tf.Tensor:
    """`||gc||_F^2`, an upper bound on `rho = lambda_max(gc gc^T)` (one pass over a matrix)."""
    return gc.frobenius_squared()


def matrix_shape(gc: CenteredRows) -> tuple[Any, Any]:
    """`(n, D)` of `gc`: Python ints where static, scalar int32 tensors otherwise."""
    return gc.num_rows, gc.num_cols
