"""The cost of the order's step -> offset map under many stages and many skips.

    python scripts/measure/offsets_cost.py [--stages 2000] [--skips 250 499 5000] [--lookups 200]

Builds `StepOffsets` for a source of 10**6 rows with a stage every 10 steps (batch sizes 64 to
160 in turn) and ``--skips`` ranges of ``skip_steps`` (2 steps each, spread over the stages' steps)
plus as many ``skip_offsets`` ranges, then prints, per skip count: the median build time (of 3), the median time
of a step lookup (`StepOffsets.info` at ``--lookups`` steps drawn with seed 0 from the whole run,
and one far beyond it), of `resume_offset` at a skip's first step, and of `cuts_short`
(``docs/concepts/order-and-resume.md``, "Offsets, schedules and skips", gives the costs this measures;
``docs/measurements/scale.md``, "Mixtures and schedules", quotes its figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from psdp._plan.offsets import StepOffsets

ROWS = 10**6


def arguments(stages: int, skips: int) -> dict[str, object]:
    """A stage every 10 steps; ``skips`` step skips and ``skips`` offset skips, evenly spread."""
    schedule = [(10 * i, 64 + 32 * (i % 4)) for i in range(stages)]
    gap = max(3, 10 * stages // max(skips, 1))
    skip_steps = [(gap * j + 1, gap * j + 3) for j in range(skips)]
    skip_offsets = [(ROWS // 7 + 997 * j, ROWS // 7 + 997 * j + 5) for j in range(skips)]
    return dict(
        num_rows=ROWS, batch_size=schedule, skip_steps=skip_steps, skip_offsets=skip_offsets
    )


def median_us(calls: list, repeats: int = 1) -> float:
    times = []
    for call in calls:
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def measure(stages: int, skips: int, lookups: int) -> None:
    kwargs = arguments(stages, skips)
    build = median_us([lambda: StepOffsets.create(**kwargs)], repeats=3) / 1e6  # type: ignore[arg-type]
    offsets = StepOffsets.create(**kwargs)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    steps = [int(s) for s in rng.integers(0, 10 * stages + 100, lookups)] + [10**15]
    info = median_us([lambda s=s: offsets.info(s) for s in steps])
    skip_first = kwargs["skip_steps"][len(kwargs["skip_steps"]) // 2][0] if skips else 0  # type: ignore[index]
    resume = median_us([lambda: offsets.resume_offset(skip_first)], repeats=3)
    short = median_us([offsets.cuts_short], repeats=3)
    print(
        f"{stages:>6} stages x {skips:>5} skip_steps (+{skips} skip_offsets): "
        f"build {build:8.3f} s, info {info:9.1f} us, resume_offset {resume / 1e3:9.2f} ms, "
        f"cuts_short {short / 1e3:9.2f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2000)
    parser.add_argument("--skips", type=int, nargs="+", default=[250, 499, 5000])
    parser.add_argument("--lookups", type=int, default=200)
    args = parser.parse_args(argv)
    for skips in args.skips:
        measure(args.stages, skips, args.lookups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
