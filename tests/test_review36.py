"""A reviewer's attacks on the object-store paths of issue 36 (S3 on moto, GCS on fake-gcs-server),
through the documented entry points: each a case that once failed, kept failing if it regresses.

Every test runs on both stores where both apply; the emulators are the ones the other object-store
tests start (``psdp.tools.benchmarks.object_store``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from psdp import DocumentStore, write_dataset, write_documents
from psdp.sources import TensorStoreSource
from psdp.sources.stores import location
from psdp.tools.benchmarks.object_store import (
    GCS_ENVIRONMENT,
    S3_ENVIRONMENT,
    FaultProxy,
    GcsServer,
    S3Server,
)
from psdp.tools.cli import main


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that accepts every connection and never answers (a hung server, a
    firewall that swallows packets after the handshake): no error ever reaches the client."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listening.accept()[0])

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        listening.shutdown(socket.SHUT_RDWR)  # ends the accept() under way
        listening.close()
        accepting.join()
        for connection in held:
            connection.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_endpoint_that_never_answers_is_an_error_naming_it_in_bounded_time(scheme, monkeypatch):
    """The first request's reach check had no deadline: TensorStore sets no timeout on a request
    that gets no answer, so an open hung for good (over 300 s, measured) instead of failing in
    seconds naming the endpoint as a refused one does. ~1 s per store."""
    monkeypatch.setattr(location, "REACH_TIMEOUT_S", 1.0)
    for name, value in {**S3_ENVIRONMENT, **GCS_ENVIRONMENT}.items():
        monkeypatch.setenv(name, value)
    with silent_endpoint() as endpoint:
        variable = "AWS_ENDPOINT_URL_S3" if scheme == "s3" else location.GCS_ENDPOINT_VARIABLE
        monkeypatch.setenv(variable, endpoint)
        with pytest.raises(ValueError, match="no answer within 1.0 s") as caught:
            TensorStoreSource(f"{scheme}://psdp/silent")
    assert f"cannot reach {scheme}://psdp/silent/ (endpoint {endpoint})" in str(caught.value)


# ------------------------------------------------------------------ on both emulators
@pytest.fixture(scope="module", params=[S3Server, GcsServer], ids=["s3", "gcs"])
def server(request):
    with request.param() as started:
        yield started


@pytest.fixture
def proxy(server, monkeypatch):
    """A `FaultProxy` in front of ``server``, where every ``s3://``/``gs://`` URL goes; psdp's
    pause before a store request's next try 10 ms (0.5 s by default)."""
    from psdp.sources.stores import errors

    monkeypatch.setattr(errors, "WRITE_BACKOFF_S", 0.01)
    with FaultProxy(server.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", p.endpoint)
        monkeypatch.setenv(location.GCS_ENDPOINT_VARIABLE, p.endpoint)
        yield p


def scheme(server) -> str:
    return "gs" if isinstance(server, GcsServer) else "s3"


def write_both(server, name: str, count: int, width: int) -> tuple[str, list, np.ndarray]:
    """A document store of ``count`` documents at ``<base>-docs`` and a dataset of ``8 x width``
    rows at ``<base>-rows``, both written straight to ``server``: ``base``, the documents, the
    rows."""
    docs = [np.arange(3 + d, dtype=np.int32) for d in range(count)]
    rows = np.arange(8 * width * width, dtype=np.int32).reshape(8 * width, width)
    base = f"{scheme(server)}://psdp/{name}"
    write_documents(f"{base}-docs", docs, progress=False)
    write_dataset(f"{base}-rows", {"tokens": rows}, rows_per_shard=8, progress=False)
    return base, docs, rows


def assert_both_read_exactly(base: str, docs: list, rows: np.ndarray) -> None:
    """Both stores of `write_both`, opened again, read back exactly."""
    store = DocumentStore.open(f"{base}-docs")
    got = store.read_ranges([0], [store.num_tokens])["input_ids"]
    assert got.tolist() == np.concatenate(docs).tolist()
    source = TensorStoreSource(f"{base}-rows")
    np.testing.assert_array_equal(source.read(np.arange(len(rows)))["tokens"], rows)


def test_an_open_whose_metadata_reply_is_cut_is_retried_not_called_damage(server, proxy):
    """Opening a document store (or a dataset) whose array metadata's first reply is cut mid-way
    (curl's "Weird server reply": transient, as the object-store guide says) said "the store is
    damaged or incomplete: rewrite it" about a healthy store. Each open is tried again and reads
    the exact documents and rows. ~1 s per store."""
    written = write_both(server, "cut-open", count=20, width=4)
    proxy.fail("cut", tries=1, where="zarr.json", by_range=False)
    assert_both_read_exactly(*written)
    assert proxy.faults["cut"] >= 4  # index, offsets, input_ids; tokens


def test_an_open_whose_first_reply_is_cut_is_retried(server, proxy):
    """The first reply of each ``psdp.json`` read cut mid-way: the reach check took the cut for
    an endpoint that cannot be reached ("cannot reach ... gave up after 0.0 s") on the first
    try. Each read is tried again; the store opens and reads exactly. ~1 s per store."""
    written = write_both(server, "cut-meta", count=10, width=2)
    proxy.fail("cut", tries=1, where="psdp.json", by_range=False)
    assert_both_read_exactly(*written)
    assert proxy.faults["cut"] == 2


def test_a_metadata_read_whose_reply_is_cut_is_retried(server, proxy, monkeypatch):
    """As above for the read of ``psdp.json`` that follows the reach check (taken out here, so
    that the cut falls on that read): it was not tried again, so a cut reply failed the open.
    ~1 s per store."""
    monkeypatch.setattr(location, "check_reach", lambda *args, **kwargs: None)
    written = write_both(server, "cut-read-meta", count=10, width=2)
    proxy.fail("cut", tries=1, where="psdp.json", by_range=False)
    assert_both_read_exactly(*written)
    assert proxy.faults["cut"] == 2


def test_prepare_into_a_bucket_that_does_not_exist_names_it(server, tmp_path, capsys):
    """``psdp prepare --output`` into a missing bucket printed the store's bare answer
    (``NOT_FOUND: Not Found [http_response_code='404'] ...``), naming no URL and no fix, while
    `write_documents` there says the bucket does not exist. ~1 s per store."""
    from tests import prepare_corpus as corpus

    tokenizer = corpus.train_tokenizer(tmp_path / "tokenizer.json")
    corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(5, seed=1))
    output = f"{scheme(server)}://no-such-bucket/tokens"
    code = main(["prepare", str(tmp_path / "a.jsonl"), "--output", output, "--tokenizer",
                 str(tokenizer), "--eos", "1", "--no-progress", "--endpoint", server.endpoint])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{output}/" in err and "does not exist" in err and "Create it" in err, err


