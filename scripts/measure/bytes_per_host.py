"""Bytes each host reads per step for one token leaf, under each partitioning strategy.

For a ``(B, S)`` token leaf on a pod, the pure planner (`psdp.plan_pod` on a `psdp.MeshLayout`, no
devices) gives every host the distinct boxes its devices hold; a host reads exactly those, so its
bytes are the boxes' elements times the item size. Strategies, with ``batch`` the batch axes and
``model`` the remaining (tensor-parallel) axes:

- BATCH: ``P(batch)``: rows split over the batch axes, replicated over ``model``.
- FULL: ``P((*batch, *model))``: rows split over every axis (a reshard before TP layers).
- REPLICATED: ``P()``: every host the whole batch.
- sequence: ``P(batch, model)``: rows over the batch axes, columns over ``model`` (context
  parallelism).
- sequence + halo: as sequence, each column window widened by ``h`` columns on each side and
  clipped at the sequence ends; a host's windows on the same rows that overlap are read once, as
  the loader does (the union of the widened windows, row block by row block).

The baseline is BATCH on the same pod: each host's figure is also given as a ratio to its BATCH
bytes, and the *duplication factor* is the bytes read by all hosts together over the batch's own
size (1.0: every byte read once in the pod).

    python scripts/measure/bytes_per_host.py [--pod data=4,model=4@4 ...] [--batch-size 64]
        [--seq-len 4096] [--halo 128] [--itemsize 4] [--layout noncontiguous] [--json]

A ``--pod`` is ``AXES@HOSTS``; its last axis is the model axis, the others are batch axes. The
defaults are the 4-host example pod (``psdp plan --example``) and ``replica=2 x data=8 x model=4`` on 16 hosts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from psdp import DataPlan, MeshLayout, plan_pod

DEFAULT_PODS = ("data=4,model=4@4", "replica=2,data=8,model=4@16")
STRATEGIES = ("BATCH", "FULL", "REPLICATED", "sequence", "sequence+halo")


def parse_pod(text: str, layout: str) -> tuple[str, MeshLayout, tuple[str, ...], str]:
    """``"data=4,model=4@4"`` -> (name, layout, batch axes, model axis)."""
    try:
        axes_text, hosts = text.split("@")
        sizes = {k: int(v) for k, v in (pair.split("=") for pair in axes_text.split(","))}
        num_hosts = int(hosts)
    except ValueError:
        raise ValueError(
            f"--pod {text!r} must look like 'data=4,model=4@4': NAME=SIZE pairs, '@', hosts"
        ) from None
    if len(sizes) < 2:
        raise ValueError(f"--pod {text!r} needs a batch axis and a model axis (the last one)")
    names = tuple(sizes)
    batch_axes, model = names[:-1], names[-1]
    if layout == "noncontiguous":
        mesh = MeshLayout.noncontiguous(sizes, num_hosts, batch_axes=len(batch_axes))
    else:
        mesh = MeshLayout.contiguous(sizes, num_hosts)
    name = " x ".join(f"{k}={v}" for k, v in sizes.items()) + f", {num_hosts} hosts"
    return name, mesh, batch_axes, model


def specs(batch_axes: tuple[str, ...], model: str) -> dict[str, tuple[Any, ...]]:
    """The partition spec of each strategy (``sequence+halo`` reads like ``sequence``, widened)."""
    return {
        "BATCH": (batch_axes,),
        "FULL": ((*batch_axes, model),),
        "REPLICATED": (),
        "sequence": (batch_axes, model),
        "sequence+halo": (batch_axes, model),
    }


def halo_union_elements(plan: DataPlan, halo: int) -> int:
    """Elements in the union of the widened windows, row block by row block (the minimum)."""
    seq_len = plan.global_shape[1]
    by_rows: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for box in plan.blocks:
        window = (max(box[1].start - halo, 0), min(box[1].stop + halo, seq_len))
        by_rows.setdefault((box[0].start, box[0].stop), []).append(window)
    total = 0
    for (row_start, row_stop), windows in by_rows.items():
        covered, reach = 0, 0
        for start, stop in sorted(windows):
            covered += max(stop - max(start, reach), 0)
            reach = max(reach, stop)
        total += (row_stop - row_start) * covered
    return total


def measure_pod(
    mesh: MeshLayout,
    batch_axes: tuple[str, ...],
    model: str,
    shape: tuple[int, int],
    halo: int,
    itemsize: int,
) -> dict[str, Any]:
    """Per-host bytes, totals and duplication factors of every strategy on one pod."""
    per_host: list[dict[str, int]] = [{} for _ in range(mesh.num_processes)]
    for strategy, spec in specs(batch_axes, model).items():
        pod = plan_pod(mesh, spec, shape)
        for p in range(mesh.num_processes):
            plan = pod.plan(p)
            elements = plan.num_elements
            if strategy == "sequence+halo":
                elements = halo_union_elements(plan, halo)
            per_host[p][strategy] = elements * itemsize
    batch_bytes = shape[0] * shape[1] * itemsize
    totals = {s: sum(host[s] for host in per_host) for s in STRATEGIES}
    return {
        "axes": mesh.axis_sizes,
        "hosts": mesh.num_processes,
        "batch_axes": list(batch_axes),
        "model_axis": model,
        "specs": {s: _spec_text(spec) for s, spec in specs(batch_axes, model).items()},
        "batch_bytes": batch_bytes,
        "per_host": per_host,
        "ratio_to_batch": [{s: host[s] / host["BATCH"] for s in STRATEGIES} for host in per_host],
        "total_bytes": totals,
        "duplication": {s: totals[s] / batch_bytes for s in STRATEGIES},
    }


def _spec_text(spec: tuple[Any, ...]) -> str:
    def entry(e: Any) -> str:
        if isinstance(e, str) or len(e) == 1:
            return repr(e if isinstance(e, str) else e[0])
        return "(" + ", ".join(map(repr, e)) + ")"

    return "P(" + ", ".join(entry(e) for e in spec) + ")"


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1: ``128 B``, ``304 KiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def _host_groups(per_host: list[dict[str, int]]) -> list[tuple[list[int], dict[str, int]]]:
    """Hosts with identical figures, grouped (in a symmetric pod, one group)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for p, host in enumerate(per_host):
        groups.setdefault(tuple(host[s] for s in STRATEGIES), []).append(p)
    return [(hosts, dict(zip(STRATEGIES, key, strict=True))) for key, hosts in groups.items()]


