"""Read planning: which source reads serve one step (`plan_reads`), where the real rows sit when
only some hosts are fed (`feeding_positions`), and which stream shard a host reads
(`stream_shard`). Pure: no I/O (``docs/loader.md``, "One step")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp._plan.leaves import Key
from psdp._plan.mesh import dp_index, uids_of
from psdp._plan.windows import LeafWindows


@dataclass
class ReadRequest:
    """One source read per step: batch positions, and per leaf the columns to read."""

    positions: np.ndarray
    columns: dict[Key, slice | None] = field(default_factory=dict)
    entries: list[WindowSlice] = field(default_factory=list)


@dataclass(frozen=True)
class WindowSlice:
    """Where one leaf window's buffer comes from in a request's read."""

    key: Key
    window: int
    rows: np.ndarray | None = None  # which rows of the read, in order; None: all of them
    columns: slice | None = None  # which columns of the leaf's read; None: all of them


def plan_reads(leaves: Mapping[Key, LeafWindows]) -> list[ReadRequest]:
    """Groups every leaf window into reads.

    Whole-row leaves share one read (the union of their rows). A sequence-sharded leaf's windows
    on the same rows whose columns overlap or touch (a host holding neighbouring shards, halos
    included) merge into one read of their column span, so no column is read twice; windows of
    different leaves on the same rows share a read.

    Example:
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
        [({'w': None}, [('w', 0, None)]), ({'tokens': slice(0, 8, None)}, [('tokens', 0, slice(0, 5, None)), ('tokens', 1, slice(3, 8, None))])]
    """
    whole = {k: leaf.windows[0].rows for k, leaf in leaves.items() if not leaf.column_shards}
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
        for rows, span, members in _column_runs(leaf):
            shared = [
                r
                for r in requests[1 if whole else 0 :]
                if key not in r.columns and np.array_equal(r.positions, rows)
            ]
            request = shared[0] if shared else ReadRequest(rows)
            if not shared:
                requests.append(request)
            request.columns[key] = span
            for index, columns in members:
                whole_span = columns == slice(0, span.stop - span.start)
                request.entries.append(
                    WindowSlice(key, index, None, None if whole_span else columns)
                )
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

    Example:
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

    Example:
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


def _column_runs(
    leaf: LeafWindows,
) -> list[tuple[np.ndarray, slice, list[tuple[int, slice]]]]:
    """A leaf's column windows as reads: (rows, column span, [(window, columns within span)])."""
    if not leaf.column_shards:
        return []
    by_rows: list[tuple[np.ndarray, list[int]]] = []
    for index, window in enumerate(leaf.windows):
        same = [members for rows, members in by_rows if np.array_equal(rows, window.rows)]
        if same:
            same[0].append(index)
        else:
            by_rows.append((window.rows, [index]))
    runs: list[tuple[np.ndarray, slice, list[int]]] = []
    for rows, members in by_rows:
        for index in sorted(members, key=lambda i: _columns(leaf, i).start):
            columns = _columns(leaf, index)
            if runs and runs[-1][0] is rows and columns.start <= runs[-1][1].stop:
                span = runs[-1][1]
                runs[-1] = (rows, slice(span.start, max(span.stop, columns.stop)), runs[-1][2])
                runs[-1][2].append(index)
            else:
                runs.append((rows, columns, [index]))
    return [
        (rows, span, [(i, _shift(_columns(leaf, i), -span.start)) for i in members])
        for rows, span, members in runs
    ]


def _columns(leaf: LeafWindows, index: int) -> slice:
    columns = leaf.windows[index].columns
    assert columns is not None  # column-mode windows always name their columns
    return columns


def _shift(columns: slice, by: int) -> slice:
    return slice(columns.start + by, columns.stop + by)
