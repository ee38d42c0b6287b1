"""`write_dataset` when a write is interrupted, fails, or rewrites a dataset from its own rows.

The writer builds the dataset in a hidden sibling directory and renames it into place when
complete, so ``path`` only ever holds a whole dataset: the old one, or the new one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from psdp.sources import TensorStoreSource, read_metadata
from psdp.sources.stores.writer import write_dataset

# A write of 4 leaves in blocks of 64 MiB, stopped by SIGINT (Ctrl-C) while its first block is in
# flight: TensorStore writes each leaf on its own threads, so writes are still running when the
# KeyboardInterrupt reaches the main thread.
INTERRUPTED_WRITE = """
import signal, sys
# a suite run as a background job (`pytest &`) starts its children with SIGINT ignored; a write
# interrupted by hand has Python's handler, which this test is about
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
from psdp.sources.stores.writer import write_dataset

def chunks():
    for i in range(100):
        yield {f"leaf{k}": np.full((256, 1024), i, np.int32) for k in range(4)}

write_dataset(sys.argv[1], chunks(), rows_per_shard=64, overwrite=True, progress=False)
"""


def _files_under(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )


def _interrupt_a_write(target) -> str:
    """Starts the write in a child, sends SIGINT once shard files appear, returns its stderr."""
    root = target.parent
    before = set(_files_under(root))
    child = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_WRITE, str(target)],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any("/c/" in f for f in set(_files_under(root)) - before):
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline, "the child wrote no shard file in 120 s"
        time.sleep(0.005)
    child.send_signal(signal.SIGINT)
    return child.communicate(timeout=120)[1]


@pytest.mark.parametrize("existing", [False, True], ids=["new-path", "overwrite"])
def test_ctrl_c_mid_write_leaves_the_path_as_it_was_and_overwrite_works(tmp_path, existing):
    target = tmp_path / "ds"
    old = np.arange(5, dtype=np.int64)
    if existing:
        write_dataset(target, {"old": old}, progress=False)
    before = _files_under(tmp_path)
    err = _interrupt_a_write(target)
    assert "KeyboardInterrupt" in err, err
    # the child has exited, so every write it started has landed or failed by now: what is on
    # disk is final, and must be exactly what was there before (no stray shard files)
    assert _files_under(tmp_path) == before
    if existing:
        np.testing.assert_array_equal(TensorStoreSource(target).read(np.arange(5))["old"], old)
    new = {"a": np.arange(7, dtype=np.int32)}
    write_dataset(target, new, overwrite=True, progress=False)
    assert TensorStoreSource(target).read(np.array([6, 0]))["a"].tolist() == [6, 0]
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def _read_back(path):
    source = TensorStoreSource(path)
    return source.read(np.arange(len(source)))


def _own_chunks(path, rows):
    """The dataset's rows read lazily from ``path`` itself, ``rows`` at a time."""
    source = TensorStoreSource(path)
    return (
        source.read(np.arange(start, min(start + rows, len(source))))
        for start in range(0, len(source), rows)
    )


def test_a_dataset_is_rewritten_from_its_own_rows(tmp_path):
    data = {
        "tokens": np.arange(50 * 6, dtype=np.int32).reshape(50, 6),
        "weight": np.linspace(0, 1, 50, dtype=np.float32),
    }
    path = write_dataset(tmp_path / "ds", data, rows_per_shard=8, progress=False)
    write_dataset(
        path,
        _own_chunks(path, rows=7),
        rows_per_shard=16,
        compression="zstd",
        overwrite=True,
        progress=False,
    )
    meta = read_metadata(path)
    assert (meta["num_rows"], meta["rows_per_shard"], meta["compression"]) == (50, 16, "zstd")
    got = _read_back(path)
    for key, value in data.items():
        np.testing.assert_array_equal(got[key], value)
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # no staging or old directory left beside it


