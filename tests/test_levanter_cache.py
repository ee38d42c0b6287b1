"""Levanter token caches read in place: a cache written in Levanter's exact layout
(`tests.levanter_cache`) opens as a `DocumentStore` whose every document equals the numpy
document written, only the counted part is read, and a `DataConfig` source with ``format:
levanter`` gives the loader built by hand from the same numpy documents."""

from __future__ import annotations

import io
import json

import draccus
import numpy as np
import pytest

from psdp import (
    DataConfig,
    DataLoader,
    DocumentStore,
    Mixture,
    MixtureConfig,
    OrderOptions,
    PackedSequences,
    SourceConfig,
    TokenSequences,
)
from psdp.sources import open_levanter_cache
from psdp.sources.documents.writer import write_documents
from tests.levanter_cache import write_levanter_cache
from tests.meshes import mesh_of


def _documents(seed: int, count: int, base: int) -> list[dict[str, np.ndarray]]:
    """``count`` documents of seeded lengths 0..40 (Levanter keeps empty ones), with an aligned
    per-token ``assistant_masks`` leaf; token ``i`` of document ``d`` is ``base + d * 1000 + i``."""
    lengths = np.random.default_rng(seed).integers(0, 41, count)
    lengths[3] = 0
    return [
        {
            "input_ids": (base + d * 1000 + np.arange(n)).astype(np.int32),
            "assistant_masks": (np.arange(n) % 3 == 0).astype(np.int8),
        }
        for d, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn batch after the count"])
def test_a_levanter_cache_opens_as_the_documents_written(tmp_path, torn):
    docs = _documents(0, 50, 0)
    write_levanter_cache(tmp_path / "train", docs, torn_batch=torn)
    store = open_levanter_cache(tmp_path / "train", leaves=("input_ids", "assistant_masks"))
    lengths = [len(d["input_ids"]) for d in docs]
    ends = np.concatenate([[0], np.cumsum(lengths)])
    assert store.num_documents == len(docs) and store.num_tokens == ends[-1]
    assert store.offsets_range(0, len(docs) + 1).tolist() == ends.tolist()
    assert store.leaves == {"input_ids": np.dtype(np.int32), "assistant_masks": np.dtype(np.int8)}
    for d, doc in enumerate(docs):
        got = store.read_ranges([ends[d]], [ends[d + 1]])
        for leaf, values in doc.items():
            assert np.array_equal(got[leaf], values), (d, leaf)
    only_tokens = open_levanter_cache(str(tmp_path / "train"))
    assert list(only_tokens.leaves) == ["input_ids"]
    assert np.array_equal(
        only_tokens.read_ranges([0], [ends[-1]])["input_ids"],
        np.concatenate([d["input_ids"] for d in docs]),
    )


def test_a_cache_whose_count_differs_from_its_ledger_is_refused(tmp_path):
    """offsets[0] (the count Levanter's reads use) against the ledger's total_num_rows."""
    write_levanter_cache(tmp_path, _documents(0, 20, 0))
    ledger = json.loads((tmp_path / "shard_ledger.json").read_text())
    ledger["total_num_rows"] = 21
    (tmp_path / "shard_ledger.json").write_text(json.dumps(ledger))
    with pytest.raises(ValueError) as info:
        open_levanter_cache(tmp_path)
    message = " ".join(str(info.value).split())
    assert "counts 20 documents in input_ids/offsets[0]" in message, message
    assert "says total_num_rows=21" in message and "cache_dataset" in message, message


SEQ_LEN, BATCH = 16, 8


@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_a_data_config_with_a_levanter_source_equals_the_loader_built_by_hand(tmp_path, packing):
    """One Levanter source and one psdp store mixed 1:3; the hand-built loader reads the same
    numpy documents from memory (`DocumentStore.from_documents`), not the cache."""
    lev_docs = [d for d in _documents(1, 60, 0) if len(d["input_ids"])]
    psdp_docs = [d["input_ids"] for d in _documents(2, 40, 500_000) if len(d["input_ids"])]
    write_levanter_cache(tmp_path / "web" / "train", lev_docs)
    prose = write_documents(tmp_path / "prose", psdp_docs, progress=False)
    view = "{eos_id: 0}" if packing is None else f"{{packing: {packing}, eos_id: 0}}"
    yaml = f"""
sources:
  web: {{store: {tmp_path / "web" / "train"}, format: levanter, weight: 1}}
  prose: {{store: {prose}, weight: 3}}
seq_len: {SEQ_LEN}
view: {view}
mixture: {{block_size: 16, seed: 5}}
order: {{global_batch_size: {BATCH}}}
"""
    config = draccus.load(DataConfig, io.StringIO(yaml))
    assert DataConfig.from_dict(config.to_dict()) == config
    stores = {
        "web": DocumentStore.from_documents([d["input_ids"] for d in lev_docs]),
        "prose": DocumentStore.from_documents(psdp_docs),
    }
    if packing is None:
        views = {n: TokenSequences(s, SEQ_LEN, eos_id=0) for n, s in stores.items()}
    else:
        views = {n: PackedSequences(s, SEQ_LEN, packing, eos_id=0) for n, s in stores.items()}
    views = dict(sorted(views.items()))  # a DataConfig's mixture takes its sources sorted
    by_hand = Mixture(views, stages=[(0, {"web": 1, "prose": 3})], block_size=16, seed=5)
    mesh = mesh_of(("data", "model"), (4, 2))
    with (
        config.build(mesh) as loader,
        DataLoader(by_hand, mesh=mesh, global_batch_size=BATCH) as hand,
    ):
        for step in range(12):
            got, want = loader.batch_at(step), hand.batch_at(step)
            assert set(got) == set(want)
            for key in want:
                assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), (step, key)


