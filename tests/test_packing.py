"""Packing: the pure plan against naive packers, `PackedSequences` against a table laid out from
the documents, and every device shard of a loader over it (tests/packing_oracle.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from psdp import PACKING_STRATEGIES, DataLoader, DocumentStore, PackedSequences, plan_packing
from psdp._plan.packing import LONG_DOCUMENTS
from tests.batch_checks import assert_batch_exact, expected_batch
from tests.packing_oracle import (
    FormulaCorpus,
    check_packed,
    naive_pack,
    named_documents,
    packed_table,
)


def store_of(lengths, masks=False, kind=DocumentStore):
    """A store of `named_documents` (empty documents allowed: `from_arrays`)."""
    docs = named_documents(lengths, masks)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = {k: np.concatenate([d[k] for d in docs]) for k in docs[0]}
    return kind.from_arrays(offsets, flat)


def plan_bins(plan) -> list[list[tuple[int, int, int]]]:
    return [list(zip(*(a.tolist() for a in plan.pieces(q)), strict=True)) for q in range(len(plan))]


class CountingStore(DocumentStore):
    """Records every `read_ranges` call, (starts, stops, leaves), and every `offsets_range`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list = []
        self.offset_reads: list[tuple[int, int]] = []

    def read_ranges(self, starts, stops, leaves=None):
        self.calls.append((np.array(starts), np.array(stops), leaves))
        return super().read_ranges(starts, stops, leaves)

    def offsets_range(self, start, stop):
        self.offset_reads.append((start, stop))
        return super().offsets_range(start, stop)


# ------------------------------------------------------------------------------------ the plan
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    seq_len=st.integers(1, 16),
    strategy=st.sampled_from(PACKING_STRATEGIES),
    long_documents=st.sampled_from(LONG_DOCUMENTS),
    seed=st.one_of(st.none(), st.integers(0, 3)),
    cap=st.one_of(st.none(), st.integers(1, 4)),
)
def test_the_plan_is_the_naive_packing_and_reads_hold_every_token_once(
    lengths, seq_len, strategy, long_documents, seed, cap
):
    if all(n == 0 or (n > seq_len and long_documents == "drop") for n in lengths):
        with pytest.raises(ValueError, match="nothing to pack"):
            plan_packing(lengths, seq_len, strategy, long_documents, seed, cap)
        return
    plan = plan_packing(lengths, seq_len, strategy, long_documents, seed, cap)
    want = naive_pack(lengths, seq_len, strategy, long_documents, seed, max_segments=cap)
    assert plan_bins(plan) == want
    assert cap is None or max(map(len, want)) <= cap
    dropped = [d for d, n in enumerate(lengths) if n > seq_len and long_documents == "drop"]
    assert plan.dropped.tolist() == dropped
    assert plan.empty.tolist() == [d for d, n in enumerate(lengths) if n == 0]
    cut = seq_len if long_documents == "truncate" else max(lengths)
    kept = sum(min(n, cut) for d, n in enumerate(lengths) if d not in dropped)
    assert plan.efficiency == kept / (len(want) * seq_len)
    if sum(lengths) == 0 or all(n == 0 for n in lengths):
        return
    source = PackedSequences(
        store_of(lengths), seq_len, strategy, long_documents, seed=seed, max_segments=cap
    )
    rows = source.read(np.arange(len(source)))
    check_packed(rows, lengths, seq_len, dropped, truncate=long_documents == "truncate")
    table = packed_table(named_documents(lengths), want, seq_len)
    for key, value in table.items():
        np.testing.assert_array_equal(rows[key], value, err_msg=key)