def test_the_index_command_named_for_a_spec_is_one_the_cli_takes():
    """A store given as a kvstore spec (what ``s3://`` with ``--endpoint`` becomes) was named in
    the command to run as a Python dict (``'{'"'"'bucket'"'"': ...``), which ``psdp index``
    refuses as not JSON; it is the spec's JSON, any endpoint password hidden. Instant."""
    import json
    import shlex

    from psdp.sources.documents.beside import PackSettings, index_command

    spec = {"driver": "s3", "bucket": "b", "path": "t/", "endpoint": "http://me:pw@127.0.0.1:9"}
    words = shlex.split(index_command(spec, "levanter", (PackSettings(16, 8),)))
    assert words[:2] == ["psdp", "index"] and words[3:] == [
        "--format",
        "levanter",
        "--pack",
        "16,8",
    ]
    assert json.loads(words[2]) == {**spec, "endpoint": "http://me:***@127.0.0.1:9"}


def test_the_pack_index_in_a_bucket_is_required_built_found_and_checked(server, capsys):
    """The config path on each store, through the documented commands: a large store without
    its pack index fails fast naming ``psdp index URL --pack ...`` (no host builds it); the
    command with ``--endpoint`` builds it beside the store; a config loads it (no build) and
    plans as the API does; the index copied beside another store of the same size (the same
    documents in another order) is refused, naming the command. ~2 s per store."""
    from unittest import mock

    from psdp import DataConfig, PackedSequences
    from psdp._integration.source_config import SourceConfig
    from psdp._integration.view_config import ViewConfig
    from psdp.sources.views import pack_index

    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 1000, rng.integers(1, 90), dtype=np.int32) for _ in range(1000)]
    url, other = f"{scheme(server)}://psdp/big", f"{scheme(server)}://psdp/big-reversed"
    for where, written in ((url, docs), (other, docs[::-1])):
        write_documents(
            server.kvstore(where.split("psdp/", 1)[1] + "/") if scheme(server) == "s3" else where,
            written, progress=False,
        )  # fmt: skip

    def view(store: str) -> PackedSequences:
        config = DataConfig(sources={"web": SourceConfig(store=store)}, seq_len=64,
                            view=ViewConfig(packing="best_fit", window=32))  # fmt: skip
        return config.train_source().sources["web"]

    built = mock.patch.object(pack_index, "build_pack_index", side_effect=AssertionError("built"))
    with (
        mock.patch.object(pack_index, "IN_MEMORY_DOCUMENTS", 999),
        built,
        mock.patch.dict("os.environ", {"AWS_ENDPOINT_URL_S3": server.endpoint}),
    ):
        with pytest.raises(FileNotFoundError, match=f"`psdp index {url} --pack 64,32`"):
            view(url)
        assert main(["index", url, "--pack", "64,32", "--no-progress", "--endpoint",
                     server.endpoint, "--workers", "1"]) == 0  # fmt: skip
        fresh = PackedSequences(DocumentStore.open(url), 64, window=32)
        assert view(url).plan.starts.tolist() == fresh.plan.starts.tolist()
        objects = server.objects()
        for key in [k for k in objects.list().result() if k.startswith(b"big/psdp-index/")]:
            objects.write(b"big-reversed/" + key[4:], objects.read(key).result().value).result()
        with pytest.raises(ValueError, match=f"`psdp index {other} --pack 64,32`"):
            view(other)
    capsys.readouterr()


