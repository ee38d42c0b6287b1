"""Soak: thousands of loader steps with restarts; memory, threads and file descriptors must stay flat.

    python scripts/measure/soak.py --steps 10000   # the full soak (docs/reference/reliability.md quotes it)
    # what tests/test_soak.py runs in CI:
    python scripts/measure/soak.py --steps 2000 --restart-every 500 --sample-every 50 --json out

The run reads a small zarr3 dataset on disk (`TensorStoreSource`: real files, real descriptors)
with everything that starts threads or holds buffers switched on: two read threads, a read timeout
(one watchdog thread per step), a sequence-sharded leaf with a halo, a padded batch with a mask.
Every ``--restart-every`` steps the trainer saves ``loader.state()``, closes the loader and
restores a new one from the state, as after a preemption. Every step's ``weight`` leaf is checked
against the rows the order names, so the soak also proves the batches stay right.

Baselines are taken after a warm-up (JAX compiles, allocators and thread pools settle), with no
loader open; the final figures are taken after the last loader is closed. The run fails (exit 1)
when the resident memory grew by more than ``--rss-bound-mib`` or any thread or descriptor is left
over. Figures come from psutil when it is installed, otherwise from ``/proc/self``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from psdp import DataLoader, TensorStoreSource, write_dataset
from psdp._plan.order import PAD

MIB = 1024 * 1024


# ------------------------------------------------------------------------------- measurements
def rss_bytes() -> int:
    """Resident memory of this process."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot measure RSS: no psutil and no /proc/self/status")


def os_threads() -> int:
    """Threads of this process as the OS sees them (Python's and native ones)."""
    return len(os.listdir("/proc/self/task"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def sample(step: int) -> dict[str, int]:
    return {
        "step": step,
        "rss": rss_bytes(),
        "python_threads": threading.active_count(),
        "os_threads": os_threads(),
        "fds": open_fds(),
    }


def settle(baseline: dict[str, int], limit_s: float = 5.0) -> dict[str, int]:
    """Samples until threads and descriptors are back to ``baseline`` (daemon threads exiting)."""
    deadline = time.monotonic() + limit_s
    while True:
        now = sample(-1)
        keys = ("python_threads", "os_threads", "fds")
        if all(now[k] <= baseline[k] for k in keys) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# ------------------------------------------------------------------------------------ the run
def make_dataset(path: Path, rows: int, width: int) -> dict[str, np.ndarray]:
    data = {
        "tokens": (np.arange(rows)[:, None] * 1000 + np.arange(width)).astype(np.int32),
        "weight": np.arange(rows, dtype=np.float32),
    }
    write_dataset(path, data, rows_per_shard=64, progress=False)
    return data


def open_loader(source: Any, mesh: Mesh, args: argparse.Namespace, state=None) -> DataLoader:
    kwargs = dict(
        batch_spec={"tokens": PartitionSpec("data", "model"), "weight": "batch"},
        halo=1,
        prefetch=2,
        read_threads=2,
        read_timeout_s=60.0,
    )
    if state is not None:
        return DataLoader.restore(state, source, mesh=mesh, **kwargs)
    return DataLoader(source, mesh=mesh, global_batch_size=args.batch, seed=17, **kwargs)


def check_weights(loader: DataLoader, batch: dict[str, jax.Array], step: int) -> None:
    """The ``weight`` leaf names its rows: it must hold exactly the rows of ``step``."""
    ids = np.full(loader.plan.physical_batch_size, PAD, np.int64)
    ids[: loader.global_batch_size] = loader.order.batch_ids(step)
    want = np.where(ids == PAD, 0, ids).astype(np.float32)
    got = np.asarray(batch["weight"])
    if not np.array_equal(got, want) or not np.array_equal(np.asarray(batch["mask"]), ids != PAD):
        raise AssertionError(f"step {step}: wrong rows {got.tolist()}, expected {want.tolist()}")


def run_steps(loader: DataLoader, first: int, count: int, samples: list, every: int) -> None:
    iterator = iter(loader)
    for step in range(first, first + count):
        batch = next(iterator)
        check_weights(loader, batch, step)
        del batch
        if (step + 1) % every == 0:
            samples.append(sample(step + 1))


def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    make_dataset(workdir / "ds", args.rows, args.width)
    source = TensorStoreSource(workdir / "ds")
    warmup = max(200, args.steps // 10)
    with open_loader(source, mesh, args) as loader:  # warm-up: compile, allocate, start pools
        run_steps(loader, 0, warmup, [], warmup)
    baseline = settle(sample(0))
    samples: list[dict[str, int]] = [baseline]
    started = time.perf_counter()
    loader, step, restarts = open_loader(source, mesh, args), 0, 0
    while step < args.steps:
        count = min(args.restart_every, args.steps - step)
        run_steps(loader, step, count, samples, args.sample_every)
        step += count
        state = json.loads(json.dumps(loader.state()))
        loader.close()
        if step < args.steps:
            loader, restarts = open_loader(source, mesh, args, state), restarts + 1
    elapsed = time.perf_counter() - started
    final = settle(baseline)
    return summarise(args, baseline, samples, final, elapsed, restarts)


def summarise(args, baseline, samples, final, elapsed, restarts) -> dict[str, Any]:
    rss = np.array([s["rss"] for s in samples], float) / MIB
    steps = np.array([s["step"] for s in samples], float)
    slope = float(np.polyfit(steps, rss, 1)[0] * 1000) if len(samples) > 2 else 0.0
    figures = {
        "steps": args.steps,
        "batch": args.batch,
        "restarts": restarts,
        "steps_per_s": round(args.steps / elapsed, 1),
        "rss_baseline_mib": round(baseline["rss"] / MIB, 1),
        "rss_max_mib": round(float(rss.max()), 1),
        "rss_final_mib": round(final["rss"] / MIB, 1),
        "rss_growth_mib": round((final["rss"] - baseline["rss"]) / MIB, 1),
        "rss_slope_mib_per_1000_steps": round(slope, 2),
        "python_threads": [baseline["python_threads"], final["python_threads"]],
        "python_threads_max_running": max(s["python_threads"] for s in samples),
        "os_threads": [baseline["os_threads"], final["os_threads"]],
        "os_threads_max_running": max(s["os_threads"] for s in samples),
        "fds": [baseline["fds"], final["fds"]],
        "fds_max_running": max(s["fds"] for s in samples),
        "rss_bound_mib": args.rss_bound_mib,
        "samples": len(samples),
    }
    problems = []
    if figures["rss_growth_mib"] > args.rss_bound_mib:
        problems.append(f"RSS grew {figures['rss_growth_mib']} MiB > {args.rss_bound_mib} MiB")
    for key in ("python_threads", "os_threads", "fds"):
        before, after = figures[key]
        if after > before:
            problems.append(f"{key}: {before} before, {after} after the last close()")
    figures["problems"] = problems
    figures["ok"] = not problems
    return figures


def table(figures: dict[str, Any]) -> str:
    rows = [(k, v) for k, v in figures.items() if k not in ("problems",)]
    lines = ["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=6, help="global batch (6 pads to 8)")
    parser.add_argument("--rows", type=int, default=1000, help="dataset rows (epochs end short)")
    parser.add_argument("--width", type=int, default=16, help="tokens per row")
    parser.add_argument("--restart-every", type=int, default=1000)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--rss-bound-mib", type=float, default=32.0)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="psdp-soak-") as tmp:
        figures = soak(args, Path(tmp))
    print(table(figures))
    for problem in figures["problems"]:
        print(f"FAIL: {problem}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
