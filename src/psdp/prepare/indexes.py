"""`build_indexes`: a document store's indexes built once, beside it (``psdp index``, ``psdp
prepare --pack``), so that no host builds them at start-up (``docs/guides/packing.md``, "The pack
index beside the store"; the layout: ``psdp.sources.documents.beside``).

A pack index is every window planned once. The windows are cut into parts of about
`DOCUMENTS_PER_PART` documents, each planned by one task on an engine (local processes, or Ray:
``prepare``'s engines) that saves its part's counts beside the store before it reports; a build
that is killed resumes from the parts saved (those of the same settings and the same store,
`store_digest`), and the index file is written whole only once every part is in, so a reader
never sees half an index. A Levanter cache's document index (it has none) is one pass over its
offsets, saved first.
"""

from __future__ import annotations

import functools
import io
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from psdp._plan.pack_windows import COUNTS, PackIndex
from psdp.prepare.engines import engine_named
from psdp.sources.documents.beside import (
    DOCUMENT_INDEX,
    IndexFolder,
    PackSettings,
    document_index_bytes,
    index_command,
    saved_document_index,
    store_digest,
)
from psdp.sources.documents.store import DocumentStore
from psdp.sources.views.pack_index import counts_of_windows, pack_index_bytes, read_pack_index

#: Documents a task plans (whole windows, at least one): a few seconds of one core, so that a
#: kill loses little and a worker's start (1-2 s) is paid back.
DOCUMENTS_PER_PART = 1 << 20
#: Fewer documents than this per local worker are planned faster in the driver alone.
DOCUMENTS_PER_WORKER = 4_000_000
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
    format: str = "psdp",
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Builds the store's indexes beside it: a Levanter cache's document index (a psdp store
    commits its own), and a pack index per packing of ``packs``; one that is already there and
    up to date is kept. Returns one record per index: its file, ``"built"``, ``"resumed"`` or
    ``"up to date"``, and its counts.

    Args:
        store: the store (a path, URL or kvstore spec), as a `DataConfig` source names it.
        packs: the packings in windows to index (`PackSettings`, e.g. ``PackSettings(4096, 4096)``).
        format: ``"psdp"`` or ``"levanter"`` (a Levanter cache's split directory).
        workers: local processes (default: one per CPU, at most one per 4 million documents);
            ``engine="ray"``: ignored.
        engine: ``"local"`` or ``"ray"`` (the cluster at ``ray_address``).
        progress: show a progress bar.

    Examples:
        >>> import tempfile
        >>> from psdp import write_documents
        >>> path = f"{tempfile.mkdtemp()}/store"
        >>> _ = write_documents(path, [np.arange(1, n + 1) for n in [3, 5, 2, 6] * 4], progress=False)
        >>> [r["state"] for r in build_indexes(path, [PackSettings(8, 4)], progress=False)]
        ['built']
        >>> [r["state"] for r in build_indexes(path, [PackSettings(8, 4)], progress=False)]
        ['up to date']
    """
    if format not in FORMATS:
        raise ValueError(
            f"format={format!r} must be one of {list(FORMATS)}; e.g. format='levanter'"
        )
    packs = list(packs)
    for settings in packs:
        if not isinstance(settings, PackSettings):
            raise TypeError(
                f"packs holds {settings!r}; give PackSettings, e.g. PackSettings(4096, 4096)"
            )
    folder = IndexFolder(store)
    records = []
    try:
        opened, record = _opened_with_index(store, format, folder, progress)
    except (ValueError, FileNotFoundError) as error:
        raise _other_format(store, format, packs, error) from None
    if record is not None:
        records.append(record)
    digest = store_digest(opened.index)
    if workers is None and engine == "local":
        workers = max(1, min(os.cpu_count() or 1, opened.num_documents // DOCUMENTS_PER_WORKER))
    for settings in packs:
        started = time.perf_counter()
        options = {"workers": workers, "address": ray_address}
        state, index = _pack_index(
            store, format, folder, opened, settings, digest, (engine, options), progress
        )
        records.append({
            "index": folder.where(settings.file_name), "state": state, "windows": len(index.tokens),
            "sequences": len(index), "efficiency": round(index.efficiency, 6),
            "seconds": round(time.perf_counter() - started, 3),
        })  # fmt: skip
    return records


def _opened_with_index(
    store: Any, format: str, folder: IndexFolder, progress: bool
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
    opened = open_levanter_cache(store, index=None)  # one pass, with its own progress bar
    folder.write(DOCUMENT_INDEX, document_index_bytes(opened.index))
    return opened, {
        "index": folder.where(DOCUMENT_INDEX), "state": "built",
        "seconds": round(time.perf_counter() - started, 3),
    }  # fmt: skip


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
                settings: PackSettings, digest: str, engine: tuple[str, dict[str, Any]],
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
    runner = engine_named(engine[0], **engine[1]) if todo else None
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
    if store_digest(store.index) != part.digest:
        raise ValueError(
            f"the store {store.name} changed while its pack index was being built (it is "
            f"{store_digest(store.index)!r}, the build began on {part.digest!r}); run the "
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
