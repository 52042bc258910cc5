# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export KERAS_BACKEND := tensorflow

.PHONY: demo test test-slow venv clean real-data

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m benchmarks.demo --out runs/demo

# Two worker processes: the tests are single-threaded at heart (small TensorFlow ops), so two
# processes use both cores of a 2-core machine.
test: $(STAMP)
	$(PY) -m pytest -q -n 2

# Real MNIST and Fashion-MNIST (IDX files) from Debian's and PyPI's registries into data/real
# (docs/real_data.md); apt-get needs root or sudo.
REAL_DATA_DIR ?= data/real
real-data:
	PYTHON=$(if $(wildcard $(PY)),$(PY),$(PYTHON)) bash scripts/get_real_data.sh $(REAL_DATA_DIR)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
