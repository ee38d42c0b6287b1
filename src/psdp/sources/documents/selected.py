"""`SelectedDocuments`: the documents of a store whose length lies in bounds (`LengthBounds`), as
a store of their own, so that a long-context stage can mix them in as a source of its own
(``docs/guides/mixtures.md``, "Sources selected by length").

The mental model: a selection is a sorted list of the store's document ids. Selected document
``i`` is the store's document ``ids[i]``; its tokens are the store's, and the selection's token
space is the selected documents back to back. A `SelectedDocuments` is a `DocumentStore` over
that space (offsets of the selected documents, and leaves whose ranges map onto the store's),
so every view, `Mixture` and `StagedTokens` reads it unchanged.

The list is kept in blocks of `BLOCK` selected documents (``[id, start in the selection, start
in the store]`` each), read when a batch needs them; a host holds only the selection's
`DocumentIndex` (16 bytes per 4,096 selected documents) and a few blocks. `build_length_index`
writes the blocks beside the store, then the head file (the index and what it was built for:
the store's `store_digest` and the bounds) in one commit, so a reader sees a whole selection or
none, and one of another store, or of this store before it changed, is refused.
"""

from __future__ import annotations

import io
import json
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from psdp.sources.documents.beside import IndexFolder, LengthBounds, index_command, store_digest
from psdp.sources.documents.index import STRIDE, DocumentIndex, documents_touching
from psdp.sources.documents.store import DocumentStore

#: Selected documents per block file (a multiple of the index's stride, so that a search inside
#: one block of the index reads one block file): 384 KiB a block.
BLOCK = 1 << 14
#: Blocks a host keeps: an object store's read whole (48 MiB at most), a local store's memory
#: maps (address space only: the pages a batch touched). A search visits each block a batch
#: needs ~log2(4096) times, so a batch's blocks (one or two a row) must fit.
CACHED_BLOCKS = {"remote": 128, "local": 8192}
#: Store offsets read per step of the selection pass (8 MiB of int64).
PASS_DOCUMENTS = 1 << 20
#: What a length index's head file says it is, and its layout's version.
FORMAT, VERSION = "psdp.length_index", 1
#: A block's columns: the store's document id, its start in the selection, its start in the store.
ID, START, SOURCE_START = 0, 1, 2


