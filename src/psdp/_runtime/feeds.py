"""Feeds: where a step's rows come from, for random-access sources and for streams
(``docs/concepts/loader.md``, ``docs/guides/stores.md``). The loader sees only the `Feed` protocol."""

from __future__ import annotations

import bisect
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from psdp._checks import preview_ids
from psdp._plan.leaves import Key, leaves_of
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.offsets import StepInfo, StepOffsets
from psdp._plan.options import OrderOptions, read_threads_for
from psdp._plan.order import PAD, GlobalOrder
from psdp._runtime.agreement import StreamEnds, describe_end
from psdp._runtime.prefetch import LoaderClosedError
from psdp._runtime.step_reader import stray_stop_iteration
from psdp.sources import ArraySource, StreamReader, StreamSource, as_source
from psdp.sources.base import reads_fresh_rows

logger = logging.getLogger(__name__)

#: a plan's key: the batch size, or ``(batch size, length stage)`` for a source of length stages
PlanKey = int | tuple[int, int]


class Feed(Protocol):
    """A step's rows: its ids in the physical batch, and a source that reads them."""

    #: the source, as `describe` names it
    source: Any
    #: the global order (``None`` for a stream: it has none)
    order: GlobalOrder | None
    #: which sample offsets each step covers
    offsets: StepOffsets
    #: the source's length, part of its fingerprint (``None`` for a stream)
    rows: int | None
    #: whether each host reads a stream shard instead of ids of a global order
    stream: bool
    #: whether a final batch may be short (so batches may hold padding)
    ends_short: bool
    #: whether reads return new arrays (not memory the source refills)
    fresh: bool
    #: the first step past a finite loader's last (``epochs``); ``None``: endless, or a stream
    #: (which ends where its shards end)
    end_step: int | None

    def probe(self) -> dict[Key, np.ndarray]:
        """One row per leaf, ``(1, ...)``: the leaves' names, shapes and dtypes."""
        ...

    def plan_keys(self, batch_sizes: Sequence[int]) -> dict[PlanKey, int]:
        """The plans a run needs, each key with the length stage whose row it is planned for:
        one per batch size (stage 0), or for a source of length stages (`StagedTokens`), one per
        batch size and stage (``(batch_size, stage)``)."""
        ...

    def plan_key(self, info: StepInfo) -> PlanKey:
        """The key of the plan that reads the step at ``info``."""
        ...

    def start(self, plans: Mapping[PlanKey, LoaderPlan], namespace: str | None) -> None:
        """Ready to read steps with the plan of their batch size (``plans``: batch size ->
        plan; ``namespace``: the hosts' agreement, if several)."""
        ...

    def step_info(self, step: int) -> StepInfo:
        """Where ``step`` lies: its offset, batch size, real rows and epoch."""
        ...

    def read_threads(self, requested: int | None) -> int:
        """How many steps may be read concurrently (``requested``: the option, maybe unset)."""
        ...

    def step(self, step: int, run: str, stop: Callable[[], bool]) -> tuple[np.ndarray, Any]:
        """The physical batch's ids (`PAD` for padding) and a source whose ``read(ids)`` serves
        them; raises `StopIteration` where a stream or a finite loader ends. ``run`` names the iteration (hosts of a
        stream agree per run and step), ``stop()`` says it was closed."""
        ...

    def what_is_read(self, step: int) -> str:
        """What this host reads for ``step``, in words (for timeout messages)."""
        ...

    def close(self) -> None:
        """Releases what the feed holds open; idempotent."""
        ...


def open_feed(source: Any, order: OrderOptions) -> Feed:
    """The feed of ``source``: a `StreamFeed` for a `StreamSource`, else a `RandomAccessFeed`."""
    if isinstance(source, StreamSource):
        return StreamFeed(source, order)
    return RandomAccessFeed(as_source(source), order)


