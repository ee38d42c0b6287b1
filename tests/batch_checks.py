"""Exact-data oracles shared by single- and multi-process tests: every device shard, never shapes."""

from __future__ import annotations

import jax
import numpy as np

from psdp import ArraySource
from psdp.order import PAD


def expected_global(data: np.ndarray | dict[str, np.ndarray], ids: np.ndarray, pad_value=0):
    """The global batch a step must hold: the source rows at ``ids``, in batch order.

    `PAD` ids give rows of ``pad_value``.
    """
    if isinstance(data, dict):
        return {k: expected_global(v, ids, pad_value) for k, v in data.items()}
    rows = data[np.where(ids == PAD, 0, ids)]
    rows[ids == PAD] = pad_value
    return rows


def physical_ids(loader, step: int) -> np.ndarray:
    """The step's ids padded to the loader's physical batch with `PAD`."""
    ids = np.full(loader.physical_batch_size, PAD, np.int64)
    ids[loader.real_positions] = loader.order.batch_ids(step)
    return ids


def expected_batch(loader, data, step: int):
    """What the loader must deliver at ``step``: the rows, padding, and the mask when padded."""
    ids = physical_ids(loader, step)
    out = expected_global(data, ids, loader.pad_value)
    if loader.padded:
        out[loader.mask_key] = ids != PAD
    return out


def assert_shards_exact(batch: jax.Array, expected: np.ndarray) -> int:
    """Every addressable shard of ``batch`` equals ``expected[shard.index]``; returns the count."""
    assert batch.shape == expected.shape, (batch.shape, expected.shape)
    count = 0
    for shard in batch.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index])
        count += 1
    assert count == len(batch.sharding.addressable_devices)
    return count


def assert_batch_exact(batch, expected) -> int:
    if isinstance(expected, dict):
        assert set(batch) == set(expected)
        return sum(assert_shards_exact(batch[k], expected[k]) for k in expected)
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
