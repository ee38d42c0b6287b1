"""TokenSequences: every device shard of every leaf against a numpy oracle that concatenates the
documents and splits them (tests/token_oracle.py), for the batch, full and context strategies
with halos; a context-sharded host reads only its token ranges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from psdp import DataLoader
from psdp.sources import DocumentStore, TokenSequences
from tests import oracle, token_oracle
from tests.batch_checks import assert_batch_exact, expected_batch, physical_ids
from tests.fake_hosts import fake_pod, host_batch
from tests.meshes import mesh_of
from tests.pod_targets_tokens import CountingStore

S = 8  # seq_len
DOCS = token_oracle.documents(seed=3, count=30, mean=9)


def _check_steps(loader, rows, steps=(0, 1, 2), **settings):
    """Each step of ``loader``, made with ``settings``, exact against ``rows``."""
    for step in steps:
        want = expected_batch(rows, step, **settings)
        assert assert_batch_exact(loader.batch_at(step), want) > 0


@pytest.mark.parametrize("eos_id", [None, 2])
@pytest.mark.parametrize("targets", [False, True])
@pytest.mark.parametrize("strategy", ["batch", "full"])
def test_every_shard_exact_batch_and_full(mesh_2d, strategy, targets, eos_id):
    source = TokenSequences(DocumentStore.from_documents(DOCS), S, targets=targets, eos_id=eos_id)
    rows = token_oracle.rows(DOCS, S, targets=targets, eos_id=eos_id)
    assert len(source) == len(rows["input_ids"])
    settings = dict(mesh=mesh_2d, global_batch_size=8, batch_spec=strategy, seed=5)
    _check_steps(DataLoader(source, **settings), rows, **settings)


@pytest.mark.parametrize("halo", [0, 2])
def test_every_shard_exact_context_sharded_with_a_pad_halo(mesh_context, halo):
    docs = [{"input_ids": d, "loss_mask": (d % 3 == 0).astype(np.uint8)} for d in DOCS]
    source = TokenSequences(DocumentStore.from_documents(docs), S, eos_id=1)
    rows = token_oracle.rows(docs, S, eos_id=1)
    spec = {k: P("data", "context") for k in rows}
    halos = {k: halo for k in rows} if halo else None
    settings = dict(mesh=mesh_context, global_batch_size=8, batch_spec=spec, halo=halos or 0,
                    seed=1, pad_value=7)  # fmt: skip
    _check_steps(DataLoader(source, **settings), rows, **settings)


@pytest.mark.parametrize(("targets", "halo"), [(False, 2), (True, 1), (False, 4)])
def test_a_continue_halo_holds_the_neighbouring_tokens(mesh_context, targets, halo):
    """Halo columns are the stream's tokens before and after each shard, the previous and next
    rows' included; ``pad_id`` only before token 0 and after the stream's end."""
    docs = [{"input_ids": d, "loss_mask": (d % 2).astype(np.uint8)} for d in DOCS]
    seq = 8 if not targets else 9  # an even width for 2 context shards
    source = TokenSequences(
        DocumentStore.from_documents(docs), seq, targets=targets, eos_id=1, pad_id=9
    )
    want_rows = token_oracle.continued_rows(
        docs, seq, shards=2, halo=halo, pad_id=9, targets=targets, eos_id=1
    )
    spec = {k: P("data", "context") for k in want_rows}
    halos = {k: {1: (halo, "continue")} for k in want_rows}
    for shuffle in (False, True):  # unshuffled: row 0 (before token 0) and the last row
        settings = dict(mesh=mesh_context, global_batch_size=8, batch_spec=spec, seed=4,
                        shuffle=shuffle, pad_value=7)  # fmt: skip
        loader = DataLoader(source, halo=halos, **settings)
        steps = range(-(-len(source) // 8)) if not shuffle else (0, 1)
        for step in steps:
            want = expected_batch(want_rows, step, **settings)  # rows already in delivered layout
            assert assert_batch_exact(loader.batch_at(step), want) > 0


def test_a_continue_halo_needs_a_source_that_continues_rows(mesh_context):
    rows = np.arange(64, dtype=np.int32).reshape(8, 8)
    with pytest.raises(ValueError, match="does not continue its rows"):
        DataLoader(
            {"input_ids": rows}, mesh=mesh_context, global_batch_size=8,
            batch_spec=P("data", "context"), halo={"input_ids": {1: (1, "continue")}},
        )  # fmt: skip


@pytest.mark.parametrize("halo", [0, 2])
def test_a_context_sharded_host_reads_only_its_token_ranges(mesh_context, halo):
    """Host (data pair, context shard c) reads, per row r it holds, exactly the tokens
    [r*S + c*w - halo, r*S + (c+1)*w + halo) of the store (clipped to it), once, and no token
    for segment_ids or positions."""
    layout = np.array([[0, 1], [0, 1], [2, 3], [2, 3]])  # host = 2 * data pair + context shard
    docs = [{"input_ids": d, "loss_mask": (d % 2).astype(np.uint8)} for d in DOCS]
    base = DocumentStore.from_documents(docs)
    w = S // 2
    with fake_pod(mesh_context, layout) as process_of:
        for host in range(4):
            store = CountingStore.from_documents(docs)
            settings = dict(
                mesh=mesh_context, global_batch_size=8, seed=2,
                batch_spec={k: P("data", "context") for k in ("input_ids", "loss_mask", "segment_ids", "positions")},
            )  # fmt: skip
            loader = DataLoader(
                TokenSequences(store, S), process_index=host, **settings,
                halo={k: {1: (halo, "continue")} for k in ("input_ids", "loss_mask")} if halo else 0,
            )  # fmt: skip
            ids = physical_ids(token_oracle.rows(docs, S), 1, **settings)
            store.ranges.clear()
            host_batch(loader, 1, process_of)
            pair, c = divmod(host, 2)
            rows = ids[pair * 4 : (pair + 1) * 4]  # 8 rows over data=4: 2 per shard, 2 shards
            want = sorted(
                (name, max(0, r * S + c * w - halo), min(base.num_tokens, r * S + (c + 1) * w + halo))
                for r in rows for name in ("input_ids", "loss_mask")
            )  # fmt: skip
            assert sorted(store.ranges) == want, host


@pytest.mark.timeout(300)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
def test_every_shard_exact_and_each_hosts_token_ranges_on_the_noncontiguous_pod():
    """One pod run (tests/pod_targets_tokens.py): BATCH, FULL, EOS with targets, and
    P("data", "context") without a halo, with a pad and with a continue halo, each host's
    two local shards of every leaf exact at two steps, and its store reading exactly the ranges
    of its rows and columns."""
    from tests import pod_targets_tokens as targets
    from tests.batch_checks import run_on_noncontiguous_pod

    results = run_on_noncontiguous_pod(
        targets.token_shards_exact, axis_names=["data", "context"], timeout_s=240
    )
    # host h holds context column h % 2 of data rows {0, 2} (hosts 0, 1) or {1, 3} (hosts 2, 3)
    assert [r["positions"] for r in results] == [
        [[0, 0], [2, 0]], [[0, 1], [2, 1]], [[1, 0], [3, 0]], [[1, 1], [3, 1]]
    ]  # fmt: skip
    for r in results:
        assert set(r["shards"].values()) == {5 * 2 * 2}, r  # 4 leaves + mask, 2 devices, 2 steps
        # 2 stored leaves x 2 steps x (2 data rows x 2 rows each; FULL: 1 row per device);
        # eos+targets is not counted (EOS tokens are not stored)
        assert r["ranges"] == {
            "batch": 16, "full": 8, "context": 16, "context+pad halo": 16,
            "context+continue halo": 16,
        }  # fmt: skip


def _sample_keys(batch) -> list[tuple]:
    """The real rows of a delivered batch (the mask), each named by its tokens and its first
    token's document and position (which fix its place in the stream)."""
    ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["mask"])
    seg, pos = np.asarray(batch["segment_ids"]), np.asarray(batch["positions"])
    return sorted(
        (tuple(ids[i].tolist()), int(seg[i, 0]), int(pos[i, 0])) for i in np.flatnonzero(mask)
    )


