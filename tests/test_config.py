"""`MeshConfig` and `LoaderConfig`: draccus round trips (YAML and flags), every validation error,
the mesh and loader they build (checked shard by shard), and the trainer of docs/guides/trainer.md."""

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
import yaml
from jax.sharding import PartitionSpec as P

from psdp import LoaderOptions, OrderOptions, OutputOptions, ReadingOptions, ShardingOptions
from psdp._integration.consistency import check_consistency
from psdp._integration.loader_config import LoaderConfig, MeshConfig
from psdp._plan.layout import MeshLayout
from psdp.sources.stores.writer import write_dataset
from tests import oracle
from tests.batch_checks import assert_batch_exact, assert_shards_exact, token_table

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
        order=OrderOptions(global_batch_size=16, shuffle=False, seed=7, drop_last=True, epochs=2),
        sharding=ShardingOptions(
            batch_spec={"tokens": "(replica,data),model", "mask": "batch"},
            halo={"tokens": 2},
            feeding_processes=[0, 1],
            named_axes={"weight": ["batch"]},
            axis_mapping={"batch": ["replica", "data"]},
        ),
        output=OutputOptions(pad_value=-1, mask_key="valid", dtypes={"weight": "float16"}),
        reading=ReadingOptions(
            prefetch=3, read_threads=2, read_timeout_s=30.0, stall_warning_s=None
        ),
    ),
    num_train_steps=5,
)


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("config", [FULL, TrainerConfig()], ids=["every-field", "defaults"])
def test_yaml_round_trip(config):
    text = draccus.dump(config)
    assert draccus.load(TrainerConfig, io.StringIO(text)) == config


def test_yaml_nests_the_groups_and_writes_specs_as_text():
    text = draccus.dump(FULL)
    assert "  order:\n    drop_last: true\n    epochs: 2\n    global_batch_size: 16\n" in text
    assert "      tokens: (replica,data),model\n" in text  # a PartitionSpec, written as its text
    yaml = (
        "data:\n  source: data/tokens\n  order: {global_batch_size: 8}\n"
        "  sharding: {batch_spec: 'data,model'}\n"
    )
    parsed = draccus.load(TrainerConfig, io.StringIO(yaml))
    assert parsed.data.order == OrderOptions(global_batch_size=8)
    assert parsed.data.sharding.batch_spec == P("data", "model")
    assert parsed.data.output == OutputOptions() and parsed.data.reading == ReadingOptions()


