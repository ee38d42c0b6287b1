"""On-disk sources through the loader: exact data on every device shard, and loud damage.

TensorStore datasets (`write_dataset` -> `TensorStoreSource`), single TensorStore arrays by spec,
``.npy`` memmaps and Grain-style per-record sources all feed the DataLoader on 8 fake devices
(data=4 x model=2), checked shard by shard against plain numpy. A damaged or changed store must
raise an error naming the path and the problem; a wrong batch is never an acceptable outcome.
"""

from __future__ import annotations

import itertools
import json
import runpy
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from psdp import DataLoader
from psdp.sources import GrainSource, MemmapSource, TensorStoreSource, read_metadata
from psdp.sources.stores.writer import write_dataset
from psdp.tools.pod import run_pod
from tests.batch_checks import assert_batch_exact, expected_batch, expected_global, token_table
from tests.meshes import SCRAMBLED, mesh_of
from tests.pod_targets import tensorstore_exact

ROOT = Path(__file__).resolve().parents[1]
MESH = mesh_of(("data", "model"), (4, 2), SCRAMBLED)  # the scrambled order of test_loader.py


def corpus(num_rows: int) -> dict[str, np.ndarray]:
    """Heterogeneous leaves whose values name their row."""
    return {
        "tokens": token_table(num_rows, width=16),
        "loss_mask": (np.arange(num_rows)[:, None] + np.arange(16)) % 3 == 0,
        "segment_ids": (np.arange(num_rows) % 7).astype(np.int16),
    }


def check_loader(source, data, *, steps=7, batch=16, shuffle=True) -> int:
    """Runs the loader on data=4 x model=2 and checks every shard; returns the shard count.

    With a batch that does not divide the rows, each epoch's last batch is padded and masked, so
    dict batches get a ``mask`` leaf: 4 leaves for `corpus`, checked like the others.
    """
    shards = 0
    settings = dict(mesh=MESH, global_batch_size=batch, shuffle=shuffle)
    with DataLoader(source, **settings) as loader:
        for step, got in zip(range(steps), loader, strict=False):
            shards += assert_batch_exact(got, expected_batch(data, step, **settings))
    return shards


def shard_files(path: Path, leaf: str) -> list[Path]:
    return sorted(p for p in (path / leaf / "c").rglob("*") if p.is_file())


@pytest.fixture
def dataset(tmp_path):
    """44 rows in shards of 8 (the last one partial)."""
    data = corpus(44)
    return write_dataset(tmp_path / "ds", data, rows_per_shard=8, progress=False), data


# ------------------------------------------------------------------------- TensorStoreSource
@pytest.mark.parametrize("shuffle", [False, True])
def test_tensorstore_round_trip_exact_on_every_shard(dataset, shuffle):
    path, data = dataset
    source = TensorStoreSource(path)
    assert len(source) == 44
    # 7 steps of 16 over 44 rows cross two epochs; 3 leaves + the mask x 8 devices per step
    assert check_loader(source, data, shuffle=shuffle) == 7 * 4 * 8


