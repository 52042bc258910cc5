"""Classification data for the benchmarks, and `fit`'s minibatch drawing.

Every loader returns a `ClassificationData` (`arrays`): a batched `tf.data.Dataset` of `(x, y)`
with `x` float32 and `y` int64, plus the metadata a sampler needs (`num_examples` is the `N` of
`BayesianModel`). Images are held in memory as stored (uint8) and scaled per batch, so
`x = pixel / pixel_max` lies in `[0, 1]` (`normalize=True`, the default; 255 for TFDS images,
16 for the 8x8 digits).

* `tfds`: `load_classification` and `load_mnist`, `load_fashion_mnist`, `load_emnist_balanced`,
  `load_cifar10`, from IDX files (`idx`: `read_idx`, `idx_files`) or TensorFlow Datasets;
  nothing is downloaded unless asked (`DatasetNotPreparedError` says how to prepare a dataset).
* `digits`: scikit-learn's 8x8 digits (`digits_arrays`, `load_digits`, `load_digits_7_vs_9`).
* `arrays`: `from_arrays`, the in-memory core of every loader, and `epoch_plan`, the
  deterministic order and noisy labels of each pass; `labels`: label noise (Luo et al. 2018,
  section 5.2, `permute_labels`) and `stratified_holdout`.
* `_minibatches`: how `BayesianModel.fit` draws minibatches (`keyed_minibatches`,
  `split_off_validation`) and the endless streams of the tests and benchmarks
  (`random_minibatches`, `mark_with_replacement`).

Every name is importable from `keras_thermo.data` itself.
"""

from keras_thermo.data._minibatches import (
    keyed_minibatches,
    mark_with_replacement,
    random_minibatches,
    split_off_validation,
)
from keras_thermo.data.arrays import ClassificationData, epoch_plan, from_arrays
from keras_thermo.data.digits import digits_arrays, load_digits, load_digits_7_vs_9
from keras_thermo.data.idx import (
    EMNIST_BALANCED,
    FASHION_MNIST,
    IDX_DATASETS,
    IDX_DTYPES,
    MNIST,
    idx_files,
    read_idx,
    read_idx_split,
)
from keras_thermo.data.labels import label_permutation, num_permuted_labels, permute_labels, stratified_holdout
from keras_thermo.data.tfds import (
    CIFAR10,
    DatasetNotPreparedError,
    load_cifar10,
    load_classification,
    load_emnist_balanced,
    load_fashion_mnist,
    load_mnist,
)

__all__ = [
    "CIFAR10",
    "ClassificationData",
    "DatasetNotPreparedError",
    "EMNIST_BALANCED",
    "FASHION_MNIST",
    "IDX_DATASETS",
    "IDX_DTYPES",
    "MNIST",
    "digits_arrays",
    "epoch_plan",
    "from_arrays",
    "idx_files",
    "keyed_minibatches",
    "label_permutation",
    "load_cifar10",
    "load_classification",
    "load_digits",
    "load_digits_7_vs_9",
    "load_emnist_balanced",
    "load_fashion_mnist",
    "load_mnist",
    "mark_with_replacement",
    "num_permuted_labels",
    "permute_labels",
    "random_minibatches",
    "read_idx",
    "read_idx_split",
    "split_off_validation",
    "stratified_holdout",
]
