"""`PackedSequences(targets=True, eos_id=...)` and provenance against tables laid out from the
documents themselves (tests/packing_oracle.py: `naive_pack`, `packed_table`, `with_eos`,
`with_targets`), never from the code under test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from psdp import (
    PACKING_STRATEGIES,
    DataLoader,
    DocumentStore,
    Mixture,
    PackedSequences,
    TokenSequences,
)
from tests.batch_checks import assert_batch_exact, expected_batch
from tests.meshes import mesh_of
from tests.packing_oracle import naive_pack, named_documents, packed_table, with_eos, with_targets

EOS, PAD = 999_999, -1


def store_of(lengths, masks=False):
    """A store of `named_documents` (empty documents allowed: `from_arrays`)."""
    docs = named_documents(lengths, masks)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = {k: np.concatenate([d[k] for d in docs]) for k in docs[0]}
    return DocumentStore.from_arrays(offsets, flat)


def oracle(lengths, seq_len, *, targets, eos_id, masks=False, strategy="best_fit",
           long_documents="split", seed=None, window=None):  # fmt: skip
    """Every row's leaves as documented, from the documents (with their EOS) packed naively."""
    docs, slots = with_eos(named_documents(lengths, masks), eos_id)
    bins = naive_pack(slots, seq_len, strategy, long_documents, seed, window)
    table = packed_table(docs, bins, seq_len, PAD)
    return with_targets(table, PAD, store_mask=masks) if targets else table


def assert_rows_equal(got, want):
    assert set(got) == set(want), (set(got), set(want))
    for key in want:
        assert got[key].dtype == want[key].dtype, (key, got[key].dtype, want[key].dtype)
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# --------------------------------------------------------------------------- rows, any lengths
@settings(max_examples=200, deadline=None, derandomize=True)  # the same cases every run
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=25),
    seq_len=st.integers(1, 12),
    strategy=st.sampled_from(PACKING_STRATEGIES),
    long_documents=st.sampled_from(["split", "drop"]),
    eos=st.booleans(),
    targets=st.booleans(),
    masks=st.booleans(),
    window=st.sampled_from([None, 3]),
    columns=st.tuples(st.integers(0, 12), st.integers(0, 12)),
)
@example(
    lengths=[4, 0, 9],
    seq_len=4,
    strategy="best_fit",
    long_documents="split",
    eos=True,
    targets=True,
    masks=False,
    window=None,
    columns=(0, 4),
)  # an EOS alone in its piece
@example(
    lengths=[3, 4],
    seq_len=4,
    strategy="greedy",
    long_documents="drop",
    eos=True,
    targets=True,
    masks=True,
    window=None,
    columns=(1, 3),
)  # 4 tokens + EOS: dropped
@example(
    lengths=[1, 1, 1],
    seq_len=1,
    strategy="best_fit",
    long_documents="split",
    eos=False,
    targets=True,
    masks=False,
    window=None,
    columns=(0, 1),
)  # no token has a target
@example(
    lengths=[3],
    seq_len=8,
    strategy="best_fit",
    long_documents="split",
    eos=True,
    targets=False,
    masks=False,
    window=None,
    columns=(0, 2),
)  # a window cuts off the EOS
def test_targets_and_eos_rows_are_the_documented_table(
    lengths, seq_len, strategy, long_documents, eos, targets, masks, window, columns
):
    eos_id = EOS if eos else None
    slots = with_eos(named_documents(lengths), eos_id)[1]
    if not any(n > 0 and (n <= seq_len or long_documents == "split") for n in slots):
        return  # nothing to pack: an error (tests/test_bad_input.py)
    source = PackedSequences(store_of(lengths, masks), seq_len, strategy, long_documents,
                             pad_id=PAD, targets=targets, eos_id=eos_id,
                             window=window)  # fmt: skip
    want = oracle(lengths, seq_len, targets=targets, eos_id=eos_id, masks=masks,
                  strategy=strategy, long_documents=long_documents, window=window)  # fmt: skip
    ids = np.arange(len(source))[::-1].copy()
    assert len(source) == len(want["input_ids"])
    assert_rows_equal(source.read(ids), {k: v[ids] for k, v in want.items()})
    low, high = sorted(c % (seq_len + 1) for c in columns)
    window_read = source.read_window(ids, {k: slice(low, high) for k in want})
    assert_rows_equal(window_read, {k: v[ids, low:high] for k, v in want.items()})


