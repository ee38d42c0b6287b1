"""Sources: where rows come from. Every source is a sized table read in batches.

A source has ``len(source)`` rows and ``source.read(ids)`` returns those rows (an int64 array of
row ids, any order, repeats allowed) as one array or a dict of arrays whose first dimension is
``len(ids)``. Reads are batched (one call per step, never one per row) and must be thread-safe.
``as_source`` accepts what users already have: a numpy array, a dict of equally long arrays, or any
object with ``__len__`` and a batched ``__getitem__(ids)``.

On disk (see ``docs/sources.md``): `TensorStoreSource` reads a dataset written by
`psdp.writer.write_dataset` (one zarr3 array per leaf, sharded files of many rows, one row per
inner chunk, so a random row costs one small read) with one batched TensorStore read per leaf per
step; `MemmapSource` maps ``.npy`` files; `GrainSource` adapts a Grain-style per-record source by
reading a step's records on a small thread pool. Missing or damaged data is an error, never a
silently wrong batch: a missing zarr3 shard would otherwise read as the fill value.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import tensorstore as ts

from psdp._checks import check_int, preview_ids

Rows: TypeAlias = "np.ndarray | dict[str, np.ndarray]"

#: The metadata file of a psdp dataset directory; `write_dataset` writes it last.
METADATA_FILE = "psdp.json"
#: Present while `write_dataset` is writing; a directory that still has it is an unfinished write.
INCOMPLETE_MARKER = ".psdp-incomplete"
#: The ``format`` and ``version`` of ``psdp.json`` this code reads and writes.
DATASET_FORMAT = "psdp.zarr3"
DATASET_VERSION = 1
#: The leaf name under which a dataset written from one array stores it (reads return an array).
SINGLE_LEAF = "array"


@runtime_checkable
class Source(Protocol):
    """What the loader reads from."""

    def __len__(self) -> int: ...

    def read(self, ids: np.ndarray) -> Rows: ...

    def describe(self) -> str: ...


class ArraySource:
    """In-memory rows: one array ``(N, ...)`` or a dict of arrays with the same ``N``.

    Example:
        >>> src = ArraySource({"tokens": np.arange(12).reshape(6, 2), "weight": np.ones(6)})
        >>> len(src), src.read(np.array([4, 1]))["tokens"].tolist()
        (6, [[8, 9], [2, 3]])
    """

    def __init__(self, data: np.ndarray | Mapping[str, np.ndarray]):
        if isinstance(data, Mapping):
            if not data:
                raise ValueError("a dict source needs at least one leaf, got an empty dict")
            leaves = {str(k): _as_rows(v, f"leaf {k!r}") for k, v in data.items()}
            lengths = {k: len(v) for k, v in leaves.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(
                    f"every leaf of a dict source needs the same number of rows, got {lengths}; "
                    "trim or pad the leaves to one length"
                )
            self._data: Rows = leaves
            self._len = next(iter(lengths.values()))
        else:
            self._data = _as_rows(data, "the source")
            self._len = len(self._data)

    def __len__(self) -> int:
        return self._len

    def read(self, ids: np.ndarray) -> Rows:
        if isinstance(self._data, dict):
            return {k: v[ids] for k, v in self._data.items()}
        return self._data[ids]

    def describe(self) -> str:
        return f"ArraySource({_describe_rows(self._data)})"


class IndexableSource:
    """Adapts any object with ``__len__`` and a batched ``__getitem__(ids)``."""

    def __init__(self, obj: Any):
        self._obj = obj

    def __len__(self) -> int:
        return len(self._obj)

    def read(self, ids: np.ndarray) -> Rows:
        return self._obj[ids]

    def describe(self) -> str:
        return f"IndexableSource({type(self._obj).__name__}, {len(self)} rows)"


class TensorStoreSource:
    """Rows of a zarr3 dataset on disk (or of one TensorStore array), one batched read per leaf.

    A dataset is a directory written by `psdp.writer.write_dataset`: ``psdp.json`` (leaves, row
    count, dtypes, trailing shapes) and one zarr3 array per leaf in a sub-directory of that name.
    Each step reads all its rows with one TensorStore index-array read per leaf, all leaves in one
    ``ts.Batch``; ids may be unsorted and repeated. Opening checks ``psdp.json`` against every
    array (row count, dtype, trailing shape) and that every shard file exists, and every read
    refuses to fill missing chunks with the fill value, so a damaged store raises instead of
    yielding a wrong batch. Thread-safe.

    Args:
        path_or_spec: a dataset directory; a directory holding one zarr3 array (``zarr.json``);
            a TensorStore spec dict of one array, e.g. ``{"driver": "zarr3", "kvstore":
            "memory://rows/"}``; or an open ``ts.TensorStore``. A single array reads as an
            array, a dataset as a dict of arrays (or an array if it was written from one).
        cache_bytes: size of a TensorStore chunk cache shared by the leaves; ``None``: no cache
            (the OS page cache still serves local files).
        context: the ``ts.Context`` to open in; a ``memory://`` store is only visible through
            the context it was written in. Default: a fresh context.
        check_shards: on open, check that every shard file of a dataset exists and is non-empty
            (one ``stat`` per shard file).

    Example:
        >>> import tempfile
        >>> from psdp.writer import write_dataset
        >>> tmp = tempfile.TemporaryDirectory()
        >>> rows = {"tokens": np.arange(12, dtype=np.int32).reshape(6, 2)}
        >>> path = write_dataset(f"{tmp.name}/ds", rows, rows_per_shard=4, progress=False)
        >>> src = TensorStoreSource(path)
        >>> len(src), src.read(np.array([5, 0, 5]))["tokens"].tolist()
        (6, [[10, 11], [0, 1], [10, 11]])
        >>> tmp.cleanup()
    """

    def __init__(
        self,
        path_or_spec: str | os.PathLike[str] | Mapping[str, Any] | ts.TensorStore,
        *,
        cache_bytes: int | None = None,
        context: ts.Context | None = None,
        check_shards: bool = True,
    ):
        if cache_bytes is not None:
            check_int("cache_bytes", cache_bytes, minimum=0)
        parent = ts.Context() if context is None else context
        self._context = (
            parent
            if cache_bytes is None
            else ts.Context({"cache_pool": {"total_bytes_limit": int(cache_bytes)}}, parent)
        )
        self.path: Path | None = None
        self._single = True
        if isinstance(path_or_spec, ts.TensorStore):
            self._where = "an open TensorStore"
            self._arrays = {SINGLE_LEAF: path_or_spec}
        elif isinstance(path_or_spec, Mapping):
            spec = _strict_spec(dict(path_or_spec))
            self._where = f"the TensorStore spec with kvstore {spec.get('kvstore')!r}"
            self._arrays = {SINGLE_LEAF: _open_array(spec, self._context, self._where)}
        elif isinstance(path_or_spec, str | os.PathLike):
            self.path = Path(path_or_spec)
            self._where = str(self.path)
            self._arrays = self._open_directory(self.path, check_shards)
        else:
            raise TypeError(
                "path_or_spec must be a dataset directory path, a TensorStore spec dict or a "
                f"ts.TensorStore, got {type(path_or_spec).__name__}"
            )
        if self._single:
            self._len = _rows_of_single_array(self._arrays[SINGLE_LEAF], self._where)
        self._leaf_types = {
            name: (np.dtype(a.dtype.numpy_dtype), tuple(a.shape[1:]))
            for name, a in self._arrays.items()
        }

    def _open_directory(self, path: Path, check_shards: bool) -> dict[str, ts.TensorStore]:
        if not path.exists():
            raise FileNotFoundError(
                f"no dataset at {path}: the path does not exist; write one with "
                "psdp.write_dataset(path, arrays) or check the path"
            )
        if not path.is_dir():
            hint = "; for a .npy file use MemmapSource" if path.suffix == ".npy" else ""
            raise ValueError(
                f"{path} is a file, but TensorStoreSource needs a dataset directory written by "
                f"psdp.write_dataset (with {METADATA_FILE} and one zarr3 array per leaf){hint}"
            )
        if not (path / METADATA_FILE).is_file():
            if (path / "zarr.json").is_file():  # one plain zarr3 array
                spec = _strict_spec({"driver": "zarr3", "kvstore": _file_kvstore(path)})
                return {SINGLE_LEAF: _open_array(spec, self._context, str(path))}
            unfinished = (path / INCOMPLETE_MARKER).exists()
            raise ValueError(
                f"{path} is not a psdp dataset: it has no {METADATA_FILE}"
                + (
                    f" and still has {INCOMPLETE_MARKER}, so write_dataset did not finish; "
                    "rerun it with overwrite=True"
                    if unfinished
                    else "; write one with psdp.write_dataset(path, arrays)"
                )
            )
        meta = read_metadata(path)
        self._single = bool(meta["single_array"])
        self._len = int(meta["num_rows"])
        arrays = {}
        for name, leaf in meta["leaves"].items():
            leaf_path = path / name
            if not (leaf_path / "zarr.json").is_file():
                raise ValueError(
                    f"{path}: leaf {name!r} is listed in {METADATA_FILE} but "
                    f"{leaf_path / 'zarr.json'} does not exist; the dataset is incomplete, "
                    "rewrite it with write_dataset(..., overwrite=True)"
                )
            spec = _strict_spec({"driver": "zarr3", "kvstore": _file_kvstore(leaf_path)})
            array = _open_array(spec, self._context, f"{path} (leaf {name!r})")
            _check_leaf_matches(path, name, array, self._len, leaf)
            if check_shards:
                _check_shard_files(path, name, leaf_path, array)
            arrays[name] = array
        return arrays

    def __len__(self) -> int:
        return self._len

    def read(self, ids: np.ndarray) -> Rows:
        ids = _check_ids(ids, self._len, self._where)
        if ids.size == 0:
            rows = {
                k: np.empty((0, *shape), dtype) for k, (dtype, shape) in self._leaf_types.items()
            }
        else:
            try:
                with ts.Batch() as batch:  # all leaves' reads go to the kvstore together
                    futures = {k: a[ids].read(batch=batch) for k, a in self._arrays.items()}
                rows = {k: f.result() for k, f in futures.items()}
            except ValueError as error:
                raise ValueError(
                    f"reading {ids.size} rows (ids {preview_ids(ids)}) from {self._where} failed: "
                    f"{error}. The store is damaged or incomplete (e.g. a missing or truncated "
                    "shard file); rewrite it with write_dataset(..., overwrite=True)"
                ) from error
        return rows[SINGLE_LEAF] if self._single else rows

    def describe(self) -> str:
        leaves = ", ".join(
            f"{k}: {dtype}{[self._len, *shape]}" for k, (dtype, shape) in self._leaf_types.items()
        )
        return f"TensorStoreSource({self._where}: {leaves})"


class MemmapSource(ArraySource):
    """Rows of ``.npy`` files (``np.save``), memory-mapped: one file, or a dict leaf -> file.

    The fastest source for random rows on a local disk (a read is a gather from the page cache),
    but the files must hold uncompressed arrays and the OS decides what stays in memory.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.save(f"{tmp.name}/tokens.npy", np.arange(8).reshape(4, 2))
        >>> src = MemmapSource({"tokens": f"{tmp.name}/tokens.npy"})
        >>> len(src), src.read(np.array([3, 3, 0]))["tokens"].tolist()
        (4, [[6, 7], [6, 7], [0, 1]])
        >>> tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]):
        if isinstance(path, Mapping):
            if not path:
                raise ValueError("a dict of .npy files needs at least one leaf, got an empty dict")
            self._files = {str(k): Path(p) for k, p in path.items()}
            leaves = {k: _map_npy(p, f"leaf {k!r}") for k, p in self._files.items()}
            lengths = {k: len(v) for k, v in leaves.items()}
            if len(set(lengths.values())) > 1:
                files = {k: str(p) for k, p in self._files.items()}
                raise ValueError(
                    f"every .npy file of a MemmapSource needs the same number of rows, got "
                    f"{lengths} from {files}; rewrite the files with one row count"
                )
            super().__init__(leaves)
        elif isinstance(path, str | os.PathLike):
            self._files = {SINGLE_LEAF: Path(path)}
            super().__init__(_map_npy(Path(path), "the source"))
        else:
            raise TypeError(
                "MemmapSource needs a .npy path or a dict of leaf name -> .npy path, got "
                f"{type(path).__name__}"
            )

    def read(self, ids: np.ndarray) -> Rows:
        rows = super().read(ids)
        if isinstance(rows, dict):
            return {k: np.asarray(v) for k, v in rows.items()}
        return np.asarray(rows)

    def describe(self) -> str:
        files = ", ".join(str(p) for p in self._files.values())
        return f"MemmapSource({_describe_rows(self._data)} from {files})"


