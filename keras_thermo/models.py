"""Deprecated: the paper tasks' networks live in `keras_thermo.networks`; this module re-exports
them for one release."""

from keras_thermo._deprecation import warn_moved_module
from keras_thermo.networks import cifar10_cnn, digits_mlp, emnist_mlp, fashion_mnist_lstm, logistic_regression

warn_moved_module("keras_thermo.models", "keras_thermo.networks")

__all__ = ["cifar10_cnn", "digits_mlp", "emnist_mlp", "fashion_mnist_lstm", "logistic_regression"]
