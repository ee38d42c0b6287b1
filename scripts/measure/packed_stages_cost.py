"""The cost of packed length stages' plan at scale: the first batch, and a restore in stage 2.

    python scripts/measure/packed_stages_cost.py [--documents 1000000] [--repeats 3] [--restore-batch 10]

One source of ``--documents`` documents, lengths drawn log-normal (seed 0, ``exp(N(6.5, 1))``
slots, about 1,100 on average), ``lanes=256``, shuffled, ``long_documents="split"``, two stages:
``seq_len`` 4,096 from offset 0, then 32,768 from offset 256 x 200 (batches of 256 rows, one row
per lane). It times `PackedLengthPlan.pieces` alone (no token is read), each on a fresh plan,
``--repeats`` times, and prints the range of each (wall and CPU seconds):

- ``first batch``: offsets ``[0, 256)`` of a fresh plan (every lane's first rows);
- ``next batch``: offsets ``[256, 512)`` of that plan;
- ``restore, re-packing``: a fresh plan's first batch at a step inside stage 2 (``--restore-batch``
  batches of 256 into it: 10 by default, 20% into epoch 0 at 10^6 documents; 1,000 is 7 epochs
  later), with no cursors given: it packs each lane from the run's start;
- ``save cursors``: `PackedLengthPlan.resume_cursors` at that offset on a plan that has read it;
- ``restore, from cursors``: a fresh plan seeded by those cursors (`seed_cursors`, which checks
  them) and its same batch (the rows checked equal to the re-packing restore's).

``docs/concepts/length-stages.md`` ("Packed sources") describes what is measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from psdp._plan.packed_stages import PackedLengthPlan

LANES, BATCH = 256, 256
STAGE_2 = 256 * 200


def plan_of(lengths: np.ndarray) -> PackedLengthPlan:
    stages = ((0, 4096, {"a": 1}), (STAGE_2, 32768, {"a": 1}))
    return PackedLengthPlan(("a",), (lengths,), stages, block_size=BATCH, lanes=LANES,
                            seed=0, long_documents="split")  # fmt: skip


class Clock:
    """Wall and CPU seconds since it started (the machine may be shared: CPU is steadier)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def took(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def once(lengths: np.ndarray, times: dict[str, list[tuple[float, float]]], restore_at: int) -> None:
    """One of each measurement, each on a fresh plan, appended to ``times``."""
    clock = Clock()
    plan = plan_of(lengths)
    times["build"].append(clock.took())
    clock = Clock()
    plan.pieces(np.arange(BATCH))
    times["first"].append(clock.took())
    clock = Clock()
    plan.pieces(np.arange(BATCH, 2 * BATCH))
    times["next"].append(clock.took())
    batch = np.arange(restore_at, restore_at + BATCH)
    fresh = plan_of(lengths)
    clock = Clock()
    expected = fresh.pieces(batch)
    times["repack"].append(clock.took())
    if not hasattr(fresh, "resume_cursors"):
        return  # psdp before cursors
    clock = Clock()
    cursors = fresh.resume_cursors(restore_at)
    times["save"].append(clock.took())
    seeded = plan_of(lengths)
    clock = Clock()
    seeded.seed_cursors(cursors, restore_at)
    got = seeded.pieces(batch)
    times["seeded"].append(clock.took())
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def span(times: list[tuple[float, float]]) -> str:
    if not times:
        return "-"
    wall, cpu = zip(*times, strict=True)
    return f"{min(wall):.3f} to {max(wall):.3f} s (CPU {min(cpu):.3f} to {max(cpu):.3f} s)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=10**6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--restore-batch", type=int, default=10)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(6.5, 1.0, args.documents).astype(np.int64))
    print(f"{args.documents} documents, {int(lengths.sum())} slots, lanes={LANES}, "
          f"seq_len 4096 then 32768 from offset {STAGE_2}, restored at offset "
          f"{STAGE_2 + BATCH * args.restore_batch}")  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in ("build", "first", "next", "repack", "save",
                                                     "seeded")}  # fmt: skip
    for _ in range(args.repeats):
        once(lengths, times, STAGE_2 + BATCH * args.restore_batch)
    print(f"plan built:             {span(times['build'])}")
    print(f"first batch:            {span(times['first'])}")
    print(f"next batch:             {span(times['next'])}")
    print(f"restore, re-packing:    {span(times['repack'])}")
    print(f"save cursors:           {span(times['save'])}")
    print(f"restore, from cursors:  {span(times['seeded'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
