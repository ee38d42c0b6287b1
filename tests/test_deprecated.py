"""The previous release's spellings still work for one release, each warning with the new one.

The oracle is the previous release itself, read from git history: its top-level modules (before
"layout: folders show the architecture"), its `LoaderConfig` fields and YAML (before "options: the
four groups validated once"), and its docs/guides/trainer.md trainer, copied here as it was. Each old
spelling must give what the new one gives, and warn (a `FutureWarning`, shown by default) naming
the new one.
"""

from __future__ import annotations

import importlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import draccus
import numpy as np
import pytest
import yaml
from jax.sharding import PartitionSpec as P
from packaging.version import Version

import psdp
from psdp import DataLoader, LoaderConfig, LoaderOptions, MeshConfig
from tests.batch_checks import token_table

ROOT = Path(__file__).resolve().parents[1]

#: every module at the top of the previous release's package -> where its code is now
OLD_MODULES = {
    "psdp.agreement": "psdp._runtime.agreement",
    "psdp.assembly": "psdp._runtime.assembly",
    "psdp.benchmarks": "psdp.tools.benchmarks",
    "psdp.cli": "psdp.tools.cli",
    "psdp.config": "psdp._integration.loader_config",
    "psdp.consistency": "psdp._integration.consistency",
    "psdp.dtypes": "psdp._plan.dtypes",
    "psdp.layout": "psdp._plan.layout",
    "psdp.loader": "psdp._runtime.loader",
    "psdp.mesh": "psdp._plan.mesh",
    "psdp.order": "psdp._plan.order",
    "psdp.partition": "psdp._plan.partition",
    "psdp.picture": "psdp._plan.picture",
    "psdp.pod": "psdp.tools.pod",
    "psdp.prefetch": "psdp._runtime.prefetch",
    "psdp.reads": "psdp._plan.reads",
    "psdp.sharding": "psdp._integration.filter_shard",
    "psdp.simulate": "psdp.tools.simulate",
    "psdp.telemetry": "psdp._runtime.telemetry",
    "psdp.writer": "psdp.sources.stores.writer",
}

#: what the previous release's docs imported from a module, and the public name it is now
OLD_IMPORTS = [
    ("psdp.config", "LoaderConfig", psdp.LoaderConfig),
    ("psdp.config", "MeshConfig", psdp.MeshConfig),
    ("psdp.writer", "write_dataset", psdp.write_dataset),
    ("psdp.mesh", "plan_batch", psdp.plan_batch),
    ("psdp.consistency", "check_consistency", psdp.check_consistency),
    ("psdp.sharding", "filter_shard", psdp.filter_shard),
    ("psdp.loader", "DataLoader", psdp.DataLoader),
]


