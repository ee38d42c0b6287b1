"""`MappedShards`: the flat arrays of a document store on local disk, read from memory maps of
their shard files instead of through TensorStore (``docs/measurements/token-path.md``, "Local
stores").

A read through TensorStore costs ~0.1 ms a range (a file read, a checksum, a decode and a copy
per chunk, each handed to its threads), 15x a memmap's slice. The format is the same: each
array is a zarr3 ``sharding_indexed`` array of uncompressed chunks (``bytes``, then a
``crc32c`` checksum by default), so a chunk is its little-endian values at the offset its
shard's index gives. Nothing unverified is returned, and a host reads only what its rows
touch: a shard's index (the bytes at the file's end) is checked against its checksum and the
layout when a read maps the shard, and each chunk's crc32c (``google-crc32c``) when a read first
touches the chunk since its shard was mapped, before any of its bytes are copied. A store written with
``checksum=False`` has no checksum to check: its chunks are read unchecked, as a memmap's
would be. A store whose layout differs (compressed, other chunks) is read through TensorStore
as before.

Each map is one of the process's memory areas, which Linux caps (``vm.max_map_count``, 65,530
by default), and before Python 3.13 holds a file descriptor (``ulimit -n``, often 1,024): a
process holds at most `MAPS.limit` shard files mapped (`map_limit`), all stores together, and
lets the oldest go first (a read maps it again when it needs it, and checks it again). Without
the bound, a run failed once its reads had touched as many shard files as its descriptors
allowed (measured: at 19,993 of 70,000 shards under a limit of 20,000 descriptors), 2^20 tokens
each by default. What a process remembers of its checks lives with the maps, so its memory is
bounded by `MAPS.limit` too, whatever the store's size (a flag a chunk of the whole store was
244 MB a leaf at 10^12 tokens).
"""

from __future__ import annotations

import mmap
import os
import resource
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import google_crc32c
import numpy as np


def _crc32c(data: np.ndarray) -> int:
    """The CRC-32C (Castagnoli) of the bytes ``data``, as zarr3's ``crc32c`` codec stores it
    (little-endian, in the 4 bytes after them)."""
    return int(google_crc32c.value(data))


#: The CRC-32C of any bytes followed by their own CRC-32C (little-endian): a chunk and its
#: stored checksum agree if and only if the checksum of both is this constant (a property of
#: the CRC), so a check is one call over the chunk's bytes and the 4 after them.
CHECKED = 0x48674BC7


class MapLimit:
    """The shard files mapped in this process, oldest first, all `MappedShards` together: past
    ``limit``, the oldest are let go (their maps close once no read holds them).

    Examples:
        >>> limit = MapLimit(2)
        >>> class Owner:
        ...     def release(self, key):
        ...         print("released", key)
        >>> owner = Owner()
        >>> for key in range(3):
        ...     limit.admit(owner, key)
        released 0
    """

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"a map limit must be at least 1, not {limit}")
        self.limit = limit
        self._held: OrderedDict[tuple[Any, Any], None] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, owner: Any, key: Any) -> None:
        """Count ``owner``'s new map ``key``; let the oldest go (``owner.release(key)`` of each,
        outside this lock) while more than ``limit`` are held."""
        with self._lock:
            self._held[(weakref.ref(owner), key)] = None
            let_go = []
            while len(self._held) > self.limit:
                (ref, old), _ = self._held.popitem(last=False)
                let_go.append((ref(), old))
        for held_by, old in let_go:
            if held_by is not None:  # else its owner is gone, and its maps with it
                held_by.release(old)


#: Python's mmap before 3.13 holds a duplicate of the mapped file's descriptor while it is open.
HOLDS_DESCRIPTOR = sys.version_info < (3, 13)


