"""Inputs of `prepare`: which files a list of inputs names, cut into units of work, and the
records of one unit. ``docs/guides/prepare.md``, "Inputs".

An input is a file, a glob of files or a Hugging Face `datasets` directory (``save_to_disk``),
local or in an object store (a URL such as ``s3://bucket/shards/*.jsonl``, or a TensorStore
kvstore spec dict whose ``path`` names the file or glob, as `write_dataset` takes). Each file is a
*shard*; a `Unit` is a whole shard, a range of rows of a Parquet or Arrow file (cut at its row
groups or record batches), or a range of bytes of an uncompressed jsonl file (each line read by
the range that holds its first byte), and is what one task of `prepare` reads. An object is read
by byte ranges (`ObjectFile`): a task reads its rows' bytes, never the whole object. A reader
yields a unit's
records in batches, each record checked: a malformed one raises `BadRecordError` naming the file
and line (jsonl, from 1) or row (Parquet and Arrow, from 0), or, when skipping, is counted with
its reason. A file that cannot be read to its end (a truncated or damaged compressed stream,
Parquet or Arrow file) raises `CorruptFileError`, skipping or not: the records it hides are no
records that could be counted.
"""

from __future__ import annotations

import codecs
import dataclasses
import fnmatch
import glob
import io
import json
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psdp._imports import import_optional
from psdp.prepare import arrow_blocks
from psdp.sources.stores.errors import retried_write
from psdp.sources.stores.location import (
    check_reach,
    describe_kvstore,
    environment_credentials,
    list_keys,
)

#: The file kinds a reader reads, by name ending (in any case): jsonl's compression, or the kind.
JSONL_ENDINGS = {
    ".jsonl": None, ".jsonl.gz": "gzip", ".jsonl.zst": "zstd",
    ".ndjson": None, ".ndjson.gz": "gzip", ".ndjson.zst": "zstd",
}  # fmt: skip
COLUMNAR_ENDINGS = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow"}
#: Records per batch that a reader yields (and the tokenizer encodes at once).
BATCH_RECORDS = 1024
#: Bytes an object's reader asks for at a time (a range read).
READ_BYTES = 1 << 23
#: Below this size an object's size is read with its bytes (one range read), not probed.
PROBE_BYTES = 1 << 20
#: Objects planned at once (their sizes and generations are probed by range reads).
PLAN_THREADS = 16
#: Compressed bytes fed to a decompressor at a time (a damaged stream is named to within this).
CHUNK_BYTES = 1 << 16
_SKIP_FIX = "pass skip_bad=True (--skip-bad) to skip such records and count them"
_BROKEN_FIX = (
    "the file is truncated or damaged: download or write it again (skip_bad skips malformed "
    "records, never the unread rest of a file)"
)
#: The end-of-stream marker that closes an Arrow IPC stream (a continuation, then length 0).
_ARROW_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class BadRecordError(ValueError):
    """A malformed record: names the file, the line or row, and what is wrong with it."""


class CorruptFileError(ValueError):
    """A file that cannot be read to its end (truncated or damaged): names the file and the byte,
    line or row where it broke. Never skipped, since the records after the break are unknown."""


@dataclass(frozen=True)
class Unit:
    """One task's input: rows ``[row_start, row_stop)`` of the file at ``path`` (``row_stop``
    ``None``: to its end), of ``kind`` ``"jsonl"``, ``"parquet"`` or ``"arrow"``; ``kvstore``:
    the spec of the object store holding the key ``path``, ``None`` for a local file.
    ``version``: the file's size (local) or generation (an object's ETag) when planned: a
    changed file is refused on resume. ``byte_start``, ``byte_stop``: a jsonl file's bytes whose
    lines the unit reads (the lines that start in them; ``byte_stop`` ``None``: to its end), or
    an Arrow IPC object's whose record batches it reads (those whose messages start in them).
    ``size``: an object's size in bytes when planned (``None``: not needed, or a local file)."""

    path: str
    row_start: int = 0
    row_stop: int | None = None
    kind: str = "jsonl"
    kvstore: Mapping[str, Any] | None = None
    version: str = ""
    byte_start: int = 0
    byte_stop: int | None = None
    size: int | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        """The file, for messages and the store's manifest: a local path or a URL."""
        if self.kvstore is None:
            return self.path
        return describe_kvstore({**self.kvstore, "path": self.kvstore.get("path", "") + self.path})

    @property
    def identity(self) -> dict[str, Any]:
        """What a store records of the unit, and compares on resume (``bytes`` only for a range
        of a jsonl file's bytes: a whole file is recorded as an older psdp recorded it)."""
        identity = {"file": self.name, "rows": [self.row_start, self.row_stop],
                    "version": self.version}  # fmt: skip
        if self.byte_start or self.byte_stop is not None:
            identity["bytes"] = [self.byte_start, self.byte_stop]
        return identity

    @property
    def first(self) -> bool:
        """Whether the unit is its file's first (rows and bytes from 0)."""
        return self.row_start == 0 and self.byte_start == 0


