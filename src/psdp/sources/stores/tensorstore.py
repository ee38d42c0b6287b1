"""`TensorStoreSource`: rows of a zarr3 dataset (written by `write_dataset`), one batched read per
leaf, and the dataset format's constants and `read_metadata`, shared with the writer. The layout,
and how missing or damaged data becomes an error, never a wrong batch: ``docs/guides/stores.md``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from psdp._checks import check_int, preview_ids
from psdp._plan.leaves import SINGLE_LEAF, Key, in_leaf_order
from psdp._plan.windows import Box
from psdp.sources.base import Rows, check_ids, fresh_rows
from psdp.sources.stores.errors import TransientReadError, is_transient_status, retried_write
from psdp.sources.stores.location import (
    DATA_PREFIX,
    Location,
    check_reach,
    environment_credentials,
    is_kvstore_spec,
    list_keys,
    locate,
    open_kvstore,
    redacted_message,
)

#: The metadata file of a psdp dataset directory; `write_dataset` writes it last.
METADATA_FILE = "psdp.json"
#: Present while `write_dataset` is writing; a directory that still has it is an unfinished write.
INCOMPLETE_MARKER = ".psdp-incomplete"
#: The ``format`` and ``version`` of ``psdp.json`` this code reads and writes.
DATASET_FORMAT = "psdp.zarr3"
DATASET_VERSION = 1
#: How many times opening a remote dataset starts again when an overwrite commits meanwhile.
OPEN_ATTEMPTS = 3
#: How a committed remote dataset is opened: the objects below its data prefix never change
#: (a write fills a new prefix), so what the cache holds is never checked again (a conditional
#: GET per object and read, otherwise).
COMMITTED: dict[str, Any] = {"recheck_cached_data": False, "recheck_cached_metadata": False}
_PREFIX = re.compile(rf"(|{DATA_PREFIX}[0-9a-f]+/)")


class TensorStoreSource:
    """Rows of a zarr3 dataset on disk (or of one TensorStore array), one batched read per leaf.

    Ids may be unsorted and repeated; all leaves are read in one ``ts.Batch``. A damaged store
    raises on open or on read, never yields a wrong batch (``docs/guides/stores.md``). Thread-safe.

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

    Examples:
        >>> import tempfile
        >>> from psdp.sources.stores.writer import write_dataset
        >>> tmp = tempfile.TemporaryDirectory()
        >>> rows = {"tokens": np.arange(12, dtype=np.int32).reshape(6, 2)}
        >>> path = write_dataset(f"{tmp.name}/ds", rows, rows_per_shard=4, progress=False)
        >>> src = TensorStoreSource(path)
        >>> len(src), src.read(np.array([5, 0, 5]))["tokens"].tolist()
        (6, [[10, 11], [0, 1], [10, 11]])
        >>> tmp.cleanup()
    """

    #: its reads wait on storage and release the GIL: unset ``read_threads`` give it several
    reads_storage = True

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
        #: whether the rows come from an object store (then `request_counts` means something)
        self.remote = False
        self._single = True
        if isinstance(path_or_spec, ts.TensorStore):
            self._where = "an open TensorStore"
            self._arrays = {SINGLE_LEAF: path_or_spec}
        elif isinstance(path_or_spec, Mapping) and not is_kvstore_spec(path_or_spec):
            spec = _strict_spec(dict(path_or_spec))
            self._where = f"the TensorStore spec with kvstore {spec.get('kvstore')!r}"
            if "kvstore" in spec:  # quiet: no ERROR lines from TensorStore's AWS layer
                spec["kvstore"] = environment_credentials(spec["kvstore"])
            if isinstance(spec.get("kvstore"), Mapping):
                check_reach(spec["kvstore"], self._where, self._context)
            kvstore = spec.get("kvstore")
            driver = kvstore.get("driver") if isinstance(kvstore, Mapping) else str(kvstore)
            self.remote = str(driver).split(":")[0] not in ("file", "memory", "None")
            self._arrays = {SINGLE_LEAF: _open_array(spec, self._context, self._where)}
        elif isinstance(path_or_spec, str | os.PathLike | Mapping):
            location = locate(path_or_spec)
            self._where = location.name
            if location.local is not None:
                self.path = location.local
                self._arrays = self._open_directory(self.path, check_shards)
            else:
                self.remote = True
                self._arrays = self._open_remote(location, check_shards)
        else:
            raise TypeError(
                "path_or_spec must be a dataset directory path, a kvstore URL or spec, a "
                f"TensorStore spec dict or a ts.TensorStore, got {type(path_or_spec).__name__}"
            )
        if self._single:
            self._len = _rows_of_single_array(self._arrays[SINGLE_LEAF], self._where)
        self._arrays = in_leaf_order(self._arrays)  # reads return the leaves in this order
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
            _check_leaf_matches(str(path), name, array, self._len, leaf)
            if check_shards:
                _check_shard_files(path, name, leaf_path, array)
            arrays[name] = array
        return arrays

    def _open_remote(self, location: Location, check_shards: bool) -> dict[str, ts.TensorStore]:
        store = open_kvstore(location, self._context)
        for _ in range(OPEN_ATTEMPTS):
            meta, generation = _read_remote_metadata(store, location)
            if meta is None:
                return self._open_remote_array(store, location)
            try:
                return self._open_remote_dataset(store, location, meta, check_shards)
            except ValueError as error:
                # An overwrite that commits while this open runs deletes the prefix it read
                # psdp.json naming: then open the new dataset; else the dataset is damaged.
                if _read_remote_metadata(store, location)[1] == generation:
                    raise
                overwritten = error
        raise ValueError(
            f"{location.name} was overwritten while it was being opened, {OPEN_ATTEMPTS} times "
            f"in a row (its {METADATA_FILE} changed each time; the dataset is not damaged); "
            "open it again once the writes to it are done"
        ) from overwritten

    def _open_remote_array(self, store: ts.KvStore, location: Location) -> dict[str, Any]:
        """A prefix with no psdp.json: one plain zarr3 array, or an error saying what is there."""
        if store.read(b"zarr.json").result().state == "value":
            spec = _strict_spec({"driver": "zarr3", "kvstore": location.below("")})
            return {SINGLE_LEAF: _open_array(spec, self._context, location.name)}
        unfinished = any(k.startswith(DATA_PREFIX) for k in list_keys(store))
        raise FileNotFoundError(
            f"no dataset at {location.name}: it has no {METADATA_FILE}"
            + (
                f" but holds {DATA_PREFIX}* objects, so a write_dataset there did not "
                "finish; rerun it with overwrite=True"
                if unfinished
                else "; write one with psdp.write_dataset(url_or_spec, arrays) or check "
                "the URL, bucket and path"
            )
        )

    def _open_remote_dataset(
        self, store: ts.KvStore, location: Location, meta: dict[str, Any], check_shards: bool
    ) -> dict[str, ts.TensorStore]:
        """The leaves of the dataset ``meta`` (its psdp.json) names, each checked."""
        self._single = bool(meta["single_array"])
        self._len = int(meta["num_rows"])
        prefix = meta.get("data_prefix", "")
        arrays = {}
        for name, leaf in meta["leaves"].items():
            spec = _strict_spec(
                {"driver": "zarr3", "kvstore": location.below(f"{prefix}{name}/"), **COMMITTED}
            )
            where = f"{location.name} (leaf {name!r})"
            array = _open_array(spec, self._context, where)
            _check_leaf_matches(location.name, name, array, self._len, leaf)
            if check_shards:
                present = set(list_keys(store, f"{prefix}{name}/c/"))
                missing = [f"{prefix}{name}/{key}" for key in _shard_keys(array)]
                _refuse_missing_shards(
                    location.name, name, [k for k in missing if k not in present]
                )
            arrays[name] = array
        return arrays

    def __len__(self) -> int:
        return self._len

    @fresh_rows  # every TensorStore read returns a new array (tested)
    def read(self, ids: np.ndarray) -> Rows:
        ids = check_ids(ids, self._len, self._where)
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
                raise self._read_error(
                    error, f"{ids.size} rows (ids {preview_ids(ids)})"
                ) from error
        return rows[SINGLE_LEAF] if self._single else rows

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Only some leaves (``None``: a single-array store), each cut to a range of dimension 1
        or to a box of several dimensions (``docs/guides/spatial.md``, "Spatial reads").

        One batched read, like `read`; a windowed host reads only its columns' or box's chunks.
        """
        ids = check_ids(ids, self._len, self._where)
        arrays = {key: self._arrays[SINGLE_LEAF if key is None else key] for key in columns}
        try:
            with ts.Batch() as batch:
                futures = {
                    key: _box_of(a, ids, columns[key]).read(batch=batch)
                    for key, a in arrays.items()
                }
            return in_leaf_order({key: f.result() for key, f in futures.items()})
        except ValueError as error:
            what = f"{ids.size} rows (ids {preview_ids(ids)}, columns {dict(columns)})"
            raise self._read_error(error, what) from error

    def _read_error(self, error: ValueError, what: str) -> Exception:
        """A transient store error (unreachable, throttled, 5xx: TensorStore's own request
        retries spent) as `TransientReadError`, which the loader retries; any other, such as a
        missing object or a checksum mismatch, as a `ValueError` naming the object."""
        if is_transient_status(str(error)):
            return TransientReadError(
                f"reading {what} from {self._where} failed: {error}. The store did not answer "
                "in time or asked to slow down; the loader retries such reads (read_attempts)"
            )
        return ValueError(
            f"reading {what} from {self._where} failed: {error}. The store is damaged or "
            "incomplete (e.g. a missing, truncated or corrupted shard file); rewrite it with "
            "write_dataset(..., overwrite=True)"
        )

    @staticmethod
    def request_counts() -> tuple[int, int]:
        """``(HTTP requests started, request retries)`` of every TensorStore kvstore in this
        process so far (its own counters: one process-wide count, not this source's alone).

        Examples:
            >>> requests, retries = TensorStoreSource.request_counts()
            >>> requests >= 0 and retries >= 0
            True
        """
        requests = retries = 0
        for metric in ts.experimental_collect_matching_metrics("/tensorstore/"):
            name = metric["name"]
            if name == "/tensorstore/http/request_started" or name.endswith("/retries"):
                value = sum(int(v.get("value", 0)) for v in metric["values"])
                if name.endswith("/retries"):
                    retries += value
                else:
                    requests += value
        return requests, retries

    def describe(self) -> str:
        leaves = ", ".join(
            f"{k}: {dtype}{[self._len, *shape]}" for k, (dtype, shape) in self._leaf_types.items()
        )
        return f"TensorStoreSource({self._where}: {leaves})"