def test_a_leaf_of_rank_above_one_is_refused(tmp_path):
    """Levanter keeps ``<leaf>/shapes`` for items of rank > 1; psdp reads per-token leaves."""
    import tensorstore as ts

    write_levanter_cache(tmp_path, _documents(0, 5, 0))
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": f"{tmp_path}/input_ids/shapes/"},
    }
    ts.open(spec, dtype="int64", shape=[2**54, 1], create=True).result()
    with pytest.raises(ValueError, match=r"leaf 'input_ids' .* holds arrays of rank > 1"):
        open_levanter_cache(tmp_path)


def test_a_levanter_cache_on_s3_opens_as_the_documents_written():
    """Levanter caches live in buckets: moto's S3 server on 127.0.0.1, TensorStore's s3 driver."""
    from psdp.sources.stores.levanter_cache import is_levanter_cache
    from psdp.tools.benchmarks.object_store import S3Server

    docs = _documents(3, 30, 7_000)
    with S3Server() as server:
        where = server.kvstore("cache/train/")
        write_levanter_cache(where, docs)
        assert is_levanter_cache(where) and not is_levanter_cache(server.kvstore("cache/"))
        store = open_levanter_cache(where, leaves=("input_ids", "assistant_masks"))
        ends = np.concatenate([[0], np.cumsum([len(d["input_ids"]) for d in docs])])
        assert store.offsets_range(0, len(docs) + 1).tolist() == ends.tolist()
        got = store.read_ranges(ends[:-1], ends[1:])
        for leaf in ("input_ids", "assistant_masks"):
            assert np.array_equal(got[leaf], np.concatenate([d[leaf] for d in docs])), leaf


def test_document_store_open_on_a_levanter_cache_names_the_levanter_reader(tmp_path):
    """DocumentStore.open finds no psdp.json there: the error names the cache's format and
    open_levanter_cache, never "write one with psdp.write_documents" (that rewrites the cache)."""
    write_levanter_cache(tmp_path / "train", _documents(0, 6, 0))
    with pytest.raises(ValueError) as info:
        DocumentStore.open(tmp_path / "train")
    message = " ".join(str(info.value).split())
    assert "is a Levanter token cache (shard_ledger.json)" in message, message
    assert "open_levanter_cache(path)" in message and "format: levanter" in message, message
    assert "write_documents" not in message, message
    with pytest.raises(FileNotFoundError, match="write_documents"):  # no cache: as before
        DocumentStore.open(tmp_path / "nothing")


