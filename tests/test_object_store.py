"""Datasets on an object store: moto's S3 server and fake-gcs-server on 127.0.0.1 (one of each per
module; every test runs on both), TensorStore's own s3 and gcs drivers pointed at them, and a
fault-injecting proxy in front. Every row is checked against the numpy arrays that were written
(never against ids the code under test computed).

TensorStore's gcs driver takes its endpoint from the environment only (TENSORSTORE_GCS_HTTP_URL),
so on GCS the `proxy` fixture points the environment at the proxy for the whole test, and every
request of the test goes through it: the writes a test makes "straight to the server" on S3 pass
the proxy on GCS, with no rule meant for them (each rule and hold names its request)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from psdp import DataLoader
from psdp.sources import TensorStoreSource, read_metadata
from psdp.sources.documents.store import open_documents
from psdp.sources.documents.writer import write_documents
from psdp.sources.stores.errors import TransientReadError
from psdp.sources.stores.location import GCS_ENDPOINT_VARIABLE
from psdp.sources.stores.writer import write_dataset
from psdp.tools.benchmarks.object_store import FaultProxy, GcsServer, S3Server
from tests.batch_checks import assert_batch_exact, expected_batch, run_on_noncontiguous_pod

#: TensorStore's own request retries, fast (its default pauses a second before the first retry)
FAST_RETRIES = {"max_retries": 2, "initial_delay": "5ms", "max_delay": "20ms"}


def rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 50_000, (n, 8), dtype=np.int32),
        "weight": rng.random(n).astype(np.float32),
    }


@pytest.fixture(scope="module", params=[S3Server, GcsServer], ids=["s3", "gcs"])
def server(request):
    with request.param() as started:
        yield started


@pytest.fixture
def proxy(server, monkeypatch):
    with FaultProxy(server.endpoint) as p:
        if gcs(server):
            monkeypatch.setenv(GCS_ENDPOINT_VARIABLE, p.endpoint)
        yield p


def gcs(server) -> bool:
    return isinstance(server, GcsServer)


def spec(server, path, proxy=None, retries=FAST_RETRIES):
    """The kvstore spec of ``path`` (through ``proxy`` on S3; on GCS the environment says)."""
    if gcs(server):
        return {**server.kvstore(path), "gcs_request_retries": retries}
    return {
        **server.kvstore(path, proxy.endpoint if proxy else None),
        "s3_request_retries": retries,
    }


def url(server, path):
    """How psdp names ``path`` of the bucket in its messages."""
    return f"{'gs' if gcs(server) else 's3'}://psdp/{path}"


def upload(server):
    """The HTTP method of an object's upload: S3 PUTs, GCS's JSON API POSTs."""
    return "POST" if gcs(server) else "PUT"


def listing(server):
    """What the path of a LIST request holds."""
    return "/o?" if gcs(server) else "list-type=2"


# ------------------------------------------------------------------------------ write, read
def test_write_and_read_back_exactly(server):
    data = rows(90)
    where = spec(server, "exact/")
    assert write_dataset(where, data, rows_per_shard=32, progress=False) == where
    source = TensorStoreSource(where)
    ids = np.array([89, 0, 33, 33, 64, 1])  # unsorted, repeated, across shards
    got = source.read(ids)
    for name, leaf in data.items():
        np.testing.assert_array_equal(got[name], leaf[ids])
    meta = read_metadata(where)
    assert meta["num_rows"] == 90 and meta["data_prefix"].startswith("psdp-data-")
    keys = {k.decode() for k in server.objects().list().result() if k.startswith(b"exact/")}
    assert "exact/psdp.json" in keys
    assert all(k.startswith(f"exact/{meta['data_prefix']}") for k in keys - {"exact/psdp.json"})


def test_a_head_through_the_proxy_says_the_objects_length(server, proxy):
    """fsspec (s3fs, which Levanter reads a cache's ledger with) takes an object's size from a
    HEAD's Content-Length: the proxy passes the server's on, with no body."""
    if gcs(server):
        pytest.skip("GCS's JSON API reads an object's size from its metadata, not a HEAD")
    import boto3  # moto's own dependency: a signed HEAD, as s3fs sends it

    server.objects().write(b"head/object", b"x" * 1234).result()
    client = boto3.client("s3", endpoint_url=proxy.endpoint)
    assert client.head_object(Bucket=server.bucket, Key="head/object")["ContentLength"] == 1234
    assert proxy.requests["HEAD"] == 1


def test_the_proxy_takes_a_burst_of_connections_as_an_object_store_does():
    """TensorStore opens a connection per request in flight, tens at once. With socketserver's
    listen backlog (5) the kernel dropped those past the accept thread's pace, and the client
    tried each again only after 1 s: a second's stall in the loader's reads that no object store
    gives. 64 connections are taken at once here by a proxy that accepts none yet."""
    proxy = FaultProxy("127.0.0.1:1")  # listening from construction; never started
    try:
        port = int(proxy.endpoint.rsplit(":", 1)[1])
        taken = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(64)]
        for connection in taken:
            connection.close()
    finally:
        proxy.__exit__(None, None, None)


def test_a_file_url_is_a_local_directory(tmp_path):
    data = rows(10)
    url = f"file://{tmp_path}/ds"
    assert write_dataset(url, data, progress=False) == tmp_path / "ds"
    assert (tmp_path / "ds" / "psdp.json").is_file()
    np.testing.assert_array_equal(
        TensorStoreSource(url).read(np.arange(10))["weight"], data["weight"]
    )


def test_a_single_array_and_an_iterable_of_chunks(server):
    table = np.arange(50 * 3, dtype=np.int16).reshape(50, 3)
    write_dataset(spec(server, "single/"), table, rows_per_shard=16, progress=False)
    np.testing.assert_array_equal(
        TensorStoreSource(spec(server, "single/")).read(np.arange(50)), table
    )
    chunks = (table[i : i + 7] for i in range(0, 50, 7))
    write_dataset(spec(server, "chunks/"), chunks, rows_per_shard=16, progress=False)
    np.testing.assert_array_equal(
        TensorStoreSource(spec(server, "chunks/")).read(np.arange(50)), table
    )


def test_overwrite_commits_by_metadata_and_never_mixes(server):
    where = spec(server, "overwrite/")
    old, new = rows(40, seed=1), rows(24, seed=2)
    write_dataset(where, old, rows_per_shard=16, progress=False)
    reader = TensorStoreSource(where)  # opened before the overwrite: it reads the old prefix
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        write_dataset(where, new, progress=False)
    write_dataset(where, new, rows_per_shard=16, overwrite=True, progress=False)
    fresh = TensorStoreSource(where)
    assert len(fresh) == 24
    np.testing.assert_array_equal(fresh.read(np.arange(24))["tokens"], new["tokens"])
    # the old prefix is gone: the old reader fails naming the object, it never reads zeros
    with pytest.raises(ValueError, match=r"NOT_FOUND.*overwrite/psdp-data-[0-9a-f]+/tokens/c/0/0"):
        reader.read(np.array([3]))
    prefixes = {
        k.split(b"/")[1] for k in server.objects().list().result() if k.startswith(b"overwrite/")
    }
    assert prefixes == {b"psdp.json", read_metadata(where)["data_prefix"].rstrip("/").encode()}


def test_a_failed_write_leaves_the_old_dataset_and_no_objects(server):
    where = spec(server, "failed/")
    old = rows(20, seed=3)
    write_dataset(where, old, rows_per_shard=8, progress=False)
    before = sorted(server.objects().list().result())

    def chunks():
        yield rows(8, seed=4)
        raise RuntimeError("the corpus reader broke")

    with pytest.raises(RuntimeError, match="corpus reader broke"):
        write_dataset(where, chunks(), rows_per_shard=8, overwrite=True, progress=False)
    assert sorted(server.objects().list().result()) == before
    np.testing.assert_array_equal(
        TensorStoreSource(where).read(np.arange(20))["tokens"], old["tokens"]
    )


def test_a_write_that_lost_a_race_keeps_the_winner(server):
    where = spec(server, "race/")
    winner = rows(12, seed=9)

    def chunks():  # another writer commits to the same place while this write runs
        yield rows(8, seed=10)
        write_dataset(where, winner, overwrite=True, progress=False)
        yield rows(8, seed=11)

    with pytest.raises(FileExistsError, match=f"another write committed to {url(server, 'race/')}"):
        write_dataset(where, chunks(), rows_per_shard=8, progress=False)
    source = TensorStoreSource(where)
    np.testing.assert_array_equal(source.read(np.arange(12))["tokens"], winner["tokens"])
    prefixes = {
        k.split(b"/")[1] for k in server.objects().list().result() if k.startswith(b"race/")
    }
    assert len(prefixes) == 2  # psdp.json and the winner's prefix: the loser left nothing


def _prefixes(server, path):
    """The first path parts below ``path`` in the bucket: psdp.json and the data prefixes."""
    keys = server.objects().list().result()
    return {k.decode()[len(path) :].split("/")[0] for k in keys if k.startswith(path.encode())}


def _write_rows(where, seed, **options):
    write_dataset(where, rows(12 + seed % 5, seed), rows_per_shard=8, progress=False, **options)


def _write_docs(where, seed, **options):
    docs = [np.arange(1 + seed % 7 + d, dtype=np.int32) + seed for d in range(5)]
    write_documents(where, docs, tokens_per_shard=16, tokens_per_chunk=4, progress=False, **options)


def _check_rows(where, seed):
    data = rows(12 + seed % 5, seed)
    got = TensorStoreSource(where).read(np.arange(len(data["tokens"])))
    np.testing.assert_array_equal(got["tokens"], data["tokens"])


def _check_docs(where, seed):
    store = open_documents(where)
    want = np.concatenate([np.arange(1 + seed % 7 + d, dtype=np.int32) + seed for d in range(5)])
    assert store.read_ranges([0], [len(want)])["input_ids"].tolist() == want.tolist()


WRITERS = {
    "write_dataset": (_write_rows, _check_rows),
    "write_documents": (_write_docs, _check_docs),
}


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_of_two_concurrent_writers_exactly_one_commits(server, proxy, kind, existing):
    """Writer A's commit PUT is held at the proxy, after every check A makes (TensorStore's
    own HEAD included), until writer B has committed: A must fail, naming the URL, and B's
    dataset is the one there, whole, with no object of A's left."""
    write, check = WRITERS[kind]
    path = f"cas-{kind}-{'old' if existing else 'new'}/"
    if existing:
        write(spec(server, path), seed=30)
    held = proxy.hold(upload(server), f"{path}psdp.json")
    outcome: dict[str, object] = {}

    def writer_a():
        try:
            write(spec(server, path, proxy), seed=31, overwrite=True)
            outcome["a"] = "committed"
        except Exception as error:  # the test looks at it below
            outcome["a"] = error

    thread = threading.Thread(target=writer_a)
    thread.start()
    assert held.reached.wait(60), "writer A never reached its commit"
    write(spec(server, path), seed=32, overwrite=True)  # writer B, straight to the server
    held.release()
    thread.join(60)
    assert isinstance(outcome["a"], FileExistsError), outcome
    assert url(server, path) in str(outcome["a"]) and "while this one ran" in str(outcome["a"])
    check(spec(server, path), seed=32)
    meta = json.loads(bytes(server.objects()[f"{path}psdp.json".encode()]))
    assert _prefixes(server, path) == {"psdp.json", meta["data_prefix"].rstrip("/")}


