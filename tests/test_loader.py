"""The DataLoader on 8 fake devices: exact data on every device shard, resume, threads, errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, LoaderClosedError, StreamSource
from psdp._plan.order import PAD
from tests.batch_checks import (
    CountingSource,
    assert_batch_exact,
    expected_batch,
    expected_global,
    physical_ids,
    token_table,
)
from tests.meshes import SCRAMBLED, mesh_of

MESHES = {
    "data=8": (("data",), (8,)),
    "data=4 x model=2": (("data", "model"), (4, 2)),
    "replica=2 x data=2 x model=2": (("replica", "data", "model"), (2, 2, 2)),
}


def make_mesh(name: str) -> Mesh:
    return mesh_of(*MESHES[name], SCRAMBLED)


def live_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_device_gets_exactly_its_rows(mesh_name, shuffle):
    mesh = make_mesh(mesh_name)
    data = {"tokens": token_table(44), "loss_mask": (np.arange(44) % 3 == 0)}
    settings = dict(mesh=mesh, global_batch_size=16, shuffle=shuffle, seed=3)
    with DataLoader(data, **settings) as loader:
        for step, batch in zip(range(7), loader, strict=False):  # 44/16: 3 steps per epoch
            assert assert_batch_exact(batch, expected_batch(data, step, **settings)) == 24
            assert batch["tokens"].sharding.spec == loader.batch_spec["tokens"]


def test_a_batch_lists_its_leaves_in_sorted_order_the_mask_included():
    """One rule for leaf order (docs/guides/custom-sources.md, "Leaf order"): a batch's keys are sorted, the
    mask's among them, whatever order the source gave."""
    data = {
        "weight": np.ones(44, np.float32),
        "tokens": token_table(44),
        "ids": np.arange(44, dtype=np.int32),
    }
    for options in ({}, {"mask_key": "z_mask"}, {"mask_key": None, "drop_last": True}):
        with DataLoader(data, mesh=make_mesh("data=8"), global_batch_size=16, **options) as loader:
            keys = list(loader.batch_at(0))
        assert keys == sorted(keys) and len(keys) == 3 + (options.get("mask_key", 1) is not None)


def test_the_mask_of_a_step_without_padding_is_assembled_once(monkeypatch):
    """Issue 29 (a token step of 0.26 ms spent 0.045 ms on its mask): a loader whose epochs end
    short pads some steps, and built the mask of every step afresh; a step with no padding now
    gets the all-real mask built once (jax.Arrays are immutable), a padded step its own."""
    from psdp._runtime import assembly

    built = []
    assemble = assembly.LeafAssembler.assemble
    monkeypatch.setattr(
        assembly.LeafAssembler,
        "assemble",
        lambda self, buffers: built.append(self.global_shape) or assemble(self, buffers),
    )
    data = {"tokens": token_table(44)}
    settings = dict(mesh=make_mesh("data=8"), global_batch_size=16, shuffle=False)
    with DataLoader(data, **settings) as loader:
        for step in (0, 1, 0, 2, 3, 2):  # 44 / 16: the epoch's third step holds 12 rows
            batch = loader.batch_at(step)
            assert_batch_exact(batch, expected_batch(data, step, **settings))
    assert built.count((16,)) == 3  # the all-real mask once, step 2's twice


def test_how_to_read_a_source_is_decided_once_not_every_step(monkeypatch):
    """Issue 29 (a token step of 0.2 ms): every step asked again whether its source reads
    column windows (an isinstance check against a runtime protocol, and a walk of the class's
    MRO: ~10% of the step); the answer is a property of the source, found once per reader."""
    from psdp._runtime import step_reader

    asked = []
    read_window_of = step_reader._read_window_of
    monkeypatch.setattr(
        step_reader, "_read_window_of", lambda source: asked.append(1) or read_window_of(source)
    )
    data = {"tokens": token_table(44, 4), "w": np.arange(44, dtype=np.float32)}
    settings = dict(mesh=make_mesh("data=4 x model=2"), global_batch_size=8, seed=2,
                    batch_spec={"tokens": P("data", "model"), "w": P("data")})  # fmt: skip
    with DataLoader(data, **settings) as loader:
        for step in range(6):
            assert_batch_exact(loader.batch_at(step), expected_batch(data, step, **settings))
    assert len(asked) == 1


