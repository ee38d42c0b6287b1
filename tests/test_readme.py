"""The README's code runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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
