"""Packing efficiency (real tokens / slots) and plan time, per strategy, on synthetic lengths.

Strategies: ``none`` (one document per sequence, padded; a long document split into
sequences of its own), and psdp's `plan_packing` with ``greedy``, ``first_fit`` and ``best_fit``
(long documents split). Lengths are drawn, never read: the plan needs only them.

- ``log-normal``: pretraining-like documents, log-normal with mean ~300 tokens, at most 4096.
- ``chat``: SFT-like conversations, a log-normal prompt (median 100) plus a log-normal response
  (median 250), at most 4096.

    python scripts/packing_efficiency.py [--documents 1000000] [--seq-len 2048] [--seed 0]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from psdp import PACKING_STRATEGIES, plan_packing

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


def measure(lengths: np.ndarray, seq_len: int) -> list[dict[str, Any]]:
    rows = []
    start = time.perf_counter()
    sequences, efficiency = unpacked(lengths, seq_len)
    rows.append(dict(strategy="none", sequences=sequences, efficiency=efficiency,
                     seconds=time.perf_counter() - start))  # fmt: skip
    for strategy in ("greedy", "first_fit", "best_fit"):
        assert strategy in PACKING_STRATEGIES
        start = time.perf_counter()
        plan = plan_packing(lengths, seq_len, strategy)
        seconds = time.perf_counter() - start
        assert plan.num_tokens == lengths.sum()  # split: every token packed
        rows.append(dict(strategy=strategy, sequences=len(plan), efficiency=plan.efficiency,
                         seconds=seconds))  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    results = []
    for name, draw in DISTRIBUTIONS.items():
        lengths = draw(np.random.default_rng(args.seed), args.documents).astype(np.int64)
        for row in measure(lengths, args.seq_len):
            results.append(dict(distribution=name, mean_length=float(lengths.mean()), **row))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{args.documents} documents, seq_len {args.seq_len}, seed {args.seed}\n")
    print("| lengths | mean | packing | sequences | efficiency | plan s |")
    print("|---|---:|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['distribution']} | {r['mean_length']:.0f} | {r['strategy']} | "
              f"{r['sequences']} | {r['efficiency']:.4f} | {r['seconds']:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
