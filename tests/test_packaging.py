"""Packaging: what ``import psdp`` loads, optional extras, and the locks against pyproject's ranges.

The ranges are checked with ``packaging`` (pip's own version rules), independently of
scripts/lock.py, which writes the locks.
"""

from __future__ import annotations

import doctest
import json
import runpy
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.batch_checks import token_table

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = sorted((ROOT / "requirements").glob("*.lock"))
#: dependencies psdp loads only when a feature needs them
HEAVY = ["equinox", "grain", "haliax", "orbax", "tensorstore"]


#: extras of tools, not of users: ``dev`` in every lock, ``docs`` in the dev lock only (the
#: Makefile's DEV_EXTRAS); neither has lower bounds to test
TOOLS = {"dev": None, "docs": "dev-py311.lock"}
#: user extras that cannot share a venv with the others, each tested in a venv of its own lock
#: (Levanter pins jax < 0.11 and installs its own haliax build): not in the lower-bound job
SEPARATE = {"levanter": "levanter-py311.lock"}


def declared(*, with_dev: bool, lock: str | None = None) -> list[Requirement]:
    """Every requirement of pyproject.toml: the dependencies and the user extras, with ``dev``
    if asked, and the tool extras that ``lock`` installs; a `SEPARATE` lock: the dependencies,
    its own extra and ``dev``."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    own = next((name for name, its_lock in SEPARATE.items() if its_lock == lock), None)
    chosen = [
        r
        for name, reqs in extras.items()
        if (own is None and name not in TOOLS and name not in SEPARATE)
        or (with_dev and name == "dev")
        or (own is None and lock and TOOLS.get(name) == lock)
        or name == own
        for r in reqs
    ]
    return [Requirement(r) for r in [*PYPROJECT["project"]["dependencies"], *chosen]]


def pins(lock: Path) -> dict[str, Version]:
    lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
    return {canonicalize_name(n): Version(v) for n, v in (line.split("==") for line in lines)}


def modules_after(code: str) -> list[str]:
    """The `HEAVY` modules a fresh interpreter holds after running ``code``."""
    probe = (
        f"import json, sys\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


# ------------------------------------------------------------------------------ import cost
def test_import_psdp_loads_no_optional_or_slow_dependency():
    assert modules_after("import psdp") == []


def test_lazy_names_load_their_dependency_on_first_use():
    code = "import psdp\nassert 'TensorStoreSource' in dir(psdp)\npsdp.TensorStoreSource"
    assert modules_after(code) == ["tensorstore"]
    assert modules_after("from psdp.sources import read_metadata") == ["tensorstore"]
    assert modules_after("from psdp import write_dataset") == ["tensorstore"]
    with pytest.raises(AttributeError, match="module 'psdp' has no attribute 'NoSuchName'"):
        import psdp

        _ = psdp.NoSuchName


def test_star_import_gives_exactly_the_public_names():
    """``from psdp import *`` gives `psdp.__all__`: the names ``psdp/__init__.py`` re-exports
    (``import X as X``, the public ones tests/test_docs.py wants in the API reference), and
    none of its own helpers (``Any``, ``TYPE_CHECKING``, ``importlib``, ``lazy_attributes``)."""
    import re

    import psdp

    namespace: dict[str, object] = {}
    exec("from psdp import *", namespace)
    namespace.pop("__builtins__")
    reexported = set(re.findall(r"\bimport (\w+) as \1\b", Path(psdp.__file__).read_text()))
    assert sorted(namespace) == sorted(psdp.__all__) == sorted(reexported)
    assert not {"Any", "TYPE_CHECKING", "importlib", "lazy_attributes"} & set(namespace)
    assert namespace["prepare"] is sys.modules["psdp.prepare"]  # the package, callable


# ------------------------------------------------------------------------------ optional extras
def test_named_axes_without_haliax_name_the_extra(monkeypatch, mesh_2d):
    from psdp import DataLoader

    monkeypatch.setitem(sys.modules, "haliax", None)  # as if haliax were not installed
    with pytest.raises(
        ImportError, match=r"named_axes needs haliax, .*pip install 'psdp\[haliax\]'"
    ):
        DataLoader({"tokens": token_table(16)}, mesh=mesh_2d, global_batch_size=8,
                   named_axes={"tokens": ("batch", "pos")}, axis_mapping={"batch": "data"})  # fmt: skip


def test_a_broken_optional_dependency_keeps_its_own_error(tmp_path, monkeypatch):
    from psdp._imports import import_optional

    (tmp_path / "broken_extra.py").write_text("import no_such_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_it"):
        import_optional("broken_extra", extra="x", needed_for="a test")


# ------------------------------------------------------------------------------ ranges and locks
def test_every_requirement_is_a_range_with_a_lower_bound():
    separate = [declared(with_dev=False, lock=lock) for lock in SEPARATE.values()]
    for requirement in [*declared(with_dev=False), *(r for rs in separate for r in rs)]:
        operators = {spec.operator for spec in requirement.specifier}
        assert ">=" in operators and "<" in operators, f"{requirement} needs >=X,<Y"
        assert "==" not in operators, f"{requirement} pins: a library declares ranges"


def test_the_lower_lock_pins_every_lower_bound():
    lower = pins(ROOT / "requirements" / "lower-py311.lock")
    for requirement in declared(with_dev=False):
        floor = next(Version(s.version) for s in requirement.specifier if s.operator == ">=")
        assert lower[canonicalize_name(requirement.name)] == floor, requirement


@pytest.mark.parametrize("lock", LOCKS, ids=[lock.name for lock in LOCKS])
def test_every_lock_is_inside_the_ranges(lock):
    pinned = pins(lock)
    for requirement in declared(with_dev=True, lock=lock.name):
        got = pinned[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(got, prereleases=True), f"{lock.name}: {got}"


def test_the_locks_are_the_four_jobs():
    assert [lock.name for lock in LOCKS] == [
        "dev-py311.lock",
        "levanter-py311.lock",
        "lower-py311.lock",
        "newest-py313.lock",
    ]


def test_this_environment_is_inside_the_ranges():
    """What the suite runs on (any job) is a combination psdp declares it supports."""
    for requirement in declared(with_dev=False):
        try:
            installed = Version(version(requirement.name))
        except PackageNotFoundError:
            continue  # an extra that is not installed here
        assert requirement.specifier.contains(
            installed, prereleases=True
        ), f"{requirement.name} {installed} is outside {requirement}"


def test_lock_script_lower_bounds_agree_with_pyproject():
    script = runpy.run_path(str(ROOT / "scripts" / "lock.py"), run_name="lock")
    expected = sorted(
        f"{canonicalize_name(r.name)}=={next(s.version for s in r.specifier if s.operator == '>=')}"
        for r in declared(with_dev=False)
    )
    assert script["lower_bounds"](PYPROJECT) == expected
    with pytest.raises(ValueError, match="'tqdm' has no lower bound"):
        script["lower_bounds"]({"project": {"dependencies": ["tqdm"]}})


def test_lock_script_examples_hold():
    script = runpy.run_path(str(ROOT / "scripts" / "lock.py"), run_name="lock")
    for name in ("lower_bounds", "lock_lines"):
        for test in doctest.DocTestFinder().find(script[name], name, globs=script):
            assert doctest.DocTestRunner().run(test).failed == 0, name


# ----------------------------------------------------------------------- the test run's limits
HANGING_TEST = """
import time

import pytest


@pytest.mark.timeout(1)
def test_hangs():
    time.sleep(600)


def test_after_the_hang():
    pass
"""


def test_every_test_has_a_time_limit(request):
    """pyproject's default limit (slow tests carry their own ``@pytest.mark.timeout``)."""
    assert request.config.pluginmanager.hasplugin("timeout")
    assert 60 <= float(request.config.getini("timeout")) <= 300


def test_a_hanging_test_fails_at_its_limit_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGING_TEST)
    test = str(tmp_path / "test_hang.py")
    options = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-q", test]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options],
        capture_output=True,
        text=True,
        timeout=120,  # hang guard
    )
    assert "Timeout (>1.0s) from pytest-timeout" in run.stdout, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
