"""A local document store read from memory maps of its shard files (`MappedShards`): every read
equals TensorStore's of the same store, a damaged chunk is refused, and a layout a map cannot
read (compressed chunks) is read through TensorStore as before."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
import tensorstore as ts

from psdp import DocumentStore, write_documents
from psdp.sources.documents import mapped
from psdp.sources.documents.format import join_stored, read_documents
from psdp.sources.documents.mapped import MappedShards
from psdp.sources.documents.store import join_documents


def corpus(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 60_000, n).astype(np.uint16) for n in rng.integers(1, 900, count)]


def random_ranges(rng, tokens, count, longest=3000):
    starts = rng.integers(0, tokens, count)
    stops = np.minimum(tokens, starts + rng.integers(0, longest, count))
    return starts, stops


@pytest.mark.parametrize("checksum", [True, False])
def test_mapped_reads_equal_the_written_tokens(tmp_path, checksum):
    docs = corpus(0, 300)
    # small chunks and shards: ranges cross chunk and shard ends, the last shard is short
    path = write_documents(tmp_path / "s", docs, tokens_per_chunk=256, tokens_per_shard=4096,
                           checksum=checksum, progress=False)  # fmt: skip
    store = DocumentStore.open(path)
    stored = read_documents(path)
    assert isinstance(stored.leaves["input_ids"], MappedShards)
    assert isinstance(stored.offsets, MappedShards)
    flat = np.concatenate(docs)
    rng = np.random.default_rng(1)
    for _ in range(20):
        starts, stops = random_ranges(rng, len(flat), 40)
        got = store.read_ranges(starts, stops)["input_ids"]
        want = np.concatenate([flat[a:b] for a, b in zip(starts, stops, strict=True)])
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.uint16
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    probes = rng.integers(0, len(offsets), (7, 5))
    np.testing.assert_array_equal(stored.offsets.take(probes), offsets[probes])
    probes = rng.integers(0, len(flat), (9, 11))  # one gather over many shards' chunks
    np.testing.assert_array_equal(stored.leaves["input_ids"].take(probes), flat[probes])
    assert stored.leaves["input_ids"].take(np.zeros((0, 3), np.int64)).shape == (0, 3)
    np.testing.assert_array_equal(store.offsets_range(0, len(offsets)), offsets)


def test_parts_read_back_to_back(tmp_path):
    parts = [corpus(seed, 40) for seed in range(3)]
    paths = [
        write_documents(
            tmp_path / f"p{i}", docs, tokens_per_chunk=256, tokens_per_shard=1024, progress=False
        )  # fmt: skip
        for i, docs in enumerate(parts)
    ]
    store = join_documents(paths, name="joined")
    assert not store.reads_storage  # tokens and offsets from memory maps
    offsets = np.concatenate([[0], np.cumsum([len(d) for docs in parts for d in docs])])
    np.testing.assert_array_equal(store.offsets_range(0, len(offsets)), offsets)
    np.testing.assert_array_equal(store.offsets_range(39, 43), offsets[39:43])  # a part's end
    flat = np.concatenate([d for docs in parts for d in docs])
    rng = np.random.default_rng(2)
    for _ in range(20):  # many ranges cross a part's end
        starts, stops = random_ranges(rng, len(flat), 30, longest=20_000)
        got = store.read_ranges(starts, stops)["input_ids"]
        want = np.concatenate([flat[a:b] for a, b in zip(starts, stops, strict=True)])
        np.testing.assert_array_equal(got, want)
    joined = join_stored(paths, name="joined").leaves["input_ids"]
    assert isinstance(joined, MappedShards)
    probes = rng.integers(0, len(flat), (5, 10))  # one gather from every part's shards
    np.testing.assert_array_equal(joined.take(probes), flat[probes])


def test_a_damaged_chunk_is_refused_on_first_read(tmp_path):
    path = write_documents(tmp_path / "s", corpus(3, 50), tokens_per_chunk=256,
                           tokens_per_shard=4096, progress=False)  # fmt: skip
    shard = path / "tokens" / "input_ids" / "c" / "1"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF  # a value of shard 1's first chunk; its checksum no longer matches
    shard.write_bytes(bytes(data))
    store = DocumentStore.open(path)
    store.read_ranges([0], [100])  # shard 0: fine
    with pytest.raises(ValueError, match="damaged"):
        store.read_ranges([4096], [4100])


def test_a_damaged_stored_checksum_is_refused_with_both_values(tmp_path):
    docs = corpus(3, 50)
    path = write_documents(tmp_path / "s", docs, tokens_per_chunk=256,
                           tokens_per_shard=4096, progress=False)  # fmt: skip
    flat = np.concatenate(docs)
    last = (len(flat) - 1) // 256  # the part's last chunk, in the last shard
    shard = path / "tokens" / "input_ids" / "c" / str(last // 16)
    data = bytearray(shard.read_bytes())
    at = last % 16 * (512 + 4)  # the chunk's 256 uint16, then its crc32c
    computed = mapped._crc32c(np.frombuffer(bytes(data[at : at + 512]), np.uint8))
    data[at + 512] ^= 0x01  # the stored checksum, not the values
    shard.write_bytes(bytes(data))
    tokens = read_documents(path).leaves["input_ids"]
    np.testing.assert_array_equal(tokens.read_ranges(np.array([0]), np.array([9])), flat[:9])
    stored = computed ^ 0x01
    with pytest.raises(ValueError, match=rf"chunk {last % 16} of shard {last // 16} .* \(stored "
                       rf"{stored:#010x}, computed {computed:#010x}\).*rewrite"):  # fmt: skip
        tokens.read_ranges(np.array([10, len(flat) - 3]), np.array([20, len(flat)]))


def test_a_short_last_chunk_is_read_and_checked(tmp_path):
    # another tool may store the array's last chunk short (only its values, then the checksum)
    flat = np.arange(4096 + 10, dtype=np.uint16)
    path = write_documents(tmp_path / "s", [flat], tokens_per_chunk=256, tokens_per_shard=4096,
                           progress=False)  # fmt: skip
    shard = path / "tokens" / "input_ids" / "c" / "1"
    values = shard.read_bytes()[:20]  # the 10 values of the shard's one chunk
    crc = lambda b: mapped._crc32c(np.frombuffer(b, np.uint8)).to_bytes(4, "little")  # noqa: E731
    table = np.full((16, 2), 2**64 - 1, "<u8")
    table[0] = 0, 24
    shard.write_bytes(values + crc(values) + table.tobytes() + crc(table.tobytes()))
    tokens = read_documents(path).leaves["input_ids"]
    probes = np.array([4100, 3, 4105, 4096])  # no whole row of 256 over the short chunk's map
    np.testing.assert_array_equal(tokens.take(probes), flat[probes])
    got = tokens.read_ranges(np.array([4090, 4100]), np.array([4106, 4103]))
    np.testing.assert_array_equal(got, flat[np.r_[4090:4106, 4100:4103]])
    shard.write_bytes(values[:-1] + b"\xff" + crc(values) + table.tobytes() + crc(table.tobytes()))
    with pytest.raises(ValueError, match="chunk 0 of shard 1 .* damaged"):
        read_documents(path).leaves["input_ids"].take(np.array([4105]))


def test_compressed_chunks_are_read_through_tensorstore(tmp_path):
    docs = corpus(4, 50)
    path = write_documents(tmp_path / "s", docs, compression="zstd", progress=False)
    stored = read_documents(path)
    assert isinstance(stored.leaves["input_ids"], ts.TensorStore)
    store = DocumentStore.open(path)
    np.testing.assert_array_equal(
        store.read_ranges([5, 0], [9, 3])["input_ids"],
        np.concatenate(docs)[np.r_[5:9, 0:3]],
    )


class CountingCrc:
    """google_crc32c counting the bytes it checks: a checksum per chunk a read touches."""

    def __init__(self, real):
        self.real, self.sizes = real, []

    def value(self, data):
        self.sizes.append(len(data))
        return self.real.value(data)


def test_only_the_chunks_a_read_touches_are_read_and_checked(tmp_path, monkeypatch):
    path = write_documents(tmp_path / "s", corpus(3, 50), tokens_per_chunk=256,
                           tokens_per_shard=4096, progress=False)  # fmt: skip
    shard = path / "tokens" / "input_ids" / "c" / "1"
    data = bytearray(shard.read_bytes())
    data[3 * (512 + 4) + 10] ^= 0xFF  # chunk 3 of shard 1 (256 uint16 and a crc32c each)
    shard.write_bytes(bytes(data))
    flat = np.concatenate(corpus(3, 50))
    counting = CountingCrc(mapped.google_crc32c)
    monkeypatch.setattr(mapped, "google_crc32c", counting)
    tokens = read_documents(path).leaves["input_ids"]
    # chunks 0 and 2 of shard 1, and chunk 4 by a probe: a whole-shard read would meet chunk 3
    got = tokens.read_ranges(np.array([4096, 4096 + 600]), np.array([4100, 4096 + 700]))
    np.testing.assert_array_equal(got, flat[np.r_[4096:4100, 4696:4796]])
    assert tokens.take(np.array([4096 + 4 * 256 + 1])).tolist() == [flat[4096 + 1025]]
    # shard 1's index (16 entries of 16 bytes), then chunks 0, 2 and 4 (each with its 4-byte
    # checksum): each checked once
    assert counting.sizes == [256, 516, 516, 516]
    tokens.read_ranges(np.array([4096]), np.array([4096 + 256]))
    assert counting.sizes == [256, 516, 516, 516]
    with pytest.raises(ValueError, match=r"chunk 3 of shard 1 of .*input_ids.* damaged.*rewrite"):
        tokens.read_ranges(np.array([4096 + 3 * 256 + 5]), np.array([4096 + 3 * 256 + 6]))
    with pytest.raises(ValueError, match="chunk 3 of shard 1"):  # refused again, never returned
        tokens.take(np.array([4096 + 3 * 256]))


def test_a_damaged_shard_index_is_refused(tmp_path):
    path = write_documents(tmp_path / "s", corpus(3, 50), tokens_per_chunk=256,
                           tokens_per_shard=4096, progress=False)  # fmt: skip
    shard = path / "tokens" / "input_ids" / "c" / "0"
    data = bytearray(shard.read_bytes())
    data[-4 - 16 + 8] ^= 0x01  # the size of the index's last chunk entry
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"index of shard file .*/c/0 .* crc32c .* damaged"):
        DocumentStore.open(path).read_ranges([0], [10])


def test_without_checksums_chunks_are_read_unchecked(tmp_path, monkeypatch):
    docs = corpus(5, 50)
    path = write_documents(tmp_path / "s", docs, tokens_per_chunk=256, tokens_per_shard=4096,
                           checksum=False, progress=False)  # fmt: skip
    counting = CountingCrc(mapped.google_crc32c)
    monkeypatch.setattr(mapped, "google_crc32c", counting)
    store = DocumentStore.open(path)
    got = store.read_ranges([0, 5000], [300, 9000])["input_ids"]
    np.testing.assert_array_equal(got, np.concatenate(docs)[np.r_[0:300, 5000:9000]])
    # only the shard indexes' checksums (offsets' one shard, input_ids' shards 0 to 2), which
    # a store without chunk checksums still writes; no chunk (512 bytes) checked
    assert sorted(counting.sizes) == [16, 256, 256, 256]


def mapped_files(directory) -> list[str]:
    """The files under ``directory`` that this process maps now (Linux's /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return [line.split()[-1] for line in maps if f"{directory}/" in line]


def open_files(directory) -> list[str]:
    """The files under ``directory`` that this process holds a descriptor of now."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            target = os.readlink(f"/proc/self/fd/{fd}")
            found += [target] if target.startswith(f"{directory}/") else []
    return found


@pytest.mark.parametrize("checksum", [True, False])
def test_a_process_maps_at_most_the_limits_shard_files(tmp_path, monkeypatch, checksum):
    """Each map is one of the process's memory areas, which Linux caps (vm.max_map_count): past
    `MAPS.limit` the oldest maps are let go, and reads that need them again map them again,
    every value still exact and checked."""
    monkeypatch.setattr(mapped, "MAPS", mapped.MapLimit(3))
    docs = corpus(2, 300)  # ~135,000 tokens: 33 shards of ids, each read below
    path = write_documents(tmp_path / "s", docs, tokens_per_chunk=256, tokens_per_shard=4096,
                           checksum=checksum, progress=False)  # fmt: skip
    store = DocumentStore.open(path)
    flat = np.concatenate(docs)
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(3):  # every shard read, let go, and read again
        for first in range(0, len(flat), 4096):
            starts = np.array([first, *rng.integers(0, len(flat), 3)])
            stops = np.minimum(len(flat), starts + 300)
            got = store.read_ranges(starts, stops)["input_ids"]
            want = np.concatenate([flat[a:b] for a, b in zip(starts, stops, strict=True)])
            np.testing.assert_array_equal(got, want)
            held = mapped_files(tmp_path / "s")
            seen.update(held)
            assert len(held) <= 3, held
            # a descriptor per map before Python 3.13, none after
            assert len(open_files(tmp_path / "s")) <= (3 if mapped.HOLDS_DESCRIPTOR else 0)
    assert len([name for name in seen if "/input_ids/" in name]) == -(-len(flat) // 4096)
    probes = rng.integers(0, len(flat), (9, 11))  # a gather over many shards, maps let go
    np.testing.assert_array_equal(read_documents(path).leaves["input_ids"].take(probes),
                                  flat[probes])  # fmt: skip


def test_the_map_limit_leaves_most_descriptors_to_others(monkeypatch):
    """Where each map holds a file descriptor, a process maps at most a quarter of its open-file
    limit (at least 16); else, and never more than, 8,192."""
    monkeypatch.setattr(mapped.resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(mapped, "HOLDS_DESCRIPTOR", True)
    assert mapped.map_limit() == 256
    monkeypatch.setattr(mapped.resource, "getrlimit", lambda _: (40, 4096))
    assert mapped.map_limit() == 16
    monkeypatch.setattr(mapped.resource, "getrlimit", lambda _: (10**6, 10**6))
    assert mapped.map_limit() == 8192
    monkeypatch.setattr(mapped, "HOLDS_DESCRIPTOR", False)
    monkeypatch.setattr(mapped.resource, "getrlimit", lambda _: (1024, 4096))
    assert mapped.map_limit() == 8192
    with pytest.raises(ValueError, match="at least 1, not 0"):
        mapped.MapLimit(0)


def test_a_shard_mapped_again_is_checked_again(tmp_path, monkeypatch):
    """What a process remembers of its checks goes with the shard's map: a chunk damaged on disk
    after its shard was let go (`MAPS`) is refused when a read maps the shard again, never
    returned as checked; the same read of a healthy chunk is checked once per map."""
    monkeypatch.setattr(mapped, "MAPS", mapped.MapLimit(1))
    flat = np.arange(3 * 4096, dtype=np.uint16)
    path = write_documents(tmp_path / "s", [flat], tokens_per_chunk=256, tokens_per_shard=4096,
                           progress=False)  # fmt: skip
    counting = CountingCrc(mapped.google_crc32c)
    monkeypatch.setattr(mapped, "google_crc32c", counting)
    tokens = read_documents(path).leaves["input_ids"]
    for _ in range(2):  # shard 0's chunks 0 and 1, then shard 2's chunk 0, which lets shard 0 go
        np.testing.assert_array_equal(tokens.read_ranges(np.array([10]), np.array([300])),
                                      flat[10:300])  # fmt: skip
        np.testing.assert_array_equal(tokens.take(np.array([8200])), flat[[8200]])
    # each time: shard 0's index and its 2 chunks, then shard 2's index and its chunk
    assert counting.sizes == [256, 516, 516, 256, 516] * 2
    shard = path / "tokens" / "input_ids" / "c" / "0"
    with shard.open("r+b") as file:  # shard 0 is not mapped now: damaged in place on disk
        file.seek(5 * 2)
        file.write(b"\xff\xff")
    with pytest.raises(ValueError, match="chunk 0 of shard 0 .* damaged"):
        tokens.read_ranges(np.array([4]), np.array([6]))


def test_what_a_process_remembers_of_its_checks_does_not_grow_with_the_store():
    """Opening a leaf of 10^12 tokens allocates nothing per chunk (a flag a chunk of the whole
    store was 244 MB): its checks are remembered per shard mapped, at most `MAPS.limit`."""
    import tracemalloc
    from pathlib import Path
    from types import SimpleNamespace

    part = mapped.Part(Path("/nonexistent"), SimpleNamespace(shape=(10**12,)), per_chunk=4096,
                       per_shard=2**20, checksum=True, index_checksum=True)  # fmt: skip
    tracemalloc.start()
    try:
        leaf = MappedShards([part] * 4, np.uint32, "a store of 4 x 10^12 tokens")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(leaf) == 4 * 10**12
    assert peak < 2**16, peak


@pytest.mark.parametrize("read", ["read_ranges", "take"])
def test_a_read_over_several_shards_checks_each_shards_own_chunks(tmp_path, read):
    """Chunk 3 of shard 0 checked says nothing of chunk 3 of shard 1: one read over both refuses
    the damaged one."""
    flat = np.arange(3 * 4096, dtype=np.uint16)
    path = write_documents(tmp_path / "s", [flat], tokens_per_chunk=256, tokens_per_shard=4096,
                           progress=False)  # fmt: skip
    shard = path / "tokens" / "input_ids" / "c" / "1"
    with shard.open("r+b") as file:  # chunk 3 of shard 1: 256 uint16, then its crc32c
        file.seek(3 * (512 + 4) + 10)
        file.write(b"\xff")
    tokens = read_documents(path).leaves["input_ids"]
    first = 3 * 256 + 7  # in chunk 3 of shard 0: checked by this read
    np.testing.assert_array_equal(tokens.read_ranges(np.array([first]), np.array([first + 2])),
                                  flat[first : first + 2])  # fmt: skip
    both = np.array([first, 4096 + first, 8192 + 5])
    with pytest.raises(ValueError, match="chunk 3 of shard 1 .* damaged"):
        if read == "take":
            tokens.take(both)
        else:
            tokens.read_ranges(both, both + 2)