def test_int64_ids_read_as_int32_and_mix_with_a_uint16_store_in_a_data_config(tmp_path):
    """Levanter's int64 ids are read as int32 by default (JAX without 64-bit mode holds them),
    so a loader starts with no dtypes=; a DataConfig mixes the cache with a uint16 psdp store,
    both read as int32 (their common type); the batches equal a hand-built loader over the same
    documents as int32 numpy arrays, value for value."""
    lev = [d["input_ids"].astype(np.int64) + 60_000 for d in _documents(3, 50, 0)]
    lev = [d for d in lev if len(d)]
    prose = [
        d["input_ids"].astype(np.uint16) for d in _documents(4, 40, 100) if len(d["input_ids"])
    ]
    write_levanter_cache(tmp_path / "web", [{"input_ids": d} for d in lev])
    store = open_levanter_cache(tmp_path / "web")
    assert store.leaves == {"input_ids": np.dtype(np.int32)}
    assert open_levanter_cache(tmp_path / "web", ids_dtype=None).leaves["input_ids"] == np.int64
    mesh = mesh_of(("data", "model"), (4, 2))
    in_memory = TokenSequences(
        DocumentStore.from_documents([d.astype(np.int32) for d in lev]), SEQ_LEN
    )
    with (
        DataLoader(TokenSequences(store, SEQ_LEN), mesh=mesh, global_batch_size=BATCH) as alone,
        DataLoader(in_memory, mesh=mesh, global_batch_size=BATCH) as oracle,
    ):
        got = np.asarray(alone.batch_at(0)["input_ids"])
        assert got.dtype == np.int32
        assert np.array_equal(got, np.asarray(oracle.batch_at(0)["input_ids"]))
    prose_path = write_documents(tmp_path / "prose", prose, dtype=np.uint16, progress=False)
    config = DataConfig(
        sources={
            "web": SourceConfig(store=str(tmp_path / "web"), format="levanter", weight=1),
            "prose": SourceConfig(store=str(prose_path), weight=3),
        },
        seq_len=SEQ_LEN,
        mixture=MixtureConfig(block_size=16, seed=5),
        order=OrderOptions(global_batch_size=BATCH),
    )
    stores = {
        "web": DocumentStore.from_documents([d.astype(np.int32) for d in lev]),
        "prose": DocumentStore.from_documents([d.astype(np.int32) for d in prose]),
    }
    views = {n: TokenSequences(s, SEQ_LEN) for n, s in stores.items()}
    views = dict(sorted(views.items()))  # a DataConfig's mixture takes its sources sorted
    by_hand = Mixture(views, stages=[(0, {"web": 1, "prose": 3})], block_size=16, seed=5)
    with (
        config.build(mesh) as loader,
        DataLoader(by_hand, mesh=mesh, global_batch_size=BATCH) as hand,
    ):
        for step in range(8):
            got, want = loader.batch_at(step), hand.batch_at(step)
            assert np.asarray(got["input_ids"]).dtype == np.int32
            for key in want:
                assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), (step, key)


def test_an_int64_id_beyond_int32_is_an_error_naming_it_never_wrapped(tmp_path):
    docs = [{"input_ids": np.array([1, 2, 3], np.int64)}, {"input_ids": np.array([4, 2**31])}]
    write_levanter_cache(tmp_path, docs, batches=1)
    store = open_levanter_cache(tmp_path)
    assert store.read_ranges([0], [4])["input_ids"].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"holds 2147483648 at token 4, which its dtype int32"):
        store.read_ranges([0], [5])
    wide = open_levanter_cache(tmp_path, ids_dtype=None)
    assert wide.read_ranges([4], [5])["input_ids"].tolist() == [2**31]


def test_a_ledger_that_does_not_say_is_finished_is_an_unfinished_cache(tmp_path):
    """Only ``is_finished: true`` opens a cache: a ledger without the key (an older or damaged
    one) is refused like an unfinished one, never read as finished."""
    write_levanter_cache(tmp_path, _documents(0, 10, 0))
    ledger = json.loads((tmp_path / "shard_ledger.json").read_text())
    assert open_levanter_cache(tmp_path).num_documents == 10  # as written: finished
    del ledger["is_finished"]
    (tmp_path / "shard_ledger.json").write_text(json.dumps(ledger))
    with pytest.raises(
        ValueError, match=r"is unfinished: its shard_ledger.json says is_finished=None"
    ):
        open_levanter_cache(tmp_path)