def test_tensorstore_layout_is_sharded_with_one_row_chunks(dataset):
    path, data = dataset
    meta = read_metadata(path)
    assert meta["num_rows"] == 44 and meta["rows_per_shard"] == 8
    assert meta["leaves"] == {
        "tokens": {"dtype": "int32", "shape": [16]},
        "loss_mask": {"dtype": "bool", "shape": [16]},
        "segment_ids": {"dtype": "int16", "shape": []},
    }
    zarr = json.loads((path / "tokens" / "zarr.json").read_text())
    assert zarr["chunk_grid"]["configuration"]["chunk_shape"] == [8, 16]
    sharding = zarr["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    assert sharding["configuration"]["chunk_shape"] == [1, 16]
    assert [c["name"] for c in sharding["configuration"]["codecs"]] == ["bytes", "crc32c"]
    assert len(shard_files(path, "tokens")) == 6  # ceil(44 / 8)
    assert not (path / ".psdp-incomplete").exists()


def test_tensorstore_read_unsorted_repeated_and_empty_ids(dataset):
    path, data = dataset
    source = TensorStoreSource(path)
    ids = np.array([43, 0, 7, 8, 7, 43, 21, 0])  # across shards, out of order, repeats
    got = source.read(ids)
    for key, value in data.items():
        np.testing.assert_array_equal(got[key], value[ids])
        assert got[key].dtype == value.dtype
    empty = source.read(np.zeros(0, np.int64))
    assert empty["tokens"].shape == (0, 16) and empty["segment_ids"].dtype == np.int16
    with pytest.raises(IndexError, match=r"must be in \[0, 43\].*got ids from 0 to 44"):
        source.read(np.array([0, 44]))
    assert "tokens: int32[44, 16]" in source.describe()


def test_tensorstore_reads_from_many_threads_at_once_are_exact(dataset):
    path, data = dataset
    source = TensorStoreSource(path, cache_bytes=1 << 20)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 44, size=32) for _ in range(16)]
    errors: list[BaseException] = []

    def reader(ids):
        try:
            got = source.read(ids)
            for key, value in data.items():
                np.testing.assert_array_equal(got[key], value[ids])
        except BaseException as error:  # re-raised on the main thread below
            errors.append(error)

    threads = [threading.Thread(target=reader, args=(ids,)) for ids in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_single_array_dataset_reads_arrays(tmp_path):
    data = token_table(40, width=5)
    path = write_dataset(tmp_path / "one", data, rows_per_shard=16, progress=False)
    source = TensorStoreSource(path)
    assert isinstance(source.read(np.array([1])), np.ndarray)
    assert check_loader(source, data, batch=8) == 7 * 8  # an array batch: no padding, no mask


def test_chunked_iterable_write_equals_in_memory(tmp_path):
    data = corpus(59)
    sizes = [7, 0, 13, 1, 30, 8]  # irregular, with an empty chunk; shards of 8 rows
    bounds = np.cumsum([0, *sizes])
    chunks = ({k: v[a:b] for k, v in data.items()} for a, b in itertools.pairwise(bounds))
    path = write_dataset(tmp_path / "chunked", chunks, rows_per_shard=8, progress=False)
    source = TensorStoreSource(path)
    assert len(source) == 59 and read_metadata(path)["num_rows"] == 59
    assert len(shard_files(path, "tokens")) == 8
    everything = source.read(np.arange(59))
    for key, value in data.items():
        np.testing.assert_array_equal(everything[key], value)
    assert check_loader(source, data) == 7 * 4 * 8


@pytest.mark.parametrize(
    "options",
    [
        dict(compression="zstd"),
        dict(compression={"name": "zstd", "configuration": {"level": 9}}),
        dict(compression="gzip", rows_per_chunk=4),
        dict(rows_per_chunk=8, rows_per_shard=8),
        dict(checksum=False),
    ],
)
def test_write_options_round_trip(tmp_path, options):
    data = corpus(30)
    source = TensorStoreSource(write_dataset(tmp_path / "ds", data, progress=False, **options))
    ids = np.array([29, 3, 3, 17])
    for key, value in source.read(ids).items():
        np.testing.assert_array_equal(value, data[key][ids])


def test_rows_equal_to_the_fill_value_are_stored_and_read(tmp_path):
    # zarr skips chunks equal to the fill value by default; strict reads would then fail, so the
    # writer must store them
    data = {"zeros": np.zeros((20, 4), np.int32), "flags": np.zeros(20, bool)}
    path = write_dataset(tmp_path / "z", data, rows_per_shard=8, progress=False)
    got = TensorStoreSource(path).read(np.array([19, 0, 9]))
    assert got["zeros"].tolist() == [[0] * 4] * 3 and got["flags"].tolist() == [False] * 3


def test_big_endian_input_round_trips(tmp_path):
    data = np.arange(12, dtype=">i4").reshape(6, 2)
    path = write_dataset(tmp_path / "be", data, rows_per_shard=4, progress=False)
    got = TensorStoreSource(path).read(np.array([5, 0]))
    assert got.tolist() == [[10, 11], [0, 1]] and got.dtype == np.dtype("int32")


def test_memory_spec_single_array_through_the_loader():
    context = ts.Context()  # a memory:// store is only visible through its own context
    spec = {"driver": "zarr3", "kvstore": "memory://psdp-test/rows/"}
    data = token_table(48, width=8)
    store = ts.open(spec, create=True, dtype=ts.int32, shape=data.shape, context=context).result()
    store[...] = data
    source = TensorStoreSource(spec, context=context, cache_bytes=1 << 20)
    assert len(source) == 48 and "memory://psdp-test/rows/" in source.describe()
    assert check_loader(source, data) == 7 * 8
    # an already open TensorStore works too
    assert check_loader(TensorStoreSource(store), data, steps=2) == 2 * 8


def test_plain_zarr3_directory_opens_as_one_array(tmp_path):
    data = token_table(16, width=3)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "arr")}}
    ts.open(spec, create=True, dtype=ts.int32, shape=data.shape).result()[...] = data
    got = TensorStoreSource(tmp_path / "arr").read(np.array([15, 2]))
    np.testing.assert_array_equal(got, data[[15, 2]])