class SelectedDocuments(DocumentStore):
    """The documents of ``source`` that `LengthBounds` selects, as a `DocumentStore`: document
    ``i`` is ``source``'s document ``document_ids(i, i + 1)[0]``, with all its leaves.

    Make one with `select` (in memory, one pass over the store's offsets: for small stores and
    tests) or `beside` (the length index ``psdp index --min-length N`` built beside the store,
    checked: what a `DataConfig` source with ``min_length`` opens).

    Examples:
        >>> store = DocumentStore.from_documents([np.arange(n) for n in [3, 9, 1, 12, 8]])
        >>> long = SelectedDocuments.select(store, min_length=8)
        >>> long.num_documents, long.num_tokens, long.document_ids(0, 3).tolist()
        (3, 29, [1, 3, 4])
        >>> long.read_ranges([7, 9], [11, 11])["input_ids"].tolist()  # across documents 1 and 3
        [7, 8, 0, 1, 0, 1]
    """

    def __init__(
        self,
        source: DocumentStore,
        bounds: LengthBounds,
        index: DocumentIndex,
        block: Callable[[int], np.ndarray],
        *,
        remote: bool = False,
        checked: str | None = None,
    ):
        """Use `select` or `beside`.

        Args:
            source: the store the documents are selected from.
            bounds: the selection.
            index: the selection's `DocumentIndex` (of its offsets).
            block: ``block(k)``: the ``(n, 3)`` int64 rows of selected documents
                ``[k * BLOCK, ...)`` (`ID`, `START`, `SOURCE_START`).
            remote: whether reading a block waits on storage.
            checked: where the blocks were read from and how to build them again: each block
                is checked against the store's offsets when first read (``None``: made now,
                from them).
        """
        self.source, self.bounds = source, bounds
        if checked is not None:
            block = _checked(block, source, index, checked)
        self._blocks = _Blocks(block, index.num_documents, index.num_tokens, remote)
        self._mapped: tuple[bytes, tuple[np.ndarray, np.ndarray]] | None = None
        leaves = {
            leaf: _SelectedLeaf(self, leaf, dtype, index.num_tokens)
            for leaf, dtype in source.leaves.items()
        }
        written = None if source.written is None else f"{source.written}|{bounds.file_name}"
        super().__init__(
            self._blocks.column(START), leaves, name=f"{source.name} [{bounds.fields()}]",
            index=index, spot_check=False, written=written,
        )  # fmt: skip

    @classmethod
    def select(
        cls, store: DocumentStore, *, min_length: int | None = None, max_length: int | None = None
    ) -> SelectedDocuments:
        """The selection made now, in memory (one pass over ``store``'s offsets; 24 bytes per
        selected document). For a large store build its length index once and open it with
        `beside`.

        Raises:
            ValueError: no document of ``store`` is selected.
        """
        bounds = LengthBounds(min_length, max_length)
        blocks: list[np.ndarray] = []
        head = selection_pass(store, bounds, lambda _, rows: blocks.append(rows), progress=False)
        _check_selects(head, bounds, store.name, "")
        return cls(store, bounds, _head_index(head), blocks.__getitem__)

    @classmethod
    def beside(
        cls,
        where: Any,
        store: DocumentStore,
        *,
        min_length: int | None = None,
        max_length: int | None = None,
        format: str = "psdp",
    ) -> SelectedDocuments:
        """The selection whose length index ``psdp index`` built beside the store at ``where``
        (a path, URL or kvstore spec; ``store``: that store, opened), checked: built for these
        bounds of this store as it is now (`store_digest`). Reads its head file only.

        Raises:
            FileNotFoundError: there is no length index for these bounds; it names the command
                that builds it.
            ValueError: the file is not a length index, or is stale (another store, or this
                store before it changed), or it selects no document; it names the fix.

        Examples:
            >>> import tempfile
            >>> from psdp import write_documents
            >>> from psdp.prepare import build_indexes
            >>> path = f"{tempfile.mkdtemp()}/store"
            >>> _ = write_documents(path, [np.arange(n) for n in [3, 9, 1, 12]], progress=False)
            >>> _ = build_indexes(path, lengths=[LengthBounds(min_length=8)], progress=False)
            >>> long = SelectedDocuments.beside(path, DocumentStore.open(path), min_length=8)
            >>> long.document_ids(0, long.num_documents).tolist()
            [1, 3]
        """
        bounds = LengthBounds(min_length, max_length)
        folder = IndexFolder(where)
        command = index_command(where, format, lengths=(bounds,))
        data = folder.read(bounds.file_name)
        if data is None:
            raise FileNotFoundError(
                f"no length index beside {store.name} for {bounds.fields()} "
                f"({folder.where(bounds.file_name)}); build it once with `{command}`"
            )
        fix = f"build it again with `{command}` (it replaces the file)"
        head, index_arrays = read_length_head(data, folder.where(bounds.file_name), fix)
        # min_length 0 and unset select alike and share the file name: one index serves both
        if (head["min_length"] or 0, head["max_length"]) != (
            bounds.min_length or 0,
            bounds.max_length,
        ):
            raise ValueError(
                f"the length index {folder.where(bounds.file_name)} is of min_length="
                f"{head['min_length']}, max_length={head['max_length']}, not {bounds.fields()}"
                f"; {fix}"
            )
        digest = store_digest(store.index, store.written)
        if head["store"] != digest:
            raise ValueError(
                f"the length index {folder.where(bounds.file_name)} is stale: it was built for "
                f"store {head['store']!r}, but {store.name} is {digest!r} (its size, document "
                f"index and write: another store, or this one changed since); {fix}"
            )
        _check_selects(head, bounds, store.name, " (as its length index says)")
        blocks = head["blocks"]
        read = _local_block(folder, blocks) if folder.local else _remote_block(folder, blocks)
        index = _head_index(head, index_arrays)
        checked = f"the length index {folder.where(bounds.file_name)} is stale ({{}}); {fix}"
        return cls(store, bounds, index, read, remote=not folder.local, checked=checked)

    def document_ids(self, start: int, stop: int) -> np.ndarray:
        """The store's ids of selected documents ``[start, stop)`` (int64, increasing).

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(n) for n in [3, 9, 1, 12]])
            >>> SelectedDocuments.select(store, max_length=3).document_ids(0, 2).tolist()
            [0, 2]
        """
        if not 0 <= start <= stop <= self.num_documents:
            raise ValueError(
                f"document_ids needs 0 <= start <= stop <= num_documents={self.num_documents}, "
                f"got start={start}, stop={stop}"
            )
        return self._blocks.take(np.arange(start, stop, dtype=np.int64), ID)

    def source_ids(self, docs: Any) -> np.ndarray:
        """The store's ids of selected documents ``docs`` (any order).

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(n) for n in [3, 9, 1, 12]])
            >>> SelectedDocuments.select(store, min_length=4).source_ids([1, 0]).tolist()
            [3, 1]
        """
        docs = np.asarray(docs, np.int64)
        if docs.size and not 0 <= docs.min() <= docs.max() < self.num_documents:
            raise ValueError(
                f"source_ids needs documents in [0, {self.num_documents}), got "
                f"{int(docs.min())} to {int(docs.max())}"
            )
        return self._blocks.take(docs, ID)

    def source_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The store's token ranges that hold the selection's ranges ``[starts[i], stops[i])``,
        in order (a range across selected documents is one range a document). The last
        mapping is kept: every leaf of one read asks for the same ranges."""
        key = np.concatenate([starts, stops]).astype(np.int64).tobytes()
        last = self._mapped  # another thread may replace it
        if last is not None and last[0] == key:
            return last[1]
        got = documents_touching(
            self.index, self._blocks.column(START), self._blocks.read, starts, stops, eos=False,
            where=self.name,
        )  # fmt: skip
        of_range = np.repeat(np.arange(len(starts)), got.count)
        lo = np.maximum(got.start, starts[of_range])
        hi = np.minimum(got.stop, stops[of_range])
        shift = self._blocks.take(got.doc, SOURCE_START) - got.start
        keep = hi > lo
        mapped = (lo + shift)[keep], (hi + shift)[keep]
        self._mapped = key, mapped
        return mapped

    def describe(self) -> str:
        return f"SelectedDocuments({self.bounds.fields()} of {self.source.describe()})"


class _Blocks:
    """The selection's blocks, read by ``block(k)``: its columns gathered, the blocks last read
    kept (`CACHED_BLOCKS`)."""

    def __init__(self, block: Callable[[int], np.ndarray], selected: int, tokens: int,
                 remote: bool):  # fmt: skip
        self._block, self.selected, self.tokens, self.remote = block, selected, tokens, remote
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # a loader reads with several threads

    def _get(self, k: int) -> np.ndarray:
        with self._lock:
            if k in self._kept:
                self._kept.move_to_end(k)
                return self._kept[k]
        rows = np.asarray(self._block(k))  # a memory map as a plain view: cheaper to index
        with self._lock:
            self._kept[k] = rows
            if len(self._kept) > CACHED_BLOCKS["remote" if self.remote else "local"]:
                self._kept.popitem(last=False)
        return rows

    def take(self, d: np.ndarray, column: int) -> np.ndarray:
        """Column ``column`` of selected documents ``d``; ``START`` of ``d = selected`` is the
        selection's token count (its last offset)."""
        d = np.asarray(d, np.int64)
        out = np.full(d.shape, self.tokens, np.int64)
        inside = d < self.selected
        if column == START:  # the first start is 0: a store's open reads no block
            out[d == 0] = 0
            inside &= d != 0
        blocks = d // BLOCK
        wanted = np.flatnonzero(inside)
        wanted = wanted[np.argsort(blocks[wanted], kind="stable")]  # grouped by block, sorted
        for at in np.split(wanted, np.flatnonzero(np.diff(blocks[wanted])) + 1):
            if len(at):
                k = int(blocks[at[0]])
                out[at] = self._get(k)[d[at] - k * BLOCK, column]
        return out

    def read(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """The selection's offsets ``[starts[i], stops[i])``, concatenated."""
        runs = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, stops, strict=True)]
        return self.take(np.concatenate([np.zeros(0, np.int64), *runs]), START)

    def column(self, column: int) -> _Column:
        return _Column(self, column)


