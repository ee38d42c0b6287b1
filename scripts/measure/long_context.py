"""Length stages at seq_len 131,072 x context 4 against the same job at 4,096: per-host tokens/s
and bytes read per host per step (issue 38's goal; docs/measurements/tokens.md, "Long context").

The job: one `StagedTokens` over a memmap store (documents of log-normal lengths, ``uint16`` ids
in ``.npy`` files opened with ``mmap_mode="r"``, no EOS), two stages: ``seq_len`` 4,096 with a
global batch of 256, then 131,072 with a batch of 8 (the same 2^20 tokens a step). A
``data=2 x context=4`` mesh of fake CPU devices, one device a host: `tests/fake_hosts.py` plans,
reads and cuts exactly one host's boxes in this process, the whole loader but JAX's last
placement. Every leaf (``input_ids``, ``segment_ids``, ``positions``) is ``P("data",
"context")``, ``input_ids`` with a pad halo of ``--halo`` columns, so a host holds 131,072 tokens
a step at both lengths. `TokenSequences` at both lengths (rows in a shuffled order, the same
mesh and leaves) is the reference: it reads a window of a row as one range of the store.

1. Checked first, on every host, at one step of each length: each shard of every leaf equals
   the whole rows (``read``) at its box (tests/batch_checks.py's expected batch, halo included),
   and, through a counting store, the ``input_ids`` tokens the host reads are exactly its rows
   times its columns plus halos (clipped to the row). (That they are the right tokens, each
   once within an epoch, tests/test_staged_tokens.py checks against the oracle.)
2. Timed: the hosts of data row 0 (context shards 0 to 3), ``--steps`` steps of each job per
   round, the jobs in turn, ``--rounds`` rounds; wall and CPU milliseconds per step (one read at
   a time, ``batch_at``: no prefetch hides a slow read). Per-host tokens/s: the host's 131,072
   tokens over the median wall time. The goal: 131,072's over 4,096's >= 0.8.

    python scripts/measure/long_context.py [--steps 4] [--rounds 3] [--halo 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fake_hosts

from psdp.tools.benchmarks.common import ask_for_cpu_devices

ask_for_cpu_devices(8)

from jax.sharding import PartitionSpec as P  # noqa: E402
from tests.batch_checks import expected_batch  # noqa: E402
from tests.fake_hosts import fake_pod, host_batch  # noqa: E402
from tests.meshes import mesh_of  # noqa: E402
from tests.pod_targets_tokens import CountingStore  # noqa: E402

from psdp import DataLoader, DocumentStore, StagedTokens, TokenSequences  # noqa: E402

DATA, CONTEXT = 2, 4
LEAVES = ("input_ids", "segment_ids", "positions")
ITEMSIZE = 2  # uint16 ids


def corpus(folder: Path, tokens: int, seed: int = 0) -> tuple[Path, Path]:
    """``offsets.npy`` and ``tokens.npy`` of about ``tokens`` tokens in documents of log-normal
    lengths (mean ~900, at most 64k)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.3, 1.0, tokens // 400), 1, 65_536).astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    paths = folder / "offsets.npy", folder / "tokens.npy"
    np.save(paths[0], offsets)
    np.save(paths[1], rng.integers(0, 65_536, int(offsets[-1]), dtype=np.uint16))
    return paths


def store_of(paths: tuple[Path, Path], kind: type[DocumentStore] = DocumentStore) -> Any:
    offsets, tokens = (np.load(p, mmap_mode="r") for p in paths)
    return kind.from_arrays(offsets, {"input_ids": tokens})


