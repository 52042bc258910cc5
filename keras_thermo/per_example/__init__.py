"""Per-example gradients and the gradient-noise statistics of a minibatch (DESIGN section 5).

* `engine`: the layer-rule engine, `layer_statistics(net, loss, x, y, ...)`: one forward and
  one backward pass record each trainable layer's inputs and the gradient at its
  pre-activation; one rule per layer family (`rules/`) turns them into column blocks of `G`
  (`blocks`), and `statistics.LayerStatistics` gives the samplers what they ask for.
* `vectorized`: `per_example_gradients`, the explicit rows `[n, Nd]` from `tf.vectorized_map`:
  the fallback for a layer without a rule and the reference in tests.
* `statistics`: the interface the samplers use (`count`, `diagonal_covariance`,
  `full_covariance`, `covariance_factor`, `covariance_trace`), over rows
  (`PerExampleGradients`) or blocks (`LayerStatistics`); `flatten` / `unflatten`
  (`keras_thermo._tree`) define the column order.
* `checks`: layers that couple or randomise the examples, refused by name; `losses`: the
  per-example losses both paths differentiate.

Example:
    >>> import keras, tensorflow as tf
    >>> from keras_thermo import per_example
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> x, y = tf.random.normal([6, 3]), tf.zeros([6, 2])
    >>> engine = per_example.layer_statistics(net, "mse", x, y)
    >>> rows = per_example.PerExampleGradients(per_example.per_example_gradients(net, "mse", x, y))
    >>> bool(tf.reduce_all(tf.abs(engine.diagonal_covariance() - rows.diagonal_covariance()) < 1e-5))
    True
"""

from keras_thermo._tree import flatten, unflatten
from keras_thermo.per_example.checks import check_per_example_compatible, stochastic_layers, stochastic_setting
from keras_thermo.per_example.engine import Recording, incompatibility, layer_statistics
from keras_thermo.per_example.registry import LayerRule, register, rule_for
from keras_thermo.per_example.losses import PER_EXAMPLE_MEAN_REDUCTIONS, LossLike, example_loss
from keras_thermo.per_example.statistics import (
    LayerRows,
    LayerStatistics,
    PerExampleGradients,
    centered,
    diagonal_covariance,
    full_covariance,
)
from keras_thermo.per_example.vectorized import per_example_gradients

__all__ = [
    "LayerRows",
    "LayerRule",
    "LayerStatistics",
    "Recording",
    "LossLike",
    "PER_EXAMPLE_MEAN_REDUCTIONS",
    "PerExampleGradients",
    "centered",
    "check_per_example_compatible",
    "diagonal_covariance",
    "example_loss",
    "flatten",
    "full_covariance",
    "incompatibility",
    "layer_statistics",
    "per_example_gradients",
    "register",
    "rule_for",
    "stochastic_layers",
    "stochastic_setting",
    "unflatten",
]
