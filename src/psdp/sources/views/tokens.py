"""`TokenSequences`: fixed-length sequences cut from a `DocumentStore` at read time.

The documents are concatenated (with an optional EOS token after each) and split into rows of
``seq_len`` tokens: row ``r`` is ``stream[r * seq_len : r * seq_len + width]``, so the sequence
length is chosen when reading, not when writing. A read works per row, never per token in
Python: the store finds the few documents each row touches (`DocumentStore.documents_touching`,
from its index and a range of its offsets), each row's tokens are one range of the store
(`DocumentStore.read_ranges`), and ``segment_ids`` and ``positions`` are filled from the
documents' boundaries with a handful of numpy calls for the whole batch. A window of columns
``[a, b)`` of a row reads only ``stream[r * seq_len + a : r * seq_len + b]``. ``docs/guides/tokens.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp._plan.leaves import POSITIONS, SEGMENT_IDS, TOKENS, Key, in_leaf_order
from psdp._plan.windows import Box, box_parts
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents.index import TouchedDocuments
from psdp.sources.documents.store import (
    DocumentStore,
    check_view_of,
    chosen_leaves,
)
from psdp.sources.views.provenance import provenance_table


class TokenSequences:
    """Rows of ``seq_len`` tokens cut from the concatenated documents of a `DocumentStore`.

    Row ``r`` holds stream tokens ``r * seq_len`` up to ``r * seq_len + width``, where the stream
    is the documents back to back (each followed by ``eos_id`` when given) and ``width`` is
    ``seq_len``, or ``seq_len + 1`` with ``targets=True`` (the extra token is the next row's
    first: inputs ``row[:-1]``, shifted targets ``row[1:]``). Tokens left over after the last
    whole row are not read.

    Leaves: every store leaf (``input_ids``, and e.g. a ``loss_mask``), ``segment_ids`` (the
    document's index in the store plus one) and ``positions`` (the token's position in its
    document), the last two computed from the offsets without reading tokens. An EOS token
    belongs to the document it ends (its position follows the document's last token); the other
    store leaves hold 0 there.

    A window of columns (``read_window``, used by the loader for a sequence-sharded leaf or a
    halo) reads only those tokens of each row, one contiguous range of the store. With the halo
    boundary ``"continue"`` a row's halo holds the tokens that continue it in the stream (the end
    of the row before, the start of the row after); beyond the stream's ends, ``input_ids`` hold
    ``pad_id`` and every other leaf 0.

    Args:
        store: the documents.
        seq_len: tokens per row (and the stride between rows).
        targets: one more token per row, for shifted targets.
        eos_id: a token inserted after every document; ``None``: none.
        pad_id: ``input_ids`` beyond the stream's ends (halos of ``"continue"`` only); any id
            the token dtype holds (``eos_id`` too).
        leaves: the leaves to deliver, e.g. ``("input_ids", "segment_ids")`` to leave out
            ``positions``; default every leaf. A computed leaf left out costs nothing.

    Examples:
        >>> store = DocumentStore.from_documents([np.array([11, 12, 13]), np.array([21, 22])])
        >>> rows = TokenSequences(store, 3, eos_id=0)  # stream: 11 12 13 0 21 22 0
        >>> len(rows), rows.read(np.array([1, 0]))["input_ids"].tolist()
        (2, [[0, 21, 22], [11, 12, 13]])
        >>> got = rows.read(np.array([1]))
        >>> got["segment_ids"].tolist(), got["positions"].tolist()
        ([[1, 2, 2]], [[3, 0, 1]])
        >>> rows.read_window(np.array([1]), {"input_ids": slice(-1, 4)})["input_ids"].tolist()
        [[13, 0, 21, 22, 0]]
    """

    #: the halo boundary ``"continue"`` is served: columns before 0 and past the row's width are
    #: the stream's neighbouring tokens (``docs/concepts/partitioning.md``)
    continues_rows = True

    def __init__(
        self,
        store: DocumentStore,
        seq_len: int,
        *,
        targets: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
        leaves: tuple[str, ...] | None = None,
    ):
        check_view_of(store, "TokenSequences", eos_id=eos_id, pad_id=pad_id)
        check_int("seq_len", seq_len, minimum=1)
        if not isinstance(targets, bool):
            raise TypeError(f"targets must be a bool, got {type(targets).__name__} {targets!r}")
        self.store, self.seq_len, self.targets = store, int(seq_len), targets
        self.eos_id, self.pad_id = eos_id, int(pad_id)
        self.width = self.seq_len + int(targets)
        self._eos = eos_id is not None
        #: the stream's size: every token, and an EOS after each non-empty document if asked
        self.stream_tokens = store.index.stream_tokens(self._eos)
        self._len = max(0, (self.stream_tokens - int(targets)) // self.seq_len)
        if self._len == 0:
            raise ValueError(
                f"the store has {self.stream_tokens} tokens (EOS included), fewer than one row of "
                f"seq_len={self.seq_len}{' + 1 target' if targets else ''}; use a shorter "
                "seq_len or more documents"
            )
        ids_dtype = np.int32 if store.num_documents < np.iinfo(np.int32).max else np.int64
        computed = {
            SEGMENT_IDS: np.dtype(ids_dtype),
            POSITIONS: np.dtype(np.int32 if store.index.longest < 2**31 - 1 else np.int64),
        }
        self._dtypes = chosen_leaves({**store.leaves, **computed}, leaves, "TokenSequences")

    def __len__(self) -> int:
        return self._len

    @property
    def reads_storage(self) -> bool:
        """Whether its reads wait on storage: its store's `DocumentStore.reads_storage`."""
        return self.store.reads_storage

    @property
    def leaves(self) -> dict[str, np.dtype]:
        """The leaves of every row and their dtypes."""
        return dict(self._dtypes)

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[Key, np.ndarray]:
        ids = check_ids(ids, self._len, self.describe)
        return self._read(ids, {name: slice(0, self.width) for name in self._dtypes})

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Some leaves, each cut to a range (or index array) of columns of every row.

        Columns may lie before 0 or past the row's width (the halo boundary ``"continue"``):
        they are the stream's neighbouring tokens.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(10, 18)])
            >>> rows = TokenSequences(store, 4)
            >>> rows.read_window(np.array([1]), {"input_ids": slice(1, 3)})["input_ids"].tolist()
            [[15, 16]]
        """
        ids = check_ids(ids, self._len, self.describe)
        boxes: dict[Key, Any] = {}
        for key, box in columns.items():
            if key not in self._dtypes:
                raise KeyError(f"{key!r} is not a leaf of {self.describe()}")
            parts = box_parts(box)
            if len(parts) > 1:
                raise ValueError(f"rows of {self.describe()} have one dimension after the batch")
            boxes[key] = parts[0] if parts else slice(0, self.width)
        return self._read(ids, boxes)

    def read_spans(
        self, starts: Any, stops: Any, leaves: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Leaves ``leaves`` (default all) at stream positions ``[starts[i], stops[i])`` for
        every ``i``, concatenated in order. Each span's tokens are one range of the store, read
        exactly (EOS tokens are not stored); ``segment_ids`` (the document's index plus one) and
        ``positions`` read no token.

        Examples:
            >>> store = DocumentStore.from_documents([np.array([11, 12, 13]), np.array([21, 22])])
            >>> rows = TokenSequences(store, 3, eos_id=0)  # stream: 11 12 13 0 21 22 0
            >>> got = rows.read_spans([2, 0], [5, 1])
            >>> got["input_ids"].tolist(), got["segment_ids"].tolist(), got["positions"].tolist()
            ([13, 0, 21, 11], [1, 1, 2, 1], [2, 3, 0, 0])
        """
        lo, hi = np.asarray(starts), np.asarray(stops)
        if (
            lo.ndim != 1 or lo.shape != hi.shape
            or (lo.size and not (np.issubdtype(lo.dtype, np.integer) and np.issubdtype(hi.dtype, np.integer)))
        ):  # fmt: skip
            raise TypeError(
                f"starts and stops must be 1-D integer arrays of one length, got shapes "
                f"{lo.shape} and {hi.shape} of {lo.dtype} and {hi.dtype}"
            )
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        bad = (lo < 0) | (hi < lo) | (hi > self.stream_tokens)
        if bad.any():
            at = int(np.argmax(bad))
            raise ValueError(
                f"span {at} of {self.describe()} is [{int(lo[at])}, {int(hi[at])}); a span needs "
                f"0 <= start <= stop <= {self.stream_tokens} (the stream's tokens): read spans "
                "inside the stream"
            )
        names = list(self._dtypes) if leaves is None else list(leaves)
        unknown = [name for name in names if name not in self._dtypes]
        if unknown:
            raise KeyError(
                f"{unknown} are not leaves of {self.describe()}: it has {list(self._dtypes)}"
            )
        out: dict[str, np.ndarray] = {}
        size = hi - lo
        total = int(size.sum())
        stored = [name for name in names if name in self.store.leaves]
        if not (self._eos or SEGMENT_IDS in names or POSITIONS in names):
            # no EOS: stream positions are token positions, and a span one range of the store
            return self.store.read_ranges(lo, hi, stored) if stored else out
        pieces = _Pieces.of(self.store, lo, hi, self._eos)
        if SEGMENT_IDS in names:
            numbers = (pieces.docs.doc + 1).astype(self._dtypes[SEGMENT_IDS])
            out[SEGMENT_IDS] = np.repeat(numbers, pieces.size)
        if POSITIONS in names:
            out[POSITIONS] = pieces.positions(self._dtypes[POSITIONS])
        if not stored:
            return out
        before = np.cumsum(size) - size  # each span's first place in the concatenation
        begin, count, eos_rows, eos_columns = pieces.token_ranges(lo, lo, hi, self._eos)
        held = count > 0
        got = self.store.read_ranges(begin[held], begin[held] + count[held], stored)
        if not len(eos_rows):
            return out | got
        token = np.ones(total, bool)
        eos_at = before[eos_rows] + eos_columns
        token[eos_at] = False
        for name, values in got.items():
            leaf = np.zeros(total, values.dtype)
            leaf[token] = values
            if name == TOKENS:
                leaf[eos_at] = self.eos_id
            out[name] = leaf
        return out

    def _read(self, ids: np.ndarray, boxes: Mapping[Key, Any]) -> dict[Key, np.ndarray]:
        """Each leaf's columns of rows ``ids``; one window per distinct span of columns."""
        by_span: dict[tuple[int, int], list[str]] = {}
        picks: dict[str, np.ndarray | None] = {}
        for key, part in boxes.items():
            assert isinstance(key, str)  # a store's leaves are named
            first, stop, picks[key] = _span(part, self.width)
            by_span.setdefault((first, stop), []).append(key)
        out: dict[Key, np.ndarray] = {}
        for (first, stop), keys in by_span.items():
            got = self._window(ids * self.seq_len + first, stop - first, keys)
            for key in keys:
                pick = picks[key]
                out[key] = got[key] if pick is None else got[key][:, pick]
        return in_leaf_order(out)

    def _window(self, starts: np.ndarray, width: int, names: list[str]) -> dict[str, np.ndarray]:
        """The leaves ``names`` at stream positions ``[starts[i], starts[i] + width)``, which may
        reach past the stream's ends (padding there)."""
        window = _Window.of(starts, width, self.stream_tokens)
        out: dict[str, np.ndarray] = {}
        stored = [name for name in names if name in self.store.leaves]
        if self._eos or SEGMENT_IDS in names or POSITIONS in names:
            pieces = _Pieces.of(self.store, window.lo, window.hi, self._eos)
            if SEGMENT_IDS in names:
                ids = (pieces.docs.doc + 1).astype(self._dtypes[SEGMENT_IDS])
                out[SEGMENT_IDS] = window.placed(np.repeat(ids, pieces.size), 0)
            if POSITIONS in names:
                out[POSITIONS] = window.placed(pieces.positions(self._dtypes[POSITIONS]), 0)
            tokens = pieces.token_ranges(window.starts, window.lo, window.hi, self._eos)
        else:  # no EOS: stream positions are token positions
            none = np.zeros(0, np.int64)
            tokens = (window.lo, window.hi - window.lo, none, none)
        if stored:
            out.update(self._stored(window, tokens, stored))
        return out

    def _stored(
        self, window: _Window, tokens: _TokenRanges, names: list[str]
    ) -> dict[str, np.ndarray]:
        """The store's leaves ``names`` in the window: each row's tokens are one range of the
        store, placed around its EOS tokens and padding."""
        begin, count, eos_rows, eos_columns = tokens
        held = count > 0
        got = self.store.read_ranges(begin[held], begin[held] + count[held], names)
        shape = (len(window.starts), window.width)
        if not self._eos and window.inside is None:  # each row one whole range of the store
            return {name: values.reshape(shape) for name, values in got.items()}
        token = np.ones(shape, bool) if window.inside is None else window.inside.copy()
        token[eos_rows, eos_columns] = False
        out = {}
        for name, values in got.items():
            leaf = np.full(shape, self.pad_id if name == TOKENS else 0, values.dtype)
            leaf[token] = values
            if self.eos_id is not None and name == TOKENS:
                leaf[eos_rows, eos_columns] = self.eos_id
            out[name] = leaf
        return out

    def provenance(self, ids: np.ndarray) -> np.ndarray:
        """Where every segment (the part of a document in a row, of its ``width`` columns) of
        rows ``ids`` comes from: a `provenance_table` row per segment; reads no token.

        Examples:
            >>> store = DocumentStore.from_documents([np.array([11, 12, 13]), np.array([21, 22])])
            >>> table = TokenSequences(store, 3, eos_id=0).provenance(np.array([1]))
            >>> table[["row", "column", "document", "start", "stop", "eos"]].tolist()
            [(0, 0, 0, 3, 3, True), (0, 1, 1, 0, 2, False)]
        """
        ids = check_ids(ids, self._len, self.describe)
        window = _Window.of(ids * self.seq_len, self.width, self.stream_tokens)
        p = _Pieces.of(self.store, window.lo, window.hi, self._eos)
        stop = np.minimum(p.within + p.size, p.length)
        column = p.docs.stream_start + p.within - window.starts[p.row]
        document = self.store.source_ids(p.docs.doc)
        return provenance_table(p.row, column, document, np.minimum(p.within, p.length), stop,
                                p.within + p.size > p.length)  # fmt: skip

    def describe(self) -> str:
        eos = "" if self.eos_id is None else f", eos_id={self.eos_id}"
        return (
            f"TokenSequences({len(self)} rows of seq_len={self.seq_len}"
            f"{' + 1' if self.targets else ''}{eos}, {self.store.describe()})"
        )