def test_best_fit_fills_at_least_95_percent_of_log_normal_documents():
    """Issue #18: log-normal lengths (mean ~300, at most 4096) in sequences of 2048."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(300) - 0.5, 1.0, 20_000)), 1, 4096)
    plan = plan_packing(lengths.astype(np.int64), 2048, "best_fit")
    assert plan.efficiency >= 0.95, plan.describe()
    assert plan.num_tokens == lengths.sum()  # split: nothing lost


def test_long_documents_split_into_pieces_of_seq_len_or_are_dropped():
    split = plan_packing([3, 10, 2], 4, "first_fit")
    assert plan_bins(split) == [[(0, 0, 3)], [(1, 0, 4)], [(1, 4, 4)], [(1, 8, 2), (2, 0, 2)]]
    dropped = plan_packing([3, 10, 2], 4, "first_fit", "drop")
    assert plan_bins(dropped) == [[(0, 0, 3)], [(2, 0, 2)]]
    assert dropped.dropped.tolist() == [1] and "1 long documents dropped" in dropped.describe()


def test_best_fit_takes_the_fullest_sequence_and_the_earliest_among_equals():
    # rooms after [6, 8, 8] in sequences of 10: 4, 2, 2. Each 2 goes to the fullest sequence with
    # room, the earliest first: 1, then 2, then 0; first fit fills sequence 0 first.
    bins = [[(0, 0, 6), (5, 0, 2)], [(1, 0, 8), (3, 0, 2)], [(2, 0, 8), (4, 0, 2)]]
    assert plan_bins(plan_packing([6, 8, 8, 2, 2, 2], 10, "best_fit")) == bins
    first = [[(0, 0, 6), (3, 0, 2), (4, 0, 2)], [(1, 0, 8), (5, 0, 2)], [(2, 0, 8)]]
    assert plan_bins(plan_packing([6, 8, 8, 2, 2, 2], 10, "first_fit")) == first


def test_a_cap_on_segments_closes_a_row_that_holds_that_many():
    # rows of 10 with room left: without a cap, every 1-token document joins them
    lengths = [4, 1, 1, 1, 4, 1, 1, 1]
    assert plan_bins(plan_packing(lengths, 10, "greedy")) == [
        [(0, 0, 4), (1, 0, 1), (2, 0, 1), (3, 0, 1)], [(4, 0, 4), (5, 0, 1), (6, 0, 1), (7, 0, 1)]
    ]  # fmt: skip
    for strategy in PACKING_STRATEGIES:
        plan = plan_packing(lengths, 10, strategy, max_segments=2)
        assert max(np.diff(plan.seq_starts)) == 2 and plan.num_tokens == sum(lengths)
        assert "of at most 2 segments" in plan.describe()
    # best_fit: a row at its cap leaves the choice even when it is the fullest
    assert plan_bins(plan_packing([6, 1, 3, 3], 10, "best_fit", max_segments=2)) == [
        [(0, 0, 6), (1, 0, 1)], [(2, 0, 3), (3, 0, 3)]
    ]  # fmt: skip
    # pieces of a split document are segments too
    assert plan_bins(plan_packing([3, 9], 4, "first_fit", max_segments=1)) == [
        [(0, 0, 3)], [(1, 0, 4)], [(1, 4, 4)], [(1, 8, 1)]
    ]  # fmt: skip


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=60),
    cap=st.one_of(st.none(), st.integers(1, 5)),
)
def test_greedy_with_a_cap_and_truncation_packs_the_rows_levanter_packs(lengths, cap):
    """Levanter's packing of a text cache (``pack: N``: ``max_segments_per_example=N``, long
    documents cut to their first seq_len tokens, store order): the same documents in every row,
    and the rows' tokens laid out as Levanter lays them (documents side by side, zeros after)."""
    from tests.packing_oracle import levanter_pack_ranges

    packed = PackedSequences(store_of(lengths), 12, "greedy", "truncate", max_segments=cap)
    want = levanter_pack_ranges(lengths, 12, cap)
    assert [packed.plan.pieces(q)[0].tolist() for q in range(len(packed))] == want
    docs = named_documents(lengths)
    rows = packed.read(np.arange(len(packed)))["input_ids"]
    for row, pack in zip(rows, want, strict=True):
        tokens = np.concatenate([docs[d]["input_ids"] for d in pack])[:12]
        np.testing.assert_array_equal(row, np.pad(tokens, (0, 12 - len(tokens))))


def test_a_seed_reorders_documents_the_same_way_every_time():
    lengths = list(range(1, 30))
    a, b = (plan_packing(lengths, 32, "greedy", seed=5) for _ in range(2))
    assert plan_bins(a) == plan_bins(b) != plan_bins(plan_packing(lengths, 32, "greedy"))


