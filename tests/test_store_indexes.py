"""The indexes beside a store (`psdp index`, `psdp prepare --pack`): built once, in parallel,
resumable, written whole; found and checked by `DataConfig`, a stale one refused, a missing one
on a large store a fast error naming the command (``docs/guides/packing.md``)."""

from __future__ import annotations

import json
import shutil
from unittest import mock

import numpy as np
import pytest

from psdp import DataConfig, DocumentStore, PackedSequences, write_documents
from psdp._integration.source_config import SourceConfig
from psdp._integration.view_config import ViewConfig
from psdp.prepare import indexes
from psdp.sources.documents import beside
from psdp.sources.documents.beside import PackSettings
from psdp.sources.stores.location import INDEX_DIRECTORY
from psdp.sources.views import pack_index
from psdp.tools.cli import main
from tests.ray_cluster import requires_ray

SEQ_LEN, WINDOW = 64, 32


def documents(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, rng.integers(1, 90), dtype=np.int32) for _ in range(count)]


def store_at(path, count: int = 1000, seed: int = 0, reverse: bool = False) -> str:
    docs = documents(count, seed)
    write_documents(path, docs[::-1] if reverse else docs, progress=False, overwrite=True)
    return str(path)


def config(store: str, window: int = WINDOW, format: str = "psdp", **view) -> DataConfig:
    return DataConfig(
        sources={"code": SourceConfig(store=store, format=format)},
        seq_len=SEQ_LEN,
        view=ViewConfig(packing="best_fit", window=window, **view),
    )


def view_of(config: DataConfig) -> PackedSequences:
    return config.train_source().sources["code"]


def no_build():
    """Fails the test if a pack index is built (at start-up) instead of loaded."""
    return mock.patch.object(
        pack_index, "build_pack_index", side_effect=AssertionError("built at start-up")
    )


