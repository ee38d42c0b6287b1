"""One loader configuration checked on one host against the oracle: exact shards and exact reads.

A `Case` is plain data (JSON-able, so a pod target can take a list of them): the source's leaves,
each leaf's spec or strategy, batch settings, halos, feeding processes and the kind of source
(with ``read_window``, with ``read`` only, a ``__getitem__`` table, or a Grain-style per-record
source). `check_case` builds the loader for one host, reads some steps and checks, for that host:

- every device it holds (its addressable shards, or a simulated host's boxes) equals the
  oracle's global batch at the box JAX gives that device (`oracle.check_shards`);
- its reads are exactly what its devices need (`oracle.needed_elements`): a sequence-sharded
  leaf (or one split after dimension 1) read through ``read_window`` reads exactly its (row,
  entry) pairs, each once; whole-row
  leaves read exactly the union of the rows they need, once; a source without ``read_window``
  reads whole rows, exactly the union of the rows any leaf needs. Padding is never read.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from psdp import ArraySource, DataLoader, GrainSource
from tests import oracle

SOURCES = ("window", "read", "getitem", "grain")


class WindowReads(ArraySource):
    """A source with ``read_window`` that records every read: ``(ids, {leaf: columns})``."""

    def __init__(self, data: Mapping[str, np.ndarray]):
        super().__init__(dict(data))
        self.names = list(data)
        self.reads: list[tuple[np.ndarray, dict[Any, slice | None]]] = []

    def read(self, ids):
        self.reads.append((np.array(ids), dict.fromkeys(self.names)))
        return super().read(ids)

    def read_window(self, ids, columns):
        self.reads.append((np.array(ids), dict(columns)))
        return super().read_window(ids, columns)


class ReadOnly:
    """A user source with ``read`` only: the loader must cut its columns itself."""

    def __init__(self, data: Mapping[str, np.ndarray]):
        self.data = dict(data)
        self.reads: list[tuple[np.ndarray, dict[Any, slice | None]]] = []

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    def read(self, ids):
        self.reads.append((np.array(ids), dict.fromkeys(self.data)))
        return {k: v[ids] for k, v in self.data.items()}

    def describe(self) -> str:
        return "ReadOnly"


class Table:
    """An object with ``__len__`` and a batched ``__getitem__``, the plainest source."""

    def __init__(self, data: Mapping[str, np.ndarray]):
        self.data = dict(data)
        self.reads: list[tuple[np.ndarray, dict[Any, slice | None]]] = []

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    def __getitem__(self, ids):
        self.reads.append((np.array(ids), dict.fromkeys(self.data)))
        return {k: v[ids] for k, v in self.data.items()}


class GrainReads(GrainSource):
    """A Grain-style per-record source (a list of record dicts), recording each batched read."""

    def __init__(self, data: Mapping[str, np.ndarray]):
        records = [
            {k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))
        ]
        super().__init__(records, read_threads=1)
        self.names = list(data)
        self.reads: list[tuple[np.ndarray, dict[Any, slice | None]]] = []

    def read(self, ids):
        self.reads.append((np.array(ids), dict.fromkeys(self.names)))
        return super().read(ids)


def spec_of(entry: Any) -> Any:
    """A JSON spec: a strategy name, or a list of entries (None, an axis, a list of axes)."""
    if isinstance(entry, str | PartitionSpec):
        return entry
    return PartitionSpec(*[tuple(e) if isinstance(e, list | tuple) else e for e in entry])


@dataclass
class Case:
    """One loader configuration (JSON-able)."""

    leaves: dict[str, list[int]]  # leaf -> trailing shape (dimensions after the batch)
    specs: dict[str, Any]  # leaf -> strategy name or list of spec entries
    batch_size: int
    num_rows: int
    source: str = "window"
    halo: dict[str, int] = field(default_factory=dict)
    feeding: list[int] | None = None
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    pad_value: int = -1
    steps: list[int] = field(default_factory=lambda: [0, 1])
    float_leaves: list[str] = field(default_factory=list)
    name: str = ""

    def data(self) -> dict[str, np.ndarray]:
        """Every element of every leaf distinct, so a wrong element is always visible."""
        out = {}
        for i, (key, trailing) in enumerate(self.leaves.items()):
            size = self.num_rows * math.prod(trailing)
            values = np.arange(size).reshape(self.num_rows, *trailing) + 100_000 * (i + 1)
            out[key] = values.astype(np.float32 if key in self.float_leaves else np.int32)
        return out

    def describe(self) -> str:
        return self.name or str(asdict(self))


SOURCE_KINDS: dict[str, Callable[[Mapping[str, np.ndarray]], Any]] = {
    "window": WindowReads,
    "read": ReadOnly,
    "getitem": Table,
    "grain": GrainReads,
}

#: Host shards of one leaf at one step: (the spec it was assembled with, device -> its data).
Shards = tuple[PartitionSpec, dict[Any, np.ndarray]]


def live_shards(loader: DataLoader, step: int) -> dict[Any, Shards]:
    """A real host's batch: every addressable shard of every leaf."""
    batch = loader.batch_at(step)
    batch = batch if isinstance(batch, dict) else {None: batch}
    return {
        k: (v.sharding.spec, {s.device: np.asarray(s.data) for s in v.addressable_shards})
        for k, v in batch.items()
    }


