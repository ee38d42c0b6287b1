"""TokenSequences at real size and memory speed: two tables for docs/measurements/tokens.md.

1. Time per step from 10^6 to 10^9 documents: corpora never written (tests/scale_corpus.py, the
   same formula at every size, offsets and tokens computed on the fly), opened with the index
   write_documents would record; each step reads ``BATCH`` random rows of ``SEQ_LEN`` tokens
   with ``segment_ids`` and ``positions``, the offsets served two ways (`OFFSETS`: gathered in
   place, as a memmap's, and read by range only, as a remote store's), with the offsets a step
   reads. The corpus formula's own time (computing the offsets and tokens read) is measured
   apart: psdp's own is the rest.
2. A `Mixture` of 100 such corpora of 10^9 documents each (tests/test_scale_mixture.py's
   simulation, in a child process: its peak memory is the measure): open plus the first batch,
   and the resident memory that adds, every token checked against the formula.
3. ``TokenSequences.read`` against a tight numpy loop over the same in-memory corpus (200,000
   documents of log-normal lengths, mean ~300, int32 ids): the loop gathers whole rows of a
   reshape of the flat array and computes ``segment_ids`` and ``positions`` per row (one
   ``searchsorted`` of each row's ends, then ``np.repeat``), as docs/measurements/performance.md's tight
   loop does. Both are checked equal first, then timed in interleaved rounds.

Then the goals' table of issue 29 this script measures, each with the value reached and met /
not met (`goal_rows`): open + first batch <= 5 s and memory added <= 1 GiB at 10^9 documents
(`TokenSequences` here; `PackedSequences` in windows of 4096 with its pack index, in a process
of its own: tests/test_packing.py's ``scale_simulation``), psdp's own time per step at 10^9 over
10^6 documents <= 1.1 (median and range of the rounds' ratios), and best fit in windows of 4096
>= 0.99 of whole-corpus best fit (scripts/measure/packing_efficiency.py's ``measure``).

Times are the process's CPU time (the machine may be shared), medians and ranges over rounds.
glibc's allocator is told not to return freed memory to the system (``mallopt``): otherwise
every large temporary is paged in afresh, which slowed the tight loop (many such temporaries)
about 6x on this machine and made the comparison say more about the allocator than the loops.

Run: ``python scripts/measure/scale_tokens.py`` (about a minute; ``--mixture`` for table 2 alone).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests.scale_corpus

from tests.scale_corpus import LazyArray, ScaleCorpus

from psdp.sources import DocumentIndex, DocumentStore, TokenSequences
from psdp.sources.documents.index import STRIDE
from psdp.tools.benchmarks.token_loops import row_segments  # the user's loop of figure 8

SEQ_LEN, BATCH, STEPS, ROUNDS = 2048, 64, 20, 7
SIZES = (10**6, 10**7, 10**9)  # documents
#: Packing goal: windows of this many documents, over this many drawn lengths per distribution.
PACK_WINDOW, PACK_DOCUMENTS = 4096, 200_000


def keep_freed_memory() -> None:
    """glibc only: freed memory stays in the process (no trimming, no fresh mappings)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD: its maximum, 32 MiB


