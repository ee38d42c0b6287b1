"""`write_dataset`: the zarr3 datasets `TensorStoreSource` reads, written atomically in shard
files of many rows, one row per chunk. The layout on disk, the input kinds, atomicity and
overwriting: ``docs/guides/stores.md``, "write_dataset and TensorStoreSource".
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
from tqdm import tqdm

from psdp._checks import is_int
from psdp._plan.leaves import SINGLE_LEAF
from psdp.sources.base import as_rows
from psdp.sources.stores.errors import retried_write
from psdp.sources.stores.location import locate
from psdp.sources.stores.remote import write_remote
from psdp.sources.stores.tensorstore import (
    DATASET_FORMAT,
    DATASET_VERSION,
    INCOMPLETE_MARKER,
    METADATA_FILE,
)

#: Rows are written in blocks of whole shards of about this many bytes (all leaves together).
BLOCK_BYTES = 64 << 20

_LEAF_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_COMPRESSION: dict[str, dict[str, Any]] = {
    "zstd": {"name": "zstd", "configuration": {"level": 3}},
    "gzip": {"name": "gzip"},
}

Chunk = dict[str, np.ndarray]
Schema = dict[str, tuple[np.dtype, tuple[int, ...]]]


def write_dataset(
    path: str | os.PathLike[str] | Mapping[str, Any],
    arrays: np.ndarray
    | Mapping[str, np.ndarray]
    | Iterable[np.ndarray]
    | Iterable[Mapping[str, np.ndarray]],
    *,
    rows_per_shard: int = 1024,
    rows_per_chunk: int = 1,
    compression: str | dict[str, Any] | None = None,
    checksum: bool = True,
    overwrite: bool = False,
    progress: bool = True,
) -> Any:
    """Writes rows to a dataset directory that `TensorStoreSource` reads.

    Args:
        path: the dataset directory; it must not exist or be empty (see ``overwrite``). Its
            parent must be writable: the dataset is written beside it and renamed into place.
            Or a prefix in an object store: a URL (``s3://bucket/corpus``, ``gs://...``) or a
            TensorStore kvstore spec (endpoint, region; credentials come from the environment
            as TensorStore reads them), committed by writing ``psdp.json`` last.
        arrays: one array ``(N, ...)`` (reads return an array), a dict of arrays with the same
            ``N`` (reads return a dict), or an iterable of such arrays or dicts (chunks of rows,
            any sizes, all of one kind; the row count is the sum). Leaves must be numeric or bool
            numpy arrays. The chunks may be read from the dataset at ``path`` itself.
        rows_per_shard: rows per shard file; a random row read opens one file per leaf.
        rows_per_chunk: rows per inner chunk, the unit TensorStore reads and decodes; 1 (the
            default) is fastest for random rows, larger suits sequential reads.
        compression: ``None`` (fastest reads), ``"zstd"``, ``"gzip"``, or a zarr3 codec dict such
            as ``{"name": "zstd", "configuration": {"level": 9}}``.
        checksum: store a crc32c per row chunk, so a corrupted row fails its read instead of
            returning wrong values (about 30% slower random reads; shard indexes always have one).
        overwrite: replace an existing psdp dataset at ``path`` (never any other directory),
            once the new one is complete.
        progress: show a tqdm bar when the write takes more than a second.

    Returns:
        ``path`` as a `Path` for a local directory, else ``path`` as given.

    Examples:
        >>> import tempfile
        >>> from psdp.sources import TensorStoreSource
        >>> tmp = tempfile.TemporaryDirectory()
        >>> chunks = ({"ids": np.arange(i, i + 3)} for i in range(0, 9, 3))  # 3 chunks of 3 rows
        >>> path = write_dataset(f"{tmp.name}/ds", chunks, rows_per_shard=4, progress=False)
        >>> sorted(p.name for p in path.iterdir())
        ['ids', 'psdp.json']
        >>> TensorStoreSource(path).read(np.array([8, 0]))["ids"].tolist()
        [8, 0]
        >>> tmp.cleanup()
    """
    for name, value in (("rows_per_shard", rows_per_shard), ("rows_per_chunk", rows_per_chunk)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if rows_per_shard % rows_per_chunk:
        raise ValueError(
            f"rows_per_shard={rows_per_shard} must be a multiple of rows_per_chunk="
            f"{rows_per_chunk}; e.g. rows_per_shard={rows_per_chunk * 16}"
        )
    codecs = inner_codecs(compression, checksum)
    location = locate(path)
    chunks, total, single = _chunks_of(arrays)
    first = next(chunks, None)
    if first is None or total == 0:
        raise ValueError(
            f"no rows to write to {location.name}: "
            + ("the iterable of chunks was empty" if first is None else "the arrays have 0 rows")
        )
    head: Chunk = first
    schema = _schema_of(head)
    label = location.local.name if location.local is not None else location.name
    layout = {"rows_per_chunk": rows_per_chunk, "compression": compression, "checksum": checksum}

    def fill(leaf_kvstore: Any, on_start: Callable[[Any], None]) -> ShardedWriter:
        """Writes every row to the leaves at ``leaf_kvstore(name)``, metadata aside."""
        writer = ShardedWriter(
            leaf_kvstore, schema, rows_per_shard, rows_per_chunk, codecs, total, on_start
        )
        with tqdm(
            total=total, unit="rows", desc=f"write {label}", disable=not progress, delay=1.0
        ) as bar:
            for index, chunk in enumerate(_checked(head, chunks, schema)):
                bar.update(writer.add(chunk, index))
            bar.update(writer.finish())
        if writer.written == 0:
            raise ValueError(f"no rows to write to {location.name}: every chunk had 0 rows")
        return writer

    return commit_write(
        path, overwrite, fill, lambda writer: _metadata_of(schema, writer, single, layout)
    )


def commit_write(
    path: Any,
    overwrite: bool,
    fill: Callable[[Callable[[str], dict[str, Any]], Callable[[Any], None]], Any],
    metadata_of: Callable[[Any], dict[str, Any]],
) -> Any:
    """Writes a psdp store atomically: ``fill(leaf_kvstore, on_start)`` writes its arrays (each at
    ``leaf_kvstore(name)``, registering every `ShardedWriter` with ``on_start``), then
    ``metadata_of(result)`` becomes ``psdp.json``; a local directory is staged beside ``path``
    and renamed into place, an object store commits by writing ``psdp.json`` last. On failure,
    what this write put there is deleted and the old store is kept.

    Returns:
        ``path`` as a `Path` for a local directory, else ``path`` as given.
    """
    location = locate(path)
    started: list[ShardedWriter] = []
    if location.local is None:
        write_remote(
            location,
            overwrite,
            lambda leaf_kvstore: fill(leaf_kvstore, started.append),
            lambda _schema, result, _single, _layout: metadata_of(result),
            None,
            False,
            {},
            started,
        )
        return path
    local = location.local
    _check_target(local, overwrite)
    target = Path(os.path.abspath(local))  # "." and "a/.." name no sibling
    before = _identity(target)
    staging = _staging_directory(target)
    try:
        result = fill(lambda name: _file_kvstore(staging / name), started.append)
        _write_metadata(staging, metadata_of(result))
        (staging / INCOMPLETE_MARKER).unlink()
        _swap_into_place(staging, target, overwrite, before)
    except BaseException:  # Ctrl-C included
        for writer in started:
            writer.wait_for_writes()  # a write landing after the rmtree would recreate files
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return local


class ShardedWriter:
    """Buffers chunks into blocks of whole shards and writes each block to every leaf array:
    ``shards_per_block`` shards a block, or as many as fit in `BLOCK_BYTES` (None)."""

    def __init__(
        self,
        leaf_kvstore: Callable[[str], dict[str, Any]],
        schema: Schema,
        rows_per_shard: int,
        rows_per_chunk: int,
        codecs: list[dict[str, Any]],
        total: int | None,
        on_start: Callable[[ShardedWriter], None],
        shards_per_block: int | None = None,
    ):
        on_start(self)
        self.in_flight: list[Any] = []
        self.schema = schema
        self.rows_per_shard = rows_per_shard
        context = ts.Context()
        self.size = total or 0
        self.arrays = {
            name: _create_leaf(
                leaf_kvstore(name),
                dtype,
                shape,
                self.size,
                rows_per_shard,
                rows_per_chunk,
                codecs,
                context,
            )
            for name, (dtype, shape) in schema.items()
        }
        row_bytes = sum(dtype.itemsize * int(np.prod(shape)) for dtype, shape in schema.values())
        fit = max(1, BLOCK_BYTES // max(1, row_bytes * rows_per_shard))
        self.block_rows = rows_per_shard * (shards_per_block or fit)
        self.pending: deque[Chunk] = deque()
        self.pending_rows = 0
        self.written = 0

    def add(self, chunk: Chunk, index: int) -> int:
        """Queues a chunk and writes every full block; returns how many rows it wrote."""
        rows = len(next(iter(chunk.values())))
        if rows:
            # a copy: a generator may refill one buffer for every chunk it yields
            self.pending.append({k: np.array(v, copy=True) for k, v in chunk.items()})
            self.pending_rows += rows
        before = self.written
        while self.pending_rows >= self.block_rows:
            self._write(self._take(self.block_rows))
        return self.written - before

    def finish(self) -> int:
        """Writes the rows still queued (the last, possibly partial, shard)."""
        before = self.written
        if self.pending_rows:
            self._write(self._take(self.pending_rows))
        return self.written - before

    def _take(self, rows: int) -> Chunk:
        parts: list[Chunk] = []
        need = rows
        while need:
            head = self.pending[0]
            size = len(next(iter(head.values())))
            if size <= need:
                parts.append(self.pending.popleft())
                need -= size
            else:
                parts.append({k: v[:need] for k, v in head.items()})
                self.pending[0] = {k: v[need:] for k, v in head.items()}
                need = 0
        self.pending_rows -= rows
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in self.schema}

    def _write(self, block: Chunk) -> None:
        start = self.written
        stop = start + len(next(iter(block.values())))
        if stop > self.size:  # an iterable of chunks: grow every leaf to the rows written so far
            resized = self._settle(
                lambda: (
                    array.resize(exclusive_max=[stop, *[None] * (array.rank - 1)])
                    for array in self.arrays.values()
                ),
                f"growing the leaves to {stop} rows",
            )
            self.arrays = dict(zip(self.arrays, resized, strict=True))
            self.size = stop
        self._settle(
            lambda: (
                array[start:stop].write(np.ascontiguousarray(block[name], self.schema[name][0]))
                for name, array in self.arrays.items()
            ),
            f"writing rows {start}-{stop - 1}",
        )
        self.written = stop

    def _settle(self, start: Callable[[], Iterable[Any]], what: str) -> list[Any]:
        """Starts the operations and returns their results, starting them all again while one
        fails with a transient store error (`retried_write`: they write the same bytes again);
        each stays in `in_flight` (from the moment it starts) until all of them are done."""

        def attempt() -> list[Any]:
            self.in_flight = []
            try:
                for future in start():
                    self.in_flight.append(future)
                results = [future.result() for future in self.in_flight]
            except Exception:
                self.wait_for_writes()  # no write of this try may land after the next try's
                raise
            self.in_flight = []
            return results

        return retried_write(attempt, what)

    def wait_for_writes(self) -> None:
        """Waits until every TensorStore operation started is over, whatever its outcome.

        ``Future.cancel()`` only marks a future done; the write itself goes on in TensorStore's
        threads, so the only way to know no file appears later is to wait for each one.
        """
        for future in self.in_flight:
            done = getattr(future, "commit", future)  # a write is over once it is committed
            while True:
                try:
                    done.exception()
                    break
                except KeyboardInterrupt:  # a second Ctrl-C: these writes end in moments
                    continue
                except Exception:  # the write failed or was cancelled: it is over
                    break
        self.in_flight = []


def _create_leaf(
    kvstore: dict[str, Any],
    dtype: np.dtype,
    shape: tuple[int, ...],
    rows: int,
    rows_per_shard: int,
    rows_per_chunk: int,
    codecs: list[dict[str, Any]],
    context: ts.Context,
) -> ts.TensorStore:
    trailing = [max(1, d) for d in shape]  # zarr chunk sizes must be >= 1
    spec = {
        "driver": "zarr3",
        "kvstore": kvstore,
        # every row gets stored, even if it equals the fill value, so that a missing chunk can
        # only mean damage, and readers can refuse to fill it in
        "store_data_equal_to_fill_value": True,
        "metadata": {
            "shape": [rows, *shape],
            "data_type": ts.dtype(dtype.name).name,
            "chunk_grid": {
                "name": "regular",
                "configuration": {"chunk_shape": [rows_per_shard, *trailing]},
            },
            "chunk_key_encoding": {"name": "default"},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [rows_per_chunk, *trailing],
                        "codecs": codecs,
                        "index_codecs": [{"name": "bytes"}, {"name": "crc32c"}],
                    },
                }
            ],
        },
    }
    tries = 0

    def create() -> ts.TensorStore:
        nonlocal tries
        tries += 1  # a try after one whose answer was lost opens what that one created
        return ts.open(spec, create=True, open=tries > 1, context=context).result()

    return retried_write(create, f"creating the array at {kvstore.get('path', kvstore)}")


def inner_codecs(compression: str | dict[str, Any] | None, checksum: bool) -> list[dict[str, Any]]:
    """bytes -> optional compression -> optional crc32c (over the stored bytes)."""
    middle: list[dict[str, Any]] = []
    if compression is None:
        pass
    elif isinstance(compression, str) and compression in _COMPRESSION:
        middle = [_COMPRESSION[compression]]
    elif isinstance(compression, dict) and isinstance(compression.get("name"), str):
        middle = [compression]
    else:
        raise ValueError(
            f"compression must be None, one of {sorted(_COMPRESSION)} or a zarr3 codec dict "
            f'like {{"name": "zstd", "configuration": {{"level": 9}}}}, got {compression!r}'
        )
    return [{"name": "bytes"}, *middle, *([{"name": "crc32c"}] if checksum else [])]


def _chunks_of(arrays: Any) -> tuple[Iterator[Chunk], int | None, bool]:
    """The rows as an iterator of dict chunks, the row count when known up front, and whether
    they are one array (reads return an array) rather than a dict of leaves."""
    if isinstance(arrays, np.ndarray):
        return iter([_as_chunk(arrays, None, single=True)]), _rows(arrays), True
    if isinstance(arrays, Mapping):
        chunk = _as_chunk(arrays, None, single=False)
        return iter([chunk]), len(next(iter(chunk.values()))), False
    if isinstance(arrays, str | bytes) or not isinstance(arrays, Iterable):
        raise TypeError(
            "arrays must be a numpy array, a dict of numpy arrays, or an iterable of such arrays "
            f"or dicts, got {type(arrays).__name__}"
        )
    raw = iter(arrays)
    head = next(raw, None)
    if head is None:
        return iter(()), None, False
    single = isinstance(head, np.ndarray)
    chunks = itertools.chain([head], raw)
    return (_as_chunk(c, i, single) for i, c in enumerate(chunks)), None, single


def _as_chunk(chunk: Any, index: int | None, single: bool) -> Chunk:
    where = "" if index is None else f"chunk {index}: "
    if single:
        if not isinstance(chunk, np.ndarray):
            raise TypeError(
                f"{where}chunk 0 was a numpy array, so every chunk must be one (the rows of one "
                f"array), got {type(chunk).__name__}; yield arrays only, or dicts only"
            )
        return {SINGLE_LEAF: _leaf_array(chunk, "the array", index)}
    if not isinstance(chunk, Mapping):
        raise TypeError(
            f"{where}each chunk must be a dict of leaf name -> numpy array (or, for one array, a "
            f"numpy array in every chunk), got {type(chunk).__name__}"
        )
    if not chunk:
        raise ValueError(f"{where}no leaves to write: got an empty dict")
    leaves = {}
    for name, value in chunk.items():
        if not isinstance(name, str) or not _LEAF_NAME.fullmatch(name) or name == METADATA_FILE:
            raise ValueError(
                f"{where}leaf name {name!r} is not a plain directory name; use letters, digits, "
                "'_', '-' and '.' (not first)"
            )
        leaves[name] = _leaf_array(value, f"leaf {name!r}", index)
    lengths = {k: len(v) for k, v in leaves.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{where}every leaf needs the same number of rows, got {lengths}; trim or pad the "
            "leaves to one length"
        )
    return leaves


def _leaf_array(value: Any, what: str, index: int | None) -> np.ndarray:
    where = "" if index is None else f"chunk {index}: "
    value = as_rows(value, f"{where}{what}")
    try:
        if value.dtype.kind in "OSUMmV" and value.dtype.name != "bfloat16":
            raise TypeError
        ts.dtype(value.dtype.name)
    except TypeError:
        raise TypeError(
            f"{where}{what} has dtype {value.dtype}; datasets store numeric and bool arrays "
            "(encode strings or objects as numbers first)"
        ) from None
    return value


def _rows(array: np.ndarray) -> int:
    return len(array) if array.ndim else 0


def _schema_of(chunk: Chunk) -> Schema:
    return {k: (v.dtype.newbyteorder("="), v.shape[1:]) for k, v in chunk.items()}


def _checked(first: Chunk, rest: Iterator[Chunk], schema: Schema) -> Iterator[Chunk]:
    """The chunks, each checked to have the first chunk's leaves, dtypes and trailing shapes."""
    yield first
    for index, chunk in enumerate(rest, start=1):
        got = _schema_of(chunk)
        if got != schema:
            want = {k: f"{d}{list(s)}" for k, (d, s) in schema.items()}
            have = {k: f"{d}{list(s)}" for k, (d, s) in got.items()}
            raise ValueError(
                f"chunk {index} has leaves {have}, but chunk 0 had {want}; every chunk must have "
                "the same leaves, dtypes and trailing shapes (cast or pad the chunk)"
            )
        yield chunk


def _check_target(path: Path, overwrite: bool) -> None:
    """Refuses a file, a non-empty directory without ``overwrite``, any foreign directory, and
    the working directory (or one above it), which the final rename would pull from under us."""
    here = Path.cwd()
    if Path(os.path.abspath(path)) in (here, *here.parents):
        raise ValueError(
            f"write_dataset cannot write to {path}: it is the current directory or holds it, and "
            "the finished dataset is renamed into place; give a path below it, e.g. "
            f"write_dataset('{path}/dataset', ...)"
        )
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file; write_dataset needs a directory path")
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{path} already exists and is not empty; pass overwrite=True to replace a psdp "
                "dataset there, or choose a new path"
            )
        if not ((path / METADATA_FILE).exists() or (path / INCOMPLETE_MARKER).exists()):
            raise FileExistsError(
                f"refusing to overwrite {path}: it is not a psdp dataset (no {METADATA_FILE} or "
                f"{INCOMPLETE_MARKER}); delete it yourself or choose a new path"
            )


