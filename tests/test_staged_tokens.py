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
from tests.pod_targets_tokens import CountingStore

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


def test_no_rows_read_as_empty_leaves():
    view = staged(True)
    for got in (view.read(np.zeros(0, int)), view.stage(1).read_window(
            np.zeros(0, int), {"segment_ids": slice(2, 5), "input_ids": slice(1, 3)})):  # fmt: skip
        assert {k: v.shape[1:] for k, v in got.items()} in (
            {"input_ids": (9,), "segment_ids": (9,), "positions": (9,)},
            {"input_ids": (2,), "segment_ids": (3,)},
        )
        assert all(v.shape[0] == 0 for v in got.values())


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
def test_a_window_is_the_rows_columns_and_reads_exactly_their_tokens(box):
    """Stage 1's rows (32 + 1 target) of offsets across an epoch's end of web: a window's every
    leaf is the whole rows' columns, and the stores read exactly the window's span of columns
    of each row, once (EOS tokens are not stored)."""
    stores = {n: CountingStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    rows = StagedTokens(stores, STAGES, targets=True, eos_id=EOS, **SETTINGS).stage(1)
    ids = np.arange(0, 40, 3)
    whole = rows.read(ids)
    for store in stores.values():
        store.ranges.clear()
    got = rows.read_window(ids, dict.fromkeys(rows.leaves, box))
    for leaf, values in whole.items():
        assert np.array_equal(got[leaf], values[:, box]), leaf
    span = np.arange(33)[box]
    first, stop = int(span.min()), int(span.max()) + 1
    read, want = (
        _store_tokens(stores),
        _oracle_tokens(64 + ids, {r: (first, stop) for r in range(len(ids))}, True),
    )
    assert read == want and sum(len(t) for t in want.values()) > len(ids)


def _store_tokens(stores) -> dict[str, list[int]]:
    """Each store's tokens of ``input_ids`` read since its ranges were cleared, sorted."""
    return {
        n: sorted(t for leaf, a, b in s.ranges if leaf == "input_ids" for t in range(a, b))
        for n, s in stores.items()
    }


def _oracle_tokens(offsets, columns, targets: bool, stages=STAGES) -> dict[str, list[int]]:
    """The store tokens (EOS left out) of columns ``columns[i] = (first, stop)`` of the row at
    ``offsets[i]``, per store, sorted: what a host whose rows those are must read, once."""
    docs = [documents(i) for i in range(len(NAMES))]
    stream = [streams(d) for d in docs]
    run = OracleLengthRun(NAMES, [len(s["input_ids"]) for s in stream], stages,
                          extra=int(targets), **SETTINGS)  # fmt: skip
    rows = run.rows(int(max(offsets)) + 1)
    out: dict[str, list[int]] = {n: [] for n in NAMES}
    for i, (first, stop) in columns.items():
        source, places, _, _ = rows[int(offsets[i])]
        s, places = stream[source], np.array(places)[first:stop]
        places = places[s["input_ids"][places] != EOS]
        out[NAMES[source]] += (places - (s["document"][places] - 1)).tolist()  # EOS before
    return {n: sorted(t) for n, t in out.items()}


@pytest.mark.slow  # 3 s: four hosts' loaders over three stages
def test_each_host_of_a_context_mesh_reads_exactly_its_columns_and_halos(halo=2):
    """data=2 x context=4, one device a host, three length stages (rows of 8, 32, 64): at a step
    of each stage, the shards of every leaf on four hosts (both edges of data row 0, the inner
    shards of row 1) are the oracle's, and each host's stores read exactly
    the tokens of its rows' columns plus a pad halo of ``halo`` (clipped to the row), once."""
    from jax.sharding import PartitionSpec as P

    from tests.fake_hosts import fake_pod, host_batch
    from tests.meshes import mesh_of

    mesh = mesh_of(("data", "context"), (2, 4))
    tables = oracle_tables(8, False, THREE)
    spec = {k: P("data", "context") for k in ("input_ids", "loss_mask", "segment_ids", "positions")}
    halos = dict.fromkeys(("input_ids", "loss_mask"), halo) if halo else 0
    settings = {"mesh": mesh, "global_batch_size": RAMP, "batch_spec": spec, "halo": halos}
    layout = np.arange(8).reshape(2, 4)
    with fake_pod(mesh, layout) as process_of:
        for host in (0, 3, 5, 6):  # both edges of data row 0, the inner shards of row 1
            stores = {n: CountingStore.from_documents(_masked(documents(i)))
                      for i, n in enumerate(NAMES)}  # fmt: skip
            view = StagedTokens(stores, THREE, eos_id=EOS, **SETTINGS)
            with DataLoader(view, process_index=host, **settings) as loader:
                for step in (1, 5, 11):  # stages 0, 1 and 2
                    info, stage = (
                        loader.step_info(step),
                        view.stage_at(loader.step_info(step).offset),
                    )
                    first = info.offset - THREE[stage][0]
                    table = {
                        k: v[first : first + info.batch_size] for k, v in tables[stage].items()
                    }
                    table["loss_mask"] = (table["input_ids"] % 3 == 0).astype(np.uint8)
                    table = {k: v.astype(view.leaves[k]) for k, v in table.items()}
                    want = expected_batch(table, 0, shuffle=False, **{
                        **settings, "global_batch_size": info.batch_size})  # fmt: skip
                    for store in stores.values():
                        store.ranges.clear()
                    got = host_batch(loader, step, process_of)
                    for key, shards in got.items():
                        boxes = shards.sharding.devices_indices_map(shards.shape)
                        assert {process_of[d] for d in shards.shards} == {host}
                        for device, value in shards.shards.items():
                            np.testing.assert_array_equal(value, want[key][boxes[device]])
                    width = THREE[stage][1]
                    rows, c = boxes[device][0], host % 4
                    lo, hi = max(0, c * width // 4 - halo), min(width, (c + 1) * width // 4 + halo)
                    columns = {r: (lo, hi) for r in range(*rows.indices(info.batch_size))}
                    want_tokens = _oracle_tokens(info.offset + np.arange(info.batch_size), columns,
                                                 False, THREE)  # fmt: skip
                    assert _store_tokens(stores) == want_tokens, (host, step)
                    mask = [
                        (a, b)
                        for s in stores.values()
                        for leaf, a, b in s.ranges
                        if leaf == "loss_mask"
                    ]
                    ids = [
                        (a, b)
                        for s in stores.values()
                        for leaf, a, b in s.ranges
                        if leaf == "input_ids"
                    ]
                    assert sorted(mask) == sorted(ids), (host, step)


def _masked(docs: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{"input_ids": d, "loss_mask": (d % 3 == 0).astype(np.uint8)} for d in docs]


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


class _Remote:
    """A flat array that is not a numpy array: a store of it waits on storage."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.shape, self.dtype = values, values.shape, values.dtype

    def __getitem__(self, where):
        return self.values[where]


def test_a_store_that_waits_on_storage_gives_the_loader_storages_read_threads():
    from psdp import OrderOptions
    from psdp._runtime.feeds import open_feed

    docs = documents(0)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    flat = np.concatenate(docs)
    local = DocumentStore.from_arrays(offsets, {"input_ids": flat})
    remote = DocumentStore.from_arrays(offsets, {"input_ids": _Remote(flat)})
    for store, waits, threads in ((local, False, 1), (remote, True, 4)):
        view = StagedTokens({"web": store, "code": local}, STAGES, **SETTINGS)
        assert view.reads_storage is waits and view.stage(1).reads_storage is waits
        assert open_feed(view, OrderOptions(global_batch_size=8)).read_threads(None) == threads


@pytest.mark.slow  # 4 s: 8 hosts x 4 jobs, then timed
def test_the_long_context_script_checks_and_measures_at_small_lengths():
    """scripts/measure/long_context.py at seq_len 64 -> 512 (its own run takes half a minute):
    every host's bytes are its columns plus halos, each job timed, the ratios and read times
    reported."""
    import runpy
    from pathlib import Path

    script = runpy.run_path(
        str(Path(__file__).parents[1] / "scripts/measure/long_context.py"), run_name="long_context"
    )
    result = script["measure"](1, 1, 4, 40_000, lengths=(64, 512, 2048))
    assert set(result["times"]) == {
        f"{v} {n}" for v in ("StagedTokens", "TokenSequences") for n in (64, 512)
    }
    # host (d, c) of data=2 x context=4: 16 rows x 16 columns (+ 4 halo inside the row) at 64
    assert sorted(set(result["bytes"]["StagedTokens 64"].values())) == [16 * 20 * 2, 16 * 24 * 2]
    assert sorted(set(result["bytes"]["StagedTokens 512"].values())) == [2 * 132 * 2, 2 * 136 * 2]
    assert set(script["ratios"](result)) == {"tokens_per_s", "cpu_tokens_per_s"}
    assert "read() of 32 whole rows of 64" in script["table"](result)
