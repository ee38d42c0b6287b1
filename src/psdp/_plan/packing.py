"""The pack plan: which pieces of which documents fill each fixed-length sequence (``docs/guides/packing.md``).

The plan is computed from the documents' lengths alone (``np.diff`` of the offsets), never from
their tokens, so every host computes the same plan in bounded time. A large corpus is packed in
windows of documents, each alone (`plan_window`), so that no host plans the whole corpus.
Documents (optionally in a seeded order) become *items*: a document up to ``seq_len`` tokens is one
item; a longer one is split into pieces of ``seq_len`` and a remainder, cut to its first
``seq_len`` tokens, or dropped. A strategy puts each item, in order, into a sequence (a bin of
``seq_len`` slots, and with ``max_segments`` of at most that many items, Levanter's
``max_segments_per_example``); the plan is then flat arrays,
so sequence ``q``'s pieces are ``seq_starts[q]:seq_starts[q + 1]``, found in O(1).
Its I/O: ``psdp/sources/views/packed.py`` reads by a plan, ``pack_index.py`` beside it builds the
index of windows (``pack_windows.py``) over a store.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from psdp._checks import check_int, is_int

#: How items are put into sequences, each in item order: ``greedy`` fills one open sequence and
#: starts the next when an item does not fit (Levanter's prepacking); ``first_fit`` puts an item
#: in the earliest sequence with room; ``best_fit`` in the fullest sequence with room (the
#: earliest among equals). Every sequence stays open until the end (Grain's packers keep a pool
#: of a fixed number of open bins instead).
PACKING_STRATEGIES = ("best_fit", "first_fit", "greedy")
#: What becomes of a document longer than ``seq_len``: ``split`` into pieces of ``seq_len`` and a
#: remainder (each a segment of its own), ``drop`` it (the plan reports it), or ``truncate`` it
#: to its first ``seq_len`` tokens, a row of its own (the rest is never read; Levanter's packing,
#: its ``slice_strategy="left"``).
LONG_DOCUMENTS = ("split", "drop", "truncate")


@dataclass(frozen=True, eq=False)
class PackPlan:
    """Sequences of ``seq_len`` slots, each holding whole documents or pieces of them.

    Piece ``p`` is tokens ``[piece_start[p], piece_start[p] + piece_len[p])`` of document
    ``piece_doc[p]``, placed at columns ``piece_column[p]`` onwards of its sequence; sequence ``q``
    holds pieces ``seq_starts[q]:seq_starts[q + 1]``, in the order they were placed.

    Attributes:
        seq_len: slots per sequence.
        strategy: the `PACKING_STRATEGIES` entry used.
        long_documents: the `LONG_DOCUMENTS` entry used.
        seed: the seed of the document order, or ``None`` for the store's order.
        max_segments: the most pieces a sequence holds, or ``None`` for no cap.
        seq_starts: int64 ``(Q + 1,)``, the first piece of each sequence, then the piece count.
        piece_doc: int64 ``(P,)``, each piece's document.
        piece_start: int64 ``(P,)``, each piece's first token within its document.
        piece_len: int64 ``(P,)``, each piece's token count (>= 1).
        piece_column: int64 ``(P,)``, each piece's first column within its sequence.
        dropped: int64, ascending: the documents left out for being longer than ``seq_len``.
        empty: int64, ascending: the documents with no tokens (nothing to pack).

    Examples:
        >>> plan = plan_packing([3, 5, 2, 6], seq_len=8, strategy="best_fit")
        >>> [plan.pieces(q)[0].tolist() for q in range(len(plan))]
        [[0, 1], [2, 3]]
        >>> plan.efficiency
        1.0
    """

    seq_len: int
    strategy: str
    long_documents: str
    seed: int | None
    seq_starts: np.ndarray
    piece_doc: np.ndarray
    piece_start: np.ndarray
    piece_len: np.ndarray
    piece_column: np.ndarray
    dropped: np.ndarray
    empty: np.ndarray
    max_segments: int | None = None

    def __len__(self) -> int:
        return len(self.seq_starts) - 1

    @property
    def num_tokens(self) -> int:
        """The real tokens the sequences hold (every token of every document not dropped)."""
        return int(self.piece_len.sum())

    @property
    def efficiency(self) -> float:
        """Real tokens per slot: ``num_tokens / (len(plan) * seq_len)`` (0 for no sequence)."""
        return self.num_tokens / max(1, len(self) * self.seq_len)

    def pieces(self, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence ``q``'s pieces: their documents, first tokens and lengths, in column order."""
        span = slice(self.seq_starts[q], self.seq_starts[q + 1])
        return self.piece_doc[span], self.piece_start[span], self.piece_len[span]

    def pieces_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pieces of sequences ``ids``: ``(row, piece)``, ``row`` the position in ``ids``.

        Examples:
            >>> plan = plan_packing([3, 5, 2, 6], seq_len=8, strategy="best_fit")
            >>> [a.tolist() for a in plan.pieces_of(np.array([1, 1, 0]))]
            [[0, 0, 1, 1, 2, 2], [2, 3, 2, 3, 0, 1]]
        """
        first = self.seq_starts[ids]
        counts = self.seq_starts[ids + 1] - first
        rows = np.repeat(np.arange(len(ids)), counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, first[rows] + within

    def describe(self) -> str:
        """One line: strategy, sequences, efficiency, and the documents left out."""
        left_out = f", {len(self.dropped)} long documents dropped" if len(self.dropped) else ""
        empty = f", {len(self.empty)} empty documents" if len(self.empty) else ""
        return (
            f"{self.strategy} packing of {self.num_tokens} tokens into {len(self)} sequences of "
            f"{self.seq_len}{capped(self.max_segments)} (efficiency {self.efficiency:.4f})"
            f"{left_out}{empty}"
        )


def capped(max_segments: int | None) -> str:
    """The words a description gives a cap on segments per sequence ('' for none)."""
    return "" if max_segments is None else f" of at most {max_segments} segments"


def segment_lengths(offsets: np.ndarray, eos: bool) -> np.ndarray:
    """Each document's slots from its offsets: its tokens, plus one for the EOS that ends a
    non-empty document when ``eos`` (an empty document gets none, as in `TokenSequences`).

    Examples:
        >>> segment_lengths(np.array([0, 3, 3, 5]), eos=True).tolist()
        [4, 0, 3]
    """
    lengths = np.diff(offsets)
    return lengths + (lengths > 0) if eos else lengths


def plan_packing(
    lengths: Any,
    seq_len: int,
    strategy: str = "best_fit",
    long_documents: str = "split",
    seed: int | None = None,
    max_segments: int | None = None,
) -> PackPlan:
    """Packs documents of ``lengths`` tokens into sequences of ``seq_len`` slots.

    Args:
        lengths: each document's token count (``np.diff(offsets)``).
        seq_len: slots per sequence.
        strategy: one of `PACKING_STRATEGIES`.
        long_documents: one of `LONG_DOCUMENTS`.
        seed: packs the documents in a random order drawn from this seed; ``None`` packs them in
            their own order. Either way the plan is the same on every host.
        max_segments: the most segments (documents, or pieces of a split one) a sequence
            holds, Levanter's ``max_segments_per_example``; ``None``: as many as fit. A sequence
            that holds that many takes no more, whatever room it has left.

    Examples:
        >>> plan = plan_packing([4, 10, 2], seq_len=6, strategy="first_fit")
        >>> plan.piece_doc.tolist(), plan.piece_start.tolist(), plan.piece_len.tolist()
        ([0, 2, 1, 1], [0, 0, 0, 6], [4, 2, 6, 4])
        >>> plan.seq_starts.tolist(), plan.piece_column.tolist()
        ([0, 2, 3, 4], [0, 4, 0, 0])
        >>> [plan_packing([1, 1, 1, 1, 1], 8, "greedy", max_segments=m).seq_starts.tolist()
        ...  for m in (None, 2)]
        [[0, 5], [0, 2, 4, 5]]
    """
    lengths = _check_lengths(lengths)
    check_packing_options(seq_len, strategy, long_documents, seed, max_segments)
    order = (
        np.arange(len(lengths))
        if seed is None
        else np.random.default_rng(seed).permutation(len(lengths))
    )
    plan = _pack(lengths, order, 0, seq_len, strategy, long_documents, seed, max_segments)
    if not len(plan):
        raise nothing_to_pack(len(lengths), len(plan.empty), len(plan.dropped), seq_len)
    return plan


def plan_window(
    lengths: Any,
    seq_len: int,
    strategy: str,
    long_documents: str,
    seed: int | None,
    *,
    window: int,
    index: int,
    max_segments: int | None = None,
) -> PackPlan:
    """Window ``index`` of a corpus packed in windows of ``window`` documents: its documents,
    numbered ``index * window + i`` for ``lengths[i]``, packed alone. With a ``seed`` they go in
    the order ``np.random.default_rng([seed, index]).permutation(len(lengths))`` (each window
    its own order). A window may hold no sequence (every document empty, or long and dropped).

    Examples:
        >>> plan = plan_window([3, 5, 2], 8, "best_fit", "split", None, window=3, index=2)
        >>> plan.piece_doc.tolist(), plan.seq_starts.tolist()
        ([6, 7, 8], [0, 2, 3])
    """
    lengths = _check_lengths(lengths)
    check_packing_options(seq_len, strategy, long_documents, seed, max_segments)
    n = len(lengths)
    assert index >= 0 and 0 < n <= window, (index, window, n)
    order = np.arange(n) if seed is None else np.random.default_rng([seed, index]).permutation(n)
    return _pack(lengths, order, index * window, seq_len, strategy, long_documents, seed,
                 max_segments)  # fmt: skip


def nothing_to_pack(documents: int, empty: int, dropped: int, seq_len: int) -> ValueError:
    """The error of a corpus that fills no sequence."""
    return ValueError(
        f"nothing to pack: of {documents} documents, {empty} are empty and {dropped} are "
        f"longer than seq_len={seq_len} with long_documents='drop'; raise seq_len, or use "
        "long_documents='split'"
    )


def _pack(lengths, order, first, seq_len, strategy, long_documents, seed, max_segments) -> PackPlan:
    """Documents ``first + order`` (``lengths[order]`` tokens), placed in that order."""
    ordered = lengths[order]
    too_long = ordered > seq_len
    keep = (ordered > 0) & ~(too_long & (long_documents == "drop"))
    dropped = np.sort(order[too_long]) if long_documents == "drop" else np.zeros(0, np.int64)
    empty = np.flatnonzero(lengths == 0)
    if long_documents == "truncate":
        ordered = np.minimum(ordered, seq_len)
    item_doc, item_start, item_len = _items(first + order[keep], ordered[keep], seq_len)
    # no cap is a cap no sequence reaches: each holds at most seq_len items of >= 1 token
    cap = seq_len if max_segments is None else min(max_segments, seq_len)
    bins = _ASSIGN[strategy](item_len.tolist(), seq_len, cap)
    return _plan_from_bins(
        bins, item_doc, item_start, item_len,
        seq_len=seq_len, strategy=strategy, long_documents=long_documents, seed=seed,
        dropped=first + dropped, empty=first + empty, max_segments=max_segments,
    )  # fmt: skip


def _check_lengths(lengths: Any) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            f"document lengths must be a 1-d integer array, got {array.dtype}{list(array.shape)}; "
            "pass np.diff(store.offsets_range(0, store.num_documents + 1))"
        )
    if array.size and array.min() < 0:
        raise ValueError(
            f"document lengths must be >= 0, got {int(array.min())} at document "
            f"{int(np.argmin(array))}; the store's offsets must not decrease"
        )
    return array.astype(np.int64, copy=False)


def check_packing_options(
    seq_len: Any, strategy: Any, long_documents: Any, seed: Any, max_segments: Any = None
) -> None:
    """Raises unless the options are a valid packing's (naming the option and the fix)."""
    check_int("seq_len", seq_len, minimum=1)
    if strategy not in PACKING_STRATEGIES:
        raise ValueError(
            f"strategy must be one of {list(PACKING_STRATEGIES)}, got {strategy!r}; best_fit "
            "wastes the fewest slots"
        )
    if long_documents not in LONG_DOCUMENTS:
        raise ValueError(
            f"long_documents must be one of {list(LONG_DOCUMENTS)}, got {long_documents!r}"
        )
    if seed is not None and not is_int(seed):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
    check_max_segments(max_segments)


