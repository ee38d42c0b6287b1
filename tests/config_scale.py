"""`DataConfig.build` on every host of a simulated pod over a store of 10^9 documents that is never
written (``docs/measurements/scale.md``, "The config path at 10^9 documents").

The store is a prepared store as a host finds it: its document index (`index-<D>.npz`, as ``psdp
prepare`` commits it) and its pack index (``psdp-index/pack-*.npz``, as ``psdp index`` builds it)
are real files in a directory, written once here; its offsets and tokens are computed from
`tests.packing_oracle.FormulaCorpus` (document lengths repeat every window, so the pack index's
counts are one window's, planned once). ``DocumentStore.open`` of that directory gives the
formula's arrays behind a counter: every read of an array (one range) and of an index file is one
request, its bytes counted, as an object store would see them.

Each host of a ``data=H x model=2`` pod (`tests.fake_hosts.fake_pod`, host ``p`` owning data row
``p``) builds the config's loader (``DataConfig.build``) and reads its first batch; the loader's
agreement call is recorded, not made (one process has no peers). Run it in a process with at
least ``2 * H`` CPU devices: ``python -m tests.config_scale DIR packed 2 64`` prints the figures
as JSON (``scripts/measure/config_scale.py`` prints them as a table, with times and memory).
"""

from __future__ import annotations

import gc
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import jax
import numpy as np
from jax.sharding import Mesh

from psdp import DataConfig, DocumentStore, OrderOptions
from psdp._integration.source_config import SourceConfig
from psdp._integration.view_config import ViewConfig
from psdp._plan.pack_windows import PackIndex, window_counts
from psdp._plan.packing import plan_window, segment_lengths
from psdp.sources.documents.beside import IndexFolder, PackSettings, store_digest
from psdp.sources.documents.index import STRIDE, DocumentIndex
from psdp.sources.documents.parts import index_key
from psdp.sources.views.pack_index import pack_index_bytes
from tests.fake_hosts import fake_pod, host_batch
from tests.packing_oracle import FormulaCorpus

DOCUMENTS = 10**9
SEQ_LEN, WINDOW = 2048, 4096
ROWS_PER_HOST = 4