def test_spec_with_a_missing_chunk_raises_on_read():
    context = ts.Context()
    spec = {"driver": "zarr3", "kvstore": "memory://psdp-test/holes/"}
    store = ts.open(
        spec,
        create=True,
        dtype=ts.int32,
        shape=[8, 2],
        chunk_layout=ts.ChunkLayout(chunk_shape=[2, 2]),
        context=context,
    ).result()
    store[:4] = np.ones((4, 2), np.int32)  # rows 4..7 were never written
    source = TensorStoreSource(spec, context=context)
    assert source.read(np.array([3, 0])).tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match=r"reading 1 rows \(ids \[5\]\).*memory://psdp-test/holes"):
        source.read(np.array([5]))


# ------------------------------------------------------------------------ damaged datasets
def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"no dataset at {tmp_path / 'nope'}.*not exist"):
        TensorStoreSource(tmp_path / "nope")


def test_path_is_a_file(tmp_path):
    (tmp_path / "rows.npy").write_bytes(b"")
    with pytest.raises(ValueError, match=r"rows.npy is a file.*use MemmapSource"):
        TensorStoreSource(tmp_path / "rows.npy")


def test_directory_that_is_not_a_dataset(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"other is not a psdp dataset: it has no psdp.json"):
        TensorStoreSource(tmp_path / "other")


def test_unfinished_write_is_refused(dataset):
    path, _ = dataset
    (path / "psdp.json").unlink()
    (path / ".psdp-incomplete").touch()  # what an interrupted write leaves behind
    with pytest.raises(ValueError, match=r"no psdp.json and still has .psdp-incomplete.*finish"):
        TensorStoreSource(path)


def test_missing_shard_file_is_found_on_open_and_on_read(dataset):
    path, data = dataset
    shard = path / "tokens" / "c" / "2" / "0"  # rows 16..23
    shard.unlink()
    with pytest.raises(ValueError, match=r"leaf 'tokens' is missing 1 shard file.*tokens/c/2/0"):
        TensorStoreSource(path)
    # skipping the open-time check must not turn the hole into zeros either
    source = TensorStoreSource(path, check_shards=False)
    np.testing.assert_array_equal(source.read(np.array([3, 40]))["tokens"], data["tokens"][[3, 40]])
    with pytest.raises(ValueError, match=rf"ids \[1, 17\]\) from {path} failed.*NOT_FOUND"):
        source.read(np.array([1, 17]))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_shard_file_raises_on_read(dataset, damage):
    path, _ = dataset
    shard = path / "tokens" / "c" / "1" / "0"  # rows 8..15
    raw = bytearray(shard.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip":
        raw[40] ^= 0xFF  # inside row 8's data: its crc32c no longer matches
    else:
        raw = bytearray()
    shard.write_bytes(bytes(raw))
    if damage == "empty":
        with pytest.raises(ValueError, match=r"missing 1 shard file\(s\) or has them empty"):
            TensorStoreSource(path)
        return
    source = TensorStoreSource(path)
    source.read(np.array([0, 20]))  # other shards are fine
    with pytest.raises(ValueError, match=rf"from {path} failed.*damaged or incomplete"):
        source.read(np.array([8, 9, 10, 11]))


def test_leaf_with_a_changed_dtype(dataset):
    path, _ = dataset
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / "segment_ids")}}
    ts.open(spec, create=True, delete_existing=True, dtype=ts.int64, shape=[44]).result()
    with pytest.raises(ValueError, match=r"leaf 'segment_ids' has dtype int64 but psdp.json says"):
        TensorStoreSource(path)