@dataclass
class Batch:
    """Up to `BATCH_RECORDS` records of a unit: their values (text, or a list of chat messages)
    and, when skipping, the malformed ones as (where, reason)."""

    values: list[Any] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)


def plan_units(
    inputs: Any, rows_per_part: int, bytes_per_part: int | None = None, cut_objects: bool = True
) -> list[Unit]:
    """The units of ``inputs``, in their order (a glob's files sorted by name): Parquet and Arrow
    files cut into about ``rows_per_part`` rows at their row groups (record batches), uncompressed
    jsonl files into ranges of ``bytes_per_part`` bytes (``None``: whole); objects in a store
    only with ``cut_objects`` (as a psdp before byte ranges planned: every object whole).

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> for name in ("b.jsonl", "a.jsonl"):
        ...     _ = Path(tmp.name, name).write_text('{"text": "hi"}\\n')
        >>> [Path(u.path).name for u in plan_units([f"{tmp.name}/*.jsonl"], 1000)]
        ['a.jsonl', 'b.jsonl']
        >>> [u.identity["bytes"] for u in plan_units([f"{tmp.name}/a.jsonl"], 1000, 10)]
        [[0, 10], [10, None]]
        >>> tmp.cleanup()
    """
    if isinstance(inputs, str | os.PathLike | Mapping):
        inputs = [inputs]
    units: list[Unit] = []
    named: dict[str, Any] = {}  # file -> the input that named it first
    for given in inputs:
        files = _local_files(given) if _is_local(given) else _remote_files(given, bytes_per_part)
        for unit in files:
            if unit.name in named:
                raise ValueError(
                    f"the input {unit.name} is named more than once (by {named[unit.name]!r} and "
                    f"{given!r}); name each file once (a store holds each input once: to weight "
                    "a corpus, give it a weight in a Mixture)"
                )
            named[unit.name] = given
            cut = cut_objects or unit.kvstore is None
            units.extend(_cut(unit, rows_per_part, bytes_per_part) if cut else [unit])
    if not units:
        raise ValueError("prepare needs at least one input, got none; name files or globs")
    return units


def read_batches(unit: Unit, field_name: str, expect: type, skip_bad: bool) -> Iterator[Batch]:
    """The records of ``unit`` in batches: each one's ``field_name`` value, which must be of type
    ``expect`` (``str`` for text, ``list`` for chat messages). A malformed record raises
    `BadRecordError`, or with ``skip_bad`` goes to the batch's ``bad`` list."""
    where: Callable[[int], str]  # a record's place, named only for a malformed one
    if unit.kind == "jsonl":
        records, where = _jsonl_records(unit, field_name), _LineNames(unit)
    else:
        records, where = _columnar_records(unit, field_name), _RowNames(unit)
    batch = Batch()
    for number, value, problem in records:
        if problem is None and not isinstance(value, expect):
            shown = "null" if value is None else type(value).__name__
            problem = f"field {field_name!r} is {shown}, not a {expect.__name__}"
        if problem is None and isinstance(value, str) and not value.isascii():
            problem = _unencodable(value)
        if problem is not None:
            place = where(number)
            if not skip_bad:
                raise BadRecordError(f"{place}: {problem}; fix the record, or {_SKIP_FIX}")
            batch.bad.append((place, problem))
        else:
            batch.values.append(value)
        if len(batch.values) + len(batch.bad) >= BATCH_RECORDS:
            yield batch
            batch = Batch()
    if batch.values or batch.bad:
        yield batch


