"""Image-classification splits from IDX files or TensorFlow Datasets, offline unless asked:
`load_classification` and one loader per benchmark dataset.

Nothing is downloaded unless asked: `download=False` is the default and a dataset that is not
prepared in `data_dir` raises `DatasetNotPreparedError`, which says how to prepare it (both
routes: IDX files, `keras_thermo.data.idx`, and TFDS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from keras_thermo._validation import check_int
from keras_thermo.data.arrays import ClassificationData, from_arrays
from keras_thermo.data.idx import _IDX_SPLITS, EMNIST_BALANCED, FASHION_MNIST, IDX_DATASETS, MNIST, read_idx_split

CIFAR10 = "cifar10"

_TFDS_PIXEL_MAX = 255.0
_READ_BATCH = 4096


class DatasetNotPreparedError(RuntimeError):
    """A dataset is neither as IDX files nor as a prepared TFDS dataset in `data_dir`, and
    downloading was not allowed."""


def _not_found_message(name: str, data_dir: str | None) -> str:
    """How to get a dataset that is in none of the places looked at, both routes named."""
    if name not in IDX_DATASETS:
        return ""
    spec = IDX_DATASETS[name]
    where = (f"no IDX files of it in '{data_dir}' or '{Path(data_dir) / spec['folder']}'" if data_dir
             else "no data_dir was given to look for IDX files in")
    return (
        f"Two routes to '{name}'. (1) Its IDX files ({where}): {spec['get']}; then pass that directory as "
        f"data_dir (benchmark runner: `--data-dir data/real`, or `data.data_dir` in the config). (2) TensorFlow "
        f"Datasets: "
    )


def _read_tfds_split(
    name: str, split: str, data_dir: str | None, download: bool, limit: int | None
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Reads a supervised TFDS split into memory: (images, labels, num_classes or None)."""
    import tensorflow_datasets as tfds  # Slow to import; only the TFDS loaders need it.

    builder = tfds.builder(name, data_dir=data_dir)
    if download:
        builder.download_and_prepare()
    try:
        dataset = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    except Exception as error:
        if builder.is_prepared():
            raise
        root = builder.data_dir_root
        raise DatasetNotPreparedError(
            _not_found_message(name, data_dir) +
            f"Dataset '{name}' is not prepared in data_dir '{root}' (looked for "
            f"'{builder.data_dir}'), and download=False, so nothing was fetched. Prepare it "
            f"once on a machine with network access, `tfds build {name} --data_dir={root}`, "
            f"and copy that directory here (or pass its location as data_dir); or pass "
            f"download=True to fetch it now."
        ) from error
    if limit is not None:
        dataset = dataset.take(limit)
    image_batches, label_batches = [], []
    for images, labels in tfds.as_numpy(dataset.batch(_READ_BATCH)):
        image_batches.append(images)
        label_batches.append(labels)
    if not image_batches:
        raise ValueError(f"Split '{split}' of dataset '{name}' is empty.")
    label_key = builder.info.supervised_keys[1] if builder.info.supervised_keys else "label"
    label_feature = builder.info.features[label_key]
    num_classes = getattr(label_feature, "num_classes", None)
    return np.concatenate(image_batches), np.concatenate(label_batches), num_classes