def test_leaf_with_a_changed_row_count(dataset):
    path, _ = dataset
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / "loss_mask")}}
    ts.open(spec).result().resize(exclusive_max=[40, None]).result()
    with pytest.raises(ValueError, match=r"'loss_mask' has shape \(40, 16\) but .* \(44, 16\)"):
        TensorStoreSource(path)


def test_leaf_directory_missing(dataset):
    path, _ = dataset
    shutil.rmtree(path / "tokens")
    with pytest.raises(ValueError, match=r"leaf 'tokens' is listed in psdp.json but .* not exist"):
        TensorStoreSource(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "cannot read the dataset metadata"),
        ('{"format": "other"}', "format 'other' version None"),
        (
            '{"format": "psdp.zarr3", "version": 1, "num_rows": 0, "leaves": {}}',
            "num_rows must be a positive int, got 0",
        ),
    ],
)
def test_bad_metadata(dataset, text, problem):
    path, _ = dataset
    (path / "psdp.json").write_text(text)
    with pytest.raises(ValueError, match=problem) as info:
        TensorStoreSource(path)
    assert str(path / "psdp.json") in str(info.value)


# ------------------------------------------------------- damage reaches the trainer, on time
def next_or_hang(iterator, limit_s: float = 120.0):
    """``next(iterator)`` on a helper thread; a liveness guard (not a timing threshold)."""
    outcome: list = []

    def call():
        try:
            outcome.append(("value", next(iterator)))
        except BaseException as error:  # handed to the test thread below
            outcome.append(("error", error))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert outcome, f"next() did not return or raise within {limit_s}s: the loader hangs"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


@pytest.fixture
def even_dataset(tmp_path):
    """48 rows in shards of 8: batches of 8 never pad, so batch steps map to shard files."""
    data = corpus(48)
    return write_dataset(tmp_path / "ds", data, rows_per_shard=8, progress=False), data


def loader_of(source, batch=8):
    # one read thread: the damage tests count how far the reads run ahead (prefetch + threads)
    return DataLoader(
        source, mesh=MESH, global_batch_size=batch, shuffle=False, prefetch=1, read_threads=1
    )


def expect_steps(iterator, data, steps, batch=8):
    """The next batches are exactly rows ``[s*batch, (s+1)*batch)`` for each step in ``steps``."""
    for step in steps:
        ids = np.arange(step * batch, (step + 1) * batch)
        want = expected_global(data, ids) | {"mask": np.ones(batch, bool)}  # nothing padded
        assert assert_batch_exact(next_or_hang(iterator), want) == 4 * 8


def test_a_missing_shard_file_reaches_the_trainer_at_its_step(even_dataset):
    path, data = even_dataset
    (path / "tokens" / "c" / "2" / "0").unlink()  # rows 16..23: step 2
    with pytest.raises(ValueError, match=rf"{path}: leaf 'tokens' is missing 1 shard file"):
        loader_of(TensorStoreSource(path))  # the default: refused before the first batch
    with loader_of(TensorStoreSource(path, check_shards=False)) as loader:
        batches = iter(loader)
        expect_steps(batches, data, [0, 1])
        with pytest.raises(ValueError, match=rf"ids \[16, 17, .*\) from {path} failed.*NOT_FOUND"):
            next_or_hang(batches)


def test_a_shard_file_deleted_mid_run_raises_at_that_step(even_dataset):
    path, data = even_dataset
    with loader_of(TensorStoreSource(path)) as loader:
        batches = iter(loader)
        expect_steps(batches, data, [0])
        # prefetch=1: the thread is at most at step 2 now, so step 4 is read after the damage
        (path / "loss_mask" / "c" / "4" / "0").unlink()  # rows 32..39: step 4
        expect_steps(batches, data, [1, 2, 3])
        with pytest.raises(ValueError, match=rf"ids \[32, 33, .*\) from {path} failed.*NOT_FOUND"):
            next_or_hang(batches)


