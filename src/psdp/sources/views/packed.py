"""`PackedSequences`: documents packed into fixed-length sequences, read as an ordinary source.

Row ``q`` is sequence ``q`` of a pack plan: its pieces laid side by side, then padding. The plan
is the whole corpus's (`plan_packing`, computed at construction), or, packed in windows, the
plan of the window that holds ``q`` (found by the `PackIndex`, planned again when first read and
kept in a small cache). A read fetches exactly the pieces of the rows asked for with one batched
`DocumentStore.read_ranges`, and a column window only the pieces' tokens that fall in it.
``docs/guides/packing.md``.

Packing is four modules: the plans, pure, in ``psdp/_plan/packing.py`` (a plan) and
``psdp/_plan/pack_windows.py`` (the index of windows); their I/O here (the reads) and in
``pack_index.py`` (the index built over a store, saved and loaded).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from psdp._checks import check_int
from psdp._plan.leaves import POSITIONS, SEGMENT_IDS, TOKENS, Key, in_leaf_order
from psdp._plan.pack_windows import PackIndex, PackKey
from psdp._plan.packing import PackPlan, check_packing_options, plan_packing, segment_lengths
from psdp._plan.windows import Box
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents.index import ranges
from psdp.sources.documents.store import (
    DocumentStore,
    check_view_of,
    chosen_leaves,
)
from psdp.sources.views.pack_index import build_pack_index, open_pack_index, plan_of_window
from psdp.sources.views.provenance import provenance_table

#: The leaves a packed sequence adds to the store's: each token's segment (1, 2, ... within a
#: sequence, 0 on padding), its position within its segment, and whether it counts in the loss.
LOSS_MASK = "loss_mask"
#: With ``targets=True``: each token's next-token target within its segment (``pad_id`` where
#: it has none).
TARGETS = "targets"
#: Window plans kept for reads when packing in windows (each about 40 bytes per document).
WINDOW_CACHE = 64


class PackedSequences:
    """Documents of a `DocumentStore` packed into sequences of ``seq_len`` tokens.

    Leaves: every leaf of the store (``input_ids`` padded with ``pad_id``, the others with 0),
    ``segment_ids`` (int32: 1, 2, ... for the pieces of a sequence in column order, 0 on
    padding), ``positions`` (int32: 0, 1, ... within each piece, 0 on padding) and ``loss_mask``
    (1 on tokens, 0 on padding; a store's own ``loss_mask`` leaf is kept on tokens, in its dtype;
    uint8 otherwise). A piece of a split document is a segment of its own: its positions restart
    at 0.

    With ``targets=True`` a leaf ``targets`` holds each token's next token within its segment
    (``pad_id`` where there is none: a segment's last token, padding), and ``loss_mask`` is 1
    exactly where that target is real (times the store's ``loss_mask`` of the target token,
    if it has one). With ``eos_id``, every non-empty document ends with an EOS token, packed
    as one more token of its last piece, so that its last token has a real target: the EOS.
    ``docs/guides/packing.md``, "Next-token targets".

    Args:
        store: the documents.
        seq_len: tokens per sequence.
        strategy: how documents fill sequences (`PACKING_STRATEGIES`).
        long_documents: ``"split"`` a document longer than ``seq_len`` into pieces, or
            ``"drop"`` it (`plan.dropped` lists them).
        seed: packs the documents in an order drawn from this seed; ``None``: the store's order.
        max_segments: the most segments a row holds (documents, or pieces of a split one),
            Levanter's ``max_segments_per_example``; ``None``: as many as fit.
        pad_id: the ``input_ids`` of padding (and the ``targets`` where none is real).
        targets: add the ``targets`` leaf, and make ``loss_mask`` the mask of real targets.
        eos_id: a token ending every non-empty document (a slot of its own); ``None``: none.
        leaves: the leaves to deliver, e.g. ``("input_ids", "segment_ids")``; default all. A
            stored leaf left out is not read; a computed one is not computed.
        window: packs each window of this many documents alone (``plan`` is then a
            `PackIndex`); ``None``: the whole corpus at once, at construction (for more than
            ~10^7 documents, give a window and ``index``: ``docs/guides/packing.md``).
        index: with ``window``, a file for the pack index: loaded if it was built for this
            packing of this store's size, else built and saved there; or a `PackIndex` (e.g.
            the one ``psdp index`` built beside the store, `pack_index_beside`), which must be
            of this packing of this store's size; ``None``: built now.

    Examples:
        >>> store = DocumentStore.from_documents([np.array([1, 2, 3]), np.array([4, 5])])
        >>> packed = PackedSequences(store, seq_len=4, pad_id=-1)
        >>> len(packed), packed.plan.efficiency
        (2, 0.625)
        >>> rows = packed.read(np.array([1, 0]))
        >>> rows["input_ids"].tolist(), rows["segment_ids"].tolist(), rows["positions"].tolist()
        ([[4, 5, -1, -1], [1, 2, 3, -1]], [[1, 1, 0, 0], [1, 1, 1, 0]], [[0, 1, 0, 0], [0, 1, 2, 0]])
        >>> lm = PackedSequences(store, seq_len=4, pad_id=-1, targets=True, eos_id=0)
        >>> rows = lm.read(np.array([0, 1]))
        >>> rows["input_ids"].tolist(), rows["targets"].tolist(), rows["loss_mask"].tolist()
        ([[1, 2, 3, 0], [4, 5, 0, -1]], [[2, 3, 0, -1], [5, 0, -1, -1]], [[1, 1, 1, 0], [1, 1, 0, 0]])
        >>> short = DocumentStore.from_documents([np.array([1]), np.array([2]), np.array([3])])
        >>> PackedSequences(short, 4, "greedy", max_segments=2).read(np.arange(2))["input_ids"].tolist()
        [[1, 2, 0, 0], [3, 0, 0, 0]]
    """

    def __init__(
        self,
        store: DocumentStore,
        seq_len: int,
        strategy: str = "best_fit",
        long_documents: str = "split",
        *,
        seed: int | None = None,
        max_segments: int | None = None,
        pad_id: int = 0,
        targets: bool = False,
        eos_id: int | None = None,
        leaves: Sequence[str] | None = None,
        window: int | None = None,
        index: str | os.PathLike[str] | PackIndex | None = None,
    ):
        self._view_of(store, seq_len, pad_id, targets, eos_id, leaves, "PackedSequences")
        self.max_segments = max_segments
        self.plan: PackPlan | PackIndex
        if window is None:
            self.plan = self._plan_whole(strategy, long_documents, seed, index)
        else:
            self.plan = self._open_index(window, strategy, long_documents, seed, index)

    def _view_of(self, store, seq_len, pad_id, targets, eos_id, leaves, name) -> None:
        """The settings and leaves of a view of ``store`` (checked; no plan)."""
        check_view_of(store, name, pad_id=pad_id, eos_id=eos_id)
        _check_targets(store, targets)
        self.store, self.seq_len, self.pad_id = store, seq_len, pad_id
        self.targets, self.eos_id = targets, eos_id
        computed = {SEGMENT_IDS: np.dtype(np.int32), POSITIONS: np.dtype(np.int32),
                    LOSS_MASK: store.leaves.get(LOSS_MASK, np.dtype(np.uint8))}  # fmt: skip
        if targets:
            computed[TARGETS] = store.leaves[TOKENS]
        #: The leaves of every row and their dtypes (the store's, then the computed ones).
        self.leaves: dict[str, np.dtype] = chosen_leaves({**store.leaves, **computed}, leaves, name)

    def _plan_whole(self, strategy, long_documents, seed, index) -> PackPlan:
        """The whole corpus's plan (its offsets kept for the reads)."""
        if index is not None:
            raise ValueError(
                f"index={str(index)!r} is the index of a packing in windows, but window=None "
                "packs the whole corpus at once; set window (e.g. window=4096), or drop index"
            )
        self._offsets = self.store.offsets_range(0, self.store.num_documents + 1)
        lengths = segment_lengths(self._offsets, self.eos_id is not None)
        return plan_packing(lengths, self.seq_len, strategy, long_documents, seed,
                            self.max_segments)  # fmt: skip

    def _open_index(self, window, strategy, long_documents, seed, index) -> PackIndex:
        """The pack index: loaded from ``index`` (its first and last windows checked at once),
        or built."""
        check_int("window", window, minimum=1)
        check_packing_options(self.seq_len, strategy, long_documents, seed, self.max_segments)
        key = PackKey(self.seq_len, strategy, long_documents, seed, window,
                      self.store.num_documents, self.store.num_tokens,
                      eos=self.eos_id is not None, max_segments=self.max_segments)  # fmt: skip
        self._where = "built at start-up" if index is None else f"at {index}"
        self._fix = "delete the index to build it again"
        self._window_plan = functools.lru_cache(WINDOW_CACHE)(self._plan_of_window)
        if index is None:
            return build_pack_index(self.store, key)
        if isinstance(index, PackIndex):
            if index.key != key:
                raise ValueError(
                    f"index is a pack index of {index.key}, but this packing of the store is "
                    f"{key}; pass the index built for this packing (psdp index), or index=None"
                )
            self._where, self.plan, loaded = "given", index, True
            self._fix = (
                "build it again for the store as it is now (psdp index STORE --pack "
                f"{self.seq_len},{window} ...; docs/guides/packing.md)"
            )
        else:
            self.plan, loaded = open_pack_index(self.store, key, index)
        for w in sorted({0, key.num_windows - 1}) if loaded else ():
            self._window_plan(w)
        return self.plan

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def io_block(self) -> int | None:
        """The block a loader's shuffle takes unless given one: packed in windows, about a
        window's sequences, so that a step plans a few windows, not one per row (each about
        once an epoch, ``docs/guides/packing.md``); ``None`` (a full shuffle) for a whole-corpus plan.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(1, n + 1) for n in [3, 5, 2, 6] * 4])
            >>> PackedSequences(store, 8, window=4).io_block, PackedSequences(store, 8).io_block
            (2, None)
        """
        if isinstance(self.plan, PackPlan):
            return None
        return max(1, len(self) // self.plan.key.num_windows)

    @property
    def reads_storage(self) -> bool:
        """Whether its reads wait on storage: its store's `DocumentStore.reads_storage`."""
        return bool(self.store.reads_storage)

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, len(self), self.describe)
        return self._read_columns(ids, None, list(in_leaf_order(self.leaves)))

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Some leaves, each cut to a range of columns (or an index array of them): only the
        pieces' tokens inside the range are read from the store.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(1, 6), np.arange(6, 9)])
            >>> packed = PackedSequences(store, seq_len=8)
            >>> packed.read_window(np.array([0]), {"input_ids": slice(3, 7)})["input_ids"].tolist()
            [[4, 5, 6, 7]]
        """
        ids = check_ids(ids, len(self), self.describe)
        groups: dict[Any, tuple[Any, list[str]]] = {}
        for key, box in columns.items():
            if key not in self.store.leaves and key not in _DERIVED:
                raise KeyError(f"leaf {key!r} is not a leaf of {self.describe()}")
            if key not in self.leaves:
                raise KeyError(f"leaf {key!r} is not delivered: leaves={tuple(self.leaves)}")
            cols = _columns(box, self.seq_len)
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
        if self.targets and (TARGETS in keys or LOSS_MASK in keys):
            return self._with_targets(ids, low, high, keys)
        return self._laid_out(ids, low, high, keys)

    def _with_targets(
        self, ids: np.ndarray, low: int, high: int, keys: list[str]
    ) -> dict[str, np.ndarray]:
        """`_read_span` with ``targets`` and the loss mask of real targets: a column's target is
        the next column's token if both are in one segment, so one more column is read."""
        stop = min(high + 1, self.seq_len)
        own_mask = LOSS_MASK in self.store.leaves
        needed = [TOKENS, SEGMENT_IDS] + ([LOSS_MASK] if own_mask else [])
        got = self._laid_out(
            ids, low, stop, [k for k in dict.fromkeys(keys + needed) if k != TARGETS]
        )
        width, inner = high - low, max(0, stop - low - 1)  # inner: columns whose next was read
        segment = got[SEGMENT_IDS]
        real = np.zeros((len(ids), width), bool)
        real[:, :inner] = (segment[:, 1 : inner + 1] == segment[:, :inner]) & (
            segment[:, :inner] > 0
        )

        def following(key: str, fill: int) -> np.ndarray:
            """Leaf ``key`` at each column's target where it is real, ``fill`` elsewhere."""
            value = np.full(real.shape, fill, got[key].dtype)
            value[:, :inner] = got[key][:, 1 : inner + 1]
            return np.where(real, value, np.asarray(fill, value.dtype))

        out = {}
        for key in keys:
            if key == TARGETS:
                out[key] = following(TOKENS, self.pad_id)
            elif key == LOSS_MASK:
                mask = following(LOSS_MASK, 0) if own_mask else real
                out[key] = mask.astype(self.leaves[LOSS_MASK], copy=False)
            else:
                out[key] = got[key][:, :width]
        return out

    def _laid_out(
        self, ids: np.ndarray, low: int, high: int, keys: list[str]
    ) -> dict[str, np.ndarray]:
        """Leaves ``keys`` (not ``targets``) of rows ``ids`` at columns ``[low, high)``.

        A row's pieces lie side by side from column 0, so the part of a row inside the columns
        is one run from ``low``: the pieces' tokens, read in (row, column) order, fill the rows
        through one mask, in C order (an EOS column left out of it and filled after)."""
        rows, _, _, token, count, column, segment, eos = self._pieces(ids)
        skipped = np.zeros_like(count)  # each piece's columns before the window
        if low > 0 or high < self.seq_len:  # clip the pieces to the window (whole rows: none)
            begin = np.maximum(column, low)
            end = np.minimum(column + count, high)
            eos = eos & (end == column + count)  # the EOS, a piece's last slot, is inside
            count = end - begin
            inside = count > 0
            rows, token, column, segment, begin, count, eos = (
                a[inside] for a in (rows, token, column, segment, begin, count, eos)
            )
            skipped = begin - column
        starts = token + skipped
        stored = [key for key in keys if key in self.store.leaves]
        read = self.store.read_ranges(starts, starts + count - eos, stored) if stored else {}
        filled = np.bincount(rows, weights=count, minlength=len(ids)).astype(np.int64)
        mask = np.arange(high - low) < filled[:, None]
        tokens, at_eos = mask, (rows[eos], (column + skipped + count - 1 - low)[eos])
        if self.eos_id is not None:
            tokens = mask.copy()
            tokens[at_eos] = False
        out = {}
        for key in keys:
            if key == LOSS_MASK and LOSS_MASK not in read:
                out[key] = mask.astype(np.uint8)
                continue
            value, dtype, pad = self._token_values(key, read, segment, skipped, count)
            leaf = np.zeros(mask.shape, dtype) if pad == 0 else np.full(mask.shape, pad, dtype)
            leaf[tokens if key in read else mask] = value
            if key == TOKENS and self.eos_id is not None:
                leaf[at_eos] = self.eos_id
            out[key] = leaf
        return out

    def _pieces(self, ids: np.ndarray) -> _Pieces:
        """The pieces of rows ``ids`` in (row, column) order."""
        if isinstance(self.plan, PackPlan):
            return self._plan_pieces(self.plan, self._offsets, 0, ids)
        windows, local = self.plan.locate(ids)
        by_window = np.argsort(windows, kind="stable")
        parts = []
        for at in np.split(by_window, np.flatnonzero(np.diff(windows[by_window])) + 1):
            w = int(windows[at[0]])
            plan, offsets = self._window_plan(w)
            rows, *rest = self._plan_pieces(plan, offsets, self.plan.key.documents(w)[0], local[at])
            parts.append((at[rows], *rest))
        joined = [np.concatenate(column) for column in zip(*parts, strict=True)]
        by_row = np.argsort(joined[0], kind="stable")  # each row's pieces stay in column order
        return _Pieces(*(a[by_row] for a in joined))

    def _plan_pieces(
        self, plan: PackPlan, offsets: np.ndarray, first: int, ids: np.ndarray
    ) -> _Pieces:
        """`_pieces` of ``plan``'s sequences ``ids``; ``offsets[d - first]`` is document ``d``'s
        first token."""
        rows, piece = plan.pieces_of(ids)
        doc, start, count = plan.piece_doc[piece], plan.piece_start[piece], plan.piece_len[piece]
        token = offsets[doc - first] + start
        segment = piece - plan.seq_starts[ids[rows]] + 1
        if self.eos_id is None:
            eos = np.zeros(len(piece), bool)
        else:  # a document's EOS is the slot after its last token: its last piece's last slot
            eos = start + count > offsets[doc - first + 1] - offsets[doc - first]
        return _Pieces(rows, doc, start, token, count, plan.piece_column[piece], segment, eos)

    def _plan_of_window(self, w: int) -> tuple[PackPlan, np.ndarray]:
        """Window ``w``'s plan and offsets, checked against the index (cached: `WINDOW_CACHE`)."""
        assert isinstance(self.plan, PackIndex)
        plan, offsets = plan_of_window(self.store, self.plan.key, w)
        self.plan.check(w, plan, self._where, self._fix)
        return plan, offsets

    def _token_values(self, key, tokens, segment, skipped, count):
        """The values of leaf ``key`` at the tokens read, its dtype and its padding."""
        # computed leaves in int32 where they fit: half the bytes written of int64
        if key == SEGMENT_IDS:
            return np.repeat(segment.astype(np.int32), count), np.int32, 0
        if key == POSITIONS:  # each piece's tokens count on from its skipped columns
            work = np.int32 if int(count.sum()) < 2**31 else np.int64
            return ranges(skipped, count, work), np.int32, 0
        return tokens[key], self.store.leaves[key], self.pad_id if key == TOKENS else 0

    def provenance(self, ids: np.ndarray) -> np.ndarray:
        """Where every segment of rows ``ids`` comes from: a `provenance_table` row per
        segment, in (row, column) order; reads no token.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(1, 4), np.arange(4, 10)])
            >>> table = PackedSequences(store, seq_len=4, eos_id=0).provenance(np.array([2]))
            >>> table[["row", "column", "document", "start", "stop", "eos"]].tolist()
            [(0, 0, 1, 4, 6, True)]
        """
        ids = check_ids(ids, len(self), self.describe)
        p = self._pieces(ids)
        document = self.store.source_ids(p.doc)
        return provenance_table(p.row, p.column, document, p.start, p.start + p.slots - p.eos,
                                p.eos)  # fmt: skip

    def describe(self) -> str:
        targets = ", targets" if self.targets else ""
        eos = "" if self.eos_id is None else f", eos_id={self.eos_id}"
        return f"PackedSequences({self.plan.describe()}{targets}{eos}; {self.store.describe()})"

    def __repr__(self) -> str:
        return self.describe()


