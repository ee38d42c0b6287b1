"""`psdp.prepare`: text -> tokenizer -> a parted document store that the loader reads exactly.

Oracle: the tokenizer called directly on each text (``encode(text, add_special_tokens=False)``,
with the chosen BOS/EOS ids around it), and decoding each stored document back to its text; the
loader's rows against the oracle's ids concatenated in numpy. Byte identity: a hash of every file
of the store. Kills are seeded (which commit each one waits for), never timed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from psdp import DataLoader, DocumentStore, PackedSequences, TokenSequences
from psdp.prepare import prepare
from tests import prepare_corpus as corpus

BOS, EOS = 0, 1  # "<|bos|>", "<|eos|>": the tokenizer's first two tokens


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return corpus.train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def oracle(tokenizer_path, texts, bos=BOS, eos=EOS):
    """The ids of each non-empty text, from the tokenizer called directly."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        if ids:
            out.append(
                [*([bos] if bos is not None else []), *ids, *([eos] if eos is not None else [])]
            )
    return out


def stored(path):
    store = DocumentStore.open(path)
    offsets = store.offsets_range(0, store.num_documents + 1)
    ids = store.read_ranges([0], [store.num_tokens])["input_ids"]
    return store, [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def tree_hash(path):
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "datasets"])
def test_each_input_kind_gives_a_store_the_loader_reads_exactly(tmp_path, tokenizer, kind):
    from tokenizers import Tokenizer

    texts = corpus.texts(300, seed=10)
    texts[7] = ""  # an empty record: counted, not stored
    if kind == "jsonl":
        inputs = [str(corpus.write_jsonl(tmp_path / "a.jsonl", texts))]
    elif kind == "parquet":
        inputs = [str(corpus.write_parquet(tmp_path / "a.parquet", texts, row_group_size=50))]
    else:
        inputs = [str(corpus.write_datasets_export(tmp_path / "export", texts, shards=3))]
    summary = prepare(inputs, tmp_path / "store", tokenizer=tokenizer, bos="<|bos|>", eos=EOS,
                      workers=1, rows_per_part=100, progress=False)  # fmt: skip
    want = oracle(tokenizer, texts)
    store, got = stored(tmp_path / "store")
    assert got == want
    assert (summary.documents, summary.tokens, summary.empty, summary.dtype) == (
        299,
        sum(map(len, want)),
        1,
        "uint16",
    )
    assert summary.parts == {"jsonl": 1, "parquet": 3, "datasets": 3}[kind]
    decode = Tokenizer.from_file(str(tokenizer)).decode
    assert [decode(ids[1:-1]) for ids in got] == [t for t in texts if t]  # the round trip
    flat = np.concatenate([np.array(ids) for ids in want])
    rows = TokenSequences(store, 16).read(np.arange(len(flat) // 16))["input_ids"]
    np.testing.assert_array_equal(rows, flat[: len(flat) // 16 * 16].reshape(-1, 16))


def test_many_parts_across_index_blocks_read_exactly(tmp_path, tokenizer):
    """10,000 documents in 7 parts: index blocks of 4096 documents cross part boundaries."""
    texts = corpus.texts(10_000, seed=11)
    corpus.write_parquet(tmp_path / "a.parquet", texts, row_group_size=1500)
    prepare(tmp_path / "a.parquet", tmp_path / "store", tokenizer=tokenizer, bos=None,
            eos="<|eos|>", workers=1, rows_per_part=1500, progress=False)  # fmt: skip
    want = oracle(tokenizer, texts, bos=None)
    store, got = stored(tmp_path / "store")
    assert got == want
    assert store.index.marks.tolist()[:3] == [0, *np.cumsum([len(d) for d in want])[[4095, 8191]]]
    flat = np.concatenate([np.array(d) for d in want])
    rng = np.random.default_rng(0)
    ids = rng.permutation(len(flat) // 64)[:200]
    rows = TokenSequences(store, 64).read(ids)["input_ids"]
    np.testing.assert_array_equal(rows, flat[: len(flat) // 64 * 64].reshape(-1, 64)[ids])
    packed = PackedSequences(store, 128)  # opens and packs over the parted store
    assert len(packed) > 0


def test_one_and_two_workers_write_byte_identical_stores(tmp_path, tokenizer):
    texts = corpus.texts(600, seed=12)
    for i in range(4):
        corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 150 : (i + 1) * 150])
    hashes = []
    for workers in (1, 2):
        out = tmp_path / f"store-{workers}"
        prepare(str(tmp_path / "s*.jsonl"), out, tokenizer=tokenizer, eos=EOS, workers=workers,
                progress=False)  # fmt: skip
        hashes.append(tree_hash(out))
    assert hashes[0] == hashes[1]
    assert stored(tmp_path / "store-2")[1] == oracle(tokenizer, texts, bos=None)


def test_a_run_commits_its_manifest_a_bounded_number_of_times(tmp_path, tokenizer, monkeypatch):
    """The manifest names every part: a commit per part wrote O(parts^2) bytes in all (10^4
    parts, ~3 MB each time). About COMMITS commits a run; the store is the same."""
    import psdp.prepare as module
    from psdp.prepare.parts import Output

    texts = corpus.texts(40, seed=14)
    for i in range(40):
        corpus.write_jsonl(tmp_path / f"s{i:02d}.jsonl", texts[i : i + 1])
    commits = []
    commit = Output.commit
    monkeypatch.setattr(
        Output, "commit", lambda self, meta: commits.append(1) or commit(self, meta)
    )
    monkeypatch.setattr(module, "COMMITS", 10)
    prepare(str(tmp_path / "s*.jsonl"), tmp_path / "store", tokenizer=tokenizer, eos=EOS,
            workers=1, progress=False)  # fmt: skip
    assert len(commits) == 1 + 10 + 1  # the plan, every 4th of 40 parts, the finished store
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts, bos=None)


KILL_SCRIPT = """
import sys
from psdp.prepare import prepare
prepare(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], eos=1, workers=2, progress=False)
"""


def _committed(out: Path) -> int:
    try:
        meta = json.loads((out / "psdp.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return sum(part is not None for part in meta["parts"].values())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_killed_three_times_then_resumed_equals_an_uninterrupted_one(tmp_path, tokenizer):
    texts = corpus.texts(2400, seed=13)
    for i in range(12):
        corpus.write_jsonl(tmp_path / f"s{i:02d}.jsonl", texts[i * 200 : (i + 1) * 200])
    inputs = str(tmp_path / "s*.jsonl")
    prepare(inputs, tmp_path / "whole", tokenizer=tokenizer, eos=EOS, workers=1, progress=False)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    points = sorted(random.Random(30).sample(range(1, 12), 3))  # seeded: after these commits
    for point in points:
        run = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, inputs, str(out), str(tokenizer)],
                               env=env, start_new_session=True)  # fmt: skip
        while _committed(out) < point and run.poll() is None:
            time.sleep(0.01)
        os.killpg(run.pid, signal.SIGKILL)  # the driver and its workers, mid-run
        run.wait()
        assert _committed(out) >= point
    with pytest.raises(ValueError, match="unfinished psdp prepare"):
        DocumentStore.open(out)
    prepare(inputs, out, tokenizer=tokenizer, eos=EOS, workers=2, progress=False)
    assert tree_hash(out) == tree_hash(tmp_path / "whole")
    assert stored(out)[1] == oracle(tokenizer, texts, bos=None)


def test_a_resume_deletes_what_a_killed_run_left(tmp_path, tokenizer):
    """The leftovers of a kill, made by hand: a part's staging directory, an index of another
    size, a part written but not in the manifest; the resumed store equals an uninterrupted one."""
    for i in range(3):
        corpus.write_jsonl(tmp_path / f"s{i}.jsonl", corpus.texts(50, seed=20 + i))
    inputs = str(tmp_path / "s*.jsonl")
    prepare(inputs, tmp_path / "whole", tokenizer=tokenizer, workers=1, progress=False)
    out = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", out)
    meta = json.loads((out / "psdp.json").read_text())
    meta["parts"]["000001"] = None  # written (its directory is there), never committed
    del meta["complete"], meta["num_documents"], meta["num_tokens"]
    (out / meta.pop("index")).rename(out / "index-7.npz")
    (out / "psdp.json").write_text(json.dumps(meta))
    staging = out / "parts" / ".000002.psdp-partial-0123abcd"
    staging.mkdir()
    (staging / "junk").write_text("a write cut short")
    prepare(inputs, out, tokenizer=tokenizer, workers=1, progress=False)
    assert tree_hash(out) == tree_hash(tmp_path / "whole")


def test_another_tokenizer_is_refused(tmp_path, tokenizer):
    corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(20, seed=14))
    prepare(tmp_path / "a.jsonl", tmp_path / "store", tokenizer=tokenizer, workers=1,
            progress=False)  # fmt: skip
    other = corpus.train_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=280)
    before = tree_hash(tmp_path / "store")
    with pytest.raises(ValueError, match="was prepared with other settings .*tokenizer_sha256"):
        prepare(tmp_path / "a.jsonl", tmp_path / "store", tokenizer=other, workers=1,
                progress=False)  # fmt: skip
    assert tree_hash(tmp_path / "store") == before


def test_new_shards_append_parts(tmp_path, tokenizer):
    texts = corpus.texts(300, seed=15)
    first = corpus.write_jsonl(tmp_path / "a.jsonl", texts[:200])
    second = corpus.write_parquet(tmp_path / "b.parquet", texts[200:])
    prepare(first, tmp_path / "store", tokenizer=tokenizer, workers=1, progress=False)
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts[:200], None, None)
    summary = prepare([first, second], tmp_path / "store", tokenizer=tokenizer, workers=1,
                      progress=False)  # fmt: skip
    assert summary.documents == 300 and summary.parts == 2
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts, None, None)
    prepare([first, second], tmp_path / "fresh", tokenizer=tokenizer, workers=1, progress=False)
    assert tree_hash(tmp_path / "store") == tree_hash(tmp_path / "fresh")