def load_classification(
    name: str,
    split: str,
    *,
    batch_size: int,
    data_dir: str | None = None,
    download: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    label_noise: float = 0.0,
    num_classes: int | None = None,
    flatten: bool = False,
    squeeze_channels: bool = False,
    normalize: bool = True,
    limit: int | None = None,
    drop_remainder: bool = False,
    with_replacement: bool = False,
    examples: Sequence[int] | None = None,
) -> ClassificationData:
    """Loads a supervised image-classification split from IDX files or TensorFlow Datasets.

    MNIST, Fashion-MNIST and EMNIST Balanced splits `"train"` and `"test"` are read from their
    IDX files when `data_dir` holds them (`idx_files`: in `data_dir` or its subfolder named after
    the dataset); otherwise, and for every other dataset or split, from TFDS. The split is read
    into memory once (uint8, in storage order) and served by `from_arrays`.

    Args:
        name: TFDS name, e.g. `"emnist/balanced"`, `"fashion_mnist"`, `"cifar10"`.
        split: TFDS split, e.g. `"train"`, `"test"`, `"train[:10%]"`.
        batch_size: Examples per batch.
        data_dir: A directory of IDX files (see above), else the TFDS data directory; None
            for TFDS' default (`~/tensorflow_datasets` or `$TFDS_DATA_DIR`).
        download: Allow downloading and preparing the dataset. Off by default: without it a
            missing dataset raises `DatasetNotPreparedError`.
        shuffle: New example order every epoch.
        seed: Seed of the order and the label noise.
        label_noise: Fraction of labels permuted at the start of every epoch (`permute_labels`).
        num_classes: Number of classes; default from the dataset's metadata.
        flatten: Examples as vectors (`(784,)` for 28x28 images), for MLPs.
        squeeze_channels: Drop the size-1 channel axis of grayscale images, `(28, 28)`.
        normalize: Scale pixels to `[0, 1]` by dividing by 255; else raw values as float32.
        limit: Keep only the first `limit` examples of the split (storage order).
        drop_remainder: Drop a last, smaller batch.
        with_replacement: Draw each pass's examples with replacement (see `from_arrays`).
        examples: Keep only these examples of the split (after `limit`; see `from_arrays`).

    Returns:
        A `ClassificationData`.

    Raises:
        DatasetNotPreparedError: The dataset is not in `data_dir` and `download=False`; the
            message says how to get it (both routes).

    Example:
        >>> data = load_classification("fashion_mnist", "train", batch_size=64)  # doctest: +SKIP
        >>> data.input_shape, data.num_classes  # doctest: +SKIP
        ((28, 28, 1), 10)
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    if limit is not None:
        limit = check_int("limit", limit, low=1)
    found = None
    if data_dir is not None and name in IDX_DATASETS and split in _IDX_SPLITS:
        found = read_idx_split(data_dir, name, split, limit)
    if found is not None:
        (images, labels), metadata_classes = found, IDX_DATASETS[name]["num_classes"]
    else:
        images, labels, metadata_classes = _read_tfds_split(name, split, data_dir, download, limit)
    return from_arrays(
        images,
        labels,
        batch_size=batch_size,
        num_classes=num_classes if num_classes is not None else metadata_classes,
        shuffle=shuffle,
        seed=seed,
        label_noise=label_noise,
        flatten=flatten,
        squeeze_channels=squeeze_channels,
        scale=1.0 / _TFDS_PIXEL_MAX if normalize else None,
        drop_remainder=drop_remainder,
        with_replacement=with_replacement,
        examples=examples,
        name=name,
        split=split,
    )


def load_emnist_balanced(split: str = "train", **kwargs: Any) -> ClassificationData:
    """EMNIST Balanced: 47 classes of 28x28x1 handwritten characters (112,800 / 18,800).

    Used with `networks.emnist_mlp` and `flatten=True`. Keyword arguments are those of
    `load_classification`. TFDS stores EMNIST images transposed relative to MNIST; an MLP
    does not care.
    """
    return load_classification(EMNIST_BALANCED, split, **kwargs)


def load_mnist(split: str = "train", **kwargs: Any) -> ClassificationData:
    """MNIST: 10 classes of 28x28x1 handwritten digits (60,000 / 10,000).

    Keyword arguments are those of `load_classification`; `data_dir` may hold the IDX files
    (`make real-data` puts them in `data/real/mnist`).
    """
    return load_classification(MNIST, split, **kwargs)


def load_fashion_mnist(split: str = "train", **kwargs: Any) -> ClassificationData:
    """Fashion-MNIST: 10 classes of 28x28x1 images (60,000 / 10,000).

    Used with `networks.fashion_mnist_lstm` and `squeeze_channels=True`. Keyword arguments are
    those of `load_classification`.
    """
    return load_classification(FASHION_MNIST, split, **kwargs)


def load_cifar10(split: str = "train", **kwargs: Any) -> ClassificationData:
    """CIFAR-10: 10 classes of 32x32x3 images (50,000 / 10,000), for `networks.cifar10_cnn`.

    Keyword arguments are those of `load_classification`.
    """
    return load_classification(CIFAR10, split, **kwargs)
