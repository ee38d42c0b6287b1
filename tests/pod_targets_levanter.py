"""Pod target for tests/test_levanter.py: Levanter's `Trainer` (a tiny Llama) fed by psdp's
`LevanterLoader`, checkpointed by Levanter's own checkpointer, killed between steps.

Each host appends one JSON line per step to ``<run_dir>/<record>.p<process>.jsonl``: the step,
the loss, and the rows of the step's ``input_ids`` that sit on this host's devices (by their
first row), so a pod that is killed still leaves what it trained on.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import jax
import numpy as np

SEQ_LEN, BATCH, EOS, VOCAB = 16, 8, 1, 64
#: Levanter saves its permanent checkpoints at 0-indexed steps divisible by this
SAVE_EVERY = 4


def train(run_dir: str, cache: str, steps: int, record: str, kill_after_save: bool) -> dict:
    """Levanter's training loop as ``train_lm`` runs it: ``trainer.initial_state`` loads the
    latest checkpoint under ``run_dir`` (if any) and the loader starts at ``state.step``
    (``iter_from_step``). With ``kill_after_save``, Levanter's checkpointer saves at step
    `SAVE_EVERY` (state.step ``SAVE_EVERY + 1``) and every host is SIGKILLed once that
    checkpoint is on disk, with psdp's loader reading ahead."""
    import haliax as hax
    import jax.random as jrandom
    import levanter
    from jax.experimental import multihost_utils
    from levanter.checkpoint import CheckpointerConfig
    from levanter.distributed import DistributedConfig
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig

    from psdp.levanter import LevanterLoader

    os.chdir(run_dir)  # Levanter writes logs/ into the working directory
    model_config = LlamaConfig(
        max_seq_len=SEQ_LEN, hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2,
        num_kv_heads=2,
    )  # fmt: skip
    keep = [dict(every=SAVE_EVERY)] if kill_after_save else None  # None: no save at all
    trainer_config = TrainerConfig(
        num_train_steps=steps, train_batch_size=BATCH, tracker=NoopConfig(),
        require_accelerator=False, id="psdp-kill",
        distributed=DistributedConfig(initialize_jax_distributed=False),  # run_pod did
        checkpointer=CheckpointerConfig(base_path=str(Path(run_dir) / "ckpt"),
                                        save_interval=None, keep=keep),
    )  # fmt: skip
    levanter.initialize(trainer_config)
    optimizer = AdamConfig(learning_rate=1e-2).build(steps)

    def loss_fn(model, example, *, key=None):
        return model.compute_next_token_loss(example, key=key)

    me = jax.process_index()
    out = (Path(run_dir) / f"{record}.p{me}.jsonl").open("a")
    with Trainer(trainer_config, optimizer, loss_fn, add_default_hooks=False) as trainer:
        state = trainer.initial_state(
            jrandom.PRNGKey(0),
            model_init=lambda: model_config.build(hax.Axis("vocab", VOCAB), key=jrandom.PRNGKey(1)),
        )
        first = int(state.step)
        checkpointer = trainer_config.checkpointer.create(trainer.run_id)
        loader = LevanterLoader.from_cache(
            cache, mesh=trainer.device_mesh, Pos=model_config.max_Pos, batch_size=BATCH,
            axis_resources=trainer.compute_axis_mapping, eos_id=EOS,
        )  # fmt: skip
        seen: list[dict] = []

        def recorded(batches):
            for example in batches:
                tokens = example.tokens.array
                seen.append({str(s.index[0].start or 0): np.asarray(s.data).tolist()
                             for s in tokens.addressable_shards})  # fmt: skip
                yield example

        for info in trainer.training_steps(state, recorded(loader.iter_from_step(first))):
            loss = float(np.asarray(info.loss.addressable_data(0)))
            out.write(json.dumps({"step": info.step, "loss": loss, "rows": seen.pop()}) + "\n")
            out.flush()
            # Levanter's checkpoint hook, as its default hooks run it
            checkpointer.on_step(tree=info.state.saveable_state, step=info.step)
            if kill_after_save and info.step == SAVE_EVERY:
                checkpointer.wait_until_finished()
                multihost_utils.sync_global_devices("every host's part of the checkpoint is saved")
                os.kill(os.getpid(), signal.SIGKILL)
        loader.close()
    out.close()
    return {"process": me, "first_step": first}