def _hosts_text(hosts: list[int]) -> str:
    if hosts == list(range(hosts[0], hosts[-1] + 1)) and len(hosts) > 2:
        return f"{hosts[0]}-{hosts[-1]}"
    return ", ".join(map(str, hosts))


def markdown(result: dict[str, Any]) -> str:
    """One table: per pod, per group of identical hosts, bytes and ratio to BATCH; then totals."""
    lines = [
        f"Token leaf ({result['batch_size']}, {result['seq_len']}), {result['itemsize']} bytes per "
        f"item, halo {result['halo']}; bytes read per host per step (ratio to BATCH).",
        "",
        "| pod | hosts | " + " | ".join(STRATEGIES) + " |",
        "|---|---|" + "---:|" * len(STRATEGIES),
    ]
    for name, pod in result["pods"].items():
        for hosts, figures in _host_groups(pod["per_host"]):
            cells = [
                f"{_size(figures[s])} ({figures[s] / figures['BATCH']:.3g}x)" for s in STRATEGIES
            ]
            lines.append(f"| {name} | {_hosts_text(hosts)} | " + " | ".join(cells) + " |")
        dup = [
            f"{_size(pod['total_bytes'][s])} ({pod['duplication'][s]:.4g}x batch)"
            for s in STRATEGIES
        ]
        lines.append(f"| {name} | all hosts | " + " | ".join(dup) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pod",
        action="append",
        help="AXES@HOSTS, last axis the model axis, e.g. data=4,model=4@4 (repeatable; default: "
        + " and ".join(DEFAULT_PODS)
        + ")",
    )
    parser.add_argument(
        "--layout", choices=("noncontiguous", "contiguous"), default="noncontiguous"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="B, rows of the token leaf")
    parser.add_argument("--seq-len", type=int, default=4096, help="S, columns of the token leaf")
    parser.add_argument("--halo", type=int, default=128, help="halo columns on each side")
    parser.add_argument("--itemsize", type=int, default=4, help="bytes per item (int32: 4)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    shape = (args.batch_size, args.seq_len)
    result: dict[str, Any] = {
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "halo": args.halo,
        "itemsize": args.itemsize,
        "layout": args.layout,
        "pods": {},
    }
    for text in args.pod or DEFAULT_PODS:
        name, mesh, batch_axes, model = parse_pod(text, args.layout)
        result["pods"][name] = measure_pod(mesh, batch_axes, model, shape, args.halo, args.itemsize)
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