def test_skip_bad_reports_each_reason_and_stores_the_rest(tmp_path, tokenizer):
    good = corpus.texts(5, seed=16)
    lines = [json.dumps({"text": t}) for t in good]
    lines[1:1] = ['{"text": broken', '{"other": 1}', '{"text": null}', "[}"]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"a.jsonl, line 2: not valid JSON"):
        prepare(tmp_path / "a.jsonl", tmp_path / "s1", tokenizer=tokenizer, workers=1,
                progress=False)  # fmt: skip
    summary = prepare(tmp_path / "a.jsonl", tmp_path / "s2", tokenizer=tokenizer, workers=1,
                      skip_bad=True, progress=False)  # fmt: skip
    assert summary.skipped == {"not valid JSON": 2, "no field 'text'": 1,
                               "field 'text' is null, not a str": 1}  # fmt: skip
    assert [where.rsplit(", ", 1)[1] for where, _ in summary.examples] == [
        "line 2", "line 3", "line 4", "line 5",
    ]  # fmt: skip
    assert stored(tmp_path / "s2")[1] == oracle(tokenizer, good, None, None)
    assert "skipped records: 4" in str(summary) and "2 x not valid JSON" in str(summary)


def test_a_prepared_store_feeds_the_loader(tmp_path, tokenizer, mesh_2d):
    texts = corpus.texts(400, seed=17)
    corpus.write_jsonl(tmp_path / "a.jsonl", texts)
    prepare(tmp_path / "a.jsonl", tmp_path / "store", tokenizer=tokenizer, eos=EOS, workers=1,
            progress=False)  # fmt: skip
    flat = np.concatenate([np.array(d) for d in oracle(tokenizer, texts, bos=None)])
    rows = flat[: len(flat) // 32 * 32].reshape(-1, 32)
    source = TokenSequences(DocumentStore.open(tmp_path / "store"), 32)
    with DataLoader(source, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        batch = loader.batch_at(1)
    np.testing.assert_array_equal(np.asarray(batch["input_ids"]), rows[8:16])


def test_psdp_prepare_loads_no_tokenizer_arrow_or_ray_until_used(tmp_path, tokenizer):
    probe = (
        "import json, sys, psdp, psdp.prepare.tasks\n"
        "assert callable(psdp.prepare)\n"
        "print(json.dumps([m for m in ('tokenizers', 'pyarrow', 'ray', 'transformers') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []
    corpus.write_jsonl(tmp_path / "a.jsonl", ["hi"])
    import psdp

    summary = psdp.prepare(tmp_path / "a.jsonl", tmp_path / "s", tokenizer=tokenizer, workers=1,
                           progress=False)  # fmt: skip
    assert summary.documents == 1


def test_s3_inputs_into_an_s3_store(tmp_path, tokenizer):
    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(200, seed=18)
    with S3Server() as server:
        objects = server.objects()
        for i in range(2):
            local = corpus.write_jsonl(tmp_path / f"s{i}.jsonl.zst", texts[i * 100 : (i + 1) * 100])
            objects.write(f"raw/s{i}.jsonl.zst", local.read_bytes()).result()
        out = server.kvstore("tokens/")
        summary = prepare(server.kvstore("raw/*.jsonl.zst"), out, tokenizer=tokenizer, eos=EOS,
                          workers=2, progress=False)  # fmt: skip
        assert (summary.documents, summary.parts) == (200, 2)
        assert stored(out)[1] == oracle(tokenizer, texts, bos=None)


def test_the_cli_prepares_and_prints_the_summary(tmp_path, tokenizer, capsys):
    from psdp.tools.cli import main

    corpus.write_jsonl(tmp_path / "a.jsonl", ["one two", "", "three"])
    code = main(["prepare", str(tmp_path / "a.jsonl"), "--output", str(tmp_path / "s"),
                 "--tokenizer", str(tokenizer.parent), "--eos", "<|eos|>", "--workers", "1",
                 "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "2 documents" in out and "(uint16) in 1 part\n" in out
    assert "empty records (not stored): 1" in out
    assert stored(tmp_path / "s")[1] == oracle(tokenizer, ["one two", "three"], bos=None)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_local_worker_tokenizes_on_one_core(workers, monkeypatch):
    from psdp.prepare.engines import LocalEngine

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    engine = LocalEngine(workers)
    try:
        seen = list(engine.map_unordered(os.getenv, ["TOKENIZERS_PARALLELISM"] * 3))
    finally:
        engine.close()
    assert seen == ["false"] * 3
    assert "TOKENIZERS_PARALLELISM" not in os.environ  # this process's setting is restored


@pytest.mark.parametrize("name", ["b.jsonl.zst", "b.jsonl.gz"])
def test_a_truncated_compressed_input_fails_the_run_even_with_skip_bad(
    tmp_path, tokenizer, capsys, name
):
    from psdp.tools.cli import main

    corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(50, seed=30))
    whole = corpus.write_jsonl(tmp_path / name, corpus.texts(5000, seed=31)).read_bytes()
    (tmp_path / name).write_bytes(whole[: len(whole) // 2])
    for flags in (["--workers", "1"], ["--workers", "2", "--skip-bad"]):
        code = main(["prepare", str(tmp_path / "a.jsonl"), str(tmp_path / name), "--output",
                     str(tmp_path / f"s{len(flags)}"), "--tokenizer", str(tokenizer),
                     "--no-progress", *flags])  # fmt: skip
        captured = capsys.readouterr()
        assert code == 2 and captured.out == ""
        assert f"{tmp_path / name}: the " in captured.err and "cut short" in captured.err


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_bad_record_in_a_later_part_or_batch_names_its_row_in_the_file(tmp_path, tokenizer, kind):
    from psdp.prepare.readers import BATCH_RECORDS

    rows = BATCH_RECORDS + 500
    texts: list = corpus.texts(rows, seed=32)
    bad = [37, 70, BATCH_RECORDS + 40]  # part 2 (rows 32-47), part 4 (64-79), a later batch
    for row in bad:
        texts[row] = None
    write = corpus.write_parquet if kind == "parquet" else corpus.write_arrow
    path = write(tmp_path / f"a.{kind}", texts)  # row groups (record batches) of 16 rows
    for rows_per_part in (16, rows):
        with pytest.raises(ValueError, match=rf"a\.{kind}, row 37: field 'text' is null"):
            prepare(path, tmp_path / f"strict{rows_per_part}", tokenizer=tokenizer, workers=1,
                    rows_per_part=rows_per_part, progress=False)  # fmt: skip
        summary = prepare(path, tmp_path / f"s{rows_per_part}", tokenizer=tokenizer, workers=1,
                          rows_per_part=rows_per_part, skip_bad=True, progress=False)  # fmt: skip
        assert [where for where, _ in summary.examples] == [f"{path}, row {r}" for r in bad]
        good = [t for t in texts if t is not None]
        assert stored(tmp_path / f"s{rows_per_part}")[1] == oracle(tokenizer, good, None, None)


def test_malformed_records_at_the_end_of_a_file_are_counted(tmp_path, tokenizer):
    from psdp.prepare.readers import BATCH_RECORDS

    good = corpus.texts(BATCH_RECORDS, seed=33)  # a whole batch, then only malformed records
    lines = [json.dumps({"text": t}) for t in good] + ["[1]", '{"text": 2}', '{"text": "cut']
    (tmp_path / "a.jsonl").write_text("\n".join(lines))  # the last line has no newline
    summary = prepare(tmp_path / "a.jsonl", tmp_path / "s", tokenizer=tokenizer, workers=1,
                      skip_bad=True, progress=False)  # fmt: skip
    assert summary.skipped == {"a JSON list, not an object": 1, "not valid JSON": 1,
                               "field 'text' is int, not a str": 1}  # fmt: skip
    assert [where.rsplit(", ", 1)[1] for where, _ in summary.examples] == [
        f"line {BATCH_RECORDS + i}" for i in (1, 2, 3)
    ]
    assert "skipped records: 3" in str(summary)
    assert stored(tmp_path / "s")[1] == oracle(tokenizer, good, None, None)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_input_of_only_empty_texts_listed_first_is_counted_and_stores_nothing(
    tmp_path, tokenizer, workers
):
    corpus.write_jsonl(tmp_path / "0-empty.jsonl", ["", "", ""])
    texts = corpus.texts(40, seed=34)
    corpus.write_jsonl(tmp_path / "1-good.jsonl", texts[:20])
    corpus.write_jsonl(tmp_path / "2-empty.jsonl", [""])
    corpus.write_jsonl(tmp_path / "3-good.jsonl", texts[20:])
    summary = prepare(str(tmp_path / "*.jsonl"), tmp_path / "s", tokenizer=tokenizer, eos=EOS,
                      workers=workers, progress=False)  # fmt: skip
    assert (summary.documents, summary.empty, summary.parts, summary.dtype) == (
        40, 4, 4, "uint16")  # fmt: skip
    store, documents = stored(tmp_path / "s")
    assert documents == oracle(tokenizer, texts, bos=None)
    assert store.num_tokens == sum(map(len, documents))


def test_the_cli_prints_the_summary_as_one_json_object(tmp_path, tokenizer, capsys):
    from psdp.tools.cli import main

    (tmp_path / "a.jsonl").write_text('{"text": "one two"}\n{"text": ""}\n[3]\n')
    corpus.write_jsonl(tmp_path / "b.jsonl", ["three"])
    code = main(["prepare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--output",
                 str(tmp_path / "s"), "--tokenizer", str(tokenizer), "--eos", "<|eos|>",
                 "--workers", "1", "--skip-bad", "--json"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0 and captured.err == ""  # no progress bar either
    summary = json.loads(captured.out)
    seconds = summary.pop("seconds")
    documents = oracle(tokenizer, ["one two", "three"], bos=None)
    assert summary == {
        "output": str(tmp_path / "s"),
        "documents": 2,
        "tokens": sum(map(len, documents)),
        "dtype": "uint16",
        "parts": 2,
        "empty": 1,
        "skipped": {"a JSON list, not an object": 1},
        "examples": [{"where": f"{tmp_path / 'a.jsonl'}, line 3",
                      "reason": "a JSON list, not an object"}],
    }  # fmt: skip
    assert isinstance(seconds, float) and seconds > 0
    assert stored(tmp_path / "s")[1] == documents


def test_a_tokenizer_saved_again_at_the_same_path_is_another_tokenizer(tmp_path):
    """A tokenizer retrained and saved over the old one's file, in the same process: the second
    store holds the new tokenizer's ids, as its key says (a cache by path gave the old ones)."""
    path = tmp_path / "tok" / "tokenizer.json"
    texts = corpus.texts(60, seed=40)
    corpus.write_jsonl(tmp_path / "a.jsonl", texts)
    stores = {}
    for name, vocab_size in (("first", 300), ("second", 280)):
        corpus.train_tokenizer(
            path, vocab_size=vocab_size, corpus=corpus.texts(200, seed=vocab_size)
        )
        prepare(tmp_path / "a.jsonl", tmp_path / name, tokenizer=path, eos=EOS, workers=1,
                progress=False)  # fmt: skip
        stores[name] = stored(tmp_path / name)[1]
        assert stores[name] == oracle(path, texts, bos=None)
        key = json.loads((tmp_path / name / "psdp.json").read_text())["key"]
        assert key["tokenizer_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert stores["first"] != stores["second"]  # the two tokenizers do differ on these texts


def test_an_id_given_as_digits_is_an_id_in_the_api_as_on_the_command_line(tmp_path):
    """One rule for BOS/EOS: an int or a string of digits is an id, other strings are tokens;
    here "3" is also a token (id 1), and eos="3" is still the id 3, as `--eos 3` is."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from psdp.tools.cli import main

    words = Tokenizer(models.WordLevel({"[unk]": 0, "3": 1, "a": 2, "b": 3, "<e>": 4}, "[unk]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    corpus.write_jsonl(tmp_path / "a.jsonl", ["a 3 b", "b"])
    prepare(tmp_path / "a.jsonl", tmp_path / "api", tokenizer=tmp_path / "tokenizer.json",
            bos="<e>", eos="3", workers=1, progress=False)  # fmt: skip
    assert main(["prepare", str(tmp_path / "a.jsonl"), "--output", str(tmp_path / "cli"),
                 "--tokenizer", str(tmp_path / "tokenizer.json"), "--bos", "<e>", "--eos", "3",
                 "--workers", "1", "--no-progress"]) == 0  # fmt: skip
    assert (
        stored(tmp_path / "api")[1] == stored(tmp_path / "cli")[1] == [[4, 2, 1, 3, 3], [4, 3, 3]]
    )


def _start_blocked(tmp_path, tokenizer, workers):
    """A prepare of two shards in a subprocess whose tasks wait for ``tmp_path/go``."""
    for i in range(2):
        corpus.write_jsonl(tmp_path / f"s{i}.jsonl", corpus.texts(30, seed=50 + i))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "tests.blocking_task", str(tmp_path),
               str(tmp_path / "s*.jsonl"), str(tmp_path / "store"), str(tokenizer), str(workers)]  # fmt: skip
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, what, run=None, seconds=120):
    """Polls ``condition`` until true; a generous deadline only against a hang."""
    deadline = time.monotonic() + seconds
    while not condition():
        if run is not None and run.poll() is not None:
            raise AssertionError(
                f"the run ended ({run.returncode}) before {what}: {run.stderr.read()}"
            )
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.02)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_second_run_into_an_output_another_run_holds_says_so_and_exits_2(
    tmp_path, tokenizer, capsys
):
    """Run B starts while run A holds the output (A's task waits for the test): B names the
    other run and exits 2, touching nothing; A then completes; B after A finds it complete."""
    from psdp.tools.cli import main
    from tests.blocking_task import started

    run = _start_blocked(tmp_path, tokenizer, workers=1)
    try:
        _wait_for(lambda: started(tmp_path), "task started", run)
        before = tree_hash(tmp_path / "store")
        command = ["prepare", str(tmp_path / "s*.jsonl"), "--output", str(tmp_path / "store"),
                   "--tokenizer", str(tokenizer), "--eos", "1", "--workers", "1", "--no-progress"]  # fmt: skip
        assert main(command) == 2
        error = capsys.readouterr().err
        assert "another psdp prepare" in error and f"pid {run.pid}" in error, error
        assert "empty it" not in error
        assert tree_hash(tmp_path / "store") == before
    finally:
        (tmp_path / "go").touch()
        run.wait(timeout=300)
        err = run.stderr.read()
        run.stderr.close()
    assert run.returncode == 0, err
    texts = corpus.texts(30, seed=50) + corpus.texts(30, seed=51)
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts, bos=None)
    assert main(command) == 0  # the other run finished it: nothing to do


def test_a_manifest_changed_by_another_run_stops_this_one_at_its_next_commit(
    tmp_path, tokenizer, monkeypatch
):
    """The compare-and-swap (what keeps two runs on an object store, where no lock is held,
    from mixing): a manifest rewritten under a run stops the run at its next commit."""
    package = sys.modules["psdp.prepare"]
    real = package.run_task
    corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(20, seed=55))

    def another_run_commits(task):  # as a run on another machine would: it holds no lock
        manifest = tmp_path / "store" / "psdp.json"
        meta = json.loads(manifest.read_text())
        (tmp_path / "next.json").write_text(json.dumps({**meta, "by": "another"}))
        (tmp_path / "next.json").replace(manifest)
        return real(task)

    monkeypatch.setattr(package, "run_task", another_run_commits)
    with pytest.raises(FileExistsError, match="another psdp prepare wrote .* while this one ran"):
        prepare(tmp_path / "a.jsonl", tmp_path / "store", tokenizer=tokenizer, workers=1,
                progress=False)  # fmt: skip
    assert json.loads((tmp_path / "store" / "psdp.json").read_text())["by"] == "another"


def test_the_workers_of_a_killed_driver_end_with_it(tmp_path, tokenizer):
    """SIGKILL to the driver alone (no cleanup runs) while both workers are in a task: the
    workers end too, instead of waiting forever holding its stdout."""
    from tests.blocking_task import started

    run = _start_blocked(tmp_path, tokenizer, workers=2)
    workers = []
    try:
        _wait_for(lambda: len(started(tmp_path)) == 2, "two tasks started", run)
        workers = started(tmp_path)
        assert run.pid not in workers
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        run.stderr.close()
        _wait_for(lambda: not any(map(_alive, workers)), "end of the workers", seconds=60)
    finally:
        for pid in workers:  # on a failure, no worker is left behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
        if not run.stderr.closed:
            run.stderr.close()


def test_a_failed_append_leaves_the_store_as_it_was_and_completes_once_the_input_is_fixed(
    tmp_path, tokenizer
):
    """An append stopped by a malformed record: the store still reads as before; naming only
    its old inputs is accepted (the append given up); after the record is fixed, as the error
    says, the append completes into the store a fresh run writes."""
    a, c, b = (corpus.texts(40, seed=60 + i) for i in range(3))
    corpus.write_jsonl(tmp_path / "a.jsonl", a)
    corpus.write_jsonl(tmp_path / "c.jsonl", c)  # appended before b: committed before b fails
    lines = [json.dumps({"text": t}) for t in b]
    lines[5] = '{"text": broken'
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    out, inputs = tmp_path / "store", [tmp_path / n for n in ("a.jsonl", "c.jsonl", "b.jsonl")]

    def run(names, output=out):
        return prepare(names, output, tokenizer=tokenizer, eos=EOS, workers=1, progress=False)

    run(inputs[:1])
    before = tree_hash(out)
    for _ in range(2):  # the failed append, then once more as a user would before fixing it
        with pytest.raises(ValueError, match=r"b\.jsonl, line 6: not valid JSON"):
            run(inputs)
        assert stored(out)[1] == oracle(tokenizer, a, bos=None)
    assert run(inputs[:1]).documents == 40  # back to the old inputs: the store as it was
    assert tree_hash(out) == before
    with pytest.raises(ValueError, match=r"b\.jsonl, line 6"):
        run(inputs)
    lines[5] = json.dumps({"text": b[5]})  # the record fixed, as the error advises
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    assert run(inputs).documents == 120
    assert stored(out)[1] == oracle(tokenizer, a + c + b, bos=None)
    run(inputs, tmp_path / "fresh")
    assert tree_hash(out) == tree_hash(tmp_path / "fresh")


def test_a_store_stays_valid_when_its_folder_is_moved_linked_or_copied(
    tmp_path, tokenizer, monkeypatch
):
    """Inputs are recorded relative to the store and are the same inputs when their bytes are:
    a project folder moved, linked or copied keeps its store (resume, append and the data
    config accept it), and a store moved apart from its inputs follows them by content."""
    from psdp import SourceConfig

    texts = corpus.texts(80, seed=70)
    first = tmp_path / "first"
    (first / "raw").mkdir(parents=True)
    for i in range(2):
        corpus.write_jsonl(first / "raw" / f"s{i}.jsonl", texts[i * 40 : (i + 1) * 40])
    prepare(str(first / "raw" / "*.jsonl"), first / "store", tokenizer=tokenizer, eos=EOS,
            workers=1, progress=False)  # fmt: skip
    whole = tree_hash(first / "store")
    project = tmp_path / "moved"
    first.rename(project)
    (tmp_path / "linked").symlink_to(project)
    shutil.copytree(project, tmp_path / "copied")
    for folder in ("moved", "linked", "copied"):
        root = tmp_path / folder
        summary = prepare(str(root / "raw" / "*.jsonl"), root / "store", tokenizer=tokenizer,
                          eos=EOS, workers=1, progress=False)  # fmt: skip
        assert (summary.documents, tree_hash(root / "store")) == (80, whole)
        monkeypatch.chdir(root)  # a config's relative paths, as a YAML holds them
        source = SourceConfig(store="store", inputs=["raw/*.jsonl"], tokenizer=str(tokenizer),
                              eos=str(EOS))  # fmt: skip
        assert source.open("source 'web'").num_documents == 80
    apart = tmp_path / "elsewhere" / "store"  # the store alone moved: inputs found by content
    shutil.copytree(tmp_path / "copied" / "store", apart)
    corpus.write_jsonl(tmp_path / "copied" / "raw" / "s2.jsonl", ["one more document"])
    summary = prepare(str(tmp_path / "copied" / "raw" / "*.jsonl"), apart, tokenizer=tokenizer,
                      eos=EOS, workers=1, progress=False)  # fmt: skip
    assert summary.documents == 81
    assert stored(apart)[1] == oracle(tokenizer, [*texts, "one more document"], bos=None)
    raw = tmp_path / "moved" / "raw" / "s0.jsonl"  # same size, other bytes: another input
    raw.write_bytes(raw.read_bytes().replace(b"a", b"b"))
    (tmp_path / "elsewhere" / "raw").mkdir()
    shutil.copy(raw, tmp_path / "elsewhere" / "raw" / "s0.jsonl")
    shutil.copy(project / "raw" / "s1.jsonl", tmp_path / "elsewhere" / "raw" / "s1.jsonl")
    shutil.copytree(project / "store", tmp_path / "other" / "store")
    with pytest.raises(ValueError, match=r"holds the input .*s0\.jsonl .*does not name"):
        prepare(str(tmp_path / "elsewhere" / "raw" / "*.jsonl"), tmp_path / "other" / "store",
                tokenizer=tokenizer, eos=EOS, workers=1, progress=False)  # fmt: skip


def test_a_tokenizer_whose_post_processor_adds_special_tokens(tmp_path):
    """The post-processor's own [CLS] ... [SEP] is never added: the ids are the text's alone, and
    BOS/EOS are what the user asks for, once each; asked for as [CLS] and [SEP], the store holds
    exactly what the tokenizer itself gives with its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["[unk]", "[CLS]", "[SEP]", "the", "quick", "fox", "jumps"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "[unk]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[CLS]", "[SEP]"])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = ["the quick fox", "fox jumps", "jumps"]
    corpus.write_jsonl(tmp_path / "a.jsonl", texts)
    direct = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert direct.encode("fox").ids == [1, 5, 2]  # the post-processor does add them
    for name, bos, eos in (("plain", None, None), ("cls", "[CLS]", "[SEP]")):
        prepare(tmp_path / "a.jsonl", tmp_path / name, tokenizer=tmp_path / "tokenizer.json",
                bos=bos, eos=eos, workers=1, progress=False)  # fmt: skip
    assert stored(tmp_path / "plain")[1] == [
        direct.encode(t, add_special_tokens=False).ids for t in texts
    ]
    assert stored(tmp_path / "plain")[1] == [[3, 4, 5], [5, 6], [6]]
    assert stored(tmp_path / "cls")[1] == [direct.encode(t).ids for t in texts]


def test_the_parts_finished_since_the_last_commit_are_committed_when_a_task_fails(
    tmp_path, tokenizer, monkeypatch
):
    """Six parts, one commit planned after all six: the fourth fails, and the three finished
    before it are in the manifest all the same (a resume runs only the other three)."""
    package = sys.modules["psdp.prepare"]
    real = package.run_task
    texts = corpus.texts(60, seed=80)
    for i in range(6):
        corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 10 : (i + 1) * 10])
    ran = []

    def fails_at_s3(task):
        if task.unit.path.endswith("s3.jsonl"):
            raise RuntimeError("a worker died")
        ran.append(task.part)
        return real(task)

    monkeypatch.setattr(package, "COMMITS", 1)  # a periodic commit every 6 parts: never here
    monkeypatch.setattr(package, "run_task", fails_at_s3)
    with pytest.raises(RuntimeError, match="a worker died"):
        prepare(str(tmp_path / "s*.jsonl"), tmp_path / "store", tokenizer=tokenizer, workers=1,
                progress=False)  # fmt: skip
    meta = json.loads((tmp_path / "store" / "psdp.json").read_text())
    assert [name for name, part in sorted(meta["parts"].items()) if part] == ran == [
        "000000", "000001", "000002",
    ]  # fmt: skip
    ran.clear()
    monkeypatch.setattr(package, "run_task", lambda task: ran.append(task.part) or real(task))
    prepare(str(tmp_path / "s*.jsonl"), tmp_path / "store", tokenizer=tokenizer, workers=1,
            progress=False)  # fmt: skip
    assert ran == ["000003", "000004", "000005"]
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, texts, bos=None, eos=None)


def test_a_data_config_naming_an_unfinished_append_says_how_to_finish_it(tmp_path, tokenizer):
    """A config that names the inputs of an append that stopped: the error gives the command
    that finishes it (not "delete it"), and that command does."""
    import shlex

    from psdp import SourceConfig
    from psdp.tools.cli import main

    a, b = corpus.texts(20, seed=90), corpus.texts(20, seed=91)
    corpus.write_jsonl(tmp_path / "a.jsonl", a)
    prepare(tmp_path / "a.jsonl", tmp_path / "store", tokenizer=tokenizer, workers=1,
            progress=False)  # fmt: skip
    (tmp_path / "b.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match=r"b\.jsonl, line 1"):
        prepare([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "store",
                tokenizer=tokenizer, workers=1, progress=False)  # fmt: skip
    corpus.write_jsonl(tmp_path / "b.jsonl", b)  # fixed
    source = SourceConfig(store=str(tmp_path / "store"), tokenizer=str(tokenizer),
                          inputs=[str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])  # fmt: skip
    with pytest.raises(ValueError, match="unfinished append") as error:
        source.open("source 'web'")
    assert "delete it" not in str(error.value)
    command = shlex.split(str(error.value).split("`")[1])
    assert main([*command[1:], "--workers", "1", "--no-progress"]) == 0
    assert source.open("source 'web'").num_documents == 40
    assert stored(tmp_path / "store")[1] == oracle(tokenizer, a + b, bos=None, eos=None)


WATCHED = """
import multiprocessing, os, sys, time
from psdp.prepare import engines

def worker(driver, where):
    sys.platform = "elsewhere"  # no prctl: the thread that watches the driver
    engines._die_with(driver)
    open(os.path.join(where, f"started-{os.getpid()}"), "w").close()
    time.sleep(600)

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(
        target=worker, args=(os.getpid(), sys.argv[1]))
    process.start()
    process.join()
"""


def test_a_worker_without_prctl_ends_with_its_killed_driver_too(tmp_path):
    """The portable way (off Linux): a worker's thread sees its parent change, and ends it."""
    from tests.blocking_task import started

    (tmp_path / "watched.py").write_text(WATCHED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.Popen([sys.executable, str(tmp_path / "watched.py"), str(tmp_path)], env=env,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    workers = []
    try:
        _wait_for(lambda: started(tmp_path), "the worker started", run)
        workers = started(tmp_path)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        _wait_for(lambda: not any(map(_alive, workers)), "end of the worker", seconds=60)
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stderr.close()


def test_psdp_prepare_is_the_package_whatever_was_imported_first():
    """``import psdp.prepare as m`` gives the package (callable as its function), also after
    ``psdp.prepare`` was reached through the lazy re-export (which stored the function)."""
    code = (
        "import types, psdp; first = psdp.prepare\n"
        "import psdp.prepare as m\n"
        "from psdp.prepare import prepare\n"
        "assert isinstance(m, types.ModuleType) and m is first and m is psdp.prepare, type(m)\n"
        "assert callable(m) and m.readers.CorruptFileError and prepare is not m\n"
        "assert 'prepare' in dir(psdp)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
