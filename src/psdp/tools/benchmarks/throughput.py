"""Figure 2, throughput: ms per shuffled batch, psdp against the loops a user writes and Grain's best
configurations, in memory and on TensorStore (``docs/measurements/performance.md``).

Every loop is an iterator of global `jax.Array` batches, opened once per source and checked first
(its first two batches, every device shard, against the table); then, for each train step cost,
the loops are timed in turns (`common.timed_ms`: an untimed warm-up, then ``steps`` batches), the
order of the turns rotating from one repeat to the next.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp import DataLoader
from psdp.sources import TensorStoreSource
from psdp.sources.stores.writer import write_dataset
from psdp.tools.benchmarks import grain_loops
from psdp.tools.benchmarks.baselines import (
    Ids,
    Read,
    TableRows,
    TensorStoreRows,
    prefetched,
    process_local_loop,
    tight_loop,
)
from psdp.tools.benchmarks.common import (
    BatchIds,
    Sizes,
    check_batches,
    cpu_mesh,
    int32_table,
    ratio,
    timed_ms,
)
from psdp.tools.benchmarks.grain_loops import load_grain

NAIVE = "tight loop"
PREFETCH_LOOP = "tight loop + 1 prefetch thread"
PROCESS_LOCAL = "tight loop, make_array_from_process_local_data"

Opener = Callable[[], Iterator[jax.Array]]


def threads_text(count: int, one: str = "read thread", many: str = "read threads") -> str:
    """``"1 read thread"``, ``"4 read threads"``.

    Examples:
        >>> threads_text(1), threads_text(2, "worker process", "worker processes")
        ('1 read thread', '2 worker processes')
    """
    return f"{count} {one if count == 1 else many}"


def psdp_batches(loader: DataLoader) -> Iterator[jax.Array]:
    """The batches of a fresh iterator from step 0; closing this closes the iterator."""
    with loader.iter_from(0) as it:
        yield from it


def bench_throughput(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """Time per shuffled batch: psdp vs the user's loops and Grain, in memory and on TensorStore."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    table = int32_table(sizes.rows, sizes.width)
    path = write_dataset(workdir / "tokens", table, progress=False)
    sources: dict[str, tuple[Any, Read]] = {
        "in-memory": (table, TableRows(table)),
        "TensorStore zarr3": (TensorStoreSource(path), TensorStoreRows(path)),
    }
    rows_out = []
    for kind, (source, read) in sources.items():
        with ExitStack() as stack:
            loops = open_loops(sizes, mesh, table, source, read, kind, stack)
            for train_ms in sizes.train_ms:
                rows_out += _rows(sizes, kind, train_ms, loops)
    return {
        "title": (
            f"Loader throughput: shuffled {sizes.batch} x {sizes.width} int32 batches "
            f"({sizes.batch * sizes.width * 4 / 2**20:.2f} MiB), data=4 x model=2, "
            f"prefetch={sizes.prefetch}, with no train step and with a fixed-cost one (a sleep)"
        ),
        "ratio_means": (
            "speed-up over the tight loop (its ms / this ms); on psdp's rows, vs_best_other is the "
            "same over the fastest other loop of the cell (best_other), vs_grain over the fastest "
            "Grain row; spread: (slowest - fastest repeat) / median"
        ),
        "note": None
        if load_grain() is not None
        else "grain is not installed: its rows are skipped",
        "rows": rows_out,
    }