def jobs(store: DocumentStore, lengths: Lengths, long_from: int) -> dict[str, tuple[Any, Any, int]]:
    """name -> (source, global batch schedule, a first step of the job)."""
    short, long, step = lengths
    staged = StagedTokens(
        {"a": store}, [(0, short, {"a": 1}), (long_from * step // short, long, {"a": 1})],
        lanes=step // short, block_size=step // long, seed=3,
    )  # fmt: skip
    ramp = [(0, step // short), (long_from, step // long)]
    return {
        f"StagedTokens {short:,}": (staged, ramp, 0),
        f"StagedTokens {long:,}": (staged, ramp, long_from),
        f"TokenSequences {short:,}": (TokenSequences(store, short), step // short, 0),
        f"TokenSequences {long:,}": (TokenSequences(store, long), step // long, 0),
    }


def settings(halo: int, mesh: Any) -> dict[str, Any]:
    return {"mesh": mesh, "batch_spec": {k: P("data", "context") for k in LEAVES},
            "halo": {"input_ids": halo} if halo else 0, "seed": 1}  # fmt: skip


def share(loader: Any, step: int, host: int, halo: int, step_tokens: int) -> int:
    """The ``input_ids`` tokens host ``host`` holds at ``step``: its rows times its columns plus
    halos, clipped to the row."""
    info = loader.step_info(step)
    width = step_tokens // info.batch_size  # the step's seq_len
    c, rows = host % CONTEXT, info.batch_size // DATA
    w = width // CONTEXT
    return rows * (min(width, (c + 1) * w + halo) - max(0, c * w - halo))


def check(
    paths: tuple[Path, Path], lengths: Lengths, halo: int, long_from: int, mesh: Any
) -> dict[str, Any]:
    """Every host: its shards of one step of each job equal the whole rows at their boxes, and
    its ``input_ids`` reads are exactly its share (`share`)."""
    layout = np.arange(DATA * CONTEXT).reshape(DATA, CONTEXT)
    out: dict[str, Any] = {}
    with fake_pod(mesh, layout) as process_of:
        for host in range(DATA * CONTEXT):
            store = store_of(paths, CountingStore)
            for name, (source, batch, first) in jobs(store, lengths, long_from).items():
                with DataLoader(source, global_batch_size=batch, process_index=host,
                                **settings(halo, mesh)) as loader:  # fmt: skip
                    step = first + 1
                    info = loader.step_info(step)
                    ids = np.arange(info.batch_size) + info.offset  # it orders itself
                    store.ranges.clear()
                    got = host_batch(loader, step, process_of)
                    read = sum(b - a for _, a, b in store.ranges)
                    want_read = share(loader, step, host, halo, lengths[2])
                    assert read == want_read, (name, host, read, want_read)
                    if isinstance(source, StagedTokens):
                        rows = source.read(ids)
                        want = expected_batch(rows, 0, shuffle=False, global_batch_size=info.batch_size,
                                              **settings(halo, mesh))  # fmt: skip
                        for key, shards in got.items():
                            boxes = shards.sharding.devices_indices_map(shards.shape)
                            for device, value in shards.shards.items():
                                np.testing.assert_array_equal(value, want[key][boxes[device]])
                    out.setdefault(name, {})[host] = read * ITEMSIZE
    return out


def timed(paths: tuple[Path, Path], lengths: Lengths, halo: int, long_from: int, mesh: Any,
          steps: int, rounds: int) -> dict[str, Any]:  # fmt: skip
    """Wall and CPU ms per step of each job on the hosts of data row 0, in interleaved rounds."""
    layout = np.arange(DATA * CONTEXT).reshape(DATA, CONTEXT)
    store = store_of(paths)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    with fake_pod(mesh, layout) as process_of:
        loaders = {
            (name, host): (
                DataLoader(
                    source, global_batch_size=batch, process_index=host, **settings(halo, mesh)
                ),
                first,
            )  # fmt: skip
            for name, (source, batch, first) in jobs(store, lengths, long_from).items()
            for host in range(CONTEXT)
        }
        for (_, _), (loader, first) in loaders.items():
            host_batch(loader, first, process_of)  # warm: page cache and plans
        for r in range(rounds):
            for (name, _), (loader, first) in loaders.items():
                for step in range(first + 1 + r * steps, first + 1 + (r + 1) * steps):
                    w, c = time.perf_counter(), time.process_time()
                    host_batch(loader, step, process_of)
                    wall.setdefault(name, []).append(1000 * (time.perf_counter() - w))
                    cpu.setdefault(name, []).append(1000 * (time.process_time() - c))
        for loader, _ in loaders.values():
            loader.close()
    host_tokens = lengths[2] // DATA // CONTEXT
    return {
        name: {
            "wall_ms": statistics.median(wall[name]),
            "wall_ms_range": [min(wall[name]), max(wall[name])],
            "cpu_ms": statistics.median(cpu[name]),
            "tokens_per_s": host_tokens / statistics.median(wall[name]) * 1000,
            "cpu_tokens_per_s": host_tokens / statistics.median(cpu[name]) * 1000,
        }
        for name in wall
    }


def read_speed(paths: tuple[Path, Path], rows: int, seq_len: int, rounds: int) -> dict[str, Any]:
    """CPU ms of ``read`` (whole rows, ``segment_ids`` and ``positions``) of ``rows`` rows of
    ``seq_len`` tokens: `StagedTokens` (one stage) against `TokenSequences`' rows in a random
    order, interleaved, after checking one batch of each against the other's rows."""
    store = store_of(paths)
    staged = StagedTokens({"a": store}, [(0, seq_len, {"a": 1})], lanes=rows, block_size=rows,
                          seed=3).stage(0)  # fmt: skip
    plain = TokenSequences(store, seq_len)
    rng = np.random.default_rng(0)
    ms: dict[str, list[float]] = {"StagedTokens": [], "TokenSequences": []}
    for r in range(rounds):
        ids = np.arange(rows) + r * rows
        picked = rng.choice(len(plain), rows, replace=False)
        for name, source, which in (
            ("StagedTokens", staged, ids),
            ("TokenSequences", plain, picked),
        ):
            c = time.process_time()
            got = source.read(which)
            ms[name].append(1000 * (time.process_time() - c))
            assert got["input_ids"].shape == (rows, seq_len), name
    return {name: statistics.median(v) for name, v in ms.items()}


#: (short seq_len, long seq_len, tokens a step)
Lengths = tuple[int, int, int]


def measure(steps: int, rounds: int, halo: int, tokens: int,
            lengths: Lengths = (4096, 131_072, 2**20)) -> dict[str, Any]:  # fmt: skip
    mesh = mesh_of(("data", "context"), (DATA, CONTEXT))
    long_from = (
        steps * rounds + 2
    )  # the short stage's steps (checked, warmed, timed), then the long one's
    with tempfile.TemporaryDirectory(prefix="psdp-long-") as tmp:
        paths = corpus(Path(tmp), tokens)
        stored = int(np.load(paths[0], mmap_mode="r")[-1])
        bytes_read = check(paths, lengths, halo, long_from, mesh)
        times = timed(paths, lengths, halo, long_from, mesh, steps, rounds)
        speed = read_speed(paths, lengths[2] // lengths[0], lengths[0], 4 * rounds)
    return {"tokens": stored, "halo": halo, "steps": steps, "rounds": rounds,
            "lengths": list(lengths), "bytes": bytes_read, "times": times, "read": speed}  # fmt: skip


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """StagedTokens' per-host tokens/s at the long length over the short one's, by wall and by
    CPU time."""
    short, long, _ = result["lengths"]
    at = {n: result["times"][f"StagedTokens {n:,}"] for n in (short, long)}
    return {k: at[long][k] / at[short][k] for k in ("tokens_per_s", "cpu_tokens_per_s")}


def table(result: dict[str, Any]) -> str:
    halo, times = result["halo"], result["times"]
    short, long, step = result["lengths"]
    lines = [
        f"data={DATA} x context={CONTEXT}, one host a device; {step:,} tokens a step "
        f"({step // DATA // CONTEXT:,} a host); memmap store of {result['tokens']:,} "
        f"uint16 tokens; input_ids with a pad halo of {halo}; {result['rounds']} rounds of "
        f"{result['steps']} steps a job per host, hosts of data row 0",
        "",
        "| job | wall ms a step (median, range) | CPU ms a step | tokens/s a host (wall) | tokens/s a host (CPU) | input_ids bytes a host a step (every host) | = its columns + halos |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for name, t in times.items():
        got = sorted(set(result["bytes"][name].values()))
        lines.append(
            f"| {name} | {t['wall_ms']:.1f} ({t['wall_ms_range'][0]:.1f}-"
            f"{t['wall_ms_range'][1]:.1f}) | {t['cpu_ms']:.1f} | {t['tokens_per_s'] / 1e6:.1f} M | "
            f"{t['cpu_tokens_per_s'] / 1e6:.1f} M | {', '.join(f'{b:,}' for b in got)} | exactly |"
        )
    r = ratios(result)
    met = "met" if min(r.values()) >= 0.8 else "not met"
    read = result["read"]
    lines += [
        "",
        f"StagedTokens per-host tokens/s, {long:,} over {short:,}: {r['tokens_per_s']:.2f} by "
        f"wall time, {r['cpu_tokens_per_s']:.2f} by CPU time (goal >= 0.8: {met})",
        "",
        f"read() of {step // short} whole rows of {short:,} (with segment_ids and positions), CPU ms: "
        f"StagedTokens {read['StagedTokens']:.1f}, TokenSequences {read['TokenSequences']:.1f}",
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps a job a round a host")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--halo", type=int, default=64, help="input_ids' pad halo (columns)")
    parser.add_argument("--tokens", type=int, default=64_000_000, help="the store's tokens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.rounds, args.halo, args.tokens)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
