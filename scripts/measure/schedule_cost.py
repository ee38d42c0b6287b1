"""Start-up and per-step cost of a `Mixture` under a schedule, over (sources, stages, skips).

    python scripts/measure/schedule_cost.py [--sources 10 100 1000 10000] [--stages 1 100 2000]
        [--skips 0 250 499 5000] [--steps 20] [--max-weights 2500000]

For each combination it builds what a loader builds for a mixture (the `Mixture` with
``--stages`` weight stages, and the order's feed with as many batch-size stages plus ``--skips``
``skip_steps`` and as many ``skip_offsets`` ranges), then times one step's host work (its
`step_info`, its ids and the mixture's read of them) at ``--steps`` steps drawn with seed 0 from
the whole run, median. The sources are never read (each returns its row ids), so the map and the
bookkeeping are timed, not storage. Before timing it checks every step's sources against
`Mixture.counts`. Combinations with more than ``--max-weights`` stage weights (stages x sources)
are left out: their input alone is that many Python floats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from psdp import Mixture, OrderOptions
from psdp._runtime.feeds import RandomAccessFeed

STEPS_PER_STAGE = 10  # a batch-size stage every 10 steps, as scripts/measure/offsets_cost.py
BATCHES = (64, 96, 128, 160)


class Rows:
    """A source of ``n`` rows that is never read: a row is its id (the map alone is timed)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def read(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids, np.int64)

    def describe(self) -> str:
        return f"Rows({self.n})"


def mixture(sources: int, stages: int) -> Mixture:
    """``sources`` sources of 10**6 to 10**9 rows; ``stages`` weight stages, one every 8 blocks,
    each with its own weights (a different source leads each)."""
    rng = np.random.default_rng(sources)
    names = [f"s{i}" for i in range(sources)]
    rows = {
        name: Rows(int(n))
        for name, n in zip(names, rng.integers(10**6, 10**9, sources), strict=True)
    }
    block = max(2048, 4 * sources)  # every source's share rounds to >= 1 sample a block
    weights = rng.uniform(1, 3, (stages, sources))
    weights[np.arange(stages), np.arange(stages) % sources] *= 4
    schedule = [
        (8 * block * i, dict(zip(names, w.tolist(), strict=True))) for i, w in enumerate(weights)
    ]
    return Mixture(rows, stages=schedule, block_size=block, seed=1)


def order(stages: int, skips: int) -> OrderOptions:
    """A batch-size stage every 10 steps; ``skips`` skip_steps and ``skips`` skip_offsets."""
    schedule = [(STEPS_PER_STAGE * i, BATCHES[i % 4]) for i in range(stages)]
    steps = STEPS_PER_STAGE * stages
    gap = max(3, steps // max(skips, 1))
    skip_steps = [(gap * j + 1, gap * j + 3) for j in range(skips)]
    skip_offsets = [(10_007 + 997 * j, 10_007 + 997 * j + 5) for j in range(skips)]
    return OrderOptions(
        global_batch_size=schedule, skip_steps=skip_steps, skip_offsets=skip_offsets
    )


def measure(mix: Mixture, stages: int, skips: int, steps: int) -> dict[str, float]:
    """The order's build time and the median step time, ``mix`` under ``stages`` batch-size
    stages and ``skips`` skips of each kind."""
    sources = len(mix.names)
    built = time.perf_counter()
    feed = RandomAccessFeed(mix, order(stages, skips))
    done = time.perf_counter()
    last = STEPS_PER_STAGE * stages + skips * 2
    picks = np.random.default_rng(0).integers(0, last + 100, steps).tolist()
    times = []
    for step in picks:
        start = time.perf_counter()
        info = feed.step_info(step)
        ids = np.arange(info.offset, info.offset + info.rows, dtype=np.int64)
        got = mix.read(ids)
        times.append(time.perf_counter() - start)
        source, _ = mix.locate(ids)
        counts = np.bincount(source, minlength=sources).tolist()
        assert counts == list(mix.counts(info.offset, info.rows).values()), step
        assert got.shape == (info.rows,)
    return {
        "order_s": done - built,
        "step_ms": statistics.median(times) * 1e3,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 100, 2000])
    parser.add_argument("--skips", type=int, nargs="+", default=[0, 250, 499, 5000])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-weights", type=int, default=2_500_000)
    args = parser.parse_args(argv)
    print("sources  stages  mixture s   skips   order s   step ms")
    for sources in args.sources:
        for stages in args.stages:
            if sources * stages > args.max_weights:
                print(f"{sources:7d} {stages:7d}   (left out: {sources * stages} weights)")
                continue
            began = time.perf_counter()
            mix = mixture(sources, stages)
            built = f"{time.perf_counter() - began:9.3f}"
            for skips in args.skips:
                got = measure(mix, stages, skips, args.steps)
                print(
                    f"{sources:7d} {stages:7d}   {built}  {skips:6d} "
                    f"{got['order_s']:9.3f} {got['step_ms']:9.2f}",
                    flush=True,
                )
                built = " " * 9
    return 0


if __name__ == "__main__":
    sys.exit(main())
