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


def test_per_source_tags_switched_on_at_a_resume_continue_the_same_rows(tmp_path, mesh_2d):
    """`mixture.source_leaf` (the switch for losses per source) turned on when a run resumes
    from its Orbax checkpoint: it adds a leaf and changes no row, yet the restore refused it
    with the two fingerprints and no field named. Now the rows are the uninterrupted run's and
    each tag names the row's source (its tokens tell: web's ids < 1000, code's >= 5000); turned
    off again, the error names the switch."""
    import dataclasses

    from psdp import DataConfig
    from psdp.sources.documents.writer import write_documents

    rng = np.random.default_rng(0)
    for name, first in (("web", 2), ("code", 5000)):
        docs = [first + rng.integers(0, 900, int(n)) for n in rng.integers(3, 30, 60)]
        write_documents(tmp_path / name, [d.astype(np.int32) for d in docs], progress=False)
    plain = DataConfig.from_dict({
        "sources": {n: {"store": str(tmp_path / n), "weight": w} for n, w in (("web", 3), ("code", 1))},
        "seq_len": 16, "mixture": {"block_size": 8, "seed": 5}, "order": {"global_batch_size": 8},
    })  # fmt: skip
    tagged = dataclasses.replace(
        plain, mixture=dataclasses.replace(plain.mixture, source_leaf="source")
    )
    with plain.build(mesh_2d) as loader:
        it = iter(loader)
        whole = [np.asarray(next(it)["input_ids"]) for _ in range(6)]
    with plain.build(mesh_2d) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        saved = it.state()
        manager = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",))
        manager.save(3, args=ocp.args.Composite(data=LoaderSave(it)))
        manager.wait_until_finished()
    restored = manager.restore(3, args=ocp.args.Composite(data=LoaderRestore(tagged, mesh=mesh_2d)))
    with restored.data as loader:
        names, it = loader.source.names, iter(loader)
        for step in range(3, 6):
            batch = next(it)
            tokens, tags = np.asarray(batch["input_ids"]), np.asarray(batch["source"])
            np.testing.assert_array_equal(tokens, whole[step])
            expected = [names.index("code" if row.max() >= 5000 else "web") for row in tokens]
            assert tags.tolist() == expected
        resumed = it.state()
    assert saved["step"] == 3
    with pytest.raises(ValueError, match=r"was the mixture's source_leaf, set it again: "
                                         r"mixture.source_leaf: source"):  # fmt: skip
        plain.restore(resumed, mesh_2d)
