"""The ``psdp`` command line: one subcommand per task, each a small ``_add_*`` + ``_run_*`` pair.

Mental model. `main` builds the parser from `SUBCOMMANDS` (each entry registers one subparser and
sets its ``run`` function), runs the chosen command, and is the only place that turns a user error
into an exit code: every `ValueError` (the planner's messages already say the rule, the values and
the fix) and every argparse error becomes one line on stderr and exit code 2, never a traceback.
Errors raised while handling one option are prefixed with that option and its value by `_given`.

Adding a subcommand: write ``_add_<name>(subparsers)`` that calls ``subparsers.add_parser`` and
``set_defaults(run=_run_<name>)``, write ``_run_<name>(args) -> int``, and append ``_add_<name>`` to
`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from psdp.layout import MeshLayout
from psdp.mesh import _spec_axes, dp_index, plan_pod
from psdp.picture import plan_summary, render_plan

T = TypeVar("T")
Subparsers = Any  # argparse's private _SubParsersAction

USAGE_ERROR = 2
BUILTIN_LAYOUTS = ("contiguous", "noncontiguous")

# `psdp plan --example`: the seed pod of the Levanter PR (see docs/concepts.md).
EXAMPLE = {
    "axes": "data=4,model=4",
    "processes": 4,
    "layout": "noncontiguous",
    "batch_axes": "data",
    "spec": "data",
    "batch_size": 16,
}


class UsageError(Exception):
    """A user error, already phrased as one line: the option, the value received, and the fix."""

    def __init__(self, message: str, prog: str = "psdp") -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors reach `main` as `UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`", self.prog)


# --------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``psdp`` with ``argv`` (default ``sys.argv[1:]``) and returns the exit code.

    Example:
        >>> main(["plan", "--example", "--json"])  # doctest: +ELLIPSIS
        {
          "mesh": {
        ...
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help exits through argparse
        return done.code if isinstance(done.code, int) else 0
    except UsageError as err:
        return _fail(err.prog, err)
    try:
        return int(args.run(args))
    except (UsageError, ValueError) as err:
        return _fail(f"psdp {args.command}", err)


def _fail(prog: str, err: Exception) -> int:
    """Prints ``err`` as one line on stderr and returns the usage-error exit code."""
    print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
    return USAGE_ERROR


def build_parser() -> argparse.ArgumentParser:
    """The ``psdp`` parser with every subcommand of `SUBCOMMANDS` registered."""
    parser = _Parser(
        prog="psdp",
        description="Data loading for partially sharded data parallelism on JAX device meshes.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def _given(option: str, value: Any, action: Callable[..., T], *args: Any) -> T:
    """Runs ``action(*args)``, prefixing any `ValueError` with the option and value it came from."""
    try:
        return action(*args)
    except ValueError as err:
        raise UsageError(f"{option} {value}: {err}") from None


# --------------------------------------------------------------------------------------- plan
def _add_plan(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show which devices each host owns, which hosts share data, and which rows each reads",
        description=(
            "Print the data plan of a pod without any devices: the mesh as a grid, the uid table, "
            "and for every process its local_device_mapping and the rows (and columns) it reads."
        ),
    )
    parser.add_argument(
        "--example",
        action="store_true",
        help="the seed pod: data=4,model=4 on 4 processes, noncontiguous, batch 16; "
        "any option given overrides it",
    )
    parser.add_argument("--axes", help="mesh axes in order, NAME=SIZE pairs: data=4,model=4")
    parser.add_argument(
        "--processes", type=int, help="number of processes (hosts), for a built-in --layout"
    )
    parser.add_argument(
        "--layout",
        help="contiguous (default), noncontiguous, or PATH.json "
        '({"axis_names": [...], "process_index": nested lists})',
    )
    parser.add_argument(
        "--batch-axes", help="comma-separated batch axes, major to minor (default: spec entry 0)"
    )
    parser.add_argument(
        "--spec",
        help="partition spec, one entry per leaf dimension: NAME, (A,B) or A+B, None or -; "
        "e.g. '(replica,data),context' (default: the batch axes)",
    )
    parser.add_argument("--batch-size", type=int, help="global batch size (leaf dimension 0)")
    parser.add_argument("--seq-len", type=int, help="sequence length (leaf dimension 1)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(run=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    if args.example:
        _fill_example(args)
    layout = _plan_layout(args)
    spec, batch_axes = _plan_spec(args, layout)
    shape = _plan_shape(args, layout, spec)
    if args.json:
        print(json.dumps(plan_summary(layout, batch_axes, spec, shape), indent=2))
    else:
        print(render_plan(layout, batch_axes, spec, shape))
    return 0


def _fill_example(args: argparse.Namespace) -> None:
    """Fills every option not given from `EXAMPLE`; a layout file keeps its own axes and hosts."""
    from_file = args.layout is not None and args.layout not in BUILTIN_LAYOUTS
    for name, value in EXAMPLE.items():
        if getattr(args, name) is None and not (from_file and name in ("axes", "processes")):
            setattr(args, name, value)


def _plan_layout(args: argparse.Namespace) -> MeshLayout:
    kind = args.layout or "contiguous"
    if kind not in BUILTIN_LAYOUTS:
        return _layout_file(kind, args)
    if args.axes is None:
        raise UsageError(
            f"--layout {kind} needs --axes; give the mesh axes, e.g. --axes data=4,model=4"
        )
    if args.processes is None:
        raise UsageError(
            f"--layout {kind} needs --processes; give the number of hosts, e.g. --processes 4"
        )
    axes = _given("--axes", repr(args.axes), parse_axes, args.axes)
    _check_processes(args.processes, axes)
    builder = getattr(MeshLayout, kind)
    return _given(
        f"--layout {kind}", f"with --processes {args.processes}", builder, axes, args.processes
    )


def _check_processes(processes: int, axes: dict[str, int]) -> None:
    devices = math.prod(axes.values())
    if processes < 1 or devices % processes:
        divisors = [str(n) for n in range(1, devices + 1) if devices % n == 0]
        raise UsageError(
            f"--processes {processes}: the number of processes must be a positive divisor of the "
            f"{devices} devices of the mesh so that every process owns the same number of devices; "
            f"use one of {', '.join(divisors[:8])}{', ...' if len(divisors) > 8 else ''}"
        )


def _layout_file(path: str, args: argparse.Namespace) -> MeshLayout:
    if args.processes is not None:
        raise UsageError(
            f"--processes {args.processes}: a layout file already fixes the processes; drop "
            "--processes or use --layout contiguous/noncontiguous"
        )
    hint = "; use contiguous, noncontiguous or a JSON layout file"
    try:
        layout = MeshLayout.from_file(path)
    except ValueError as err:  # MeshLayout.from_file turns unreadable files into ValueError too
        raise UsageError(f"--layout {path!r}: {err}{hint}") from None
    if args.axes is not None:
        axes = _given("--axes", repr(args.axes), parse_axes, args.axes)
        if axes != layout.axis_sizes:
            raise UsageError(
                f"--axes {args.axes!r} does not match the layout file's axes {layout.axis_sizes}; "
                "drop --axes or make it agree with the file"
            )
    return layout


def _plan_spec(
    args: argparse.Namespace, layout: MeshLayout
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The spec entries and batch axes, each defaulting to the other."""
    spec = _given("--spec", repr(args.spec), parse_spec, args.spec) if args.spec else None
    if args.batch_axes:
        batch_axes = _given("--batch-axes", repr(args.batch_axes), parse_names, args.batch_axes)
        _given("--batch-axes", repr(args.batch_axes), dp_index, layout, batch_axes)
    elif spec and spec[0] is not None:
        batch_axes = (spec[0],) if isinstance(spec[0], str) else spec[0]
    else:
        raise UsageError(
            "--batch-axes is missing and --spec does not shard dimension 0; give the batch axes, "
            f"e.g. --batch-axes {layout.axis_names[0]}"
        )
    if spec is None:
        spec = (batch_axes[0] if len(batch_axes) == 1 else batch_axes,)
    return spec, batch_axes


