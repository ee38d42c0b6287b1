"""What a finite (eval) loader costs beyond an endless one (``docs/guides/evaluate.md``, "Finite loaders").

    python scripts/measure/eval_cost.py [--rows 20000] [--width 512] [--batch 256] [--repeats 5]

Prints (1) the median time of `StepOffsets.end_step` (where ``len(loader)`` comes from: a
bisection over steps) for 10**6 and 10**9 rows at a constant batch of 256, and for 10**6 rows under
scripts/measure/offsets_cost.py's 2,000 stages with 5,000 step and 5,000 offset skips; (2) the wall time of
one eval pass over ``--rows`` rows of ``--width`` int32 tokens on 8 fake CPU devices
(``data=4 x model=2``), against the same number of steps of an endless unshuffled loader over the
same rows (medians of ``--repeats``, interleaved; each pass starts a new iterator).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")  # before jax is imported

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).parent))
import offsets_cost

import psdp
from psdp._plan.offsets import StepOffsets


def end_step_us(offsets: StepOffsets, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        offsets.end_step(1)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def pass_s(loader: psdp.DataLoader, steps: int) -> float:
    """Seconds for ``steps`` batches of a new iterator (fewer if it ends), closed at the end: an
    endless iterator left open would go on prefetching during the next measurement."""
    started = time.perf_counter()
    it = iter(loader)
    for _, batch in zip(range(steps), it, strict=False):
        batch["tokens"].block_until_ready()
    it.close()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cases = {
        "10**6 rows, B=256": StepOffsets.create(10**6, 256),
        "10**9 rows, B=256": StepOffsets.create(10**9, 256),
        "10**6 rows, 2000 stages, 5000+5000 skips": StepOffsets.create(
            **offsets_cost.arguments(2000, 5000)
        ),
    }
    for name, offsets in cases.items():
        print(f"end_step {name}: {end_step_us(offsets, args.repeats):.0f} us")

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    tokens = np.arange(args.rows * args.width, dtype=np.int32).reshape(args.rows, args.width)
    data = {"tokens": tokens}
    settings = dict(mesh=mesh, global_batch_size=args.batch)
    finite = psdp.eval_loader(data, **settings)
    endless = psdp.DataLoader(data, shuffle=False, **settings)
    steps = len(finite)
    times: dict[str, list[float]] = {"eval pass": [], "endless, same steps": []}
    with finite, endless:
        for _ in range(args.repeats):
            times["eval pass"].append(pass_s(finite, steps + 1))  # runs to its StopIteration
            times["endless, same steps"].append(pass_s(endless, steps))
    medians = {k: statistics.median(v) for k, v in times.items()}
    for name, seconds in medians.items():
        print(
            f"{name}: {steps} steps in {seconds * 1e3:.1f} ms ({seconds / steps * 1e3:.2f} ms/step)"
        )
    ratio = medians["eval pass"] / medians["endless, same steps"]
    print(f"eval / endless: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
