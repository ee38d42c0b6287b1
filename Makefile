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

run: $(STAMP)
	$(VENV)/bin/psdp plan --example

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts conftest.py
	$(VENV)/bin/ruff format --check src tests scripts conftest.py
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
