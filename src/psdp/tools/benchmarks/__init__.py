"""``psdp bench``: nine figures, each psdp against baselines measured in the same run.

What each figure measures, its baseline, how to read its ratio, and the results:
``docs/measurements/performance.md``. One module per figure; ``common`` holds the sizes and timing helpers,
``report`` the markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from psdp.tools.benchmarks.assembly import assembly_paths, bench_assembly
from psdp.tools.benchmarks.baselines import prefetched, tight_loop
from psdp.tools.benchmarks.common import (
    DEVICES,
    FIGURES,
    FULL,
    QUICK,
    BatchIds,
    Sizes,
    ask_for_cpu_devices,
    cpu_mesh,
    interleaved_ms,
    median_ms,
    with_changes,
)
from psdp.tools.benchmarks.grain_loops import load_grain
from psdp.tools.benchmarks.multihost import bench_multihost, pod_rows
from psdp.tools.benchmarks.object_store import bench_object_store
from psdp.tools.benchmarks.object_tokens import bench_object_tokens
from psdp.tools.benchmarks.planning import bench_planning, bench_pod, naive_uid_table, pods
from psdp.tools.benchmarks.report import machine, markdown, markdown_figure, rows
from psdp.tools.benchmarks.resume import bench_resume, rss_child
from psdp.tools.benchmarks.stall import LatencySource, bench_stall
from psdp.tools.benchmarks.throughput import bench_throughput
from psdp.tools.benchmarks.tokens import bench_tokens

__all__ = [
    "DEVICES",
    "FIGURES",
    "FULL",
    "QUICK",
    "RUNNERS",
    "BatchIds",
    "LatencySource",
    "Sizes",
    "assembly_paths",
    "bench_assembly",
    "bench_multihost",
    "bench_object_store",
    "bench_object_tokens",
    "bench_planning",
    "bench_pod",
    "bench_resume",
    "bench_stall",
    "bench_throughput",
    "bench_tokens",
    "cpu_mesh",
    "interleaved_ms",
    "load_grain",
    "machine",
    "main",
    "markdown",
    "markdown_figure",
    "median_ms",
    "naive_uid_table",
    "pod_rows",
    "pods",
    "prefetched",
    "rows",
    "rss_child",
    "run",
    "tight_loop",
    "with_changes",
]

#: The exit code of a usage error, as in `psdp.tools.cli`.
USAGE_ERROR = 2

RUNNERS: dict[str, Callable[[Sizes, Path], dict[str, Any]]] = {
    "assembly": lambda s, _: bench_assembly(s),
    "throughput": bench_throughput,
    "stall": bench_stall,
    "planning": lambda s, _: bench_planning(s),
    "resume": lambda s, _: bench_resume(s),
    "multihost": lambda s, _: bench_multihost(s),
    "object_store": lambda s, _: bench_object_store(s),
    "tokens": bench_tokens,
    "object_tokens": bench_object_tokens,
}


def run(
    figures: Sequence[str], quick: bool, command: str, sizes: Sizes | None = None
) -> dict[str, Any]:
    """Measures the chosen figures and returns the JSON-able report.

    ``sizes`` default to `QUICK` or `FULL`, as ``quick`` says.

    Examples:
        >>> report = run(["planning"], quick=True, command="psdp bench --quick")
        >>> list(report["figures"]), report["quick"], report["sizes"]["pod"]
        (['planning'], True, [256, 64, 8])
    """
    sizes = sizes or (QUICK if quick else FULL)
    report: dict[str, Any] = {
        "command": command,
        "quick": quick,
        "machine": machine(),
        "sizes": json.loads(json.dumps(asdict(sizes))),  # tuples as lists, as bench.json has them
        "figures": {},
    }
    with tempfile.TemporaryDirectory(prefix="psdp-bench-") as tmp:
        for name in figures:
            started = time.perf_counter()
            figure = report["figures"][name] = RUNNERS[name](sizes, Path(tmp))
            figure["seconds"] = time.perf_counter() - started
            print(f"psdp bench: {name} done in {figure['seconds']:.1f} s", file=sys.stderr)
            print("\n".join(markdown_figure(name, figure)), file=sys.stderr, flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints the markdown table and writes ``bench.md`` and ``bench.json``.

    ``--out`` and ``--set`` are checked before anything runs (a bad one is a one-line error and
    exit code 2), and the table is printed before the files are written, so a write that still
    fails loses nothing.

    Example (``--quick`` is what CI runs; the full run takes a minute or two)::

        psdp bench --out bench-results
        psdp bench --quick --only assembly planning --out /tmp/bench
        psdp bench --only planning --set pod=4096,1024,64 repeats=5
    """
    parser = argparse.ArgumentParser(prog="psdp bench", description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and few repeats (CI): seconds, not minutes"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="directory for bench.md, bench.json"
    )
    parser.add_argument(
        "--only", nargs="+", choices=FIGURES, default=list(FIGURES), help="figures to run"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="change sizes, e.g. --set rows=512 steps=20 train_ms=0,2 pod=4096,1024,64; the "
        f"fields: {', '.join(f.name for f in fields(Sizes))}",
    )
    args = parser.parse_args(argv)
    try:
        sizes = with_changes(QUICK if args.quick else FULL, args.set)
    except ValueError as err:
        return _usage_error(parser.prog, str(err))
    files = [args.out / "bench.md", args.out / "bench.json"]
    problem = _unwritable(args.out, files)
    if problem:
        return _usage_error(
            parser.prog, f"--out {args.out}: {problem}; choose a writable directory"
        )
    ask_for_cpu_devices(DEVICES)
    command = "psdp bench " + " ".join(sys.argv[1:] if argv is None else argv)
    report = run(args.only, args.quick, command.strip(), sizes)
    text = markdown(report)
    print(text, flush=True)  # first: the results survive a write that fails below
    try:
        files[0].write_text(text + "\n")
        files[1].write_text(json.dumps(report, indent=2) + "\n")
    except OSError as err:
        print(
            f"{parser.prog}: error: cannot write {args.out} ({err}); the table above has the "
            "results",
            file=sys.stderr,
        )
        return USAGE_ERROR
    print(f"wrote {files[0]} and {files[1]}")
    return 0


def _usage_error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _unwritable(out: Path, files: Sequence[Path]) -> str | None:
    """Why the results cannot be written to ``out`` (creating it if needed), or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        return f"cannot write there ({type(err).__name__}: {err.strerror or err})"
    for file in files:
        if file.exists() and not (file.is_file() and os.access(file, os.W_OK)):
            return f"{file} exists and cannot be overwritten"
    return None
