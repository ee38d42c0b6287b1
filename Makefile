# The two set-up commands of the README: `make run` and `make test`. Both create .venv themselves.
# Every venv installs psdp (editable) with all its extras at the exact versions of a lock file under
# requirements/ (`make lock` writes them from pyproject.toml's ranges: scripts/lock.py).
# CI (.ci/run) runs `make lint` beside the venv builds (make -j2), then the suite at the lower
# bounds and at the newest releases.

# The interpreter of Python $(1): on PATH, else pyenv's (its shims answer only for the active one).
python_of = $(firstword $(foreach p,$(shell command -v python$(1)) \
	$(wildcard $(shell pyenv root 2>/dev/null)/versions/$(1).*/bin/python$(1)), \
	$(if $(shell $(p) -c 'print(1)' 2>/dev/null),$(p))))

comma := ,
PYTHON ?= $(or $(call python_of,3.11),python3)
PYTHON_LOWER ?= $(or $(call python_of,3.11),python3.11)
PYTHON_NEWEST ?= $(or $(call python_of,3.13),python3.13)
EXTRAS := chat,dev,draccus,grain,haliax,orbax,prepare,ray
# The dev venv (.venv) also builds the documentation site; the test venvs need no docs tools.
DEV_EXTRAS := $(EXTRAS),docs
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run example test test-slow lint docs test-lower test-newest test-levanter check-install lock bench clean

setup: $(STAMP)

# A fresh venv whenever pyproject.toml or the lock changes, so nothing outside the lock lingers.
# uv builds the venvs (a pinned release, itself pip-installed into .venv-uv, once): the same exact
# versions as pip from the same lock (`-c`: checked, every package alike), in a third of the time
# (.venv-lower from an empty cache, 2026-11-29: 20 s against pip's 57 s, 15 s of CPU against 43 s),
# so that CI's set-up leaves room for its suites. `--seed` puts pip in each venv (check-install
# and scripts/lock.py ask it). Neither compiles the modules it installs to bytecode (pip would
# compile every one: 91 s of the 146 s of CPU .venv-levanter took, 18,421 modules), when a run of
# the suite imports about 1,000 of them (collecting all tests: 1,023 of .venv-lower's 17,073);
# those are compiled at their first import instead (16 s of CPU, once), as Python writes them.
UV_RELEASE := uv==0.13.9
UV := .venv-uv/bin/uv

$(UV):
	rm -rf .venv-uv
	$(PYTHON) -m venv .venv-uv
	.venv-uv/bin/python -m pip install --quiet --no-compile $(UV_RELEASE)

define make_venv
rm -rf $(1)
$(UV) venv --quiet --seed --python $(2) $(1)
$(UV) pip install --quiet --python $(1)/bin/python -c $(3) -e '.[$(or $(4),$(EXTRAS))]'
touch $(1)/.installed-stamp
endef

# Python writes the bytecode of what it imports (in __pycache__, git-ignored) in every command
# here, even where the environment says not to: the venvs hold none (--no-compile above), and
# without it each process (every pod's, every test's subprocess) compiled each module it imports,
# psdp's own included: 0.24 s of CPU more per `import psdp` (1.62 s instead of 1.38).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml requirements/dev-py311.lock | $(UV)
	$(call make_venv,$(VENV),$(PYTHON),requirements/dev-py311.lock,$(DEV_EXTRAS))

# The headline job, examples/train_lm: text -> psdp prepare -> a YAML data config -> a tiny
# transformer on a 4-process local pod (its picture first: which host owns which device and reads
# which rows), every device's batch checked every step against an oracle that reads the stores
# without psdp, killed, then resumed on 2 processes with another batch size (about a minute on
# 2 cores). `psdp simulate --train` is the same pod check on synthetic rows (docs/reference/cli.md).
run: $(STAMP)
	$(PY) examples/train_lm/run.py

# The former name of `make run`.
example: run

