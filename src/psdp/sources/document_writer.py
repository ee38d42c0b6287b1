"""`write_documents` and `open_documents`: a `DocumentStore` on disk or in an object store, written
atomically like `write_dataset` (the same staging and commit), read by token ranges.

Layout below the store (``docs/guides/tokens.md``): ``psdp.json`` (format `DOCUMENTS_FORMAT`, written
last), ``offsets/`` (int64, ``D + 1``, in chunks of one index block), ``index/`` (the offsets'
`DocumentIndex`, so that opening the store reads no offsets but its ends) and ``tokens/<leaf>/``
(one flat zarr3 array per leaf, in shard files of ``tokens_per_shard`` tokens and chunks of
``tokens_per_chunk``, the unit a range read decodes), each chunk with a crc32c checksum by
default.
"""

from __future__ import annotations

import array
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts
from tqdm import tqdm

from psdp._checks import check_int
from psdp.sources.document_index import STRIDE, DocumentIndex, build_index
from psdp.sources.document_parts import (
    PARTS_DIRECTORY,
    PARTS_FORMAT,
    PARTS_VERSION,
    PartedOffsets,
)
from psdp.sources.documents import TOKENS, DocumentStore, document_leaves
from psdp.sources.location import DATA_PREFIX, Location, locate, open_kvstore
from psdp.sources.tensorstore import COMMITTED, METADATA_FILE
from psdp.sources.writer import ShardedWriter, commit_write, inner_codecs

#: The ``format`` and ``version`` of a document store's ``psdp.json``.
DOCUMENTS_FORMAT = "psdp.documents"
DOCUMENTS_VERSION = 1


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
        with tqdm(unit="tokens", desc=f"write {name}", disable=not progress, delay=1.0) as bar:
            for index, chunk in enumerate(chunks):
                bar.update(tokens.add(chunk, index))
            bar.update(tokens.finish())
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(np.frombuffer(lengths, np.int64), out=offsets[1:])
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
        }

    return commit_write(path, overwrite, fill, metadata_of)


def open_documents(path: Any, *, context: ts.Context | None = None) -> DocumentStore:
    """The `DocumentStore` `write_documents` (or `psdp prepare`, a parted store) wrote at
    ``path`` (a directory, URL or kvstore spec); its metadata, offsets and leaf shapes are
    checked on open."""
    location = locate(path)
    context = ts.Context() if context is None else context
    text, where, kvstore, options = _read_metadata(location, context)
    meta = _json(text, where)
    if isinstance(meta, dict) and meta.get("format") == PARTS_FORMAT:
        return _open_parted(location, _checked_manifest(meta, where), kvstore, context)
    meta = _checked_metadata(meta, where)
    offsets, arrays = _open_arrays(location.name, meta, kvstore, context, options)
    index = None  # a store written before the index was recorded: built by a pass on open
    if "index_stride" in meta:
        index = _read_index(_open(kvstore("index"), context, location.name, options, rank=2), meta)
    # the index was committed with the offsets, and its ends match the metadata's counts
    return DocumentStore(offsets, arrays, name=location.name, index=index, spot_check=False)


def join_documents(
    paths: Sequence[Any], *, name: str, index: DocumentIndex | None = None
) -> DocumentStore:
    """The stores `write_documents` wrote at ``paths``, back to back as one store (its leaves
    and dtypes those of the first). ``index``: the whole corpus's, committed with the list of
    parts; ``None``: built by one pass over every offset."""
    context = ts.Context()
    offsets: list[ts.TensorStore] = []
    leaves: list[dict[str, ts.TensorStore]] = []
    for path in paths:
        location = locate(path)
        text, where, kvstore, options = _read_metadata(location, context)
        meta = _checked_metadata(_json(text, where), where)
        part_offsets, arrays = _open_arrays(location.name, meta, kvstore, context, options)
        if leaves and {k: a.dtype for k, a in arrays.items()} != {
            k: a.dtype for k, a in leaves[0].items()
        }:
            raise ValueError(
                f"the part {location.name} has leaves {meta['leaves']}, unlike the parts before "
                f"it; the store {name} is damaged: prepare it again"
            )
        offsets.append(part_offsets)
        leaves.append(arrays)
    flat = {leaf: ts.concat([part[leaf] for part in leaves], axis=0) for leaf in leaves[0]}
    return DocumentStore(
        PartedOffsets(offsets), flat, name=name, index=index, spot_check=index is None
    )


def _open_parted(
    location: Location, meta: dict[str, Any], kvstore: Callable[[str], Any], context: ts.Context
) -> DocumentStore:
    """A parted store: its parts joined, with the index its manifest names."""
    if not meta.get("complete"):
        done = sum(1 for part in meta["parts"].values() if part is not None)
        raise ValueError(
            f"{location.name} is an unfinished psdp prepare: {done} of {len(meta['parts'])} "
            "parts are committed; run the same psdp prepare again to finish it (it resumes; "
            "first fix or replace an input that stopped it)"
        )
    key = meta["index"]
    if location.local is not None:
        index = DocumentIndex.load(location.local / key)
    else:
        got = open_kvstore(location, context).read(key.encode()).result()
        index = DocumentIndex.load(io.BytesIO(bytes(got.value)))
    names = [u["part"] for u in meta["units"] if meta["parts"][u["part"]]["num_documents"]]
    paths = [_below(location, f"{PARTS_DIRECTORY}/{name}") for name in names]
    return join_documents(paths, name=location.name, index=index)


def _below(location: Location, relative: str) -> Any:
    """The path or kvstore spec of ``relative`` below ``location``."""
    if location.local is not None:
        return location.local / relative
    return location.below(relative + "/")