# ------------------------------------------------------------------------- packing in windows
@settings(max_examples=60, deadline=None, derandomize=True)  # the same cases every run
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    seq_len=st.integers(1, 16),
    strategy=st.sampled_from(PACKING_STRATEGIES),
    long_documents=st.sampled_from(LONG_DOCUMENTS),
    seed=st.one_of(st.none(), st.integers(0, 3)),
    window=st.integers(1, 9),
    cap=st.one_of(st.none(), st.integers(1, 3)),
)
def test_packing_in_windows_packs_each_window_alone_as_the_naive_packer_does(
    lengths, seq_len, strategy, long_documents, seed, window, cap
):
    want = naive_pack(lengths, seq_len, strategy, long_documents, seed, window, cap)
    options = dict(seed=seed, window=window, pad_id=-1, max_segments=cap)
    store = store_of(lengths)
    if not want:
        with pytest.raises(ValueError, match="nothing to pack"):
            PackedSequences(store, seq_len, strategy, long_documents, **options)
        return
    source = PackedSequences(store, seq_len, strategy, long_documents, **options)
    assert len(source) == len(want)
    dropped = [d for d, n in enumerate(lengths) if n > seq_len and long_documents == "drop"]
    assert int(source.plan.dropped.sum()) == len(dropped)
    assert int(source.plan.empty.sum()) == lengths.count(0)
    cut = seq_len if long_documents == "truncate" else max(lengths)
    kept = sum(min(n, cut) for d, n in enumerate(lengths) if d not in dropped)
    assert source.plan.efficiency == kept / (len(want) * seq_len)
    ids = np.arange(len(source))[::-1]  # every window, out of order
    rows = source.read(ids)
    check_packed({k: v[::-1] for k, v in rows.items()}, lengths, seq_len, dropped,
                 truncate=long_documents == "truncate")  # fmt: skip
    table = packed_table(named_documents(lengths), want, seq_len, -1)
    for key, value in table.items():
        np.testing.assert_array_equal(rows[key], value[ids], err_msg=key)
    cols = slice(seq_len // 3, seq_len - 1)
    got = source.read_window(ids, {"input_ids": cols, "positions": cols})
    for key in ("input_ids", "positions"):
        np.testing.assert_array_equal(got[key], table[key][ids][:, cols], err_msg=key)


def test_a_window_plan_numbers_documents_in_the_corpus():
    from psdp._plan.packing import plan_window

    plan = plan_window([0, 9, 3, 5], 4, "greedy", "drop", None, window=4, index=2)
    assert plan_bins(plan) == [[(10, 0, 3)]]  # documents 9 and 11 are longer than 4: dropped
    assert plan.dropped.tolist() == [9, 11] and plan.empty.tolist() == [8]
    assert plan_bins(plan_window([2, 1], 4, "greedy", "split", 3, window=2, index=5)) == [
        [(10 + int(d), 0, [2, 1][d]) for d in np.random.default_rng([3, 5]).permutation(2)]
    ]


def test_a_window_over_the_whole_corpus_packs_as_the_whole_corpus_does():
    whole = PackedSequences(store_of(LENGTHS), 16)
    one = PackedSequences(store_of(LENGTHS), 16, window=len(LENGTHS))
    assert len(whole) == len(one) and whole.plan.num_tokens == one.plan.num_tokens
    ids = np.arange(len(whole))
    for key, value in whole.read(ids).items():
        np.testing.assert_array_equal(one.read(ids)[key], value, err_msg=key)
    assert one.describe().startswith("PackedSequences(best_fit packing in windows of 60 documents")


def test_a_pack_index_file_is_built_once_then_start_up_reads_only_two_windows(tmp_path):
    """With an index file, start-up reads the offsets of the first and last windows (to check
    them against the index), not the corpus's; a read plans only the windows it touches."""
    path = tmp_path / "pack" / "index.npz"
    store = store_of(LENGTHS, kind=CountingStore)  # 60 documents: windows of 8, the last of 4
    built = PackedSequences(store, 16, "first_fit", seed=4, window=8, index=path)
    assert path.exists() and store.offset_reads == [(0, 61)]  # one chunk of whole windows
    store.offset_reads.clear()
    loaded = PackedSequences(store, 16, "first_fit", seed=4, window=8, index=path)
    assert store.offset_reads == [(0, 9), (56, 61)]
    np.testing.assert_array_equal(loaded.plan.starts, built.plan.starts)
    want = naive_pack(LENGTHS, 16, "first_fit", seed=4, window=8)
    table = packed_table(named_documents(LENGTHS), want, 16)
    last = loaded.plan.starts[-2]  # the last window's first sequence: its plan is cached
    store.offset_reads.clear()
    ids = np.array([int(loaded.plan.starts[3]), last, 0, int(loaded.plan.starts[3]) + 1])
    for key, value in loaded.read(ids).items():
        np.testing.assert_array_equal(value, table[key][ids], err_msg=key)
    assert store.offset_reads == [(24, 33)]  # window 3 only


def test_a_stale_pack_index_is_rebuilt_or_refused_never_used(tmp_path):
    path = tmp_path / "index.npz"
    PackedSequences(store_of(LENGTHS), 16, window=8, index=path)
    # other options: another key, so the index is built again and replaces the file
    source = PackedSequences(store_of(LENGTHS), 12, "greedy", window=8, index=path)
    want = naive_pack(LENGTHS, 12, "greedy", window=8)
    np.testing.assert_array_equal(
        source.read(np.arange(len(source)))["input_ids"],
        packed_table(named_documents(LENGTHS), want, 12)["input_ids"],
    )
    # the same size and options, but a token moved from window 2 to window 3: found when
    # either is read, never served
    changed = list(LENGTHS)
    changed[23], changed[24] = changed[23] - 1, changed[24] + 1
    stale = PackedSequences(store_of(changed), 12, "greedy", window=8, index=path)
    for w in (2, 3):
        with pytest.raises(
            ValueError, match=rf"window {w} \(documents \[{8 * w}, {8 * w + 8}\)\) packs"
        ):
            stale.read(stale.plan.starts[w : w + 1])
    # a file that is not a pack index is never overwritten
    other = tmp_path / "notes.npz"
    for text in (b"not an index", path.read_bytes()[:100]):  # another file, a cut index
        other.write_bytes(text)
        with pytest.raises(ValueError, match="is not a psdp pack index"):
            PackedSequences(store_of(LENGTHS), 16, window=8, index=other)
        assert other.read_bytes() == text


def test_a_pack_index_of_another_format_version_is_refused_and_left_as_it_was(tmp_path):
    """The same key and arrays under another version (a layout psdp does not read) is never
    loaded, nor overwritten."""
    import json

    from psdp.sources.views.pack_index import VERSION

    path = tmp_path / "index.npz"
    PackedSequences(store_of(LENGTHS), 16, window=8, index=path)
    with np.load(path) as saved:
        arrays = {name: saved[name] for name in saved.files}
    header = json.loads(str(arrays["header"]))
    header["version"] = VERSION + 1
    arrays["header"] = np.array(json.dumps(header))
    with open(path, "wb") as file:
        np.savez(file, **arrays)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=rf"is not a psdp pack index of version {VERSION} "):
        PackedSequences(store_of(LENGTHS), 16, window=8, index=path)
    assert path.read_bytes() == before


