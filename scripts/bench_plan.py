"""Planning benchmark: how long psdp takes to plan a 65,536-device pod of 16,384 hosts.

For two pods (a non-contiguous ``data x model`` one and a contiguous ``replica x data x model`` one)
it times, as the median of several repeats, ``plan_pod(...)`` followed by ``.plan(p)`` for one host,
and ``process_mesh_mapping``. The baseline, measured in the same run on the same layout, is a naive
pure-Python loop over every device computing the same uid table; the script checks that the two
tables are equal before reporting. No devices are needed.

    python scripts/bench_plan.py [--devices 65536 --hosts 16384 --model 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psdp._plan.layout import MeshLayout
from psdp.tools.benchmarks.common import median_ms
from psdp.tools.benchmarks.planning import bench_pod, naive_uid_table, pods

# the helpers live in psdp.tools.benchmarks.planning (figure 4 of `psdp bench`); re-exported for this
# script's users
__all__ = ["MeshLayout", "bench_pod", "main", "markdown", "median_ms", "naive_uid_table", "pods"]


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| pod | step | median ms | speed-up over naive |",
        "|---|---|---:|---:|",
    ]
    for name, figures in results.items():
        naive = figures["naive uid loop ms"]
        for step in ("plan_pod + plan(p) ms", "process_mesh_mapping ms", "naive uid loop ms"):
            ratio = naive / figures[step]
            lines.append(f"| {name} | {step[:-3]} | {figures[step]:.2f} | {ratio:.0f}x |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=65536, help="devices in the pod")
    parser.add_argument("--hosts", type=int, default=16384, help="processes (hosts) in the pod")
    parser.add_argument("--model", type=int, default=256, help="size of the model axis")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per measurement")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    results = {
        name: bench_pod(layout, batch_axes, args.repeats)
        for name, layout, batch_axes in pods(args.devices, args.hosts, args.model)
    }
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
