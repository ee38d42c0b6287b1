"""`DocumentIndex`: what a host keeps in memory of a `DocumentStore`'s offsets, so that it never
holds the whole array: every ``stride``-th offset (the *marks*) and, for the EOS rule (an empty
document gets no EOS), the number of non-empty documents before each mark. That is 16 bytes per
``stride`` documents (10^9 documents, stride 4096: 3.9 MB).

`documents_touching` turns ranges of the stream (the documents back to back, each non-empty one
followed by an EOS when asked) into the documents they touch: the marks find each range's blocks
of ``stride`` documents, then one read of the offsets per run of blocks gives the exact
boundaries. Offsets that gather (`gathers`: numpy, in memory or memory-mapped, or a `FlatArray`
with ``take``) are searched in place inside each block instead: ~log2(stride) entries per range
end, whatever the store's size and whichever blocks other ranges touch. The index comes from `write_documents` (recorded beside
the offsets) or from `build_index`, one streaming pass that checks every offset on the way.
``docs/guides/tokens.md``, "The document index".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from psdp._checks import check_int

#: The default stride: one mark every this many documents.
STRIDE = 4096
#: Offsets read per step of `build_index`'s pass (a multiple of the stride): 2 MiB of int64, and a
#: few such arrays at a time is all the memory the pass takes.
PASS_ENTRIES = 1 << 18
#: The marks a given index is checked against when a store opens with it (evenly spaced).
SPOT_CHECKS = 64
#: Marks per group of `DocumentIndex.blocks_of`'s search: 8 int64, one cache line.
GROUP = 8

#: ``read(starts, stops)``: the offsets ``[starts[i], stops[i])`` for every ``i``, concatenated,
#: as int64.
ReadOffsets = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: ``take(d)``: the offsets of documents ``d`` (int64), wherever they are.
Gather = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, eq=False)
class DocumentIndex:
    """Every ``stride``-th offset of a store of ``num_documents`` documents, and the non-empty
    documents before it.

    Block ``j`` is documents ``[j * stride, min((j + 1) * stride, D))``; ``marks[j]`` is
    ``offsets[min(j * stride, D)]`` and ``nonempty[j]`` the number of non-empty documents before
    that document, for ``j = 0 .. ceil(D / stride)`` (so ``marks[-1]`` is the token count).
    ``longest`` bounds every document's length (the exact longest when built), which decides the
    dtype of the positions a view computes.

    Examples:
        >>> offsets = np.array([0, 3, 3, 7, 8, 10])  # 5 documents, the second empty
        >>> read = lambda a, b: offsets[a[0]:b[0]]  # one range at a time
        >>> index = build_index(read, 5, stride=2, name="example")
        >>> index.marks.tolist(), index.nonempty.tolist(), index.longest
        ([0, 3, 8, 10], [0, 1, 3, 4], 4)
        >>> index.num_tokens, index.stream_tokens(eos=True)  # 10 tokens and 4 EOS
        (10, 14)
    """

    num_documents: int
    stride: int
    marks: np.ndarray
    nonempty: np.ndarray
    longest: int

    def __post_init__(self) -> None:
        check_int("num_documents", self.num_documents, minimum=1)
        check_int("stride", self.stride, minimum=1)
        check_int("longest", self.longest, minimum=0)
        blocks = -(-self.num_documents // self.stride)
        fix = "build it with build_index, or pass index=None to build it from the offsets"
        for name in ("marks", "nonempty"):
            values = np.asarray(getattr(self, name))
            if values.shape != (blocks + 1,) or values.dtype.kind not in "iu":
                raise ValueError(
                    f"the document index's {name} must be an integer array of ceil(D / stride) + 1"
                    f" = {blocks + 1} entries (D={self.num_documents}, stride={self.stride}), got "
                    f"{values.dtype}{list(values.shape)}; {fix}"
                )
            values = values.astype(np.int64)
            if values[0] != 0 or (np.diff(values) < 0).any():
                raise ValueError(
                    f"the document index's {name} must start at 0 and never decrease, got "
                    f"{values[:4].tolist()}...; {fix}"
                )
            object.__setattr__(self, name, values)
        if (np.diff(self.nonempty) > np.diff(self._mark_documents)).any():
            raise ValueError(
                f"the document index counts more non-empty documents in a block than the "
                f"block's {self.stride} documents; {fix}"
            )

    @property
    def num_tokens(self) -> int:
        return int(self.marks[-1])

    @property
    def num_nonempty(self) -> int:
        """The documents of at least one token (each gets an EOS in a stream with EOS)."""
        return int(self.nonempty[-1])

    def stream_tokens(self, eos: bool) -> int:
        """The stream's length: every token, plus one EOS per non-empty document if ``eos``."""
        return self.num_tokens + (self.num_nonempty if eos else 0)

    @functools.cached_property
    def _mark_documents(self) -> np.ndarray:
        """The document at each mark: ``min(j * stride, D)``."""
        marks = np.arange(len(self.marks), dtype=np.int64) * self.stride
        return np.minimum(marks, self.num_documents)

    def empty_free(self, blocks: np.ndarray) -> bool:
        """Whether none of ``blocks`` holds an empty document."""
        docs = self._mark_documents
        added = self.nonempty[blocks + 1] - self.nonempty[blocks]
        return bool((added == docs[blocks + 1] - docs[blocks]).all())

    @functools.cached_property
    def _stream_marks(self) -> np.ndarray:
        """Where each mark's document starts in a stream with EOS."""
        return self.marks + self.nonempty

    def stream_marks(self, eos: bool) -> np.ndarray:
        return self._stream_marks if eos else self.marks

    @functools.cached_property
    def _group_marks(self) -> np.ndarray:
        """Every `GROUP`-th mark (a copy: a strided view would step through all the marks)."""
        return self.marks[::GROUP].copy()

    @functools.cached_property
    def _group_stream_marks(self) -> np.ndarray:
        return self._stream_marks[::GROUP].copy()

    def blocks_of(self, positions: np.ndarray, eos: bool) -> np.ndarray:
        """The block of the document that holds each stream position (in a stream with EOS if
        ``eos``). In two levels, so that the cost barely grows with the index: a binary search
        of all the marks misses the cache at most of its ~log2(D / stride) steps (2 MB of marks
        at 10^9 documents), while every `GROUP`-th mark is a small array that stays in cache,
        and it leaves one cache line of marks to compare per position.

        Examples:
            >>> index = DocumentIndex(10, 2, np.arange(0, 60, 10), np.arange(0, 12, 2), 10)
            >>> index.blocks_of(np.array([0, 9, 10, 25, 49]), eos=False).tolist()
            [0, 0, 1, 2, 4]
        """
        marks = self.stream_marks(eos)
        groups = self._group_stream_marks if eos else self._group_marks
        group = np.searchsorted(groups, positions, side="right") - 1
        rows = np.minimum(group[:, None] * GROUP + np.arange(GROUP), len(marks) - 1)
        at_or_below = (marks[rows] <= positions[:, None]).sum(axis=1)
        return np.minimum(group * GROUP + at_or_below - 1, len(marks) - 2)

    def check_matches(self, num_documents: int, num_tokens: int, where: str, fix: str) -> None:
        """Raises unless the index is of ``num_documents`` documents ending at ``num_tokens``."""
        if (self.num_documents, self.num_tokens) != (num_documents, num_tokens):
            raise ValueError(
                f"the document index of {where} is of {self.num_documents} documents and "
                f"{self.num_tokens} tokens, but the offsets hold {num_documents} documents and "
                f"{num_tokens} tokens; {fix}"
            )

    def spot_check(self, read: ReadOffsets, where: str, fix: str) -> None:
        """Compares up to `SPOT_CHECKS` evenly spaced marks with the offsets (one batched read)."""
        picks = np.unique(np.linspace(0, len(self.marks) - 1, SPOT_CHECKS).astype(np.int64))
        docs = self._mark_documents[picks]
        self.check_marks(picks, read(docs, docs + 1), where, fix)

    def check_marks(self, blocks: np.ndarray, values: np.ndarray, where: str, fix: str) -> None:
        """Raises unless ``values`` are the offsets at the marks of ``blocks``."""
        wrong = values != self.marks[blocks]
        if wrong.any():
            j = int(blocks[np.argmax(wrong)])
            raise ValueError(
                f"the document index of {where} is stale: offsets[{j * self.stride}]="
                f"{int(values[np.argmax(wrong)])}, but the index says {int(self.marks[j])}; {fix}"
            )

    def save(self, path: str | os.PathLike[str] | BinaryIO, *, identity: str = "") -> None:
        """Writes the index to a local ``.npz`` file (or a binary file object) that `load`
        reads, with ``identity``: what the offsets it indexes are (`saved_identity`; e.g. their
        file, size and time)."""
        if isinstance(path, str | os.PathLike):
            with open(path, "wb") as file:  # np.savez would append ".npz" to a name without it
                self.save(file, identity=identity)
            return
        np.savez(
            path,
            marks=self.marks,
            nonempty=self.nonempty,
            sizes=np.array([self.num_documents, self.stride, self.longest], np.int64),
            identity=np.array(identity),
        )

    @staticmethod
    def saved_identity(path: str | os.PathLike[str]) -> str:
        """The ``identity`` `save` recorded at ``path`` (``""`` if none)."""
        with np.load(path) as saved:
            return str(saved["identity"]) if "identity" in saved.files else ""

    @classmethod
    def load(cls, path: str | os.PathLike[str] | BinaryIO) -> DocumentIndex:
        """The index `save` wrote at ``path`` (a file name or a binary file object)."""
        with np.load(path) as saved:
            documents, stride, longest = (int(n) for n in saved["sizes"])
            return cls(documents, stride, saved["marks"], saved["nonempty"], longest)


