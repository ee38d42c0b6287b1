"""`Mixture`: weighted sources read as one, row id = sample offset (``docs/guides/mixtures.md``).

The map from an offset to (source, row) is `psdp._plan.mixture`'s; this module reads: one batched
read per mixed source, rows scattered back in the order of the ids.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from psdp._plan.leaves import Key, in_leaf_order, leaves_of
from psdp._plan.mixture import (
    MIXTURE_ROWS,
    MixturePlan,
    check_block_size,
    check_sources,
    stages_from,
)
from psdp._plan.windows import Box
from psdp.sources.base import Rows, check_ids
from psdp.sources.stores.adapt import as_source
from psdp.sources.stores.streams import StreamSource
from psdp.sources.views.provenance import provenance_dtype

#: The dtype of the ``source_leaf`` tags.
TAG_DTYPE = np.dtype(np.int32)
#: The most sources of one read read at once (a step of a mixture of many stores may touch
#: dozens, and the loader runs up to 32 reads at once): the rest wait their turn on these.
SOURCE_READS_AT_ONCE = 8


class Mixture:
    """Several sources read as one, each sample drawn from a source by weight, exactly per block.

    Row ``g`` of a mixture is its sample offset ``g``: the loader reads it in order
    (``shuffle=False``, the default for a mixture), and the mixture shuffles inside each block and
    each source's epochs. Every ``block_size`` samples hold exactly the per-source counts of their
    stage's weights; each source runs through its own epochs, each a keyed permutation of its rows.

    Args:
        sources: ``{name: source}``; any psdp random-access source (or what `as_source` takes),
            all with the same leaves (names, row shapes, dtypes).
        weights: ``{name: weight}`` for the whole run (unnamed sources: 0); or ``stages``.
        stages: ``[(start_offset, {name: weight}), ...]``, the first at offset 0, starts
            increasing multiples of ``block_size`` (a step's offset: ``loader.step_info(step)``).
        block_size: samples per block, each with exact counts (must give each weighted source a
            sample per block).
        seed: keys the blocks' and the sources' permutations.
        shuffle: permute each source's epochs (``False``: each source in row order).
        source_leaf: the name of an int32 leaf added to each row: its source's position in
            ``sources`` (for a per-source loss); ``None``: no such leaf. Needs dict sources.

    Examples:
        >>> web = {"tokens": np.zeros((100, 4), np.int32)}
        >>> code = {"tokens": np.ones((50, 4), np.int32)}
        >>> mix = Mixture({"web": web, "code": code}, weights={"web": 3, "code": 1},
        ...               block_size=8, source_leaf="source")
        >>> mix.counts(0, 16), mix.read(np.arange(8))["source"].tolist()
        ({'web': 12, 'code': 4}, [0, 1, 0, 0, 0, 1, 0, 0])
    """

    #: The loader's rule for such a source: it orders its own rows, so read them in id order.
    orders_itself = True

    def __init__(
        self,
        sources: Mapping[str, Any],
        *,
        weights: Mapping[str, float] | None = None,
        stages: Sequence[tuple[int, Mapping[str, float]]] | None = None,
        block_size: int = 2048,
        seed: int = 0,
        shuffle: bool = True,
        source_leaf: str | None = None,
    ) -> None:
        if not isinstance(sources, Mapping):
            raise TypeError(
                f"a mixture's sources must be a dict {{name: source}}, got {type(sources).__name__}"
            )
        self.sources = {name: _mixed_source(name, s) for name, s in sources.items()}
        names, lengths = tuple(self.sources), tuple(len(s) for s in self.sources.values())
        check_sources(names, lengths)
        block_size = check_block_size(block_size)
        if not isinstance(shuffle, bool | np.bool_):
            raise TypeError(f"a mixture's shuffle must be True or False, got {shuffle!r}")
        self.plan = MixturePlan(
            names,
            lengths,
            stages_from(names, weights, stages, block_size),
            block_size,
            seed,
            bool(shuffle),
        )
        self.source_leaf = source_leaf
        self._leaves = _agreed_leaves(self.sources)  # in leaf order (leaves_of)
        if source_leaf is not None:
            _check_source_leaf(source_leaf, self._leaves)
        # once: every read names the mixture, and this is O(sources)
        parts = ", ".join(f"{name}: {s.describe()}" for name, s in self.sources.items())
        blocks = f"{len(self.plan.stages)} stage(s), block_size={self.plan.block_size}"
        self._description = f"Mixture({parts}; {blocks})"

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names, in tag order."""
        return self.plan.names

    def __len__(self) -> int:
        return MIXTURE_ROWS

    def read(self, ids: np.ndarray) -> Rows:
        """The rows at sample offsets ``ids``: one batched read per source, in the order of ids."""
        ids = check_ids(ids, MIXTURE_ROWS, self.describe)
        source, rows = self.plan.locate(ids)
        out = self._gather(source, rows, lambda s, r: leaves_of(s.read(r)), list(self._leaves))
        if self.source_leaf is not None:
            out[self.source_leaf] = source.astype(TAG_DTYPE)
        return out[None] if None in out else in_leaf_order(out)

    @property
    def reads_storage(self) -> bool:
        """Whether some mixed source waits on storage (the loader then reads several steps at
        once by default)."""
        return any(bool(getattr(s, "reads_storage", False)) for s in self.sources.values())

    @property
    def read_window(self) -> Any:
        """``read_window(ids, columns)`` when every mixed source has one (so a host reads only
        its columns of a sequence-sharded leaf); absent otherwise."""
        if not all(hasattr(s, "read_window") for s in self.sources.values()):
            raise AttributeError("read_window: a mixed source reads only whole rows")
        return self._read_window

    def _read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        ids = check_ids(ids, MIXTURE_ROWS, self.describe)
        source, rows = self.plan.locate(ids)
        wanted = {
            k: v for k, v in columns.items() if self.source_leaf is None or k != self.source_leaf
        }
        out = self._gather(source, rows, lambda s, r: s.read_window(r, wanted), list(wanted))
        if self.source_leaf is not None and self.source_leaf in columns:
            out[self.source_leaf] = source.astype(TAG_DTYPE)
        return in_leaf_order(out)

    def _gather(self, source: np.ndarray, rows: np.ndarray, read: Any, keys: list[Key]) -> dict:
        """Per leaf in ``keys``, the rows of every id: each source read once (its rows sorted, as
        gathers like), then scattered to the ids' positions."""
        out: dict[Key, np.ndarray] = {}
        if not keys:
            return out
        if not source.size:  # no ids: the leaves' empty rows, as a source returns them
            got = read(next(iter(self.sources.values())), rows)
            return {key: np.asarray(got[key]) for key in keys}
        # one sort by (source, row) groups each source's ids, rows sorted: no loop over sources
        # the batch does not touch
        by_source = np.lexsort((rows, source))
        present, firsts = np.unique(source[by_source], return_index=True)
        groups = [
            (self.names[index], positions)
            for index, positions in zip(
                present.tolist(), np.split(by_source, firsts[1:]), strict=True
            )
        ]
        reads = [partial(read, self.sources[name], rows[positions]) for name, positions in groups]
        # only the sources read (a mixture of thousands reads a few a step)
        storage = any(getattr(self.sources[name], "reads_storage", False) for name, _ in groups)
        for (name, positions), got in zip(groups, _run(reads, storage), strict=True):
            for key in keys:
                value = np.asarray(got[key])
                if key not in out:
                    out[key] = np.empty((len(source), *value.shape[1:]), value.dtype)
                self._check_rows(name, key, value, len(positions), out[key])
                out[key][positions] = value
        return out

    def _check_rows(
        self, name: str, key: Key, value: np.ndarray, ids: int, out: np.ndarray
    ) -> None:
        """Raises unless a source's rows fit the batch as they are: an assignment would cast
        another dtype and broadcast a single row or column, silently."""
        dtype = self._leaves[key][1]
        if value.dtype == dtype and value.shape == (ids, *out.shape[1:]):
            return
        raise ValueError(
            f"source {name!r} of the mixture ({self.sources[name].describe()}) returned leaf "
            f"{key!r} of shape {value.shape} and dtype {value.dtype} for {ids} ids, but the "
            f"mixture needs shape {(ids, *out.shape[1:])} and dtype {dtype}; every read of a "
            "mixed source must return one row per id, all of one shape and dtype"
        )

    def provenance(self, ids: np.ndarray) -> np.ndarray:
        """Where every segment of the rows at sample offsets ``ids`` comes from: each mixed
        source's ``provenance`` table (``docs/guides/mixtures.md``, "Provenance") with its name in
        ``source`` and ``row`` a position in ``ids``, in (row, column) order; reads no token.

        Examples:
            >>> from psdp import DocumentStore, TokenSequences
            >>> views = {name: TokenSequences(DocumentStore.from_documents([np.arange(8)]), 4)
            ...          for name in ("web", "code")}
            >>> mix = Mixture(views, weights={"web": 1, "code": 1}, block_size=2)
            >>> mix.provenance(np.array([0, 1]))[["row", "source"]].tolist()
            [(0, 'web'), (1, 'code')]
        """
        ids = check_ids(ids, MIXTURE_ROWS, self.describe)
        source, rows = self.plan.locate(ids)
        parts = []
        for index, name in enumerate(self.names):
            positions = np.flatnonzero(source == index)
            if not positions.size:
                continue
            if not hasattr(self.sources[name], "provenance"):
                raise TypeError(
                    f"source {name!r} of the mixture ({self.sources[name].describe()}) has no "
                    "provenance; only TokenSequences and PackedSequences have one"
                )
            table = self.sources[name].provenance(rows[positions])
            part = np.zeros(len(table), provenance_dtype(max(map(len, self.names))))
            for field in table.dtype.names:
                part[field] = table[field]
            part["row"], part["source"] = positions[table["row"]], name
            parts.append(part)
        out = np.concatenate(parts) if parts else np.zeros(0, provenance_dtype())
        return out[np.lexsort((out["column"], out["row"]))]

    def counts(self, offset: int, count: int) -> dict[str, int]:
        """Samples each source gives at offsets ``[offset, offset + count)``, reading nothing:
        ``mix.counts(info.offset, info.rows)`` for ``info = loader.step_info(step)``."""
        return dict(zip(self.names, map(int, self.plan.counts_between(offset, count)), strict=True))

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source (a position in `names`) and row within it of each sample offset."""
        return self.plan.locate(check_ids(offsets, MIXTURE_ROWS, self.describe))

    def state_record(self) -> dict[str, Any]:
        """What the samples depend on (JSON values): a loader state records it."""
        return self.plan.record()

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        """Raises unless ``saved`` (a `state_record`) gives the same samples before ``offset``:
        only stages starting at or after the resume offset may differ."""
        self.plan.check_past(saved, offset)

    def describe(self) -> str:
        return self._description


def _mixed_source(name: Any, source: Any) -> Any:
    """``source`` as a psdp source that a mixture can draw rows from by number, or raises."""
    if not isinstance(name, str):
        raise TypeError(
            f"a mixture's source names must be str, got {name!r} ({type(name).__name__}); name "
            "each source by a str (the weights, the source tags and the state use the names)"
        )
    if isinstance(source, StreamSource):
        raise TypeError(
            f"source {name!r} of the mixture is a stream ({source.describe()}): a mixture reads "
            "each source's rows by number, which a StreamSource cannot; mix a random-access "
            "source (arrays, TensorStoreSource, MemmapSource, GrainSource, TokenSequences)"
        )
    source = as_source(source)
    if getattr(source, "orders_itself", False):
        raise ValueError(
            f"source {name!r} is {source.describe()}, which orders its own rows (its row g is its "
            "sample offset g): this mixture would read its rows in a permuted order, scrambling "
            "its stages; mix its sources directly, each with its weight times the inner one's"
        )
    return source


def _agreed_leaves(sources: Mapping[str, Any]) -> dict[Key, tuple[tuple[int, ...], np.dtype]]:
    """The leaves every source has (name -> row shape, dtype), or raises naming one that differs."""
    found = {}
    for name, source in sources.items():
        row = leaves_of(source.read(np.zeros(1, np.int64)))
        found[name] = {k: (np.shape(v)[1:], np.asarray(v).dtype) for k, v in row.items()}
    first, leaves = next(iter(found.items()))
    for name, other in found.items():
        if other == leaves:
            continue
        if set(other) != set(leaves):
            what = f"leaves {sorted(map(str, other))}, but {first!r} has {sorted(map(str, leaves))}"
        else:
            key = next(k for k in leaves if other[k] != leaves[k])
            shape, dtype = other[key]
            what = (
                f"leaf {key!r} with rows of shape {shape} and dtype {dtype}, but {first!r} has "
                f"{leaves[key][0]} {leaves[key][1]}"
            )
        raise ValueError(
            f"mixed sources must have the same leaves (names, row shapes, dtypes): source "
            f"{name!r} has {what}; convert the sources to one layout before mixing them"
        )
    return leaves


def _check_source_leaf(name: Any, leaves: Mapping[Key, Any]) -> None:
    if not isinstance(name, str):
        raise TypeError(f"source_leaf must be a leaf name (a str) or None, got {name!r}")
    if None in leaves:
        raise ValueError(
            f"source_leaf={name!r} adds a leaf, which a single-array source cannot carry; pass "
            "dict sources (e.g. {'tokens': array}) or source_leaf=None"
        )
    if name in leaves:
        raise ValueError(
            f"source_leaf={name!r}, but the sources already have a leaf {name!r}; pick another "
            "source_leaf name"
        )


def _run(reads: Sequence[Callable[[], Any]], storage: bool) -> list[Any]:
    """The results of ``reads`` (one a source), in order: where a source waits on storage
    (``storage``), at once on up to `SOURCE_READS_AT_ONCE` threads (the calling one and daemon
    threads of their own), so a read costs the slowest source's round trips, not their sum; one
    after the other otherwise. The first error is raised once all are done."""
    if len(reads) < 2 or not storage:
        return [read() for read in reads]
    results: list[Any] = [None] * len(reads)
    errors: list[BaseException | None] = [None] * len(reads)

    at_once = min(len(reads), SOURCE_READS_AT_ONCE)

    def run(first: int) -> None:  # reads first, first + at_once, ... one after the other
        for i in range(first, len(reads), at_once):
            try:
                results[i] = reads[i]()
            except BaseException as error:  # raised on the calling thread below
                errors[i] = error

    # daemon threads, as the loader's own: a read that never returns cannot hold up exit
    threads = [
        threading.Thread(target=run, args=(i,), name=f"psdp-mixture-read-{i}", daemon=True)
        for i in range(1, at_once)
    ]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results