def test_a_target_never_crosses_a_segment_and_the_eos_is_the_last_tokens_target():
    """One case by hand: documents 0 (3 tokens), 1 (6: split at seq_len 4 with its EOS)."""
    source = PackedSequences(store_of([3, 6]), 4, pad_id=PAD, targets=True, eos_id=EOS)
    rows = source.read(np.arange(3))
    assert rows["input_ids"].tolist() == [[0, 1, 2, EOS], [1000, 1001, 1002, 1003],
                                          [1004, 1005, EOS, PAD]]  # fmt: skip
    assert rows["targets"].tolist() == [[1, 2, EOS, PAD], [1001, 1002, 1003, PAD],
                                        [1005, EOS, PAD, PAD]]  # fmt: skip
    assert rows["loss_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]]
    assert rows["positions"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 0]]


def test_without_targets_or_eos_the_rows_are_unchanged():
    lengths = [5, 17, 3, 9, 0, 1, 12]
    plain = PackedSequences(store_of(lengths, masks=True), 8, pad_id=PAD)
    assert "targets" not in plain.leaves
    assert_rows_equal(plain.read(np.arange(len(plain))),
                      oracle(lengths, 8, targets=False, eos_id=None, masks=True))  # fmt: skip


def test_a_store_loss_mask_counts_at_the_target_token():
    """A chat mask marks the tokens to learn: a column counts where its target is one."""
    source = PackedSequences(store_of([7], masks=True), 8, pad_id=PAD, targets=True)
    rows = source.read(np.array([0]))
    # tokens 0..6, mask of token i: i % 3 != 1 -> targets 1..6 have masks 0 1 1 0 1 1
    assert rows["loss_mask"].tolist() == [[0, 1, 1, 0, 1, 1, 0, 0]]


def test_leaves_can_deliver_targets_alone():
    source = PackedSequences(store_of([3, 6]), 4, targets=True, eos_id=EOS, leaves=("targets",))
    assert list(source.read(np.array([2]))) == ["targets"]
    assert source.read(np.array([2]))["targets"].tolist() == [[1005, EOS, 0, 0]]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_the_targets_leaf_has_the_ids_dtype(dtype):
    """``targets`` are token ids: the store's id dtype, declared and delivered, under both views
    (packing: a leaf of its own; concatenation: ``input_ids`` one token wider)."""
    docs = [np.arange(1, n + 1, dtype=dtype) for n in (5, 9, 4)]
    store = DocumentStore.from_documents(docs)
    packed = PackedSequences(store, 4, targets=True)
    assert packed.leaves["targets"] == packed.leaves["input_ids"] == np.dtype(dtype)
    rows = packed.read(np.arange(len(packed)))
    assert rows["targets"].dtype == np.dtype(dtype)
    mesh = mesh_of(("data",), (2,))
    with DataLoader(packed, mesh=mesh, global_batch_size=2, shuffle=False) as loader:
        batch = loader.batch_at(0)
        assert batch["targets"].dtype == batch["input_ids"].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(batch["targets"]), rows["targets"][:2])
    concatenated = TokenSequences(store, 4, targets=True)
    assert concatenated.read(np.array([0]))["input_ids"].dtype == np.dtype(dtype)


def test_a_pack_index_records_eos(tmp_path):
    lengths = [5, 3, 7, 2, 6, 4, 8, 1] * 2
    path = tmp_path / "index.npz"
    plain = PackedSequences(store_of(lengths), 8, window=4, index=path)
    with_eos_ = PackedSequences(store_of(lengths), 8, window=4, index=path, eos_id=EOS, pad_id=PAD)
    assert not plain.plan.key.eos and with_eos_.plan.key.eos  # rebuilt, not reused
    want = oracle(lengths, 8, targets=False, eos_id=EOS, window=4)
    np.testing.assert_array_equal(with_eos_.read(np.arange(len(with_eos_)))["input_ids"],
                                  want["input_ids"])  # fmt: skip


# ------------------------------------------------------------------- loader: every shard exact
LENGTHS = [5, 17, 3, 9, 30, 1, 12, 8, 8, 4, 21, 2, 6, 15, 11, 7, 3, 19, 5, 10] * 3


@pytest.mark.parametrize("window", [None, 7])
def test_every_device_shard_is_exact_with_targets(window, mesh_2d, mesh_context):
    """Batch, and the sequence over ``context`` with a halo: a host's columns' targets need the
    column after its last, read from the store."""
    source = PackedSequences(store_of(LENGTHS, masks=True), 16, window=window, seed=1,
                             pad_id=PAD, targets=True, eos_id=EOS)  # fmt: skip
    table = oracle(LENGTHS, 16, targets=True, eos_id=EOS, masks=True, seed=1, window=window)
    context = {k: P("data", "context") for k in table}
    for mesh, spec, halo in ((mesh_2d, "batch", 0), (mesh_context, context, 0),
                             (mesh_context, context, 2)):  # fmt: skip
        settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, halo=halo, seed=3)
        with DataLoader(source, **settings) as loader:
            for step in range(4):  # past the epoch's end
                want = expected_batch(table, step, io_block=source.io_block, **settings)
                assert_batch_exact(loader.batch_at(step), want)


