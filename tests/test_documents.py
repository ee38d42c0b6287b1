"""DocumentStore: documents stored flat, read by token ranges, against numpy slices of the
concatenated documents (the oracle), and the checks of bad stores."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp.sources import DocumentStore, PackedSequences, TokenSequences
from psdp.sources.documents import store as documents_module
from tests import token_oracle


def _docs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, n).astype(np.uint16) for n in lengths]


def test_from_documents_offsets_and_leaves():
    docs = _docs([3, 1, 4])
    store = DocumentStore.from_documents(docs)
    offsets = store.offsets_range(0, 4)
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [0, 3, 4, 8]
    assert store.leaves == {"input_ids": np.dtype(np.uint16)}
    assert (store.num_documents, store.num_tokens) == (3, 8)
    assert len(store) == 3  # len() counts documents, as num_documents does
    flat = np.concatenate(docs)
    for d in range(3):
        a, b = store.offsets_range(d, d + 2)
        got = store.read_ranges([a], [b])["input_ids"]
        np.testing.assert_array_equal(got, docs[d])
        assert got.dtype == np.uint16
    np.testing.assert_array_equal(store.read_ranges([0], [8])["input_ids"], flat)


def test_dict_documents_keep_leaves_aligned():
    docs = [
        {"input_ids": np.array([1, 2, 3]), "loss_mask": np.array([0, 1, 1], np.uint8)},
        {"input_ids": np.array([4, 5]), "loss_mask": np.array([1, 0], np.uint8)},
    ]
    store = DocumentStore.from_documents(iter(docs))
    got = store.read_ranges([1, 3], [4, 5])
    assert got["input_ids"].tolist() == [2, 3, 4, 4, 5]
    assert got["loss_mask"].tolist() == [1, 1, 1, 1, 0]
    assert list(store.read_ranges([0], [1], ["loss_mask"])) == ["loss_mask"]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=12),
    cuts=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=6),
)
def test_read_ranges_equals_slices_of_the_concatenation(lengths, cuts):
    docs = _docs(lengths, seed=len(lengths))
    flat = np.concatenate(docs)  # the oracle
    n = len(flat)
    starts = [min(a, b) % (n + 1) for a, b in cuts]
    stops = [max(s, max(a, b) % (n + 1)) for s, (a, b) in zip(starts, cuts, strict=True)]
    want = [flat[a:b] for a, b in zip(starts, stops, strict=True)]
    got = DocumentStore.from_documents(docs).read_ranges(
        np.array(starts, np.int64), np.array(stops, np.int64)
    )["input_ids"]
    np.testing.assert_array_equal(got, np.concatenate([flat[:0], *want]))


@pytest.mark.parametrize("backing", ["documents", "array", "memmap r+", "memmap r"])
def test_reads_return_arrays_the_caller_owns(tmp_path, backing):
    """A caller may write into what read_ranges returns (a read-only view would also do): the
    store, in memory or a memory-mapped file, never changes. One range, several, and none."""
    flat = np.arange(100, 110, dtype=np.int32)
    offsets = np.array([0, 4, 10])
    if backing == "documents":
        store = DocumentStore.from_documents([flat[:4], flat[4:]])
    elif backing == "array":
        store = DocumentStore.from_arrays(offsets, {"input_ids": flat})
    else:
        np.save(tmp_path / "flat.npy", flat)
        mapped = np.load(tmp_path / "flat.npy", mmap_mode=backing.split()[1])
        store = DocumentStore.from_arrays(offsets, {"input_ids": mapped})
    for starts, stops in (([2], [7]), ([0, 5], [3, 9]), ([], [])):
        got = store.read_ranges(np.array(starts, np.int64), np.array(stops, np.int64))["input_ids"]
        if got.flags.writeable:
            got[...] = -1
        assert store.read_ranges([0], [10])["input_ids"].tolist() == list(range(100, 110))
    if backing.startswith("memmap"):
        assert np.load(tmp_path / "flat.npy").tolist() == list(range(100, 110))


def test_from_arrays_reads_foreign_flat_and_tensorstore_arrays():
    import tensorstore as ts

    flat = np.arange(100, 110, dtype=np.int32)
    spec = {"driver": "zarr3", "kvstore": "memory://toks/", "create": True}
    array = ts.open(spec, dtype=ts.int32, shape=[10]).result()
    array.write(flat).result()
    for leaf in (flat, array):
        store = DocumentStore.from_arrays(np.array([0, 4, 4, 10]), {"input_ids": leaf})
        assert store.num_documents == 3  # a foreign store may hold an empty document
        got = store.read_ranges([8, 1], [10, 3])["input_ids"]
        assert got.tolist() == [108, 109, 101, 102]


# a Levanter JaggedArrayStore's raw arrays: offsets[0] holds the document count, the others the
# documents' ends, and both arrays are allocated 2**54 entries long (sparse: only the written
# chunks exist). Run in a child process: an abort (std::bad_alloc) must fail the test, not pytest.
_LEVANTER_CHILD = """
import json, sys
import numpy as np
import tensorstore as ts
from psdp.sources import DocumentStore

