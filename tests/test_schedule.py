"""Batch-size schedules, skips and resume on the sample offset, through the `DataLoader`: every
device shard exact against the oracle (tests/oracle.py `schedule_spans`), and the samples of an
interrupted run (saved, restored with other settings) equal to an uninterrupted run's."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from psdp import DataLoader, OrderOptions
from psdp.sources import StreamSource
from tests import oracle
from tests.batch_checks import assert_batch_exact, expected_batch, token_table

N = 1000
RAMP = [(0, 64), (4, 128), (8, 256)]
SKIP_STEPS = [(6, 7)]
SKIP_OFFSETS = [(1500, 1540)]
STEPS = 14  # crosses the first epoch's end (offset 1000) and the offset skip
DATA = {"tokens": token_table(N), "weight": np.arange(N, dtype=np.float32)}


ORDER = dict(global_batch_size=RAMP, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS, seed=5)


def _ramp(mesh, **changes):
    return DataLoader(DATA, mesh=mesh, **ORDER | changes)


def _rows(batch) -> list[int]:
    """The source rows a delivered batch holds (its real ones: the mask), from the tokens."""
    tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["mask"])
    return (tokens[mask, 0] // 1000).tolist()


def _covered(spans: list[oracle.Span]) -> list[tuple[int, int]]:
    """(epoch, row) of every offset the spans cover, from the oracle's permutation."""
    out = []
    for span in spans:
        ids = oracle.span_ids(N, span, seed=5)[: span.rows]
        out += [(span.offset // N, int(i)) for i in ids]
    return out


def test_a_ramp_with_skips_delivers_the_oracles_rows_on_every_device(mesh_2d):
    spans = oracle.schedule_spans(N, RAMP, STEPS, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS)
    assert [s.batch_size for s in spans] == [64] * 4 + [128] * 4 + [256] * 6
    seen = []
    with _ramp(mesh_2d) as loader:
        for step, batch in zip(range(STEPS), loader, strict=False):
            want = expected_batch(DATA, step, mesh=mesh_2d, **ORDER)
            assert assert_batch_exact(batch, want) == 3 * 8
            info = loader.step_info(step)
            assert (info.offset, info.batch_size, info.rows) == (
                spans[step].offset, spans[step].batch_size, spans[step].rows,
            )  # fmt: skip
            seen += [(info.epoch, row) for row in _rows(batch)]
    # every step's real rows together: the samples of the covered offsets, each once per epoch
    assert sorted(seen) == sorted(_covered(spans))
    assert len(seen) == len(set(seen))
    offsets = {g for s in spans for g in range(s.offset, s.offset + s.rows)}
    skipped_steps = range(spans[5].offset + spans[5].rows, spans[6].offset)  # step 6 jumped
    assert len(skipped_steps) == 128 and not offsets & set(skipped_steps)
    assert not offsets & set(range(*SKIP_OFFSETS[0]))
    assert max(offsets) > SKIP_OFFSETS[0][1]  # the walk went past the offset skip


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"global_batch_size": 96},
        {"global_batch_size": [(0, 64), (9, 32)], "skip_steps": [*SKIP_STEPS, (10, 12)]},
        {"drop_last": True},
    ],
    ids=["same settings", "new batch size", "new schedule and skip", "drop_last"],
)
@pytest.mark.parametrize("resume_at", [5, 6])  # 6: where a step skip starts
def test_a_resumed_run_reads_every_sample_once_like_an_uninterrupted_one(
    mesh_2d, changes, resume_at
):
    steps = 12
    with _ramp(mesh_2d) as loader:
        it = loader.iter_from(0)
        first = [_rows(next(it)) for _ in range(resume_at)]
        state = it.state()
        it.close()
    before = oracle.schedule_spans(
        N, RAMP, resume_at, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS
    )
    # what the restore was asked for, from the test's own settings (not the loader's): the
    # saved settings with the changes, from where the saved walk stopped
    resumed = ORDER | changes | dict(start_at=(resume_at, before[-1].offset + before[-1].rows))
    after = oracle.schedule_spans(
        N, resumed["global_batch_size"], steps, drop_last=resumed.get("drop_last", False),
        skip_steps=resumed["skip_steps"], skip_offsets=SKIP_OFFSETS, start=resumed["start_at"],
    )  # fmt: skip
    with DataLoader.restore(state, DATA, mesh=mesh_2d, **changes) as loader:
        second = []
        for step, batch in zip(range(resume_at, steps), loader, strict=False):
            want = expected_batch(DATA, step, mesh=mesh_2d, **resumed)
            assert assert_batch_exact(batch, want) == 3 * 8
            want = oracle.span_ids(N, after[step - resume_at], seed=5)
            assert _rows(batch) == want[want != oracle.PAD].tolist()
            second.append(_rows(batch))
    # the state holds where the saved walk stopped (before a skip starting there): no offset
    # twice, none lost but the skipped ones
    assert state["offset"] == before[-1].offset + before[-1].rows
    covered = [g for s in before + after for g in range(s.offset, s.offset + s.rows)]
    assert len(covered) == len(set(covered))
    rows = [row for step in first + second for row in step]
    want = [row for _, row in _covered(before + after)]
    assert collections.Counter(rows) == collections.Counter(want)
    if not changes:  # the same settings: the very batches of an uninterrupted run
        with _ramp(mesh_2d) as loader:
            whole = [_rows(loader.batch_at(step)) for step in range(steps)]
        assert first + second == whole


