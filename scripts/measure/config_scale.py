"""The config path at 10^9 documents: the table of docs/measurements/scale.md, "The config path at
10^9 documents".

1. **Start-up on every host.** Every host of a 2- and a 64-host pod (``data=H x model=2``, 4 rows
   a host per step) runs ``DataConfig.build`` over a store of 10^9 documents, ~1.2 x 10^12 tokens,
   that is never written (its offsets and tokens computed; its document index and its pack index
   real files, as ``psdp prepare`` and ``psdp index`` leave them), then reads its first batch;
   host after host, in one process (`tests.config_scale`). Printed per view and pod, over its
   hosts: the seconds of the build and of the first batch, the peak resident memory each host's
   build and first batch added (``VmHWM``, reset before each host; the corpus is computed, so
   no file's pages count), the requests and bytes it read at build (exact counts).
2. **The one-time index cost.** (a) Planning: the pack index of `SEQ_LEN` and `WINDOW` over
   the scale corpus's lengths (1 to 2,400 tokens), windows planned by `counts_of_windows` (what
   a ``psdp index`` task runs) on one core, extrapolated linearly to 10^9 documents (the work is
   one plan per window). (b) The whole command: ``build_indexes`` over a written store of
   ``--index-documents`` short documents with 1 and 2 local workers, and a build killed halfway
   then resumed.

    python scripts/measure/config_scale.py [--hosts 2,64] [--plan-windows 200]
        [--index-documents 3000000] [--json]

About 1-2 minutes on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
SEQ_LEN, WINDOW = 2048, 4096
GOAL_S, GOAL_MIB = 2.0, 256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,64", help="pod sizes, comma-separated")
    parser.add_argument("--plan-windows", type=int, default=200, help="windows planned, timed")
    parser.add_argument("--index-documents", type=int, default=3_000_000,
                        help="documents of the written store indexed end to end")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    return parser.parse_args(argv)


def pods(hosts: list[int]) -> list[dict[str, Any]]:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(2 * max(hosts)), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run(
            [sys.executable, "-m", "tests.config_scale", directory, "sequences,packed",
             *map(str, hosts)],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def span(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    low, mid, high = (v * scale for v in (min(values), statistics.median(values), max(values)))
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def pod_row(run: dict[str, Any]) -> str:
    starts = run["startups"]
    requests = {tuple(sorted(s["build_requests"].items())) for s in starts}
    read = {sum(s["build_bytes"].values()) for s in starts}
    shown = "; ".join(f"{k} {v}" for k, v in sorted(starts[0]["build_requests"].items()))
    return " | ".join([
        f"| {run['kind']}", str(run["hosts"]),
        span([s["build_s"] for s in starts], 1e3), span([s["first_batch_s"] for s in starts], 1e3),
        f"{max(s['peak_added_bytes'] for s in starts) / 2**20:.1f}",
        shown if len(requests) == 1 else f"differ: {sorted(requests)}",
        f"{next(iter(read)) / 2**20:.2f}" if len(read) == 1 else "differ |",
    ]) + " |"  # fmt: skip


def plan_cost(windows: int) -> dict[str, float]:
    """Seconds of one core per window planned, over the scale corpus's lengths."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from tests.config_scale import CountedArray, Requests, document_index
    from tests.packing_oracle import FormulaCorpus

    from psdp import DocumentStore
    from psdp.sources.documents.beside import PackSettings
    from psdp.sources.views.pack_index import counts_of_windows

    corpus = FormulaCorpus(windows * WINDOW, period=WINDOW * 7)  # 7 different windows
    counted = Requests()
    offsets = CountedArray(corpus.documents + 1, np.int64, corpus.offsets, "offsets", counted)
    tokens = CountedArray(corpus.num_tokens, np.int32, corpus.tokens, "tokens", counted)
    store = DocumentStore(offsets, {"input_ids": tokens}, index=document_index(corpus))
    key = PackSettings(SEQ_LEN, WINDOW).key(store.num_documents, store.num_tokens)
    started = time.process_time()
    counts_of_windows(store, key, 0, windows)
    per_window = (time.process_time() - started) / windows
    return {"windows": windows, "cpu_s_per_window": per_window,
            "cpu_minutes_at_1e9": per_window * (10**9 / WINDOW) / 60}  # fmt: skip