def _plan_shape(
    args: argparse.Namespace, layout: MeshLayout, spec: tuple[Any, ...]
) -> tuple[int, ...]:
    if args.batch_size is None or args.batch_size < 1:
        raise UsageError(
            f"--batch-size {args.batch_size}: give the global batch size as a positive int, e.g. "
            "--batch-size 16"
        )
    if args.seq_len is not None and args.seq_len < 1:
        raise UsageError(
            f"--seq-len {args.seq_len}: give a positive sequence length, e.g. --seq-len 32"
        )
    shape = (args.batch_size,) if args.seq_len is None else (args.batch_size, args.seq_len)
    if len(spec) > len(shape):
        raise UsageError(
            f"--spec {args.spec!r} has {len(spec)} entries but the leaf has {len(shape)} "
            "dimension(s); give --seq-len for a second dimension or drop the extra entries"
        )
    _given("--spec", repr(args.spec), _spec_axes, layout, spec, len(shape))
    _given("--batch-size", args.batch_size, plan_pod, layout, spec[:1], shape[:1])
    if args.seq_len is not None:
        _given("--seq-len", args.seq_len, plan_pod, layout, spec, shape)
    return shape


# ------------------------------------------------------------------------------------ parsing
def parse_axes(text: str) -> dict[str, int]:
    """Parses ``--axes``: ``"data=4,model=4"`` -> ``{"data": 4, "model": 4}``.

    Example:
        >>> parse_axes("replica=2,data=2,model=2")
        {'replica': 2, 'data': 2, 'model': 2}
    """
    axes: dict[str, int] = {}
    for entry in text.split(","):
        name, sep, size = (part.strip() for part in entry.partition("="))
        if not sep or not name.isidentifier() or not size.isdigit() or int(size) < 1:
            raise ValueError(
                f"entry {entry.strip()!r} is not NAME=SIZE with a positive size; write the axes "
                "as NAME=SIZE pairs, e.g. --axes data=4,model=4"
            )
        if name in axes:
            raise ValueError(f"axis {name!r} is given twice; name each mesh axis once")
        axes[name] = int(size)
    return axes