def test_the_pack_index_built_in_worker_processes_is_the_one_built_here(monkeypatch):
    """Built in 2 processes, or here reading the offsets 3 windows at a time: one index."""
    from psdp._plan.pack_windows import PackKey
    from psdp.sources.views import pack_index

    lengths = np.random.default_rng(0).integers(0, 40, 500)
    store = store_of(lengths, kind=CountingStore)
    key = PackKey(32, "best_fit", "drop", 7, 16, store.num_documents, store.num_tokens)
    build_pack_index = pack_index.build_pack_index
    pooled = build_pack_index(store, key, workers=2, progress=False)
    monkeypatch.setattr(pack_index, "CHUNK_OFFSETS", 3 * 16 + 5)
    store.offset_reads.clear()
    here = build_pack_index(store, key, workers=1, progress=False)
    assert store.offset_reads == [(a, min(a + 48, 500) + 1) for a in range(0, 500, 48)]
    for name in ("starts", "tokens", "dropped", "empty"):
        np.testing.assert_array_equal(getattr(pooled, name), getattr(here, name), err_msg=name)
    assert len(here) == len(naive_pack(lengths, 32, "best_fit", "drop", 7, 16))


# ------------------------------------------------------------------------------------ the reads
def test_one_store_read_per_read_and_a_window_reads_only_its_tokens():
    lengths = [5, 9, 3, 7, 2, 6]
    store = store_of(lengths, masks=True, kind=CountingStore)
    source = PackedSequences(store, 8, "best_fit", pad_id=-1)
    table = packed_table(
        named_documents(lengths, masks=True), naive_pack(lengths, 8, "best_fit"), 8, -1
    )
    ids = np.array([2, 0, 2, 1])
    store.calls.clear()
    rows = source.read(ids)
    assert len(store.calls) == 1 and set(rows) == set(table)
    for key in table:
        np.testing.assert_array_equal(rows[key], table[key][ids], err_msg=key)
    for columns in (slice(2, 6), slice(0, 8), slice(5, 5), np.array([7, 0, 1, 2])):
        store.calls.clear()
        got = source.read_window(ids, {"input_ids": columns, "positions": columns})
        assert len(store.calls) == 1
        for key in ("input_ids", "positions"):
            np.testing.assert_array_equal(got[key], table[key][ids][:, columns], err_msg=key)
        starts, stops, leaves = store.calls[0]
        assert leaves == ["input_ids"]
        if isinstance(columns, slice):  # only the tokens inside the window are read
            assert (stops - starts).sum() == (table["segment_ids"][ids][:, columns] > 0).sum()
    mixed = source.read_window(ids, {"segment_ids": (slice(1, 3),), "loss_mask": ()})
    np.testing.assert_array_equal(mixed["segment_ids"], table["segment_ids"][ids][:, 1:3])
    np.testing.assert_array_equal(mixed["loss_mask"], table["loss_mask"][ids])


