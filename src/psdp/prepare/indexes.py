"""`build_indexes`: a document store's indexes built once, beside it (``psdp index``, ``psdp
prepare --pack``), so that no host builds them at start-up (``docs/guides/packing.md``, "The pack
index beside the store"; the layout: ``psdp.sources.documents.beside``).

A pack index is every window planned once. The windows are cut into parts of about
`DOCUMENTS_PER_PART` documents, each planned by one task on an engine (local processes, or Ray:
``prepare``'s engines) that saves its part's counts beside the store before it reports; a build
that is killed resumes from the parts saved (those of the same settings and the same store,
`store_digest`), and the index file is written whole only once every part is in, so a reader
never sees half an index. A Levanter cache's document index (it has none) is built first, the
same way: its offsets read in parts of `DOCUMENTS_PER_OFFSETS_PART` documents, one task each.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from psdp._plan.leaves import TOKENS
from psdp._plan.pack_windows import COUNTS, PackIndex
from psdp.prepare.engines import engine_named
from psdp.sources.documents.beside import (
    DOCUMENT_INDEX,
    IndexFolder,
    LengthBounds,
    PackSettings,
    document_index_bytes,
    index_command,
    saved_document_index,
    store_digest,
)
from psdp.sources.documents.index import STRIDE, DocumentIndex, check_offsets_rise
from psdp.sources.documents.selected import build_length_index
from psdp.sources.documents.store import DocumentStore
from psdp.sources.stores.levanter_cache import open_cache_arrays
from psdp.sources.views.pack_index import counts_of_windows, pack_index_bytes, read_pack_index

#: Documents a task plans (whole windows, at least one): a few seconds of one core, so that a
#: kill loses little and a worker's start (1-2 s) is paid back.
DOCUMENTS_PER_PART = 1 << 20
#: Fewer documents than this per local worker are planned faster in the driver alone.
DOCUMENTS_PER_WORKER = 4_000_000
#: Documents per task of a Levanter cache's document index (a multiple of its stride): 32 MiB
#: of offsets read, under 100 MiB of memory a task.
DOCUMENTS_PER_OFFSETS_PART = 1 << 22
#: ``format`` values: a psdp store, or a Levanter token cache.
FORMATS = ("psdp", "levanter")


@dataclass(frozen=True)
class _Part:
    """One task: windows ``[first, stop)`` of a packing of the store at ``store``."""

    store: Any
    format: str
    settings: PackSettings
    digest: str
    part: int
    first: int
    stop: int


def build_indexes(
    store: str | os.PathLike[str] | Mapping[str, Any],
    packs: Iterable[PackSettings] = (),
    *,
    lengths: Iterable[LengthBounds] = (),
    format: str = "psdp",
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Builds the store's indexes beside it: a Levanter cache's document index (a psdp store
    commits its own), a pack index per packing of ``packs`` and a length index per selection of
    ``lengths``; one that is already there and up to date is kept. Returns one record per
    index: its file, ``"built"``, ``"resumed"`` or ``"up to date"``, and its counts.

    Args:
        store: the store (a path, URL or kvstore spec), as a `DataConfig` source names it.
        packs: the packings in windows to index (`PackSettings`, e.g. ``PackSettings(4096, 4096)``).
        lengths: the selections by length to index (`LengthBounds`, e.g.
            ``LengthBounds(min_length=8192)``: one pass over the offsets each; what
            `SelectedDocuments.beside` and a `DataConfig` source with ``min_length`` open).
        format: ``"psdp"`` or ``"levanter"`` (a Levanter cache's split directory).
        workers: local processes (default: one per CPU, at most one per 4 million documents);
            ``engine="ray"``: ignored.
        engine: ``"local"`` or ``"ray"`` (the cluster at ``ray_address``).
        progress: show a progress bar.

    Examples:
        >>> import tempfile
        >>> from psdp import write_documents
        >>> path = f"{tempfile.mkdtemp()}/store"
        >>> docs = [np.arange(1, n + 1) for n in [3, 5, 2, 6] * 4]
        >>> _ = write_documents(path, docs, progress=False)
        >>> [r["state"] for r in build_indexes(path, [PackSettings(8, 4)], progress=False)]
        ['built']
        >>> [r["state"] for r in build_indexes(path, [PackSettings(8, 4)], progress=False)]
        ['up to date']
    """
    if format not in FORMATS:
        raise ValueError(
            f"format={format!r} must be one of {list(FORMATS)}; e.g. format='levanter'"
        )
    packs, lengths = list(packs), list(lengths)
    for settings in packs:
        if not isinstance(settings, PackSettings):
            raise TypeError(
                f"packs holds {settings!r}; give PackSettings, e.g. PackSettings(4096, 4096)"
            )
    for bounds in lengths:
        if not isinstance(bounds, LengthBounds):
            raise TypeError(
                f"lengths holds {bounds!r}; give LengthBounds, e.g. LengthBounds(min_length=8192)"
            )
    folder = IndexFolder(store)
    records = []
    runs = _Engine(engine, workers, ray_address)
    try:
        opened, record = _opened_with_index(store, format, folder, runs, progress)
    except (ValueError, FileNotFoundError) as error:
        raise _other_format(store, format, packs, error) from None
    if record is not None:
        records.append(record)
    digest = store_digest(opened.index, opened.written)
    for settings in packs:
        started = time.perf_counter()
        state, index = _pack_index(store, format, folder, opened, settings, digest, runs, progress)
        records.append({
            "index": folder.where(settings.file_name), "state": state, "windows": len(index.tokens),
            "sequences": len(index), "efficiency": round(index.efficiency, 6),
            "seconds": round(time.perf_counter() - started, 3),
        })  # fmt: skip
    for bounds in lengths:
        started = time.perf_counter()
        state, head = build_length_index(store, opened, bounds, progress=progress)
        records.append({
            "index": folder.where(bounds.file_name), "state": state,
            "documents": head["documents"], "tokens": head["tokens"],
            "seconds": round(time.perf_counter() - started, 3),
        })  # fmt: skip
    return records


