"""`PackedSequences`: documents packed into fixed-length sequences, read as an ordinary source.

Row ``q`` is sequence ``q`` of a pack plan (`plan_packing`, computed from the store's offsets at
construction): its pieces laid side by side, then padding. A read fetches exactly the pieces of
the rows asked for with one batched `DocumentStore.read_ranges`, and a column window only the
pieces' tokens that fall in it. ``docs/packing.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from psdp._plan.leaves import Key, in_leaf_order
from psdp._plan.packing import PackPlan, plan_packing
from psdp._plan.windows import Box
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents import POSITIONS, SEGMENT_IDS, TOKENS, DocumentStore, check_view_of

#: The leaves a packed sequence adds to the store's: each token's segment (1, 2, ... within a
#: sequence, 0 on padding), its position within its segment, and whether it counts in the loss.
LOSS_MASK = "loss_mask"


class PackedSequences:
    """Documents of a `DocumentStore` packed into sequences of ``seq_len`` tokens.

    Leaves: every leaf of the store (``input_ids`` padded with ``pad_id``, the others with 0),
    ``segment_ids`` (int32: 1, 2, ... for the pieces of a sequence in column order, 0 on
    padding), ``positions`` (int32: 0, 1, ... within each piece, 0 on padding) and ``loss_mask``
    (1 on tokens, 0 on padding; a store's own ``loss_mask`` leaf is kept on tokens, in its dtype;
    uint8 otherwise). A piece of a split document is a segment of its own: its positions restart
    at 0.

    Args:
        store: the documents.
        seq_len: tokens per sequence.
        strategy: how documents fill sequences (`PACKING_STRATEGIES`).
        long_documents: ``"split"`` a document longer than ``seq_len`` into pieces, or
            ``"drop"`` it (`plan.dropped` lists them).
        seed: packs the documents in an order drawn from this seed; ``None``: the store's order.
        pad_id: the ``input_ids`` of padding.

    Example:
        >>> store = DocumentStore.from_documents([np.array([1, 2, 3]), np.array([4, 5])])
        >>> packed = PackedSequences(store, seq_len=4, pad_id=-1)
        >>> len(packed), packed.plan.efficiency
        (2, 0.625)
        >>> rows = packed.read(np.array([1, 0]))
        >>> rows["input_ids"].tolist(), rows["segment_ids"].tolist(), rows["positions"].tolist()
        ([[4, 5, -1, -1], [1, 2, 3, -1]], [[1, 1, 0, 0], [1, 1, 1, 0]], [[0, 1, 0, 0], [0, 1, 2, 0]])
    """

    def __init__(
        self,
        store: DocumentStore,
        seq_len: int,
        strategy: str = "best_fit",
        long_documents: str = "split",
        *,
        seed: int | None = None,
        pad_id: int = 0,
    ):
        check_view_of(store, "PackedSequences", pad_id=pad_id)
        self.store, self.seq_len, self.pad_id = store, seq_len, pad_id
        self._offsets = store.offsets_range(0, store.num_documents + 1)  # the whole plan needs all
        self.plan: PackPlan = plan_packing(
            np.diff(self._offsets), seq_len, strategy, long_documents, seed
        )

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def reads_storage(self) -> bool:
        """Whether its reads wait on storage: its store's `DocumentStore.reads_storage`."""
        return bool(self.store.reads_storage)

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, len(self), self.describe())
        leaves = in_leaf_order(dict.fromkeys([*self.store.leaves, *_DERIVED]))
        return self._read_columns(ids, None, list(leaves))

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Some leaves, each cut to a range of columns (or an index array of them): only the
        pieces' tokens inside the range are read from the store.

        Example:
            >>> store = DocumentStore.from_documents([np.arange(1, 6), np.arange(6, 9)])
            >>> packed = PackedSequences(store, seq_len=8)
            >>> packed.read_window(np.array([0]), {"input_ids": slice(3, 7)})["input_ids"].tolist()
            [[4, 5, 6, 7]]
        """
        ids = check_ids(ids, len(self), self.describe())
        groups: dict[Any, tuple[Any, list[str]]] = {}
        for key, box in columns.items():
            if key not in self.store.leaves and key not in _DERIVED:
                raise KeyError(f"leaf {key!r} is not a leaf of {self.describe()}")
            cols = _columns(box)
            groups.setdefault(_tag(cols), (cols, []))[1].append(str(key))
        out: dict[Key, np.ndarray] = {}
        for cols, keys in groups.values():  # leaves with the same columns: one store read
            for key, value in self._read_columns(ids, cols, keys).items():
                out[key] = value
        return in_leaf_order(out)

    def _read_columns(
        self, ids: np.ndarray, cols: slice | np.ndarray | None, keys: list[str]
    ) -> dict[str, np.ndarray]:
        """Leaves ``keys`` of rows ``ids`` at columns ``cols`` (``None``: all)."""
        if isinstance(cols, np.ndarray):  # an index array (a periodic halo): read its span, pick
            low = int(cols.min()) if cols.size else 0
            high = int(cols.max()) + 1 if cols.size else 0
            span = self._read_span(ids, low, high, keys)
            return {key: value[:, cols - low] for key, value in span.items()}
        low, high, _ = (slice(None) if cols is None else cols).indices(self.seq_len)
        return self._read_span(ids, low, max(low, high), keys)

    def _read_span(
        self, ids: np.ndarray, low: int, high: int, keys: list[str]
    ) -> dict[str, np.ndarray]:
        """Leaves ``keys`` of rows ``ids`` at columns ``[low, high)``: one store read."""
        plan, width = self.plan, high - low
        rows, piece = plan.pieces_of(ids)
        first = plan.piece_column[piece]
        begin = np.maximum(first, low)
        count = np.minimum(first + plan.piece_len[piece], high) - begin
        inside = count > 0
        rows, piece, first, begin, count = (a[inside] for a in (rows, piece, first, begin, count))
        starts = self._offsets[plan.piece_doc[piece]] + plan.piece_start[piece] + begin - first
        stored = [key for key in keys if key in self.store.leaves]
        tokens = self.store.read_ranges(starts, starts + count, stored) if stored else {}
        within = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        where = np.repeat(rows * width + begin - low, count) + within  # flat (row, column)
        out = {}
        for key in keys:
            value, dtype, pad = self._token_values(
                key, tokens, piece, ids, rows, begin - first, count, within
            )
            leaf = np.full(len(ids) * width, pad, dtype)
            leaf[where] = value
            out[key] = leaf.reshape(len(ids), width)
        return out

    def _token_values(self, key, tokens, piece, ids, rows, skipped, count, within):
        """The values of leaf ``key`` at the tokens read, its dtype and its padding."""
        if key == SEGMENT_IDS:
            segment = piece - self.plan.seq_starts[ids[rows]] + 1
            return np.repeat(segment, count), np.int32, 0
        if key == POSITIONS:
            return np.repeat(skipped, count) + within, np.int32, 0
        if key == LOSS_MASK:
            if LOSS_MASK in tokens:
                return tokens[LOSS_MASK], self.store.leaves[LOSS_MASK], 0
            return 1, np.uint8, 0
        return tokens[key], self.store.leaves[key], self.pad_id if key == TOKENS else 0

    def describe(self) -> str:
        return f"PackedSequences({self.plan.describe()}; {self.store.describe()})"

    def __repr__(self) -> str:
        return self.describe()


_DERIVED = (SEGMENT_IDS, POSITIONS, LOSS_MASK)


def _columns(box: Box) -> slice | np.ndarray | None:
    """A read's columns of dimension 1: ``None`` (all), a range, or an index array."""
    cols: Any = box
    if isinstance(box, tuple):
        if len(box) > 1:
            raise ValueError(f"a packed sequence has one dimension after the batch, got box {box}")
        cols = box[0] if box else None  # (): the whole row
    if cols is None or isinstance(cols, slice):
        if cols is not None and cols.step not in (None, 1):
            raise ValueError(f"column windows are ranges with step 1, got {cols}")
        return cols
    return np.asarray(cols, np.int64)


def _tag(cols: slice | np.ndarray | None) -> Any:
    """A hashable key of ``cols``, to read leaves with the same columns together."""
    if isinstance(cols, slice):
        return (cols.start, cols.stop)
    return None if cols is None else cols.tobytes()