class Requests:
    """What one host asked of the store: requests and bytes, by what was read."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def add(self, what: str, size: int) -> None:
        self.count[what] += 1
        self.bytes[what] += size


class CountedArray:
    """A flat array of the formula whose every ``[start:stop]`` is one counted request."""

    def __init__(self, length: int, dtype: Any, values: Any, what: str, requests: Requests):
        self.shape, self.dtype = (length,), np.dtype(dtype)
        self._values, self._what, self._requests = values, what, requests

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        self._requests.add(self._what, (stop - start) * self.dtype.itemsize)
        return self._values(np.arange(start, max(start, stop))).astype(self.dtype)


def document_index(corpus: FormulaCorpus) -> DocumentIndex:
    docs = np.minimum(np.arange(-(-corpus.documents // STRIDE) + 1) * STRIDE, corpus.documents)
    longest = int(corpus.period_lengths.max())
    return DocumentIndex(corpus.documents, STRIDE, corpus.offsets(docs), docs, longest)


def write_store(directory: Path, documents: int = DOCUMENTS) -> dict[str, int]:
    """The store's index files in ``directory``: its document index and the pack index of
    `SEQ_LEN` and `WINDOW`. Returns their sizes."""
    corpus = FormulaCorpus(documents, period=WINDOW)
    directory.mkdir(parents=True, exist_ok=True)
    index = document_index(corpus)
    index.save(directory / index_key(documents))
    settings = PackSettings(SEQ_LEN, WINDOW)
    key = settings.key(documents, corpus.num_tokens)

    def counts(n: int) -> tuple[int, int, int, int]:
        lengths = segment_lengths(corpus.offsets(np.arange(n + 1)), False)
        return window_counts(plan_window(lengths, SEQ_LEN, "best_fit", "split", None,
                                         window=WINDOW, index=0))  # fmt: skip

    table = np.tile(counts(WINDOW), (key.num_windows, 1))
    if documents % WINDOW:
        table[-1] = counts(documents % WINDOW)
    packed = PackIndex.from_counts(key, table)
    IndexFolder(str(directory)).write(
        settings.file_name, pack_index_bytes(packed, store=store_digest(index))
    )
    return {
        "document_index_bytes": (directory / index_key(documents)).stat().st_size,
        "pack_index_bytes": len(pack_index_bytes(packed, store=store_digest(index))),
    }


def opener(directory: Path, requests: Requests, documents: int) -> Any:
    """``DocumentStore.open`` of ``directory``: the formula's arrays, counted, with the document
    index read from its file (one request), as a prepared store is opened."""
    corpus = FormulaCorpus(documents, period=WINDOW)
    real_open = DocumentStore.open.__func__  # type: ignore[attr-defined]

    def open_store(cls: type[DocumentStore], path: Any, **options: Any) -> DocumentStore:
        if str(path) != str(directory):
            return real_open(cls, path, **options)
        data = (directory / index_key(documents)).read_bytes()
        requests.add("document index", len(data))
        offsets = CountedArray(documents + 1, np.int64, corpus.offsets, "offsets", requests)
        tokens = CountedArray(corpus.num_tokens, np.int32, corpus.tokens, "tokens", requests)
        index = DocumentIndex.load(io.BytesIO(data))
        return DocumentStore(
            offsets, {"input_ids": tokens}, name=str(directory), index=index, spot_check=False
        )

    return classmethod(open_store)


def counted_index_files(requests: Requests) -> Any:
    real = IndexFolder.read

    def read(self: IndexFolder, name: str) -> bytes | None:
        data = real(self, name)
        requests.add("pack index", len(data or b""))
        return data

    return read


def config(directory: Path, kind: str, hosts: int) -> DataConfig:
    view = ViewConfig(packing="best_fit", window=WINDOW) if kind == "packed" else ViewConfig()
    return DataConfig(
        sources={"web": SourceConfig(store=str(directory))},
        seq_len=SEQ_LEN,
        view=view,
        order=OrderOptions(global_batch_size=ROWS_PER_HOST * hosts),
    )


def pod(directory: Path, kind: str, hosts: int, documents: int = DOCUMENTS) -> list[dict]:
    """Per host of an ``H``-host pod: its requests and bytes at ``DataConfig.build`` and at its
    first batch, what it holds of the indexes, and its times and memory (not to be asserted)."""
    devices = np.array(jax.devices()[: 2 * hosts]).reshape(hosts, 2)
    mesh = Mesh(devices, ("data", "model"))
    layout = np.repeat(np.arange(hosts), 2).reshape(hosts, 2)
    requests = Requests()
    current = [0]
    results = []
    with (
        fake_pod(mesh, layout) as process_of,
        mock.patch("psdp._runtime.loader.check_own_process", lambda _layout, _p: current[0]),
        mock.patch("psdp._runtime.loader.agree", lambda *a, **k: None),
        mock.patch.object(DocumentStore, "open", opener(directory, requests, documents)),
        mock.patch.object(IndexFolder, "read", counted_index_files(requests)),
    ):
        the_config = config(directory, kind, hosts)
        for host in range(hosts):
            current[0] = host
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
            before = _rss()
            requests.count.clear()
            requests.bytes.clear()
            started = time.perf_counter()
            with the_config.build(mesh) as loader:
                built_s = time.perf_counter() - started
                built = dict(requests.count), dict(requests.bytes)
                held = _held(loader.source.sources["web"])
                requests.count.clear()
                requests.bytes.clear()
                batch = host_batch(loader, 0, process_of)
                first_s = time.perf_counter() - started - built_s
                rows = sum(len(s) for s in batch["input_ids"].shards.values())
            results.append({
                "host": host, "build_requests": built[0], "build_bytes": built[1],
                "held_bytes": held, "first_batch_requests": sum(requests.count.values()),
                "first_batch_rows": rows, "build_s": built_s, "first_batch_s": first_s,
                "peak_added_bytes": _peak() - before,
            })  # fmt: skip
    return results


def _held(view: Any) -> dict[str, int]:
    """The bytes of the indexes a host keeps: the document index, and a pack index's arrays."""
    index = view.store.index
    out = {"document_index": int(index.marks.nbytes + index.nonempty.nbytes)}
    plan = getattr(view, "plan", None)
    if isinstance(plan, PackIndex):
        out["pack_index"] = int(
            sum(getattr(plan, n).nbytes for n in ("starts", "tokens", "dropped", "empty"))
        )
    return out


def _status(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) * 1024


def _rss() -> int:
    """Resident memory now (the corpus is computed, never mapped: no file's pages in it)."""
    return _status("VmRSS")


def _peak() -> int:
    """The resident peak since the last ``clear_refs`` (which resets it to the resident now)."""
    return _status("VmHWM")


def main(argv: list[str]) -> None:
    directory, kinds, pods = Path(argv[0]), argv[1].split(","), [int(n) for n in argv[2:]]
    sizes = write_store(directory)
    out = [{"kind": kind, "hosts": hosts, "store": sizes, "startups": pod(directory, kind, hosts)}
           for kind in kinds for hosts in pods]  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