def test_a_commit_whose_answer_was_lost_is_still_its_own(server, proxy):
    """The commit PUT reaches the store but its answer is lost: TensorStore tries again, and
    now the condition fails, since psdp.json is this write's own. The write must see that it
    committed (it reads psdp.json back), not delete the dataset it just committed."""
    path = "lost-answer/"
    _write_rows(spec(server, path), seed=40)
    proxy.fail("lost", tries=1, where=f"{path}psdp.json", method=upload(server))
    _write_rows(spec(server, path, proxy), seed=41, overwrite=True)
    assert proxy.faults["lost"] == 1
    _check_rows(spec(server, path), seed=41)
    meta = json.loads(bytes(server.objects()[f"{path}psdp.json".encode()]))
    assert _prefixes(server, path) == {"psdp.json", meta["data_prefix"].rstrip("/")}


def _open_in_thread(where):
    """Opens a `TensorStoreSource` on a thread; returns the thread and a dict that gets the
    source (or the error) under ``"source"``."""
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["source"] = TensorStoreSource(where)
        except Exception as error:  # the test looks at it
            outcome["source"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize(
    "request_held",
    ["/tokens/zarr.json", "LIST"],  # a leaf's metadata; the LIST of its shard objects
    ids=["leaf-metadata", "shard-list"],
)
def test_an_open_that_meets_an_overwrite_opens_the_new_dataset(server, proxy, request_held):
    """The reader has read psdp.json (the old dataset) when its next request is held at the
    proxy while an overwrite commits and deletes the old prefix: the open must see that
    psdp.json changed and open the new dataset, never call the dataset damaged."""
    path = f"reopen-{'list' if request_held == 'LIST' else 'leaf'}/"
    request_held = listing(server) if request_held == "LIST" else request_held
    old, new = rows(40, seed=50), rows(24, seed=51)
    write_dataset(spec(server, path), old, rows_per_shard=8, progress=False)
    held = proxy.hold("GET", request_held)
    thread, outcome = _open_in_thread(spec(server, path, proxy))
    assert held.reached.wait(60), "the reader never sent the request"
    write_dataset(spec(server, path), new, rows_per_shard=8, overwrite=True, progress=False)
    held.release()
    thread.join(60)
    source = outcome["source"]
    assert isinstance(source, TensorStoreSource), source
    assert len(source) == 24
    np.testing.assert_array_equal(source.read(np.arange(24))["tokens"], new["tokens"])


def test_an_open_overwritten_every_time_says_so(server, proxy):
    """Each of the open's tries meets another overwrite: it gives up saying what happened (the
    dataset is not damaged), after `OPEN_ATTEMPTS` tries."""
    from psdp.sources.stores.tensorstore import OPEN_ATTEMPTS

    path = "reopen-always/"
    write_dataset(spec(server, path), rows(16, seed=60), rows_per_shard=8, progress=False)
    held = proxy.hold("GET", "/tokens/zarr.json")
    thread, outcome = _open_in_thread(spec(server, path, proxy))
    for attempt in range(OPEN_ATTEMPTS):
        assert held.reached.wait(60), f"try {attempt + 1} never came"
        data = rows(16, seed=61 + attempt)
        write_dataset(spec(server, path), data, rows_per_shard=8, overwrite=True, progress=False)
        last, held = held, proxy.hold("GET", "/tokens/zarr.json")
        last.release()
    thread.join(60)
    error = outcome["source"]
    assert isinstance(error, ValueError), error
    assert f"was overwritten while it was being opened, {OPEN_ATTEMPTS} times" in str(error)
    assert "missing" not in str(error) and "rewrite" not in str(error)  # not called damaged


def test_foreign_objects_are_never_overwritten(server):
    objects = server.objects()
    objects[b"foreign/notes.txt"] = b"not a dataset"
    with pytest.raises(FileExistsError, match=r"not a psdp dataset \(it holds notes.txt\)"):
        write_dataset(spec(server, "foreign/"), rows(4), overwrite=True, progress=False)
    assert objects[b"foreign/notes.txt"] == b"not a dataset"


def test_an_unfinished_write_is_refused_by_readers(server):
    objects = server.objects()
    objects[b"unfinished/psdp-data-0123abcd/tokens/zarr.json"] = b"{}"
    with pytest.raises(FileNotFoundError, match="did not finish; rerun it with overwrite=True"):
        TensorStoreSource(spec(server, "unfinished/"))
    with pytest.raises(FileNotFoundError, match=f"no dataset at {url(server, 'nothing-here/')}"):
        TensorStoreSource(spec(server, "nothing-here/"))


# --------------------------------------------------------------------------- credentials
_OPEN_AND_FAIL = """
import json, sys
import numpy as np
from psdp.sources import TensorStoreSource, read_metadata
from psdp.sources.stores.writer import write_dataset

spec = json.loads(sys.argv[1])
write_dataset(spec, np.arange(8, dtype=np.int32), progress=False)
assert TensorStoreSource(spec).read(np.array([3])).tolist() == [3]
leaf = {**spec, "path": spec["path"] + read_metadata(spec)["data_prefix"] + "array/"}
assert TensorStoreSource({"driver": "zarr3", "kvstore": leaf}).read(np.array([5])).tolist() == [5]
for problem, bad in [("refused", {"endpoint": sys.argv[2]}), ("bucket", {"bucket": "no-such"})]:
    try:
        TensorStoreSource({**spec, **bad})
    except (ValueError, FileNotFoundError) as error:
        print(problem, type(error).__name__, error)
"""


def test_an_s3_open_logs_nothing_and_real_errors_still_raise(server, tmp_path):
    if gcs(server):
        pytest.skip(
            "S3's credential chain; GCS: test_refused_credentials_are_a_clear_error_and_never_shown"
        )
    """TensorStore's AWS layer logs an ERROR line for every ~/.aws file it does not find, on
    every S3 open, unless the spec says where credentials come from: with AWS_ACCESS_KEY_ID set,
    psdp names the environment, so a write, opens (of the dataset, and of one array by its
    spec) and reads log nothing (HOME has no .aws here). A refused connection and a missing bucket
    still raise with the store's message."""
    from psdp.tools.benchmarks.object_store import free_port

    where = spec(server, "quiet/", retries={"max_retries": 1, "initial_delay": "1ms"})
    refused = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_AND_FAIL, json.dumps(where), refused],
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    noise = [line for line in done.stderr.splitlines() if ".aws" in line or "Credentials" in line]
    assert noise == [], done.stderr
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert out["refused"].startswith(
        f"ValueError cannot reach s3://psdp/quiet/ (endpoint {refused})"
    )
    assert "Could not connect to server" in out["refused"]
    # TensorStore 0.1.86 says "NoSuchBucket" (psdp names the bucket), 0.1.68 "Malformed List ..."
    assert out["bucket"].startswith(
        ("FileNotFoundError the bucket of s3://no-such/quiet/", "ValueError ")
    ), out


