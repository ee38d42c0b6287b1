"""Figure 4, planning: psdp plans a 65,536-device pod against a naive per-device loop
(``docs/measurements/performance.md``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from psdp import MeshLayout, plan_pod, process_mesh_mapping
from psdp._plan.mesh import dp_index
from psdp.tools.benchmarks.common import Sizes, median_ms, ratio


def naive_uid_table(layout: MeshLayout, batch_axes: Sequence[str]) -> dict[int, int]:
    """The uid table the slow, obvious way: one Python step per device.

    Examples:
        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> naive_uid_table(layout, ["data"])
        {0: 0, 1: 0, 2: 1, 3: 1}
    """
    dims = [layout.axis_index(a) for a in batch_axes]
    held: dict[int, set[int]] = {}
    for position in itertools.product(*(range(n) for n in layout.shape)):
        dp = 0
        for dim in dims:
            dp = dp * layout.shape[dim] + position[dim]
        held.setdefault(int(layout.process_index[position]), set()).add(dp)
    uid_of: dict[frozenset[int], int] = {}
    return {p: uid_of.setdefault(frozenset(held[p]), len(uid_of)) for p in sorted(held)}


def pods(devices: int, hosts: int, model: int) -> list[tuple[str, MeshLayout, tuple[str, ...]]]:
    """The two benchmark pods: (name, layout, batch axes).

    Examples:
        >>> [name for name, _, _ in pods(64, 16, 8)]
        ['noncontiguous data=8 x model=8', 'contiguous replica=4 x data=2 x model=8']
    """
    data = devices // model
    flat = MeshLayout.noncontiguous({"data": data, "model": model}, hosts)
    cube = MeshLayout.contiguous({"replica": 4, "data": data // 4, "model": model}, hosts)
    return [
        (f"noncontiguous data={data} x model={model}", flat, ("data",)),
        (f"contiguous replica=4 x data={data // 4} x model={model}", cube, ("replica", "data")),
    ]


def bench_pod(layout: MeshLayout, batch_axes: tuple[str, ...], repeats: int) -> dict[str, Any]:
    """Median ms of psdp's planning steps and of `naive_uid_table` on one pod (tables checked).

    Examples:
        >>> _, layout, axes = pods(64, 16, 8)[0]
        >>> figures = bench_pod(layout, axes, repeats=1)
        >>> figures["devices"], figures["hosts"], figures["naive uid loop ms"] > 0
        (64, 16, True)
    """
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


def bench_planning(sizes: Sizes) -> dict[str, Any]:
    """Both pods of ``sizes.pod``: psdp's two planning steps against the naive loop."""
    devices, hosts, model = sizes.pod
    rows_out = []
    for name, layout, batch_axes in pods(devices, hosts, model):
        figures = bench_pod(layout, batch_axes, max(sizes.repeats // 4, 1))
        naive = figures["naive uid loop ms"]
        rows_out += [
            {
                "pod": name,
                "devices": figures["devices"],
                "hosts": figures["hosts"],
                "step": step[:-3],
                "ms": figures[step],
                "naive_ms": naive,
                "ratio": ratio(naive, figures[step]),
                "goal_ms": 200.0,
            }
            for step in ("plan_pod + plan(p) ms", "process_mesh_mapping ms")
        ]
    return {
        "title": f"Planning a pod of {devices:,} devices on {hosts:,} hosts (no devices needed)",
        "ratio_means": "speed-up over a naive per-device Python loop computing the same uid table",
        "rows": rows_out,
    }
