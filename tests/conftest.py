"""Fixtures shared by the tests: the common meshes of the 8 fake CPU devices, in id order.

The root conftest.py gives the process its 8 devices; tests/meshes.py builds any other mesh.
"""

from __future__ import annotations

import pytest
from jax.sharding import Mesh

from tests.meshes import mesh_of

# The Ray head every Ray test shares, registered here once: a session fixture imported into two
# test modules is two fixtures, and the second found the first's session open and never closed it.
from tests.ray_cluster import ray_engine  # noqa: F401 (a fixture)


@pytest.fixture(scope="session")
def mesh_1d() -> Mesh:
    """``data=8``: pure data parallelism."""
    return mesh_of(("data",), (8,))


@pytest.fixture(scope="session")
def mesh_2d() -> Mesh:
    """``data=4 x model=2``: every row on a tensor-parallel pair of devices."""
    return mesh_of(("data", "model"), (4, 2))


@pytest.fixture(scope="session")
def mesh_context() -> Mesh:
    """``data=4 x context=2``: the sequence (dimension 1) split over ``context``."""
    return mesh_of(("data", "context"), (4, 2))
