"""Loader time per batch against the naive loop, measured in one run on the same machine.

The naive loop is what a user writes without psdp: fancy-index the global batch out of the full
array, then ``jax.device_put(batch, sharding)``. psdp's loader does the same work per step (one
batched read, one global array per leaf) but on a background thread, and on a real pod each host
would read only its own rows. Both see the same source, batch, shuffle and mesh (data=4 x model=2
on 8 fake CPU devices unless --mesh says otherwise). The figure that matters is the ratio.

    python scripts/bench_loader.py                  # B=128 x 2048 int32, 200 steps, train 0 and 2 ms
    python scripts/bench_loader.py --rows 512 --steps 20 --json out.json

With no train work both loops do the same per-step work, so the ratio shows the loader's overhead;
with a train step the loader's background thread hides the read and assembly behind it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from psdp import DataLoader
from psdp._plan.order import GlobalOrder
from psdp.sources import ArraySource
from psdp.tools.benchmarks.common import int32_table, train_step
from psdp.tools.benchmarks.throughput import naive_loop


def timed_naive_loop(
    data: np.ndarray, order: GlobalOrder, sharding: NamedSharding, steps: int, train_s: float
) -> float:
    """Seconds per step of the benchmark's naive loop (fancy index + device_put) over ``data``."""
    started = time.perf_counter()
    naive_loop(ArraySource(data), order, sharding, steps, train_s)
    return (time.perf_counter() - started) / steps


def psdp_loop(loader: DataLoader, steps: int, train_s: float) -> float:
    it = iter(loader)
    next(it).block_until_ready()  # thread start-up is not per-batch cost
    started = time.perf_counter()
    for _ in range(steps):
        next(it).block_until_ready()
        train_step(train_s)
    elapsed = time.perf_counter() - started
    it.close()
    return elapsed / steps


def run(
    rows: int,
    width: int,
    batch: int,
    steps: int,
    repeats: int,
    prefetch: int,
    train_costs_ms: list[float],
) -> dict:
    mesh = Mesh(np.array(jax.devices()).reshape(4, -1), ("data", "model"))
    data = int32_table(rows, width)
    loader = DataLoader(data, mesh=mesh, global_batch_size=batch, seed=1, prefetch=prefetch)
    sharding = NamedSharding(mesh, loader.batch_spec)
    order = loader.order
    assert order is not None, "an array source has a global order"
    # same order, and the same rows on the first step, before timing anything
    np.testing.assert_array_equal(
        np.asarray(loader.batch_at(0)),
        np.asarray(jax.device_put(data[order.batch_ids(0)], sharding)),
    )
    result: dict = {
        "batch": [batch, width],
        "dtype": "int32",
        "batch_mib": batch * width * 4 / 2**20,
        "mesh": dict(mesh.shape),
        "steps": steps,
        "repeats": repeats,
        "cases": [],
    }
    for train_ms in train_costs_ms:
        naive, ours = [], []
        for _ in range(repeats):  # interleaved, so drift hits both alike
            naive.append(timed_naive_loop(data, order, sharding, steps, train_ms / 1e3))
            ours.append(psdp_loop(loader, steps, train_ms / 1e3))
        case = {
            "train_ms": train_ms,
            "naive_ms": statistics.median(naive) * 1e3,
            "psdp_ms": statistics.median(ours) * 1e3,
        }
        case["speedup_vs_naive"] = case["naive_ms"] / case["psdp_ms"]
        result["cases"].append(case)
    loader.close()
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192, help="source rows")
    parser.add_argument("--width", type=int, default=2048, help="int32 columns per row")
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each loop")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument(
        "--train-ms", type=float, nargs="+", default=[0.0, 2.0], help="simulated train step costs"
    )
    parser.add_argument("--json", help="also write the figures here")
    opts = parser.parse_args(argv)
    result = run(
        opts.rows, opts.width, opts.batch, opts.steps, opts.repeats, opts.prefetch, opts.train_ms
    )
    print(
        f"ms per step, {opts.batch} x {opts.width} int32 batches ({result['batch_mib']:.1f} MiB), "
        f"shuffled, 8 fake CPU devices data=4 x model=2, median of {opts.repeats} runs of "
        f"{opts.steps} steps, {os.cpu_count()} CPU cores\n"
    )
    print("| train step | naive: fancy index + device_put | psdp DataLoader | speedup |")
    print("|---|---|---|---|")
    for case in result["cases"]:
        print(
            f"| {case['train_ms']:g} ms | {case['naive_ms']:.3f} | {case['psdp_ms']:.3f} | "
            f"{case['speedup_vs_naive']:.2f}x |"
        )
    if opts.json:
        with open(opts.json, "w") as out:
            json.dump(result, out, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
