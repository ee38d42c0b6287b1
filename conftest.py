"""Every test and doctest runs with 8 fake CPU devices, so multi-device code really runs in CI.

This must happen before JAX initialises its backend, hence the root conftest (loaded first).
"""

import os
import time
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

# The doctests, docs and README show specs as jax >= 0.9.1 prints them, ``P('data',)``; older jax
# (down to psdp's lower bound) prints ``PartitionSpec('data',)``. The lower-bound job prints the
# newer form, so that the same examples hold on both (only the repr changes).
if repr(jax.sharding.PartitionSpec("x")).startswith("PartitionSpec("):
    _spec_repr = jax.sharding.PartitionSpec.__repr__
    jax.sharding.PartitionSpec.__repr__ = (
        lambda self: "P" + _spec_repr(self)[len("PartitionSpec") :]
    )

# scripts/mutation.py runs the tests once per mutant and needs only "does a test fail", not the
# smallest failing example: its profile skips hypothesis's shrinking
import pytest  # noqa: E402
from hypothesis import Phase, settings  # noqa: E402

settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that launches a local pod is one of the slow end-to-end runs as well."""
    for item in items:
        if item.get_closest_marker("multiprocess"):
            item.add_marker(pytest.mark.slow)


# Nothing a test starts may outlive the run: this process adopts every orphaned descendant (a
# "child subreaper", Linux), so a grandchild whose parent exited is still seen below.
PR_SET_CHILD_SUBREAPER = 36  # Linux's prctl option: orphaned descendants reparent to this process


def _adopt_orphans() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the check below sees direct children only
        pass


def _live_children() -> list[str]:
    """``pid command`` of each child of this process that still runs (zombies are reaped)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) != os.getpid():
                continue
            if state == "Z":
                os.waitpid(int(stat.parent.name), os.WNOHANG)
                continue
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except (OSError, ChildProcessError):  # gone, or reaped by its Popen, meanwhile
            continue
        if "multiprocessing.resource_tracker" not in command:  # Python's own: ends with us
            found.append(f"{stat.parent.name} {command}")
    return found


@pytest.fixture(scope="session", autouse=True)
def _nothing_outlives_the_tests():
    """Set up first, so torn down last: a process still running then was leaked by some test."""
    _adopt_orphans()
    yield
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + 10  # a process told to stop gets a moment to exit
    while (left := _live_children()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes that outlived the tests:\n  " + "\n  ".join(left)