def check_max_segments(
    max_segments: Any, name: str = "max_segments", example: str = "max_segments=64"
) -> None:
    """Raises unless ``max_segments`` is a cap on segments per sequence (an int >= 1) or
    ``None`` (no cap); ``name`` and ``example`` are how the caller's user spells the option.

    Examples:
        >>> check_max_segments(0)
        Traceback (most recent call last):
            ...
        ValueError: max_segments must be an int >= 1 (the most documents a packed row holds) or None for no cap, got 0; e.g. max_segments=64, Levanter's default
    """
    if max_segments is None or (is_int(max_segments) and max_segments >= 1):
        return
    kind = ValueError if is_int(max_segments) else TypeError
    raise kind(
        f"{name} must be an int >= 1 (the most documents a packed row holds) or None for no "
        f"cap, got {max_segments!r}; e.g. {example}, Levanter's default"
    )


def _items(docs: np.ndarray, lengths: np.ndarray, seq_len: int):
    """Each document as pieces of at most ``seq_len`` tokens, in order: ``(doc, start, len)``."""
    count = -(-lengths // seq_len)
    item_doc = np.repeat(docs, count)
    first = np.cumsum(count) - count
    item_start = (np.arange(count.sum()) - np.repeat(first, count)) * seq_len
    item_len = np.minimum(seq_len, np.repeat(lengths, count) - item_start)
    return item_doc, item_start, item_len


def _greedy(lengths: list[int], seq_len: int, cap: int) -> np.ndarray:
    """One open sequence; a new one whenever the next item does not fit, or the open one holds
    ``cap`` items (counted only under a cap: a count per item costs uncapped packing 25%)."""
    bins, current, room, held = [0] * len(lengths), -1, 0, cap
    if cap >= seq_len:  # no sequence can reach the cap: items have >= 1 token
        for i, length in enumerate(lengths):
            if length > room:
                current, room = current + 1, seq_len
            room -= length
            bins[i] = current
        return np.asarray(bins, np.int64)
    for i, length in enumerate(lengths):
        if length > room or held == cap:
            current, room, held = current + 1, seq_len, 0
        room -= length
        held += 1
        bins[i] = current
    return np.asarray(bins, np.int64)


def _first_fit(lengths: list[int], seq_len: int, cap: int) -> np.ndarray:
    """The earliest sequence with room: a max tree of rooms over sequences, descended from the
    root towards the leftmost leaf with enough room (O(log n) per item). A sequence holding
    ``cap`` items has room 0 in the tree: no item (>= 1 token) goes there again."""
    size = 1 << max(0, len(lengths) - 1).bit_length()
    tree = [0] * (2 * size)  # tree[size + b]: room of sequence b (0 until opened)
    held = [0] * len(lengths) if cap < seq_len else None  # items in sequence b, under a cap
    bins, opened = [0] * len(lengths), 0
    for i, length in enumerate(lengths):
        if tree[1] >= length:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
            room = tree[node] - length
        else:
            node, opened, room = size + opened, opened + 1, seq_len - length
        bins[i] = node - size
        if held is not None:
            held[node - size] += 1
            if held[node - size] == cap:
                room = 0
        tree[node] = room
        node >>= 1
        while node:  # a room changed: refresh the maxima above it until one stays the same
            left, right = tree[2 * node], tree[2 * node + 1]
            best = left if left >= right else right
            if tree[node] == best:
                break
            tree[node], node = best, node >> 1
    return np.asarray(bins, np.int64)


def _best_fit(lengths: list[int], seq_len: int, cap: int) -> np.ndarray:
    """The fullest sequence with room, the earliest among equals: sequences in one heap per
    room, and a bit set of the rooms whose heap is not empty, so the smallest room >= the
    item's length is the lowest set bit at or above it (a shift and a bit trick). A sequence
    holding ``cap`` items leaves the heaps, as a full one does."""
    heaps: list[list[int]] = [[] for _ in range(seq_len + 1)]
    held = [0] * len(lengths) if cap < seq_len else None  # items in sequence b, under a cap
    nonempty, bins, opened = 0, [0] * len(lengths), 0
    for i, length in enumerate(lengths):
        above = nonempty >> length
        if above:
            room = length + (above & -above).bit_length() - 1
            heap = heaps[room]
            b = heapq.heappop(heap)
            if not heap:
                nonempty ^= 1 << room
            room -= length
        else:
            b, opened, room = opened, opened + 1, seq_len - length
        bins[i] = b
        if held is not None:
            held[b] += 1
            if held[b] == cap:
                room = 0
        if room:  # a full sequence never takes another item: it leaves the heaps
            if not heaps[room]:
                nonempty |= 1 << room
            heapq.heappush(heaps[room], b)
    return np.asarray(bins, np.int64)


_ASSIGN = {"greedy": _greedy, "first_fit": _first_fit, "best_fit": _best_fit}


def _plan_from_bins(bins, item_doc, item_start, item_len, **fields: Any) -> PackPlan:
    """Groups the items by sequence (stable: placement order within a sequence)."""
    order = np.argsort(bins, kind="stable")
    counts = np.bincount(bins)
    seq_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    piece_len = item_len[order]
    before = np.cumsum(piece_len) - piece_len  # tokens before each piece, over all sequences
    piece_column = before - np.repeat(before[seq_starts[:-1]], counts)
    return PackPlan(
        seq_starts=seq_starts, piece_doc=item_doc[order], piece_start=item_start[order],
        piece_len=piece_len, piece_column=piece_column, **fields,
    )  # fmt: skip
