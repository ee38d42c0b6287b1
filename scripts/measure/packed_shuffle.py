"""A shuffled loader over packing in windows at 10^9 documents: time a step and count the window
plans it makes, with the loader's default (blocks of about a window's sequences,
`PackedSequences.io_block`) against a row-level shuffle (``io_block=1``), in interleaved rounds
(``docs/measurements/packing.md``, "Shuffle in blocks"; the rule: ``docs/guides/packing.md``).

The corpus is tests/test_packing.py's scale simulation (`FormulaCorpus`: 10^9 documents,
1.2 x 10^12 tokens, never written; windows of 4096 documents; the pack index given), read on 8
fake CPU devices, ``P("data")``, 64 sequences of 1024 a step, seed 0; the first step of each
loader is checked against the formula's oracle.

Run: ``python scripts/measure/packed_shuffle.py [--steps 10] [--rounds 3]`` (about a minute).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests.test_packing

from psdp.tools.benchmarks.common import DEVICES, ask_for_cpu_devices, cpu_mesh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    ask_for_cpu_devices(DEVICES)
    import numpy as np
    from jax.sharding import PartitionSpec
    from tests.test_packing import SCALE, FormulaStore, formula_pack_index, scale_rows

    from psdp import DataLoader, PackedSequences
    from psdp.sources.views import packed as packed_module

    planned: list[int] = []
    plan_of_window = packed_module.plan_of_window
    packed_module.plan_of_window = lambda *a: planned.append(1) or plan_of_window(*a)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as directory:
        corpus, path, bins_full, bins_last = formula_pack_index(directory, 10**9)
        mesh = cpu_mesh((4, 2), ("data", "model"))
        modes = {
            "default (io_block from the source)": {},
            "io_block=1 (row-level)": {"io_block": 1},
        }
        loaders, steps = {}, {}
        for mode, extra in modes.items():
            # a source each: each keeps its own cache of window plans
            source = PackedSequences(FormulaStore(corpus), SCALE["seq_len"], window=SCALE["window"],
                                     index=path, pad_id=-1)  # fmt: skip
            loader = DataLoader(source, mesh=mesh, global_batch_size=SCALE["batch"], seed=0,
                                batch_spec=PartitionSpec("data"), **extra)  # fmt: skip
            ids = np.sort(loader.order.batch_ids(0))
            want = scale_rows(corpus, bins_full, bins_last, ids)["input_ids"]
            assert np.array_equal(np.asarray(loader.batch_at(0)["input_ids"]), want), mode
            loaders[mode], steps[mode] = loader, iter(range(1, 10**9))
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        plans: dict[str, list[int]] = {mode: [] for mode in modes}
        for turn in range(args.rounds):
            for mode in list(modes)[turn % 2 :] + list(modes)[: turn % 2]:
                planned.clear()
                start = time.perf_counter()
                for _ in range(args.steps):
                    loaders[mode].batch_at(next(steps[mode]))
                times[mode].append((time.perf_counter() - start) / args.steps * 1e3)
                plans[mode].append(len(planned))
        print("| shuffle | io_block | ms a step (median, range) | window plans a step |")
        print("|---|---:|---:|---:|")
        for mode, loader in loaders.items():
            block = loader.state()["io_block"]
            t = times[mode]
            per_step = sum(plans[mode]) / (args.rounds * args.steps)
            print(f"| {mode} | {block} | {statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f}) "
                  f"| {per_step:.1f} |")  # fmt: skip
            loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