def test_yaml_file_and_flags(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(draccus.dump(FULL))
    parsed = draccus.parse(TrainerConfig, config_path=str(path), args=["--data.order.seed", "9"])
    assert parsed.data.order.seed == 9  # flags win over the file
    assert parsed.mesh == FULL.mesh and parsed.data.sharding == FULL.data.sharding


@pytest.mark.parametrize(
    ("flag", "axes"),
    [
        ("model=2,data=4", {"model": 2, "data": 4}),  # the same axes in another order
        ("data=8", {"data": 8}),  # an axis fewer
        ("replica=2,data=2,model=2", {"replica": 2, "data": 2, "model": 2}),
    ],
)
def test_a_mesh_flag_over_a_yaml_is_the_mesh(tmp_path, flag, axes):
    """docs/guides/trainer.md: flags win. ``--mesh.axes NAME=SIZE,...`` over a YAML's axes is the mesh,
    its order too; a dict flag merges into the YAML's dict key by key (draccus's rule for every
    dict field), which the docs say."""
    path = tmp_path / "train.yaml"
    path.write_text("mesh:\n  axes: {data: 4, model: 2}\n  layout: noncontiguous\n")
    parsed = draccus.parse(TrainerConfig, config_path=str(path), args=["--mesh.axes", flag])
    assert parsed.mesh == MeshConfig(axes=axes, layout="noncontiguous")
    assert list(parsed.mesh.axes) == list(axes)
    merged = draccus.parse(TrainerConfig, config_path=str(path), args=["--mesh.axes", "{data: 8}"])
    assert merged.mesh.axes == {"data": 8, "model": 2}
    assert draccus.parse(TrainerConfig, args=["--mesh.axes", "{model: 2, data: 4}"]).mesh.axes == {
        "model": 2,
        "data": 4,
    }


def test_flags_set_every_field():
    args = [
        *["--mesh.axes", "{replica: 2, data: 2, model: 2}", "--mesh.batch_axes", "[replica, data]"],
        *["--mesh.layout", "noncontiguous", "--data.source", "data/tokens"],
        *["--data.order.global_batch_size", "16", "--data.order.shuffle", "false"],
        *["--data.order.seed", "7", "--data.order.drop_last", "true", "--data.order.epochs", "2"],
        *["--data.sharding.batch_spec", '{tokens: "(replica,data),model", mask: batch}'],
        *["--data.sharding.halo", "{tokens: 2}", "--data.sharding.feeding_processes", "[0, 1]"],
        *["--data.sharding.named_axes", "{weight: [batch]}"],
        *["--data.sharding.axis_mapping", "{batch: [replica, data]}"],
        *["--data.output.pad_value", "-1", "--data.output.mask_key", "valid"],
        *["--data.output.dtypes", "{weight: float16}"],
        *["--data.reading.prefetch", "3", "--data.reading.read_threads", "2"],
        *["--data.reading.read_timeout_s", "30", "--data.reading.stall_warning_s", "null"],
        *["--num_train_steps", "5"],
    ]
    assert draccus.parse(TrainerConfig, args=args) == FULL


def test_flags_of_a_loader_config_at_the_root():
    args = ["--order.global_batch_size", "8", "--sharding.batch_spec", "(replica,data),context"]
    config = draccus.parse(LoaderConfig, args=args)
    assert config.order.global_batch_size == 8
    assert config.sharding.batch_spec == P(("replica", "data"), "context")


@pytest.mark.parametrize(
    ("flags", "group", "field_name", "value"),
    [
        (["--data.sharding.batch_spec", "data,model"], "sharding", "batch_spec", P("data", "model")),
        (["--data.sharding.batch_spec", "full"], "sharding", "batch_spec", "full"),  # a strategy
        (["--data.sharding.batch_axes", "data"], "sharding", "batch_axes", ("data",)),  # not d,a,t,a
        (["--data.sharding.batch_axes", "[replica, data]"], "sharding", "batch_axes", ("replica", "data")),
        (["--data.sharding.named_axes", "[b, p]", "--data.sharding.axis_mapping", "{b: data, p: null}"],
         "sharding", "axis_mapping", {"b": "data", "p": None}),
        (["--data.sharding.halo", "4"], "sharding", "halo", 4),  # an int, not a dict
        (["--data.output.pad_value", "0.5"], "output", "pad_value", 0.5),
        (["--data.output.dtypes", "int32"], "output", "dtypes", "int32"),  # one name, not a dict
        (["--data.output.mask_key", "null"], "output", "mask_key", None),  # no mask leaf
    ],
)  # fmt: skip
def test_flags_for_union_fields(flags, group, field_name, value):
    parsed = getattr(draccus.parse(TrainerConfig, args=flags).data, group)
    assert getattr(parsed, field_name) == value


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        draccus.parse(TrainerConfig, args=["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--data.order.global_batch_size" in out
    assert "Rows per step, over all hosts" in out
    assert "Which host owns which mesh position" in out


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        (["--data.order.global_batch_size", "0"], ValueError,
         "OrderOptions.global_batch_size must be >= 1, got 0"),
        (["--data.sharding.batch_spec", "(data,model"], ValueError,
         "ShardingOptions.batch_spec '(data,model' is neither a strategy"),
        (["--data.sharding.named_axes", "{w: [batch]}"], ValueError,
         "ShardingOptions.named_axes needs an axis_mapping"),
        (["--data.output.dtypes", "int33"], TypeError, "OutputOptions.dtypes must be a numpy dtype"),
        (["--data.reading.read_threads", "0"], ValueError, "ReadingOptions.read_threads must be >= 1"),
        (["--mesh.axes", "{data: 0}"], ValueError, "MeshConfig.axes: axis 'data' has size 0"),
    ],
)  # fmt: skip
def test_a_bad_flag_names_the_field(flags, error, message):
    """draccus reports psdp's error as the cause of its ParsingError, whatever its type."""
    with pytest.raises(draccus.utils.ParsingError) as info:
        draccus.parse(TrainerConfig, args=flags)
    assert type(info.value.__cause__) is error and message in str(info.value.__cause__)


# ------------------------------------------------------------------------- validation errors
@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        # axes must be a non-empty mapping
        ({"axes": {}}, ValueError, ["MeshConfig.axes", "non-empty mapping", "axes: {data: 4"]),
        ({"axes": [4, 2]}, TypeError, ["MeshConfig.axes", "[4, 2]", "of type list"]),
        # an axis name that is not an identifier, or not a str
        ({"axes": {"da ta": 4}}, ValueError, ["MeshConfig.axes", "'da ta' is not an axis name"]),
        ({"axes": {3: 4}}, TypeError, ["MeshConfig.axes", "axis 3 has size 4", "a str"]),
        # a size that is not a positive int (zero; bool and float are wrong types)
        ({"axes": {"data": 0}}, ValueError, ["axis 'data' has size 0", "positive int"]),
        # the text form: NAME=SIZE pairs
        ({"axes": "data=4,model"}, ValueError, ["MeshConfig.axes 'data=4,model'", "NAME=SIZE"]),
        ({"axes": {"data": True}}, TypeError, ["axis 'data' has size True"]),
        ({"axes": {"data": 2.0}}, TypeError, ["axis 'data' has size 2.0"]),
        # batch axes: unknown, repeated, empty, unknown when axes are unset, not names
        ({"axes": {"data": 2, "model": 2}, "batch_axes": ("dp",)}, ValueError, ["'dp' is not a mesh axis"]),
        ({"axes": {"data": 2}, "batch_axes": ("data", "data")}, ValueError, ["give each axis once"]),
        ({"axes": {"data": 2}, "batch_axes": ()}, ValueError, ["MeshConfig.batch_axes []"]),
        ({"batch_axes": ("replica",)}, ValueError, ["'replica' is not a mesh axis", "['data']"]),
        ({"axes": {"data": 2}, "batch_axes": (1,)}, TypeError, ["MeshConfig.batch_axes", "(1,)"]),
        # no usual batch axis and no batch_axes
        ({"axes": {"x": 2, "y": 2}}, ValueError, ["MeshConfig.batch_axes is unset", "batch_axes: [x]"]),
        # layout: neither built in nor .json, or not a str
        ({"layout": "torus"}, ValueError, ["MeshConfig.layout", "'torus'", "layout: noncontiguous"]),
        ({"layout": 3}, TypeError, ["MeshConfig.layout must be a str, got 3"]),
    ],
)  # fmt: skip
def test_mesh_config_errors(kwargs, error, words):
    with pytest.raises(error) as info:
        MeshConfig(**kwargs)
    assert type(info.value) is error
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: LoaderConfig(source=""), ValueError,
         ["LoaderConfig.source must be a path, got ''", "source: data/tokens"]),
        (lambda: LoaderConfig(source=3), TypeError, ["LoaderConfig.source must be a path", "got 3 of type int"]),
        (lambda: LoaderConfig(order={"global_batch_size": 8}), TypeError,
         ["LoaderConfig.order must be a OrderOptions, got {'global_batch_size': 8}"]),
        (lambda: LoaderConfig.create(global_batch_size=0), ValueError,
         ["OrderOptions.global_batch_size must be >= 1, got 0"]),
        (lambda: LoaderConfig.create(batch_size=8), TypeError,
         ["unknown loader option 'batch_size' (did you mean 'global_batch_size'?)"]),
        (lambda: LoaderConfig.from_dict({"order": {"seed": "7"}}), TypeError,
         ["OrderOptions.seed must be an int, got '7'"]),
    ],
)  # fmt: skip
def test_loader_config_errors(make, error, words):
    """The groups' own checks are in test_options.py; these are the config's."""
    with pytest.raises(error) as info:
        make()
    assert type(info.value) is error
    for word in words:
        assert word in str(info.value)


