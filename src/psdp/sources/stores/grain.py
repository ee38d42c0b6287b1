"""The bridge with Grain, both ways; Grain itself is never imported.

`GrainSource`: a Grain-style per-record source (``__len__``, ``__getitem__(int)``) read by psdp in
batches on a small thread pool (``docs/guides/stores.md``). `GrainRecords`: any psdp source (a
store, `TokenSequences`, `PackedSequences`, a `Mixture`) as a Grain random-access data source,
record ``i`` the source's row ``i`` (``docs/guides/grain-maxtext.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp._plan.leaves import in_leaf_order
from psdp.sources.base import Rows, check_ids, fresh_rows, reads_fresh_rows


class GrainSource:
    """Adapts a Grain-style random-access source: ``__len__`` and ``__getitem__(int)`` per record.

    A read fetches the unique ids' records on a thread pool (each thread a contiguous slice) and
    stacks them per leaf; a record is an array or a dict of arrays.

    Args:
        data_source: the per-record source.
        read_threads: threads fetching records; 1 reads on the calling thread.

    Examples:
        >>> records = [{"x": np.array([i, 10 * i])} for i in range(5)]
        >>> with GrainSource(records, read_threads=2) as src:
        ...     src.read(np.array([3, 1, 3]))["x"].tolist()
        [[3, 30], [1, 10], [3, 30]]
    """

    def __init__(self, data_source: Any, *, read_threads: int = 8):
        for method in ("__len__", "__getitem__"):
            if not hasattr(data_source, method):
                raise TypeError(
                    f"GrainSource needs a random-access source with __len__ and "
                    f"__getitem__(int), but {type(data_source).__name__} has no {method}; "
                    "wrap an iterable dataset in a list, or use a grain MapDataset with a length"
                )
        check_int("read_threads", read_threads, minimum=1)
        self._source = data_source
        self.read_threads = read_threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._source)

    @fresh_rows  # records are stacked into new arrays
    def read(self, ids: np.ndarray) -> Rows:
        ids = check_ids(ids, len(self), type(self._source).__name__)
        unique, inverse = np.unique(ids, return_inverse=True)
        if unique.size == 0:  # learn the leaves from record 0, keep none of its rows
            unique, inverse = np.zeros(1, np.int64), np.zeros(0, np.int64)
        records = self._fetch(unique.tolist())
        return _stack_records(records, unique, type(self._source).__name__, inverse)

    def _fetch(self, ids: list[int]) -> list[Any]:
        if self.read_threads == 1 or len(ids) < 2:
            return [self._source[i] for i in ids]
        parts = [p for p in np.array_split(np.asarray(ids), self.read_threads) if p.size]
        pool = self._executor()
        chunks = pool.map(lambda part: [self._source[int(i)] for i in part], parts)
        return [record for chunk in chunks for record in chunk]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="psdp-grain")
            return self._pool

    def close(self) -> None:
        """Stops the fetch threads (a later read starts them again); idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> GrainSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def describe(self) -> str:
        return (
            f"GrainSource({type(self._source).__name__}, {len(self)} records, "
            f"{self.read_threads} threads)"
        )


def _stack_records(
    records: Sequence[Any], ids: np.ndarray, where: str, inverse: np.ndarray
) -> Rows:
    """Stacks per-record arrays (or dicts of arrays) into rows, then repeats rows per ``inverse``."""
    dropped = [int(i) for i, record in zip(ids, records, strict=True) if record is None]
    if dropped:
        raise ValueError(
            f"{where}: record {dropped[0]} is None ({len(dropped)} of the {len(ids)} read), as a "
            "filtered Grain MapDataset gives for each record its filter drops; psdp reads records "
            "by number, so give it a source whose every record is one: drop the .filter (select "
            "rows psdp's way), or keep the records that pass it, e.g. [r for r in ds if r is not None]"
        )
    if isinstance(records[0], Mapping):
        keys = set(records[0])
        for i, record in zip(ids, records, strict=True):
            if not isinstance(record, Mapping) or set(record) != keys:
                got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
                raise ValueError(
                    f"{where}: record {int(ids[0])} has leaves {sorted(keys)} but record {int(i)} "
                    f"has {got}; every record must have the same leaves"
                )
        return in_leaf_order(
            {
                str(k): _stack_leaf([r[k] for r in records], ids, f"{where} leaf {k!r}")[inverse]
                for k in records[0]
            }
        )
    return _stack_leaf(records, ids, where)[inverse]


def _stack_leaf(values: Sequence[Any], ids: np.ndarray, where: str) -> np.ndarray:
    arrays = [np.asarray(v) for v in values]
    first = arrays[0]
    if first.dtype == object:
        raise ValueError(
            f"{where}: record {int(ids[0])} is a {type(values[0]).__name__}, not an array of "
            "numbers; every record must be an array or a dict of arrays of one shape and dtype"
        )
    for i, a in zip(ids, arrays, strict=True):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(
                f"{where}: record {int(i)} is {a.dtype}{list(a.shape)} but record {int(ids[0])} "
                f"is {first.dtype}{list(first.shape)}; every record must have one shape and dtype "
                "(pad or cast the records)"
            )
    return np.stack(arrays)


class GrainRecords:
    """A psdp source as a Grain random-access data source: record ``i`` is row ``i``.

    ``grain.MapDataset.source(GrainRecords(source))`` and ``grain.DataLoader(data_source=...)``
    take it: ``__len__``, ``__getitem__(i)`` (a dict of the row's leaves, or the row of an
    array source) and ``_getitems(indices)``, the batched read hook of Grain releases that have
    one (0.2.18 has it; 0.2.9 reads record by record): one ``source.read`` for all the indices,
    where Grain calls it. A record's arrays are memory nothing else holds (copied where the
    source may refill its buffers), so Grain may keep or change them.
    Thread-safe as the source's reads are; picklable (Grain's worker processes) when the source is.

    Args:
        source: any psdp source (``len`` and ``read(ids)``).

    Examples:
        >>> from psdp.sources.base import ArraySource
        >>> records = GrainRecords(ArraySource({"x": np.arange(6).reshape(3, 2)}))
        >>> len(records), records[2]["x"].tolist(), [int(r["x"][0]) for r in records._getitems([1, 0])]
        (3, [4, 5], [2, 0])
    """

    def __init__(self, source: Any):
        for method in ("__len__", "read"):
            if not hasattr(source, method):
                raise TypeError(
                    f"GrainRecords needs a psdp source (len() and read(ids)), but "
                    f"{type(source).__name__} has no {method}; wrap an array or a dict of arrays "
                    "with psdp.ArraySource, or a Grain source with psdp.GrainSource the other way"
                )
        self.source = source
        self._copy = not reads_fresh_rows(source)  # rows that may be views of a reused buffer

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return self._getitems([index])[0]

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices``, from one read of the source (Grain's batched hook)."""
        ids = np.asarray(indices, dtype=np.int64).reshape(-1)
        rows = self.source.read(check_ids(ids, len(self), self._describe))
        if isinstance(rows, Mapping):
            leaves = {k: np.array(v) if self._copy else v for k, v in rows.items()}
            return [{k: v[i] for k, v in leaves.items()} for i in range(len(ids))]
        rows = np.array(rows) if self._copy else rows
        return list(rows)

    def _describe(self) -> str:
        describe = getattr(self.source, "describe", None)
        return describe() if callable(describe) else type(self.source).__name__

    def __repr__(self) -> str:
        # Grain's DataLoader writes the source's repr into its checkpoints and compares it on
        # restore: it must name the source, never an address
        return f"GrainRecords({self._describe()}, {len(self)} records)"