def test_a_schedule_saved_on_one_mesh_resumes_on_another_with_the_same_samples(
    mesh_1d, mesh_context
):
    """A batch-size ramp with a step skip, saved at step 4 on data=8 (BATCH) and restored on
    data=4 x context=2 (P("data", "context")): every shard exact against the oracle on both,
    and each step holds the samples of the uninterrupted run's step."""
    store = DocumentStore.from_documents(DOCS)
    source = TokenSequences(store, S, eos_id=2)
    rows = token_oracle.rows(DOCS, S, eos_id=2)
    order = dict(global_batch_size=[(0, 8), (3, 16)], skip_steps=[(5, 6)], seed=9)
    steps, save_at = 8, 4
    with DataLoader(source, mesh=mesh_1d, **order) as loader:
        whole = [_sample_keys(loader.batch_at(step)) for step in range(steps)]
        it = loader.iter_from(0)
        for step in range(save_at):
            want = expected_batch(rows, step, mesh=mesh_1d, **order)
            assert assert_batch_exact(next(it), want) > 0
        state = it.state()
        it.close()
    spec = {k: P("data", "context") for k in rows}
    with DataLoader.restore(state, source, mesh=mesh_context, batch_spec=spec) as loader:
        for step, batch in zip(range(save_at, steps), loader, strict=False):
            want = expected_batch(rows, step, mesh=mesh_context, batch_spec=spec, **order)
            assert assert_batch_exact(batch, want) > 0
            assert _sample_keys(batch) == whole[step], step
    spans = oracle.schedule_spans(len(rows["input_ids"]), order["global_batch_size"], steps, skip_steps=order["skip_steps"])  # fmt: skip
    assert [len(w) for w in whole] == [s.rows for s in spans]  # epoch ends cut some steps short
    assert spans[5].offset > spans[4].offset + spans[4].rows  # step 5 was skipped


