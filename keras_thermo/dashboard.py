"""A TensorBoard custom-scalars layout for sampling runs.

`keras.callbacks.TensorBoard` writes each logged diagnostic as its own chart (`epoch_xi`,
`batch_kinetic_temperature`, ...). The layout written here groups them the way one reads a
sampler: both temperatures against the target T, the thermostat xi, the gradient-noise scale,
and the per-variable temperatures of `EquilibrationCheck(log_dir=...)`. Open TensorBoard's
"Custom Scalars" tab to see it.

Example:
    >>> import tempfile
    >>> write_layout(tempfile.mkdtemp())
"""

from __future__ import annotations

import tensorflow as tf

#: (category, [(chart title, [tag regular expressions])]); Keras' TensorBoard callback writes
#: `epoch_<name>` (and `batch_<name>` with `update_freq`), EquilibrationCheck `temperature/...`.
LAYOUT = [
    (
        "Temperature",
        [
            (
                "temperatures per epoch: last step, and running mean after burn-in",
                [
                    r"(epoch|batch)_(mean_)?(kinetic|configurational)_temperature",
                    r"(epoch|batch)_effective_temperature",
                ],
            ),
            (
                "block means against T (x: sampler step)",
                [r"temperature/(kinetic|configurational)/overall", r"temperature/target"],
            ),
            ("equilibrated (1 in band, 0 out)", [r"epoch_equilibrated$"]),
        ],
    ),
    (
        "Thermostat and noise",
        [
            ("thermostat xi", [r"(epoch|batch)_xi$", r"(epoch|batch)_z_(theta|xi)"]),
            ("gradient-noise scale tr(Sigma)/Nd", [r"(epoch|batch)_noise_scale"]),
            ("potential U", [r"(epoch|batch)_potential"]),
        ],
    ),
    (
        "Per-variable temperatures (block means, x: sampler step)",
        [
            ("kinetic, per variable", [r"temperature/kinetic/.*"]),
            ("configurational, per variable", [r"temperature/configurational/.*"]),
        ],
    ),
]


def layout_proto():
    """The layout as a `tensorboard.plugins.custom_scalar.layout_pb2.Layout`."""
    from tensorboard.plugins.custom_scalar import layout_pb2  # noqa: PLC0415 (optional, heavy)

    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title=title,
                chart=[
                    layout_pb2.Chart(title=chart, multiline=layout_pb2.MultilineChartContent(tag=tags))
                    for chart, tags in charts
                ],
            )
            for title, charts in LAYOUT
        ]
    )


def write_layout(log_dir: str) -> None:
    """Writes the layout into `log_dir` (its root run; TensorBoard merges layouts of all runs)."""
    from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary  # noqa: PLC0415

    proto = custom_scalar_summary.pb(layout_proto())
    writer = tf.summary.create_file_writer(str(log_dir))
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(proto.SerializeToString(), step=0)
    writer.close()
