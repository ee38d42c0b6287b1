"""Exact-data checks shared by single- and multi-process tests: every device shard, never shapes.

The expected values come from tests/oracle.py and the settings the test gave the loader, never
from the loader under test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from psdp import ArraySource
from tests import oracle
from tests.oracle import PAD


def expected_global(data: np.ndarray | dict[str, np.ndarray], ids: np.ndarray, pad_value=0):
    """The global batch a step must hold: the source rows at ``ids``, in batch order.

    `PAD` ids give rows of ``pad_value``.
    """
    if isinstance(data, dict):
        return {k: expected_global(v, ids, pad_value) for k, v in data.items()}
    rows = data[np.where(ids == PAD, 0, ids)]
    rows[ids == PAD] = pad_value
    return rows


def expected_step(
    data,
    step: int,
    *,
    mesh,
    global_batch_size,
    batch_spec=None,
    batch_axes=None,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    skip_steps=(),
    skip_offsets=(),
    start_at=None,
    io_block=None,
    window_blocks: int = 16,
    pad_value=0,
    mask_key="mask",
    feeding_processes=None,
    halo=0,
) -> oracle.Expected:
    """The oracle's step for the settings a test gave its loader: `DataLoader`'s keywords with
    the same values and defaults (``shuffle``: ``True``, a random-access source's; pass ``False``
    for a `Mixture`), never read back from a loader, so a loader that applies other settings (a
    restore that picks another seed or block shuffle, say) fails the comparison. ``data`` is the
    source as numpy, an array or a dict of some of its leaves (in the source's leaf order); a
    ``halo`` is an int or a dict leaf -> int, pad halos of dimension 1 (the oracle's only kind)."""
    leaves = data if isinstance(data, dict) else {None: data}
    named = batch_spec if isinstance(batch_spec, dict) else dict.fromkeys(leaves, batch_spec)
    # leaves without a spec take the "batch" strategy (documented)
    strategies = {k: "batch" if named.get(k) is None else named[k] for k in leaves}
    specs = {k: oracle.resolve(strategy, mesh, batch_axes) for k, strategy in strategies.items()}
    span = None
    if not isinstance(global_batch_size, int) or skip_steps or skip_offsets or start_at:
        span = oracle.schedule_spans(
            len(next(iter(leaves.values()))), global_batch_size, step + 1, drop_last=drop_last,
            skip_steps=skip_steps, skip_offsets=skip_offsets, start=start_at or (0, 0),
        )[-1]  # fmt: skip
    return oracle.expected_step(
        data, mesh, specs, global_batch_size if span is None else span.batch_size, step,
        seed=seed, shuffle=shuffle, drop_last=drop_last, pad_value=pad_value,
        halo=_pad_halos(halo, specs), feeding=feeding_processes, mask_key=mask_key, span=span,
        block=None if io_block is None else (io_block, window_blocks),
    )  # fmt: skip


def _pad_halos(halo, specs) -> dict:
    """Each leaf's dimension-1 pad halo: an int is every leaf sharded on dimension 1 (documented)."""
    if isinstance(halo, int):
        return {k: halo for k, spec in specs.items() if len(spec) > 1 and oracle.axes_of(spec[1])}
    if not all(isinstance(h, int) for h in halo.values()):
        raise TypeError(f"the oracle models dimension-1 pad halos only, got {halo}")
    return dict(halo)


def expected_batch(data, step: int, **settings):
    """What a loader given ``settings`` must deliver at ``step`` (`expected_step`): the rows,
    padding, halos and the mask leaf of a dict."""
    want = expected_step(data, step, **settings)
    return want.leaves if isinstance(data, dict) else want.leaves[None]


def physical_ids(data, step: int, **settings) -> np.ndarray:
    """The step's ids in the physical batch, `PAD` for padding (`expected_step`)."""
    return expected_step(data, step, **settings).ids


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
