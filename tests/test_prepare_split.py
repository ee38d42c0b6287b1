"""`prepare` at corpus size: one large input cut into units (byte ranges of an uncompressed jsonl
file, local or in an object store; a remote Parquet file's row groups read by byte range), each
line read once, and the store the same, document for document in order, as an unsplit run's;
line numbers in errors the file's own.

Oracles: a plain split of the bytes on ``\\n``; an unsplit run (``bytes_per_part=None``) of the
same inputs; the tokenizer called directly (`tests.test_prepare.oracle`).
"""

from __future__ import annotations

import io
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp.prepare import BadRecordError, prepare, readers
from psdp.prepare.readers import plan_units, range_lines, read_batches
from tests import prepare_corpus as corpus
from tests.test_prepare import EOS, oracle, stored


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return corpus.train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def plain_lines(data: bytes) -> list[bytes]:
    """The lines of ``data`` as a plain split on ``\\n`` gives them (each with its newline)."""
    pieces = data.split(b"\n")
    return [p + b"\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    last_newline=st.booleans(),
    step=st.integers(1, 40),
)
def test_byte_ranges_read_every_line_once_as_a_plain_split(lines, last_newline, step):
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    starts = list(range(0, len(data), step)) or [0]
    stops = [*starts[1:], None]
    got = [line for a, b in zip(starts, stops, strict=True)
           for line in range_lines(io.BytesIO(data), a, b)]  # fmt: skip
    assert got == plain_lines(data)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), size=st.integers(1, 400))
def test_split_units_read_the_records_and_name_the_lines_of_an_unsplit_read(
    tmp_path_factory, seed, size
):
    rng = random.Random(seed)
    lines = []
    for i in range(rng.randint(0, 40)):
        kind = rng.random()
        if kind < 0.1:
            lines.append("")  # a blank line: no record, but a line
        elif kind < 0.2:
            lines.append('{"text": broken')
        else:
            lines.append(json.dumps({"text": f"é {i} " + "x" * rng.randint(0, 30)}))
    path = tmp_path_factory.mktemp("split") / "a.jsonl"
    path.write_text("\n".join(lines) + rng.choice(["", "\n"]), encoding="utf-8")

    def read(bytes_per_part):
        values, bad = [], []
        for unit in plan_units([str(path)], 10, bytes_per_part):
            for batch in read_batches(unit, "text", str, skip_bad=True):
                values += batch.values
                bad += batch.bad
        return values, bad

    assert read(size) == read(None)