# --------------------------------------------------------------------- damage: fail, never zeros
def _damaged(server, path):
    where = spec(server, path)
    data = rows(64, seed=5)
    write_dataset(where, data, rows_per_shard=16, progress=False)
    prefix = read_metadata(where)["data_prefix"]
    return where, data, f"{path}{prefix}tokens/c/2/0"  # rows 32..47 of the tokens leaf


def test_a_deleted_shard_is_refused_on_open_and_on_read(server, mesh_1d):
    where, data, shard = _damaged(server, "deleted/")
    source = TensorStoreSource(where)  # opened whole: then the shard goes
    del server.objects()[shard.encode()]
    with pytest.raises(ValueError, match=f"missing 1 shard file.*{shard.split('/', 1)[1]}"):
        TensorStoreSource(where)
    loader = DataLoader(
        source,
        mesh=mesh_1d,
        global_batch_size=64,
        shuffle=False,
        read_timeout_s=30,
        read_attempts=4,
    )
    # a missing object is permanent: it fails at once (no retry), naming the object and the step
    with pytest.raises(ValueError, match=f"NOT_FOUND.*{shard}") as caught, loader:
        next(iter(loader))
    assert any("psdp: step 0: reading" in note for note in caught.value.__notes__)
    assert not any("try" in note for note in caught.value.__notes__)