def test_an_index_built_by_the_command_is_loaded_by_every_config_and_reads_the_same_rows(
    tmp_path, capsys
):
    store = store_at(tmp_path / "store")
    assert main(["index", store, "--pack", f"{SEQ_LEN},{WINDOW}", "--no-progress"]) == 0
    name = f"pack-{SEQ_LEN}-{WINDOW}-best_fit-split-noseed.npz"
    assert capsys.readouterr().out.startswith(f"{store}/{INDEX_DIRECTORY}/{name}: built")
    with no_build():
        packed = view_of(config(store))
    fresh = PackedSequences(DocumentStore.open(store), SEQ_LEN, window=WINDOW)
    assert packed.plan.starts.tolist() == fresh.plan.starts.tolist()
    ids = np.arange(len(fresh))
    assert packed.read(ids)["input_ids"].tolist() == fresh.read(ids)["input_ids"].tolist()
    # a second run keeps it
    assert main(["index", store, "--pack", f"{SEQ_LEN},{WINDOW}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "up to date"


def test_each_setting_of_the_view_has_its_own_index(tmp_path):
    store = store_at(tmp_path / "store")
    options = {"strategy": "greedy", "seed": 3, "eos": True, "long_documents": "drop"}
    records = indexes.build_indexes(store, [PackSettings(SEQ_LEN, WINDOW, **options)],
                                    progress=False)  # fmt: skip
    assert records[0]["state"] == "built"
    view = {"seed": 3, "eos_id": 0, "long_documents": "drop"}
    greedy = DataConfig(
        sources={"code": SourceConfig(store=store)},
        seq_len=SEQ_LEN,
        view=ViewConfig(packing="greedy", window=WINDOW, **view),
    )
    with no_build():
        packed = view_of(greedy)
    assert (packed.plan.key.strategy, packed.plan.key.seed, packed.plan.key.eos) == (
        "greedy", 3, True)  # fmt: skip


def test_an_index_is_of_one_cap_on_segments_and_another_cap_is_refused_naming_the_command(
    tmp_path, capsys
):
    store = store_at(tmp_path / "store")
    flags = ["--pack", f"{SEQ_LEN},{WINDOW}", "--strategy", "greedy", "--max-segments", "2"]
    assert main(["index", store, *flags, "--no-progress"]) == 0
    name = f"pack-{SEQ_LEN}-{WINDOW}-greedy-split-noseed-max2.npz"
    assert capsys.readouterr().out.startswith(f"{store}/{INDEX_DIRECTORY}/{name}: built")

    def capped(cap):
        return DataConfig(
            sources={"code": SourceConfig(store=store)},
            seq_len=SEQ_LEN,
            view=ViewConfig(packing="greedy", window=WINDOW, max_segments=cap),
        )

    with no_build():
        packed = view_of(capped(2))
    fresh = PackedSequences(DocumentStore.open(store), SEQ_LEN, "greedy", window=WINDOW,
                            max_segments=2)  # fmt: skip
    assert packed.plan.starts.tolist() == fresh.plan.starts.tolist()
    segments = packed.read(np.arange(len(packed)))["segment_ids"]
    assert segments.max() == 2 and len(packed) > len(view_of(capped(None)))
    command = f"`psdp index {store} --pack {SEQ_LEN},{WINDOW} --strategy greedy --max-segments 3`"
    with (
        mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 999),
        no_build(),
        pytest.raises(FileNotFoundError, match=f"build the index once with {command}"),
    ):
        view_of(capped(3))
    folder = tmp_path / "store" / INDEX_DIRECTORY  # the cap-2 index under the cap-3 name
    shutil.copy(folder / name, folder / name.replace("max2", "max3"))
    with pytest.raises(ValueError, match=r"is stale: it was built for max_segments=2, but the "
                       rf"store and the config have max_segments=3; build it again with {command}"):  # fmt: skip
        view_of(capped(3))


def test_a_large_store_without_its_index_fails_fast_naming_the_command(tmp_path):
    store = store_at(tmp_path / "store")
    with (
        mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 999),
        no_build(),
        pytest.raises(FileNotFoundError) as error,
    ):
        view_of(config(store, eos_id=2))
    assert str(error.value) == (
        f"source 'code' ({store!r}): no pack index beside {store} for --pack {SEQ_LEN},{WINDOW} "
        f"--pack-eos ({store}/psdp-index/pack-{SEQ_LEN}-{WINDOW}-best_fit-split-noseed-eos.npz): "
        f"a packing in windows of 1,000 documents (more than 999) would plan all its 32 windows "
        f"at start-up on every host; build the index once with `psdp index {store} --pack "
        f"{SEQ_LEN},{WINDOW} --pack-eos`"
    )


def test_a_small_store_without_its_index_builds_it_at_start_up(tmp_path):
    store = store_at(tmp_path / "store")
    with mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 1000):
        packed = view_of(config(store))
    assert len(packed) == len(PackedSequences(DocumentStore.open(store), SEQ_LEN, window=WINDOW))
    assert not (tmp_path / "store" / INDEX_DIRECTORY).exists()  # nothing written by a host


def test_an_index_of_another_store_of_the_same_size_is_refused(tmp_path):
    # the same documents in another order: the same size and tokens, other lengths per block
    a, b = store_at(tmp_path / "a", 5000), store_at(tmp_path / "b", 5000, reverse=True)
    indexes.build_indexes(a, [PackSettings(SEQ_LEN, WINDOW)], progress=False)
    shutil.copytree(f"{a}/{INDEX_DIRECTORY}", f"{b}/{INDEX_DIRECTORY}")
    with pytest.raises(ValueError, match=r"was built for another store, or for this one before it "
                       r"changed: it records store '5000:\d+:[0-9a-f]{32}', but .*/b is "
                       rf"'5000:\d+:[0-9a-f]{{32}}' .*; build it again with `psdp index {b} "
                       rf"--pack {SEQ_LEN},{WINDOW}` \(it replaces the file\)"):  # fmt: skip
        view_of(config(b))
    indexes.build_indexes(b, [PackSettings(SEQ_LEN, WINDOW)], progress=False)  # the fix
    with no_build():
        assert view_of(config(b)).plan.key.num_documents == 5000


