"""Action of `exp(-tau Gc^T Gc)` on a vector without forming the `D x D` matrix.

The C step of the mCCAdL sampler multiplies the momentum by `exp(-tau Gc^T Gc)`, where `Gc` is
the `[n, D]` matrix of centered per-example gradients of a minibatch (`n` examples, `D`
parameters). Two methods, both on TensorFlow ops, eager, in `tf.function` and under XLA:

* `expm_action_taylor`: scaled and shifted truncated Taylor series of Al-Mohy & Higham (2011),
  the method of the mCCAdL paper; products with `Gc` only.
* `expm_action_gram`: exact, through the eigendecomposition of the `n x n` Gram matrix.
* `expm_action`: dispatches between them by estimated cost (`method="auto"`).

`Gc` is a tensor or a `CenteredRows` operator (`keras_thermo.linalg.operators`) that provides
`Gc u`, `Gc^T z`, `Gc Gc^T` and `||Gc||_F^2` without the matrix, such as the per-layer factors
of `keras_thermo.per_example.dense_layers`; `MatrixRows` wraps a tensor.

Accuracy statements for float32 assume full float32 matrix products; on GPUs where TensorFlow
uses TensorFloat-32 for float32 matmuls (its default on Ampere and later), products carry
~1e-3 relative error (`tf.config.experimental.enable_tensor_float_32_execution(False)`
restores full precision).

Example:
    >>> import numpy as np
    >>> from keras_thermo.linalg import expm_action
    >>> gc = np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0]])   # rank 1, row space (1, -1, 0)
    >>> result, matvecs, method = expm_action(gc, np.array([1.0, 0.0, 1.0]), 0.25)
    >>> np.round(result.numpy(), 6).tolist()   # (1, 0, 1) = (1/2)(1, -1, 0) + (1/2)(1, 1, 0) + e3
    [0.68394, 0.31606, 1.0]
"""

from keras_thermo.linalg.dispatch import GRAM, TAYLOR, expm_action
from keras_thermo.linalg.gram import expm_action_gram, gram_matrix
from keras_thermo.linalg.operators import CenteredRows, MatrixRows
from keras_thermo.linalg.taylor import expm_action_taylor

__all__ = [
    "CenteredRows",
    "GRAM",
    "MatrixRows",
    "TAYLOR",
    "expm_action",
    "expm_action_gram",
    "expm_action_taylor",
    "gram_matrix",
]
