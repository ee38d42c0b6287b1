"""TokenSequences at real size and memory speed: two tables for docs/tokens.md.

1. Time per step from 10^6 to 10^9 documents: corpora never written (tests/scale_corpus.py, the
   same formula at every size, offsets and tokens computed on the fly), opened with the index
   write_documents would record; each step reads ``BATCH`` random rows of ``SEQ_LEN`` tokens
   with ``segment_ids`` and ``positions``. The corpus formula's own time (computing the offsets
   and tokens read) is measured apart: psdp's own is the rest.
2. A `Mixture` of 100 such corpora of 10^9 documents each (tests/test_scale_mixture.py's
   simulation, in a child process: its peak memory is the measure): open plus the first batch,
   and the resident memory that adds, every token checked against the formula.
3. ``TokenSequences.read`` against a tight numpy loop over the same in-memory corpus (200,000
   documents of log-normal lengths, mean ~300, int32 ids): the loop gathers whole rows of a
   reshape of the flat array and computes ``segment_ids`` and ``positions`` per row (one
   ``searchsorted`` of each row's ends, then ``np.repeat``), as docs/performance.md's tight
   loop does. Both are checked equal first, then timed in interleaved rounds.

Times are the process's CPU time (the machine may be shared), medians and ranges over rounds.
glibc's allocator is told not to return freed memory to the system (``mallopt``): otherwise
every large temporary is paged in afresh, which slowed the tight loop (many such temporaries)
about 6x on this machine and made the comparison say more about the allocator than the loops.

Run: ``python scripts/scale_tokens.py`` (about a minute; ``--mixture`` for table 2 alone).
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.scale_corpus

from tests.scale_corpus import LazyArray, ScaleCorpus

from psdp.sources import DocumentIndex, DocumentStore, TokenSequences
from psdp.sources.document_index import STRIDE
from psdp.tools.benchmarks.token_loops import row_segments  # the user's loop of figure 8

SEQ_LEN, BATCH, STEPS, ROUNDS = 2048, 64, 20, 7
SIZES = (10**6, 10**7, 10**9)  # documents


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
    """A flat array that adds the CPU time of its reads (the formula's work) to ``spent``."""

    def __init__(self, array: LazyArray, spent: list[float]):
        self.array, self.shape, self.dtype, self.spent = array, array.shape, array.dtype, spent

    def __getitem__(self, where: slice) -> np.ndarray:
        start = time.process_time()
        values = self.array[where]
        self.spent[0] += time.process_time() - start
        return values


def scale_table() -> None:
    """Both sizes open side by side, then timed in interleaved rounds (a load change on a
    shared machine then falls on both)."""
    loops, opened = {}, {}
    for documents in SIZES:
        corpus = ScaleCorpus(documents=documents)
        spent = [0.0]
        start = time.perf_counter()
        marks, nonempty = corpus.marks(STRIDE)
        index = DocumentIndex(documents, STRIDE, marks, nonempty, 2 * corpus.length - 1)
        offsets, tokens = Timed(corpus.offsets_array(), spent), Timed(corpus.tokens_array(), spent)
        store = DocumentStore.from_arrays(offsets, {"input_ids": tokens}, index=index)
        opened[documents] = time.perf_counter() - start, store.num_tokens
        for eos_id in (None, 0):
            rows = TokenSequences(store, SEQ_LEN, eos_id=eos_id)
            batches = [
                np.random.default_rng(step).choice(len(rows), BATCH, replace=False)
                for step in range(STEPS)
            ]
            loops[(documents, eos_id)] = rows, batches, spent
    totals: dict[tuple[int, int | None], list[float]] = {key: [] for key in loops}
    formula: dict[tuple[int, int | None], list[float]] = {key: [] for key in loops}
    for _ in range(ROUNDS):
        for key, (rows, batches, spent) in loops.items():
            spent[0] = 0.0
            start = time.process_time()
            for ids in batches:
                rows.read(ids)
            totals[key].append((time.process_time() - start) / STEPS)
            formula[key].append(spent[0] / STEPS)
    print(
        "| documents | tokens | open (index given) | eos_id | per step (CPU) | of which the "
        "corpus formula | psdp's own |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|")
    own = {}
    for (documents, eos_id), values in totals.items():
        mine = [t - f for t, f in zip(values, formula[(documents, eos_id)], strict=True)]
        own[(documents, eos_id)] = statistics.median(mine)
        seconds, tokens = opened[documents]
        print(
            f"| {documents:.0e} | {tokens:.2e} | {seconds * 1e3:.1f} ms | {eos_id} | "
            f"{summary(values)} | {summary(formula[(documents, eos_id)])} | {summary(mine)} |"
        )
    for eos_id in (None, 0):
        for small in SIZES[:-1]:
            ratio = own[(SIZES[-1], eos_id)] / own[(small, eos_id)]
            print(
                f"psdp's own time per step, {SIZES[-1]:.0e} / {small:.0e} documents, "
                f"eos_id={eos_id}: {ratio:.2f}"
            )


def mixture_row() -> None:
    """The 100-source mixture's simulation, in a process of its own (goals: <= 5 s, <= 1 GiB)."""
    root = Path(__file__).resolve().parents[1]
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


if __name__ == "__main__":
    keep_freed_memory()
    print(f"seq_len {SEQ_LEN}, batch {BATCH}, {STEPS} random batches a round, {ROUNDS} rounds\n")
    if "--mixture" not in sys.argv:
        scale_table()
        print()
    mixture_row()
    if "--mixture" not in sys.argv:
        print()
        speed_table()
