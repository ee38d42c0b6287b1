"""The read plan of a windowed leaf (`psdp._plan.reads.plan_reads`) on layouts alone: a host's
reads never overlap and cover exactly the union of its devices' windows, halos included
(``docs/concepts/partitioning.md``: "Each entry is read once per host").

The oracle is a numpy boolean mask of source entries per host, built from each device's mesh
position (JAX's rule: a dimension split over axes ``(a, b)`` is in ``size(a) * size(b)`` shards,
shard ``i_a * size(b) + i_b``) and the documented halo rule, with nothing of psdp's planner.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from psdp._plan.layout import MeshLayout
from psdp._plan.reads import plan_reads
from psdp._plan.windows import BOUNDARIES, AxisHalo, LeafWindows, box_parts


def axes_of(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def shard_of(position: tuple[int, ...], names, sizes, axes) -> tuple[int, int]:
    """(shard index, shard count) of a mesh position along a dimension split over ``axes``."""
    index, count = 0, 1
    for axis in axes:
        k = names.index(axis)
        index, count = index * sizes[k] + position[k], count * sizes[k]
    return index, count


def axis_entries(shard: int, count: int, n: int, halo: AxisHalo) -> np.ndarray:
    """The source entries a device's window holds along one dimension of ``n`` entries
    (docs/concepts/partitioning.md, "Uneven domains": position ``p`` of shard ``k`` is entry
    ``k * ceil(n / C) - h + p``); ``continue`` entries may lie ``h`` beyond either end."""
    w, h = -(-n // count), halo.width
    x = np.arange(shard * w - h, (shard + 1) * w + h)
    if halo.boundary == "pad":
        return x[(x >= 0) & (x < n)]
    held = x[(x >= -h) & (x < n + h)]
    return held % n if halo.boundary == "periodic" else held


def needed(layout, spec, shape, halos, process) -> np.ndarray:
    """Every source entry ``process``'s devices hold; a ``continue`` dimension's mask is
    widened by its halo on both sides (entry ``x`` at index ``x + h``)."""
    names, sizes = layout.axis_names, layout.process_index.shape
    entries = list(spec) + [None] * (len(shape) - len(spec))
    reach = [halos[d].width if d in halos and halos[d].boundary == "continue" else 0
             for d in range(len(shape))]  # fmt: skip
    mask = np.zeros([n + 2 * r for n, r in zip(shape, reach, strict=True)], bool)
    for position in itertools.product(*map(range, sizes)):
        if layout.process_index[position] != process:
            continue
        index = []
        for d, n in enumerate(shape):
            shard, count = shard_of(position, names, sizes, axes_of(entries[d]))
            if d == 0:
                index.append(np.arange(shard * n // count, (shard + 1) * n // count))
                continue
            held = axis_entries(shard, count, n, halos.get(d, AxisHalo(0)))
            index.append(held + reach[d])
        mask[np.ix_(*index)] = True
    return mask


def read_counts(leaf: LeafWindows, halos, shape) -> np.ndarray:
    """How many times the host's planned reads take each source entry (same widening)."""
    reach = [halos[d].width if d in halos and halos[d].boundary == "continue" else 0
             for d in range(len(shape))]  # fmt: skip
    counts = np.zeros([n + 2 * r for n, r in zip(shape, reach, strict=True)], np.int64)
    for request in plan_reads({"x": leaf}):
        parts = box_parts(request.columns["x"])
        index = [request.positions]
        for d in range(1, len(shape)):
            part = parts[d - 1] if d - 1 < len(parts) else slice(0, shape[d])
            if isinstance(part, slice):
                part = np.arange(part.start, part.stop)
            index.append(np.asarray(part) + reach[d])
        np.add.at(counts, np.ix_(*index), 1)
    return counts


@st.composite
def layouts(draw):
    """A mesh of 2-3 axes (at most 16 devices) on up to 4 processes, a 2-D or 3-D leaf, a spec
    (each axis shards one dimension or none), and a halo per dimension after the batch."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=2, max_size=3).filter(
        lambda s: np.prod(s) <= 16))  # fmt: skip
    names = ("a0", "a1", "a2")[: len(sizes)]
    processes = np.array(
        draw(
            st.lists(st.integers(0, 3), min_size=int(np.prod(sizes)), max_size=int(np.prod(sizes)))
        )
    ).reshape(sizes)
    ndim = draw(st.integers(2, 3))
    dims = [draw(st.sampled_from((*range(ndim), None))) for _ in names]
    entries = []
    for d in range(ndim):
        axes = draw(st.permutations([n for n, dd in zip(names, dims, strict=True) if dd == d]))
        entries.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    counts = [int(np.prod([sizes[names.index(a)] for a in axes_of(e)])) for e in entries]
    shape = [counts[0] * draw(st.integers(1, 2))]
    halos = {}
    for d in range(1, ndim):
        n = draw(st.integers(1, 9))
        shape.append(n)
        width = draw(st.integers(0, -(-n // counts[d])))  # at most one shard
        if width:
            halos[d] = AxisHalo(width, draw(st.sampled_from(BOUNDARIES)))
    return MeshLayout(processes, names), P(*entries), tuple(shape), halos


# the case of the defect report: 2 processes x 4 devices, a0=4 x a1=2; host 0 holds rows 0-1 of
# both column shards and rows 2-3 of shard 0 (and rows 4-5 of shard 1): its windows' columns
# [0, 5) and [3, 8) overlap on rows 0-1, which were read twice
ISSUE = (
    MeshLayout(np.array([[0, 0], [0, 1], [1, 0], [1, 1]]), ("a0", "a1")),
    P("a0", None, "a1"),
    (8, 3, 8),
    {2: AxisHalo(1)},
)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(layouts())
@example(ISSUE)
@example((ISSUE[0], ISSUE[1], ISSUE[2], {2: AxisHalo(2, "periodic")}))
@example((ISSUE[0], ISSUE[1], ISSUE[2], {2: AxisHalo(1, "continue"), 1: AxisHalo(1, "pad")}))
def test_a_hosts_reads_never_overlap_and_cover_exactly_its_windows(case):
    layout, spec, shape, halos = case
    for process in np.unique(layout.process_index).tolist():
        leaf = LeafWindows.create(layout, spec, shape, np.int32, process, halos, pad_uneven=True)
        if not leaf.windowed:
            continue
        counts = read_counts(leaf, halos, shape)
        assert counts.max() <= 1, f"process {process}: an entry is read {counts.max()} times"
        want = needed(layout, spec, shape, halos, process)
        assert np.array_equal(counts > 0, want), f"process {process}: reads != its windows"
