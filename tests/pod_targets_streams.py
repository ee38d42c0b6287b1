"""Stream functions run inside each process of a local pod (see psdp.tools.pod.run_pod).

Element ``k`` of every stream here names itself (token row ``k`` and ``weight == k``), and shards
are dealt round-robin, so shard ``u`` of ``U`` holds elements ``u, u + U, u + 2U, ...``: every
check below is exact, element by element.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec

from psdp import DataLoader, MeshLayout, plan_batch, process_mesh_mapping
from psdp.sources import StreamSource
from tests.batch_checks import assert_batch_exact, expected_global, token_table


def _stream(num_elements: int) -> tuple[dict[str, np.ndarray], StreamSource]:
    data = {
        "tokens": token_table(num_elements),
        "weight": np.arange(num_elements, dtype=np.float32),
    }
    elements = [{k: v[i] for k, v in data.items()} for i in range(num_elements)]
    return data, StreamSource(elements, name="numbered")


def stream_uid_shards(process_index, num_elements, rows_per_step, steps):
    """Opens shard uid of num_uids (uids over the ``data`` axis) and reads ``steps`` steps."""
    layout = MeshLayout(np.asarray(process_index), ("data", "model"))
    mesh = layout.build_mesh(jax.devices())
    uids = process_mesh_mapping(mesh, "data")
    uid, num_uids = uids[jax.process_index()], max(uids.values()) + 1
    data, source = _stream(num_elements)

    def read(start: int, num_steps: int) -> list[int]:
        ids: list[int] = []
        with source.open(uid, num_uids, start=start) as reader:
            for _ in range(num_steps):
                rows = reader.take(rows_per_step)
                np.testing.assert_array_equal(
                    rows["tokens"], data["tokens"][rows["weight"].astype(int)]
                )
                ids += rows["weight"].astype(int).tolist()
        return ids

    return {
        "uid": uid,
        "num_uids": num_uids,
        "ids": read(0, steps),
        "resumed": read(2 * rows_per_step, steps - 2),
    }


def stream_loader_exact(
    process_index, axis_names, mesh_shape, num_elements, batch_size, steps, resume_step
):
    """DataLoader over a StreamSource: every local shard holds exactly its uid's elements.

    The loader's contract for streams: the host of uid ``u`` opens shard ``u`` of ``U`` and, at step
    ``s``, places shard element ``s*R + j`` at batch position ``read_positions[j]`` (``R`` positions
    per host). So the global batch at step ``s`` holds, at uid ``u``'s positions, shard ``u``'s
    elements ``[s*R, (s+1)*R)``: stream elements ``u + (s*R + j) * U``.
    """
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    me = jax.process_index()
    uids = process_mesh_mapping(mesh, "data")
    num_uids = max(uids.values()) + 1
    positions = {
        uids[p]: plan_batch(mesh, PartitionSpec("data"), (batch_size,), p).rows
        for p in range(layout.num_processes)
    }
    data, source = _stream(num_elements)

    def expected_ids(step: int) -> np.ndarray:
        ids = np.full(batch_size, -1)
        for uid, rows in positions.items():
            ids[rows] = uid + (step * len(rows) + np.arange(len(rows))) * num_uids
        assert (ids >= 0).all()
        return ids

    def check(step: int, batch) -> int:
        want = expected_global(data, expected_ids(step))
        want["mask"] = np.ones(batch_size, bool)  # drop_last: every row real
        shards = assert_batch_exact(batch, want)
        # every host's part is right, not only mine: a global reduction over the whole pod
        total = float(jax.jit(lambda w: w.sum())(batch["weight"]))
        assert total == float(want["weight"].sum()), (step, total)
        return shards

    shards = 0
    mine: list[int] = []
    loader = DataLoader(
        source, mesh=mesh, global_batch_size=batch_size, shuffle=False, drop_last=True
    )
    with loader:
        np.testing.assert_array_equal(loader.plan.read_positions, positions[uids[me]])
        for step, batch in zip(range(steps), loader, strict=False):
            shards += check(step, batch)
            mine += _held_values(batch["weight"])
        shards += check(resume_step, next(loader.iter_from(resume_step)))  # resume by skipping
    return {"process": me, "uid": uids[me], "shards": shards, "ids": mine}


def _held_values(leaf: jax.Array) -> list[int]:
    """The distinct rows this host's devices hold, in batch order (replicas counted once)."""
    held = {shard.index[0].start: np.asarray(shard.data) for shard in leaf.addressable_shards}
    return [int(v) for start in sorted(held) for v in held[start]]


def stream_runs_to_its_end(process_index, axis_names, mesh_shape, num_elements, batch_size):
    """Iterates a round-robin stream to its end with drop_last=False, with a collective per step.

    Every host must stop at the same step (or the collective would hang): returns how many batches
    this host saw and the pod-wide count of real rows per step.
    """
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    _, source = _stream(num_elements)
    real_rows = []
    with DataLoader(source, mesh=mesh, global_batch_size=batch_size, shuffle=False) as loader:
        for batch in loader:
            real_rows.append(int(jax.jit(lambda m: m.sum())(batch["mask"])))  # a collective
    return {"process": jax.process_index(), "batches": len(real_rows), "real_rows": real_rows}
