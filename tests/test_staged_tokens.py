"""`StagedTokens` through the loader: two stages of another ``seq_len`` each, every device shard
of every leaf equal to tests/length_oracle.py's rows read from the sources' concatenated streams."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import DataLoader
from psdp.sources.documents.store import DocumentStore
from psdp.sources.views.staged import StagedTokens
from tests.batch_checks import assert_batch_exact, expected_batch
from tests.length_oracle import OracleLengthRun

EOS = 7
NAMES = ["web", "code"]
STAGES = [(0, 8, {"web": 1, "code": 1}), (64, 32, {"web": 3, "code": 1})]
SETTINGS = {"block_size": 8, "lanes": 4, "unit_tokens": 32, "seed": 5}


def documents(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 90, size=40)
    first = 1000 * (seed + 1)
    return [first + 100 * i + np.arange(n, dtype=np.int32) % 100 for i, n in enumerate(lengths)]


def streams(docs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A store's stream with an EOS after each document: each position's token, document
    (from 1) and place in its document."""
    tokens = np.concatenate([np.append(d, EOS) for d in docs])
    doc = np.concatenate([np.full(len(d) + 1, i + 1) for i, d in enumerate(docs)])
    place = np.concatenate([np.arange(len(d) + 1) for d in docs])
    return {"input_ids": tokens, "document": doc, "positions": place}


def oracle_tables(rows: int, targets: bool, stages=STAGES) -> list[dict[str, np.ndarray]]:
    """Each stage's rows as the loader must deliver them (the last stage's first ``rows``)."""
    docs = [documents(i) for i in range(len(NAMES))]
    stream = [streams(d) for d in docs]
    tokens = [len(s["input_ids"]) for s in stream]
    run = OracleLengthRun(NAMES, tokens, stages, extra=int(targets), **SETTINGS)
    return stage_tables(run, stream, stages, rows)


def stage_tables(run: OracleLengthRun, stream: list[dict[str, np.ndarray]], stages,
                 rows: int) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """Each stage's rows of ``run`` (the last stage's first ``rows``) as leaves: the stream's
    tokens and positions at the oracle's store places, a new segment at each new document or
    jump in the stream."""
    tables = []
    starts = [start for start, _, _ in stages]
    for start, stop in zip(starts, [*starts[1:], starts[-1] + rows], strict=True):
        table: dict[str, list] = {"input_ids": [], "segment_ids": [], "positions": []}
        for source, places, _, _ in run.rows(stop)[start:]:
            s, places = stream[source], np.array(places)
            table["input_ids"].append(s["input_ids"][places])
            table["positions"].append(s["positions"][places])
            new = np.ones(len(places), bool)
            new[1:] = (np.diff(s["document"][places]) != 0) | (np.diff(places) != 1)
            table["segment_ids"].append(np.cumsum(new))
        tables.append({k: np.stack(v).astype(np.int32) for k, v in table.items()})
    return tables