def map_limit() -> int:
    """Shard files a process may keep mapped: 8,192 of the 65,530 memory areas Linux allows a
    process by default (``vm.max_map_count``), the rest left to Python, jax and the others;
    where each map holds a file descriptor (`HOLDS_DESCRIPTOR`), at most a quarter of the
    process's open-file limit (``ulimit -n``, often 1,024), the rest left to sockets and files.

    Examples:
        >>> 16 <= map_limit() <= 8192
        True
    """
    limit = 8192
    if HOLDS_DESCRIPTOR:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, max(16, soft // 4))
    return limit


#: The shard files mapped in this process (`map_limit`, read when psdp is imported).
MAPS = MapLimit(map_limit())


def _map(file: Any) -> mmap.mmap:
    """A read-only map of the whole open ``file``, holding no descriptor where Python allows."""
    if sys.version_info >= (3, 13):  # `HOLDS_DESCRIPTOR` is False
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ, trackfd=False)
    return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


class Mapped(NamedTuple):
    """A shard file mapped: its bytes, the byte offset of each of its chunks and the bytes each
    is stored in (its checksum's included: a part's last chunk may be short), its values as rows
    of a chunk (a row's stride steps over the checksum; ``None`` where a short last chunk leaves
    too few bytes for a whole row), and which of its chunks were checked since it was mapped."""

    data: np.ndarray
    offsets: np.ndarray
    sizes: list[int]
    rows: np.ndarray | None
    checked: np.ndarray


#: One slot: the shard of a read that touches one shard (`MappedShards._verify`).
ONE_SHARD = np.zeros(1, np.intp)


@dataclass(frozen=True)
class Part:
    """One zarr3 array of the joined array: its directory, its TensorStore array (its length),
    and its layout."""

    directory: Path
    array: Any
    per_chunk: int
    per_shard: int
    checksum: bool
    index_checksum: bool


def layout_of(array: Any) -> tuple[int, int, bool, bool] | None:
    """``(per_chunk, per_shard, checksum, index_checksum)`` of a 1-D zarr3 TensorStore array
    whose chunks can be read from a memory map (sharded, uncompressed, little-endian, chunks and
    index checksummed or not, index at the end); ``None`` for any other.

    Examples:
        >>> import tempfile, tensorstore as ts
        >>> tmp = tempfile.TemporaryDirectory()
        >>> codecs = [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4],
        ...     "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
        ...                {"name": "crc32c"}]}}]
        >>> array = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": tmp.name},
        ...     "metadata": {"shape": [20], "chunk_grid": {"name": "regular", "configuration":
        ...     {"chunk_shape": [16]}}, "data_type": "int32", "codecs": codecs}},
        ...     create=True).result()
        >>> layout_of(array)
        (4, 16, True, True)
        >>> tmp.cleanup()
    """
    spec = array.spec().to_json()
    meta = spec.get("metadata", {})
    codecs = meta.get("codecs", [])
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed" or array.rank != 1:
        return None
    config = codecs[0].get("configuration", {})
    inner = [c.get("name") for c in config.get("codecs", [])]
    index = [c.get("name") for c in config.get("index_codecs", [])]
    little = all(
        c.get("configuration", {}).get("endian", "little") == "little"
        for c in config.get("codecs", [])
        if c.get("name") == "bytes"
    )
    if (
        inner not in (["bytes"], ["bytes", "crc32c"])
        or index not in (["bytes"], ["bytes", "crc32c"])
        or config.get("index_location", "end") != "end"
        or not little
    ):
        return None
    per_chunk = int(config["chunk_shape"][0])
    per_shard = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
    return per_chunk, per_shard, inner == ["bytes", "crc32c"], index == ["bytes", "crc32c"]


