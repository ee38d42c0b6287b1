"""A leaf's windows: the host buffers its devices' boxes are views of (``docs/concepts/partitioning.md``).

A leaf is read in *windows* when a dimension after the batch is sharded or has a halo: one window
per distinct box of those dimensions that the host holds, widened by each dimension's halo, whose
entries beyond the domain's edges follow the halo's boundary rule (``pad``, ``periodic`` or
``continue``), and a
dimension its shards do not divide is padded up to the next multiple. Every device box is then a
view of one window's buffer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Self, TypeAlias

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp._checks import check_int
from psdp._plan.mesh import DataPlan, as_layout, plan_pod, spec_axes

#: What lies beyond a domain's edges in a halo: ``pad_value``; the entries of the other end; or the
#: entries that continue the row in the source (entries before 0 and past the end, which a source
#: that stores its rows back to back serves: `TokenSequences`, where they are the neighbouring
#: rows' tokens).
BOUNDARIES = ("pad", "periodic", "continue")

#: The entries of one dimension a read takes: a range, or an index array (a periodic wrap).
Indexer: TypeAlias = "slice | np.ndarray"
#: What a read of a leaf takes beyond its rows: ``None`` (whole rows), a slice of dimension 1, or
#: one `Indexer` per dimension from 1 on (the dimensions after them whole).
Box: TypeAlias = "slice | tuple[slice | np.ndarray, ...] | None"


class AxisHalo(NamedTuple):
    """One dimension's halo: ``width`` entries of each neighbouring shard on each side, and the
    ``boundary`` rule beyond the domain's edges (`BOUNDARIES`).

    Examples:
        >>> AxisHalo(2, "periodic")
        AxisHalo(width=2, boundary='periodic')
    """

    width: int
    boundary: str = "pad"


@dataclass(frozen=True, eq=False)
class AxisWindow:
    """One windowed dimension of a window: the source entries it holds, and the padding around.

    Attributes:
        indices: the source entries of the window's data positions, in order (a periodic halo
            wraps to the other end, so they need not ascend).
        before: positions before them that hold ``pad_value``.
        after: positions after them that hold ``pad_value``.
    """

    indices: np.ndarray
    before: int
    after: int

    @property
    def indexer(self) -> slice | np.ndarray:
        """`indices` as a read takes them: a slice when they are one ascending range."""
        return as_indexer(self.indices)


@dataclass(frozen=True, eq=False)
class Window:
    """One host buffer of a leaf: some batch rows, and which part of each row.

    Attributes:
        rows: the (physical) batch positions the buffer holds, ascending.
        shard: the window's shard index along each windowed dimension (empty for whole rows).
        axes: one `AxisWindow` per windowed dimension (empty for whole rows).
    """

    rows: np.ndarray
    shard: tuple[int, ...] = ()
    axes: tuple[AxisWindow, ...] = ()


@dataclass(frozen=True, eq=False)
class LeafWindows:
    """Everything fixed about one batch leaf on one host: shapes, sharding, plan, windows.

    Examples:
        A sequence sharded over ``model`` with one halo column: each window holds a column shard
        and one column of each neighbour (padded outside the sequence).

        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafWindows.create(mesh, P("data", "model"), (4, 4), np.int32, 0, halo=1)
        >>> [(w.axes[0].indices.tolist(), w.axes[0].before, w.axes[0].after) for w in leaf.windows]
        [([0, 1, 2], 1, 0), ([1, 2, 3], 0, 1)]
        >>> [b[0].tolist() for b in leaf.fill(np.arange(16).reshape(4, 4), pad_value=-1)]
        [[-1, 0, 1, 2], [1, 2, 3, -1]]

        The same with a periodic halo: the first shard's left halo is the sequence's last column.

        >>> leaf = LeafWindows.create(mesh, P("data", "model"), (4, 4), np.int32, 0,
        ...                           halo={1: AxisHalo(1, "periodic")})
        >>> [b[0].tolist() for b in leaf.fill(np.arange(16).reshape(4, 4))]
        [[3, 0, 1, 2], [1, 2, 3, 0]]
    """

    #: the delivered global shape: halos and padding included
    global_shape: tuple[int, ...]
    #: the leaf's shape as the source holds it (the physical batch, then one row's shape)
    source_shape: tuple[int, ...]
    dtype: np.dtype
    #: ``None`` when planned on a `MeshLayout` (no devices: planning only)
    sharding: NamedSharding | None
    #: the plan of the padded domain (no halos): which boxes the host's devices hold
    plan: DataPlan
    windows: tuple[Window, ...]
    #: the dimensions read in windows (sharded after the batch, or with a halo), ascending
    windowed: tuple[int, ...]
    #: the shards of each windowed dimension
    shards: tuple[int, ...]
    #: each windowed dimension's halo (width 0: none)
    halos: tuple[AxisHalo, ...]
    #: (row start, shard tuple) -> (window, row offset in it)
    locate: dict[tuple[int, tuple[int, ...]], tuple[int, int]]

    @classmethod
    def create(
        cls,
        mesh: jax.sharding.Mesh | Any,
        spec: PartitionSpec,
        global_shape: tuple[int, ...],
        dtype: np.dtype | type,
        process_index: int,
        halo: int | Mapping[int, AxisHalo | tuple[int, str] | int] = 0,
        pad_uneven: bool = False,
    ) -> Self:
        """Plans one leaf of (source) global shape ``global_shape`` for ``process_index``.

        ``halo``: an int for dimension 1 (``pad``), or a dict dimension -> `AxisHalo`;
        ``pad_uneven``: pad a dimension after the batch that its shards do not divide up to the
        next multiple (else that is an error); ``mesh``: a `jax.sharding.Mesh`, or a `MeshLayout`
        to plan without devices.

        Raises:
            ValueError: a dimension does not divide into its shards (without ``pad_uneven``), or a
                halo is negative, on a dimension the leaf lacks, or wider than a shard.
        """
        shape = tuple(global_shape)
        halos = _halos_of(halo, shape)
        layout = as_layout(mesh)
        counts = [
            math.prod(layout.axis_sizes[a] for a in axes)
            for axes in spec_axes(layout, spec, len(shape))
        ]
        windowed = tuple(
            d for d in range(1, len(shape)) if counts[d] > 1 or halos.get(d, AxisHalo(0)).width
        )
        padded = tuple(
            -(-n // c) * c if pad_uneven and d else n
            for d, (n, c) in enumerate(zip(shape, counts, strict=True))
        )
        plan = plan_pod(layout, spec, padded).plan(process_index)
        axis_halos = tuple(halos.get(d, AxisHalo(0)) for d in windowed)
        for d, h in zip(windowed, axis_halos, strict=True):
            _check_width(d, h.width, shape[d], counts[d], padded[d] // counts[d])
        widths = [padded[d] // counts[d] for d in windowed]
        windows, locate = _windows(plan, windowed, widths, axis_halos, shape)
        delivered = list(padded)
        for d, w, h in zip(windowed, widths, axis_halos, strict=True):
            delivered[d] = counts[d] * (w + 2 * h.width)
        sharding = NamedSharding(mesh, spec) if isinstance(mesh, jax.sharding.Mesh) else None
        return cls(
            tuple(delivered),
            shape,
            np.dtype(dtype),
            sharding,
            plan,
            windows,
            windowed,
            tuple(counts[d] for d in windowed),
            axis_halos,
            locate,
        )

    def window_shape(self, index: int) -> tuple[int, ...]:
        """The shape of window ``index``'s buffer, halos and padding included."""
        shape = [len(self.windows[index].rows), *self.global_shape[1:]]
        for d, count in zip(self.windowed, self.shards, strict=True):
            shape[d] //= count
        return tuple(shape)

    def box(self, index: int) -> tuple[Indexer, ...]:
        """The source entries window ``index`` holds, one `Indexer` per dimension from 1 up to
        its last windowed one."""
        if not self.windowed:
            return ()
        axes = dict(zip(self.windowed, self.windows[index].axes, strict=True))
        return tuple(
            axes[d].indexer if d in axes else slice(0, self.source_shape[d])
            for d in range(1, self.windowed[-1] + 1)
        )

    def read_shape(self, box: Box, rows: int) -> tuple[int, ...]:
        """The shape of a read of ``rows`` rows of this leaf cut to ``box``."""
        trailing = list(self.source_shape[1:])
        for d, part in enumerate(box_parts(box)):
            if isinstance(part, slice):  # a `continue` halo's range may lie past either end
                start = 0 if part.start is None else part.start
                stop = trailing[d] if part.stop is None else part.stop
                trailing[d] = max(0, stop - start)
            else:
                trailing[d] = len(part)
        return (rows, *trailing)

    def fill(
        self,
        source_rows: np.ndarray,
        pad_value: int | float = 0,
        positions: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Window buffers cut from whole rows of the leaf (its source shape).

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
            out.append(self.pad_window(i, take_box(rows, self.box(i)), pad_value))
        return out

    def pad_window(self, index: int, data: np.ndarray, pad_value: int | float) -> np.ndarray:
        """Window ``index``'s buffer from the entries it reads (a copy only when it has padding)."""
        axes = self.windows[index].axes
        if not any(a.before or a.after for a in axes):
            return data
        buffer = np.full(self.window_shape(index), pad_value, self.dtype)
        inner = [slice(None)] * buffer.ndim
        for d, axis in zip(self.windowed, axes, strict=True):
            inner[d] = slice(axis.before, buffer.shape[d] - axis.after)
        buffer[tuple(inner)] = data
        return buffer

    def place(
        self,
        buffers: list[np.ndarray],
        index: int,
        data: np.ndarray,
        into: Box,
        pad_value: int | float,
        rows: np.ndarray | None = None,
    ) -> None:
        """Writes ``data``, the entries ``into`` of window ``index`` on its rows ``rows`` (their
        positions in the window; ``None``: all), into its buffer in ``buffers``, made the first
        time (``pad_value``): one read of a window that spans several."""
        shape = self.window_shape(index)
        if buffers[index].shape != shape:
            buffers[index] = np.full(shape, pad_value, self.dtype)
        where = [np.arange(n) for n in shape]
        if rows is not None:
            where[0] = rows
        parts = box_parts(into)
        for d, axis in zip(self.windowed, self.windows[index].axes, strict=True):
            where[d] = axis.before + np.arange(len(axis.indices))[parts[d - 1]]
        buffers[index][np.ix_(*where)] = data


def as_indexer(indices: np.ndarray) -> slice | np.ndarray:
    """Source entries as a read takes them: a slice when they are one ascending range.

    Examples:
        >>> as_indexer(np.array([3, 4, 5])), as_indexer(np.array([7, 0, 1])).tolist()
        (slice(3, 6, None), [7, 0, 1])
    """
    start = int(indices[0]) if len(indices) else 0
    if np.array_equal(indices, np.arange(start, start + len(indices))):
        return slice(start, start + len(indices))
    return indices


def box_parts(box: Box) -> tuple[slice | np.ndarray, ...]:
    """A `Box` as one `Indexer` per dimension from 1 on (``None``: none, whole rows)."""
    if box is None:
        return ()
    return box if isinstance(box, tuple) else (box,)


def take_box(rows: np.ndarray, box: Box) -> np.ndarray:
    """``rows`` cut to ``box`` from dimension 1 on: slices are views, index arrays copy.

    Examples:
        >>> rows = np.arange(12).reshape(1, 3, 4)
        >>> take_box(rows, (slice(1, 3), np.array([3, 0]))).tolist()
        [[[7, 4], [11, 8]]]
    """
    parts = box_parts(box)
    out = rows[(slice(None), *(p if isinstance(p, slice) else slice(None) for p in parts))]
    for d, part in enumerate(parts, start=1):
        if not isinstance(part, slice):
            out = np.take(out, part, axis=d)
    return out


def read_box(array: Any, ids: np.ndarray, box: Box) -> np.ndarray:
    """``array[ids]`` cut to ``box``, gathering only the box: what an in-memory source's
    ``read_window`` returns for one leaf.

    Examples:
        >>> grid = np.arange(2 * 4 * 4).reshape(2, 4, 4)
        >>> read_box(grid, np.array([1]), (slice(0, 2), np.array([3, 0]))).tolist()
        [[[19, 16], [23, 20]]]
    """
    parts = box_parts(box)
    sliced = array[(slice(None), *(p if isinstance(p, slice) else slice(None) for p in parts))]
    arrays = tuple(slice(None) if isinstance(p, slice) else p for p in parts)
    return take_box(np.asarray(sliced[ids]), arrays)


def _halos_of(
    halo: int | Mapping[int, AxisHalo | tuple[int, str] | int], shape: tuple[int, ...]
) -> dict[int, AxisHalo]:
    """The per-dimension halos of ``halo`` (an int: dimension 1, ``pad``), checked on ``shape``."""
    if not isinstance(halo, Mapping):
        check_int("halo", halo, minimum=0)
        if halo and len(shape) < 2:
            raise ValueError(
                f"halo={halo} needs a leaf with a sequence dimension (dimension 1), but the leaf "
                f"has shape {shape}; give halos only to (batch, sequence, ...) leaves"
            )
        return {1: AxisHalo(int(halo))} if halo else {}
    out = {}
    for dim, axis in halo.items():
        width, boundary = AxisHalo(*axis) if isinstance(axis, tuple) else AxisHalo(int(axis))
        check_int(f"halo[{dim}]", width, minimum=0)
        if not 1 <= dim < len(shape):
            raise ValueError(
                f"a halo on dimension {dim} needs a leaf with dimensions 1..{dim} after the batch, "
                f"but the leaf has shape {shape}; give halos only to dimensions 1..{len(shape) - 1}"
            )
        if boundary not in BOUNDARIES:
            raise ValueError(f"halo boundary {boundary!r} is not one of {BOUNDARIES}")
        out[dim] = AxisHalo(int(width), boundary)
    return out


def _check_width(dim: int, halo: int, size: int, count: int, width: int) -> None:
    """A halo reaches the neighbouring shards only: at most one shard wide."""
    if halo <= width:
        return
    padded = f" (padded to {width * count})" if size % count else ""
    if dim == 1:
        raise ValueError(
            f"halo={halo} is wider than one sequence shard: {size} columns over {count} shards "
            f"is {width} columns per device{padded}, and a halo may be at most one shard (a "
            f"device's neighbours only); use halo <= {width} or fewer sequence shards"
        )
    raise ValueError(
        f"halo={halo} on dimension {dim} is wider than one shard: {size} entries over {count} "
        f"shards is {width} per device{padded}, and a halo may be at most one shard (a device's "
        f"neighbours only); use a halo <= {width} on dimension {dim} or fewer shards there"
    )


def axis_window(shard: int, width: int, size: int, halo: AxisHalo) -> AxisWindow:
    """Shard ``shard`` of a dimension of ``size`` entries in shards of ``width`` (the last ones
    padded), widened by ``halo``: the source entries it holds and the padding around them.

    Position ``p`` of the window is domain entry ``x = shard * width - h + p``: entry ``x`` if
    ``0 <= x < size``; beyond the edges, within ``h``, ``pad_value`` (``pad``), entry
    ``x mod size`` (``periodic``) or entry ``x`` itself, outside ``[0, size)`` (``continue``: the
    source serves it); past ``size + h`` (an uneven domain's padding), ``pad_value``.

    Examples:
        >>> w = axis_window(0, 3, 5, AxisHalo(1, "periodic"))  # entries 0-2 of 5, one each side
        >>> w.indices.tolist(), w.before, w.after
        ([4, 0, 1, 2, 3], 0, 0)
        >>> w = axis_window(1, 3, 5, AxisHalo(1, "periodic"))  # entries 3-4, padding, halo
        >>> w.indices.tolist(), w.before, w.after
        ([2, 3, 4, 0], 0, 1)
    """
    h = halo.width
    x = np.arange(shard * width - h, (shard + 1) * width + h)
    # a periodic halo holds data as far as h past either edge (x >= -h always)
    data = x < size + h if halo.boundary != "pad" else (x >= 0) & (x < size)
    held = x[data] % size if halo.boundary == "periodic" else x[data]
    before = int(np.argmax(data)) if data.any() else len(x)
    return AxisWindow(held, before, len(x) - before - len(held))


def _windows(
    plan: DataPlan,
    windowed: tuple[int, ...],
    widths: list[int],
    halos: tuple[AxisHalo, ...],
    shape: tuple[int, ...],
) -> tuple[tuple[Window, ...], dict[tuple[int, tuple[int, ...]], tuple[int, int]]]:
    """One window per distinct box of the windowed dimensions the host holds, with the rows
    that hold it (every row when no dimension is windowed)."""
    by_shard: dict[tuple[int, ...], list[slice]] = {}
    for box in plan.blocks:
        shard = tuple(box[d].start // w for d, w in zip(windowed, widths, strict=True))
        by_shard.setdefault(shard, []).append(box[0])
    windows: list[Window] = []
    locate: dict[tuple[int, tuple[int, ...]], tuple[int, int]] = {}
    for shard, all_slices in sorted(by_shard.items()):
        # blocks that differ only in dimensions not windowed hold the same rows: read them once
        row_slices = list({s.start: s for s in all_slices}.values())
        rows = np.concatenate([np.arange(s.start, s.stop) for s in row_slices])
        for s in row_slices:
            locate[(s.start, shard)] = (len(windows), int(np.searchsorted(rows, s.start)))
        axes = tuple(
            axis_window(k, w, shape[d], h)
            for k, d, w, h in zip(shard, windowed, widths, halos, strict=True)
        )
        windows.append(Window(rows, shard, axes))
    return tuple(windows), locate