def test_a_context_shard_of_padding_only():
    """Rows of 8 + 1 tokens over 4 context shards are padded to 12 columns: the last shard holds
    no token (columns 9-11) and is padding, also on a host that holds it alone (and reads no
    token for it)."""
    mesh = mesh_of(("data", "context"), (2, 4))
    source = TokenSequences(DocumentStore.from_documents(DOCS), S, targets=True)
    spec = {k: P("data", "context") for k in source.leaves}
    options = dict(global_batch_size=4, batch_spec=spec, seed=3, pad_value=7)
    loader = DataLoader(source, mesh=mesh, **options)
    rows = token_oracle.rows(DOCS, S, targets=True)
    delivered = {k: np.pad(v, ((0, 0), (0, 3)), constant_values=7) for k, v in rows.items()}
    for step in (0, 1):
        want = expected_batch(delivered, step, mesh=mesh, **options)
        assert assert_batch_exact(loader.batch_at(step), want)
    layout = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])  # host c holds context shard c only
    with fake_pod(mesh, layout) as process_of:
        loader = DataLoader(source, mesh=mesh, process_index=3, **options)
        shards = host_batch(loader, 1, process_of)
    for name in spec:
        for box in shards[name].shards.values():
            assert np.array_equal(box, np.full((2, 3), 7)), (name, box)


def test_a_negative_pad_id_for_signed_token_ids():
    """pad_id may be any id the token dtype holds (as for PackedSequences): -1 for int32."""
    rows = TokenSequences(
        DocumentStore.from_documents([np.arange(1, 9, dtype=np.int32)]), 4, pad_id=-1
    )
    got = rows.read_window(np.array([0, 1]), {"input_ids": slice(-1, 6)})["input_ids"]
    assert got.tolist() == [[-1, 1, 2, 3, 4, 5, 6], [4, 5, 6, 7, 8, -1, -1]]


def test_a_window_past_the_streams_end_is_padding():
    # stream (EOS 9 after every document): 100 101 102 103 104 9 200 201 9 -- 9 tokens, exactly
    # 3 rows of 3, so a continue halo of the last row reaches past the stream's end
    store = DocumentStore.from_documents([np.arange(100, 105), np.arange(200, 202)])
    rows = TokenSequences(store, 3, eos_id=9, pad_id=7)
    got = rows.read_window(
        np.array([2]), {k: slice(1, 5) for k in ("input_ids", "segment_ids", "positions")}
    )
    assert got["input_ids"].tolist() == [[201, 9, 7, 7]]  # stream positions 7, 8, then beyond
    assert got["segment_ids"].tolist() == [[2, 2, 0, 0]]
    assert got["positions"].tolist() == [[1, 2, 0, 0]]


