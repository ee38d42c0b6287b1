"""Levanter's reader in figure 9: the same documents as the figure's first store, in a Levanter
cache (written by Levanter's own ``SerialCacheWriter``: int64 ids, TensorStore zarr3), read by
Levanter's own pipeline with its defaults, on local disk and from the same S3 and GCS emulators
through the same `FaultProxy` (``docs/measurements/token-path.md``, "From an object store").

Levanter's pipeline is what ``train_lm`` builds from a data section with one cached component:
``LmDataConfig.train_set`` (its default block shuffle, its mixture of one) and Levanter's
``DataLoader`` (its default prefetch of 32 batches) on the figure's mesh, rows of the figure's
``seq_len`` cut as its ``TokenSeqDataset`` cuts them (concatenate, then split: the job of psdp's
``TokenSequences`` row). Levanter reads a cache's arrays with TensorStore and its ledger with
fsspec (s3fs, gcsfs); `endpoint` points both at the proxy while it reads.

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
from unittest import mock

import jax
import numpy as np

from psdp import DocumentStore
from psdp.sources.stores.location import GCS_ENDPOINT_VARIABLE
from psdp.tools.benchmarks.object_store import GCS_ENVIRONMENT
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
    "time; on S3 and GCS its arrays (TensorStore) and its ledger (s3fs, gcsfs) go through the "
    "same proxy as psdp's"
)
#: The path of the cache in an emulator's bucket (its ``train`` split inside).
CACHE_PATH = "levanter/a"
#: The variable of the bearer token TensorStore's gcs driver sends (`GCS_ENVIRONMENT`'s one
#: key), which gcsfs is given too.
GCS_TOKEN_VARIABLE = next(iter(GCS_ENVIRONMENT))
#: Documents per batch written to the cache, as a cache builder appends them.
WRITE_BATCH = 1024


def installed() -> bool:
    """Whether Levanter (``marin-levanter``) imports here."""
    try:
        import levanter  # noqa: F401
    except ImportError:
        return False
    return True


def cache_url(server: Any) -> str:
    """The URL of the figure's Levanter cache in ``server``'s bucket (an `S3Server` or a
    `GcsServer`): ``s3://`` or ``gs://``, as Levanter names a cache in either store.

    Examples:
        >>> from psdp.tools.benchmarks.object_store import S3Server
        >>> cache_url(S3Server(bucket="corpus"))  # not started: only its bucket and kind
        's3://corpus/levanter/a'
    """
    scheme = {"s3": "s3", "gcs": "gs"}[server.kvstore("")["driver"]]
    return f"{scheme}://{server.bucket}/{CACHE_PATH}"


@contextlib.contextmanager
def endpoint(url: str, at: str) -> Iterator[None]:
    """Levanter's reads and writes of the object-store URL ``url`` sent to ``at`` (an
    emulator's endpoint, or a proxy's in front of it) inside, what was set before after.

    ``s3://``: ``AWS_ENDPOINT_URL``, which Levanter passes to TensorStore and s3fs reads.
    ``gs://``: ``TENSORSTORE_GCS_HTTP_URL`` for the arrays (TensorStore's gcs driver), and for
    the ledger (gcsfs) fsspec's defaults for ``gs``: ``endpoint_url`` and the bearer token that
    TensorStore sends (``GOOGLE_AUTH_TOKEN_FOR_TESTING``, set by `GcsServer`), so that gcsfs
    looks for no Google credentials (its default search asks a metadata server). Levanter's
    filesystems made before are dropped on the way in and out: an instance that fsspec keeps
    would still send to the endpoint it was made for."""
    import fsspec

    if url.startswith("s3://"):
        variables, defaults = {"AWS_ENDPOINT_URL": at}, {}
    else:
        from google.oauth2.credentials import Credentials  # gcsfs's, Levanter's dependency

        if GCS_TOKEN_VARIABLE not in os.environ:
            raise RuntimeError(
                f"Levanter's reads of {url} need the emulator's token in {GCS_TOKEN_VARIABLE}, "
                "which is not set; open the endpoint inside a started GcsServer (it sets it)"
            )
        variables = {GCS_ENDPOINT_VARIABLE: at}
        # an object: given the token as a string, gcsfs would look up its expiry online
        token = Credentials(os.environ[GCS_TOKEN_VARIABLE])
        defaults = {"gs": {"endpoint_url": at, "token": token}}
    with (
        mock.patch.dict(os.environ, variables),
        mock.patch.dict(fsspec.config.conf, defaults),
        no_metadata_server(),
    ):
        fresh_filesystems(url)
        try:
            yield
        finally:
            fresh_filesystems(url)


@contextlib.contextmanager
def no_metadata_server() -> Iterator[None]:
    """Levanter's gs:// filesystem (rigging's cross-region guard) asks the GCE metadata server
    (``metadata.google.internal``) for the VM's region: inside, it is told there is none, which
    is what the request would find off Google Cloud, without sending it. Its guard is then off,
    as on any machine whose region is unknown; no read changes."""
    try:
        import rigging.filesystem  # noqa: F401  (Levanter's filesystems; absent before it)
    except ImportError:
        yield
        return
    with mock.patch("rigging.filesystem.region_from_metadata", return_value=None):
        yield


def fresh_filesystems(url: str) -> None:
    """Drops the fsspec filesystems of ``url``'s protocol that fsspec keeps for reuse, so that
    the next is made anew, as on a new host, with the endpoint set now."""
    import fsspec

    fsspec.get_filesystem_class(fsspec.utils.get_protocol(url)).clear_instance_cache()


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
    fresh_filesystems(root)  # and fsspec's filesystems, with their listings
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


def write_remote_cache(store: DocumentStore, server: Any) -> str:
    """``store``'s documents as a Levanter cache in ``server``'s bucket (an `S3Server` or a
    `GcsServer`, written straight to it), and its URL."""
    root = cache_url(server)
    with endpoint(root, server.endpoint):
        write_cache(store, root)
    return root


def remote_row(root: str, proxy: Any, **measures: Any) -> dict[str, Any]:
    """The figure's row of Levanter's pipeline on the cache at the ``s3://`` or ``gs://`` URL
    ``root``, read through ``proxy`` (a `FaultProxy` in front of the server)."""
    with endpoint(root, proxy.endpoint):
        return measure(root, proxy, **measures)
