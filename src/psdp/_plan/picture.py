"""Text pictures of a plan (``psdp plan``): who owns each device, who shares data, who reads what.

`plan_summary` is the data, computed by the planner on a `MeshLayout` (no devices needed), and
`render_plan` only formats it; how to read the picture: ``docs/concepts/mesh.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from psdp._plan.layout import MeshLayout
from psdp._plan.mesh import (
    AxisNames,
    PodPlan,
    batch_axes_of,
    dp_index,
    local_device_mapping,
    merge_ranges,
    plan_pod,
    process_mesh_mapping,
    spec_axes,
    spec_entry,
)

Range = tuple[int, int]


# ------------------------------------------------------------------------------------ summary
def plan_summary(
    layout: MeshLayout, batch_axes: AxisNames, spec: Sequence[Any], global_shape: Sequence[int]
) -> dict[str, Any]:
    """The plan of every process as plain JSON-able data (what ``psdp plan --json`` prints).

    Ranges are half-open ``[start, stop]`` pairs, like Python slices. Mapping keys are strings so
    that the result survives a JSON round trip unchanged.

    Args:
        layout: the process of every mesh position.
        batch_axes: the batch axes, in the order the batch spec names them.
        spec: the leaf's `PartitionSpec` (or any sequence of spec entries).
        global_shape: the leaf's global shape, e.g. ``(batch_size,)`` or ``(batch_size, seq_len)``.

    Returns:
        A dict with keys ``mesh`` (the grid), ``spec``, ``global_shape``, ``uids`` (process ->
        uid from `process_mesh_mapping`), ``uid_groups`` (uid -> processes), ``read_uids`` (process
        -> uid of the whole read plan, which differs from ``uids`` when the spec also shards
        dimension 1) and ``processes`` (one entry per process).

    Examples:
        The example pod of ``docs/concepts/mesh.md``: process 0 reads rows 0-3 and 12-15 of 16.

        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> summary = plan_summary(layout, "data", ("data",), (16,))
        >>> summary["uids"], summary["uid_groups"]
        ({'0': 0, '1': 0, '2': 1, '3': 1}, {'0': [0, 1], '1': [2, 3]})
        >>> p0 = summary["processes"][0]
        >>> p0["devices"], p0["local_device_mapping"], p0["rows"]
        ([0, 1, 2, 3], {'0': 0, '3': 1}, [[0, 4], [12, 16]])
    """
    axes = batch_axes_of(batch_axes)
    pod = plan_pod(layout, spec, global_shape)
    uids = process_mesh_mapping(layout, axes)
    return {
        "mesh": _mesh_summary(layout, axes),
        "spec": [list(names) for names in spec_axes(layout, spec, len(pod.global_shape))],
        "global_shape": list(pod.global_shape),
        "uids": {str(p): u for p, u in uids.items()},
        "uid_groups": _groups(uids),
        "read_uids": {str(p): u for p, u in pod.uid_table().items()},
        "processes": [_process_summary(pod, axes, p, uids[p]) for p in layout.processes],
    }


def _mesh_summary(layout: MeshLayout, batch_axes: tuple[str, ...]) -> dict[str, Any]:
    """The layout as a (DP index) x (other axes) grid of device ids and processes."""
    batch_dims = [layout.axis_index(a) for a in batch_axes]
    other_dims = [d for d in range(len(layout.shape)) if d not in batch_dims]
    dp, num_dp = dp_index(layout, batch_axes)

    def as_grid(values: np.ndarray) -> np.ndarray:
        return np.transpose(values.reshape(layout.shape), batch_dims + other_dims).reshape(
            num_dp, -1
        )

    dp_grid = as_grid(dp)
    assert (dp_grid == dp_grid[:, :1]).all(), "each grid row must be one DP index"
    return {
        "axes": layout.axis_sizes,
        "batch_axes": list(batch_axes),
        "column_axes": [layout.axis_names[d] for d in other_dims],
        "num_devices": layout.num_devices,
        "num_processes": layout.num_processes,
        "row_dp_index": dp_grid[:, 0].tolist(),
        "device_ids": as_grid(_device_ids(layout)).tolist(),
        "processes": as_grid(layout.process_index).tolist(),
    }


def _device_ids(layout: MeshLayout) -> np.ndarray:
    if layout.device_ids is not None:
        return layout.device_ids
    return np.arange(layout.num_devices).reshape(layout.shape)


def _groups(table: dict[int, int]) -> dict[str, list[int]]:
    """uid -> the processes that have it, uids in ascending order."""
    groups: dict[int, list[int]] = {}
    for process, uid in table.items():
        groups.setdefault(uid, []).append(process)
    return {str(uid): groups[uid] for uid in sorted(groups)}


def _process_summary(
    pod: PodPlan, batch_axes: tuple[str, ...], process: int, uid: int
) -> dict[str, Any]:
    plan = pod.plan(process)
    mapping = local_device_mapping(pod.layout, batch_axes, process_index=process)
    ids = _device_ids(pod.layout).ravel()
    return {
        "process": process,
        "uid": uid,
        "read_uid": plan.uid,
        "devices": ids[plan.device_positions].tolist(),
        "local_device_mapping": {str(dp): slot for dp, slot in mapping.items()},
        "rows": [list(r) for r in _runs(plan.rows)],
        "row_blocks": [
            {
                "rows": [block.rows.start, block.rows.stop],
                "columns": None
                if block.columns is None
                else [[c.start, c.stop] for c in block.columns],
            }
            for block in plan.row_blocks
        ],
    }


def _runs(values: np.ndarray) -> list[Range]:
    """Sorted distinct ints as half-open runs of consecutive values: [0,1,2,5] -> [(0,3), (5,6)]."""
    if values.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts = values[np.concatenate(([0], breaks))]
    stops = values[np.concatenate((breaks - 1, [values.size - 1]))] + 1
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


# ------------------------------------------------------------------------------------ picture
def render_plan(
    layout: MeshLayout, batch_axes: AxisNames, spec: Sequence[Any], global_shape: Sequence[int]
) -> str:
    """A text picture of the plan: the mesh grid, the uid table, and each process's reads.

    Args:
        layout: the process of every mesh position.
        batch_axes: the batch axes, in the order the batch spec names them.
        spec: the leaf's `PartitionSpec` (or any sequence of spec entries).
        global_shape: the leaf's global shape, e.g. ``(batch_size,)`` or ``(batch_size, seq_len)``.

    Returns:
        Several lines of text. Ranges in the text are inclusive (``rows 0-3`` is rows 0, 1, 2, 3).

    Examples:
        Two hosts of 2 devices on ``data=2 x model=2``, each data row spanning both hosts: both
        hosts hold both DP indices, so they share one uid and both read all 8 rows.

        >>> layout = MeshLayout.noncontiguous({"data": 2, "model": 2}, num_processes=2)
        >>> print(render_plan(layout, "data", ("data",), (8,)))
        mesh data=2 x model=2: 4 devices on 2 processes; cell = device id, process
        rows: DP index over data=2; columns: model=2
        DP0 | d0 p0  d2 p1
        DP1 | d1 p0  d3 p1
        <BLANKLINE>
        uids (process_mesh_mapping): {0: 0, 1: 0}
          uid 0: p0 p1
        <BLANKLINE>
        reads for global shape (8,), spec P('data'):
        p0  uid 0  devices d0 d1  local_device_mapping {0: 0, 1: 1}
            rows 0-7
        p1  uid 0  devices d2 d3  local_device_mapping {0: 0, 1: 1}
            rows 0-7
    """
    summary = plan_summary(layout, batch_axes, spec, global_shape)
    sections = (_mesh_lines(summary["mesh"]), _uid_lines(summary), _read_lines(summary))
    return "\n\n".join("\n".join(lines) for lines in sections)


def _mesh_lines(mesh: dict[str, Any]) -> list[str]:
    sizes = mesh["axes"]
    header = (
        f"mesh {_axes_text(sizes, list(sizes))}: {mesh['num_devices']} devices on "
        f"{mesh['num_processes']} processes; cell = device id, process"
    )
    cells = [
        [f"d{d} p{p}" for d, p in zip(ids, procs, strict=True)]
        for ids, procs in zip(mesh["device_ids"], mesh["processes"], strict=True)
    ]
    width = max(len(cell) for row in cells for cell in row)
    labels = [f"DP{dp}" for dp in mesh["row_dp_index"]]
    label_width = max(len(label) for label in labels)
    grid = [
        f"{label:<{label_width}} | " + "  ".join(cell.ljust(width) for cell in row).rstrip()
        for label, row in zip(labels, cells, strict=True)
    ]
    return [header, _caption(mesh), *grid]


def _caption(mesh: dict[str, Any]) -> str:
    sizes, rows, columns = mesh["axes"], mesh["batch_axes"], mesh["column_axes"]
    row_text = f"DP index over {_axes_text(sizes, rows)}"
    column_text = _axes_text(sizes, columns) if columns else "none (every axis is a batch axis)"
    if len(rows) > 1:
        row_text += " (flattened, major to minor)"
    if len(columns) > 1:
        column_text += " (flattened row-major)"
    caption = f"rows: {row_text}; columns: {column_text}"
    if len(sizes) > 2:
        caption += f"; the {len(sizes)}-D mesh is drawn flattened to 2-D"
    return caption


def _axes_text(sizes: dict[str, int], names: Sequence[str]) -> str:
    return " x ".join(f"{name}={sizes[name]}" for name in names)


def _uid_lines(summary: dict[str, Any]) -> list[str]:
    lines = [f"uids (process_mesh_mapping): {_int_keys(summary['uids'])}"]
    lines += _group_lines(summary["uid_groups"])
    if summary["read_uids"] != summary["uids"]:
        lines.append(
            f"read-plan uids (spec {_spec_text(summary['spec'])} splits the batch differently "
            "from the batch axes, so hosts of one batch uid above can read different data; "
            f"the reads below are labelled with these): {_int_keys(summary['read_uids'])}"
        )
        lines += _group_lines(_groups(_int_keys(summary["read_uids"])))
    return lines


def _group_lines(groups: dict[str, list[int]]) -> list[str]:
    return [f"  uid {uid}: " + " ".join(f"p{p}" for p in procs) for uid, procs in groups.items()]


def _int_keys(table: dict[str, int]) -> dict[int, int]:
    return {int(k): v for k, v in table.items()}


def _spec_text(spec: list[list[str]]) -> str:
    entries = [repr(spec_entry(names)) for names in spec]
    return f"P({', '.join(entries)})"


def _read_lines(summary: dict[str, Any]) -> list[str]:
    shape = tuple(summary["global_shape"])
    lines = [f"reads for global shape {shape}, spec {_spec_text(summary['spec'])}:"]
    for process in summary["processes"]:
        devices = " ".join(f"d{d}" for d in process["devices"])
        mapping = _int_keys(process["local_device_mapping"])
        lines.append(
            f"p{process['process']}  {_uid_label(summary, process)}  devices {devices}  "
            f"local_device_mapping {mapping}"
        )
        lines.append(f"    {_reads_text(process)}")
    return lines


def _uid_label(summary: dict[str, Any], process: dict[str, Any]) -> str:
    """The uid of what this process reads under the spec; hosts with one label read the same.

    When the spec splits the batch differently from the batch axes (FULL, or a sharded
    sequence), two hosts of one batch uid can read different rows or columns, so the label is
    the read-plan uid and names the batch uid beside it.
    """
    if summary["read_uids"] == summary["uids"]:
        return f"uid {process['uid']}"
    return f"read uid {process['read_uid']} (batch uid {process['uid']})"


def _reads_text(process: dict[str, Any]) -> str:
    """``rows 0-3, 12-15``, or with sharded columns ``rows 0-3, 12-15 x cols 16-31``."""
    if all(block["columns"] is None for block in process["row_blocks"]):
        return f"rows {_ranges_text(process['rows'])}"
    by_columns: dict[str, list[Range]] = {}
    for block in process["row_blocks"]:
        columns = _ranges_text(block["columns"])
        by_columns.setdefault(columns, []).append(tuple(block["rows"]))
    return "; ".join(
        f"rows {_ranges_text(merge_ranges(rows))} x cols {columns}"
        for columns, rows in by_columns.items()
    )


def _ranges_text(ranges: Sequence[Sequence[int]]) -> str:
    """Half-open ranges as inclusive text: [[0, 4], [12, 16], [20, 21]] -> ``0-3, 12-15, 20``."""
    return ", ".join(f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in ranges)
