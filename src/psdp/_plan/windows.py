"""A leaf's windows: the host buffers its devices' boxes are views of (``docs/partitioning.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp._checks import check_int
from psdp._plan.mesh import DataPlan, plan_pod


@dataclass(frozen=True)
class Window:
    """One host buffer of a leaf: some batch rows, and which source columns they hold.

    Attributes:
        rows: the (physical) batch positions the buffer holds, ascending.
        columns: the source columns to read (already clipped to the sequence), or ``None`` for
            whole rows.
        pad_before: halo columns before ``columns`` that lie outside the sequence (pad-filled).
        pad_after: the same after ``columns``.
    """

    rows: np.ndarray
    columns: slice | None = None
    pad_before: int = 0
    pad_after: int = 0


@dataclass(frozen=True, eq=False)
class LeafWindows:
    """Everything fixed about one batch leaf on one host: global shape, sharding, plan, windows.

    Example:
        A sequence sharded over ``model`` with one halo column: each window holds a column shard
        and one column of each neighbour (padded outside the sequence).

        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafWindows.create(mesh, P("data", "model"), (4, 4), np.int32, 0, halo=1)
        >>> [(w.columns, w.pad_before, w.pad_after) for w in leaf.windows]
        [(slice(0, 3, None), 1, 0), (slice(1, 4, None), 0, 1)]
        >>> [b[0].tolist() for b in leaf.fill(np.arange(16).reshape(4, 4), pad_value=-1)]
        [[-1, 0, 1, 2], [1, 2, 3, -1]]
    """

    global_shape: tuple[int, ...]
    dtype: np.dtype
    sharding: NamedSharding
    plan: DataPlan
    windows: tuple[Window, ...]
    halo: int
    column_shards: int  # C: shards of dimension 1 in column mode, 0 for whole rows
    locate: dict[tuple[int, int], tuple[int, int]]  # (row start, column shard) -> (window, offset)

    @classmethod
    def create(
        cls,
        mesh: jax.sharding.Mesh,
        spec: PartitionSpec,
        global_shape: tuple[int, ...],
        dtype: np.dtype | type,
        process_index: int,
        halo: int = 0,
    ) -> Self:
        """Plans one leaf of (unhaloed) global shape ``global_shape`` for ``process_index``.

        Raises:
            ValueError: a dimension does not divide into its shards, or the halo is negative,
                given for a 1-D leaf, or wider than a column shard.
        """
        check_int("halo", halo, minimum=0)
        shape = tuple(global_shape)
        plan = plan_pod(mesh, spec, shape).plan(process_index)
        column_mode = len(shape) >= 2 and (halo > 0 or _is_sharded(plan, 1))
        if halo and len(shape) < 2:
            raise ValueError(
                f"halo={halo} needs a leaf with a sequence dimension (dimension 1), but the leaf "
                f"has shape {shape}; give halos only to (batch, sequence, ...) leaves"
            )
        if not column_mode:
            offsets = {int(r): i for i, r in enumerate(plan.rows.tolist())}
            locate = {(b[0].start, 0): (0, offsets[b[0].start]) for b in plan.blocks}
            sharding = NamedSharding(mesh, spec)
            whole = (Window(plan.rows),)
            return cls(shape, np.dtype(dtype), sharding, plan, whole, 0, 0, locate)
        width = plan.blocks[0][1].stop - plan.blocks[0][1].start
        shards = shape[1] // width
        if halo > width:
            raise ValueError(
                f"halo={halo} is wider than one sequence shard: {shape[1]} columns over {shards} "
                f"shards is {width} columns per device, and a halo may be at most one shard (a "
                f"device's neighbours only); use halo <= {width} or fewer sequence shards"
            )
        windows, locate = _column_windows(plan, width, halo, shape[1])
        haloed = (shape[0], shards * (width + 2 * halo), *shape[2:])
        sharding = NamedSharding(mesh, spec)
        return cls(haloed, np.dtype(dtype), sharding, plan, windows, halo, shards, locate)

    def window_shape(self, index: int) -> tuple[int, ...]:
        """The shape of window ``index``'s buffer, halo columns included."""
        rows = len(self.windows[index].rows)
        if not self.column_shards:
            return (rows, *self.global_shape[1:])
        return (rows, self.global_shape[1] // self.column_shards, *self.global_shape[2:])

    def fill(
        self,
        source_rows: np.ndarray,
        pad_value: int | float = 0,
        positions: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Window buffers cut from whole rows of the leaf (its unhaloed shape).

        ``source_rows[i]`` is batch position ``i``, or ``positions[i]`` (ascending) when given,
        e.g. a host's own rows in ``plan.rows`` order; a window holding exactly those rows is a
        view of ``source_rows``.
        """
        out = []
        for i, window in enumerate(self.windows):
            if positions is None:
                rows = source_rows[window.rows]
            elif np.array_equal(positions, window.rows):
                rows = source_rows
            else:
                rows = source_rows[np.searchsorted(positions, window.rows)]
            if window.columns is not None:
                rows = rows[:, window.columns]
            out.append(self.pad_columns(i, rows, pad_value))
        return out

    def pad_columns(self, index: int, rows: np.ndarray, pad_value: int | float) -> np.ndarray:
        """Adds window ``index``'s out-of-sequence halo columns (a copy only when there are any)."""
        window = self.windows[index]
        if not (window.pad_before or window.pad_after):
            return rows
        buffer = np.full(self.window_shape(index), pad_value, self.dtype)
        buffer[:, window.pad_before : buffer.shape[1] - window.pad_after] = rows
        return buffer


def _is_sharded(plan: DataPlan, dim: int) -> bool:
    box = plan.blocks[0][dim]
    return box.stop - box.start < plan.global_shape[dim]


def _column_windows(
    plan: DataPlan, width: int, halo: int, length: int
) -> tuple[tuple[Window, ...], dict[tuple[int, int], tuple[int, int]]]:
    """One window per distinct column shard the host holds, with the rows that hold it."""
    by_shard: dict[int, list[slice]] = {}
    for box in plan.blocks:
        by_shard.setdefault(box[1].start // width, []).append(box[0])
    windows: list[Window] = []
    locate: dict[tuple[int, int], tuple[int, int]] = {}
    for shard, all_slices in sorted(by_shard.items()):
        # blocks that differ only beyond dimension 1 hold the same rows: read them once
        row_slices = list({s.start: s for s in all_slices}.values())
        rows = np.concatenate([np.arange(s.start, s.stop) for s in row_slices])
        for s in row_slices:
            locate[(s.start, shard)] = (len(windows), int(np.searchsorted(rows, s.start)))
        first, last = shard * width - halo, (shard + 1) * width + halo
        windows.append(
            Window(
                rows, slice(max(first, 0), min(last, length)), max(-first, 0), max(last - length, 0)
            )
        )
    return tuple(windows), locate