def test_the_mask_follows_the_first_leaf_by_name_whatever_order_the_planner_gets():
    """docs/concepts/partitioning.md: the mask is sharded like the batch dimension of the first leaf by
    name, also when the planner is handed the leaves in another order."""
    from psdp._plan.loader_plan import LoaderPlan
    from psdp._plan.options import LoaderOptions

    row = {"w": np.zeros(1, np.float32), "tokens": np.zeros((1, 4), np.int32)}
    options = LoaderOptions.create(global_batch_size=8, batch_spec={"w": P(), "tokens": P("data")})
    for first_row in (row, dict(reversed(row.items()))):
        plan = LoaderPlan.create(first_row, make_mesh("data=8"), options, 0, stream=False,
                                 ends_short=False)  # fmt: skip
        assert list(plan.leaves) == ["tokens", "w"]
        assert plan.mask.sharding.spec == P("data")


def test_unshuffled_order_is_the_documented_formula():
    data = {"x": token_table(10)}
    loader = DataLoader(data, mesh=make_mesh("data=8"), global_batch_size=8, shuffle=False)
    with loader:
        for step, batch in zip(range(4), loader, strict=False):
            position = (step % 2) * 8 + np.arange(8)  # 2 steps per epoch, the second one short
            real = position < 10
            assert np.asarray(batch["mask"]).tolist() == real.tolist()
            assert (np.asarray(batch["x"])[real, 0] // 1000).tolist() == position[real].tolist()
            assert (np.asarray(batch["x"])[~real] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_each_epoch_is_a_permutation_of_all_rows(seed):
    data = token_table(48)
    loader = DataLoader(data, mesh=make_mesh("data=8"), global_batch_size=16, seed=seed)
    with loader:
        rows = [np.asarray(b)[:, 0] // 1000 for _, b in zip(range(9), loader, strict=False)]
    for epoch in range(3):
        seen = np.concatenate(rows[epoch * 3 : epoch * 3 + 3])
        assert sorted(seen.tolist()) == list(range(48))
    assert rows[0].tolist() != rows[3].tolist()  # epochs are shuffled differently
    assert rows[0].tolist() != list(range(16))  # the rows are shuffled (a batch is sorted by id)


def test_seed_changes_the_order_and_nothing_else():
    """Two seeds: each batch exact for its own seed, different batches, the same epoch's rows,
    the same shapes and shardings."""
    data = token_table(64)
    mesh = make_mesh("data=8")
    seen = {}
    for seed in (1, 2):
        settings = dict(mesh=mesh, global_batch_size=8, seed=seed)
        loader = DataLoader(data, **settings)
        batches = [loader.batch_at(step) for step in range(8)]  # one epoch
        for step, batch in enumerate(batches):
            assert_batch_exact(batch, expected_batch(data, step, **settings))
        assert {(b.shape, b.sharding) for b in batches} == {((8, 3), loader.leaf().sharding)}
        seen[seed] = [np.asarray(b)[:, 0] // 1000 for b in batches]
    assert all(not np.array_equal(a, b) for a, b in zip(seen[1], seen[2], strict=True))
    assert sorted(np.concatenate(seen[1]).tolist()) == sorted(np.concatenate(seen[2]).tolist())


def test_resume_from_any_step_equals_continuing():
    data = {"x": token_table(50)}
    mesh = make_mesh("data=4 x model=2")
    with DataLoader(data, mesh=mesh, global_batch_size=8, seed=9) as loader:
        reference = [np.asarray(b["x"]) for _, b in zip(range(12), loader, strict=False)]
        for k in (1, 6, 11):
            resumed = loader.iter_from(k)
            for step in range(k, 12):
                np.testing.assert_array_equal(np.asarray(next(resumed)["x"]), reference[step])
            resumed.close()


def test_a_restore_takes_the_block_shuffle_from_the_state():
    """Restored with no order given, a block-shuffled run goes on with the saved io_block and
    window_blocks (a short block, into the next epoch): every shard exact against the oracle of
    the settings the run was started with."""
    data = {"x": token_table(50)}  # blocks of 4: a short last block of 2
    mesh = make_mesh("data=4 x model=2")
    settings = dict(mesh=mesh, global_batch_size=8, seed=9, io_block=4, window_blocks=3)
    with DataLoader(data, **settings) as loader:
        state = loader.iter_from(4).state()
    with DataLoader.restore(state, data, mesh=mesh) as restored:
        for step, batch in zip(range(4, 11), restored, strict=False):  # 7 steps an epoch
            assert assert_batch_exact(batch, expected_batch(data, step, **settings)) == 16


def test_prefetch_depth_does_not_change_batches():
    data = {"x": token_table(40)}
    mesh = make_mesh("replica=2 x data=2 x model=2")
    for depth in (1, 8):
        settings = dict(mesh=mesh, global_batch_size=8, seed=4)
        with DataLoader(data, prefetch=depth, **settings) as loader:
            for step, batch in zip(range(10), loader, strict=False):  # every shard, exactly
                assert_batch_exact(batch, expected_batch(data, step, **settings))


def test_step_ten_million_is_its_known_batch():
    """No permutation is stored or walked: step 10**7 is read directly (tests/test_oracle.py
    pins these ids)."""
    loader = DataLoader({"x": token_table(1000)}, mesh=make_mesh("data=8"), global_batch_size=16,
                        seed=12345)  # fmt: skip
    batch = loader.batch_at(10**7)
    assert np.asarray(batch["mask"]).all()
    got = np.asarray(batch["x"])[:, 0] // 1000
    assert got.tolist() == [123, 175, 185, 215, 452, 537, 551, 597,
                            625, 635, 677, 694, 723, 745, 784, 911]  # fmt: skip


def test_one_batched_read_per_step():
    """One call per step with the step's ids, never one per row (on one process, every row: the
    reads of hosts holding part of the batch are checked in tests/test_hosts.py)."""
    source = CountingSource(token_table(32))
    settings = dict(mesh=make_mesh("data=4 x model=2"), global_batch_size=8)
    loader = DataLoader(source, **settings)
    source.reads.clear()
    loader.batch_at(3)
    assert len(source.reads) == 1
    np.testing.assert_array_equal(source.reads[0], physical_ids(token_table(32), 3, **settings))


def test_indexable_object_source():
    class Table:
        def __init__(self):
            self.rows = token_table(20)

        def __len__(self):
            return 20

        def __getitem__(self, ids):
            return self.rows[ids]

    loader = DataLoader(
        Table(), mesh=make_mesh("data=8"), global_batch_size=8, shuffle=False, drop_last=True
    )
    assert_batch_exact(loader.batch_at(1), token_table(20)[8:16])
    assert_batch_exact(loader.batch_at(2), token_table(20)[0:8])  # epoch 1: rows 16..19 dropped


# ---------------------------------------------------------------------------------- threads
class FailingSource(CountingSource):
    def __init__(self, data, fail_at_call):
        super().__init__(data)
        self.fail_at_call = fail_at_call

    def read(self, ids):
        if len(self.reads) == self.fail_at_call:
            raise KeyError(f"row {int(ids[0])} is corrupt")
        return super().read(ids)


def test_reader_exception_reaches_the_trainer_with_type_and_traceback():
    source = FailingSource(token_table(64), fail_at_call=4)  # call 0 is the probe
    loader = DataLoader(source, mesh=make_mesh("data=8"), global_batch_size=8, shuffle=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
    with pytest.raises(KeyError, match="row 24 is corrupt") as info:
        next(it)
    frames = [f.name for f in info.traceback]
    assert "read" in frames  # the original frame inside the source survives
    with pytest.raises(LoaderClosedError, match="step 3 raised KeyError"):
        next(it)
    loader.close()


def test_close_with_a_full_queue_is_fast_and_joins():
    loader = DataLoader(token_table(64), mesh=make_mesh("data=8"), global_batch_size=8, prefetch=2)
    loader.name = "psdp-fullq"
    it = iter(loader)
    next(it)
    time.sleep(0.3)  # the queue fills up; the thread blocks on put
    started = time.perf_counter()
    loader.close()
    assert time.perf_counter() - started < 1.0
    assert not live_threads("psdp-fullq")
    with pytest.raises(LoaderClosedError):
        next(it)
    with pytest.raises(LoaderClosedError, match="DataLoader is closed"):
        loader.iter_from(0)


def test_close_from_another_thread_wakes_a_blocked_next():
    gate = threading.Event()

    class SlowSource(CountingSource):
        def read(self, ids):
            if self.reads:  # after the probe, block until the test lets go
                gate.wait(5)
            return super().read(ids)

    loader = DataLoader(SlowSource(token_table(16)), mesh=make_mesh("data=8"), global_batch_size=8)
    it = iter(loader)
    threading.Timer(0.2, it.close).start()
    started = time.perf_counter()
    with pytest.raises(LoaderClosedError, match="close"):
        next(it)
    assert time.perf_counter() - started < 1.5
    gate.set()
    loader.close()


def test_no_thread_left_after_100_open_close_cycles():
    data = token_table(32)
    mesh = make_mesh("data=8")
    before = threading.active_count()
    for i in range(100):
        with DataLoader(data, mesh=mesh, global_batch_size=8, name="psdp-cycle") as loader:
            if i % 2:
                next(iter(loader))
    assert not live_threads("psdp-cycle")
    assert threading.active_count() <= before


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(global_batch_size=12), ValueError, "pass a dict source.*=12 is not a multiple"),
        (dict(drop_last=False, global_batch_size=5), ValueError, "is padded to 8 rows"),
        (dict(global_batch_size=0), ValueError, "global_batch_size must be >= 1, got 0"),
        (dict(global_batch_size=8.0), TypeError, "global_batch_size must be an int"),
        (dict(prefetch=0), ValueError, "prefetch must be >= 1, got 0"),
        (dict(batch_spec=P("dp")), ValueError, "'dp' is not in the mesh"),
        (dict(mesh="data=8"), TypeError, "mesh must be a jax.sharding.Mesh"),
        (dict(global_batch_size=64, drop_last=True), ValueError, "would yield no batch at all"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    args = dict(mesh=make_mesh("data=8"), global_batch_size=8, drop_last=True) | kwargs
    with pytest.raises(error, match=message):
        DataLoader(token_table(32), **args)


def test_no_batch_axis_in_mesh_asks_for_a_spec():
    mesh = mesh_of(("x",), (8,))
    with pytest.raises(ValueError, match="pass batch_spec=PartitionSpec"):
        DataLoader(token_table(16), mesh=mesh, global_batch_size=8)


def test_negative_step_is_refused():
    loader = DataLoader(token_table(16), mesh=make_mesh("data=8"), global_batch_size=8)
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        loader.iter_from(-1)


def test_dict_leaves_of_different_lengths():
    with pytest.raises(ValueError, match="same number of rows"):
        DataLoader(
            {"a": np.zeros((8, 2)), "b": np.zeros(9)}, mesh=make_mesh("data=8"), global_batch_size=8
        )


def test_rows_changing_shape_mid_dataset_is_a_clear_error():
    class Ragged(CountingSource):
        def read(self, ids):
            out = super().read(ids)
            return out if len(self.reads) < 3 else out[:, :2]

    loader = DataLoader(Ragged(token_table(32)), mesh=make_mesh("data=8"), global_batch_size=8)
    it = iter(loader)
    next(it)
    with pytest.raises(
        ValueError,
        match=r"step 1: rows of the array source have shape \(2,\).*first row had \(3,\)",
    ):
        next(it)
    loader.close()


# ----------------------------------------------------------------------------------- streams
def test_a_stream_fills_batches_in_order_and_pads_its_end():
    data = {"x": token_table(21), "w": np.arange(21, dtype=np.float32)}
    elements = [{k: v[i] for k, v in data.items()} for i in range(21)]
    mesh = make_mesh("data=4 x model=2")
    with DataLoader(StreamSource(elements), mesh=mesh, global_batch_size=8) as loader:
        assert loader.plan.stream_shard == (0, 1) and loader.plan.padded
        batches = list(loader)  # the stream ends: 8 + 8 + 5 rows, the last batch padded
    assert len(batches) == 3
    for step, batch in enumerate(batches):
        ids = np.arange(step * 8, step * 8 + 8)
        ids[ids >= 21] = PAD
        want = expected_global(data, ids) | {"mask": ids != PAD}
        assert_batch_exact(batch, want)


def test_a_stream_takes_no_elements_for_the_physical_batchs_padding():
    """6 real rows on 4 data shards: a physical batch of 8, whose last 2 rows are padding every
    step; each step takes the next 6 elements (21 = 6 + 6 + 6 + 3)."""
    data = {"x": token_table(21)}
    elements = [{"x": row} for row in data["x"]]
    with DataLoader(
        StreamSource(elements), mesh=make_mesh("data=4 x model=2"), global_batch_size=6
    ) as loader:
        assert loader.plan.physical_batch_size == 8
        batches = list(loader)
    assert len(batches) == 4
    for step, batch in enumerate(batches):
        ids = np.full(8, PAD)
        ids[:6] = np.arange(step * 6, step * 6 + 6)
        ids[ids >= 21] = PAD
        assert_batch_exact(batch, expected_global(data, ids) | {"mask": ids != PAD})


def test_a_stream_resumes_by_skipping_and_drops_its_end_with_drop_last():
    stream = StreamSource(
        lambda shard, num_shards: ({"x": np.array([k, -k], np.int32)} for k in range(30))
    )
    mesh = make_mesh("data=8")
    with DataLoader(stream, mesh=mesh, global_batch_size=8, drop_last=True) as loader:
        assert not loader.plan.padded
        assert [np.asarray(b["x"])[0, 0] for b in loader] == [0, 8, 16]  # 24..29 dropped
        resumed = next(loader.iter_from(2))
        assert np.asarray(resumed["x"])[:, 0].tolist() == list(range(16, 24))
        state = loader.state()
    assert state["step"] == 3 and state["source"]["rows"] is None


def test_a_stream_cannot_be_shuffled():
    with pytest.raises(ValueError, match="shuffle=True with a stream .* pass shuffle=False"):
        DataLoader(StreamSource([1, 2, 3]), mesh=make_mesh("data=8"), global_batch_size=8,
                   shuffle=True)  # fmt: skip


def test_a_subclass_overriding_read_is_not_bypassed_by_read_window(mesh_context):
    from psdp import ArraySource

    class Doubling(ArraySource):  # overrides read only: read_window (inherited) must not be used
        def read(self, ids):
            return {k: v * 2 for k, v in super().read(ids).items()}

    data = {"tokens": token_table(16, 4), "w": np.arange(16, dtype=np.int32)}
    spec = {"tokens": P("data", "context")}  # a column window: served by read_window otherwise
    settings = dict(mesh=mesh_context, global_batch_size=8, batch_spec=spec, seed=1)
    loader = DataLoader(Doubling(data), **settings)
    doubled = {k: v * 2 for k, v in data.items()}
    assert_batch_exact(loader.batch_at(0), expected_batch(doubled, 0, **settings))


def test_state_after_the_with_block_keeps_the_progress():
    with DataLoader(
        {"x": token_table(64)}, mesh=make_mesh("data=8"), global_batch_size=8
    ) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        assert loader.state()["step"] == 3
    assert loader.state()["step"] == 3  # a checkpoint saved after close() resumes at step 3


@pytest.mark.parametrize(
    ("storage", "requested", "threads"),
    [(False, None, 1), (True, None, 4), (True, 2, 2), (False, 3, 3)],
)
def test_unset_read_threads_follow_the_source(tmp_path, mesh_2d, storage, requested, threads):
    from psdp.sources import TensorStoreSource
    from psdp.sources.stores.writer import write_dataset

    table = token_table(32)
    source = TensorStoreSource(write_dataset(tmp_path / "d", table, progress=False))
    kwargs = {} if requested is None else {"read_threads": requested}
    loader = DataLoader(source if storage else table, mesh=mesh_2d, global_batch_size=8, **kwargs)
    with loader, loader.iter_from(0) as it:
        next(it)
        names = {t.name for t in live_threads(loader.name)}
        assert len(names) == threads, names
