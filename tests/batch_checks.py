"""Exact-data checks shared by single- and multi-process tests: every device shard, never shapes.

The expected values come from tests/oracle.py, never from the loader under test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from psdp import ArraySource
from psdp._plan.order import PAD
from tests import oracle


def expected_global(data: np.ndarray | dict[str, np.ndarray], ids: np.ndarray, pad_value=0):
    """The global batch a step must hold: the source rows at ``ids``, in batch order.

    `PAD` ids give rows of ``pad_value``.
    """
    if isinstance(data, dict):
        return {k: expected_global(v, ids, pad_value) for k, v in data.items()}
    rows = data[np.where(ids == PAD, 0, ids)]
    rows[ids == PAD] = pad_value
    return rows


def _oracle_step(loader, data, step: int, feeding=None, halo=None) -> oracle.Expected:
    """The oracle's step for a loader's *settings* (its mesh, leaf specs, batch size or
    schedule, skips, resume point, seed, shuffle, drop_last, pad value, mask key): never its ids,
    positions or plans."""
    specs = loader.batch_spec if isinstance(loader.batch_spec, dict) else {None: loader.batch_spec}
    order = loader.options.order
    span = None
    if (
        not isinstance(order.global_batch_size, int)
        or order.skip_steps
        or order.skip_offsets
        or (order.start_at is not None)
    ):
        span = oracle.schedule_spans(
            len(loader.source), order.global_batch_size, step + 1, drop_last=order.drop_last,
            skip_steps=order.skip_steps, skip_offsets=order.skip_offsets, start=order.start,
        )[-1]  # fmt: skip
    return oracle.expected_step(
        data, loader.mesh, specs, loader.global_batch_size, step,
        seed=loader.order.seed, shuffle=loader.order.shuffle,
        drop_last=order.drop_last, pad_value=loader.options.output.pad_value,
        halo=halo, feeding=feeding, mask_key=loader.options.output.mask_key, span=span,
        block=None if order.io_block is None else (order.io_block, order.window_blocks),
    )  # fmt: skip


def physical_ids(loader, step: int, feeding=None) -> np.ndarray:
    """The step's ids in the physical batch, `PAD` for padding (from the oracle)."""
    return _oracle_step(loader, _rows_like(loader), step, feeding).ids


def _rows_like(loader):
    """A stand-in source with the loader's leaves and length, for the ids alone."""
    rows = np.zeros(len(loader.source), np.int8)
    return {k: rows for k in loader.batch_spec} if isinstance(loader.batch_spec, dict) else rows


def expected_batch(loader, data, step: int, feeding=None, halo=None):
    """What the loader must deliver at ``step``, from the oracle (tests/oracle.py): the rows,
    padding, halos and the mask when padded. ``feeding`` and ``halo`` are the loader's
    ``feeding_processes`` and per-leaf halos when it was given them."""
    want = _oracle_step(loader, data, step, feeding, halo)
    return want.leaves if isinstance(data, dict) else want.leaves[None]


def assert_shards_exact(batch: jax.Array, expected: np.ndarray, leaf: Any = None) -> int:
    """Every addressable shard of ``batch`` (leaf ``leaf``) equals ``expected[shard.index]``;
    returns the count. A failure names the leaf, the device and the first differing index."""
    assert batch.shape == expected.shape, (leaf, batch.shape, expected.shape)
    count = 0
    for shard in batch.addressable_shards:
        oracle.assert_shard_equal(
            np.asarray(shard.data), expected[shard.index], shard.index, expected.shape,
            leaf=leaf, device=shard.device, process=shard.device.process_index,
        )  # fmt: skip
        count += 1
    assert count == len(batch.sharding.addressable_devices)
    return count


def assert_batch_exact(batch, expected) -> int:
    """`assert_shards_exact` for every leaf of a batch (a dict of leaves, or one array)."""
    if isinstance(expected, dict):
        assert set(batch) == set(expected), (set(batch), set(expected))
        return sum(assert_shards_exact(batch[k], expected[k], leaf=k) for k in expected)
    return assert_shards_exact(batch, expected)


def token_table(num_rows: int, width: int = 3) -> np.ndarray:
    """Rows whose values name them: row r is ``[r*1000, r*1000 + 1, ...]`` (int32)."""
    return (np.arange(num_rows)[:, None] * 1000 + np.arange(width)).astype(np.int32)


class CountingSource(ArraySource):
    """An in-memory source that records every batched read (ids per call)."""

    def __init__(self, data):
        super().__init__(data)
        self.reads: list[np.ndarray] = []

    def read(self, ids):
        self.reads.append(np.array(ids))
        return super().read(ids)

    def read_window(self, ids, columns):
        self.reads.append(np.array(ids))
        return super().read_window(ids, columns)


class WindowSource(CountingSource):
    """Records every read with its column windows: ``(ids, {leaf: columns or None})``."""

    def __init__(self, data):
        super().__init__(data)
        self.windows: list[tuple[np.ndarray, dict]] = []

    def read(self, ids):
        rows = super().read(ids)
        self.windows.append((np.array(ids), dict.fromkeys(rows)))
        return rows

    def read_window(self, ids, columns):
        self.windows.append((np.array(ids), dict(columns)))
        return ArraySource.read_window(self, ids, columns)


# data=4 x model=2 on 4 hosts x 2 devices: each model group (data row) spans two hosts, and each
# host sits in two non-adjacent data rows (0 and 2, or 1 and 3): the seed's shape, on 8 devices.
NONCONTIGUOUS_4x2 = [[0, 1], [2, 3], [0, 1], [2, 3]]


def run_on_noncontiguous_pod(
    target: Callable[..., Any], timeout_s: float = 180, env: Any = None, **args
):
    """Runs the pod target ``target`` (a function of a ``tests.pod_targets*`` module) on the
    4-process `NONCONTIGUOUS_4x2` pod (``data=4 x model=2``); ``env`` as `run_pod` takes it."""
    from psdp.tools.pod import run_pod

    layout = dict(process_index=NONCONTIGUOUS_4x2, axis_names=["data", "model"], mesh_shape=[4, 2])
    return run_pod(
        target,
        num_processes=4,
        devices_per_process=2,
        args=layout | args,
        timeout_s=timeout_s,
        env=env,
    )


def halo_exchange(x: jax.Array, mesh, h: int, pad) -> jax.Array:
    """The reference for halos: each device's window plus h columns of each neighbour, exchanged
    with ``ppermute`` inside ``shard_map`` (over a ``context`` axis, batch over ``data``)."""
    import functools

    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    c = mesh.shape["context"]

    @functools.partial(
        jax.shard_map, mesh=mesh, in_specs=P("data", "context"), out_specs=P("data", "context")
    )
    def exchange(block):
        index = jax.lax.axis_index("context")
        from_left = jax.lax.ppermute(block[:, -h:], "context", [(i, i + 1) for i in range(c - 1)])
        from_right = jax.lax.ppermute(block[:, :h], "context", [(i + 1, i) for i in range(c - 1)])
        from_left = jnp.where(index == 0, pad, from_left)
        from_right = jnp.where(index == c - 1, pad, from_right)
        return jnp.concatenate([from_left, block, from_right], axis=1)

    return exchange(x)