def test_an_index_of_the_store_before_it_grew_is_refused(tmp_path):
    store = store_at(tmp_path / "store")
    indexes.build_indexes(store, [PackSettings(SEQ_LEN, WINDOW)], progress=False)
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path / "store" / INDEX_DIRECTORY, saved)
    store_at(tmp_path / "store", count=1200)  # rewritten, larger
    shutil.copytree(saved, tmp_path / "store" / INDEX_DIRECTORY)
    with pytest.raises(ValueError, match=r"is stale: it was built for num_documents=1000, "
                       r"num_tokens=\d+, but the store and the config have num_documents=1200, "
                       r"num_tokens=\d+; build it again with `psdp index"):  # fmt: skip
        view_of(config(store))


def test_a_file_there_that_is_no_pack_index_is_refused_naming_the_command(tmp_path):
    store = store_at(tmp_path / "store")
    folder = tmp_path / "store" / INDEX_DIRECTORY
    folder.mkdir()
    (folder / PackSettings(SEQ_LEN, WINDOW).file_name).write_bytes(b"not an index")
    with pytest.raises(ValueError, match=r"is not a psdp pack index .*build it again with `psdp "
                       rf"index {store} --pack {SEQ_LEN},{WINDOW}`"):  # fmt: skip
        view_of(config(store))


def test_a_killed_build_resumes_from_its_parts_and_never_leaves_a_half_index(tmp_path, monkeypatch):
    store = store_at(tmp_path / "store", count=3000)
    settings = PackSettings(SEQ_LEN, WINDOW)
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_PART", 10 * WINDOW)  # 10 parts of 10 windows
    planned = []
    real = indexes.counts_of_windows

    def killed_at_part_6(store_, key, first, stop):
        if first == 60:
            raise KeyboardInterrupt  # as a kill between two parts
        planned.append(first)
        return real(store_, key, first, stop)

    monkeypatch.setattr(indexes, "counts_of_windows", killed_at_part_6)
    with pytest.raises(KeyboardInterrupt):
        indexes.build_indexes(store, [settings], workers=1, progress=False)
    folder = tmp_path / "store" / INDEX_DIRECTORY
    assert not (folder / settings.file_name).exists()  # no index until every part is in
    assert len(list(folder.glob(".build-*/part-*.npy"))) == 6 == len(planned)
    with (
        mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 0),
        pytest.raises(FileNotFoundError, match="no pack index beside"),
    ):  # a host sees no index, never a half one
        view_of(config(store))

    planned.clear()
    monkeypatch.setattr(indexes, "counts_of_windows", lambda *a: planned.append(a[2]) or real(*a))
    record = indexes.build_indexes(store, [settings], workers=1, progress=False)[0]
    assert record["state"] == "resumed" and planned == [60, 70, 80, 90]
    assert list(folder.glob(".build-*")) == []
    fresh = PackedSequences(DocumentStore.open(store), SEQ_LEN, window=WINDOW).plan
    with no_build():
        loaded = view_of(config(store)).plan
    for name in ("starts", "tokens", "dropped", "empty"):
        assert getattr(loaded, name).tolist() == getattr(fresh, name).tolist()


def test_parts_left_by_a_build_for_the_store_before_it_changed_are_not_used(tmp_path, monkeypatch):
    store = store_at(tmp_path / "store", count=3000)
    settings = PackSettings(SEQ_LEN, WINDOW)
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_PART", 10 * WINDOW)
    real = indexes.counts_of_windows

    def killed(store_, key, first, stop):
        if first == 50:
            raise KeyboardInterrupt
        return real(store_, key, first, stop)

    monkeypatch.setattr(indexes, "counts_of_windows", killed)
    with pytest.raises(KeyboardInterrupt):
        indexes.build_indexes(store, [settings], workers=1, progress=False)
    store_at(tmp_path / "store", count=3000, reverse=True)  # the same size, another order
    monkeypatch.setattr(indexes, "counts_of_windows", real)
    record = indexes.build_indexes(store, [settings], workers=1, progress=False)[0]
    assert record["state"] == "built"  # no old part was mixed in
    fresh = PackedSequences(DocumentStore.open(store), SEQ_LEN, window=WINDOW).plan
    with no_build():
        assert view_of(config(store)).plan.starts.tolist() == fresh.starts.tolist()


