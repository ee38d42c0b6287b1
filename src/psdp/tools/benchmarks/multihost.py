"""Figure 6, the multi-host figure: on a 4-host non-contiguous pod, the bytes each host reads per
batch and the pod's batches per second, psdp against the loops users write there
(``docs/measurements/performance.md``).

The pod is 4 real JAX processes on 127.0.0.1 (`psdp.tools.pod.run_pod`), 2 fake CPU devices each,
``data=4 x model=2`` laid out as ``tests/batch_checks.NONCONTIGUOUS_4x2``: every data row spans
two hosts, so two hosts hold the same rows and each host needs half of the batch. Every loop reads
from a source of its own whose reads sleep ``read_ms`` first (a remote store's latency) and record
their rows. Each host checks every loop's first two batches on its devices before any timing; the
loops are then timed in turns, all hosts starting each turn together (a barrier), and a turn of the
pod lasts as long as its slowest host.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp import DataLoader, MeshLayout
from psdp.sources import ArraySource
from psdp.sources.base import fresh_rows
from psdp.tools.benchmarks.baselines import (
    Ids,
    Read,
    callback_loop,
    host_rows,
    own_rows_loop,
    read_all_local_data_loop,
)
from psdp.tools.benchmarks.common import (
    BatchIds,
    Sizes,
    check_batches,
    int32_table,
    ratio,
    timed_ms,
)
from psdp.tools.benchmarks.throughput import psdp_batches, threads_text

#: The pod of ``tests/batch_checks.NONCONTIGUOUS_4x2``: the process of each (data, model) device.
LAYOUT = [[0, 1], [2, 3], [0, 1], [2, 3]]
READ_ALL_CALLBACK = "read the whole batch, make_array_from_callback"
READ_ALL_LOCAL = "read the whole batch, make_array_from_process_local_data"
OWN_ROWS = "read own rows (addressable_devices_indices_map), make_array_from_process_local_data"


class TimedReads(ArraySource):
    """An in-memory source whose reads sleep ``latency_s`` first and record how many rows they
    read.

    Examples:
        >>> source = TimedReads(np.arange(6).reshape(3, 2))
        >>> source.read(np.array([2, 0])).tolist(), source.rows_read
        ([[4, 5], [0, 1]], [2])
    """

    def __init__(self, data: np.ndarray):
        super().__init__(data)
        self.latency_s = 0.0
        self.rows_read: list[int] = []

    @fresh_rows  # the parent's read, a new array each call: the loader need not copy it
    def read(self, ids: np.ndarray) -> Any:
        if self.latency_s:
            time.sleep(self.latency_s)
        self.rows_read.append(len(ids))
        return super().read(ids)


@dataclass
class Loop:
    """One loop on one host: its batches, the ids of each step, its own source, and its turns."""

    batches: Iterator[jax.Array]
    ids: Ids
    source: TimedReads
    read_ahead: int = 0  # batches it may read beyond those taken (psdp's prefetch + threads)
    ms: list[float] = field(default_factory=list)
    taken: int = 0


def pod_target(
    process_index: list[list[int]],
    rows: int,
    width: int,
    batch: int,
    steps: int,
    warmup: int,
    repeats: int,
    read_ms: list[float],
    prefetch: int,
    read_threads: list[int],
) -> dict[str, Any]:
    """One host's part of figure 6 (`run_pod` runs it in every process): per read latency and
    loop, its ms per batch in each turn and the rows of each read. Raises on a wrong shard, and
    unless psdp read exactly this host's rows (JAX's boxes of its devices) once per batch."""
    layout = MeshLayout(np.asarray(process_index), ("data", "model"))
    mesh = layout.build_mesh(jax.devices())
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    table = int32_table(rows, width)
    own_rows = len(host_rows(sharding, (batch, width)))
    cells = []
    for latency_ms in read_ms:
        with ExitStack() as stack:
            loops = _open_loops(mesh, table, batch, prefetch, read_threads, stack)
            for loop in loops.values():  # the loaders' one-row probes above took no time
                loop.source.latency_s = latency_ms / 1e3
            _time_turns(loops, f"{latency_ms}", steps, warmup, repeats)
        for name, loop in loops.items():
            cells.append(_host_cell(name, latency_ms, loop, own_rows))
    return {"process": jax.process_index(), "own_rows": own_rows, "cells": cells}


def _open_loops(
    mesh: Mesh,
    table: np.ndarray,
    batch: int,
    prefetch: int,
    read_threads: list[int],
    stack: ExitStack,
) -> dict[str, Loop]:
    """Every loop, open (``stack`` closes them) and checked on this host's devices."""
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    user_ids = BatchIds(len(table), batch, seed=1)
    width = table.shape[1]
    makers: dict[str, Callable[[Read], Iterator[jax.Array]]] = {
        READ_ALL_CALLBACK: lambda read: callback_loop(read, user_ids, sharding),
        READ_ALL_LOCAL: lambda read: read_all_local_data_loop(read, user_ids, sharding),
        OWN_ROWS: lambda read: own_rows_loop(read, user_ids, sharding, width),
    }
    loops: dict[str, Loop] = {}
    for name, make in makers.items():
        source = TimedReads(table)
        loops[name] = Loop(make(source.read), user_ids, source)
    for threads in read_threads:
        source = TimedReads(table)
        loader = stack.enter_context(
            DataLoader(
                source,
                mesh=mesh,
                global_batch_size=batch,
                seed=1,
                prefetch=prefetch,
                read_threads=threads,
            )
        )
        assert loader.order is not None, "an array source has a global order"
        source.rows_read.clear()  # the constructor's one-row probe
        batches = psdp_batches(loader)
        loops[f"psdp, {threads_text(threads)}"] = Loop(
            batches, loader.order.batch_ids, source, read_ahead=prefetch + threads
        )
    for name, loop in loops.items():
        stack.callback(loop.batches.close)  # type: ignore[attr-defined]
        check_batches(loop.batches, loop.ids, table, f"{name} on host {jax.process_index()}")
        loop.taken = 2
    return loops