def _store_of(docs: list[np.ndarray]) -> DocumentStore:
    """A store holding ``docs`` as they are, empty ones included (`from_documents` refuses
    those; a store written by another tool may hold them)."""
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    return DocumentStore.from_arrays(offsets, {"input_ids": np.concatenate(docs).astype(np.int32)})


def test_an_empty_document_contributes_no_token_not_even_an_eos():
    """docs/guides/tokens.md: empty documents contribute no token. Documents [], [11 12 13], [], [21 22]
    with EOS 0: the stream is 11 12 13 0 21 22 0, numbered by the documents' places in the store."""
    docs = [np.array([], np.int32), np.array([11, 12, 13]), np.array([]), np.array([21, 22])]
    rows = TokenSequences(_store_of(docs), 7, eos_id=0)
    assert len(rows) == 1 and rows.stream_tokens == 7
    got = rows.read(np.array([0]))
    assert got["input_ids"].tolist() == [[11, 12, 13, 0, 21, 22, 0]]
    assert got["segment_ids"].tolist() == [[2, 2, 2, 2, 4, 4, 4]]
    assert got["positions"].tolist() == [[0, 1, 2, 3, 0, 1, 2]]


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=10),
    seq_len=st.integers(1, 8),
    targets=st.booleans(),
    eos_id=st.sampled_from([None, 0]),
)
# the stream exactly a multiple of seq_len: with targets the last row would need a token past the
# end, so there is one row fewer (a row whose last target is padding would be unmasked)
@example(lengths=[3, 3], seq_len=3, targets=True, eos_id=None)
@example(lengths=[2, 0, 2], seq_len=3, targets=True, eos_id=0)
def test_rows_equal_the_oracle_with_empty_documents(lengths, seq_len, targets, eos_id):
    """Every leaf of every row equals the numpy oracle's concatenate-then-split, whatever the
    documents (empty ones anywhere), the length, the targets and the EOS."""
    rng = np.random.default_rng(len(lengths) * 100 + seq_len)
    docs = [rng.integers(1, 1000, n).astype(np.int32) for n in lengths]
    want = token_oracle.rows(docs, seq_len, targets=targets, eos_id=eos_id)
    if not len(want["input_ids"]):
        with pytest.raises(ValueError, match="fewer than one row"):
            TokenSequences(_store_of(docs), seq_len, targets=targets, eos_id=eos_id)
        return
    source = TokenSequences(_store_of(docs), seq_len, targets=targets, eos_id=eos_id)
    assert len(source) == len(want["input_ids"])
    got = source.read(np.arange(len(source)))
    assert list(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_targets_on_a_stream_of_whole_rows_leave_out_the_row_that_would_run_past_its_end():
    """6 tokens in rows of 3 + 1 target: row 1 would need a 7th token, and its last target would
    be padding that no mask marks, so there is one row, not two."""
    rows = TokenSequences(_store_of([np.arange(1, 7)]), 3, targets=True, pad_id=99)
    assert len(rows) == 1
    assert rows.read(np.array([0]))["input_ids"].tolist() == [[1, 2, 3, 4]]


# ------------------------------------------------------------------------------- per-row reads
class _TouchCounting(DocumentStore):
    """A store that counts the searches for documents (`documents_touching`)."""

    searches = 0

    def documents_touching(self, starts, stops, *, eos=False):
        self.searches += 1
        return super().documents_touching(starts, stops, eos=eos)


@pytest.mark.parametrize("eos_id", [None, 1])
def test_leaves_leave_out_computed_leaves_and_their_work(mesh_2d, eos_id):
    """leaves=(...) delivers only those leaves, every shard exact; input_ids alone without an
    EOS searches no document at all (each row is one range of the store)."""
    docs = [{"input_ids": d, "loss_mask": (d % 3 == 0).astype(np.uint8)} for d in DOCS]
    rows = token_oracle.rows(docs, S, eos_id=eos_id)
    store = _TouchCounting.from_documents(docs)
    chosen = ("input_ids", "segment_ids")
    source = TokenSequences(store, S, eos_id=eos_id, leaves=chosen)
    assert list(source.leaves) == ["input_ids", "segment_ids"]
    settings = dict(mesh=mesh_2d, global_batch_size=8, seed=5)
    want = {k: rows[k] for k in chosen}
    _check_steps(DataLoader(source, **settings), want, **settings)
    alone = TokenSequences(store, S, eos_id=eos_id, leaves=("input_ids",))
    store.searches = 0
    got = alone.read(np.arange(len(alone)))
    assert list(got) == ["input_ids"]
    np.testing.assert_array_equal(got["input_ids"], rows["input_ids"])
    assert store.searches == (0 if eos_id is None else 1)


def test_documents_are_found_per_row_never_per_token(monkeypatch):
    """A batch's documents come from its rows' ends: every search (np.searchsorted) takes at
    most two queries per row, whatever the row's length; reading a batch never searches each
    token's document (the old path searched all 64 x 512 of them)."""
    store = DocumentStore.from_documents(token_oracle.documents(seed=4, count=3000, mean=40))
    sizes = []
    search = np.searchsorted

    def recorded(a, v, *args, **kwargs):
        sizes.append(np.size(v))
        return search(a, v, *args, **kwargs)

    monkeypatch.setattr(np, "searchsorted", recorded)
    for eos_id in (None, 0):
        rows = TokenSequences(store, 512, eos_id=eos_id)
        ids = np.random.default_rng(1).choice(len(rows), 64, replace=False)
        rows.read(ids)
        rows.read_window(ids, {"input_ids": slice(-8, 520), "positions": slice(100, 300)})
    assert sizes and max(sizes) <= 2 * 64, sizes


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=40),
    seq_len=st.integers(1, 9),
    eos_id=st.sampled_from([None, 0]),
    stride=st.sampled_from([1, 2, 3, 4096]),
    kind=st.sampled_from(["numpy", "gathered", "read by range"]),
    window=st.tuples(st.integers(-12, 12), st.integers(0, 24)),
)
@example(lengths=[0, 0, 3, 0, 0, 2, 0], seq_len=2, eos_id=0, stride=2, kind="numpy", window=(-3, 9))
# offsets gathered in place without EOS: searched in each query's block, not the whole array
@example(
    lengths=[3, 0, 2, 0, 0, 4, 1], seq_len=2, eos_id=None, stride=2, kind="gathered", window=(-1, 5)
)
@example(
    lengths=[5, 0, 0, 0, 1], seq_len=3, eos_id=0, stride=1, kind="read by range", window=(0, 3)
)
# empty documents before a block with none: its stream starts shift by the empties' missing EOS
@example(lengths=[0, 3, 0, 2], seq_len=2, eos_id=0, stride=1, kind="numpy", window=(0, 2))
# every third row: runs of blocks apart, their counts of non-empty documents each from its mark
@example(
    lengths=[2, 0, 1, 3, 0, 0, 2, 1, 0, 4, 1, 0, 2], seq_len=2, eos_id=0, stride=1,
    kind="read by range", window=(0, 2),
)  # fmt: skip
def test_windows_equal_the_oracle_whatever_the_offsets_and_the_index(
    lengths, seq_len, eos_id, stride, kind, window
):
    """Columns [a, a + n) of every row, and of every third row, (reaching past the stream's
    ends: padding) equal the numpy oracle's stream, with empty documents anywhere, for offsets searched in place (numpy)
    or read block by block (any other array), and index strides from 1 to 4096 (a row then
    spans many blocks, runs of blocks, or one)."""
    from psdp.sources.documents.index import build_index
    from tests.scale_corpus import GatheredArray, LazyArray

    if sum(lengths) == 0:
        return
    rng = np.random.default_rng(len(lengths) * 10 + seq_len)
    docs = [rng.integers(1, 1000, n).astype(np.int32) for n in lengths]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = {"input_ids": np.concatenate(docs)}
    index = build_index(lambda a, b: offsets[a[0] : b[0]], len(docs), stride=stride, name="t")
    kinds = {"gathered": GatheredArray, "read by range": LazyArray}
    array = offsets if kind == "numpy" else kinds[kind](offsets.shape, offsets.dtype, offsets.take)
    try:
        source = TokenSequences(DocumentStore.from_arrays(array, flat, index=index), seq_len,
                                eos_id=eos_id, pad_id=7)  # fmt: skip
    except ValueError as error:
        assert "fewer than one row" in str(error)
        return
    stream = token_oracle.stream(docs, eos_id)
    a, n = window
    where = np.arange(len(source))[:, None] * seq_len + a + np.arange(n)
    inside = (where >= 0) & (where < len(stream["input_ids"]))
    clipped = np.clip(where, 0, len(stream["input_ids"]) - 1)
    names = ("input_ids", "segment_ids", "positions")
    for ids in (np.arange(len(source)), np.arange(len(source))[::3]):  # all, and rows apart
        got = source.read_window(ids, {k: slice(a, a + n) for k in names})
        for key in names:
            want = np.where(inside, stream[key][clipped], 7 if key == "input_ids" else 0)[ids]
            np.testing.assert_array_equal(got[key], want, err_msg=key)