class _RowNames:
    """A Parquet or Arrow record's place, for messages: its row in the file, from 0."""

    def __init__(self, unit: Unit):
        self.unit = unit

    def __call__(self, row: int) -> str:
        return f"{self.unit.name}, row {row}"


class _LineNames:
    """A jsonl record's place, for messages: its line in the file, from 1, whatever range of the
    file the unit reads. The lines before the range are counted on the first message only (a
    read of the bytes before it): a range read without a malformed record never pays for it."""

    def __init__(self, unit: Unit):
        self.unit, self.before = unit, None if unit.byte_start else 0

    def __call__(self, number: int) -> str:
        if self.before is None:
            self.before = _lines_before(self.unit)
        return f"{self.unit.name}, line {self.before + number}"


def _lines_before(unit: Unit) -> int:
    """The lines of the unit's file before the first line its byte range reads: those ended by
    the newlines before its byte ``byte_start - 1``, and the one that newline (or that byte)
    ends."""
    count, left = 1, unit.byte_start - 1
    with _open_binary(unit) as raw:
        while left > 0 and (block := raw.read(min(READ_BYTES, left))):
            count += block.count(b"\n")
            left -= len(block)
    return count


def range_lines(file: Any, start: int, stop: int | None) -> Iterator[bytes]:
    """The lines of a seekable binary ``file`` (each with its ``\\n``, the last one maybe
    without) that start in its bytes ``[start, stop)`` (``stop`` ``None``: to its end): the line
    that starts before ``start`` belongs to the range before, the one that crosses ``stop`` to
    this one. Ranges that tile a file read each of its lines once.

    Examples:
        >>> data = b"ab\\ncd\\nef"
        >>> [list(range_lines(io.BytesIO(data), a, b)) for a, b in ((0, 3), (3, 4), (4, None))]
        [[b'ab\\n'], [b'cd\\n'], [b'ef']]
        >>> [list(range_lines(io.BytesIO(data), a, b)) for a, b in ((0, 4), (4, 5), (5, None))]
        [[b'ab\\n', b'cd\\n'], [], [b'ef']]
    """
    position = 0
    if start:
        file.seek(start - 1)  # a newline just before start: the line at start is this range's
        position = start - 1 + len(file.readline())
    while stop is None or position < stop:
        line = file.readline()
        if not line:
            return
        position += len(line)
        yield line


def _unencodable(text: str) -> str | None:
    """Why ``text`` is no text a tokenizer takes (a lone UTF-16 surrogate, which JSON's
    ``"\\ud83d"`` escape allows), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"not valid text (a lone surrogate {text[error.start]!r} at character {error.start})"
    return None


# ------------------------------------------------------------------------------ discovery
def _is_local(given: Any) -> bool:
    return isinstance(given, os.PathLike) or (
        isinstance(given, str) and ("://" not in given or given.startswith("file://"))
    )


def _local_files(given: str | os.PathLike[str]) -> list[Unit]:
    text = os.fspath(given).removeprefix("file://")
    if glob.has_magic(text):
        paths = sorted(glob.glob(text))
        if not paths:
            raise FileNotFoundError(f"no file matches the input {text!r}; check the pattern")
    elif Path(text).is_dir():
        return _datasets_export(Path(text))
    elif not Path(text).is_file():
        raise FileNotFoundError(
            f"the input {text!r} does not exist; name a file, glob or directory"
        )
    else:
        paths = [text]
    return [
        Unit(os.path.abspath(p), kind=_kind(p), version=str(os.path.getsize(p)))
        for p in paths
        if not Path(p).is_dir()
    ]


def _datasets_export(directory: Path) -> list[Unit]:
    """The Arrow files of a `datasets` ``save_to_disk`` directory, in its own order."""
    state = directory / "state.json"
    if (directory / "dataset_dict.json").is_file():
        splits = _json_file(directory / "dataset_dict.json", "splits")["splits"]
        raise ValueError(
            f"{directory} is a DatasetDict of splits {splits}; name one split's directory, "
            f"e.g. {directory / (splits[0] if splits else 'train')}"
        )
    if not state.is_file():
        raise ValueError(
            f"the input {directory} is a directory but not a datasets save_to_disk export (it "
            "has no state.json); name its files or a glob, e.g. DIR/*.jsonl"
        )
    files = [entry["filename"] for entry in _json_file(state, "_data_files")["_data_files"]]
    return [
        Unit(
            str((directory / f).resolve()),
            kind="arrow",
            version=str((directory / f).stat().st_size),
        )
        for f in files
    ]


def _json_file(path: Path, needed: str) -> dict[str, Any]:
    """The JSON object of a `datasets` export's ``path``, which must hold ``needed``."""
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        problem = f"is not valid JSON ({error})"
    else:
        if isinstance(data, dict) and needed in data:
            return data
        problem = f"has no {needed!r} (it holds {str(data)[:80]})"
    raise CorruptFileError(
        f"{path} {problem}: the datasets export is damaged; save it again with save_to_disk, or "
        "name its .arrow files as inputs"
    )