def test_a_truncated_shard_file_reaches_the_trainer_at_its_step(even_dataset):
    path, data = even_dataset
    shard = path / "segment_ids" / "c" / "1"  # rows 8..15 of a scalar leaf: step 1
    shard.write_bytes(shard.read_bytes()[:-20])
    with loader_of(TensorStoreSource(path)) as loader:
        batches = iter(loader)
        expect_steps(batches, data, [0])
        with pytest.raises(ValueError, match=rf"from {path} failed.*damaged or incomplete"):
            next_or_hang(batches)


def test_records_that_change_shape_reach_the_trainer_at_their_step():
    data = token_table(48, width=4)
    records = list(data)
    records[20] = np.zeros(5, np.int32)  # step 2 reads records 16..23
    with loader_of(GrainSource(records, read_threads=2)) as loader:
        batches = iter(loader)
        for step in range(2):
            ids = np.arange(step * 8, step * 8 + 8)
            assert assert_batch_exact(next_or_hang(batches), data[ids]) == 8
        with pytest.raises(
            ValueError, match=r"record 20 is int32\[5\] but record 16 is int32\[4\]"
        ):
            next_or_hang(batches)
    loader.source.close()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda p: p / "nope", FileNotFoundError, r"no dataset at {p}/nope: the path does not"),
        (lambda p: p / "ds" / "psdp.json", ValueError, r"{p}/ds/psdp.json is a file, but Tensor"),
        (lambda p: p / "ds" / "tokens", ValueError, r"cannot open {p}/ds/tokens as a TensorStore"),
    ],
)
def test_a_path_that_is_not_a_store_is_refused_before_the_first_batch(
    even_dataset, make, error, message
):
    path, _ = even_dataset
    root = path.parent
    (root / "ds" / "tokens" / "zarr.json").write_text("{}")  # a broken single-array directory
    with pytest.raises(error, match=message.format(p=root)):
        loader_of(TensorStoreSource(make(root)))


# --------------------------------------------------------------------------- writer errors
@pytest.mark.parametrize(
    ("arrays", "error", "message"),
    [
        ({"a": np.zeros(3), "b": np.zeros(4)}, ValueError, r"same number of rows, got \{'a': 3"),
        ({"a": [1, 2, 3]}, TypeError, r"leaf 'a' must be a numpy array.*got list"),
        ({}, ValueError, "empty dict"),
        ([], ValueError, "the iterable of chunks was empty"),
        (np.zeros((0, 4)), ValueError, "the arrays have 0 rows"),
        ({"a": np.array(["x", "y"])}, TypeError, r"leaf 'a' has dtype <U1.*numeric and bool"),
        ({"a/b": np.zeros(3)}, ValueError, r"leaf name 'a/b' is not a plain directory name"),
        ({"a": np.float32(1)}, TypeError, r"leaf 'a' must be a numpy array.*float32"),
        ({"a": np.zeros(())}, ValueError, r"leaf 'a' is a 0-d array"),
        ("tokens.npy", TypeError, "arrays must be a numpy array, a dict"),
    ],
)
def test_writer_rejects_bad_input_and_leaves_nothing(tmp_path, arrays, error, message):
    with pytest.raises(error, match=message):
        write_dataset(tmp_path / "ds", arrays, progress=False)
    assert not (tmp_path / "ds").exists()


