"""An independent oracle: what every device must hold at a step, from the documented rules alone.

Nothing here asks the loader or psdp's planner which rows, positions or columns a step holds:

- the order is the documented formula (``psdp._plan.order``'s module docstring): ``K = N // B`` steps
  per epoch with ``drop_last``, else ``ceil(N / B)``; step ``s`` takes positions
  ``(s % K) * B ..`` of epoch ``s // K``'s permutation, `PAD` past ``N``. The permutation is
  tests/shuffle_oracle.py, the documented rule written again (nothing from psdp), and
  tests/test_oracle.py pins it with literal known answers;
- the physical batch is the smallest multiple of the lcm of every leaf's batch-shard count (the
  product of the mesh axis sizes its spec names for dimension 0) that holds ``B`` rows; with
  feeding processes, each fed batch shard (one that a feeding process holds) gets
  ``ceil(B / fed)`` positions and the first ``B`` of them, in shard order, are real;
- halo windows are numpy concatenations: device column shard ``c`` of a leaf with ``C`` shards
  of ``w`` columns holds source columns ``[c*w - h, (c+1)*w + h)``, pad outside the sequence;
- the box each device holds is JAX's own ``devices_indices_map``, and the rows are plain numpy
  indexing of the source data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tests import shuffle_oracle

#: The id of a padding position (the documented `psdp._plan.order.PAD`; pinned in tests/test_oracle.py).
PAD = -1

#: Mesh axis names the ``"batch"`` strategy takes (the documented default), in mesh order.
BATCH_AXES = ("replica", "data", "fsdp", "batch")


# ------------------------------------------------------------------------------------ order
def permuted(
    num_rows: int,
    seed: int,
    epoch: int,
    positions: np.ndarray,
    block: tuple[int, int] | None = None,
) -> np.ndarray:
    """Rows at ``positions`` of epoch ``epoch``'s permutation (``block``: the
    ``(io_block, window_blocks)`` of a block shuffle)."""
    rows = np.array(shuffle_oracle.epoch_rows(num_rows, seed, epoch, positions, block), np.int64)
    assert ((rows >= 0) & (rows < num_rows)).all(), rows
    return rows


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s whole permutation of ``range(num_rows)``: position -> source row."""
    perm = permuted(num_rows, seed, epoch, np.arange(num_rows))
    assert sorted(perm.tolist()) == list(range(num_rows)), "not a permutation"
    return perm


def step_ids(
    num_rows: int,
    batch_size: int,
    step: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    block: tuple[int, int] | None = None,
) -> np.ndarray:
    """The ``B`` source row ids of step ``step``, increasing (`PAD` for an epoch's short final
    batch, after the real ones)."""
    n, b = num_rows, batch_size
    per_epoch = n // b if drop_last else -(-n // b)
    epoch, within = divmod(step, per_epoch)
    position = within * b + np.arange(b)
    real = position < n
    safe = np.where(real, position, 0)
    ids = permuted(n, seed, epoch, safe, block) if shuffle else safe
    ids = np.where(real, ids, PAD)
    assert len(set(ids[real].tolist())) == real.sum(), "a row twice in one batch"
    ids[real] = np.sort(ids[real])  # a batch's rows in increasing id order (real ones lead)
    return ids


@dataclass(frozen=True)
class Span:
    """The sample offsets a step covers: ``rows`` of them from ``offset``, in a batch of
    ``batch_size`` (the rest padding)."""

    offset: int
    batch_size: int
    rows: int


