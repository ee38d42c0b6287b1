"""The pure planner: which rows (and columns) each host reads, and which hosts read the same.

Everything is numpy over a `MeshLayout`, for all devices at once. Why reading the union of a
host's device boxes is necessary and sufficient, and why equal sets of box ids mean equal data:
``docs/concepts/mesh.md``, "Why the plan is right".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from psdp._checks import is_int
from psdp._plan.layout import MeshLayout

if TYPE_CHECKING:
    import jax
    from jax.sharding import PartitionSpec

MeshLike: TypeAlias = "jax.sharding.Mesh | MeshLayout"
AxisNames: TypeAlias = "str | Sequence[str]"


def as_layout(mesh_or_layout: Any) -> MeshLayout:
    """Returns the `MeshLayout` of a live `jax.sharding.Mesh`, or the layout itself."""
    if isinstance(mesh_or_layout, MeshLayout):
        return mesh_or_layout
    if hasattr(mesh_or_layout, "devices") and hasattr(mesh_or_layout, "axis_names"):
        return MeshLayout.from_mesh(mesh_or_layout)
    raise TypeError(
        f"expected a jax.sharding.Mesh or a psdp.MeshLayout, got {type(mesh_or_layout).__name__}"
    )


def _current_process(process_index: int | None) -> int:
    if process_index is not None:
        return process_index
    import jax

    return jax.process_index()


# ------------------------------------------------------------------------------- index maths
def _names(value: Any) -> tuple[str, ...] | None:
    """``value`` as a tuple of axis names (one name, or a sequence of names); None if it is not."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(a, str) for a in value):
        return tuple(value)
    return None


def axes_of(entry: Any) -> tuple[str, ...]:
    """The mesh axes one spec entry names: the one normaliser of axis names.

    Examples:
        >>> axes_of(None), axes_of("data"), axes_of(("replica", "data"))
        ((), ('data',), ('replica', 'data'))
    """
    names = () if entry is None else _names(entry)
    if names is None:
        raise ValueError(
            f"partition spec entry {entry!r} is not supported; use None, an axis name, or a tuple "
            "of axis names"
        )
    return names


def spec_entry(axes: Sequence[str]) -> str | tuple[str, ...] | None:
    """The spec entry that splits one dimension over ``axes``, major to minor: `axes_of` reversed.

    Examples:
        >>> spec_entry(()), spec_entry(["data"]), spec_entry(["replica", "data"])
        (None, 'data', ('replica', 'data'))
    """
    axes = tuple(axes)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def batch_axes_of(batch_axes: AxisNames) -> tuple[str, ...]:
    """``batch_axes`` (a name or a sequence of names) as a tuple of distinct names.

    Examples:
        >>> batch_axes_of("data"), batch_axes_of(["replica", "data"])
        (('data',), ('replica', 'data'))
    """
    axes = _names(batch_axes)
    if not axes:
        raise ValueError(
            f"batch_axes must be an axis name or a non-empty sequence of axis names, got "
            f"{batch_axes!r}"
        )
    if len(set(axes)) != len(axes):
        raise ValueError(f"batch_axes {axes} names an axis twice")
    return axes


def spec_axes(layout: MeshLayout, spec: Any, ndim: int) -> tuple[tuple[str, ...], ...]:
    """Normalises a spec to one tuple of axis names per leaf dimension, checking it on the mesh.

    Examples:
        >>> layout = MeshLayout.contiguous({"data": 2, "context": 2}, num_processes=1)
        >>> spec_axes(layout, ("data",), 2), spec_axes(layout, "data", 1)
        ((('data',), ()), (('data',),))
    """
    entries = (spec,) if isinstance(spec, str) else tuple(spec)  # "data" means P("data")
    if len(entries) > ndim:
        raise ValueError(
            f"partition spec {spec} has {len(entries)} entries but the leaf has only {ndim} "
            "dimensions; drop the extra entries"
        )
    per_dim = tuple(axes_of(e) for e in entries) + ((),) * (ndim - len(entries))
    seen: list[str] = []
    for axes in per_dim:
        for name in axes:
            layout.axis_index(name)  # raises with the mesh's axes
            if name in seen:
                raise ValueError(
                    f"mesh axis {name!r} appears twice in partition spec {spec}; a mesh axis can "
                    "shard at most one dimension once"
                )
            seen.append(name)
    return per_dim