def _remote_files(given: Any, bytes_per_part: int | None) -> list[Unit]:
    import tensorstore as ts

    try:
        spec = ts.KvStore.Spec(given if isinstance(given, str) else dict(given)).to_json()
    except (ValueError, TypeError, NotImplementedError) as error:
        raise ValueError(
            f"the input {given!r} is not a path, glob, URL (s3://, gs://) or TensorStore kvstore "
            f"spec: {error}"
        ) from None
    key = spec.get("path", "")
    directory, _, pattern = key.rpartition("/")
    prefix = directory + "/" if directory else ""
    store_spec = environment_credentials({**spec, "path": prefix})
    store = ts.KvStore.open(store_spec).result()
    check_reach(store_spec, describe_kvstore(store_spec))
    names = [k for k in list_keys(store) if "/" not in k and fnmatch.fnmatchcase(k, pattern)]
    if not names:
        raise FileNotFoundError(
            f"no object matches the input {describe_kvstore(spec)}; check the URL or pattern, "
            f"and that the bucket {spec.get('bucket')!r} exists (GCS lists a missing bucket "
            "as an empty one)"
        )

    def planned(name: str) -> Unit:
        kind = _kind(name)
        found = _Object(store, name, describe_kvstore({**spec, "path": prefix + name}))
        size = _planned_size(found, kind, name, bytes_per_part)
        if found.version is None:
            found.read(0, 0)  # no bytes: the generation (an ETag on S3)
        return Unit(name, kind=kind, kvstore=store_spec, version=found.version or "", size=size)

    with ThreadPoolExecutor(min(PLAN_THREADS, len(names))) as pool:
        return list(pool.map(planned, names))


def _planned_size(found: _Object, kind: str, name: str, bytes_per_part: int | None) -> int | None:
    """The size an object's reader needs: a Parquet or Arrow file's (its footer is at its end); a
    jsonl file's when it is cut (larger than ``bytes_per_part``); else ``None`` (read on to the
    end)."""
    if kind != "jsonl":
        return object_size(found)
    if bytes_per_part is None or JSONL_ENDINGS[_jsonl_ending(name) or ".jsonl"] is not None:
        return None
    if found.read(bytes_per_part - 1, bytes_per_part) is None:
        return None  # one range: read to the end
    return object_size(found, bytes_per_part)


