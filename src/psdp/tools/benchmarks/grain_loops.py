"""Grain in its best configurations for figure 2 (``docs/measurements/performance.md``), as iterators of global
`jax.Array` batches.

Grain's ``MapDataset.batch`` reads record by record in the open-source build (its batched
``_getitems`` push-down is off), so the fast way to feed Grain pre-batched reads is a dataset whose
element *is* a batch: `StepReads` (step -> one batched read of that step's sorted ids). Around it:
Grain's read threads (``to_iter_dataset(ReadOptions(num_threads, prefetch_buffer_size))``), its
two-stage host/device prefetch (``grain.experimental.device_put``), and ``grain.DataLoader`` with
worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from psdp.tools.benchmarks.baselines import Ids, Read

#: Steps a `StepReads` claims to hold (Grain needs a length; no run comes near it).
STEPS = 10**9


def load_grain() -> Any | None:
    """The ``grain`` module, or ``None`` when it is not installed (its rows are then skipped)."""
    try:
        import grain
    except ImportError:
        return None
    return grain


class StepReads:
    """A Grain data source whose record ``s`` is step ``s``'s batch: one read of its sorted ids.

    Examples:
        >>> from psdp.tools.benchmarks.baselines import TableRows
        >>> from psdp.tools.benchmarks.common import BatchIds
        >>> table = np.arange(16).reshape(8, 2)
        >>> reads = StepReads(TableRows(table), BatchIds(8, 4))
        >>> np.array_equal(reads[1], table[BatchIds(8, 4)(1)])
        True
    """

    def __init__(self, read: Read, ids: Ids):
        self.read, self.ids = read, ids

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, step: int) -> np.ndarray:
        return self.read(self.ids(int(step)))

    def __repr__(self) -> str:  # Grain logs and checkpoints it; keep it short
        return "StepReads()"


def map_dataset(
    grain: Any, reads: StepReads, threads: int, prefetch: int, sharding: NamedSharding
) -> Iterator[jax.Array]:
    """``MapDataset.source(reads)`` read ahead by ``threads`` Grain threads, then one global
    ``device_put`` per batch on the consumer's thread."""
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch + threads)
    iterator = iter(grain.MapDataset.source(reads).to_iter_dataset(options))
    return _closing((jax.device_put(batch, sharding) for batch in iterator), iterator)


def map_dataset_device_put(
    grain: Any, reads: StepReads, threads: int, prefetch: int, sharding: NamedSharding
) -> Iterator[jax.Array]:
    """As `map_dataset`, then ``grain.experimental.device_put``: a host prefetch buffer, the
    transfer on a Grain thread, and a buffer of arrays already on the devices."""
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch + threads)
    dataset = grain.MapDataset.source(reads).to_iter_dataset(options)
    iterator = iter(grain.experimental.device_put(dataset, sharding))
    return _closing(iterator, iterator)


def data_loader(
    grain: Any, reads: StepReads, workers: int, prefetch: int, sharding: NamedSharding
) -> Iterator[jax.Array]:
    """``grain.DataLoader`` with ``workers`` worker processes reading `StepReads` in step order
    (the shuffle is in the ids), one global ``device_put`` per batch."""
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags; a script parses them
        flags.FLAGS.mark_as_parsed()
    sampler = grain.samplers.IndexSampler(
        STEPS, shard_options=grain.sharding.NoSharding(), shuffle=False, num_epochs=1
    )
    loader = grain.DataLoader(
        data_source=reads,
        sampler=sampler,
        worker_count=workers,
        worker_buffer_size=prefetch,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch),
    )
    iterator = iter(loader)
    return _closing((jax.device_put(batch, sharding) for batch in iterator), iterator)


def _closing(batches: Iterator[jax.Array], iterator: Any) -> Iterator[jax.Array]:
    """``batches``; closing it closes Grain's ``iterator`` (its threads, or its worker processes,
    which ``grain.DataLoader``'s iterator stops when it is collected)."""
    try:
        yield from batches
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        del iterator