def cpu_seconds(run: Callable[[], object], repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        run()
    return (time.process_time() - start) / repeats


def summary(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.3f} ms ({min(values) * 1e3:.3f}-{max(values) * 1e3:.3f})"


class Timed:
    """A flat array that adds the CPU time of its reads (the formula's work) to ``spent`` and
    counts the values read."""

    def __init__(self, array: LazyArray, spent: list[float]):
        self.array, self.shape, self.dtype, self.spent = array, array.shape, array.dtype, spent
        self.values = 0

    def __getitem__(self, where: slice) -> np.ndarray:
        return self._timed(lambda: self.array[where])

    def _timed(self, read: Callable[[], np.ndarray]) -> np.ndarray:
        start = time.process_time()
        values = read()
        self.spent[0] += time.process_time() - start
        self.values += len(values)
        return values


class TimedGather(Timed):
    """`Timed` over offsets that also gather (``take``): searched in place, as a memmap's."""

    def take(self, where: np.ndarray) -> np.ndarray:
        return self._timed(lambda: self.array.take(where))


#: How each corpus's offsets are served: gathered in place (a memory-mapped file's), or read by
#: range only (a remote store's, or any `FlatArray` without ``take``).
OFFSETS = {"in place": TimedGather, "by range": Timed}


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def scale_table() -> dict[str, Any]:
    """Every size opens side by side, its offsets served both ways (`OFFSETS`), then all are
    timed in interleaved rounds (a load change on a shared machine then falls on all). Returns,
    per size, the open + first batch time and the memory it added (offsets in place), and per
    (size, offsets, eos_id) psdp's own time per step in each round."""
    Key = tuple[int, str, int | None]
    loops: dict[Key, Any] = {}
    opened, first = {}, {}
    for documents in SIZES:
        corpus = ScaleCorpus(documents=documents)
        for mode, timed in OFFSETS.items():
            spent = [0.0]
            rss = rss_bytes()
            start = time.perf_counter()
            marks, nonempty = corpus.marks(STRIDE)
            index = DocumentIndex(documents, STRIDE, marks, nonempty, 2 * corpus.length - 1)
            offsets = timed(corpus.offsets_array(gather=True), spent)
            tokens = Timed(corpus.tokens_array(), spent)
            store = DocumentStore.from_arrays(offsets, {"input_ids": tokens}, index=index)
            opened.setdefault(documents, (time.perf_counter() - start, store.num_tokens))
            TokenSequences(store, SEQ_LEN).read(np.arange(BATCH))
            first.setdefault(documents, (time.perf_counter() - start, rss_bytes() - rss))
            for eos_id in (None, 0):
                rows = TokenSequences(store, SEQ_LEN, eos_id=eos_id)
                batches = [
                    np.random.default_rng(step).choice(len(rows), BATCH, replace=False)
                    for step in range(STEPS)
                ]
                loops[(documents, mode, eos_id)] = rows, batches, spent, offsets
    totals: dict[Key, list[float]] = {key: [] for key in loops}
    formula: dict[Key, list[float]] = {key: [] for key in loops}
    read: dict[Key, float] = {}  # offsets read per step (the last round)
    for _ in range(ROUNDS):
        for key, (rows, batches, spent, offsets) in loops.items():
            spent[0], offsets.values = 0.0, 0
            start = time.process_time()
            for ids in batches:
                rows.read(ids)
            totals[key].append((time.process_time() - start) / STEPS)
            formula[key].append(spent[0] / STEPS)
            read[key] = offsets.values / STEPS
    print(
        "| documents | tokens | open (index given) | offsets | eos_id | per step (CPU) | of which "
        "the corpus formula | psdp's own | offsets read a step |"
    )
    print("|---:|---:|---:|---|---|---:|---:|---:|---:|")
    own = {}
    for (documents, mode, eos_id), values in totals.items():
        key = (documents, mode, eos_id)
        mine = [t - f for t, f in zip(values, formula[key], strict=True)]
        own[key] = mine
        seconds, tokens = opened[documents]
        print(
            f"| {documents:.0e} | {tokens:.2e} | {seconds * 1e3:.1f} ms | {mode} | {eos_id} | "
            f"{summary(values)} | {summary(formula[key])} | {summary(mine)} | {read[key]:,.0f} |"
        )
    for mode in OFFSETS:
        for eos_id in (None, 0):
            for small in SIZES[:-1]:
                ratios = [
                    a / b
                    for a, b in zip(
                        own[(SIZES[-1], mode, eos_id)], own[(small, mode, eos_id)], strict=True
                    )
                ]
                print(
                    f"psdp's own time per step, {SIZES[-1]:.0e} / {small:.0e} documents, offsets "
                    f"{mode}, eos_id={eos_id}: {statistics.median(ratios):.2f} "
                    f"({min(ratios):.2f}-{max(ratios):.2f})"
                )
    # by range, a step reads each row's block of the index (STRIDE documents) once, however
    # many rows share it: at 10^6 documents rows of a step share blocks more often, so it reads
    # fewer offsets; in place, each row's search reads ~log2(STRIDE) offsets at any size
    return {"first_batch": first, "own": own}


def packed_at_scale() -> dict[str, Any]:
    """tests/test_packing.py's 10^9-document packing simulation, in a process of its own (its
    memory is the process's): open with the pack index + first batch, memory added."""
    root = Path(__file__).resolve().parents[2]
    child = (
        "import json, sys; from tests.test_packing import scale_simulation; "
        "print(json.dumps(scale_simulation(sys.argv[1])))"
    )
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run(
            [sys.executable, "-c", child, directory],
            capture_output=True, text=True, check=True, cwd=root,
            env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
        )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def packing_efficiency() -> dict[str, float]:
    """Best fit in windows of `PACK_WINDOW` over whole-corpus best fit, per distribution of
    scripts/measure/packing_efficiency.py (`PACK_DOCUMENTS` lengths, seed 0)."""
    script = runpy.run_path(str(Path(__file__).with_name("packing_efficiency.py")))
    ratios = {}
    for name, draw in script["DISTRIBUTIONS"].items():
        lengths = draw(np.random.default_rng(0), PACK_DOCUMENTS).astype(np.int64)
        rows = script["measure"](lengths, SEQ_LEN, [PACK_WINDOW])
        ratios[name] = next(r["vs_best_fit"] for r in rows if r["window"] == PACK_WINDOW)
    return ratios


def goal_rows(
    scale: dict[str, Any],
    packed: dict[str, Any],
    efficiency: dict[str, float],
    mixture: dict[str, Any] | None = None,
) -> list[tuple[str, str, str, bool]]:
    """The goals' table: ``(goal, target, reached, met)`` per goal this script measures
    (`mixture_row`'s too, when given).

    Example:
        >>> scale = {"first_batch": {10**9: (0.02, 30 << 20)},
        ...          "own": {(10**6, "in place", None): [1.0, 1.0],
        ...                  (10**9, "in place", None): [1.05, 1.2]}}
        >>> packed = {"open_and_first_batch_s": 0.03, "rss_added_bytes": 40 << 20}
        >>> for row in goal_rows(scale, packed, {"chat": 0.9975}):
        ...     print(row)
        ('TokenSequences, 10^9 documents: open + first batch', '<= 5 s', '0.020 s', True)
        ('TokenSequences, 10^9 documents: memory added', '<= 1 GiB', '30 MiB', True)
        ('PackedSequences (windows, pack index), 10^9 documents: open + first batch', '<= 5 s', '0.030 s', True)
        ('PackedSequences (windows, pack index), 10^9 documents: peak memory added (its reads and oracle)', '<= 1 GiB', '40 MiB', True)
        ('time per step, 10^9 / 10^6 documents, offsets in place, eos_id=None', '<= 1.1', '1.12 (1.05-1.2)', False)
        ('packing efficiency in windows of 4096 / whole-corpus best fit, chat', '>= 0.99', '0.9975', True)
    """
    largest, smallest = max(scale["first_batch"]), min(size for size, _, _ in scale["own"])
    seconds, added = scale["first_batch"][largest]
    big = f"10^{len(str(largest)) - 1} documents"
    packs = "PackedSequences (windows, pack index), 10^9 documents"
    rows = [
        (f"TokenSequences, {big}: open + first batch", "<= 5 s", f"{seconds:.3f} s", seconds <= 5),
        (f"TokenSequences, {big}: memory added", "<= 1 GiB", f"{added >> 20} MiB", added <= 2**30),
        (f"{packs}: open + first batch", "<= 5 s", f"{packed['open_and_first_batch_s']:.3f} s",
         packed["open_and_first_batch_s"] <= 5),
        (f"{packs}: peak memory added (its reads and oracle)", "<= 1 GiB", f"{packed['rss_added_bytes'] >> 20} MiB",
         packed["rss_added_bytes"] <= 2**30),
    ]  # fmt: skip
    if mixture is not None:
        mixed = f"Mixture of {mixture['sources']} TokenSequences of 10^9 documents"
        seconds, added = mixture["open_and_first_batch_s"], mixture["rss_added_bytes"]
        rows += [
            (f"{mixed}: open + first batch", "<= 5 s", f"{seconds:.3f} s", seconds <= 5),
            (f"{mixed}: peak memory added", "<= 1 GiB", f"{added >> 20} MiB", added <= 2**30),
        ]
    for (size, mode, eos_id), values in scale["own"].items():
        if size != largest:
            continue
        smaller = scale["own"][(smallest, mode, eos_id)]
        ratios = [a / b for a, b in zip(values, smaller, strict=True)]
        median = statistics.median(ratios)
        rows.append((
            f"time per step, {big.split()[0]} / 10^{len(str(smallest)) - 1} documents, "
            f"offsets {mode}, eos_id={eos_id}", "<= 1.1", f"{median:.3g} ({min(ratios):.3g}-{max(ratios):.3g})",
            median <= 1.1,
        ))  # fmt: skip
    for name, ratio in efficiency.items():
        rows.append((
            f"packing efficiency in windows of {PACK_WINDOW} / whole-corpus best fit, {name}",
            ">= 0.99", f"{ratio:.4f}", ratio >= 0.99,
        ))  # fmt: skip
    return rows


def print_goals(rows: list[tuple[str, str, str, bool]]) -> None:
    print("| goal | target | reached | met |")
    print("|---|---|---|---|")
    for goal, target, reached, met in rows:
        print(f"| {goal} | {target} | {reached} | {'met' if met else 'not met'} |")


def mixture_row() -> dict[str, Any]:
    """The 100-source mixture's simulation, in a process of its own (goals: <= 5 s, <= 1 GiB);
    returns what it measured."""
    root = Path(__file__).resolve().parents[2]
    child = "import json; from tests.test_scale_mixture import mixture_simulation as m; print(json.dumps(m()))"
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"},
    )  # fmt: skip
    got = json.loads(done.stdout.splitlines()[-1])
    print("| view | documents | tokens | open + first batch | peak RSS added | tokens checked |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| Mixture of {got['sources']} TokenSequences | {got['sources']} x "
        f"{got['documents_per_source']:.0e} | {got['sources']} x {got['tokens_per_source']:.2e} | "
        f"{got['open_and_first_batch_s']:.2f} s | {got['rss_added_bytes'] / 2**20:.0f} MiB | "
        f"{got['checked_tokens']} |"
    )
    return got


