"""What each process of a ``psdp simulate`` pod runs: the loader (and the tiny model), with every
step's batch checked against its rows on every device (``docs/reference/cli.md``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from psdp import check_consistency
from psdp._plan.leaves import leaves_of
from psdp.tools.pod import report_progress
from psdp.tools.simulate.config import Simulation, parse_fail_at
from psdp.tools.simulate.data import main_leaf, open_source, packed_source, synthetic_tokens

#: The pod target `psdp.tools.simulate.simulate` starts on every process.
TARGET = "psdp.tools.simulate.host:run_host"


def run_host(simulation: dict[str, Any], path: str | None, synthetic: bool) -> dict[str, Any]:
    """The pod target: one host's loader (and model) for every step; returns its figures.

    Every step it checks the batch with `psdp.check_consistency` against the expected rows
    (recomputed from the row ids for synthetic data, re-read from the source otherwise).
    ``path`` None: the host packs the synthetic documents itself (``packing``).
    """
    import jax

    from psdp.tools.simulate.model import TinyModel

    sim = Simulation.from_json(simulation)
    me = jax.process_index()
    fail = parse_fail_at(sim.fail_at, sim.processes) if sim.fail_at else None
    mesh = sim.mesh.build()
    if path is None:  # every host packs the same documents into the same plan
        assert sim.packing is not None  # simulate gives no path only to pack synthetic documents
        source = packed_source(sim.rows, sim.seq_len, sim.vocab, sim.packing)
    else:
        source = open_source(path, sim.seq_len, sim.packing)
    trainer = TinyModel(mesh, sim) if sim.train else None
    losses: list[float] = []
    mask_key = sim.data.output.mask_key or "mask"
    shape: list[int] = []
    spec: list[Any] = []
    shards, report, first_done, last_note = 0, None, 0.0, 0.0
    with sim.data.build(mesh, source=source, batch_axes=sim.mesh.batch_axes) as loader:
        for step, batch in zip(range(sim.steps), loader, strict=False):
            if fail is not None and (me, step) == fail[:2]:
                inject_failure(fail[2], me, step)
            report = check_consistency(batch, expected_batch(loader, batch, step, sim, synthetic))
            shards += report.local_shards
            if trainer is not None:
                losses.append(trainer.step(batch))
            if step == 0:
                first_done = time.perf_counter()
                main = main_leaf(leaves_of(batch), mask_key)[1]
                spec = [list(e) if isinstance(e, tuple) else e for e in main.sharding.spec]
                shape = list(main.shape)
            if me == 0 and (time.perf_counter() - last_note > 0.2 or step + 1 == sim.steps):
                report_progress(step + 1, sim.steps)
                last_note = time.perf_counter()
        elapsed = time.perf_counter() - first_done
        stats = loader.stats()
        rows_per_step = len(loader.plan.read_positions)
    return {
        "process": me,
        "steps": sim.steps,
        "shape": shape,
        "spec": spec,
        "shards_checked": shards,
        "consistency": str(report),
        "rows_per_step": rows_per_step,
        "steps_per_s": (sim.steps - 1) / elapsed if elapsed > 0 else float("nan"),
        "wait_ms_p50": stats.wait_ms_p50,
        "wait_ms_p99": stats.wait_ms_p99,
        "wait_fraction": stats.wait_fraction,
        "read_ms_p50": stats.read_ms_p50,
        "loader": str(stats),
        "model": trainer.summary if trainer is not None else None,
        "losses": losses if me == 0 else None,
    }


def inject_failure(mode: str, me: int, step: int) -> None:
    """What ``--fail-at`` asks of this process: raise, die (SIGKILL) or hang."""
    import os
    import signal

    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(10**6)
    raise RuntimeError(f"injected failure: process {me} raised at step {step} (--fail-at)")


def physical_ids(loader: Any, step: int) -> np.ndarray:
    """The source row id of every row of the step's physical batch; negative for padding."""
    if loader.order is None:
        raise ValueError(
            "psdp simulate checks every batch against its source rows, so it needs a "
            "random-access source (a dataset directory or a .npy file), not a stream"
        )
    return loader.feed.ids(step)


def expected_batch(loader: Any, batch: Any, step: int, sim: Simulation, synthetic: bool) -> Any:
    """The expected global batch of ``step``: its rows, padding rows filled with the loader's
    ``pad_value``, and its mask leaf when the batch has one."""
    output = loader.options.output
    ids = physical_ids(loader, step)
    real = ids >= 0
    if synthetic:
        rows: Any = {"tokens": synthetic_tokens(np.where(real, ids, 0), sim.seq_len, sim.vocab)}
    else:
        rows = loader.source.read(np.where(real, ids, 0))
    out = {}
    for name, value in leaves_of(rows).items():
        value = np.array(value)
        value[~real] = output.pad_value
        out[name] = value
    if not isinstance(batch, dict):
        return out[None] if None in out else out
    if None in out and None not in batch:  # an array source whose batch gained a mask leaf
        out[next(k for k in batch if k != output.mask_key)] = out.pop(None)
    if output.mask_key in batch:
        out[output.mask_key] = real
    return out
