"""Review of `psdp prepare`: inputs a demanding user hits (bad bytes in a jsonl, a lone UTF-16
surrogate, a file named twice, a rerun with ``--skip-bad`` as the error advises, nothing to
store).

Oracle: the tokenizer called directly on the texts that are good, and the input files as
written by the test; never the code under test.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from psdp import DocumentStore
from psdp.prepare import prepare
from tests import prepare_corpus as corpus


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return corpus.train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def ids_of(tokenizer_path, texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def stored(path):
    store = DocumentStore.open(path)
    offsets = store.offsets_range(0, store.num_documents + 1)
    ids = store.read_ranges([0], [store.num_tokens])["input_ids"]
    return [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def run(inputs, output, tokenizer, **options):
    return prepare(inputs, str(output), tokenizer=str(tokenizer), workers=1, progress=False,
                   **options)  # fmt: skip


def test_invalid_utf8_in_a_jsonl_line_names_the_line_and_is_skippable(tmp_path, tokenizer):
    (tmp_path / "a.jsonl").write_bytes(
        b'{"text": "the fox"}\n{"text": "bad \xff\xfe bytes"}\n{"text": "lazy dog"}\n'
    )
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2: .*UTF-8"):
        run(tmp_path / "a.jsonl", tmp_path / "strict", tokenizer)
    summary = run(tmp_path / "a.jsonl", tmp_path / "skip", tokenizer, skip_bad=True)
    assert sum(summary.skipped.values()) == 1 and summary.documents == 2
    assert stored(tmp_path / "skip") == ids_of(tokenizer, ["the fox", "lazy dog"])


def test_a_lone_surrogate_is_a_malformed_record_not_a_tokenizer_crash(tmp_path, tokenizer):
    # JSON allows "\ud83d" alone (half an emoji, common in scraped text); it is no valid text
    (tmp_path / "a.jsonl").write_text(
        '{"text": "the fox"}\n{"text": "half \\ud83d emoji"}\n{"text": "lazy dog"}\n'
    )
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2: "):
        run(tmp_path / "a.jsonl", tmp_path / "strict", tokenizer)
    summary = run(tmp_path / "a.jsonl", tmp_path / "skip", tokenizer, skip_bad=True)
    assert sum(summary.skipped.values()) == 1 and summary.documents == 2
    assert stored(tmp_path / "skip") == ids_of(tokenizer, ["the fox", "lazy dog"])


def test_a_file_named_twice_is_refused_not_silently_stored_once(tmp_path, tokenizer):
    corpus.write_jsonl(tmp_path / "a.jsonl", ["the fox", "lazy dog"])
    corpus.write_jsonl(tmp_path / "b.jsonl", ["data mesh"])
    # the glob names a.jsonl again: the user meant it twice (upsampling), or made a mistake
    with pytest.raises(ValueError, match=r"a\.jsonl.*more than once"):
        run([tmp_path / "a.jsonl", str(tmp_path / "*.jsonl")], tmp_path / "out", tokenizer)


def test_rerunning_with_skip_bad_as_the_error_says_resumes_the_store(tmp_path, tokenizer):
    good = corpus.texts(30, 1)
    corpus.write_jsonl(tmp_path / "a.jsonl", good)
    (tmp_path / "b.jsonl").write_text('{"text": "the fox"}\nnot json\n')
    inputs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    with pytest.raises(ValueError, match="skip_bad=True") as error:
        run(inputs, tmp_path / "out", tokenizer)
    assert "--skip-bad" in str(error.value)
    summary = run(inputs, tmp_path / "out", tokenizer, skip_bad=True)  # what the error said
    assert summary.skipped == {"not valid JSON": 1}
    assert stored(tmp_path / "out") == ids_of(tokenizer, [*good, "the fox"])
    # the store is the one a run with skip_bad from the start writes
    run(inputs, tmp_path / "fresh", tokenizer, skip_bad=True)
    assert json.loads((tmp_path / "out/psdp.json").read_text()) == json.loads(
        (tmp_path / "fresh/psdp.json").read_text()
    )
    # and once records were skipped, a run without skip_bad is still refused
    with pytest.raises(ValueError, match="skip_bad"):
        run(inputs, tmp_path / "out", tokenizer)


def test_nothing_to_store_says_what_was_found(tmp_path, tokenizer):
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n{"text": 5}\n{"text": 6}\n')
    with pytest.raises(ValueError, match="no document") as error:
        run(tmp_path / "a.jsonl", tmp_path / "out", tokenizer, skip_bad=True)
    message = str(error.value)  # no summary is printed: the error holds the counts
    assert "1 empty" in message and "2 x field 'text' is int, not a str" in message, message


def test_parted_store_reads_like_numpy_across_parts_and_shards(tmp_path, tokenizer):
    rng = np.random.default_rng(3)
    words = ["fox", "data", "é", "世界", "shard", "lazy"]
    long = " ".join(rng.choice(words, 5000))  # over one 4096-token shard
    a, b = corpus.texts(40, 1), corpus.texts(50, 2)
    a[7], b[3], a[2] = long, long + " dog", ""
    corpus.write_jsonl(tmp_path / "a.jsonl", a)
    corpus.write_parquet(tmp_path / "b.parquet", b, row_group_size=7)
    (tmp_path / "c.jsonl").write_text("\n \n")  # only blank lines: no record
    run([tmp_path / "a.jsonl", tmp_path / "c.jsonl", tmp_path / "b.parquet"], tmp_path / "out",
        tokenizer, eos=1, rows_per_part=20, tokens_per_shard=4096)  # fmt: skip
    docs = [np.array([*ids, 1]) for ids in ids_of(tokenizer, a + b) if ids]
    flat = np.concatenate(docs)
    store = DocumentStore.open(tmp_path / "out")
    assert np.array_equal(store.read_ranges([0], [store.num_tokens])["input_ids"], flat)
    ends = np.cumsum([0] + [len(d) for d in docs])
    assert np.array_equal(store.offsets_range(0, len(ends)), ends)
    from psdp import TokenSequences

    view = TokenSequences(store, 61, targets=True)
    rows = view.read(np.arange(len(view)))["input_ids"]
    assert np.array_equal(rows, np.stack([flat[i * 61 : i * 61 + 62] for i in range(len(view))]))


def test_the_command_that_finishes_an_unfinished_store_is_accepted(
    tmp_path, tokenizer, monkeypatch
):
    import shlex
    import sys

    from psdp import SourceConfig
    from psdp.tools.cli import main

    corpus.write_jsonl(tmp_path / "a.jsonl", corpus.texts(20, 1))
    corpus.write_jsonl(tmp_path / "b.jsonl", corpus.texts(20, 2))
    package = sys.modules["psdp.prepare"]
    real = package.run_task

    def killed_at_b(task):
        if task.unit.path.endswith("b.jsonl"):
            raise KeyboardInterrupt("killed")
        return real(task)

    monkeypatch.setattr(package, "run_task", killed_at_b)
    with pytest.raises(KeyboardInterrupt):
        run(str(tmp_path / "*.jsonl"), tmp_path / "out", tokenizer, eos="<|eos|>", skip_bad=True,
            field="text", rows_per_part=1000)  # fmt: skip
    monkeypatch.setattr(package, "run_task", real)
    source = SourceConfig(store=str(tmp_path / "out"), inputs=[str(tmp_path / "*.jsonl")],
                          tokenizer=str(tokenizer), eos="<|eos|>")  # fmt: skip
    with pytest.raises(ValueError, match="unfinished") as error:
        source.open("source 'web'")
    command = shlex.split(str(error.value).split("`")[1])
    assert command[:2] == ["psdp", "prepare"]
    assert main([*command[1:], "--workers", "1", "--no-progress"]) == 0  # it finishes the store
    want = ids_of(tokenizer, corpus.texts(20, 1) + corpus.texts(20, 2))
    assert stored(tmp_path / "out") == [[*ids, 1] for ids in want if ids]