def test_a_restored_loader_refuses_steps_before_its_resume_point(mesh_2d):
    with _ramp(mesh_2d) as loader:
        state = loader.iter_from(3).state()
        loader.close()
    with DataLoader.restore(state, DATA, mesh=mesh_2d, global_batch_size=32) as loader:
        with pytest.raises(ValueError, match=r"step 2 is before step 3, where this restored"):
            loader.batch_at(2)
        with pytest.raises(ValueError, match=r"step 1 is before step 3"):
            loader.iter_from(1)
        assert loader.step_info(3).batch_size == 32


def test_an_old_state_without_offsets_still_resumes(mesh_2d):
    """A ``psdp.loader/1`` state (saved before offsets) resumes at its step's offset."""
    with DataLoader(DATA, mesh=mesh_2d, global_batch_size=64, seed=5) as loader:
        whole = [_rows(loader.batch_at(step)) for step in range(20)]
        state = loader.state()
    old = {k: v for k, v in state.items() if k not in ("offset", "skip_steps", "skip_offsets")}
    old |= {"format": "psdp.loader/1", "step": 17}
    with DataLoader.restore(old, DATA, mesh=mesh_2d) as loader:
        assert loader.step_info(17).offset == 1000 + 64  # epoch 0 has 16 steps (the last short)
        assert [_rows(b) for b, _ in zip(loader, range(3), strict=False)] == whole[17:20]


def test_a_stream_follows_a_schedule_and_skips_whole_steps(mesh_2d):
    elements = [{"tokens": DATA["tokens"][i], "weight": DATA["weight"][i]} for i in range(N)]
    schedule, skips = [(0, 8), (3, 16)], [(4, 6)]
    with DataLoader(
        StreamSource(elements, name="numbered"), mesh=mesh_2d, global_batch_size=schedule,
        skip_steps=skips,
    ) as loader:  # fmt: skip
        got = [np.asarray(loader.batch_at(step)["weight"]).astype(int) for step in range(7)]
    spans = oracle.schedule_spans(None, schedule, 7, skip_steps=skips)
    # one process holds every batch shard, so it reads the one stream shard: element g is offset g
    for span, weights in zip(spans, got, strict=True):
        assert weights.tolist() == list(range(span.offset, span.offset + span.batch_size))
    assert [s.offset for s in spans] == [0, 8, 16, 24, 72, 88, 104]


def test_stream_skips_of_offsets_and_restores_on_other_shard_counts_are_refused(mesh_2d):
    elements = [{"tokens": DATA["tokens"][i]} for i in range(64)]
    with pytest.raises(ValueError, match=r"skip_offsets=\[\(3, 9\)\] with a stream.*skip_steps"):
        DataLoader(StreamSource(elements), mesh=mesh_2d, global_batch_size=8, skip_offsets=[(3, 9)])
    with pytest.raises(ValueError, match=r"io_block=4 with a stream.*drop io_block"):
        DataLoader(StreamSource(elements), mesh=mesh_2d, global_batch_size=8, io_block=4)
    with DataLoader(StreamSource(elements), mesh=mesh_2d, global_batch_size=8) as loader:
        state = loader.iter_from(2).state()
        loader.close()
    assert state["source"]["stream_shards"] == 1  # one process: one shard
    # as if saved on a pod of 4 hosts in 4 data groups
    state["source"]["stream_shards"], state["offset"] = 4, 16
    with pytest.raises(ValueError, match=r"saved read as 4 shards, but this mesh reads it as 1"):
        DataLoader.restore(state, StreamSource(elements), mesh=mesh_2d)


