"""Finite loaders for evaluation: one pass over the source, every example exactly once (the last
batch padded and masked), then `StopIteration`; the same global batches on any mesh; a length
known up front (docs/guides/evaluate.md, "Finite loaders: evaluation"). Oracle: tests/eval_oracle.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import psdp
from psdp import DataLoader, DocumentStore, Mixture, PackedSequences, TokenSequences
from psdp._plan.offsets import StepOffsets
from tests import oracle, packing_oracle, token_oracle
from tests.batch_checks import assert_batch_exact, token_table
from tests.eval_oracle import eval_batches
from tests.meshes import SCRAMBLED, mesh_of

# (axis names, shape, the batch shards the "batch" strategy splits over)
MESHES = {
    "data8": (("data",), (8,), 8),
    "data4xmodel2": (("data", "model"), (4, 2), 4),
    "replica2xdata2xmodel2": (("replica", "data", "model"), (2, 2, 2), 4),
}


def _rows(n: int) -> dict[str, np.ndarray]:
    """Rows that name themselves: ``tokens`` row r starts at r * 1000, ``id`` is r."""
    return {"id": np.arange(n, dtype=np.int32), "tokens": token_table(n, width=4)}


def _one_pass(loader) -> list:
    """Every batch of ``iter(loader)``, which must end by itself (a guard of 10,000 steps)."""
    batches = []
    for batch in loader:
        batches.append(batch)
        assert len(batches) < 10_000, "the finite loader did not stop"
    return batches


def _assert_pass_exact(batches, want) -> None:
    """Each batch equals the oracle's on every device shard, and the pass has its length."""
    assert len(batches) == len(want)
    for batch, expected in zip(batches, want, strict=True):
        assert_batch_exact(batch, expected)


def _seen_ids(batches) -> np.ndarray:
    """The ``id`` leaf's real rows (mask True) of every batch, sorted."""
    ids = [np.asarray(b["id"])[np.asarray(b["mask"])] for b in batches]
    return np.sort(np.concatenate(ids))


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize(("n", "batch"), [(40, 16), (37, 8), (5, 8), (64, 8), (1, 3), (33, 1)])
def test_one_pass_every_shard_exact_then_stop(mesh_name, n, batch):
    names, shape, shards = MESHES[mesh_name]
    data = _rows(n)
    want = eval_batches(data, batch, shards)
    with psdp.eval_loader(data, mesh=mesh_of(names, shape), global_batch_size=batch) as loader:
        assert len(loader) == -(-n // batch)  # known before any read
        batches = _one_pass(loader)
        _assert_pass_exact(batches, want)
        np.testing.assert_array_equal(_seen_ids(batches), np.arange(n))  # each exactly once
        again = _one_pass(loader)  # a new iterator: the next eval round, the same batches
        _assert_pass_exact(again, want)


def test_the_same_global_batches_on_every_mesh():
    """Host count and layout change only who holds a row: the real rows of every batch are the
    same on 1-D, 2-D, 3-D and scrambled meshes (the physical batch rounds up to each mesh's
    batch shards; the pod tests vary the processes)."""
    data = _rows(45)
    meshes = [(mesh_of(names, shape), shards) for names, shape, shards in MESHES.values()]
    meshes.append((mesh_of(("data", "model"), (4, 2), SCRAMBLED), 4))
    for mesh, shards in meshes:
        with psdp.eval_loader(data, mesh=mesh, global_batch_size=12) as loader:
            got = [{k: np.asarray(v) for k, v in b.items()} for b in _one_pass(loader)]
        want = eval_batches(data, 12, shards)
        assert len(got) == len(want) == 4
        for k, (batch, expected) in enumerate(zip(got, want, strict=True)):
            assert set(batch) == set(expected)
            for key in expected:
                np.testing.assert_array_equal(batch[key], expected[key])
            real = batch["id"][batch["mask"]]  # the same on every mesh
            np.testing.assert_array_equal(real, np.arange(45)[12 * k : 12 * k + 12])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 90), batch=st.integers(1, 20), mesh_name=st.sampled_from(list(MESHES)))
