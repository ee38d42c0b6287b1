"""`MeshConfig` and `LoaderConfig`: draccus round trips (YAML and flags), every validation error,
the mesh and loader they build (checked shard by shard), and the trainer of docs/trainer.md."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import draccus
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp._integration.config import LoaderConfig, MeshConfig
from psdp._integration.consistency import check_consistency
from psdp._plan.layout import MeshLayout
from psdp.sources.writer import write_dataset
from tests.batch_checks import assert_batch_exact, token_table

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TrainerConfig:
    """A Levanter-style trainer config holding both psdp configs as fields."""

    mesh: MeshConfig = field(default_factory=MeshConfig)
    data: LoaderConfig = field(default_factory=LoaderConfig)
    num_train_steps: int = 100


FULL = TrainerConfig(
    mesh=MeshConfig(
        axes={"replica": 2, "data": 2, "model": 2},
        batch_axes=("replica", "data"),
        layout="noncontiguous",
    ),
    data=LoaderConfig(
        source="data/tokens",
        global_batch_size=16,
        partition={"tokens": "(replica,data),model", "mask": "batch"},
        shuffle=False,
        seed=7,
        prefetch=3,
        drop_last=True,
        halo={"tokens": 2},
        pad_value=-1,
        mask_key="valid",
        dtypes={"weight": "float16"},
        read_threads=2,
        read_timeout_s=30.0,
        feeding_processes=[0, 1],
        named_axes={"weight": ["batch"]},
        axis_mapping={"batch": ["replica", "data"]},
    ),
    num_train_steps=5,
)


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("config", [FULL, TrainerConfig()], ids=["every-field", "defaults"])
def test_yaml_round_trip(config):
    text = draccus.dump(config)
    assert draccus.load(TrainerConfig, io.StringIO(text)) == config


def test_yaml_file_and_flags(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(draccus.dump(FULL))
    parsed = draccus.parse(TrainerConfig, config_path=str(path), args=["--data.seed", "9"])
    assert parsed.data.seed == 9  # flags win over the file
    assert parsed.mesh == FULL.mesh and parsed.data.partition == FULL.data.partition


def test_flags_set_every_field():
    args = [
        *["--mesh.axes", "{replica: 2, data: 2, model: 2}", "--mesh.batch_axes", "[replica, data]"],
        *["--mesh.layout", "noncontiguous", "--data.source", "data/tokens"],
        *["--data.global_batch_size", "16", "--data.shuffle", "false", "--data.seed", "7"],
        *["--data.partition", '{tokens: "(replica,data),model", mask: batch}'],
        *["--data.prefetch", "3", "--data.drop_last", "true", "--data.halo", "{tokens: 2}"],
        *["--data.pad_value", "-1", "--data.mask_key", "valid", "--data.read_threads", "2"],
        *["--data.dtypes", "{weight: float16}"],
        *["--data.read_timeout_s", "30", "--num_train_steps", "5"],
        *["--data.feeding_processes", "[0, 1]", "--data.named_axes", "{weight: [batch]}"],
        *["--data.axis_mapping", "{batch: [replica, data]}"],
    ]
    assert draccus.parse(TrainerConfig, args=args) == FULL


@pytest.mark.parametrize(
    ("flags", "field_name", "value"),
    [
        (["--data.partition", "data,model"], "partition", "data,model"),  # a string, not a dict
        (["--data.halo", "4"], "halo", 4),  # an int, not a dict
        (["--data.pad_value", "0.5"], "pad_value", 0.5),
        (["--data.dtypes", "int32"], "dtypes", "int32"),  # one name, not a dict
    ],
)
def test_flags_for_union_fields(flags, field_name, value):
    assert getattr(draccus.parse(TrainerConfig, args=flags).data, field_name) == value


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        draccus.parse(TrainerConfig, args=["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Rows per step, over all hosts." in out
    assert "Which host owns which mesh position" in out


def test_a_bad_flag_names_the_field():
    with pytest.raises(draccus.utils.ParsingError) as info:
        draccus.parse(TrainerConfig, args=["--data.global_batch_size", "0"])
    assert "LoaderConfig.global_batch_size must be an int >= 1, got 0" in str(info.value.__cause__)


# ------------------------------------------------------------------------- validation errors
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        # axes must be a non-empty mapping
        ({"axes": {}}, ["MeshConfig.axes", "non-empty mapping", "axes: {data: 4"]),
        ({"axes": [4, 2]}, ["MeshConfig.axes", "[4, 2]"]),
        # an axis name that is not an identifier
        ({"axes": {"da ta": 4}}, ["MeshConfig.axes", "'da ta' is not an axis name"]),
        # a size that is not a positive int (zero, bool, float)
        ({"axes": {"data": 0}}, ["axis 'data' has size 0", "positive int"]),
        ({"axes": {"data": True}}, ["axis 'data' has size True"]),
        ({"axes": {"data": 2.0}}, ["axis 'data' has size 2.0"]),
        # batch axes: unknown, repeated, empty, and unknown when axes are unset
        ({"axes": {"data": 2, "model": 2}, "batch_axes": ("dp",)}, ["'dp' is not a mesh axis"]),
        ({"axes": {"data": 2}, "batch_axes": ("data", "data")}, ["give each axis once"]),
        ({"axes": {"data": 2}, "batch_axes": ()}, ["MeshConfig.batch_axes []"]),
        ({"batch_axes": ("replica",)}, ["'replica' is not a mesh axis", "['data']"]),
        # no usual batch axis and no batch_axes
        ({"axes": {"x": 2, "y": 2}}, ["MeshConfig.batch_axes is unset", "batch_axes: [x]"]),
        # layout: neither built in nor .json
        ({"layout": "torus"}, ["MeshConfig.layout", "'torus'", "layout: noncontiguous"]),
    ],
)
def test_mesh_config_errors(kwargs, words):
    with pytest.raises(ValueError) as info:
        MeshConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"source": ""}, ["LoaderConfig.source must be a path", "source: data/tokens"]),
        ({"source": 3}, ["LoaderConfig.source must be a path, got 3"]),
        ({"global_batch_size": 0}, ["LoaderConfig.global_batch_size", "got 0", "256"]),
        ({"global_batch_size": 8.0}, ["LoaderConfig.global_batch_size", "got 8.0"]),
        ({"prefetch": 0}, ["LoaderConfig.prefetch must be an int >= 1, got 0"]),
        ({"read_threads": -1}, ["LoaderConfig.read_threads must be an int >= 1, got -1"]),
        ({"seed": "7"}, ["LoaderConfig.seed must be an int, got '7'"]),
        ({"shuffle": "yes"}, ["LoaderConfig.shuffle must be true or false, got 'yes'"]),
        ({"drop_last": 1}, ["LoaderConfig.drop_last must be true or false, got 1"]),
        # partition: an unparsable spec, a non-string, an empty dict, a bad dict entry
        ({"partition": "(data,model"}, ["LoaderConfig.partition '(data,model'", "not closed"]),
        ({"partition": 3}, ["LoaderConfig.partition 3", "got a int"]),
        ({"partition": {}}, ["LoaderConfig.partition is an empty dict"]),
        ({"partition": {"tokens": "da ta"}}, ["LoaderConfig.partition['tokens'] 'da ta'"]),
        # halo: negative, or a bad dict entry
        ({"halo": -1}, ["LoaderConfig.halo must be an int >= 0", "got -1", "halo: 128"]),
        ({"halo": {"tokens": 1.5}}, ["LoaderConfig.halo['tokens']", "got 1.5"]),
        ({"pad_value": "0"}, ["LoaderConfig.pad_value must be a number, got '0'"]),
        ({"pad_value": True}, ["LoaderConfig.pad_value must be a number, got True"]),
        ({"mask_key": ""}, ["LoaderConfig.mask_key must be a non-empty leaf name"]),
        ({"dtypes": {"tokens": "int33"}}, ["LoaderConfig.dtypes['tokens']", "'int33'", "int32"]),
        ({"dtypes": "text"}, ["LoaderConfig.dtypes must be a numpy dtype name", "'text'"]),
        ({"read_timeout_s": 0}, ["LoaderConfig.read_timeout_s must be a positive number", "got 0"]),
        ({"read_timeout_s": True}, ["LoaderConfig.read_timeout_s", "got True"]),
        ({"feeding_processes": []}, ["LoaderConfig.feeding_processes must be a non-empty list"]),
        ({"feeding_processes": [0, -1]}, ["feeding_processes", "got [0, -1]", "[0, 1]"]),
        (
            {"named_axes": {"tokens": []}, "axis_mapping": {"batch": ["data"]}},
            [
                "LoaderConfig.named_axes must map names to non-empty lists",
                "{tokens: [batch, position]}",
            ],
        ),
        (
            {"named_axes": {"tokens": ["batch"]}},
            ["named_axes and LoaderConfig.axis_mapping go together"],
        ),
        (
            {"axis_mapping": {"batch": "data"}},
            ["LoaderConfig.axis_mapping must map names", "got {'batch': 'data'}"],
        ),
    ],
)
def test_loader_config_errors(kwargs, words):
    with pytest.raises(ValueError) as info:
        LoaderConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_build_time_errors(tmp_path):
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    with pytest.raises(ValueError, match=r"needs 16 devices but the job has 8"):
        MeshConfig(axes={"data": 4, "model": 4}).build()
    with pytest.raises(ValueError, match=r"batch axes \['data'\] are not the first axes"):
        MeshConfig(axes={"model": 2, "data": 4}, layout="noncontiguous").build()
    with pytest.raises(ValueError, match=r"MeshConfig.layout noncontiguous: .*tile"):
        MeshConfig(axes={"data": 3, "model": 2}, layout="noncontiguous").layout_for(3, 6)
    with pytest.raises(ValueError, match=r"LoaderConfig.global_batch_size is unset"):
        LoaderConfig(source="x.npy").build(mesh)
    with pytest.raises(ValueError, match=r"LoaderConfig.source is unset"):
        LoaderConfig(global_batch_size=8).build(mesh)
    with pytest.raises(ValueError, match=r"LoaderConfig.source '.*nowhere' does not exist"):
        LoaderConfig(source=str(tmp_path / "nowhere"), global_batch_size=8).build(mesh)


def test_layout_file_must_fit_the_job(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"axis_names": ["data", "model"], "process_index": [[0, 0]] * 4}))
    layout = MeshConfig(layout=str(path)).layout_for(num_processes=1, num_devices=8)
    assert layout.axis_sizes == {"data": 4, "model": 2}
    with pytest.raises(ValueError, match=r"does not match the layout file"):
        MeshConfig(axes={"data": 8, "model": 1}, layout=str(path)).layout_for(1, 8)
    with pytest.raises(ValueError, match=r"is for 1 processes and 8 devices"):
        MeshConfig(layout=str(path)).layout_for(2, 16)


# --------------------------------------------------------------------------- what they build
def test_mesh_config_layouts_match_mesh_layout():
    config = MeshConfig(axes={"data": 4, "model": 4}, layout="noncontiguous")
    want = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
    np.testing.assert_array_equal(config.layout_for(4, 16).process_index, want.process_index)
    three = MeshConfig(axes={"replica": 2, "data": 2, "model": 2}, batch_axes=("replica", "data"))
    assert three.batch_spec() == P(("replica", "data"))
    assert MeshConfig().resolved_batch_axes() == ("data",)
    assert dict(MeshConfig().build().shape) == {"data": 8}


def test_unset_fields_do_not_reach_the_loader():
    assert LoaderConfig().loader_kwargs() == {}
    kwargs = FULL.data.loader_kwargs()
    assert "source" not in kwargs and "partition" not in kwargs
    assert kwargs["batch_spec"] == {"tokens": P(("replica", "data"), "model"), "mask": "batch"}
    assert kwargs["halo"] == {"tokens": 2} and kwargs["read_timeout_s"] == 30.0
    assert LoaderConfig(partition="(batch)").batch_spec() == P("batch")  # an axis named batch
    assert LoaderConfig(partition=" full ").batch_spec() == "full"


@pytest.mark.parametrize("kind", ["npy", "tensorstore"])
def test_build_reads_the_source_exactly(tmp_path, kind):
    rows = token_table(64, width=4)
    if kind == "npy":
        path = tmp_path / "tokens.npy"
        np.save(path, rows)
    else:
        path = write_dataset(tmp_path / "ds", rows, rows_per_shard=16, progress=False)
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig(source=str(path), global_batch_size=8, shuffle=True, seed=3)
    with config.build(mesh) as loader:
        for step, batch in zip(range(3), loader, strict=False):
            ids = loader.order.batch_ids(step)
            assert_batch_exact(batch, rows[ids])
            report = check_consistency(batch, rows[ids])
            assert (report.devices, report.distinct_shards, report.exact) == (8, 4, True)


def test_dtypes_let_a_64_bit_npy_file_load_without_x64(tmp_path):
    rows = token_table(64, width=4).astype(np.int64)
    np.save(tmp_path / "tokens.npy", rows)
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig(source=str(tmp_path / "tokens.npy"), global_batch_size=8, shuffle=False)
    with pytest.raises(TypeError, match=r"int64, which JAX holds as int32.*dtypes=np.int32"):
        config.build(mesh)
    with replace(config, dtypes="int32").build(mesh) as loader:
        assert loader.dtypes == np.dtype(np.int32)
        assert_batch_exact(loader.batch_at(1), rows[8:16].astype(np.int32))


# ------------------------------------------------------------------------ docs/trainer.md
def _trainer_script(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "trainer.md").read_text()
    block = re.search(r"## A trainer in under 30 lines\n\n```python\n(.*?)```", text, re.S)
    assert block is not None
    assert len(block.group(1).splitlines()) < 30
    script = tmp_path / "train.py"
    script.write_text(block.group(1))
    return script


def _run(script: Path, *args: str, ok: bool = True) -> str:
    """The script's stdout (its stderr when ``ok`` is False: it must fail)."""
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        cwd=script.parent,
        env=env,
        timeout=120,
        check=False,
    )
    assert (result.returncode == 0) == ok, result.stderr
    return result.stdout if ok else result.stderr


