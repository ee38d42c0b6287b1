"""The example's trainer, one process of a pod: `main` runs on every host after
`jax.distributed.initialize` (`run.py` starts it on local processes with `run_pod`).

It reads `train_lm.yaml` (a `DataConfig` for a two-source packed mixture with an eval set and a
source tag per row, the model, the steps) and flags, trains the Equinox transformer of
`model.py` with optax on the packed batches, reports the loss per source (by the rows' source
tag), runs an eval round over the finite eval loader, and saves an Orbax checkpoint of the
model, the optimizer state and the loader state every ``save_every`` steps. When the checkpoint
folder holds one, it resumes from the latest: the loader continues at the saved sample offset,
under the batch size the flags give now.

The data path is three things: the loader built from the config (or restored with the model),
iterated, and saved in the model's checkpoint (`psdp.orbax`). `checks.py` is the example's own
verification (every device's batch against an oracle, and a log of every step's rows), which a
trainer of your own leaves out.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from checks import Checks
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
from model import ModelConfig, Transformer, loss_sum, row_loss_sums

from psdp import DataConfig, MeshConfig
from psdp.orbax import LoaderRestore, LoaderSave

CONFIG = Path(__file__).with_name("train_lm.yaml")


@dataclass(frozen=True)
class TrainConfig:
    mesh: MeshConfig = field(default_factory=MeshConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 16
    """Train steps in all (a resumed run goes on to the same end)."""
    save_every: int = 4
    """A checkpoint after every this many steps."""
    eval_every: int = 8
    """An eval round after every this many steps."""
    checkpoints: str = "checkpoints"
    """The checkpoint folder (relative to the run folder); a run resumes from its latest."""
    log: str = "steps.jsonl"
    """Process 0's log, one JSON line per step and eval round (appended)."""
    kill_at: int | None = None
    """Stand-in for a crash: every process SIGKILLs itself after this step (unset: never)."""
    check: bool = True
    """Check every device's batch against the oracle (`batch_oracle.py`) every step."""


def main(run_dir: str, args: list[str]) -> dict[str, Any]:
    """The pod target: the config file plus ``args`` (flags), paths relative to ``run_dir``."""
    os.chdir(run_dir)
    config = draccus.parse(TrainConfig, config_path=str(CONFIG), args=args)
    return train(config)


def train(config: TrainConfig) -> dict[str, Any]:
    mesh = config.mesh.build()
    batch_axes = config.mesh.resolved_batch_axes()
    optimizer = optax.adam(config.model.learning_rate)

    def on_mesh(tree):
        """docs/reference/reliability.md's recipe: a leaf on one device (optax's scalar `count`) replicated
        over the mesh, so Orbax saves it on a pod and a jitted step accepts it restored."""

        def place(leaf):
            if isinstance(leaf.sharding, NamedSharding):
                return leaf
            return jax.device_put(leaf, NamedSharding(mesh, PartitionSpec()))

        return jax.tree.map(place, tree)

    def initial_train_state():
        replicated = NamedSharding(mesh, PartitionSpec())
        make = eqx.filter_jit(lambda: Transformer(config.model, config.data.seq_len))
        model = jax.device_put(make(), replicated)
        return on_mesh({"model": model, "opt_state": optimizer.init(model)})

    @eqx.filter_jit
    def train_step(state, batch):
        def mean_loss(model):
            totals, tokens = row_loss_sums(model, batch)
            return jnp.sum(totals) / jnp.maximum(jnp.sum(tokens), 1), (totals, tokens)

        (loss, rows), grads = eqx.filter_value_and_grad(mean_loss, has_aux=True)(state["model"])
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["model"])
        # each row's loss and tokens summed by its source tag (mixture.source_leaf: source)
        tags = jax.nn.one_hot(batch["source"], len(config.data.sources))
        by_source = jnp.stack(rows) @ tags  # (total, tokens) x source
        new = {"model": eqx.apply_updates(state["model"], updates), "opt_state": opt_state}
        return new, loss, by_source

    sums = eqx.filter_jit(loss_sum)
    manager = ocp.CheckpointManager(
        Path(config.checkpoints).absolute(), item_names=("model", "loader")
    )
    state = initial_train_state()
    if manager.latest_step() is None:
        loader = config.data.build(mesh, batch_axes=batch_axes)
    else:  # a restart: the model, optimizer and loader of the latest checkpoint
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            model=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, state)),
            loader=LoaderRestore(config.data, mesh=mesh, batch_axes=batch_axes),
        ))  # fmt: skip
        state, loader = restored.model, restored.loader
    evals = config.data.eval_loaders(mesh, batch_axes=batch_axes)
    checks = Checks(config.data, config.log, check=config.check)
    losses = {}
    with loader:
        batches = iter(loader)
        for step in range(loader.start_step, config.steps):
            batch = next(batches)
            state, loss, by_source = train_step(state, batch)
            losses[step] = float(loss)
            per_source = {
                name: float(total / tokens)
                for name, (total, tokens) in zip(
                    loader.source.names, by_source.T.tolist(), strict=True
                )
                if tokens
            }
            verdict = checks.step(loader, step, batch, losses[step], per_source)
            if jax.process_index() == 0:
                shown = ", ".join(f"{name} {value:.4f}" for name, value in per_source.items())
                print(f"step {step:2d}  loss {losses[step]:.4f} ({shown})  {verdict}", flush=True)
            if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                checks.write({"eval_after": step, **evaluate(sums, state["model"], evals)})
            if (step + 1) % config.save_every == 0:
                manager.save(step + 1, args=ocp.args.Composite(
                    model=ocp.args.StandardSave(state), loader=LoaderSave(batches)))  # fmt: skip
                manager.wait_until_finished()  # on disk before the run may die
            if step == config.kill_at:  # every host past its last collective, then gone
                multihost_utils.sync_global_devices("kill")
                os.kill(os.getpid(), signal.SIGKILL)
    for eval_loader in evals.values():
        eval_loader.close()
    manager.close()
    return {"process": jax.process_index(), "losses": losses, "checked": checks.checked}


def evaluate(sums, model, evals) -> dict[str, float]:
    """One pass over each eval set: the mean next-token loss over all its tokens."""
    out = {}
    for name, loader in evals.items():
        total, tokens = 0.0, 0.0
        for batch in loader:  # every row once over all hosts; the padded rows are masked
            batch_total, batch_tokens = sums(model, batch)
            total, tokens = total + float(batch_total), tokens + float(batch_tokens)
        out[name] = total / tokens
    return out
