"""The cost of reading a Levanter token cache in place against the same documents in a psdp store.

    python scripts/measure/levanter_cache.py [--documents 200000] [--steps 20]

Writes ``--documents`` documents (seeded lengths 1..1000, int32 ids) twice: in Levanter's exact
layout (`tests.levanter_cache`: zarr3 shards of 2**27 entries, inner chunks of 2**18, blosc) and
with `write_documents`; then prints, for each, the median time (of 3) to open the store (Levanter:
`open_levanter_cache`, which builds the document index by one pass over the offsets; psdp: its
committed index) and the median time of a `TokenSequences` batch of 64 rows of 2048 tokens at
``--steps`` seeded random steps (``docs/guides/tokens.md``, "Levanter caches").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests.levanter_cache
from tests.levanter_cache import write_levanter_cache

from psdp import DocumentStore, TokenSequences
from psdp.sources import open_levanter_cache, write_documents

SEQ_LEN, BATCH = 2048, 64


def median_s(action, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    lengths = np.random.default_rng(0).integers(1, 1001, args.documents)
    ids = np.arange(int(lengths.sum()), dtype=np.int64) % 50_000
    docs = [{"input_ids": a.astype(np.int32)} for a in np.split(ids, np.cumsum(lengths)[:-1])]
    with tempfile.TemporaryDirectory() as tmp:
        write_levanter_cache(Path(tmp, "lev"), docs, batches=8)
        write_documents(Path(tmp, "psdp"), docs, progress=False)
        opens = {
            "levanter": lambda: open_levanter_cache(Path(tmp, "lev")),
            "psdp": lambda: DocumentStore.open(Path(tmp, "psdp")),
        }
        print(f"{args.documents} documents, {len(ids)} tokens; batch {BATCH} x {SEQ_LEN}")
        for name, opener in opens.items():
            open_s = median_s(opener)
            view = TokenSequences(opener(), SEQ_LEN)
            steps = np.random.default_rng(1).integers(0, len(view) // BATCH, args.steps)
            batch_s = statistics.median(
                median_s(lambda s=s, v=view: v.read(np.arange(s * BATCH, (s + 1) * BATCH)), 1)
                for s in steps
            )
            print(f"{name:9s} open {open_s * 1e3:8.1f} ms   batch {batch_s * 1e3:7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