class _Object:
    """One object of a kvstore, read by byte ranges, each checked to be of one generation (the
    first read's, or the ``version`` planned): an object replaced while it is read is an error,
    never a mix of two."""

    def __init__(self, store: Any, key: str, name: str, version: str | None = None):
        self.store, self.key, self.name, self.version = store, key.encode(), name, version

    def read(self, start: int, stop: int | None) -> bytes | None:
        """Bytes ``[start, stop)`` (``stop`` ``None``: to the end); ``None`` where the object
        ends before ``stop`` (or at ``start``, with ``stop`` ``None``)."""
        try:
            got = retried_write(
                lambda: self.store.read(self.key, byte_range=slice(start, stop)).result(),
                f"reading {self.name}",
            )
        except ValueError as error:
            if str(error).startswith("OUT_OF_RANGE"):
                return None
            raise
        if got.state != "value":
            raise FileNotFoundError(
                f"{self.name} was deleted while psdp prepare read it; restore it, or name the "
                "inputs again (a store holds each input as it was planned)"
            )
        version = bytes(got.stamp.generation).hex()
        if self.version is None:
            self.version = version
        elif version != self.version:
            raise ValueError(
                f"{self.name} changed while psdp prepare read it (generation {self.version} "
                f"planned, {version} now): a part never mixes two versions of an input; run the "
                "command again once the object stays put (a store holds an input as planned)"
            )
        return bytes(got.value)

    def read_all(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)``, all there (a range past the end is a damaged file)."""
        got = self.read(start, stop)
        if got is None or len(got) != stop - start:
            raise ValueError(f"bytes [{start}, {stop}) lie past the end of {self.name}")
        return got


def object_size(found: _Object, known: int = 0) -> int:
    """The size of ``found`` (at least ``known`` bytes): by reads of one byte, doubling then
    halving the offset, until the end lies within `PROBE_BYTES`, whose bytes are read (a
    kvstore reads ranges and lists keys, but tells no size).

    Examples:
        >>> import tensorstore as ts
        >>> store = ts.KvStore.open("memory://").result()
        >>> _ = store.write(b"a", bytes(3_000_000)).result()
        >>> object_size(_Object(store, "a", "memory://a"))
        3000000
    """
    low, high = known, max(2 * known, PROBE_BYTES)  # byte low - 1 is there (or low is 0)
    while found.read(high - 1, high) is not None:
        low, high = high, 2 * high
    while high - low > PROBE_BYTES:  # the end is in (low - 1, high - 1]
        middle = (low + high) // 2
        low, high = (middle, high) if found.read(middle - 1, middle) is not None else (low, middle)
    if low == 0:
        return len(found.read(0, None) or b"")
    return low - 1 + len(found.read(low - 1, None) or b"")


def _kind(name: str) -> str:
    if _jsonl_ending(name) is not None:
        return "jsonl"
    for ending, kind in COLUMNAR_ENDINGS.items():
        if name.lower().endswith(ending):
            return kind
    raise ValueError(
        f"cannot tell the format of {name}: prepare reads {sorted(JSONL_ENDINGS)}, "
        f"{sorted(COLUMNAR_ENDINGS)} and datasets save_to_disk directories; rename the file"
    )


def _jsonl_ending(name: str) -> str | None:
    """The ending of `JSONL_ENDINGS` that ``name`` has in any case (the longest), or ``None``."""
    found = [e for e in JSONL_ENDINGS if name.lower().endswith(e)]
    return max(found, key=len) if found else None


def _cut(unit: Unit, rows_per_part: int, bytes_per_part: int | None) -> list[Unit]:
    """A Parquet or Arrow file's row ranges of about ``rows_per_part`` rows, cut at its row
    groups (record batches; an Arrow object's also by the bytes its batches start in); an
    uncompressed jsonl file's ranges of ``bytes_per_part`` bytes. One unit: a compressed jsonl
    file (a stream read from its start), an Arrow stream (no footer to find batches by)."""
    if unit.kind == "jsonl":
        return _byte_ranges(unit, bytes_per_part)
    if unit.kind == "arrow" and unit.kvstore is not None:
        return _object_batches(unit, rows_per_part)
    with _open_binary(unit) as raw:
        sizes = _group_rows(unit, raw)
    if sizes is None:
        return [unit]
    return [dataclasses.replace(unit, row_start=a, row_stop=b)
            for a, b, _, _ in _row_ranges(sizes, rows_per_part)]  # fmt: skip


def _row_ranges(sizes: list[int], rows_per_part: int) -> list[tuple[int, int, int, int]]:
    """Ranges ``(row_start, row_stop, group_start, group_stop)`` of about ``rows_per_part`` rows
    of whole groups of ``sizes`` rows (at least one range)."""
    ranges, start, stop, first = [], 0, 0, 0
    for group, rows in enumerate(sizes):
        stop += rows
        if stop - start >= rows_per_part:
            ranges.append((start, stop, first, group + 1))
            start, first = stop, group + 1
    if stop > start or not ranges:
        ranges.append((start, stop, first, len(sizes)))
    return ranges


def _object_batches(unit: Unit, rows_per_part: int) -> list[Unit]:
    """An Arrow IPC object's row ranges at its record batches, each unit naming the bytes its
    batches start in (so a task finds them in the footer, reading no other batch); their row
    counts read from the footer and each batch's metadata, never a batch's body. An IPC stream
    (no footer): one unit."""
    with ObjectFile(unit) as raw:
        if raw.read(len(arrow_blocks.MAGIC)) != arrow_blocks.MAGIC:
            return [unit]
        assert raw.size is not None, "an Arrow object's size is planned"
        read = raw.object.read_all
        try:
            blocks = arrow_blocks.footer_blocks(read, raw.size)
            with ThreadPoolExecutor(PLAN_THREADS) as pool:
                sizes = list(pool.map(lambda b: arrow_blocks.batch_rows(read, b), blocks))
        except ValueError as error:
            if "changed while psdp prepare read it" in str(error):
                raise
            raise CorruptFileError(f"{unit.name} cannot be opened as an Arrow IPC file ({error}); "
                                   f"{_BROKEN_FIX}") from None  # fmt: skip
    ranges = _row_ranges(sizes, rows_per_part)
    if len(ranges) == 1:
        return [unit]  # whole: as an older psdp recorded it
    starts = [0, *(blocks[g].offset for _, _, g, _ in ranges[1:])]
    return [
        dataclasses.replace(unit, row_start=a, row_stop=b, byte_start=start, byte_stop=stop)
        for (a, b, _, _), start, stop in zip(ranges, starts, [*starts[1:], None], strict=True)
    ]


def _byte_ranges(unit: Unit, bytes_per_part: int | None) -> list[Unit]:
    """An uncompressed jsonl file's ranges of ``bytes_per_part`` bytes (the last to its end)."""
    compressed = JSONL_ENDINGS[_jsonl_ending(unit.path) or ".jsonl"] is not None
    size = int(unit.version) if unit.kvstore is None else unit.size
    if bytes_per_part is None or compressed or size is None or size <= bytes_per_part:
        return [unit]
    starts = range(0, size, bytes_per_part)
    stops: list[int | None] = [*starts[1:], None]
    return [
        dataclasses.replace(unit, byte_start=a, byte_stop=b)
        for a, b in zip(starts, stops, strict=True)
    ]


def _group_rows(unit: Unit, raw: Any) -> list[int] | None:
    """The rows of each row group (Parquet) or record batch (Arrow IPC file); ``None`` for an
    Arrow stream, which is read whole."""
    pa = import_optional("pyarrow", extra="prepare", needed_for="reading Parquet and Arrow")
    if unit.kind == "parquet":
        meta = import_optional("pyarrow.parquet", extra="prepare", needed_for="Parquet")
        info = _opened(unit, lambda: meta.ParquetFile(raw), pa).metadata
        return [info.row_group(i).num_rows for i in range(info.num_row_groups)]
    reader = _arrow_file(unit, raw, pa)
    if reader is None:
        return None  # a stream (as `datasets` writes): no footer to find batches by
    return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]


