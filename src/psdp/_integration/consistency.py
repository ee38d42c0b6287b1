"""Did every device get exactly its rows? `check_consistency`, a collective check of a batch.

Every host gathers one small record per shard of every host and checks the same table, so every
host reaches the same verdict; the checks: ``docs/reference/reliability.md``, "Checking a batch on every host".
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from psdp._plan.option_checks import as_halo
from psdp._plan.partition import resolve_halos
from psdp._plan.windows import AxisHalo
from psdp.sources import as_source

#: Columns of a shard record before the box: device id, process, leaf, fingerprint (2 x int32), ok.
_HEAD = 6


class ConsistencyError(AssertionError):
    """A device holds the wrong rows: the message names the leaf, the device, its box and why."""


@dataclass(frozen=True)
class ConsistencyReport:
    """What `check_consistency` verified; ``str()`` is one line.

    Attributes:
        leaves: batch leaves checked.
        devices: devices holding each leaf (all hosts together).
        processes: hosts that took part.
        distinct_shards: different index boxes, summed over leaves.
        local_shards: shards this host checked byte for byte (its addressable shards).
        exact: whether every shard was also compared with the expected rows.
    """

    leaves: int
    devices: int
    processes: int
    distinct_shards: int
    local_shards: int
    exact: bool

    def __str__(self) -> str:
        against = "exactly their rows" if self.exact else "consistent rows"
        return (
            f"all {self.devices} devices received {against} ({_count(self.leaves, 'leaf')}, "
            f"{_count(self.distinct_shards, 'distinct shard')}, "
            f"{_count(self.processes, 'process')})"
        )


def check_consistency(
    batch: Any,
    expected: Any = None,
    *,
    source: Any = None,
    ids: np.ndarray | None = None,
    halo: int | Mapping[Any, Any] = 0,
    pad_value: int | float = 0,
    distinct: bool | Collection[str] = True,
    mask_key: str | None = "mask",
) -> ConsistencyReport:
    """Checks that every device of every host holds exactly its part of ``batch``.

    Collective: in a multi-process job every process must call it with the same batch structure
    (it does one ``process_allgather``); every process then raises the same error or returns the
    same report.

    Args:
        batch: a `jax.Array` or a dict of them (a loader batch); haliax ``NamedArray`` leaves
            are checked through their arrays.
        expected: the global batch as numpy (an array, or a dict with some or all of the batch's
            leaves); leaves of ``batch`` missing from it (such as a loader's mask) are checked
            for agreement only.
        source: instead of ``expected``: a psdp source (or anything `DataLoader` accepts) whose
            rows ``ids`` form the expected global batch.
        ids: the global row ids of the batch, with ``source``.
        halo: the loader's ``halo=`` (any of its forms), for a batch delivered with halos: the
            expected rows are then cut into each shard's window, halo included, by the rule of
            ``docs/concepts/partitioning.md`` (a dimension its shards do not divide is padded likewise);
            a ``"continue"`` halo needs ``source``, which serves the entries beyond a row's ends.
        pad_value: the loader's ``pad_value``: what ``pad`` halos beyond a domain's edges and an
            uneven domain's padding hold.
        distinct: require shards with different index boxes to hold different bytes: ``True``
            for every non-boolean leaf without expected rows (a mask legitimately repeats, and an
            exact comparison needs no such oracle), ``False`` for none, or a collection of leaf
            names.
        mask_key: the batch's boolean mask leaf (the loader's padding mask), if it has one:
            boxes made only of padding rows are equal by design, so they are exempt from
            ``distinct``.

    Returns:
        A `ConsistencyReport`.

    Raises:
        ConsistencyError: a device holds the wrong data; the message names the leaf, the device,
            its process and index box, and the first differing element when it is local.
        ValueError: ``expected`` does not fit the batch (e.g. a haloed batch checked without
            its ``halo``), or ``source`` came without ``ids``.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> rows = np.arange(16).reshape(8, 2)
        >>> batch = {"x": jax.device_put(rows, NamedSharding(mesh, P("data")))}
        >>> print(check_consistency(batch, {"x": rows}))
        all 8 devices received exactly their rows (1 leaf, 4 distinct shards, 1 process)
        >>> check_consistency(batch, {"x": rows[::-1]})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        psdp._integration.consistency.ConsistencyError: leaf 'x': device 0 (process 0) holds rows 0:2, cols 0:2, which differ ...
    """
    leaves = _leaves(batch)
    if isinstance(distinct, str):
        distinct = {distinct}
    wanted = _expected(leaves, expected, source, ids, halo, pad_value)
    records, local_problems = _local_records(leaves, wanted)
    table = _gather(records)
    real = _real_rows(leaves, mask_key)
    names = list(leaves)
    for number, name in enumerate(names):
        rows = table[table[:, 2] == number]
        unique = (
            name in distinct
            if isinstance(distinct, Collection)
            else distinct and leaves[name].dtype != np.bool_ and name not in (wanted or {})
        )
        _check_leaf(name, leaves[name].shape, rows, local_problems, unique, real)
    boxes = sum(len(_unique_boxes(table[table[:, 2] == n])) for n in range(len(names)))
    return ConsistencyReport(
        leaves=len(names),
        devices=len(np.unique(table[:, 0])),
        processes=len(np.unique(table[:, 1])),
        distinct_shards=boxes,
        local_shards=len(records),
        exact=wanted is not None and set(wanted) == set(leaves),
    )


# ------------------------------------------------------------------------------- inputs
def _leaves(batch: Any) -> dict[str, jax.Array]:
    """The batch's leaves by name, sorted: records number the leaves by this order, so hosts
    whose batch dicts list the leaves in different orders still compare leaf with leaf."""
    items = (
        sorted(batch.items(), key=lambda kv: str(kv[0]))
        if isinstance(batch, Mapping)
        else [("batch", batch)]
    )
    # a haliax NamedArray holds its jax.Array in ``.array``
    leaves: dict[str, jax.Array] = {}
    for key, value in items:
        leaf = getattr(value, "array", value)
        if not isinstance(leaf, jax.Array):
            raise TypeError(
                f"check_consistency needs jax.Array leaves, but leaf {str(key)!r} is a "
                f"{type(leaf).__name__}; pass the batch the loader yields"
            )
        leaves[str(key)] = leaf
    return leaves


def _expected(
    leaves: dict[str, jax.Array],
    expected: Any,
    source: Any,
    ids: np.ndarray | None,
    halo: int | Mapping[Any, Any],
    pad_value: int | float,
) -> dict[str, np.ndarray] | None:
    if source is not None:
        if expected is not None or ids is None:
            raise ValueError(
                "give either expected=<global batch> or source=<source> with ids=<row ids>, got "
                f"expected={'set' if expected is not None else None}, "
                f"ids={'set' if ids is not None else None}"
            )
        source = as_source(source)
        expected = source.read(np.asarray(ids))
    if expected is None:
        return None
    single = not isinstance(expected, Mapping)  # the loader keys an array source's leaf None
    got = {"batch": expected} if single else dict(expected)
    got = {str(k): np.asarray(v) for k, v in got.items()}
    extra = sorted(set(got) - set(leaves))
    if extra:
        raise ValueError(
            f"expected has leaves {extra} that the batch lacks (batch leaves: {sorted(leaves)}); "
            "pass the expected rows of the batch's own leaves"
        )
    halos = _halos(leaves, halo, single)
    for name, rows in got.items():
        leaf = leaves[name]
        if rows.shape[:1] != leaf.shape[:1] or rows.ndim != leaf.ndim:
            raise ValueError(
                f"expected leaf {name!r} has shape {rows.shape} but the batch leaf is "
                f"{leaf.shape}; pass the whole global batch, not one host's rows"
            )
        axes = halos.get(name, {})
        if any(h.boundary == "continue" for h in axes.values()):
            rows = _continued(name, None if single else name, axes, source, ids, rows.shape)
        got[name] = _windows(name, rows, leaf, axes, pad_value)
    return got


def _halos(
    leaves: dict[str, jax.Array], halo: int | Mapping[Any, Any], single: bool
) -> dict[str, dict[int, AxisHalo]]:
    """Each leaf's halos per dimension, resolved as the loader resolves ``halo=``."""
    if not halo:
        return {}
    specs = {
        None if single else name: getattr(leaf.sharding, "spec", PartitionSpec())
        for name, leaf in leaves.items()
    }
    ndims = {None if single else name: leaf.ndim for name, leaf in leaves.items()}
    resolved = resolve_halos(as_halo(halo), specs, ndims)
    return {("batch" if key is None else str(key)): axes for key, axes in resolved.items()}