def test_a_memmap_store_is_read_without_a_memmap_object_per_piece(tmp_path, monkeypatch):
    """Issue 29: each of a batch's ~430 pieces made an `np.memmap` object (2-3x slower than a
    plain view of the same memory); a read now makes none, whatever its pieces."""
    lengths = [5, 9, 3, 7, 2, 6, 11, 4] * 4
    docs = named_documents(lengths, masks=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = {}
    for key in docs[0]:
        np.save(tmp_path / f"{key}.npy", np.concatenate([d[key] for d in docs]))
        flat[key] = np.load(tmp_path / f"{key}.npy", mmap_mode="r")
    source = PackedSequences(DocumentStore.from_arrays(offsets, flat), 8, "best_fit")
    made = []
    finalize = np.memmap.__array_finalize__
    monkeypatch.setattr(
        np.memmap, "__array_finalize__", lambda self, obj: made.append(1) or finalize(self, obj)
    )
    ids = np.arange(len(source))[::-1]
    rows = source.read(ids)
    window = source.read_window(ids, {"input_ids": slice(2, 7)})
    assert made == []
    table = packed_table(docs, naive_pack(lengths, 8, "best_fit"), 8)
    for key in table:
        np.testing.assert_array_equal(rows[key], table[key][ids], err_msg=key)
    np.testing.assert_array_equal(window["input_ids"], table["input_ids"][ids][:, 2:7])


def test_a_read_builds_no_description_of_its_source(monkeypatch):
    """Issue 29 (packed mixture at 0.67x of the tight loop): every read of a packed source, and
    of a mixture over it, built the source's description for a possible error message, summing
    every piece of the plan twice (~0.3 ms of a 1.7 ms step at 200,000 documents). A read that
    succeeds now describes nothing."""
    from psdp import Mixture

    lengths = [5, 9, 3, 7, 2, 6, 11, 4] * 4
    whole = PackedSequences(store_of(lengths), 8)
    windowed = PackedSequences(store_of(lengths), 8, window=8)
    mixture = Mixture({"a": whole, "b": windowed}, weights={"a": 3, "b": 1}, block_size=4)
    described = []
    for kind in (PackedSequences, Mixture):
        describe = kind.describe
        monkeypatch.setattr(
            kind, "describe", lambda self, d=describe: described.append(1) or d(self)
        )
    ids = np.array([3, 0, 2])
    whole.read(ids), windowed.read(ids), mixture.read(np.arange(8))
    whole.read_window(ids, {"input_ids": slice(1, 5)})
    assert described == []
    with pytest.raises(IndexError, match=r"PackedSequences\(best_fit packing of"):
        whole.read(np.array([len(whole)]))


@pytest.mark.parametrize(
    "leaves",
    [("input_ids",), ("segment_ids", "input_ids"), ("positions",), ("loss_mask", "segment_ids")],
)
def test_leaves_delivers_only_the_leaves_named_and_reads_only_the_stored_ones(leaves):
    lengths = [5, 9, 3, 7, 2, 6]
    store = store_of(lengths, masks=True, kind=CountingStore)
    source = PackedSequences(store, 8, "best_fit", pad_id=-1, leaves=leaves)
    table = packed_table(
        named_documents(lengths, masks=True), naive_pack(lengths, 8, "best_fit"), 8, -1
    )
    ids = np.array([2, 0, 2, 1])
    store.calls.clear()
    rows = source.read(ids)
    assert list(rows) == sorted(leaves)
    for key in leaves:
        np.testing.assert_array_equal(rows[key], table[key][ids], err_msg=key)
    stored = sorted({"input_ids", "loss_mask"} & set(leaves))
    assert [sorted(c[2]) for c in store.calls] == ([stored] if stored else [])
    window = source.read_window(ids, {key: slice(1, 5) for key in leaves})
    for key in leaves:
        np.testing.assert_array_equal(window[key], table[key][ids][:, 1:5], err_msg=key)
    left_out = next(k for k in table if k not in leaves)
    with pytest.raises(KeyError, match=f"leaf '{left_out}' is not delivered"):
        source.read_window(ids, {left_out: slice(0, 2)})


# --------------------------------------------------------------------- every device shard exact
LENGTHS = [5, 17, 3, 9, 30, 1, 12, 8, 8, 4, 21, 2, 6, 15, 11, 7, 3, 19, 5, 10] * 3


@pytest.mark.parametrize("strategy", PACKING_STRATEGIES)
def test_every_device_shard_is_exact_for_batch_full_and_context(strategy, mesh_2d, mesh_context):
    seq_len = 16
    source = PackedSequences(store_of(LENGTHS, masks=True), seq_len, strategy, pad_id=7)
    table = packed_table(
        named_documents(LENGTHS, masks=True), naive_pack(LENGTHS, seq_len, strategy), seq_len, 7
    )
    cases = [
        (mesh_2d, "batch", None),
        (mesh_2d, "full", None),
        (mesh_context, {k: P("data", "context") for k in table}, None),
        (mesh_context, {k: P("data", "context") for k in table}, 2),
    ]
    for mesh, spec, halo in cases:
        settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, halo=halo or 0,
                        pad_value=5, seed=3)  # fmt: skip
        with DataLoader(source, **settings) as loader:
            for step in range(3):  # 3 steps of 8 cross the epoch end (len(source) < 24)
                want = expected_batch(table, step, **settings)
                assert_batch_exact(loader.batch_at(step), want)