def test_build_time_errors(tmp_path):
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    with pytest.raises(ValueError, match=r"needs 16 devices but the job has 8") as info:
        MeshConfig(axes={"data": 4, "model": 4}).build()
    assert "give it as text, e.g. --mesh.axes data=8, to replace them" in str(info.value)
    with pytest.raises(ValueError, match=r"batch axes \['data'\] are not the first axes"):
        MeshConfig(axes={"model": 2, "data": 4}, layout="noncontiguous").build()
    with pytest.raises(ValueError, match=r"MeshConfig.layout noncontiguous: .*tile"):
        MeshConfig(axes={"data": 3, "model": 2}, layout="noncontiguous").layout_for(3, 6)
    with pytest.raises(TypeError, match=r"needs global_batch_size .* order.global_batch_size: 256"):
        LoaderConfig(source="x.npy").build(mesh)  # before the missing file: options come first
    with pytest.raises(ValueError, match=r"LoaderConfig.source is unset"):
        LoaderConfig.create(global_batch_size=8).build(mesh)
    with pytest.raises(ValueError, match=r"LoaderConfig.source '.*nowhere' does not exist"):
        LoaderConfig.create(source=str(tmp_path / "nowhere"), global_batch_size=8).build(mesh)
    config = LoaderConfig.create(global_batch_size=8, batch_axes=["data"])
    with pytest.raises(ValueError, match=r"batch_axes \('data',\) differs from the batch_axes"):
        config.build(mesh, source=token_table(16), batch_axes=("model",))


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


