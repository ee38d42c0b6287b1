"""The README's code runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def first_screen() -> str:
    """The README above its Quick start: the pitch, the first example and the feature list."""
    return README.read_text().split("## Quick start")[0]


def test_the_first_screen_shows_the_language_model_path_and_links_its_docs():
    text = " ".join(first_screen().split())
    path = ["DocumentStore", "TokenSequences", "PackedSequences", "Mixture", "DataLoader"]
    for word in [*path, "token", "packing", "stages", "schedule", "domain", "S3"]:
        assert word in text, f"the first screen never says {word!r}"
    first = [text.index(word) for word in path]  # in the order the data flows
    assert first[0] < min(first[1:3]) and max(first[1:3]) < first[3] < first[4]
    for doc in ["tokens.md", "packing.md", "mixtures.md", "sources.md"]:
        assert f"(docs/{doc}" in text
    assert "prepare" not in text  # not built yet


def test_language_model_example_runs(capsys):
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
