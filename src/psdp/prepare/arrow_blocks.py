"""The record batches of an Arrow IPC file found by range reads, for `prepare` to cut a remote
file at its batches as it cuts a Parquet file at its row groups: the footer's blocks (where each
batch's message lies, `footer_blocks`) and each batch's row count from its message's metadata
alone (`batch_rows`). pyarrow tells neither without reading every batch's body (its
``get_batch`` reads a message whole), which in an object store is the whole file.

The footer and a message's metadata are flatbuffers (``File.fbs``, ``Message.fbs`` of the Arrow
format); the few fields read here are read by their place in the table, as the format fixes it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

#: What an Arrow IPC file starts and ends with (then, at the start, two bytes of padding).
MAGIC = b"ARROW1"
#: ``Block`` of ``File.fbs``: offset (int64), metaDataLength (int32), padding, bodyLength (int64).
_BLOCK = struct.Struct("<qi4xq")
#: ``MessageHeader.RecordBatch``: the union's type of a record batch's message.
_RECORD_BATCH = 3
#: The fields read, by their place in their table: ``Footer.recordBatches``,
#: ``Message.header_type``, ``Message.header``, ``RecordBatch.length``.
_FOOTER_BATCHES, _HEADER_TYPE, _HEADER, _LENGTH = 3, 1, 2, 0
#: Before a message's metadata: the continuation marker (then its length, int32).
_CONTINUATION = b"\xff\xff\xff\xff"

#: ``read(start, stop)``: bytes ``[start, stop)`` of the file.
ReadBytes = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Block:
    """Where one record batch's message lies: from ``offset``, ``metadata`` bytes (its prefix and
    flatbuffer), then ``body`` bytes (its buffers)."""

    offset: int
    metadata: int
    body: int


def footer_blocks(read: ReadBytes, size: int) -> list[Block]:
    """The blocks of the record batches of the Arrow IPC file of ``size`` bytes, in order, from
    its footer (two reads: its length, then the footer).

    Raises:
        ValueError: the file does not end as an Arrow IPC file does, or its footer is damaged.

    Examples:
        >>> import io, pyarrow as pa
        >>> sink = io.BytesIO()
        >>> with pa.ipc.new_file(sink, pa.schema([("text", pa.string())])) as writer:
        ...     for texts in (["a", "b", "c"], ["d"]):
        ...         writer.write_batch(pa.record_batch([texts], names=["text"]))
        >>> data = sink.getvalue()
        >>> blocks = footer_blocks(lambda start, stop: data[start:stop], len(data))
        >>> [batch_rows(lambda start, stop: data[start:stop], b) for b in blocks]
        [3, 1]
    """
    if size < 2 * len(MAGIC) + 6:
        raise ValueError(f"{size} bytes are too few for an Arrow IPC file and its footer")
    tail = read(size - len(MAGIC) - 4, size)
    if tail[4:] != MAGIC:
        raise ValueError(f"the file ends in {tail[4:]!r}, not the Arrow IPC file's {MAGIC!r}")
    length = int.from_bytes(tail[:4], "little", signed=True)
    start = size - len(MAGIC) - 4 - length
    if length <= 0 or start < len(MAGIC) + 2:
        raise ValueError(f"the footer's length {length} does not fit in the file's {size} bytes")
    footer = read(start, start + length)
    try:
        vector = _child(footer, _root(footer), _FOOTER_BATCHES)
        (count,) = struct.unpack_from("<I", footer, vector)
        blocks = [Block(*_BLOCK.unpack_from(footer, vector + 4 + _BLOCK.size * k))
                  for k in range(count)]  # fmt: skip
    except struct.error:
        raise ValueError("the footer's record batches lie outside it: it is damaged") from None
    for block in blocks:
        if block.offset < 0 or block.metadata <= 0 or block.offset + block.metadata > start:
            raise ValueError(f"the footer names a record batch outside the file: {block}")
    return blocks


def batch_rows(read: ReadBytes, block: Block) -> int:
    """The rows of the record batch at ``block``, from its message's metadata (one read of
    ``block.metadata`` bytes, never its body).

    Raises:
        ValueError: the message there is not a record batch's (a damaged file or footer).
    """
    data = read(block.offset, block.offset + block.metadata)
    skip = 8 if data[:4] == _CONTINUATION else 4  # a file before format 0.15: length only
    message = data[skip:]
    try:
        table = _root(message)
        kind = _field(message, table, _HEADER_TYPE)
        if not kind or message[kind] != _RECORD_BATCH:
            raise ValueError(
                f"the message at byte {block.offset} is not a record batch's (header type "
                f"{message[kind] if kind else None}): the file is damaged"
            )
        length = _field(message, _child(message, table, _HEADER), _LENGTH)
        return struct.unpack_from("<q", message, length)[0] if length else 0
    except (struct.error, IndexError):
        raise ValueError(f"the message at byte {block.offset} is cut short or damaged") from None


def _root(buffer: bytes) -> int:
    """Where a flatbuffer's root table lies."""
    return int(struct.unpack_from("<I", buffer, 0)[0])


def _field(buffer: bytes, table: int, number: int) -> int:
    """Where field ``number`` of the table at ``table`` lies (0: absent, its default)."""
    vtable = table - struct.unpack_from("<i", buffer, table)[0]
    (vtable_size,) = struct.unpack_from("<H", buffer, vtable)
    place = 4 + 2 * number
    if place >= vtable_size:
        return 0
    (offset,) = struct.unpack_from("<H", buffer, vtable + place)
    return table + offset if offset else 0


def _child(buffer: bytes, table: int, number: int) -> int:
    """Where the table or vector that field ``number`` refers to lies."""
    at = _field(buffer, table, number)
    if not at:
        raise struct.error(f"field {number} is absent")
    return at + int(struct.unpack_from("<I", buffer, at)[0])
