"""DocumentStore: documents stored flat, read by token ranges, against numpy slices of the
concatenated documents (the oracle), and the checks of bad stores."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp.sources import DocumentStore


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