def _time_turns(loops: dict[str, Loop], tag: str, steps: int, warmup: int, repeats: int) -> None:
    """Each loop timed in ``repeats`` turns, every host starting each turn together (the order of
    the turns rotating from one repeat to the next)."""
    names = list(loops)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            multihost_utils.sync_global_devices(f"psdp bench {tag} {repeat} {name}")
            loops[name].ms.append(timed_ms(loops[name].batches, warmup, steps, 0.0))
            loops[name].taken += warmup + steps
    multihost_utils.sync_global_devices(f"psdp bench {tag} done")


def _host_cell(name: str, latency_ms: float, loop: Loop, own_rows: int) -> dict[str, Any]:
    """One loop's figures on this host; psdp's reads checked: its own rows, one read per batch."""
    sizes = set(loop.source.rows_read)
    reads = len(loop.source.rows_read)
    if len(sizes) != 1:
        raise AssertionError(f"{name}: reads of different sizes on one host: {sorted(sizes)}")
    rows_per_read = sizes.pop()
    if loop.read_ahead and not (
        rows_per_read == own_rows and loop.taken <= reads <= loop.taken + loop.read_ahead
    ):
        raise AssertionError(
            f"{name}: {reads} reads of {rows_per_read} rows for {loop.taken} batches; expected "
            f"one read of this host's {own_rows} rows per batch (plus at most {loop.read_ahead} "
            "read ahead)"
        )
    return {"read_ms": latency_ms, "loader": name, "ms": loop.ms, "rows_per_read": rows_per_read}


def bench_multihost(sizes: Sizes) -> dict[str, Any]:
    """Runs `pod_target` on the 4-host pod and turns its hosts' figures into one row per
    (read latency, loop)."""
    from psdp.tools.pod import run_pod

    args = {
        "process_index": LAYOUT,
        "rows": sizes.rows,
        "width": sizes.width,
        "batch": sizes.pod_batch,
        "steps": sizes.pod_steps,
        "warmup": sizes.warmup_steps,
        "repeats": max(sizes.repeats // 4, 2),
        "read_ms": list(sizes.pod_read_ms),
        "prefetch": sizes.prefetch,
        "read_threads": sorted({min(sizes.read_threads), max(sizes.read_threads)}),
    }
    hosts = run_pod(pod_target, num_processes=4, devices_per_process=2, args=args, timeout_s=600)
    batch_bytes = sizes.pod_batch * sizes.width * 4
    return {
        "title": (
            f"The 4-host pod: 4 processes x 2 fake CPU devices on 127.0.0.1, data=4 x model=2 "
            f"non-contiguous (each data row on 2 hosts), shuffled {sizes.pod_batch} x "
            f"{sizes.width} int32 batches ({batch_bytes / 2**20:.2f} MiB), prefetch="
            f"{sizes.prefetch}, no train step"
        ),
        "ratio_means": (
            "the pod's batches/s over the read-the-whole-batch make_array_from_callback loop's "
            "(a turn of the pod: its slowest host); host_share: bytes a host reads per batch / "
            "the batch's bytes; own_rows_exact: every host read exactly the rows of its devices"
        ),
        "rows": pod_rows(hosts, batch_bytes // sizes.pod_batch, batch_bytes),
    }


def pod_rows(hosts: list[dict[str, Any]], row_bytes: int, batch_bytes: int) -> list[dict[str, Any]]:
    """One row per (read latency, loop) from every host's cells.

    Examples:
        >>> cell = {"read_ms": 0, "loader": READ_ALL_CALLBACK, "ms": [2.0, 4.0], "rows_per_read": 8}
        >>> host = {"own_rows": 4, "cells": [cell]}
        >>> row = pod_rows([host, host], row_bytes=16, batch_bytes=128)[0]
        >>> row["host_bytes"], row["host_share"], row["ms_per_batch"], row["ratio"]
        (128, 1.0, 3.0, 1.0)
    """
    rows = []
    for i, first in enumerate(hosts[0]["cells"]):
        cells = [host["cells"][i] for host in hosts]
        turns = [max(turn) for turn in zip(*(cell["ms"] for cell in cells), strict=True)]
        host_bytes = max(cell["rows_per_read"] for cell in cells) * row_bytes
        exact = all(
            cell["rows_per_read"] == host["own_rows"]
            for cell, host in zip(cells, hosts, strict=True)
        )
        ms = statistics.median(turns)
        rows.append(
            {
                "read_ms": first["read_ms"],
                "loader": first["loader"],
                "host_bytes": host_bytes,
                "host_share": host_bytes / batch_bytes,
                "own_rows_exact": exact,
                "ms_per_batch": ms,
                "batches_per_s": 1e3 / ms,
                "spread": (max(turns) - min(turns)) / ms,
            }
        )
    for row in rows:
        base = next(
            r for r in rows if r["read_ms"] == row["read_ms"] and r["loader"] == READ_ALL_CALLBACK
        )
        row["ratio"] = ratio(row["batches_per_s"], base["batches_per_s"])
    return rows
