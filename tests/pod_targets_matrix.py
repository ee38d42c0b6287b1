"""The pod matrix's target: every case of tests/test_pod_matrix.py on this host of a real pod."""

from __future__ import annotations

import jax
import numpy as np

from psdp import MeshLayout
from tests.matrix import Case, check_case, live_shards


def check_cases(process_index, axis_names, mesh_shape, cases) -> dict:
    """Builds the mesh from the layout; checks every case here; returns shards checked per case."""
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    process_of = {d: d.process_index for d in mesh.devices.flat}
    me = jax.process_index()
    shards = [check_case(Case(**case), mesh, me, process_of, live_shards) for case in cases]
    return {"process": me, "shards": shards}
