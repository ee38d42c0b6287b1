"""A document store's pack index (`PackIndex`): built by planning every window once, in a pool
of processes, saved to a file, and loaded only when its key matches (``docs/guides/packing.md``,
"Packing in windows").

Building reads the offsets in chunks of whole windows (`DocumentStore.offsets_range`), so its
memory stays bounded whatever the corpus; each window's plan is reduced to its counts at once.
The index itself and the plans, pure: ``psdp/_plan/pack_windows.py``, ``psdp/_plan/packing.py``;
the source that reads by them: ``packed.py``.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import zipfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from psdp._plan.pack_windows import COUNTS, PackIndex, PackKey, window_counts
from psdp._plan.packing import PackPlan, plan_window, segment_lengths
from psdp.sources.documents.beside import (
    IN_MEMORY_DOCUMENTS,
    IndexFolder,
    PackSettings,
    index_command,
    store_digest,
)
from psdp.sources.documents.store import DocumentStore

#: What a pack index file says it is, and its layout's version.
FORMAT, VERSION = "psdp.pack_index", 1
#: Offsets read at a time while building (8 MiB of int64): whole windows, at least one.
CHUNK_OFFSETS = 1 << 20
#: A worker process takes 1-2 s to start (it imports psdp), the time to plan about 2-3 million
#: documents: fewer documents than this per worker are planned faster in this process.
DOCUMENTS_PER_WORKER = 4_000_000


def plan_of_window(store: DocumentStore, key: PackKey, w: int) -> tuple[PackPlan, np.ndarray]:
    """Window ``w``'s plan and its offsets (``offsets[first:stop + 1]``): one range read."""
    first, stop = key.documents(w)
    offsets = store.offsets_range(first, stop + 1)
    return _plan(segment_lengths(offsets, key.eos), key, w), offsets


