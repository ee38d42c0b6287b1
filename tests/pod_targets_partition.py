"""Partition strategies inside each process of a local pod (see tests/test_partition_multiprocess.py)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from batch_checks import (
    CountingSource,
    WindowSource,
    assert_batch_exact,
    expected_batch,
    halo_exchange,
    physical_ids,
    token_table,
)
from psdp import DataLoader, MeshLayout
from psdp.order import PAD


def _spec(entry):
    if entry is None or isinstance(entry, str):
        return entry
    return P(*[tuple(e) if isinstance(e, list) else e for e in entry])


def elements_read(source: WindowSource, key: str) -> set[tuple[int, int]]:
    """(row id, column) pairs of leaf ``key`` this host read (columns -1 for whole rows)."""
    out = set()
    for ids, columns in source.windows:
        if key not in columns:
            continue
        cols = columns[key]
        span = [-1] if cols is None else range(cols.start, cols.stop)
        out |= {(int(i), c) for i in ids for c in span}
    return out


def elements_planned(loader, key: str, step: int) -> set[tuple[int, int]]:
    """The same pairs from the planner's boxes alone (halo-widened, clipped, padding dropped)."""
    leaf, ids = loader.leaf(key), physical_ids(loader, step)
    length = leaf.plan.global_shape[1] if len(leaf.plan.global_shape) > 1 else 0
    out = set()
    for box in leaf.plan.blocks:
        if leaf.column_shards:
            span = range(max(box[1].start - leaf.halo, 0), min(box[1].stop + leaf.halo, length))
        else:
            span = [-1]
        out |= {(int(i), c) for i in ids[box[0]] if i != PAD for c in span}
    return out


def partition_exact(
    process_index, axis_names, mesh_shape, batch_spec, batch_size, num_rows, steps, halo=0
):
    """Every local shard exact (or equal to a ppermute halo exchange), and reads equal to the plan."""
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    data = {"tokens": token_table(num_rows, 8), "weight": np.arange(num_rows, dtype=np.float32)}
    spec = (
        {k: _spec(v) for k, v in batch_spec.items()} if isinstance(batch_spec, dict) else batch_spec
    )
    source = WindowSource(data)
    loader = DataLoader(source, mesh=mesh, global_batch_size=batch_size, batch_spec=spec, seed=3,
                        halo=halo, pad_value=-1, shuffle=True)  # fmt: skip
    plain = DataLoader(data, mesh=mesh, global_batch_size=batch_size, batch_spec=spec, seed=3,
                       pad_value=-1)  # fmt: skip
    shards = 0
    for step in range(steps):
        source.windows.clear()
        batch = loader.batch_at(step)
        expected = expected_batch(loader, data, step)
        if halo:
            reference = halo_exchange(plain.batch_at(step)["tokens"], mesh, halo, -1)
            by_device = {s.device: np.asarray(s.data) for s in reference.addressable_shards}
            for s in batch["tokens"].addressable_shards:
                np.testing.assert_array_equal(np.asarray(s.data), by_device[s.device])
                shards += 1
            del batch["tokens"], expected["tokens"]
        shards += assert_batch_exact(batch, expected)
        for key in ("tokens", "weight"):
            assert elements_read(source, key) == elements_planned(loader, key, step), key
    return {
        "process": jax.process_index(),
        "shards": shards,
        "rows_per_step": int(len(loader.read_positions)),
        "elements": int(sum(len(elements_planned(loader, k, 0)) for k in ("tokens", "weight"))),
    }


def feeding_exact(process_index, axis_names, mesh_shape, feeding, batch_size, num_rows, steps):
    """Only ``feeding`` processes' shards get real rows; the others read nothing."""
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    data = {"tokens": token_table(num_rows, 8), "weight": np.arange(num_rows, dtype=np.float32)}
    source = CountingSource(data)
    loader = DataLoader(source, mesh=mesh, global_batch_size=batch_size, seed=3,
                        feeding_processes=feeding)  # fmt: skip
    source.reads.clear()
    shards = 0
    for step in range(steps):
        batch = loader.batch_at(step)
        expected = expected_batch(loader, data, step)
        shards += assert_batch_exact(batch, expected)
        total = int(jax.jit(lambda m: m.sum())(batch["mask"]))  # a pod-wide count of real rows
        assert total == batch_size
    return {
        "process": jax.process_index(),
        "shards": shards,
        "physical": loader.physical_batch_size,
        "rows_read": int(sum(len(r) for r in source.reads)),
    }
