"""Packing pod target, run inside each process of the 4-host non-contiguous pod: one loader per
case over `PackedSequences`, every local device shard against the table that
tests/packing_oracle.py lays out from the documents."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, DocumentStore, MeshLayout, PackedSequences
from tests.batch_checks import assert_batch_exact, expected_batch
from tests.packing_oracle import naive_pack, named_documents, packed_table

LENGTHS = [5, 17, 3, 9, 30, 1, 12, 8, 8, 4, 21, 2, 6, 15, 11, 7, 3, 19, 5, 10] * 3
SEQ_LEN = 16
LEAVES = ("input_ids", "loss_mask", "segment_ids", "positions")


def _cases() -> list[tuple[str, dict[str, Any]]]:
    """(strategy, loader options): batch, full, the sequence over ``model`` with a halo, and a
    batch-size schedule whose batches the shards do not divide (padding and the mask)."""
    sequence = dict.fromkeys(LEAVES, P("data", "model"))
    return [
        ("best_fit", {"batch_spec": "batch", "global_batch_size": 8}),
        ("first_fit", {"batch_spec": "full", "global_batch_size": 8}),
        ("best_fit", {"batch_spec": sequence, "halo": 2, "global_batch_size": 8}),
        ("greedy", {"batch_spec": "batch", "global_batch_size": [(0, 8), (2, 6)]}),
    ]


def packed_exact(process_index, axis_names, mesh_shape, steps: int) -> Any:
    """Checks ``steps`` steps of every case; returns the shards checked and each plan's shape."""
    mesh = MeshLayout(np.asarray(process_index), tuple(axis_names)).build_mesh(jax.devices())
    docs = named_documents(LENGTHS, masks=True)
    store = DocumentStore.from_documents(docs)
    checked, plans = 0, []
    for strategy, options in _cases():
        source = PackedSequences(store, SEQ_LEN, strategy, pad_id=9)
        table = packed_table(docs, naive_pack(LENGTHS, SEQ_LEN, strategy), SEQ_LEN, 9)
        settings = dict(mesh=mesh, seed=2, **options)
        with DataLoader(source, **settings) as loader:
            for step in range(steps):
                want = expected_batch(table, step, **settings)
                checked += assert_batch_exact(loader.batch_at(step), want)
        plans.append([len(source), source.plan.seq_starts.tolist()])
    return {"checked": checked, "plans": plans}
