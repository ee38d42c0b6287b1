"""`StagedTokens`: token sources read in stages of ``seq_len``, each stage a source of its own.

The map is `psdp._plan.length_stages`' (``docs/concepts/length-stages.md``): a sample offset is a
source, a lane and ranges of the source's stream. This module reads them: each stage is a
`StageRows` whose row ``r`` is sample offset ``stage start + r`` (a loader reads it in id order,
as a `Mixture`). A read, of whole rows or of a window of columns, takes exactly its columns'
tokens: each store's ranges in one `TokenSequences.read_spans` (one store range per piece of a
row), so EOS tokens and stored leaves are `TokenSequences`' own; ``segment_ids`` and
``positions`` come from the stores' offsets alone, per part of a document.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from psdp._plan.leaves import POSITIONS, SEGMENT_IDS, Key, in_leaf_order
from psdp._plan.length_stages import LengthPlan, Pieces
from psdp._plan.mixture import MIXTURE_ROWS
from psdp._plan.windows import Box, box_parts
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents.index import ranges
from psdp.sources.documents.store import DocumentStore
from psdp.sources.views.mixture import TAG_DTYPE
from psdp.sources.views.provenance import provenance_table
from psdp.sources.views.tokens import TokenSequences


class StagedTokens:
    """Documents of several stores, mixed and cut into rows whose ``seq_len`` changes by stage.

    Its row ``g`` is sample offset ``g`` (``docs/concepts/length-stages.md``); one `DataLoader`
    reads it across all its stages, each step from the stage holding its offsets (a stage must
    start at a step's first offset). `stage` gives one stage's rows alone.

    Args:
        stores: ``{name: DocumentStore}``, all with the same leaves.
        stages: ``[(start_offset, seq_len, {name: weight}), ...]``, the first at 0, starts
            increasing multiples of ``block_size``.
        lanes: lanes per source (`LengthPlan`): at least the most samples of one source a batch
            holds, so they come from distinct places of its stream.
        block_size: samples per mixture block (`Mixture`'s).
        unit_tokens: the unit order's grain; default the longest ``seq_len``.
        seed: keys the mixture's blocks and the unit orders.
        shuffle: order each source's units by key (``False``: the store's order).
        targets: one more token per row (the next row's first), for shifted targets.
        eos_id: the token after each document (unset: none), as `TokenSequences`'.
        pad_id: the padding token, as `TokenSequences`'.
        context: the context axis every ``seq_len`` must divide by.
        source_leaf: the name of an int32 leaf added to each row: its source's position in the
            stores (as `Mixture`'s); ``None``: none.

    Examples:
        >>> store = DocumentStore.from_documents([np.arange(100, 160)])
        >>> staged = StagedTokens({"a": store}, [(0, 4, {"a": 1}), (4, 8, {"a": 1})],
        ...                       lanes=2, block_size=1, shuffle=False)
        >>> staged.stage(0).read(np.arange(4))["input_ids"][:, 0].tolist()
        [100, 130, 104, 134]
        >>> staged.stage(1).read(np.arange(2))["input_ids"].tolist()  # each lane goes on
        [[108, 109, 110, 111, 112, 113, 114, 115], [138, 139, 140, 141, 142, 143, 144, 145]]
    """

    def __init__(
        self,
        stores: Mapping[str, DocumentStore],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        *,
        lanes: int,
        block_size: int = 2048,
        unit_tokens: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        targets: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
        context: int = 1,
        source_leaf: str | None = None,
    ) -> None:
        if not isinstance(stores, Mapping) or not stores:
            raise TypeError(
                f"stores must be a non-empty dict {{name: DocumentStore}}, got {stores!r}"
            )
        self.streams = {
            name: TokenSequences(store, 1, eos_id=eos_id, pad_id=pad_id)
            for name, store in stores.items()
        }
        longest = max((stage[1] for stage in stages if _is_stage(stage)), default=1)
        self.plan = LengthPlan(
            tuple(self.streams),
            tuple(s.stream_tokens for s in self.streams.values()),
            stages,
            block_size=block_size,
            lanes=lanes,
            unit_tokens=longest if unit_tokens is None else unit_tokens,
            seed=seed,
            shuffle=shuffle,
            extra=int(targets),
            context=context,
        )
        leaves = [s.leaves for s in self.streams.values()]
        if any(other != leaves[0] for other in leaves[1:]):
            raise ValueError(
                f"the stores' leaves differ ({dict(zip(self.streams, leaves, strict=True))}); "
                "a mixture's rows need the same leaves and dtypes from every store"
            )
        self.leaves = with_source_leaf(leaves[0], source_leaf)
        self.source_leaf = source_leaf

    #: a loader reads it in id order: row ``g`` is sample offset ``g`` (the plan shuffles)
    orders_itself = True

    def __len__(self) -> int:
        return MIXTURE_ROWS

    @property
    def reads_storage(self) -> bool:
        """Whether some store waits on storage (the loader then reads several steps at once by
        default), as a `Mixture`'s.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(100, 160)])
            >>> StagedTokens({"a": store}, [(0, 4, {"a": 1})], lanes=2, block_size=1).reads_storage
            False
        """
        return any(stream.reads_storage for stream in self.streams.values())

    @property
    def stage_starts(self) -> tuple[int, ...]:
        """Each stage's first sample offset: a loader plans each stage's rows apart (their width
        differs) and reads a step from the stage holding its offsets."""
        return tuple(stage.start for stage in self.plan.stages)

    def stage_at(self, offset: int) -> int:
        """The stage holding sample offset ``offset``."""
        return bisect.bisect_right(self.stage_starts, offset) - 1

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[Key, np.ndarray]:
        """Rows at sample offsets ``ids``, all of one stage (rows of two stages differ in width).

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(100, 160)])
            >>> staged = StagedTokens({"a": store}, [(0, 4, {"a": 1}), (4, 8, {"a": 1})],
            ...                       lanes=2, block_size=1, shuffle=False)
            >>> staged.read(np.array([4, 5]))["input_ids"][:, :3].tolist()
            [[108, 109, 110], [138, 139, 140]]
        """
        ids = check_ids(ids, len(self), self.describe)
        if not ids.size:
            return self.stage(0).read(ids)
        index = self.stage_at(int(ids.min()))
        if self.stage_at(int(ids.max())) != index:
            raise ValueError(
                f"sample offsets {int(ids.min())} to {int(ids.max())} of {self.describe()} lie in "
                f"stages {index} to {self.stage_at(int(ids.max()))}, whose rows differ in "
                "seq_len; read each stage's offsets apart (a DataLoader reads a step from one stage)"
            )
        return self.stage(index).read(ids - self.stage_starts[index])

    @property
    def names(self) -> tuple[str, ...]:
        """The sources, in the plan's order (a position in it is a source number)."""
        return self.plan.names

    def counts(self, offset: int, count: int) -> dict[str, int]:
        """Samples each source gives at offsets ``[offset, offset + count)``, reading nothing
        (`Mixture.counts`')."""
        return dict(zip(self.names, map(int, self.plan.mixture.counts_between(offset, count)),
                        strict=True))  # fmt: skip

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source (a position in `names`) of each sample offset, and its sample number in
        that source."""
        _, source, sample = self.plan.mixture.slots(np.asarray(offsets, np.int64).reshape(-1))
        return source, sample

    def provenance(self, offsets: np.ndarray) -> np.ndarray:
        """Where every segment of the rows at sample ``offsets`` comes from: a
        `provenance_table` row per (piece of the stream, document), in row then column order;
        reads no token (each store's offsets, once).

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(100, 110), np.arange(5)])
            >>> staged = StagedTokens({"a": store}, [(0, 4, {"a": 1}), (2, 8, {"a": 1})],
            ...                       lanes=1, block_size=1, shuffle=False)
            >>> table = staged.provenance(np.array([2]))  # the lane ends: on in epoch 1
            >>> table[["row", "column", "document", "start", "stop"]].tolist()
            [(0, 0, 0, 8, 10), (0, 2, 1, 0, 5), (0, 7, 0, 0, 1)]
        """
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        pieces = self.plan.store_pieces(offsets)
        none = np.zeros(0, np.int64)
        parts = [provenance_table(none, none, none, none, none, none.astype(bool))]
        for source, stream in enumerate(self.streams.values()):
            at = np.flatnonzero(pieces.source == source)
            first, stop = pieces.start[at], pieces.start[at] + pieces.size[at]
            eos = stream.eos_id is not None
            got = stream.store.documents_touching(first, stop, eos=eos)  # their offsets only
            of = np.repeat(np.arange(len(at)), got.count)
            size = got.stop - got.start
            end = got.stream_start + size + (size > 0) * eos  # each document's slots' end
            low, high = np.maximum(first[of], got.stream_start), np.minimum(stop[of], end)
            keep = high > low
            parts.append(provenance_table(
                pieces.row[at][of], pieces.column[at][of] + low - first[of],
                stream.store.source_ids(got.doc), low - got.stream_start,
                np.minimum(high - got.stream_start, size), high - got.stream_start > size,
            )[keep])  # fmt: skip
        table = np.concatenate(parts)
        return table[np.lexsort((table["column"], table["row"]))]

    def state_record(self) -> dict[str, Any]:
        """What the samples depend on (JSON values): a loader state records it."""
        return self.plan.record()

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        """Raises unless ``saved`` (a `state_record`) gives the same samples before ``offset``:
        only stages starting at or after the resume offset may differ."""
        self.plan.check_past(saved, offset)

    def stage(self, index: int) -> StageRows:
        """Stage ``index``'s rows, a source whose row ``r`` is offset ``start + r``."""
        if not 0 <= index < len(self.plan.stages):
            raise IndexError(f"stage {index} does not exist: there are {len(self.plan.stages)}")
        return StageRows(self, index)

    def describe(self) -> str:
        lengths = [stage.seq_len for stage in self.plan.stages]
        return f"StagedTokens({', '.join(self.streams)}; seq_len by stage {lengths})"