def parse_names(text: str) -> tuple[str, ...]:
    """Parses a comma-separated list of axis names: ``"replica,data"`` -> ``("replica", "data")``."""
    names = tuple(part.strip() for part in text.split(","))
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise ValueError(
            f"{bad[0]!r} is not an axis name; give comma-separated axis names, e.g. replica,data"
        )
    return names


def parse_spec(text: str) -> tuple[Any, ...]:
    """Parses ``--spec`` into partition spec entries, one per leaf dimension.

    Each entry is an axis name, several axis names as ``(a,b)`` or ``a+b``, or ``None``/``-`` for
    a replicated dimension.

    Example:
        >>> parse_spec("(replica,data),context")
        (('replica', 'data'), 'context')
        >>> parse_spec("data+fsdp,-")
        (('data', 'fsdp'), None)
    """
    return tuple(_spec_entry(entry) for entry in _split_top_level(text))


def _split_top_level(text: str) -> list[str]:
    """Splits on the commas outside parentheses."""
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(
                "parentheses are unbalanced or nested; group axes once, e.g. '(replica,data),context'"
            )
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '(' is not closed; group axes like '(replica,data)'")
    return [*entries, current]


def _spec_entry(entry: str) -> str | tuple[str, ...] | None:
    entry = entry.strip()
    if entry in ("None", "-"):
        return None
    if entry.startswith("(") and entry.endswith(")"):
        names = parse_names(entry[1:-1])
    else:
        names = tuple(part.strip() for part in entry.split("+"))
    if not all(name.isidentifier() for name in names):
        raise ValueError(
            f"entry {entry!r} is not an axis name, (a,b), a+b, None or -; e.g. '(replica,data),context'"
        )
    return names[0] if len(names) == 1 else names


SUBCOMMANDS: list[Callable[[Subparsers], None]] = [_add_plan]