@pytest.mark.timeout(300)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
def test_every_device_shard_is_exact_on_the_noncontiguous_pod():
    """One pod run: batch, full, the sequence sharded with a halo, and a schedule with padding,
    each over a packed source, on 4 hosts that hold non-adjacent data rows."""
    from tests import pod_targets_packing as targets
    from tests.batch_checks import run_on_noncontiguous_pod

    results = run_on_noncontiguous_pod(targets.packed_exact, steps=3, timeout_s=240)
    # each host: 4 cases x 3 steps x 2 local devices x (4 leaves + the mask: 38 sequences leave
    # a padded batch at each epoch's end, so every batch has one)
    assert [r["checked"] for r in results] == [4 * 3 * 2 * 5] * 4
    assert all(r["plans"] == results[0]["plans"] for r in results)  # every host, one plan


def test_every_device_shard_is_exact_packed_in_windows(mesh_2d, mesh_context):
    """Windows of 7 documents, a seed: batch, and the sequence over ``context`` with a halo."""
    source = PackedSequences(store_of(LENGTHS, masks=True), 16, seed=1, window=7, pad_id=7)
    want = naive_pack(LENGTHS, 16, "best_fit", seed=1, window=7)
    table = packed_table(named_documents(LENGTHS, masks=True), want, 16, 7)
    context = {k: P("data", "context") for k in table}
    for mesh, spec, halo in ((mesh_2d, "batch", 0), (mesh_context, context, 2)):
        settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, halo=halo, seed=3)
        with DataLoader(source, **settings) as loader:
            for step in range(6):  # past the epoch's end; shuffled in the source's blocks
                want = expected_batch(table, step, io_block=source.io_block, **settings)
                assert_batch_exact(loader.batch_at(step), want)


def test_a_shuffled_loader_plans_each_window_about_once_an_epoch(mesh_2d, monkeypatch):
    """Issue 29: a full shuffle over packing in windows planned a window for almost every row
    (225 ms a step at 10^9 documents). A loader shuffling `PackedSequences(window=W)` now
    shuffles blocks of about a window's sequences (`PackedSequences.io_block`) unless told
    otherwise, so over an epoch each window is planned once, or twice where a block straddles
    two windows (counted, not timed); the rows are the oracle's block shuffle, and the state
    records the block."""
    from psdp.sources.views import packed

    lengths = LENGTHS * 20  # 150 windows of 8 documents: more than packed.WINDOW_CACHE
    source = PackedSequences(store_of(lengths), 16, window=8)
    windows = len(source.plan.tokens)
    assert windows > packed.WINDOW_CACHE
    assert source.io_block == len(source) // windows
    table = packed_table(
        named_documents(lengths), naive_pack(lengths, 16, "best_fit", window=8), 16
    )
    planned = []
    plan_of_window = packed.plan_of_window
    monkeypatch.setattr(
        packed, "plan_of_window", lambda *a: planned.append(a[2]) or plan_of_window(*a)
    )
    settings = dict(mesh=mesh_2d, global_batch_size=8, seed=3)
    with DataLoader(source, **settings) as loader:
        steps = loader.order.steps_per_epoch
        for step in range(steps):
            want = expected_batch(table, step, io_block=source.io_block, **settings)
            assert_batch_exact(loader.batch_at(step), want)
        assert loader.state()["io_block"] == source.io_block
    assert sorted(set(planned)) == list(range(windows))
    assert len(planned) <= 2 * windows, (len(planned), windows)