def test_a_corrupted_chunk_fails_its_checksum(server):
    where, data, shard = _damaged(server, "corrupt/")
    objects = server.objects()
    raw = bytearray(objects[shard.encode()])
    raw[5 * (8 * 4 + 4) + 3] ^= 0xFF  # row 37: the 6th chunk (32 data bytes + a crc32c each)
    objects[shard.encode()] = bytes(raw)
    source = TensorStoreSource(where)
    np.testing.assert_array_equal(source.read(np.array([36]))["tokens"], data["tokens"][[36]])
    with pytest.raises(ValueError, match=f"DATA_LOSS.*{shard}"):
        source.read(np.array([37]))


# ------------------------------------------------------------------------ faults and retries
def test_faults_are_retried_and_every_batch_is_exact(server, proxy, mesh_1d, caplog):
    """Faults by rule, the same on every run: the first try of every read of the tokens' shard 1
    is dropped (TensorStore's HTTP layer tries again, uncounted), and the first 3 tries of every
    read of the weights' shard 2 answer 503: TensorStore retries twice (counted), then gives up,
    so psdp's retry gets them. One read thread: no two steps share a request's tries."""
    data = rows(96, seed=6)
    write_dataset(spec(server, "faults/"), data, rows_per_shard=16, progress=False)
    source = TensorStoreSource(spec(server, "faults/", proxy))
    settings = dict(mesh=mesh_1d, global_batch_size=24, seed=3)
    loader = DataLoader(source, read_attempts=8, retry_backoff_s=0.01, read_threads=1, **settings)
    proxy.latency_s = 0.002
    proxy.fail("drop", tries=1, where="/tokens/c/1/0")  # rows 16..31
    proxy.fail("503", tries=1 + FAST_RETRIES["max_retries"], where="/weight/c/2")  # 32..47
    store_before = TensorStoreSource.request_counts()
    with loader, caplog.at_level("WARNING", logger="psdp"):
        for step, batch in zip(range(8), loader, strict=False):  # two epochs: every row read
            assert_batch_exact(batch, expected_batch(data, step, **settings))
    store_retries = TensorStoreSource.request_counts()[1] - store_before[1]
    psdp_retries = [r for r in caplog.records if "SlowDown" in r.getMessage()]
    assert proxy.faults["drop"] > 0 and proxy.faults["503"] >= 3
    assert store_retries >= FAST_RETRIES["max_retries"] and psdp_retries


def test_psdp_retries_a_transient_error_that_outlives_the_store(server, proxy, mesh_1d):
    data = rows(32, seed=7)
    write_dataset(spec(server, "outlives/"), data, rows_per_shard=8, progress=False)
    source = TensorStoreSource(spec(server, "outlives/", proxy, retries={"max_retries": 1}))
    loader = DataLoader(
        source, mesh=mesh_1d, global_batch_size=8, read_attempts=2, retry_backoff_s=None
    )
    proxy.fail("503", tries=1 << 30, where="/outlives/")  # every read: TensorStore gives up,
    with loader, pytest.raises(TransientReadError, match="SlowDown") as caught:  # then psdp
        loader.batch_at(0)
    assert any("(try 2 of 2)" in note for note in caught.value.__notes__)


class CountingReads(TensorStoreSource):
    """A `TensorStoreSource` that counts the reads the loader asks of it (tries included)."""

    calls = 0

    def read(self, ids):
        self.calls += 1
        return super().read(ids)

    def read_window(self, ids, columns):
        self.calls += 1
        return super().read_window(ids, columns)