class GrainSource:
    """Adapts a Grain-style random-access source: ``__len__`` and ``__getitem__(int)`` per record.

    Grain's sources (``grain.sources.ArrayRecordDataSource``, ``grain.MapDataset``, ...) read one
    record per call. A step's records are fetched on a small thread pool (each thread reads a
    contiguous slice of the unique ids) and stacked per leaf; a record is an array or a dict of
    arrays. Grain itself is never imported: any object with that interface works.

    Args:
        data_source: the per-record source.
        num_threads: threads fetching records; 1 reads on the calling thread.

    Example:
        >>> records = [{"x": np.array([i, 10 * i])} for i in range(5)]
        >>> with GrainSource(records, num_threads=2) as src:
        ...     src.read(np.array([3, 1, 3]))["x"].tolist()
        [[3, 30], [1, 10], [3, 30]]
    """

    def __init__(self, data_source: Any, *, num_threads: int = 8):
        for method in ("__len__", "__getitem__"):
            if not hasattr(data_source, method):
                raise TypeError(
                    f"GrainSource needs a random-access source with __len__ and "
                    f"__getitem__(int), but {type(data_source).__name__} has no {method}; "
                    "wrap an iterable dataset in a list, or use a grain MapDataset with a length"
                )
        check_int("num_threads", num_threads, minimum=1)
        self._source = data_source
        self.num_threads = num_threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._source)

    def read(self, ids: np.ndarray) -> Rows:
        ids = _check_ids(ids, len(self), type(self._source).__name__)
        unique, inverse = np.unique(ids, return_inverse=True)
        if unique.size == 0:  # learn the leaves from record 0, keep none of its rows
            unique, inverse = np.zeros(1, np.int64), np.zeros(0, np.int64)
        records = self._fetch(unique.tolist())
        return _stack_records(records, unique, type(self._source).__name__, inverse)

    def _fetch(self, ids: list[int]) -> list[Any]:
        if self.num_threads == 1 or len(ids) < 2:
            return [self._source[i] for i in ids]
        parts = [p for p in np.array_split(np.asarray(ids), self.num_threads) if p.size]
        pool = self._executor()
        chunks = pool.map(lambda part: [self._source[int(i)] for i in part], parts)
        return [record for chunk in chunks for record in chunk]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="psdp-grain")
            return self._pool

    def close(self) -> None:
        """Stops the fetch threads (a later read starts them again); idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> GrainSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def describe(self) -> str:
        return (
            f"GrainSource({type(self._source).__name__}, {len(self)} records, "
            f"{self.num_threads} threads)"
        )


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked ``psdp.json`` of the dataset directory ``path``.

    Returns:
        ``{"format", "version", "num_rows", "single_array", "rows_per_shard", "rows_per_chunk",
        "compression", "checksum", "leaves": {name: {"dtype": str, "shape": [trailing]}}}``.
    """
    meta_file = Path(path) / METADATA_FILE
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"cannot read the dataset metadata {meta_file}: {error}; rewrite the dataset with "
            "write_dataset(..., overwrite=True)"
        ) from error
    problem = _metadata_problem(meta)
    if problem:
        raise ValueError(
            f"{meta_file} is not valid psdp dataset metadata: {problem}; rewrite the dataset "
            "with write_dataset(..., overwrite=True)"
        )
    return meta