#: What `check_offsets_rise` tells a user whose store's offsets fall.
DAMAGED = "the document store is damaged or was written with another layout; rewrite it"


def check_offsets_rise(
    values: np.ndarray,
    where: str,
    *,
    first: int | np.ndarray = 0,
    run_start: np.ndarray | None = None,
    fix: str = DAMAGED,
) -> None:
    """Checks that document offsets never decrease (a document's length is never negative),
    the one check every reader of offsets makes. ``values`` are ``offsets[first:first + n]``,
    or, with ``run_start``, runs read back to back: run ``r`` starts at ``values[run_start[r]]``
    and holds the offsets from document ``first[r]`` (no step between two runs is checked).

    Raises:
        ValueError: naming ``where``, the first document whose offsets fall and both values,
            and ``fix``.

    Examples:
        >>> check_offsets_rise(np.array([0, 3, 3, 7]), "store s")
        >>> check_offsets_rise(np.array([5, 9, 2]), "store s", first=10, fix="rewrite it")
        Traceback (most recent call last):
        ...
        ValueError: the offsets of store s must be non-decreasing, got offsets[11]=9 > offsets[12]=2; rewrite it
        >>> check_offsets_rise(np.array([0, 4, 2, 3]), "s", first=np.array([0, 8]),
        ...                    run_start=np.array([0, 2]))  # two runs: [0, 4] and [2, 3]
    """
    # compared, not differenced: one pass, a bool per offset (the work that grows with them)
    falls = values[1:] < values[:-1]
    starts = np.zeros(1, np.int64) if run_start is None else np.asarray(run_start)
    firsts = np.atleast_1d(np.asarray(first, np.int64))
    falls[starts[1:] - 1] = False  # from one run to the next is no step
    if not falls.any():
        return
    i = int(np.argmax(falls))
    run = int(np.searchsorted(starts, i, side="right")) - 1
    d = int(firsts[run] + i - starts[run])
    raise ValueError(
        f"the offsets of {where} must be non-decreasing, got offsets[{d}]={int(values[i])} > "
        f"offsets[{d + 1}]={int(values[i + 1])}; {fix}"
    )