class RandomAccessFeed:
    """Rows by id, in the global order of (source length, batch size, seed, shuffle, epoch)."""

    stream = False

    def __init__(self, source: Any, order: OrderOptions) -> None:
        assert order.global_batch_size is not None
        self.source = source
        self.rows: int | None = len(source)
        ordered = orders_itself(source, order)
        shuffle = not ordered and order.shuffle is not False
        self.order: GlobalOrder | None = GlobalOrder(
            len(source),
            order.global_batch_size,
            shuffle,
            order.seed,
            order.drop_last,
            order.skip_steps,
            order.skip_offsets,
            order.start,
            order.io_block
            if order.io_block is not None or not shuffle
            else suggested_block(source),
            order.window_blocks,
        )
        self.offsets = self.order.offsets
        self.epochs = order.epochs
        self.end_step = None if order.epochs is None else self.offsets.end_step(order.epochs)
        # a self-ordered source is endless in practice: its length is a bound no run reaches
        self.ends_short = self.order.pads if not ordered else endless_pads(order)
        self.fresh = reads_fresh_rows(source)  # other reads may be views of memory they refill
        self._plans: Mapping[PlanKey, LoaderPlan] = {}
        # a step's info is asked for by the loader and by the read: walk the schedule once
        self.step_info = functools.lru_cache(maxsize=64)(self.order.step_info)
        #: where each length stage starts (rows of another width each), or ``None``: one width
        self.stage_starts: tuple[int, ...] | None = None
        if ordered and getattr(source, "stage_starts", None) is not None:
            self.stage_starts = tuple(source.stage_starts)
            check_stage_steps(self.offsets, self.stage_starts, source.describe())

    def probe(self, stage: int = 0) -> dict[Key, np.ndarray]:
        """Row 0 of the source (of length stage ``stage``'s rows, for `StagedTokens`)."""
        first = 0 if self.stage_starts is None else self.stage_starts[stage]
        shaped = getattr(self.source, "probe_row", None)  # a row whose leaves cost no read
        try:
            if shaped is not None:
                return leaves_of(shaped(stage))
            return leaves_of(self.source.read(np.full(1, first, np.int64)))
        except StopIteration as err:
            raise stray_stop_iteration(f"the first read (row {first})", self.source) from err

    def plan_keys(self, batch_sizes: Sequence[int]) -> dict[PlanKey, int]:
        if self.stage_starts is None:
            return dict.fromkeys(batch_sizes, 0)
        stages = range(len(self.stage_starts))
        return {(b, k): k for b in batch_sizes for k in stages}

    def plan_key(self, info: StepInfo) -> PlanKey:
        if self.stage_starts is None:
            return info.batch_size
        return info.batch_size, bisect.bisect_right(self.stage_starts, info.offset) - 1

    def start(self, plans: Mapping[PlanKey, LoaderPlan], namespace: str | None) -> None:
        self._plans = plans

    def read_threads(self, requested: int | None) -> int:
        return read_threads_for(requested, bool(getattr(self.source, "reads_storage", False)))

    def ids(self, step: int) -> np.ndarray:
        """The physical batch's source row ids at ``step`` (`PAD` for padding); reads nothing."""
        assert self.order is not None
        info = self.step_info(step)
        plan = self._plans[self.plan_key(info)]
        ids = np.full(plan.physical_batch_size, PAD, np.int64)
        ids[plan.real_positions[: info.rows]] = self.order.rows(info)
        return ids

    def step(self, step: int, run: str, stop: Callable[[], bool]) -> tuple[np.ndarray, Any]:
        if self.end_step is not None and step >= self.end_step:
            epochs = f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
            raise StopIteration(
                f"the loader's {epochs} of {self.rows} rows ended: step {step} is past its last "
                f"step, {self.end_step - 1} (a new iterator makes another pass)"
            )
        ids = self.ids(step)
        if self.stage_starts is None:
            return ids, self.source
        # a length stage's rows are a source of their own, row r at offset start + r
        stage = self.plan_key(self.step_info(step))[1]  # type: ignore[index]
        ids[ids != PAD] -= self.stage_starts[stage]
        return ids, self.source.stage(stage)

    def what_is_read(self, step: int) -> str:
        plan = self._plans[self.plan_key(self.step_info(step))]
        read = self.ids(step)[plan.read_positions]
        return f"{len(read)} rows (ids {preview_ids(read)})"

    def close(self) -> None:
        pass


