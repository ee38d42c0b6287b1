"""`StepOffsets` and the schedule-aware `GlobalOrder` against the oracle's offset-by-offset walk
(tests/oracle.py `schedule_spans`): batch-size schedules, skips, drop_last, streams, resume."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from psdp._plan import offsets as offsets_module
from psdp._plan.offsets import StepOffsets
from psdp._plan.order import PAD, GlobalOrder
from tests import oracle

STEPS = 40


@st.composite
def orders(draw, stream: bool = False):
    """Random schedules (1-3 stages), step and offset skips, drop_last, for N in 1..30."""
    n = None if stream else draw(st.integers(1, 30))
    drop_last = False if stream else draw(st.booleans())
    largest = 12 if n is None or not drop_last else min(12, n)
    starts = sorted(draw(st.sets(st.integers(1, STEPS), max_size=2)))
    sizes = draw(
        st.lists(st.integers(1, largest), min_size=len(starts) + 1, max_size=len(starts) + 1)
    )
    schedule = list(zip([0, *starts], sizes, strict=True))
    batch = schedule[0][1] if len(schedule) == 1 and draw(st.booleans()) else schedule
    cuts = sorted(draw(st.sets(st.integers(0, STEPS), max_size=4)))
    skip_steps = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b]
    marks = [] if stream else sorted(draw(st.sets(st.integers(0, 150), max_size=4)))
    skip_offsets = [(a, b) for a, b in zip(marks[::2], marks[1::2], strict=False) if a < b]
    return dict(
        num_rows=n, batch_size=batch, drop_last=drop_last, skip_steps=skip_steps,
        skip_offsets=skip_offsets,
    )  # fmt: skip


def _spans(offsets: StepOffsets, first: int = 0) -> list[oracle.Span]:
    infos = [offsets.info(step) for step in range(first, STEPS)]
    return [oracle.Span(i.offset, i.batch_size, i.rows) for i in infos]


@settings(max_examples=300, deadline=None)
@given(orders())
def test_step_offsets_match_the_walk_one_offset_at_a_time(kwargs):
    offsets = StepOffsets.create(**kwargs)
    assert _spans(offsets) == oracle.schedule_spans(steps=STEPS, **kwargs)


@settings(max_examples=100, deadline=None)
@given(orders(stream=True))
def test_a_stream_has_one_endless_epoch(kwargs):
    offsets = StepOffsets.create(**kwargs)
    assert _spans(offsets) == oracle.schedule_spans(steps=STEPS, **kwargs)
    assert all(offsets.info(step).epoch == 0 for step in range(STEPS))


@settings(max_examples=200, deadline=None)
@given(orders(), st.integers(0, STEPS - 1))
def test_resuming_from_a_saved_offset_continues_the_same_walk(kwargs, step):
    """A state saved at ``step`` records `resume_offset`; the walk restarted there (with the same
    skip list, past ones included) gives every later step as the uninterrupted walk did."""
    whole = StepOffsets.create(**kwargs)
    resumed = StepOffsets.create(**kwargs, start=(step, whole.resume_offset(step)))
    assert _spans(resumed, step) == _spans(whole, step)


def test_resuming_at_a_new_skip_applies_it_and_a_saved_one_is_not_applied_twice():
    plain = StepOffsets.create(100, 4)
    # the saved run had no skip; the restore adds (5, 8): step 5 reads what step 8 would have
    added = StepOffsets.create(100, 4, skip_steps=[(5, 8)], start=(5, plain.resume_offset(5)))
    assert added.info(5).offset == plain.info(8).offset == 32
    # the saved run had the skip and saved at its first step: the state's offset is before it
    skipping = StepOffsets.create(100, 4, skip_steps=[(5, 8)])
    again = StepOffsets.create(100, 4, skip_steps=[(5, 8)], start=(5, skipping.resume_offset(5)))
    assert skipping.resume_offset(5) == 20 and again.info(5).offset == 32


def test_a_new_batch_size_applies_from_the_resume_point_without_losing_a_sample():
    before = StepOffsets.create(64, 8)
    after = StepOffsets.create(64, 16, start=(3, before.resume_offset(3)))
    assert [after.info(s).offset for s in range(3, 7)] == [24, 40, 56, 64]
    assert after.info(5).rows == 8  # cut short at the epoch's end: 56..63, then padding
    with pytest.raises(ValueError, match=r"step 2 is before step 3, where this restored"):
        after.info(2)


def test_far_steps_cost_the_same_as_near_ones():
    """O(log(stages + skips)): step 10**15 of a ramp with skips is found by arithmetic."""
    offsets = StepOffsets.create(
        1000, [(0, 64), (10, 128), (100, 256)], skip_steps=[(50, 60)], skip_offsets=[(5, 9)]
    )
    info = offsets.info(10**15)
    assert info.batch_size == 256 and info.epoch == info.offset // 1000


def test_drop_last_with_a_stage_larger_than_the_source_names_the_stage():
    with pytest.raises(ValueError, match=r"stage 1 \(from step 10\) of global_batch_size=16"):
        StepOffsets.create(10, [(0, 4), (10, 16)], drop_last=True)


@settings(max_examples=100, deadline=None)
@given(orders(), st.integers(0, 2**64 - 1), st.booleans())
def test_every_row_once_per_epoch_minus_the_skipped_offsets(kwargs, seed, shuffle):
    """Concatenating every step's real rows gives the order's samples, each once per epoch:
    exactly the rows of the offsets the walk covers, none twice within an epoch."""
    order = GlobalOrder(
        kwargs["num_rows"], kwargs["batch_size"], shuffle, seed, kwargs["drop_last"],
        kwargs["skip_steps"], kwargs["skip_offsets"],
    )  # fmt: skip
    n = kwargs["num_rows"]
    seen: dict[int, list[int]] = {}
    for step, span in enumerate(oracle.schedule_spans(steps=STEPS, **kwargs)):
        ids = order.batch_ids(step)
        assert ids.tolist() == oracle.span_ids(n, span, seed=seed, shuffle=shuffle).tolist()
        assert (ids[span.rows :] == PAD).all() and len(ids) == span.batch_size
        seen.setdefault(span.offset // n, []).extend(ids[: span.rows].tolist())
    for rows in seen.values():
        assert len(rows) == len(set(rows)), "a row twice in one epoch"
    covered = np.concatenate(
        [
            np.arange(s.offset, s.offset + s.rows)
            for s in oracle.schedule_spans(steps=STEPS, **kwargs)
        ]
    )
    assert len(covered) == len(set(covered.tolist())), "an offset twice"


@settings(max_examples=300, deadline=None)
@given(orders(), st.integers(0, STEPS))
# a skip starting exactly at an epoch's start that a run's end reaches, with N % B == 0: the
# skip's epoch is short (16 - 3 = 13 rows in steps of 8), found by luck only before
@example(
    dict(num_rows=16, batch_size=8, drop_last=False, skip_steps=[], skip_offsets=[(16, 19)]), 0
)
def test_cuts_short_says_exactly_whether_some_step_holds_padding(kwargs, step):
    """Against the oracle's walk far past the last stage and skip (the steady state then repeats
    every epoch): True exactly when some step from the start on is short."""
    whole = StepOffsets.create(**kwargs)
    start = (step, whole.resume_offset(step))
    spans = oracle.schedule_spans(steps=STEPS + 400, start=start, **kwargs)
    short = any(span.rows < span.batch_size for span in spans)
    assert StepOffsets.create(**kwargs, start=start).cuts_short() == short


@st.composite
def crowded_orders(draw):
    """Up to 12 stages, 8 step skips and 8 offset skips (touching ones included), N in 1..20."""
    n = draw(st.integers(1, 20))
    drop_last = draw(st.booleans())
    starts = sorted(draw(st.sets(st.integers(1, STEPS), max_size=11)))
    sizes = draw(st.lists(st.integers(1, n if drop_last else 9), min_size=len(starts) + 1))
    schedule = list(zip([0, *starts], sizes, strict=False))
    cuts = sorted(draw(st.sets(st.integers(0, STEPS), max_size=16)))
    skip_steps = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b]
    marks = sorted(draw(st.sets(st.integers(0, 200), max_size=16)))
    skip_offsets = [(a, b) for a, b in zip(marks[::2], marks[1::2], strict=False) if a < b]
    return dict(
        num_rows=n, batch_size=schedule[: len(starts) + 1], drop_last=drop_last,
        skip_steps=skip_steps, skip_offsets=skip_offsets,
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(crowded_orders(), st.integers(0, STEPS - 1))
def test_many_stages_and_skips_match_the_walk_and_resume_on_it(kwargs, step):
    """The anchored walk (runs recorded once, a step found from the last one before it) equals
    the oracle's offset-by-offset walk, from step 0 and from a saved offset."""
    whole = StepOffsets.create(**kwargs)
    assert _spans(whole) == oracle.schedule_spans(steps=STEPS, **kwargs)
    start = (step, whole.resume_offset(step))
    resumed = StepOffsets.create(**kwargs, start=start)
    assert _spans(resumed, step) == oracle.schedule_spans(steps=STEPS, start=start, **kwargs)


