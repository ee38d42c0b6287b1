"""Meshes of this process's 8 fake CPU devices (the root conftest.py makes them), built one way.

tests/conftest.py serves the common ones as fixtures; `mesh_of` builds any other, e.g. inside a
parameter table or a helper that no fixture reaches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

#: A device order that is not id order, for tests where nothing may assume that devices sit in
#: id order (a device's position in the mesh is never its id).
SCRAMBLED = (3, 0, 7, 4, 1, 6, 2, 5)


def mesh_of(names: Sequence[str], shape: Sequence[int], order: Sequence[int] | None = None) -> Mesh:
    """The mesh ``names`` of ``shape`` over the first ``prod(shape)`` devices, taken from
    ``jax.devices()`` in id order or at the positions ``order`` (e.g. `SCRAMBLED`)."""
    devices = np.array(jax.devices())
    if order is not None:
        devices = devices[list(order)]
    return Mesh(devices[: math.prod(shape)].reshape(tuple(shape)), tuple(names))