def same_spec(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Equal as shardings: trailing unsharded entries and one-axis tuples do not matter."""

    def norm(spec: PartitionSpec) -> list[tuple[str, ...]]:
        entries = [oracle.axes_of(e) for e in spec]
        while entries and not entries[-1]:
            entries.pop()
        return entries

    return norm(a) == norm(b)


def check_case(
    case: Case,
    mesh: Mesh,
    host: int,
    process_of: Mapping[Any, int],
    batch_of: Callable[[DataLoader, int], dict[Any, Shards]],
) -> int:
    """Checks every step of ``case`` on ``host``; returns the number of device shards checked."""
    data = case.data()
    source = SOURCE_KINDS[case.source](data)
    # leaves without a spec take "batch" (documented)
    specs = {k: oracle.resolve(spec_of(case.specs.get(k, "batch")), mesh) for k in case.leaves}
    loader = DataLoader(
        source,
        mesh=mesh,
        global_batch_size=case.batch_size,
        batch_spec={k: spec_of(s) for k, s in case.specs.items()},
        halo=dict(case.halo),
        feeding_processes=case.feeding,
        seed=case.seed,
        shuffle=case.shuffle,
        drop_last=case.drop_last,
        pad_value=case.pad_value,
        process_index=host,
    )
    devices = [d for d, p in process_of.items() if p == host]
    checked = 0
    with loader:
        for step in case.steps:
            source.reads.clear()
            got = batch_of(loader, step)
            want = oracle.expected_step(
                data, mesh, specs, case.batch_size, step,
                seed=case.seed, shuffle=case.shuffle, drop_last=case.drop_last,
                pad_value=case.pad_value, halo=case.halo, feeding=case.feeding,
                process_of=process_of,
            )  # fmt: skip
            assert set(got) == set(want.leaves), (case.describe(), set(got), set(want.leaves))
            for key, (spec, shards) in got.items():
                what = f"{case.describe()}, step {step}"
                assert same_spec(spec, want.specs[key]), (what, key, spec, want.specs[key])
                assert set(shards) == set(devices), (what, key, "not every device of the host")
                checked += oracle.check_shards(
                    shards, want.leaves[key], want.specs[key], mesh, what,
                    leaf=key, process_of=process_of,
                )  # fmt: skip
            check_reads(case, source.reads, want, mesh, devices, step)
    return checked


def check_reads(
    case: Case, reads: list, want: oracle.Expected, mesh: Mesh, devices: list, step: int
) -> None:
    """This host read exactly what its devices need, and nothing twice (see the module doc)."""
    what = f"{case.describe()}, step {step}"
    needed = {
        k: oracle.needed_elements(want, k, mesh, devices, case.halo.get(k, 0)) for k in case.leaves
    }
    columns = {
        k
        for k in case.leaves
        if oracle.windowed_dims(want.specs[k], mesh, 1 + len(case.leaves[k]), case.halo.get(k, 0))
    }
    all_rows = {i for pairs in needed.values() for i, _ in pairs}
    whole_rows = {i for k, pairs in needed.items() if k not in columns for i, _ in pairs}
    if case.source != "window":  # whole rows only: the union of what any leaf needs, every call
        read = [int(i) for ids, _ in reads for i in ids]
        assert set(read) == all_rows, (what, sorted(set(read) ^ all_rows))
        return
    for key in case.leaves:
        pairs = [
            (int(i), c)
            for ids, cols in reads
            if key in cols
            for i in ids
            for c in entries_of(cols[key], case.leaves[key])
        ]
        assert len(pairs) == len(set(pairs)), (what, key, "an element was read twice")
        if key in columns:
            assert set(pairs) == needed[key], (what, key, sorted(set(pairs) ^ needed[key])[:8])
        else:
            rows = {i for i, _ in pairs}
            assert rows == whole_rows, (what, key, sorted(rows ^ whole_rows)[:8])


def entries_of(box: Any, trailing: list[int]) -> list[tuple[int, ...]]:
    """The entries a read of one row cut to ``box`` takes (what ``read_window`` was given: None
    for whole rows, a slice of dimension 1, or a slice or index array per dimension from 1)."""
    if box is None:
        return [()]
    parts = box if isinstance(box, tuple) else (box,)
    ranges = [
        range(n)[part] if isinstance(part, slice) else [int(x) for x in part]
        for part, n in zip(parts, trailing, strict=False)
    ]
    return list(itertools.product(*ranges))