def _opened(unit: Unit, open_: Any, pa: Any) -> Any:
    """``open_()``, a reader of the unit's Parquet or Arrow file; one that pyarrow cannot open
    (a truncated file has no footer) raises `CorruptFileError` naming the file."""
    try:
        return open_()
    except (pa.ArrowException, OSError) as error:
        kind = "a Parquet file" if unit.kind == "parquet" else "an Arrow IPC file"
        raise CorruptFileError(f"{unit.name} cannot be opened as {kind} ({error}); {_BROKEN_FIX}"
                               ) from None  # fmt: skip


def _arrow_file(unit: Unit, raw: Any, pa: Any) -> Any:
    """The Arrow IPC file reader of the unit's file, or ``None`` for an IPC stream (which has
    no footer); a file that starts as an IPC file but has no footer is truncated."""
    raw.seek(0)
    magic = raw.read(6)
    raw.seek(0)
    if magic != b"ARROW1":
        return None
    return _opened(unit, lambda: pa.ipc.open_file(raw), pa)


# ------------------------------------------------------------------------------ records
def _jsonl_records(unit: Unit, field_name: str) -> Iterator[tuple[int, Any, str | None]]:
    """(line, value, problem) for each non-blank line of the unit's range, its lines numbered
    from the range's first (`_LineNames` names them in the file)."""
    compression = JSONL_ENDINGS[_jsonl_ending(unit.path) or ".jsonl"]
    number = 0
    with _open_binary(unit) as raw:
        stream = raw if compression is None else _Decompressed(raw, compression)
        # lines split on b"\n" and decoded one at a time: a line that is no UTF-8 is one
        # malformed record (named, skippable), not the end of the file's reading
        with io.BufferedReader(stream, READ_BYTES) as file:
            lines = range_lines(file, unit.byte_start, unit.byte_stop)
            try:
                for number, raw_line in enumerate(lines, start=1):
                    if number == 1 and unit.byte_start == 0:  # a BOM opens the file: no record
                        raw_line = raw_line.removeprefix(codecs.BOM_UTF8)
                    record = _jsonl_record(raw_line, field_name)
                    if record is not None:
                        yield number, *record
            except _Broken as error:
                raise CorruptFileError(
                    f"{unit.name}: {error}, in line {number + 1:,} (the {number:,} lines before "
                    f"it were read); {_BROKEN_FIX}"
                ) from None