def _read_metadata(
    location: Location, context: ts.Context
) -> tuple[bytes, str, Callable[[str], dict[str, Any]], dict[str, Any]]:
    """A store's ``psdp.json``, where it is (for messages), the kvstore of each array by name, and
    the open options of its arrays."""
    if location.local is not None:
        meta_file = location.local / METADATA_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(
                f"no document store at {location.local}: it has no {METADATA_FILE}; write one "
                "with psdp.write_documents(path, docs)"
            )
        root = os.path.abspath(location.local)
        text = meta_file.read_bytes()

        def local(name: str) -> dict[str, Any]:
            return {"driver": "file", "path": f"{root}/{name}/"}

        return text, str(meta_file), local, {}
    got = open_kvstore(location, context).read(METADATA_FILE.encode()).result()
    if got.state != "value":
        raise FileNotFoundError(f"no document store at {location.name}: no {METADATA_FILE}")
    text = bytes(got.value)
    try:
        prefix = json.loads(text).get("data_prefix", "")
    except (ValueError, AttributeError):
        prefix = ""  # refused by the checks of the metadata

    def remote(name: str) -> dict[str, Any]:
        return location.below(f"{prefix}{name}/")

    return text, f"{location.name}{METADATA_FILE}", remote, COMMITTED


def _open_arrays(
    name: str,
    meta: dict[str, Any],
    kvstore: Callable[[str], dict[str, Any]],
    context: ts.Context,
    options: dict[str, Any],
) -> tuple[ts.TensorStore, dict[str, ts.TensorStore]]:
    """A document store's offsets and leaves, checked against its metadata."""
    arrays = {
        leaf: _open(kvstore(f"tokens/{leaf}"), context, name, options) for leaf in meta["leaves"]
    }
    for leaf, opened in arrays.items():
        if np.dtype(opened.dtype.numpy_dtype).name != meta["leaves"][leaf]:
            raise ValueError(
                f"leaf {leaf!r} of {name} has dtype {opened.dtype.numpy_dtype}, but its "
                f"metadata says {meta['leaves'][leaf]}; the store is damaged: rewrite it"
            )
    offsets = _open(kvstore("offsets"), context, name, options)
    entries = int(offsets.shape[0])
    last = int(offsets[entries - 1].read().result()) if entries else 0
    if entries != meta["num_documents"] + 1 or last != meta["num_tokens"]:
        raise ValueError(
            f"the offsets of {name} hold {entries - 1} documents and {last} tokens, but "
            f"its metadata says {meta['num_documents']} and {meta['num_tokens']}; the store is "
            "damaged: rewrite it"
        )
    return offsets, arrays


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


def _read_index(array: ts.TensorStore, meta: dict[str, Any]) -> DocumentIndex:
    rows = np.asarray(array.read().result())
    try:
        return DocumentIndex(
            meta["num_documents"], meta["index_stride"], rows[:, 0], rows[:, 1],
            meta["longest_document"],
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise ValueError(
            f"the document index of the store is damaged: {error}; rewrite the store"
        ) from error


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


def _json(text: bytes, where: str) -> Any:
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the document store metadata {where}: {error}") from error


def _checked_manifest(meta: dict[str, Any], where: str) -> dict[str, Any]:
    if meta.get("version") != PARTS_VERSION:
        raise ValueError(
            f"{where} is a psdp parted store of version {meta.get('version')!r}, but this psdp "
            f"reads version {PARTS_VERSION}; read it with the psdp that wrote it, or prepare it "
            "again"
        )
    parts, units = meta.get("parts"), meta.get("units")
    if (
        not isinstance(parts, dict)
        or not isinstance(units, list)
        or (meta.get("complete") and not isinstance(meta.get("index"), str))
    ):
        raise ValueError(f"{where} is a damaged parted store manifest; prepare the store again")
    return meta


def _checked_metadata(meta: Any, where: str) -> dict[str, Any]:
    if (
        isinstance(meta, dict)
        and meta.get("format") == DOCUMENTS_FORMAT
        and (meta.get("version") != DOCUMENTS_VERSION)
    ):
        raise ValueError(
            f"{where} is a psdp document store of format version {meta.get('version')!r}, but "
            f"this psdp reads version {DOCUMENTS_VERSION}; read it with the psdp that wrote it "
            "(a newer one: upgrade psdp), or rewrite the store with write_documents"
        )
    if not isinstance(meta, dict) or meta.get("format") != DOCUMENTS_FORMAT:
        got = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else meta
        raise ValueError(
            f"{where} is not a psdp document store: format/version {got!r}, but this psdp reads "
            f"{DOCUMENTS_FORMAT!r} version {DOCUMENTS_VERSION} (a dataset of rows opens with "
            "TensorStoreSource)"
        )
    leaves = meta.get("leaves")
    counts = [meta.get("num_documents"), meta.get("num_tokens")]
    prefix = meta.get("data_prefix", "")
    if (
        not isinstance(leaves, dict)
        or TOKENS not in leaves
        or not all(isinstance(c, int) and c >= 0 for c in counts)
        or not (prefix == "" or (isinstance(prefix, str) and prefix.startswith(DATA_PREFIX)))
    ):
        raise ValueError(f"{where} is damaged document store metadata; rewrite the store")
    return meta


def _open(
    kvstore: dict[str, Any],
    context: ts.Context,
    where: str,
    options: dict[str, Any],
    rank: int = 1,
) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": kvstore, "fill_missing_data_reads": False, **options}
    try:
        array = ts.open(spec, read=True, open=True, context=context).result()
    except ValueError as error:
        raise ValueError(
            f"cannot open {kvstore.get('path')} of the document store {where}: {error}; the "
            "store is damaged or incomplete: rewrite it"
        ) from error
    if array.rank != rank:
        raise ValueError(f"{kvstore.get('path')} of {where} is not a {rank}-D array")
    return array