root, out = sys.argv[1], {}
def array(name, dtype):
    metadata = {"shape": [2**54], "data_type": dtype,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4096]}}}
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/{name}/"}}
    return spec, ts.open({**spec, "metadata": metadata, "create": True}).result()
offsets_spec, offsets = array("offsets", "int64")
data_spec, data = array("data", "int32")
offsets[:4].write(np.array([3, 3, 5, 9])).result()  # 3 documents, ending at 3, 5 and 9
data[:9].write(np.arange(100, 109, dtype=np.int32)).result()
zeros_spec, _ = array("zeros", "int64")  # offsets allocated 2**54 long, entry 0 a plain 0

def refusal(offsets, leaves):
    try:
        DocumentStore.from_arrays(offsets, leaves)
    except ValueError as error:
        return " ".join(str(error).split())
    return "no error"

out["raw"] = refusal(offsets_spec, {"input_ids": data_spec})
out["raw open"] = refusal(offsets, {"input_ids": data})
out["long zeros"] = refusal(zeros_spec, {"input_ids": data_spec})
n = int(offsets[0].read().result())  # the used parts, as the error says
ends = offsets[: n + 1].read().result().copy()
ends[0] = 0
out["long data"] = refusal(ends, {"input_ids": data})
store = DocumentStore.from_arrays(ends, {"input_ids": data[: int(ends[-1])]})
out["store"] = [store.num_documents, store.read_ranges([3, 0], [5, 2])["input_ids"].tolist()]
print(json.dumps(out))
"""


def test_a_levanter_shaped_store_is_refused_with_a_python_error_and_read_by_its_recipe(tmp_path):
    """Offsets and data 2**54 long: from_arrays reads offsets[0] and the shapes only, and says
    how to pass the used parts (or open_levanter_cache); sliced so, the documents read."""
    import json
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", _LEVANTER_CHILD, str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    got = json.loads(child.stdout.splitlines()[-1])
    for raw in (got["raw"], got["raw open"]):
        assert "the offsets of arrays must start at 0, got 3" in raw, raw
        assert "Levanter's JaggedArrayStore" in raw and "offsets[:3 + 1]" in raw, raw
    long_zeros = got["long zeros"]
    assert "the offsets of arrays have 18014398509481984 entries" in long_zeros, long_zeros
    assert "pass the used part, offsets[:D + 1]" in long_zeros, long_zeros
    long_data = got["long data"]
    assert "leaf 'input_ids' of arrays has 18014398509481984 values" in long_data, long_data
    assert "pass leaf[:9]" in long_data, long_data
    assert got["store"] == [3, [103, 104, 100, 101]]


# ------------------------------------------------------------------------------ written stores
def _chat_docs(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in rng.integers(1, 40, 25):
        ids = rng.integers(0, 65_536, n).astype(np.int64)  # the whole uint16 range
        out.append({"input_ids": ids, "loss_mask": (rng.random(n) < 0.5).astype(np.uint8)})
    return out


def _assert_store_equal(store, docs):
    oracle = {k: np.concatenate([d[k] for d in docs]) for k in docs[0]}
    lengths = [len(d["input_ids"]) for d in docs]
    want = np.concatenate(([0], np.cumsum(lengths)))
    assert store.offsets_range(0, store.num_documents + 1).tolist() == want.tolist()
    got = store.read_ranges([0], [store.num_tokens])
    for k, v in oracle.items():
        np.testing.assert_array_equal(got[k], v)
    a, b = int(want[3]), int(want[9])  # a range across chunks
    np.testing.assert_array_equal(
        store.read_ranges([a], [b])["loss_mask"], oracle["loss_mask"][a:b]
    )


def test_write_documents_round_trips_locally(tmp_path):
    from psdp.sources.documents.writer import write_documents

    docs = _chat_docs()
    path = write_documents(
        tmp_path / "store", iter(docs), dtype=np.uint16, tokens_per_shard=64,
        tokens_per_chunk=16, progress=False,
    )  # fmt: skip
    store = DocumentStore.open(path)
    assert store.leaves == {"input_ids": np.dtype(np.uint16), "loss_mask": np.dtype(np.uint8)}
    # a store read through TensorStore (here: compressed, which no memory map reads) waits on
    # storage (the loader then reads with several threads); one in memory, or read from memory
    # maps of its shard files, does not; TokenSequences and PackedSequences say what their
    # store says
    compressed = DocumentStore.open(write_documents(tmp_path / "zstd", iter(docs),
                                                    compression="zstd", progress=False))  # fmt: skip
    in_memory = DocumentStore.from_documents(docs)
    assert (
        TokenSequences(compressed, 4).reads_storage,
        TokenSequences(in_memory, 4).reads_storage,
        TokenSequences(store, 4).reads_storage,
        PackedSequences(compressed, 8).reads_storage,
        PackedSequences(in_memory, 8).reads_storage,
    ) == (True, False, False, True, False)
    _assert_store_equal(store, docs)
    assert sorted(p.name for p in (path / "tokens").iterdir()) == ["input_ids", "loss_mask"]


def test_write_documents_round_trips_through_s3():
    from psdp.sources.documents.writer import write_documents
    from psdp.tools.benchmarks.object_store import S3Server

    docs = _chat_docs(seed=1)
    with S3Server() as server:
        where = server.kvstore("docs/")
        write_documents(
            where, docs, dtype=np.uint16, tokens_per_shard=128, tokens_per_chunk=32, progress=False
        )
        _assert_store_equal(DocumentStore.open(where), docs)


def test_a_dataset_of_rows_is_not_a_document_store(tmp_path):
    from psdp import write_dataset

    write_dataset(tmp_path / "rows", np.zeros((4, 2), np.int32), progress=False)
    with pytest.raises(ValueError, match="is not a psdp document store"):
        DocumentStore.open(tmp_path / "rows")


# ------------------------------------------------------------------ offsets by range, the index
class RecordedArray:
    """A flat array (the `FlatArray` protocol) over numpy values that records every slice read."""

    def __init__(self, values: np.ndarray):
        self.values, self.shape, self.dtype = values, values.shape, values.dtype
        self.reads: list[tuple[int, int]] = []

    def __getitem__(self, where: slice) -> np.ndarray:
        self.reads.append((where.start, where.stop))
        return self.values[where]


def _short_documents(count: int, seed: int = 0) -> np.ndarray:
    """The offsets of ``count`` documents of 1 to 5 tokens."""
    lengths = np.random.default_rng(seed).integers(1, 6, count)
    return np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


def test_offsets_are_read_by_range_and_a_batch_reads_only_the_blocks_its_rows_touch(monkeypatch):
    """Opening reads the offsets in bounded steps (one pass that builds the index), offsets_range
    is one read of exactly its range, and a TokenSequences batch reads, per run of index blocks
    its rows touch, one range of whole blocks: never the whole array."""
    from psdp.sources.documents import index as document_index

    monkeypatch.setattr(document_index, "PASS_ENTRIES", 4096)  # the pass's step: one block
    offsets = _short_documents(20_000)
    recorded = RecordedArray(offsets)
    flat = np.arange(offsets[-1], dtype=np.int32)
    store = DocumentStore.from_arrays(recorded, {"input_ids": flat})
    ends, passed = recorded.reads[:2], recorded.reads[2:]
    assert ends == [(0, 1), (20_000, 20_001)]
    # steps of 4096 entries, each from the entry before it (the document across the edge)
    assert passed == [(max(a - 1, 0), min(a + 4096, 20_001)) for a in range(0, 20_001, 4096)]
    assert store.index.marks.tolist() == [*offsets[::4096].tolist(), offsets[-1]]
    recorded.reads.clear()
    got = store.offsets_range(5, 9000)
    assert recorded.reads == [(5, 9000)] and got.tolist() == offsets[5:9000].tolist()
    got[:] = -1  # the caller's to keep
    assert store.offsets_range(5, 6).tolist() == [offsets[5]]
    recorded.reads.clear()
    rows = TokenSequences(store, 16, eos_id=0)  # EOS: searched in blocks read by range
    ids = np.array([3, 400, 1000, 1030, 4200])  # ~1000 rows a block: blocks 0, 1 and 4
    rows.read(ids)
    stream = offsets + np.arange(len(offsets))  # with an EOS after each document
    blocks = set()
    for r in ids:
        first, last = np.searchsorted(stream, [r * 16, r * 16 + 15], side="right") - 1
        blocks.update(range(first // 4096, last // 4096 + 1))
    want = []
    for b in sorted(blocks):
        if want and want[-1][1] == b * 4096 + 1:  # a run of adjacent blocks: one read
            want[-1] = (want[-1][0], min((b + 1) * 4096, 20_000) + 1)
        else:
            want.append((b * 4096, min((b + 1) * 4096, 20_000) + 1))
    assert len(want) == 2 and recorded.reads == want


class _EvenOffsets:
    """The offsets of ``documents`` documents of ``length`` tokens each, computed on the fly,
    read by slice or gathered in place (``take``): counts every entry read either way."""

    def __init__(self, documents: int, length: int):
        self.shape, self.dtype, self.length = (documents + 1,), np.dtype(np.int64), length
        self.entries = 0

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        self.entries += stop - start
        return np.arange(start, stop, dtype=np.int64) * self.length

    def take(self, documents: np.ndarray) -> np.ndarray:
        self.entries += documents.size
        return documents.astype(np.int64) * self.length


class _Zeros:
    """A flat leaf of ``size`` zeros (the `FlatArray` protocol), never stored."""

    def __init__(self, size: int):
        self.shape, self.dtype = (size,), np.dtype(np.uint16)

    def __getitem__(self, where: slice) -> np.ndarray:
        start, stop, _ = where.indices(self.shape[0])
        return np.zeros(stop - start, self.dtype)


@pytest.mark.parametrize("eos_id", [None, 0])
def test_the_offsets_a_step_reads_do_not_depend_on_the_corpus_size(eos_id):
    """Offsets that gather in place (``take``, as numpy's do) are searched in each row's own
    block: a batch of 64 rows reads the same number of offsets from 10^6 documents as from
    10^9, rows at the same place in their documents and blocks (documents of 256 tokens: ids
    that differ by a multiple of 512 * 514 rows), however many blocks the rows share (at 10^6,
    64 random rows fall in 245 blocks). Segment ids and positions follow the rule of equal
    documents: stream position p is in document p // (256 + EOS)."""
    from psdp.sources import DocumentIndex

    length, stride, seq_len, period = 256, 4096, 2048, 512 * 514
    rng = np.random.default_rng(3)
    small = rng.choice(120_000, 64, replace=False)  # of 125,000 rows (no EOS) at 10^6
    reads = {}
    for documents, shift in ((10**6, 0), (10**9, period * rng.integers(1, 470, 64))):
        offsets = _EvenOffsets(documents, length)
        docs = np.minimum(np.arange(-(-documents // stride) + 1) * stride, documents)
        index = DocumentIndex(documents, stride, docs * length, docs, length)
        store = DocumentStore.from_arrays(
            offsets, {"input_ids": _Zeros(documents * length)}, index=index
        )
        rows = TokenSequences(store, seq_len, eos_id=eos_id)
        ids = small + shift
        offsets.entries = 0
        got = rows.read(ids)
        reads[documents] = offsets.entries
        stream = (ids * seq_len)[:, None] + np.arange(seq_len)
        each = length + (eos_id is not None)
        np.testing.assert_array_equal(got["segment_ids"], stream // each + 1)
        np.testing.assert_array_equal(got["positions"], stream % each)
    assert reads[10**6] == reads[10**9] < 64 * 64, reads  # a block is 4,097 offsets


def test_the_store_holds_an_index_not_the_offsets_and_the_pass_memory_is_bounded(
    tmp_path, monkeypatch
):
    """2 * 10^6 documents in .npy memmaps: after opening and reading, the store holds its
    index (16 bytes per 4096 documents), not 16 MB of offsets; the pass that built it read
    them in steps of PASS_ENTRIES, so its peak stays near one step whatever the store's size."""
    import tracemalloc

    from psdp.sources.documents import index as document_index

    monkeypatch.setattr(document_index, "PASS_ENTRIES", 1 << 14)  # 128 KiB a step
    offsets = np.arange(2_000_001, dtype=np.int64) * 2  # documents of 2 tokens
    np.save(tmp_path / "offsets.npy", offsets)
    np.save(tmp_path / "flat.npy", np.zeros(4_000_000, np.uint16))
    del offsets
    mapped = {
        name: np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("offsets", "flat")
    }
    tracemalloc.start()
    try:
        store = DocumentStore.from_arrays(mapped["offsets"], {"input_ids": mapped["flat"]})
        rows = TokenSequences(store, 1024, eos_id=1)
        rows.read(np.array([0, 1000, 5000]))
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (
        store.num_documents == 2_000_000 and store.index.marks.nbytes == 490 * 8
    )  # ceil(D / 4096) + 1 marks
    assert held < 1 << 20, held  # the offsets alone are 16 MB
    assert peak < 4 << 20, peak  # a few copies of one 128 KiB step, and a batch


def _cached_rows(offsets, flat, index, seq_len=2):
    """Every row of TokenSequences with EOS over ``offsets`` with ``index=`` the cache path."""
    store = DocumentStore.from_arrays(offsets, {"input_ids": flat}, index=index)
    rows = TokenSequences(store, seq_len, eos_id=-1)
    return rows.read(np.arange(len(rows)))


def _oracle_rows(offsets, flat, seq_len=2):
    docs = [flat[a:b] for a, b in itertools.pairwise(np.asarray(offsets).tolist())]
    return token_oracle.rows(docs, seq_len, eos_id=-1)


def _assert_rows(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_an_index_saved_at_a_path_is_reused_for_the_same_offsets_file_only(tmp_path, monkeypatch):
    """index=PATH: built and saved on first use, reused while the memory-mapped offsets file is
    the same (path, size, time, inode); offsets rewritten in place with the same size, marks and
    last entry (a document emptied, its neighbour grown: the non-empty counts change, which no
    spot check sees) are indexed again, and every row is exact."""
    path, file = tmp_path / "offsets.index", tmp_path / "offsets.npy"
    flat = np.arange(1, 13, dtype=np.int32)
    np.save(file, np.array([0, 1, 6, 9, 12]))
    builds = []
    real_build = documents_module.build_index
    monkeypatch.setattr(
        documents_module, "build_index", lambda *a, **k: builds.append(1) or real_build(*a, **k)
    )
    first = np.load(file, mmap_mode="r")
    _assert_rows(_cached_rows(first, flat, path), _oracle_rows(first, flat))
    _assert_rows(_cached_rows(np.load(file, mmap_mode="r"), flat, path), _oracle_rows(first, flat))
    assert len(builds) == 1 and path.is_file()  # the second open read the saved index
    changed = np.array([0, 2, 7, 7, 12])  # lengths 1 5 3 3 -> 2 5 0 5
    np.save(file, changed)
    os.utime(file, ns=(1, 1))  # a time of its own: the change is seen even on a coarse clock
    _assert_rows(
        _cached_rows(np.load(file, mmap_mode="r"), flat, path), _oracle_rows(changed, flat)
    )
    assert len(builds) == 2


def test_an_index_path_for_offsets_in_no_file_is_refused(tmp_path):
    """Offsets in memory (or any array that is not a file's) have nothing but their values to
    tell a changed copy apart (the reviewer's case: a stale cached index gave 8 rows for 7, wrong
    tokens and a reshape error): index=PATH is refused for them, naming the fix."""
    with pytest.raises(ValueError, match="are not a file's, so nothing tells a changed copy"):
        DocumentStore.from_arrays(np.array([0, 1, 6]), {"input_ids": np.arange(6)},
                                  index=tmp_path / "offsets.index")  # fmt: skip
    assert not (tmp_path / "offsets.index").exists()


def test_an_index_path_holding_another_file_is_refused_and_left_as_it_was(tmp_path):
    other = tmp_path / "tokens.npy"
    np.save(other, np.arange(12, dtype=np.int32))
    before = other.read_bytes()
    np.save(tmp_path / "offsets.npy", np.array([0, 6, 12]))
    offsets = np.load(tmp_path / "offsets.npy", mmap_mode="r")
    with pytest.raises(ValueError, match="is not a document index psdp saved"):
        DocumentStore.from_arrays(offsets, {"input_ids": np.arange(12)}, index=other)
    assert other.read_bytes() == before


@pytest.mark.parametrize("kind", ["numpy", "read by range"])
def test_offsets_changed_under_the_store_are_refused_when_a_read_touches_them(kind):
    """Offsets memory-mapped from a file rewritten after the store opened: a read whose blocks'
    marks no longer match the index raises, naming the offset and the fix, instead of reading
    rows at wrong boundaries."""
    offsets = _short_documents(10_000, seed=2)
    values = offsets.copy()
    array = values if kind == "numpy" else RecordedArray(values)
    store = DocumentStore.from_arrays(array, {"input_ids": np.zeros(offsets[-1], np.int32)})
    rows = TokenSequences(store, 16, eos_id=0)
    row = int((offsets[4096] + 4096) // 16)  # a row in block 1
    rows.read(np.array([row]))
    values[4096] += 1  # its first offset moves
    with pytest.raises(ValueError, match=r"is stale: offsets\[4096\]=.*build the index again"):
        rows.read(np.array([row]))


@pytest.mark.parametrize("kind", ["numpy", "read by range"])
def test_a_stale_count_of_empty_documents_is_refused_when_a_read_counts_them(kind):
    """With EOS, documents in blocks holding empty ones are counted: offsets rewritten under the
    store so that an empty document of block 0 takes a token from its neighbour (same marks, same
    ends, still non-decreasing) change the non-empty count the index holds for block 1, and a
    read spanning both blocks raises instead of giving every later token a shifted EOS."""
    lengths = np.random.default_rng(6).integers(1, 6, 10_000)
    lengths[[5, 17, 5000]] = 0  # empty documents in blocks 0 and 1
    lengths[6] = 3
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = offsets.copy()
    array = values if kind == "numpy" else RecordedArray(values)
    store = DocumentStore.from_arrays(array, {"input_ids": np.zeros(offsets[-1], np.int32)})
    rows = TokenSequences(store, 16, eos_id=0)
    ids = np.array([0, int((offsets[4100] + 4100) // 16)])  # rows in blocks 0 and 1
    rows.read(ids)
    values[6] += 1  # document 5 (empty) now holds a token of document 6: one more non-empty
    with pytest.raises(ValueError, match=r"count of non-empty documents before document 4096"):
        rows.read(ids)


def test_a_document_longer_than_the_index_allows_is_refused():
    """Offsets rewritten so that one document spans more tokens than the index's longest (the
    marks unchanged): a read touching it raises, naming the document, instead of reading a
    span the index says no document has."""
    offsets = _short_documents(10_000, seed=7)
    values = offsets.copy()
    store = DocumentStore.from_arrays(
        RecordedArray(values), {"input_ids": np.zeros(offsets[-1], np.int32)}
    )
    rows = TokenSequences(store, 16)
    row = int(offsets[100] // 16)
    rows.read(np.array([row]))
    values[95:100] = values[95]  # documents 95-98 emptied: document 99 holds all their tokens
    span = int(values[100] - values[99])
    assert span > store.index.longest
    with pytest.raises(ValueError, match=r"do not match its index: document 99 spans"):
        rows.read(np.array([row]))


def test_blocks_read_in_separate_runs_are_checked_each_against_its_own_mark():
    """Rows in blocks 0 and 2 read two runs of offsets; a block 2 rewritten lower than block 0
    ends is named by its own mark (the step from one run to the next is no document)."""
    offsets = _short_documents(10_000, seed=5)
    values = offsets.copy()
    store = DocumentStore.from_arrays(
        RecordedArray(values), {"input_ids": np.zeros(offsets[-1], np.int32)}
    )
    rows = TokenSequences(store, 16, eos_id=0)
    ids = np.array([0, int((offsets[8192] + 8192) // 16) + 1])  # in blocks 0 and 2
    rows.read(ids)
    values[8192:] -= offsets[8192] - offsets[4000]  # now below block 0's last offset
    with pytest.raises(ValueError, match=rf"is stale: offsets\[8192\]={offsets[4000]}, but"):
        rows.read(ids)


def test_a_written_store_records_its_index_and_opening_it_reads_no_offsets_but_its_ends(
    tmp_path, monkeypatch
):
    """write_documents writes index/ beside offsets/ (and its stride in psdp.json): open builds
    nothing. A store written before the index (no index/) is indexed by a pass on open."""
    import json
    import shutil

    from psdp.sources.documents import store as documents
    from psdp.sources.documents.writer import write_documents

    docs = _chat_docs(seed=3)
    path = write_documents(tmp_path / "store", docs, progress=False)
    meta = json.loads((path / "psdp.json").read_text())
    longest = max(len(d["input_ids"]) for d in docs)
    assert (meta["index_stride"], meta["longest_document"]) == (4096, longest)
    assert (path / "index").is_dir()

    def no_pass(*args, **kwargs):
        raise AssertionError("the index was built again")

    with monkeypatch.context() as patched:
        patched.setattr(documents, "build_index", no_pass)
        store = DocumentStore.open(path)
    _assert_store_equal(store, docs)
    del meta["index_stride"]
    (path / "psdp.json").write_text(json.dumps(meta))
    shutil.rmtree(path / "index")
    _assert_store_equal(DocumentStore.open(path), docs)


def test_any_object_with_shape_dtype_and_slices_is_a_flat_array():
    """The FlatArray protocol (docs/guides/tokens.md): offsets and a leaf computed on the fly read
    exactly as numpy arrays of the same values."""
    from tests.scale_corpus import ScaleCorpus

    corpus = ScaleCorpus(documents=300, length=5, seed=4)
    offsets = corpus.offsets(np.arange(301))
    lazy = DocumentStore.from_arrays(corpus.offsets_array(), {"input_ids": corpus.tokens_array()})
    plain = DocumentStore.from_arrays(offsets, {"input_ids": corpus.tokens(np.arange(offsets[-1]))})
    assert lazy.reads_storage and not plain.reads_storage  # the loader reads it with threads
    assert lazy.offsets_range(0, 301).tolist() == offsets.tolist()
    starts, stops = np.array([0, 17, 900]), np.array([5, 400, 1500])
    np.testing.assert_array_equal(
        lazy.read_ranges(starts, stops)["input_ids"], plain.read_ranges(starts, stops)["input_ids"]
    )


def test_the_whole_offsets_are_deprecated_with_their_range_read_as_the_fix():
    store = DocumentStore.from_documents(_docs([3, 1, 4]))
    with pytest.warns(FutureWarning, match=r"DocumentStore.offsets is deprecated.*offsets_range"):
        whole = store.offsets
    assert whole.tolist() == [0, 3, 4, 8]


def test_the_offsets_check_names_the_first_fall_of_runs_read_back_to_back():
    """`check_offsets_rise` over runs of offsets read back to back (as `documents_touching`
    reads blocks): the step from one run to the next is no fall, and a fall inside a run is
    named by its document, not its place in the values read."""
    from psdp.sources.documents.index import check_offsets_rise

    runs = dict(first=np.array([0, 4096, 9000]), run_start=np.array([0, 3, 5]))
    check_offsets_rise(np.array([0, 5, 9, 2, 4, 1, 7]), "s", **runs)
    with pytest.raises(ValueError) as error:
        check_offsets_rise(np.array([0, 5, 9, 2, 4, 1, 0]), "store s", **runs, fix="rewrite it")
    assert str(error.value) == (
        "the offsets of store s must be non-decreasing, got offsets[9000]=1 > offsets[9001]=0; "
        "rewrite it"
    )
