"""Read planning: which source reads serve one step (`plan_reads`), where the real rows sit when
only some hosts are fed (`feeding_positions`), and which stream shard a host reads
(`stream_shard`). Pure: no I/O (``docs/concepts/loader.md``, "One step")."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp._plan.leaves import Key
from psdp._plan.mesh import dp_index, uids_of
from psdp._plan.windows import Box, Indexer, LeafWindows, as_indexer


@dataclass
class ReadRequest:
    """One source read per step: batch positions, and per leaf the `Box` to read (``None``:
    whole rows; the value ``read_window`` gets)."""

    positions: np.ndarray
    columns: dict[Key, Box] = field(default_factory=dict)
    entries: list[WindowSlice] = field(default_factory=list)


@dataclass(frozen=True)
class WindowSlice:
    """Where one leaf window's buffer comes from in a request's read."""

    key: Key
    window: int
    rows: np.ndarray | None = None  # which rows of the read, in order; None: all of them
    columns: Box = None  # which entries of the leaf's read (a `Box`); None: all of them
    #: which entries of the window they are (a `Box` of positions after its padding): a window
    #: put together from several reads; None: the whole window
    into: Box = None
    #: which rows of the window they are, in order (a window whose rows other windows share in
    #: part is put together from several reads); None: all of them
    window_rows: np.ndarray | None = None


def plan_reads(leaves: Mapping[Key, LeafWindows]) -> list[ReadRequest]:
    """Groups every leaf window into reads.

    Whole-row leaves share one read (the union of their rows). A windowed leaf's windows on the
    same rows that form a grid (every combination of the shards they hold) are read together,
    and along each dimension their entries that overlap or touch (neighbouring shards, halos
    included; around the ends of a periodic dimension too) merge into one range, so no entry is
    read twice; windows of different leaves on the same rows share a read.

    Examples:
        A ``(B, 8)`` token leaf split over ``context`` with a halo of 1, and a whole-row weight,
        on one process holding every device: one read for the weight, and one for both token
        windows (columns ``[0, 5)`` and ``[3, 8)`` merge into ``[0, 8)``).

        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "context"))
        >>> leaves = {
        ...     "tokens": LeafWindows.create(mesh, P("data", "context"), (8, 8), np.int32, 0, halo=1),
        ...     "w": LeafWindows.create(mesh, P("data"), (8,), np.float32, 0),
        ... }
        >>> [(r.columns, [(e.key, e.window, e.columns) for e in r.entries]) for r in plan_reads(leaves)]
        [({'w': None}, [('w', 0, None)]), ({'tokens': slice(0, 8, None)}, [('tokens', 0, (slice(0, 5, None),)), ('tokens', 1, (slice(3, 8, None),))])]
    """
    whole = {k: leaf.windows[0].rows for k, leaf in leaves.items() if not leaf.windowed}
    requests: list[ReadRequest] = []
    if whole:
        union = np.unique(np.concatenate(list(whole.values())))
        request = ReadRequest(union)
        for key, rows in whole.items():
            request.columns[key] = None
            same = np.array_equal(union, rows)
            request.entries.append(
                WindowSlice(key, 0, None if same else np.searchsorted(union, rows))
            )
        requests.append(request)
    for key, leaf in leaves.items():
        for rows, box, members in window_reads(leaf):
            shared = [
                r
                for r in requests[1 if whole else 0 :]
                if key not in r.columns and np.array_equal(r.positions, rows)
            ]
            request = shared[0] if shared else ReadRequest(rows)
            if not shared:
                requests.append(request)
            request.columns[key] = box[0] if len(box) == 1 and isinstance(box[0], slice) else box
            for index, within, into in members:
                held = leaf.windows[index].rows
                part = None if np.array_equal(held, rows) else np.searchsorted(held, rows)
                request.entries.append(WindowSlice(key, index, None, within, into, part))
    return requests


def feeding_positions(
    processes: Sequence[int],
    specs: dict[Key, PartitionSpec],
    shards: list[int],
    batch_size: int,
    layout: Any,
) -> tuple[int, np.ndarray]:
    """(physical batch size, positions of the real rows) when only ``processes`` are fed.

    A batch shard is fed when a feeding process holds it; each fed shard gets
    ``ceil(B / fed shards)`` positions, the first ``B`` of which (in shard order) are real.

    Examples:
        Host 0 of a non-contiguous 4-host pod holds data rows 0 and 2: 6 rows go 3 and 3 there.

        >>> from jax.sharding import PartitionSpec as P
        >>> from psdp._plan.layout import MeshLayout
        >>> layout = MeshLayout(np.array([[0, 1], [2, 3], [0, 1], [2, 3]]), ("data", "model"))
        >>> size, positions = feeding_positions([0], {"x": P("data")}, [4], 6, layout)
        >>> size, positions.tolist()
        (12, [0, 1, 2, 6, 7, 8])
    """
    index, count = _batch_shard_index(
        specs, layout, "feeding_processes needs", "give every leaf the same batch sharding"
    )
    chosen = sorted({int(layout.check_process(p)) for p in processes})
    if not chosen:
        raise ValueError("feeding_processes is empty; name at least one process, or pass None")
    fed = np.unique(index[np.isin(layout.process_index.ravel(), chosen)])
    per_shard = -(-batch_size // len(fed))
    positions = (fed[:, None] * per_shard + np.arange(per_shard)).ravel()[:batch_size]
    return count * per_shard, positions


def stream_shard(
    specs: dict[Key, PartitionSpec],
    layout: Any,
    process_index: int,
    physical_batch_size: int,
    real_positions: np.ndarray,
) -> tuple[int, int]:
    """(this host's stream shard, the number of shards): one shard per data-shard uid.

    A stream has no global order, so hosts must never need the same batch position from two
    different shards, and every shard must be consumed at the same rate (or hosts would reach its
    end at different steps and hang a pod). Hence the rules, each an error otherwise: every leaf
    splits its batch dimension over the same mesh axes; hosts hold equal or disjoint sets of
    batch shards; and every host reads the same number of real rows per step (a global batch
    divisible by the batch shards, no ``feeding_processes``).

    Examples:
        >>> from jax.sharding import PartitionSpec as P
        >>> from psdp._plan.layout import MeshLayout
        >>> layout = MeshLayout(np.array([[0, 1], [2, 3], [0, 1], [2, 3]]), ("data", "model"))
        >>> [stream_shard({"x": P("data")}, layout, p, 8, np.arange(8)) for p in range(4)]
        [(0, 2), (0, 2), (1, 2), (1, 2)]
    """
    index, count = _batch_shard_index(
        specs,
        layout,
        "a stream needs",
        "a replicated or differently split leaf would need the same stream elements on hosts that "
        "read different stream shards; give every leaf the same batch sharding (e.g. "
        "batch_spec='batch')",
    )
    held = np.zeros((layout.num_processes, count), bool)
    held[layout.ranks.ravel(), index] = True
    real_per_shard = np.bincount(real_positions // (physical_batch_size // count), minlength=count)
    rows = held.astype(np.int64) @ real_per_shard
    if rows.min() != rows.max() or rows.min() == 0:
        raise ValueError(
            f"a stream needs every host to read the same number of real rows per step, but they "
            f"read {sorted(set(rows.tolist()))} (global batch {len(real_positions)} over "
            f"{count} batch shards); use a global_batch_size that is a multiple of {count} and "
            "no feeding_processes, or a random-access source"
        )
    uids = uids_of(held)  # the planner's uids: equal shard sets, equal uid, first-appearance order
    sets = held[np.unique(uids, return_index=True)[1]]
    if (sets.sum(axis=0) > 1).any():
        raise ValueError(
            "hosts hold overlapping but different sets of batch shards, so no stream shard can "
            "serve them; use a random-access source for this layout"
        )
    return int(uids[layout.rank(process_index)]), len(sets)


def _batch_shard_index(
    specs: dict[Key, PartitionSpec], layout: Any, who: str, fix: str
) -> tuple[np.ndarray, int]:
    """Every mesh position's batch-shard index, when all leaves split dimension 0 alike."""
    firsts = {spec[0] if len(spec) else None for spec in specs.values()}
    if len(firsts) != 1 or None in firsts:
        raise ValueError(
            f"{who} every leaf's batch dimension split over the same mesh axes, but the leaves' "
            f"specs are {specs}; {fix}"
        )
    axes: Any = firsts.pop()
    return dp_index(layout, axes)


#: One read of a windowed leaf: (rows, box, [(window, the entries of the read it takes, the
#: positions of its entries they fill)]); ``None`` for all of them.
WindowRead = tuple[np.ndarray, tuple[Indexer, ...], list[tuple[int, Box, Box]]]


def window_reads(leaf: LeafWindows) -> list[WindowRead]:
    """A windowed leaf's reads, each entry of the host's windows read once.

    The host's rows are split into classes of rows held by the same windows (`row_classes`), and
    each class is read apart, so windows whose rows overlap in part never read the shared rows
    twice; a window whose rows span several classes is put together from its pieces. Within a
    class, along each windowed dimension the windows' entries merge into ranges
    (`merged_ranges`); windows in different ranges share no entry and are read apart. Windows in
    the same ranges are read as the boxes of `shard_grids` over the pieces their overlaps cut the
    ranges into: one box when they form a grid (every combination of their shards: the usual
    case), several when they do not (a host holding two diagonal corners of a domain), and a
    window that spans several boxes is put together from its pieces.
    """
    if not leaf.windowed:
        return []
    reads = []
    for rows, members in row_classes([w.rows for w in leaf.windows]):
        per_dim = [
            merged_ranges(
                [leaf.windows[i].axes[axis].indices for i in members],
                leaf.source_shape[d],
                leaf.halos[axis].boundary == "periodic",
                reach(leaf, axis),
            )
            for axis, d in enumerate(leaf.windowed)
        ]
        groups: dict[tuple[int, ...], list[int]] = {}
        for m, index in enumerate(members):
            groups.setdefault(tuple(which[m] for _, which, _ in per_dim), []).append(index)
        for chosen, group in sorted(groups.items()):
            ranges = [per_dim[axis][0][r] for axis, r in enumerate(chosen)]
            reads += _boxes(leaf, rows, group, ranges)
    return reads


def row_classes(held: list[np.ndarray]) -> list[tuple[np.ndarray, list[int]]]:
    """The rows some windows hold (``held[i]``: window ``i``'s rows, ascending), split into
    classes of rows held by the same windows: ``(rows, windows)``, in order of their first window,
    then of their first row.

    Examples:
        Two windows on rows 0-3 and on rows 0, 1, 4, 5: rows 0-1 are both windows', rows 2-3 the
        first's only, rows 4-5 the second's only.

        >>> [(r.tolist(), w) for r, w in row_classes([np.arange(4), np.array([0, 1, 4, 5])])]
        [([0, 1], [0, 1]), ([2, 3], [0]), ([4, 5], [1])]
    """
    rows = np.unique(np.concatenate(held))
    member = np.stack([np.isin(rows, h) for h in held], axis=1)  # row -> the windows holding it
    patterns, first, inverse = np.unique(member, axis=0, return_index=True, return_inverse=True)
    classes = [
        (rows[inverse.ravel() == c], np.flatnonzero(patterns[c]).tolist())
        for c in range(len(patterns))
    ]
    order = sorted(range(len(classes)), key=lambda c: (classes[c][1][0], first[c]))
    return [classes[c] for c in order]


def _boxes(
    leaf: LeafWindows, rows: np.ndarray, group: list[int], ranges: list[np.ndarray]
) -> list[WindowRead]:
    """The reads of windows that share ``ranges`` (one per windowed dimension): each range is cut
    into *atoms*, entries held by the same windows; a window holds a product of atoms, and the
    union of those products splits into disjoint products (`shard_grids`), one box each."""
    atoms, held, place = [], [], []
    for axis, run in enumerate(ranges):
        size, r = leaf.source_shape[leaf.windowed[axis]], reach(leaf, axis)
        where = np.full(size + 2 * r, -1, np.int64)
        where[run + r] = np.arange(len(run))  # an entry's position in its range
        positions = [where[leaf.windows[i].axes[axis].indices + r] for i in group]
        inside = np.zeros((len(run), len(group)), bool)
        for w, held_at in enumerate(positions):
            inside[held_at, w] = True
        _, first, inverse = np.unique(inside, axis=0, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first)] = np.arange(len(first))  # atoms in order along the range
        atom = rank[inverse.ravel()]
        atoms.append(atom)
        held.append([sorted(set(atom[p].tolist())) for p in positions])
        place.append(positions)
    covered = {
        cell
        for w in range(len(group))
        for cell in itertools.product(*(held[axis][w] for axis in range(len(ranges))))
    }
    # a window of an uneven dimension's padding alone (no source entry) reads nothing, but
    # still needs an entry of some read, or its buffer would never be made
    blank = [w for w in range(len(group)) if not all(len(p[w]) for p in place)]
    n_rows = [len(leaf.windows[index].rows) for index in group]
    reads = []
    for grid in sorted(shard_grids(covered), key=min) if covered else [set()]:
        keep = [np.isin(atoms[a], sorted({cell[a] for cell in grid})) for a in range(len(ranges))]
        axes = {d: ranges[a][keep[a]] for a, d in enumerate(leaf.windowed)}
        box = tuple(
            as_indexer(axes[d]) if d in axes else slice(0, leaf.source_shape[d])
            for d in range(1, leaf.windowed[-1] + 1)
        )
        in_box = [np.cumsum(k) - 1 for k in keep]
        entries: list[tuple[int, Box, Box]] = []
        for w, index in enumerate(group):
            mine = [keep[a][place[a][w]] for a in range(len(ranges))]
            if not all(m.any() for m in mine):
                continue
            read = [in_box[a][place[a][w][m]] for a, m in enumerate(mine)]
            window = [np.flatnonzero(m) for m in mine]
            whole_window = all(m.all() for m in mine)
            whole_read = whole_window and all(
                np.array_equal(r, np.arange(len(axes[d])))
                for r, d in zip(read, leaf.windowed, strict=True)
            )
            entries.append(
                (
                    index,
                    None if whole_read else _parts(leaf, read),
                    # a window with rows in other reads too is put together from its pieces
                    None if whole_window and len(rows) == n_rows[w] else _parts(leaf, window),
                )
            )
        reads.append((rows, box, entries))
    nothing = _parts(leaf, [np.zeros(0, np.int64)] * len(ranges))
    reads[0][2].extend((group[w], nothing, nothing) for w in blank)
    return reads


