"""The benchmark's report: one JSON-able dict, and its markdown (``docs/measurements/performance.md``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from typing import Any

import jax

from psdp.tools.benchmarks.common import DEVICES, FIGURES


def machine() -> dict[str, Any]:
    """Where the figures were measured.

    Examples:
        >>> machine()["devices"]
        '8 fake CPU devices'
    """
    return {
        "cpu_cores": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "devices": f"{DEVICES} fake CPU devices",
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: the machine and command, then one table per figure.

    Examples:
        >>> figure = {"title": "Planning", "ratio_means": "speed-up", "rows": [{"ratio": 12.5}]}
        >>> report = {"command": "psdp bench", "quick": True, "machine": {"cpu_cores": 2},
        ...           "figures": {"planning": figure}}
        >>> print(markdown(report))  # doctest: +NORMALIZE_WHITESPACE
        # psdp benchmark
        <BLANKLINE>
        Command: `psdp bench`
        Machine: cpu_cores 2
        Mode: quick (CI sizes)
        <BLANKLINE>
        ## 4. Planning
        <BLANKLINE>
        Ratio: speed-up.
        <BLANKLINE>
        | ratio |
        |---|
        | 12.5 |
        <BLANKLINE>
    """
    lines = [
        "# psdp benchmark",
        "",
        f"Command: `{report['command']}`  ",
        "Machine: "
        + ", ".join(f"{k} {v}" for k, v in report["machine"].items())
        + f"  \nMode: {'quick (CI sizes)' if report['quick'] else 'full'}",
        "",
    ]
    for key in FIGURES:
        if key in report["figures"]:
            lines += markdown_figure(key, report["figures"][key])
    return "\n".join(lines)


def markdown_figure(key: str, figure: dict[str, Any]) -> list[str]:
    """One figure's heading, ratio meaning, note and table, as markdown lines, then its goals'
    table where it has one.

    Every column any row has, in first-seen order; a row without it shows ``-``.

    Examples:
        >>> figure = {"title": "Stall", "ratio_means": "wait fraction",
        ...           "rows": [{"ratio": 0.004, "ok": True}, {"ratio": 0.5, "note": "slow"}]}
        >>> print("\\n".join(markdown_figure("stall", figure)[4:]))
        | ratio | ok | note |
        |---|---|---|
        | 0.004 | yes | - |
        | 0.5 | - | slow |
        <BLANKLINE>
    """
    lines = [f"## {FIGURES.index(key) + 1}. {figure['title']}", ""]
    lines += [f"Ratio: {figure['ratio_means']}.", ""]
    if figure.get("note"):
        lines += [f"Note: {figure['note']}.", ""]
    lines += _table(figure["rows"])
    if figure.get("goals"):  # the goals the figure measures, met or not
        lines += ["Goals (one run):", "", *_table(figure["goals"])]
    return lines


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """Every column any row has, in first-seen order (``stats`` left out); ``-`` where a row
    has none."""
    columns = [c for c in rows[0] if c != "stats"]
    for row in rows[1:]:
        columns += [c for c in row if c not in columns and c != "stats"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    lines.append("")
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def rows(report: dict[str, Any], figure: str) -> Iterator[dict[str, Any]]:
    """The rows of one figure of a report (for tests and notebooks).

    Examples:
        >>> list(rows({"figures": {"stall": {"rows": [{"ratio": 0.0}]}}}, "stall"))
        [{'ratio': 0.0}]
    """
    yield from report["figures"][figure]["rows"]
