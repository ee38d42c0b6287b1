"""Assembly: from a host's buffers to one global `jax.Array` per batch leaf.

Mental model: the planner gives this host the distinct boxes its devices hold (``plan.blocks``).
The host reads them into a few buffers, its *windows*; every local device's box is then a *view*
of a window. Small batches go through ``jax.make_array_from_callback`` (device by device); from
`BATCHED_PUT_MIN_BYTES` on, all the views go to their devices in one batched ``jax.device_put`` and
``jax.make_array_from_single_device_arrays`` makes the global array. The results are identical;
on this machine's CPU devices the batched call has a fixed cost of about 0.1 ms that makes it 1.1-4x
slower below 1 MiB and 1.05-1.5x faster from 16 MiB (``docs/performance.md``, figure 1). The buffers are laid out by the plan, not by device order, so replicas of a box (a
tensor-parallel group) share one buffer region, and a host never reads what it does not hold.

- Whole rows (dimension 1 unsharded, the usual case): one window, the host's rows
  ``plan.rows`` in ascending order, whole.
- Column windows (dimension 1 sharded, e.g. ``P("data", "context")``, or a halo): one window per
  distinct column shard the host holds, each with the rows that hold it, reading only those
  columns. With ``halo=h`` each window is widened by ``h`` columns on each side, read from the
  neighbouring shards' columns (or filled with the pad value outside the sequence), and the global
  array's dimension 1 becomes ``C * (S/C + 2h)``: under ``jax.shard_map`` every device sees its
  ``S/C`` columns with ``h`` halo columns on each side, exactly what a halo exchange would give.

`LeafAssembler` holds what is fixed for a leaf (sharding, plan, windows); `assemble` is the per-step
work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp._checks import check_int
from psdp._plan.mesh import DataPlan, plan_pod

#: Host bytes per leaf from which `LeafAssembler.assemble` sends every box in one batched
#: ``jax.device_put`` instead of ``jax.make_array_from_callback`` (measured, see the docstring).
BATCHED_PUT_MIN_BYTES = 4 << 20


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
class LeafAssembler:
    """Everything fixed about one batch leaf: its global shape, sharding, plan and windows.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafAssembler.create(mesh, P("data"), (8, 3), np.int32, process_index=0)
        >>> leaf.plan.rows.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> batch = leaf.assemble(np.arange(24, dtype=np.int32).reshape(8, 3))
        >>> batch.shape, batch.sharding.spec
        ((8, 3), P('data',))

        A sequence sharded over ``model`` with one halo column: each device holds its 2 columns
        and one column of each neighbour (``-1`` outside the sequence).

        >>> leaf = LeafAssembler.create(
        ...     mesh, P("data", "model"), (4, 4), np.int32, process_index=0, halo=1)
        >>> [(w.columns, w.pad_before, w.pad_after) for w in leaf.windows]
        [(slice(0, 3, None), 1, 0), (slice(1, 4, None), 0, 1)]
        >>> rows = np.arange(16, dtype=np.int32).reshape(4, 4)
        >>> batch = leaf.assemble(leaf.fill(rows, pad_value=-1))
        >>> np.asarray(batch)[0].tolist()  # row 0 = [0, 1, 2, 3], as two haloed windows
        [-1, 0, 1, 2, 1, 2, 3, -1]
    """

    global_shape: tuple[int, ...]
    dtype: np.dtype
    sharding: NamedSharding
    plan: DataPlan
    windows: tuple[Window, ...]
    halo: int
    column_shards: int  # C: shards of dimension 1 in column mode, 0 for whole rows
    locate: dict[tuple[int, int], tuple[int, int]]  # (row start, column shard) -> (window, offset)
    device_boxes: dict[jax.Device, tuple[slice, ...]]  # each local device's box of the global array

    @classmethod
    def create(
        cls,
        mesh: jax.sharding.Mesh,
        spec: PartitionSpec,
        global_shape: tuple[int, ...],
        dtype: np.dtype | type,
        process_index: int,
        halo: int = 0,
    ) -> LeafAssembler:
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
            return cls(
                shape, np.dtype(dtype), sharding, plan, (Window(plan.rows),), 0, 0, locate,
                sharding.addressable_devices_indices_map(shape),  # type: ignore[arg-type]
            )  # fmt: skip
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
        return cls(
            haloed, np.dtype(dtype), sharding, plan, windows, halo, shards, locate,
            sharding.addressable_devices_indices_map(haloed),  # type: ignore[arg-type]
        )  # fmt: skip

    @property
    def host_shape(self) -> tuple[int, ...]:
        """The shape of the only window's buffer (whole-row leaves; see `window_shape`)."""
        if len(self.windows) != 1:
            raise ValueError(f"this leaf has {len(self.windows)} windows; use window_shape(i)")
        return self.window_shape(0)

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

    def assemble(self, buffers: np.ndarray | Sequence[np.ndarray]) -> jax.Array:
        """Builds the global array from this host's window buffers (one array if one window)."""
        if isinstance(buffers, np.ndarray):
            buffers = [buffers]
        if len(buffers) != len(self.windows):
            raise ValueError(f"got {len(buffers)} buffers for {len(self.windows)} windows")
        for i, buffer in enumerate(buffers):
            if buffer.shape != self.window_shape(i) or buffer.dtype != self.dtype:
                raise ValueError(
                    f"window {i}'s buffer has shape {buffer.shape} and dtype {buffer.dtype}, but "
                    f"the plan needs {self.window_shape(i)} {self.dtype}"
                )
        batch = self.global_shape[0]
        shard_width = self.global_shape[1] // self.column_shards if self.column_shards else 0

        def device_box(index: tuple[slice, ...] | None) -> np.ndarray:
            assert index is not None  # only None for arrays with no addressable shards
            start = index[0].start or 0
            stop = batch if index[0].stop is None else index[0].stop
            if shard_width:
                window, offset = self.locate[(start, (index[1].start or 0) // shard_width)]
                rest: tuple[slice, ...] = (slice(None), *index[2:])
            else:
                window, offset = self.locate[(start, 0)]
                rest = tuple(index[1:])
            return buffers[window][(slice(offset, offset + stop - start), *rest)]

        if sum(b.nbytes for b in buffers) < BATCHED_PUT_MIN_BYTES:
            return jax.make_array_from_callback(self.global_shape, self.sharding, device_box)
        devices = list(self.device_boxes)
        shards = jax.device_put([device_box(self.device_boxes[d]) for d in devices], devices)
        return jax.make_array_from_single_device_arrays(self.global_shape, self.sharding, shards)


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
