"""The Python examples of the docs run as written, and the results they show hold.

Every ```python block of a doc runs, in order, in one namespace per doc (a later block uses the
names of earlier ones), in a fresh temporary directory, on the root conftest's 8 fake CPU devices.
getting-started.md runs as its reader runs it: each block its own script, in a fresh process.
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

#: the docs this test covers, by their path under docs/ (README.md has tests/test_readme.py;
#: guides/trainer.md has tests/test_config.py; the API reference is generated: no examples)
COVERED = [
    "index.md",
    "getting-started.md",
    "concepts/mesh.md",
    "concepts/loader.md",
    "concepts/order-and-resume.md",
    "concepts/length-stages.md",
    "concepts/partitioning.md",
    "concepts/architecture.md",
    "guides/install.md",
    "guides/prepare.md",
    "guides/tokens.md",
    "guides/packing.md",
    "guides/mixtures.md",
    "guides/long-context.md",
    "guides/stores.md",
    "guides/custom-sources.md",
    "guides/streams.md",
    "guides/object-stores.md",
    "guides/spatial.md",
    "guides/evaluate.md",
    "guides/checkpoint-and-resume.md",
    "guides/grain-maxtext.md",
    "guides/local-pod.md",
    "guides/tuning.md",
    "reference/cli.md",
    "reference/config.md",
    "reference/reliability.md",
    "measurements/performance.md",
    "measurements/token-path.md",
    "measurements/prepare.md",
    "measurements/scale.md",
    "measurements/storage.md",
    "measurements/tokens.md",
    "measurements/packing.md",
    "measurements/mixtures.md",
    "measurements/partitioning.md",
]
GETTING_STARTED = "getting-started.md"
#: its python blocks: text, a batch, the killed pod, the resumed pod
GETTING_STARTED_BLOCKS = 4
EXAMPLES = DOCS.parent / "examples"


#: pages whose examples other tests run
ELSEWHERE = {
    "guides/trainer.md": "tests/test_config.py",
    "guides/levanter.md": "tests/test_levanter.py",  # needs Levanter: its own venv and CI job
}
#: the generated API reference: ``::: name`` directives, no examples of its own
API = DOCS / "reference" / "api"

#: doc -> the reasons of its blocks that are not run, in order
NOT_RUN = {"guides/streams.md": ["an outline of the stream API, not Python"]}

NOT_RUN_MARK = re.compile(r"<!-- not run: (.+?) -->")

#: optional dependency -> the psdp extra that installs it: where it is not installed, a block that
#: imports it is skipped (and the doc's test reports the skip once its other blocks have passed)
OPTIONAL = {"haliax": "haliax", "grain": "grain"}


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


@pytest.mark.parametrize("doc", [doc for doc in COVERED if doc != GETTING_STARTED])
def test_python_examples_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' temporary files
    run_blocks(doc)


def test_the_checkpoint_example_runs_again_in_the_same_directory(tmp_path, monkeypatch):
    """A user who runs reference/reliability.md's examples twice must not meet their first run's files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_blocks("reference/reliability.md")
    run_blocks("reference/reliability.md")


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


