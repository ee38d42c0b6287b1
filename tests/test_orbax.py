"""psdp.orbax in one process: the loader's state as an item of an Orbax checkpoint, saved and
restored with the model's step (the pod and the kill: tests/test_orbax_pod.py)."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import DataLoader, LoaderConfig

ocp = pytest.importorskip("orbax.checkpoint")
from psdp.orbax import LoaderCheckpointHandler, LoaderRestore, LoaderSave  # noqa: E402

DATA = {"tokens": np.arange(64 * 4, dtype=np.int32).reshape(64, 4)}  # row r: 4r .. 4r + 3


def _saved(tmp_path, mesh, data_args):
    """A manager with step 3 saved: a small model beside ``data_args`` (made from a loader that
    handed out 3 batches of 8)."""
    manager = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("model", "data"))
    with DataLoader(DATA, mesh=mesh, global_batch_size=8, shuffle=False) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = it.state()
        model = {"w": np.full(3, 3.0)}
        manager.save(3, args=ocp.args.Composite(model=ocp.args.StandardSave(model),
                                                data=data_args(it)))  # fmt: skip
        manager.wait_until_finished()
    return manager, state


def test_the_restored_item_is_a_loader_at_the_saved_step_with_a_new_batch_size(tmp_path, mesh_2d):
    manager, state = _saved(tmp_path, mesh_2d, LoaderSave)
    restored = manager.restore(3, args=ocp.args.Composite(
        model=ocp.args.StandardRestore({"w": np.zeros(3)}),
        data=LoaderRestore(DATA, mesh=mesh_2d, global_batch_size=16),
    ))  # fmt: skip
    assert restored.model["w"].tolist() == [3.0, 3.0, 3.0]
    with restored.data as loader:
        assert isinstance(loader, DataLoader)
        assert loader.state()["step"] == 3 and loader.state()["offset"] == 24
        batch = np.asarray(next(iter(loader))["tokens"])
    np.testing.assert_array_equal(batch[:, 0] // 4, np.arange(24, 40))  # the next 16 rows
    # the state dict itself, and Orbax's own JSON reader after a restart, read the same item
    assert manager.restore(3, args=ocp.args.Composite(data=LoaderRestore())).data == state
    restarted = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("model", "data"))
    assert restarted.restore(3, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data == state


def test_a_loader_item_saved_by_the_json_recipe_restores_with_loader_restore(tmp_path, mesh_2d):
    """Checkpoints of the recipe psdp documented before (``ocp.args.JsonSave(it.state())``)."""
    _, state = _saved(tmp_path, mesh_2d, lambda it: ocp.args.JsonSave(it.state()))
    restarted = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("model", "data"))
    restored = restarted.restore(3, args=ocp.args.Composite(data=LoaderRestore(DATA, mesh=mesh_2d)))
    with restored.data as loader:
        assert loader.state() == state


def test_a_loader_config_restores_its_loader(tmp_path, mesh_2d):
    manager, state = _saved(tmp_path, mesh_2d, LoaderSave)
    config = LoaderConfig.create(global_batch_size=8, shuffle=False)
    args = ocp.args.Composite(data=LoaderRestore(config, mesh=mesh_2d, source=DATA))
    with manager.restore(3, args=args).data as loader:
        assert loader.state() == state


def test_the_state_is_taken_when_the_args_are_made(mesh_2d):
    with DataLoader(DATA, mesh=mesh_2d, global_batch_size=8) as loader:
        it = iter(loader)
        next(it)
        args = LoaderSave(it)
        next(it)
        assert args.state["step"] == 1 and LoaderSave(it).state["step"] == 2
        assert LoaderSave(loader).state == LoaderSave(it.state()).state == it.state()
    assert repr(args) == "LoaderSave(step 1)"


def test_bad_args_say_the_fix(mesh_2d):
    with pytest.raises(TypeError, match=r"got list; pass LoaderSave\(it\)"):
        LoaderSave([1, 2])
    with pytest.raises(ValueError, match="format"):
        LoaderSave({"step": 3})
    with pytest.raises(TypeError, match=r"needs the source and the mesh"):
        LoaderRestore(DATA)
    with pytest.raises(TypeError, match=r"needs the source and the mesh"):
        LoaderRestore(mesh=mesh_2d)
    with pytest.raises(
        TypeError, match=r"LoaderRestore\(config, mesh=mesh\): a LoaderConfig needs the mesh"
    ):
        LoaderRestore(LoaderConfig.create(global_batch_size=8))
    with pytest.raises(TypeError, match="saves psdp.orbax.LoaderSave args, got JsonSaveArgs"):
        LoaderCheckpointHandler().save("/nonexistent", args=ocp.args.JsonSave({}))
