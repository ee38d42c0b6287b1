"""DocumentStore: documents stored flat, read by token ranges, against numpy slices of the
concatenated documents (the oracle), and the checks of bad stores."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp.sources import DocumentStore, PackedSequences, TokenSequences


def _docs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, n).astype(np.uint16) for n in lengths]


def test_from_documents_offsets_and_leaves():
    docs = _docs([3, 1, 4])
    store = DocumentStore.from_documents(docs)
    assert store.offsets.dtype == np.int64
    assert store.offsets.tolist() == [0, 3, 4, 8]
    assert store.leaves == {"input_ids": np.dtype(np.uint16)}
    assert (store.num_documents, store.num_tokens) == (3, 8)
    flat = np.concatenate(docs)
    for d in range(3):
        a, b = store.offsets[d], store.offsets[d + 1]
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
n = int(offsets[0].read().result())  # the documented recipe: the used parts
ends = offsets[: n + 1].read().result().copy()
ends[0] = 0
out["long data"] = refusal(ends, {"input_ids": data})
store = DocumentStore.from_arrays(ends, {"input_ids": data[: int(ends[-1])]})
out["store"] = [store.num_documents, store.read_ranges([3, 0], [5, 2])["input_ids"].tolist()]
print(json.dumps(out))
"""


def test_a_levanter_shaped_store_is_refused_with_a_python_error_and_read_by_its_recipe(tmp_path):
    """Offsets and data 2**54 long: from_arrays reads offsets[0] and the shapes only, and says
    how to pass the used parts; the recipe of docs/tokens.md then reads the documents."""
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
    assert store.offsets.tolist() == np.concatenate(([0], np.cumsum(lengths))).tolist()
    got = store.read_ranges([0], [store.num_tokens])
    for k, v in oracle.items():
        np.testing.assert_array_equal(got[k], v)
    a, b = int(store.offsets[3]), int(store.offsets[9])  # a range across chunks
    np.testing.assert_array_equal(
        store.read_ranges([a], [b])["loss_mask"], oracle["loss_mask"][a:b]
    )


def test_write_documents_round_trips_locally(tmp_path):
    from psdp.sources.document_writer import write_documents

    docs = _chat_docs()
    path = write_documents(
        tmp_path / "store", iter(docs), dtype=np.uint16, tokens_per_shard=64,
        tokens_per_chunk=16, progress=False,
    )  # fmt: skip
    store = DocumentStore.open(path)
    assert store.leaves == {"input_ids": np.dtype(np.uint16), "loss_mask": np.dtype(np.uint8)}
    # a store on disk waits on storage (the loader then reads with several threads), one in
    # memory does not; TokenSequences and PackedSequences say what their store says
    in_memory = DocumentStore.from_documents(docs)
    assert (
        TokenSequences(store, 4).reads_storage,
        TokenSequences(in_memory, 4).reads_storage,
        PackedSequences(store, 8).reads_storage,
        PackedSequences(in_memory, 8).reads_storage,
    ) == (True, False, True, False)
    _assert_store_equal(store, docs)
    assert sorted(p.name for p in (path / "tokens").iterdir()) == ["input_ids", "loss_mask"]


def test_write_documents_round_trips_through_s3():
    from psdp.sources.document_writer import write_documents
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
