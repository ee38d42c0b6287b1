"""Bytes each host reads per step for a spatially sharded field, against reading whole samples.

For a ``(B, C, H, W)`` field split over ``data x h x w`` (spec ``P("data", None, "h", "w")``),
the loader's own planner (`LeafWindows` on a `MeshLayout`, no devices, and `plan_reads`) gives
each host's reads: one box per window, a host's boxes on the same rows merged, each entry read
once. A host's bytes are those reads' entries times the item size; the baseline is reading every
sample the host's devices hold, whole. ``tests/test_spatial.py`` checks these figures against the
bytes a source returns on simulated hosts.

    python scripts/measure/spatial_bytes.py [--shape 16,8,720,1440] [--mesh data=2,h=2,w=2]
        [--halo 2:8:pad,3:8:periodic] [--itemsize 4] [--json]

Layouts: ``one host per device``; ``4 hosts, non-contiguous`` (each host's two devices in both
data rows, different corners of the domain); ``2 hosts, one per data row`` (a host holds a whole
sample's domain).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp import MeshLayout
from psdp._plan.reads import plan_reads
from psdp._plan.windows import AxisHalo, LeafWindows

SPEC = PartitionSpec("data", None, "h", "w")
LAYOUTS = {
    "one host per device": np.arange(8).reshape(2, 2, 2),
    "4 hosts, non-contiguous": np.array([[[0, 1], [2, 3]], [[3, 2], [1, 0]]]),
    "2 hosts, one per data row": np.array([[[0, 0], [0, 0]], [[1, 1], [1, 1]]]),
}


def parse_halo(text: str) -> dict[int, AxisHalo]:
    """``"2:8:pad,3:8:periodic"`` -> {2: AxisHalo(8, "pad"), 3: AxisHalo(8, "periodic")}."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        dim, width, boundary = part.split(":")
        out[int(dim)] = AxisHalo(int(width), boundary)
    return out


def host_bytes(
    layout: MeshLayout,
    shape: Sequence[int],
    halos: dict[int, AxisHalo],
    itemsize: int,
    process: int,
) -> int:
    """Bytes ``process`` reads for one step: the entries of its reads times the item size."""
    leaf = LeafWindows.create(
        layout, SPEC, tuple(shape), np.float32, process, halo=halos, pad_uneven=True
    )
    total = 0
    for request in plan_reads({"field": leaf}):
        read = leaf.read_shape(request.columns["field"], len(request.positions))
        total += math.prod(read)
    return total * itemsize


def whole_sample_bytes(
    layout: MeshLayout, shape: Sequence[int], itemsize: int, process: int
) -> int:
    """Bytes ``process`` reads when every sample its devices hold is read whole."""
    leaf = LeafWindows.create(layout, PartitionSpec("data"), tuple(shape), np.float32, process)
    return len(leaf.plan.rows) * math.prod(shape[1:]) * itemsize


def measure(shape: Sequence[int], halo_text: str, itemsize: int) -> dict[str, Any]:
    halos = parse_halo(halo_text)
    out: dict[str, Any] = {"shape": list(shape), "halo": halo_text, "layouts": {}}
    for name, processes in LAYOUTS.items():
        layout = MeshLayout(processes, ("data", "h", "w"))
        hosts = []
        for p in layout.processes:
            boxes = host_bytes(layout, shape, halos, itemsize, p)
            whole = whole_sample_bytes(layout, shape, itemsize, p)
            hosts.append(
                {"host": p, "bytes": boxes, "whole_samples": whole, "ratio": boxes / whole}
            )
        out["layouts"][name] = hosts
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| layout | halo | bytes per host | whole samples per host | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for result in results:
        for name, hosts in result["layouts"].items():
            sizes = sorted({(h["bytes"], h["whole_samples"]) for h in hosts})
            for boxes, whole in sizes:
                lines.append(
                    f"| {name} | {result['halo'] or 'none'} | {mib(boxes)} | {mib(whole)} | "
                    f"{boxes / whole:.3f} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="16,8,720,1440", help="B,C,H,W")
    parser.add_argument(
        "--halo", action="append", help="dim:width:boundary,... (repeatable; default: a set)"
    )
    parser.add_argument("--itemsize", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    shape = [int(n) for n in args.shape.split(",")]
    halos = args.halo or ["", "2:1:pad,3:1:periodic", "2:8:pad,3:8:periodic"]
    results = [measure(shape, h, args.itemsize) for h in halos]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
