"""The README's code runs as written."""

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def first_screen() -> str:
    """The README above its Quick start: the pitch, the first example and the feature list."""
    return README.read_text().split("## Quick start")[0]


def test_the_first_screen_shows_the_language_model_path_and_links_its_docs():
    text = " ".join(first_screen().split())
    path = [
        "prepare",
        "DocumentStore",
        "TokenSequences",
        "PackedSequences",
        "Mixture",
        "DataLoader",
    ]
    for word in [*path, "token", "packing", "stages", "schedule", "domain", "S3"]:
        assert word in text, f"the first screen never says {word!r}"
    first = [text.index(word) for word in path]  # in the order the data flows
    assert first[0] < first[1] < min(first[2:4]) and max(first[2:4]) < first[4] < first[5]
    for doc in [
        "getting-started.md",
        "guides/prepare.md",
        "guides/tokens.md",
        "guides/packing.md",
        "guides/mixtures.md",
        "guides/stores.md",
    ]:
        assert f"(docs/{doc}" in text


def test_language_model_example_runs(tmp_path, monkeypatch, capsys):
    """Text -> prepare -> loader: the first screen's commands on inputs made here, then its code."""
    from psdp.tools.cli import main
    from tests import prepare_corpus as corpus

    monkeypatch.chdir(tmp_path)
    texts = corpus.texts(2800, seed=5)
    corpus.train_tokenizer(tmp_path / "tokenizer.json", specials=["<|endoftext|>"])
    (tmp_path / "web").mkdir()
    for i in range(2):
        corpus.write_jsonl(tmp_path / "web" / f"{i}.jsonl.zst", texts[i * 1000 : (i + 1) * 1000])
    corpus.write_datasets_export(tmp_path / "code" / "train", texts[2000:])
    commands = re.search(r"```shell\n(.*?)```", first_screen(), re.S)
    assert commands is not None, "the first screen has no psdp prepare command"
    for line in commands.group(1).splitlines():
        assert main([*shlex.split(line)[1:], "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    block = re.search(r"```python\n(.*?)```", first_screen(), re.S)
    assert block is not None, "the first screen has no example"
    exec(compile(block.group(1), str(README), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out == ["(64, 256) P('data', 'context')", "{'web': 48, 'code': 16}"]


def test_ten_line_example_runs(capsys):
    text = README.read_text()
    block = re.search(r"## Ten lines\n\n```python\n(.*?)```", text, re.S)
    assert block is not None
    exec(compile(block.group(1), str(README), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out == ["P('data',)", "{0: 0}"]


def test_plan_picture_is_current(capsys):
    from psdp.tools.cli import main

    assert main(["plan", "--example"]) == 0
    picture = capsys.readouterr().out
    assert picture.strip() in README.read_text()