def _jsonl_record(raw_line: bytes, field_name: str) -> tuple[Any, str | None] | None:
    """(value, problem) of one line; ``None`` for a blank line, which holds no record."""
    try:
        line = raw_line.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = raw_line[error.start]
        return None, f"not valid UTF-8 (byte {bad:#04x} at byte {error.start + 1})"
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return None, f"not valid JSON ({error.msg.removesuffix(' at')} at column {error.colno})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    if field_name not in record:
        return None, f"no field {field_name!r} (it has {sorted(record)[:5]})"
    return record[field_name], None


class _Broken(Exception):
    """A compressed stream that cannot be read on: why, and the compressed byte."""


class _Decompressed(io.RawIOBase):
    """The decompressed bytes of a gzip or zstd file, member after member (frame after frame)
    as ``cat a.gz b.gz`` makes; raises `_Broken` where the compressed data is damaged, and at
    the file's end if it ends inside a member: a truncated file must not read as a short one
    (zstandard's stream reader returns what it has and stops)."""

    def __init__(self, raw: Any, compression: str):
        self.raw, self.compression = raw, compression
        self.decoder: Any = None  # None: between members
        self.errors: tuple[type[Exception], ...] = ()  # what the decoder raises on damaged data
        self.consumed = 0  # compressed bytes read whole into members so far
        self.left = b""  # compressed bytes read but not yet decoded
        self.out, self.at = memoryview(b""), 0  # decoded bytes, and how many were returned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.at == len(self.out) and self._decode():
            pass
        size = min(len(buffer), len(self.out) - self.at)
        buffer[:size] = self.out[self.at : self.at + size]
        self.at += size
        return size

    def _decode(self) -> bool:
        """Decodes the next chunk into ``out``; ``False`` at the end of the file."""
        chunk = self.left or self.raw.read(CHUNK_BYTES)
        self.left = b""
        if self.decoder is None and self.compression == "gzip":
            stripped = chunk.lstrip(b"\0")  # gzip allows zero padding after a member
            self.consumed += len(chunk) - len(stripped)
            if chunk and not stripped:
                return True  # padding only: read on
            chunk = stripped
        if not chunk:
            if self.decoder is not None:
                unit = "member" if self.compression == "gzip" else "frame"
                raise _Broken(
                    f"the {self.compression} data is cut short: the file ends (at byte "
                    f"{self.consumed:,}) inside a {self.compression} {unit}"
                )
            return False
        if self.decoder is None:
            self.decoder = self._new_decoder()
        try:
            self.out, self.at = memoryview(self.decoder.decompress(chunk)), 0
        except self.errors as error:
            raise _Broken(
                f"the {self.compression} data is damaged within bytes {self.consumed:,}-"
                f"{self.consumed + len(chunk):,} ({error})"
            ) from None
        if self.decoder.eof:  # a member ends: what follows it is the next member
            self.left = self.decoder.unused_data
            self.decoder = None
        self.consumed += len(chunk) - len(self.left)
        return True

    def _new_decoder(self) -> Any:
        if self.compression == "gzip":
            self.errors = (zlib.error,)
            return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # a gzip header and trailer
        zstd = import_optional("zstandard", extra="prepare", needed_for="reading .jsonl.zst")
        self.errors = (zstd.ZstdError,)
        return zstd.ZstdDecompressor().decompressobj()