def _parts(leaf: LeafWindows, positions: list[np.ndarray]) -> tuple[Indexer, ...]:
    """Positions along each windowed dimension as a `Box` (the dimensions between them whole)."""
    by_dim = dict(zip(leaf.windowed, positions, strict=True))
    return tuple(
        as_indexer(by_dim[d]) if d in by_dim else slice(None)
        for d in range(1, leaf.windowed[-1] + 1)
    )


def shard_grids(shards: set[tuple[int, ...]]) -> list[set[tuple[int, ...]]]:
    """``shards`` split into disjoint grids: sets that hold every combination of their shard
    indices (a product), so each grid's windows are one box.

    Examples:
        >>> [sorted(g) for g in shard_grids({(0, 0), (0, 1), (1, 0), (1, 1)})]  # a whole grid
        [[(0, 0), (0, 1), (1, 0), (1, 1)]]
        >>> sorted(map(sorted, shard_grids({(0, 0), (1, 1)})))  # a diagonal: two grids
        [[(0, 0)], [(1, 1)]]
    """
    if not shards or not next(iter(shards)):
        return [shards]
    rest_of: dict[int, set[tuple[int, ...]]] = {}
    for shard in shards:
        rest_of.setdefault(shard[0], set()).add(shard[1:])
    firsts_of: dict[frozenset[tuple[int, ...]], list[int]] = {}
    for first, rest in sorted(rest_of.items()):
        firsts_of.setdefault(frozenset(rest), []).append(first)
    return [
        {(first, *r) for first in firsts for r in sub}
        for rest, firsts in firsts_of.items()
        for sub in shard_grids(set(rest))
    ]