def test_a_levanter_cache_gets_its_document_index_beside_it(tmp_path):
    from tests.levanter_cache import write_levanter_cache

    docs = [{"input_ids": d.astype(np.int64)} for d in documents(500)]
    write_levanter_cache(tmp_path / "cache", docs)
    cache = str(tmp_path / "cache")
    with (
        mock.patch.object(beside, "IN_MEMORY_DOCUMENTS", 499),
        mock.patch("psdp.sources.documents.levanter.IN_MEMORY_DOCUMENTS", 499),
        pytest.raises(FileNotFoundError) as error,
    ):
        config(cache, format="levanter").train_source()
    assert str(error.value).endswith(
        f"holds 500 documents and no document index beside it (psdp-index/documents.npz): "
        f"every host would read all its offsets at start-up (more than 499 documents); build "
        f"the index once with `psdp index {cache} --format levanter`"
    )
    assert main(["index", cache, "--format", "levanter", "--pack", f"{SEQ_LEN},{WINDOW}",
                 "--no-progress"]) == 0  # fmt: skip
    no_pass = AssertionError("a pass over the offsets")
    with mock.patch("psdp.sources.documents.store.build_index", side_effect=no_pass), no_build():
        packed = view_of(config(cache, format="levanter"))
    want = PackedSequences(DocumentStore.from_documents([d["input_ids"] for d in docs]),
                           SEQ_LEN, window=WINDOW)  # fmt: skip
    assert packed.read(np.arange(8))["input_ids"].tolist() == want.read(np.arange(8))[
        "input_ids"].tolist()  # fmt: skip


def test_a_stale_document_index_beside_a_levanter_cache_is_refused(tmp_path):
    from tests.levanter_cache import write_levanter_cache

    for name, seed in (("a", 0), ("b", 1)):
        docs = [{"input_ids": d.astype(np.int64)} for d in documents(500, seed)]
        write_levanter_cache(tmp_path / name, docs)
    indexes.build_indexes(str(tmp_path / "a"), format="levanter", progress=False)
    shutil.copytree(tmp_path / "a" / INDEX_DIRECTORY, tmp_path / "b" / INDEX_DIRECTORY)
    with pytest.raises(ValueError, match=r"source 'code': the document index of Levanter cache "
                       r".*/b \(.*/b/psdp-index/documents.npz\) is of 500 documents and \d+ tokens,"
                       r" but the offsets hold 500 documents and \d+ tokens; it was built for "
                       r"another cache, or for this one before it changed: build it again with "
                       r"`psdp index .*/b --format levanter`"):  # fmt: skip
        config(str(tmp_path / "b"), format="levanter").train_source()


def test_prepare_builds_the_pack_index_it_is_asked_for(tmp_path):
    from psdp.prepare import prepare
    from tests import prepare_corpus as corpus

    tokenizer = corpus.train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    text = corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(300))
    out = str(tmp_path / "store")
    summary = prepare([str(text)], out, tokenizer=tokenizer, workers=1, progress=False,
                      packs=[PackSettings(SEQ_LEN, 16)])  # fmt: skip
    sequences = len(PackedSequences(DocumentStore.open(out), SEQ_LEN, window=16))
    name = f"pack-{SEQ_LEN}-16-best_fit-split-noseed.npz"
    assert str(summary).endswith(f"{out}/psdp-index/{name}: built, {sequences:,} sequences")
    assert summary.to_json()["indexes"][0]["state"] == "built"
    with no_build(), mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 0):
        packed = view_of(config(out, window=16))
    assert len(packed) == sequences


@pytest.mark.slow
def test_two_worker_processes_build_the_same_index_as_one(tmp_path, monkeypatch):
    store = store_at(tmp_path / "store", count=3000)
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_PART", 10 * WINDOW)
    settings = PackSettings(SEQ_LEN, WINDOW)
    indexes.build_indexes(store, [settings], workers=2, progress=False)
    two = (tmp_path / "store" / INDEX_DIRECTORY / settings.file_name).read_bytes()
    shutil.rmtree(tmp_path / "store" / INDEX_DIRECTORY)
    indexes.build_indexes(store, [settings], workers=1, progress=False)
    assert (tmp_path / "store" / INDEX_DIRECTORY / settings.file_name).read_bytes() == two