def test_a_single_array_dataset_is_rewritten_from_its_own_rows(tmp_path):
    data = np.arange(30 * 4, dtype=np.int16).reshape(30, 4)
    path = write_dataset(tmp_path / "ds", data, rows_per_shard=8, progress=False)
    write_dataset(path, _own_chunks(path, rows=9), rows_per_shard=4, overwrite=True, progress=False)
    assert read_metadata(path)["single_array"] is True
    np.testing.assert_array_equal(_read_back(path), data)


def test_a_failed_overwrite_keeps_the_old_dataset(tmp_path):
    old = {"a": np.arange(9, dtype=np.int32)}
    path = write_dataset(tmp_path / "ds", old, rows_per_shard=4, progress=False)
    chunks = [{"a": np.zeros(4, np.int32)}, {"a": np.zeros(4, np.int64)}]  # a dtype change
    with pytest.raises(ValueError, match="chunk 1 has leaves"):
        write_dataset(path, chunks, rows_per_shard=2, overwrite=True, progress=False)
    np.testing.assert_array_equal(_read_back(path)["a"], old["a"])
    assert sorted(os.listdir(tmp_path)) == ["ds"]


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([np.zeros(3), {"a": np.zeros(3)}], r"chunk 1: chunk 0 was a numpy array.*got dict"),
        ([{"a": np.zeros(3)}, np.zeros(3)], r"chunk 1: each chunk must be a dict.*got ndarray"),
        ([[1, 2, 3]], r"chunk 0: each chunk must be a dict.*got list"),
    ],
)
def test_chunks_are_all_arrays_or_all_dicts(tmp_path, chunks, message):
    with pytest.raises(TypeError, match=message):
        write_dataset(tmp_path / "ds", chunks, progress=False)
    assert os.listdir(tmp_path) == []


def test_the_written_dataset_is_readable_by_others(tmp_path):
    """Built in a staging directory, the dataset still gets the umask's mode, not mkdtemp's 0o700."""
    umask = os.umask(0o022)
    try:
        path = write_dataset(tmp_path / "ds", np.arange(4), progress=False)
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o755


# ------------------------------------------------------------------------- concurrent writers
def _overtaken_at(where, winner):
    """Chunks of a write that another write of ``winner`` to ``where`` overtakes: it commits
    between this write's first and second chunk."""
    yield {"x": np.arange(3)}
    write_dataset(where, winner, overwrite=True, progress=False)
    yield {"x": np.arange(3)}


def test_a_write_that_lost_a_race_keeps_the_winner(tmp_path):
    """Another write commits to the same directory while this one runs: this one fails at its
    commit, naming the path, and the other's dataset stays, as on an object store."""
    path = write_dataset(tmp_path / "ds", {"x": np.arange(4)}, progress=False)
    winner = {"x": np.arange(10, 16)}
    with pytest.raises(FileExistsError, match=f"another write committed to {path} while this"):
        write_dataset(path, _overtaken_at(path, winner), overwrite=True, progress=False)
    np.testing.assert_array_equal(_read_back(path)["x"], winner["x"])
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # no staging directory, no lock file left