def _staging_directory(path: Path) -> Path:
    """A new hidden directory beside ``path``, marked unfinished, to write the dataset into."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.psdp-partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # not mkdtemp: its mode 0o700 would hide the dataset from other users
    (staging / INCOMPLETE_MARKER).touch()
    return staging


def _swap_into_place(
    staging: Path, path: Path, overwrite: bool, before: tuple[int, int, int] | None
) -> None:
    """Renames the finished ``staging`` to ``path`` if the dataset there is still the one this
    write saw when it began (``before``); an old dataset there is deleted only then. The check
    and the renames hold the commit lock, so of two concurrent writers exactly one commits."""
    with _commit_lock(path):
        _check_target(path, overwrite)  # again: the directory may have changed during the write
        if _identity(path) != before:
            raise FileExistsError(
                f"another write committed to {path} while this one ran (its {METADATA_FILE} "
                "changed after this write began); this write's files are deleted and the other "
                "dataset is kept. Write to one place from one process at a time, or run this "
                "write again (with overwrite=True) to replace the other one"
            )
        if path.is_dir() and any(path.iterdir()):
            old = path.parent / f".{path.name}.psdp-old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
            try:
                os.rename(staging, path)
            except BaseException:
                os.rename(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
            return
        if path.is_dir():
            path.rmdir()  # empty: os.rename replaces an empty directory on POSIX, not on Windows
        os.rename(staging, path)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which dataset is at ``path``: its ``psdp.json``'s inode, modification time and size
    (every commit renames a new file into place), or ``None`` for none."""
    try:
        stat = (path / METADATA_FILE).stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