def openers(
    sizes: Sizes, mesh: Mesh, source: Any, read: Read, stack: ExitStack
) -> dict[str, tuple[Opener, Ids]]:
    """Every loop of one source: name -> (open a fresh iterator, the ids of each step)."""
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    user_ids = BatchIds(sizes.rows, sizes.batch, seed=1)
    loops: dict[str, tuple[Opener, Ids]] = {
        NAIVE: (lambda: tight_loop(read, user_ids, sharding), user_ids),
        PREFETCH_LOOP: (
            lambda: prefetched(tight_loop(read, user_ids, sharding), sizes.prefetch),
            user_ids,
        ),
        PROCESS_LOCAL: (lambda: process_local_loop(read, user_ids, sharding), user_ids),
    }
    for threads in sizes.read_threads:
        loader = stack.enter_context(
            DataLoader(
                source,
                mesh=mesh,
                global_batch_size=sizes.batch,
                seed=1,
                batch_spec=sharding.spec,
                prefetch=sizes.prefetch,
                read_threads=threads,
            )
        )
        assert loader.order is not None, "a random-access source has a global order"
        loops[f"psdp, {threads_text(threads)}"] = (
            partial(psdp_batches, loader),
            loader.order.batch_ids,
        )
    loops.update(_grain_openers(sizes, sharding, read, user_ids))
    return loops


def _grain_openers(
    sizes: Sizes, sharding: NamedSharding, read: Read, ids: Ids
) -> dict[str, tuple[Opener, Ids]]:
    grain = load_grain()
    if grain is None:
        return {}
    reads = grain_loops.StepReads(read, ids)
    depth = sizes.prefetch
    loops: dict[str, tuple[Opener, Ids]] = {}
    for threads in sorted({min(sizes.read_threads), max(sizes.read_threads)}):
        name = f"Grain MapDataset of batch reads, {threads_text(threads)}"
        loops[name] = (
            partial(grain_loops.map_dataset, grain, reads, threads, depth, sharding),
            ids,
        )
        if hasattr(grain.experimental, "device_put"):  # not in Grain's oldest supported releases
            loops[f"{name} + experimental.device_put"] = (
                partial(grain_loops.map_dataset_device_put, grain, reads, threads, depth, sharding),
                ids,
            )
    if sizes.grain_workers:
        name = f"Grain DataLoader, {threads_text(sizes.grain_workers, 'worker process', 'worker processes')}"
        loops[name] = (
            partial(grain_loops.data_loader, grain, reads, sizes.grain_workers, depth, sharding),
            ids,
        )
    return loops


def open_loops(
    sizes: Sizes,
    mesh: Mesh,
    table: np.ndarray,
    source: Any,
    read: Read,
    kind: str,
    stack: ExitStack,
) -> dict[str, Iterator[jax.Array]]:
    """Every loop of one source opened, its first two batches checked on every device shard;
    ``stack`` closes them."""
    loops = {}
    for name, (open_loop, ids) in openers(sizes, mesh, source, read, stack).items():
        batches = open_loop()
        stack.callback(batches.close)  # type: ignore[attr-defined]
        check_batches(batches, ids, table, f"{name} on {kind}")
        loops[name] = batches
    return loops


def _rows(
    sizes: Sizes, kind: str, train_ms: float, loops: dict[str, Iterator[jax.Array]]
) -> list[dict[str, Any]]:
    """One row per loop at one train step cost: the loops timed in turns, ``repeats`` turns."""
    train_s = train_ms / 1e3
    names = list(loops)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(max(sizes.repeats // 4, 2)):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            ms = timed_ms(loops[name], sizes.warmup_steps, sizes.steps, train_s)
            times[name].append(ms)
    ms_per_batch = {name: statistics.median(t) for name, t in times.items()}
    others = {n: v for n, v in ms_per_batch.items() if not n.startswith("psdp")}
    best_other = min(others, key=others.__getitem__)
    grain_ms = min((v for n, v in others.items() if n.startswith("Grain")), default=None)
    rows = []
    for name in names:
        mine = name.startswith("psdp")
        rows.append(
            {
                "source": kind,
                "train_ms": train_ms,
                "loader": name,
                "ms_per_batch": ms_per_batch[name],
                "spread": (max(times[name]) - min(times[name])) / ms_per_batch[name],
                "ratio": ratio(ms_per_batch[NAIVE], ms_per_batch[name]),
                "vs_best_other": ratio(others[best_other], ms_per_batch[name]) if mine else None,
                "best_other": best_other if mine else None,
                "vs_grain": ratio(grain_ms, ms_per_batch[name]) if mine else None,
            }
        )
    return rows