def test_of_two_writers_committing_at_once_exactly_one_commits(tmp_path, monkeypatch):
    """Writer A has checked that the dataset is still the one it began with, and is stopped
    just before its renames; writer B commits meanwhile (or, holding no lock, would): B must
    wait for A's commit and then fail, since the dataset changed; A's dataset stays."""
    from psdp.sources.stores import writer

    path = write_dataset(tmp_path / "ds", {"x": np.arange(4)}, progress=False)
    a_checked, b_done = threading.Event(), threading.Event()
    calls = {"a": 0}
    real = writer._identity

    def identity(where):
        got = real(where)
        if threading.current_thread().name == "writer-a":
            calls["a"] += 1
            if calls["a"] == 2:  # A's check at its commit (the first is at its start)
                a_checked.set()
                b_done.wait(2)  # B, if it could commit now, would do it in this time
        return got

    monkeypatch.setattr(writer, "_identity", identity)
    outcome = {}

    def writer_a():
        try:
            write_dataset(path, {"x": np.arange(20, 25)}, overwrite=True, progress=False)
            outcome["a"] = "committed"
        except FileExistsError as error:
            outcome["a"] = error

    thread = threading.Thread(target=writer_a, name="writer-a")
    thread.start()
    assert a_checked.wait(60)
    try:
        write_dataset(path, {"x": np.arange(30, 33)}, overwrite=True, progress=False)
        outcome["b"] = "committed"
    except FileExistsError as error:
        outcome["b"] = error
    b_done.set()
    thread.join(60)
    assert outcome["a"] == "committed", outcome
    assert isinstance(outcome["b"], FileExistsError), outcome
    np.testing.assert_array_equal(_read_back(path)["x"], np.arange(20, 25))
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_a_file_kvstore_write_that_lost_a_race_keeps_the_winner(tmp_path):
    """A ``file`` kvstore spec commits like an object store, by a conditional write of psdp.json
    that TensorStore's file driver checks: a write that another one overtook fails."""
    where = {"driver": "file", "path": f"{tmp_path}/kv/"}
    write_dataset(where, {"x": np.arange(4)}, progress=False)
    winner = {"x": np.arange(10, 16)}
    with pytest.raises(FileExistsError, match=f"another write committed to file://{tmp_path}/kv/"):
        write_dataset(where, _overtaken_at(where, winner), overwrite=True, progress=False)
    np.testing.assert_array_equal(_read_back(where)["x"], winner["x"])
    prefix = read_metadata(where)["data_prefix"]
    files = [
        str(f.relative_to(tmp_path / "kv")) for f in (tmp_path / "kv").rglob("*") if f.is_file()
    ]
    assert all(f == "psdp.json" or f.startswith(prefix) for f in files), files  # the loser's: gone


def test_a_small_document_store_writes_files_sized_to_their_content(tmp_path):
    """50 documents: the document index holds 2 rows (blocks 0 and the end) and the offsets 51
    entries, each file one chunk of exactly those int64s (+ a 4-byte crc32c) and its shard index
    (one 16-byte entry + a crc32c), not a 1 MiB chunk of 65,536 marks; and an index written in
    the old layout (chunks of 65,536 rows) opens the same."""
    import tensorstore as ts

    from psdp.sources import DocumentStore
    from psdp.sources.documents.writer import write_documents

    docs = [np.arange(1 + i % 7, dtype=np.uint16) for i in range(50)]
    path = write_documents(tmp_path / "docs", docs, progress=False)
    assert (path / "index" / "c" / "0" / "0").stat().st_size == 2 * 2 * 8 + 4 + 16 + 4
    assert (path / "offsets" / "c" / "0").stat().st_size == 51 * 8 + 4 + 16 + 4
    store = DocumentStore.open(path)
    lengths = np.array([len(d) for d in docs])
    assert store.offsets_range(0, 51).tolist() == [0, *np.cumsum(lengths).tolist()]
    new_index = (store.index.marks.tolist(), store.index.nonempty.tolist())
    assert new_index == ([0, int(lengths.sum())], [0, 50])  # the tokens and documents before
    old = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/index/"}},
                  open=True).result()  # fmt: skip
    rows = old.read().result()
    meta = old.spec().to_json()["metadata"]
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [1 << 16, 2]
    meta["codecs"][0]["configuration"]["chunk_shape"] = [1 << 16, 2]
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/index/"},
            "metadata": meta, "store_data_equal_to_fill_value": True}  # fmt: skip
    rewritten = ts.open(spec, create=True, delete_existing=True).result()
    rewritten.write(rows).result()
    assert (path / "index" / "c" / "0" / "0").stat().st_size == (1 << 16) * 16 + 4 + 16 + 4
    again = DocumentStore.open(path)
    assert (again.index.marks.tolist(), again.index.nonempty.tolist()) == new_index
