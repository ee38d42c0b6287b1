"""Where a step of figure 8's token jobs goes: CPU milliseconds a step of psdp (memmap store,
`DataLoader.batch_at` on the calling thread: no prefetch thread to hide or share work) against
the tight loop of the same job (``docs/measurements/token-path.md``, "The token path"), and
psdp on the same documents in the zarr3 store `write_documents` writes (its ratio to the memmap
store: "Local stores"), in interleaved rounds.

CPU time (``time.process_time``), not wall time, so that other work on a shared machine moves the
figures less; psdp's read and assembly medians come from its own telemetry (`DataLoader.stats`).
The corpus and loops are figure 8's (`psdp.tools.benchmarks.tokens`, full sizes): 200,000
documents (+ 100,000 for the mixture), 64 rows of 2048 a step, ``data=4 x model=2``; every loop
is checked on its first batches before timing. The real-token ratio of the packed job counts
each loop's packing efficiency, as figure 8 does.

A local zarr3 store checks each chunk's crc32c the first time a read touches it; the last
column counts those checks a timed step. ``--fresh`` opens the zarr3 loader anew before each
round (outside the timing) and never repeats a step, so each round's steps meet unchecked
chunks, as a run that touches each chunk about once does; without it, the zarr3 loop's steps
continue from those its check read.

Run: ``python scripts/measure/token_profile.py [--rounds 7] [--steps 40] [--fresh]`` (about a
minute; ``--fresh`` a few more).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from psdp.tools.benchmarks.common import DEVICES, FULL, ask_for_cpu_devices, cpu_mesh


def cpu_ms(step: Callable[[], Any], steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        step()
    return (time.process_time() - start) / steps * 1e3


class CountingCrc:
    """google_crc32c, counting the checks of a whole chunk (4096 int32 tokens, or 8-byte
    offsets: 16 or 32 KiB; a shard index is smaller)."""

    def __init__(self, real: Any):
        self.real, self.chunks = real, 0

    def value(self, data: Any) -> int:
        self.chunks += len(data) >= 16 << 10
        return int(self.real.value(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fresh", action="store_true", help="a new zarr3 loader each round")
    args = parser.parse_args(argv)
    ask_for_cpu_devices(DEVICES)
    from psdp.sources.documents import mapped
    from psdp.tools.benchmarks import tokens  # after the device count is set

    checks = CountingCrc(mapped.google_crc32c)
    mapped.google_crc32c = checks  # type: ignore[assignment]  # counts the chunks checked

    mesh = cpu_mesh((4, 2), ("data", "model"))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        lengths = tokens.document_lengths(
            FULL.token_documents, FULL.token_mean_length, FULL.token_seq_len, seed=0
        )
        first = tokens.write_corpus(workdir / "a", lengths, base=1)
        second_lengths = tokens.document_lengths(
            FULL.token_documents // 2, FULL.token_mean_length, FULL.token_seq_len, seed=1
        )
        second = tokens.write_corpus(workdir / "b", second_lengths, 1 + int(first.offsets[-1]))
        print("| job | tight loop, CPU ms a step | psdp batch_at | of which read | assemble "
              "| psdp / tight (real tokens/s) | psdp on zarr3, CPU ms | zarr3 / memmap "
              "| chunks checked a zarr3 step |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for job in tokens.JOBS:
            loops = tokens.loops(job, FULL, mesh, (first, second), None, stack)
            (open_tight, check_tight), (open_psdp, check_psdp) = (
                loops[tokens.TIGHT],
                loops[tokens.PSDP_MEMMAP],
            )
            open_zarr, check_zarr = loops[tokens.PSDP_ZARR]
            tight: Iterator[Any] = open_tight()
            stack.callback(tight.close)  # type: ignore[attr-defined]
            loader = open_psdp.args[0]  # type: ignore[attr-defined]  # psdp_batches(loader)
            zarr = open_zarr.args[0]  # type: ignore[attr-defined]
            checked = range(tokens.CHECKED_STEPS)  # every loop checked before timing
            efficiency = {
                tokens.TIGHT: check_tight([next(tight) for _ in checked]),
                "psdp": check_psdp([loader.batch_at(step) for step in checked]),
                "zarr": check_zarr([zarr.batch_at(step) for step in checked]),
            }
            times: dict[str, list[float]] = {tokens.TIGHT: [], "psdp": [], "zarr": []}
            steps = iter(range(10**9))
            zarr_steps = iter(range(tokens.CHECKED_STEPS if args.fresh else 0, 10**9))
            current = [zarr]  # the zarr3 loader the next round times
            runs = {
                tokens.TIGHT: lambda tight=tight: next(tight),
                "psdp": lambda loader=loader, steps=steps: loader.batch_at(next(steps)),
                "zarr": lambda current=current, steps=zarr_steps: current[0].batch_at(next(steps)),
            }
            checked_chunks = 0
            rounds = stack.enter_context(ExitStack())  # the loaders of --fresh's current round
            for turn in range(args.rounds):  # interleaved, the order rotating
                for name in list(runs)[turn % 3 :] + list(runs)[: turn % 3]:
                    if name == "zarr" and args.fresh:  # a new store: no chunk checked yet
                        rounds.close()  # the last round's loaders (memory)
                        fresh = tokens.loops(job, FULL, mesh, (first, second), None, rounds)
                        current[0] = fresh[tokens.PSDP_ZARR][0].args[0]  # type: ignore[attr-defined]
                    before = checks.chunks
                    times[name].append(cpu_ms(runs[name], args.steps))
                    if name == "zarr":
                        checked_chunks += checks.chunks - before
            stats = loader.stats()
            mine, theirs = statistics.median(times["psdp"]), statistics.median(times[tokens.TIGHT])
            ratio = theirs / mine * efficiency["psdp"] / efficiency[tokens.TIGHT]
            stored = statistics.median(times["zarr"])
            print(f"| {job.name} | {theirs:.3f} | {mine:.3f} | {stats.read_ms_p50:.3f} | "
                  f"{stats.assemble_ms_p50:.3f} | {ratio:.2f} | {stored:.3f} | "
                  f"{mine / stored:.2f} | {checked_chunks / (args.rounds * args.steps):.0f} |")  # fmt: skip
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
