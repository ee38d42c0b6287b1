"""The `DataLoader`: global batches for a device mesh, read host-locally, prefetched on a thread.

One step, on every host (see ``docs/loader.md``)::

    GlobalOrder.batch_ids(step)            the step's B source row ids        (pure, psdp.order)
      -> ids[read_positions]               the rows this host's devices hold  (pure, psdp.mesh)
      -> source.read(...)                  one batched read                   (background thread)
      -> LeafAssembler.assemble(...)       one global jax.Array per leaf      (psdp.assembly)
      -> Prefetcher queue -> trainer

Resume rule: the batch at a step is a function of ``(len(source), global_batch_size, seed, shuffle,
drop_last, step)`` only, so ``iter_from(step)`` starts anywhere in O(1) and every host, whatever
its layout or prefetch depth, agrees on every batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from psdp._checks import check_int, preview_ids
from psdp.assembly import LeafAssembler
from psdp.order import GlobalOrder
from psdp.prefetch import LoaderClosedError, Prefetcher
from psdp.sources import Rows, Source, as_source
from psdp.telemetry import LoaderStats, Telemetry

#: Mesh axis names taken as batch axes when no ``batch_spec`` is given, in mesh order.
DEFAULT_BATCH_AXES = ("replica", "data", "fsdp", "batch")

Batch = jax.Array | dict[str, jax.Array]


class DataLoader:
    """Feeds global batches to a mesh; each host reads only the rows its devices hold.

    Args:
        source: a numpy array ``(N, ...)``, a dict of such arrays (a dict batch), a psdp source, or
            any object with ``__len__`` and a batched ``__getitem__(ids)``.
        mesh: the `jax.sharding.Mesh` the batch lives on.
        global_batch_size: rows per global batch.
        batch_spec: the `PartitionSpec` of each leaf (its first entry shards the batch
            dimension); default: the mesh's batch axes, e.g. ``P(("replica", "data"))``.
        shuffle: permute each epoch (from ``seed`` and the epoch number).
        seed: the shuffle seed.
        prefetch: how many finished batches wait in the queue (>= 1).
        drop_last: never let a batch straddle two epochs (drop each epoch's last ``N % B`` rows).
        process_index: this host; defaults to ``jax.process_index()``.
        name: the prefetch thread's name.
        stall_warning_s: log a warning with the loader's figures when the trainer waits longer
            than this for one batch; ``None`` to disable.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> tokens = np.arange(64).reshape(32, 2)
        >>> with DataLoader(tokens, mesh=mesh, global_batch_size=8, shuffle=False) as loader:
        ...     batch = next(iter(loader))
        >>> batch.sharding.spec, np.asarray(batch)[:, 0].tolist()
        (P('data',), [0, 2, 4, 6, 8, 10, 12, 14])
    """

    def __init__(
        self,
        source: Any,
        *,
        mesh: Mesh,
        global_batch_size: int,
        batch_spec: PartitionSpec | None = None,
        shuffle: bool = True,
        seed: int = 0,
        prefetch: int = 2,
        drop_last: bool = False,
        process_index: int | None = None,
        name: str = "psdp-loader",
        stall_warning_s: float | None = 1.0,
    ):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        check_int("global_batch_size", global_batch_size, minimum=1)
        check_int("prefetch", prefetch, minimum=1)
        check_int("seed", seed, minimum=None)
        self.source: Source = as_source(source)
        self.mesh = mesh
        self.global_batch_size = global_batch_size
        self.batch_spec = default_batch_spec(mesh) if batch_spec is None else batch_spec
        self.prefetch = prefetch
        self.name = name
        self.process_index = jax.process_index() if process_index is None else process_index
        self.order = GlobalOrder(len(self.source), global_batch_size, shuffle, seed, drop_last)
        self._leaves = self._plan_leaves()
        self._read_positions = np.unique(
            np.concatenate([a.plan.rows for a in self._leaves.values()])
        )
        self._selects = {
            key: _selection(self._read_positions, leaf.plan.rows)
            for key, leaf in self._leaves.items()
        }
        self.telemetry = Telemetry(stall_warning_s=stall_warning_s)
        self._iterators: list[Prefetcher[Batch]] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------------------- planning
    def _plan_leaves(self) -> dict[str | None, LeafAssembler]:
        """One assembler per leaf (key ``None`` for an array source), from one probe row's spec."""
        probe = self.source.read(np.zeros(1, np.int64))
        leaves = _leaves_of(probe)
        return {
            key: LeafAssembler.create(
                self.mesh,
                self.batch_spec,
                (self.global_batch_size, *np.shape(row)[1:]),
                np.asarray(row).dtype,
                self.process_index,
            )
            for key, row in leaves.items()
        }

    @property
    def read_positions(self) -> np.ndarray:
        """Positions within each global batch this host reads (sorted; the same every step)."""
        return self._read_positions

    def plan(self, key: str | None = None) -> Any:
        """The `DataPlan` of one leaf (``key`` for dict sources)."""
        return self._leaves[key].plan

    # ------------------------------------------------------------------------------ one step
    def batch_at(self, step: int) -> Batch:
        """Reads and assembles the batch of ``step`` on the calling thread (no prefetch)."""
        started = time.perf_counter()
        ids = self.order.batch_ids(step)[self._read_positions]
        rows = self.source.read(ids)
        read = time.perf_counter()
        batch = self._assemble(step, ids, rows)
        self.telemetry.record_read(read - started, time.perf_counter() - read)
        return batch

    def stats(self) -> LoaderStats:
        """Recent wait, read and assembly times, queue depth, and whether the loader is the bottleneck.

        ``print(loader.stats())`` gives a one-line verdict, e.g. "the loader is not the
        bottleneck: the trainer waited 0.1% of its time (...)".
        """
        return self.telemetry.stats()

    def _assemble(self, step: int, ids: np.ndarray, rows: Rows) -> Batch:
        got = _leaves_of(rows)
        if got.keys() != self._leaves.keys():
            raise ValueError(
                f"step {step}: the source returned leaves {sorted(map(str, got))}, but its first "
                f"row had {sorted(map(str, self._leaves))}; every read must return the same leaves"
            )
        out = {}
        for key, leaf in self._leaves.items():
            data = np.asarray(got[key])
            expected = (len(ids), *leaf.global_shape[1:])
            if data.shape != expected or data.dtype != leaf.dtype:
                raise ValueError(
                    f"step {step}: {_leaf_name(key)} rows have shape {data.shape[1:]} and dtype "
                    f"{data.dtype}, but the source's first row had {leaf.global_shape[1:]} "
                    f"{leaf.dtype} (read of {len(ids)} rows, ids {preview_ids(ids)}); every row of a "
                    "source must have one shape and dtype"
                )
            select = self._selects[key]
            out[key] = leaf.assemble(data if select is None else data[select])
        return out[None] if None in out else out  # type: ignore[return-value]

    # ----------------------------------------------------------------------------- iteration
    def iter_from(self, step: int) -> Prefetcher[Batch]:
        """An iterator over the batches of steps ``step, step + 1, ...``, prefetched."""
        check_int("step", step, minimum=0)
        with self._lock:
            if self._closed:
                raise LoaderClosedError(
                    "this DataLoader is closed; create a new DataLoader to read again"
                )
            self._iterators = [it for it in self._iterators if not it.closed]
            iterator: Prefetcher[Batch] = Prefetcher(
                self.batch_at,
                start=step,
                depth=self.prefetch,
                name=f"{self.name}-{step}",
                observer=self.telemetry.record_next,
            )
            self._iterators.append(iterator)
        return iterator

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_from(0)

    def close(self) -> None:
        """Stops every iterator this loader started and joins their threads; idempotent."""
        with self._lock:
            self._closed = True
            iterators, self._iterators = self._iterators, []
        for iterator in iterators:
            iterator.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.source.describe()}, global_batch_size={self.global_batch_size}, "
            f"batch_spec={self.batch_spec}, process {self.process_index} reads "
            f"{len(self._read_positions)} rows/step)"
        )


