"""A document store's pack index (`PackIndex`): built by planning every window once, in a pool
of processes, saved to a file, and loaded only when its key matches (``docs/guides/packing.md``,
"Packing in windows").

Building reads the offsets in chunks of whole windows (`DocumentStore.offsets_range`), so its
memory stays bounded whatever the corpus; each window's plan is reduced to its counts at once.
The index itself and the plans, pure: ``psdp/_plan/pack_windows.py``, ``psdp/_plan/packing.py``;
the source that reads by them: ``packed.py``.
"""

from __future__ import annotations

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

from psdp._plan.pack_windows import PackIndex, PackKey, window_counts
from psdp._plan.packing import PackPlan, plan_window, segment_lengths
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
    save_pack_index(index, path)
    return index, False


def save_pack_index(index: PackIndex, path: Any) -> None:
    """Writes ``index`` to ``path`` atomically (a reader sees the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "version": VERSION, "key": index.key.as_dict()}
    arrays = {name: getattr(index, name) for name in ("starts", "tokens", "dropped", "empty")}
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staging, "wb") as file:
        np.savez(file, header=np.array(json.dumps(header)), **arrays)
    os.replace(staging, path)


def load_pack_index(path: Any) -> PackIndex | None:
    """The index saved at ``path``, or ``None`` if there is no file; a file that is not a psdp
    pack index of this version is an error (it is never overwritten)."""
    path = Path(path)
    if not path.exists():
        return None
    fix = "give another path for the index, or delete the file to build the index there"
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as saved:
            header = json.loads(str(saved["header"]))
            arrays = {name: saved[name] for name in ("starts", "tokens", "dropped", "empty")}
        got = (header.get("format"), header.get("version"))
        key = PackKey(**header["key"]) if got == (FORMAT, VERSION) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} is not a psdp pack index ({error}); {fix}") from error
    if key is None:
        raise ValueError(
            f"{path} is not a psdp pack index of version {VERSION} (it says {got}); {fix}"
        )
    return PackIndex(key, **arrays)


def _plan(lengths: np.ndarray, key: PackKey, w: int) -> PackPlan:
    return plan_window(lengths, key.seq_len, key.strategy, key.long_documents, key.seed,
                       window=key.window, index=w)  # fmt: skip


def _counts(lengths: np.ndarray, key: PackKey, w: int) -> tuple[int, int, int, int]:
    """One window's `COUNTS` (run in a worker process)."""
    return window_counts(_plan(lengths, key, w))


def _windows(store: DocumentStore, key: PackKey) -> Iterator[tuple[int, np.ndarray]]:
    """Every window's lengths, in order, from one offsets read per chunk of windows."""
    per_chunk = max(1, CHUNK_OFFSETS // key.window)
    for chunk in range(0, key.num_windows, per_chunk):
        last = min(chunk + per_chunk, key.num_windows) - 1
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
