"""Packed length stages at scale (`psdp._plan.packed_stages`): lanes packed in chunks of a few
documents give tests/length_oracle.py's rows, and a restore seeded by the cursors a state saves
equals the oracle without packing a lane's documents before them; cursors that are not the
plan's are refused (docs/concepts/length-stages.md, "Packed sources")."""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from psdp import DataLoader
from psdp._plan import packed_stages
from psdp._plan.packed_stages import PackedLengthPlan
from tests.length_oracle import NoRow
from tests.test_packed_stages import oracle_of, rows_of, runs, split_across
from tests.test_staged_packed import STAGES, staged, tables
from tests.test_staged_tokens import RAMP, assert_steps_are_the_oracles

chunks = st.integers(1, 3)
#: how far a walk's chunks may grow (1: every chunk as small as asked)
growths = st.sampled_from([1, 2, 64])
#: stage 1 (seq_len 4) starts at token 8 of document 1 (30 slots): a chunk of it alone closes
#: 5 rows, and the next chunk starts at its token 28
inside_a_split_document = {
    "names": ["a"], "lengths": [[3, 30, 2]],
    "stages": [(0, 8, {"a": 1}), (2, 4, {"a": 1}), (9, 8, {"a": 1})], "block_size": 1,
    "lanes": 1, "seed": 0, "shuffle": False, "long_documents": "split", "max_segments": None,
    "blocks": 12,
}  # fmt: skip


def growing(growth: int):
    """Chunks that grow along a walk up to ``growth`` times the first (`CHUNK_GROWTH`)."""
    return mock.patch.object(packed_stages, "CHUNK_GROWTH", growth)


def plan_of(run: dict, chunk: int) -> PackedLengthPlan:
    kwargs = {k: v for k, v in run.items() if k not in ("names", "lengths", "stages", "blocks")}
    return PackedLengthPlan(run["names"], run["lengths"], run["stages"], chunk_documents=chunk,
                            **kwargs)  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(runs(), chunks, growths)
@example(split_across, 1, 1)
@example(split_across | {"long_documents": "drop", "max_segments": 2, "shuffle": False}, 2, 1)
@example(split_across | {"long_documents": "truncate", "shuffle": False}, 1, 2)
@example(inside_a_split_document, 1, 1)
def test_rows_packed_in_chunks_are_the_oracles(run, chunk, growth):
    """Chunks of 1 to 3 documents, growing along a walk or not (each chunk's last row carried
    to the next, split documents cut inside a chunk and across one) give every row the oracle
    gives."""
    count = run["blocks"] * run["block_size"]
    plan = plan_of(run, chunk)
    try:
        expected = oracle_of(run).rows(count)
    except NoRow:
        with pytest.raises(ValueError, match="packs no row"), growing(growth):
            plan.pieces(np.arange(count))
        return
    with growing(growth):
        got = rows_of(plan, np.arange(count))
    assert got == [pieces for _, pieces, _ in expected]


