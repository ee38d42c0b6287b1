"""Inputs of `prepare`: which files a list of inputs names, cut into units of work, and the
records of one unit. ``docs/guides/prepare.md``, "Inputs".

An input is a file, a glob of files or a Hugging Face `datasets` directory (``save_to_disk``),
local or in an object store (a URL such as ``s3://bucket/shards/*.jsonl``, or a TensorStore
kvstore spec dict whose ``path`` names the file or glob, as `write_dataset` takes). Each file is a
*shard*; a `Unit` is a whole shard, or a range of rows of a Parquet or Arrow file (cut at its
row groups or record batches), and is what one task of `prepare` reads. A reader yields a unit's
records in batches, each record checked: a malformed one raises `BadRecordError` naming the file
and line (jsonl, from 1) or row (Parquet and Arrow, from 0), or, when skipping, is counted with
its reason. A file that cannot be read to its end (a truncated or damaged compressed stream,
Parquet or Arrow file) raises `CorruptFileError`, skipping or not: the records it hides are no
records that could be counted.
"""

from __future__ import annotations

import codecs
import fnmatch
import glob
import io
import json
import os
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psdp._imports import import_optional
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
    changed file is refused on resume."""

    path: str
    row_start: int = 0
    row_stop: int | None = None
    kind: str = "jsonl"
    kvstore: Mapping[str, Any] | None = None
    version: str = ""

    @property
    def name(self) -> str:
        """The file, for messages and the store's manifest: a local path or a URL."""
        if self.kvstore is None:
            return self.path
        return describe_kvstore({**self.kvstore, "path": self.kvstore.get("path", "") + self.path})

    @property
    def identity(self) -> dict[str, Any]:
        """What a store records of the unit, and compares on resume."""
        return {"file": self.name, "rows": [self.row_start, self.row_stop], "version": self.version}


@dataclass
class Batch:
    """Up to `BATCH_RECORDS` records of a unit: their values (text, or a list of chat messages)
    and, when skipping, the malformed ones as (where, reason)."""

    values: list[Any] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)


def plan_units(inputs: Any, rows_per_part: int) -> list[Unit]:
    """The units of ``inputs``, in their order (a glob's files sorted by name).

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> for name in ("b.jsonl", "a.jsonl"):
        ...     _ = Path(tmp.name, name).write_text('{"text": "hi"}\\n')
        >>> [Path(u.path).name for u in plan_units([f"{tmp.name}/*.jsonl"], 1000)]
        ['a.jsonl', 'b.jsonl']
        >>> tmp.cleanup()
    """
    if isinstance(inputs, str | os.PathLike | Mapping):
        inputs = [inputs]
    units: list[Unit] = []
    named: dict[str, Any] = {}  # file -> the input that named it first
    for given in inputs:
        files = _local_files(given) if _is_local(given) else _remote_files(given)
        for unit in files:
            if unit.name in named:
                raise ValueError(
                    f"the input {unit.name} is named more than once (by {named[unit.name]!r} and "
                    f"{given!r}); name each file once (a store holds each input once: to weight "
                    "a corpus, give it a weight in a Mixture)"
                )
            named[unit.name] = given
            units.extend(_cut(unit, rows_per_part))
    if not units:
        raise ValueError("prepare needs at least one input, got none; name files or globs")
    return units


def read_batches(unit: Unit, field_name: str, expect: type, skip_bad: bool) -> Iterator[Batch]:
    """The records of ``unit`` in batches: each one's ``field_name`` value, which must be of type
    ``expect`` (``str`` for text, ``list`` for chat messages). A malformed record raises
    `BadRecordError`, or with ``skip_bad`` goes to the batch's ``bad`` list."""
    if unit.kind == "jsonl":
        records = _jsonl_records(unit, field_name)
    else:
        records = _columnar_records(unit, field_name)
    batch = Batch()
    for where, value, problem in records:
        if problem is None and not isinstance(value, expect):
            shown = "null" if value is None else type(value).__name__
            problem = f"field {field_name!r} is {shown}, not a {expect.__name__}"
        if problem is None and isinstance(value, str) and not value.isascii():
            problem = _unencodable(value)
        if problem is not None:
            if not skip_bad:
                raise BadRecordError(f"{where}: {problem}; fix the record, or {_SKIP_FIX}")
            batch.bad.append((where, problem))
        else:
            batch.values.append(value)
        if len(batch.values) + len(batch.bad) >= BATCH_RECORDS:
            yield batch
            batch = Batch()
    if batch.values or batch.bad:
        yield batch


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


