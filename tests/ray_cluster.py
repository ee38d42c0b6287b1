"""A local Ray cluster for the tests: 2 CPUs on 127.0.0.1, started once per test session.

`requires_ray` skips a test, with its reason, only where ray is not installed (CI installs it).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# Ray gives a cluster the machine's interface address unless clusters are "disabled", which keeps
# every process on 127.0.0.1: the tests talk to nothing but loopback. Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

requires_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'psdp[ray]'); CI installs it and runs these tests",
)


@pytest.fixture(scope="session")
def ray_engine():
    """A `RayEngine` that started its own local cluster; shut down (and checked) at the end."""
    import ray

    from psdp.prepare.ray_engine import RayEngine

    engine = RayEngine(num_cpus=2)
    assert ray.util.get_node_ip_address() == "127.0.0.1", "ray was imported before ray_cluster"
    yield engine
    engine.close()
    assert not ray.is_initialized(), "the engine started the session, so it shuts it down"
