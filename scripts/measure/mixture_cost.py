"""The per-sample cost of the mixture map (sample offset -> source, row) at 2, 8 and 64 sources.

    python scripts/measure/mixture_cost.py [--batch 1024] [--repeats 50]

Each row times `Mixture.locate` on batches of ``--batch`` consecutive offsets mid-way through a
3-stage schedule (offsets near 2**40, far past every stage start: the map walks no table), with
sources of 10**6 to 10**9 rows and blocks of 2048 samples, and prints the median microseconds per
sample and per batch. Before timing, it checks the batch's counts against `Mixture.counts`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from psdp import Mixture


class Rows:
    """A source of ``n`` rows that is never read (the map alone is timed)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def read(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids, np.int32)

    def describe(self) -> str:
        return f"Rows({self.n})"


def mixture_of(count: int, block: int = 2048) -> Mixture:
    rng = np.random.default_rng(count)
    names = [f"s{i}" for i in range(count)]
    sources = {name: Rows(int(rng.integers(10**6, 10**9))) for name in names}
    stages = []
    for index, start in enumerate((0, 1 << 30, 1 << 35)):
        weights = rng.uniform(1, 3, count)
        weights[index % count] *= 4  # a different source leads each stage
        stages.append((start, dict(zip(names, weights.tolist(), strict=True))))
    return Mixture(sources, stages=stages, block_size=block, seed=1)


def cost(count: int, batch: int, repeats: int) -> tuple[float, float]:
    """Median µs per batch of ``batch`` offsets, and per sample."""
    mix = mixture_of(count)
    start = (1 << 40) + 12345
    ids = start + np.arange(batch, dtype=np.int64)
    source, _ = mix.locate(ids)
    got = np.bincount(source, minlength=count)
    assert got.tolist() == list(mix.counts(start, batch).values())
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        mix.locate(ids)
        times.append(time.perf_counter() - began)
    per_batch = statistics.median(times) * 1e6
    return per_batch, per_batch / batch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    print(f"mixture map, batches of {args.batch} offsets near 2**40, 3 stages, blocks of 2048")
    print("  sources   µs/batch   µs/sample")
    for count in (2, 8, 64):
        per_batch, per_sample = cost(count, args.batch, args.repeats)
        print(f"  {count:7d}   {per_batch:8.0f}   {per_sample:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
