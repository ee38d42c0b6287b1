"""Levanter's reader in figure 9: the same documents as the figure's first store, in a Levanter
cache (written by Levanter's own ``SerialCacheWriter``: int64 ids, TensorStore zarr3), read by
Levanter's own pipeline with its defaults, on local disk and from the same S3 emulator through
the same `FaultProxy` (``docs/measurements/token-path.md``, "From an object store").

Levanter's pipeline is what ``train_lm`` builds from a data section with one cached component:
``LmDataConfig.train_set`` (its default block shuffle, its mixture of one) and Levanter's
``DataLoader`` (its default prefetch of 32 batches) on the figure's mesh, rows of the figure's
``seq_len`` cut as its ``TokenSeqDataset`` cuts them (concatenate, then split: the job of psdp's
``TokenSequences`` row). Levanter reads ``s3://`` URLs from ``AWS_ENDPOINT_URL`` (TensorStore's
spec and fsspec's), so that variable points at the proxy while it reads.

Levanter is optional: `installed` says whether it is here, and the figure leaves these rows out
(and says so) where it is not.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from psdp import DocumentStore
from psdp.tools.benchmarks.stall import stall_run

#: The job's name in the figure's rows.
JOB = "Levanter's loader (its defaults)"
#: Why the rows are missing, in the figure's note, where Levanter is not installed.
NOT_INSTALLED = (
    "Levanter is not installed here, so its rows are left out (pip install 'psdp[levanter]' in "
    "an environment of its own: docs/guides/levanter.md)"
)
#: What the figure's note says of these rows, where Levanter is installed.
ROWS_NOTE = (
    f"{JOB}: the first store's documents in a Levanter cache (int64 ids, as Levanter writes "
    "them), read by LmDataConfig.train_set (its block shuffle) and Levanter's DataLoader "
    "(prefetch 32); its requests and KiB per step are those of each step's rows read one at a "
    "time; on S3 only (Levanter's gs:// path, gcsfs for the ledger, is not pointed at the GCS "
    "emulator here)"
)
#: The S3 path of the cache in the emulator's bucket (its ``train`` split inside).
S3_ROOT = "levanter/a"
#: Documents per batch written to the cache, as a cache builder appends them.
WRITE_BATCH = 1024


def installed() -> bool:
    """Whether Levanter (``marin-levanter``) imports here."""
    try:
        import levanter  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def s3_endpoint(endpoint: str) -> Iterator[None]:
    """``AWS_ENDPOINT_URL`` set to ``endpoint`` (moto's own, or a proxy's) for Levanter's reads
    and writes of ``s3://`` URLs, then put back."""
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved


def write_cache(store: DocumentStore, root: str) -> None:
    """``store``'s documents, in order, as the ``train`` split of a Levanter cache at ``root``
    (a folder or an ``s3://`` URL), written by Levanter's ``SerialCacheWriter``."""
    from levanter.store.cache import SerialCacheWriter

    exemplar = {"input_ids": np.zeros((0,), dtype=np.int64)}
    with SerialCacheWriter(f"{root}/train", exemplar) as writer:
        for first in range(0, store.num_documents, WRITE_BATCH):
            last = min(first + WRITE_BATCH, store.num_documents)
            offsets = store.offsets_range(first, last + 1)
            starts, stops = offsets[:-1], offsets[1:]
            flat = store.read_ranges(starts, stops, ["input_ids"])["input_ids"]
            documents = np.split(flat.astype(np.int64), np.cumsum(stops - starts)[:-1])
            writer.write_batch([{"input_ids": d} for d in documents])


def tokenizer_folder(tokenizer_json: Path) -> str:
    """The figure's ``tokenizer.json`` as a folder Levanter's data config loads (its
    ``tokenizer:`` takes a Hugging Face name or folder), beside it."""
    from transformers import PreTrainedTokenizerFast

    folder = tokenizer_json.parent / "levanter-tokenizer"
    PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json)).save_pretrained(str(folder))
    return str(folder)