def _forget(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Makes the next import of ``name`` run its import again (a module imports once)."""
    monkeypatch.delitem(sys.modules, name, raising=False)


def _messages(record: pytest.WarningsRecorder) -> list[str]:
    return [str(w.message) for w in record]


# --------------------------------------------------------------------------- module paths
@pytest.mark.parametrize(("old", "new"), OLD_MODULES.items())
def test_an_old_module_path_is_the_new_module_with_a_warning(monkeypatch, old, new):
    _forget(monkeypatch, old)
    with pytest.warns(FutureWarning) as record:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # the same names, the same objects
    (message,) = _messages(record)
    assert message.startswith(f"{old} is deprecated and goes away in psdp ")
    assert f"the module is {new} now" in message


@pytest.mark.parametrize(("old", "name", "public"), OLD_IMPORTS)
def test_an_old_import_gives_the_public_object_and_names_the_new_spelling(
    monkeypatch, old, name, public
):
    _forget(monkeypatch, old)
    with pytest.warns(FutureWarning) as record:
        value = getattr(importlib.import_module(old), name)
    assert value is public
    assert re.search(rf"write `from psdp import [^`]*\b{name}\b", _messages(record)[0])


def test_the_warning_points_at_the_import_statement(monkeypatch):
    _forget(monkeypatch, "psdp.pod")
    with pytest.warns(FutureWarning) as record:
        from psdp.pod import run_pod
    assert run_pod is importlib.import_module("psdp.tools.pod").run_pod
    assert record[0].filename == __file__
    assert "write `from psdp.tools.pod import run_pod`" in str(record[0].message)


def test_a_module_inside_an_old_package_is_the_new_one(monkeypatch):
    for name in ("psdp.benchmarks", "psdp.benchmarks.throughput"):
        _forget(monkeypatch, name)
    with pytest.warns(FutureWarning, match="psdp.benchmarks is deprecated"):
        module = importlib.import_module("psdp.benchmarks.throughput")
    assert module is importlib.import_module("psdp.tools.benchmarks.throughput")


# ------------------------------------------------------------- psdp.sources' flat module paths
#: every module of psdp.sources before it was split into stores/, documents/ and views/ -> its
#: module now (psdp.sources.documents, a module then, is the package of the document modules)
OLD_SOURCES_MODULES = {
    "psdp.sources.errors": "psdp.sources.stores.errors",
    "psdp.sources.location": "psdp.sources.stores.location",
    "psdp.sources.remote": "psdp.sources.stores.remote",
    "psdp.sources.tensorstore": "psdp.sources.stores.tensorstore",
    "psdp.sources.memmap": "psdp.sources.stores.memmap",
    "psdp.sources.grain": "psdp.sources.stores.grain",
    "psdp.sources.streams": "psdp.sources.stores.streams",
    "psdp.sources.writer": "psdp.sources.stores.writer",
    "psdp.sources.levanter": "psdp.sources.documents.levanter",
    "psdp.sources.document_index": "psdp.sources.documents.index",
    "psdp.sources.document_parts": "psdp.sources.documents.parts",
    "psdp.sources.document_writer": "psdp.sources.documents.writer",
    "psdp.sources.tokens": "psdp.sources.views.tokens",
    "psdp.sources.packed": "psdp.sources.views.packed",
    "psdp.sources.pack_index": "psdp.sources.views.pack_index",
    "psdp.sources.mixture": "psdp.sources.views.mixture",
    "psdp.sources.provenance": "psdp.sources.views.provenance",
}


@pytest.mark.parametrize(("old", "new"), OLD_SOURCES_MODULES.items())
def test_an_old_sources_module_path_is_the_new_module_with_a_warning(monkeypatch, old, new):
    _forget(monkeypatch, old)
    with pytest.warns(FutureWarning) as record:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    (message,) = _messages(record)
    assert message.startswith(f"{old} is deprecated and goes away in psdp ")
    assert f"the module is {new} now" in message


def test_an_old_sources_module_is_an_attribute_of_the_package_with_a_warning(monkeypatch):
    """``psdp.sources.tokens`` worked as an attribute once psdp.sources was imported."""
    _forget(monkeypatch, "psdp.sources.tokens")
    monkeypatch.delattr(psdp.sources, "tokens", raising=False)  # set by an import before
    with pytest.warns(FutureWarning, match="psdp.sources.tokens is deprecated"):
        module = psdp.sources.tokens
    assert module is importlib.import_module("psdp.sources.views.tokens")


@pytest.mark.parametrize(
    ("old", "name", "public"),
    [
        ("psdp.sources.tensorstore", "TensorStoreSource", "psdp.sources"),
        ("psdp.sources.memmap", "MemmapSource", "psdp.sources"),
        ("psdp.sources.grain", "GrainSource", "psdp.sources"),
        ("psdp.sources.streams", "StreamSource", "psdp.sources"),
        ("psdp.sources.writer", "write_dataset", "psdp"),
        ("psdp.sources.levanter", "open_levanter_cache", "psdp.sources"),
        ("psdp.sources.document_index", "DocumentIndex", "psdp.sources"),
        ("psdp.sources.document_writer", "write_documents", "psdp"),
        ("psdp.sources.tokens", "TokenSequences", "psdp"),
        ("psdp.sources.packed", "PackedSequences", "psdp"),
        ("psdp.sources.mixture", "Mixture", "psdp"),
    ],
)
def test_an_old_sources_import_gives_the_public_object_and_names_it(monkeypatch, old, name, public):
    _forget(monkeypatch, old)
    with pytest.warns(FutureWarning) as record:
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(public), name)
    assert f"write `from {public} import {name}" in _messages(record)[0]


@pytest.mark.parametrize(
    ("name", "spelling"),
    [
        ("DocumentStore", "from psdp.sources import DocumentStore"),
        ("FlatArray", "from psdp.sources import FlatArray"),
        ("TOKENS", "from psdp.sources.documents.store import TOKENS"),
        ("document_leaves", "from psdp.sources.documents.store import document_leaves"),
    ],
)
def test_a_name_of_the_old_documents_module_is_served_by_its_package_with_a_warning(name, spelling):
    """``psdp.sources.documents`` was DocumentStore's module; it is the package of the document
    modules now, and hands out the old module's names, each with a warning."""
    import psdp.sources.documents as documents  # the package: importing it warns of nothing

    with pytest.warns(FutureWarning) as record:
        value = getattr(documents, name)
    assert value is getattr(importlib.import_module("psdp.sources.documents.store"), name)
    (message,) = _messages(record)
    assert message.startswith(f"psdp.sources.documents.{name} is deprecated and goes away")
    assert f"write `{spelling}` (it is psdp.sources.documents.store.{name} now)" in message
    with pytest.warns(FutureWarning):
        from psdp.sources.documents import DocumentStore
    assert DocumentStore is psdp.DocumentStore
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = documents.nothing
    from psdp.sources.documents import index  # its own modules: no warning (filterwarnings=error)

    assert index is importlib.import_module("psdp.sources.documents.index")


# ------------------------------------------------------------------ LoaderConfig's flat fields
#: the previous release's flat LoaderConfig fields (one example each) -> the same in the groups
FLAT_FIELDS = [
    ({"global_batch_size": 8}, "order", {"global_batch_size": 8}),
    ({"partition": "data,model"}, "sharding", {"batch_spec": "data,model"}),
    ({"shuffle": False}, "order", {"shuffle": False}),
    ({"seed": 3}, "order", {"seed": 3}),
    ({"prefetch": 4}, "reading", {"prefetch": 4}),
    ({"drop_last": True}, "order", {"drop_last": True}),
    ({"halo": {"tokens": 2}}, "sharding", {"halo": {"tokens": 2}}),
    ({"pad_value": -1}, "output", {"pad_value": -1}),
    ({"mask_key": "valid"}, "output", {"mask_key": "valid"}),
    ({"dtypes": {"tokens": "int32"}}, "output", {"dtypes": {"tokens": "int32"}}),
    ({"read_threads": 2}, "reading", {"read_threads": 2}),
    ({"feeding_processes": [0]}, "sharding", {"feeding_processes": [0]}),
    (
        {"named_axes": {"tokens": ["batch", "pos"]}, "axis_mapping": {"batch": ["data"]}},
        "sharding",
        {"named_axes": {"tokens": ["batch", "pos"]}, "axis_mapping": {"batch": ["data"]}},
    ),
    ({"read_timeout_s": 30.0}, "reading", {"read_timeout_s": 30.0}),
]


@pytest.mark.parametrize(("old", "group", "new"), FLAT_FIELDS, ids=lambda v: str(v)[:30])
def test_a_flat_field_is_its_group_field_with_a_warning(old, group, new):
    with pytest.warns(FutureWarning) as record:
        config = LoaderConfig(source="data.npy", **old)
    assert config == LoaderConfig.create(source="data.npy", **new)
    assert config.to_dict() == LoaderConfig.create(source="data.npy", **new).to_dict()
    assert _messages(record) == [
        f"LoaderConfig.{flat} is deprecated and goes away in psdp 0.2.0; use "
        f"LoaderConfig.{group}.{field} (YAML: `{group}: {{{field}: ...}}`, flag: "
        f"--<config>.{group}.{field})"
        for flat, field in zip(old, new, strict=True)
    ]


#: the previous release's docs/guides/trainer.md YAML, and the same settings in the groups
OLD_YAML = """\
mesh:
  axes: {data: 4, model: 2}
  layout: contiguous          # or noncontiguous, or a JSON layout file
data:
  source: my_dataset          # a psdp dataset directory (psdp write) or a .npy file
  global_batch_size: 8
  partition: batch            # or a spec like "(replica,data),context", or a dict per leaf
  seed: 3
num_train_steps: 100
"""
NEW_YAML = """\
mesh: {axes: {data: 4, model: 2}, layout: contiguous}
data:
  source: my_dataset
  order: {global_batch_size: 8, seed: 3}
  sharding: {batch_spec: batch}
num_train_steps: 100
"""


@dataclass(frozen=True)
class TrainerConfig:
    """A Levanter-style trainer config holding both psdp configs as fields."""

    mesh: MeshConfig = field(default_factory=MeshConfig)
    data: LoaderConfig = field(default_factory=LoaderConfig)
    num_train_steps: int = 100


def test_old_yaml_loads_as_the_new_yaml_and_dumps_in_the_new_form():
    trainer = TrainerConfig
    with pytest.warns(FutureWarning) as record:
        old = draccus.load(trainer, io.StringIO(OLD_YAML))
    assert old == draccus.load(trainer, io.StringIO(NEW_YAML))
    assert len(record) == 3  # global_batch_size, partition, seed
    dumped = draccus.dump(old)  # what the next release must load: no flat field in it
    assert set(yaml.safe_load(dumped)["data"]) == {
        "source",
        "order",
        "sharding",
        "output",
        "reading",
    }
    assert draccus.load(trainer, io.StringIO(dumped)) == old


def test_old_flags_parse_as_the_new_flags():
    trainer = TrainerConfig
    old = ["--data.global_batch_size", "8", "--data.partition", "data,model"]
    new = ["--data.order.global_batch_size", "8", "--data.sharding.batch_spec", "data,model"]
    with pytest.warns(FutureWarning, match=r"LoaderConfig\.(global_batch_size|partition) is"):
        parsed = draccus.parse(trainer, args=old)
    assert parsed == draccus.parse(trainer, args=new)
    assert parsed.data.sharding.batch_spec == P("data", "model")


def test_from_dict_maps_flat_keys_too():
    with pytest.warns(FutureWarning, match=r"LoaderConfig\.global_batch_size is deprecated"):
        old = LoaderConfig.from_dict({"source": "x.npy", "global_batch_size": 8})
    assert old == LoaderConfig.from_dict({"source": "x.npy", "order": {"global_batch_size": 8}})


def test_loader_kwargs_gives_the_set_options_as_flat_keywords():
    config = LoaderConfig.create(source="data/tokens", global_batch_size=256, seed=3)
    with pytest.warns(FutureWarning, match=r"LoaderConfig\.loader_kwargs\(\) is deprecated"):
        kwargs = config.loader_kwargs()
    assert kwargs == {"global_batch_size": 256, "seed": 3}  # the previous release's doctest

    config = LoaderConfig.create(global_batch_size=8, shuffle=False, batch_spec="data,model")
    with pytest.warns(FutureWarning, match=r"use config\.build\(mesh, source=\.\.\.\)"):
        kwargs = config.loader_kwargs()
    assert LoaderOptions.create(**kwargs) == config.options()
    rows = token_table(32, width=4)
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    with DataLoader(rows, mesh=mesh, **kwargs) as old, config.build(mesh, source=rows) as new:
        old_batch, new_batch = next(iter(old)), next(iter(new))
    assert old_batch.sharding.spec == new_batch.sharding.spec == P("data", "model")
    np.testing.assert_array_equal(np.asarray(old_batch), rows[:8])  # shuffle off: rows 0..7
    np.testing.assert_array_equal(np.asarray(new_batch), rows[:8])


# ------------------------------------------------------------------- the old trainer, whole
#: docs/guides/trainer.md's trainer as the previous release wrote it (commit 88903a5^)
OLD_TRAINER = """\
from dataclasses import dataclass, field

import draccus
import jax

from psdp.config import LoaderConfig, MeshConfig


@dataclass(frozen=True)
class TrainerConfig:
    mesh: MeshConfig = field(default_factory=MeshConfig)
    data: LoaderConfig = field(default_factory=LoaderConfig)
    num_train_steps: int = 100
    \"\"\"Steps to train.\"\"\"


@draccus.wrap()
def main(config: TrainerConfig) -> None:
    mesh = config.mesh.build()  # every process's devices, placed as the layout says
    with config.data.build(mesh, batch_axes=config.mesh.batch_axes) as loader:  # own rows only
        for step, batch in zip(range(config.num_train_steps), loader):
            shapes = jax.tree.map(lambda leaf: leaf.shape, batch)  # global jax.Arrays
            print(f"step {step}: {shapes}")  # a real trainer calls its jitted step here
        print(loader.stats())  # is the loader the bottleneck?


if __name__ == "__main__":
    main()
"""


def _run_trainer(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
    env.pop("PYTHONWARNINGS", None)  # Python's default filters: what a user's run shows
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        cwd=script.parent,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_previous_releases_trainer_runs_unchanged_and_says_what_to_edit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OLD_TRAINER)
    np.save(tmp_path / "tokens.npy", token_table(40, width=6))
    flags = ["--mesh.axes", "{data: 4, model: 2}", "--data.source", "tokens.npy"]
    result = _run_trainer(script, *flags, "--data.global_batch_size", "8", "--num_train_steps", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == ["step 0: (8, 6)", "step 1: (8, 6)"]
    # shown with Python's default warning filters, the import blamed on its own line
    assert re.search(r"train\.py:6: FutureWarning: psdp\.config is deprecated", result.stderr)
    assert "write `from psdp import LoaderConfig, MeshConfig`" in result.stderr
    assert "use LoaderConfig.order.global_batch_size" in result.stderr

    (tmp_path / "train.yaml").write_text(OLD_YAML.replace("my_dataset", "tokens.npy"))
    result = _run_trainer(script, "--config_path", "train.yaml", "--num_train_steps", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "step 0: (8, 6)"
    assert "use LoaderConfig.sharding.batch_spec" in result.stderr


# --------------------------------------------------------------------------- the release
def test_the_deprecated_names_are_gone_by_the_release_the_docs_name():
    """Fails on the release that must delete them: psdp/_deprecated.py, LoaderConfig's flat
    fields and loader_kwargs, this file, and the docs' section."""
    from psdp._deprecated import REMOVED_IN

    assert Version(psdp.__version__) < Version(REMOVED_IN)
    section = (ROOT / "docs" / "guides" / "trainer.md").read_text().split("## Deprecated names")[1]
    assert f"psdp {REMOVED_IN}" in section
    for old in OLD_MODULES:
        assert f"`{old}`" in section
    for old, _, _ in FLAT_FIELDS:
        for name in old:
            assert f"`{name}`" in section
