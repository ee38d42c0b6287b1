"""`TokenSequences`: fixed-length sequences cut from a `DocumentStore` at read time.

The documents are concatenated (with an optional EOS token after each) and split into rows of
``seq_len`` tokens: row ``r`` is ``stream[r * seq_len : r * seq_len + width]``, so the sequence
length is chosen when reading, not when writing. ``segment_ids`` and ``positions`` come from the
offsets alone; a window of columns ``[a, b)`` of a row reads only ``stream[r * seq_len + a :
r * seq_len + b]``, one contiguous range of the store. ``docs/tokens.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp._plan.leaves import Key, in_leaf_order
from psdp._plan.windows import Box, box_parts
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents import POSITIONS, SEGMENT_IDS, TOKENS, DocumentStore, check_view_of


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

    Example:
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
    #: the stream's neighbouring tokens (``docs/partitioning.md``)
    continues_rows = True

    def __init__(
        self,
        store: DocumentStore,
        seq_len: int,
        *,
        targets: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
    ):
        check_view_of(store, "TokenSequences", eos_id=eos_id, pad_id=pad_id)
        check_int("seq_len", seq_len, minimum=1)
        if not isinstance(targets, bool):
            raise TypeError(f"targets must be a bool, got {type(targets).__name__} {targets!r}")
        self.store, self.seq_len, self.targets = store, int(seq_len), targets
        self.eos_id, self.pad_id = eos_id, int(pad_id)
        self.width = self.seq_len + int(targets)
        extra = 1 if eos_id is not None else 0
        lengths = np.diff(store.offsets)
        # an empty document contributes no token, not even an EOS (docs/tokens.md)
        eos_after = extra * (lengths > 0)
        #: where each document starts in the stream (EOS tokens included), and the stream's size
        self._starts = store.offsets[:-1] + np.cumsum(eos_after) - eos_after
        self.stream_tokens = store.num_tokens + int(eos_after.sum())
        self._ends = self._starts + lengths  # where each document's own tokens end (its EOS)
        self._len = max(0, (self.stream_tokens - int(targets)) // self.seq_len)
        if self._len == 0:
            raise ValueError(
                f"the store has {self.stream_tokens} tokens (EOS included), fewer than one row of "
                f"seq_len={self.seq_len}{' + 1 target' if targets else ''}; use a shorter "
                "seq_len or more documents"
            )
        ids_dtype = np.int32 if store.num_documents < np.iinfo(np.int32).max else np.int64
        self._dtypes = {
            **store.leaves,
            SEGMENT_IDS: np.dtype(ids_dtype),
            POSITIONS: np.dtype(np.int32 if lengths.max() < 2**31 - 1 else np.int64),
        }

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
        ids = check_ids(ids, self._len, self.describe())
        return self._read(ids, {name: slice(0, self.width) for name in self._dtypes})

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Some leaves, each cut to a range (or index array) of columns of every row.

        Columns may lie before 0 or past the row's width (the halo boundary ``"continue"``):
        they are the stream's neighbouring tokens.

        Example:
            >>> store = DocumentStore.from_documents([np.arange(10, 18)])
            >>> rows = TokenSequences(store, 4)
            >>> rows.read_window(np.array([1]), {"input_ids": slice(1, 3)})["input_ids"].tolist()
            [[15, 16]]
        """
        ids = check_ids(ids, self._len, self.describe())
        boxes: dict[Key, Any] = {}
        for key, box in columns.items():
            if key not in self._dtypes:
                raise KeyError(f"{key!r} is not a leaf of {self.describe()}")
            parts = box_parts(box)
            if len(parts) > 1:
                raise ValueError(f"rows of {self.describe()} have one dimension after the batch")
            boxes[key] = parts[0] if parts else slice(0, self.width)
        return self._read(ids, boxes)

    def _read(self, ids: np.ndarray, boxes: Mapping[Key, Any]) -> dict[Key, np.ndarray]:
        """Each leaf's columns of rows ``ids``; one store read per distinct box."""
        by_box: dict[Any, list[Key]] = {}
        for key, part in boxes.items():
            columns = _columns(part, self.width)
            by_box.setdefault((columns.tobytes(), len(columns)), []).append(key)
        out: dict[Key, np.ndarray] = {}
        for keys in by_box.values():
            columns = _columns(boxes[keys[0]], self.width)
            where = ids[:, None] * self.seq_len + columns[None, :]  # stream positions
            out.update(self._at(where, [k for k in keys if isinstance(k, str)]))
        return in_leaf_order(out)

    def _at(self, where: np.ndarray, names: list[str]) -> dict[Key, np.ndarray]:
        """The leaves ``names`` at stream positions ``where`` (any shape)."""
        inside = (where >= 0) & (where < self.stream_tokens)
        doc = np.searchsorted(self._starts, np.where(inside, where, 0), side="right") - 1
        within = where - self._starts[doc]
        token = inside & (where < self._ends[doc])  # not EOS, not beyond the ends
        out: dict[Key, np.ndarray] = {}
        stored = [name for name in names if name in self.store.leaves]
        if stored:
            values = self._stored(self.store.offsets[doc] + within, token, stored)
            for name in stored:
                fill = self.pad_id if name == TOKENS else 0
                leaf = np.full(where.shape, fill, self._dtypes[name])
                if self.eos_id is not None and name == TOKENS:
                    leaf[inside & ~token] = self.eos_id
                elif name != TOKENS:
                    leaf[inside & ~token] = 0
                leaf[token] = values[name]
                out[name] = leaf
        if SEGMENT_IDS in names:
            out[SEGMENT_IDS] = np.where(inside, doc + 1, 0).astype(self._dtypes[SEGMENT_IDS])
        if POSITIONS in names:
            out[POSITIONS] = np.where(inside, within, 0).astype(self._dtypes[POSITIONS])
        return out

    def _stored(self, at: np.ndarray, token: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        """The store's values at flat positions ``at[token]`` (row-major order), read as one
        range per row: from the row's first to its last stored token."""
        rows = at.reshape(len(at), -1) if at.ndim > 1 else at[None]
        held = token.reshape(rows.shape)
        big = np.iinfo(np.int64).max
        lo = np.where(held, rows, big).min(axis=1, initial=big)  # initial: a window of 0 columns
        hi = np.where(held, rows, -1).max(axis=1, initial=-1) + 1
        some = held.any(axis=1)
        starts, stops = lo[some], hi[some]
        got = self.store.read_ranges(starts, stops, names)
        base = np.zeros(len(rows), np.int64)
        base[some] = np.concatenate(([0], np.cumsum(stops - starts)[:-1]))
        row_of = np.nonzero(held)[0]
        index = base[row_of] + rows[held] - lo[row_of]
        return {name: values[index] for name, values in got.items()}

    def describe(self) -> str:
        eos = "" if self.eos_id is None else f", eos_id={self.eos_id}"
        return (
            f"TokenSequences({len(self)} rows of seq_len={self.seq_len}"
            f"{' + 1' if self.targets else ''}{eos}, {self.store.describe()})"
        )


def _columns(part: Any, width: int) -> np.ndarray:
    if isinstance(part, slice):  # a slice may start before 0 or stop past ``width`` (halos)
        start = 0 if part.start is None else part.start
        return np.arange(start, width if part.stop is None else part.stop, dtype=np.int64)
    return np.asarray(part, np.int64)