def test_a_config_is_the_loader_options_plus_a_source():
    config = LoaderConfig.create(source="x.npy", global_batch_size=8, batch_spec="data,model")
    assert config.options() == LoaderOptions.create(global_batch_size=8, batch_spec="data,model")
    assert FULL.data.options().sharding.batch_axes is None  # a dict spec: batch_axes may apply
    assert FULL.data.options(("replica", "data")).sharding.batch_axes == ("replica", "data")
    # a spec names its axes: the mesh's batch axes are not applied (and are no conflict)
    assert config.options(("data",)).sharding == config.sharding
    plain = FULL.data.to_dict()
    assert plain["sharding"]["batch_spec"] == {"tokens": "(replica,data),model", "mask": "batch"}
    assert plain["sharding"]["feeding_processes"] == [0, 1]
    assert LoaderConfig.from_dict(json.loads(json.dumps(plain))) == FULL.data
    assert LoaderConfig.create(dtypes=np.int32, pad_value=np.float32(0.5)).to_dict()["output"] == {
        "pad_value": 0.5,
        "mask_key": "mask",
        "dtypes": "int32",
    }


@pytest.mark.parametrize("kind", ["npy", "tensorstore"])
def test_build_reads_the_source_exactly(tmp_path, kind):
    rows = token_table(64, width=4)
    if kind == "npy":
        path = tmp_path / "tokens.npy"
        np.save(path, rows)
    else:
        path = write_dataset(tmp_path / "ds", rows, rows_per_shard=16, progress=False)
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig.create(source=str(path), global_batch_size=8, shuffle=True, seed=3)
    with config.build(mesh) as loader:
        for step, batch in zip(range(3), loader, strict=False):
            ids = oracle.step_ids(64, 8, step, seed=3)  # the config's order, by the oracle
            assert_batch_exact(batch, rows[ids])
            report = check_consistency(batch, rows[ids])
            assert (report.devices, report.distinct_shards, report.exact) == (8, 4, True)


