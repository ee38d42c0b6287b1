"""Eval-loader pod target, run inside each process of a pod: one pass of `psdp.eval_loader`, every
local shard against the plain-numpy oracle (tests/eval_oracle.py), a global reduction each step
(every host must reach it: a host that stopped early would hang the others), and what this host
saw: its devices' real rows per step and where its iteration ended."""

from __future__ import annotations

import jax
import numpy as np

import psdp
from psdp import MeshLayout
from tests.batch_checks import assert_batch_exact, token_table
from tests.eval_oracle import eval_batches


def eval_pass(process_index, axis_names, mesh_shape, num_rows, batch_size, batch_shards):
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    data = {"id": np.arange(num_rows, dtype=np.int32), "tokens": token_table(num_rows, 4)}
    want = eval_batches(data, batch_size, batch_shards)
    real_sum = jax.jit(lambda ids, mask: (ids * mask).sum())
    seen, shards, total = [], 0, 0
    with psdp.eval_loader(data, mesh=mesh, global_batch_size=batch_size) as loader:
        length = len(loader)
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration as end:
                stop = str(end)
                break
            step = len(seen)
            shards += assert_batch_exact(batch, want[step])
            total += int(real_sum(batch["id"], batch["mask"]))  # a computation over all hosts
            masks = {s.device: np.asarray(s.data) for s in batch["mask"].addressable_shards}
            held = {}  # first row of a device's block -> its real ids (replicas hold the same)
            for shard in batch["id"].addressable_shards:
                ids = np.asarray(shard.data)[masks[shard.device]]
                held[shard.index[0].start or 0] = ids.tolist()
            seen.append(sorted(held.items()))
    return {
        "process": jax.process_index(),
        "length": length,
        "steps": len(seen),
        "stop": stop,
        "seen": seen,
        "shards": shards,
        "total": total,
    }


def per_host_epochs():
    """Host 0 builds an endless loader, host 1 a finite one (``epochs=2``): the hosts would stop
    at different steps (the other waiting forever in the next step's collectives), so both must
    refuse, although an endless loader's settings do not name ``epochs`` at all."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    data = {"id": np.arange(10, dtype=np.int32)}
    try:
        psdp.eval_loader(
            data, mesh=mesh, global_batch_size=4, epochs=(None, 2)[jax.process_index()]
        )
    except ValueError as err:
        return str(err)
    return "built"
