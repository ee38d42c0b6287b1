"""The example's trainer, one process of a pod: `main` runs on every host after
`jax.distributed.initialize` (`run.py` starts it on local processes with `run_pod`).

It reads `train_lm.yaml` (a `DataConfig` for a two-source packed mixture with an eval set, the
model, the steps) and flags, trains the Equinox transformer of `model.py` with optax on the
packed batches, runs an eval round over the finite eval loader, and saves an Orbax checkpoint
of the model, the optimizer state and the loader state every ``save_every`` steps. When the
checkpoint folder holds one, it resumes from the latest: the loader continues at the saved
sample offset, under the batch size the flags give now. Every step, every host checks that each
device holds exactly its part of the batch that `batch_oracle.py` rebuilds from the stores
without psdp (`psdp.check_consistency`); process 0 prints the step's loss and that verdict, and
logs the step (its sample offset, loss, the delivered tokens and where each row's segments come
from) as a line of JSON.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from batch_oracle import expected_batch, store_documents
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
from model import ModelConfig, Transformer, loss_sum

from psdp import DataConfig, MeshConfig, check_consistency
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
            total, tokens = loss_sum(model, batch)
            return total / jnp.maximum(tokens, 1)

        loss, grads = eqx.filter_value_and_grad(mean_loss)(state["model"])
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["model"])
        return {"model": eqx.apply_updates(state["model"], updates), "opt_state": opt_state}, loss

    sums = eqx.filter_jit(loss_sum)
    manager = ocp.CheckpointManager(
        Path(config.checkpoints).absolute(), item_names=("model", "loader")
    )
    state = initial_train_state()
    if manager.latest_step() is None:
        loader = config.data.build(mesh, batch_axes=batch_axes)
    else:  # a restart: the model, optimizer and loader of the latest checkpoint
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(abstract),
                loader=LoaderRestore(config.data, mesh=mesh, batch_axes=batch_axes),
            ),
        )
        state, loader = restored.model, restored.loader
    log = Log(Path(config.log))
    evals = config.data.eval_loaders(mesh, batch_axes=batch_axes)
    documents = {
        name: store_documents(source.store) for name, source in config.data.sources.items()
    }
    losses, checked = {}, []
    with loader:
        batches = iter(loader)
        for step in range(batches.state()["step"], config.steps):
            batch = next(batches)
            info = loader.step_info(step)
            rows = provenance(loader.source, np.arange(info.offset, info.offset + info.rows))
            verdict = "not checked"
            if config.check:  # collective: every host checks, every host gets the verdict
                report = check_consistency(batch, oracle(batch, rows, documents, config))
                verdict = str(report)
                checked += [step] if report.exact else []
            state, loss = train_step(state, batch)
            losses[step] = float(loss)
            log.step(step, info, rows, batch, losses[step])
            if jax.process_index() == 0:
                print(f"step {step:2d}  loss {losses[step]:.4f}  {verdict}", flush=True)
            if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                log.write({"eval_after": step, **evaluate(sums, state["model"], evals)})
            if (step + 1) % config.save_every == 0:
                manager.save(
                    step + 1,
                    args=ocp.args.Composite(
                        model=ocp.args.StandardSave(state), loader=LoaderSave(batches)
                    ),
                )
                manager.wait_until_finished()  # on disk before the run may die
            if step == config.kill_at:  # every host past its last collective, then gone
                multihost_utils.sync_global_devices("kill")
                os.kill(os.getpid(), signal.SIGKILL)
    for eval_loader in evals.values():
        eval_loader.close()
    manager.close()
    return {"process": jax.process_index(), "losses": losses, "checked": checked}


def oracle(batch, rows: list[list], documents, config: TrainConfig) -> dict[str, np.ndarray]:
    """The step's global batch as the oracle rebuilds it, in the delivered leaves' dtypes; rows
    past ``rows`` (a padded batch's) are padding, and ``mask`` says which rows are real."""
    size = batch["input_ids"].shape[0]
    padded = rows + [[] for _ in range(size - len(rows))]
    expected = expected_batch(padded, documents, config.data.seq_len, config.data.view.pad_id)
    expected["mask"] = np.arange(size) < len(rows)
    return {
        name: leaf.astype(batch[name].dtype) for name, leaf in expected.items() if name in batch
    }


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


class Log:
    """Process 0's JSON lines: each step's offset, loss, tokens and the rows' provenance."""

    def __init__(self, path: Path):
        self.path = path

    def step(self, step: int, info, rows: list[list], batch, loss: float) -> None:
        tokens = multihost_utils.process_allgather(batch["input_ids"], tiled=True)  # collective
        self.write({
            "processes": jax.process_count(),
            "step": step,
            "offset": info.offset,
            "rows": info.rows,
            "loss": loss,
            "input_ids": np.asarray(tokens)[: info.rows].tolist(),
            "provenance": rows,
        })  # fmt: skip

    def write(self, record: dict[str, Any]) -> None:
        if jax.process_index() == 0:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def provenance(mixture, offsets: np.ndarray) -> list[list]:
    """Each row's segments as ``[source, document, start, stop, column]``: the document's tokens
    ``[start, stop)`` sit from ``column`` on (`Mixture.provenance`: reads no token)."""
    out: list[list] = [[] for _ in offsets]
    for segment in mixture.provenance(offsets):
        fields = ("document", "start", "stop", "column")
        out[segment["row"]].append([str(segment["source"]), *(int(segment[k]) for k in fields)])
    return out