def test_writer_rejects_a_chunk_that_changes_schema_and_cleans_up(tmp_path):
    chunks = [{"a": np.zeros((4, 2), np.int32)}, {"a": np.zeros((4, 3), np.int32)}]
    with pytest.raises(ValueError, match=r"chunk 1 has leaves \{'a': 'int32\[3\]'\}.*int32\[2\]"):
        write_dataset(tmp_path / "ds", chunks, rows_per_shard=2, progress=False)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(rows_per_shard=0), "rows_per_shard must be an int >= 1, got 0"),
        (dict(rows_per_shard=10, rows_per_chunk=4), "rows_per_shard=10 must be a multiple"),
        (dict(compression="lz4"), "compression must be None, one of"),
    ],
)
def test_writer_rejects_bad_options(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        write_dataset(tmp_path / "ds", {"a": np.zeros(4)}, progress=False, **options)


def test_writer_refuses_to_overwrite_unless_asked(dataset):
    path, _ = dataset
    new = {"a": np.arange(5)}
    with pytest.raises(FileExistsError, match=rf"{path} already exists.*overwrite=True"):
        write_dataset(path, new, progress=False)
    write_dataset(path, new, overwrite=True, progress=False)
    assert TensorStoreSource(path).read(np.array([4, 1]))["a"].tolist() == [4, 1]
    assert sorted(p.name for p in path.iterdir()) == ["a", "psdp.json"]


def test_writer_never_deletes_a_foreign_directory(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match=r"refusing to overwrite .*not a psdp dataset"):
        write_dataset(tmp_path / "home", {"a": np.arange(3)}, overwrite=True, progress=False)
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        write_dataset(tmp_path / "file", {"a": np.arange(3)}, progress=False)


def test_writer_progress_bar_runs(tmp_path):
    path = write_dataset(tmp_path / "ds", corpus(10), progress=True)
    assert len(TensorStoreSource(path)) == 10


# ---------------------------------------------------------------------------- MemmapSource
def test_memmap_dict_through_the_loader(tmp_path):
    data = corpus(44)
    files = {}
    for key, value in data.items():
        files[key] = tmp_path / f"{key}.npy"
        np.save(files[key], value)
    source = MemmapSource(files)
    assert len(source) == 44 and "tokens.npy" in source.describe()
    assert check_loader(source, data) == 7 * 4 * 8


def test_memmap_single_file_through_the_loader(tmp_path):
    data = token_table(40, width=4)
    np.save(tmp_path / "rows.npy", data)
    got = MemmapSource(str(tmp_path / "rows.npy")).read(np.array([3, 3]))
    assert type(got) is np.ndarray
    assert check_loader(MemmapSource(tmp_path / "rows.npy"), data, batch=8) == 7 * 8


def test_memmap_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"leaf 'x': no .npy file at .*missing.npy"):
        MemmapSource({"x": tmp_path / "missing.npy"})
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(ValueError, match=r"text.npy is not a readable .npy file"):
        MemmapSource(tmp_path / "text.npy")
    np.savez(tmp_path / "both.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match=r"both.npz is an .npz archive"):
        MemmapSource(tmp_path / "both.npz")
    with pytest.raises(ValueError, match="is a directory"):
        MemmapSource(tmp_path)
    np.save(tmp_path / "a.npy", np.zeros(3))
    np.save(tmp_path / "b.npy", np.zeros(4))
    with pytest.raises(ValueError, match=r"same number of rows, got \{'a': 3, 'b': 4\}"):
        MemmapSource({"a": tmp_path / "a.npy", "b": tmp_path / "b.npy"})
    np.save(tmp_path / "scalar.npy", np.float32(1))
    with pytest.raises(ValueError, match="0-d array"):
        MemmapSource(tmp_path / "scalar.npy")
    with pytest.raises(ValueError, match="at least one leaf"):
        MemmapSource({})


# ----------------------------------------------------------------------------- GrainSource
def test_grain_map_dataset_through_the_loader():
    grain = pytest.importorskip("grain", reason="grain is optional (pip install psdp[grain])")
    data = corpus(44)
    records = [{k: v[i] for k, v in data.items()} for i in range(44)]
    source = GrainSource(grain.MapDataset.source(records), read_threads=4)
    assert len(source) == 44 and "4 threads" in source.describe()
    assert check_loader(source, data) == 7 * 4 * 8
    source.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("psdp-grain")]


def test_grain_array_record_source_through_the_loader(tmp_path):
    grain = pytest.importorskip("grain", reason="grain is optional (pip install psdp[grain])")
    writer_module = pytest.importorskip(
        "array_record.python.array_record_module", reason="array_record comes with grain"
    )
    data = token_table(40, width=6)
    writer = writer_module.ArrayRecordWriter(str(tmp_path / "rows.array_record"), "group_size:1")
    for row in data:
        writer.write(row.tobytes())
    writer.close()
    records = grain.sources.ArrayRecordDataSource([str(tmp_path / "rows.array_record")])
    decoded = grain.MapDataset.source(records).map(lambda b: np.frombuffer(b, np.int32))
    with GrainSource(decoded, read_threads=3) as source:
        assert check_loader(source, data, batch=8) == 7 * 8