def test_every_device_shard_is_exact_in_a_mixture_with_targets(mesh_context):
    a, b = [5, 17, 3, 9, 30, 1, 12, 8], [8, 4, 21, 2, 6, 15, 11, 7]
    views = {name: PackedSequences(store_of(lengths), 16, pad_id=PAD, targets=True, eos_id=EOS)
             for name, lengths in (("a", a), ("b", b))}  # fmt: skip
    mix = Mixture(views, weights={"a": 1, "b": 1}, block_size=4, seed=2)
    tables = {name: oracle(lengths, 16, targets=True, eos_id=EOS)
              for name, lengths in (("a", a), ("b", b))}  # fmt: skip
    spec = {k: P("data", "context") for k in tables["a"]}
    with DataLoader(mix, mesh=mesh_context, global_batch_size=8, batch_spec=spec) as loader:
        for step in range(3):
            source, rows = mix.locate(np.arange(step * 8, step * 8 + 8))
            names = np.array(mix.names)[source]
            want = {k: np.stack([tables[n][k][r] for n, r in zip(names, rows, strict=True)])
                    for k in spec}  # fmt: skip
            batch = loader.batch_at(step)
            assert np.asarray(batch.pop("mask")).all()  # a mixture never runs out of rows
            assert_batch_exact(batch, want)


# ---------------------------------------------------------------------------------- provenance
def raw_store(lengths, seed):
    """A store of random tokens and the raw arrays it was made from (the oracle's data)."""
    tokens = np.random.default_rng(seed).integers(1, 50_000, int(sum(lengths))).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return DocumentStore.from_arrays(offsets, {"input_ids": tokens}), tokens, offsets


def assert_provenance_names_every_token(rows, table, raws, width, covered):
    """Every segment's columns hold exactly its document's tokens [start, stop) in the raw
    arrays (then the EOS if it says so), and the segments cover exactly the ``covered`` cells."""
    seen = np.zeros((len(rows), width), bool)
    for seg in table:
        tokens, offsets = raws[str(seg["source"])]
        first = offsets[seg["document"]]
        want = tokens[first + seg["start"] : first + seg["stop"]].tolist()
        want += [EOS] if seg["eos"] else []
        cols = slice(seg["column"], seg["column"] + len(want))
        assert rows[seg["row"], cols].tolist() == want, seg
        assert not seen[seg["row"], cols].any(), seg  # segments never overlap
        seen[seg["row"], cols] = True
    np.testing.assert_array_equal(seen, covered)


@pytest.mark.parametrize("view", ["packed", "packed_windows", "tokens", "tokens_targets"])
def test_provenance_names_the_store_tokens_of_every_delivered_token(view, mesh_context):
    """Through a loader over a Mixture of two sources, sequence sharded over ``context``."""
    lengths = {"a": [5, 17, 0, 9, 30, 1, 12, 8], "b": [8, 4, 21, 2, 6, 15, 0, 11, 7, 3]}
    raws, views = {}, {}
    for seed, (name, lens) in enumerate(lengths.items()):
        store, tokens, offsets = raw_store(lens, seed)
        raws[name] = (tokens, offsets)
        if view.startswith("packed"):
            window = 4 if view == "packed_windows" else None
            views[name] = PackedSequences(store, 16, targets=True, eos_id=EOS, window=window)
        else:
            views[name] = TokenSequences(store, 16, eos_id=EOS, targets=view == "tokens_targets")
    mix = Mixture(views, weights={"a": 1, "b": 2}, block_size=3, seed=1)
    leaves = ["input_ids", "segment_ids"]
    spec = {k: P("data", "context") for k in leaves}
    with DataLoader(mix, mesh=mesh_context, global_batch_size=8, batch_spec=spec) as loader:
        for step in range(3):
            batch = loader.batch_at(step)
            ids = loader.step_info(step).offset + np.arange(8)
            rows, segment = (np.asarray(batch[k]) for k in leaves)
            if view.startswith("packed"):
                covered = segment > 0
            else:  # a row's width columns (seq_len + 1 with targets: the domain pads one more)
                covered = np.arange(rows.shape[1]) < views["a"].width
                covered = np.broadcast_to(covered, rows.shape)
            table = mix.provenance(ids)
            assert set(table["source"]) <= {"a", "b"}
            assert_provenance_names_every_token(rows, table, raws, rows.shape[1], covered)
