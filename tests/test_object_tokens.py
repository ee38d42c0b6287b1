"""The token path from an object store, counted: requests per step bounded by the chunks the
step's rows touch (moto's S3 on 127.0.0.1 behind a counting `FaultProxy`), and the loader's
read threads grown from measured read times (`Prefetcher.adapt`, fed exact numbers). Nothing
here asserts a time."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorstore as ts

from psdp import DataLoader, DocumentStore, Mixture, PackedSequences, TokenSequences
from psdp._runtime.prefetch import Prefetcher, steps_in_flight
from psdp.sources.documents.writer import write_documents
from psdp.tools.benchmarks.object_store import FaultProxy, S3Server
from psdp.tools.benchmarks.object_tokens import chunk_runs, touched_chunks

SEQ = 512
BATCH = 8
SHARD = 1 << 16  # tokens per shard file of the stores: rows touch several shards


@pytest.fixture(scope="module")
def server():
    with S3Server() as s3:
        rng = np.random.default_rng(0)
        for name, count in (("a", 600), ("b", 300)):
            lengths = rng.integers(1, 2000, count)
            docs = [rng.integers(0, 60_000, n).astype(np.uint16) for n in lengths]
            write_documents(s3.kvstore(f"{name}/"), docs, tokens_per_shard=SHARD,
                            progress=False)  # fmt: skip
        yield s3


@pytest.fixture
def proxy(server):
    with FaultProxy(server.endpoint) as p:
        yield p


def counted_steps(loader, stores, proxy, steps):
    """Per step after step 0: the requests at the proxy, and their bound: the runs of chunks
    its token ranges touched, plus the shards touched for the first time (whose index is read
    once)."""
    runs: list[int] = []
    seen: set[tuple[int, int]] = set()
    new: set[tuple[int, int]] = set()
    for number, store in enumerate(stores):
        read = store.read_ranges

        def recorded(starts, stops, leaves=None, read=read, number=number):
            runs.append(chunk_runs([0], starts, stops, SHARD))
            shards = {(number, shard) for _, shard, _ in touched_chunks([0], starts, stops, SHARD)}
            new.update(shards - seen)
            seen.update(shards)
            return read(starts, stops, leaves)

        store.read_ranges = recorded
    loader.batch_at(0)  # opens connections, reads the offsets it needs
    out = []
    for step in range(1, steps + 1):
        proxy.reset()
        runs.clear()
        new.clear()
        loader.batch_at(step)
        out.append((sum(proxy.requests.values()), sum(runs) + len(new)))
    return out


def open_store(server, proxy, name, **options):
    return DocumentStore.open(server.kvstore(f"{name}/", proxy.endpoint), **options)


@pytest.mark.parametrize("job", ["sequences", "packed mixture"])
def test_requests_per_step_are_bounded_by_the_chunk_runs_touched(server, proxy, job, mesh_1d):
    if job == "sequences":
        stores = [open_store(server, proxy, "a")]
        view = TokenSequences(stores[0], SEQ)
        options = {"seed": 3}
    else:
        stores = [open_store(server, proxy, name) for name in "ab"]
        packed = {n: PackedSequences(s, SEQ) for n, s in zip("ab", stores, strict=True)}
        view, options = Mixture(packed, weights={"a": 3, "b": 1}, block_size=BATCH, seed=3), {}
    with DataLoader(view, mesh=mesh_1d, global_batch_size=BATCH, **options) as loader:
        counts = counted_steps(loader, stores, proxy, steps=6)
    assert all(bound > 0 for _, bound in counts), counts
    # the offsets came with step 0 and the store's cache keeps them and each shard index read:
    # a step costs at most one request per run of chunks its rows touch, plus one per shard
    # it is the first to touch
    assert all(requests <= bound for requests, bound in counts), counts


def test_without_the_cache_each_read_also_fetches_shard_indexes(server, proxy, mesh_1d):
    store = open_store(server, proxy, "a", context=ts.Context())  # no cache pool
    with DataLoader(TokenSequences(store, SEQ), mesh=mesh_1d, global_batch_size=BATCH,
                    seed=3) as loader:  # fmt: skip
        counts = counted_steps(loader, [store], proxy, steps=3)
    assert all(requests > bound for requests, bound in counts), counts


def test_read_threads_grow_to_cover_the_measured_reads_and_stop_when_it_does_not_help():
    with Prefetcher(lambda s: s, start=0, depth=2, name="t", read_threads=4,
                    max_read_threads=32) as items:  # fmt: skip
        assert items.adapt(step_s=0.2, rate=1.0) == 4  # nothing timed yet: as it was
        for _ in range(8):
            items.record_read(1.0, 0.01)  # 1 s reads (10 ms of CPU): 100 ms round trips
        assert items.adapt(step_s=0.2, rate=1.0) == steps_in_flight(1.0, 0.01, 0.2) == 6
        for _ in range(8):
            items.record_read(1.0, 0.01)
        assert items.adapt(step_s=0.0, rate=2.0) == 12  # at most doubled at once
        for _ in range(8):
            items.record_read(1.0, 0.01)
        assert items.adapt(step_s=0.0, rate=2.1) == 12  # 5% more steps/s: growth stops
        assert items.max_read_threads == 12
        for _ in range(8):
            items.record_read(5.0, 0.01)
        assert items.adapt(step_s=0.0, rate=9.0) == 12
        assert [next(items) for _ in range(3)] == [0, 1, 2]


def test_the_first_growth_follows_the_first_wait_not_a_window_of_steps():
    # cold first reads are the slowest: a consumer that waits at its second step gets more
    # threads at once, not after TIMED_READS steps (step 1 is held until the consumer waits)
    released = threading.Event()

    def produce(step):
        if step == 1:
            released.wait(30)
        return step

    with Prefetcher(produce, start=0, depth=2, name="t", read_threads=2,
                    max_read_threads=32) as items:  # fmt: skip
        assert next(items) == 0  # its read was timed before it was handed out
        threading.Timer(0.05, released.set).start()
        assert next(items) == 1  # waited: step 1 was held
        assert items.read_threads == 4  # doubled, by steps_in_flight of the timed reads
        assert [next(items) for _ in range(3)] == [2, 3, 4]


def test_fixed_read_threads_never_grow():
    with Prefetcher(lambda s: s, start=0, depth=2, name="t", read_threads=2) as items:
        for _ in range(8):
            items.record_read(1.0, 0.0)
        assert items.adapt(step_s=0.0, rate=1.0) == 2


def test_a_loader_grows_only_when_read_threads_is_unset(server, proxy, mesh_1d):
    store = open_store(server, proxy, "a")
    for requested, limit in ((None, 32), (4, None)):
        view = TokenSequences(store, SEQ)
        with (
            DataLoader(view, mesh=mesh_1d, global_batch_size=BATCH, seed=3,
                       read_threads=requested) as loader,
            loader.iter_from(0) as it,
        ):  # fmt: skip
            assert (it.read_threads, it.max_read_threads) == (4, limit)


def test_a_parted_stores_offsets_ranges_are_read_in_one_round_trip(server, proxy):
    """The offsets of a remote ``psdp prepare`` store (`PartedOffsets`) are read one range per
    run of blocks that a read's rows touch (`DocumentStore.documents_touching`); every range's
    request goes out before any answer comes: the second range's reaches the proxy while the
    first one's is held there (read one after the other, each range cost a round trip of its
    own, and the second never would)."""
    from psdp.sources.documents.index import build_index
    from psdp.sources.documents.parts import PartedOffsets

    parts = []
    for number in range(2):  # two parts of 19 documents of 3 tokens: 20 offsets, chunks of 8
        spec = {"driver": "zarr3", "kvstore": server.kvstore(f"parted-offsets-{number}/")}
        written = ts.open(spec, create=True, delete_existing=True, dtype=ts.int64, shape=[20],
                          chunk_layout=ts.ChunkLayout(chunk_shape=[8])).result()  # fmt: skip
        written.write(np.arange(20, dtype=np.int64) * 3).result()
        through = {**spec, "kvstore": server.kvstore(f"parted-offsets-{number}/", proxy.endpoint)}
        parts.append(ts.open(through, read=True, context=ts.Context()).result())  # no cache
    offsets = PartedOffsets(parts)
    whole = offsets[0:39]  # a DocumentIndex of 4 documents a block: far ranges, two runs
    index = build_index(lambda a, b: whole[a[0] : b[0]], 38, stride=4, name="p", progress=False)
    store = DocumentStore.from_arrays(offsets, {"input_ids": np.zeros(114, np.uint16)},
                                      index=index)  # fmt: skip
    first = proxy.hold("GET", "parted-offsets-0/c/0")  # blocks 0 and 7: two ranges
    second = proxy.hold("GET", "parted-offsets-1/c/1")
    got: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: got.setdefault("touched", store.documents_touching([6, 90], [9, 93]))
    )
    thread.start()
    try:
        assert first.reached.wait(60), "the first range's read never came"
        assert second.reached.wait(30), "the second range waited for the first one's answer"
    finally:
        first.release()
        second.release()
        thread.join(60)
    touched = got["touched"]
    assert touched.doc.tolist() == [2, 30] and touched.start.tolist() == [6, 90]
