"""`write_documents`: a `DocumentStore` on disk or in an object store, written atomically like
`write_dataset` (the same staging and commit), read by token ranges (``format.py`` reads it back).

Layout below the store (``docs/guides/tokens.md``): ``psdp.json`` (format `DOCUMENTS_FORMAT`, written
last), ``offsets/`` (int64, ``D + 1``, in chunks of one index block), ``index/`` (the offsets'
`DocumentIndex`, so that opening the store reads no offsets but its ends) and ``tokens/<leaf>/``
(one flat zarr3 array per leaf, in shard files of ``tokens_per_shard`` tokens and chunks of
``tokens_per_chunk``, the unit a range read decodes), each chunk with a crc32c checksum by
default.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from tqdm import tqdm

from psdp._checks import check_int
from psdp._plan.leaves import TOKENS
from psdp.sources.documents.format import DOCUMENTS_FORMAT, DOCUMENTS_VERSION
from psdp.sources.documents.index import STRIDE, DocumentIndex, build_index
from psdp.sources.documents.store import document_leaves
from psdp.sources.stores.location import locate
from psdp.sources.stores.writer import ShardedWriter, commit_write, inner_codecs


def write_documents(
    path: str | os.PathLike[str] | Mapping[str, Any],
    docs: Iterable[Any],
    *,
    dtype: Any = None,
    tokens_per_shard: int = 1 << 20,
    tokens_per_chunk: int = 4096,
    compression: str | dict[str, Any] | None = None,
    checksum: bool = True,
    overwrite: bool = False,
    progress: bool = True,
) -> Any:
    """Writes documents to a store that `DocumentStore.open` reads.

    Args:
        path: a new directory, or a prefix in an object store (a URL such as
            ``s3://bucket/docs`` or a kvstore spec), as for `write_dataset`.
        docs: 1-D integer arrays of token ids, or dicts of aligned 1-D arrays (``input_ids`` and
            e.g. a ``loss_mask``), every document with the same leaves and at least one token.
        dtype: the dtype of ``input_ids`` on disk (e.g. ``np.uint16`` for vocabularies up to
            65,536); default: the first document's. An id it cannot hold (too large, or
            negative) is an error, never a wrapped value; the other leaves keep the first
            document's dtypes under the same rule.
        tokens_per_shard: tokens per shard file.
        tokens_per_chunk: tokens per chunk, the unit a range read decodes (a read of a few
            thousand tokens touches one or two chunks).
        compression: as for `write_dataset`.
        checksum: as for `write_dataset`.
        overwrite: as for `write_dataset`.
        progress: as for `write_dataset`.

    Returns:
        ``path`` as a `Path` for a local directory, else ``path`` as given.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> docs = [np.array([5, 6, 7]), np.array([8, 9])]
        >>> path = write_documents(f"{tmp.name}/docs", docs, dtype=np.uint16, progress=False)
        >>> sorted(p.name for p in path.iterdir())
        ['index', 'offsets', 'psdp.json', 'tokens']
        >>> from psdp import DocumentStore
        >>> store = DocumentStore.open(path)
        >>> store.offsets_range(0, 3).tolist(), store.read_ranges([2], [4])["input_ids"].tolist()
        ([0, 3, 5], [7, 8])
        >>> tmp.cleanup()
    """
    check_int("tokens_per_shard", tokens_per_shard, minimum=1)
    check_int("tokens_per_chunk", tokens_per_chunk, minimum=1)
    if tokens_per_shard % tokens_per_chunk:
        raise ValueError(
            f"tokens_per_shard={tokens_per_shard} must be a multiple of tokens_per_chunk="
            f"{tokens_per_chunk}; e.g. tokens_per_shard={tokens_per_chunk * 256}"
        )
    if isinstance(docs, np.ndarray | Mapping | str | bytes) or not isinstance(docs, Iterable):
        raise TypeError(
            "docs must be an iterable of documents (1-D token arrays, or dicts of aligned 1-D "
            f"arrays), got {type(docs).__name__}; for one document pass [doc]"
        )
    codecs = inner_codecs(compression, checksum)
    stream = iter(docs)
    first = next(stream, None)
    if first is None:
        raise ValueError(f"no documents to write to {locate(path).name}: the iterable was empty")
    head = document_leaves(first, 0, None)
    schema: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
        name: (np.dtype(values.dtype), ()) for name, values in head.items()
    }
    if dtype is not None:
        schema[TOKENS] = (_token_dtype(dtype), ())
    layout = {
        "tokens_per_shard": tokens_per_shard,
        "tokens_per_chunk": tokens_per_chunk,
        "compression": compression,
        "checksum": checksum,
    }
    lengths = array.array("q")  # 8 bytes a document (a list of ints: ~36)
    recorded: dict[str, int] = {}  # what the index found, for the metadata
    recorded_content: list[str] = []  # the sha256 of what was written
    name = locate(path).name

    def fill(leaf_kvstore: Callable[[str], dict[str, Any]], on_start: Any) -> tuple[int, int]:
        tokens = ShardedWriter(
            lambda leaf: leaf_kvstore(f"tokens/{leaf}"),
            schema,
            tokens_per_shard,
            tokens_per_chunk,
            codecs,
            None,
            on_start,
            shards_per_block=1,  # documents arrive one by one: a shard's worth held, not 64 MB
        )
        chunks = _checked(head, stream, schema, lengths)
        content = hashlib.sha256(json.dumps(sorted((k, d.name) for k, (d, _) in schema.items()))
                                 .encode())  # fmt: skip
        with tqdm(unit="tokens", desc=f"write {name}", disable=not progress, delay=1.0) as bar:
            for index, chunk in enumerate(chunks):
                for leaf in sorted(chunk):  # what is written, document by document
                    content.update(np.ascontiguousarray(chunk[leaf]).data)
                bar.update(tokens.add(chunk, index))
            bar.update(tokens.finish())
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(np.frombuffer(lengths, np.int64), out=offsets[1:])
        content.update(offsets.astype("<i8").data)
        recorded_content.append(content.hexdigest())
        # a chunk per index block (a read of one block decodes ~one chunk), 256 to a shard; a
        # store of fewer documents has one chunk of its offsets, not a block's padded to 32 KiB
        per_chunk = min(STRIDE, len(offsets))
        writer = ShardedWriter(
            leaf_kvstore,
            {"offsets": (np.dtype(np.int64), ())},
            per_chunk * 256 if per_chunk == STRIDE else per_chunk,
            per_chunk,
            codecs,
            len(offsets),
            on_start,
        )
        writer.add({"offsets": offsets}, 0)
        writer.finish()
        doc_index = build_index(lambda a, b: offsets[a[0] : b[0]], len(lengths), name=name,
                                progress=False)  # fmt: skip
        _write_index(doc_index, leaf_kvstore, codecs, on_start)
        recorded.update(longest=doc_index.longest)
        return len(lengths), int(offsets[-1])

    def metadata_of(counts: tuple[int, int]) -> dict[str, Any]:
        return {
            "format": DOCUMENTS_FORMAT,
            "version": DOCUMENTS_VERSION,
            "num_documents": counts[0],
            "num_tokens": counts[1],
            "leaves": {leaf: d.name for leaf, (d, _) in schema.items()},
            **layout,
            "index_stride": STRIDE,
            "longest_document": recorded["longest"],
            # what was written (leaves, dtypes, tokens, offsets): the indexes beside the store
            # record it, and tell this store from another of the same size (``beside.py``)
            "written": f"sha256:{recorded_content[-1]}",
        }

    return commit_write(path, overwrite, fill, metadata_of)


def _write_index(
    index: DocumentIndex, leaf_kvstore: Callable[[str], dict[str, Any]], codecs: Any, on_start: Any
) -> None:
    """The index beside the offsets: ``index/``, int64 ``(blocks + 1, 2)``: each mark and the
    non-empty documents before it, in one chunk of exactly its rows (it is read whole; stores
    written before this wrote chunks of 65,536 rows, 1 MiB, which read the same)."""
    rows = np.stack([index.marks, index.nonempty], axis=1)
    writer = ShardedWriter(
        leaf_kvstore, {"index": (np.dtype(np.int64), (2,))}, len(rows), len(rows), codecs,
        len(rows), on_start,
    )  # fmt: skip
    writer.add({"index": rows}, 0)
    writer.finish()


def _token_dtype(dtype: Any) -> np.dtype:
    try:
        token = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy integer dtype, got {dtype!r}") from None
    if token.kind not in "iu":
        raise TypeError(f"dtype must be an integer dtype for token ids, got {token}")
    return token


def _checked(
    head: dict[str, np.ndarray],
    rest: Iterator[Any],
    schema: dict[str, tuple[np.dtype, tuple[int, ...]]],
    lengths: array.array[int],
) -> Iterator[dict[str, np.ndarray]]:
    """Each document as leaves in the store's dtypes; records its length."""
    names = list(head)
    leaves = head
    index = 0
    while True:
        out = {}
        for leaf, values in leaves.items():
            out[leaf] = _cast(values, schema[leaf][0], f"document {index}, leaf {leaf!r}")
        lengths.append(len(out[TOKENS]))
        yield out
        doc = next(rest, None)
        if doc is None:
            return
        index += 1
        leaves = document_leaves(doc, index, names)


def _cast(values: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """``values`` in ``dtype``, refusing any value it cannot hold exactly."""
    if values.dtype == dtype:
        return values
    cast = values.astype(dtype)
    if not np.array_equal(cast, values):
        bad = np.flatnonzero(cast != values)[0]
        fix = (
            "write with a wider dtype (e.g. dtype=np.uint32 for ids >= 65,536)"
            if dtype.kind in "iu"
            else "cast the leaf first"
        )
        raise ValueError(
            f"{where}: value {values[bad].item()!r} at token {bad} does not fit the store's dtype "
            f"{dtype} (it would be written as {cast[bad].item()!r}); {fix}"
        )
    return cast