@pytest.mark.parametrize(
    ("batch_spec", "spec"),
    [(None, P("data")), ("data,model", P("data", "model")), ("full", P(("data", "model")))],
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_build_then_restore_continue_with_exact_rows(tmp_path, batch_spec, spec, shuffle):
    """A run of 3 steps saves its state; a restart from the same YAML (or one that leaves the
    batch size and shuffle unset) continues at step 3, into epoch 1, every shard exact."""
    rows = token_table(48, width=4)
    np.save(tmp_path / "tokens.npy", rows)
    mesh_config = MeshConfig(axes={"data": 4, "model": 2}, batch_axes=("data",))
    mesh = mesh_config.build()
    config = LoaderConfig.create(source=str(tmp_path / "tokens.npy"), global_batch_size=8,
                                 shuffle=shuffle, seed=5, batch_spec=batch_spec, prefetch=3)  # fmt: skip
    config = draccus.load(LoaderConfig, io.StringIO(draccus.dump(config)))  # as a trainer reads it

    def want(step: int) -> np.ndarray:
        return rows[oracle.step_ids(48, 8, step, seed=5, shuffle=shuffle)]

    with config.build(mesh, batch_axes=mesh_config.batch_axes) as loader:
        batches = iter(loader)
        for step in range(3):
            assert_shards_exact(next(batches), want(step))
        state = json.loads(json.dumps(batches.state()))
    unset = replace(config, order=OrderOptions(seed=5))
    for again in (config, unset):
        with again.restore(state, mesh, batch_axes=mesh_config.batch_axes) as loader:
            assert loader.start_step == 3
            batches = iter(loader)
            for step in range(3, 8):  # 48 rows are 6 steps: steps 6 and 7 are epoch 1's
                batch = next(batches)
                assert batch.sharding.spec == spec
                assert_shards_exact(batch, want(step))


def test_restore_refuses_an_order_that_differs_from_the_state():
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    rows = token_table(32)
    config = LoaderConfig.create(global_batch_size=8, seed=3)
    with config.build(mesh, source=rows) as loader:
        state = loader.state()
    for changed, words in [
        ({"seed": 4}, "resuming with seed=4, but the saved state has seed=3"),
        ({"shuffle": False}, "shuffle=False, but the saved state has shuffle=True"),
    ]:
        order = replace(config.order, **changed)
        with pytest.raises(ValueError, match=re.escape(words)):
            replace(config, order=order).restore(state, mesh, source=rows)


def test_dtypes_let_a_64_bit_npy_file_load_without_x64(tmp_path):
    rows = token_table(64, width=4).astype(np.int64)
    np.save(tmp_path / "tokens.npy", rows)
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig.create(
        source=str(tmp_path / "tokens.npy"), global_batch_size=8, shuffle=False
    )
    with pytest.raises(TypeError, match=r"int64, which JAX holds as int32.*dtypes=np.int32"):
        config.build(mesh)
    with replace(config, output=OutputOptions(dtypes="int32")).build(mesh) as loader:
        assert loader.dtypes == np.dtype(np.int32)
        assert_batch_exact(loader.batch_at(1), rows[8:16].astype(np.int32))


# ------------------------------------------------------------------------ docs/guides/trainer.md
def _trainer_script(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "guides" / "trainer.md").read_text()
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
    text = (ROOT / "docs" / "guides" / "trainer.md").read_text()
    shown = re.search(r"```\n(Traceback.*?ParsingError.*?)\n```", text, re.S)
    assert shown is not None and "--data.order.global_batch_size 0" in text[: shown.start()]
    err = _run(_trainer_script(tmp_path), "--data.order.global_batch_size", "0", ok=False)
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
        *["--mesh.axes", "data=4,model=2", "--data.source", "tokens.npy"],
        *["--data.order.global_batch_size", "8", "--num_train_steps", "2"],
    )
    lines = out.splitlines()
    assert lines[:2] == ["step 0: (8, 6)", "step 1: (8, 6)"]
    assert "bottleneck" in lines[2]
    yaml = (
        "mesh:\n  axes: {data: 2, model: 4}\n"
        "data:\n  source: tokens.npy\n  order:\n    global_batch_size: 4\n"
    )
    (tmp_path / "train.yaml").write_text(yaml)
    out = _run(script, "--config_path", "train.yaml", "--num_train_steps", "1")
    assert out.splitlines()[0] == "step 0: (4, 6)"


def test_named_axes_and_feeding_processes_reach_the_loader():
    haliax = pytest.importorskip("haliax", reason="haliax is optional: pip install 'psdp[haliax]'")

    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    config = LoaderConfig.create(
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
    config = LoaderConfig.create(global_batch_size=8, shuffle=False)
    with pytest.raises(ValueError, match="include none of the usual batch axes"):
        config.build(mesh, source={"x": token_table(16)})  # "rows" is not a usual name
    with config.build(
        mesh, source={"x": token_table(16)}, batch_axes=mesh_config.batch_axes
    ) as loader:
        batch = next(iter(loader))
    assert batch["x"].sharding.spec == P("rows")
    np.testing.assert_array_equal(np.asarray(batch["x"]), token_table(16)[:8])


def test_a_schedule_and_skips_come_from_yaml_and_flags_and_a_restore_may_change_them():
    text = "order:\n  global_batch_size: [[0, 8], [2, 16]]\n  skip_steps: [[3, 4]]\n  seed: 3\n"
    config = draccus.decode(LoaderConfig, yaml.safe_load(text))
    assert config.order.global_batch_size == ((0, 8), (2, 16))
    assert config.order.skip_steps == ((3, 4),)
    flags = draccus.parse(
        LoaderConfig, args=["--order.global_batch_size", "[[0, 8], [2, 16]]", "--order.seed", "3",
                            "--order.skip_steps", "[[3, 4]]"],
    )  # fmt: skip
    assert flags.order == config.order
    assert LoaderConfig.from_dict(config.to_dict()) == config  # a JSON round trip
    mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
    rows = token_table(64)
    with config.build(mesh, source=rows) as loader:
        assert [loader.step_info(s).offset for s in range(5)] == [0, 8, 16, 48, 64]
        state = loader.iter_from(4).state()
        loader.close()
    # the config now says 32 rows per step: it applies from the resume step, at the saved offset
    later = replace(config, order=replace(config.order, global_batch_size=32))
    with later.restore(state, mesh, source=rows) as loader:
        assert loader.step_info(4).offset == 64 and loader.step_info(5).offset == 96
        want = oracle.span_ids(64, oracle.Span(64, 32, 32), seed=3)
        assert_batch_exact(loader.batch_at(4), rows[want])