def test_on_s3_the_index_is_built_resumed_found_and_checked_beside_the_store(tmp_path, monkeypatch):
    """The same path on an object store (moto on 127.0.0.1): the parts and the index are
    objects below ``STORE/psdp-index/``, the index appears only whole, a config over the
    ``s3://`` URL loads it, and a store rewritten since is refused."""
    from psdp.tools.benchmarks.object_store import S3Server

    with S3Server() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        url = "s3://psdp/web/"
        write_documents(server.kvstore("web/"), documents(3000), progress=False)
        settings = PackSettings(SEQ_LEN, WINDOW)
        monkeypatch.setattr(indexes, "DOCUMENTS_PER_PART", 40 * WINDOW)  # 3 parts
        real = indexes.counts_of_windows

        def killed(store_, key, first, stop):
            if first == 80:
                raise KeyboardInterrupt
            return real(store_, key, first, stop)

        monkeypatch.setattr(indexes, "counts_of_windows", killed)
        with pytest.raises(KeyboardInterrupt):
            indexes.build_indexes(url, [settings], workers=1, progress=False)
        objects = server.objects()
        index_keys = sorted(k.decode() for k in objects.list().result() if b"psdp-index" in k)
        assert [k.rsplit("/", 1)[-1] for k in index_keys] == ["part-0000000.npy",
                                                              "part-0000001.npy"]  # fmt: skip
        monkeypatch.setattr(indexes, "counts_of_windows", real)
        (record,) = indexes.build_indexes(url, [settings], workers=1, progress=False)
        assert record["state"] == "resumed"
        index_keys = sorted(k.decode() for k in objects.list().result() if b"psdp-index" in k)
        assert index_keys == [f"web/psdp-index/{settings.file_name}"]
        fresh = PackedSequences(DocumentStore.open(url), SEQ_LEN, window=WINDOW).plan
        with no_build():
            assert view_of(config(url)).plan.starts.tolist() == fresh.starts.tolist()
        write_documents(server.kvstore("web/"), documents(3000, seed=5), progress=False,
                        overwrite=True)  # fmt: skip
        with pytest.raises(ValueError, match=rf"build it again with `psdp index {url} --pack"):
            view_of(config(url))


@pytest.mark.slow
@pytest.mark.timeout(300)
@requires_ray
def test_ray_tasks_build_the_same_index_as_local_workers(
    ray_engine,
    tmp_path,
    monkeypatch,
):
    store = store_at(tmp_path / "store", count=3000)
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_PART", 10 * WINDOW)  # 10 tasks
    settings = PackSettings(SEQ_LEN, WINDOW)
    (record,) = indexes.build_indexes(store, [settings], engine="ray", progress=False)
    assert record["state"] == "built"
    on_ray = (tmp_path / "store" / INDEX_DIRECTORY / settings.file_name).read_bytes()
    shutil.rmtree(tmp_path / "store" / INDEX_DIRECTORY)
    indexes.build_indexes(store, [settings], workers=1, progress=False)
    assert (tmp_path / "store" / INDEX_DIRECTORY / settings.file_name).read_bytes() == on_ray


def without_identity(store: str) -> str:
    """The store as a psdp older than the write identity left it: no ``written`` recorded."""
    path = f"{store}/psdp.json"
    with open(path) as file:
        meta = json.load(file)
    del meta["written"]
    with open(path, "w") as file:
        json.dump(meta, file)
    return store