@pytest.mark.timeout(540)  # its pods' time limits, plus a minute
@pytest.mark.multiprocess
def test_a_ramp_saved_on_four_hosts_resumes_on_two_with_a_new_batch_size():
    """The 4-host non-contiguous pod reads the ramp with skips (every device shard exact) and
    saves at step 5; a 2-host pod (hosts in several data groups) restores with a batch of 96
    from there (every device shard exact), and together they read each sample once."""
    from psdp.tools.pod import run_pod
    from tests import pod_targets_schedule as targets
    from tests.batch_checks import run_on_noncontiguous_pod

    first = run_on_noncontiguous_pod(targets.ramp_then_save, steps=8, save_at=5, timeout_s=240)
    # 3 leaves (tokens, weight, mask) x 2 local devices x 8 steps on each host
    assert [r["checked"] for r in first] == [3 * 2 * 8] * 4
    states = [r["state"] for r in first]
    assert all(s == states[0] for s in states)
    state = states[0]
    layout = dict(process_index=[[0, 1], [1, 0], [0, 1], [1, 0]], axis_names=["data", "model"])
    second = run_pod(
        targets.restore_and_check, num_processes=2, devices_per_process=4, timeout_s=240,
        args=layout | dict(mesh_shape=[4, 2], state=state, steps=12, changes={"global_batch_size": 96}),
    )  # fmt: skip
    assert [r["checked"] for r in second] == [3 * 4 * 7] * 2  # steps 5..11 on 4 local devices
    assert second[0]["settings"] == [[5, state["offset"]], 96]
    before = oracle.schedule_spans(N, RAMP, 5, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS)
    after = oracle.schedule_spans(N, 96, 12, skip_steps=SKIP_STEPS, skip_offsets=SKIP_OFFSETS,
                                  start=(5, state["offset"]))  # fmt: skip
    assert state["offset"] == before[-1].offset + before[-1].rows  # no sample lost or repeated
    covered = [g for s in before + after for g in range(s.offset, s.offset + s.rows)]
    assert len(covered) == len(set(covered))


def test_a_restore_refuses_a_new_offset_skip_behind_its_resume_offset(mesh_2d):
    """Offsets before the resume offset were trained on: a new ``skip_offsets`` range there is
    refused like a new ``skip_steps`` range before the resume step; a saved one is the past
    (accepted), and one from the resume offset on applies."""
    with _ramp(mesh_2d, skip_offsets=[(10, 20)]) as loader:
        state = loader.iter_from(3).state()  # steps 0-2: offsets 0..9 (cut short), 20..147
        loader.close()
    assert state["offset"] == 148
    for skip, fix in (((30, 40), "drop it"), ((100, 300), "give (148, 300)")):
        with pytest.raises(ValueError) as error:
            DataLoader.restore(state, DATA, mesh=mesh_2d, skip_offsets=[(10, 20), skip])
        message = str(error.value)
        assert f"skip_offsets {skip} starts before sample offset 148" in message
        assert "the saved run did not have it" in message and fix in message
    ahead = [(10, 20), (148, 160)]
    with DataLoader.restore(state, DATA, mesh=mesh_2d, skip_offsets=ahead) as loader:
        assert loader.step_info(3).offset == 160  # 148..159 skipped


def test_an_empty_skip_list_on_restore_removes_the_saved_future_skips(mesh_2d):
    """``skip_steps=[]`` (or ``skip_offsets=[]``) given to a restore replaces the saved list, so
    a saved skip still ahead is not applied; left out (or left at an ``order=`` group's default),
    the saved list applies. Offsets by hand:
    steps 0-3 of 64, 4-7 of 128 (step 6 at 512, or 640 with the skip (6, 7)), then 256: step 8
    is cut at the epoch's end (1000) either way, step 9 reads 1000..1255, step 10 from 1256
    reaches the offset skip at 1500 (244 rows) or not (256 rows)."""
    with _ramp(mesh_2d) as loader:
        state = loader.iter_from(3).state()
        loader.close()
    cases = {  # restore keywords -> (step 6's offset, step 10's rows, step 11's offset)
        "kept": ({}, (640, 244, 1540)),
        "no step skip": ({"skip_steps": []}, (512, 244, 1540)),
        "no offset skip": ({"skip_offsets": []}, (640, 256, 1512)),
        "an order group's empty list is its default": (
            {"order": OrderOptions(skip_steps=[], skip_offsets=[])},
            (640, 244, 1540),
        ),
    }
    for name, (changes, want) in cases.items():
        with DataLoader.restore(state, DATA, mesh=mesh_2d, **changes) as loader:
            got = (loader.step_info(6).offset, loader.step_info(10).rows)
            assert (*got, loader.step_info(11).offset) == want, name


def test_a_skip_at_an_epoch_start_pads_that_epoch_and_masks_the_padding(mesh_2d):
    """16 rows, batch 8, offsets 16..18 skipped: epoch 0 ends on a whole step, epoch 1 holds 13
    offsets (19..31), so its second step has 5 real rows and 3 padded ones, masked (by hand)."""
    data = {"tokens": token_table(16)}
    kwargs = dict(mesh=mesh_2d, global_batch_size=8, shuffle=False, skip_offsets=[(16, 19)])
    with DataLoader(data, **kwargs) as loader:
        batches = [
            (_rows(b), np.asarray(b["mask"]).tolist())
            for b, _ in zip(loader, range(5), strict=False)
        ]
        padded = loader.plan.padded
    assert batches == [
        (list(range(0, 8)), [True] * 8),
        (list(range(8, 16)), [True] * 8),
        (list(range(3, 11)), [True] * 8),  # offsets 19..26
        (list(range(11, 16)), [True] * 5 + [False] * 3),  # 27..31, then the epoch's end
        (list(range(0, 8)), [True] * 8),  # epoch 2: no skip
    ]
    assert padded