def test_a_large_jsonl_file_uses_every_worker_and_stores_what_an_unsplit_run_does(
    tmp_path, tokenizer
):
    texts = corpus.texts(600, seed=31)
    texts[100] = ""  # empty: counted, not stored
    path = corpus.write_jsonl(tmp_path / "big.jsonl", texts)
    whole = prepare(str(path), tmp_path / "whole", tokenizer=tokenizer, eos=EOS, workers=1,
                    bytes_per_part=None, progress=False)  # fmt: skip
    cut = prepare(str(path), tmp_path / "cut", tokenizer=tokenizer, eos=EOS, workers=2,
                  bytes_per_part=-(-path.stat().st_size // 7), progress=False)  # fmt: skip
    assert (whole.parts, cut.parts) == (1, 7)
    assert (cut.documents, cut.tokens, cut.empty) == (whole.documents, whole.tokens, 1)
    assert stored(tmp_path / "cut")[1] == stored(tmp_path / "whole")[1]
    assert stored(tmp_path / "cut")[1] == oracle(tokenizer, texts, bos=None)
    # compressed: a stream read from its start, one unit whatever bytes_per_part says
    gz = corpus.write_jsonl(tmp_path / "big.jsonl.gz", texts)
    assert len(plan_units([str(gz)], 10, 100)) == 1


def test_an_error_in_a_later_range_names_the_line_of_the_file(tmp_path, tokenizer):
    lines = [json.dumps({"text": t}) for t in corpus.texts(300, seed=32)]
    lines[250] = '{"text": "cut off'
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    fifth = -(-path.stat().st_size // 5)
    assert [u.byte_start for u in plan_units([str(path)], 10, fifth)] == [
        0, fifth, 2 * fifth, 3 * fifth, 4 * fifth]  # fmt: skip
    for bytes_per_part in (None, fifth):
        with pytest.raises(BadRecordError, match=r"bad.jsonl, line 251: not valid JSON"):
            prepare(str(path), tmp_path / f"s{bytes_per_part}", tokenizer=tokenizer, workers=1,
                    bytes_per_part=bytes_per_part, progress=False)  # fmt: skip


def test_a_run_stopped_in_a_range_resumes_its_committed_ranges(tmp_path, tokenizer):
    """Units are told apart by their bytes: a rerun keeps the ranges committed before a
    malformed record stopped the run, and the store equals an unsplit run's."""
    lines = [json.dumps({"text": t}) for t in corpus.texts(300, seed=33)]
    lines[280] = "not json"
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    quarter = -(-path.stat().st_size // 4)
    options = dict(tokenizer=tokenizer, workers=1, bytes_per_part=quarter, progress=False)
    with pytest.raises(BadRecordError, match=r"a.jsonl, line 281"):
        prepare(str(path), tmp_path / "cut", **options)
    manifest = json.loads((tmp_path / "cut" / "psdp.json").read_text())
    done = [u["bytes"] for u in manifest["units"] if manifest["parts"][u["part"]]]
    assert done == [[0, quarter], [quarter, 2 * quarter], [2 * quarter, 3 * quarter]]
    calls = []
    real = readers.read_batches

    def counted(unit, *args):
        calls.append(unit.byte_start)
        return real(unit, *args)

    import psdp.prepare.tasks as tasks

    original = tasks.read_batches
    tasks.read_batches = counted
    try:
        cut = prepare(str(path), tmp_path / "cut", skip_bad=True, **options)
    finally:
        tasks.read_batches = original
    assert calls == [3 * quarter], calls  # the range that stopped only
    whole = prepare(str(path), tmp_path / "whole", skip_bad=True,
                    **{**options, "bytes_per_part": None})  # fmt: skip
    assert stored(tmp_path / "cut")[1] == stored(tmp_path / "whole")[1]
    assert cut.skipped == whole.skipped == {"not valid JSON": 1}


def test_a_store_of_an_older_psdp_keeps_its_units(tmp_path, tokenizer):
    """An older psdp read every jsonl file and object whole and recorded no bytes_per_part: a run
    that resumes or appends to its store plans as it did (a file appended is whole too), so the
    store's units never change under it."""
    texts = corpus.texts(120, seed=34)
    first = corpus.write_jsonl(tmp_path / "a.jsonl", texts[:50])
    options = dict(tokenizer=tokenizer, eos=EOS, workers=1, progress=False)
    prepare(str(first), tmp_path / "store", bytes_per_part=None, **options)
    manifest_path = tmp_path / "store" / "psdp.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["key"]["bytes_per_part"]  # as an older psdp wrote it
    manifest_path.write_text(json.dumps(manifest))
    second = corpus.write_jsonl(tmp_path / "b.jsonl", texts[50:])
    summary = prepare([str(first), str(second)], tmp_path / "store", bytes_per_part=100,
                      **options)  # fmt: skip
    manifest = json.loads(manifest_path.read_text())
    assert summary.parts == 2 and "bytes_per_part" not in manifest["key"]
    assert [u.get("bytes") for u in manifest["units"]] == [None, None]
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts, bos=None)
    # a store this psdp makes records its cut, and a run with another is refused
    prepare(str(first), tmp_path / "new", bytes_per_part=100, **options)
    with pytest.raises(ValueError, match=r"bytes_per_part: 100 there, 200 now"):
        prepare(str(first), tmp_path / "new", bytes_per_part=200, **options)


def test_remote_inputs_split_by_range_reads_into_the_store_of_an_unsplit_local_run(
    tmp_path, tokenizer, monkeypatch
):
    """An uncompressed jsonl object in byte ranges and a Parquet object in row groups, read by
    range reads (planning reads the Parquet footer, not its rows); the store equals an unsplit
    run on the same files kept locally, and a malformed line is named as locally."""
    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(8400, seed=35)
    local = tmp_path / "local"
    local.mkdir()
    jsonl = corpus.write_jsonl(local / "a.jsonl", texts[:400])
    parquet = corpus.write_parquet(local / "b.parquet", texts[400:], row_group_size=500)
    third = -(-jsonl.stat().st_size // 3)
    monkeypatch.setattr(readers, "PROBE_BYTES", 4096)  # sizes probed, not read whole
    with S3Server() as server:
        objects = server.objects()
        for path in (jsonl, parquet):
            objects.write(f"raw/{path.name}", path.read_bytes()).result()
        read = []
        real_read = readers._Object.read

        def counted(self, start, stop):
            got = real_read(self, start, stop)
            read.append(len(got or b""))
            return got

        monkeypatch.setattr(readers._Object, "read", counted)
        units = plan_units([server.kvstore("raw/*")], 2000, third)
        assert [(u.byte_start, u.row_start) for u in units] == [
            (0, 0), (third, 0), (2 * third, 0), (0, 0), (0, 2000), (0, 4000), (0, 6000),
        ]  # fmt: skip
        assert units[3].size == parquet.stat().st_size and units[0].size == jsonl.stat().st_size
        planning = sum(read)
        assert planning < parquet.stat().st_size // 4, read  # the footer and size probes
        monkeypatch.setattr(readers, "READ_BYTES", 1024)
        # a task reads its own bytes, not the object: a jsonl range (and a buffer more); a
        # quarter of the Parquet rows (its row groups, and pyarrow's 64 KiB read of the footer)
        for unit, most in ((units[1], third + 3 * 1024), (units[5], parquet.stat().st_size // 2)):
            read.clear()
            assert list(read_batches(unit, "text", str, skip_bad=False))
            assert sum(read) <= most, (unit, sum(read), most)
        split = prepare(server.kvstore("raw/*"), tmp_path / "split", tokenizer=tokenizer,
                        eos=EOS, workers=2, rows_per_part=2000, bytes_per_part=third,
                        progress=False)  # fmt: skip
        assert split.parts == 7
        whole = prepare(str(local / "*"), tmp_path / "whole", tokenizer=tokenizer, eos=EOS,
                        workers=1, rows_per_part=10**6, bytes_per_part=None,
                        progress=False)  # fmt: skip
        assert whole.parts == 2
        assert stored(tmp_path / "split")[1] == stored(tmp_path / "whole")[1]
        assert stored(tmp_path / "split")[1] == oracle(tokenizer, texts, bos=None)

        lines = jsonl.read_text().splitlines()
        lines[350] = "{broken"
        objects.write("bad/a.jsonl", ("\n".join(lines) + "\n").encode()).result()
        with pytest.raises(BadRecordError, match=r"s3://psdp/bad/a.jsonl.*, line 351: not valid"):
            prepare(server.kvstore("bad/a.jsonl"), tmp_path / "bad", tokenizer=tokenizer,
                    workers=1, bytes_per_part=third, progress=False)  # fmt: skip


def test_an_object_replaced_while_it_is_read_is_an_error_not_a_mix(tmp_path):
    from psdp.tools.benchmarks.object_store import S3Server

    with S3Server() as server:
        objects = server.objects()
        objects.write("raw/a.jsonl", b'{"text": "one"}\n' * 100).result()
        [unit] = plan_units([server.kvstore("raw/a.jsonl")], 10, None)
        objects.write("raw/a.jsonl", b'{"text": "two"}\n' * 100).result()
        with pytest.raises(ValueError, match=r"a.jsonl.* changed while psdp prepare read it"):
            list(read_batches(unit, "text", str, skip_bad=False))


@pytest.fixture(params=["s3", "gcs"])
def object_server(request):
    from psdp.tools.benchmarks.object_store import GcsServer, S3Server

    with S3Server() if request.param == "s3" else GcsServer() as server:
        yield server


def test_a_remote_arrow_file_splits_at_its_batches_read_by_range_reads(
    tmp_path, tokenizer, monkeypatch, object_server
):
    """An Arrow IPC object (file format) is cut at its record batches as Parquet is at its row
    groups: planning reads its footer and each batch's metadata (requests counted, not its
    bodies), a task reads the footer and its own batches, never the others; the store equals an
    unsplit run on the same file kept locally; a replaced object is an error, not a mix."""
    texts = corpus.texts(3000, seed=36)
    arrow = corpus.write_arrow(tmp_path / "c.arrow", texts, batch_rows=100)  # 30 batches
    size = arrow.stat().st_size
    objects = object_server.objects()
    objects.write("raw/c.arrow", arrow.read_bytes()).result()
    reads: list[tuple[int, int | None, int]] = []
    real_read = readers._Object.read

    def counted(self, start, stop):
        got = real_read(self, start, stop)
        reads.append((start, stop, len(got or b"")))
        return got

    monkeypatch.setattr(readers._Object, "read", counted)
    monkeypatch.setattr(readers, "PROBE_BYTES", 4096)  # its size probed, not read whole
    units = plan_units([object_server.kvstore("raw/c.arrow")], 1000)
    assert [(u.row_start, u.row_stop) for u in units] == [(0, 1000), (1000, 2000), (2000, 3000)]
    assert units[0].byte_start == 0 and units[2].byte_stop is None
    assert sum(r[2] for r in reads) < size // 20, reads  # probes, footer, metadata: no body
    reads.clear()
    values = [v for b in read_batches(units[1], "text", str, skip_bad=False) for v in b.values]
    assert values == texts[1000:2000]
    # its magic, the footer (ours, then pyarrow's: two reads each), its 10 batches: one read
    # each from pyarrow 17 on, two (metadata, then body) in pyarrow 16.1, the lower bound
    assert 1 + 2 + 2 + 10 <= len(reads) <= 1 + 2 + 2 + 2 * 10, reads
    assert sum(r[2] for r in reads) < size * 0.4, reads  # a third of the file
    # every read lies in the magic, the task's own batches or the footer (from the file's last
    # 10 bytes: the footer's length, then the magic), never in another task's batches
    footer = size - 10 - int.from_bytes(arrow.read_bytes()[-10:-6], "little")
    for start, stop, _ in reads:
        stop = size if stop is None else stop
        assert (
            stop <= 8
            or (units[1].byte_start <= start and stop <= units[2].byte_start)
            or start >= footer
        ), (start, stop, units[1].byte_start, units[2].byte_start, footer)

    split = prepare(object_server.kvstore("raw/c.arrow"), tmp_path / "split",
                    tokenizer=tokenizer, eos=EOS, workers=2, rows_per_part=1000,
                    progress=False)  # fmt: skip
    assert split.parts == 3
    whole = prepare(str(arrow), tmp_path / "whole", tokenizer=tokenizer, eos=EOS, workers=1,
                    rows_per_part=10**6, progress=False)  # fmt: skip
    assert whole.parts == 1
    assert stored(tmp_path / "split")[1] == stored(tmp_path / "whole")[1]
    assert stored(tmp_path / "split")[1] == oracle(tokenizer, texts, bos=None)

    objects.write("raw/c.arrow", corpus.write_arrow(tmp_path / "d.arrow", texts[::-1],
                                                    batch_rows=100).read_bytes()).result()  # fmt: skip
    with pytest.raises(ValueError, match=r"c.arrow.* changed while psdp prepare read it"):
        list(read_batches(units[1], "text", str, skip_bad=False))


def test_a_remote_arrow_stream_is_one_unit_and_a_cut_arrow_file_is_named(tmp_path):
    """An Arrow IPC stream in an object store has no footer: one unit, read on from its start;
    an Arrow IPC file cut short (no footer) is refused when planned, naming the object."""
    import pyarrow as pa

    from psdp.prepare import CorruptFileError
    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(500, seed=7)
    table = pa.table({"text": texts})
    stream = io.BytesIO()
    with pa.ipc.new_stream(stream, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=100):
            writer.write_batch(batch)
    whole = corpus.write_arrow(tmp_path / "c.arrow", texts, batch_rows=100).read_bytes()
    with S3Server() as server:
        objects = server.objects()
        objects.write("raw/s.arrow", stream.getvalue()).result()
        objects.write("raw/c.arrow", whole[: len(whole) // 2]).result()
        [unit] = plan_units([server.kvstore("raw/s.arrow")], 100)
        values = [v for b in read_batches(unit, "text", str, skip_bad=False) for v in b.values]
        assert values == texts
        with pytest.raises(CorruptFileError, match=r"s3://psdp/raw/c.arrow.* cannot be opened "
                           r"as an Arrow IPC file .*truncated or damaged"):  # fmt: skip
            plan_units([server.kvstore("raw/c.arrow")], 100)


# ------------------------------------------------------------------ leftovers in an object store
def keys_below(objects, prefix="tokens/"):
    return sorted(k.decode() for k in objects.list().result() if k.decode().startswith(prefix))


def test_leftovers_of_killed_remote_parts_are_deleted_by_the_next_run(tmp_path, tokenizer):
    """What a killed run leaves in an object store output, simulated object by object: a data
    prefix of a committed part that its psdp.json does not name (a rewrite cut off), and a part
    no manifest names (an append given up). The next run deletes them, keeps every object of
    the store, and the store reads the same."""
    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(300, seed=36)
    with S3Server() as server:
        objects = server.objects()
        for i in range(3):
            local = corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 100 : (i + 1) * 100])
            objects.write(f"raw/s{i}.jsonl", local.read_bytes()).result()
        out = server.kvstore("tokens/")
        options = dict(tokenizer=tokenizer, eos=EOS, workers=1, progress=False)
        prepare(server.kvstore("raw/*.jsonl"), out, **options)
        kept = keys_below(objects)
        committed = json.loads(objects.read("tokens/parts/000001/psdp.json").result().value)
        assert any(k.startswith(f"tokens/parts/000001/{committed['data_prefix']}") for k in kept)
        leftovers = [
            "tokens/parts/000001/psdp-data-0123456789ab/input_ids/c/0",  # a rewrite cut off
            "tokens/parts/000001/psdp-data-0123456789ab/offsets/zarr.json",
            "tokens/parts/000007/psdp.json",  # a part of an append given up
            "tokens/parts/000007/psdp-data-ba9876543210/input_ids/c/0",
            "tokens/parts/000008/psdp-data-ffffffffffff/input_ids/c/0",  # cut off before its json
        ]
        for key in leftovers:
            objects.write(key, b"left by a killed run").result()
        assert keys_below(objects) == sorted(kept + leftovers)
        summary = prepare(server.kvstore("raw/*.jsonl"), out, **options)
        assert keys_below(objects) == kept
        assert summary.documents == 300
        assert stored(out)[1] == oracle(tokenizer, texts, bos=None)


KILL_MID_PART = """
import os, signal, sys
import psdp.prepare.tasks as tasks
from psdp.prepare import prepare
from psdp.tools.benchmarks.object_store import S3_ENVIRONMENT

os.environ.update(S3_ENVIRONMENT)
write = tasks.write_documents

def killed(destination, documents, **options):
    def then_killed():
        for n, doc in enumerate(documents):
            if n == 150 and destination["path"].endswith("/000001/"):  # shards of it written
                os.kill(os.getpid(), signal.SIGKILL)
            yield doc
    return write(destination, then_killed(), **options)

tasks.write_documents = killed
spec = {"driver": "s3", "bucket": "psdp", "endpoint": sys.argv[1]}
prepare({**spec, "path": "raw/*.jsonl"}, {**spec, "path": "tokens/"}, tokenizer=sys.argv[2],
        workers=1, progress=False, tokens_per_shard=4096)
"""


@pytest.mark.slow
def test_a_run_killed_mid_part_leaves_objects_the_next_run_deletes(tmp_path, tokenizer):
    import os
    import signal
    import subprocess
    import sys

    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(600, seed=37)
    with S3Server() as server:
        objects = server.objects()
        for i in range(2):
            local = corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 300 : (i + 1) * 300])
            objects.write(f"raw/s{i}.jsonl", local.read_bytes()).result()
        killed = subprocess.run(
            [sys.executable, "-c", KILL_MID_PART, server.endpoint, str(tokenizer)],
            env={**os.environ}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        left = keys_below(objects, "tokens/parts/000001/")
        assert left and all("/psdp-data-" in k for k in left), left  # no psdp.json: cut off
        options = dict(tokenizer=tokenizer, workers=1, progress=False, tokens_per_shard=4096)
        out = server.kvstore("tokens/")
        prepare(server.kvstore("raw/*.jsonl"), out, **options)
        committed = json.loads(objects.read("tokens/parts/000001/psdp.json").result().value)
        prefixes = {k.split("/")[3] + "/" for k in keys_below(objects, "tokens/parts/000001/")
                    if "/psdp-data-" in k}  # fmt: skip
        assert prefixes == {committed["data_prefix"]}
        assert not set(left) & set(keys_below(objects))
        assert stored(out)[1] == oracle(tokenizer, texts, bos=None, eos=None)


# ------------------------------------------------------------------ progress by record
BARS: list[Bar] = []


class Bar:
    """A stand-in for tqdm that keeps what the run asks of its progress bar (in `BARS`)."""

    def __init__(self, **options):
        self.options, self.updates = options, []
        BARS.append(self)

    def update(self, n=1):
        self.updates.append(n)

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def close(self):
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_moves_by_batch_of_records_not_by_part(tmp_path, tokenizer, monkeypatch, workers):
    """One update per batch of records read (`BATCH_RECORDS`), malformed and empty ones
    counted, every update in before the run returns: 2,500 records are 3 batches, 1,000 one,
    10 one."""
    import sys

    monkeypatch.setattr(sys.modules["psdp.prepare"], "tqdm", Bar)
    BARS.clear()
    texts = corpus.texts(3510, seed=38)
    texts[5] = ""
    corpus.write_jsonl(tmp_path / "a.jsonl", texts[:2500])
    corpus.write_jsonl(tmp_path / "b.jsonl", texts[2500:3500])
    lines = [json.dumps({"text": t}) for t in texts[3500:]]
    lines[3] = "{not json"
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    summary = prepare(str(tmp_path / "*.jsonl"), tmp_path / "store", tokenizer=tokenizer,
                      workers=workers, skip_bad=True, bytes_per_part=None)  # fmt: skip
    [bar] = BARS
    assert bar.options["unit"] == " records" and "total" not in bar.options
    assert sorted(bar.updates) == sorted([1024, 1024, 452, 1000, 10])
    assert (summary.parts, summary.documents, summary.empty) == (3, 3508, 1)
    assert bar.postfix.startswith("parts 3/3, ")


def test_a_task_error_with_progress_on_stops_the_run_with_the_error(
    tmp_path, tokenizer, monkeypatch
):
    """A malformed record stops a 2-worker run whose tasks report progress: the error comes out
    as itself, and the workers end (none waits to flush reports no one reads)."""
    import sys

    monkeypatch.setattr(sys.modules["psdp.prepare"], "tqdm", Bar)
    texts = corpus.texts(6000, seed=39)
    for i in range(3):
        corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 2000 : (i + 1) * 2000])
    (tmp_path / "s3.jsonl").write_text('{"text": "fine"}\n{"text": 5}\n')
    with pytest.raises(BadRecordError, match=r"s3.jsonl, line 2: field 'text' is int"):
        prepare(str(tmp_path / "*.jsonl"), tmp_path / "store", tokenizer=tokenizer, workers=2,
                bytes_per_part=20_000)  # fmt: skip
