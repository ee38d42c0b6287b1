"""Pod target for tests/test_orbax_pod.py: docs/reference/reliability.md's Orbax recipe on every host."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from psdp import DataLoader
from tests.test_docs import python_blocks


def orbax_recipe() -> str:
    """The doc's Orbax block, as written."""
    (block,) = [b for b in python_blocks("reference/reliability.md") if "import orbax" in b.code]
    return block.code


def run_orbax_recipe(run_dir: str) -> dict:
    """Runs the doc's Orbax block with the names the doc's block before it defines (the pod's
    8 devices as data=4 x model=2, a loader 3 steps on); ``run_dir`` is shared by every host."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    data = {"tokens": np.arange(64 * 4, dtype=np.int32).reshape(64, 4)}
    with DataLoader(data, mesh=mesh, global_batch_size=8, seed=7) as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = batches.state()
    namespace = {
        "__name__": "docs.reference.reliability.md",
        "jax": jax,
        "np": np,
        "DataLoader": DataLoader,
        "mesh": mesh,
        "data": data,
        "run_dir": Path(run_dir),
        "state": state,
        "loader": loader,
    }
    exec(compile(orbax_recipe(), "docs/reference/reliability.md (Orbax block)", "exec"), namespace)
    resumed = namespace["resumed"]
    return {
        "process": jax.process_index(),
        "loader_step": namespace["loader"].state()["step"],
        "count": int(np.asarray(resumed["opt_state"][0].count.addressable_data(0))),
        "count_devices": len(resumed["opt_state"][0].count.sharding.device_set),
    }


# ------------------------------------------------------------------------------ killed mid-save
ROWS, WIDTH = 64, 4  # row r of the data is 4r .. 4r + 3: a batch names its rows
SAVE_EVERY = 2


def _data() -> dict:
    return {"tokens": np.arange(ROWS * WIDTH, dtype=np.int32).reshape(ROWS, WIDTH)}


def _manager(run_dir: str):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(Path(run_dir) / "orbax", item_names=("model", "data"))


def _model(mesh, value: int):
    """A stand-in model whose every entry is the number of steps it trained: a restore that
    pairs it with another step's loader state shows as two different numbers."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    return {"params": jnp.full((8, 2), value, jnp.int32, device=sharding)}


def _kill_after_the_model_is_written(kill_step: int) -> None:
    """From the save of ``kill_step`` on, Orbax's JSON write (the loader item's file, under
    psdp's handler) is replaced by a commit future that SIGKILLs this process. Orbax waits on
    a step's commit futures in item order (model first), so the kill comes once this host's
    part of the model item is on disk, and the loader's file is never written; psdp's own part
    of the save runs as it always does."""
    import os
    import signal

    import orbax.checkpoint as ocp

    real = ocp.JsonCheckpointHandler.async_save
    me = jax.process_index()

    class KillAfterModel:
        def __init__(self, directory):
            self.step = Path(str(directory)).parent  # the step's directory, not committed yet

        def result(self, timeout=None):
            # every host's part of the model item (its ocdbt manifest; the item's directory is
            # "model", or "model.<Orbax's temporary suffix>"): this host's is written (its
            # futures came first), the others' soon; then no host kills another's write
            deadline = time.monotonic() + 120
            for p in range(jax.process_count()):
                while not list(self.step.glob(f"model*/ocdbt.process_{p}/manifest.ocdbt")):
                    assert p != me, f"the model item of this host is not on disk in {self.step}"
                    assert time.monotonic() < deadline, f"host {p} never wrote its model part"
                    time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    async def killing(self, directory, item=None, args=None):
        if int(Path(str(directory)).parent.name.split(".")[0]) < kill_step:
            return await real(self, directory, item=item, args=args)
        return [KillAfterModel(directory)]

    ocp.JsonCheckpointHandler.async_save = killing


def train_saving_until_killed(run_dir: str, kill_step: int) -> None:
    """Trains (the model counts the steps), saving model and loader every `SAVE_EVERY` steps
    in one Orbax step; the save of ``kill_step`` is killed between the model and the loader."""
    import orbax.checkpoint as ocp

    from psdp.orbax import LoaderSave

    _kill_after_the_model_is_written(kill_step)
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    manager = _manager(run_dir)
    with DataLoader(_data(), mesh=mesh, global_batch_size=8, shuffle=False) as loader:
        it = iter(loader)
        for step in range(1, kill_step + 1):
            next(it)  # train_state = train_step(train_state, batch)
            if step % SAVE_EVERY == 0:
                args = ocp.args.Composite(
                    model=ocp.args.StandardSave(_model(mesh, step)), data=LoaderSave(it)
                )
                manager.save(step, args=args)
        manager.wait_until_finished()  # the kill comes here, in Orbax's commit thread
    raise AssertionError(f"the save of step {kill_step} was not killed")


def restore_latest(run_dir: str, global_batch_size: int) -> dict:
    """On another pod: the latest step's model and loader, the loader with another batch size."""
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    from psdp.orbax import LoaderRestore

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    manager = _manager(run_dir)
    step = manager.latest_step()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _model(mesh, 0))
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            model=ocp.args.StandardRestore(abstract),
            data=LoaderRestore(
                _data(), mesh=mesh, global_batch_size=global_batch_size, shuffle=False
            ),
        ),
    )
    params = multihost_utils.process_allgather(restored.model["params"], tiled=True)
    with restored.data as loader:
        state = loader.state()
        batch = next(iter(loader))
        tokens = multihost_utils.process_allgather(batch["tokens"], tiled=True)
    return {
        "process": jax.process_index(),
        "steps": [int(s) for s in manager.all_steps()],
        "latest": int(step),
        "model": sorted({int(v) for v in np.asarray(params).ravel()}),
        "loader_step": state["step"],
        "offset": state["offset"],
        "rows": (np.asarray(tokens)[:, 0] // WIDTH).tolist(),
    }
