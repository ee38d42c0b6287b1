"""One large input on every worker: `psdp prepare` of a single file, cut into units or read whole.

Seeded text (`prepare_bench.texts`) as ONE uncompressed jsonl file (local) and ONE Parquet file
(in moto's S3 server on 127.0.0.1), and a BPE tokenizer trained here (nothing downloaded). Each
file is prepared with 2 workers, read whole (``bytes_per_part=None``, or ``rows_per_part`` over
the file's rows: one unit, one worker busy) and cut (8 units), alternately, twice each: the
better of two, tokens/s including the workers' start-up (on a machine shared with other work,
the alternation spreads its load over both), and each worker's CPU seconds (its ``/proc`` times,
read every 50 ms): where the cores are busy with other work, wall time says little, but the
busiest worker's CPU time is the run's critical path on a machine with a core per worker. Then
the cut store's documents against the whole one's (every document's ids, in order).

    python scripts/measure/prepare_split.py              # 20,000 documents, a few minutes
    python scripts/measure/prepare_split.py --docs 4000  # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_bench import texts, train_tokenizer

CUT = 8  # units of the cut runs


def documents(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from psdp import DocumentStore

    store = DocumentStore.open(str(path))
    offsets = np.asarray(store.offsets_range(0, store.num_documents + 1))
    return offsets, np.asarray(store.read_ranges([0], [store.num_tokens])["input_ids"])


def cpu_seconds(pid: str) -> float:
    """A process's user + system CPU seconds so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children() -> list[str]:
    pids = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as listed:
                pids += listed.read().split()
        except OSError:
            pass
    return pids


def timed(inputs, output, tokenizer, **cut) -> dict:
    from psdp.prepare import prepare

    workers: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:  # CPU times only grow: the last reading before a worker ends is its own
        while not done.wait(0.05):
            for pid in children():
                workers[pid] = max(workers.get(pid, 0.0), cpu_seconds(pid))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    summary = prepare(inputs, output, tokenizer=tokenizer, eos="<|eos|>", workers=2,
                      progress=False, **cut)  # fmt: skip
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    busy = sorted((round(c, 1) for c in workers.values() if c > 0), reverse=True)
    return {"parts": summary.parts, "tokens": summary.tokens, "seconds": round(seconds, 2),
            "tokens_per_s": round(summary.tokens / seconds), "worker_cpu_s": busy[:2]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    args = parser.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from psdp.tools.benchmarks.object_store import S3Server

    docs = texts(args.docs, seed=0)
    rows_per_group = -(-args.docs // (4 * CUT))
    results = {}
    with tempfile.TemporaryDirectory() as tmp_name, S3Server() as server:
        tmp = Path(tmp_name)
        tokenizer = train_tokenizer(tmp / "tokenizer.json", docs[:2000])
        jsonl = tmp / "one.jsonl"
        with jsonl.open("w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
        parquet = tmp / "one.parquet"
        pq.write_table(pa.table({"text": docs}), parquet, row_group_size=rows_per_group)
        objects = server.objects()
        for path in (jsonl, parquet):
            objects.write(f"raw/{path.name}", path.read_bytes()).result()
        cuts = {
            "jsonl": ({"bytes_per_part": None}, {"bytes_per_part": -(-jsonl.stat().st_size // CUT)}),
            "parquet": ({"rows_per_part": args.docs}, {"rows_per_part": -(-args.docs // CUT)}),
        }  # fmt: skip
        cases = {"jsonl local": ("jsonl", str(jsonl)),
                 "parquet s3": ("parquet", server.kvstore("raw/one.parquet"))}  # fmt: skip
        for name, (kind, inputs) in cases.items():
            whole, cut = cuts[kind]
            runs: dict[str, list[dict]] = {"whole": [], "cut": []}
            for attempt in range(2):
                for label, options in (("whole", whole), ("cut", cut)):
                    output = tmp / f"{kind}-{label}-{attempt}"
                    runs[label].append(timed(inputs, output, tokenizer, **options))
            best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
            same = all(np.array_equal(a, b) for a, b in zip(
                documents(tmp / f"{kind}-whole-0"), documents(tmp / f"{kind}-cut-0"),
                strict=True))  # fmt: skip
            results[name] = {**best, "runs": runs, "same_documents": same,
                             "speedup": round(best["cut"]["tokens_per_s"]
                                              / best["whole"]["tokens_per_s"], 2)}  # fmt: skip
            print(name, json.dumps(results[name]), flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":  # prepare's worker processes import this file again
    sys.exit(main())
