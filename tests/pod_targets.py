"""Functions run inside each process of a local pod (see psdp.tools.pod.run_pod)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, MeshLayout
from psdp._plan.order import PAD
from tests.batch_checks import (
    CountingSource,
    assert_batch_exact,
    expected_batch,
    physical_ids,
    token_table,
)


def loader_exact(
    process_index, axis_names, mesh_shape, num_rows, batch_size, steps, shuffle, batch_axes
):
    """Builds the mesh from a layout, runs the loader, and checks every local shard and read."""
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    data = {"tokens": token_table(num_rows), "weight": np.arange(num_rows, dtype=np.float32)}
    source = CountingSource(data)
    settings = dict(mesh=mesh, global_batch_size=batch_size, shuffle=shuffle, seed=5)
    loader = DataLoader(source, prefetch=2, **settings)
    source.reads.clear()  # the constructor's one-row probe
    me = jax.process_index()
    shards, want_reads = 0, []
    with loader:
        for step, batch in zip(range(steps), loader, strict=False):
            expected = expected_batch(data, step, **settings)
            shards += assert_batch_exact(batch, expected)
            # the host reads exactly the rows of its devices' boxes (JAX's), in batch order,
            # minus padding, which is never read (no read at all if it holds only padding)
            ids = physical_ids(data, step, **settings)
            boxes = NamedSharding(mesh, P(batch_axes)).devices_indices_map(ids.shape)
            mine = sorted({boxes[d][0].start for d in mesh.devices.flat if d.process_index == me})
            block = len(ids) // mesh.shape[batch_axes]
            want = np.concatenate([ids[start : start + block] for start in mine])
            if (want != PAD).any():
                want_reads.append(want[want != PAD])
            # and every process agrees on the whole batch (a global reduction over all hosts)
            total = int(jax.jit(lambda t: t.sum())(batch["tokens"]))
            assert total == int(expected["tokens"].sum())
    assert len(source.reads) >= len(want_reads)  # the prefetcher may have read further ahead
    for got, want in zip(source.reads, want_reads, strict=False):
        np.testing.assert_array_equal(got, want)
    held = [start // block for start in mine]
    return {"process": me, "shards": shards, "held": held, "reads": len(source.reads)}


def tensorstore_exact(
    path, expected_npz, process_index, axis_names, mesh_shape, batch_size, steps, shuffle
):
    """Opens the TensorStore dataset at ``path`` on every process and checks every local shard.

    The oracle is ``expected_npz``, the same rows saved by the parent with plain numpy, so a bug in
    the writer or the source cannot hide behind itself.
    """
    from psdp.sources import TensorStoreSource

    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    with np.load(expected_npz) as saved:
        data = {k: saved[k] for k in saved.files}
    source = TensorStoreSource(path)
    shards = 0
    settings = dict(mesh=mesh, global_batch_size=batch_size, shuffle=shuffle, seed=11)
    loader = DataLoader(source, **settings)
    with loader:
        for step, batch in zip(range(steps), loader, strict=False):
            shards += assert_batch_exact(batch, expected_batch(data, step, **settings))
    return {
        "process": jax.process_index(),
        "shards": shards,
        "rows_per_step": len(loader.plan.read_positions),
        "source": source.describe(),
    }
