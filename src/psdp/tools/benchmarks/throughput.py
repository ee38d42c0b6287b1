"""Figure 2, throughput: ms per shuffled batch, psdp against a tight hand-written loop and Grain
(``docs/performance.md``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp import DataLoader
from psdp._plan.leaves import SINGLE_LEAF
from psdp.sources import TensorStoreSource
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

Read = Callable[[np.ndarray], np.ndarray]
NAIVE = "hand loop"


def sorted_shuffled_ids(num_rows: int, batch: int, seed: int = 1) -> Iterator[np.ndarray]:
    """Each step's ids as a user shuffles them: a numpy permutation per epoch, each batch sorted
    (sorted ids make the gather, and a store's reads, faster).

    Example:
        >>> ids = sorted_shuffled_ids(num_rows=8, batch=4)
        >>> first, second = next(ids), next(ids)
        >>> sorted(np.concatenate([first, second]).tolist()), bool((np.diff(first) > 0).all())
        ([0, 1, 2, 3, 4, 5, 6, 7], True)
    """
    rng = np.random.default_rng(seed)
    while True:
        permutation = rng.permutation(num_rows)
        for start in range(0, num_rows - batch + 1, batch):
            yield np.sort(permutation[start : start + batch])


def naive_loop(
    read: Read, num_rows: int, batch: int, sharding: NamedSharding, steps: int, train_s: float
) -> None:
    """What a user writes without psdp, at its best: per step the sorted ids, one read (one fancy
    index, or one batched TensorStore read), one global ``device_put``, the train step.

    Example:
        >>> from jax.sharding import PartitionSpec as P
        >>> sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        >>> table = int32_table(32, 4)
        >>> naive_loop(table.__getitem__, 32, 8, sharding, steps=2, train_s=0)
    """
    for ids in itertools.islice(sorted_shuffled_ids(num_rows, batch), steps):
        jax.device_put(read(ids), sharding).block_until_ready()
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


def load_grain() -> Any | None:
    """The ``grain`` module, or ``None`` when it is not installed (its rows are then skipped)."""
    try:
        import grain
    except ImportError:
        return None
    return grain


class Records:
    """A per-record view of a batched read, the way Grain reads: one row per ``__getitem__``.

    Example:
        >>> records = Records(np.arange(6).reshape(3, 2).__getitem__, 3)
        >>> len(records), records[2].tolist()
        (3, [4, 5])
    """

    def __init__(self, read: Read, length: int):
        self._read, self._length = read, length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self._read(np.array([i], np.int64)))[0]


def grain_batches(grain: Any, records: Any, batch: int, threads: int) -> Iterator[np.ndarray]:
    """Grain's own pipeline: a ``MapDataset`` shuffled and batched, read ahead by ``threads``
    threads (``to_iter_dataset``).

    Example:
        >>> grain = load_grain()
        >>> grain is None or next(grain_batches(grain, int32_table(8, 2), 4, 1)).shape == (4, 2)
        True
    """
    dataset = grain.MapDataset.source(records).shuffle(seed=1).repeat().batch(batch)
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
    return iter(dataset.to_iter_dataset(options))


def grain_loop(
    grain: Any,
    records: Any,
    batch: int,
    threads: int,
    sharding: NamedSharding,
    steps: int,
    train_s: float,
) -> None:
    """`grain_batches`, one ``device_put`` per batch, the train step."""
    for host_batch in itertools.islice(grain_batches(grain, records, batch, threads), steps):
        jax.device_put(host_batch, sharding).block_until_ready()
        train_step(train_s)


def check_rows_of(batch: np.ndarray, table: np.ndarray, what: str) -> None:
    """Raises unless ``batch`` holds distinct rows of ``table`` (for loops with their own order).

    Example:
        >>> table = int32_table(8, 3)
        >>> check_rows_of(table[[5, 1]], table, "ok")
        >>> check_rows_of(table[[5, 5]], table, "twice")
        Traceback (most recent call last):
        ...
        AssertionError: twice: the batch does not hold distinct rows of the source
    """
    rows = {row.tobytes() for row in table}
    got = {row.tobytes() for row in np.asarray(batch)}
    if len(got) != len(batch) or not got <= rows:
        raise AssertionError(f"{what}: the batch does not hold distinct rows of the source")


def tensorstore_read(path: Path) -> Read:
    """One batched read of a dataset's single array with TensorStore alone, as a user writes it."""
    import tensorstore as ts

    kvstore = {"driver": "file", "path": str(path / SINGLE_LEAF)}
    array = ts.open({"driver": "zarr3", "kvstore": kvstore}, read=True).result()
    return lambda ids: array[ids].read().result()


def bench_throughput(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """Time per shuffled batch: psdp vs the hand loop and Grain, in memory and on TensorStore."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    table = int32_table(sizes.rows, sizes.width)
    path = write_dataset(workdir / "tokens", table, progress=False)
    sources: dict[str, tuple[Any, Read]] = {
        "in-memory": (table, table.__getitem__),
        "TensorStore zarr3": (TensorStoreSource(path), tensorstore_read(path)),
    }
    rows_out = []
    for kind, (source, read) in sources.items():
        with ExitStack() as loaders:
            loops = _loops(sizes, mesh, table, source, read, kind, loaders)
            for train_ms in sizes.train_ms:
                rows_out += _rows(sizes, kind, train_ms, loops)
    return {
        "title": (
            f"Loader throughput: shuffled {sizes.batch} x {sizes.width} int32 batches "
            f"({sizes.batch * sizes.width * 4 / 2**20:.2f} MiB), data=4 x model=2, "
            f"prefetch={sizes.prefetch}, with no train step and with a fixed-cost one (a sleep)"
        ),
        "ratio_means": (
            "speed-up over the hand loop (its ms / this ms); vs_grain the same over the faster "
            "Grain row"
        ),
        "note": None
        if load_grain() is not None
        else "grain is not installed: its rows are skipped",
        "rows": rows_out,
    }


Loop = Callable[[int, float], None]  # (steps, train_s) -> None


def _loops(
    sizes: Sizes,
    mesh: Any,
    table: np.ndarray,
    source: Any,
    read: Read,
    kind: str,
    loaders: ExitStack,
) -> dict[str, tuple[int, Loop]]:
    """Every loop of one source, name -> (steps, loop), each checked for its rows first."""
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    options = {
        "mesh": mesh,
        "global_batch_size": sizes.batch,
        "seed": 1,
        "batch_spec": sharding.spec,
    }
    one = loaders.enter_context(DataLoader(source, prefetch=sizes.prefetch, **options))
    many = loaders.enter_context(
        DataLoader(source, prefetch=sizes.prefetch, read_threads=sizes.read_threads, **options)
    )
    assert one.order is not None, "a random-access source has a global order"
    check_shards(one.batch_at(3), table[one.order.batch_ids(3)], f"psdp on {kind}")
    ids = next(sorted_shuffled_ids(sizes.rows, sizes.batch))
    check_shards(jax.device_put(read(ids), sharding), table[ids], f"{NAIVE} on {kind}")
    steps, threads = sizes.steps, sizes.read_threads
    loops: dict[str, tuple[int, Loop]] = {
        NAIVE: (steps, partial(naive_loop, read, sizes.rows, sizes.batch, sharding)),
        "psdp": (steps, partial(psdp_loop, one)),
        f"psdp, {threads} read threads": (steps, partial(psdp_loop, many)),
    }
    grain = load_grain()
    if grain is not None:  # record by record, as Grain reads; in memory, the array itself
        records = table if kind == "in-memory" else Records(read, sizes.rows)
        grain_steps = max(steps // 5, 2)  # slower per batch: fewer steps, same ms per batch
        for count in (1, threads):
            name = f"Grain, {count} read thread" + ("s" if count > 1 else "")
            first = next(grain_batches(grain, records, sizes.batch, count))
            check_rows_of(first, table, f"{name} on {kind}")
            run = partial(grain_loop, grain, records, sizes.batch, count, sharding)
            loops[name] = (grain_steps, run)
    return loops


def _rows(
    sizes: Sizes, kind: str, train_ms: float, loops: dict[str, tuple[int, Loop]]
) -> list[dict[str, Any]]:
    """One row per loop at one train step cost, timed interleaved."""
    train_s = train_ms / 1e3
    actions = {name: partial(loop, steps, train_s) for name, (steps, loop) in loops.items()}
    ms = interleaved_ms(actions, max(sizes.repeats // 4, 2))
    per_batch = {name: ms[name] / loops[name][0] for name in loops}
    grain_ms = min((v for k, v in per_batch.items() if k.startswith("Grain")), default=None)
    return [
        {
            "source": kind,
            "train_ms": train_ms,
            "loader": name,
            "ms_per_batch": per_batch[name],
            "ratio": ratio(per_batch[NAIVE], per_batch[name]),
            "vs_grain": ratio(grain_ms, per_batch[name]),
        }
        for name in loops
    ]