def reach(leaf: LeafWindows, axis: int) -> int:
    """How far the entries of windowed dimension ``axis`` may lie outside ``[0, size)``: the
    halo's width for the ``continue`` boundary (the source serves them), else 0."""
    halo = leaf.halos[axis]
    return halo.width if halo.boundary == "continue" else 0


def merged_ranges(
    held: list[np.ndarray], size: int, periodic: bool, reach: int = 0
) -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """Merges the entries some windows hold along one dimension of ``size`` entries into ranges.

    Entries that overlap or touch merge; on a ``periodic`` dimension the range that ends at the
    last entry and the one that starts at entry 0 merge too (read as one index array). Entries
    may lie ``reach`` beyond either end (a ``continue`` halo).

    Returns:
        ``(ranges, range of each window, positions of each window's entries in its range)``.

    Examples:
        Shards 0 and 3 of 4 of 8 entries with a periodic halo of 1: one range, wrapping.

        >>> ranges, which, within = merged_ranges([np.array([7, 0, 1, 2]), np.array([5, 6, 7, 0])], 8, True)
        >>> [r.tolist() for r in ranges], which, [w.tolist() for w in within]
        ([[5, 6, 7, 0, 1, 2]], [0, 0], [[2, 3, 4, 5], [0, 1, 2, 3]])
    """
    covered = np.zeros(size + 2 * reach, bool)
    for entries in held:
        covered[entries + reach] = True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))) - reach
    runs = [np.arange(a, b) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    if periodic and len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == size - 1:
        runs = [np.concatenate((runs[-1], runs[0])), *runs[1:-1]]
    runs = runs or [np.arange(0)]
    range_of = np.zeros(size + 2 * reach, np.int64)
    position = np.zeros(size + 2 * reach, np.int64)
    for r, entries in enumerate(runs):
        range_of[entries + reach], position[entries + reach] = r, np.arange(len(entries))
    which = [int(range_of[e[0] + reach]) if len(e) else 0 for e in held]
    return runs, which, [position[e + reach] for e in held]