def _shard_index(layout: MeshLayout, axes: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """Each position's shard index along ``axes`` (major to minor) and the number of shards."""
    coords = np.indices(layout.shape).reshape(len(layout.shape), -1)
    index = np.zeros(layout.num_devices, np.int64)
    count = 1
    for name in axes:
        dim = layout.axis_index(name)
        index = index * layout.shape[dim] + coords[dim]
        count *= layout.shape[dim]
    return index, count


def _describe_axes(layout: MeshLayout, axes: tuple[str, ...]) -> str:
    return " x ".join(f"{a}={layout.axis_sizes[a]}" for a in axes)


def dp_index(layout: MeshLayout, batch_axes: AxisNames) -> tuple[np.ndarray, int]:
    """The DP index of every mesh position (flattened row-major) and the number of DP shards.

    Examples:
        >>> layout = MeshLayout.contiguous({"data": 2, "model": 2}, num_processes=2)
        >>> dp, count = dp_index(layout, "data")
        >>> dp.tolist(), count
        ([0, 0, 1, 1], 2)
    """
    return _shard_index(layout, batch_axes_of(batch_axes))


# ------------------------------------------------------------------------------ uid tables
def _held_sets(procs: np.ndarray, keys: np.ndarray, num_processes: int) -> np.ndarray:
    """Row ``p`` lists the distinct keys process ``p`` holds, ascending, padded with -1."""
    span = int(keys.max()) + 1
    pairs = np.unique(procs * span + keys)
    owner, key = np.divmod(pairs, span)
    counts = np.bincount(owner, minlength=num_processes)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    held = np.full((num_processes, int(counts.max())), -1, np.int64)
    held[owner, np.arange(pairs.size) - first[owner]] = key
    return held


def uids_of(held: np.ndarray) -> np.ndarray:
    """Equal rows of ``held`` get equal uids, numbered by first appearance (process order)."""
    _, first, inverse = np.unique(held, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.ravel()]


def local_device_mapping(
    mesh_or_layout: MeshLike, batch_axes: AxisNames, process_index: int | None = None
) -> dict[int, int]:
    """DP index -> local slot, for the DP indices this process's devices hold.

    Slots are numbered in increasing DP order, so slot ``k`` of the host's batch buffer holds the
    rows of the ``k``-th smallest DP index the host holds.

    Args:
        mesh_or_layout: a live `jax.sharding.Mesh` or a `MeshLayout`.
        batch_axes: the batch axes, in the order the batch spec names them.
        process_index: the process to plan for; defaults to ``jax.process_index()``.

    Examples:
        The example pod of ``docs/concepts/mesh.md`` (4 hosts x 4 devices on ``data=4 x model=4``,
        each host folded across two data rows): host 0 holds data rows 0 and 3.

        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> local_device_mapping(layout, "data", process_index=0)
        {0: 0, 3: 1}
    """
    layout = as_layout(mesh_or_layout)
    p = layout.check_process(_current_process(process_index))
    dp, _ = dp_index(layout, batch_axes)
    held = np.unique(dp[layout.process_index.ravel() == p])
    return {int(d): slot for slot, d in enumerate(held.tolist())}


def process_mesh_mapping(mesh_or_layout: MeshLike, batch_axes: AxisNames) -> dict[int, int]:
    """Process -> data-shard uid; processes whose devices hold the same DP indices share a uid.

    Uids are numbered ``0..U-1`` in order of first appearance by process index. Processes with the
    same uid must be fed identical data; different uids disjoint data.

    Examples:
        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> process_mesh_mapping(layout, "data")
        {0: 0, 1: 0, 2: 1, 3: 1}
    """
    layout = as_layout(mesh_or_layout)
    dp, _ = dp_index(layout, batch_axes)
    uids = uids_of(_held_sets(layout.ranks.ravel(), dp, layout.num_processes))
    return dict(zip(layout.processes, uids.tolist(), strict=True))


# ---------------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class RowBlock:
    """A contiguous block of global rows a host reads, and which columns of them.

    Adjacent blocks with the same columns are merged, so one block is one contiguous read.
    ``columns`` lists merged, ascending column ranges of dimension 1, or is ``None`` when whole rows
    are read (dimension 1 unsharded, or a 1-D leaf).
    """

    rows: slice
    columns: tuple[slice, ...] | None


@dataclass(frozen=True, eq=False)
class DataPlan:
    """What one process must read for one batch leaf: the answer to "what does this host read".

    Attributes:
        process_index: the process this plan is for.
        uid: its data-shard uid; processes with equal uids hold exactly the same data.
        num_uids: the number of distinct uids in the pod.
        global_shape: the leaf's global shape.
        device_positions: flat (row-major) mesh positions of this process's devices.
        device_indices: for each of those devices, its box as a tuple of ``slice(start, stop)``,
            one per leaf dimension: the same boxes as JAX's ``devices_indices_map``.
        blocks: the distinct boxes this process holds (replicas counted once), sorted.
        rows: sorted global row ids this process must hold: the union over its devices.
        row_blocks: the same rows as contiguous blocks, each with the column ranges to read.
    """

    process_index: int
    uid: int
    num_uids: int
    global_shape: tuple[int, ...]
    device_positions: np.ndarray
    device_indices: tuple[tuple[slice, ...], ...]
    blocks: tuple[tuple[slice, ...], ...]
    rows: np.ndarray
    row_blocks: tuple[RowBlock, ...]

    @property
    def num_elements(self) -> int:
        """Elements this process reads: the size of ``U(p)``."""
        return sum(math.prod(s.stop - s.start for s in box) for box in self.blocks)


@dataclass(frozen=True, eq=False)
class PodPlan:
    """The whole pod's plan for one leaf: every device's box, every process's uid.

    Computed once (vectorised) and queried per process with `plan`; `plan_batch` is
    ``plan_pod(...).plan(p)``.
    """

    layout: MeshLayout
    global_shape: tuple[int, ...]
    starts: np.ndarray  # (num_devices, ndim) first index of each device's box
    sizes: tuple[int, ...]  # box extent per dimension
    uids: np.ndarray  # (num_processes,): one per process of the mesh, in `processes` order

    @property
    def num_uids(self) -> int:
        return int(self.uids.max()) + 1

    def uid_table(self) -> dict[int, int]:
        """Process -> uid."""
        return dict(zip(self.layout.processes, self.uids.tolist(), strict=True))

    def plan(self, process_index: int) -> DataPlan:
        """The `DataPlan` of one process."""
        p = self.layout.check_process(process_index)
        positions = np.flatnonzero(self.layout.process_index.ravel() == p)
        starts = self.starts[positions]
        boxes = tuple(_box(row, self.sizes) for row in starts.tolist())
        distinct = np.unique(starts, axis=0)
        row_starts = np.unique(distinct[:, 0])
        rows = (row_starts[:, None] + np.arange(self.sizes[0])).ravel()
        return DataPlan(
            process_index=p,
            uid=int(self.uids[self.layout.rank(p)]),
            num_uids=self.num_uids,
            global_shape=self.global_shape,
            device_positions=positions,
            device_indices=boxes,
            blocks=tuple(_box(row, self.sizes) for row in distinct.tolist()),
            rows=rows,
            row_blocks=_row_blocks(distinct, self.sizes, self.global_shape),
        )


def _box(starts: list[int], sizes: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _row_blocks(
    distinct: np.ndarray, sizes: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[RowBlock, ...]:
    """Adjacent row blocks with the same columns merge, so each block is one read."""
    whole_rows = len(shape) < 2 or sizes[1] == shape[1]
    blocks: list[RowBlock] = []
    for row_start in np.unique(distinct[:, 0]).tolist():
        columns = None
        if not whole_rows:
            starts = distinct[distinct[:, 0] == row_start, 1].tolist()
            columns = tuple(
                slice(a, b) for a, b in merge_ranges([(s, s + sizes[1]) for s in starts])
            )
        if blocks and blocks[-1].rows.stop == row_start and blocks[-1].columns == columns:
            blocks[-1] = RowBlock(slice(blocks[-1].rows.start, row_start + sizes[0]), columns)
        else:
            blocks.append(RowBlock(slice(row_start, row_start + sizes[0]), columns))
    return tuple(blocks)


def plan_pod(
    mesh_or_layout: MeshLike, spec: PartitionSpec | Sequence[Any], global_shape: Sequence[int]
) -> PodPlan:
    """Plans one batch leaf for every process of the pod at once.

    Args:
        mesh_or_layout: a live `jax.sharding.Mesh` or a `MeshLayout`.
        spec: the leaf's `PartitionSpec` (or any sequence of spec entries).
        global_shape: the leaf's global shape; every sharded dimension must divide evenly.

    Examples:
        >>> from jax.sharding import PartitionSpec as P
        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> pod = plan_pod(layout, P("data"), (16, 8))
        >>> pod.uid_table(), pod.num_uids
        ({0: 0, 1: 0, 2: 1, 3: 1}, 2)
    """
    layout = as_layout(mesh_or_layout)
    shape = _checked_shape(global_shape)
    per_dim = spec_axes(layout, spec, len(shape))
    starts = np.zeros((layout.num_devices, len(shape)), np.int64)
    sizes = []
    block_ids = np.zeros(layout.num_devices, np.int64)
    for dim, axes in enumerate(per_dim):
        index, count = _shard_index(layout, axes)
        if shape[dim] % count:
            raise ValueError(_indivisible(dim, shape[dim], count, _describe_axes(layout, axes)))
        size = shape[dim] // count
        starts[:, dim] = index * size
        sizes.append(size)
        block_ids = block_ids * count + index
    held = _held_sets(layout.ranks.ravel(), block_ids, layout.num_processes)
    return PodPlan(layout, shape, starts, tuple(sizes), uids_of(held))


def plan_batch(
    mesh_or_layout: MeshLike,
    spec: PartitionSpec | Sequence[Any],
    global_shape: Sequence[int],
    process_index: int | None = None,
) -> DataPlan:
    """What one process must read for one batch leaf.

    Args:
        mesh_or_layout: a live `jax.sharding.Mesh` or a `MeshLayout`.
        spec: the leaf's `PartitionSpec`; dimension 0 is the batch, dimension 1 (if sharded, e.g.
            over a ``context`` axis) gives column ranges.
        global_shape: the leaf's global shape.
        process_index: the process to plan for; defaults to ``jax.process_index()``.

    Examples:
        A ``data=4 x model=2`` mesh on 4 hosts, batch of 16 rows: host 2 holds data row 2 (rows
        8..11) on both of its devices, and shares it with no other host.

        >>> from jax.sharding import PartitionSpec as P
        >>> layout = MeshLayout.contiguous({"data": 4, "model": 2}, num_processes=4)
        >>> plan = plan_batch(layout, P("data"), (16, 128), process_index=2)
        >>> plan.rows.tolist(), plan.uid, plan.num_uids
        ([8, 9, 10, 11], 2, 4)
        >>> plan.row_blocks
        (RowBlock(rows=slice(8, 12, None), columns=None),)
    """
    pod = plan_pod(mesh_or_layout, spec, global_shape)
    return pod.plan(_current_process(process_index))


def _indivisible(dim: int, size: int, count: int, axes: str) -> str:
    """The error for a dimension its shards do not divide, with a fix that fits the dimension."""
    rule = (
        f"dimension {dim} of size {size} is not divisible by its {count} shards ({axes}), and "
        "every shard must hold the same number of entries"
    )
    if dim == 0:  # the batch: the DataLoader pads it to a multiple and masks the padding
        return f"{rule}; use a batch that is a multiple of {count}, or pad it and mask the padding"
    below, above = size // count * count, -(-size // count) * count
    sizes = f"{below} or {above}" if below else f"{above}"
    return (
        f"{rule}; make dimension {dim} of every row a multiple of {count} (e.g. {sizes}: cut or "
        f"pad each row, e.g. a sequence length that divides into the {count} shards), or split "
        f"dimension {dim} over fewer mesh axes in its spec (or none)"
    )


def _checked_shape(global_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(global_shape)
    if not shape or not all(is_int(n) and n >= 1 for n in shape):
        raise ValueError(
            f"global_shape must be a non-empty sequence of positive ints, got {global_shape!r}"
        )
    return tuple(int(n) for n in shape)