def check_stage_steps(offsets: StepOffsets, starts: Sequence[int], source: str) -> None:
    """Raises unless each length stage after the resume point starts at a step's first offset
    (a step's rows have one width): the first step at or past the stage's start is found by a
    bisection over the steps (each covers at least one offset), and the step before it must end
    at or before the start.

    Examples:
        >>> check_stage_steps(StepOffsets.create(None, [(0, 16), (4, 8)]), [0, 64], "s")
        >>> check_stage_steps(StepOffsets.create(None, 24), [0, 64], "s")
        Traceback (most recent call last):
            ...
        ValueError: length stage 1 of s starts at sample offset 64, inside step 2 (offsets 48 to 71, global_batch_size=24): a step's rows have one seq_len, so start the stage at a step's first offset (batch sizes that divide the stage's start, or a batch schedule that changes where it starts)
    """
    step0, offset0 = offsets.start
    for index, start in enumerate(starts):
        if start <= offset0:
            continue  # the run resumes past it: no step of this loader crosses it
        low, high = step0, step0 + start - offset0
        while low < high:  # the first step whose offset is >= start
            middle = (low + high) // 2
            if offsets.info(middle).offset >= start:
                high = middle
            else:
                low = middle + 1
        if low == step0:
            continue
        before = offsets.info(low - 1)
        if before.offset + before.rows > start:
            raise ValueError(
                f"length stage {index} of {source} starts at sample offset {start}, inside step "
                f"{before.step} (offsets {before.offset} to {before.offset + before.rows - 1}, "
                f"global_batch_size={before.batch_size}): a step's rows have one seq_len, so "
                "start the stage at a step's first offset (batch sizes that divide the stage's "
                "start, or a batch schedule that changes where it starts)"
            )


def suggested_block(source: Any) -> int | None:
    """The block a source asks its shuffle to take when the loader is given none: its
    ``io_block`` attribute (e.g. `PackedSequences` in windows, whose rows are planned a window at a
    time); ``None`` (a full shuffle) for a source without one."""
    block = getattr(source, "io_block", None)
    return None if block is None else int(block)


def orders_itself(source: Any, order: OrderOptions) -> bool:
    """Whether ``source`` orders its own rows (``orders_itself = True``, e.g. a `Mixture`: row
    ``g`` is sample offset ``g``), so the loader reads its rows in id order; raises if the order
    options ask for a shuffle."""
    if not getattr(source, "orders_itself", False):
        return False
    if order.shuffle or order.io_block is not None:
        asked = "shuffle=True" if order.shuffle else f"io_block={order.io_block}"
        raise ValueError(
            f"{asked} with {source.describe()}, which orders its own rows (a mixture shuffles "
            "inside each source and each block, and its stages follow the sample offset): the "
            "loader's shuffle would scramble its stages; leave shuffle unset (False for such a "
            "source) and drop io_block"
        )
    if order.epochs is not None:
        raise ValueError(
            f"epochs={order.epochs} with {source.describe()}, which orders its own rows: its row g "
            "is sample offset g of an endless draw, so it has no epochs to pass over; evaluate "
            "each of a mixture's sets with a loader of its own, e.g. {name: psdp.eval_loader("
            "source, mesh=mesh, global_batch_size=...) for name, source in mixture.sources.items()}"
        )
    return True


def endless_pads(order: OrderOptions) -> bool:
    """Whether some step is cut short by a skip, in a run with no epoch end."""
    return order.step_offsets(None).cuts_short()