class StageRows:
    """One stage of a `StagedTokens`: row ``r`` is sample offset ``start + r`` of the run.

    It reads its rows in id order (``orders_itself``: the plan shuffles). Its length is endless,
    as a mixture's, so a loader never wraps back to its first row; a row past the stage's end is
    refused, naming the stage that holds it. ``segment_ids`` number each row's segments from 1:
    a new one at each document and wherever the row goes on at another place of its store's
    stream (the next unit of the epoch's order, or the lane's next epoch).
    """

    orders_itself = True

    def __init__(self, staged: StagedTokens, index: int) -> None:
        stages = staged.plan.stages
        self.staged, self.index = staged, index
        self.start, self.seq_len = stages[index].start, stages[index].seq_len
        self.stop = stages[index + 1].start if index + 1 < len(stages) else MIXTURE_ROWS
        self.width = self.seq_len + staged.plan.extra

    def __len__(self) -> int:
        return MIXTURE_ROWS - self.start

    @property
    def reads_storage(self) -> bool:
        """Its `StagedTokens`' ``reads_storage``."""
        return self.staged.reads_storage

    @property
    def leaves(self) -> dict[str, np.dtype]:
        return dict(self.staged.leaves)

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[Key, np.ndarray]:
        offsets = self._offsets(ids)
        return self._tagged(offsets, self._read_at(offsets, None), None)

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Some leaves, each cut to a range (or index array) of columns inside the row, reading
        exactly those columns' tokens from the stores (one range per piece of a row: a row
        across a unit or an epoch is two); ``segment_ids`` and ``positions`` come from the
        stores' offsets, reading no token.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(100, 160)])
            >>> rows = StagedTokens({"a": store}, [(0, 8, {"a": 1})], lanes=2, block_size=1,
            ...                     shuffle=False).stage(0)
            >>> rows.read_window(np.array([1]), {"input_ids": slice(2, 5)})["input_ids"].tolist()
            [[132, 133, 134]]
        """
        offsets = self._offsets(ids)
        tag = self.staged.source_leaf
        wanted = {k: v for k, v in columns.items() if tag is None or k != tag}
        return self._tagged(offsets, self._read_at(offsets, wanted), columns)

    def _tagged(
        self, offsets: np.ndarray, out: dict[Key, np.ndarray], columns: Mapping[Key, Box] | None
    ) -> dict[Key, np.ndarray]:
        """``out`` with the source leaf (where one is asked for): each row's source, read from
        the plan alone."""
        tag = self.staged.source_leaf
        if tag is not None and (columns is None or tag in columns):
            _, source, _ = self.staged.plan.mixture.slots(offsets)
            out[tag] = source.astype(TAG_DTYPE)
        return in_leaf_order(out)

    def _read_at(
        self, offsets: np.ndarray, columns: Mapping[Key, Box] | None
    ) -> dict[Key, np.ndarray]:
        """The store leaves of the rows at ``offsets``: whole (``columns=None``), or each cut
        to its columns."""
        pieces = self._pieces(offsets)  # once for every span of columns
        if columns is None:
            names = [n for n in self.leaves if n != self.staged.source_leaf]
            return self._columns(pieces, len(offsets), 0, self.width, names)
        by_span: dict[tuple[int, int], list[str]] = {}
        picks: dict[str, np.ndarray | None] = {}
        for key, box in columns.items():
            if key not in self.leaves:
                raise KeyError(f"{key!r} is not a leaf of {self.describe()}")
            assert isinstance(key, str)  # a store's leaves are named
            parts = box_parts(box)
            if len(parts) > 1:
                raise ValueError(f"rows of {self.describe()} have one dimension after the batch")
            first, stop, picks[key] = _span(parts[0] if parts else slice(0, self.width))
            if first < 0 or stop > self.width:
                raise ValueError(
                    f"columns [{first}, {stop}) of {self.describe()} reach past its rows' "
                    f"{self.width} columns; a stage's row does not continue into its neighbours "
                    "(use a pad halo, not 'continue')"
                )
            by_span.setdefault((first, stop), []).append(key)
        out: dict[Key, np.ndarray] = {}
        for (first, stop), keys in by_span.items():
            got = self._columns(pieces, len(offsets), first, stop, keys)
            for key in keys:
                pick = picks[key]
                out[key] = got[key] if pick is None else got[key][:, pick]
        return out

    def _offsets(self, ids: np.ndarray) -> np.ndarray:
        ids = check_ids(ids, len(self), self.describe)
        offsets = ids + self.start
        if ids.size and offsets.max() >= self.stop:
            raise IndexError(
                f"row {int(ids.max())} of stage {self.index} is sample offset "
                f"{int(offsets.max())}, where stage {self.index + 1} starts (at {self.stop}) "
                f"with another seq_len; stage {self.index} holds {self.stop - self.start} rows: "
                f"read the rest from stage {self.index + 1}'s rows"
            )
        return offsets

    def _pieces(self, offsets: np.ndarray) -> Pieces:
        """The rows at ``offsets`` as ranges of the stores (`LengthPlan.store_pieces`)."""
        if not offsets.size:  # no rows: no pieces (the plan's map wants one at least)
            return Pieces(*(np.zeros(0, np.int64) for _ in Pieces._fields))
        return self.staged.plan.store_pieces(offsets)

    def _columns(
        self, pieces: Pieces, count: int, first: int, stop: int, names: list[str]
    ) -> dict[Key, np.ndarray]:
        """Leaves ``names`` at columns ``[first, stop)`` of the ``count`` rows made of
        ``pieces``, reading exactly those columns' tokens: one store range per piece."""
        computed = [n for n in names if n in (SEGMENT_IDS, POSITIONS)]
        out = self._leaves_at(pieces, count, first, stop, [n for n in names if n not in computed])
        if computed:
            out.update(self._computed(pieces, count, first, stop, computed))
        return out

    def _leaves_at(
        self, pieces: Pieces, count: int, first: int, stop: int, names: list[str]
    ) -> dict[Key, np.ndarray]:
        """Leaves ``names`` at columns ``[first, stop)``: each source's pieces cut to them and
        read in one `TokenSequences.read_spans`, exactly their tokens."""
        shape = (count, stop - first)
        if not names or stop <= first:
            return {n: np.zeros(shape, self.leaves[n]) for n in names}
        mine = _clipped(pieces, first, stop)
        streams = list(self.staged.streams.values())
        used = np.unique(mine.source).tolist()
        if len(used) == 1:  # the pieces in row and column order tile the window: no placing
            got = streams[used[0]].read_spans(mine.start, mine.start + mine.size, names)
            return {n: got[n].reshape(shape) for n in names}
        out: dict[Key, np.ndarray] = {n: np.zeros(shape, self.leaves[n]) for n in names}
        flat = {n: leaf.reshape(-1) for n, leaf in out.items()}
        before = np.cumsum(mine.size) - mine.size  # each piece's place in the window
        for source in used:
            at = mine.source == source
            got = streams[source].read_spans(mine.start[at], mine.start[at] + mine.size[at], names)
            places = ranges(before[at], mine.size[at])
            for name in names:
                flat[name][places] = got[name]
        return out

    def _computed(
        self, pieces: Pieces, count: int, first: int, stop: int, names: list[str]
    ) -> dict[Key, np.ndarray]:
        """``segment_ids`` and ``positions`` at columns ``[first, stop)``, from the stores'
        offsets alone (no token read), per part of a document: segments numbered from 1 at
        column 0 of each row (those before ``first`` counted), positions each token's place in
        its document."""
        shape = (count, stop - first)
        if stop <= first:
            return {n: np.zeros(shape, self.leaves[n]) for n in names}
        numbered = SEGMENT_IDS in names
        parts = self._parts(pieces, 0 if numbered else first, stop)
        before = np.zeros(count, np.int64)
        if numbered and first > 0:  # count the segments starting before the window, then cut
            early = parts.column < first
            before = np.bincount(parts.row[early], parts.new[early], count).astype(np.int64)
            parts = _cut(parts, first)
        if len(self.staged.streams) > 1:  # each source's parts in order: all of them in order
            parts = _Parts(*(a[np.lexsort((parts.column, parts.row))] for a in parts))
        out: dict[Key, np.ndarray] = {}
        if numbered:
            per_row = np.bincount(parts.row, parts.new, count).astype(np.int64)
            number = np.cumsum(parts.new) - (np.cumsum(per_row) - per_row)[parts.row]
            number = (number + before[parts.row]).astype(self.leaves[SEGMENT_IDS])
            out[SEGMENT_IDS] = np.repeat(number, parts.size).reshape(shape)
        if POSITIONS in names:
            dtype = self.leaves[POSITIONS]
            work = dtype if count * (stop - first) < 2**31 else np.dtype(np.int64)
            out[POSITIONS] = ranges(parts.within, parts.size, work).astype(dtype).reshape(shape)
        return out

    def _parts(self, pieces: Pieces, first: int, stop: int) -> _Parts:
        """The parts of documents in columns ``[first, stop)`` of the rows, each source's in
        row and column order (one `DocumentStore.documents_touching` a source)."""
        keep = np.minimum(pieces.column + pieces.size, stop) > np.maximum(pieces.column, first)
        # a piece starts a segment where the row goes on elsewhere; one cut at `first` goes on
        jump = (~_going_on(pieces) & (pieces.column >= first))[keep]
        mine = _clipped(pieces, first, stop)
        none = np.zeros(0, np.int64)
        parts = [_Parts(none, none, none, np.zeros(0, bool), none)]  # no rows: no parts
        for source, stream in enumerate(self.staged.streams.values()):
            at = np.flatnonzero(mine.source == source)
            if not at.size:
                continue
            lo = mine.start[at]
            hi = lo + mine.size[at]
            eos = stream.eos_id is not None
            docs = stream.store.documents_touching(lo, hi, eos=eos)
            span = np.repeat(np.arange(at.size), docs.count)
            length = docs.stop - docs.start
            start = np.maximum(docs.stream_start, lo[span])
            size = np.minimum(docs.stream_start + length + (eos & (length > 0)), hi[span]) - start
            held = size > 0  # not an empty document
            span, start, size = span[held], start[held], size[held]
            opens = np.concatenate([[True], span[1:] != span[:-1]])  # a span's first part
            doc_start = docs.stream_start[held]
            new = (doc_start >= lo[span]) | (opens & jump[at][span])
            column = mine.column[at][span] + start - lo[span]
            parts.append(_Parts(mine.row[at][span], column, size, new, start - doc_start))
        return _Parts(*(np.concatenate(a) for a in zip(*parts, strict=True)))

    def describe(self) -> str:
        return (
            f"stage {self.index} of {self.staged.describe()} (offsets from {self.start}, "
            f"seq_len={self.seq_len}{' + 1' if self.width > self.seq_len else ''})"
        )