class _Column:
    """A column of the blocks as a flat array (`FlatArray`, with ``take``): the selection's
    offsets (`START`, ``selected + 1`` entries)."""

    def __init__(self, blocks: _Blocks, column: int):
        self._blocks, self._column = blocks, column
        self.shape, self.dtype = (blocks.selected + 1,), np.dtype(np.int64)
        self.reads_storage = blocks.remote

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        return self.take(np.arange(start, max(start, stop), dtype=np.int64))

    def take(self, d: np.ndarray) -> np.ndarray:
        return self._blocks.take(d, self._column)


class _SelectedLeaf:
    """A leaf of the selection as a flat array: its ranges read from the store's leaf."""

    def __init__(self, selection: SelectedDocuments, leaf: str, dtype: np.dtype, tokens: int):
        self._selection, self._leaf = selection, leaf
        self.shape, self.dtype = (tokens,), np.dtype(dtype)
        self.reads_storage = selection.source.reads_storage

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        lo, hi = self._selection.source_ranges(np.asarray(starts), np.asarray(stops))
        return self._selection.source.read_ranges(lo, hi, [self._leaf])[self._leaf]

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        return self.read_ranges(np.array([start]), np.array([max(start, stop)]))


def selection_pass(
    store: DocumentStore,
    bounds: LengthBounds,
    keep_block: Callable[[int, np.ndarray], None],
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """One pass over ``store``'s offsets (`PASS_DOCUMENTS` at a time) that hands each block of
    selected documents to ``keep_block(k, rows)`` (`BLOCK` rows of ``[id, start, source
    start]``, the last one shorter, maybe empty). Returns the head: the counts, the store's
    shortest and longest document, and the selection's index arrays (``marks``,
    ``nonempty``). Memory: a block and a step of offsets, whatever the store's size."""
    blocks = 0
    total = store.num_documents
    pending: list[np.ndarray] = []
    held = selected = tokens = nonempty = longest = source_longest = 0
    shortest: int | None = None
    marks: list[int] = []
    counts: list[int] = []
    bar = tqdm(total=total, unit="documents", desc=f"length index {bounds.flags()}",
               disable=not progress, delay=1.0)  # fmt: skip
    with bar:
        for first in range(0, total, PASS_DOCUMENTS):
            stop = min(first + PASS_DOCUMENTS, total)
            offsets = store.offsets_range(first, stop + 1)
            lengths = np.diff(offsets)
            low = int(lengths.min())
            shortest = low if shortest is None else min(shortest, low)
            source_longest = max(source_longest, int(lengths.max()))
            keep = np.flatnonzero(bounds.selects(lengths))
            chosen = lengths[keep]
            rows = np.empty((len(keep), 3), np.int64)
            rows[:, ID] = keep + first
            rows[:, START] = tokens + np.cumsum(chosen) - chosen
            rows[:, SOURCE_START] = offsets[keep]
            # the selection's index: a mark at every STRIDE-th selected document, then the end
            at = np.flatnonzero((np.arange(len(keep)) + selected) % STRIDE == 0)
            marks += rows[at, START].tolist()
            counts += (nonempty + np.cumsum(chosen > 0) - (chosen > 0))[at].tolist()
            selected += len(keep)
            tokens += int(chosen.sum())
            nonempty += int((chosen > 0).sum())
            longest = max(longest, int(chosen.max(initial=0)))
            pending.append(rows)
            held += len(rows)
            while held >= BLOCK:
                block, pending, held = _cut(pending, held)
                keep_block(blocks, block)
                blocks += 1
            bar.update(stop - first)
    head = {
        "documents": selected, "tokens": tokens, "longest": longest, "shortest": shortest,
        "source_longest": source_longest, "marks": np.array([*marks, tokens], np.int64),
        "nonempty": np.array([*counts, nonempty], np.int64),
    }  # fmt: skip
    keep_block(blocks, np.concatenate(pending) if pending else np.zeros((0, 3), np.int64))
    return head


def _cut(pending: list[np.ndarray], held: int) -> tuple[np.ndarray, list[np.ndarray], int]:
    """The first `BLOCK` rows of ``pending``, and the rest."""
    rows = np.concatenate(pending)
    return rows[:BLOCK], [rows[BLOCK:]], held - BLOCK


def build_length_index(
    where: Any, store: DocumentStore, bounds: LengthBounds, *, progress: bool = True
) -> tuple[str, dict[str, Any]]:
    """Builds the length index of ``bounds`` beside the store at ``where`` (``store``: it,
    opened), unless the one there is up to date: the blocks (in a folder named by the store's
    digest), then the head file, in one commit; blocks of an earlier build are deleted after.
    Returns ``"built"`` or ``"up to date"``, and the head. `psdp.prepare.build_indexes` calls it.
    """
    folder = IndexFolder(where)
    digest = store_digest(store.index, store.written)
    data = folder.read(bounds.file_name)
    if data is not None:
        try:
            head, _ = read_length_head(data, "", "")
            if head["store"] == digest:
                return "up to date", head
        except ValueError:  # not a length index of this psdp: replaced
            pass
    stem = bounds.file_name.removesuffix(".npz")
    blocks = f"{stem}-{digest.rsplit(':', 1)[-1][:16]}/"

    def write(k: int, rows: np.ndarray) -> None:
        body = io.BytesIO()
        np.save(body, rows)
        folder.write(f"{blocks}block-{k:07d}.npy", body.getvalue())

    head = selection_pass(store, bounds, write, progress=progress)
    header = {key: value for key, value in head.items() if key not in ("marks", "nonempty")}
    header.update(format=FORMAT, version=VERSION, store=digest, blocks=blocks, block=BLOCK,
                  min_length=bounds.min_length, max_length=bounds.max_length)  # fmt: skip
    body = io.BytesIO()
    np.savez(body, header=np.array(json.dumps(header)), marks=head["marks"],
             nonempty=head["nonempty"])  # fmt: skip
    folder.write(bounds.file_name, body.getvalue())
    folder.delete([n for n in folder.names(f"{stem}-") if not n.startswith(blocks)])
    return "built", {**header, "marks": head["marks"], "nonempty": head["nonempty"]}


def read_length_head(data: bytes, where: str, fix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A length index's head file (its bytes, from ``where``): its header, and its index's
    ``marks`` and ``nonempty``; anything else is a `ValueError` ending in ``fix``."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as saved:
            header = json.loads(str(saved["header"]))
            arrays = {name: saved[name] for name in ("marks", "nonempty")}
        got = (header.get("format"), header.get("version"))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        raise ValueError(f"{where} is not a psdp length index ({error}); {fix}") from error
    if got != (FORMAT, VERSION) or header.get("block") != BLOCK:
        raise ValueError(
            f"{where} is not a psdp length index of version {VERSION} with blocks of {BLOCK} "
            f"(it says {got}, blocks of {header.get('block')}); {fix}"
        )
    return header, arrays


def _head_index(head: dict[str, Any], arrays: dict[str, Any] | None = None) -> DocumentIndex:
    arrays = head if arrays is None else arrays
    return DocumentIndex(
        head["documents"], STRIDE, arrays["marks"], arrays["nonempty"], head["longest"]
    )


def _check_selects(head: dict[str, Any], bounds: LengthBounds, name: str, built: str) -> None:
    """Raises unless the selection holds a document, saying what the store's lengths are."""
    if head["documents"]:
        return
    raise ValueError(
        f"{bounds.fields()} selects no document of {name}{built}: its documents have "
        f"{head['shortest']} to {head['source_longest']} tokens; choose bounds inside that range,"
        " or drop the source"
    )


def _checked(
    block: Callable[[int], np.ndarray], store: DocumentStore, index: DocumentIndex, stale: str
) -> Callable[[int], np.ndarray]:
    """``block``, each block checked against ``store``'s offsets (one read of two per selected
    document): the store's identity (`store_digest`) misses a store rewritten with the same
    size, every 4,096th offset and write record (a Levanter cache's ledger holds no tokens: the
    same documents in another order keep it), whose selected documents then lie elsewhere."""

    def read(k: int) -> np.ndarray:
        rows = np.asarray(block(k))
        if not len(rows):
            return rows
        ids = rows[:, ID]
        first, span = int(ids[0]), int(ids[-1] - ids[0]) + 2
        # one range read (at most 8 MiB a block: a selection of >= 1/64 of the documents) is
        # far cheaper than a range per document (80 ms a block from a local store's maps)
        if span <= 64 * len(ids):
            around = store.offsets_range(first, first + span)
            places = np.stack([around[ids - first], around[ids - first + 1]], axis=1)
        else:
            places = store._read_offsets(ids, ids + 2).reshape(-1, 2)
        # each selected document's end in the store: the next one's start in the selection,
        # then the selection's end for the last; a block's last ends where the next block says
        starts = np.append(rows[:, START], index.num_tokens)
        ends = rows[:, SOURCE_START] + np.diff(starts)
        if k * BLOCK + len(rows) < index.num_documents:
            ends[-1] = places[-1, 1]  # in the next block: its start is checked there
        wrong = np.flatnonzero((places[:, 0] != rows[:, SOURCE_START]) | (places[:, 1] != ends))
        if len(wrong):
            i = int(wrong[0])
            raise ValueError(
                stale.format(
                    f"its selected document {k * BLOCK + i} is the store's document "
                    f"{int(ids[i])} at tokens {int(rows[i, SOURCE_START])}-{int(ends[i])}, but "
                    f"the store has that document at {int(places[i, 0])}-{int(places[i, 1])}: "
                    "the store changed since the index was built, keeping its size and write "
                    "record"
                )
            )
        return rows

    return read


def _local_block(folder: IndexFolder, blocks: str) -> Callable[[int], np.ndarray]:
    """A local store's block ``k``, memory-mapped (its pages read as a batch needs them)."""
    local = folder.local
    assert local is not None

    def block(k: int) -> np.ndarray:
        path = local / f"{blocks}block-{k:07d}.npy"
        try:
            return np.load(path, mmap_mode="r")
        except FileNotFoundError:
            raise FileNotFoundError(_missing(str(path))) from None

    return block


def _remote_block(folder: IndexFolder, blocks: str) -> Callable[[int], np.ndarray]:
    """An object store's block ``k``: one read of its file."""

    def block(k: int) -> np.ndarray:
        name = f"{blocks}block-{k:07d}.npy"
        data = folder.read(name)
        if data is None:
            raise FileNotFoundError(_missing(folder.where(name)))
        return np.load(io.BytesIO(data), allow_pickle=False)

    return block


def _missing(where: str) -> str:
    return (
        f"{where} is missing: the length index beside the store is damaged (a block deleted, "
        "or a build of another store running); build it again with psdp index"
    )