def test_an_object_is_named_by_its_url_then_the_endpoint(server):
    """A damaged ``psdp.json`` was named ``s3://psdp/x/ (endpoint http://...)psdp.json``: the
    endpoint inside the object's URL. It is ``s3://psdp/x/psdp.json (endpoint ...)``, for a
    dataset and a document store. ~1 s per store."""
    base = f"{scheme(server)}://psdp/garbled"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint)
        write_documents(f"{base}-docs", [np.arange(4, dtype=np.int32)], progress=False)
        write_dataset(f"{base}-rows", np.arange(8, dtype=np.int32), progress=False)
        objects = server.objects()
        for kind in ("docs", "rows"):
            objects.write(f"garbled-{kind}/psdp.json", b'{"format": ').result()
        for kind, open_ in (("docs", DocumentStore.open), ("rows", TensorStoreSource)):
            with pytest.raises(ValueError) as caught:
                open_(f"{base}-{kind}")
            assert f"{base}-{kind}/psdp.json (endpoint {server.endpoint})" in str(caught.value)


def test_a_document_index_read_is_retried_and_its_damage_names_the_store(server, proxy):
    """The read of a document store's index on open: a cut reply failed the open (not tried
    again), and a truncated index shard raised TensorStore's bare ``DATA_LOSS`` naming only the
    key (on S3: no bucket, no endpoint). ~1 s per store."""
    docs = [np.arange(2 + d, dtype=np.int32) for d in range(30)]
    url = f"{scheme(server)}://psdp/index-read"
    write_documents(url, docs, progress=False)
    proxy.fail("cut", tries=1, where="/index/c/", by_range=False)
    store = DocumentStore.open(url)
    assert store.num_documents == 30 and proxy.faults["cut"] == 1
    url = f"{url}-truncated"  # another store: this process trusts what it read (immutable)
    write_documents(url, docs, progress=False)
    objects = server.objects()
    (key,) = [
        k
        for k in objects.list().result()
        if k.startswith(b"index-read-truncated/") and b"/index/c/" in k
    ]
    whole = objects.read(key).result().value
    objects.write(key, whole[: len(whole) // 2]).result()
    with pytest.raises(ValueError, match="DATA_LOSS") as caught:
        DocumentStore.open(url)
    assert f"{url}/ (endpoint {proxy.endpoint})" in str(caught.value)
    assert "rewrite" in str(caught.value)


def test_a_commit_whose_metadata_was_deleted_meanwhile_is_a_lost_race_not_a_missing_bucket(
    server, proxy
):
    """An overwrite conditions its commit on the ``psdp.json`` it found; deleted meanwhile (by
    another run's clean-up, as when two ``psdp prepare`` runs share an output), the commit is
    the lost race it is (the other write's doing, this one's objects deleted), never a missing
    bucket. Passed when written: a guard (both emulators fail the condition, no 404). ~1 s per
    store."""
    import threading

    url = f"{scheme(server)}://psdp/deleted-under"
    write_dataset(url, np.arange(8, dtype=np.int32), progress=False)
    held = proxy.hold("POST" if scheme(server) == "gs" else "PUT", "deleted-under/psdp.json")
    outcome: list[BaseException | None] = []

    def overwrite() -> None:
        try:
            write_dataset(url, np.arange(16, dtype=np.int32), overwrite=True, progress=False)
            outcome.append(None)
        except BaseException as error:  # the test looks at it
            outcome.append(error)

    writer = threading.Thread(target=overwrite)
    writer.start()
    assert held.reached.wait(60)
    import tensorstore as ts

    key = "deleted-under/psdp.json"
    server.objects().delete_range(ts.KvStore.KeyRange(key, key + "\0")).result()
    held.release()
    writer.join(60)
    (error,) = outcome
    assert isinstance(error, FileExistsError) and "another write" in str(error), repr(error)


def test_psdp_sets_the_stall_limits_the_environment_leaves_unset():
    """TensorStore ends a request that stalls (connected, no bytes moving) only where these are
    set; psdp sets JAX's values with its store code (before its first request), and keeps the
    environment's own."""
    env = {k: v for k, v in os.environ.items() if k not in location.STALL_LIMITS}
    env["TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"] = "7"
    shown = subprocess.run(
        [sys.executable, "-c", "import os, psdp.sources.stores.location as where; print(sorted("
         "(k, os.environ[k]) for k in where.STALL_LIMITS))"],  # fmt: skip
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert shown.strip() == str(
        [
            ("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "256"),
            ("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", "7"),
        ]  # fmt: skip
    )


STALLED_READ = """
import json, sys
import numpy as np
from psdp import DocumentStore
store = DocumentStore.open(sys.argv[1])
offsets = store.offsets_range(0, store.num_documents + 1)
tokens = store.read_ranges(offsets[:-1], offsets[1:])["input_ids"]
print(json.dumps(tokens.tolist()))
"""


@pytest.mark.slow  # a process of its own, and a stall of 1 s
@pytest.mark.timeout(120)
def test_a_read_that_stalls_is_ended_and_tried_again(server, proxy, tmp_path):
    """A read whose connection stays open with no byte moving waited for good (the loader's
    read_timeout_s is unset by default): with the stall limits (psdp's default 60 s; 1 s here,
    in a process of its own, as TensorStore reads them when it starts) the stalled try ends and
    the next one reads the tokens, exact."""
    docs = [np.arange(2 + d, dtype=np.int32) for d in range(30)]
    url = f"{scheme(server)}://psdp/stalled-read"
    write_documents(url, docs, progress=False)
    held = proxy.hold("GET", "/tokens/input_ids/c/")  # never released until the end: a stall
    env = {**os.environ, "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", STALLED_READ, url], env=env,
                              capture_output=True, text=True, timeout=100)  # fmt: skip
    finally:
        held.release()
    assert done.returncode == 0, done.stderr[-3000:]
    assert held.reached.is_set()  # the first try of the tokens' chunk was the one stalled
    assert json.loads(done.stdout.splitlines()[-1]) == np.concatenate(docs).tolist()


def test_prepare_from_a_bucket_that_does_not_exist_names_it(server, tmp_path, capsys):
    """``psdp prepare`` of an input in a missing bucket: on GCS, which lists a missing bucket as
    an empty one, the error said only that no object matched the input. ~1 s per store."""
    from tests import prepare_corpus as corpus

    tokenizer = corpus.train_tokenizer(tmp_path / "tokenizer.json")
    source = f"{scheme(server)}://no-such-bucket/raw/*.jsonl"
    code = main(["prepare", source, "--output", str(tmp_path / "out"), "--tokenizer",
                 str(tokenizer), "--eos", "1", "--no-progress", "--endpoint", server.endpoint])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "no-such-bucket" in err and "bucket" in err.replace("no-such-bucket", "") and "exist" in err
    ), err