def test_trainer_doc_shows_the_error_users_see(tmp_path):
    """The doc's error is what the trainer prints, draccus's ParsingError around psdp's error."""
    text = (ROOT / "docs" / "trainer.md").read_text()
    shown = re.search(r"```\n(Traceback.*?ParsingError.*?)\n```", text, re.S)
    assert shown is not None and "--data.global_batch_size 0" in text[: shown.start()]
    err = _run(_trainer_script(tmp_path), "--data.global_batch_size", "0", ok=False)
    lines = err.rstrip("\n").splitlines()
    wanted = [line for line in shown.group(1).splitlines() if line.strip() != "..."]
    assert lines[-1] == wanted[-1]
    found = iter(lines)
    missing = [line for line in wanted if line not in found]  # in order: consumes `found`
    assert not missing, f"not printed (in this order): {missing}\n{err}"


def test_trainer_doc_runs_with_flags_and_yaml(tmp_path):
    script = _trainer_script(tmp_path)
    np.save(tmp_path / "tokens.npy", token_table(40, width=6))
    out = _run(
        script,
        *["--mesh.axes", "{data: 4, model: 2}", "--data.source", "tokens.npy"],
        *["--data.global_batch_size", "8", "--num_train_steps", "2"],
    )
    lines = out.splitlines()
    assert lines[:2] == ["step 0: (8, 6)", "step 1: (8, 6)"]
    assert "bottleneck" in lines[2]
    yaml = (
        "mesh:\n  axes: {data: 2, model: 4}\ndata:\n  source: tokens.npy\n  global_batch_size: 4\n"
    )
    (tmp_path / "train.yaml").write_text(yaml)
    out = _run(script, "--config_path", "train.yaml", "--num_train_steps", "1")
    assert out.splitlines()[0] == "step 0: (4, 6)"