def _remote_files(given: Any) -> list[Unit]:
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
            f"no object matches the input {describe_kvstore(spec)}; check the URL or pattern"
        )
    units = []
    for name in names:
        stamp = _generation(store, name.encode())
        units.append(
            Unit(name, kind=_kind(name), kvstore=store_spec, version=stamp.generation.hex())
        )
    return units


def _generation(store: Any, key: bytes) -> Any:
    """The object's generation (its ETag on S3), from a read of no bytes; TensorStore before
    ``byte_range`` (0.1.72) reads the whole object for it."""
    try:
        return store.read(key, byte_range=slice(0, 0)).result().stamp
    except TypeError:
        return store.read(key).result().stamp


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


def _cut(unit: Unit, rows_per_part: int) -> list[Unit]:
    """A Parquet or Arrow file's row ranges of about ``rows_per_part`` rows, cut at its row
    groups (record batches); a jsonl file or an Arrow stream is one unit."""
    if unit.kind == "jsonl" or unit.kvstore is not None:
        return [unit]  # an object is read whole anyway: its row groups save nothing
    with _open_binary(unit) as raw:
        sizes = _group_rows(unit, raw)
    if sizes is None:
        return [unit]
    ranges, start, stop = [], 0, 0
    for rows in sizes:
        stop += rows
        if stop - start >= rows_per_part:
            ranges.append((start, stop))
            start = stop
    if stop > start or not ranges:
        ranges.append((start, stop))
    return [Unit(unit.path, a, b, unit.kind, unit.kvstore, unit.version) for a, b in ranges]


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
def _jsonl_records(unit: Unit, field_name: str) -> Iterator[tuple[str, Any, str | None]]:
    """(where, value, problem) for each non-blank line."""
    compression = JSONL_ENDINGS[_jsonl_ending(unit.path) or ".jsonl"]
    number = 0
    with _open_binary(unit) as raw:
        stream = raw if compression is None else _Decompressed(raw, compression)
        # lines split on b"\n" and decoded one at a time: a line that is no UTF-8 is one
        # malformed record (named, skippable), not the end of the file's reading
        with io.BufferedReader(stream) as lines:
            try:
                for number, raw_line in enumerate(lines, start=1):
                    if number == 1:  # a byte order mark opens the file, not its first record
                        raw_line = raw_line.removeprefix(codecs.BOM_UTF8)
                    record = _jsonl_record(f"{unit.name}, line {number}", raw_line, field_name)
                    if record is not None:
                        yield record
            except _Broken as error:
                raise CorruptFileError(
                    f"{unit.name}: {error}, in line {number + 1:,} (the {number:,} lines before "
                    f"it were read); {_BROKEN_FIX}"
                ) from None


def _jsonl_record(
    where: str, raw_line: bytes, field_name: str
) -> tuple[str, Any, str | None] | None:
    """(where, value, problem) of one line; ``None`` for a blank line, which holds no record."""
    try:
        line = raw_line.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = raw_line[error.start]
        return where, None, f"not valid UTF-8 (byte {bad:#04x} at byte {error.start + 1})"
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return (
            where,
            None,
            f"not valid JSON ({error.msg.removesuffix(' at')} at column {error.colno})",
        )
    if not isinstance(record, dict):
        return where, None, f"a JSON {type(record).__name__}, not an object"
    if field_name not in record:
        return where, None, f"no field {field_name!r} (it has {sorted(record)[:5]})"
    return where, record[field_name], None


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


def _columnar_records(unit: Unit, field_name: str) -> Iterator[tuple[str, Any, str | None]]:
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
                yield f"{unit.name}, row {row}", value, None
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
    if reader is None:
        yield from pa.ipc.open_stream(raw)
        raw.seek(-len(_ARROW_EOS), os.SEEK_END)
        if raw.read(len(_ARROW_EOS)) != _ARROW_EOS:  # a stream cut between its batches
            raise _Broken("the Arrow stream has no end-of-stream marker: it is cut short")
        return
    first = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        if unit.row_start <= first and (unit.row_stop is None or first < unit.row_stop):
            yield batch
        first += batch.num_rows


def _open_binary(unit: Unit) -> Any:
    """A seekable binary file of the unit's shard."""
    if unit.kvstore is None and unit.kind == "arrow":
        pa = import_optional("pyarrow", extra="prepare", needed_for="reading Arrow")
        return pa.memory_map(unit.path)  # batches outside the unit's rows cost no read
    if unit.kvstore is None:
        return open(unit.path, "rb")  # the caller's `with` closes it
    import tensorstore as ts

    # read whole: memory is bounded by the largest shard, not by the corpus
    store = ts.KvStore.open(dict(unit.kvstore)).result()
    return io.BytesIO(bytes(store.read(unit.path.encode()).result().value))
