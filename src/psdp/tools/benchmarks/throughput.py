"""Figure 2, throughput: time per shuffled batch, psdp's `DataLoader` against the naive loop and Grain.

What it measures: ms per batch of shuffled int32 batches, from an in-memory array and from a
TensorStore zarr3 dataset written by `write_dataset`, on 8 fake CPU devices (``data=4 x model=2``),
each loop with no train step (pure loader throughput) and with a fixed-cost one (a sleep, which
like XLA compute frees the GIL). Loops: psdp with 1 and with several read threads, and Grain's
``DataLoader`` (+ ``device_put``) reading record by record as Grain does, when grain is installed.

The baseline is the naive loop (`naive_loop`), what a user writes without psdp: read the global
batch with one fancy index in psdp's own order, ``device_put`` it, train. Ratio = naive ms per
batch / this loop's ms per batch, so above 1 is faster than the naive loop; ``vs_grain`` is the
same against Grain. Grain's shuffle is its own permutation (same kind of order, not the same one).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp._plan.order import GlobalOrder
from psdp._runtime.loader import DataLoader
from psdp.sources import ArraySource, TensorStoreSource
from psdp.sources.writer import write_dataset
from psdp.tools.benchmarks.common import (
    Sizes,
    check_shards,
    cpu_mesh,
    int32_table,
    interleaved_ms,
    ratio,
    train_step,
)


class Records:
    """A per-record view of a psdp source, the way Grain reads: one row per ``__getitem__``.

    Example:
        >>> records = Records(ArraySource(np.arange(6).reshape(3, 2)))
        >>> len(records), records[2].tolist()
        (3, [4, 5])
    """

    def __init__(self, source: Any):
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self._source.read(np.array([i], np.int64)))[0]


def load_grain() -> Any | None:
    """The ``grain`` module, or ``None`` when it is not installed (its rows are then skipped)."""
    try:
        import grain
    except ImportError:
        return None
    return grain


def naive_loop(
    source: Any, order: GlobalOrder, sharding: NamedSharding, steps: int, train_s: float
) -> None:
    """What a user writes without psdp: read the whole global batch, ``device_put`` it, train.

    Example:
        >>> from jax.sharding import PartitionSpec as P
        >>> sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        >>> order = GlobalOrder(num_rows=32, batch_size=8, seed=1)
        >>> naive_loop(ArraySource(int32_table(32, 4)), order, sharding, steps=2, train_s=0)
    """
    for step in range(steps):
        batch = jax.device_put(np.asarray(source.read(order.batch_ids(step))), sharding)
        batch.block_until_ready()
        train_step(train_s)


def psdp_loop(loader: DataLoader, steps: int, train_s: float) -> None:
    """``steps`` batches from a fresh iterator (its first batch is start-up, not timed apart)."""
    it = loader.iter_from(0)
    try:
        for _ in range(steps):
            next(it).block_until_ready()
            train_step(train_s)
    finally:
        it.close()


def grain_loop(
    grain: Any,
    records: Any,
    batch: int,
    sharding: NamedSharding,
    steps: int,
    train_s: float,
) -> None:
    """Grain's ``DataLoader`` (shuffled index sampler, ``Batch``) plus ``device_put`` per batch."""
    loader = grain.DataLoader(
        data_source=records,
        sampler=grain.samplers.IndexSampler(len(records), shuffle=True, seed=1, num_epochs=None),
        operations=[grain.transforms.Batch(batch, drop_remainder=True)],
        worker_count=0,
    )
    for host_batch in itertools.islice(iter(loader), steps):
        jax.device_put(host_batch, sharding).block_until_ready()
        train_step(train_s)


def bench_throughput(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """Time per shuffled batch: psdp vs the naive loop and Grain, in memory and on TensorStore."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    table = int32_table(sizes.rows, sizes.width)
    store = TensorStoreSource(write_dataset(workdir / "tokens", table, progress=False))
    grain = load_grain()
    spec = PartitionSpec("data")
    sharding = NamedSharding(mesh, spec)
    threads = sizes.read_threads
    steps, grain_steps = sizes.steps, max(sizes.steps // 5, 2)  # Grain is slow; ms per batch
    rows_out = []
    for kind, source in (("in-memory", ArraySource(table)), ("TensorStore zarr3", store)):
        options: dict[str, Any] = {
            "mesh": mesh,
            "global_batch_size": sizes.batch,
            "batch_spec": spec,
            "seed": 1,
        }
        one = DataLoader(source, **options)
        many = DataLoader(source, read_threads=threads, **options)
        order = one.order
        assert order is not None, "a random-access source has a global order"
        check_shards(one.batch_at(3), table[order.batch_ids(3)], f"psdp on {kind}")
        records = table if kind == "in-memory" else Records(source)
        for train_ms in sizes.train_ms:
            train_s = train_ms / 1e3
            loops: dict[str, tuple[int, Callable[[], Any]]] = {
                "naive loop": (steps, partial(naive_loop, source, order, sharding, steps, train_s)),
                "psdp": (steps, partial(psdp_loop, one, steps, train_s)),
                f"psdp, {threads} read threads": (steps, partial(psdp_loop, many, steps, train_s)),
            }
            if grain is not None:
                loops["Grain DataLoader"] = (
                    grain_steps,
                    partial(
                        grain_loop, grain, records, sizes.batch, sharding, grain_steps, train_s
                    ),
                )
            ms = interleaved_ms({k: v[1] for k, v in loops.items()}, max(sizes.repeats // 4, 2))
            per_step = {name: ms[name] / loops[name][0] for name in loops}
            grain_ms = per_step.get("Grain DataLoader")
            rows_out += [
                {
                    "source": kind,
                    "train_ms": train_ms,
                    "loader": name,
                    "ms_per_batch": per_step[name],
                    "ratio": ratio(per_step["naive loop"], per_step[name]),
                    "vs_grain": ratio(grain_ms, per_step[name]),
                }
                for name in loops
            ]
        one.close()
        many.close()
    return {
        "title": (
            f"Loader throughput: shuffled {sizes.batch} x {sizes.width} int32 batches "
            f"({sizes.batch * sizes.width * 4 / 2**20:.2f} MiB), data=4 x model=2, prefetch=2, "
            "with no train step and with a fixed-cost one (a sleep)"
        ),
        "ratio_means": "speed-up over the naive loop (naive ms / this ms); vs_grain the same over Grain",
        "note": None if grain is not None else "grain is not installed: its column is skipped",
        "rows": rows_out,
    }