def read_metadata(path: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """The checked ``psdp.json`` of the dataset at ``path`` (a directory, a URL or a kvstore spec).

    Returns:
        ``{"format", "version", "num_rows", "single_array", "rows_per_shard", "rows_per_chunk",
        "compression", "checksum", "leaves": {name: {"dtype": str, "shape": [trailing]}}}``, and
        for a dataset on an object store ``"data_prefix"``, the prefix holding its arrays.

    Examples:
        >>> import tempfile
        >>> from psdp.sources.stores.writer import write_dataset
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = write_dataset(f"{tmp.name}/ds", np.zeros((5, 3), np.int16), progress=False)
        >>> meta = read_metadata(path)
        >>> meta["num_rows"], meta["single_array"], meta["leaves"]
        (5, True, {'array': {'dtype': 'int16', 'shape': [3]}})
        >>> tmp.cleanup()
    """
    location = locate(path)
    if location.local is None:
        meta, _ = _read_remote_metadata(open_kvstore(location), location)
        if meta is None:
            raise FileNotFoundError(f"no dataset at {location.name}: it has no {METADATA_FILE}")
        return meta
    meta_file = location.local / METADATA_FILE
    try:
        text = meta_file.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(
            f"cannot read the dataset metadata {meta_file}: {error}; rewrite the dataset with "
            "write_dataset(..., overwrite=True)"
        ) from error
    return parse_metadata(text, str(meta_file))


def parse_metadata(text: str | bytes, where: str) -> dict[str, Any]:
    """The checked metadata in ``text`` (the contents of ``where``); raises naming ``where``."""
    try:
        meta = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"cannot read the dataset metadata {where}: {error}; rewrite the dataset with "
            "write_dataset(..., overwrite=True)"
        ) from error
    problem = _metadata_problem(meta)
    if problem:
        raise ValueError(
            f"{where} is not valid psdp dataset metadata: {problem}; rewrite the dataset "
            "with write_dataset(..., overwrite=True)"
        )
    return meta


