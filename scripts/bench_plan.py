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
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from psdp.layout import MeshLayout
from psdp.mesh import dp_index, plan_pod, process_mesh_mapping


def naive_uid_table(layout: MeshLayout, batch_axes: Sequence[str]) -> dict[int, int]:
    """The uid table the slow, obvious way: one Python step per device."""
    dims = [layout.axis_index(a) for a in batch_axes]
    held: dict[int, set[int]] = {}
    for position in itertools.product(*(range(n) for n in layout.shape)):
        dp = 0
        for dim in dims:
            dp = dp * layout.shape[dim] + position[dim]
        held.setdefault(int(layout.process_index[position]), set()).add(dp)
    uid_of: dict[frozenset[int], int] = {}
    return {p: uid_of.setdefault(frozenset(held[p]), len(uid_of)) for p in sorted(held)}


def median_ms(action: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def pods(devices: int, hosts: int, model: int) -> list[tuple[str, MeshLayout, tuple[str, ...]]]:
    """The two benchmark pods: (name, layout, batch axes)."""
    data = devices // model
    flat = MeshLayout.noncontiguous({"data": data, "model": model}, hosts)
    cube = MeshLayout.contiguous({"replica": 4, "data": data // 4, "model": model}, hosts)
    return [
        (f"noncontiguous data={data} x model={model}", flat, ("data",)),
        (f"contiguous replica=4 x data={data // 4} x model={model}", cube, ("replica", "data")),
    ]


def bench_pod(layout: MeshLayout, batch_axes: tuple[str, ...], repeats: int) -> dict[str, Any]:
    spec = (batch_axes,)
    shape = (dp_index(layout, batch_axes)[1] * 4, 2048)  # 4 rows per DP index
    host = layout.num_processes // 2
    naive = naive_uid_table(layout, batch_axes)
    # A batch-only spec makes the box id the DP index, so the pod plan's uids must agree too.
    for table in (
        process_mesh_mapping(layout, batch_axes),
        plan_pod(layout, spec, shape).uid_table(),
    ):
        if table != naive:
            raise RuntimeError("psdp's uid table differs from the naive per-device loop's")
    return {
        "devices": layout.num_devices,
        "hosts": layout.num_processes,
        "plan_pod + plan(p) ms": median_ms(
            lambda: plan_pod(layout, spec, shape).plan(host), repeats
        ),
        "process_mesh_mapping ms": median_ms(
            lambda: process_mesh_mapping(layout, batch_axes), repeats
        ),
        "naive uid loop ms": median_ms(lambda: naive_uid_table(layout, batch_axes), repeats),
    }


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
