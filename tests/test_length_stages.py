"""Length stages' pure plan (`psdp._plan.length_stages`) against tests/length_oracle.py: the same
rows, each token once per epoch across stages of any lengths, any offset computed alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from psdp._plan.length_stages import LengthPlan, stage_offsets
from psdp._plan.offsets import StepOffsets
from tests.length_oracle import OracleLengthRun


def rows_of(plan: LengthPlan, offsets: np.ndarray) -> list[list[int]]:
    """Each row's store positions, from the plan's store pieces."""
    pieces = plan.store_pieces(offsets)
    out: list[list[int]] = [[] for _ in range(len(offsets))]
    for row, start, count in zip(pieces.row, pieces.start, pieces.size, strict=True):
        out[int(row)].extend(range(int(start), int(start) + int(count)))
    return out


@st.composite
def runs(draw: st.DrawFn) -> dict:
    sources = draw(st.integers(1, 3))
    names = [f"s{i}" for i in range(sources)]
    # weights of 0..3 among 3 sources: a share of 1/7 at least, so blocks of 8 give it a sample
    block = draw(st.sampled_from([1, 2, 4])) if sources == 1 else 8
    count = draw(st.integers(1, 4))
    starts = sorted(draw(st.sets(st.integers(1, 12), max_size=count - 1)))
    lengths = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=len(starts) + 1,
                            max_size=len(starts) + 1))  # fmt: skip
    stages = []
    for start, length in zip([0, *starts], lengths, strict=True):
        weights = draw(st.lists(st.integers(0, 3), min_size=sources, max_size=sources))
        if not any(weights):
            weights[draw(st.integers(0, sources - 1))] = 1
        stages.append((start * block, length, dict(zip(names, weights, strict=True))))
    lanes = draw(st.integers(1, 4))
    extra = draw(st.integers(0, 1))
    longest = max(lengths) + extra
    tokens = [draw(st.integers(lanes * longest, lanes * longest + 60)) for _ in names]
    return {
        "names": names, "tokens": tokens, "stages": stages, "block_size": block, "lanes": lanes,
        "unit_tokens": draw(st.integers(1, 16)), "seed": draw(st.integers(0, 2**64 - 1)),
        "shuffle": draw(st.booleans()), "extra": extra,
        "blocks": draw(st.integers(1, 80 // block)),
    }  # fmt: skip


def plan_of(run: dict) -> LengthPlan:
    kwargs = {k: v for k, v in run.items() if k not in ("names", "tokens", "stages", "blocks")}
    return LengthPlan(run["names"], run["tokens"], run["stages"], **kwargs)


def oracle_of(run: dict) -> OracleLengthRun:
    kwargs = {k: v for k, v in run.items() if k != "blocks"}
    return OracleLengthRun(**kwargs)


two_stages = {
    "names": ["web", "code"], "tokens": [50, 37],
    "stages": [(0, 4, {"web": 1, "code": 1}), (8, 8, {"web": 3, "code": 1})],
    "block_size": 4, "lanes": 2, "unit_tokens": 8, "seed": 7, "shuffle": True, "extra": 1,
    "blocks": 20,
}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(runs())
@example(two_stages)
def test_rows_are_the_oracles(run):
    count = run["blocks"] * run["block_size"]
    plan, oracle = plan_of(run), oracle_of(run)
    expected = oracle.rows(count)
    offsets = np.arange(count)
    got = rows_of(plan, offsets)
    samples = plan.locate(offsets)
    for g in range(count):
        source, tokens, _, length = expected[g]
        assert (int(samples.source[g]), int(samples.seq_len[g])) == (source, length), g
        assert got[g] == tokens, g


@settings(max_examples=60, deadline=None)
@given(runs())
@example(two_stages)
def test_each_token_once_an_epoch_across_stages(run):
    """Every source's delivered tokens (a row's first ``seq_len``; the extra one is the next
    row's): no token twice in an epoch, and an epoch every lane finished holds every token."""
    plan = plan_of(run)
    count = run["blocks"] * run["block_size"]
    pieces = plan.pieces(np.arange(count))
    seq_len = plan.locate(np.arange(count)).seq_len
    for s, total in enumerate(plan.tokens):
        seen: dict[int, list[int]] = {}
        ends = np.zeros(plan.lanes, np.int64)  # how far each lane got, as (epoch, position)
        for i in np.flatnonzero(pieces.source == s):
            row, column = int(pieces.row[i]), int(pieces.column[i])
            kept = max(0, min(int(pieces.size[i]), int(seq_len[row]) - column))
            start, epoch = int(pieces.start[i]), int(pieces.epoch[i])
            seen.setdefault(epoch, []).extend(range(start, start + kept))
            lane = int(np.searchsorted(plan.lane_starts[s], start, side="right")) - 1
            ends[lane] = max(ends[lane], epoch * total + start + kept)
        for epoch, positions in seen.items():
            assert len(positions) == len(set(positions)), (s, epoch)
            lanes_done = all(
                ends[lane] >= epoch * total + plan.lane_starts[s, lane + 1]
                for lane in range(plan.lanes)
            )
            if lanes_done:
                assert sorted(positions) == list(range(total)), (s, epoch)