def build_pack_index(
    store: DocumentStore, key: PackKey, *, workers: int | None = None, progress: bool = True
) -> PackIndex:
    """Plans every window of ``store`` once and keeps their counts.

    Args:
        store: the documents (its size must be ``key``'s).
        key: the packing.
        workers: processes that plan windows; ``None``: one per CPU, but no more than one per
            `DOCUMENTS_PER_WORKER` documents (1: all in this process).
        progress: show a progress bar when building takes more than a second.
    """
    if workers is None:
        workers = min(os.cpu_count() or 1, key.num_documents // DOCUMENTS_PER_WORKER)
    bar = tqdm(total=key.num_windows, unit="windows", desc="pack index", disable=not progress,
               delay=1.0)  # fmt: skip
    with bar:
        if workers <= 1:
            counts = [_counts(lengths, key, w) for w, lengths in _windows(store, key)]
            bar.update(len(counts))
        else:
            # spawn: a forked child of a process running JAX's threads may deadlock
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                counts = _in_pool(pool, workers, store, key, bar)
    return PackIndex.from_counts(key, counts)


def open_pack_index(
    store: DocumentStore, key: PackKey, path: Any, *, workers: int | None = None
) -> tuple[PackIndex, bool]:
    """The index at ``path`` if it was built for ``key``; otherwise one built now and saved
    there (replacing a stale one). Returns it and whether it was loaded."""
    path = Path(path)
    index = load_pack_index(path)
    if index is not None and index.key == key:
        return index, True
    index = build_pack_index(store, key, workers=workers)
    save_pack_index(index, path, store=store_digest(store.index, store.written))
    return index, False


def save_pack_index(index: PackIndex, path: Any, *, store: str | None = None) -> None:
    """Writes ``index`` to ``path`` atomically (a reader sees the old file or the new one), with
    ``store``: what the store it indexes is (`psdp.sources.views.store_indexes.store_digest`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_bytes(pack_index_bytes(index, store=store))
    os.replace(staging, path)


def pack_index_bytes(index: PackIndex, *, store: str | None = None) -> bytes:
    """``index`` as the bytes of a pack index file (``.npz``), with ``store`` in its header."""
    header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "key": index.key.as_dict()}
    if store is not None:
        header["store"] = store
    arrays = {name: getattr(index, name) for name in ("starts", "tokens", "dropped", "empty")}
    body = io.BytesIO()
    np.savez(body, header=np.array(json.dumps(header)), **arrays)
    return body.getvalue()


def load_pack_index(path: Any) -> PackIndex | None:
    """The index saved at ``path``, or ``None`` if there is no file; a file that is not a psdp
    pack index of this version is an error (it is never overwritten)."""
    path = Path(path)
    if not path.exists():
        return None
    fix = "give another path for the index, or delete the file to build the index there"
    return read_pack_index(path.read_bytes(), str(path), fix)[0]


def read_pack_index(data: bytes, where: str, fix: str) -> tuple[PackIndex, str | None]:
    """The index in ``data`` (a pack index file's bytes, from ``where``) and the store its
    header names (``None``: a file saved without one); anything else is a `ValueError` ending
    in ``fix``."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as saved:
            header = json.loads(str(saved["header"]))
            arrays = {name: saved[name] for name in ("starts", "tokens", "dropped", "empty")}
        got = (header.get("format"), header.get("version"))
        key = PackKey(**header["key"]) if got == (FORMAT, VERSION) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as error:
        raise ValueError(f"{where} is not a psdp pack index ({error}); {fix}") from error
    if key is None:
        raise ValueError(
            f"{where} is not a psdp pack index of version {VERSION} (it says {got}); {fix}"
        )
    store = header.get("store")
    return PackIndex(key, **arrays), store if isinstance(store, str) else None


def _plan(lengths: np.ndarray, key: PackKey, w: int) -> PackPlan:
    return plan_window(lengths, key.seq_len, key.strategy, key.long_documents, key.seed,
                       window=key.window, index=w, max_segments=key.max_segments)  # fmt: skip


def _counts(lengths: np.ndarray, key: PackKey, w: int) -> tuple[int, int, int, int]:
    """One window's `COUNTS` (run in a worker process)."""
    return window_counts(_plan(lengths, key, w))


def counts_of_windows(store: DocumentStore, key: PackKey, first: int, stop: int) -> np.ndarray:
    """The `COUNTS` of windows ``[first, stop)``, one int64 row per window, planned in this
    process (a part of a pack index, as ``psdp index`` builds it in parallel)."""
    rows = [_counts(lengths, key, w) for w, lengths in _windows(store, key, first, stop)]
    return np.asarray(rows, np.int64).reshape(-1, len(COUNTS))


def _windows(
    store: DocumentStore, key: PackKey, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """Windows ``[start, end)``'s lengths (default every window), in order, from one offsets
    read per chunk of windows."""
    end = key.num_windows if end is None else end
    per_chunk = max(1, CHUNK_OFFSETS // key.window)
    for chunk in range(start, end, per_chunk):
        last = min(chunk + per_chunk, end) - 1
        first = key.documents(chunk)[0]
        offsets = store.offsets_range(first, key.documents(last)[1] + 1)
        for w in range(chunk, last + 1):
            a, b = (d - first for d in key.documents(w))
            yield w, segment_lengths(offsets[a : b + 1], key.eos)


def _in_pool(
    pool: Executor, workers: int, store: DocumentStore, key: PackKey, bar: tqdm
) -> list[tuple[int, int, int, int]]:
    """The windows' counts, planned in ``pool``, with a bounded number of windows in flight
    (so the lengths read ahead stay a few windows' worth)."""
    counts: list[tuple[int, int, int, int]] = []
    flight: deque[Future[tuple[int, int, int, int]]] = deque()
    for w, lengths in _windows(store, key):
        if len(flight) >= 4 * workers:
            counts.append(flight.popleft().result())
            bar.update()
        flight.append(pool.submit(_counts, lengths, key, w))
    for future in flight:
        counts.append(future.result())
        bar.update()
    return counts


def pack_index_beside(
    where: Any, store: DocumentStore, settings: PackSettings, *, format: str = "psdp"
) -> PackIndex | None:
    """The pack index ``psdp index`` built beside the store at ``where`` for ``settings``,
    checked: built for this packing of this store as it is now (`store_digest`). ``None`` when
    it is missing and the store is small (`IN_MEMORY_DOCUMENTS`: the caller builds it).

    Raises:
        FileNotFoundError: it is missing and the store is larger: it names the command that
            builds it (every host building it at start-up would take minutes to hours).
        ValueError: the file there is not a pack index, or is stale (built for other settings,
            another store, or this store before it changed); it names the command that
            rebuilds it.
    """
    folder = IndexFolder(where)
    command = index_command(where, format, (settings,))
    data = folder.read(settings.file_name)
    if data is None:
        if store.num_documents <= IN_MEMORY_DOCUMENTS:
            return None
        raise FileNotFoundError(
            f"no pack index beside {store.name} for {settings.flags()} "
            f"({folder.where(settings.file_name)}): a packing in windows of {store.num_documents:,}"
            f" documents (more than {IN_MEMORY_DOCUMENTS:,}) would plan all its "
            f"{-(-store.num_documents // settings.window):,} windows at start-up on every host; "
            f"build the index once with `{command}`"
        )
    fix = f"build it again with `{command}` (it replaces the file)"
    index, built_for = read_pack_index(data, folder.where(settings.file_name), fix)
    want = settings.key(store.num_documents, store.num_tokens)
    if index.key != want:
        got, now = index.key.as_dict(), want.as_dict()
        differ = {k: (got[k], now[k]) for k in now if got[k] != now[k]}
        raise ValueError(
            f"the pack index {folder.where(settings.file_name)} is stale: it was built for "
            + ", ".join(f"{k}={a!r}" for k, (a, _) in differ.items())
            + ", but the store and the config have "
            + ", ".join(f"{k}={b!r}" for k, (_, b) in differ.items())
            + f"; {fix}"
        )
    digest = store_digest(store.index, store.written)
    if built_for is None:
        raise ValueError(
            f"the pack index {folder.where(settings.file_name)} records no store (it was saved "
            f"without store=, so nothing tells it was built for {store.name} as it is now); {fix}"
            ", or save it with save_pack_index_beside"
        )
    if built_for != digest:
        raise ValueError(
            f"the pack index {folder.where(settings.file_name)} was built for another store, or "
            f"for this one before it changed: it records store {built_for!r}, but {store.name} "
            f"is {digest!r} (its size, document index and write); {fix}"
        )
    return index


def save_pack_index_beside(where: Any, store: DocumentStore, index: PackIndex) -> str:
    """Saves ``index``, a pack index of ``store`` computed elsewhere (e.g. by
    `build_pack_index`), beside the store at ``where`` (a path, URL or kvstore spec), where
    `pack_index_beside` and a `DataConfig` find it, recording the store (`store_digest`).
    ``psdp index`` does this itself. Returns the file it wrote.

    Examples:
        >>> import tempfile
        >>> from psdp import DocumentStore, write_documents
        >>> where = f"{tempfile.mkdtemp()}/store"
        >>> _ = write_documents(where, [np.arange(1, n + 1) for n in [3, 5, 2, 6]], progress=False)
        >>> store = DocumentStore.open(where)
        >>> key = PackSettings(8, window=2).key(store.num_documents, store.num_tokens)
        >>> save_pack_index_beside(where, store, build_pack_index(store, key)).rsplit("/", 2)[1:]
        ['psdp-index', 'pack-8-2-best_fit-split-noseed.npz']
        >>> len(pack_index_beside(where, store, PackSettings(8, window=2)))  # one a window
        2
    """
    key = index.key
    settings = PackSettings(key.seq_len, key.window, key.strategy, key.long_documents, key.seed,
                            eos=key.eos, max_segments=key.max_segments)  # fmt: skip
    if (key.num_documents, key.num_tokens) != (store.num_documents, store.num_tokens):
        raise ValueError(
            f"the pack index is of {key.num_documents} documents and {key.num_tokens} tokens, "
            f"but {store.name} holds {store.num_documents} and {store.num_tokens}; save the index "
            "of this store (build_pack_index(store, key))"
        )
    folder = IndexFolder(where)
    folder.write(
        settings.file_name, pack_index_bytes(index, store=store_digest(store.index, store.written))
    )
    return folder.where(settings.file_name)