def test_grain_source_single_thread_and_errors():
    source = GrainSource([np.array([i, i]) for i in range(6)], read_threads=1)
    assert source.read(np.array([5, 0, 5])).tolist() == [[5, 5], [0, 0], [5, 5]]
    assert source.read(np.zeros(0, np.int64)).shape == (0, 2)

    class Stream:
        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match=r"Stream has no __len__"):
        GrainSource(Stream())
    with pytest.raises(ValueError, match="read_threads must be >= 1, got 0"):
        GrainSource([1], read_threads=0)
    ragged = GrainSource([np.zeros(2), np.zeros(3)], read_threads=2)
    with pytest.raises(ValueError, match=r"record 1 is float64\[3\] but record 0 is float64\[2\]"):
        ragged.read(np.array([0, 1]))
    mixed = GrainSource([{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match=r"record 0 has leaves \['a'\] but record 1 has \['b'\]"):
        mixed.read(np.array([1, 0]))
    with pytest.raises(IndexError, match=r"must be in \[0, 1\]"):
        mixed.read(np.array([2]))
    for s in (ragged, mixed):
        s.close()


def test_a_filtered_grain_dataset_is_refused_naming_the_filter_never_read_as_objects():
    """A filtered Grain MapDataset gives None for each record its filter drops (Grain's
    iterators skip them; a read by number gets them). psdp read [None, record] as an object
    array, silently, and a batch of dicts failed naming 'NoneType' only."""
    grain = pytest.importorskip("grain", reason="grain is optional (pip install psdp[grain])")
    rows = grain.MapDataset.range(10).map(lambda i: {"x": np.array([i, i], np.int32)})
    kept = rows.filter(lambda r: r["x"][0] % 2 == 0)
    assert kept[1] is None  # Grain's own answer for a dropped record
    with GrainSource(kept, read_threads=1) as source:
        assert source.read(np.array([2, 0]))["x"].tolist() == [[2, 2], [0, 0]]
        for ids in ([1], [1, 2], [2, 1, 3]):
            with pytest.raises(ValueError, match=r"record 1 is None .* filtered Grain MapDataset"):
                source.read(np.array(ids))
    numbers = GrainSource([None, np.zeros(2)], read_threads=1)
    with pytest.raises(ValueError, match=r"record 0 is None \(1 of the 2 read\)"):
        numbers.read(np.array([0, 1]))

    class Record:  # a record type of the user's, never converted to arrays
        pass

    objects = GrainSource([Record(), Record()], read_threads=1)
    with pytest.raises(ValueError, match=r"record 0 is a Record, not an array of numbers"):
        objects.read(np.array([1, 0]))
    for s in (numbers, objects):
        s.close()


# --------------------------------------------------------------------------- multi-process
@pytest.mark.timeout(240)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
def test_tensorstore_on_a_noncontiguous_four_host_pod(tmp_path):
    data = corpus(40)
    path = write_dataset(tmp_path / "ds", data, rows_per_shard=8, progress=False)
    np.savez(tmp_path / "expected.npz", **data)
    results = run_pod(
        tensorstore_exact,
        num_processes=4,
        devices_per_process=2,
        args=dict(
            path=str(path),
            expected_npz=str(tmp_path / "expected.npz"),
            process_index=[[0, 1], [2, 3], [0, 1], [2, 3]],  # each host in two non-adjacent rows
            axis_names=["data", "model"],
            mesh_shape=[4, 2],
            batch_size=16,
            steps=5,
            shuffle=True,
        ),
        timeout_s=180,
    )
    assert [r["process"] for r in results] == [0, 1, 2, 3]
    # (3 leaves + the mask: 40 rows / 16 pad each epoch's last batch) x 2 local devices x 5 steps
    # on every host, each checked against numpy
    assert [r["shards"] for r in results] == [40] * 4
    assert [r["rows_per_step"] for r in results] == [8] * 4  # half the batch: 2 of 4 DP rows


# ------------------------------------------------------------------------------- benchmark
def test_bench_sources_runs_tiny(tmp_path, capsys):
    bench = runpy.run_path(
        str(ROOT / "scripts" / "measure" / "bench_sources.py"), run_name="bench_sources"
    )
    out = tmp_path / "bench.json"
    argv = ["--rows", "256", "--width", "64", "--batch", "32", "--repeats", "3"]
    assert bench["main"]([*argv, "--dir", str(tmp_path), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| layout |")
    figures = json.loads(out.read_text())
    assert set(figures["layouts"]) == {
        "zarr3 sharded, 1-row chunks (psdp)",
        "zarr3 sharded, 64-row chunks",
        "zarr3 sharded, 1-row chunks, zstd",
        "zarr3 sharded, 1-row chunks, no crc32c",
        "numpy memmap",
    }


@pytest.mark.parametrize("shift", [(5, 0), (0, -2)])
def test_a_tensorstore_not_numbered_from_zero_is_refused(shift):
    data = np.arange(16 * 8, dtype=np.int32).reshape(16, 8)
    store = ts.open({"driver": "array", "array": data, "dtype": "int32"}).result()
    shifted = store.translate_by[shift]
    with pytest.raises(ValueError, match=r"domain starting at \((5, 0|0, -2)\).*translate_to\[0\]"):
        TensorStoreSource(shifted)
    source = TensorStoreSource(shifted.translate_to[0])  # the fix the message gives
    window = source.read_window(np.array([3, 1]), {None: slice(0, 4)})[None]
    np.testing.assert_array_equal(window, data[[3, 1], 0:4])


def test_a_generator_that_refills_one_buffer_writes_every_chunk(tmp_path):
    def refilled():
        buffer = np.empty((3, 4), np.int32)
        for i in range(4):
            buffer[:] = i
            yield {"x": buffer}

    path = write_dataset(tmp_path / "ds", refilled(), rows_per_shard=4, progress=False)
    rows = TensorStoreSource(path).read(np.arange(12))["x"][:, 0]
    assert rows.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def _unsorted_leaves(n: int = 12) -> dict[str, np.ndarray]:
    """Leaves listed out of name order: a source must not keep the order it was given."""
    return {"weight": np.arange(n, dtype=np.float32), "tokens": token_table(n, width=4)}


def _leaf_order_sources(tmp: Path) -> dict[str, object]:
    from psdp import DocumentStore, Mixture, PackedSequences, StreamSource, TokenSequences

    data = _unsorted_leaves()
    for name, values in data.items():
        np.save(tmp / f"{name}.npy", values)
    docs = [{"input_ids": np.arange(3, 9), "weight": np.ones(6, np.float32)}] * 4
    store = DocumentStore.from_documents(docs)
    records = [{k: v[i] for k, v in data.items()} for i in range(12)]
    return {
        "ArraySource": data,
        "TensorStoreSource": TensorStoreSource(write_dataset(tmp / "ds", data, progress=False)),
        "MemmapSource": MemmapSource({k: tmp / f"{k}.npy" for k in data}),
        "GrainSource": GrainSource(records, read_threads=1),
        "Mixture": Mixture(
            {"b": data, "a": data}, weights={"b": 1, "a": 1}, block_size=2, source_leaf="from"
        ),  # fmt: skip
        "TokenSequences": TokenSequences(store, 4),
        "PackedSequences": PackedSequences(store, 8),
        "StreamSource": StreamSource(records),
    }


def test_every_source_reads_its_leaves_in_sorted_order(tmp_path):
    """One rule for leaf order (docs/guides/custom-sources.md, "Leaf order"): whatever order a source's
    leaves were given or computed in, its reads list them sorted by name."""
    from psdp.sources import as_source

    for name, given in _leaf_order_sources(tmp_path).items():
        if name == "StreamSource":
            got = given.open(0, 1).take(2)
            assert list(got) == sorted(got), (name, list(got))
            continue
        source = as_source(given)
        got = source.read(np.array([1, 0]))
        assert list(got) == sorted(got), (name, list(got))
        if hasattr(source, "read_window"):
            got = source.read_window(np.array([1]), dict.fromkeys(reversed(sorted(got))))
            assert list(got) == sorted(got), (name, "read_window", list(got))
