"""One module per layer family; importing this package registers every rule with the engine.

Each rule turns a layer's recorded calls (input rows `A`, the gradient `Delta` at its
pre-activation) into column blocks of `G` (`keras_thermo.per_example.blocks`):

| module | layers | form |
|---|---|---|
| `dense` | `Dense` on any input rank, `EinsumDense` of the `...x,xy->...y` kind | factors (`T = 1`) or the cheaper of factors and explicit rows |
| `conv` | `Conv1D`, `Conv2D` (strides, padding incl. causal, dilation) | explicit rows from patches |
| `embedding` | `Embedding` | explicit rows over the tokens present |
| `normalization` | `LayerNormalization` | explicit rows (`[n, C]`) |
| `recurrent` | `LSTM`, `GRU` (any `unroll`, masks, `go_backwards`, `reset_after`) | cheaper of factors and explicit rows, per weight |
| `noise_scale` | `keras_thermo.regression.SharedNoiseScale` | explicit rows (`[n, D]`) |
"""

from keras_thermo.per_example.rules import conv, dense, embedding, noise_scale, normalization, recurrent  # noqa: F401