def speed_table() -> None:
    rng = np.random.default_rng(0)
    drawn = rng.lognormal(np.log(300) - 0.5, 1.0, 200_000)
    lengths = np.clip(np.round(drawn), 1, SEQ_LEN).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.arange(offsets[-1], dtype=np.int32)
    store = DocumentStore.from_arrays(offsets, {"input_ids": flat})
    every = TokenSequences(store, SEQ_LEN)
    ids_only = TokenSequences(store, SEQ_LEN, leaves=("input_ids",))
    rows = flat[: len(flat) // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN)
    batches = [np.sort(rng.choice(len(every), BATCH, replace=False)) for _ in range(50)]

    def tight(ids: np.ndarray) -> dict[str, np.ndarray]:
        return {"input_ids": rows[ids], **row_segments(ids * SEQ_LEN, SEQ_LEN, offsets)}

    for ids in batches[:5]:  # the same rows, every leaf, before any timing
        want, got = tight(ids), every.read(ids)
        assert all(np.array_equal(want[k], got[k]) for k in want)
    loops = {
        ("input_ids, segment_ids, positions", "tight loop"): tight,
        ("input_ids, segment_ids, positions", "TokenSequences.read"): every.read,
        ("input_ids", "tight loop"): lambda ids: rows[ids],
        ("input_ids", "TokenSequences.read (leaves=)"): ids_only.read,
    }
    times: dict[tuple[str, str], list[float]] = {key: [] for key in loops}
    for round_ in range(4 * ROUNDS):  # interleaved, the order rotating
        order = list(loops)[round_ % 4 :] + list(loops)[: round_ % 4]
        for key in order:
            times[key].append(cpu_seconds(lambda f=loops[key]: [f(i) for i in batches], 1) / 50)
    print("| leaves | loop | per batch (CPU) | Mtokens/s | vs tight loop |")
    print("|---|---|---:|---:|---:|")
    for (leaves, loop), values in times.items():
        tight_median = statistics.median(times[(leaves, "tight loop")])
        median = statistics.median(values)
        print(
            f"| {leaves} | {loop} | {summary(values)} | {BATCH * SEQ_LEN / median / 1e6:.0f} | "
            f"{tight_median / median:.2f}x |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mixture", action="store_true", help="table 2 (the mixture) alone")
    args = parser.parse_args(argv)
    keep_freed_memory()
    print(f"seq_len {SEQ_LEN}, batch {BATCH}, {STEPS} random batches a round, {ROUNDS} rounds\n")
    if args.mixture:
        mixture_row()
    else:
        scale = scale_table()
        print()
        mixture = mixture_row()
        print()
        speed_table()
        print("\nGoals (one run):\n")
        print_goals(goal_rows(scale, packed_at_scale(), packing_efficiency(), mixture))
    return 0


if __name__ == "__main__":
    sys.exit(main())