def test_a_store_rewritten_in_another_order_under_its_index_is_refused_by_its_identity(tmp_path):
    """The same documents, the first and last windows' kept in place and the rest reversed: the
    same size and document index (under 4,096 documents it holds only the ends) and the same
    windows a host checks, so only the identity of the write tells the stores apart. (An overwrite deletes
    the indexes beside the store: here they are put back, as a copy of the folder would.)"""
    docs = documents(1000)
    store = str(tmp_path / "store")
    write_documents(store, docs, progress=False)
    indexes.build_indexes(store, [PackSettings(SEQ_LEN, WINDOW)], progress=False)
    before = DocumentStore.open(store)
    shutil.copytree(tmp_path / "store" / INDEX_DIRECTORY, tmp_path / "kept")
    last = (len(docs) - 1) // WINDOW * WINDOW  # the last window's first document
    reordered = docs[:WINDOW] + docs[WINDOW:last][::-1] + docs[last:]
    write_documents(store, reordered, progress=False, overwrite=True)
    shutil.copytree(tmp_path / "kept", tmp_path / "store" / INDEX_DIRECTORY)
    after = DocumentStore.open(store)
    assert after.index.num_documents == before.index.num_documents
    assert after.index.marks.tolist() == before.index.marks.tolist()
    assert after.written != before.written
    with pytest.raises(ValueError, match=r"was built for another store, or for this one before it "
                       rf"changed: .*build it again with `psdp index {store} --pack "
                       rf"{SEQ_LEN},{WINDOW}`"):  # fmt: skip
        view_of(config(store))


def test_a_levanter_cache_built_again_under_its_index_is_refused_by_its_ledger(tmp_path):
    """A rebuild rewrites the ledger (here: other shard names, the same documents reordered
    past the first and last windows): the digest records the ledger's sha256."""
    from tests.levanter_cache import write_levanter_cache

    docs = [{"input_ids": d.astype(np.int64)} for d in documents(500)]
    cache = str(tmp_path / "cache")
    write_levanter_cache(cache, docs)
    assert main(["index", cache, "--format", "levanter", "--pack", f"{SEQ_LEN},{WINDOW}"]) == 0
    shutil.copytree(tmp_path / "cache" / INDEX_DIRECTORY, tmp_path / "kept")
    shutil.rmtree(cache)
    last = (len(docs) - 1) // WINDOW * WINDOW
    write_levanter_cache(cache, docs[:WINDOW] + docs[WINDOW:last][::-1] + docs[last:])
    ledger = json.loads((tmp_path / "cache" / "shard_ledger.json").read_text())
    ledger["shard_rows"] = {"rebuilt": len(docs)}
    (tmp_path / "cache" / "shard_ledger.json").write_text(json.dumps(ledger))
    shutil.copytree(tmp_path / "kept", tmp_path / "cache" / INDEX_DIRECTORY)
    with pytest.raises(ValueError, match=r"was built for another store, or for this one before it "
                       rf"changed: .*`psdp index {cache} --format levanter --pack "):  # fmt: skip
        view_of(config(cache, format="levanter"))


def test_a_store_written_without_an_identity_keeps_its_digest_and_its_index(tmp_path):
    store = without_identity(store_at(tmp_path / "store"))
    opened = DocumentStore.open(store)
    assert opened.written is None
    assert beside.store_digest(opened.index, opened.written) == beside.store_digest(opened.index)
    indexes.build_indexes(store, [PackSettings(SEQ_LEN, WINDOW)], progress=False)
    fresh = PackedSequences(opened, SEQ_LEN, window=WINDOW).plan
    with no_build():
        assert view_of(config(store)).plan.starts.tolist() == fresh.starts.tolist()


def test_a_store_reordered_under_its_index_is_refused_at_its_first_window(tmp_path):
    """Stores written without an identity: under 4,096 documents the document index holds only
    the ends, so a store rewritten with the same documents in another order has the same
    digest: the window check catches it."""
    store = without_identity(store_at(tmp_path / "store", reverse=True))
    without_identity(store_at(tmp_path / "other"))  # the same documents in their first order
    indexes.build_indexes(str(tmp_path / "other"), [PackSettings(SEQ_LEN, WINDOW)], progress=False)
    shutil.copytree(tmp_path / "other" / INDEX_DIRECTORY, tmp_path / "store" / INDEX_DIRECTORY)
    with pytest.raises(ValueError, match=r"the pack index given does not match the store: window 0 "
                       r".*build it again for the store as it is now \(psdp index STORE --pack "
                       rf"{SEQ_LEN},{WINDOW} "):  # fmt: skip
        view_of(config(store))


