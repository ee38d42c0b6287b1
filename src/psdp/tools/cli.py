"""The ``psdp`` command line: ``plan``, ``simulate``, ``write``, ``prepare``, ``index``,
``inspect`` and ``bench`` (``docs/reference/cli.md``).

Every user error, from argparse or from the library, ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

from psdp import PACKING_STRATEGIES, MeshConfig, MeshLayout, plan_pod
from psdp._integration.loader_config import BUILTIN_LAYOUTS, parse_axes, parse_names, parse_spec
from psdp._plan.mesh import dp_index, spec_axes
from psdp._plan.packing import LONG_DOCUMENTS
from psdp._plan.picture import plan_summary, render_plan
from psdp.tools.pod import PodError

T = TypeVar("T")
Subparsers = Any  # argparse's private _SubParsersAction

USAGE_ERROR = 2

#: `psdp plan --example`: the pod of docs/concepts/mesh.md.
EXAMPLE = {
    "axes": "data=4,model=4",
    "processes": 4,
    "layout": "noncontiguous",
    "batch_axes": "data",
    "batch_spec": "data",
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

    Examples:
        >>> main(["plan", "--example", "--json"])  # doctest: +ELLIPSIS
        {
          "mesh": {
        ...
        0
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        args.extra = extra
        if extra and not getattr(args, "passes_extra", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as done:  # --help exits through argparse
        return done.code if isinstance(done.code, int) else 0
    except UsageError as err:
        return _fail(err.prog, err)
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # here, so that a reader gone early is seen here and not at exit
        return code
    except (UsageError, ValueError) as err:
        return _fail(f"psdp {args.command}", err)
    except BrokenPipeError:  # `psdp plan | head`: the reader has all it wanted
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    """Points stdout at devnull, so that Python's flush at exit raises no second BrokenPipeError.

    The recipe of the Python docs (``signal``, "Note on SIGPIPE").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


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