def _columnar_records(unit: Unit, field_name: str) -> Iterator[tuple[int, Any, str | None]]:
    pa = import_optional("pyarrow", extra="prepare", needed_for="reading Parquet and Arrow")
    with _open_binary(unit) as raw:
        row = unit.row_start
        batches = _record_batches(unit, raw, pa)
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError, _Broken) as error:
                raise CorruptFileError(
                    f"{unit.name}: cannot read on from row {row} ({error}); {_BROKEN_FIX}"
                ) from None
            if batch is None:
                return
            if field_name not in batch.schema.names:
                raise ValueError(
                    f"{unit.name} has no column {field_name!r} (it has {batch.schema.names}); "
                    "name the text column with field= (--field)"
                )
            for value in batch.column(field_name).to_pylist():
                yield row, value, None
                row += 1


def _record_batches(unit: Unit, raw: Any, pa: Any) -> Iterator[Any]:
    """The record batches of the unit's rows (row groups or IPC batches as planned by `_cut`)."""
    if unit.kind == "parquet":
        parquet = import_optional("pyarrow.parquet", extra="prepare", needed_for="Parquet")
        file = _opened(unit, lambda: parquet.ParquetFile(raw), pa)
        groups, first = [], 0
        for i in range(file.metadata.num_row_groups):
            rows = file.metadata.row_group(i).num_rows
            if unit.row_start <= first and (unit.row_stop is None or first < unit.row_stop):
                groups.append(i)
            first += rows
        yield from file.iter_batches(batch_size=BATCH_RECORDS, row_groups=groups)
        return
    reader = _arrow_file(unit, raw, pa)
    if reader is None:  # read on from its start: buffered, not a range read per message part
        yield from pa.ipc.open_stream(
            io.BufferedReader(raw, READ_BYTES) if isinstance(raw, ObjectFile) else raw
        )
        raw.seek(-len(_ARROW_EOS), os.SEEK_END)
        if raw.read(len(_ARROW_EOS)) != _ARROW_EOS:  # a stream cut between its batches
            raise _Broken("the Arrow stream has no end-of-stream marker: it is cut short")
        return
    if isinstance(raw, ObjectFile):  # the unit's batches found in the footer: no other is read
        blocks = arrow_blocks.footer_blocks(raw.object.read_all, raw.size or 0)
        for i, block in enumerate(blocks):
            if unit.byte_start <= block.offset and (
                unit.byte_stop is None or block.offset < unit.byte_stop
            ):
                yield reader.get_batch(i)
        return
    first = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        if unit.row_start <= first and (unit.row_stop is None or first < unit.row_stop):
            yield batch
        first += batch.num_rows


def _open_binary(unit: Unit) -> Any:
    """A seekable binary file of the unit's shard (the caller's ``with`` closes it)."""
    if unit.kvstore is None and unit.kind == "arrow":
        pa = import_optional("pyarrow", extra="prepare", needed_for="reading Arrow")
        return pa.memory_map(unit.path)  # batches outside the unit's rows cost no read
    if unit.kvstore is None:
        return open(unit.path, "rb")
    found = ObjectFile(unit)
    # pyarrow reads a Parquet file's footer and column chunks, and an Arrow file's footer and
    # messages, each in one read: a buffer would read what it skips; jsonl goes on from where
    # it is (an Arrow stream too: `_record_batches` buffers it)
    return found if unit.kind != "jsonl" else io.BufferedReader(found, READ_BYTES)


class ObjectFile(io.RawIOBase):
    """The object a unit names, read as a seekable binary file by range reads of its planned
    generation (`_Object`): a task reads its own rows' bytes, and memory holds what it reads at
    a time, whatever the object's size."""

    def __init__(self, unit: Unit):
        import tensorstore as ts

        assert unit.kvstore is not None, "a local file is opened as one"
        store = ts.KvStore.open(dict(unit.kvstore)).result()
        self.object = _Object(store, unit.path, unit.name, unit.version)
        self.size, self.position = unit.size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            if self.size is None:
                self.size = object_size(self.object)
            offset += self.size
        elif whence == os.SEEK_CUR:
            offset += self.position
        self.position = max(0, offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        wanted = len(buffer)
        if self.size is not None:
            wanted = min(wanted, self.size - self.position)
        if wanted <= 0:
            return 0
        got = self.object.read(self.position, self.position + wanted)
        if got is None:  # the end is nearer than asked (a size not planned): the rest
            got = self.object.read(self.position, None) or b""
            self.size = self.position + len(got)
        buffer[: len(got)] = got
        self.position += len(got)
        return len(got)
