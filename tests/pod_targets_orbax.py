"""Pod target for tests/test_orbax_pod.py: docs/reference/reliability.md's Orbax recipe on every host."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from psdp import DataLoader
from tests.test_docs import python_blocks


def orbax_recipe() -> str:
    """The doc's Orbax block, as written."""
    (block,) = [b for b in python_blocks("reference/reliability.md") if "import orbax" in b.code]
    return block.code


def run_orbax_recipe(run_dir: str) -> dict:
    """Runs the doc's Orbax block with the names the doc's block before it defines (the pod's
    8 devices as data=4 x model=2, a loader 3 steps on); ``run_dir`` is shared by every host."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    data = {"tokens": np.arange(64 * 4, dtype=np.int32).reshape(64, 4)}
    with DataLoader(data, mesh=mesh, global_batch_size=8, seed=7) as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = batches.state()
    namespace = {
        "__name__": "docs.reference.reliability.md",
        "jax": jax,
        "np": np,
        "DataLoader": DataLoader,
        "mesh": mesh,
        "data": data,
        "run_dir": Path(run_dir),
        "state": state,
        "loader": loader,
    }
    exec(compile(orbax_recipe(), "docs/reference/reliability.md (Orbax block)", "exec"), namespace)
    resumed = namespace["resumed"]
    return {
        "process": jax.process_index(),
        "loader_step": namespace["loader"].state()["step"],
        "count": int(np.asarray(resumed["opt_state"][0].count.addressable_data(0))),
        "count_devices": len(resumed["opt_state"][0].count.sharding.device_set),
    }