@example(n=16, batch=16, mesh_name="data8")  # divisible: no padding at all
@example(n=17, batch=16, mesh_name="data8")  # one real row in the last batch
@example(n=3, batch=5, mesh_name="data4xmodel2")  # fewer rows than one batch
def test_sizes_not_divisible_by_the_batch(n, batch, mesh_name):
    names, shape, shards = MESHES[mesh_name]
    data = _rows(n)
    with psdp.eval_loader(data, mesh=mesh_of(names, shape), global_batch_size=batch) as loader:
        assert len(loader) == -(-n // batch)
        batches = _one_pass(loader)
        _assert_pass_exact(batches, eval_batches(data, batch, shards))
        np.testing.assert_array_equal(_seen_ids(batches), np.arange(n))


def test_token_sequences_one_pass(mesh_2d):
    docs = token_oracle.documents(seed=3, count=30, mean=7)
    rows = token_oracle.rows(docs, 8)
    source = TokenSequences(DocumentStore.from_documents(docs), 8)
    with psdp.eval_loader(source, mesh=mesh_2d, global_batch_size=6) as loader:
        assert len(loader) == -(-len(rows["input_ids"]) // 6)
        _assert_pass_exact(_one_pass(loader), eval_batches(rows, 6, 4))


def test_packed_sequences_one_pass(mesh_2d):
    lengths = [5, 9, 3, 12, 7, 20, 6, 11, 2, 8, 4, 15, 1, 9]
    docs = packing_oracle.named_documents(lengths)
    bins = packing_oracle.naive_pack(lengths, 16, "best_fit")
    rows = packing_oracle.packed_table(docs, bins, 16)
    store = DocumentStore.from_documents([d["input_ids"] for d in docs])
    source = PackedSequences(store, 16)
    with psdp.eval_loader(source, mesh=mesh_2d, global_batch_size=3) as loader:
        assert len(loader) == -(-len(bins) // 3)
        batches = _one_pass(loader)
    want = eval_batches({k: rows[k] for k in source.leaves}, 3, 4)
    _assert_pass_exact(batches, want)


def test_a_mixture_of_eval_sets_is_one_loader_per_set(mesh_2d):
    """The documented recipe: a finite loader for each of the mixture's sources, by name."""
    sets = {"web": _rows(21), "code": {k: v[::-1].copy() for k, v in _rows(10).items()}}
    mix = Mixture(sets, weights={"web": 3, "code": 1}, block_size=4)
    loaders = {
        name: psdp.eval_loader(source, mesh=mesh_2d, global_batch_size=8)
        for name, source in mix.sources.items()
    }
    for name, loader in loaders.items():
        with loader:
            _assert_pass_exact(_one_pass(loader), eval_batches(sets[name], 8, 4))


def test_epochs_on_a_data_loader_is_the_same_mechanism(mesh_2d):
    """``DataLoader(..., epochs=2)``: two passes in the documented order (here unshuffled),
    each epoch's short final batch padded, then the end."""
    data = _rows(13)
    settings = dict(mesh=mesh_2d, global_batch_size=4, shuffle=False, epochs=2)
    with DataLoader(data, **settings) as loader:
        assert len(loader) == 8
        _assert_pass_exact(_one_pass(loader), eval_batches(data, 4, 4) * 2)


def test_shuffled_epochs_see_every_row_once_per_epoch(mesh_1d):
    data = _rows(50)
    with DataLoader(data, mesh=mesh_1d, global_batch_size=8, seed=4, epochs=3) as loader:
        batches = _one_pass(loader)
    assert len(batches) == 3 * 7
    for epoch in range(3):
        seen = _seen_ids(batches[7 * epoch : 7 * (epoch + 1)])
        np.testing.assert_array_equal(seen, np.arange(50))


def test_a_restored_eval_loader_finishes_the_same_pass(mesh_2d):
    data = _rows(30)
    want = eval_batches(data, 8, 4)
    with psdp.eval_loader(data, mesh=mesh_2d, global_batch_size=8) as loader:
        it = iter(loader)
        assert_batch_exact(next(it), want[0])
        state = it.state()
        it.close()
    assert state["epochs"] == 1
    with DataLoader.restore(state, data, mesh=mesh_2d) as loader:
        assert len(loader) == 3  # the batches iter(loader) still yields
        _assert_pass_exact(_one_pass(loader), want[1:])


def test_the_end_is_a_stop_iteration_naming_the_step(mesh_2d):
    with psdp.eval_loader(_rows(10), mesh=mesh_2d, global_batch_size=4) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        with pytest.raises(StopIteration, match="1 epoch of 10 rows ended: step 3 is past"):
            next(it)
        with pytest.raises(StopIteration, match="step 3 is past"):
            loader.batch_at(3)


def test_an_endless_loader_is_unchanged_and_has_no_length(mesh_2d):
    data = _rows(10)
    with DataLoader(data, mesh=mesh_2d, global_batch_size=4) as loader:
        it = iter(loader)
        batches = [next(it) for _ in range(7)]  # past two epochs' ends: no stop
        assert "epochs" not in it.state()  # an endless loader's state is as before
        it.close()
        assert bool(loader)  # truthy although len() has nothing to say
        with pytest.raises(TypeError, match="an endless DataLoader has no length"):
            len(loader)
    assert len(batches) == 7


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 40),
    stages=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    drop_last=st.booleans(),
    skip=st.one_of(st.none(), st.tuples(st.integers(0, 60), st.integers(1, 15))),
    epochs=st.integers(1, 3),
)
def test_end_step_is_the_first_step_of_the_epoch_after_the_last(n, stages, drop_last, skip, epochs):
    """`StepOffsets.end_step` against the documented walk of tests/oracle.py: the first step
    whose first offset lies in epoch ``epochs`` or later."""
    schedule = [(3 * i, b) for i, b in enumerate(stages)]
    skips = [] if skip is None else [(skip[0], skip[0] + skip[1])]
    if drop_last and max(stages) > n:
        return  # refused (a stage that yields no batch): tests/test_bad_input.py
    offsets = StepOffsets.create(n, schedule, drop_last=drop_last, skip_offsets=skips)
    spans = oracle.schedule_spans(
        n, schedule, 4 * epochs * n + 10, drop_last=drop_last, skip_offsets=skips
    )
    want = next(step for step, span in enumerate(spans) if span.offset >= epochs * n)
    assert offsets.end_step(epochs) == want


@pytest.mark.parametrize(
    "settings",
    [
        {"epochs": 2, "global_batch_size": 4},
        {"order": psdp.OrderOptions(global_batch_size=4, epochs=2)},
    ],
    ids=["keyword", "group"],
)
def test_eval_loader_takes_epochs_as_a_keyword_or_in_its_group(mesh_2d, settings):
    """``epochs`` given to `eval_loader`, flat or in an `OrderOptions` group, is that many
    passes in source order (unset: 1), each the oracle's, then the end."""
    data = _rows(13)
    with psdp.eval_loader(data, mesh=mesh_2d, **settings) as loader:
        assert len(loader) == 8
        _assert_pass_exact(_one_pass(loader), eval_batches(data, 4, 4) * 2)


def test_an_eval_loader_reads_in_source_order_unless_told(mesh_2d):
    """Unset shuffle in a group is source order: the ids of each batch are the oracle's, in
    order, not only each row once."""
    data = _rows(29)
    order = psdp.OrderOptions(global_batch_size=8, seed=3)
    with psdp.eval_loader(data, mesh=mesh_2d, order=order) as loader:
        batches = _one_pass(loader)
    got = np.concatenate([np.asarray(b["id"])[np.asarray(b["mask"])] for b in batches])
    assert got.tolist() == list(range(29))
    _assert_pass_exact(batches, eval_batches(data, 8, 4))
