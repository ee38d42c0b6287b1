"""Pod target for tests/test_levanter.py: psdp's `LevanterLoader` in a training loop whose
state Levanter's own checkpointer saves and restores, killed between steps.

The "model" is an ordered fold of every batch trained on (``seen``: each step's tokens weighed
by position and by the step's number, in int32: exact on any device count), so a step lost,
trained twice or trained on other rows after a restore shows as another number. Each host
appends one JSON line per step to ``<run_dir>/<record>.p<process>.jsonl``: the step, ``seen``
after it, and the rows of the step's ``input_ids`` that sit on this host's devices (by their
first row), so a pod that is killed still leaves what it trained on.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

SEQ_LEN, BATCH, EOS, VOCAB = 16, 8, 1, 64
#: Levanter saves its permanent checkpoints at 0-indexed steps divisible by this
SAVE_EVERY = 4


def train(run_dir: str, cache: str, steps: int, record: str, kill_after_save: bool) -> dict:
    """Levanter's resume as ``train_lm`` does it: the state is Levanter's latest checkpoint under
    ``run_dir`` if there is one (``load_checkpoint_or_initialize``, what ``Trainer.initial_state``
    calls), and the loader starts at its step (``iter_from_step``). With ``kill_after_save``,
    Levanter's `Checkpointer` saves after step `SAVE_EVERY` (0-indexed, as its hook counts) and
    every host is SIGKILLed once that checkpoint is on disk, psdp's loader reading ahead."""
    import haliax as hax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh
    from levanter.checkpoint import CheckpointerConfig, load_checkpoint_or_initialize

    from psdp.levanter import LevanterLoader

    mesh = Mesh(np.array(jax.devices()), ("data",))
    path = str(Path(run_dir) / "ckpt")
    keep = [dict(every=SAVE_EVERY)] if kill_after_save else None  # None: no save at all
    config = CheckpointerConfig(base_path=path, save_interval=None, keep=keep,
                                append_run_id_to_base_path=False)  # fmt: skip

    def initial() -> dict:
        return {"step": jnp.zeros((), jnp.int32), "seen": jnp.zeros((), jnp.int32)}

    state = load_checkpoint_or_initialize(initial, [path], mesh=mesh)()
    first = _scalar(state["step"])
    checkpointer = config.create("psdp-kill")

    @jax.jit
    def train_step(state: dict, tokens: jax.Array) -> dict:
        weighed = jnp.sum(tokens * jnp.arange(1, SEQ_LEN + 1, dtype=jnp.int32))
        return {"step": state["step"] + 1, "seen": state["seen"] + (state["step"] + 1) * weighed}

    me = jax.process_index()
    with (
        (Path(run_dir) / f"{record}.p{me}.jsonl").open("a") as out,
        LevanterLoader.from_cache(
            cache, mesh=mesh, Pos=hax.Axis("position", SEQ_LEN), batch_size=BATCH,
            axis_resources={"batch": "data"}, eos_id=EOS,
        ) as loader,
    ):  # fmt: skip
        batches = loader.iter_from_step(first)
        for step in range(first, steps):
            tokens = next(batches).tokens.array
            state = train_step(state, tokens)
            rows = {str(s.index[0].start or 0): np.asarray(s.data).tolist()
                    for s in tokens.addressable_shards}  # fmt: skip
            entry = {"step": step, "seen": _scalar(state["seen"]), "rows": rows}
            out.write(json.dumps(entry) + "\n")
            out.flush()
            # Levanter's checkpoint hook, as Trainer's default hooks run it after each step
            checkpointer.on_step(tree=state, step=step)
            if kill_after_save and step == SAVE_EVERY:
                checkpointer.wait_until_finished()
                multihost_utils.sync_global_devices("every host's part of the checkpoint is saved")
                os.kill(os.getpid(), signal.SIGKILL)
        batches.close()
    return {"process": me, "first_step": first, "seen": _scalar(state["seen"])}


def _scalar(value: jax.Array) -> int:
    """A replicated scalar of the pod, read from this host's copy."""
    return int(np.asarray(value.addressable_data(0)))
