"""`DocumentStore`: variable-length documents stored flat, as Levanter's ``JaggedArrayStore`` and
nanoGPT's token files do: one 1-D array per leaf (``input_ids``, and any per-token leaf such as a
``loss_mask``, all aligned token by token) plus ``offsets``, so that document ``d`` is
``flat[offsets[d]:offsets[d + 1]]``. Views such as `TokenSequences` choose the sequence length at
read time and read contiguous token ranges (`DocumentStore.read_ranges`). ``docs/guides/tokens.md``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from psdp._checks import check_int
from psdp._deprecated import warn_deprecated
from psdp._plan.dtypes import cast_checked
from psdp._plan.leaves import POSITIONS, SEGMENT_IDS, TOKENS
from psdp.sources.documents.index import (
    DocumentIndex,
    TouchedDocuments,
    build_index,
    documents_touching,
)
from psdp.sources.stores.errors import TransientReadError, is_transient_status

if TYPE_CHECKING:  # both load tensorstore, imported on first use (`open_documents`)
    import tensorstore as ts

    from psdp.sources.documents.format import StoredDocuments

#: More documents than any store holds (10^13 tokens are ~2**43 documents): offsets this long
#: are allocated longer than their documents, and a pass over them would never end.
MAX_DOCUMENTS = 2**48
_DAMAGED = "the document store is damaged or was written with another layout; rewrite it"


def check_view_of(store: Any, view: str, **ids: int | None) -> None:
    """Raises unless ``store`` is a `DocumentStore` that ``view`` may read: no leaf that the view
    computes itself (it would silently replace the store's own), and every token id in ``ids``
    (e.g. ``pad_id=0``; ``None``: unset) an int that the store's token dtype holds.

    Examples:
        >>> store = DocumentStore.from_documents([np.arange(3, dtype=np.uint8)])
        >>> check_view_of(store, "TokenSequences", pad_id=255, eos_id=None)
        >>> check_view_of(store, "TokenSequences", pad_id=256)
        Traceback (most recent call last):
            ...
        ValueError: pad_id=256 does not fit the store's input_ids dtype uint8 ([0, 255]); choose an id in that range, or store wider ids
    """
    if not isinstance(store, DocumentStore):
        raise TypeError(
            f"store must be a psdp DocumentStore, got {type(store).__name__}; build one with "
            "DocumentStore.from_documents(docs), DocumentStore.open(path) or "
            "DocumentStore.from_arrays(offsets, leaves)"
        )
    clash = sorted({SEGMENT_IDS, POSITIONS} & set(store.leaves))
    if clash:
        raise ValueError(
            f"the store has leaves {clash}, which {view} computes itself; rename or drop them "
            f"before reading it with {view}"
        )
    dtype = store.leaves[TOKENS]
    info = np.iinfo(dtype)
    for name, value in ids.items():
        if value is None:
            continue
        check_int(name, value, minimum=None)
        if not info.min <= value <= info.max:
            raise ValueError(
                f"{name}={value} does not fit the store's {TOKENS} dtype {dtype} ([{info.min}, "
                f"{info.max}]); choose an id in that range, or store wider ids"
            )


def chosen_leaves(available: Mapping[str, np.dtype], leaves: Any, view: str) -> dict[str, np.dtype]:
    """The leaves a view delivers: ``leaves`` (names of ``available``, e.g. to leave out a
    computed leaf the trainer does not use), or all of ``available`` when ``None``; in
    ``available``'s order.

    Examples:
        >>> available = {"input_ids": np.dtype(np.uint16), "segment_ids": np.dtype(np.int32)}
        >>> list(chosen_leaves(available, ("input_ids",), "TokenSequences"))
        ['input_ids']
        >>> chosen_leaves(available, ("input_ids", "position"), "TokenSequences")
        Traceback (most recent call last):
            ...
        ValueError: leaves=('input_ids', 'position') names ['position'], which TokenSequences does not have (it has ['input_ids', 'segment_ids']); choose among those
    """
    if leaves is None:
        return dict(available)
    if isinstance(leaves, str | bytes) or not isinstance(leaves, Iterable):
        raise TypeError(
            f"leaves must be a tuple of leaf names, got {type(leaves).__name__} {leaves!r}; "
            f"e.g. leaves=({TOKENS!r}, {SEGMENT_IDS!r})"
        )
    names = tuple(leaves)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(
            f"leaves={names!r} names {unknown}, which {view} does not have (it has "
            f"{list(available)}); choose among those"
        )
    if not names or len(set(names)) < len(names):
        raise ValueError(
            f"leaves={names!r} must name each leaf {view} delivers once, and at least one; "
            "leave it unset for every leaf"
        )
    return {name: dtype for name, dtype in available.items() if name in names}


class DocumentStore:
    """Documents stored flat: one 1-D array per leaf, all aligned token by token, plus ``offsets``.

    ``offsets`` is an integer array of shape ``(D + 1,)``, ``offsets[0] == 0``, non-decreasing,
    and ``offsets[-1] == num_tokens``: document ``d`` is ``flat[offsets[d]:offsets[d + 1]]``.
    Every array is read by range only, the offsets too (`offsets_range`): a host keeps their
    `DocumentIndex` (every 4096th offset), never the whole array. The arrays may be numpy
    arrays (memory, or ``np.load(..., mmap_mode="r")``), TensorStore arrays (`open`,
    `from_arrays`) or any object with ``shape``, ``dtype`` and ``a[start:stop]`` (`FlatArray`).

    Build one with `from_documents` (in memory), `open` (written by `write_documents`) or
    `from_arrays` (flat arrays and offsets written by another tool).

    Examples:
        >>> store = DocumentStore.from_documents([np.array([5, 6, 7]), np.array([8, 9])])
        >>> store.offsets_range(0, 3).tolist(), store.num_documents, store.num_tokens
        ([0, 3, 5], 2, 5)
        >>> store.read_ranges([4, 0], [5, 2])["input_ids"].tolist()
        [9, 5, 6]
    """

    def __init__(
        self,
        offsets: Any,
        flat: Mapping[str, Any],
        *,
        name: str = "in memory",
        index: DocumentIndex | str | os.PathLike[str] | None = None,
        spot_check: bool = True,
        written: str | None = None,
    ):
        """Use `from_documents`, `open` or `from_arrays`.

        Args:
            offsets: the document offsets (a `FlatArray`; checked as `DocumentIndex` says).
            flat: leaf name -> a 1-D `FlatArray`.
            name: where the store is, for messages.
            index: the offsets' `DocumentIndex`, a local file that caches it, or ``None``
                (built by one pass over the offsets); as for `from_arrays`.
            spot_check: compare a given index with 64 evenly spaced offsets; ``False`` for an
                index committed with the offsets (`open` checks it against the metadata).
            written: the identity of the write that made the store (`written`).
        """
        self.name = name
        #: What the write that made the store wrote (its ``psdp.json``'s ``written``): the
        #: sha256 of the documents `write_documents` wrote, or of what a ``psdp prepare`` commit
        #: holds (settings, tokenizer, inputs by content, parts), a Levanter cache's ledger's
        #: sha256; ``None`` for a store written before psdp recorded it, or made in memory. The
        #: indexes beside the store record it (`psdp.sources.documents.beside`).
        self.written = written
        # what a cached index (index=PATH) is of; before `_plain` drops the memmap's file
        self._offsets_file = (
            _file_identity(offsets) if isinstance(index, str | os.PathLike) else None
        )
        self._offsets = _plain(offsets)
        self._flat = {leaf: _plain(array) for leaf, array in flat.items()}
        shape, dtype = _shape_and_dtype(self._offsets)
        _check_offsets_type(shape, dtype, name)
        documents = shape[0] - 1
        if documents < 1:
            raise ValueError(
                f"the offsets of {name} must have D + 1 >= 2 entries (at least one document), got "
                f"{shape[0]}; {_DAMAGED}"
            )
        _check_ends(int(self._read_offsets(np.array([0]), np.array([1]))[0]), shape[0], name)
        last = int(self._read_offsets(np.array([documents]), np.array([documents + 1]))[0])
        self.leaves: dict[str, np.dtype] = _checked_leaves(self._flat, last, name)
        #: leaf -> the dtype its reads are cast to, each checked (`with_dtypes`)
        self._casts: dict[str, np.dtype] = {}
        #: The offsets' `DocumentIndex`: what this host keeps of them.
        self.index = self._index_of(index, documents, last, spot_check)

    @property
    def num_documents(self) -> int:
        return self.index.num_documents

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    def __len__(self) -> int:
        """The number of documents (`num_documents`)."""
        return self.num_documents

    def source_ids(self, docs: Any) -> np.ndarray:
        """The ids that name documents ``docs`` in the store a user opened: themselves here; a
        `SelectedDocuments` maps its own numbers to its store's (what provenance reports).

        Examples:
            >>> DocumentStore.from_documents([np.arange(3)]).source_ids([0]).tolist()
            [0]
        """
        return np.asarray(docs, np.int64)

    def offsets_range(self, start: int, stop: int) -> np.ndarray:
        """``offsets[start:stop]`` as an int64 array the caller owns (one range read).

        Examples:
            >>> store = DocumentStore.from_documents([np.array([5, 6, 7]), np.array([8, 9])])
            >>> store.offsets_range(1, 3).tolist()
            [3, 5]
        """
        check_int("start", start, minimum=None)
        check_int("stop", stop, minimum=None)
        if not 0 <= start <= stop <= self.num_documents + 1:
            raise ValueError(
                f"offsets_range needs 0 <= start <= stop <= num_documents + 1 = "
                f"{self.num_documents + 1} (the offsets' entries), got start={start}, "
                f"stop={stop}; offsets_range(d, d + 2) gives document d's start and end"
            )
        return self._read_offsets(np.array([start]), np.array([stop]))

    @property
    def offsets(self) -> np.ndarray:
        """Deprecated: every offset, read whole; use `offsets_range`."""
        warn_deprecated(
            "DocumentStore.offsets",
            "use store.offsets_range(start, stop), which reads only that range (the whole "
            "array is store.offsets_range(0, store.num_documents + 1))",
        )
        return self.offsets_range(0, self.num_documents + 1)

    @property
    def reads_storage(self) -> bool:
        """Whether reading waits on storage: some array (the offsets included) is not a numpy
        array and does not say ``reads_storage = False`` (a local store's memory maps of its
        shard files do). A loader then reads with several threads by default.

        Examples:
            >>> DocumentStore.from_documents([np.array([1, 2])]).reads_storage
            False
        """
        arrays = (self._offsets, *self._flat.values())
        # an array may say itself (a local store's memory maps are read like memory)
        return any(
            getattr(array, "reads_storage", not isinstance(array, np.ndarray)) for array in arrays
        )

    @classmethod
    def from_documents(cls, docs: Iterable[Any]) -> DocumentStore:
        """A store in memory from an iterable of documents.

        Args:
            docs: each document a 1-D integer array of token ids (the leaf ``input_ids``), or a
                dict of aligned 1-D arrays (one value per token, e.g. ``input_ids`` and a
                ``loss_mask``), every document with the same leaves. Empty documents are refused:
                they hold no token to train on and would only shift document numbers (drop
                them first); a store opened with `from_arrays` may have them.

        Examples:
            >>> docs = [{"input_ids": np.array([1, 2]), "loss_mask": np.array([0, 1], np.uint8)},
            ...         {"input_ids": np.array([3]), "loss_mask": np.array([1], np.uint8)}]
            >>> store = DocumentStore.from_documents(docs)
            >>> store.leaves
            {'input_ids': dtype('int64'), 'loss_mask': dtype('uint8')}
        """
        parts: dict[str, list[np.ndarray]] | None = None
        lengths = []
        for index, doc in enumerate(docs):
            leaves = document_leaves(doc, index, None if parts is None else list(parts))
            if parts is None:
                parts = {name: [] for name in leaves}
            for name, value in leaves.items():
                parts[name].append(value)
            lengths.append(len(leaves[TOKENS]))
        if parts is None:
            raise ValueError("no documents to store: the iterable was empty; pass at least one")
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(offsets, {name: np.concatenate(values) for name, values in parts.items()})

    @classmethod
    def from_arrays(
        cls,
        offsets: Any,
        leaves: Mapping[str, Any],
        *,
        index: DocumentIndex | str | os.PathLike[str] | None = None,
    ) -> DocumentStore:
        """A store from flat arrays written by any tool: numpy arrays (``np.load(path,
        mmap_mode="r")`` for nanoGPT/MaxText ``.npy`` files), open TensorStore arrays,
        TensorStore spec dicts (a zarr array of another tool), or any `FlatArray`. A Levanter
        cache differs (``offsets[0]`` holds the document count, the arrays are allocated
        ``2**54`` long): open it with `psdp.sources.open_levanter_cache`.

        Args:
            offsets: the ``(D + 1,)`` integer offsets, read by range only.
            leaves: leaf name -> a flat 1-D array; ``input_ids`` is required.
            index: the offsets' `DocumentIndex`. ``None``: built by one pass over the offsets,
                which checks every one (a progress bar shows when it takes over a second). A
                local file path: the index saved there, if it matches the offsets (their size,
                last entry and 64 evenly spaced marks), else built and saved there. A
                `DocumentIndex`: used after the same check.

        Examples:
            >>> flat = np.array([7, 7, 8, 9], np.uint16)
            >>> store = DocumentStore.from_arrays(np.array([0, 2, 4]), {"input_ids": flat})
            >>> store.read_ranges([1], [3])["input_ids"].tolist()
            [7, 8]
        """
        if not isinstance(leaves, Mapping):
            raise TypeError(
                f"leaves must be a dict of leaf name -> flat array, got {type(leaves).__name__}; "
                'e.g. {"input_ids": tokens}'
            )
        flat = {str(name): _opened(value, f"leaf {name!r}") for name, value in leaves.items()}
        return cls(_opened(offsets, "offsets"), flat, name="arrays", index=index)

    @classmethod
    def open(cls, path: Any, **options: Any) -> DocumentStore:
        """The store `write_documents` wrote at ``path`` (a directory, URL or kvstore spec).

        Keyword options go to `open_documents`.

        Raises:
            FileNotFoundError: there is no store at ``path``.
            ValueError: ``path`` holds a Levanter token cache (open it with
                `psdp.sources.open_levanter_cache`), or a damaged store.
        """
        try:
            return open_documents(path, **options)
        except FileNotFoundError:
            # loads tensorstore: imported on first use, as the format below
            from psdp.sources.stores.levanter_cache import LEDGER_FILE, is_levanter_cache

            if not is_levanter_cache(path):
                raise
            where = path if isinstance(path, str | os.PathLike) else "that kvstore spec"
            raise ValueError(
                f"{os.fspath(where)!r} is a Levanter token cache ({LEDGER_FILE}), not a psdp "
                "document store (no psdp.json); read it in place, with no conversion: "
                "psdp.sources.open_levanter_cache(path), or in a DataConfig source set "
                "format: levanter"
            ) from None

    def with_dtypes(self, dtypes: Mapping[str, Any]) -> DocumentStore:
        """This store with some leaves read as other dtypes (leaf -> dtype), every read checked:
        a value the dtype does not hold is a `ValueError` naming it, never wrapped. E.g. a
        Levanter cache's int64 ids as int32, which JAX holds without 64-bit mode, or two stores'
        ids as one dtype to mix them.

        Examples:
            >>> store = DocumentStore.from_documents([np.array([5, 6, 7], np.int64)])
            >>> narrow = store.with_dtypes({"input_ids": np.int32})
            >>> narrow.leaves, narrow.read_ranges([1], [3])["input_ids"]
            ({'input_ids': dtype('int32')}, array([6, 7], dtype=int32))
        """
        unknown = sorted(set(dtypes) - set(self.leaves))
        if unknown:
            raise ValueError(
                f"dtypes names leaves {unknown} that the document store {self.name} does not "
                f"have; its leaves are {list(self.leaves)}"
            )
        wanted = {leaf: np.dtype(dtype) for leaf, dtype in dtypes.items()}
        for leaf, dtype in wanted.items():
            _check_dtype(leaf, dtype, f"dtypes[{leaf!r}]")
            if dtype.kind not in "biuf":
                raise TypeError(f"dtypes[{leaf!r}] is {dtype}; store numbers or bools")
        out = copy.copy(self)
        stored = {leaf: self._flat_dtype(leaf) for leaf in self.leaves}
        out._casts = {
            **{k: v for k, v in self._casts.items() if k not in wanted},
            **{k: v for k, v in wanted.items() if v != stored[k]},
        }
        out.leaves = {**self.leaves, **wanted}
        return out

    def _flat_dtype(self, leaf: str) -> np.dtype:
        return _shape_and_dtype(self._flat[leaf])[1]

    def documents_touching(self, starts: Any, stops: Any, *, eos: bool = False) -> TouchedDocuments:
        """The documents that the stream ranges ``[starts[i], stops[i])`` touch, with their
        token and stream boundaries (`TouchedDocuments`). The stream is the documents back to
        back, each non-empty one followed by an EOS if ``eos``. Reads only the offsets of the
        ranges' blocks of documents (`DocumentIndex`).

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(3), np.arange(4), np.arange(2)])
            >>> got = store.documents_touching([2, 8], [5, 9], eos=True)  # a A B C D E ...
            >>> got.count.tolist(), got.doc.tolist(), got.stream_start.tolist()
            ([2, 1], [0, 1, 1], [0, 4, 4])
        """
        lo, hi = _checked_ranges(starts, stops, self.index.stream_tokens(eos), "stream ranges")
        return documents_touching(
            self.index, self._offsets, self._read_offsets, lo, hi, eos=eos, where=self.name
        )

    def read_ranges(
        self, starts: Any, stops: Any, leaves: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Per leaf, ``flat[starts[i]:stops[i]]`` for every ``i``, concatenated in order.

        One batched read per leaf: every range read is started, then all are awaited.

        Args:
            starts: 1-D integer array, ``0 <= start <= stop <= num_tokens``.
            stops: 1-D integer array of the same length as ``starts``.
            leaves: the leaves to read; default all.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(10, 16)])
            >>> store.read_ranges([3, 0], [5, 1], ["input_ids"])["input_ids"].tolist()
            [13, 14, 10]
        """
        starts, stops = _checked_ranges(starts, stops, self.num_tokens, "token ranges")
        names = list(self.leaves) if leaves is None else list(leaves)
        unknown = [name for name in names if name not in self.leaves]
        if unknown:
            raise KeyError(
                f"leaves {unknown} are not in the document store {self.name} (it has "
                f"{list(self.leaves)})"
            )
        read = {
            name: self._read(self._flat[name], f"leaf {name!r}", starts, stops) for name in names
        }
        for name in set(names) & set(self._casts):
            read[name] = self._cast(name, read[name], starts, stops)
        return read

    def _cast(self, leaf: str, values: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> Any:
        """``values`` (of the ranges) as the leaf's `with_dtypes` dtype, or a `ValueError`."""
        out, bad = cast_checked(values, self._casts[leaf])
        if bad is None:
            return out
        at = int(np.flatnonzero(bad)[0])
        ends = np.cumsum(stops - starts)
        i = int(np.searchsorted(ends, at, side="right"))
        token = int(starts[i] + at - (ends[i - 1] if i else 0))
        raise ValueError(
            f"leaf {leaf!r} of {self.name} holds {values[at].item()!r} at token {token}, which "
            f"its dtype {self._casts[leaf]} (as read, from {values.dtype}) does not hold; read "
            f"it as a wider dtype (with_dtypes, or open_levanter_cache(path, ids_dtype=None) "
            "with 64-bit JAX), or fix the store"
        )

    def _read_offsets(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        return self._read(self._offsets, "offsets", starts, stops).astype(np.int64, copy=False)

    def _read(self, array: Any, what: str, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        try:
            return _read_flat(array, starts, stops)
        except ValueError as error:  # TensorStore: a missing, truncated or corrupt chunk
            raise _read_error(error, f"{what} of {self.name}", starts, stops) from error

    def _index_of(self, index: Any, documents: int, tokens: int, spot_check: bool) -> DocumentIndex:
        """``index`` checked against the offsets, or built (and saved at a path given)."""
        if index is None:
            return build_index(self._read_offsets, documents, name=self.name)
        if isinstance(index, str | os.PathLike):
            if self._offsets_file is None:
                raise ValueError(
                    f"index={os.fspath(index)!r} caches the index of offsets in a memory-mapped "
                    f"file (np.load(path, mmap_mode='r')), but the offsets of {self.name} are not "
                    "a file's, so nothing tells a changed copy apart; pass index=None (one pass "
                    "builds it), or index=DocumentIndex.load(path) for an index you know is theirs"
                )
            saved = _saved_index(index, self._offsets_file)
            if saved is not None and _matches(saved, documents, tokens, self._read_offsets):
                return saved
            built = build_index(self._read_offsets, documents, name=self.name)
            built.save(index, identity=self._offsets_file)
            return built
        if not isinstance(index, DocumentIndex):
            raise TypeError(
                f"index must be a DocumentIndex, a local file path or None, got "
                f"{type(index).__name__}"
            )
        fix = "pass the index of these offsets, or index=None to build it"
        index.check_matches(documents, tokens, self.name, fix)
        if spot_check:
            index.spot_check(self._read_offsets, self.name, fix)
        return index

    def describe(self) -> str:
        leaves = ", ".join(f"{k}: {v}" for k, v in self.leaves.items())
        return (
            f"DocumentStore({self.name}, {self.num_documents} documents, {self.num_tokens} "
            f"tokens, {leaves})"
        )

    def __repr__(self) -> str:
        return self.describe()


def open_documents(path: Any, *, context: ts.Context | None = None) -> DocumentStore:
    """The `DocumentStore` `write_documents` (or `psdp prepare`, a parted store) wrote at
    ``path`` (a directory, URL or kvstore spec), read with the TensorStore ``context`` (default:
    a new one); its metadata, offsets and leaf shapes are checked on open (``format.py``)."""
    # the format loads tensorstore, slow to import: on first use, not with this module
    from psdp.sources.documents.format import read_documents

    return _from_stored(read_documents(path, context=context))


def join_documents(
    paths: Sequence[Any], *, name: str, index: DocumentIndex | None = None
) -> DocumentStore:
    """The stores `write_documents` wrote at ``paths``, back to back as one store (its leaves
    and dtypes those of the first). ``index``: the whole corpus's, committed with the list of
    parts; ``None``: built by one pass over every offset."""
    from psdp.sources.documents.format import join_stored

    return _from_stored(join_stored(paths, name=name, index=index))


def _from_stored(stored: StoredDocuments) -> DocumentStore:
    """The store of a written store's arrays (a `StoredDocuments`)."""
    return DocumentStore(
        stored.offsets, stored.leaves, name=stored.name, index=stored.index,
        spot_check=stored.spot_check, written=stored.written,
    )  # fmt: skip


def document_leaves(doc: Any, index: int, names: list[str] | None) -> dict[str, np.ndarray]:
    """Document ``index`` as checked 1-D leaves of one length (> 0); ``names``: the leaves of
    the documents before it, which it must match."""
    where = f"document {index}"
    if isinstance(doc, Mapping):
        leaves = {str(k): _leaf_values(v, f"{where}, leaf {k!r}") for k, v in doc.items()}
        if TOKENS not in leaves:
            raise ValueError(
                f"{where} has leaves {list(leaves)} but no {TOKENS!r}; name the token ids "
                f"{TOKENS!r}"
            )
    else:
        leaves = {TOKENS: _leaf_values(doc, where)}
    if names is not None and list(leaves) != names:
        raise ValueError(
            f"{where} has leaves {list(leaves)}, but the documents before it had {names}; give "
            "every document the same leaves"
        )
    lengths = {name: len(value) for name, value in leaves.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{where}: every leaf needs one value per token, got lengths {lengths}; align the "
            "per-token leaves with input_ids"
        )
    if lengths[TOKENS] == 0:
        raise ValueError(
            f"{where} is empty; a document store holds documents of at least one token (drop "
            "empty documents first, e.g. `(d for d in docs if len(d))`)"
        )
    _check_dtype(TOKENS, leaves[TOKENS].dtype, where)
    return leaves


def _leaf_values(value: Any, where: str) -> np.ndarray:
    if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
        raise TypeError(f"{where} must be a 1-D array of values, got {type(value).__name__}")
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"{where} must be 1-D (one value per token), got shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{where} has dtype {array.dtype}; store numbers or bools")
    return array


def _check_dtype(name: str, dtype: np.dtype, where: str) -> None:
    if name == TOKENS and dtype.kind not in "iu":
        raise TypeError(
            f"{where}: token ids ({TOKENS}) must be integers, got dtype {dtype}; tokenize first "
            "and pass the ids as an integer array"
        )


def _check_offsets_type(shape: tuple[int, ...], dtype: np.dtype, name: str) -> None:
    if len(shape) != 1 or dtype.kind not in "iu":
        raise TypeError(
            f"the offsets of {name} must be a 1-d integer array, got {dtype}{list(shape)}"
        )


def _check_ends(first: int, entries: int, name: str) -> None:
    """What can be refused before the pass over the offsets: entry 0 must be 0, and an array
    allocated far longer than its documents (Levanter's ``2**54`` entries) would take days."""
    if first != 0:
        raise ValueError(
            f"the offsets of {name} must start at 0, got {first}. Levanter's JaggedArrayStore "
            "keeps its document count there: open a Levanter cache with "
            "psdp.sources.open_levanter_cache(path), or pass its used part, ends = "
            f"offsets[:{first} + 1] with ends[0] = 0, and each leaf sliced to leaf[:ends[-1]]; "
            f"otherwise {_DAMAGED}"
        )
    if entries > MAX_DOCUMENTS + 1:
        raise ValueError(
            f"the offsets of {name} have {entries} entries, more than psdp reads (2**48 "
            "documents): the array is allocated longer than its documents (Levanter's are "
            "2**54 long); pass the used part, offsets[:D + 1] for D documents"
        )


def _checked_ranges(
    starts: Any, stops: Any, limit: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    starts, stops = np.asarray(starts), np.asarray(stops)
    for name, value in (("starts", starts), ("stops", stops)):
        if value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
            raise TypeError(
                f"{name} must be a 1-d integer array, got {value.dtype}{list(value.shape)}"
            )
    if starts.shape != stops.shape:
        raise ValueError(
            f"starts and stops need the same length, got {starts.size} and {stops.size}"
        )
    starts, stops = starts.astype(np.int64), stops.astype(np.int64)
    bad = (starts < 0) | (stops < starts) | (stops > limit)
    if bad.any():
        i = int(np.argmax(bad))
        bound = "num_tokens" if what == "token ranges" else "the stream's length"
        raise ValueError(
            f"{what} must satisfy 0 <= start <= stop <= {bound}={limit}, got range {i}: "
            f"[{int(starts[i])}, {int(stops[i])})"
        )
    return starts, stops


def _saved_index(path: str | os.PathLike[str], offsets_file: str) -> DocumentIndex | None:
    """The index saved at ``path`` for the offsets file ``offsets_file`` (`_file_identity`);
    ``None`` (built again and saved over it) if there is none or the file changed since (its
    path, size, modification time or inode). A file that is not an index is refused, never
    overwritten."""
    try:
        index, identity = DocumentIndex.load(path), DocumentIndex.saved_identity(path)
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"index={os.fspath(path)!r} is not a document index psdp saved ({error}); psdp "
            "would overwrite it: give the path of a new file, or delete this one"
        ) from error
    return index if identity == offsets_file else None


def _file_identity(array: Any) -> str | None:
    """The file a memory-mapped array maps, as ``path:size:mtime_ns:inode`` (what makes a cached
    index trustworthy), or ``None`` for an array that is not a file's."""
    filename = array.filename if isinstance(array, np.memmap) else None
    if filename is None:
        return None
    info = os.stat(filename)
    where = f"{os.path.realpath(filename)}@{array.offset}"
    return f"{where}:{len(array)}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}"


def _matches(index: DocumentIndex, documents: int, tokens: int, read: Any) -> bool:
    """Whether a saved index is the offsets': same size and last entry, and its spot checks."""
    try:
        index.check_matches(documents, tokens, "", "")
        index.spot_check(read, "", "")
    except ValueError:
        return False
    return True


@runtime_checkable
class FlatArray(Protocol):
    """What `DocumentStore.from_arrays` reads besides numpy and TensorStore arrays: an object
    with a 1-d ``shape``, a numpy ``dtype``, and ``array[start:stop]`` returning the
    ``stop - start`` values as a numpy array (or anything ``np.asarray`` takes). Only slices
    with ``0 <= start <= stop <= shape[0]`` and no step are asked for; a slice's result is
    copied before it is handed on, so it may be a view of memory the array reuses. Offsets
    that also have ``take(d)`` (``array[d]`` for an int64 index array, cheap as memory is) are
    searched in place, as numpy's are: a batch reads ~log2(4096) entries a row, not a block of
    4,096 per row (``docs/guides/tokens.md``).

    Examples:
        >>> class Squares:  # offsets of documents of 1, 3, 5, ... tokens, never stored
        ...     shape, dtype = (5,), np.dtype(np.int64)
        ...     def __getitem__(self, where):
        ...         return np.arange(where.start, where.stop) ** 2
        >>> isinstance(Squares(), FlatArray)
        True
        >>> store = DocumentStore.from_arrays(Squares(), {"input_ids": np.arange(16)})
        >>> store.offsets_range(2, 5).tolist(), store.read_ranges([4], [7])["input_ids"].tolist()
        ([4, 9, 16], [4, 5, 6])
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...

    def __getitem__(self, where: slice, /) -> Any: ...


def _is_tensorstore(array: Any) -> bool:
    return hasattr(array, "domain")


def _plain(array: Any) -> Any:
    """A memory-mapped array as a plain ndarray over the same memory: slicing an `np.memmap`
    makes a memmap object per slice, a plain view does not (12-22% faster reads of many
    slices)."""
    return np.asarray(array) if isinstance(array, np.memmap) else array


def _shape_and_dtype(array: Any) -> tuple[tuple[int, ...], np.dtype]:
    """An array's shape and numpy dtype, from its metadata (reads nothing)."""
    dtype = array.dtype.numpy_dtype if _is_tensorstore(array) else array.dtype
    return tuple(int(n) for n in array.shape), np.dtype(dtype)


def _checked_leaves(flat: Mapping[str, Any], num_tokens: int, name: str) -> dict[str, np.dtype]:
    if TOKENS not in flat:
        raise ValueError(
            f"the document store {name} needs a {TOKENS!r} leaf, got leaves {list(flat)}"
        )
    dtypes = {}
    for leaf, array in flat.items():
        shape, dtype = _shape_and_dtype(array)
        if len(shape) != 1:
            raise ValueError(f"leaf {leaf!r} of {name} must be 1-D (flat), got shape {shape}")
        if shape[0] != num_tokens:
            longer = (
                f"; if the array is allocated longer than its tokens, pass leaf[:{num_tokens}]"
                if shape[0] > num_tokens
                else ""
            )
            raise ValueError(
                f"leaf {leaf!r} of {name} has {shape[0]} values, but the offsets end at "
                f"{num_tokens} tokens; every leaf holds one value per token (check that the "
                f"offsets belong to these arrays){longer}"
            )
        if dtype.kind not in "biuf":
            raise TypeError(f"leaf {leaf!r} of {name} has dtype {dtype}; store numbers or bools")
        _check_dtype(leaf, dtype, f"leaf {leaf!r} of {name}")
        dtypes[leaf] = dtype
    return dtypes


def _opened(value: Any, what: str) -> Any:
    """A numpy array, open TensorStore array or `FlatArray` as it is; a spec dict opened with
    TensorStore."""
    if isinstance(value, np.ndarray) or _is_tensorstore(value):
        return value
    if isinstance(value, Mapping):
        import tensorstore as ts  # slow to import: only for stores that need it

        try:
            return ts.open(dict(value), read=True, open=True).result()
        except ValueError as error:
            raise ValueError(f"cannot open {what} ({dict(value)!r}): {error}") from error
    if isinstance(value, FlatArray):
        return value
    raise TypeError(
        f"{what} must be a numpy array, an open TensorStore array, a TensorStore spec dict or "
        f"an object with shape, dtype and [start:stop] (psdp.sources.FlatArray), got "
        f"{type(value).__name__}"
    )


def _read_error(error: ValueError, where: str, starts: np.ndarray, stops: np.ndarray) -> Exception:
    """A TensorStore read error as the loader treats those of `TensorStoreSource`: a transient
    one (unreachable, throttled) as `TransientReadError`, retried; any other as a `ValueError`
    naming the store and the ranges."""
    shown = ", ".join(f"[{a}, {b})" for a, b in zip(starts[:3], stops[:3], strict=True))
    what = f"reading {len(starts)} token ranges ({shown}{', ...' if len(starts) > 3 else ''}) of {where}"
    if is_transient_status(str(error)):
        return TransientReadError(
            f"{what} failed: {error}. The store did not answer in time or asked to slow down; "
            "the loader retries such reads (read_attempts)"
        )
    return ValueError(
        f"{what} failed: {error}. The document store is damaged or incomplete (e.g. a missing, "
        "truncated or corrupted shard file); rewrite it with write_documents(..., overwrite=True)"
    )


def _read_flat(array: Any, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """``array[starts[i]:stops[i]]`` for every ``i``, concatenated, in memory the caller owns."""
    if isinstance(array, np.ndarray):
        if len(starts) == 1:
            return np.array(array[starts[0] : stops[0]])
        size = int(stops[0] - starts[0]) if len(starts) else 0
        if size and (stops - starts == size).all():  # one gather: row i of a strided view
            every = as_strided(array, (len(array) - size + 1, size), array.strides * 2)
            return every[starts].reshape(-1)
        spans = zip(starts.tolist(), stops.tolist(), strict=True)
        return np.concatenate([array[:0], *(array[a:b] for a, b in spans)])
    if callable(getattr(array, "read_ranges", None)):  # e.g. a local store's memory maps
        return np.asarray(array.read_ranges(starts, stops))
    if _is_tensorstore(array):  # every read started in one batch, then all awaited
        import tensorstore as ts  # loaded already: the array is TensorStore's

        # one batch: the reads of a shard share one index lookup, and neighbouring chunks of
        # different ranges come in one request (a step: one request per run of chunks)
        with ts.Batch() as batch:
            spans = zip(starts.tolist(), stops.tolist(), strict=True)
            futures = [array[a:b].read(batch=batch) for a, b in spans]
        parts = [np.asarray(f.result()) for f in futures]
        return np.concatenate(parts) if parts else np.zeros(0, array.dtype.numpy_dtype)
    parts = []
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        part = np.asarray(array[a:b])
        if part.shape != (b - a,):
            raise TypeError(
                f"{type(array).__name__}[{a}:{b}] returned shape {part.shape}, not ({b - a},): "
                "a FlatArray's slice must hold stop - start values"
            )
        parts.append(part)
    return np.concatenate([np.zeros(0, array.dtype), *parts])