def _metadata_problem(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return f"expected a JSON object, got {type(meta).__name__}"
    if meta.get("format") != DATASET_FORMAT or meta.get("version") != DATASET_VERSION:
        return (
            f"format {meta.get('format')!r} version {meta.get('version')!r}, but this psdp reads "
            f"{DATASET_FORMAT!r} version {DATASET_VERSION}"
        )
    rows = meta.get("num_rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        return f"num_rows must be a positive int, got {rows!r}"
    leaves = meta.get("leaves")
    if not isinstance(leaves, dict) or not leaves:
        return f"leaves must be a non-empty object, got {leaves!r}"
    for name, leaf in leaves.items():
        if not isinstance(leaf, dict) or not isinstance(leaf.get("dtype"), str):
            return f"leaf {name!r} needs a dtype string, got {leaf!r}"
        shape = leaf.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return f"leaf {name!r} needs a shape list of ints, got {shape!r}"
        if os.sep in name or name.startswith("."):
            return f"leaf name {name!r} is not a plain directory name"
    if meta.get("single_array") and list(leaves) != [SINGLE_LEAF]:
        return f"a single-array dataset must have the one leaf {SINGLE_LEAF!r}, got {list(leaves)}"
    return None


def _strict_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Zarr specs read missing chunks as errors, not as the fill value, unless the spec says."""
    if spec.get("driver") in ("zarr", "zarr3"):
        spec.setdefault("fill_missing_data_reads", False)
    return spec


def _file_kvstore(path: Path) -> dict[str, str]:
    return {"driver": "file", "path": f"{path.resolve()}/"}


def _open_array(spec: dict[str, Any], context: ts.Context, where: str) -> ts.TensorStore:
    try:
        return ts.open(spec, read=True, open=True, context=context).result()
    except ValueError as error:
        raise ValueError(
            f"cannot open {where} as a TensorStore array: {error}; check the path or spec "
            "(a dataset written by psdp.write_dataset opens by its directory path)"
        ) from error


def _rows_of_single_array(array: ts.TensorStore, where: str) -> int:
    if array.rank == 0:
        raise ValueError(f"{where} is a 0-d array; a source needs a row dimension")
    if array.domain.inclusive_min[0] != 0:
        raise ValueError(
            f"{where} has rows starting at {array.domain.inclusive_min[0]}; a source needs "
            "rows numbered from 0 (translate the array with store.translate_to[0])"
        )
    return int(array.shape[0])


def _check_leaf_matches(
    path: Path, name: str, array: ts.TensorStore, num_rows: int, leaf: Mapping[str, Any]
) -> None:
    """The zarr3 array of a leaf has the row count, dtype and trailing shape psdp.json says."""
    got_dtype = np.dtype(array.dtype.numpy_dtype)
    want_shape = (num_rows, *leaf["shape"])
    problems = []
    if array.rank == 0 or tuple(array.shape) != want_shape:
        problems.append(f"shape {tuple(array.shape)} but {METADATA_FILE} says {want_shape}")
    if got_dtype.name != leaf["dtype"]:
        problems.append(f"dtype {got_dtype.name} but {METADATA_FILE} says {leaf['dtype']}")
    if problems:
        raise ValueError(
            f"{path}: leaf {name!r} has {' and '.join(problems)}; the array was changed after "
            "the dataset was written, rewrite the dataset with write_dataset(..., overwrite=True)"
        )


def _check_shard_files(path: Path, name: str, leaf_path: Path, array: ts.TensorStore) -> None:
    """Every shard file of a leaf exists and is non-empty (a missing one reads as fill value)."""
    zarr_meta = json.loads((leaf_path / "zarr.json").read_text())
    encoding = zarr_meta.get("chunk_key_encoding", {})
    if (
        encoding.get("name") != "default"
        or encoding.get("configuration", {}).get("separator", "/") != "/"
    ):
        return  # not the layout write_dataset makes; reads still refuse missing chunks
    shard = zarr_meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
    if not isinstance(shard, list) or len(shard) != array.rank:
        return
    grid = [range(math.ceil(n / c)) for n, c in zip(array.shape, shard, strict=True)]
    missing = []
    for key in itertools.product(*grid):
        file = leaf_path.joinpath("c", *map(str, key))
        try:
            empty = file.stat().st_size == 0
        except FileNotFoundError:
            empty = True
        if empty:
            missing.append(file)
    if missing:
        shown = ", ".join(str(f.relative_to(path)) for f in missing[:3])
        raise ValueError(
            f"{path}: leaf {name!r} is missing {len(missing)} shard file(s) or has them empty "
            f"({shown}{', ...' if len(missing) > 3 else ''}); those rows would read as zeros. "
            "Restore the files or rewrite the dataset with write_dataset(..., overwrite=True)"
        )


def _map_npy(path: Path, what: str) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"{what}: no .npy file at {path}; check the path")
    if path.is_dir():
        raise ValueError(
            f"{what}: {path} is a directory, not a .npy file; for a dataset directory written by "
            "psdp.write_dataset use TensorStoreSource"
        )
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(
            f"{what}: {path} is not a readable .npy file ({error}); MemmapSource maps arrays "
            "saved with np.save"
        ) from error
    if not isinstance(array, np.ndarray):
        array.close()
        raise ValueError(
            f"{what}: {path} is an .npz archive, not a .npy file; save each array with np.save "
            "and pass a dict of leaf name -> .npy path"
        )
    return _as_rows(array, f"{what} ({path})")


def _stack_records(
    records: Sequence[Any], ids: np.ndarray, where: str, inverse: np.ndarray
) -> Rows:
    """Stacks per-record arrays (or dicts of arrays) into rows, then repeats rows per ``inverse``."""
    if isinstance(records[0], Mapping):
        keys = set(records[0])
        for i, record in zip(ids, records, strict=True):
            if not isinstance(record, Mapping) or set(record) != keys:
                got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
                raise ValueError(
                    f"{where}: record {int(ids[0])} has leaves {sorted(keys)} but record {int(i)} "
                    f"has {got}; every record must have the same leaves"
                )
        return {
            str(k): _stack_leaf([r[k] for r in records], ids, f"{where} leaf {k!r}")[inverse]
            for k in records[0]
        }
    return _stack_leaf(records, ids, where)[inverse]


def _stack_leaf(values: Sequence[Any], ids: np.ndarray, where: str) -> np.ndarray:
    arrays = [np.asarray(v) for v in values]
    first = arrays[0]
    for i, a in zip(ids, arrays, strict=True):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(
                f"{where}: record {int(i)} is {a.dtype}{list(a.shape)} but record {int(ids[0])} "
                f"is {first.dtype}{list(first.shape)}; every record must have one shape and dtype "
                "(pad or cast the records)"
            )
    return np.stack(arrays)


def _check_ids(ids: Any, num_rows: int, where: str) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(
            f"row ids must be a 1-d integer array, got {ids.dtype}{list(ids.shape)} for {where}"
        )
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise IndexError(
            f"row ids must be in [0, {num_rows - 1}] for {where} ({num_rows} rows), got ids from "
            f"{int(ids.min())} to {int(ids.max())}"
        )
    return ids


def as_source(data: Any) -> Source:
    """Returns ``data`` as a `Source`: sources pass through; arrays and dicts become `ArraySource`."""
    if isinstance(data, Source):
        return data
    if isinstance(data, np.ndarray | Mapping):
        return ArraySource(data)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        return IndexableSource(data)
    raise TypeError(
        f"cannot read rows from a {type(data).__name__}; pass a numpy array, a dict of arrays, a "
        "psdp source, or an object with __len__ and a batched __getitem__(ids)"
    )


def _as_rows(value: Any, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy array with rows along dimension 0, got "
            f"{type(value).__name__}; convert it with np.asarray"
        )
    if value.ndim == 0:
        raise ValueError(f"{what} is a 0-d array; it needs a row dimension")
    return value


def _describe_rows(data: Rows) -> str:
    if isinstance(data, dict):
        return ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in data.items())
    return f"{data.dtype}{list(data.shape)}"
