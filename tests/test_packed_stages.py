"""Packed length stages' pure plan (`psdp._plan.packed_stages`) against tests/length_oracle.py's
packed oracle: the same rows, each document once per epoch across stages of any lengths, any
offset computed alone (docs/concepts/length-stages.md, "Packed sources")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from psdp._plan.packed_stages import PackedLengthPlan
from tests.length_oracle import NoRow, OraclePackedRun


def rows_of(plan: PackedLengthPlan, offsets: np.ndarray) -> list[list[tuple[int, int, int]]]:
    """Each row's pieces ``(document, first token, tokens)`` in column order, the columns
    checked to lie side by side from 0."""
    pieces = plan.pieces(offsets)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(len(offsets))]
    for row, column, doc, start, size in zip(pieces.row, pieces.column, pieces.document,
                                             pieces.start, pieces.size, strict=True):  # fmt: skip
        assert column == sum(p[2] for p in out[int(row)]), "pieces are laid side by side"
        out[int(row)].append((int(doc), int(start), int(size)))
    return out


@st.composite
def runs(draw: st.DrawFn) -> dict:
    sources = draw(st.integers(1, 2))
    names = [f"s{i}" for i in range(sources)]
    block = draw(st.sampled_from([1, 2, 4])) if sources == 1 else 4
    count = draw(st.integers(1, 4))
    starts = sorted(draw(st.sets(st.integers(1, 10), max_size=count - 1)))
    seq_lens = draw(st.lists(st.sampled_from([4, 6, 8, 12, 16]), min_size=len(starts) + 1,
                             max_size=len(starts) + 1))  # fmt: skip
    stages = []
    for start, length in zip([0, *starts], seq_lens, strict=True):
        weights = draw(st.lists(st.integers(1, 3), min_size=sources, max_size=sources))
        stages.append((start * block, length, dict(zip(names, weights, strict=True))))
    lanes = draw(st.integers(1, 3))
    long_documents = draw(st.sampled_from([None, "split", "truncate", "drop"]))
    cap = min(seq_lens) if long_documents is None else 24
    lengths = [
        draw(st.lists(st.integers(0, cap), min_size=lanes + 2, max_size=lanes + 14)) for _ in names
    ]
    for docs in lengths:  # each lane needs a non-empty document
        docs[: lanes + 1] = [max(1, n) for n in docs[: lanes + 1]]
    return {
        "names": names, "lengths": lengths, "stages": stages, "block_size": block,
        "lanes": lanes, "seed": draw(st.integers(0, 2**64 - 1)), "shuffle": draw(st.booleans()),
        "long_documents": long_documents,
        "max_segments": draw(st.sampled_from([None, None, 1, 2, 3])),
        "blocks": draw(st.integers(1, 48 // block)),
    }  # fmt: skip


def plan_of(run: dict) -> PackedLengthPlan:
    kwargs = {k: v for k, v in run.items() if k not in ("names", "lengths", "stages", "blocks")}
    return PackedLengthPlan(run["names"], run["lengths"], run["stages"], **kwargs)


def oracle_of(run: dict) -> OraclePackedRun:
    return OraclePackedRun(**{k: v for k, v in run.items() if k != "blocks"})


split_across = {
    "names": ["web", "code"], "lengths": [[5, 11, 3, 0, 7, 2, 9, 4], [3, 3, 14, 1, 6]],
    "stages": [(0, 8, {"web": 1, "code": 1}), (8, 4, {"web": 3, "code": 1}),
               (16, 16, {"web": 1, "code": 3})],
    "block_size": 4, "lanes": 2, "seed": 7, "shuffle": True, "long_documents": "split",
    "max_segments": None, "blocks": 10,
}  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(runs())
@example(split_across)
@example(split_across | {"long_documents": "drop", "max_segments": 2, "shuffle": False})
@example(
    {
        "names": ["s0", "s1"],
        "lengths": [[1, 1, 1, 0], [1, 5, 1, 0]],  # epoch 0 drops lane 0
        "stages": [(0, 4, {"s0": 1, "s1": 1})],
        "block_size": 4,
        "lanes": 2,
        "seed": 0,
        "shuffle": True,
        "long_documents": "drop",
        "max_segments": None,
        "blocks": 1,
    }
)
def test_rows_are_the_oracles(run):
    count = run["blocks"] * run["block_size"]
    plan, oracle = plan_of(run), oracle_of(run)
    try:
        expected = oracle.rows(count)
    except NoRow:  # a lane whose epoch drops every document: the plan refuses it too
        with pytest.raises(ValueError, match="packs no row"):
            plan.pieces(np.arange(count))
        return
    got = rows_of(plan, np.arange(count))
    for g in range(count):
        assert got[g] == expected[g][1], g
        assert sum(p[2] for p in got[g]) <= expected[g][2], g


@settings(max_examples=40, deadline=None)
@given(runs(), st.data())
def test_any_offset_is_computed_alone(run, data):
    """A fresh plan asked for offsets in any order (a restore at any step: no earlier row read
    first) gives the rows one plan gives walking from offset 0."""
    count = run["blocks"] * run["block_size"]
    try:
        whole = rows_of(plan_of(run), np.arange(count))
    except ValueError:
        return
    offsets = data.draw(st.permutations(range(count)), label="order")[: max(1, count // 3)]
    fresh = plan_of(run)
    for g in offsets:
        assert rows_of(fresh, np.array([g]))[0] == whole[g], g


@settings(max_examples=40, deadline=None)
@given(runs())
@example(split_across)
def test_each_token_once_an_epoch_across_stages(run):
    """Without dropping or truncating: no token of a source twice in an epoch, and an epoch that
    every lane has left holds every token of every document."""
    if run["long_documents"] in ("drop", "truncate"):
        run = run | {"long_documents": "split"}
    plan = plan_of(run)
    count = run["blocks"] * run["block_size"]
    pieces = plan.pieces(np.arange(count))
    _, _, sample = plan.mixture.slots(np.arange(count))
    lane_of = sample % plan.lanes
    for s, lengths in enumerate(run["lengths"]):
        seen: dict[int, list[tuple[int, int]]] = {}
        last = np.zeros(plan.lanes, np.int64)  # the latest epoch each lane read
        for i in np.flatnonzero(pieces.source == s):
            epoch, doc, start = int(pieces.epoch[i]), int(pieces.document[i]), int(pieces.start[i])
            seen.setdefault(epoch, []).extend(
                (doc, t) for t in range(start, start + int(pieces.size[i]))
            )
            lane = int(lane_of[pieces.row[i]])
            last[lane] = max(last[lane], epoch)
        every = sorted((d, t) for d, n in enumerate(lengths) for t in range(n))
        for epoch, tokens in seen.items():
            assert len(tokens) == len(set(tokens)), (s, epoch)
            if epoch < last.min():
                assert sorted(tokens) == every, (s, epoch)


def test_each_stage_continues_inside_a_split_document():
    """One lane, in store order: document 1 (30 tokens) spans three stages; stage 1 lowers
    seq_len to 4 at its token 8 (where stage 0's piece of 8 stopped), stage 2 raises it to 8 at
    its token 16, and its last 6 tokens share a row with document 2."""
    plan = PackedLengthPlan(("a",), ([3, 30, 2],), ((0, 8, {"a": 1}), (2, 4, {"a": 1}),
                            (4, 8, {"a": 1})), block_size=1, lanes=1, shuffle=False,
                            long_documents="split")  # fmt: skip
    assert rows_of(plan, np.arange(7)) == [
        [(0, 0, 3)],
        [(1, 0, 8)],
        [(1, 8, 4)],
        [(1, 12, 4)],
        [(1, 16, 8)],
        [(1, 24, 6), (2, 0, 2)],
        [(0, 0, 3)],
    ]


def test_a_stage_that_would_split_a_document_is_refused_naming_it():
    lengths = ([3, 9, 2],)
    stages = ((0, 16, {"a": 1}), (4, 8, {"a": 1}))
    with pytest.raises(ValueError, match=r"stage 1's seq_len=8 is shorter than document 1 of "
                       r"source 'a' \(9 tokens.*long_documents='split'"):  # fmt: skip
        PackedLengthPlan(("a",), lengths, stages, block_size=4, lanes=1)
    PackedLengthPlan(("a",), lengths, stages, block_size=4, lanes=1, long_documents="split")


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match=r"3 non-empty documents for lanes=4"):
        PackedLengthPlan(("a",), ([3, 0, 2, 1],), ((0, 8, {"a": 1}),), block_size=1, lanes=4)
    with pytest.raises(ValueError, match=r"stage 1's seq_len=6 does not divide by the context"):
        PackedLengthPlan(("a",), ([3, 2],), ((0, 8, {"a": 1}), (1, 6, {"a": 1})),
                         block_size=1, lanes=1, context=4)  # fmt: skip
    with pytest.raises(ValueError, match=r"long_documents must be None"):
        PackedLengthPlan(("a",), ([3],), ((0, 8, {"a": 1}),), block_size=1, lanes=1,
                         long_documents="cut")  # fmt: skip
    plan = PackedLengthPlan(("a",), ([9, 9],), ((0, 4, {"a": 1}),), block_size=1, lanes=1,
                            long_documents="drop")  # fmt: skip
    with pytest.raises(ValueError, match=r"lane 0 of source 'a' packs no row of seq_len=4"):
        plan.pieces(np.arange(2))


def test_a_restore_may_change_only_stages_from_its_offset():
    lengths = ([3, 5, 2, 7, 1, 4],)
    plan = PackedLengthPlan(("a",), lengths, ((0, 8, {"a": 1}), (4, 16, {"a": 1})),
                            block_size=2, lanes=2)  # fmt: skip
    later = PackedLengthPlan(("a",), lengths, ((0, 8, {"a": 1}), (6, 16, {"a": 1})),
                             block_size=2, lanes=2)  # fmt: skip
    later.check_past(plan.record(), 4)  # stage 1 starts at the resume offset: it may move
    with pytest.raises(ValueError, match=r"stage 1 differs from the saved run's before the "
                       r"resume offset 5"):  # fmt: skip
        later.check_past(plan.record(), 5)
    with pytest.raises(
        ValueError, match=r"long_documents is 'split', but the saved run's was None"
    ):
        PackedLengthPlan(("a",), lengths, ((0, 8, {"a": 1}),), block_size=2, lanes=2,
                         long_documents="split").check_past(plan.record(), 0)  # fmt: skip
    assert rows_of(later, np.arange(4)) == rows_of(plan, np.arange(4))