# The suite in two groups (marker `slow`, pyproject.toml): `make test` runs all but the slow
# end-to-end runs, a test file per worker on every core (about 3.5 min on 2 cores); `make
# test-slow` runs those: every multi-process pod, the example, the benchmark, the Ray cluster, the
# host simulations (about 11 min). CI runs both at the lower bounds and the first at the newest.
PYTEST_FAST := -m "not slow" -n auto --maxprocesses=4 --dist loadfile
PYTEST_SLOW := -m slow
# Both groups in one run, a test file per worker: the slow files (the benchmark, the example, the
# pods) run beside the fast ones instead of after them, one collection for all (test-lower, CI).
PYTEST_ALL := -n auto --maxprocesses=4 --dist loadfile

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_FAST)

test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_SLOW)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts examples conftest.py
	$(VENV)/bin/ruff format --check src tests scripts examples conftest.py
	$(VENV)/bin/mypy
	$(MAKE) docs

# The documentation site (docs/, mkdocs.yml) with its API reference generated from the docstrings,
# into site/; --strict: a warning (a broken link or anchor, a docstring mkdocstrings cannot read)
# fails the build. `make lint` runs it, so CI does.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# The suite on Python 3.11 with every dependency and extra at its declared lower bound.
.venv-lower/.installed-stamp: pyproject.toml requirements/lower-py311.lock | $(UV)
	$(call make_venv,.venv-lower,$(PYTHON_LOWER),requirements/lower-py311.lock)

test-lower: .venv-lower/.installed-stamp
	.venv-lower/bin/python -m pytest $(PYTEST_ALL)

# The suite but its slow runs on Python 3.13 with the newest releases (as of the last `make
# lock`); `make test-newest PYTEST_FAST=` runs all of it there.
.venv-newest/.installed-stamp: pyproject.toml requirements/newest-py313.lock | $(UV)
	$(call make_venv,.venv-newest,$(PYTHON_NEWEST),requirements/newest-py313.lock)

test-newest: .venv-newest/.installed-stamp
	.venv-newest/bin/python -m pytest $(PYTEST_FAST)

# psdp as Levanter's data loader (`psdp.levanter`) beside Levanter itself (marin-levanter), in a
# venv of its own: Levanter pins jax < 0.11, tensorstore < 0.1.82 and transformers < 5, and its
# haliax build (marin-haliax) replaces the `haliax` extra's. Only the Levanter tests run there
# (tests/test_levanter.py and the blocks of docs/guides/levanter.md). Building the venv: 63 s of
# CPU (146 s before --no-compile) plus the downloads. The tests: most of their time goes to three,
# the 20 training steps twice, the guide's recipe (a 2-process pod) and the kill and resume; two
# workers run them side by side (a test per worker as one frees up): 402 s against 793 s one after
# the other, on the same loaded 2 cores.
PYTEST_LEVANTER := -n 2 --dist load
.venv-levanter/.installed-stamp: pyproject.toml requirements/levanter-py311.lock | $(UV)
	$(call make_venv,.venv-levanter,$(PYTHON),requirements/levanter-py311.lock,levanter$(comma)dev)

test-levanter: .venv-levanter/.installed-stamp
	.venv-levanter/bin/python -m pytest $(PYTEST_LEVANTER) tests/test_levanter.py tests/test_review37.py

# `pip install psdp` into an environment that already holds other allowed releases (the lower
# bounds: jax 0.6.2, tensorstore 0.1.81, ...) installs psdp and changes no other package.
check-install: .venv-lower/.installed-stamp
	.venv-lower/bin/python scripts/lock.py check-install

# Re-resolve the three locks from pyproject.toml (needs the package registry; about a minute each).
lock:
	$(PYTHON) scripts/lock.py lock requirements/dev-py311.lock $(PYTHON) --extras $(DEV_EXTRAS)
	$(PYTHON) scripts/lock.py lock requirements/lower-py311.lock $(PYTHON_LOWER) --lower-bounds
	$(PYTHON) scripts/lock.py lock requirements/newest-py313.lock $(PYTHON_NEWEST)
	$(PYTHON) scripts/lock.py lock requirements/levanter-py311.lock $(PYTHON) --extras levanter,dev

clean:
	rm -rf $(VENV) .venv-uv .venv-lower .venv-newest .venv-levanter .pytest_cache .ruff_cache .mypy_cache .hypothesis site
