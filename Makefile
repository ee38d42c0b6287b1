# The two set-up commands of the README: `make run` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,grain]'
	touch $(STAMP)

# A 4-host non-contiguous pod on this machine: synthetic tokens in a temporary TensorStore store,
# 300 steps of a tiny model, every device's rows checked every step (about a minute on 2 cores).
run: $(STAMP)
	$(VENV)/bin/psdp simulate --train

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts conftest.py
	$(VENV)/bin/ruff format --check src tests scripts conftest.py
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