def read_metadata_object(store: ts.KvStore, location: Location) -> Any:
    """The read of ``psdp.json`` at the remote ``location`` (``store`` opened there, its state
    ``"missing"`` where there is none), tried again on a transient error; any other is a
    `ValueError` naming the object, its endpoint's password hidden."""
    try:
        return retried_write(
            lambda: store.read(METADATA_FILE.encode()).result(),
            f"reading {location.named(METADATA_FILE)}",
        )
    except ValueError as error:
        raise ValueError(
            f"cannot read {location.named(METADATA_FILE)}: {redacted_message(str(error))}; "
            "check the credentials in the environment, the endpoint and the bucket"
        ) from None


def _read_remote_metadata(
    store: ts.KvStore, location: Location
) -> tuple[dict[str, Any] | None, bytes]:
    """The checked ``psdp.json`` of a remote dataset (``None`` if there is none), and its
    generation (which changes when a write commits there)."""
    got = read_metadata_object(store, location)
    generation = bytes(got.stamp.generation)
    if got.state != "value":
        return None, generation
    return parse_metadata(bytes(got.value), location.named(METADATA_FILE)), generation


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
    prefix = meta.get("data_prefix", "")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        return f"data_prefix must be {DATA_PREFIX}<hex>/, got {prefix!r}"
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
        return retried_write(
            lambda: ts.open(spec, read=True, open=True, context=context).result(),
            f"opening {where}",
        )
    except ValueError as error:
        raise ValueError(
            f"cannot open {where} as a TensorStore array: {error}; check the path or spec "
            "(a dataset written by psdp.write_dataset opens by its directory path)"
        ) from error