def with_source_leaf(leaves: Mapping[str, np.dtype], name: str | None) -> dict[str, np.dtype]:
    """The leaves of rows that carry a source leaf ``name`` (int32) too, checked to be new.

    Examples:
        >>> with_source_leaf({"input_ids": np.dtype(np.int32)}, "input_ids")
        Traceback (most recent call last):
            ...
        ValueError: source_leaf='input_ids', but the stores already have a leaf 'input_ids'; pick another source_leaf name, e.g. source_leaf='source'
    """
    if name is None:
        return dict(leaves)
    if not isinstance(name, str) or not name:
        raise TypeError(f"source_leaf must be a leaf name (a non-empty str) or None, got {name!r}")
    if name in leaves:
        raise ValueError(
            f"source_leaf={name!r}, but the stores already have a leaf {name!r}; pick another "
            "source_leaf name, e.g. source_leaf='source'"
        )
    return {**leaves, name: TAG_DTYPE}


class _Parts(NamedTuple):
    """Parts of documents in rows: part ``i`` is ``size[i]`` tokens of row ``row[i]`` from
    column ``column[i]``, from place ``within[i]`` of its document; ``new[i]``: a segment
    starts at its first column."""

    row: np.ndarray
    column: np.ndarray
    size: np.ndarray
    new: np.ndarray
    within: np.ndarray


