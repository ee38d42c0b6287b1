"""The loops a user writes without psdp, at their best, as iterators of global `jax.Array` batches
(``docs/measurements/performance.md``): the tight loop, the same with a one-thread prefetch, and the multi-host
loops of figure 6. Each reads through ``read(ids)``, so every loop of a figure reads the same
source with the same cost per read."""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from psdp._plan.leaves import SINGLE_LEAF

Read = Callable[[np.ndarray], np.ndarray]
Ids = Callable[[int], np.ndarray]


class TableRows:
    """``read(ids)`` of an in-memory table: one fancy index (picklable, for Grain's workers).

    Examples:
        >>> TableRows(np.arange(6).reshape(3, 2))(np.array([0, 2])).tolist()
        [[0, 1], [4, 5]]
    """

    def __init__(self, table: np.ndarray):
        self.table = table

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return self.table[ids]


class TensorStoreRows:
    """``read(ids)`` of a dataset's single array with TensorStore alone, as a user writes it: one
    batched read. Picklable: each process opens the store on its first read."""

    def __init__(self, path: Path):
        self.path = path
        self._array: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_array": None}

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self._array is None:
            import tensorstore as ts

            kvstore = {"driver": "file", "path": str(self.path / SINGLE_LEAF)}
            self._array = ts.open({"driver": "zarr3", "kvstore": kvstore}, read=True).result()
        return self._array[ids].read().result()


def tight_loop(read: Read, ids: Ids, sharding: NamedSharding) -> Iterator[jax.Array]:
    """Per step: the sorted ids, one read, one global ``device_put``.

    Examples:
        >>> from psdp.tools.benchmarks.common import BatchIds, cpu_mesh, int32_table
        >>> from jax.sharding import PartitionSpec as P
        >>> sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        >>> table = int32_table(32, 4)
        >>> batch = next(tight_loop(TableRows(table), BatchIds(32, 8), sharding))
        >>> np.array_equal(np.asarray(batch), table[BatchIds(32, 8)(0)])
        True
    """
    for step in itertools.count():
        yield jax.device_put(read(ids(step)), sharding)


def process_local_loop(read: Read, ids: Ids, sharding: NamedSharding) -> Iterator[jax.Array]:
    """The tight loop with ``jax.make_array_from_process_local_data`` instead of ``device_put``
    (one process holds the whole batch)."""
    for step in itertools.count():
        yield jax.make_array_from_process_local_data(sharding, read(ids(step)))


def prefetched(batches: Iterator[Any], depth: int) -> Iterator[Any]:
    """``batches`` computed ahead on one thread, ``depth`` at most waiting: the short loop a user
    writes around the tight loop (errors re-raised in order; closing stops and joins the thread).

    Examples:
        >>> list(itertools.islice(prefetched(iter(range(100)), depth=2), 4))
        [0, 1, 2, 3]
    """
    ready: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fill() -> None:
        try:
            for batch in batches:
                if stop.is_set():
                    return
                ready.put((batch, None))
        except BaseException as err:  # handed to the consumer
            ready.put((None, err))
        ready.put((None, StopIteration()))

    thread = threading.Thread(target=fill, name="prefetch-loop", daemon=True)
    thread.start()
    try:
        while True:
            batch, error = ready.get()
            if isinstance(error, StopIteration):
                return
            if error is not None:
                raise error
            yield batch
    finally:
        stop.set()
        while thread.is_alive():  # free the slot a blocked put waits for, until it sees stop
            with contextlib.suppress(queue.Empty):
                ready.get(timeout=0.01)
        thread.join()


# ----------------------------------------------------------------- figure 6: the 4-host pod
def callback_loop(read: Read, ids: Ids, sharding: NamedSharding) -> Iterator[jax.Array]:
    """Every host reads the whole global batch and builds the array with
    ``make_array_from_callback`` (each local device takes its box of it)."""
    for step in itertools.count():
        batch = read(ids(step))
        yield jax.make_array_from_callback(batch.shape, sharding, batch.__getitem__)


def read_all_local_data_loop(read: Read, ids: Ids, sharding: NamedSharding) -> Iterator[jax.Array]:
    """Every host reads the whole global batch and hands it to
    ``make_array_from_process_local_data`` as the global array (JAX slices each device's box)."""
    for step in itertools.count():
        batch = read(ids(step))
        yield jax.make_array_from_process_local_data(sharding, batch, batch.shape)


def host_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of a ``shape`` batch that this host's devices hold, in increasing order, from
    JAX's ``addressable_devices_indices_map``.

    Examples:
        >>> from psdp.tools.benchmarks.common import cpu_mesh
        >>> from jax.sharding import PartitionSpec as P
        >>> host_rows(NamedSharding(cpu_mesh((4, 2), ("data", "model")), P("data")), (8, 3))
        array([0, 1, 2, 3, 4, 5, 6, 7])
    """
    positions = np.arange(shape[0])
    boxes = sharding.addressable_devices_indices_map(shape).values()
    return np.unique(np.concatenate([positions[box[0]] for box in boxes if box is not None]))


def own_rows_loop(read: Read, ids: Ids, sharding: NamedSharding, width: int) -> Iterator[jax.Array]:
    """A careful user: each host reads only the rows of its devices' boxes (`host_rows`),
    concatenated in increasing global order as ``make_array_from_process_local_data`` requires."""
    rows: np.ndarray | None = None
    for step in itertools.count():
        step_ids = ids(step)
        shape = (len(step_ids), width)
        if rows is None:  # the same boxes every step
            rows = host_rows(sharding, shape)
        yield jax.make_array_from_process_local_data(sharding, read(step_ids[rows]), shape)