def test_a_pack_index_given_for_another_packing_is_refused():
    store = DocumentStore.from_documents([np.arange(1, n + 1) for n in [3, 5, 2, 6] * 4])
    index = PackedSequences(store, 8, window=4).plan
    with pytest.raises(ValueError, match=r"index is a pack index of PackKey\(seq_len=8, .*window="
                       r"4,.*but this packing of the store is PackKey\(seq_len=8, .*window=8,"):  # fmt: skip
        PackedSequences(store, 8, window=8, index=index)
    assert len(PackedSequences(store, 8, window=4, index=index)) == len(index)


def test_the_command_names_the_format_of_a_store_given_with_the_other_one(tmp_path, capsys):
    from tests.levanter_cache import write_levanter_cache

    store = store_at(tmp_path / "store", 100)
    write_levanter_cache(tmp_path / "cache", [{"input_ids": d.astype(np.int64)}
                                              for d in documents(100)])  # fmt: skip
    cache = str(tmp_path / "cache")
    assert main(["index", cache, "--pack", "64,32"]) == 2
    assert capsys.readouterr().err == (
        f"psdp index: error: {cache} is a Levanter token cache, not a psdp document store; "
        f"build its indexes with `psdp index {cache} --format levanter --pack 64,32`\n"
    )
    assert main(["index", store, "--format", "levanter", "--pack", "64,32", "--pack-eos"]) == 2
    assert capsys.readouterr().err == (
        f"psdp index: error: {store} is a psdp document store, not a Levanter token cache; "
        f"build its indexes with `psdp index {store} --pack 64,32 --pack-eos`\n"
    )
    assert main(["index", store]) == 2
    assert "name a packing to index, e.g. --pack 4096,4096" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "none"), "--pack", "64,0"]) == 2
    assert capsys.readouterr().err == "psdp index: error: --pack 64,0: window must be >= 1, got 0\n"


def test_a_levanter_caches_document_index_is_built_in_parts_resumed_and_equals_one_pass(
    tmp_path, monkeypatch
):
    from psdp.sources import open_levanter_cache
    from tests.levanter_cache import write_levanter_cache

    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, 20_000)  # empty documents too
    docs = [{"input_ids": np.arange(1, n + 1, dtype=np.int64)} for n in lengths]
    write_levanter_cache(tmp_path / "cache", docs)
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_OFFSETS_PART", 4096)  # 5 parts
    real, ran = indexes._index_part, []

    def killed_at_part_3(part):
        if part.part == 3:
            raise KeyboardInterrupt
        ran.append(part.part)
        return real(part)

    monkeypatch.setattr(indexes, "_index_part", killed_at_part_3)
    with pytest.raises(KeyboardInterrupt):
        indexes.build_indexes(cache, format="levanter", workers=1, progress=False)
    folder = tmp_path / "cache" / INDEX_DIRECTORY
    assert not (folder / "documents.npz").exists() and ran == [0, 1, 2]
    ran.clear()
    monkeypatch.setattr(indexes, "_index_part", lambda p: ran.append(p.part) or real(p))
    (record,) = indexes.build_indexes(cache, format="levanter", workers=1, progress=False)
    assert (record["state"], ran) == ("resumed", [3, 4])
    assert sorted(p.name for p in folder.iterdir()) == ["documents.npz"]
    built = open_levanter_cache(cache, index="beside").index
    one_pass = open_levanter_cache(cache).index
    assert (built.num_documents, built.longest) == (one_pass.num_documents, one_pass.longest)
    assert built.marks.tolist() == one_pass.marks.tolist()
    assert built.nonempty.tolist() == one_pass.nonempty.tolist()


