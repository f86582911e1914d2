# make test: create .venv if missing, install bert_jax with its test extras, run the suite.
# make lint: ruff over the repository (ruff.toml); CI runs it before the tests.
# make train: create .venv if missing, install bert_jax, pretrain a tiny BERT on the bundled corpus (runs/bert-tiny).
# make bench: run the CPU benchmarks against transformers and write benchmarks/RESULTS.md.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
TRAIN_WORKDIR ?= runs/bert-tiny
TRAIN_FLAGS ?=
# These targets run on the CPU. With libtpu installed (the test extra), JAX would look for a TPU first and warn;
# on a TPU VM pass JAX_PLATFORMS= (empty) to let it find the TPU.
export JAX_PLATFORMS ?= cpu

.PHONY: test lint train bench

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# A run writes about 3 GB of checkpoints and workdirs under pytest's temporary folder; only failed tests' folders
# are kept afterwards, so repeated runs do not fill a small /tmp.
test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -o tmp_path_retention_policy=failed tests

lint: $(VENV)/.installed
	$(PY) -m ruff check .

bench: $(VENV)/.installed
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) benchmarks/run_all.py

# Training needs the package alone, not the test extras (torch, transformers).
$(VENV)/.installed-train: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# A workdir that already holds a checkpoint continues from it; delete it (or set TRAIN_WORKDIR) to start afresh.
train: $(VENV)/.installed-train
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m bert_jax.train --config=configs/bert.py:tiny --workdir=$(TRAIN_WORKDIR) $(TRAIN_FLAGS)
