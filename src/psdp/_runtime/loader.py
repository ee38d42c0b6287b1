"""The `DataLoader`: a thin iterator over a frozen `LoaderPlan`, a feed and a `StepReader`
(``docs/concepts/loader.md``; the parts: ``docs/concepts/architecture.md``)."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from psdp._checks import check_int
from psdp._plan.layout import MeshLayout
from psdp._plan.leaves import leaf_label, unwrap
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.mesh import as_layout
from psdp._plan.offsets import StepInfo, stages_of
from psdp._plan.options import (
    LoaderOptions,
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
    read_threads_limit,
)
from psdp._runtime.agreement import agree, check_own_process, failures_published
from psdp._runtime.assembly import BatchAssembler, LeafAssembler, domain_mask, halo_mask
from psdp._runtime.feeds import open_feed
from psdp._runtime.iterator import Iterators, LoaderIterator
from psdp._runtime.prefetch import LoaderClosedError
from psdp._runtime.state import (
    agreed_settings,
    check_restored,
    check_state,
    loader_state,
    restored_order,
)
from psdp._runtime.step_reader import StepReader, read_first_row
from psdp._runtime.telemetry import LoaderStats, Telemetry

__all__ = ["DataLoader", "LoaderIterator"]

Batch = Any  # a jax.Array, or a dict of jax.Arrays / haliax NamedArrays
DEFAULT_NAME = "psdp-loader"  # of a loader and its threads


class DataLoader:
    """Feeds global batches to a mesh; each host reads only what its devices hold.

    Args:
        source: a numpy array ``(N, ...)``, a dict of such arrays (a dict batch), a psdp source,
            any object with ``__len__`` and a batched ``__getitem__(ids)``, a list of records
            (each an array or a dict of arrays), or a `StreamSource`.
        mesh: the `jax.sharding.Mesh` the batch lives on.
        order: the order option group (`OrderOptions`); like each group below, or pass its
            fields as flat keywords, e.g. ``global_batch_size=8, batch_spec="batch"``. Each
            option: ``docs/reference/config.md``.
        sharding: the sharding option group (`ShardingOptions`).
        output: the output option group (`OutputOptions`).
        reading: the reading option group (`ReadingOptions`).
        **options: the option groups' fields as flat keywords (instead of the groups).
        process_index: this host; defaults to ``jax.process_index()``.
        name: the prefetch threads' name.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> tokens = np.arange(64, dtype=np.int32).reshape(32, 2)
        >>> with DataLoader(tokens, mesh=mesh, global_batch_size=8, shuffle=False) as loader:
        ...     batch = next(iter(loader))
        >>> batch.sharding.spec, np.asarray(batch)[:, 0].tolist()
        (P('data',), [0, 2, 4, 6, 8, 10, 12, 14])

        Dict batches carry a ``mask`` leaf; a batch of 6 on 4 data shards is padded to 8 rows,
        and the mask says which are real:

        >>> data = {"tokens": np.arange(10, dtype=np.int32)}
        >>> with DataLoader(data, mesh=mesh, global_batch_size=6, shuffle=False) as loader:
        ...     batch = next(iter(loader))
        >>> np.asarray(batch["tokens"]).tolist(), np.asarray(batch["mask"]).tolist()
        ([0, 1, 2, 3, 4, 5, 0, 0], [True, True, True, True, True, True, False, False])
    """

    def __init__(
        self,
        source: Any,
        *,
        mesh: Mesh,
        order: OrderOptions | None = None,
        sharding: ShardingOptions | None = None,
        output: OutputOptions | None = None,
        reading: ReadingOptions | None = None,
        process_index: int | None = None,
        name: str = DEFAULT_NAME,
        **options: Any,
    ):
        layout = _layout_of(mesh)
        # a failure from here on reaches the other hosts, waiting in the agreement below
        with failures_published(layout.processes, f"building DataLoader {name!r}"):
            self.options = LoaderOptions.create(order, sharding, output, reading, **options)
            self.mesh, self.name = mesh, name
            self.feed = open_feed(source, self.options.order)
            self.source, self.order = self.feed.source, self.feed.order
            self.process_index = check_own_process(layout, process_index)
            reading = self.options.reading
            order = self.options.order
            batch_sizes = [s.batch_size for s in stages_of(order.global_batch_size)]  # type: ignore[arg-type]
            keys = self.feed.plan_keys(batch_sizes)
            # each length stage's rows have their own width: one first row per stage
            first_rows = {k: read_first_row(self.feed, reading, k) for k in set(keys.values())}
            #: the frozen plan of this host's steps, per batch size of the schedule (and length
            #: stage, for `StagedTokens`: ``(batch size, stage)``)
            self.plans = {
                key: LoaderPlan.create(
                    first_rows[stage],
                    mesh,
                    dataclasses.replace(
                        self.options,
                        order=dataclasses.replace(order, global_batch_size=_batch_of(key)),
                    ),
                    self.process_index,
                    layout=layout,
                    stream=self.feed.stream,
                    ends_short=self.feed.ends_short,
                    zero_rows_weigh_nothing=getattr(
                        self.feed.source, "zero_rows_weigh_nothing", False
                    ),
                )
                for key, stage in keys.items()
            }
            self.start_step = order.start[0]
            #: the plan of the first step (`plans` has every batch size's)
            first = self.feed.step_info(self.start_step)
            self.plan = self.plans[self.feed.plan_key(first)]
            #: the plan whose leaves a state records: length stage 0's, whatever the step
            self._record_plan = self.plans[
                next(k for k, s in keys.items() if s == 0 and _batch_of(k) == first.batch_size)
            ]
            _check_continue_halos(self.plan, self.source)
            _check_stage_context(self.plan, self.source, mesh)
            self.telemetry = Telemetry(stall_warning_s=reading.stall_warning_s)
            self._readers = {
                k: StepReader(p, self.feed, reading.read_timeout_s, self.telemetry)
                for k, p in self.plans.items()
            }
            self._assemblers = {k: BatchAssembler(p) for k, p in self.plans.items()}
            self._iterators = Iterators()
            self._lock = threading.Lock()
            self._closed = False
            self._direct_reads = 0  # batch_at calls, numbered alike on every host (stream ends)
            self._iterations = 0  # iterators started, numbered alike on every host (stream ends)
        namespace = agree(
            agreed_settings(self.options.order, self.feed, self._record_plan),
            layout.processes,
            f"built DataLoader {self.name!r}",
        )
        self.feed.start(self.plans, namespace)

    @property
    def global_batch_size(self) -> int | tuple[tuple[int, int], ...]:
        """Real rows per global batch: an int, or the schedule's ``(start_step, rows)`` stages
        (each step's: `step_info`)."""
        return self.options.order.global_batch_size  # type: ignore[return-value]

    def step_info(self, step: int) -> StepInfo:
        """Where ``step`` lies, without reading data: its first sample offset, batch size, real
        rows and epoch (what a trainer logs; ``docs/concepts/order-and-resume.md``, "Offsets, schedules and skips").

        Examples:
            >>> import jax, numpy as np
            >>> from jax.sharding import Mesh
            >>> mesh = Mesh(np.array(jax.devices()), ("data",))
            >>> ramp = [(0, 8), (2, 16)]
            >>> data = {"x": np.arange(100, dtype=np.int32)}
            >>> with DataLoader(data, mesh=mesh, global_batch_size=ramp) as loader:
            ...     loader.step_info(3)
            StepInfo(step=3, offset=32, batch_size=16, rows=16, epoch=0)
        """
        check_int("step", step, minimum=0)
        return self.feed.step_info(step)

    @property
    def batch_spec(self) -> Any:
        """Each leaf's `PartitionSpec` (one spec for an array source)."""
        return unwrap(self.plan.specs)

    @property
    def dtypes(self) -> Any:
        """The dtype each leaf is delivered in (one dtype for an array source)."""
        return unwrap({k: v.delivered for k, v in self.plan.dtypes.items()})

    def leaf(self, key: str | None = None) -> LeafAssembler:
        """The `LeafAssembler` of one leaf at the first step's batch size: its global shape,
        sharding and windows."""
        return self._assemblers[self.feed.plan_key(self.step_info(self.start_step))].leaves[key]

    def halo_mask(self, key: str | None = None, dim: int | None = None) -> jax.Array:
        """Which positions of a windowed leaf's dimension ``dim`` are halo positions (``True``),
        as a global array sharded like that dimension, the same every step (``dim`` may be left
        out when the leaf has one windowed dimension; ``docs/concepts/partitioning.md``)."""
        return halo_mask(self.plan.leaves[key], key, dim)

    def domain_mask(self, key: str | None = None, dim: int | None = None) -> jax.Array:
        """Which positions of a windowed leaf's dimension ``dim`` lie inside the domain
        (``True``): ``False`` for an uneven domain's padding and for halo positions beyond its
        edges (``docs/concepts/partitioning.md``)."""
        return domain_mask(self.plan.leaves[key], key, dim)

    def batch_at(self, step: int) -> Batch:
        """Reads and assembles the batch of ``step`` on the calling thread (no prefetch).

        The way to peek at a batch during training: no iterator, no thread, and `state` is
        unaffected. For a stream on several hosts, every host must make the same calls.
        """
        with self._lock:
            self._direct_reads += 1
            run = f"d{self._direct_reads}"
        return self._batch(step, run, lambda: self._closed)

    def _batch(self, step: int, run: str, stop: Callable[[], bool]) -> Batch:
        """The batch of ``step`` for the read named ``run`` (an iterator, or a direct call)."""
        key = self.feed.plan_key(self.step_info(step))
        started = time.perf_counter()
        ids, buffers = self._readers[key].read_step(step, run, stop)
        read = time.perf_counter()
        batch = self._assemblers[key].assemble(ids, buffers)
        self.telemetry.record_read(read - started, time.perf_counter() - read)
        return batch

    def stats(self) -> LoaderStats:
        """Recent wait, read and assembly times, queue depth, and whether the loader is the
        bottleneck; ``print(loader.stats())`` gives a one-line verdict."""
        return self.telemetry.stats()

    def iter_from(self, step: int) -> LoaderIterator:
        """An iterator over the batches of steps ``step, step + 1, ...``, prefetched.

        Its ``state()`` is the state to save with a checkpoint taken while training from it.
        """
        self.step_info(step)  # raises here, not in a thread, for a step before a restore's start
        reading = self.options.reading
        with self._lock:
            if self._closed:
                raise LoaderClosedError(
                    "this DataLoader is closed; create a new DataLoader to read again"
                )
            self._iterations += 1
            run = f"i{self._iterations}"
            threads = self.feed.read_threads(reading.read_threads)
            return self._iterators.add(
                lambda: LoaderIterator(
                    lambda step, stopped: self._batch(step, run, lambda: stopped() or self._closed),
                    self._state_at,
                    start=step,
                    depth=reading.prefetch,
                    name=f"{self.name}-{step}",
                    observer=self.telemetry.record_next,
                    read_threads=threads,
                    max_read_threads=read_threads_limit(reading.read_threads, threads),
                )
            )

    def __iter__(self) -> LoaderIterator:
        """Iterates from `start_step` (0, or the step of a restored `state`)."""
        return self.iter_from(self.start_step)

    def __len__(self) -> int:
        """The batches ``iter(loader)`` yields, for a finite loader (``epochs``); known before
        any read. An endless loader raises `TypeError`, as ``len()`` of an iterator does."""
        end = self.feed.end_step
        if end is None:
            raise TypeError(
                "an endless DataLoader has no length: it yields batches until closed; pass "
                "epochs=N (or build it with psdp.eval_loader) for a finite one"
            )
        return max(0, end - self.start_step)

    def __bool__(self) -> bool:
        # a loader is always truthy: without this, `if loader:` would call `__len__`, which
        # raises for an endless loader and is 0 for a finite one restored at its end
        return True

    def state(self) -> dict[str, Any]:
        """A small JSON-able record to resume from: the next step and what the order depends on.

        The step is the one the open iterator hands out next (`start_step` before any; the last
        one's once all are closed). With two open iterators it is ambiguous, so this raises: save
        ``it.state()`` of the iterator you train from (``docs/reference/reliability.md``).
        """
        return self._state_at(self._iterators.next_step(self.start_step))

    def _state_at(self, step: int) -> dict[str, Any]:
        return loader_state(step, self.options.order, self.feed, self._record_plan)

    @classmethod
    def restore(
        cls, state: Mapping[str, Any], source: Any, *, mesh: Mesh, **kwargs: Any
    ) -> DataLoader:
        """A loader that continues from a saved `state` (``iter(loader)`` starts at its step).

        ``kwargs`` are other `DataLoader` arguments. The mesh, host count and batch size (or its
        schedule), skips and ``drop_last`` may differ from the saved run's: they apply from the
        resume step on, and no sample is repeated or lost. The seed and shuffle come from the
        state; giving a different value is an error (``docs/reference/reliability.md``).
        """
        name = kwargs.get("name", DEFAULT_NAME)
        with failures_published(_layout_of(mesh).processes, f"restoring DataLoader {name!r}"):
            state = check_state(state)
            order = restored_order(state, kwargs)
        loader = cls(source, mesh=mesh, order=order, **kwargs)
        try:
            check_restored(state, loader._record_plan, loader.feed.rows, loader.name, loader.source)
        except BaseException:
            loader.close()
            raise
        return loader

    def close(self) -> None:
        """Stops every iterator this loader started and joins their threads; idempotent."""
        with self._lock:
            self._closed = True
        self._iterators.close()
        self.feed.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.source.describe()}, global_batch_size={self.global_batch_size}, "
            f"batch_spec={self.batch_spec}, process {self.process_index} reads "
            f"{len(self.plan.read_positions)} rows/step)"
        )


