"""A document store's on-disk format read back: ``psdp.json`` (a store's, or a parted store's
manifest) checked, its arrays opened, its committed `DocumentIndex` read (layout: ``writer.py``,
which writes this format, and ``docs/guides/tokens.md``).

It hands back the arrays (`StoredDocuments`), not a `DocumentStore`: ``store.py`` makes the
store from them, so the store's module needs nothing above it and loads tensorstore only when a
store is opened.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from psdp._plan.leaves import TOKENS
from psdp.sources.documents.index import DocumentIndex
from psdp.sources.documents.mapped import MappedOffsets, MappedShards, Part, layout_of
from psdp.sources.documents.parts import PARTS_DIRECTORY, PARTS_FORMAT, PARTS_VERSION, PartedOffsets
from psdp.sources.stores.errors import retried_write
from psdp.sources.stores.location import (
    DATA_PREFIX,
    GCS_ENDPOINT_VARIABLE,
    Location,
    locate,
    open_kvstore,
    redacted_message,
)
from psdp.sources.stores.tensorstore import COMMITTED, METADATA_FILE, read_metadata_object

#: The ``format`` and ``version`` of a document store's ``psdp.json``.
DOCUMENTS_FORMAT = "psdp.documents"
DOCUMENTS_VERSION = 1
#: The TensorStore cache the stores a process opens share (unless a context is given): it keeps
#: the shard indexes (4 KiB per 2**20 tokens) and offsets chunks already read, so a range read
#: costs one request per run of chunks, not also one per shard index (``docs/guides/tokens.md``).
#: One cache for all, so that a mixture of many stores holds 64 MiB, not 64 MiB a store.
CACHE_BYTES = 64 << 20
#: (process id, GCS endpoint) -> the context: a forked child makes its own, and TensorStore's
#: gcs driver keeps the endpoint it found in the environment for the context's life
_SHARED: dict[tuple[int, str | None], ts.Context] = {}


def documents_context() -> ts.Context:
    """The TensorStore context with a cache pool of `CACHE_BYTES` that `read_documents` and
    `join_stored` read with when given none: one per process (and GCS endpoint), made on first
    use."""
    key = (os.getpid(), os.environ.get(GCS_ENDPOINT_VARIABLE))
    if key not in _SHARED:  # two threads may both make one: either does
        made = ts.Context({"cache_pool": {"total_bytes_limit": CACHE_BYTES}})
        _SHARED.setdefault(key, made)
    return _SHARED[key]


@dataclass(frozen=True)
class StoredDocuments:
    """What a written store is, opened: the arguments of a `DocumentStore`."""

    offsets: Any
    leaves: Mapping[str, Any]
    name: str
    index: DocumentIndex | None
    spot_check: bool
    #: the ``written`` of its ``psdp.json`` (`DocumentStore.written`); ``None``: none recorded
    written: str | None = None


def read_documents(path: Any, *, context: ts.Context | None = None) -> StoredDocuments:
    """The arrays of the store `write_documents` (or `psdp prepare`, a parted store) wrote at
    ``path`` (a directory, URL or kvstore spec); its metadata, offsets and leaf shapes are
    checked on open."""
    location = locate(path)
    context = documents_context() if context is None else context
    text, where, kvstore, options = _read_metadata(location, context)
    meta = _json(text, where)
    if isinstance(meta, dict) and meta.get("format") == PARTS_FORMAT:
        return _open_parted(location, _checked_manifest(meta, where), kvstore, context)
    meta = _checked_metadata(meta, where)
    offsets, arrays = _open_arrays(location.name, meta, kvstore, context, options)
    if location.local is not None:  # read from memory maps of the shard files where it can
        root = Path(location.local)
        arrays = {k: _mapped([(root / f"tokens/{k}", a)], location.name) for k, a in arrays.items()}
        offsets = _mapped([(root / "offsets", offsets)], location.name)
    index = None  # a store written before the index was recorded: built by a pass on open
    if "index_stride" in meta:
        index = _read_index(
            _open(kvstore("index"), context, location.name, options, rank=2), meta, location.name
        )
    # the index was committed with the offsets, and its ends match the metadata's counts
    return StoredDocuments(offsets, arrays, location.name, index, spot_check=False,
                           written=_written(meta, where))  # fmt: skip


def join_stored(
    paths: Sequence[Any],
    *,
    name: str,
    index: DocumentIndex | None = None,
    context: ts.Context | None = None,
    written: str | None = None,
) -> StoredDocuments:
    """The arrays of the stores `write_documents` wrote at ``paths``, back to back as one store
    (its leaves and dtypes those of the first). ``index``: the whole corpus's, committed with the list of
    parts; ``None``: built by one pass over every offset. ``context``: as for
    `read_documents`. ``written``: the identity of the commit that joined them (the
    manifest's)."""
    context = documents_context() if context is None else context
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
    roots = [locate(path).local for path in paths]
    local = [Path(root) for root in roots if root is not None]
    if len(local) == len(roots):  # memory maps of the parts' shard files
        flat = {
            leaf: _mapped(
                [
                    (root / f"tokens/{leaf}", part[leaf])
                    for root, part in zip(local, leaves, strict=True)
                ],
                name,
            )
            for leaf in leaves[0]
        }
    else:
        flat = {leaf: ts.concat([part[leaf] for part in leaves], axis=0) for leaf in leaves[0]}
    parted = PartedOffsets(offsets)
    joined_offsets: Any = parted
    if len(local) == len(roots):
        joined = _mapped([(Path(r) / "offsets", o) for r, o in zip(local, offsets, strict=True)],
                         name)  # fmt: skip
        if isinstance(joined, MappedShards):
            joined_offsets = MappedOffsets(joined, parted.first_document, parted.first_token)
    return StoredDocuments(joined_offsets, flat, name, index, spot_check=index is None,
                           written=written)  # fmt: skip


def _open_parted(
    location: Location, meta: dict[str, Any], kvstore: Callable[[str], Any], context: ts.Context
) -> StoredDocuments:
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
    written = _written(meta, location.name)
    return join_stored(paths, name=location.name, index=index, context=context, written=written)


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
    got = read_metadata_object(open_kvstore(location, context), location)
    if got.state != "value":
        raise FileNotFoundError(f"no document store at {location.name}: no {METADATA_FILE}")
    text = bytes(got.value)
    try:
        prefix = json.loads(text).get("data_prefix", "")
    except (ValueError, AttributeError):
        prefix = ""  # refused by the checks of the metadata

    def remote(name: str) -> dict[str, Any]:
        return location.below(f"{prefix}{name}/")

    return text, location.named(METADATA_FILE), remote, COMMITTED


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


def _mapped(parts: list[tuple[Path, ts.TensorStore]], name: str) -> Any:
    """The local arrays ``parts`` (directory, array) back to back, as a `MappedShards` where each
    has a layout a memory map reads (`layout_of`) on a little-endian machine; otherwise the
    one array, or their TensorStore concatenation."""
    layouts = [layout_of(array) for _, array in parts]
    if sys.byteorder != "little" or any(layout is None for layout in layouts):
        return parts[0][1] if len(parts) == 1 else ts.concat([a for _, a in parts], axis=0)
    dtype = parts[0][1].dtype.numpy_dtype
    return MappedShards(
        [Part(d, a, *layout) for (d, a), layout in zip(parts, layouts, strict=True) if layout],
        dtype,
        name,
    )


def _read_index(array: ts.TensorStore, meta: dict[str, Any], where: str) -> DocumentIndex:
    try:
        rows = np.asarray(retried_write(lambda: array.read().result(), f"reading {where}'s index"))
    except ValueError as error:
        raise ValueError(
            f"cannot read the document index of {where}: {redacted_message(str(error))}; the "
            "store is damaged or incomplete: rewrite it"
        ) from None
    try:
        return DocumentIndex(
            meta["num_documents"], meta["index_stride"], rows[:, 0], rows[:, 1],
            meta["longest_document"],
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise ValueError(
            f"the document index of the store is damaged: {error}; rewrite the store"
        ) from error


def _written(meta: dict[str, Any], where: str) -> str | None:
    """The identity of the write that made the store (``None``: written before psdp recorded
    one)."""
    written = meta.get("written")
    if written is not None and not (isinstance(written, str) and written):
        raise ValueError(
            f"{where} records written={written!r}, not the id of a write; the metadata is "
            "damaged: rewrite the store (or prepare it again)"
        )
    return written


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
        array = retried_write(
            lambda: ts.open(spec, read=True, open=True, context=context).result(),
            f"opening {kvstore.get('path')} of {where}",
        )
    except ValueError as error:
        raise ValueError(
            f"cannot open {kvstore.get('path')} of the document store {where}: {error}; the "
            "store is damaged or incomplete: rewrite it"
        ) from error
    if array.rank != rank:
        raise ValueError(f"{kvstore.get('path')} of {where} is not a {rank}-D array")
    return array
