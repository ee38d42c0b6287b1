"""Levanter's token caches read in place as a `DocumentStore` (``docs/guides/tokens.md``); the cache's
layout on disk, and its checks: ``stores/levanter_cache.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from psdp._plan.leaves import TOKENS
from psdp.sources.documents.beside import (
    DOCUMENT_INDEX,
    IN_MEMORY_DOCUMENTS,
    IndexFolder,
    index_command,
    saved_document_index,
)
from psdp.sources.documents.index import DocumentIndex
from psdp.sources.documents.store import DocumentStore
from psdp.sources.stores.levanter_cache import open_cache_arrays
from psdp.sources.stores.location import INDEX_DIRECTORY


def open_levanter_cache(
    path: str | os.PathLike[str] | Mapping[str, Any],
    leaves: tuple[str, ...] = (TOKENS,),
    *,
    ids_dtype: Any = np.int32,
    index: DocumentIndex | str | None = None,
) -> DocumentStore:
    """A finished Levanter token cache as a `DocumentStore` of its counted documents.

    Levanter may store the ids as int64, which JAX holds only in 64-bit mode: such ids are read
    as ``ids_dtype``, every read checked (an id it does not hold is an error, never wrapped).

    Args:
        path: the cache directory of one split (the folder holding ``shard_ledger.json``): a
            local path, a URL (``gs://``, ``s3://``) or a TensorStore kvstore spec.
        leaves: the leaves to read, ``input_ids`` first; any other must be per token (one value
            per token, as a chat cache's ``assistant_masks``).
        ids_dtype: the dtype 64-bit ``input_ids`` are read as (int32: every vocabulary below
            2**31 ids); ``None``: as stored.
        index: the offsets' `DocumentIndex`, checked against them (their size, last entry and
            64 evenly spaced marks); ``None``: built by one pass over the offsets (every
            document's, ~8 GB at 10^9); ``"beside"``: the one ``psdp index`` saved beside the
            cache, or, if there is none, built by a pass for a cache of at most
            `IN_MEMORY_DOCUMENTS` documents and a `FileNotFoundError` naming the command above
            that (``docs/guides/tokens.md``).

    Raises:
        FileNotFoundError: no Levanter cache there (no ``shard_ledger.json``); or
            ``index="beside"`` and a large cache has no index beside it.
        ValueError: the cache is unfinished, holds a psdp store, lacks a leaf, or its arrays do
            not agree with the ledger.

    Examples:
        >>> import json, pathlib, tempfile, tensorstore as ts
        >>> root = tempfile.mkdtemp()  # 2 documents, [5, 6, 7] and [8, 9], as Levanter writes
        >>> for part, values in {"offsets": [2, 3, 5], "data": [5, 6, 7, 8, 9]}.items():
        ...     spec = {"driver": "zarr3", "kvstore": f"file://{root}/input_ids/{part}/"}
        ...     array = ts.open(spec, dtype="int64", shape=[2**54], create=True).result()
        ...     array[: len(values)].write(values).result()
        >>> ledger = {"total_num_rows": 2, "is_finished": True}
        >>> _ = pathlib.Path(root, "shard_ledger.json").write_text(json.dumps(ledger))
        >>> store = open_levanter_cache(root)
        >>> store.offsets_range(0, 3).tolist(), store.read_ranges([2], [4])["input_ids"].tolist()
        ([0, 3, 5], [7, 8])
        >>> store.leaves, open_levanter_cache(root, ids_dtype=None).leaves
        ({'input_ids': dtype('int32')}, {'input_ids': dtype('int64')})
    """
    offsets, flat, name, written = open_cache_arrays(path, _checked_leaves(leaves))
    beside = isinstance(index, str)
    if isinstance(index, str):
        index = _index_beside(path, index, offsets, name)
    store = DocumentStore(offsets, flat, name=name, index=index, spot_check=not beside,
                          written=written)  # fmt: skip
    stored = store.leaves[TOKENS]
    if ids_dtype is not None and stored.kind in "iu" and stored.itemsize == 8:
        return store.with_dtypes({TOKENS: ids_dtype})
    return store


def _index_beside(path: Any, given: str, offsets: Any, name: str) -> DocumentIndex | None:
    """The document index ``psdp index`` saved beside the cache, checked against its offsets
    (size, last entry, 64 spaced marks: one batched read); ``None`` (a pass builds it) for a
    small cache without one; a large one without one is refused."""
    if given != "beside":
        raise ValueError(
            f"index={given!r} must be a DocumentIndex, None (built by a pass) or 'beside' (the "
            "one psdp index saved beside the cache)"
        )
    folder, documents = IndexFolder(path), int(offsets.shape[0]) - 1
    index = saved_document_index(folder)
    if index is None and documents > IN_MEMORY_DOCUMENTS:
        raise FileNotFoundError(
            f"the {name} holds {documents:,} documents and no document index beside it "
            f"({INDEX_DIRECTORY}/{DOCUMENT_INDEX}): every host would read all its offsets at "
            f"start-up (more than {IN_MEMORY_DOCUMENTS:,} documents); build the index once with "
            f"`{index_command(path, 'levanter')}`"
        )
    if index is not None:
        fix = (
            f"it was built for another cache, or for this one before it changed: build it "
            f"again with `{index_command(path, 'levanter')}`"
        )
        where = f"{name} ({folder.where(DOCUMENT_INDEX)})"
        index.check_matches(documents, int(offsets[documents].read().result()), where, fix)
        index.spot_check(lambda a, b: _ranges(offsets, a, b), where, fix)
    return index


def _ranges(array: Any, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """``array[starts[i]:stops[i]]`` concatenated: every read started, then all awaited."""
    reads = [array[a:b].read() for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    return np.concatenate([np.asarray(r.result(), np.int64) for r in reads])


def _checked_leaves(leaves: Any) -> tuple[str, ...]:
    if (
        isinstance(leaves, str)
        or not isinstance(leaves, tuple | list)
        or not leaves
        or not all(isinstance(leaf, str) and leaf for leaf in leaves)
        or leaves[0] != TOKENS
        or len(set(leaves)) < len(leaves)
    ):
        raise ValueError(
            f"leaves must be a tuple of distinct leaf names of the cache, {TOKENS!r} first (its "
            f"offsets are the documents'), got {leaves!r}; e.g. leaves=({TOKENS!r}, "
            "'assistant_masks')"
        )
    return tuple(leaves)
