"""The Python examples of the docs run as written, and the results they show hold.

Every ```python block of a doc runs, in order, in one namespace per doc (a later block uses the
names of earlier ones), in a fresh temporary directory, on the root conftest's 8 fake CPU devices.
A doc states its results as short ``assert`` lines, so a result that changes fails here. A block
that cannot run here is preceded by ``<!-- not run: <reason> -->``; `NOT_RUN` lists every such
block, so adding a skip is a visible change to this file.

Shell sessions shown as real output (``$ psdp plan ...`` followed by what it prints, with
``$ cat FILE`` giving a file's content) are replayed through the CLI and compared line by line.
"""

import re
import shlex
import tempfile
from dataclasses import dataclass
from importlib.util import find_spec
from itertools import pairwise
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: the docs this test covers (README.md has tests/test_readme.py; trainer.md has test_config.py)
COVERED = [
    "concepts.md",
    "loader.md",
    "sources.md",
    "partitioning.md",
    "reliability.md",
    "packing.md",
    "tokens.md",
    "mixtures.md",
    "scale.md",
    "cli.md",
    "prepare.md",
]

#: doc -> the reasons of its blocks that are not run, in order
NOT_RUN = {"sources.md": ["an outline of the stream API, not Python"]}

NOT_RUN_MARK = re.compile(r"<!-- not run: (.+?) -->")

#: optional dependency -> the psdp extra that installs it: where it is not installed, a block that
#: imports it is skipped (and the doc's test reports the skip once its other blocks have passed)
OPTIONAL = {"haliax": "haliax"}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # the line of the opening fence, 1-based
    code: str
    not_run: str | None  # the reason, for a block marked not to run


def python_blocks(doc: str) -> list[Block]:
    """Every ```python block of ``doc``, with the reason of a ``<!-- not run: ... -->`` mark."""
    lines = (DOCS / doc).read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```py") and fence != "```python":
            raise AssertionError(f"{doc}:{i + 1}: use ```python, not {fence}, so the block runs")
        if fence != "```python":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        mark = NOT_RUN_MARK.fullmatch(before.strip())
        blocks.append(
            Block(doc, i + 1, "\n".join(lines[i + 1 : end]), mark.group(1) if mark else None)
        )
        i = end + 1
    return blocks


@pytest.mark.parametrize("doc", COVERED)
def test_python_examples_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' temporary files
    run_blocks(doc)


