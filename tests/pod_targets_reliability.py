"""Reliability pod targets (see psdp.tools.pod.run_pod), and the batch digests they share with the tests.

A *digest* of a batch is ``{"leaf@box": sha256}`` over its addressable shards, where ``box`` is the
shard's slice of the global array (``"0:2,0:8"``): the same on every process layout, so the union of
every process's digests must equal the single-process digest of the same step, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time

import jax
import numpy as np
from jax.sharding import PartitionSpec

from psdp import DataLoader, MeshLayout

SEQUENCE = 8  # columns of the "tokens" leaf


def dataset(num_rows: int) -> dict[str, np.ndarray]:
    """Rows that name themselves, with a sequence leaf and a float leaf."""
    rows = np.arange(num_rows)
    return {
        "tokens": (rows[:, None] * 100 + np.arange(SEQUENCE)).astype(np.int32),
        "weight": (rows * 0.5).astype(np.float32),
    }


def loader_kwargs() -> dict:
    """The settings every determinism run shares: a sequence-sharded leaf with a halo, a batch of 6
    padded to 8 (with a mask), shuffled; with 27 rows every epoch ends in a short padded batch."""
    return dict(
        global_batch_size=6,
        batch_spec={"tokens": PartitionSpec("data", "model"), "weight": "batch"},
        halo=1,
        seed=1234,
        shuffle=True,
    )


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    return ",".join(
        f"{s.start or 0}:{size if s.stop is None else s.stop}"
        for s, size in zip(index, shape, strict=False)
    )


def batch_digest(batch: dict[str, jax.Array]) -> dict[str, str]:
    """``{"leaf@box": sha256 of the shard's bytes}``; shards with the same box must agree."""
    out: dict[str, str] = {}
    for leaf, array in sorted(batch.items()):
        for shard in array.addressable_shards:
            data = np.ascontiguousarray(np.asarray(shard.data))
            digest = hashlib.sha256(
                f"{data.dtype}{data.shape}".encode() + data.tobytes()
            ).hexdigest()
            key = f"{leaf}@{_box(shard.index, array.shape)}"
            if out.setdefault(key, digest) != digest:
                raise AssertionError(f"two devices hold {key} with different bytes")
    return out


def _mesh(process_index: list, mesh_shape: list[int]) -> jax.sharding.Mesh:
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), ("data", "model"))
    return layout.build_mesh(jax.devices())


def layout_digests(process_index, mesh_shape, num_rows, steps, restart_at):
    """Digests of steps ``0..steps-1`` on this process, restarting once from a saved state.

    Each process uses its own prefetch depth and read-thread count (1 + its index, at most 8),
    which must not change a single byte.
    """
    me = jax.process_index()
    mesh = _mesh(process_index, mesh_shape)
    data = dataset(num_rows)
    kwargs = dict(prefetch=1 + me % 8, read_threads=1 + me % 3)
    digests = []
    with DataLoader(data, mesh=mesh, **loader_kwargs(), **kwargs) as loader:
        for _, batch in zip(range(restart_at), loader, strict=False):
            digests.append(batch_digest(batch))
        state = json.loads(json.dumps(loader.state()))
    restored = DataLoader.restore(state, data, mesh=mesh, **loader_kwargs(), prefetch=8 - me % 8)
    with restored as loader:
        for _, batch in zip(range(steps - restart_at), loader, strict=False):
            digests.append(batch_digest(batch))
    return {"process": me, "state_step": state["step"], "digests": digests}


def killed_mid_run(process_index, mesh_shape, num_rows, steps, kill_at, how):
    """Every process trains with a global sum per step; process 1 dies at step ``kill_at``.

    ``how`` is ``"sigkill"`` (killed by the OS, e.g. the OOM killer) or ``"exit"`` (``os._exit(7)``:
    no exception, no cleanup, as a crashing C extension).
    """
    me = jax.process_index()
    mesh = _mesh(process_index, mesh_shape)
    total = jax.jit(lambda t: t.sum())
    with DataLoader(dataset(num_rows), mesh=mesh, **loader_kwargs()) as loader:
        for step, batch in zip(range(steps), loader, strict=False):
            if me == 1 and step == kill_at:
                if how == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(7)
            int(total(batch["tokens"]))  # a collective: the survivors wait for process 1 here
            time.sleep(0.01)
    return {"process": me}
