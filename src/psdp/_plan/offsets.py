"""Steps on the sample offset: which offsets each step covers, under a batch-size schedule and skips.

The samples a run consumes are numbered by their **sample offset** ``g = 0, 1, 2, ...``; epoch
``g // N`` holds offsets ``[e N, (e + 1) N)``. A step with batch size ``B`` covers the offsets
``[g, g + B)`` from its start ``g``, cut short where a *run* of offsets ends: an epoch's end, or
the start of a skipped range. A short step is padded (or, with ``drop_last``, dropped: the next
step starts at the next run). One walk from the start, run by run (whole epochs jumped by
arithmetic), turns step skips into offsets and records where each run starts; a step is then
found from the last run start before it, in O(log(stages + skips)) wherever it lies:
``docs/concepts/order-and-resume.md``, "Offsets, schedules and skips".
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

#: Beyond every step and offset a run reaches: the end of an endless run (a stream's, or the
#: last stage's). An int, so the arithmetic stays exact.
_NEVER = 1 << 128


class Stage(NamedTuple):
    """From step ``start`` on (until the next stage), each step holds ``batch_size`` rows."""

    start: int
    batch_size: int


@dataclass(frozen=True)
class StepInfo:
    """What a step covers, known without reading data.

    Examples:
        >>> StepInfo(step=3, offset=24, batch_size=8, rows=8, epoch=0)
        StepInfo(step=3, offset=24, batch_size=8, rows=8, epoch=0)
    """

    step: int
    #: the sample offset of the step's first row
    offset: int
    #: rows of the step's global batch (real rows plus padding)
    batch_size: int
    #: real rows: ``batch_size`` unless the step is cut short by an epoch's end or a skip
    rows: int
    #: the epoch of its rows (0 for a stream)
    epoch: int


def stages_of(batch_size: int | Sequence[tuple[int, int]]) -> tuple[Stage, ...]:
    """The stages of a batch size: an int is one stage from step 0.

    Examples:
        >>> stages_of(256)
        (Stage(start=0, batch_size=256),)
        >>> stages_of([(0, 64), (100, 128)])[1]
        Stage(start=100, batch_size=128)
    """
    if isinstance(batch_size, int):
        return (Stage(0, batch_size),)
    return tuple(Stage(int(start), int(size)) for start, size in batch_size)


@dataclass(frozen=True)
class StepOffsets:
    """Step -> (offset, batch size, real rows, epoch) for a schedule and skips (pure).

    Build it with `StepOffsets.create`. ``skips`` are sorted, disjoint offset ranges (step skips
    already turned into offsets); ``start`` is the (step, offset) the walk begins at: ``(0, 0)``,
    or where a restored run resumed.

    Examples:
        >>> offsets = StepOffsets.create(10, [(0, 4), (3, 2)])
        >>> [(i.offset, i.rows, i.epoch) for i in map(offsets.info, range(6))]
        [(0, 4, 0), (4, 4, 0), (8, 2, 0), (10, 2, 1), (12, 2, 1), (14, 2, 1)]
    """

    num_rows: int | None
    stages: tuple[Stage, ...]
    skips: tuple[tuple[int, int], ...]
    drop_last: bool
    start: tuple[int, int]
    #: the skips as given (``skips`` holds both as offset ranges)
    skip_steps: tuple[tuple[int, int], ...]
    skip_offsets: tuple[tuple[int, int], ...]
    #: the cuts of the offset line (``skips``, epochs' ends), to bisect
    line: _Line = field(repr=False, compare=False)
    #: (step, offset) where the walk from ``start`` began each run it crossed: a step is found
    #: from the last one at or before it in O(1) bisections
    anchors: tuple[tuple[int, int], ...] = field(repr=False, compare=False)
    #: step skip's first step -> the offset that step would start at without the skip
    unskipped: Mapping[int, int] = field(repr=False, compare=False)

    @classmethod
    def create(
        cls,
        num_rows: int | None,
        batch_size: int | Sequence[tuple[int, int]],
        *,
        drop_last: bool = False,
        skip_steps: Sequence[tuple[int, int]] = (),
        skip_offsets: Sequence[tuple[int, int]] = (),
        start: tuple[int, int] = (0, 0),
    ) -> StepOffsets:
        """Checks the schedule against the source and turns step skips into offset ranges.

        ``num_rows``: the source's rows (``None``: a stream, one endless run). Step skips starting
        before ``start``'s step are done and ignored; one starting at it applies from there.
        One walk from ``start`` does it all, in O((stages + skips) log skips): each step skip is
        turned into offsets when the walk reaches its first step (the walk before it does not
        depend on it), and the walk goes on past the last cut, recording where each run starts.
        """
        stages = stages_of(batch_size)
        if drop_last and num_rows is not None:
            for index, stage in enumerate(stages):
                if stage.batch_size > num_rows:
                    raise ValueError(
                        f"drop_last=True with a source of {num_rows} rows and stage {index} "
                        f"(from step {stage.start}) of global_batch_size={stage.batch_size} "
                        "would yield no batch at all; use batches of at most "
                        f"{num_rows} rows or set drop_last=False (the short batch is then padded "
                        "and masked)"
                    )
        start = (operator.index(start[0]), operator.index(start[1]))
        steps = tuple(sorted((int(a), int(b)) for a, b in skip_steps))
        given = _merged(skip_offsets)
        line = _Line(num_rows, drop_last, given)
        anchors = [start]
        unskipped: dict[int, int] = {}
        at, offset = start
        for first, end in steps:
            if first < start[0]:
                continue  # already behind the walk's start, so already in its offset
            at, offset = _walk(line, stages, at, offset, first, anchors.append)
            skipped = line.next_start(offset, _stage(stages, first).batch_size)
            unskipped.setdefault(first, skipped)
            _, phantom = _walk(line, stages, first, offset, end)  # the steps it skips
            line.skip(skipped, line.next_start(phantom, _stage(stages, end).batch_size))
        # on to every stage and past every skip (a step moves the walk on by >= 1 offset): the
        # runs after that are whole epochs, or one endless run, so any later step is O(1) away
        last_cut = line.ends[-1] if line.ends else 0
        beyond = max(stages[-1].start, at) + 1 + max(0, last_cut - offset)
        _walk(line, stages, at, offset, beyond, anchors.append)
        return cls(
            num_rows, stages, line.ranges(), drop_last, start, steps, given, line,
            tuple(anchors), unskipped,
        )  # fmt: skip

    def resume_offset(self, step: int) -> int:
        """The offset a state saved at ``step`` records: ``info(step).offset``, but before a step
        skip that starts at ``step`` (a restore with that skip applies it again, one without it
        does not: either way as the skip list says)."""
        if step in self.unskipped:
            return self.unskipped[step]
        return self.info(step).offset

    def stage_at(self, step: int) -> Stage:
        """The stage in effect at ``step``."""
        return _stage(self.stages, step)

    def info(self, step: int) -> StepInfo:
        """Where ``step`` lies: its offset, batch size, real rows and epoch."""
        step = operator.index(step)
        if step < self.start[0]:
            raise ValueError(
                f"step {step} is before step {self.start[0]}, where this restored loader's order "
                "resumes; the earlier steps depend on the saved run's settings: read them with a "
                "loader of those settings (not restored)"
            )
        at, offset = self.anchors[bisect.bisect_right(self.anchors, (step, math.inf)) - 1]
        batch = self.stage_at(step).batch_size
        # no stage starts and no cut lies between the anchor and the step: O(1) moves
        _, offset = self.line.advance(at, offset, batch, step)
        offset = self.line.next_start(offset, batch)
        rows = min(batch, self.line.run_end(offset) - offset)
        epoch = 0 if self.num_rows is None else offset // self.num_rows
        return StepInfo(step, offset, batch, rows, epoch)

    def end_step(self, epochs: int) -> int:
        """Where a run of ``epochs`` epochs ends: the first step from ``start`` whose first offset
        lies in epoch ``epochs`` or later. A bisection over `info`: a step covers at least one
        offset, so the end lies within ``epochs * N - start offset`` steps of the start.

        Examples:
            >>> StepOffsets.create(10, 4).end_step(1), StepOffsets.create(10, 4, drop_last=True).end_step(2)
            (3, 4)
        """
        assert self.num_rows is not None  # a stream has no epochs
        return self.step_at(epochs * self.num_rows)

    def step_at(self, offset: int) -> int:
        """The first step from ``start`` whose first offset is ``offset`` or later. A bisection
        over `info`: a step covers at least one offset, so it lies within ``offset - start
        offset`` steps of the start.

        Examples:
            >>> StepOffsets.create(10, 4).step_at(5), StepOffsets.create(10, 4).step_at(8)
            (2, 2)
        """
        low, high = self.start[0], self.start[0] + max(0, offset - self.start[1])
        while low < high:
            middle = (low + high) // 2
            if self.info(middle).offset >= offset:
                high = middle
            else:
                low = middle + 1
        return low

    def cuts_short(self) -> bool:
        """Whether some step from ``start`` on is cut short (so holds padding): never with
        drop_last; otherwise where a run's length is not a multiple of the batch walking it.

        Examples:
            >>> StepOffsets.create(64, [(0, 8), (2, 16)]).cuts_short()  # 16 + 16k reaches 64
            False
            >>> StepOffsets.create(64, [(0, 8), (1, 16)]).cuts_short()  # 8 + 16k misses it
            True
        """
        if self.drop_last:
            return False
        line, n, at, offset = self.line, self.num_rows, self.start[0], self.start[1]
        stages = [s for s in self.stages if s.start > at]
        for batch, target in zip(
            [self.stage_at(at).batch_size] + [s.batch_size for s in stages],
            [s.start for s in stages] + [_NEVER],
            strict=True,
        ):
            while at < target:
                offset = line.next_start(offset, batch)
                cut = line.run_end(offset)
                if cut == _NEVER:
                    break  # a stream with no skip ahead: never cut again in this stage
                last = target == _NEVER and line.next_skip(offset) is None
                if last and n is not None and offset % n == 0:
                    return n % batch != 0  # every later run is a whole epoch
                steps = line.steps(cut - offset, batch)
                if at + steps > target:  # the stage ends inside this run
                    offset, at = offset + (target - at) * batch, target
                    break
                if (cut - offset) % batch:
                    return True
                at, offset = at + steps, cut
                if n is not None and offset % n == 0 and line.run_end(offset) - offset == n:
                    per_epoch = line.steps(n, batch)
                    epochs = min((target - at) // per_epoch, line.free_epochs(offset))
                    if epochs and n % batch:
                        return True
                    at, offset = at + epochs * per_epoch, offset + epochs * n
        return False


class _Line:
    """The cuts of the offset line, sorted disjoint skipped ranges and epochs' ends, and the walk
    of steps along them; every question is a bisection of the skips. `StepOffsets.create` adds
    the skips of step skips while it walks; read-only after."""

    def __init__(
        self, num_rows: int | None, drop_last: bool, skips: Sequence[tuple[int, int]]
    ) -> None:
        self.num_rows = num_rows
        self.drop_last = drop_last
        self.firsts = [first for first, _ in skips]
        self.ends = [end for _, end in skips]

    def skip(self, first: int, end: int) -> None:
        """Skips ``[first, end)`` too, merged with the ranges it overlaps or touches."""
        low = bisect.bisect_left(self.ends, first)
        high = bisect.bisect_right(self.firsts, end)
        if low < high:
            first, end = min(first, self.firsts[low]), max(end, self.ends[high - 1])
        self.firsts[low:high], self.ends[low:high] = [first], [end]

    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.firsts, self.ends, strict=True))

    def advance(
        self,
        at: int,
        offset: int,
        batch: int,
        target: int,
        record: Callable[[tuple[int, int]], None] | None = None,
    ) -> tuple[int, int]:
        """(step, offset) after stepping from ``at`` to ``target`` with batches of ``batch``;
        ``record`` gets the (step, offset) where each run's walk begins."""
        n = self.num_rows
        while at < target:
            offset = self.next_start(offset, batch)
            if record is not None:
                record((at, offset))
            cut = self.run_end(offset)
            if n is not None and offset % n == 0 and cut - offset == n:
                # whole epochs with no skip inside: jump over as many as the target allows
                per_epoch = self.steps(n, batch)
                # with drop_last an epoch's tail is dropped or not by the *next* step's batch
                # size, which may be another stage's: the last epoch is walked, not jumped
                room = target - at - (1 if self.drop_last else 0)
                epochs = min(room // per_epoch, self.free_epochs(offset))
                at, offset = at + epochs * per_epoch, offset + epochs * n
                if epochs:
                    continue
            steps = self.steps(cut - offset, batch)
            if cut == _NEVER or at + steps > target:  # an endless run holds every later step
                return target, offset + (target - at) * batch
            # the run's last step ends at its cut, or (drop_last) where the whole batches end
            at, offset = at + steps, min(cut, offset + steps * batch)
        return at, offset

    def steps(self, length: int, batch: int) -> int:
        """Steps in a run of ``length`` offsets (a short last one is dropped with drop_last)."""
        return length // batch if self.drop_last else -(-length // batch)

    def free_epochs(self, offset: int) -> int:
        """Whole epochs from ``offset`` (an epoch's start) before the next skip's epoch."""
        assert self.num_rows is not None
        first = self.next_skip(offset)
        if first is None:
            return _NEVER
        return first // self.num_rows - offset // self.num_rows

    def next_skip(self, offset: int) -> int | None:
        """The first offset of the first skip starting at or after ``offset``, if any."""
        index = bisect.bisect_left(self.firsts, offset)
        return self.firsts[index] if index < len(self.firsts) else None

    def next_start(self, offset: int, batch: int) -> int:
        """``offset``, or the first offset at or after it where a step of ``batch`` can start:
        out of skipped ranges, and (with drop_last) in a run with room for a whole batch."""
        while True:
            inside = bisect.bisect_right(self.firsts, offset) - 1
            if inside >= 0 and offset < self.ends[inside]:
                offset = self.ends[inside]
                continue
            cut = self.run_end(offset)
            if self.drop_last and cut - offset < batch:
                offset = int(cut)
                continue
            return offset

    def run_end(self, offset: int) -> int:
        """Where the run holding ``offset`` ends: its epoch's end or the next skip's start."""
        index = bisect.bisect_right(self.firsts, offset)
        end = self.firsts[index] if index < len(self.firsts) else _NEVER
        if self.num_rows is not None:
            end = min(end, (offset // self.num_rows + 1) * self.num_rows)
        return end


def _walk(
    line: _Line,
    stages: tuple[Stage, ...],
    at: int,
    offset: int,
    target: int,
    record: Callable[[tuple[int, int]], None] | None = None,
) -> tuple[int, int]:
    """(step, offset) after walking from ``at`` to ``target``, each stage with its batch size."""
    while at < target:
        index = bisect.bisect_right(stages, (at, math.inf)) - 1
        end = stages[index + 1].start if index + 1 < len(stages) else _NEVER
        at, offset = line.advance(at, offset, stages[index].batch_size, min(target, end), record)
    return at, offset


def _stage(stages: tuple[Stage, ...], step: int) -> Stage:
    """The stage in effect at ``step`` (the last starting at or before it)."""
    return stages[bisect.bisect_right(stages, (step, math.inf)) - 1]


def _merged(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted offset ranges, overlapping or touching ones merged."""
    out: list[tuple[int, int]] = []
    for first, end in sorted((int(a), int(b)) for a, b in ranges):
        if out and first <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((first, end))
    return tuple(out)