def test_a_store_error_is_retried_by_its_status_not_by_a_word_in_its_path(server, proxy, mesh_1d):
    """Every object's key holds the status word UNAVAILABLE, so every error message does too: a
    throttled store (503: ABORTED once TensorStore's retries are spent) is tried read_attempts
    times, a missing object (NOT_FOUND) once."""
    path = "UNAVAILABLE/ds/"
    data = rows(32, seed=9)
    write_dataset(spec(server, path), data, rows_per_shard=8, progress=False)
    source = CountingReads(spec(server, path, proxy, retries={"max_retries": 1}))
    options = {"mesh": mesh_1d, "global_batch_size": 8, "shuffle": False, "read_attempts": 3}
    with DataLoader(source, retry_backoff_s=None, **options) as loader:
        proxy.fail("503", tries=10**6, where=path)  # every read answered 503 SlowDown
        source.calls = 0
        with pytest.raises(TransientReadError, match="UNAVAILABLE/ds/"):
            loader.batch_at(0)
        assert source.calls == 3
        proxy.stop_failing()
        np.testing.assert_array_equal(np.asarray(loader.batch_at(0)["tokens"]), data["tokens"][:8])
        prefix = read_metadata(spec(server, path))["data_prefix"]
        del server.objects()[f"{path}{prefix}tokens/c/1/0".encode()]  # rows 8-15
        source.calls = 0
        with pytest.raises(ValueError, match="NOT_FOUND.*UNAVAILABLE/ds/") as caught:
            loader.batch_at(1)
        assert source.calls == 1
    assert not any("(try" in note for note in caught.value.__notes__)


@pytest.fixture
def fast_write_retries(monkeypatch):
    """psdp's pause before a write's next try, 10 ms (0.5 s by default, as for reads)."""
    from psdp.sources.stores import errors

    monkeypatch.setattr(errors, "WRITE_BACKOFF_S", 0.01)


def _objects_below(server, path):
    return sorted(
        k.decode() for k in server.objects().list().result() if k.startswith(path.encode())
    )


@pytest.mark.parametrize("kind", WRITERS)
def test_a_write_whose_replies_are_cut_mid_way_is_retried_and_exact(
    server, proxy, kind, fast_write_retries
):
    """The first try of every PUT (shards, zarr.json, the psdp.json commit) takes effect at the
    server, but its reply is cut mid-way (curl's "Weird server reply", which TensorStore does not
    retry): psdp tries each again, so both writers complete, exact, and each object was cut
    exactly once (a request's tries are counted by key at the proxy)."""
    write, check = WRITERS[kind]
    path = f"cut-{kind}/"
    proxy.fail("cut", tries=1, method=upload(server))
    write(spec(server, path, proxy), seed=70)
    check(spec(server, path), seed=70)
    objects = _objects_below(server, path)
    assert proxy.faults["cut"] == len(objects) and proxy.faults.keys() == {"cut"}
    meta = json.loads(bytes(server.objects()[f"{path}psdp.json".encode()]))
    assert _prefixes(server, path) == {"psdp.json", meta["data_prefix"].rstrip("/")}


@pytest.mark.parametrize("kind", WRITERS)
def test_a_write_outliving_the_stores_retries_is_retried_by_psdp(
    server, proxy, kind, fast_write_retries
):
    """Every metadata PUT (each leaf's zarr.json, psdp.json) answers 503 SlowDown until
    TensorStore's own retries are spent (ABORTED), and every shard PUT's reply is cut: psdp
    retries both, as it retries a read, and the store is exact."""
    write, check = WRITERS[kind]
    path = f"outlive-{kind}/"
    tries = 1 + FAST_RETRIES["max_retries"]
    proxy.fail("503", tries=tries, where=".json", method=upload(server))
    proxy.fail("cut", tries=1, where="/c/", method=upload(server))
    write(spec(server, path, proxy), seed=71)
    check(spec(server, path), seed=71)
    objects = _objects_below(server, path)
    shards = [k for k in objects if "/c/" in k]
    assert proxy.faults["cut"] == len(shards) > 0
    assert proxy.faults["503"] == tries * (len(objects) - len(shards))


def test_a_read_whose_reply_is_cut_mid_way_is_retried(server, proxy, mesh_1d):
    """A reply cut mid-way is transient for a read too: the loader tries again and reads the
    rows exactly. The proxy cuts one GET only; a try that follows the failed one at once can
    still join its entries' reads while TensorStore delivers their error one entry at a time
    (seen in CI with no backoff), so the loader waits between tries as it does by default, and
    the test asks for a second try, not for exactly two."""
    data = rows(32, seed=72)
    write_dataset(spec(server, "cut-read/"), data, rows_per_shard=8, progress=False)
    source = CountingReads(spec(server, "cut-read/", proxy))
    with DataLoader(source, mesh=mesh_1d, global_batch_size=8, shuffle=False, read_attempts=4,
                    retry_backoff_s=0.01) as loader:  # fmt: skip
        # rows 8-15: the first GET of their shard is cut, whichever of its entries it reads
        proxy.fail("cut", tries=1, where="/tokens/c/1/", method="GET", by_range=False)
        source.calls = 0
        np.testing.assert_array_equal(
            np.asarray(loader.batch_at(1)["tokens"]), data["tokens"][8:16]
        )
    assert proxy.faults["cut"] == 1 and source.calls >= 2


# -------------------------------------------------------------------------------- the pod
def pod_reads_remote(spec, expected_npz, process_index, axis_names, mesh_shape, steps):
    """Runs in every pod process: the loader over the remote dataset, every shard checked."""
    import jax

    from psdp import MeshLayout

    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    mesh = layout.build_mesh(jax.devices())
    with np.load(expected_npz) as saved:
        data = {k: saved[k] for k in saved.files}
    before = TensorStoreSource.request_counts()
    shards = 0
    settings = dict(mesh=mesh, global_batch_size=12, seed=9)
    loader = DataLoader(
        TensorStoreSource(spec),
        **settings,
        read_threads=2,
        read_attempts=8,
        retry_backoff_s=0.01,
        first_read_timeout_s=120,
        read_timeout_s=60,
    )
    with loader:
        for step, batch in zip(range(steps), loader, strict=False):
            shards += assert_batch_exact(batch, expected_batch(data, step, **settings))
    after = TensorStoreSource.request_counts()
    return {"shards": shards, "requests": after[0] - before[0], "retries": after[1] - before[1]}