def _add_batch_spec(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--batch-spec", help=help_text)
    parser.add_argument("--spec", dest="batch_spec", help=argparse.SUPPRESS)  # its old name


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
        help="the pod of docs/concepts/mesh.md: data=4,model=4 on 4 processes, noncontiguous, "
        "batch 16; any option given overrides it",
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
    _add_batch_spec(
        parser,
        "partition spec, one entry per leaf dimension: NAME, (A,B) or A+B, None or -; "
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
    # the same layout `psdp simulate` and a trainer's MeshConfig build: noncontiguous folds hosts
    # across the batch axes, which must lead
    batch = None if args.batch_axes is None else parse_names(args.batch_axes)
    config = _given(
        "--batch-axes", repr(args.batch_axes), lambda: MeshConfig(axes, batch, layout=kind)
    )
    return _given(
        f"--layout {kind}",
        f"with --processes {args.processes}",
        config.layout_for,
        args.processes,
        math.prod(axes.values()),
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
    text = args.batch_spec
    spec = _given("--batch-spec", repr(text), parse_spec, text) if text else None
    if args.batch_axes:
        batch_axes = _given("--batch-axes", repr(args.batch_axes), parse_names, args.batch_axes)
        _given("--batch-axes", repr(args.batch_axes), dp_index, layout, batch_axes)
    elif spec and spec[0] is not None:
        batch_axes = (spec[0],) if isinstance(spec[0], str) else spec[0]
    else:
        raise UsageError(
            "--batch-axes is missing and --batch-spec does not shard dimension 0; give the batch "
            f"axes, e.g. --batch-axes {layout.axis_names[0]}"
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
            f"--batch-spec {args.batch_spec!r} has {len(spec)} entries but the leaf has "
            f"{len(shape)} dimension(s); give --seq-len for a second dimension or drop the extra "
            "entries"
        )
    _given("--batch-spec", repr(args.batch_spec), spec_axes, layout, spec, len(shape))
    _given("--batch-size", args.batch_size, plan_pod, layout, spec[:1], shape[:1])
    if args.seq_len is not None:
        _given("--seq-len", args.seq_len, plan_pod, layout, spec, shape)
    return shape


# ----------------------------------------------------------------------------------- simulate
def _add_simulate(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a local multi-process pod: the loader (and with --train a tiny model) on every "
        "host, checking every device's rows",
        description=(
            "Launch N local processes (real jax.distributed on 127.0.0.1, k fake CPU devices each) "
            "on a chosen mesh layout, run the loader on every host, check every step that each "
            "device holds exactly its rows (psdp.check_consistency), and report steps/s and the "
            "loader wait per step. Without --source, a synthetic token dataset is written to a "
            "temporary TensorStore store. Defaults: the pod of docs/concepts/mesh.md (data=4,model=4 on "
            "4 processes, noncontiguous), batch 16 x 32 tokens, 300 steps."
        ),
    )
    parser.add_argument("--processes", type=int, default=4, help="processes (hosts); default 4")
    parser.add_argument("--axes", help="mesh axes, NAME=SIZE pairs (default data=4,model=4)")
    parser.add_argument(
        "--layout",
        help="contiguous, noncontiguous or PATH.json (default: noncontiguous for the default "
        "mesh, contiguous when --axes is given)",
    )
    parser.add_argument("--batch-axes", help="comma-separated batch axes (default: data-like axes)")
    _add_batch_spec(
        parser,
        "how the main leaf is sharded: batch, full, replicated or a spec like 'data,model' "
        "(default: batch)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="global batch size; default 16")
    parser.add_argument(
        "--seq-len",
        type=int,
        default=32,
        help="tokens per synthetic row, or per row of a document store's token view",
    )
    parser.add_argument("--steps", type=int, default=300, help="steps to run; default 300")
    parser.add_argument("--train", action="store_true", help="train a tiny model on the batches")
    parser.add_argument(
        "--vocab", type=int, default=64, help="vocabulary of the synthetic tokens and the model"
    )
    parser.add_argument(
        "--source",
        help="a psdp dataset directory, .npy file, or document store (read as TokenSequences "
        "of --seq-len, or packed with --packing) (default: synthetic)",
    )
    parser.add_argument(
        "--packing",
        choices=PACKING_STRATEGIES,
        help="pack documents (--source's document store, else synthetic ones) into sequences "
        "of --seq-len with this strategy (psdp.PackedSequences: input_ids, segment_ids, "
        "positions, loss_mask)",
    )
    parser.add_argument("--seed", type=int, help="shuffle seed")
    parser.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, default=None, help="shuffle rows"
    )
    parser.add_argument("--prefetch", type=int, help="batches prepared ahead")
    parser.add_argument("--read-threads", type=int, help="steps read concurrently")
    parser.add_argument(
        "--drop-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="drop each epoch's short final batch instead of padding it",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="the pod's time limit in seconds; default 300"
    )
    parser.add_argument(
        "--fail-at",
        metavar="P:STEP[:MODE]",
        help="testing aid: process P raises (MODE raise), kills itself (die) or hangs (hang) at "
        "STEP, to see the other hosts stop with its message",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from psdp.tools.simulate import check_simulation, report_json, simulate

    simulation = _simulation(args)
    check_simulation(
        simulation
    )  # a bad --batch-spec or --seq-len: one line, before any process starts
    bar = tqdm(total=simulation.steps, desc="simulate", unit="step", disable=args.json or None)
    if not args.json:
        print(
            f"psdp simulate: {simulation.processes} processes x "
            f"{simulation.devices_per_process()} devices, {simulation.steps} steps",
            flush=True,
        )

    def progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    try:
        with bar:
            report = simulate(simulation, progress=progress)
    except PodError as err:
        print(f"psdp simulate: error: {err}", file=sys.stderr)
        return 1
    print(report_json(report) if args.json else report)
    return 0


def _simulation(args: argparse.Namespace) -> Any:
    from psdp import LoaderConfig
    from psdp.tools.simulate import DEFAULT_MESH, Simulation

    if args.axes is None and args.layout is None and args.batch_axes is None:
        mesh = DEFAULT_MESH
    else:
        axes = (
            None if args.axes is None else _given("--axes", repr(args.axes), parse_axes, args.axes)
        )
        if axes is None and (args.layout or "").endswith(".json"):
            axes = MeshLayout.from_file(args.layout).axis_sizes
        elif axes is None:
            axes = DEFAULT_MESH.axes
        batch = None if args.batch_axes is None else parse_names(args.batch_axes)
        # only --axes changes the default layout (see --layout's help), not --batch-axes alone
        layout = args.layout or (DEFAULT_MESH.layout if args.axes is None else None)
        mesh = MeshConfig(axes=axes, batch_axes=batch, layout=layout)
    given = {
        "global_batch_size": args.batch_size,
        "batch_spec": args.batch_spec,
        "shuffle": args.shuffle,
        "seed": args.seed,
        "prefetch": args.prefetch,
        "read_threads": args.read_threads,
        "drop_last": args.drop_last,
    }
    data = LoaderConfig.create(args.source, **{k: v for k, v in given.items() if v is not None})
    return Simulation(
        processes=args.processes,
        mesh=mesh,
        data=data,
        steps=args.steps,
        train=args.train,
        seq_len=args.seq_len,
        vocab=args.vocab,
        packing=args.packing,
        timeout_s=args.timeout,
        fail_at=args.fail_at,
    )


# -------------------------------------------------------------------------------------- write
def _add_write(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "write",
        help="convert a .npy or .npz file (or a psdp dataset) to a psdp TensorStore dataset, or "
        "token files (.npy + offsets, .bin, .jsonl) to a document store",
        description=(
            "Write the rows of a .npy file (one array, reads return an array), a .npz file "
            "(one leaf per array, reads return a dict) or a psdp dataset directory (to change its "
            "layout, in place with --overwrite) to a psdp TensorStore dataset directory with "
            "psdp.write_dataset: zarr3, sharded files, one row per chunk. Token documents "
            "(a flat .npy with --offsets or --eos-id, a raw .bin with --eos-id, or a .jsonl of "
            "token-id lists) are written to a document store with psdp.write_documents. Either "
            "is written beside OUTPUT and renamed into place when complete."
        ),
    )
    parser.add_argument(
        "input",
        help="a .npy or .npz file (arrays share their first dimension), a psdp dataset "
        "directory, or token documents: a flat .npy or .bin token file, or a .jsonl file",
    )
    parser.add_argument(
        "output", help="the dataset or document store to create: a directory, URL or kvstore spec"
    )
    parser.add_argument("--rows-per-shard", type=int, help="rows per shard file (default 1024)")
    parser.add_argument("--rows-per-chunk", type=int, help="rows per inner chunk (default 1)")
    documents = parser.add_argument_group("token documents (a document store)")
    documents.add_argument(
        "--offsets", help="a .npy of D + 1 document offsets into the flat .npy INPUT"
    )
    documents.add_argument(
        "--eos-id",
        type=int,
        help="split the flat .npy or .bin INPUT after each token EOS_ID (kept as its "
        "document's last token)",
    )
    documents.add_argument("--key", help=".jsonl lines are objects: the key of their token-id list")
    documents.add_argument(
        "--dtype",
        help="the token dtype: of a raw .bin file (default uint16, nanoGPT's) or of the ids of a "
        ".jsonl file (default uint32); a .npy keeps its own",
    )
    documents.add_argument("--tokens-per-shard", type=int, help="tokens per shard file")
    documents.add_argument("--tokens-per-chunk", type=int, help="tokens per chunk")
    parser.add_argument("--compression", choices=["zstd", "gzip"], help="default: none")
    parser.add_argument("--no-checksum", action="store_true", help="no per-chunk crc32c")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    parser.add_argument("--json", action="store_true", help="print the dataset's metadata as JSON")
    _add_endpoint(parser)
    parser.set_defaults(run=_run_write)


#: the options of `psdp write` for rows and for token documents, refused for the other kind
ROW_OPTIONS = ("rows_per_shard", "rows_per_chunk")
DOCUMENT_OPTIONS = ("offsets", "eos_id", "key", "dtype", "tokens_per_shard", "tokens_per_chunk")


def _run_write(args: argparse.Namespace) -> int:
    args.output = _store("OUTPUT", args.output, args.endpoint)
    documents = args.input.endswith((".jsonl", ".bin")) or any(
        getattr(args, name) is not None for name in ("offsets", "eos_id")
    )
    wrong = [
        name
        for name in (ROW_OPTIONS if documents else DOCUMENT_OPTIONS)
        if getattr(args, name) is not None
    ]
    if wrong:
        option = "--" + wrong[0].replace("_", "-")
        kind = "token documents" if documents else f"the rows of {args.input!r}"
        raise UsageError(f"{option} does not apply to {kind}; see `psdp write --help`")
    return _write_documents(args) if documents else _write_rows(args)


def _write_rows(args: argparse.Namespace) -> int:
    from psdp.sources import read_metadata
    from psdp.sources.stores.writer import write_dataset

    arrays = _load_arrays(args.input, args.endpoint)
    try:
        path = write_dataset(
            args.output,
            arrays,
            rows_per_shard=1024 if args.rows_per_shard is None else args.rows_per_shard,
            rows_per_chunk=1 if args.rows_per_chunk is None else args.rows_per_chunk,
            compression=args.compression,
            checksum=not args.no_checksum,
            overwrite=args.overwrite,
            progress=not args.json,
        )
    except TypeError as err:  # only the arrays can have a wrong type or dtype
        raise UsageError(f"input {args.input!r}: {err}") from None
    except OSError as err:  # the output path exists, is a file, or cannot be created
        raise UsageError(f"output {args.output!r}: {err}") from None
    meta = read_metadata(path)
    if args.json:
        print(json.dumps({"path": _name(path), **meta}, indent=2))
    else:
        leaves = ", ".join(
            f"{name} {tuple(leaf['shape'])} {leaf['dtype']}"
            for name, leaf in meta["leaves"].items()
        )
        print(f"wrote {meta['num_rows']} rows to {_name(path)} (leaves: {leaves})")
    return 0


def _write_documents(args: argparse.Namespace) -> int:
    from psdp.sources import DocumentStore
    from psdp.sources.documents.writer import write_documents

    docs = _token_documents(args)
    sizes = {
        name: value
        for name in ("tokens_per_shard", "tokens_per_chunk")
        if (value := getattr(args, name)) is not None
    }
    try:
        path = write_documents(
            args.output,
            docs,
            dtype=docs.dtype,
            compression=args.compression,
            checksum=not args.no_checksum,
            overwrite=args.overwrite,
            progress=not args.json,
            **sizes,
        )
    except OSError as err:  # the output path exists, is a file, or cannot be created
        raise UsageError(f"output {args.output!r}: {err}") from None
    except TypeError as err:
        raise UsageError(f"input {args.input!r}: {err}") from None
    store = DocumentStore.open(path)
    dtype = store.leaves["input_ids"].name
    if args.json:
        summary = {
            "path": _name(path),
            "num_documents": store.num_documents,
            "num_tokens": store.num_tokens,
            "dtype": dtype,
            "empty_documents_left_out": docs.empty,
        }
        print(json.dumps(summary, indent=2))
        return 0
    left_out = f"; left out {docs.empty} empty documents" if docs.empty else ""
    print(
        f"wrote {store.num_documents} documents, {store.num_tokens} tokens to {_name(path)} "
        f"(input_ids {dtype}{left_out})"
    )
    return 0


def _token_documents(args: argparse.Namespace) -> Any:
    """The documents of INPUT as `psdp.tools.token_files.Documents`."""
    from psdp.tools import token_files

    path = args.input
    if path.endswith(".jsonl"):
        if args.offsets is not None or args.eos_id is not None:
            raise UsageError(f"--offsets and --eos-id read flat token files, not {path!r}")
        return token_files.jsonl_documents(path, args.dtype or "uint32", args.key)
    if args.key is not None:
        raise UsageError(f"--key names the token ids of .jsonl lines; {path!r} is not .jsonl")
    if not path.endswith((".npy", ".bin")):
        raise UsageError(
            f"input {path!r} must be a .npy, .bin or .jsonl file to write token documents"
        )
    if (args.offsets is None) == (args.eos_id is None):
        raise UsageError(
            f"give --offsets OFFSETS.npy or --eos-id ID (not both) to split {path!r} into "
            "documents"
        )
    tokens = token_files.flat_tokens(path, args.dtype)
    if args.offsets is not None:
        return token_files.split_at_offsets(tokens, args.offsets, path)
    return token_files.split_after_eos(tokens, args.eos_id)


def _load_arrays(path: str, endpoint: str | None) -> Any:
    """The rows of a .npy (one array, memory-mapped) or .npz (a dict of arrays) file, or of a
    psdp dataset (a directory, URL or kvstore spec; chunks read lazily, so OUTPUT may be the same
    dataset)."""
    import numpy as np

    hint = (
        "give a file written by np.save (.npy) or np.savez (.npz), or a psdp dataset (a "
        "directory, URL or kvstore spec)"
    )
    if os.path.isdir(path) or "://" in path or path.lstrip().startswith("{"):
        return _dataset_chunks(_store("INPUT", path, endpoint), hint)
    if not path.endswith((".npy", ".npz")):
        raise UsageError(f"input {path!r} must be a .npy or .npz file or a dataset; {hint}")
    try:
        if path.endswith(".npy"):
            return np.load(path, mmap_mode="r")
        with np.load(path) as saved:
            return {name: saved[name] for name in saved.files}
    except (OSError, ValueError) as err:
        raise UsageError(f"input {path!r} cannot be read ({err}); {hint}") from None


def _dataset_chunks(path: Any, hint: str) -> Iterator[Any]:
    """The rows of a psdp dataset in blocks of about `psdp.sources.stores.writer.BLOCK_BYTES`, read lazily."""
    import numpy as np

    from psdp.sources import TensorStoreSource
    from psdp.sources.stores.writer import BLOCK_BYTES

    try:
        source = TensorStoreSource(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"input {path!r} cannot be read ({err}); {hint}") from None
    row = source.read(np.zeros(1, np.int64))
    row_bytes = sum(leaf.nbytes for leaf in (row.values() if isinstance(row, dict) else [row]))
    step = max(1, BLOCK_BYTES // max(1, row_bytes))
    return (
        source.read(np.arange(start, min(start + step, len(source))))
        for start in range(0, len(source), step)
    )


# -------------------------------------------------------------------------------------- bench
def _add_bench(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run the benchmarks (psdp bench --help for their options)",
        description="Run psdp's benchmarks; every argument goes to psdp.tools.benchmarks.",
        add_help=False,
    )
    parser.set_defaults(run=_run_bench, passes_extra=True)


def _run_bench(args: argparse.Namespace) -> int:
    from psdp.tools import benchmarks  # imported here: it pulls in every benchmark's dependencies

    return int(benchmarks.main(args.extra))


def _add_prepare(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="tokenize text (jsonl, Parquet, Arrow, a datasets export) into a document store",
        description=(
            "Tokenize the text of INPUTS (files, globs or datasets save_to_disk directories, "
            "local or s3://, gs://) with a Hugging Face tokenizer into a document store that "
            "DocumentStore.open reads, in parts committed one at a time: a killed run resumes, "
            "new inputs are appended. docs/guides/prepare.md."
        ),
    )
    parser.add_argument("inputs", nargs="+", help="files, globs or datasets directories")
    parser.add_argument(
        "--output", required=True, help="the store: a directory, URL or kvstore spec (JSON)"
    )
    parser.add_argument(
        "--tokenizer", required=True, help="a tokenizer.json or a directory holding one"
    )
    text = parser.add_mutually_exclusive_group()
    text.add_argument("--field", default="text", help="the text field of each record")
    text.add_argument("--messages", help="a field of chat messages, rendered by the chat template")
    parser.add_argument("--bos", help="a token (or id) put before each document")
    parser.add_argument("--eos", help="a token (or id) put after each document")
    parser.add_argument("--workers", type=int, help="local worker processes (default: cores)")
    parser.add_argument("--engine", choices=["local", "ray"], default="local")
    parser.add_argument("--ray-address", help="the Ray cluster to run on (--engine ray)")
    parser.add_argument(
        "--skip-bad", action="store_true", help="skip malformed records, counted by reason"
    )
    parser.add_argument("--rows-per-part", type=int, help="Parquet/Arrow rows per part")
    _add_pack_flags(parser, "then build the pack index of this packing in windows beside the store")
    parser.add_argument(
        "--bytes-per-part", type=int, help="uncompressed jsonl bytes per part (0: a file a part)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object (no bar)"
    )
    _add_endpoint(parser)
    parser.set_defaults(run=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> int:
    from psdp.prepare import BYTES_PER_PART, ROWS_PER_PART, prepare

    def token(value: str | None) -> str | int | None:
        return int(value) if value is not None and value.isdigit() else value

    try:
        summary = prepare(
            [_store("INPUTS", given, args.endpoint) for given in args.inputs],
            _store("--output", args.output, args.endpoint),
            tokenizer=args.tokenizer,
            field=args.field,
            messages_field=args.messages,
            bos=token(args.bos),
            eos=token(args.eos),
            workers=args.workers,
            engine=args.engine,
            ray_address=args.ray_address,
            skip_bad=args.skip_bad,
            rows_per_part=args.rows_per_part or ROWS_PER_PART,
            bytes_per_part=_bytes_per_part(args.bytes_per_part, BYTES_PER_PART),
            progress=not (args.no_progress or args.json),
            packs=_packs(args),
        )
    except (OSError, TypeError, ImportError) as error:  # a missing input or extra: one line
        raise UsageError(str(error), "psdp prepare") from error
    print(json.dumps(summary.to_json(), indent=2) if args.json else summary)
    return 0


# -------------------------------------------------------------------------------------- index
def _add_pack_flags(parser: argparse.ArgumentParser, help_text: str) -> None:
    group = parser.add_argument_group("pack indexes (docs/guides/packing.md)")
    group.add_argument(
        "--pack", action="append", default=[], metavar="SEQ_LEN,WINDOW",
        help=f"{help_text}; repeat for several packings",
    )  # fmt: skip
    group.add_argument(
        "--strategy", default="best_fit", choices=list(PACKING_STRATEGIES),
        help="the view's packing (default best_fit)",
    )  # fmt: skip
    group.add_argument(
        "--long-documents", default="split", choices=list(LONG_DOCUMENTS), help="default split"
    )
    group.add_argument("--seed", type=int, help="the packing's seed (default: store order)")
    group.add_argument(
        "--pack-eos", dest="pack_eos", action="store_true",
        help="the view puts an EOS after every document (a DataConfig view with eos_id)",
    )  # fmt: skip
    group.add_argument(
        "--max-segments", dest="max_segments", type=int, metavar="N",
        help="the view packs at most N documents into a row (default: no cap)",
    )  # fmt: skip


def _packs(args: argparse.Namespace) -> list[Any]:
    from psdp.sources.documents.beside import PackSettings

    options = {"strategy": args.strategy, "long_documents": args.long_documents,
               "seed": args.seed, "eos": args.pack_eos,
               "max_segments": args.max_segments}  # fmt: skip

    def parsed(text: str) -> Any:
        return PackSettings.parse(text, **options)

    return [_given("--pack", text, parsed, text) for text in args.pack]


def _lengths(args: argparse.Namespace) -> list[Any]:
    """``--min-length``/``--max-length`` as one `LengthBounds` (none if neither is given)."""
    from psdp.sources.documents.beside import LengthBounds

    if args.min_length is None and args.max_length is None:
        return []
    try:
        return [LengthBounds(args.min_length, args.max_length)]
    except (TypeError, ValueError) as error:
        flags = [("--min-length", args.min_length), ("--max-length", args.max_length)]
        given = " ".join(f"{name} {value}" for name, value in flags if value is not None)
        raise UsageError(f"{given}: {error}", "psdp index") from None


def _add_index(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build a document store's indexes beside it, once, for every host to load",
        description=(
            "Build the indexes of STORE (a psdp store, or a Levanter cache with --format "
            "levanter; local, s3:// or gs://) beside it, in STORE/psdp-index/: a Levanter "
            "cache's document index, the pack index of each --pack, and the length index of "
            "--min-length/--max-length (docs/guides/mixtures.md). In parallel (local "
            "processes, or --engine ray), resumable (a killed run keeps its finished parts), "
            "each index written whole. A DataConfig finds them there and checks them; an "
            "index that is up to date is kept. docs/guides/packing.md."
        ),
    )
    parser.add_argument("store", help="the store: a directory, URL or kvstore spec (JSON)")
    parser.add_argument("--format", choices=["psdp", "levanter"], default="psdp")
    _add_pack_flags(parser, "build the pack index of this packing in windows")
    group = parser.add_argument_group("length indexes (docs/guides/mixtures.md)")
    group.add_argument(
        "--min-length", dest="min_length", type=int, metavar="N",
        help="index the documents of at least N tokens, for a source with min_length: N",
    )  # fmt: skip
    group.add_argument(
        "--max-length", dest="max_length", type=int, metavar="N",
        help="index the documents of at most N tokens (max_length: N); with --min-length, both",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=int,
        help="local worker processes (default: one per core, at most one per 4 million documents)",
    )  # fmt: skip
    parser.add_argument("--engine", choices=["local", "ray"], default="local")
    parser.add_argument("--ray-address", help="the Ray cluster to run on (--engine ray)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the indexes as JSON (no bar)")
    _add_endpoint(parser)
    parser.set_defaults(run=_run_index)


def _run_index(args: argparse.Namespace) -> int:
    from psdp.prepare.indexes import build_indexes

    packs, lengths = _packs(args), _lengths(args)
    if not packs and not lengths and args.format == "psdp":
        raise UsageError(
            "a psdp store commits its document index with its documents: name a packing to "
            "index, e.g. --pack 4096,4096 (SEQ_LEN,WINDOW), a selection by length, e.g. "
            "--min-length 8192, or --format levanter for a Levanter cache's document index",
            "psdp index",
        )
    try:
        records = build_indexes(
            _store("STORE", args.store, args.endpoint), packs, lengths=lengths,
            format=args.format,
            workers=args.workers, engine=args.engine, ray_address=args.ray_address,
            progress=not (args.no_progress or args.json),
        )  # fmt: skip
    except (OSError, TypeError, ImportError) as error:  # a missing store or extra: one line
        raise UsageError(str(error), "psdp index") from error
    if args.json:
        print(json.dumps(records, indent=2))
    for record in [] if args.json else records:
        counts = "".join(f", {record[k]:,} {k}" for k in ("windows", "sequences", "documents",
                                                           "tokens") if k in record)  # fmt: skip
        print(f"{record['index']}: {record['state']}{counts} ({record['seconds']:.1f} s)")
        if record.get("documents") == 0:  # a length index: a source of it would be refused
            print(f"  warning: {record['index']} selects no document", file=sys.stderr)
    return 0


def _bytes_per_part(given: int | None, default: int) -> int | None:
    """``--bytes-per-part``: unset, the default; 0, a jsonl file a part (``None``)."""
    return default if given is None else (given or None)


# ------------------------------------------------------------------------------------ inspect
def _add_inspect(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show what step N of a data config trains on (offsets, stage, per-source counts, "
        "its rows as text), or a saved loader state in words",
        description=(
            "With CONFIG (a DataConfig's YAML or JSON, or a trainer's config with a data: "
            "section; its paths relative to the current folder) and --step N: the step's sample "
            "offsets, its mixture stage and weights, the rows each source gives it, and each row's "
            "segments (document, token range, column) decoded to text with the tokenizer the "
            "store was prepared with. Reads only the step's rows. With --state CHECKPOINT: the "
            "loader state saved there (a JSON file, or an Orbax checkpoint: a manager's folder, "
            "a step or the item) in words; with CONFIG and --step too, the step of the run resumed from "
            "it. docs/reference/cli.md."
        ),
    )
    parser.add_argument("config", nargs="?", help="the data config (YAML or JSON)")
    parser.add_argument("--step", type=int, help="the step to show (0 is the first)")
    parser.add_argument(
        "--rows", metavar="START:STOP",
        help="show only these rows of the step (positions in it, as a Python slice; default all)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer",
        help="decode with this tokenizer.json (or model folder) instead of the config's; checked "
        "against the sha256 the store records",
    )
    parser.add_argument(
        "--state", metavar="CHECKPOINT",
        help="alone: show the loader state of a JSON file or an Orbax checkpoint; with CONFIG "
        "and --step: the run resumed from it (its later steps counted from its sample offset)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from psdp.tools import inspection

    state = None
    if args.state is not None:
        try:
            state, file = inspection.read_state(args.state)
        except FileNotFoundError as error:
            raise UsageError(str(error)) from None
    if state is not None and args.config is None and args.step is None:
        if args.json:
            print(json.dumps({"file": str(file), "state": state}, indent=2))
        else:
            print(f"loader state of {file}:\n{inspection.describe_state(state)}")
        return 0
    if args.config is None or args.step is None:
        raise UsageError(
            "give a config and a step, e.g. `psdp inspect train.yaml --step 100`, or a "
            "checkpoint, e.g. `psdp inspect --state checkpoints/`"
        )
    if args.step < 0:
        raise UsageError(f"--step {args.step}: give a step >= 0, e.g. --step 100")
    rows = _given("--rows", repr(args.rows), _row_slice, args.rows)
    try:
        config, run_steps = inspection.load_config(args.config)
        report = inspection.step_report(
            config, args.step, run_steps=run_steps, rows=rows, tokenizer=args.tokenizer,
            resumed_from=state,
        )  # fmt: skip
    except (FileNotFoundError, TypeError, ImportError) as error:
        raise UsageError(str(error)) from None
    print(json.dumps(report.to_json(), indent=2, ensure_ascii=False) if args.json else report)
    return 0


def _row_slice(text: str | None) -> slice:
    """``--rows START:STOP`` (either end may be left out) as a slice."""
    if text is None:
        return slice(None)
    start, colon, stop = text.partition(":")
    try:
        if not colon:
            return slice(int(start), int(start) + 1)
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(
            "give rows as START:STOP, e.g. --rows 0:4 (or one row: --rows 3)"
        ) from None


# ------------------------------------------------------------------------------ object stores
def _add_endpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        help="the endpoint of every s3:// URL given, e.g. http://127.0.0.1:9000 (default: "
        "AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS itself), or of every gs:// URL "
        "(it sets TENSORSTORE_GCS_HTTP_URL for the command; default: that variable, else Google "
        "Cloud Storage itself)",
    )


def _store(option: str, value: str, endpoint: str | None) -> Any:
    """A store argument as the library takes it: a path or URL (an ``s3://`` URL with
    ``endpoint``; for a ``gs://`` one, ``endpoint`` goes to the environment), or a TensorStore
    kvstore spec given as JSON (``{"driver": "s3", ...}``)."""
    from psdp.sources.stores.location import with_endpoint

    given: Any = value
    if value.lstrip().startswith("{"):
        try:
            given = json.loads(value)
        except json.JSONDecodeError as err:
            raise UsageError(
                f"{option} {value!r} is not a JSON kvstore spec ({err}); give a path, a URL or "
                'a spec such as \'{"driver": "s3", "bucket": "b", "path": "corpus/"}\''
            ) from None
    return with_endpoint(given, endpoint, "--endpoint")


def _name(where: Any) -> str:
    """A path, URL or kvstore spec as one name, for what the CLI prints."""
    from psdp.sources.stores.location import locate

    return locate(where).name


SUBCOMMANDS: list[Callable[[Subparsers], None]] = [
    _add_plan,
    _add_simulate,
    _add_write,
    _add_prepare,
    _add_index,
    _add_inspect,
    _add_bench,
]