def _rows_of_single_array(array: ts.TensorStore, where: str) -> int:
    if array.rank == 0:
        raise ValueError(f"{where} is a 0-d array; a source needs a row dimension")
    origin = tuple(int(m) for m in array.domain.inclusive_min)
    if any(origin):
        raise ValueError(
            f"{where} has its domain starting at {origin}; a source needs every dimension "
            "numbered from 0, rows and columns alike (translate the array with "
            "store.translate_to[0])"
        )
    return int(array.shape[0])


def _check_leaf_matches(
    where: str, name: str, array: ts.TensorStore, num_rows: int, leaf: Mapping[str, Any]
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
            f"{where}: leaf {name!r} has {' and '.join(problems)}; the array was changed after "
            "the dataset was written, rewrite the dataset with write_dataset(..., overwrite=True)"
        )


def _check_shard_files(path: Path, name: str, leaf_path: Path, array: ts.TensorStore) -> None:
    """Every shard file of a leaf exists and is non-empty (a missing one reads as fill value)."""
    missing = []
    for key in _shard_keys(array):
        file = leaf_path / key
        try:
            empty = file.stat().st_size == 0
        except FileNotFoundError:
            empty = True
        if empty:
            missing.append(str(file.relative_to(path)))
    _refuse_missing_shards(str(path), name, missing)


def _shard_keys(array: ts.TensorStore) -> list[str]:
    """The keys (below the leaf) of every shard of a leaf in write_dataset's layout; none for
    another layout (reads still refuse its missing chunks)."""
    meta = array.spec().to_json().get("metadata", {})
    encoding = meta.get("chunk_key_encoding", {})
    if (
        encoding.get("name") != "default"
        or encoding.get("configuration", {}).get("separator", "/") != "/"
    ):
        return []
    shard = meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
    if not isinstance(shard, list) or len(shard) != array.rank:
        return []
    grid = [range(math.ceil(n / c)) for n, c in zip(array.shape, shard, strict=True)]
    return ["/".join(["c", *map(str, key)]) for key in itertools.product(*grid)]


def _refuse_missing_shards(where: str, name: str, missing: list[str]) -> None:
    if missing:
        shown = ", ".join(missing[:3])
        raise ValueError(
            f"{where}: leaf {name!r} is missing {len(missing)} shard file(s) or has them empty "
            f"({shown}{', ...' if len(missing) > 3 else ''}); those rows would read as zeros. "
            "Restore the files or rewrite the dataset with write_dataset(..., overwrite=True)"
        )


def _box_of(array: ts.TensorStore, ids: np.ndarray, box: Box) -> ts.TensorStore:
    """The rows ``ids`` of ``array`` cut to ``box``: a box with index arrays (a periodic wrap)
    is read with outer indexing, each array selecting along its own dimension."""
    if box is None:
        return array[ids]
    if isinstance(box, slice):
        return array[ids, box]
    return array.oindex[(ids, *box)]
