"""Test-session set-up that must run before TensorFlow initialises its devices."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

# Two logical CPU devices, so tf.distribute tests can run MirroredStrategy with two replicas on
# one CPU (tests/test_distribute.py). Every other test keeps using the first device.
NUM_LOGICAL_CPUS = 2
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)
