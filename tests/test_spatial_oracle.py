"""The spatial oracle, and literal answers that pin it.

What every device must hold of a leaf windowed in several dimensions, from the documented rule
alone (``docs/concepts/partitioning.md``, "Spatial (domain) sharding"), with numpy and nothing of psdp's
planner: along each windowed dimension of ``n`` entries in ``C`` shards of ``w = ceil(n / C)``,
the rows are widened by the halo ``h`` on both sides with ``np.pad`` (``mode="wrap"`` for
``periodic``, ``constant`` with ``pad_value`` for ``pad``), padded at the end with ``pad_value``
up to ``C * w + 2h``, and cut into the ``C`` windows ``[k * w, k * w + w + 2h)``, side by side.

`needed_cells` is what a host must read: the source (row, entry) cells of its devices' windows,
the periodic wrap mapped back into the domain, padding and ``pad`` halos beyond the edges not.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp import ArraySource
from tests import oracle

#: One dimension's halo as the tests give it: (width, boundary).
Halo = tuple[int, str]


def shards_of(mesh: Mesh, spec: PartitionSpec, dim: int) -> int:
    return oracle.shard_count(mesh, spec[dim]) if dim < len(spec) else 1


def windowed(mesh: Mesh, spec: PartitionSpec, ndim: int, halos: Mapping[int, Halo]) -> list[int]:
    """The dimensions after the batch that are sharded or have a halo."""
    return [d for d in range(1, ndim) if shards_of(mesh, spec, d) > 1 or halos.get(d, (0,))[0]]


def widen(rows: np.ndarray, dim: int, shards: int, halo: Halo, pad_value: Any) -> np.ndarray:
    """``rows`` along ``dim``: the ``shards`` windows of the rule above, side by side."""
    h, boundary = halo
    n = rows.shape[dim]
    w = -(-n // shards)
    edges = [(0, 0)] * rows.ndim
    edges[dim] = (h, h)
    if boundary == "periodic":
        wide = np.pad(rows, edges, mode="wrap")
    else:
        wide = np.pad(rows, edges, mode="constant", constant_values=pad_value)
    tail = [(0, 0)] * rows.ndim
    tail[dim] = (0, shards * w - n)
    wide = np.pad(wide, tail, mode="constant", constant_values=pad_value)
    windows = [np.take(wide, np.arange(k * w, k * w + w + 2 * h), axis=dim) for k in range(shards)]
    return np.concatenate(windows, axis=dim)


def expected_leaf(
    rows: np.ndarray,
    mesh: Mesh,
    spec: PartitionSpec,
    halos: Mapping[int, Halo],
    pad_value: Any = 0,
) -> np.ndarray:
    """The delivered global leaf from its global batch of whole rows (padding rows included)."""
    out = rows
    for d in windowed(mesh, spec, rows.ndim, halos):
        out = widen(out, d, shards_of(mesh, spec, d), halos.get(d, (0, "pad")), pad_value)
    return out


def axis_cells(shard: int, n: int, shards: int, halo: Halo) -> list[int]:
    """The domain entries window ``shard`` of a dimension holds, wrap mapped back."""
    h, boundary = halo
    w = -(-n // shards)
    held = range(shard * w - h, shard * w + w + h)
    if boundary == "periodic":
        return sorted({x % n for x in held if x < n + h})
    return [x for x in held if 0 <= x < n]


def needed_cells(
    ids: np.ndarray,
    shape: Sequence[int],
    mesh: Mesh,
    spec: PartitionSpec,
    halos: Mapping[int, Halo],
    devices: Iterable[Any],
) -> set[tuple[int, ...]]:
    """The (row id, entry per windowed dimension) cells ``devices`` need of one leaf of source
    shape ``shape`` (batch first) at a step whose physical batch holds ``ids``."""
    dims = windowed(mesh, spec, len(shape), halos)
    delivered = list(shape)
    for d in dims:
        c, h = shards_of(mesh, spec, d), halos.get(d, (0, "pad"))[0]
        delivered[d] = c * (-(-shape[d] // c) + 2 * h)
    boxes = NamedSharding(mesh, spec).devices_indices_map(tuple(delivered))
    cells: set[tuple[int, ...]] = set()
    for device in devices:
        box = boxes[device]
        rows = [int(i) for i in ids[box[0]] if i != oracle.PAD]
        per_dim = []
        for d in dims:
            c, halo = shards_of(mesh, spec, d), halos.get(d, (0, "pad"))
            shard = (box[d].start or 0) // (delivered[d] // c)
            per_dim.append(axis_cells(shard, shape[d], c, halo))
        cells |= {(r, *entry) for r in rows for entry in itertools.product(*per_dim)}
    return cells


def needed_bytes(
    cells: set[tuple[int, ...]], shape: Sequence[int], dims: list[int], itemsize: int
) -> int:
    """Bytes of ``cells``: each one holds every entry of the dimensions that are not windowed."""
    rest = math.prod(n for d, n in enumerate(shape) if d and d not in dims)
    return len(cells) * rest * itemsize


# -------------------------------------------------------------------- device-side reference
def exchange(
    x: jax.Array, mesh, spec: PartitionSpec, halos: dict[int, tuple[int, str]], pad
) -> jax.Array:
    """The reference: inside ``shard_map``, each dimension in turn gets ``h`` entries of each
    neighbour along its mesh axis by ``ppermute`` (around the ring when periodic, ``pad`` at the
    edges otherwise); the corners follow from doing the dimensions one after the other."""

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec)
    def step(block):
        for dim, (h, boundary) in sorted(halos.items()):
            axis = spec[dim]
            c = mesh.shape[axis]
            index = jax.lax.axis_index(axis)
            ring = boundary == "periodic"
            right = [(i, (i + 1) % c) for i in range(c) if ring or i + 1 < c]
            left = [(i, (i - 1) % c) for i in range(c) if ring or i > 0]
            last = jax.lax.slice_in_dim(block, block.shape[dim] - h, block.shape[dim], axis=dim)
            first = jax.lax.slice_in_dim(block, 0, h, axis=dim)
            from_left = jax.lax.ppermute(last, axis, right)
            from_right = jax.lax.ppermute(first, axis, left)
            if not ring:
                from_left = jnp.where(index == 0, pad, from_left)
                from_right = jnp.where(index == c - 1, pad, from_right)
            block = jnp.concatenate([from_left, block, from_right], axis=dim)
        return block

    return step(x)


class Recording(ArraySource):
    """An in-memory source with ``read_window`` that records each read and the bytes it
    returned, in all (``bytes``) and per leaf (``leaf_bytes``)."""

    def __init__(self, data):
        super().__init__(data)
        self.reads: list[tuple[np.ndarray, dict[Any, Any]]] = []
        self.bytes = 0
        self.leaf_bytes: dict[Any, int] = {}

    def read(self, ids):
        rows = super().read(ids)
        self.reads.append((np.array(ids), dict.fromkeys(rows)))
        self._count(rows)
        return rows

    def read_window(self, ids, columns):
        got = super().read_window(ids, columns)
        self.reads.append((np.array(ids), dict(columns)))
        self._count(got)
        return got

    def clear(self):
        self.reads.clear()
        self.bytes = 0
        self.leaf_bytes = {}

    def _count(self, rows):
        for key, value in rows.items():
            self.bytes += value.nbytes
            self.leaf_bytes[key] = self.leaf_bytes.get(key, 0) + value.nbytes


class RecordingStore:
    """A `TensorStoreSource` behind a counter of the bytes its reads return."""

    def __init__(self, path):
        from psdp.sources import TensorStoreSource

        self.store = TensorStoreSource(path)
        self.reads = 0
        self.bytes = 0

    def __len__(self):
        return len(self.store)

    def read(self, ids):
        rows = self.store.read(ids)
        self.reads += 1
        self.bytes += sum(v.nbytes for v in rows.values())
        return rows

    def read_window(self, ids, columns):
        got = self.store.read_window(ids, columns)
        self.reads += 1
        self.bytes += sum(v.nbytes for v in got.values())
        return got

    def describe(self):
        return "RecordingStore"


# ------------------------------------------------------------------------------ literal answers
def test_widen_periodic_by_hand():
    # 5 entries over 2 shards of 3 (one padding entry), periodic halo 1:
    # wide = [4 | 0 1 2 3 4 | 0] + [pad]; windows [4 0 1 2 3] and [2 3 4 0 pad]
    got = widen(np.arange(5)[None], 1, 2, (1, "periodic"), -1)
    assert got.tolist() == [[4, 0, 1, 2, 3, 2, 3, 4, 0, -1]]


def test_widen_pad_by_hand():
    got = widen(np.arange(4)[None], 1, 2, (1, "pad"), -1)
    assert got.tolist() == [[-1, 0, 1, 2, 1, 2, 3, -1]]


def test_widen_two_dimensions_wraps_the_corners():
    # a 2 x 2 field, one shard per dimension, periodic halo 1 both ways: the corners wrap twice
    field = np.array([[[1, 2], [3, 4]]])
    got = expected_leaf(field, _mesh_1(), PartitionSpec(), {1: (1, "periodic"), 2: (1, "periodic")})
    assert got[0].tolist() == [[4, 3, 4, 3], [2, 1, 2, 1], [4, 3, 4, 3], [2, 1, 2, 1]]


def test_axis_cells_by_hand():
    assert axis_cells(0, 8, 4, (1, "periodic")) == [0, 1, 2, 7]
    assert axis_cells(3, 8, 4, (1, "periodic")) == [0, 5, 6, 7]
    assert axis_cells(0, 8, 4, (1, "pad")) == [0, 1, 2]
    assert axis_cells(3, 9, 4, (1, "periodic")) == [0, 8]  # padding only, and the wrap


def _mesh_1() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]).reshape(1), ("data",))