@pytest.mark.multiprocess
def test_four_host_pod_reads_through_faults_every_shard_exact(server, proxy, tmp_path):
    data = rows(60, seed=8)
    write_dataset(spec(server, "pod/"), data, rows_per_shard=16, progress=False)
    np.savez(tmp_path / "expected.npz", **data)
    proxy.latency_s = 0.002
    # the first try of every read of these shards fails; TensorStore tries again and gets it (a
    # request two hosts share fails once in all, on one of them)
    proxy.fail("drop", tries=1, where="/tokens/c/1/0")
    proxy.fail("503", tries=1, where="/weight/c/2")
    results = run_on_noncontiguous_pod(
        pod_reads_remote,
        spec=spec(server, "pod/", proxy, retries={"max_retries": 1}),
        expected_npz=str(tmp_path / "expected.npz"),
        steps=7,  # 60 rows, B=12: five steps an epoch, then a reshuffled epoch
    )
    # 2 leaves and the mask x 2 local devices x 7 steps, on each of the 4 processes
    assert [r["shards"] for r in results] == [42] * 4
    assert proxy.faults["drop"] > 0 and proxy.faults["503"] > 0
    assert sum(r["retries"] for r in results) > 0  # the 503s (dropped connections go uncounted)
    # TensorStore counted the requests the proxy saw (and no more: reads still in flight at the
    # end may reach the proxy after the count)
    assert 0 < sum(r["requests"] for r in results) <= sum(proxy.requests.values())


# ------------------------------------------------------------------------------- the cache
def test_cached_chunks_are_read_again_with_no_request(server, proxy):
    """A committed dataset never changes under its prefix, so what the cache holds (shard
    indexes, chunks) is used as it is, never checked again: counted at the proxy, a first read
    of 5 rows in 4 shards costs one GET per shard index and per chunk (4 + 4), and reading the
    same rows again costs none."""
    table = np.arange(64 * 4, dtype=np.int32).reshape(64, 4)
    where = spec(server, "cached/")
    write_dataset(where, table, rows_per_shard=16, rows_per_chunk=4, progress=False)
    source = TensorStoreSource(spec(server, "cached/", proxy), cache_bytes=16 << 20)
    ids = np.array([63, 3, 17, 18, 40])  # chunks 15, 0, 4, 4, 10: one in each shard
    proxy.reset()
    np.testing.assert_array_equal(source.read(ids), table[ids])
    assert dict(proxy.requests) == {"GET": 8}
    proxy.reset()
    for _ in range(3):
        np.testing.assert_array_equal(source.read(ids), table[ids])
        np.testing.assert_array_equal(source.read(ids[::-1]), table[ids[::-1]])
    assert dict(proxy.requests) == {}


def test_cached_document_chunks_are_read_again_with_no_request(server, proxy):
    """The same for a document store: a second read of the same token ranges makes no request."""
    import tensorstore as ts

    docs = [np.arange(n, dtype=np.int32) + 100 * n for n in (5, 9, 3, 12)]
    write_documents(spec(server, "cached-docs/"), docs, tokens_per_shard=8, tokens_per_chunk=4,
                    progress=False)  # fmt: skip
    cache = ts.Context({"cache_pool": {"total_bytes_limit": 16 << 20}})
    store = open_documents(spec(server, "cached-docs/", proxy), context=cache)
    flat = np.concatenate(docs)
    starts, stops = np.array([0, 6, 20]), np.array([4, 15, 29])
    want = np.concatenate([flat[a:b] for a, b in zip(starts, stops, strict=True)]).tolist()

    def read():
        return store.read_ranges(starts, stops)["input_ids"].tolist()

    proxy.reset()
    assert read() == want and proxy.requests["GET"] > 0
    proxy.reset()
    assert read() == want and read() == want
    assert dict(proxy.requests) == {}