class PlacedRows(PackedSequences):
    """Rows of ``seq_len`` slots of a store whose pieces were placed elsewhere, read as
    `PackedSequences` reads its own (its leaves, EOS, targets and column windows): the reads of
    a packing planned outside this module (`StagedPacked`'s stages).

    Row ``r`` holds the pieces with ``row == r``, in column order: ``size`` slots of document
    ``document`` from its slot ``start`` (its EOS, where ``eos_id`` is set, its last slot), at
    column ``column``. ``offsets`` are the store's document offsets (``offsets_range``).

    Examples:
        >>> store = DocumentStore.from_documents([np.arange(1, 6), np.arange(6, 9)])
        >>> offsets = store.offsets_range(0, 3)
        >>> rows = PlacedRows(store, 4, offsets, rows=2, row=[0, 1, 1], document=[0, 0, 1],
        ...                   start=[0, 4, 0], size=[4, 1, 3], column=[0, 0, 1])
        >>> rows.read(np.array([1, 0]))["input_ids"].tolist()
        [[5, 6, 7, 8], [1, 2, 3, 4]]
    """

    def __init__(
        self, store: DocumentStore, seq_len: int, offsets: np.ndarray, *, rows: int,
        row: Any, document: Any, start: Any, size: Any, column: Any, pad_id: int = 0,
        targets: bool = False, eos_id: int | None = None, leaves: Sequence[str] | None = None,
    ) -> None:  # fmt: skip
        self._view_of(store, seq_len, pad_id, targets, eos_id, leaves, "PlacedRows")
        self.max_segments, self._offsets, self._rows = None, offsets, rows
        arrays = [np.asarray(a, np.int64).reshape(-1) for a in (row, document, start, size, column)]
        order = np.lexsort((arrays[4], arrays[0]))
        self._row, self._doc, self._start, self._size, self._column = (a[order] for a in arrays)
        counts = np.bincount(self._row, minlength=rows)
        self._firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return self._rows

    @property
    def io_block(self) -> int | None:
        return None

    def _pieces(self, ids: np.ndarray) -> _Pieces:
        first = self._firsts[ids]
        counts = self._firsts[ids + 1] - first
        rows = np.repeat(np.arange(len(ids)), counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        piece = first[rows] + within
        doc, start, count = self._doc[piece], self._start[piece], self._size[piece]
        token = self._offsets[doc] + start
        if self.eos_id is None:
            eos = np.zeros(len(piece), bool)
        else:  # a document's EOS is the slot after its last token: its last piece's last slot
            eos = start + count > self._offsets[doc + 1] - self._offsets[doc]
        return _Pieces(rows, doc, start, token, count, self._column[piece], within + 1, eos)

    def describe(self) -> str:
        return f"PlacedRows({self._rows} rows of {self.seq_len}; {self.store.describe()})"


_DERIVED = (SEGMENT_IDS, POSITIONS, LOSS_MASK, TARGETS)


class _Pieces(NamedTuple):
    """The pieces of some rows, in (row, column) order: each one's row (a position in the
    ids), document, first token within it, first token in the store, slots (its EOS
    included), first column, segment id (1, 2, ... within its row), and whether its last slot
    is its document's EOS."""

    row: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    token: np.ndarray
    slots: np.ndarray
    column: np.ndarray
    segment: np.ndarray
    eos: np.ndarray


def _check_targets(store: DocumentStore, targets: Any) -> None:
    if not isinstance(targets, bool):
        raise TypeError(
            f"targets must be a bool, got {type(targets).__name__} {targets!r}; pass "
            "targets=True or targets=False"
        )
    if targets and TARGETS in store.leaves:
        raise ValueError(
            f"the store has a leaf {TARGETS!r}, which PackedSequences(targets=True) computes "
            "itself; rename or drop the store's leaf, or pass targets=False"
        )


def _columns(box: Box, seq_len: int) -> slice | np.ndarray | None:
    """A read's columns of dimension 1: ``None`` (all), a range, or an index array, each inside
    ``[0, seq_len)``: a packed row has no neighbours to read a halo from."""
    cols: Any = box
    if isinstance(box, tuple):
        if len(box) > 1:
            raise ValueError(f"a packed sequence has one dimension after the batch, got box {box}")
        cols = box[0] if box else None  # (): the whole row
    if cols is None:
        return None
    if isinstance(cols, slice):
        if cols.step not in (None, 1):
            raise ValueError(f"column windows are ranges with step 1, got {cols}")
        start, stop = cols.start or 0, seq_len if cols.stop is None else cols.stop
        inside = 0 <= start <= stop <= seq_len
    else:
        cols = np.asarray(cols, np.int64)
        inside = not cols.size or (cols.min() >= 0 and cols.max() < seq_len)
    if not inside:
        raise ValueError(
            f"columns of a packed sequence lie in [0, seq_len={seq_len}), got {cols}; a packed row "
            "has no neighbouring tokens (the halo boundary 'continue' is TokenSequences')"
        )
    return cols


def _tag(cols: slice | np.ndarray | None) -> Any:
    """A hashable key of ``cols``, to read leaves with the same columns together."""
    if isinstance(cols, slice):
        return (cols.start, cols.stop)
    return None if cols is None else cols.tobytes()