def schedule_spans(
    num_rows: int | None,
    batch_size: int | Sequence[tuple[int, int]],
    steps: int,
    *,
    drop_last: bool = False,
    skip_steps: Sequence[tuple[int, int]] = (),
    skip_offsets: Sequence[tuple[int, int]] = (),
    start: tuple[int, int] = (0, 0),
) -> list[Span]:
    """The spans of steps ``start[0] .. steps - 1``, by walking the offsets one at a time with
    the documented rules (``docs/concepts/order-and-resume.md``, "Offsets, schedules and skips"): a step takes
    consecutive offsets that are not skipped, within one epoch, up to its batch size; a short
    one is padded, or with ``drop_last`` dropped (its offsets are never read); step skip
    ``(a, b)`` skips the offsets steps ``a .. b - 1`` would have taken. ``num_rows=None``: one
    endless epoch (a stream)."""
    stages = [(0, batch_size)] if isinstance(batch_size, int) else list(batch_size)
    skipped = {g for first, end in skip_offsets for g in range(first, end)}
    pending = sorted(skip for skip in skip_steps if skip[0] >= start[0])

    def size(step: int) -> int:
        return [b for first, b in stages if first <= step][-1]

    def take(g: int, batch: int) -> tuple[int, int]:
        """(first offset, real rows) of a step of ``batch`` whose walk is at ``g``."""
        while True:
            while g in skipped:
                g += 1
            end = math.inf if num_rows is None else (g // num_rows + 1) * num_rows
            rows = 0
            while rows < batch and g + rows < end and g + rows not in skipped:
                rows += 1
            if drop_last and rows < batch:
                g += rows  # too short: never read
                continue
            return g, rows

    spans, g = [], start[1]
    for step in range(start[0], steps):
        while pending and pending[0][0] == step:
            first, end = pending.pop(0)
            phantom = g
            for t in range(first, end):
                at, rows = take(phantom, size(t))
                phantom = at + rows
            at, _ = take(g, size(step))
            skipped.update(range(at, take(phantom, size(end))[0]))
        at, rows = take(g, size(step))
        spans.append(Span(at, size(step), rows))
        g = at + rows
    return spans


def span_ids(
    num_rows: int,
    span: Span,
    *,
    seed: int = 0,
    shuffle: bool = True,
    block: tuple[int, int] | None = None,
) -> np.ndarray:
    """A span's source rows, increasing, then `PAD` up to its batch size."""
    epoch, first = divmod(span.offset, num_rows)
    positions = first + np.arange(span.rows)
    assert positions.max(initial=0) < num_rows, "a span crosses an epoch's end"
    ids = np.sort(permuted(num_rows, seed, epoch, positions, block)) if shuffle else positions
    return np.concatenate([ids, np.full(span.batch_size - span.rows, PAD, np.int64)])


def ends_short(num_rows: int, batch_size: int, drop_last: bool) -> bool:
    """Whether an epoch ends with a padded batch."""
    return not drop_last and num_rows % batch_size != 0


# ------------------------------------------------------------------------- specs and shards
def resolve(
    strategy: Any, mesh: Mesh, batch_axes: str | Sequence[str] | None = None
) -> PartitionSpec:
    """The documented meaning of a strategy name (a `PartitionSpec` is used as given)."""
    if isinstance(strategy, PartitionSpec):
        return strategy
    if strategy == "replicated":
        return PartitionSpec()
    axes = (
        tuple(mesh.axis_names)
        if strategy == "full"
        else axes_of(batch_axes) or tuple(a for a in mesh.axis_names if a in BATCH_AXES)
    )
    assert strategy in ("batch", "full") and axes, strategy
    return PartitionSpec(axes[0] if len(axes) == 1 else axes)


def axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def shard_count(mesh: Mesh, entry: Any) -> int:
    """How many shards a spec entry splits a dimension into: the product of its axis sizes."""
    return math.prod(mesh.shape[a] for a in axes_of(entry))


def batch_entry(spec: PartitionSpec) -> Any:
    return spec[0] if len(spec) else None


def physical_size(batch_size: int, mesh: Mesh, specs: Sequence[PartitionSpec]) -> int:
    """The smallest multiple of the lcm of every leaf's batch-shard count that holds ``B``."""
    unit = math.lcm(*(shard_count(mesh, batch_entry(s)) for s in specs))
    return -(-batch_size // unit) * unit


def batch_shard_of(mesh: Mesh, entry: Any) -> dict[Any, int]:
    """Device -> its batch-shard index under a spec entry, from JAX's index map."""
    count = shard_count(mesh, entry)
    boxes = NamedSharding(mesh, PartitionSpec(entry)).devices_indices_map((count,))
    return {d: box[0].start or 0 for d, box in boxes.items()}


def fed_positions(
    batch_size: int, mesh: Mesh, entry: Any, process_of: Mapping[Any, int], feeding: Sequence[int]
) -> tuple[int, np.ndarray]:
    """(physical size, real positions) when only ``feeding`` processes' batch shards get rows."""
    count = shard_count(mesh, entry)
    shard = batch_shard_of(mesh, entry)
    fed = sorted({shard[d] for d, p in process_of.items() if p in set(feeding)})
    per = -(-batch_size // len(fed))
    positions = np.concatenate([s * per + np.arange(per) for s in fed])[:batch_size]
    return count * per, positions


# -------------------------------------------------------------------------------- values
def take_rows(leaf: np.ndarray, ids: np.ndarray, pad_value: Any) -> np.ndarray:
    """``leaf[ids]`` with `PAD` ids as rows of ``pad_value``."""
    rows = np.array(leaf[np.where(ids == PAD, 0, ids)])
    rows[ids == PAD] = pad_value
    return rows


def haloed(rows: np.ndarray, shards: int, halo: int, pad_value: Any) -> np.ndarray:
    """Each of ``shards`` column shards widened by ``halo`` neighbour columns on both sides."""
    width = rows.shape[1] // shards
    padding = [(0, 0), (halo, halo)] + [(0, 0)] * (rows.ndim - 2)
    wide = np.pad(rows, padding, constant_values=pad_value)  # column j is wide column j + halo
    return np.concatenate(
        [wide[:, c * width : (c + 1) * width + 2 * halo] for c in range(shards)], axis=1
    )


@dataclass
class Expected:
    """The global value and the spec of every leaf at one step, and the step's physical ids."""

    ids: np.ndarray
    leaves: dict[Any, np.ndarray]
    specs: dict[Any, PartitionSpec]


def expected_step(
    data: Any,
    mesh: Mesh,
    specs: Mapping[Any, PartitionSpec],
    batch_size: int,
    step: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    pad_value: Any = 0,
    halo: Mapping[Any, int] | None = None,
    feeding: Sequence[int] | None = None,
    process_of: Mapping[Any, int] | None = None,
    mask_key: str | None = "mask",
    span: Span | None = None,
    block: tuple[int, int] | None = None,
) -> Expected:
    """The whole global batch of ``step`` and each leaf's spec.

    ``data`` is the source as numpy (an array: leaf ``None``; or a dict). ``specs`` has one
    `PartitionSpec` per leaf; the first leaf (whose batch dimension the mask follows) is the
    first by name (docs/guides/custom-sources.md, "Leaf order"). ``process_of`` maps each device to its
    process (default: JAX's), for feeding. ``span``: the step's span under a schedule or skips
    (`schedule_spans`); then ``batch_size`` is ignored.
    """
    leaves = data if isinstance(data, Mapping) else {None: data}
    if span is not None:
        batch_size = span.batch_size
    halo = dict(halo or {})
    num_rows = len(next(iter(leaves.values())))
    first = specs[sorted(specs, key=str)[0]]
    if feeding is None:
        size = physical_size(batch_size, mesh, list(specs.values()))
        positions = np.arange(batch_size)
    else:
        devices = process_of or {d: d.process_index for d in mesh.devices.flat}
        size, positions = fed_positions(batch_size, mesh, batch_entry(first), devices, feeding)
    physical = np.full(size, PAD, np.int64)
    physical[positions] = (
        step_ids(
            num_rows,
            batch_size,
            step,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            block=block,
        )
        if span is None
        else span_ids(num_rows, span, seed=seed, shuffle=shuffle, block=block)
    )
    out, out_specs = {}, {}
    for key, leaf in leaves.items():
        spec = specs[key]
        rows = take_rows(leaf, physical, pad_value)
        if halo.get(key):
            rows = haloed(rows, shard_count(mesh, spec[1]), halo[key], pad_value)
        out[key], out_specs[key] = rows, spec
    if isinstance(data, Mapping) and mask_key is not None:  # every dict batch carries the mask
        out[mask_key] = physical != PAD
        out_specs[mask_key] = PartitionSpec(batch_entry(first))
    return Expected(physical, out, out_specs)


# ------------------------------------------------------------------------------ comparisons
def _box_label(box: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    """``[0:2, 0:8]``: a device's box as global index ranges."""
    ranges = (part.indices(n)[:2] for part, n in zip(box, shape, strict=True))
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in ranges) + "]"


def assert_shard_equal(
    got: np.ndarray,
    want: np.ndarray,
    box: tuple[slice, ...],
    global_shape: tuple[int, ...],
    *,
    leaf: Any,
    device: Any,
    process: int,
    what: str = "",
) -> None:
    """What ``device`` holds equals ``want``, the oracle's values at its ``box`` of the global
    leaf (NaN equals NaN); else an AssertionError naming the leaf, the device (id and process) and
    the first differing global index with both values."""
    where = f"{what}: " if what else ""
    who = (
        f"{where}leaf {'(the single leaf)' if leaf is None else repr(leaf)}, device {device.id} "
        f"(process {process}), box {_box_label(box, global_shape)}"
    )
    if got.shape != want.shape:
        raise AssertionError(f"{who}: holds shape {got.shape}, expected {want.shape}")
    differ = got != want
    if got.dtype.kind in "fc" and want.dtype.kind in "fc":
        differ &= ~(np.isnan(got) & np.isnan(want))
    if differ.any():
        local = tuple(int(i) for i in np.argwhere(differ)[0])
        start = tuple(part.indices(n)[0] for part, n in zip(box, global_shape, strict=True))
        index = tuple(b + i for b, i in zip(start, local, strict=True))
        raise AssertionError(
            f"{who}: first difference at global index {index}: holds {got[local].tolist()!r}, "
            f"expected {want[local].tolist()!r} ({int(differ.sum())} of {differ.size} elements "
            "differ)"
        )


def check_shards(
    shards: Mapping[Any, np.ndarray],
    expected: np.ndarray,
    spec: PartitionSpec,
    mesh: Mesh,
    what: str,
    *,
    leaf: Any = None,
    process_of: Mapping[Any, int] | None = None,
) -> int:
    """Each device's data equals ``expected`` at the box JAX gives that device; returns the count.

    ``process_of`` maps a device to its (simulated) process; default: the device's own."""
    boxes = NamedSharding(mesh, spec).devices_indices_map(expected.shape)
    for device, data in shards.items():
        process = process_of[device] if process_of is not None else device.process_index
        assert_shard_equal(
            data, expected[boxes[device]], boxes[device], expected.shape,
            leaf=leaf, device=device, process=process, what=what,
        )  # fmt: skip
    return len(shards)


def windowed_dims(spec: PartitionSpec, mesh: Mesh, ndim: int, halo: int = 0) -> list[int]:
    """The dimensions after the batch a leaf is read in windows along: each one its spec splits
    into shards, and dimension 1 when it has a halo (``docs/concepts/partitioning.md``)."""
    return [
        d
        for d in range(1, ndim)
        if (d < len(spec) and shard_count(mesh, spec[d]) > 1) or (d == 1 and halo > 0)
    ]


def needed_elements(
    expected: Expected, key: Any, mesh: Mesh, devices: Sequence[Any], halo: int = 0
) -> set[tuple[int, tuple[int, ...]]]:
    """(source row id, source entry) pairs a set of devices needs of one leaf: the entry is an
    index along dimensions 1 to the leaf's last windowed one (``()``: whole rows, when no
    dimension after the batch is windowed); padding positions need nothing. ``halo`` is a
    dimension-1 halo; every other dimension divides evenly."""
    spec = expected.specs[key]
    shape = expected.leaves[key].shape
    boxes = NamedSharding(mesh, spec).devices_indices_map(shape)
    windowed = windowed_dims(spec, mesh, len(shape), halo)
    out: set[tuple[int, tuple[int, ...]]] = set()
    for device in devices:
        ids = [int(i) for i in expected.ids[boxes[device][0]] if i != PAD]
        entries = []
        for d in range(1, max(windowed, default=0) + 1):
            count = shard_count(mesh, spec[d]) if d < len(spec) else 1
            h = halo if d == 1 else 0
            width = shape[d] // count - 2 * h  # a shard's own entries
            shard = (boxes[device][d].start or 0) // (width + 2 * h)
            first, last = shard * width - h, (shard + 1) * width + h
            entries.append(range(max(first, 0), min(last, width * count)))
        out |= {(i, entry) for i in ids for entry in itertools.product(*entries)}
    return out