def getting_started_steps() -> list[tuple[str, int, str]]:
    """The page's ```python, ```shell and ```yaml blocks in order: (language, line, code)."""
    text = (DOCS / GETTING_STARTED).read_text()
    return [
        (m.group(1), text[: m.start()].count("\n") + 1, m.group(2))
        for m in re.finditer(r"^```(python|shell|yaml)\n(.*?)^```", text, re.S | re.M)
    ]


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_the_getting_started_page_runs_as_written(tmp_path):
    """A new user's path, from a clone's root (here: a folder with the clone's examples/), as the
    page says to follow it: each python block saved as its own script and run by ``python`` in
    a fresh process, each shell block run by ``bash`` as printed, both from the root, in an
    environment without this suite's fake devices; the YAML shown is the example's file. The pod
    is killed, then resumed on half the processes; the text step then refuses the used run folder."""
    import os
    import subprocess
    import sys

    (tmp_path / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    bin_dir = tmp_path / "bin"  # `psdp` on the PATH, as the activated environment has it
    bin_dir.mkdir()
    (bin_dir / "psdp").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m psdp "$@"\n')
    (bin_dir / "psdp").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    env |= {"PYTHONPATH": os.pathsep.join(sys.path), "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}

    def run(command: list[str], where: str) -> str:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == 0, f"{where} failed:\n{(done.stdout + done.stderr)[-4000:]}"
        return done.stdout

    steps = getting_started_steps()
    assert [lang for lang, _, _ in steps] == ["python", "shell", "yaml", *["python"] * 3]
    out, scripts = "", []
    for lang, line, code in steps:
        where = f"docs/{GETTING_STARTED}:{line}"
        if lang == "yaml":
            assert code == (EXAMPLES / "train_lm" / "train_lm.yaml").read_text(), where
        elif lang == "shell":
            out += run(["bash", "-e", "-c", code], where)
        else:
            script = tmp_path / f"step_at_line_{line}.py"
            script.write_text(code)
            scripts.append(script)
            out += run([sys.executable, script.name], where)
    assert "the pod was killed as planned" in out and "resumed step 15: loss" in out
    again = subprocess.run([sys.executable, scripts[0].name], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode != 0 and "rm -rf my-run" in again.stderr, again.stderr[-2000:]


def test_the_getting_started_commands_are_the_configs_own():
    """The page's `psdp prepare` commands are those the example's data config prints for its
    stores (what a missing store's error tells the user to run)."""
    import draccus
    import yaml

    from psdp import DataConfig

    raw = yaml.safe_load((EXAMPLES / "train_lm" / "train_lm.yaml").read_text())
    data = draccus.decode(DataConfig, raw["data"])
    (shell,) = [code for lang, _, code in getting_started_steps() if lang == "shell"]
    wanted = [s.prepare_command() for s in [*data.sources.values(), *data.eval.values()]]
    assert shell.splitlines() == ["cd my-run", *wanted, "cd .."]


def test_the_prepare_example_runs_as_a_script_with_worker_processes(tmp_path):
    """docs/guides/prepare.md's example saved as a file and run by ``python``: its 2 workers are spawned
    and import the script again (as __mp_main__), which must not run prepare again."""
    import os
    import subprocess
    import sys

    (block,) = python_blocks("guides/prepare.md")
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
        "index.md": 0,
        "getting-started.md": GETTING_STARTED_BLOCKS,
        "concepts/mesh.md": 0,
        "concepts/loader.md": 2,
        "concepts/order-and-resume.md": 1,
        "concepts/length-stages.md": 1,
        "concepts/partitioning.md": 10,
        "concepts/architecture.md": 0,
        "guides/install.md": 0,
        "guides/prepare.md": 1,
        "guides/tokens.md": 3,
        "guides/packing.md": 9,
        "guides/mixtures.md": 5,
        "guides/long-context.md": 10,  # a store, the YAML, its arithmetic and check, a scaled run
        "guides/stores.md": 2,
        "guides/custom-sources.md": 2,
        "guides/streams.md": 0,
        "guides/object-stores.md": 2,  # the recipe on both emulators, then the API
        "guides/spatial.md": 2,  # a setup block, then the example
        "guides/evaluate.md": 2,  # a setup block, then the example
        "guides/checkpoint-and-resume.md": 1,
        "guides/grain-maxtext.md": 3,  # a Grain pipeline, a Grain DataLoader, MaxText's batches
        "guides/local-pod.md": 1,
        "guides/tuning.md": 0,
        "reference/cli.md": 0,
        "reference/config.md": 2,  # a setup block, then the example
        "reference/reliability.md": 2,
        "measurements/performance.md": 0,
        "measurements/token-path.md": 0,
        "measurements/prepare.md": 0,
        "measurements/scale.md": 1,
        "measurements/storage.md": 0,
        "measurements/tokens.md": 0,
        "measurements/packing.md": 0,
        "measurements/mixtures.md": 0,
        "measurements/partitioning.md": 0,
    }


def test_every_page_is_covered():
    """A new page is run here (or names the test that runs it), so no example escapes."""
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if API not in p.parents}
    assert sorted(pages) == sorted([*COVERED, *ELSEWHERE])


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
    found = {doc: len(shell_sessions(doc)) for doc in COVERED}
    assert {doc: n for doc, n in found.items() if n} == {
        "concepts/mesh.md": 2,
        "guides/long-context.md": 1,
    }


#: what in a doc needs 8 devices: a python block's mesh, or a trainer command's mesh flag
NEEDS_DEVICES = re.compile(r"jax\.devices\(\)|--mesh\.axes")
FAKE_DEVICES = "JAX_NUM_CPU_DEVICES=8"


@pytest.mark.parametrize("doc", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")))
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
    """docs/concepts/architecture.md's map of the package: every module it names is where it says."""
    text = (DOCS / "concepts" / "architecture.md").read_text()
    named = set(re.findall(r"\b((?:_plan|_runtime|_integration|sources|tools)/\w+\.py)", text))
    named |= set(re.findall(r"`(_\w+\.py)`", text))
    assert len(named) >= 20
    src = DOCS.parent / "src" / "psdp"
    assert sorted(p for p in named if not (src / p).exists()) == []
    modules = {str(p.relative_to(src)) for p in src.glob("_*/*.py") if p.name != "__init__.py"}
    assert sorted(modules - named) == [], "modules docs/concepts/architecture.md does not place"


def test_the_trainer_docs_language_model_yaml_builds_its_loaders(tmp_path, monkeypatch):
    """docs/guides/trainer.md's YAML for a two-source packed mixture with an eval set, parsed as a
    trainer reads it and built over stores written where it names them."""
    import draccus
    import jax
    import numpy as np
    import yaml

    from psdp import DataConfig, MeshConfig
    from psdp.sources.documents.writer import write_documents

    text = (DOCS / "guides" / "trainer.md").read_text()
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


#: a markdown link: [text](target), the target without a title; images alike
LINK = re.compile(r"\]\(([^()\s]+)\)")


def slugs(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, as GitHub and the docs site make them, and its
    explicit ``<a id="...">`` anchors."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slug, n = base, 0
        while slug in found:  # a repeated heading gets -1, -2, ...
            n += 1
            slug = f"{base}-{n}"
        found.add(slug)
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


@pytest.mark.parametrize(
    "page",
    ["README.md", *sorted(str(p.relative_to(DOCS.parent)) for p in DOCS.rglob("*.md"))],
)
def test_relative_links_and_anchors_resolve(page):
    """Every relative link of the docs and the README names a file that exists, and its
    ``#anchor`` a heading of that file (links to web addresses are not followed)."""
    path = DOCS.parent / page
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in slugs(linked):
            broken.append(f"{target} (no such heading)")
    assert broken == [], f"{page}: broken links"


def test_the_api_reference_documents_every_public_name():
    """docs/reference/api/ names each public name of `psdp`, `psdp.sources`, `psdp.prepare` and
    `psdp.tools.pod` (``::: path``, the path a user imports it from), so mkdocstrings renders its
    docstring; a name `psdp` re-exports from `psdp.sources` is documented once, under
    `psdp.sources`."""
    import psdp.levanter
    import psdp.orbax
    import psdp.prepare
    import psdp.sources
    import psdp.tools.pod

    documented = set()
    for page in API.glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M))
    init = (DOCS.parent / "src" / "psdp" / "__init__.py").read_text()
    top = set(re.findall(r"\bimport (\w+) as \1\b", init))  # the explicit re-exports
    assert {"DataLoader", "prepare", "write_dataset", "TensorStoreSource"} <= top
    wanted = {f"psdp.sources.{name}" for name in psdp.sources.__all__}
    wanted |= {f"psdp.prepare.{name}" for name in psdp.prepare.__all__}
    wanted |= {f"psdp.tools.pod.{name}" for name in psdp.tools.pod.__all__}
    wanted |= {f"psdp.orbax.{name}" for name in psdp.orbax.__all__}
    wanted |= {f"psdp.levanter.{name}" for name in psdp.levanter.__all__}
    wanted |= {
        f"psdp.{name}"
        for name in top
        if name not in psdp.sources.__all__ and name != "prepare"  # the package: its __all__
    }
    assert sorted(wanted - documented) == []
    assert sorted(documented - wanted) == [], "API entries that are not public names"