def test_the_checkpoint_example_runs_again_in_the_same_directory(tmp_path, monkeypatch):
    """A user who runs reliability.md's examples twice must not meet their first run's files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_blocks("reliability.md")
    run_blocks("reliability.md")


def run_blocks(doc: str) -> None:
    """Runs the doc's python blocks in order in one fresh namespace, in the current directory,
    as a script runs them (``__name__`` is ``"__main__"``)."""
    namespace: dict = {"__name__": "__main__"}
    missing = []
    for block in python_blocks(doc):
        if block.not_run:
            continue
        absent = absent_optional_imports(block.code)
        if absent:
            missing.append(f"the block at line {block.line} needs {', '.join(absent)}")
            continue
        # Blank lines in front keep the doc's line numbers in tracebacks.
        code = compile("\n" * block.line + block.code, str(DOCS / doc), "exec")
        try:
            exec(code, namespace)
        except Exception as error:
            raise AssertionError(
                f"docs/{doc}: the ```python block at line {block.line} raised "
                f"{type(error).__name__}: {error}"
            ) from error
    if missing:
        pytest.skip(f"docs/{doc}: every other block ran; {'; '.join(missing)}")


def absent_optional_imports(code: str) -> list[str]:
    """The optional dependencies ``code`` imports that are not installed, each with its extra."""
    return [
        f"{module} (not installed: pip install 'psdp[{extra}]')"
        for module, extra in OPTIONAL.items()
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M) and find_spec(module) is None
    ]


def test_the_prepare_example_runs_as_a_script_with_worker_processes(tmp_path):
    """docs/prepare.md's example saved as a file and run by ``python``: its 2 workers are spawned
    and import the script again (as __mp_main__), which must not run prepare again."""
    import os
    import subprocess
    import sys

    (block,) = python_blocks("prepare.md")
    assert "workers=2" in block.code
    (tmp_path / "prepare_web.py").write_text(block.code + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # this checkout's psdp
    done = subprocess.run([sys.executable, "prepare_web.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "web-tokens" / "psdp.json").is_file()


def test_skipped_blocks_are_the_listed_ones():
    skipped = {doc: [b.not_run for b in python_blocks(doc) if b.not_run] for doc in COVERED}
    assert {doc: reasons for doc, reasons in skipped.items() if reasons} == NOT_RUN


def test_the_runnable_blocks_are_found():
    run = {doc: sum(not b.not_run for b in python_blocks(doc)) for doc in COVERED}
    assert run == {
        "concepts.md": 0,
        "loader.md": 6,
        "sources.md": 6,
        "partitioning.md": 10,
        "reliability.md": 2,
        "packing.md": 7,
        "tokens.md": 3,
        "mixtures.md": 4,
        "scale.md": 1,
        "cli.md": 1,
        "prepare.md": 1,
    }


def shell_sessions(doc: str) -> list[tuple[int, list[str]]]:
    """The plain ``` blocks of ``doc`` that start with a ``$ `` command: (line, their lines)."""
    text = (DOCS / doc).read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(1).splitlines())
        for m in re.finditer(r"^```\n(\$ .*?)^```", text, re.S | re.M)
    ]


@pytest.mark.parametrize("doc", COVERED)
def test_psdp_shell_sessions_print_what_the_doc_shows(doc, tmp_path, monkeypatch, capsys):
    from psdp.tools.cli import main

    monkeypatch.chdir(tmp_path)
    for line, lines in shell_sessions(doc):
        starts = [i for i, text in enumerate(lines) if text.startswith("$ ")] + [len(lines)]
        for start, end in pairwise(starts):
            command, shown = shlex.split(lines[start][2:]), lines[start + 1 : end]
            if command[0] == "cat":
                Path(command[1]).write_text("\n".join(shown) + "\n")
                continue
            assert command[0] == "psdp", f"docs/{doc}:{line}: cannot replay {lines[start]!r}"
            assert main(command[1:]) == 0
            printed = capsys.readouterr().out.rstrip("\n").splitlines()
            assert printed == shown, f"docs/{doc}:{line + 1 + start}: {lines[start]!r} prints"


def test_the_shell_sessions_are_found():
    assert {doc: len(shell_sessions(doc)) for doc in COVERED} == {
        "concepts.md": 2,
        "loader.md": 0,
        "sources.md": 0,
        "partitioning.md": 0,
        "reliability.md": 0,
        "packing.md": 0,
        "tokens.md": 0,
        "mixtures.md": 0,
        "scale.md": 0,
        "cli.md": 0,
        "prepare.md": 0,
    }


#: what in a doc needs 8 devices: a python block's mesh, or a trainer command's mesh flag
NEEDS_DEVICES = re.compile(r"jax\.devices\(\)|--mesh\.axes")
FAKE_DEVICES = "JAX_NUM_CPU_DEVICES=8"


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_docs_that_need_8_devices_say_how_to_fake_them(doc):
    """Once, before the first example that needs them (the README says it for its own)."""
    text = (DOCS / doc).read_text()
    need = NEEDS_DEVICES.search(text)
    if need is None:
        assert FAKE_DEVICES not in text
        return
    assert text.count(FAKE_DEVICES) == 1, f"docs/{doc}: say {FAKE_DEVICES} once"
    assert text.index(FAKE_DEVICES) < need.start(), f"docs/{doc}: say it before {need.group()}"


def test_architecture_names_only_modules_that_exist():
    """docs/architecture.md's map of the package: every module it names is where it says."""
    text = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"\b((?:_plan|_runtime|_integration|sources|tools)/\w+\.py)", text))
    named |= set(re.findall(r"`(_\w+\.py)`", text))
    assert len(named) >= 20
    src = DOCS.parent / "src" / "psdp"
    assert sorted(p for p in named if not (src / p).exists()) == []
    modules = {str(p.relative_to(src)) for p in src.glob("_*/*.py") if p.name != "__init__.py"}
    assert sorted(modules - named) == [], "modules docs/architecture.md does not place"


def test_the_trainer_docs_language_model_yaml_builds_its_loaders(tmp_path, monkeypatch):
    """docs/trainer.md's YAML for a two-source packed mixture with an eval set, parsed as a
    trainer reads it and built over stores written where it names them."""
    import draccus
    import jax
    import numpy as np
    import yaml

    from psdp import DataConfig, MeshConfig
    from psdp.sources.documents.writer import write_documents

    text = (DOCS / "trainer.md").read_text()
    block = re.search(r"```yaml\n(# train_lm.yaml\n.*?)```", text, re.S)
    assert block is not None
    raw = yaml.safe_load(block.group(1))
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    for name in ("code", "prose", "held_out"):  # ~40 rows of 256 tokens each
        docs = [rng.integers(1, 200, rng.integers(20, 400)).astype(np.uint8) for _ in range(50)]
        write_documents(f"tokens/{name}", docs, progress=False)
    config = draccus.decode(DataConfig, raw["data"])
    assert config.view.packing == "best_fit" and [s.step for s in config.stages] == [0, 1024]
    mesh = draccus.decode(MeshConfig, raw["mesh"]).build()
    with config.build(mesh) as loader:
        batch = loader.batch_at(1024)  # the second stage's first step
        assert batch["input_ids"].shape == (32, 256) and bool(batch["mask"].all())
        assert loader.step_info(1024).offset % config.mixture.block_size == 0
    (evals,) = config.eval_loaders(mesh).values()
    with evals:
        rows = sum(int(np.asarray(b["mask"]).sum()) for b in evals)
        assert rows == len(evals.source) and len(evals) == -(-rows // 32)
    assert len(jax.devices()) == 8