@settings(max_examples=40, deadline=None)
@given(runs(), st.data())
def test_a_resume_anywhere_reads_the_same_samples(run, data):
    """A state is the next offset and the plan's record: restored with another batch size (and
    stages changed after the resume offset), the samples from there on are the saved run's up to
    the first changed stage, and each token is still read once an epoch (the test above)."""
    plan = plan_of(run)
    count = run["blocks"] * run["block_size"]
    batch = data.draw(st.integers(1, 8), label="batch")
    steps = StepOffsets.create(None, batch)
    step = data.draw(st.integers(0, count // batch), label="step")
    offset = steps.info(step).offset
    record = plan.record()
    # the restored run: another batch size from the saved offset, and a stage added after it
    later = -(-max(offset + 1, plan.stages[-1].start + 1) // plan.block_size) * plan.block_size
    record["stages"].append([later, 1, list(plan.stages[-1].weights)])
    restored = LengthPlan.from_record(record)
    new_batch = data.draw(st.integers(1, 8), label="new batch")
    resumed = StepOffsets.create(None, new_batch, start=(step, offset))
    ends = [resumed.info(s).offset for s in range(step, step + count)]
    upto = [g for g in ends if g < later]
    wanted = np.arange(offset, max(upto, default=offset) + 1)
    assert rows_of(restored, wanted) == rows_of(plan, wanted)


def test_one_stage_without_shuffle_is_concatenate_then_split():
    """One length, one lane, no shuffle: row ``g`` is stream tokens ``[g L, g L + L + extra)``,
    `TokenSequences`' rows."""
    plan = LengthPlan(["a"], [100], [(0, 8, {"a": 1})], block_size=1, lanes=1, unit_tokens=8,
                      shuffle=False, extra=1)  # fmt: skip
    assert rows_of(plan, np.arange(3)) == [list(range(g * 8, g * 8 + 9)) for g in range(3)]


def test_a_boundary_continues_each_lane_where_it_stopped():
    plan = LengthPlan(["a"], [64], [(0, 4, {"a": 1}), (6, 16, {"a": 1})], block_size=1,
                      lanes=2, unit_tokens=4, shuffle=False)  # fmt: skip
    # lane 0 is tokens 0..31, lane 1 32..63: three rows of 4 each, then rows of 16 go on at 12
    assert [r[0] for r in rows_of(plan, np.arange(8))] == [0, 32, 4, 36, 8, 40, 12, 44]
    assert rows_of(plan, np.array([8]))[0] == list(range(28, 32)) + list(range(0, 12))


def test_a_far_offset_costs_what_a_near_one_does():
    plan = LengthPlan(["a", "b"], [10**12, 10**11], [(0, 4096, {"a": 1}),
                      (2**30, 32768, {"a": 1, "b": 1})], block_size=2048, lanes=256,
                      unit_tokens=32768)  # fmt: skip
    samples = plan.locate(np.array([2**40, 2**40 + 1]))
    assert samples.seq_len.tolist() == [32768, 32768]
    assert rows_of(plan, np.array([2**40]))[0].__len__() == 32768


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": [(0, 4, {"a": 1}), (4, 0, {"a": 1})]}, "stage 1's seq_len must be"),
        ({"context": 3}, "stage 0's seq_len=4 does not divide by the context axis of 3"),
        (
            {"stages": [(0, 4, {"a": 1}), (3, 8, {"a": 1})], "block_size": 2},
            "stage 1 starts at offset 3, which is not a block boundary",
        ),
        (
            {"tokens": [64, 0], "stages": [(0, 4, {"a": 1}), (4, 8, {"b": 1})]},
            "stage 1's weights give source 'b' weight 1.0, but it has no tokens",
        ),
        ({"lanes": 20}, "lanes=20 gives lanes of 3 tokens, shorter than a row of 4 tokens"),
        ({"stages": [(0, 4, {"c": 1})]}, "which the mixture has no source for"),
        ({"tokens": [64, -1]}, "source 'b' has -1 tokens an epoch"),
        ({"stages": [(0, 4)]}, "stage 0 must be (start_offset, seq_len, {name: weight})"),
    ],
)
def test_bad_input_names_the_stage_and_field(change, message):
    args = {"names": ["a", "b"], "tokens": [64, 64], "stages": [(0, 4, {"a": 1})],
            "block_size": 1, "lanes": 2, "unit_tokens": 8, **change}  # fmt: skip
    with pytest.raises((ValueError, TypeError)) as caught:
        LengthPlan(args.pop("names"), args.pop("tokens"), args.pop("stages"), **args)
    assert message in str(caught.value)


def test_stages_by_step_must_start_on_a_block():
    assert stage_offsets([0, 3], [(0, 4), (2, 8)], 4) == (0, 16)
    with pytest.raises(ValueError, match="stage 1 starts at step 3, sample offset 12"):
        stage_offsets([0, 3], 4, 8)


def _plan(**changes) -> LengthPlan:
    args = {"names": ["a", "b"], "tokens": [64, 80],
            "stages": [(0, 4, {"a": 1}), (8, 8, {"a": 1, "b": 1}), (16, 2, {"b": 1})],
            "block_size": 2, "lanes": 2, "unit_tokens": 8, **changes}  # fmt: skip
    return LengthPlan(args.pop("names"), args.pop("tokens"), args.pop("stages"), **args)


def test_a_restore_may_change_only_stages_from_its_offset():
    saved = _plan().record()
    _plan().check_past(saved, 12)
    # stage 2 starts at 16, after the resume offset: its length and weights may change
    _plan(stages=[(0, 4, {"a": 1}), (8, 8, {"a": 2, "b": 2}), (14, 4, {"a": 1})]).check_past(
        saved, 12
    )
    with pytest.raises(
        ValueError,
        match=r"stage 1 differs .* before the resume offset 12: saved "
        r"from offset 8 with seq_len=8 .*, now from offset 8 with seq_len=4",
    ):
        _plan(stages=[(0, 4, {"a": 1}), (8, 4, {"a": 1, "b": 1})]).check_past(saved, 12)
    with pytest.raises(ValueError, match="the length stages' unit_tokens is 4"):
        _plan(unit_tokens=4).check_past(saved, 12)
    with pytest.raises(ValueError, match=r"resized 'b' 80 -> 90 tokens"):
        _plan(tokens=[64, 90]).check_past(saved, 12)