def test_named_axes_and_feeding_processes_reach_the_loader():
    haliax = pytest.importorskip("haliax", reason="haliax is optional: pip install 'psdp[haliax]'")

    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig(
        global_batch_size=6,
        shuffle=False,
        feeding_processes=[0],
        named_axes={"tokens": ["batch", "position"]},
        axis_mapping={"batch": ["data"], "position": ["model"]},
    )
    rows = token_table(12, width=4)
    with config.build(mesh, source={"tokens": rows}) as loader:
        batch = next(iter(loader))
    tokens = batch["tokens"]
    assert isinstance(tokens, haliax.NamedArray)
    assert [a.name for a in tokens.axes] == ["batch", "position"]
    assert tokens.array.sharding.spec == P("data", "model")
    assert np.asarray(batch["mask"].array).tolist() == [True] * 6 + [False] * 2
    np.testing.assert_array_equal(np.asarray(tokens.array)[:6], rows[:6])


def test_mesh_batch_axes_decide_the_batch_partition():
    mesh_config = MeshConfig(axes={"rows": 4, "model": 2}, batch_axes=("rows",))
    mesh = mesh_config.build()
    config = LoaderConfig(global_batch_size=8, shuffle=False)
    with pytest.raises(ValueError, match="include none of the usual batch axes"):
        config.build(mesh, source={"x": token_table(16)})  # "rows" is not a usual name
    with config.build(
        mesh, source={"x": token_table(16)}, batch_axes=mesh_config.batch_axes
    ) as loader:
        batch = next(iter(loader))
    assert batch["x"].sharding.spec == P("rows")
    np.testing.assert_array_equal(np.asarray(batch["x"]), token_table(16)[:8])