def _layout_of(mesh: Any) -> MeshLayout:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    return as_layout(mesh)


def _check_stage_context(plan: LoaderPlan, source: Any, mesh: Mesh) -> None:
    """A source of length stages whose rows are split along the sequence (a leaf's dimension 1
    over mesh axes) needs every stage's ``seq_len`` to divide by those axes' devices, so each
    device holds whole, equal columns at every length."""
    starts = getattr(source, "stage_starts", None)
    if starts is None:
        return
    for key, spec in plan.specs.items():
        axes = spec[1] if len(spec) > 1 else None
        if axes is None:
            continue
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        devices = math.prod(mesh.shape[a] for a in axes)
        for index in range(len(starts)):
            seq_len = source.stage(index).seq_len
            if seq_len % devices:
                raise ValueError(
                    f"length stage {index}'s seq_len={seq_len} does not divide by the context "
                    f"axis of {devices} devices (dimension 1 of {leaf_label(key)} split over "
                    f"{axes}); every device holds seq_len / {devices} columns, so give the stage "
                    f"a seq_len that is a multiple of {devices}, e.g. "
                    f"{max(devices, seq_len // devices * devices)}"
                )


def _batch_of(key: Any) -> int:
    """The batch size of a plan's key (``batch size`` or ``(batch size, stage)``)."""
    return key if isinstance(key, int) else key[0]


def _check_continue_halos(plan: LoaderPlan, source: Any) -> None:
    """A ``continue`` halo asks the source for entries before 0 and past a row's end: only a
    source that stores rows back to back (``continues_rows``) has them; any other would wrap
    or clip them into wrong data."""
    if getattr(source, "continues_rows", False) is True:
        return
    for key, leaf in plan.leaves.items():
        for d, halo in zip(leaf.windowed, leaf.halos, strict=True):
            if halo.boundary == "continue":
                raise ValueError(
                    f"the halo of {leaf_label(key)} on dimension {d} has boundary 'continue', "
                    f"but the source {source.describe() if hasattr(source, 'describe') else type(source).__name__} "
                    "does not continue its rows (only a source with continues_rows = True, such "
                    "as TokenSequences, serves entries beyond a row's ends); use 'pad' or "
                    "'periodic'"
                )
