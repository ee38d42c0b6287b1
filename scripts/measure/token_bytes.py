"""Bytes each host reads per step from a token store under context sharding, against batch-only
sharding and against every host reading the whole batch.

A local pod (`psdp.pod.run_pod`, one process per device, ``data x context`` devices) reads
`TokenSequences` of ``seq_len`` tokens (``uint16`` ids, documents of log-normal lengths in
memory) through a counting store (``tests/pod_targets_tokens.py``): per host and step, the
tokens it reads, the ranges, and the `DocumentStore.read_ranges` calls (batched reads).
Specs: ``P("data")`` (each host its data group's rows whole: what a loader that reads whole
sequences and slices on device reads), ``P()`` (every host the whole batch), and
``P("data", "context")`` with a ``continue`` halo of each width (a host reads its column range
of each row, widened by the halo).

    python scripts/measure/token_bytes.py [--data 2] [--context 4] [--seq-len 4096]
        [--batch 16] [--halo 0,64,512] [--steps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import pod_targets_tokens as targets

from psdp.tools.pod import run_pod

ITEMSIZE = 2  # uint16 token ids


def measure(data: int, context: int, seq_len: int, batch: int, halos, steps: int) -> dict:
    hosts = data * context
    layout = [[d * context + c for c in range(context)] for d in range(data)]
    results = run_pod(
        targets.host_reads, num_processes=hosts, devices_per_process=1, timeout_s=600,
        args=dict(process_index=layout, axis_names=["data", "context"], seq_len=seq_len,
                  batch=batch, halos=list(halos), steps=steps),
    )  # fmt: skip
    return {"data": data, "context": context, "seq_len": seq_len, "batch": batch, "hosts": results}


def table(result: dict) -> str:
    hosts = result["hosts"]
    cases = list(hosts[0]["reads"])
    baseline = max(s["tokens"] for h in hosts for s in h["reads"][cases[0]])
    lines = [
        f"data={result['data']} x context={result['context']}, one host per device, "
        f"seq_len={result['seq_len']}, global batch {result['batch']}, uint16 ids",
        "",
        "| spec | bytes per host per step | ranges per host per step | read_ranges calls per step | vs P(data) |",
        "|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for case in cases:
        steps = [s for h in hosts for s in h["reads"][case]]
        tokens = sorted({s["tokens"] for s in steps})
        ranges = sorted({s["ranges"] for s in steps})
        requests = sorted({s["requests"] for s in steps})
        span = lambda v: str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"  # noqa: E731
        kib = [f"{t * ITEMSIZE / 1024:.1f}" for t in (tokens[0], tokens[-1])]
        size = kib[0] if kib[0] == kib[1] else f"{kib[0]}-{kib[1]}"
        lines.append(
            f"| {case} | {size} KiB | {span(ranges)} | {span(requests)} | "
            f"{max(tokens) / baseline:.3f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=int, default=2)
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--halo", default="0,64,512", help="continue-halo widths, comma-separated")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    halos = [int(h) for h in args.halo.split(",")]
    result = measure(args.data, args.context, args.seq_len, args.batch, halos, args.steps)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