def test_an_index_saved_without_its_store_is_refused_and_saved_beside_it_is_used(tmp_path):
    from psdp.sources import save_pack_index_beside
    from psdp.sources.views.pack_index import build_pack_index, save_pack_index

    store = store_at(tmp_path / "store")
    settings = PackSettings(SEQ_LEN, WINDOW)
    opened = DocumentStore.open(store)
    index = build_pack_index(opened, settings.key(opened.num_documents, opened.num_tokens))
    path = tmp_path / "store" / INDEX_DIRECTORY / settings.file_name
    save_pack_index(index, path)  # no store= recorded
    with pytest.raises(ValueError, match=r"records no store \(it was saved without store=, so "
                       r"nothing tells it was built for .* as it is now\); build it again with "
                       rf"`psdp index {store} --pack {SEQ_LEN},{WINDOW}`"):  # fmt: skip
        view_of(config(store))
    assert save_pack_index_beside(store, opened, index) == str(path)
    with no_build():
        assert view_of(config(store)).plan.starts.tolist() == index.starts.tolist()


def test_falling_offsets_of_a_levanter_cache_are_refused_naming_the_first_fall(tmp_path):
    """`psdp index` checks the cache's offsets with the one check every reader of offsets makes
    (`check_offsets_rise`): the error names the cache, the first document that falls, both
    values and the fix."""
    import tensorstore as ts

    from tests.levanter_cache import levanter_spec, write_levanter_cache

    docs = [{"input_ids": np.arange(1, 4 + i % 3, dtype=np.int64)} for i in range(40)]
    write_levanter_cache(tmp_path / "cache", docs)
    offsets = ts.open(levanter_spec({"driver": "file", "path": f"{tmp_path}/cache/input_ids/offsets/"})).result()  # fmt: skip
    ends = offsets[1:41].read().result()
    offsets[8].write(
        ends[9] + 5
    ).result()  # offsets[8] > offsets[9]: document 8 has a negative length
    with pytest.raises(ValueError) as error:
        indexes.build_indexes(str(tmp_path / "cache"), format="levanter", workers=1, progress=False)
    assert str(error.value) == (
        f"the offsets of the Levanter cache at {tmp_path}/cache must be non-decreasing, got "
        f"offsets[8]={int(ends[9]) + 5} > offsets[9]={int(ends[8])}; the cache is damaged: build "
        f"it again with Levanter"
    )


def test_parts_of_a_levanter_document_index_are_of_the_cache_they_were_built_for(
    tmp_path, monkeypatch
):
    """A killed build of a Levanter cache's document index leaves its parts; the cache built
    again in place, of the same documents, tokens and ledger (its documents in another order),
    builds its own index and never resumes from those parts (named by what the cache holds)."""
    from psdp.sources.documents.index import DocumentIndex
    from tests.levanter_cache import write_levanter_cache

    docs = [{"input_ids": d.astype(np.int64)} for d in documents(10_000)]
    cache = tmp_path / "cache"
    write_levanter_cache(cache, docs)
    monkeypatch.setattr(indexes, "DOCUMENTS_PER_OFFSETS_PART", 4096)  # 3 parts
    real = indexes.check_offsets_rise

    def killed_at_part_2(values, where, *, first=0, **options):
        if first == 8192:
            raise KeyboardInterrupt  # as a kill between two parts
        return real(values, where, first=first, **options)

    monkeypatch.setattr(indexes, "check_offsets_rise", killed_at_part_2)
    with pytest.raises(KeyboardInterrupt):
        indexes.build_indexes(str(cache), format="levanter", workers=1, progress=False)
    folder = cache / INDEX_DIRECTORY
    assert len(list(folder.glob(".build-documents-*/part-*.npz"))) == 2

    monkeypatch.setattr(indexes, "check_offsets_rise", real)
    write_levanter_cache(cache, docs[::-1])  # the same size and ledger, other offsets
    [record] = indexes.build_indexes(str(cache), format="levanter", workers=1, progress=False)
    assert record["state"] == "built"  # not "resumed": no part of the other cache mixed in
    write_levanter_cache(tmp_path / "fresh", docs[::-1])
    indexes.build_indexes(str(tmp_path / "fresh"), format="levanter", workers=1, progress=False)
    built, fresh = (DocumentIndex.load(path / INDEX_DIRECTORY / beside.DOCUMENT_INDEX)
                    for path in (cache, tmp_path / "fresh"))  # fmt: skip
    assert built.marks.tolist() == fresh.marks.tolist()
    assert built.nonempty.tolist() == fresh.nonempty.tolist()
    assert list(folder.glob(".build-documents-*")) == []