# ------------------------------------------------------------------ block shuffle requests
def test_a_block_shuffle_reads_few_requests_per_step(server, proxy):
    """Counted at the proxy: a step of a block shuffle over chunks of ``io_block`` rows costs at
    most one GET per block plus one per shard index; a full shuffle over 1-row chunks about one
    per row. The bound comes from the step's row ids alone (row // io_block, row // shard)."""
    from psdp._plan.block_shuffle import BlockShuffle
    from psdp._plan.order import IndexShuffle

    n, width, shard, io_block, window, batch = 256, 256, 64, 8, 4, 16
    table = np.arange(n * width, dtype=np.int32).reshape(n, width)
    write_dataset(
        spec(server, "blocks/"),
        table,
        rows_per_shard=shard,
        rows_per_chunk=io_block,
        progress=False,
    )
    write_dataset(spec(server, "rows/"), table, rows_per_shard=shard, progress=False)
    orders = {"blocks/": BlockShuffle(n, io_block, window, key=3), "rows/": IndexShuffle(n, 3)}
    gets = {}
    for path, perm in orders.items():
        source = TensorStoreSource(spec(server, path, proxy))
        gets[path] = []
        for step in range(n // batch):
            ids = np.sort(perm(np.arange(step * batch, (step + 1) * batch)))
            proxy.reset()
            np.testing.assert_array_equal(source.read(ids), table[ids])
            gets[path].append(proxy.requests["GET"])
            if path == "blocks/":
                blocks, shards = len(set(ids // io_block)), len(set(ids // shard))
                assert blocks <= window  # a step lies within one window of `window` blocks
                assert gets[path][-1] <= blocks + shards
    assert sum(gets["rows/"]) >= 2 * sum(gets["blocks/"]), gets


def test_the_loaders_block_shuffle_cuts_requests_and_resumes_exactly(server, proxy, mesh_1d):
    """``io_block`` through the loader, counted at the proxy: every batch exact against the
    oracle (the block shuffle written again from its documented rule), each epoch a permutation
    of the rows, each step's GETs within its blocks + shard indexes and far fewer than a full
    shuffle's; a restore mid-epoch (given no order: the state's) gives the same batches."""
    n, width, shard, io_block, window, batch = 512, 1024, 256, 16, 2, 32
    data = {"x": np.arange(n * width, dtype=np.int32).reshape(n, width)}
    write_dataset(spec(server, "lblocks/"), data, rows_per_shard=shard, rows_per_chunk=io_block,
                  progress=False)  # fmt: skip
    write_dataset(spec(server, "lrows/"), data, rows_per_shard=shard, rows_per_chunk=1,
                  progress=False)  # fmt: skip
    gets: dict[str, list[int]] = {}
    for path, order in {"lblocks/": {"io_block": io_block, "window_blocks": window},
                        "lrows/": {}}.items():  # fmt: skip
        source = TensorStoreSource(spec(server, path, proxy))
        gets[path], seen = [], []
        settings = dict(mesh=mesh_1d, global_batch_size=batch, seed=3, **order)
        with DataLoader(source, **settings) as loader:
            for step in range(n // batch):
                proxy.reset()
                got = loader.batch_at(step)
                gets[path].append(proxy.requests["GET"])
                want = expected_batch(data, step, **settings)
                assert_batch_exact(got, want)
                ids = np.asarray(got["x"])[:, 0] // width
                seen += ids.tolist()
                if order:
                    blocks, shards = len(set(ids // io_block)), len(set(ids // shard))
                    assert blocks <= window and gets[path][-1] <= blocks + shards
            assert sorted(seen) == list(range(n))  # the epoch: each row once
            state = loader.iter_from(5).state()
            loader.close()
        with DataLoader.restore(state, source, mesh=mesh_1d) as restored:  # the state's order
            assert_batch_exact(restored.batch_at(5), expected_batch(data, 5, **settings))
    # a step of 32 rows: ~32 GETs of 1-row chunks against 2-3 blocks (+ shard indexes)
    assert sum(gets["lrows/"]) >= 3 * sum(gets["lblocks/"]), gets


# ------------------------------------------------------------------------------ the endpoint
def test_an_s3_url_takes_its_endpoint_from_the_environment(server, monkeypatch):
    if gcs(server):
        pytest.skip("S3's variables; GCS: test_data_config.py and test_cli.py take gs:// URLs")
    """A plain ``s3://`` URL reaches moto through AWS_ENDPOINT_URL (AWS_ENDPOINT_URL_S3 first,
    when both are set), for a dataset and a document store alike, as a DataConfig's store does."""
    from psdp.tools.benchmarks.object_store import free_port

    data = rows(20, seed=80)
    docs = [np.arange(3 + d, dtype=np.int32) for d in range(4)]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # a closed port
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint)  # wins
    write_dataset("s3://psdp/env-rows/", data, rows_per_shard=8, progress=False)
    write_documents("s3://psdp/env-docs/", docs, progress=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    got = TensorStoreSource("s3://psdp/env-rows/").read(np.arange(20))
    np.testing.assert_array_equal(got["tokens"], data["tokens"])
    store = open_documents("s3://psdp/env-docs/")
    assert store.read_ranges([0], [18])["input_ids"].tolist() == np.concatenate(docs).tolist()


def test_a_prepare_whose_replies_are_cut_mid_way_is_retried_and_exact(
    server, proxy, tmp_path, fast_write_retries
):
    """``psdp prepare`` into S3 when the first try of every PUT (each part's shards and
    metadata, the index, every commit of the manifest, a compare-and-swap) lands at the server
    but its reply is cut: each is tried again (the manifest's by reading back what landed), and
    the store holds exactly the tokenizer's ids."""
    from tokenizers import Tokenizer

    from psdp.prepare import prepare
    from tests import prepare_corpus as corpus

    tokenizer = corpus.train_tokenizer(tmp_path / "tokenizer.json")
    texts = corpus.texts(40, seed=72)
    corpus.write_jsonl(tmp_path / "a.jsonl", texts[:25])
    corpus.write_jsonl(tmp_path / "b.jsonl", texts[25:])
    path = "cut-prepare/"
    proxy.fail("cut", tries=1, method=upload(server))
    prepare(str(tmp_path / "*.jsonl"), spec(server, path, proxy), tokenizer=tokenizer, eos=1,
            workers=1, progress=False)  # fmt: skip
    assert proxy.faults["cut"] >= len(_objects_below(server, path)) > 0
    encoded = Tokenizer.from_file(str(tokenizer)).encode_batch(texts, add_special_tokens=False)
    want = [[*e.ids, 1] for e in encoded if e.ids]
    store = open_documents(spec(server, path))
    ids = store.read_ranges([0], [store.num_tokens])["input_ids"].tolist()
    assert store.num_documents == len(want) and ids == [i for doc in want for i in doc]


# ------------------------------------------------------------------------------- bad input
def test_a_missing_bucket_is_a_clear_error_and_leaves_nothing(server):
    """Reads, writes and document stores in a bucket that does not exist fail at once naming the
    URL: S3 says so in its LIST, GCS answers a read as for a missing object (so the open says
    "no dataset", with the bucket among what to check) and a write with 404."""
    where = {**spec(server, "x/"), "bucket": "no-such-bucket"}
    name = f"{'gs' if gcs(server) else 's3'}://no-such-bucket/x/"
    with pytest.raises(FileNotFoundError, match="bucket") as caught:
        TensorStoreSource(where)
    assert name in str(caught.value)
    for write in (
        lambda: write_dataset(where, rows(4), progress=False),
        lambda: write_documents(where, [np.arange(3, dtype=np.int32)], progress=False),
    ):
        with pytest.raises(FileNotFoundError, match="does not exist") as caught:
            write()
        assert name in str(caught.value) and "Create it" in str(caught.value)
    with pytest.raises(FileNotFoundError, match=f"no document store at {name}"):
        open_documents(where)


_REFUSED = """
import json, sys
import numpy as np
from psdp.sources import TensorStoreSource
from psdp.sources.documents.store import open_documents
from psdp.sources.stores.writer import write_dataset

spec = json.loads(sys.argv[1])
for what, action in [
    ("open", lambda: TensorStoreSource(spec)),
    ("documents", lambda: open_documents(spec)),
    ("write", lambda: write_dataset({**spec, "path": "refused-new/"}, np.arange(4), progress=False)),
]:
    try:
        action()
        print(what, "no error")
    except Exception as error:
        print(what, type(error).__name__, " ".join(str(error).split()))
"""


def test_refused_credentials_are_a_clear_error_and_never_shown(server, tmp_path):
    """Credentials the store refuses (GCS: a token its proxy does not know, 401; S3: a moto server
    that checks access keys, 403) fail at once, not retried, naming the URL and where
    credentials come from; the secret appears in no message and no log line. In a process of
    its own: TensorStore reads a GCS token once per process."""
    secret = "psdp-secret-never-shown"
    env = {**os.environ, "HOME": str(tmp_path)}
    if gcs(server):
        write_dataset(spec(server, "refused/"), rows(4), progress=False)
        env["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = secret
        checking, where = None, spec(server, "refused/")
        expected = ["gs://psdp/refused", "401", "GOOGLE_APPLICATION_CREDENTIALS"]
    else:  # a second moto server, that checks every request's key after its first (the bucket)
        env.update(INITIAL_NO_AUTH_ACTION_COUNT="1", AWS_SECRET_ACCESS_KEY=secret)
        checking = S3Server()
        with mock_environment(env):
            checking.start()
        where = {**checking.kvstore("refused/"), "s3_request_retries": FAST_RETRIES}
        expected = ["s3://psdp/refused", "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _REFUSED, json.dumps(where)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        if checking is not None:
            checking.stop()
    assert done.returncode == 0, done.stderr
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert out["open"].startswith("PermissionError ") and out["write"].startswith(
        "PermissionError "
    ), out
    for fragment in expected:
        assert fragment in out["open"] and fragment in out["write"], (fragment, out)
    assert "refused the credentials" in out["documents"], out
    assert secret not in done.stdout + done.stderr


class mock_environment:
    """``os.environ`` is ``env`` inside (for a server started there to inherit), as before after."""

    def __init__(self, env):
        self.env, self.saved = env, None

    def __enter__(self):
        self.saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc_info):
        os.environ.clear()
        os.environ.update(self.saved)


@pytest.mark.parametrize("fault", ["drop", "cut"])
def test_a_store_that_keeps_dropping_reads_fails_naming_the_url(server, proxy, mesh_1d, fault):
    """Every read of a shard is dropped (reset, no answer) or cut mid-reply: transient, so tried
    again, by TensorStore (a drop) and by the loader, a counted number of times; then a
    `TransientReadError` naming the URL, never a batch. The rows before are exact."""
    path = f"keeps-{fault}/"
    data = rows(32, seed=90)
    write_dataset(spec(server, path), data, rows_per_shard=8, progress=False)
    source = CountingReads(spec(server, path, proxy, retries={"max_retries": 1}))
    options = {"mesh": mesh_1d, "global_batch_size": 8, "shuffle": False, "read_attempts": 3}
    with DataLoader(source, retry_backoff_s=None, **options) as loader:
        np.testing.assert_array_equal(np.asarray(loader.batch_at(0)["tokens"]), data["tokens"][:8])
        proxy.fail(fault, tries=10**6, where="/tokens/c/1/")  # rows 8-15
        source.calls = 0
        with pytest.raises(TransientReadError, match=url(server, path)) as caught:
            loader.batch_at(1)
    # One fault per try is not promised: a try may fail on a read that an earlier try started
    # and TensorStore shares between them (reads of one chunk in flight are joined), so the
    # tries are counted at the source and the proxy only shows that the store was failing.
    assert source.calls == 3 and proxy.faults[fault] >= 1
    assert any("(try 3 of 3)" in note for note in caught.value.__notes__)


def test_the_gcs_proxy_refuses_a_stale_generation_as_gcs_does():
    """fake-gcs-server takes a write whose ifGenerationMatch is stale; GcsServer's proxy refuses
    it (412: TensorStore reports the condition failed, an empty generation), and takes a fresh
    one; an absent object matches generation 0 only."""
    import tensorstore as ts

    with GcsServer() as server:
        store = ts.KvStore.open(server.kvstore("cas/")).result()
        first = store.write(b"k", b"one").result().generation
        assert store.write(b"k", b"two", if_equal=first).result().generation  # fresh: taken
        assert store.write(b"k", b"three", if_equal=first).result().generation == b""  # stale
        assert store.write(b"k", b"four", if_equal=b"\x02").result().generation == b""  # exists
        assert store.write(b"new", b"one", if_equal=b"\x02").result().generation  # absent: taken
        assert store.read(b"k").result().value == b"two"
        # the emulator alone (its own port, no proxy) takes the stale write: why the proxy is
        bare = ts.KvStore.open(server.kvstore("cas/", f"http://127.0.0.1:{server.port}")).result()
        assert bare.write(b"k", b"five", if_equal=first).result().generation
        assert bare.read(b"k").result().value == b"five"