def measure(
    root: str, proxy: Any, tokenizer: str, seq_len: int, batch: int, steps: int,
    stall_steps: int, mesh: Any, step_ms: tuple[float, ...], seed: int,
) -> dict[str, Any]:  # fmt: skip
    """The figure's columns for Levanter's pipeline over the cache at ``root``: requests and
    KiB per step at ``proxy`` (``None``: a local cache) while steps ``1..steps`` are read one at
    a time after step 0 (the rows each step's batch reads, as Levanter's loader asks its
    dataset for them); tokens/s through Levanter's loader with no trainer; the wait behind each
    simulated step of ``step_ms``. Every measure starts as a fresh host (a fresh TensorStore
    cache)."""
    with _pipeline(root, tokenizer, seq_len, batch, mesh, seed) as (dataset, _):
        rows = dataset.as_sync_dataset()
        rows.get_batch(list(range(batch)))  # start-up: the ledger, the offsets, connections
        if proxy is not None:
            proxy.reset()
        for step in range(1, steps + 1):
            rows.get_batch(list(range(step * batch, (step + 1) * batch)))
        requests = 0 if proxy is None else sum(proxy.requests.values())
        received = 0 if proxy is None else proxy.bytes_sent
    with _pipeline(root, tokenizer, seq_len, batch, mesh, seed) as (_, loader):
        it = _Closing(loader.iter_from_step(0))
        jax.block_until_ready(next(it))
        started = time.perf_counter()
        for _ in range(steps):
            jax.block_until_ready(next(it))
        seconds = time.perf_counter() - started
        it.close()
    row: dict[str, Any] = {
        "requests_per_step": requests / steps,
        "kib_per_step": received / steps / 1024,
        "mtokens_per_s": steps * batch * seq_len / seconds / 1e6,  # every row is full
    }
    for ms in step_ms:
        with _pipeline(root, tokenizer, seq_len, batch, mesh, seed) as (_, loader):
            as_psdp: Any = _AsPsdp(loader)  # the one method stall_run calls, not a DataLoader
            row[f"wait_{ms:g}ms"] = stall_run(as_psdp, ms / 1e3, stall_steps)["wait_fraction"]
    return row


@contextlib.contextmanager
def _pipeline(
    root: str, tokenizer: str, seq_len: int, batch: int, mesh: Any, seed: int
) -> Iterator[tuple[Any, Any]]:
    """Levanter's training dataset of the cache at ``root`` and its ``DataLoader``, as
    ``train_lm`` builds them, in a fresh TensorStore cache."""
    import haliax as hax
    from levanter.data.loader import DataLoader
    from levanter.data.text.datasets import DatasetComponent, LmDataConfig
    from levanter.schedule import BatchSchedule
    from levanter.store import jagged_array

    # Levanter keeps one TensorStore context (its cache) per process: a new host starts empty
    jagged_array._READ_CONTEXT = None
    data = LmDataConfig(
        tokenizer=tokenizer, cache_dir=None,
        components={"a": DatasetComponent(cache_dir=root)}, train_weights={"a": 1.0},
    )  # fmt: skip
    Pos = hax.Axis("position", seq_len)
    dataset = data.train_set(Pos, BatchSchedule(batch), key=jax.random.PRNGKey(seed))
    mapping = {"batch": mesh.axis_names[0]}
    yield dataset, DataLoader(dataset, batch, mesh=mesh, axis_resources=mapping)


class _AsPsdp:
    """Levanter's loader with the one method `stall_run` calls (``iter_from``)."""

    def __init__(self, loader: Any):
        self._loader = loader

    def iter_from(self, step: int) -> Any:
        return _Closing(self._loader.iter_from_step(step))


class _Closing:
    """Levanter's iterator with the ``close`` that `stall_run` calls: it stops the iterator's
    background reader (Levanter's iterator has no public stop; left running, it would go on
    reading up to 64 batches ahead through the next setting's measures)."""

    def __init__(self, batches: Any):
        self._batches = batches

    def __iter__(self) -> _Closing:
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def close(self) -> None:
        background = getattr(self._batches, "_batches", None)
        if background is not None and hasattr(background, "stop"):
            background.stop()


def local_row(store: DocumentStore, workdir: Path, **measures: Any) -> dict[str, Any]:
    """The figure's row of Levanter's pipeline on a local cache of ``store``'s documents
    (``measures``: `measure`'s arguments but ``root`` and ``proxy``)."""
    root = str(workdir / "levanter-a")
    write_cache(store, root)
    return measure(root, None, **measures)


def write_s3_cache(store: DocumentStore, server: Any) -> str:
    """``store``'s documents as a Levanter cache in ``server``'s bucket (an `S3Server`, written
    straight to it), and its URL."""
    root = f"s3://{server.bucket}/{S3_ROOT}"
    with s3_endpoint(server.endpoint):
        write_cache(store, root)
    return root


def s3_row(root: str, proxy: Any, **measures: Any) -> dict[str, Any]:
    """The figure's row of Levanter's pipeline on the S3 cache at ``root``, read through
    ``proxy`` (a `FaultProxy` in front of the server)."""
    with s3_endpoint(proxy.endpoint):
        return measure(root, proxy, **measures)