def _span(part: Any, width: int) -> tuple[int, int, np.ndarray | None]:
    """A box's columns as a span ``[first, stop)`` (a slice may start before 0 or stop past
    ``width``: halos) and, for an index array, the columns to pick from the span."""
    if isinstance(part, slice):
        first = 0 if part.start is None else int(part.start)
        return first, width if part.stop is None else int(part.stop), None
    columns = np.asarray(part, np.int64)
    if not columns.size:
        return 0, 0, columns
    first = int(columns.min())
    return first, int(columns.max()) + 1, columns - first


#: Each row's tokens: the first one's place in the store, their count, and the (row, column)
#: of every EOS in the rows.
_TokenRanges = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class _Window:
    """Columns ``[starts[i], starts[i] + width)`` of the stream, and the part of each inside
    the stream: ``[lo[i], hi[i])``."""

    starts: np.ndarray
    width: int
    lo: np.ndarray
    hi: np.ndarray
    inside: np.ndarray | None  # the columns inside the stream (None: all of them)

    @classmethod
    def of(cls, starts: np.ndarray, width: int, end: int) -> _Window:
        lo, hi = np.clip(starts, 0, end), np.clip(starts + width, 0, end)
        inside = None
        if (lo != starts).any() or (hi != starts + width).any():
            columns = np.arange(width)
            inside = (columns >= (lo - starts)[:, None]) & (columns < (hi - starts)[:, None])
        return cls(starts, width, lo, hi, inside)

    def placed(self, values: np.ndarray, fill: int) -> np.ndarray:
        """Values of the window's stream positions, row after row, as its rows: ``fill`` for
        the columns beyond the stream's ends."""
        shape = (len(self.starts), self.width)
        if self.inside is None:
            return values.reshape(shape)
        out = np.full(shape, fill, values.dtype)
        out[self.inside] = values
        return out