def _cut(parts: _Parts, first: int) -> _Parts:
    """The parts cut to columns ``first`` on; a part cut there starts no segment there."""
    keep = parts.column + parts.size > first
    column = np.maximum(parts.column, first)[keep]
    shift = column - parts.column[keep]
    return _Parts(parts.row[keep], column, parts.size[keep] - shift,
                  parts.new[keep] & (shift == 0), parts.within[keep] + shift)  # fmt: skip


def _clipped(pieces: Pieces, first: int, stop: int) -> Pieces:
    """The pieces cut to columns ``[first, stop)`` of their rows (empty ones dropped); columns
    stay the row's."""
    lo = np.maximum(pieces.column, first)
    hi = np.minimum(pieces.column + pieces.size, stop)
    keep = hi > lo
    shift = (lo - pieces.column)[keep]
    return Pieces(pieces.row[keep], lo[keep], pieces.source[keep], pieces.epoch[keep],
                  pieces.start[keep] + shift, (hi - lo)[keep])  # fmt: skip


def _going_on(pieces: Pieces) -> np.ndarray:
    """Whether each piece goes on right where the piece before it in its row ends, in the same
    source's stream (so no new segment starts at its first column)."""
    same_row = np.concatenate([[False], pieces.row[1:] == pieces.row[:-1]])
    ends = np.concatenate([[-1], (pieces.start + pieces.size)[:-1]])
    sources = np.concatenate([[-1], pieces.source[:-1]])
    return same_row & (ends == pieces.start) & (sources == pieces.source)


def _span(part: Any) -> tuple[int, int, np.ndarray | None]:
    """A box's columns as a span ``[first, stop)`` and, for an index array, the columns to
    pick from the span."""
    if isinstance(part, slice):
        return int(part.start or 0), int(part.stop), None
    columns = np.asarray(part, np.int64)
    if not columns.size:
        return 0, 0, columns
    first = int(columns.min())
    return first, int(columns.max()) + 1, columns - first


def _is_stage(stage: Any) -> bool:
    return isinstance(stage, Sequence) and len(stage) == 3 and isinstance(stage[1], int)