def _continued(
    name: str,
    key: Any,
    halos: dict[int, AxisHalo],
    source: Any,
    ids: np.ndarray | None,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The rows widened by each ``continue`` halo's width on both sides, as the source serves
    them (the entries before 0 and past the end of a row)."""
    if source is None or not getattr(source, "continues_rows", False):
        raise ValueError(
            f"leaf {name!r} has a 'continue' halo, whose entries lie beyond each row's ends; "
            "only a source that continues its rows (continues_rows = True, such as "
            "TokenSequences) serves them: pass source=<that source> and ids=, not expected="
        )
    last = max(halos)
    box = tuple(
        slice(-halos[d].width, shape[d] + halos[d].width)
        if d in halos and halos[d].boundary == "continue"
        else slice(0, shape[d])
        for d in range(1, last + 1)
    )
    got = source.read_window(np.asarray(ids), {key: box})
    return np.asarray(got[key] if isinstance(got, Mapping) else got)


def _windows(
    name: str,
    rows: np.ndarray,
    leaf: jax.Array,
    halos: dict[int, AxisHalo],
    pad_value: int | float,
) -> np.ndarray:
    """``rows`` cut into each shard's window along every dimension with a halo or that its
    shards do not divide: position ``p`` of shard ``k`` is entry ``x = k * ceil(n / C) - h + p``,
    which holds entry ``x`` inside the domain, the boundary rule's entry within ``h`` of an
    edge, and ``pad_value`` beyond (``docs/concepts/partitioning.md``, "Uneven domains")."""
    per_device = leaf.sharding.shard_shape(leaf.shape)
    for d in range(1, leaf.ndim):
        halo = halos.get(d, AxisHalo(0))
        h = halo.width
        reach = h if halo.boundary == "continue" else 0  # `_continued` read h more each side
        n = rows.shape[d] - 2 * reach
        if not h and n == leaf.shape[d]:
            continue
        count = leaf.shape[d] // per_device[d]
        w = -(-n // count)
        if leaf.shape[d] != count * (w + 2 * h):
            raise ValueError(_window_mismatch(name, d, leaf.shape[d], n, count, h))
        x = (np.arange(count)[:, None] * w - h + np.arange(w + 2 * h)).ravel()
        inside = (x >= 0) & (x < n)
        near = (x >= -h) & (x < n + h)  # inside, or within h of an edge
        held = inside if halo.boundary == "pad" else near
        entry = x % n if halo.boundary == "periodic" else x + reach
        rows = np.take(rows, np.where(held, entry, 0), axis=d)
        where: list[Any] = [slice(None)] * rows.ndim
        where[d] = ~held
        rows[tuple(where)] = pad_value
    return rows


def _window_mismatch(name: str, dim: int, size: int, n: int, count: int, halo: int) -> str:
    w = -(-n // count)
    with_halo = f" plus a halo of {halo} on each side" if halo else ""
    reason = (
        f"expected leaf {name!r} has {n} entries along dimension {dim}: the batch's {count} "
        f"shards there hold {w} each{with_halo}, {count * (w + 2 * halo)} in all, but the batch "
        f"leaf has {size}"
    )
    shard, extra = size // count, size // count - w
    if size % count == 0 and extra > 0 and extra % 2 == 0:
        return (
            f"{reason}: {shard} per shard, {w} + 2 x {extra // 2}, a halo of {extra // 2}; pass "
            "check_consistency the loader's halo= and pad_value="
        )
    return f"{reason}; pass the loader's halo= and the whole global batch, not one host's rows"


# ----------------------------------------------------------------------------- records
def _local_records(
    leaves: dict[str, jax.Array], wanted: dict[str, np.ndarray] | None
) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
    """One int32 row per addressable shard: head columns, then box starts, then box stops."""
    ndim = max(leaf.ndim for leaf in leaves.values())
    rows, problems = [], {}
    for number, (name, leaf) in enumerate(leaves.items()):
        for shard in leaf.addressable_shards:
            box = _box(shard.index, leaf.shape)
            data = np.asarray(shard.data)
            ok = 1
            if wanted is not None and name in wanted:
                want = wanted[name][tuple(slice(a, b) for a, b in box)]
                if not np.array_equal(data, want, equal_nan=data.dtype.kind in "fc"):
                    ok = 0
                    problems[(number, shard.device.id)] = _first_difference(data, want, box)
            padded = box + [(0, 1)] * (ndim - len(box))
            rows.append(
                [shard.device.id, shard.device.process_index, number, *_fingerprint(data), ok]
                + [a for a, _ in padded]
                + [b for _, b in padded]
            )
    return np.asarray(rows, np.int32).reshape(len(rows), _HEAD + 2 * ndim), problems


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
    return [s.indices(n)[:2] for s, n in zip(index, shape, strict=True)]


def _fingerprint(data: np.ndarray) -> list[int]:
    digest = hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=8).digest()
    return [int(v) for v in np.frombuffer(digest, np.int32)]


def _first_difference(data: np.ndarray, want: np.ndarray, box: list[tuple[int, int]]) -> str:
    differ = data != want
    if data.dtype.kind in "fc":
        differ &= ~(np.isnan(data) & np.isnan(want))  # NaN where NaN is expected is exact
    where = tuple(int(i) for i in np.argwhere(differ)[0])
    at = tuple(start + i for (start, _), i in zip(box, where, strict=True))
    return f"; at global index {at} it holds {data[where]!r}, expected {want[where]!r}"


def _real_rows(leaves: dict[str, jax.Array], mask_key: str | None) -> np.ndarray | None:
    """The global padding mask (``True``: a real row), gathered from every host; or ``None``."""
    mask = leaves.get(mask_key) if mask_key is not None else None
    if mask is None or mask.dtype != np.bool_ or mask.ndim != 1:
        return None
    if jax.process_count() == 1:
        return np.asarray(mask)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(mask, tiled=True))


def _gather(records: np.ndarray) -> np.ndarray:
    if jax.process_count() == 1:
        return records
    from jax.experimental import multihost_utils

    gathered = np.asarray(multihost_utils.process_allgather(records))
    return gathered.reshape(-1, records.shape[1])


# ------------------------------------------------------------------------------- checks
def _check_leaf(
    name: str,
    shape: tuple[int, ...],
    rows: np.ndarray,
    local_problems: dict[tuple[int, int], str],
    distinct: bool,
    real: np.ndarray | None = None,
) -> None:
    ndim = (rows.shape[1] - _HEAD) // 2
    starts, stops = rows[:, _HEAD : _HEAD + ndim], rows[:, _HEAD + ndim :]
    boxes = _unique_boxes(rows)
    for row, start, stop in zip(rows, starts, stops, strict=True):
        if not row[5]:
            number, device = int(row[2]), int(row[0])
            detail = local_problems.get(
                (number, device), f"; process {int(row[1])} reports the first differing element"
            )
            raise ConsistencyError(
                f"leaf {name!r}: device {device} (process {int(row[1])}) holds "
                f"{_describe(start, stop, len(shape))}, which differ from the expected rows"
                f"{detail}"
            )
    volume = sum(int(np.prod(np.subtract(stop, start))) for start, stop in boxes.values())
    if volume != int(np.prod(shape)):
        raise ConsistencyError(
            f"leaf {name!r}: the devices' index boxes cover {volume} elements of a global shape "
            f"{shape} ({int(np.prod(shape))} elements); the sharding leaves a gap or an overlap"
        )
    by_print: dict[tuple[int, int], tuple[int, ...]] = {}
    for key in boxes:
        members = rows[np.all(np.hstack([starts, stops]) == key, axis=1)]
        prints = {tuple(m[3:5]) for m in members}
        if len(prints) > 1:
            devices = ", ".join(f"{int(m[0])} (process {int(m[1])})" for m in members)
            raise ConsistencyError(
                f"leaf {name!r}: the replicas of {_describe(key[:ndim], key[ndim:], len(shape))} "
                f"disagree: devices {devices} hold the same index box but different bytes"
            )
        fingerprint = prints.pop()
        if real is not None and not real[key[0] : key[ndim]].any():
            continue  # only padding rows: equal to other padding boxes by design
        if distinct and fingerprint in by_print:
            other = by_print[fingerprint]
            raise ConsistencyError(
                f"leaf {name!r}: two different index boxes hold identical bytes: "
                f"{_describe(other[:ndim], other[ndim:], len(shape))} and "
                f"{_describe(key[:ndim], key[ndim:], len(shape))}, so hosts fed the same rows "
                "to different data shards; pass distinct=False if the data really repeats"
            )
        by_print[fingerprint] = key


def _unique_boxes(rows: np.ndarray) -> dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]:
    ndim = (rows.shape[1] - _HEAD) // 2
    out = {}
    for row in rows:
        start, stop = row[_HEAD : _HEAD + ndim], row[_HEAD + ndim :]
        out[tuple(int(v) for v in np.concatenate([start, stop]))] = (start, stop)
    return out


def _describe(start: Any, stop: Any, ndim: int) -> str:
    words = ["rows", "cols", *(f"dim{i}" for i in range(2, ndim))]
    return ", ".join(f"{words[i]} {int(start[i])}:{int(stop[i])}" for i in range(ndim))


def _count(n: int, noun: str) -> str:
    plural = {"leaf": "leaves", "process": "processes"}.get(noun, noun + "s")
    return f"{n} {noun if n == 1 else plural}"