@dataclass(frozen=True)
class _Engine:
    """Where the parts run: `engine_named`'s engine, with its workers (``None``: one per CPU,
    at most one per `DOCUMENTS_PER_WORKER` documents) or Ray's address."""

    name: str
    workers: int | None
    address: str | None

    def start(self, documents: int) -> Any:
        workers = self.workers
        if workers is None and self.name == "local":
            workers = max(1, min(os.cpu_count() or 1, documents // DOCUMENTS_PER_WORKER))
        return engine_named(self.name, workers=workers, address=self.address)


def _opened_with_index(
    store: Any, format: str, folder: IndexFolder, runs: _Engine, progress: bool
) -> tuple[DocumentStore, dict[str, Any] | None]:
    """The store, with its document index; a Levanter cache's built and saved beside it if
    missing or stale. Returns it and the record of that index (``None``: a psdp store's own)."""
    if format == "psdp":
        return DocumentStore.open(store), None
    from psdp.sources.documents.levanter import open_levanter_cache

    started = time.perf_counter()
    if saved_document_index(folder) is not None:
        try:
            return open_levanter_cache(store, index="beside"), {
                "index": folder.where(DOCUMENT_INDEX),
                "state": "up to date",
                "seconds": 0.0,
            }
        except ValueError:  # stale: built again below
            pass
    index, resumed = _document_index(store, folder, runs, progress)
    folder.write(DOCUMENT_INDEX, document_index_bytes(index))
    folder.delete(folder.names(_DOCUMENTS_BUILD))
    opened = open_levanter_cache(store, index=index)  # checked against the offsets
    return opened, {
        "index": folder.where(DOCUMENT_INDEX), "state": "resumed" if resumed else "built",
        "documents": index.num_documents, "seconds": round(time.perf_counter() - started, 3),
    }  # fmt: skip


#: The subfolder of a document index build's parts (then ``<D>-<T>-<digest>/``: the cache's
#: size and what it holds, `_cache_digest`).
_DOCUMENTS_BUILD = ".build-documents-"


@dataclass(frozen=True)
class _OffsetsPart:
    """One task of a document index: documents ``[first, stop)`` of the cache at ``store``."""

    store: Any
    part: int
    first: int
    stop: int
    build: str
    #: the offsets at ``first`` and ``stop`` when the build began, and the cache's ledger digest
    #: (`open_cache_arrays`): a cache built again since is refused, never mixed in
    edges: tuple[int, int]
    written: str


def _document_index(
    store: Any, folder: IndexFolder, runs: _Engine, progress: bool
) -> tuple[DocumentIndex, bool]:
    """A Levanter cache's document index, from its offsets read in parts of
    `DOCUMENTS_PER_OFFSETS_PART` documents (each task's marks, counts of non-empty documents
    and longest saved beside the cache, so a killed build resumes), then joined. Returns it and
    whether saved parts were used."""
    offsets, _, _, written = open_cache_arrays(store, (TOKENS,))
    documents = int(offsets.shape[0]) - 1
    step = DOCUMENTS_PER_OFFSETS_PART
    edges = np.array([*range(0, documents, step), documents])
    at_edges = np.asarray(offsets[edges].read().result(), np.int64)
    tokens = int(at_edges[-1])
    build = f"{_DOCUMENTS_BUILD}{documents}-{tokens}-{_cache_digest(written, at_edges)}/"
    folder.delete([n for n in folder.names(_DOCUMENTS_BUILD) if not n.startswith(build)])
    parts = [_OffsetsPart(store, p, first, min(first + step, documents), build,
                          (int(at_edges[p]), int(at_edges[p + 1])), written)
             for p, first in enumerate(range(0, documents, step))]  # fmt: skip
    saved = set(folder.names(build))
    done: dict[int, dict[str, np.ndarray]] = {}
    for part in parts:
        name = _part_name(build, part.part).replace(".npy", ".npz")
        if name in saved:
            data = folder.read(name)
            with np.load(io.BytesIO(data or b""), allow_pickle=False) as got:
                done[part.part] = {key: got[key] for key in got.files}
    todo = [part for part in parts if part.part not in done]
    bar = tqdm(total=documents, initial=sum(p.stop - p.first for p in parts if p.part in done),
               unit="documents", desc=f"document index {store}", disable=not progress)  # fmt: skip
    runner = runs.start(documents) if todo else None
    try:
        for number, result in runner.map_unordered(_index_part, todo) if runner else ():
            done[number] = result
            bar.update(parts[number].stop - parts[number].first)
    finally:
        bar.close()
        if runner is not None:
            runner.close()
    counts = np.concatenate([done[p.part]["nonempty"] for p in parts])
    index = DocumentIndex(
        documents, STRIDE,
        np.concatenate([*(done[p.part]["marks"] for p in parts), [tokens]]),
        np.concatenate([[0], np.cumsum(counts)]),
        max(int(done[p.part]["longest"]) for p in parts),
    )  # fmt: skip
    return index, len(todo) < len(parts)


def _index_part(part: _OffsetsPart) -> tuple[int, dict[str, np.ndarray]]:
    """One part of a document index (run in a worker): the offsets at the part's marks, the
    non-empty documents of each of its blocks and its longest document, saved beside the cache.
    """
    offsets = _cache_offsets(
        part.store if isinstance(part.store, str) else _Frozen(part.store), part.written
    )
    values = np.asarray(offsets[part.first : part.stop + 1].read().result(), np.int64)
    if (int(values[0]), int(values[-1])) != part.edges:
        raise ValueError(
            f"the Levanter cache at {part.store} changed while its document index was being "
            f"built (offsets[{part.first}] and offsets[{part.stop}] are "
            f"{(int(values[0]), int(values[-1]))}, the build began on {part.edges}); run the "
            "command again once nothing writes the cache"
        )
    check_offsets_rise(values, f"the Levanter cache at {part.store}", first=part.first,
                       fix="the cache is damaged: build it again with Levanter")  # fmt: skip
    lengths = np.diff(values)
    result: dict[str, Any] = {
        "marks": values[: len(lengths) : STRIDE].copy(),
        "nonempty": np.add.reduceat(lengths > 0, np.arange(0, len(lengths), STRIDE)).astype(
            np.int64
        ),
        "longest": np.array(int(lengths.max(initial=0))),
    }
    body = io.BytesIO()
    np.savez(body, **result)
    name = _part_name(part.build, part.part).replace(".npy", ".npz")
    IndexFolder(part.store).write(name, body.getvalue())
    return part.part, result


def _cache_digest(written: str, at_edges: np.ndarray) -> str:
    """What a cache holds, as a document index build's parts are named by it: its ledger's
    digest and its offsets at the parts' edges (two caches of one size, even of one ledger,
    differ there unless they hold the same documents' lengths up to the parts' edges; a part
    also checks its own edges when it reads them)."""
    body = written.encode() + np.ascontiguousarray(at_edges, "<i8").tobytes()
    return hashlib.sha256(body).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _cache_offsets(store: Any, written: str) -> Any:
    """A Levanter cache's used offsets (``[0, ends...]``), opened once per worker process and
    build (``written``: the ledger digest the build began on; a cache built again since is
    refused)."""
    offsets, _, name, now = open_cache_arrays(store, (TOKENS,))
    if now != written:
        raise ValueError(
            f"the {name} was built again while its document index was being built (its ledger "
            f"is {now!r}, the build began on {written!r}); run the command again once nothing "
            "writes the cache"
        )
    return offsets


def _other_format(
    store: Any, format: str, packs: list[PackSettings], error: Exception
) -> Exception:
    """``error`` (the store did not open as ``format``), or, when the store is of the other
    format, an error naming the command with the right ``--format``."""
    from psdp.sources.stores.levanter_cache import is_levanter_cache

    other = "levanter" if format == "psdp" else "psdp"
    if other == "levanter" and not is_levanter_cache(store):
        return error
    if other == "psdp":
        try:
            DocumentStore.open(store)
        except (ValueError, FileNotFoundError):
            return error
    kinds = {"levanter": "a Levanter token cache", "psdp": "a psdp document store"}
    return type(error)(
        f"{store} is {kinds[other]}, not {kinds[format]}; build its indexes with "
        f"`{index_command(store, other, tuple(packs))}`"
    )


def _pack_index(store: Any, format: str, folder: IndexFolder, opened: DocumentStore,
                settings: PackSettings, digest: str, runs: _Engine,
                progress: bool) -> tuple[str, PackIndex]:  # fmt: skip
    """The pack index of ``settings``: the one beside the store if up to date, else built from
    the parts saved and the parts still to plan, then written whole."""
    key = settings.key(opened.num_documents, opened.num_tokens)
    fix = "it is replaced by the index built now"
    data = folder.read(settings.file_name)
    if data is not None:
        try:
            index, built_for = read_pack_index(data, folder.where(settings.file_name), fix)
            if index.key == key and built_for == digest:
                return "up to date", index
        except ValueError:  # not a pack index of this psdp: replaced
            pass
    build = _build(settings, digest)
    stale = [n for n in folder.names(_build(settings, "")) if not n.startswith(build)]
    folder.delete(stale)  # parts of the store before it changed: never mixed in
    per_part = max(1, DOCUMENTS_PER_PART // settings.window)
    parts = [
        _Part(store, format, settings, digest, p, first, min(first + per_part, key.num_windows))
        for p, first in enumerate(range(0, key.num_windows, per_part))
    ]
    saved = set(folder.names(build))
    counts: dict[int, np.ndarray] = {}
    for part in parts:
        name = _part_name(build, part.part)
        if name in saved:
            counts[part.part] = _read_part(folder, name, part)
    todo = [part for part in parts if part.part not in counts]
    done_windows = sum(len(c) for c in counts.values())
    bar = tqdm(total=key.num_windows, initial=done_windows, unit="windows",
               desc=f"pack index {settings.flags()}", disable=not progress)  # fmt: skip
    runner = runs.start(opened.num_documents) if todo else None
    try:
        for number, part_counts in runner.map_unordered(_plan_part, todo) if runner else ():
            counts[number] = part_counts
            bar.update(len(part_counts))
    finally:
        bar.close()
        if runner is not None:
            runner.close()
    index = PackIndex.from_counts(key, np.concatenate([counts[p.part] for p in parts]))
    folder.write(settings.file_name, pack_index_bytes(index, store=digest))
    folder.delete(sorted(folder.names(build)))
    return ("resumed" if done_windows else "built"), index


def _build(settings: PackSettings, digest: str) -> str:
    """The subfolder of a build's parts: named by the settings and the store (``digest``;
    ``""``: the start every build of these settings shares)."""
    stem = settings.file_name.removesuffix(".npz")
    return f".build-{stem}-{digest.rsplit(':', 1)[-1][:16]}/" if digest else f".build-{stem}-"


def _part_name(build: str, part: int) -> str:
    return f"{build}part-{part:07d}.npy"


def _read_part(folder: IndexFolder, name: str, part: _Part) -> np.ndarray:
    """A saved part's counts; one that is damaged is planned again (its file replaced)."""
    data = folder.read(name)
    try:
        counts = np.load(io.BytesIO(data or b""), allow_pickle=False)
    except (OSError, ValueError):
        return _replan(folder, name, part)
    if counts.shape != (part.stop - part.first, len(COUNTS)):
        return _replan(folder, name, part)
    return counts.astype(np.int64)


def _replan(folder: IndexFolder, name: str, part: _Part) -> np.ndarray:
    folder.delete([name])
    return _plan_part(part)[1]


def _plan_part(part: _Part) -> tuple[int, np.ndarray]:
    """Plans the part's windows and saves their counts beside the store (run in a worker)."""
    where = part.store if isinstance(part.store, str) else _Frozen(part.store)
    store = _open(where, part.format, part.digest)
    if store_digest(store.index, store.written) != part.digest:
        raise ValueError(
            f"the store {store.name} changed while its pack index was being built (it is "
            f"{store_digest(store.index, store.written)!r}, the build began on "
            f"{part.digest!r}); run the "
            "command again once nothing writes the store"
        )
    key = part.settings.key(store.num_documents, store.num_tokens)
    counts = counts_of_windows(store, key, part.first, part.stop)
    body = io.BytesIO()
    np.save(body, counts)
    IndexFolder(part.store).write(_part_name(_build(part.settings, part.digest), part.part),
                                  body.getvalue())  # fmt: skip
    return part.part, counts


class _Frozen(dict[str, Any]):
    """A kvstore spec that `functools.lru_cache` can key on."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(repr(sorted(self.items())))


@functools.lru_cache(maxsize=4)
def _open(store: Any, format: str, digest: str) -> DocumentStore:
    """The store, opened once per worker process and build (``digest``: the store the build
    began on; a store rewritten since is opened again, and refused), its document index read
    beside a cache."""
    if format == "levanter":
        from psdp.sources.documents.levanter import open_levanter_cache

        return open_levanter_cache(store, index="beside")
    return DocumentStore.open(store)


def parse_packs(given: Sequence[str], **options: Any) -> list[PackSettings]:
    """``--pack SEQ_LEN,WINDOW`` values as `PackSettings` with the other flags' ``options``."""
    return [PackSettings.parse(text, **options) for text in given]
