"""Many hosts' start-up in one process, on the local S3 server: what each host of an N-host pod asks
of the object store and of the coordination service when it opens a dataset, builds its loader
and reads its first batch (``docs/measurements/scale.md``, "Hosts").

Two phases, each exact:

1. **The store**, host after host: host ``p`` opens the dataset (a fresh TensorStore context: it
   shares no cache with the hosts before it), builds its `DataLoader` under `tests.fake_hosts`'
   `fake_pod` (a ``data=N x model=2`` mesh, host ``p`` owning data row ``p``) and reads its first
   batch's boxes with `host_batch`. A `FaultProxy` in front of moto counts every HTTP request;
   it is zeroed before each host. The host's boxes are checked against numpy rows of what was
   written. The loader's agreement call is recorded, not made (one process has no peers).
2. **The agreement**, all hosts at once: a real coordination service (JAX's, in this process on
   127.0.0.1) and one client per host, each on its own thread, replay the recorded calls through
   the real `psdp._runtime.agreement.agree`. Each client counts what it sends and receives:
   round trips, key and value bytes, and the process ids a barrier names.

Each host reads ``ROWS_PER_HOST`` rows a step (the global batch grows with the pod, as it does in
training), in file order (``shuffle=False``), so every host's first rows are one aligned block and
the store's requests per host can be compared exactly across pod sizes.

Run in a process with at least ``2 * N`` CPU devices: ``python -m tests.host_startup plain,docs 2 64``
prints the figures as JSON (``scripts/measure/host_scale.py`` prints them as a table).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import jax
import numpy as np
import tensorstore as ts
from jax.sharding import Mesh

from psdp import DataLoader
from psdp._plan.loader_plan import LoaderPlan
from psdp.sources import DocumentStore, TensorStoreSource, TokenSequences
from psdp.sources.documents.writer import write_documents
from psdp.sources.stores.writer import write_dataset
from psdp.tools.benchmarks.object_store import FaultProxy, S3Server, free_port
from tests.fake_hosts import fake_pod, host_batch

ROWS_PER_HOST = 4
SEQ_LEN = 64  # tokens per row, both datasets
MAX_HOSTS = 1024  # the datasets hold a first batch for this many hosts


# -------------------------------------------------------------------------------- the data
def plain_rows() -> np.ndarray:
    """The plain dataset: ``2 * MAX_HOSTS * ROWS_PER_HOST`` rows of ``SEQ_LEN`` int32 tokens."""
    rows = 2 * MAX_HOSTS * ROWS_PER_HOST
    return np.random.default_rng(1).integers(0, 50_000, (rows, SEQ_LEN), dtype=np.int32)


def documents() -> list[np.ndarray]:
    """The document store's documents: 1 to 200 tokens each, enough for two first batches of
    `MAX_HOSTS` hosts."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 201, 2 * MAX_HOSTS * ROWS_PER_HOST * SEQ_LEN // 100)
    return [rng.integers(0, 50_000, n, dtype=np.int32) for n in lengths]