def default_batch_spec(mesh: Mesh) -> PartitionSpec:
    """``P(batch axes)``: the mesh axes named like batch axes (`DEFAULT_BATCH_AXES`), in mesh order.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("replica", "data", "model"))
        >>> default_batch_spec(mesh)
        P(('replica', 'data'),)
    """
    axes = tuple(a for a in mesh.axis_names if a in DEFAULT_BATCH_AXES)
    if not axes:
        raise ValueError(
            f"the mesh axes {tuple(mesh.axis_names)} include none of the usual batch axes "
            f"{DEFAULT_BATCH_AXES}; pass batch_spec=PartitionSpec(<your batch axes>)"
        )
    return PartitionSpec(axes[0] if len(axes) == 1 else axes)


def _leaves_of(rows: Rows) -> dict[str | None, np.ndarray]:
    """A read's leaves by name; an array source's single leaf is named ``None``."""
    if isinstance(rows, dict):
        return {str(k): v for k, v in rows.items()}
    return {None: rows}


def _selection(read_positions: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """Where a leaf's rows sit in the host's read; ``None`` when they are the read itself."""
    if np.array_equal(read_positions, rows):
        return None
    return np.searchsorted(read_positions, rows)


def _leaf_name(key: str | None) -> str:
    return "the" if key is None else f"leaf {key!r}"