@settings(max_examples=20, deadline=None)
@given(runs(), chunks, growths, st.data())
def test_any_offset_in_chunks_is_computed_alone(run, chunk, growth, data):
    count = run["blocks"] * run["block_size"]
    try:
        whole = [p for _, p, _ in oracle_of(run).rows(count)]
    except NoRow:
        return
    fresh = plan_of(run, chunk)
    for g in data.draw(st.permutations(range(count)), label="order")[: max(1, count // 3)]:
        with growing(growth):
            assert rows_of(fresh, np.array([g]))[0] == whole[g], g


def walked_before(plan: PackedLengthPlan, offset: int) -> list[tuple[int, int, int, int]]:
    """The (source, lane, stage, row) cursors the plan knows of before the rows of ``offset``'s
    block (whose samples come in a keyed order): a restore seeded at ``offset`` needs none."""
    offset -= offset % plan.block_size
    stage = max(k for k, s in enumerate(plan.stages) if s.start <= offset)
    given = plan.mixture.given_before(offset)
    out = []
    for (s, lane, k), (rows, _) in plan._walks.items():
        before = plan.mixture.before[stage, s]
        lane_rows = (given[s] + plan.lanes - 1 - lane) // plan.lanes
        seeded = lane_rows - (before + plan.lanes - 1 - lane) // plan.lanes
        out.extend((s, lane, k, r) for r in rows if k < stage or (k == stage and r < seeded))
    return out


@settings(max_examples=30, deadline=None)
@given(runs(), chunks, chunks, growths, st.data())
@example(split_across, 1, 2, 1, None)
@example(  # a block's samples out of row order: offset 7, after a restore at 6, is row 4
    {"names": ["s0"], "lengths": [[1, 1, 0]], "stages": [(0, 4, {"s0": 1})], "block_size": 4,
     "lanes": 1, "seed": 0, "shuffle": True, "long_documents": None, "max_segments": None,
     "blocks": 3},
    1, 1, 1, None,
)  # fmt: skip
def test_a_restore_from_saved_cursors_is_the_oracles_and_packs_nothing_before(
    run, saved_chunk, chunk, growth, data
):
    """Cursors saved at any offset (as JSON) seed a fresh plan, whose rows from there are the
    oracle's, and which knows no cursor of a row before them: nothing before was packed."""
    count = run["blocks"] * run["block_size"]
    try:
        expected = [p for _, p, _ in oracle_of(run).rows(count)]
    except NoRow:
        return
    offset = count // 2 if data is None else data.draw(st.integers(0, count), label="offset")
    saving = plan_of(run, saved_chunk)
    with growing(growth):
        rows_of(saving, np.arange(offset))  # the saving run read up to its offset
        cursors = json.loads(json.dumps(saving.resume_cursors(offset)))
        assert len(cursors["at"]) == len(run["names"]) * run["lanes"]
        fresh = plan_of(run, chunk)
        assert fresh.seed_cursors(cursors, offset)
        assert rows_of(fresh, np.arange(offset, count)) == expected[offset:]
        assert walked_before(fresh, offset) == []
        # a plan that never read a row saves the same cursors
        assert plan_of(run, chunk).resume_cursors(offset) == cursors


def test_a_restore_from_cursors_may_start_a_new_stage_at_its_offset():
    """Saved at offset 24 of `split_across`; the restored plan starts a stage of seq_len 12
    there: its rows are that schedule's oracle's, seeded by the saved cursors."""
    run = split_across
    cursors = plan_of(run, 2).resume_cursors(24)
    later = run | {"stages": [*run["stages"], (24, 12, {"web": 1, "code": 2})]}
    fresh = plan_of(later, 1)
    assert fresh.seed_cursors(cursors, 24)
    assert rows_of(fresh, np.arange(24, 40)) == [p for _, p, _ in oracle_of(later).rows(40)[24:]]
    assert walked_before(fresh, 24) == []


def test_cursors_not_of_the_plan_are_refused_and_another_offsets_ignored():
    run = split_across
    cursors = plan_of(run, 2).resume_cursors(20)
    tampered = json.loads(json.dumps(cursors))
    tampered["at"][1][1] += 1  # lane 1 of 'web' one document on
    with pytest.raises(ValueError, match=r"packing cursors at offset 20 do not match this plan"):
        plan_of(run, 2).seed_cursors(tampered, 20)
    with pytest.raises(ValueError, match=r"not 4 cursors \(sources x lanes\) of 5 ints"):
        plan_of(run, 2).seed_cursors(cursors | {"at": cursors["at"][:3]}, 20)
    with pytest.raises(ValueError, match=r"do not match this plan"):
        plan_of(run | {"seed": 8}, 2).seed_cursors(cursors, 20)
    # the same counts of documents and tokens, and so the same record, but other lengths
    other = run | {"lengths": [run["lengths"][0][::-1], run["lengths"][1]]}
    refused = plan_of(other, 2)
    with pytest.raises(ValueError, match=r"packing cursor of lane \d of source 'web', "
                       r"Cursor\(.*\) on document \d+ of \d+ slots, is not one of this plan's"):  # fmt: skip
        refused.seed_cursors(cursors, 20)
    assert refused._walks == {}  # no cursor of a refused state is used
    fresh = plan_of(run, 2)
    assert not fresh.seed_cursors(cursors, 24)  # saved at 20: the restore at 24 re-packs
    assert rows_of(fresh, np.arange(24, 40)) == [p for _, p, _ in oracle_of(run).rows(40)[24:]]


def test_a_loader_state_carries_the_cursors_and_a_tampered_one_is_refused(mesh_1d):
    """`DataLoader.state()` of a `StagedPacked` holds each lane's cursor at its offset; a
    restore uses them (the oracle's rows), refuses an edited one, and re-packs without them."""
    with DataLoader(staged(), mesh=mesh_1d, global_batch_size=RAMP) as loader:
        it = loader.iter_from(12)
        next(it)
        state = it.state()
        it.close()
    cursors = state["source"]["definition"]["cursors"]
    assert cursors["offset"] == state["offset"] and len(cursors["at"]) == 2 * 4
    source = staged()
    with DataLoader.restore(state, source, mesh=mesh_1d, global_batch_size=8) as loader:
        assert walked_before(source.plan, state["offset"]) == []
        assert_steps_are_the_oracles(loader, range(13, 15), tables(64), STAGES, mesh=mesh_1d)
    tampered = json.loads(json.dumps(state))
    tampered["source"]["definition"]["cursors"]["at"][5][2] += 1
    with pytest.raises(ValueError, match=r"packing cursors at offset \d+ do not match this plan"):
        DataLoader.restore(tampered, staged(), mesh=mesh_1d, global_batch_size=8)
    del tampered["source"]["definition"]["cursors"]
    with DataLoader.restore(tampered, staged(), mesh=mesh_1d, global_batch_size=8) as loader:
        assert_steps_are_the_oracles(loader, range(13, 15), tables(64), STAGES, mesh=mesh_1d)


@pytest.mark.parametrize("run", [split_across, inside_a_split_document])
def test_rows_are_the_oracles_keeping_one_cursor_a_lane(monkeypatch, run):
    """With only the latest known cursor kept (and a stage's start), rows read in any order
    are still the oracle's: a row before the kept cursors is walked to from the stage's
    start."""
    monkeypatch.setattr(packed_stages, "KEPT_CURSORS", 1)
    count = run["blocks"] * run["block_size"]
    expected = [p for _, p, _ in oracle_of(run).rows(count)]
    plan = plan_of(run, 1)
    order = np.random.default_rng(0).permutation(count)
    assert [rows_of(plan, np.array([g]))[0] for g in order] == [expected[g] for g in order]
    assert max(len(rows) for rows, _ in plan._walks.values()) <= 3
