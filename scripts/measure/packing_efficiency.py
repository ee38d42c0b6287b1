"""Packing efficiency (real tokens / slots) and plan time, per strategy, on synthetic lengths.

Strategies: ``none`` (one document per sequence, padded; a long document split into
sequences of its own), and psdp's `plan_packing` with ``greedy``, ``first_fit`` and ``best_fit``
(long documents split). Lengths are drawn, never read: the plan needs only them.

- ``log-normal``: pretraining-like documents, log-normal with mean ~300 tokens, at most 4096.
- ``chat``: SFT-like conversations, a log-normal prompt (median 100) plus a log-normal response
  (median 250), at most 4096.

Packing in windows (``PackedSequences(window=W)``): best fit within each window of ``W``
documents (`plan_window`, the plans a pack index counts), against whole-corpus best fit. With
``--index-workers``, also the time to build a pack index (`build_pack_index`) of the lengths.
With ``--read-speed``, the time of `PackedSequences.read` of 64 shuffled sequences from a
memory-mapped store of the log-normal lengths, against a tight loop that copies each piece of the
same plan into preallocated rows (7 interleaved rounds of 100 reads, medians).

    python scripts/measure/packing_efficiency.py [--documents 1000000] [--seq-len 2048] [--seed 0]
        [--windows 1024,4096,16384,65536] [--index-workers 1,2] [--read-speed] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from psdp import PACKING_STRATEGIES, DocumentStore, PackedSequences, PackPlan, plan_packing
from psdp._plan.pack_windows import PackKey
from psdp._plan.packing import plan_window
from psdp.sources.views.pack_index import build_pack_index

MAX_LENGTH = 4096


def log_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """Mean ~300 (sigma 1, so the median is ~180), clipped to [1, 4096]."""
    return np.clip(np.round(rng.lognormal(np.log(300) - 0.5, 1.0, n)), 1, MAX_LENGTH)


def chat(rng: np.random.Generator, n: int) -> np.ndarray:
    """A prompt (median 100) and a response (median 250), clipped to [1, 4096]."""
    total = rng.lognormal(np.log(100), 0.8, n) + rng.lognormal(np.log(250), 0.9, n)
    return np.clip(np.round(total), 1, MAX_LENGTH)


DISTRIBUTIONS = {"log-normal": log_normal, "chat": chat}


def unpacked(lengths: np.ndarray, seq_len: int) -> tuple[int, float]:
    """Sequences and efficiency of one document per sequence (a long one over several)."""
    sequences = int((-(-lengths // seq_len)).sum())
    return sequences, float(lengths.sum() / (sequences * seq_len))


def measure(lengths: np.ndarray, seq_len: int, windows: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    start = time.perf_counter()
    sequences, efficiency = unpacked(lengths, seq_len)
    rows.append(dict(strategy="none", window=None, sequences=sequences, efficiency=efficiency,
                     seconds=time.perf_counter() - start))  # fmt: skip
    for strategy in ("greedy", "first_fit", "best_fit"):
        assert strategy in PACKING_STRATEGIES
        start = time.perf_counter()
        plan = plan_packing(lengths, seq_len, strategy)
        seconds = time.perf_counter() - start
        assert plan.num_tokens == lengths.sum()  # split: every token packed
        rows.append(dict(strategy=strategy, window=None, sequences=len(plan),
                         efficiency=plan.efficiency, seconds=seconds))  # fmt: skip
    for window in windows:
        start = time.perf_counter()
        sequences = sum(
            len(plan_window(lengths[a : a + window], seq_len, "best_fit", "split", None,
                            window=window, index=a // window))
            for a in range(0, len(lengths), window)
        )  # fmt: skip
        rows.append(dict(strategy="best_fit", window=window, sequences=sequences,
                         efficiency=float(lengths.sum() / (sequences * seq_len)),
                         seconds=time.perf_counter() - start))  # fmt: skip
    whole = rows[3]["efficiency"]
    for row in rows:
        row["vs_best_fit"] = row["efficiency"] / whole
    return rows


def index_seconds(lengths: np.ndarray, seq_len: int, window: int, workers: int) -> float:
    """Seconds to build the pack index of ``lengths`` (a store whose tokens take no memory)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.broadcast_to(np.int32(0), (int(offsets[-1]),))
    store = DocumentStore.from_arrays(offsets, {"input_ids": tokens})
    key = PackKey(seq_len, "best_fit", "split", None, window, len(lengths), int(offsets[-1]))
    start = time.perf_counter()
    build_pack_index(store, key, workers=workers, progress=False)
    return time.perf_counter() - start


