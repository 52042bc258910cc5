"""scikit-learn's 8x8 digits: ships with scikit-learn, no download."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from keras_thermo._validation import check_int, check_number, check_seed
from keras_thermo.data.arrays import ClassificationData, from_arrays
from keras_thermo.data.labels import stratified_holdout

_DIGITS_PIXEL_MAX = 16.0


def digits_arrays(
    split: str = "train",
    *,
    classes: Sequence[int] | None = None,
    test_fraction: float = 0.25,
    split_seed: int = 0,
    flatten: bool = True,
    normalize: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 handwritten digits bundled with scikit-learn, as numpy arrays.

    1,797 images with pixel values 0..16. The train/test split is stratified and fixed by
    `split_seed`: within each digit class, `floor(test_fraction * n_c + 1/2)` examples,
    chosen by `np.random.default_rng(split_seed)`, form the test split. `classes` then keeps
    only the listed digits and relabels them by position, so `classes=(7, 9)` gives the
    binary task 7 -> 0, 9 -> 1 on the same examples the 10-class split assigns.

    Args:
        split: `"train"` or `"test"`.
        classes: Digits to keep, in label order; None keeps all ten.
        test_fraction: Fraction of each class in the test split, in `(0, 1)`.
        split_seed: Seed of the split.
        flatten: `(64,)` vectors; else `(8, 8, 1)` images.
        normalize: Divide pixels by 16 to land in `[0, 1]`; else raw 0..16.

    Returns:
        `(x, y)`: float32 `[n, 64]` (or `[n, 8, 8, 1]`) and int64 `[n]`, in dataset order.

    Example:
        >>> x, y = digits_arrays("test", classes=(7, 9))
        >>> x.shape[1], sorted(set(y.tolist()))
        (64, [0, 1])
    """
    pixels, labels = _digits_split(split, classes, test_fraction, split_seed)
    x = pixels.astype(np.float32)
    if normalize:
        x = x / np.float32(_DIGITS_PIXEL_MAX)
    if not flatten:
        x = x.reshape(-1, 8, 8, 1)
    return x, labels


def _digits_split(
    split: str, classes: Sequence[int] | None, test_fraction: float, split_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (uint8 pixels [n, 64], int64 labels [n]) of one digits split."""
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test', got {split!r}.")
    test_fraction = check_number(
        "test_fraction", test_fraction, low=0.0, high=1.0, high_inclusive=False
    )
    split_seed = check_seed("split_seed", split_seed)
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits
    except ImportError as error:
        raise ImportError(
            "The digits data ships with scikit-learn: `pip install scikit-learn` "
            "(or `pip install keras_thermo[dev]`)."
        ) from error
    bunch = sklearn_load_digits()
    pixels = bunch.data.astype(np.uint8)
    labels = bunch.target.astype(np.int64)

    in_test = np.zeros(labels.shape[0], dtype=bool)
    in_test[stratified_holdout(labels, test_fraction, split_seed)[1]] = True
    keep = in_test if split == "test" else ~in_test

    if classes is not None:
        classes = [check_int(f"classes[{i}]", c, low=0) for i, c in enumerate(classes)]
        if len(classes) < 2 or len(set(classes)) != len(classes) or max(classes) > 9:
            raise ValueError(
                f"`classes` must be at least two distinct digits in 0..9, got {classes}."
            )
        relabel = np.full(10, -1, dtype=np.int64)
        relabel[classes] = np.arange(len(classes))
        keep &= relabel[labels] >= 0
        labels = relabel[labels]
    return pixels[keep], labels[keep]


def load_digits(
    split: str = "train",
    *,
    batch_size: int,
    classes: Sequence[int] | None = None,
    test_fraction: float = 0.25,
    split_seed: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    label_noise: float = 0.0,
    flatten: bool = True,
    normalize: bool = True,
    drop_remainder: bool = False,
    with_replacement: bool = False,
    examples: Sequence[int] | None = None,
) -> ClassificationData:
    """scikit-learn's 8x8 digits as a `ClassificationData`; offline, no download.

    The split and `classes` are those of `digits_arrays`; batching, shuffling, label noise and
    `examples` (a subset of the split, e.g. a validation part) those of `from_arrays`. Examples
    are `(64,)` vectors by default (`networks.digits_mlp`).

    Example:
        >>> data = load_digits("train", batch_size=32)
        >>> data.input_shape, data.num_classes
        ((64,), 10)
    """
    pixels, labels = _digits_split(split, classes, test_fraction, split_seed)
    num_classes = 10 if classes is None else len(classes)
    return from_arrays(
        pixels if flatten else pixels.reshape(-1, 8, 8, 1),
        labels,
        batch_size=batch_size,
        num_classes=num_classes,
        shuffle=shuffle,
        seed=seed,
        label_noise=label_noise,
        scale=1.0 / _DIGITS_PIXEL_MAX if normalize else None,
        drop_remainder=drop_remainder,
        with_replacement=with_replacement,
        examples=examples,
        name="digits" if classes is None else f"digits[{','.join(str(c) for c in classes)}]",
        split=split,
    )


def load_digits_7_vs_9(split: str = "train", **kwargs: Any) -> ClassificationData:
    """Binary digits task, 7 -> label 0 and 9 -> label 1, for `networks.logistic_regression`.

    Keyword arguments are those of `load_digits` (except `classes`).

    Example:
        >>> load_digits_7_vs_9("test", batch_size=16).num_classes
        2
    """
    return load_digits(split, classes=(7, 9), **kwargs)
