# make test: create .venv if missing, install bert_jax with its test extras, run the suite.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: test

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q tests