def build_index(
    read: ReadOffsets,
    num_documents: int,
    *,
    stride: int = STRIDE,
    name: str,
    progress: bool = True,
) -> DocumentIndex:
    """The index of offsets ``[0, num_documents]``, read in steps of `PASS_ENTRIES` entries (so
    the memory used does not grow with the store), each step checked: no entry is below the one
    before it (the error names both). A progress bar shows when the pass takes over a second.

    Args:
        read: ``read(starts, stops)`` -> the offsets of those ranges, concatenated.
        num_documents: ``D``: the offsets have ``D + 1`` entries.
        stride: documents per mark.
        name: the store, for the progress bar and errors.
    """
    check_int("stride", stride, minimum=1)
    step = stride * max(1, PASS_ENTRIES // stride)
    marks: list[np.ndarray] = []
    nonempty: list[np.ndarray] = []
    counted = longest = 0  # non-empty documents before the entry last read; the longest
    with tqdm(
        total=num_documents + 1, unit="offsets", desc=f"index {name}", disable=not progress,
        delay=1.0,
    ) as bar:  # fmt: skip
        for first in range(0, num_documents + 1, step):
            # each step from the entry before it: the document across the step's edge counts
            low, stop = max(first - 1, 0), min(first + step, num_documents + 1)
            values = read(np.array([low]), np.array([stop]))
            check_offsets_rise(values, name, first=low)
            lengths = np.diff(values)
            before = counted + np.concatenate(([0], np.cumsum(lengths > 0)))
            marks.append(values[first - low :: stride].copy())  # a view would keep the step
            nonempty.append(before[first - low :: stride].copy())
            counted, longest = int(before[-1]), max(longest, int(lengths.max(initial=0)))
            bar.update(stop - first)
    if num_documents % stride:  # the last block is short: its end is a mark too
        marks.append(values[-1:])
        nonempty.append(np.array([counted]))
    return DocumentIndex(
        num_documents, stride, np.concatenate(marks), np.concatenate(nonempty), longest
    )


@dataclass(frozen=True)
class TouchedDocuments:
    """The documents that stream ranges touch, range after range.

    ``count[i]``: how many documents range ``i`` touches (0 for an empty range), from the one
    holding its first position to the one holding its last, empty ones between included. Then, for each
    of those documents in order, flattened over the ranges: ``doc`` (its number), ``start`` and
    ``stop`` (its tokens are ``flat[start:stop]``) and ``stream_start`` (where it starts in the
    stream).
    """

    count: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    stream_start: np.ndarray


def ranges(first: np.ndarray, count: np.ndarray, dtype: Any = np.int64) -> np.ndarray:
    """``first[i], first[i] + 1, ..., first[i] + count[i] - 1`` for every ``i``, concatenated,
    in ``dtype`` (which must hold ``count.sum()`` and every value).

    Examples:
        >>> ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
        [5, 6, 9, 10, 11]
    """
    before = np.cumsum(count) - count
    shift = (before - first).astype(dtype, copy=False)
    return np.arange(int(count.sum()), dtype=dtype) - np.repeat(shift, count)


def documents_touching(
    index: DocumentIndex,
    offsets: Any,
    read: ReadOffsets,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    eos: bool,
    where: str,
) -> TouchedDocuments:
    """The documents that the stream ranges ``[lo[i], hi[i])`` touch (``0 <= lo <= hi <=`` the
    stream's length), from the index and the offsets: ``offsets`` itself when it is a numpy
    array, else one ``read`` per run of the blocks the ranges touch.

    Examples:
        >>> offsets = np.array([0, 3, 3, 7, 8, 10])  # stream: 0 1 2 E 3 4 5 6 E 7 E 8 9 E
        >>> read = lambda a, b: np.concatenate([offsets[x:y] for x, y in zip(a, b)])
        >>> index = build_index(read, 5, stride=2, name="example")
        >>> got = documents_touching(index, offsets, read, np.array([2, 9]), np.array([6, 10]),
        ...                          eos=True, where="example")
        >>> got.count.tolist(), got.doc.tolist(), got.stream_start.tolist()  # 1 is empty
        ([3, 1], [0, 1, 2, 3], [0, 4, 4, 9])
    """
    used = hi > lo
    if not used.any():
        none = np.zeros(0, np.int64)
        return TouchedDocuments(np.zeros(len(lo), np.int64), none, none, none, none)
    queries = np.concatenate((lo[used], hi[used] - 1))
    e, n = int(eos), int(used.sum())
    docs, stream, take = _search(index, offsets, read, queries, n, e, where)
    first, count = docs[:n], docs[n:] - docs[:n] + 1
    doc = ranges(first, count)
    start, stop = take(doc), take(doc + 1)
    lengths = stop - start
    bad = (lengths < 0) | (stop > index.num_tokens) | (lengths > index.longest)
    if bad.any():
        d = int(doc[np.argmax(bad)])
        raise ValueError(
            f"the offsets of {where} do not match its index: document {d} spans "
            f"[{int(start[np.argmax(bad)])}, {int(stop[np.argmax(bad)])}) but the index says the "
            f"store holds {index.num_tokens} tokens, none in a document longer than "
            f"{index.longest}; the index is stale or the store is damaged: build the index again"
            " (index=None) or rewrite the store"
        )
    # each document's stream start: the first one's, then the stream lengths before it
    stream_lengths = lengths + e * (lengths > 0)
    before = np.cumsum(stream_lengths) - stream_lengths
    firsts = np.cumsum(count) - count
    stream_start = before + np.repeat(stream[:n] - before[firsts], count)
    counts = np.zeros(len(lo), np.int64)
    counts[used] = count
    return TouchedDocuments(counts, doc, start, stop, stream_start)


def _search(
    index: DocumentIndex,
    offsets: Any,
    read: ReadOffsets,
    queries: np.ndarray,
    n: int,
    e: int,
    where: str,
) -> tuple[np.ndarray, np.ndarray, Gather]:
    """The document holding each stream position, where it starts in the stream, and a gather
    of the offsets of the documents from each of the ``n`` ranges' first query to its last.

    Each query's block comes from the marks; the document inside it is bisected, reading the
    offsets in place where they gather (`gathers`: only the entries the search visits, about
    log2(stride) a query, however many blocks the queries share), else from one read per run
    of the blocks the ranges span. Without EOS, or in blocks with no empty document, document
    ``d`` of block ``j`` starts in the stream at ``offsets[d] + e * (d - empty documents before
    block j)``; otherwise the read blocks' non-empty documents are counted.
    """
    if isinstance(offsets, np.ndarray) and not e:  # the stream is the tokens: one search
        # in C, a few microseconds a batch; the queries in the offsets' dtype: numpy would
        # otherwise convert the whole array
        docs = np.searchsorted(offsets, queries.astype(offsets.dtype), side="right") - 1
        return docs, offsets[docs].astype(np.int64), _gather(offsets)
    blocks = index.blocks_of(queries, bool(e))
    plain = not e or index.empty_free(blocks)
    low = blocks * index.stride
    if gathers(offsets) and plain:
        take = _gather(offsets)
        index.check_marks(blocks, take(low), where, _STALE)
    else:
        take, nonempty_before = _read_blocks(index, read, blocks, n, not plain, where)
    if plain:
        empty_before = low - index.nonempty[blocks]

        def stream_at(d: np.ndarray) -> np.ndarray:
            return take(d) + e * (d - empty_before)

    else:
        assert nonempty_before is not None  # counted: some block has an empty document
        counted = nonempty_before

        def stream_at(d: np.ndarray) -> np.ndarray:
            return take(d) + counted(d)

    # the last document of its block starting at or before the query: steps of halving size
    # from the block's first, a fixed count for every query (no test of which are done); a
    # probe never passes the block's end, whose stream start is past the query
    end = np.minimum(low + index.stride, index.num_documents)
    step = 1 << (max(index.stride - 1, 1).bit_length() - 1)
    while step:
        probe = np.minimum(low + step, end)
        low = np.where(stream_at(probe) <= queries, probe, low)
        step >>= 1
    return low, stream_at(low), take


def gathers(offsets: Any) -> bool:
    """Whether ``offsets[d]`` for an index array ``d`` is cheap: a numpy array (in memory or
    memory-mapped), or a `FlatArray` with a ``take(d)`` method. A search then reads only the
    entries it visits, not whole blocks."""
    return isinstance(offsets, np.ndarray) or callable(getattr(offsets, "take", None))


def _gather(offsets: Any) -> Gather:
    return lambda d: np.asarray(offsets.take(d)).astype(np.int64, copy=False)


def _read_blocks(
    index: DocumentIndex, read: ReadOffsets, blocks: np.ndarray, n: int, count: bool, where: str
) -> tuple[Gather, Gather | None]:
    """Reads the blocks from each range's first query's to its last's, one read per run of
    consecutive blocks, and checks what it read: non-decreasing, the marks the index holds.
    Returns gathers of the offsets read and (if ``count``) of the non-empty documents before
    each document read."""
    needed = np.unique(ranges(blocks[:n], blocks[n:] - blocks[:n] + 1))
    breaks = np.flatnonzero(np.diff(needed) != 1) + 1
    run_first = needed[np.concatenate(([0], breaks))]
    run_last = needed[np.concatenate((breaks - 1, [len(needed) - 1]))]
    first_doc = run_first * index.stride
    size = np.minimum((run_last + 1) * index.stride, index.num_documents) - first_doc + 1
    values = read(first_doc, first_doc + size)
    run_start = np.cumsum(size) - size  # where each run is in ``values``

    def position(d: np.ndarray) -> np.ndarray:
        run = np.searchsorted(first_doc, d, side="right") - 1
        return run_start[run] + d - first_doc[run]

    check_offsets_rise(values, where, first=first_doc, run_start=run_start)
    at_marks = position(needed * index.stride)
    index.check_marks(needed, values[at_marks], where, _STALE)
    if not count:
        return lambda d: values[position(d)], None
    grew = np.concatenate(([0], np.cumsum(values[1:] > values[:-1])))  # non-empty, run by run
    counted = grew - np.repeat(grew[run_start] - index.nonempty[run_first], size)
    wrong = counted[at_marks] != index.nonempty[needed]
    if wrong.any():
        raise ValueError(
            f"the document index of {where} is stale: its count of non-empty documents before "
            f"document {int(needed[np.argmax(wrong)]) * index.stride} differs from the "
            f"offsets'; {_STALE}"
        )
    return lambda d: values[position(d)], lambda d: counted[position(d)]


_STALE = "build the index again (index=None) or rewrite the store"