class StreamFeed:
    """The next elements of this host's stream shard, for its real batch positions: hosts with
    the same data-shard uid read the same shard, so they hold the same elements."""

    stream = True
    rows = None
    order = None
    fresh = True
    end_step = None

    def __init__(self, source: StreamSource, order: OrderOptions) -> None:
        if order.shuffle:
            raise ValueError(
                f"shuffle=True with a stream ({source.describe()}): a stream has no random "
                "access, so psdp cannot permute it; shuffle upstream (e.g. a shuffle buffer in "
                "the stream) and pass shuffle=False"
            )
        if order.io_block is not None:
            raise ValueError(
                f"io_block={order.io_block} with a stream ({source.describe()}): a stream has no "
                "random access to shuffle in blocks; drop io_block (and shuffle upstream)"
            )
        if order.epochs is not None:
            raise ValueError(
                f"epochs={order.epochs} with a stream ({source.describe()}): a stream is one pass "
                "already, and iteration ends on every host where its shards end; drop epochs"
            )
        if order.skip_offsets:
            raise ValueError(
                f"skip_offsets={list(order.skip_offsets)} with a stream ({source.describe()}): a "
                "stream's elements have no global offsets to skip; skip whole steps with "
                "skip_steps"
            )
        assert order.global_batch_size is not None
        self.source = source
        self.drop_last = order.drop_last
        self.ends_short = not order.drop_last
        self.offsets = StepOffsets.create(
            None, order.global_batch_size, skip_steps=order.skip_steps, start=order.start
        )
        self.step_info = functools.lru_cache(maxsize=64)(self.offsets.info)
        self._plans: Mapping[PlanKey, LoaderPlan] = {}
        self._shard = (0, 1)
        self._reader: StreamReader | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: per step, which shards of a callable stream ran short, agreed by every host
        self.ends: StreamEnds | None = None

    def probe(self) -> dict[Key, np.ndarray]:
        with self.source.open(0, 1) as reader:
            rows = reader.take(1)
        if rows is None:
            raise ValueError(f"the stream {self.source.describe()} is empty; it needs elements")
        return leaves_of(rows)

    def plan_keys(self, batch_sizes: Sequence[int]) -> dict[PlanKey, int]:
        return dict.fromkeys(batch_sizes, 0)

    def plan_key(self, info: StepInfo) -> PlanKey:
        return info.batch_size

    def start(self, plans: Mapping[PlanKey, LoaderPlan], namespace: str | None) -> None:
        shards = {plan.stream_shard for plan in plans.values()}
        assert len(shards) == 1 and None not in shards  # the uids do not depend on the batch size
        self._plans, self._shard = plans, shards.pop()  # type: ignore[assignment]
        shard, num_shards = self._shard
        offset = self.offsets.start[1]
        if offset % num_shards:
            raise ValueError(
                f"a stream resumes at sample offset {offset}, which its {num_shards} shards "
                "cannot split evenly (each shard has read offset / shards elements); resume on a "
                "mesh with as many stream shards as the run that saved the state"
            )
        plan = next(iter(plans.values()))
        # hosts agree per step where a callable stream's shards (maybe unequally long) end
        if namespace is not None and not self.source.round_robin and num_shards > 1:
            self.ends = StreamEnds(namespace, plan.layout.processes, shard, self.source.describe())

    def read_threads(self, requested: int | None) -> int:
        return 1  # a shard is read in order

    def step(self, step: int, run: str, stop: Callable[[], bool]) -> tuple[np.ndarray, Any]:
        """O(1) per step in order; a jump reopens the shard at the step's offset / shards."""
        info = self.step_info(step)
        plan = self._plans[info.batch_size]
        real = plan.real_read_positions
        per_step = len(real)  # the same on every host (stream_shard checks)
        first = info.offset // self._shard[1]  # each shard holds offset / shards of the elements
        with self._lock:
            reader = self._reader
            if reader is None or reader.consumed != first:
                if self._closed or stop():
                    raise LoaderClosedError("this DataLoader is closed")
                if reader is not None:
                    reader.close()
                reader = self._reader = self.source.open(*self._shard, start=first)
            rows = reader.take(per_step)
        got = 0 if rows is None else len(next(iter(leaves_of(rows).values())))
        shard, num_shards = self._shard
        short = {shard: got} if got < per_step else {}
        if self.ends is not None:  # the other hosts' shards may end first (unequal lengths)
            short = self.ends.short_shards(run, step, got, per_step, stop)
        ended = sorted(u for u, n in short.items() if n == 0 or self.drop_last)
        if ended:
            message = describe_end(step, ended, short, num_shards, self.source.describe())
            if shard not in ended:
                logger.warning("this host's stream shard %d still had elements: %s", shard, message)
            raise StopIteration(message)
        assert rows is not None  # a shard without rows ended above
        ids = np.full(plan.physical_batch_size, PAD, np.int64)
        ids[real[:got]] = np.arange(got)
        return ids, ArraySource(rows)

    def what_is_read(self, step: int) -> str:
        plan = self._plans[self.step_info(step).batch_size]
        return f"the next {len(plan.real_read_positions)} elements of shard {self._shard[0]}"

    def close(self) -> None:
        self._closed = True
        reader, self._reader = self._reader, None  # no lock: a stuck read may hold it forever
        if reader is not None:
            reader.close()  # never waits for a take in progress