def read_speed(lengths: np.ndarray, seq_len: int, batch: int = 64) -> dict[str, float]:
    """ms per read of ``batch`` shuffled sequences: psdp's and a tight loop's (medians)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        flat = np.lib.format.open_memmap(f"{tmp}/t.npy", "w+", np.int32, (int(offsets[-1]),))
        flat[:] = np.random.default_rng(0).integers(0, 50_000, len(flat), dtype=np.int32)
        packed = PackedSequences(DocumentStore.from_arrays(offsets, {"input_ids": flat}), seq_len)
        plan = packed.plan
        assert isinstance(plan, PackPlan)
        plain = np.asarray(flat)

        def tight(ids: np.ndarray) -> dict[str, np.ndarray]:
            out = {k: np.zeros((batch, seq_len), np.int32) for k in sorted(packed.leaves)}
            for r, q in enumerate(ids.tolist()):
                for segment, p in enumerate(range(plan.seq_starts[q], plan.seq_starts[q + 1]), 1):
                    a = int(offsets[plan.piece_doc[p]] + plan.piece_start[p])
                    n, c = int(plan.piece_len[p]), int(plan.piece_column[p])
                    out["input_ids"][r, c : c + n] = plain[a : a + n]
                    out["segment_ids"][r, c : c + n] = segment
                    out["positions"][r, c : c + n] = np.arange(n)
                    out["loss_mask"][r, c : c + n] = 1
            return out

        order = np.random.default_rng(1).permutation(len(packed))
        reads = [order[s * batch : (s + 1) * batch] for s in range(100)]
        got, want = packed.read(reads[0]), tight(reads[0])
        assert all((got[k] == want[k]).all() for k in want)  # the same rows, before timing
        times: dict[str, list[float]] = {"psdp": [], "tight": []}
        for _ in range(7):
            for name, read in (("psdp", packed.read), ("tight", tight)):
                start = time.perf_counter()
                for ids in reads:
                    read(ids)
                times[name].append((time.perf_counter() - start) / len(reads) * 1e3)
    ratio = sorted(a / b for a, b in zip(times["psdp"], times["tight"], strict=True))[3]
    return {"psdp_ms": sorted(times["psdp"])[3], "tight_ms": sorted(times["tight"])[3],
            "ratio": ratio}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--windows",
        default="1024,4096,16384,65536",
        help="window sizes (documents) for best fit in windows; '' for none",
    )
    parser.add_argument(
        "--index-workers",
        default="",
        help="worker counts to time a pack index build with (windows of 4096)",
    )
    parser.add_argument(
        "--read-speed",
        action="store_true",
        help="time reads of the log-normal lengths against a tight loop",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)  # fmt: skip
    windows = [int(w) for w in args.windows.split(",") if w]
    results = []
    for name, draw in DISTRIBUTIONS.items():
        lengths = draw(np.random.default_rng(args.seed), args.documents).astype(np.int64)
        for row in measure(lengths, args.seq_len, windows):
            results.append(dict(distribution=name, mean_length=float(lengths.mean()), **row))
    builds = [
        dict(workers=int(n), seconds=index_seconds(lengths, args.seq_len, 4096, int(n)))
        for n in args.index_workers.split(",")
        if n
    ]
    if args.read_speed:
        lengths = log_normal(np.random.default_rng(args.seed), args.documents).astype(np.int64)
        builds.append(read_speed(lengths, args.seq_len))
    if args.json:
        print(json.dumps(results + builds, indent=1))
        return 0
    print(f"{args.documents} documents, seq_len {args.seq_len}, seed {args.seed}\n")
    print("| lengths | mean | packing | window | sequences | efficiency | of best fit | plan s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        window = r["window"] or "all"
        print(f"| {r['distribution']} | {r['mean_length']:.0f} | {r['strategy']} | {window} | "
              f"{r['sequences']} | {r['efficiency']:.4f} | {r['vs_best_fit']:.4f} | "
              f"{r['seconds']:.2f} |")  # fmt: skip
    for b in builds:
        if "workers" in b:
            print(f"\npack index of the chat lengths, windows of 4096, {b['workers']} workers: "
                  f"{b['seconds']:.2f} s")  # fmt: skip
        else:
            print(f"\nreads of 64 sequences: psdp {b['psdp_ms']:.2f} ms, a tight loop "
                  f"{b['tight_ms']:.2f} ms (psdp/tight {b['ratio']:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