class Datasets:
    """Both datasets written to moto once, each opened through the counting proxy, with the rows
    every opener must see (the numpy oracle: the written arrays, the documents concatenated)."""

    def __init__(self, server: S3Server, proxy: FaultProxy):
        self.plain_spec = server.kvstore("hosts/plain/", proxy.endpoint)
        self.docs_spec = server.kvstore("hosts/docs/", proxy.endpoint)
        self.plain = plain_rows()
        docs = documents()
        write_dataset(server.kvstore("hosts/plain/"), {"tokens": self.plain}, progress=False)
        write_documents(
            server.kvstore("hosts/docs/"), docs, tokens_per_shard=1 << 16, progress=False
        )
        flat = np.concatenate(docs)
        self.sequences = flat[: len(flat) // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN)

    def opener(
        self, kind: str
    ) -> tuple[Callable[[], Any], Callable[[Any], np.ndarray], np.ndarray]:
        """How a host opens dataset ``kind``, the main leaf of a batch, and the expected rows."""
        if kind == "plain":
            return (lambda: TensorStoreSource(self.plain_spec)), (lambda b: b["tokens"]), self.plain
        return (
            # a context of its own, as a host's process has (not the process's shared cache)
            lambda: TokenSequences(
                DocumentStore.open(self.docs_spec, context=ts.Context()), SEQ_LEN
            ),
            lambda b: b["input_ids"],
            self.sequences,
        )


# ---------------------------------------------------------------------- phase 1: the store
def pod_mesh(hosts: int) -> tuple[Mesh, np.ndarray]:
    """``data=hosts x model=2`` over the first devices; host ``p`` owns data row ``p``."""
    devices = np.array(jax.devices()[: 2 * hosts]).reshape(hosts, 2)
    return Mesh(devices, ("data", "model")), np.repeat(np.arange(hosts), 2).reshape(hosts, 2)


def store_startups(
    hosts: int, proxy: FaultProxy, datasets: Datasets, kind: str
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """Per host, its requests and times at start-up; and the agreement call each loader made."""
    open_source, main_leaf, expected = datasets.opener(kind)
    mesh, layout = pod_mesh(hosts)
    calls: list[tuple[Any, ...]] = []
    planning = [0.0]
    create = LoaderPlan.create

    def timed_create(*args: Any, **kwargs: Any) -> LoaderPlan:
        started = time.perf_counter()
        try:
            return create(*args, **kwargs)
        finally:
            planning[0] += time.perf_counter() - started

    def recorded_agree(*args: Any, **kwargs: Any) -> None:
        calls.append((*args, kwargs))

    results = []
    with (
        fake_pod(mesh, layout) as process_of,
        mock.patch.object(LoaderPlan, "create", timed_create),
        mock.patch("psdp._runtime.loader.agree", recorded_agree),
    ):
        for host in range(hosts):
            proxy.reset()
            planning[0] = 0.0
            started = time.perf_counter()
            source = open_source()
            opened, open_requests = time.perf_counter(), sum(proxy.requests.values())
            with DataLoader(
                source,
                mesh=mesh,
                process_index=host,
                global_batch_size=ROWS_PER_HOST * hosts,
                shuffle=False,
                prefetch=1,
            ) as loader:
                built, build_requests = time.perf_counter(), sum(proxy.requests.values())
                boxes = host_batch(loader, 0, process_of)
                read = time.perf_counter()
            rows = slice(host * ROWS_PER_HOST, (host + 1) * ROWS_PER_HOST)
            for shard in main_leaf(boxes).shards.values():  # the TP pair: the same rows each
                np.testing.assert_array_equal(shard, expected[rows])
            results.append(
                {
                    "open_requests": open_requests,
                    "build_requests": build_requests - open_requests,
                    "first_batch_requests": sum(proxy.requests.values()) - build_requests,
                    "requests_by_method": dict(proxy.requests),
                    "open_s": opened - started,
                    "build_s": built - opened,
                    "planning_s": planning[0],
                    "first_batch_s": read - built,
                }
            )
    return results, calls


# ------------------------------------------------------------------ phase 2: the agreement
class CountingClient:
    """A coordination client that counts what its host sends and receives: round trips, key and
    value bytes (UTF-8), and the process ids its barriers name."""

    def __init__(self, client: Any):
        self.client = client
        self.counts: Counter[str] = Counter()

    def _sent(self, *texts: str) -> None:
        self.counts["round_trips"] += 1
        self.counts["bytes_sent"] += sum(len(t.encode()) for t in texts)

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        self._sent(key, value)
        self.client.key_value_set(key, value, allow_overwrite)

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]:
        self._sent(key)
        got = self.client.key_value_dir_get(key)
        self.counts["bytes_received"] += sum(len(k.encode()) + len(v.encode()) for k, v in got)
        return list(got)

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        self._sent(key)
        value = str(self.client.blocking_key_value_get(key, timeout_ms))
        self.counts["bytes_received"] += len(value.encode())
        return value

    def key_value_delete(self, key: str) -> None:
        self._sent(key)
        self.client.key_value_delete(key)

    def wait_at_barrier(self, name: str, timeout_ms: int, process_ids: Any = None) -> None:
        self._sent(name)
        self.counts["barrier_ids_sent"] += len(process_ids or ())
        self.client.wait_at_barrier(name, timeout_ms, process_ids)


@contextlib.contextmanager
def coordination_service(hosts: int) -> Iterator[list[Any]]:
    """JAX's coordination service on 127.0.0.1 and one connected client per host."""
    from jax._src.lib import _jax  # the service jax.distributed.initialize starts, in-process

    address = f"127.0.0.1:{free_port()}"
    service = _jax.get_distributed_runtime_service(address, hosts)
    clients: list[Any] = [None] * hosts

    def connect(host: int) -> None:
        clients[host] = _jax.get_distributed_runtime_client(address, host, init_timeout=120)
        clients[host].connect()

    try:
        on_threads(hosts, connect)
        yield clients
    finally:
        on_threads(hosts, lambda host: clients[host] and clients[host].shutdown())
        service.shutdown()


def on_threads(hosts: int, run: Callable[[int], Any]) -> list[Any]:
    """``run(host)`` for every host at once, one thread each; re-raises the first error."""
    results: list[Any] = [None] * hosts
    errors: list[BaseException] = []

    def target(host: int) -> None:
        try:
            results[host] = run(host)
        except BaseException as error:  # re-raised below, on the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=target, args=(h,), daemon=True) for h in range(hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def agreement_costs(calls: Sequence[tuple[Any, ...]]) -> tuple[list[dict[str, int]], list[float]]:
    """Replays each host's recorded agreement call, all hosts at once, through the real `agree`
    and a real coordination service; per host what it sent and received, and its seconds in
    `agree` (all hosts start together)."""
    from psdp._runtime import agreement

    hosts = len(calls)
    me = threading.local()
    with (
        coordination_service(hosts) as clients,
        mock.patch.object(agreement, "coordination_client", lambda: me.client),
        mock.patch.object(jax, "process_index", lambda *_, **__: me.host),
        mock.patch.object(jax, "process_count", lambda *_, **__: hosts),
        # one process keeps one round count for all its loaders; each simulated host its own
        mock.patch.object(agreement, "_next_round", lambda group: 1),
    ):
        counting = [CountingClient(c) for c in clients]
        start = threading.Barrier(hosts)

        def agree(host: int) -> float:
            me.host, me.client = host, counting[host]
            *args, kwargs = calls[host]
            start.wait()
            started = time.perf_counter()
            agreement.agree(*args, **kwargs)
            return time.perf_counter() - started

        seconds = on_threads(hosts, agree)
    return [dict(c.counts) for c in counting], seconds


# -------------------------------------------------------------------------------- the run
def measure(pods: Sequence[int], kinds: Sequence[str] = ("plain", "docs")) -> list[dict[str, Any]]:
    """For each dataset kind and pod size, every host's start-up figures (`store_startups`) and
    its agreement's (`agreement_costs`)."""
    if 2 * max(pods) > len(jax.devices()) or max(pods) > MAX_HOSTS:
        raise ValueError(
            f"pods {list(pods)} need {2 * max(pods)} devices (<= {2 * MAX_HOSTS}); this process "
            f"has {len(jax.devices())}: set JAX_NUM_CPU_DEVICES before JAX starts"
        )
    out = []
    with S3Server() as server, FaultProxy(server.endpoint) as proxy:
        datasets = Datasets(server, proxy)
        for kind in kinds:
            for hosts in pods:
                startups, calls = store_startups(hosts, proxy, datasets, kind)
                agreements, seconds = agreement_costs(calls) if hosts > 1 else ([{}], [0.0])
                out.append(
                    {
                        "kind": kind,
                        "hosts": hosts,
                        "startups": startups,
                        "agreements": agreements,
                        "agreement_s": seconds,
                    }
                )
    return out


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, max)."""
    return min(values), statistics.median(values), max(values)


if __name__ == "__main__":
    print(json.dumps(measure([int(n) for n in sys.argv[2:]], sys.argv[1].split(","))))