@contextlib.contextmanager
def _commit_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``.<name>.psdp-lock`` beside ``path`` (released by the
    system if the process dies), and removes the file on release."""
    lock = path.parent / f".{path.name}.psdp-lock"
    while True:
        handle = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except BaseException:
            os.close(handle)
            raise
        if _same_file(handle, lock):
            break
        os.close(handle)  # the holder before us removed this file on release: lock the next one
    try:
        yield
    finally:
        os.unlink(lock)
        os.close(handle)


def _same_file(handle: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(handle).st_ino
    except FileNotFoundError:
        return False


def _metadata_of(
    schema: Schema, writer: ShardedWriter, single: bool, layout: dict[str, Any]
) -> dict[str, Any]:
    return {
        "format": DATASET_FORMAT,
        "version": DATASET_VERSION,
        "num_rows": writer.written,
        "single_array": single,
        "rows_per_shard": writer.rows_per_shard,
        **layout,
        "leaves": {k: {"dtype": d.name, "shape": list(s)} for k, (d, s) in schema.items()},
    }


def _write_metadata(path: Path, meta: dict[str, Any]) -> None:
    staged = path / f"{METADATA_FILE}.tmp"
    staged.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(staged, path / METADATA_FILE)  # a reader sees no metadata or all of it


def _file_kvstore(path: Path) -> dict[str, Any]:
    return {"driver": "file", "path": f"{path.resolve()}/"}
