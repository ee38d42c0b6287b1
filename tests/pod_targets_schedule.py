"""Schedule pod targets, run inside each process of a local pod (psdp.tools.pod.run_pod): a
batch-size ramp with skips on the 4-host non-contiguous pod, saved mid-run, then restored on a
2-host pod with another batch size; every device shard checked against the oracle."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from psdp import DataLoader, MeshLayout
from tests import oracle
from tests.batch_checks import assert_batch_exact, expected_batch, token_table

N = 1000
RAMP = [(0, 64), (4, 128), (8, 256)]
SKIP_STEPS = [(6, 7)]
SKIP_OFFSETS = [(1500, 1540)]
ORDER = dict(global_batch_size=RAMP, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS, seed=11)


def _data() -> dict[str, np.ndarray]:
    return {"tokens": token_table(N), "weight": np.arange(N, dtype=np.float32)}


def _mesh(process_index, axis_names, mesh_shape):
    return MeshLayout(np.asarray(process_index), tuple(axis_names)).build_mesh(jax.devices())


def ramp_then_save(process_index, axis_names, mesh_shape, steps: int, save_at: int) -> Any:
    """Reads ``steps`` steps of the ramp, each device shard against the oracle; returns the count
    and the state saved when ``save_at`` batches were taken."""
    mesh, data = _mesh(process_index, axis_names, mesh_shape), _data()
    checked, state = 0, None
    with DataLoader(data, mesh=mesh, **ORDER) as loader:
        it = loader.iter_from(0)
        for step in range(steps):
            if step == save_at:
                state = it.state()
            want = expected_batch(data, step, mesh=mesh, **ORDER)
            checked += assert_batch_exact(next(it), want)
        it.close()
        infos = [vars(loader.step_info(step)) for step in range(steps)]
    return {"checked": checked, "state": state, "steps": infos}


def restore_and_check(process_index, axis_names, mesh_shape, state, steps: int, changes) -> Any:
    """Restores ``state`` (saved by `ramp_then_save`) with ``changes`` and checks every device
    shard up to ``steps`` against the oracle of the saved settings with the changes, from where
    the saved walk stopped."""
    mesh, data = _mesh(process_index, axis_names, mesh_shape), _data()
    last = oracle.schedule_spans(N, RAMP, state["step"], skip_steps=SKIP_STEPS,
                                 skip_offsets=SKIP_OFFSETS)[-1]  # fmt: skip
    resumed = ORDER | changes | dict(start_at=(state["step"], last.offset + last.rows))
    checked = 0
    with DataLoader.restore(state, data, mesh=mesh, **changes) as loader:
        order = loader.options.order
        for step, batch in zip(range(state["step"], steps), loader, strict=False):
            want = expected_batch(data, step, mesh=mesh, **resumed)
            checked += assert_batch_exact(batch, want)
        settings = [list(order.start), order.global_batch_size]
        infos = [vars(loader.step_info(step)) for step in range(state["step"], steps)]
    return {"checked": checked, "settings": settings, "steps": infos}