@dataclass(frozen=True)
class _Pieces:
    """The documents a window touches, as *pieces*: the part of each document in each row."""

    docs: TouchedDocuments
    row: np.ndarray  # each piece's row
    length: np.ndarray  # its document's tokens
    eos_at: np.ndarray  # where its document's EOS is in the stream (if it has one)
    within: np.ndarray  # the piece's first position in its document
    size: np.ndarray  # the piece's stream positions (an EOS included)

    @classmethod
    def of(cls, store: DocumentStore, lo: np.ndarray, hi: np.ndarray, eos: bool) -> _Pieces:
        """The pieces of stream ranges ``[lo[i], hi[i])``, range ``i`` their row."""
        docs = store.documents_touching(lo, hi, eos=eos)
        row = np.repeat(np.arange(len(lo)), docs.count)
        length = docs.stop - docs.start
        eos_at = docs.stream_start + length
        first = np.maximum(docs.stream_start, lo[row])
        size = np.minimum(eos_at + (eos & (length > 0)), hi[row]) - first
        return cls(docs, row, length, eos_at, first - docs.stream_start, size)

    def positions(self, dtype: np.dtype) -> np.ndarray:
        """Each position's place in its document, row after row: a count that restarts at each
        piece (at its first position)."""
        total = int(self.size.sum())
        work = dtype if total < 2**31 else np.dtype(np.int64)  # int32 halves the bytes written
        shift = (np.cumsum(self.size) - self.size - self.within).astype(work)
        return (np.arange(total, dtype=work) - np.repeat(shift, self.size)).astype(
            dtype, copy=False
        )

    def token_ranges(
        self, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray, eos: bool
    ) -> _TokenRanges:
        """Each row's tokens, one range of the store (documents are back to back there): row
        ``i`` is stream positions ``[lo[i], hi[i])``, its columns counted from ``starts[i]``."""
        rows = len(starts)
        has_eos = eos & (self.length > 0) & (self.within + self.size > self.length)
        eos_rows = self.row[has_eos]
        eos_columns = self.eos_at[has_eos] - starts[eos_rows]
        count = hi - lo - np.bincount(eos_rows, minlength=rows)
        touched = self.docs.count > 0
        firsts = (np.cumsum(self.docs.count) - self.docs.count)[touched]
        begin = np.zeros(rows, np.int64)
        begin[touched] = self.docs.start[firsts] + self.within[firsts]  # an EOS: the next token
        return begin, count, eos_rows, eos_columns
