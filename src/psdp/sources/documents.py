"""`DocumentStore`: variable-length documents stored flat, as Levanter's ``JaggedArrayStore`` and
nanoGPT's token files do: one 1-D array per leaf (``input_ids``, and any per-token leaf such as a
``loss_mask``, all aligned token by token) plus ``offsets``, so that document ``d`` is
``flat[offsets[d]:offsets[d + 1]]``. Views such as `TokenSequences` choose the sequence length at
read time and read contiguous token ranges (`DocumentStore.read_ranges`). ``docs/tokens.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp.sources.errors import TransientReadError, is_transient_status

#: The leaf every document store has: the token ids (integers). A document given as one array
#: is this leaf.
TOKENS = "input_ids"
#: The leaf a view of a store (`TokenSequences`, `PackedSequences`) numbers each token's document
#: or segment with (0: padding).
SEGMENT_IDS = "segment_ids"
#: The leaf a view gives each token's position in its document or segment (0 at its first token).
POSITIONS = "positions"


def check_view_of(store: Any, view: str, **ids: int | None) -> None:
    """Raises unless ``store`` is a `DocumentStore` that ``view`` may read: no leaf that the view
    computes itself (it would silently replace the store's own), and every token id in ``ids``
    (e.g. ``pad_id=0``; ``None``: unset) an int that the store's token dtype holds.

    Example:
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


class DocumentStore:
    """Documents stored flat: one 1-D array per leaf, all aligned token by token, plus ``offsets``.

    ``offsets`` is int64 of shape ``(D + 1,)``, ``offsets[0] == 0``, non-decreasing, and
    ``offsets[-1] == num_tokens``: document ``d`` is ``flat[offsets[d]:offsets[d + 1]]``. The
    offsets are held in memory; the leaves may be numpy arrays (memory, or ``np.load(...,
    mmap_mode="r")``) or TensorStore arrays (`open`, `from_arrays`), read by range only.

    Build one with `from_documents` (in memory), `open` (written by `write_documents`) or
    `from_arrays` (flat arrays and offsets written by another tool).

    Example:
        >>> store = DocumentStore.from_documents([np.array([5, 6, 7]), np.array([8, 9])])
        >>> store.offsets.tolist(), store.num_documents, store.num_tokens
        ([0, 3, 5], 2, 5)
        >>> store.read_ranges([4, 0], [5, 2])["input_ids"].tolist()
        [9, 5, 6]
    """

    def __init__(self, offsets: np.ndarray, flat: Mapping[str, Any], *, name: str = "in memory"):
        """Use `from_documents`, `open` or `from_arrays`; this trusts nothing it is given either.

        Args:
            offsets: the document offsets (checked).
            flat: leaf name -> a 1-D numpy array or an open 1-D TensorStore array.
            name: where the store is, for messages.
        """
        self.name = name
        self.offsets = _checked_offsets(offsets, name)
        self._flat = dict(flat)
        self.leaves: dict[str, np.dtype] = _checked_leaves(self._flat, self.num_tokens, name)

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def offsets_range(self, start: int, stop: int) -> np.ndarray:
        """``offsets[start:stop]`` as an int64 array the caller owns (one range read)."""
        return np.array(self.offsets[start:stop], np.int64)

    @property
    def reads_storage(self) -> bool:
        """Whether reading tokens waits on storage: some leaf is a TensorStore array (the
        offsets are always in memory). A loader then reads with several threads by default.

        Example:
            >>> DocumentStore.from_documents([np.array([1, 2])]).reads_storage
            False
        """
        return any(not isinstance(array, np.ndarray) for array in self._flat.values())

    @classmethod
    def from_documents(cls, docs: Iterable[Any]) -> DocumentStore:
        """A store in memory from an iterable of documents.

        Args:
            docs: each document a 1-D integer array of token ids (the leaf ``input_ids``), or a
                dict of aligned 1-D arrays (one value per token, e.g. ``input_ids`` and a
                ``loss_mask``), every document with the same leaves. Empty documents are refused:
                they hold no token to train on and would only shift document numbers (drop
                them first); a store opened with `from_arrays` may have them.

        Example:
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
    def from_arrays(cls, offsets: Any, leaves: Mapping[str, Any]) -> DocumentStore:
        """A store from flat arrays written by any tool: numpy arrays (``np.load(path,
        mmap_mode="r")`` for nanoGPT/MaxText ``.npy`` files), open TensorStore arrays, or
        TensorStore spec dicts (a zarr array of another tool). Levanter's ``JaggedArrayStore``
        differs: its ``offsets[0]`` holds the document count and its arrays are allocated
        ``2**54`` long, so pass its offsets ``[:count + 1]`` with entry 0 set to 0, and its data
        sliced to ``[:offsets[-1]]`` (``docs/tokens.md``).

        Args:
            offsets: the ``(D + 1,)`` integer offsets (read into memory once).
            leaves: leaf name -> a flat 1-D array; ``input_ids`` is required.

        Example:
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
        return cls(_used_offsets(_opened(offsets, "offsets"), "arrays"), flat, name="arrays")

    @classmethod
    def open(cls, path: Any, **options: Any) -> DocumentStore:
        """The store `write_documents` wrote at ``path`` (a directory, URL or kvstore spec).

        Keyword options go to `open_documents` (``psdp.sources.document_writer``).
        """
        from psdp.sources.document_writer import open_documents

        return open_documents(path, **options)

    def read_ranges(
        self, starts: Any, stops: Any, leaves: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Per leaf, ``flat[starts[i]:stops[i]]`` for every ``i``, concatenated in order.

        One batched read per leaf: every range read is started, then all are awaited.

        Args:
            starts, stops: 1-D integer arrays of equal length, ``0 <= start <= stop <=
                num_tokens``.
            leaves: the leaves to read; default all.

        Example:
            >>> store = DocumentStore.from_documents([np.arange(10, 16)])
            >>> store.read_ranges([3, 0], [5, 1], ["input_ids"])["input_ids"].tolist()
            [13, 14, 10]
        """
        starts, stops = self._checked_ranges(starts, stops)
        names = list(self.leaves) if leaves is None else list(leaves)
        unknown = [name for name in names if name not in self.leaves]
        if unknown:
            raise KeyError(
                f"leaves {unknown} are not in the document store {self.name} (it has "
                f"{list(self.leaves)})"
            )
        out = {}
        for name in names:
            try:
                out[name] = _read_flat(self._flat[name], starts, stops)
            except ValueError as error:  # TensorStore: a missing, truncated or corrupt chunk
                raise _read_error(error, f"leaf {name!r} of {self.name}", starts, stops) from error
        return out

    def _checked_ranges(self, starts: Any, stops: Any) -> tuple[np.ndarray, np.ndarray]:
        starts, stops = np.asarray(starts), np.asarray(stops)
        for what, value in (("starts", starts), ("stops", stops)):
            if value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
                raise TypeError(
                    f"{what} must be a 1-d integer array, got {value.dtype}{list(value.shape)}"
                )
        if starts.shape != stops.shape:
            raise ValueError(
                f"starts and stops need the same length, got {starts.size} and {stops.size}"
            )
        starts, stops = starts.astype(np.int64), stops.astype(np.int64)
        bad = (starts < 0) | (stops < starts) | (stops > self.num_tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"token ranges must satisfy 0 <= start <= stop <= num_tokens={self.num_tokens}, "
                f"got range {i}: [{int(starts[i])}, {int(stops[i])})"
            )
        return starts, stops

    def describe(self) -> str:
        leaves = ", ".join(f"{k}: {v}" for k, v in self.leaves.items())
        return (
            f"DocumentStore({self.name}, {self.num_documents} documents, {self.num_tokens} "
            f"tokens, {leaves})"
        )

    def __repr__(self) -> str:
        return self.describe()


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


def _checked_offsets(offsets: Any, name: str) -> np.ndarray:
    offsets = np.asarray(offsets)
    _check_offsets_type(offsets.shape, offsets.dtype, name)
    offsets = offsets.astype(np.int64)
    fix = "the document store is damaged or was written with another layout; rewrite it"
    if len(offsets) < 2:
        raise ValueError(
            f"the offsets of {name} must have D + 1 >= 2 entries (at least one document), got "
            f"{len(offsets)}; {fix}"
        )
    if offsets[0] != 0:
        raise ValueError(f"the offsets of {name} must start at 0, got {int(offsets[0])}; {fix}")
    steps = np.diff(offsets)
    if (steps < 0).any():
        d = int(np.argmax(steps < 0))
        raise ValueError(
            f"the offsets of {name} must be non-decreasing, got offsets[{d}]={int(offsets[d])} > "
            f"offsets[{d + 1}]={int(offsets[d + 1])}; {fix}"
        )
    return offsets


def _used_offsets(offsets: Any, name: str) -> np.ndarray:
    """``offsets`` (a numpy or TensorStore array) in memory, read only once its metadata and
    entry 0 (read alone) show psdp's layout (entry 0 is 0) and an array that fits in memory:
    reading one allocated far longer than its documents (Levanter's, ``2**54`` entries) would
    abort Python (``std::bad_alloc``) instead of raising."""
    shape, dtype = _shape_and_dtype(offsets)
    _check_offsets_type(shape, dtype, name)
    first = 0
    if shape[0]:  # none: `_checked_offsets` says how many it needs
        first = int(offsets[0] if isinstance(offsets, np.ndarray) else offsets[0].read().result())
    if first != 0:
        raise ValueError(
            f"the offsets of {name} must start at 0, got {first}. Levanter's JaggedArrayStore "
            f"keeps its document count there: pass its used part, ends = offsets[:{first} + 1] "
            "with ends[0] = 0, and each leaf sliced to leaf[:ends[-1]] (docs/tokens.md); "
            "otherwise the document store is damaged or was written with another layout; "
            "rewrite it"
        )
    memory = _memory_bytes()
    if memory is not None and shape[0] * dtype.itemsize > memory:
        raise ValueError(
            f"the offsets of {name} have {shape[0]} entries ({shape[0] * dtype.itemsize} bytes), "
            f"more than this machine's memory ({memory} bytes), and they are read into memory "
            "whole: the array is allocated longer than its documents; pass the used part, "
            "offsets[:D + 1] for D documents"
        )
    return offsets if isinstance(offsets, np.ndarray) else np.asarray(offsets.read().result())


def _memory_bytes() -> int | None:
    """This machine's physical memory, where the OS says (``None`` elsewhere)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def _shape_and_dtype(array: Any) -> tuple[tuple[int, ...], np.dtype]:
    """A numpy or TensorStore array's shape and numpy dtype, from its metadata (reads nothing)."""
    dtype = np.dtype(array.dtype if isinstance(array, np.ndarray) else array.dtype.numpy_dtype)
    return tuple(int(n) for n in array.shape), dtype


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
    """A numpy array or open TensorStore array as it is; a spec dict opened with TensorStore."""
    if isinstance(value, np.ndarray) or hasattr(value, "domain"):
        return value
    if isinstance(value, Mapping):
        import tensorstore as ts  # slow to import: only for stores that need it

        try:
            return ts.open(dict(value), read=True, open=True).result()
        except ValueError as error:
            raise ValueError(f"cannot open {what} ({dict(value)!r}): {error}") from error
    raise TypeError(
        f"{what} must be a numpy array, an open TensorStore array or a TensorStore spec dict, "
        f"got {type(value).__name__}"
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
    if isinstance(array, np.ndarray):
        # a plain view: each slice of an np.memmap is an np.memmap object, 2-3x slower to make;
        # Python ints slice faster than numpy scalars
        plain = np.asarray(array)
        if len(starts) == 0:
            return plain[:0].copy()
        bounds = zip(starts.tolist(), stops.tolist(), strict=True)
        return np.concatenate([plain[a:b] for a, b in bounds])
    futures = [array[int(a) : int(b)].read() for a, b in zip(starts, stops, strict=True)]
    parts = [np.asarray(f.result()) for f in futures]
    if not parts:
        return np.zeros(0, np.dtype(array.dtype.numpy_dtype))
    return np.concatenate(parts)