# ------------------------------------------------------------------- 10^9 documents, never written
# Run in a child process: its peak resident memory is the store's and the view's, not pytest's.
# The corpus is tests/scale_corpus.py (plain numpy, the oracle too); its index is what
# write_documents would record, computed from the formula (a pass over 10^9 offsets is
# write-time work: docs/guides/tokens.md gives its cost).
_SCALE_CHILD = """
import json, resource, sys, time
import numpy as np
from psdp import DocumentStore, TokenSequences
from psdp.sources.documents.index import STRIDE, DocumentIndex
from tests.scale_corpus import ScaleCorpus

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
S, B = 2048, 64
corpus = ScaleCorpus()
before = peak()
start = time.perf_counter()
marks, nonempty = corpus.marks(STRIDE)
index = DocumentIndex(corpus.documents, STRIDE, marks, nonempty, 2 * corpus.length - 1)
store = DocumentStore.from_arrays(
    corpus.offsets_array(), {"input_ids": corpus.tokens_array()}, index=index
)
batches, seconds = {}, {"open": time.perf_counter() - start}
for eos_id in (None, 0):
    start = time.perf_counter()
    rows = TokenSequences(store, S, eos_id=eos_id)
    firsts = {"first": 0, "past 2**32": 2**32 // S + 1, "past 2**40": 2**40 // S + 1,
              "last": len(rows) - B}
    for name, first in firsts.items():
        ids = np.arange(first, first + B)
        batches[(eos_id, name)] = ids, rows.read(ids)
        seconds.setdefault(f"view and first batch, eos_id={eos_id}", time.perf_counter() - start)
    random = np.random.default_rng(0).choice(len(rows), B, replace=False)
    batches[(eos_id, "random")] = random, rows.read(random)
added = peak() - before
checked = 0
for (eos_id, name), (ids, got) in batches.items():
    want = corpus.stream(ids[:, None] * S + np.arange(S), eos_id is not None)
    want["input_ids"] = np.where(want["input_ids"] < 0, eos_id or 0, want["input_ids"])
    assert sorted(got) == ["input_ids", "positions", "segment_ids"], sorted(got)
    for key, value in want.items():
        assert np.array_equal(got[key], value), (eos_id, name, key)
    assert got["positions"].dtype == np.int32 and got["segment_ids"].dtype == np.int32
    checked += got["input_ids"].size
print(json.dumps({"documents": store.num_documents, "tokens": store.num_tokens,
                  "checked": checked, "rss_added": added, "seconds": seconds}))
"""


def test_a_billion_documents_open_in_bounded_memory_and_every_token_is_exact():
    """10^9 documents, 1.2 x 10^12 tokens, never written: TokenSequences without and with EOS
    reads the first batch, batches past 2**32 and 2**40 tokens, the last and a random one, every
    token, segment id and position equal to the formula's, and opening plus reading adds at
    most 1 GiB of resident memory (the time is printed, not asserted)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    child = subprocess.run(
        [sys.executable, "-c", _SCALE_CHILD], capture_output=True, text=True, timeout=300,
        cwd=root, env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.splitlines()[-1])
    print(got)
    assert (got["documents"], got["tokens"] > 2**40) == (10**9, True)
    assert got["checked"] == 2 * 5 * 64 * 2048
    assert got["rss_added"] <= 1 << 30, got