class MappedShards:
    """Parts (zarr3 arrays of one dtype, each a `Part`) back to back as one flat array, read from
    memory maps of their shard files; a `FlatArray` with ``take`` (gathers) and `read_ranges`.

    Thread-safe: the loader's read threads share it.
    """

    #: Read like memory (copies from the page cache, holding the GIL): a loader reads it with
    #: one thread by default, as a memmap (`DocumentStore.reads_storage`).
    reads_storage = False

    def __init__(self, parts: Sequence[Part], dtype: Any, where: str):
        self.parts = list(parts)
        self.dtype = np.dtype(dtype)  # little-endian on disk: only mapped on such a machine
        self._where = where
        lengths = [int(p.array.shape[0]) for p in self.parts]
        self._starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        self.shape = (int(self._starts[-1]),)
        # the shards mapped now (at most `MAPS.limit` in the process), each with its checks
        self._shards: dict[tuple[int, int], Mapped] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict[str, Any]:
        # a copy in another process (Grain's worker processes pickle their data source) maps
        # and checks the shards itself: the maps are this process's, and copying them would
        # copy the shards' bytes
        state = dict(self.__dict__)
        for own in ("_shards", "_lock"):
            del state[own]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shards, self._lock = {}, threading.Lock()

    def _shard(self, part: int, shard: int) -> Mapped:
        """A shard file, mapped; when it is mapped, its index (the bytes at the file's end, not
        the shard) is checked against its checksum and the layout. Its chunks are checked one
        by one (`_verify`)."""
        key = (part, shard)
        found = self._shards.get(key)
        if found is not None:
            return found
        p = self.parts[part]
        length = int(p.array.shape[0])
        first, stop = shard * p.per_shard, min((shard + 1) * p.per_shard, length)
        chunks = -(-(stop - first) // p.per_chunk)
        index_bytes = p.per_shard // p.per_chunk * 16 + 4 * p.index_checksum
        shard_file = p.directory / "c" / str(shard)
        where = f"shard file {shard_file} of {self._where}"
        if not shard_file.is_file():
            raise ValueError(
                f"{where} is missing; the store is damaged or incomplete: rewrite it with "
                "write_documents"
            )
        with open(shard_file, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < index_bytes:
                raise ValueError(
                    f"{where} has {size} bytes, fewer than its index's {index_bytes}; the store "
                    "is damaged (a file cut short): rewrite it with write_documents"
                )
            # a plain array over the map (np.memmap costs ~0.25 ms to open, and makes a memmap
            # object per slice); the array holds the map open after the file is closed
            data = np.frombuffer(_map(file), np.uint8)
        index = data[len(data) - index_bytes :]
        table_bytes = index[: index_bytes - 4 * p.index_checksum]
        if p.index_checksum and _crc32c(table_bytes) != int(index[-4:].view("<u4")[0]):
            raise ValueError(
                f"the index of {where} fails its crc32c checksum; the store is damaged: rewrite "
                "it with write_documents"
            )
        table = table_bytes.view("<u8").reshape(-1, 2)
        size = p.per_chunk * self.dtype.itemsize
        offsets, nbytes = table[:chunks, 0], table[:chunks, 1]
        stride = size + 4 * p.checksum  # chunk k at k * stride: what psdp's writer writes
        last = (stop - first) - (chunks - 1) * p.per_chunk  # the last chunk may hold fewer
        regular = np.array_equal(offsets, np.arange(chunks, dtype=np.uint64) * np.uint64(stride))
        if (
            not regular
            or not np.array_equal(nbytes[:-1], np.full(chunks - 1, stride))
            or (int(nbytes[-1]) not in (stride, last * self.dtype.itemsize + 4 * p.checksum))
            or int(offsets[-1]) + int(nbytes[-1]) > len(data) - index_bytes
        ):
            raise ValueError(
                f"{where} does not have the layout psdp writes (uncompressed chunks of equal "
                "size, in order); the store is damaged or was written by another tool: rewrite "
                "it with write_documents"
            )
        item = self.dtype.itemsize
        rows = None
        if (chunks - 1) * stride + p.per_chunk * item <= len(data):
            rows = np.ndarray((chunks, p.per_chunk), self.dtype, data, 0, (stride, item))
        sizes = nbytes.astype(np.int64).tolist()
        mapped = Mapped(data, offsets.astype(np.int64), sizes, rows, np.zeros(chunks, bool))
        with self._lock:
            found = self._shards.setdefault(key, mapped)
        if found is mapped:  # mapped here, not by another thread meanwhile: counted
            MAPS.admit(self, key)
        return found

    def release(self, key: tuple[int, int]) -> None:
        """Let the map of shard ``key`` go (`MAPS`), and what was checked of it; a read holding
        it keeps it open until it ends, and a later read maps the shard again and checks it."""
        with self._lock:
            self._shards.pop(key, None)

    def _verify(
        self, part: int, shards: list[int], maps: list[Mapped], slot: np.ndarray, k: np.ndarray
    ) -> None:
        """Check the crc32c of chunk ``k[i]`` of the part's shard ``shards[slot[i]]`` (mapped as
        ``maps[slot[i]]``), for each ``i`` not checked since that map was made; raise before any
        of a damaged chunk's bytes are read."""
        p = self.parts[part]
        if not p.checksum:  # no checksum written: read as a memmap reads, unchecked
            return
        per_shard = p.per_shard // p.per_chunk
        if len(maps) == 1:
            fresh = np.flatnonzero(~maps[0].checked[k])
        else:  # the shards' flags back to back: every shard is whole but a part's last, the
            # last of ``shards`` (they are in order), so chunk k of slot s is at s * per_shard + k
            flags = np.concatenate([m.checked for m in maps])
            fresh = np.flatnonzero(~flags[slot * per_shard + k])
        if not len(fresh):
            return
        # each chunk once (a read may touch one several times), in order
        _, first = np.unique(slot[fresh] * per_shard + k[fresh], return_index=True)
        # chunk k of a shard is at byte k * stride, in the bytes its index gives: the chunk and
        # its checksum (the layout checked when the shard was mapped)
        stride = p.per_chunk * self.dtype.itemsize + 4
        todo = fresh[first]
        chunks = list(zip(slot[todo].tolist(), k[todo].tolist(), strict=True))
        spans = [(c * stride, c * stride + maps[s].sizes[c]) for s, c in chunks]
        # one call a chunk over its bytes and its stored checksum, whose crc32c is a constant
        # if and only if they agree (`CHECKED`): no Python per chunk but the slice and the call
        got = [
            google_crc32c.value(maps[s].data[a:b])
            for (s, _), (a, b) in zip(chunks, spans, strict=True)
        ]
        bad = np.flatnonzero(np.array(got) != CHECKED)
        if len(bad):
            first_bad = int(bad[0])
            (s, chunk), (a, b) = chunks[first_bad], spans[first_bad]
            data = maps[s].data
            stored = int.from_bytes(data[b - 4 : b].tobytes(), "little")
            computed = _crc32c(data[a : b - 4])
            raise ValueError(
                f"chunk {chunk} of shard {shards[s]} of "
                f"{p.directory} of {self._where} fails its crc32c checksum (stored "
                f"{stored:#010x}, computed {computed:#010x}); the store is damaged: rewrite it "
                "with write_documents"
            )
        with self._lock:
            for s, chunk in chunks:
                maps[s].checked[chunk] = True

    def _pieces(self, lo: int, hi: int) -> list[tuple[np.ndarray, int, int]]:
        """``[lo, hi)`` as (mapped bytes, first byte, byte count) pieces, chunk by chunk."""
        out = []
        item = self.dtype.itemsize
        part = int(np.searchsorted(self._starts, lo, side="right")) - 1
        while lo < hi:
            p = self.parts[part]
            base, end = int(self._starts[part]), int(self._starts[part + 1])
            local, local_hi = lo - base, min(hi, end) - base
            while local < local_hi:
                shard = local // p.per_shard
                mapped = self._shard(part, shard)
                in_shard = local - shard * p.per_shard
                chunk = in_shard // p.per_chunk
                self._verify(part, [shard], [mapped], ONE_SHARD, np.array([chunk]))
                take = min(local_hi - local, (chunk + 1) * p.per_chunk - in_shard)
                start = int(mapped.offsets[chunk]) + (in_shard - chunk * p.per_chunk) * item
                out.append((mapped.data, start, take * item))
                local += take
            lo = min(hi, end)
            part += 1
        return out

    def _copy(self, pieces: list[Any], count: int) -> np.ndarray:
        """The ``count`` values of ``pieces`` (mapped bytes, first byte, byte count) in order,
        in a new array."""
        out = np.empty(count, self.dtype)
        raw = out.view(np.uint8)
        at = 0
        for data, first, size in pieces:
            raw[at : at + size] = data[first : first + size]
            at += size
        return out

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """``self[starts[i]:stops[i]]`` for every ``i``, concatenated, in a new array: the
        ranges cut at chunk ends in numpy, then one copy per piece."""
        starts, stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
        held = stops > starts
        lo, hi = starts[held], stops[held]
        part = np.searchsorted(self._starts, lo, side="right") - 1
        across = hi > self._starts[part + 1]
        if across.any():  # a range over a part's end: the slow way (rare)
            spans = zip(lo.tolist(), hi.tolist(), strict=True)
            return self._copy(
                [p for a, b in spans for p in self._pieces(a, b)], int((hi - lo).sum())
            )
        pieces: list[Any] = []
        item = self.dtype.itemsize
        for number in np.unique(part).tolist():
            p = self.parts[number]
            mine = np.flatnonzero(part == number)
            local_lo = lo[mine] - self._starts[number]
            local_hi = hi[mine] - self._starts[number]
            first, last = local_lo // p.per_chunk, (local_hi - 1) // p.per_chunk
            count = last - first + 1
            which = np.repeat(np.arange(len(mine)), count)  # each piece's range
            chunk = first[which] + np.arange(len(which)) - np.repeat(np.cumsum(count) - count,
                                                                     count)  # fmt: skip
            piece_lo = np.maximum(local_lo[which], chunk * p.per_chunk)
            piece_hi = np.minimum(local_hi[which], (chunk + 1) * p.per_chunk)
            shard = chunk * p.per_chunk // p.per_shard
            # chunk k of a shard is at byte k * stride (checked when the shard was mapped)
            stride = p.per_chunk * item + 4 * p.checksum
            in_shard = chunk - shard * (p.per_shard // p.per_chunk)
            byte = in_shard * stride + (piece_lo - chunk * p.per_chunk) * item
            shards, slot = np.unique(shard, return_inverse=True)
            numbers = shards.tolist()
            maps = [self._shard(number, s) for s in numbers]
            self._verify(number, numbers, maps, slot, in_shard)  # before any bytes are copied
            sizes = ((piece_hi - piece_lo) * item).tolist()
            order = mine[which].tolist()  # each piece's range: the pieces in the ranges' order
            each = zip(order, slot.tolist(), byte.tolist(), sizes, strict=True)
            pieces += [(r, i, maps[k].data, b, n) for i, (r, k, b, n) in enumerate(each)]
        if len(self.parts) > 1:
            pieces.sort(key=lambda piece: (piece[0], piece[1]))
        return self._copy([(d, b, n) for _, _, d, b, n in pieces], int((hi - lo).sum()))

    def __getitem__(self, where: slice) -> np.ndarray:
        return self.read_ranges(np.array([where.start]), np.array([where.stop]))

    def take(self, d: Any) -> np.ndarray:
        """``self[d]`` for an int64 index array ``d`` (a search's probes: cheap as memory)."""
        d = np.asarray(d, np.int64)
        flat = d.reshape(-1)
        if len(self.parts) == 1:  # the common case: no search for the part
            return self._take_part(0, flat).reshape(d.shape)
        out = np.empty(len(flat), self.dtype)
        part = np.searchsorted(self._starts, flat, side="right") - 1
        for number in np.unique(part).tolist():
            mine = part == number
            out[mine] = self._take_part(number, flat[mine] - self._starts[number])
        return out.reshape(d.shape)

    def _take_part(self, part: int, local: np.ndarray) -> np.ndarray:
        """The values of the part at its positions ``local``, their chunks checked first."""
        p = self.parts[part]
        if not len(local):
            return np.empty(0, self.dtype)
        chunk, within = np.divmod(local, p.per_chunk)
        shard, row = np.divmod(chunk, p.per_shard // p.per_chunk)
        if shard.min() == shard.max():  # one shard: no grouping
            shards, slot = shard[:1], np.zeros(len(shard), np.intp)
        else:
            shards, slot = np.unique(shard, return_inverse=True)
        numbers = shards.tolist()
        maps = [self._shard(part, s) for s in numbers]
        self._verify(part, numbers, maps, slot, row)  # before any of the chunks' values are read
        if len(maps) == 1:
            return self._gather(maps[0], row, within)
        out = np.empty(len(local), self.dtype)
        for s, mapped in enumerate(maps):
            here = slot == s
            out[here] = self._gather(mapped, row[here], within[here])
        return out

    def _gather(self, mapped: Mapped, row: np.ndarray, within: np.ndarray) -> np.ndarray:
        """The values at ``within`` of a shard's chunks ``row``: one gather over its rows."""
        if mapped.rows is not None:
            return mapped.rows[row, within]
        byte = mapped.offsets[row] + within * self.dtype.itemsize  # a short last chunk
        return (
            mapped.data[byte[:, None] + np.arange(self.dtype.itemsize)].reshape(-1).view(self.dtype)
        )


class MappedOffsets:
    """The offsets of a parted store on local disk (as `PartedOffsets` gives them: entry 0 is 0,
    then each part's offsets but its first, plus the tokens of the parts before it), read from
    the memory maps of the parts' offsets (``joined``, each part's ``D + 1`` entries back to
    back); a `FlatArray` with ``take``.

    Examples:
        >>> class Joined:  # two parts' offsets back to back, as MappedShards reads them
        ...     values = np.array([0, 2, 5, 0, 4])
        ...     def take(self, d):
        ...         return self.values[d]
        >>> offsets = MappedOffsets(Joined(), np.array([0, 2, 3]), np.array([0, 5, 9]))
        >>> offsets.shape, offsets[0:4].tolist(), offsets.take(np.array([3, 1])).tolist()
        ((4,), [0, 2, 5, 9], [9, 2])
    """

    reads_storage = False  # read like memory, as `MappedShards`

    def __init__(self, joined: Any, first_document: np.ndarray, first_token: np.ndarray):
        self._joined = joined
        self._first_document = np.asarray(first_document, np.int64)
        self._first_token = np.asarray(first_token, np.int64)
        # where each part's entries start in ``joined``: its D + 1 entries each
        self._at = self._first_document[:-1] + np.arange(len(self._first_document) - 1)
        self.shape = (int(self._first_document[-1]) + 1,)
        self.dtype = np.dtype(np.int64)

    def take(self, d: Any) -> np.ndarray:
        d = np.asarray(d, np.int64)
        part = np.maximum(np.searchsorted(self._first_document, d - 1, side="right") - 1, 0)
        local = d - self._first_document[part]
        return self._joined.take(self._at[part] + local) + self._first_token[part]

    def __getitem__(self, where: slice) -> np.ndarray:
        return self.take(np.arange(where.start, where.stop))

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        spans = zip(np.asarray(starts).tolist(), np.asarray(stops).tolist(), strict=True)
        return self.take(
            np.concatenate([np.zeros(0, np.int64)] + [np.arange(a, b) for a, b in spans])
        )