def test_the_efficiency_script_counts_sequences_and_tokens(capsys):
    """scripts/measure/packing_efficiency.py, small: `none` is one padded sequence per document (a long
    one over several), every packing holds all the tokens in its sequences, and best fit in
    windows packs as many sequences as the naive packer of each window."""
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "measure" / "packing_efficiency.py"
    main = runpy.run_path(str(script), run_name="packing_efficiency")["main"]
    argv = ["--documents", "500", "--seq-len", "1024", "--windows", "64,200", "--json"]
    assert main([*argv, "--index-workers", "1"]) == 0
    *rows, build = json.loads(capsys.readouterr().out)
    strategies = [("none", None), ("greedy", None), ("first_fit", None), ("best_fit", None)]
    assert [(r["distribution"], r["strategy"], r["window"]) for r in rows] == [
        (d, *s)
        for d in ("log-normal", "chat")
        for s in [*strategies, ("best_fit", 64), ("best_fit", 200)]
    ]
    assert build["workers"] == 1 and build["seconds"] > 0
    for r in rows:
        tokens = r["mean_length"] * 500
        assert r["efficiency"] == pytest.approx(tokens / (r["sequences"] * 1024))
    lengths = runpy.run_path(str(script))["log_normal"](np.random.default_rng(0), 500)
    assert rows[0]["sequences"] == sum(-(-int(n) // 1024) for n in lengths)
    windowed = naive_pack(lengths.astype(int).tolist(), 1024, "best_fit", window=200)
    assert rows[5]["sequences"] == len(windowed)
    assert rows[5]["vs_best_fit"] == pytest.approx(rows[5]["efficiency"] / rows[3]["efficiency"])
    # the read timing checks psdp's rows against the tight loop's before it times them
    assert main(["--documents", "3000", "--windows", "", "--read-speed", "--json"]) == 0
    speed = json.loads(capsys.readouterr().out)[-1]
    assert set(speed) == {"psdp_ms", "tight_ms", "ratio"}


# ------------------------------------------------------------------ the scale simulation, 10^9
class FormulaStore(DocumentStore):
    """A `FormulaCorpus` as a store that has only what `PackedSequences` reads through
    (`num_documents`, `num_tokens`, `offsets_range`, `read_ranges`): no offsets array exists.
    Records every `offsets_range` call. A test double that skips `DocumentStore`'s own checks:
    `from_arrays` over lazy arrays (`FlatArray`, tests/scale_corpus.py) with the formula's
    `DocumentIndex` would test those too, and is yet to replace it."""

    def __init__(self, corpus: FormulaCorpus):  # no offsets to check: the formula's hold
        self.corpus, self.name = corpus, "formula"
        self.leaves = {"input_ids": np.dtype(np.int32), "loss_mask": np.dtype(np.uint8)}
        self.offset_reads: list[tuple[int, int]] = []

    num_documents = property(lambda self: self.corpus.documents)
    num_tokens = property(lambda self: self.corpus.num_tokens)
    reads_storage = property(lambda self: False)

    def offsets_range(self, start, stop):
        self.offset_reads.append((start, stop))
        return self.corpus.offsets(np.arange(start, stop))

    def read_ranges(self, starts, stops, leaves=None):
        starts, stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
        count = stops - starts
        at = np.repeat(starts - (np.cumsum(count) - count), count) + np.arange(count.sum())
        formula = {"input_ids": self.corpus.tokens, "loss_mask": self.corpus.loss_mask}
        return {name: formula[name](at) for name in (leaves or self.leaves)}


SCALE = dict(seq_len=1024, window=4096, batch=64)


def scale_rows(corpus: FormulaCorpus, bins_full, bins_last, ids) -> dict[str, np.ndarray]:
    """The rows ``ids`` must hold, from the formula and the oracle's packing of a full window
    (``bins_full``) and of the last one (``bins_last``): every window but the last packs the
    same lengths, so window ``w`` holds sequences ``[w * len(bins_full), ...)``."""
    seq_len, window = SCALE["seq_len"], SCALE["window"]
    full_windows = corpus.documents // window
    rows = {
        "input_ids": np.full((len(ids), seq_len), -1, np.int32),
        "loss_mask": np.zeros((len(ids), seq_len), np.uint8),
        "positions": np.zeros((len(ids), seq_len), np.int32),
        "segment_ids": np.zeros((len(ids), seq_len), np.int32),
    }
    for r, q in enumerate(ids.tolist()):
        w, local = divmod(q, len(bins_full))
        bins = bins_full
        if w >= full_windows:
            w, local, bins = full_windows, q - full_windows * len(bins_full), bins_last
        column = 0
        for segment, (d, start, n) in enumerate(bins[local], 1):
            doc = w * window + d
            assert start + n <= corpus.lengths(doc, doc + 1)[0]  # a piece within its document
            at = corpus.offsets(np.array([doc]))[0] + start + np.arange(n)
            cols = slice(column, column + n)
            rows["input_ids"][r, cols] = corpus.tokens(at)
            rows["loss_mask"][r, cols] = corpus.loss_mask(at)
            rows["positions"][r, cols] = np.arange(n)
            rows["segment_ids"][r, cols] = segment
            column += n
    return rows


def formula_pack_index(directory: str, documents: int):
    """A `FormulaCorpus` of ``documents`` (windows of `SCALE`'s) and its pack index saved in
    ``directory``, its counts the oracle's: ``(corpus, index path, the oracle's bins of a whole
    window, of the last window)``."""
    from psdp._plan.pack_windows import PackIndex, PackKey
    from psdp.sources.views.pack_index import save_pack_index

    seq_len, window = SCALE["seq_len"], SCALE["window"]
    corpus = FormulaCorpus(documents, period=window)
    bins_full = naive_pack(corpus.period_lengths.tolist(), seq_len, "best_fit")
    last_n = documents - documents // window * window
    bins_last = naive_pack(corpus.period_lengths[:last_n].tolist(), seq_len, "best_fit")
    windows = -(-documents // window)
    counts = np.tile([len(bins_full), int(corpus.period_offsets[-1]), 0, 0], (windows, 1))
    if last_n:
        counts[-1] = (len(bins_last), int(corpus.period_offsets[last_n]), 0, 0)
    key = PackKey(seq_len, "best_fit", "split", None, window, documents, corpus.num_tokens)
    path = f"{directory}/pack-{documents}.npz"
    save_pack_index(PackIndex.from_counts(key, counts), path)
    return corpus, path, bins_full, bins_last


def scale_simulation(directory: str, documents: int = 10**9) -> dict:
    """Opens `PackedSequences` in windows over a formula corpus of ``documents`` with a pack
    index that exists (its counts the oracle's), reads the first batch, batches past 2**32 and
    2**40 tokens, across the corpus and at its end, and checks every row against the formula
    and the oracle. Returns what it measured. Run in a process of its own (the memory)."""
    import resource
    import time

    seq_len, window, batch = SCALE["seq_len"], SCALE["window"], SCALE["batch"]
    corpus, path, bins_full, bins_last = formula_pack_index(directory, documents)
    windows = -(-documents // window)
    store = FormulaStore(corpus)

    page = os.sysconf("SC_PAGE_SIZE")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on: not imports'
    rss_before = int(Path("/proc/self/statm").read_text().split()[1]) * page
    start = time.perf_counter()
    packed = PackedSequences(store, seq_len, window=window, index=path, pad_id=-1)
    startup_reads = list(store.offset_reads)
    first = packed.read(np.arange(batch))
    open_s = time.perf_counter() - start

    def tokens_before(q: int) -> int:  # the flat token where sequence q's window starts
        return int(corpus.offsets(np.array([packed.plan.locate(np.array([q]))[0][0] * window]))[0])

    far = {"first": np.arange(batch), "next (its window planned)": batch + np.arange(batch)}
    for power in (32, 40):  # the first whole window past 2**power tokens
        w = 2**power // int(corpus.period_offsets[-1]) + 1
        if w < windows - 1:
            far[f"past 2**{power}"] = w * len(bins_full) + np.arange(batch)
    far["the end"] = len(packed) - batch + np.arange(batch)
    far["across the corpus"] = np.random.default_rng(5).integers(0, len(packed), batch)
    step_s = {}
    for name, ids in far.items():
        start = time.perf_counter()
        got = first if name == "first" else packed.read(ids)
        if name != "first":  # timed with the opening
            step_s[name] = time.perf_counter() - start
        want = scale_rows(corpus, bins_full, bins_last, ids)
        assert set(got) == set(want)
        for leaf, value in want.items():
            np.testing.assert_array_equal(got[leaf], value, err_msg=f"{name}: {leaf}")
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    peak = int(status.split()[0]) * 1024  # kB
    return {
        "documents": documents,
        "tokens": corpus.num_tokens,
        "sequences": len(packed),
        "past_2_40": "past 2**40" in far and tokens_before(int(far["past 2**40"][0])) > 2**40,
        "startup_reads": startup_reads,
        "index_bytes": os.path.getsize(path),
        "open_and_first_batch_s": open_s,
        "read_s": step_s,
        "rss_added_bytes": peak - rss_before,
        "rss_before_bytes": rss_before,
        "peak_before_bytes": peak_before,
    }


def test_a_billion_documents_packed_in_windows_open_in_two_window_reads_and_read_exactly(tmp_path):
    """The scale simulation: 10^9 documents, 1.2 * 10^12 tokens, never written. With a pack
    index that exists (built once, at prepare time: its cost is measured at 10^6-10^7 documents
    by scripts/measure/packing_efficiency.py), start-up reads the offsets of two windows, whatever the
    corpus; batches anywhere in it are exact; memory added stays far below 1 GiB."""
    import json
    import subprocess
    import sys

    child = (
        "import json, sys; from tests.test_packing import scale_simulation; "
        "print(json.dumps(scale_simulation(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    last = 10**9 // 4096 * 4096
    assert got["tokens"] > 2**40 and got["past_2_40"]
    assert got["startup_reads"] == [[0, 4097], [last, 10**9 + 1]]
    assert got["index_bytes"] < 4 * 8 * (10**9 // 4096 + 2) + 4096  # O(D / W): 4 counts a window
    assert got["rss_added_bytes"] <= 2**30, got


@pytest.mark.parametrize(
    "box", [slice(-2, 4), slice(2, 9), np.array([-1, 0]), np.array([7, 8])], ids=str
)
def test_columns_outside_a_packed_row_are_refused(box):
    """A packed row has no neighbours: a window before column 0 or past seq_len is an error (a
    slice from -2 read nothing, and index -1 read column 7's value into column 0's place)."""
    store = DocumentStore.from_arrays(
        np.cumsum([0, 3, 1, 7, 2, 5]), {"input_ids": np.arange(1, 19)}
    )
    packed = PackedSequences(store, 8)
    with pytest.raises(ValueError, match=r"columns of a packed sequence lie in \[0, seq_len=8\)"):
        packed.read_window(np.array([0]), {"input_ids": box})
    got = packed.read_window(np.array([0]), {"input_ids": np.array([0, 1])})["input_ids"]
    assert got.tolist() == packed.read(np.array([0]))["input_ids"][:, :2].tolist()