def staged(targets: bool, stages=STAGES) -> StagedTokens:
    stores = {n: DocumentStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    return StagedTokens(stores, stages, targets=targets, eos_id=EOS, **SETTINGS)


#: three length stages, 8 -> 32 -> 64 tokens, the batch shrinking to keep 256 tokens a step
THREE = [*STAGES, (128, 64, {"web": 1, "code": 3})]
RAMP = [(0, 32), (2, 8), (10, 4)]


def assert_steps_are_the_oracles(loader, steps, tables, stages, **settings) -> None:
    """Every device shard of every leaf of ``steps`` is the oracle's rows at the step's offsets
    (the stage's table, from the stage's start)."""
    starts = [start for start, _, _ in stages]
    for step in steps:
        info = loader.step_info(step)
        stage = max(k for k, start in enumerate(starts) if start <= info.offset)
        first = info.offset - starts[stage]
        table = {k: v[first : first + info.batch_size] for k, v in tables[stage].items()}
        table = {k: v.astype(loader.source.leaves[k]) for k, v in table.items()}
        want = expected_batch(
            table, 0, shuffle=False, global_batch_size=info.batch_size, **settings
        )
        assert assert_batch_exact(loader.batch_at(step), want) >= len(want), step


@pytest.mark.parametrize("targets", [False, True])
def test_one_loader_over_three_length_stages_is_the_oracles_on_every_device(mesh_2d, targets):
    """One DataLoader over 8 -> 32 -> 64 tokens, batches of 32, 8 then 4: each step reads its
    stage's rows (its own plan), every shard of every leaf the oracle's, across both boundaries."""
    view, tables = staged(targets, THREE), oracle_tables(32, targets, THREE)
    with DataLoader(view, mesh=mesh_2d, global_batch_size=RAMP) as loader:
        assert sorted(loader.plans) == [(b, k) for b in (4, 8, 32) for k in range(3)]
        assert [loader.step_info(s).offset for s in (2, 10)] == [64, 128]
        assert_steps_are_the_oracles(loader, range(18), tables, THREE, mesh=mesh_2d)
        for step, batch in zip(range(12), loader, strict=False):  # the prefetching iterator's
            direct = loader.batch_at(step)
            assert all(np.array_equal(batch[k], direct[k]) for k in direct), step
        assert np.asarray(batch["input_ids"]).shape == (4, 64 + targets)


@pytest.mark.parametrize("saved_at", [5, 10, 13])
def test_a_restore_inside_a_later_stage_on_another_mesh_and_batch_equals_the_oracle(
    mesh_2d, mesh_1d, saved_at
):
    """Saved inside stage 1 (step 5), at stage 2's first step (10) and inside it (13) on the 4x2
    mesh; restored on the 8-way mesh with batches of 8 (padded to 8 from 4 in stage 2's
    schedule): every later step is the oracle's, the uninterrupted run's rows at its offsets."""
    view, tables = staged(True, THREE), oracle_tables(64, True, THREE)
    with DataLoader(view, mesh=mesh_2d, global_batch_size=RAMP) as loader:
        it = loader.iter_from(saved_at - 1)
        next(it)
        state = it.state()
        it.close()
    offset = state["offset"]
    assert state["step"] == saved_at
    assert state["source"]["definition"]["stages"][2][:2] == [128, 64]
    restored = DataLoader.restore(state, view, mesh=mesh_1d, global_batch_size=8)
    with restored as loader:
        assert loader.step_info(saved_at).offset == offset
        steps = range(saved_at, saved_at + (192 - offset) // 8)
        assert_steps_are_the_oracles(loader, steps, tables, THREE, mesh=mesh_1d)


def test_a_step_across_a_length_stage_is_refused_before_a_read(mesh_2d):
    with pytest.raises(
        ValueError, match="length stage 1 of .* starts at sample offset 64, inside step 2 "
    ):
        DataLoader(staged(False), mesh=mesh_2d, global_batch_size=24)


def test_a_restore_whose_batches_cross_a_later_stage_is_refused(mesh_2d, mesh_1d):
    """Saved at offset 88 (stage 1): batches of 16 from there cover 120 to 135, across 128."""
    view = staged(False, THREE)
    with DataLoader(view, mesh=mesh_2d, global_batch_size=RAMP) as loader:
        state = loader.iter_from(5).state()
    assert state["offset"] == 88
    with pytest.raises(
        ValueError, match="length stage 2 .* offset 128, inside step 7 .*offsets 120 to 135"
    ):
        DataLoader.restore(state, view, mesh=mesh_1d, global_batch_size=16)


def test_a_restore_with_a_changed_past_stage_is_refused(mesh_2d, mesh_1d):
    view = staged(False, THREE)
    with DataLoader(view, mesh=mesh_2d, global_batch_size=RAMP) as loader:
        state = loader.iter_from(11).state()
    changed = staged(False, [*STAGES, (128, 16, {"web": 1, "code": 3})])
    with pytest.raises(ValueError, match="stage 2"):
        DataLoader.restore(state, changed, mesh=mesh_1d, global_batch_size=8)


@pytest.mark.parametrize("targets", [False, True])
def test_two_length_stages_are_the_oracles_on_every_device(mesh_2d, targets):
    """Stage 0 (rows of 8) in 4 steps of 16, stage 1 (rows of 32) in 16 steps of 8 with a
    mixture of other weights, past the end of an epoch of web: every shard of every leaf is the
    oracle's."""
    view, tables = staged(targets), oracle_tables(128, targets)
    for index, (batch_size, steps) in enumerate([(16, 4), (8, 8)]):
        rows = view.stage(index)
        table = {k: v.astype(rows.leaves[k]) for k, v in tables[index].items()}
        settings = {"mesh": mesh_2d, "global_batch_size": batch_size}
        with DataLoader(rows, **settings) as loader:
            for step, batch in zip(range(steps), loader, strict=False):
                want = expected_batch(table, step, shuffle=False, **settings)
                assert assert_batch_exact(batch, want) == 8 * len(want)  # each leaf


def test_a_row_past_its_stage_is_refused():
    rows = staged(False).stage(0)
    with pytest.raises(IndexError, match="row 64 of stage 0 is sample offset 64, where stage 1"):
        rows.read(np.array([3, 64]))


def test_bad_stages_are_refused_before_a_read_naming_the_stage_and_field():
    stores = {n: DocumentStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    with pytest.raises(
        ValueError, match="stage 0's seq_len=8 does not divide by the context axis of 3"
    ):
        StagedTokens(stores, STAGES, context=3, **SETTINGS)
    with pytest.raises(ValueError, match="lanes=100 gives lanes of 17 tokens, shorter than a row"):
        StagedTokens(stores, STAGES, **(SETTINGS | {"lanes": 100}))
    with pytest.raises(IndexError, match="stage 2 does not exist: there are 2"):
        StagedTokens(stores, STAGES, **SETTINGS).stage(2)


def test_a_stage_resumed_on_another_mesh_and_batch_size_goes_on_at_its_offset(mesh_2d, mesh_1d):
    """Stage 1 saved after 3 steps of 8 (offset 64 + 24) on the 4x2 mesh, resumed on the 8-way
    mesh with batches of 16: its rows are the oracle's from row 24 on."""
    view, tables = staged(True), oracle_tables(72, True)
    rows = view.stage(1)
    with DataLoader(rows, mesh=mesh_2d, global_batch_size=8) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = it.state()
        it.close()
    table = {k: v.astype(rows.leaves[k]) for k, v in tables[1].items()}
    with DataLoader.restore(state, rows, mesh=mesh_1d, global_batch_size=16) as loader:
        for step, batch in zip(range(3, 6), loader, strict=False):
            want = {k: v[24 + (step - 3) * 16 : 24 + (step - 2) * 16] for k, v in table.items()}
            assert_batch_exact(batch, {**want, "mask": np.ones(16, bool)})


@pytest.mark.parametrize("box", [slice(0, 33), slice(5, 20), slice(16, 33), np.array([30, 2, 17])])
def test_a_window_is_the_rows_columns_and_reads_under_twice_their_tokens(box, monkeypatch):
    rows = staged(True).stage(1)
    ids = np.arange(0, 40, 3)
    whole = rows.read(ids)
    asked = []
    for store in (s.store for s in rows.staged.streams.values()):
        read = store.read_ranges

        def counting(starts, stops, *args, read=read, **kwargs):
            asked.append(int(np.sum(np.asarray(stops) - np.asarray(starts))))
            return read(starts, stops, *args, **kwargs)

        monkeypatch.setattr(store, "read_ranges", counting)
    got = rows.read_window(ids, dict.fromkeys(rows.leaves, box))
    for leaf, values in whole.items():
        assert np.array_equal(got[leaf], values[:, box]), leaf
    span = np.arange(33)[box]
    # a piece as wide as the window is read exactly; the others in windows rounded up to a
    # power of two, under twice their tokens (EOS tokens are not read at all)
    assert sum(asked) < 2 * len(ids) * (span.max() + 1 - span.min())


def test_sequence_sharded_batches_are_the_oracles_on_every_device(mesh_context):
    """Stage 1's rows of 32 (+ 1 target) split over ``context=2``: every shard is the oracle's."""
    from jax.sharding import PartitionSpec as P

    view, tables = staged(False), oracle_tables(64, False)
    rows = view.stage(1)
    table = {k: v.astype(rows.leaves[k]) for k, v in tables[1].items()}
    spec = {k: P("data", "context") for k in rows.leaves}
    settings = {"mesh": mesh_context, "global_batch_size": 8, "batch_spec": spec}
    with DataLoader(rows, **settings) as loader:
        for step, batch in zip(range(8), loader, strict=False):
            want = expected_batch(table, step, shuffle=False, **settings)
            assert assert_batch_exact(batch, want) == 8 * len(want)


def test_a_row_that_goes_on_at_the_next_place_keeps_its_segment():
    """One document of 24 tokens in units of 2: where the epoch's order puts a unit right after
    the one before it, the row goes on in the same segment; elsewhere a new segment starts."""
    store = DocumentStore.from_documents([np.arange(100, 124)])
    stages = [(0, 6, {"a": 1})]
    settings = {"block_size": 1, "lanes": 1, "unit_tokens": 2}
    found = False
    for seed in range(20):
        rows = StagedTokens({"a": store}, stages, seed=seed, **settings).stage(0)
        got = rows.read(np.arange(8))["segment_ids"]
        oracle = OracleLengthRun(["a"], [24], stages, seed=seed, **settings).rows(8)
        for row, (_, places, _, _) in enumerate(oracle):
            jumps = np.diff(places) != 1
            assert got[row].tolist() == np.cumsum(np.r_[True, jumps]).tolist(), (seed, row)
            found |= bool(np.any(~jumps[1::2]))  # a unit's end followed by the next unit
    assert found


def test_a_restore_on_four_hosts_gives_each_host_the_oracles_boxes(mesh_2d):
    """Saved on one host at step 13 (inside stage 2), restored on four simulated hosts (one data
    row each) with batches of 8: each host places exactly the oracle's boxes on its devices."""
    from tests.fake_hosts import fake_pod, host_batch

    view, tables = staged(True, THREE), oracle_tables(64, True, THREE)
    with DataLoader(view, mesh=mesh_2d, global_batch_size=RAMP) as loader:
        state = loader.iter_from(13).state()
    offset = state["offset"] - 128  # stage 2's row
    table = {k: v.astype(view.leaves[k]) for k, v in tables[2].items()}
    layout = np.arange(4).repeat(2).reshape(4, 2)
    with fake_pod(mesh_2d, layout) as process_of:
        for host in range(4):
            restored = DataLoader.restore(
                state, view, mesh=mesh_2d, global_batch_size=8, process_index=host
            )
            with restored as loader:
                for step in (13, 14, 16):
                    first = offset + (step - 13) * 8
                    rows = {k: v[first : first + 8] for k, v in table.items()}
                    want = expected_batch(rows, 0, shuffle=False, mesh=mesh_2d, global_batch_size=8)
                    for key, shards in host_batch(loader, step, process_of).items():
                        boxes = shards.sharding.devices_indices_map(shards.shape)
                        assert {process_of[d] for d in shards.shards} == {host}
                        assert len(shards.shards) == 2
                        for device, value in shards.shards.items():
                            np.testing.assert_array_equal(value, want[key][boxes[device]])


def test_a_stage_whose_seq_len_does_not_divide_by_the_context_axis_is_refused(mesh_context):
    from jax.sharding import PartitionSpec as P

    view = staged(False, [*STAGES, (128, 63, {"web": 1, "code": 3})])
    spec = {k: P("data", "context") for k in view.leaves}
    with pytest.raises(ValueError, match=r"length stage 2's seq_len=63 does not divide by the "
                       r"context axis of 2 devices \(dimension 1 of leaf 'input_ids'"):  # fmt: skip
        DataLoader(view, mesh=mesh_context, global_batch_size=RAMP, batch_spec=spec)