def _calls(action: Callable[[], object]) -> int:
    """The Python calls made in psdp/_plan/offsets.py while ``action`` runs: its work, counted
    (deterministic, unlike a time)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event == "call" and frame.f_code.co_filename == offsets_module.__file__

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return count


def _ramp_with_skips(stages: int, skips: int) -> dict:
    """A stage every 10 steps; ``skips`` step skips and as many offset skips, spread out."""
    gap = 10 * stages // skips
    return dict(
        num_rows=10**6,
        batch_size=[(10 * i, 64 + 32 * (i % 4)) for i in range(stages)],
        skip_steps=[(gap * j + 1, gap * j + 3) for j in range(skips)],
        skip_offsets=[(150_000 + 997 * j, 150_005 + 997 * j) for j in range(skips)],
    )


def test_building_costs_linear_work_and_a_step_constant_work():
    """docs/concepts/order-and-resume.md: building is O((stages + skips) log skips), a step O(log(stages + skips))
    (bisections, in C). 4x the stages and skips is about 4x the calls to build (not 16x), and a
    step's lookup makes a few calls at either size (the old walk made thousands)."""
    small, large = _ramp_with_skips(100, 50), _ramp_with_skips(400, 200)
    built = [StepOffsets.create(**small), StepOffsets.create(**large)]
    work = [_calls(lambda kw=kw: StepOffsets.create(**kw)) for kw in (small, large)]
    assert work[1] <= 5 * work[0], work
    steps = [*np.random.default_rng(0).integers(0, 4000, 100).tolist(), 10**15]
    for offsets in built:
        lookups = [_calls(lambda s=s, o=offsets: o.info(s)) for s in steps]
        assert max(lookups) <= 30, max(lookups)  # 7 or 11 calls; a far step's epoch jumps 24