def command_cost(documents: int) -> dict[str, Any]:
    """``build_indexes`` end to end on a written store: 1 and 2 workers, and kill + resume."""
    import numpy as np

    from psdp import write_documents
    from psdp.prepare import indexes
    from psdp.sources.documents.beside import PackSettings
    from psdp.sources.stores.location import INDEX_DIRECTORY

    settings = PackSettings(256, WINDOW)
    out: dict[str, Any] = {"documents": documents, "pack": settings.flags()}
    with tempfile.TemporaryDirectory() as directory:
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 40, documents)  # short: a quick write; 3 parts of 2**20
        flat = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.uint16)
        docs = np.split(flat, np.cumsum(lengths)[:-1])
        store = f"{directory}/store"
        write_documents(store, docs, progress=False)
        for workers in (1, 2):
            Path(store, INDEX_DIRECTORY, settings.file_name).unlink(missing_ok=True)
            started = time.perf_counter()
            indexes.build_indexes(store, [settings], workers=workers, progress=False)
            out[f"workers_{workers}_s"] = time.perf_counter() - started
        # killed after half its parts, then resumed
        Path(store, INDEX_DIRECTORY, settings.file_name).unlink()
        parts = -(-documents // indexes.DOCUMENTS_PER_PART)
        real, planned = indexes.counts_of_windows, []

        def killed(*args: Any) -> Any:
            if len(planned) >= parts // 2:
                raise KeyboardInterrupt
            planned.append(args[2])
            return real(*args)

        indexes.counts_of_windows = killed
        with contextlib.suppress(KeyboardInterrupt):
            indexes.build_indexes(store, [settings], workers=1, progress=False)
        indexes.counts_of_windows = real
        started = time.perf_counter()
        record = indexes.build_indexes(store, [settings], workers=1, progress=False)[0]
        out["resumed"] = {"parts": parts, "planned_before_kill": len(planned),
                          "state": record["state"], "s": time.perf_counter() - started}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    runs = pods([int(n) for n in args.hosts.split(",")])
    plan = plan_cost(args.plan_windows)
    command = command_cost(args.index_documents)
    if args.json:
        print(json.dumps({"pods": runs, "plan": plan, "command": command}))
        return 0
    print(f"10^9 documents, seq_len {SEQ_LEN}, window {WINDOW}; per host, median (min-max)")
    print("| view | hosts | DataConfig.build ms | first batch ms | peak added MiB (max) | "
          "requests at build | MiB read at build |\n" + "|---" * 7 + "|")  # fmt: skip
    for run in runs:
        print(pod_row(run))
    worst_s = max(s["build_s"] for r in runs for s in r["startups"])
    worst_mib = max(s["peak_added_bytes"] for r in runs for s in r["startups"]) / 2**20
    same = all(
        len({json.dumps(s["build_requests"], sort_keys=True) for r in runs if r["kind"] == k
             for s in r["startups"]}) == 1 for k in ("sequences", "packed")
    )  # fmt: skip
    met = worst_s <= GOAL_S and worst_mib <= GOAL_MIB and same
    print(f"\ngoal: <= {GOAL_S} s and <= {GOAL_MIB} MiB per host, the same requests at every pod "
          f"size: worst {worst_s:.3f} s, {worst_mib:.1f} MiB, requests "
          f"{'the same' if same else 'DIFFER'}: {'met' if met else 'NOT met'}")  # fmt: skip
    print(f"\none-time pack index: {plan['cpu_s_per_window'] * 1e3:.2f} ms of one core per window "
          f"of {WINDOW} ({plan['windows']} windows timed): "
          f"~{plan['cpu_minutes_at_1e9']:.0f} CPU-minutes at 10^9 documents")  # fmt: skip
    print(f"psdp index on {command['documents']:,} written documents ({command['pack']}): "
          f"1 worker {command['workers_1_s']:.1f} s, 2 workers {command['workers_2_s']:.1f} s; "
          f"killed after {command['resumed']['planned_before_kill']} of "
          f"{command['resumed']['parts']} parts, resumed in {command['resumed']['s']:.1f} s "
          f"({command['resumed']['state']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
