"""`benchmarks.lab.step_passes`: its count on a known graph, and the cheap samplers' step held to
the passes its update needs (a count of the traced graph: machine-independent, not a timing)."""

import tensorflow as tf

from benchmarks import step_cost
from benchmarks.lab import step_passes
from keras_thermo import random as kt_random


def test_writes_and_reads_of_the_size_are_counted_and_nothing_else():
    big = tf.TensorSpec([100, 10], tf.float32)

    variable = tf.Variable(tf.zeros([100, 10]))

    @tf.function
    def step(a, b):
        c = a * 2.0 + b                  # Mul, AddV2: two writes
        total = tf.reduce_sum(tf.square(c))  # Square writes, Sum reads
        both = tf.concat([tf.reshape(a, [-1]), tf.reshape(b, [-1])], 0)  # a larger array: a write
        variable.assign_add(c)           # assignments are not counted
        return tf.reshape(c, [1000]), total + tf.reduce_sum(a[:3]) + both[0]  # Reshape is free; a slice is smaller

    counts = step_passes.count_passes(step.get_concrete_function(big, big).graph, 1000)
    assert counts["writes"] == {"AddV2": 1, "ConcatV2": 1, "Mul": 1, "Square": 1}
    assert counts["reads"] == {"StridedSlice": 2, "Sum": 1}
    assert (counts["total_writes"], counts["total_reads"]) == (4, 3)


def test_sgld_writes_no_more_weight_sized_arrays_than_its_update_needs():
    """SGLD's step, listed: the gradient of the largest kernel (one matrix product, as SGD's),
    the prior's value (a square) and closed-form force (a product and its sum with the data's),
    the noise draw (counted on its own below), the update `theta + (eps/2) F + sqrt(eps T) R`
    (two products, two sums), and the logged temperatures (the increment's square; the
    product `theta F`). A pass added to the step fails this."""
    network = step_cost.NETWORKS["emnist_mlp"]
    weights = step_cost.initial_weights(network)
    variables = [tf.constant(w) for w in weights]

    @tf.function
    def draw():
        return kt_random.normal_like(kt_random.step_key(0, tf.constant(0, tf.int64), kt_random.STREAM_MOMENTUM), variables)

    size = max(w.size for w in weights)
    draw_writes = step_passes.count_passes(draw.get_concrete_function().graph, size)["total_writes"]
    listed = 1 + 1 + 2 + draw_writes + 4 + 2
    sgld = step_passes.method_passes(network, "sgld", weights)
    assert sgld["total_writes"] <= listed, (draw_writes, sgld)
