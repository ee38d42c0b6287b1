"""Random-batch read time of on-disk layouts, measured in one run on the same machine and data.

Each layout holds the same token table (``--rows`` x ``--width`` int32, values like token ids) in a
temporary directory; every repeat reads the same ``--batch`` random rows (unsorted, as a shuffled
loader asks) through psdp's own sources, so the figures are what ``DataLoader`` sees per step:

- zarr3 sharded, 1-row chunks (psdp): ``write_dataset`` defaults, read by `TensorStoreSource`
- zarr3 sharded, 64-row chunks: a random row decodes its whole 64-row chunk
- zarr3 sharded, 1-row chunks, zstd: ``write_dataset(compression="zstd")``
- zarr3 sharded, 1-row chunks, no crc32c: ``write_dataset(checksum=False)``
- numpy memmap: ``np.save`` + `MemmapSource`, the baseline

The files are fresh, so the page cache is warm (as on a node that has read its shard of the corpus
before); each layout is deleted after it is measured, so the disk holds at most two at a time.

    python scripts/measure/bench_sources.py                      # 20k x 2048 int32 (164 MB), batch 256
    python scripts/measure/bench_sources.py --rows 2000 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from psdp import write_dataset
from psdp.sources import MemmapSource, Source, TensorStoreSource

MEMMAP = "numpy memmap"


def layouts() -> dict[str, Callable[[Path, np.ndarray], Source]]:
    """Layout name -> function writing the table under a directory and opening it as a source."""

    def zarr3(**options: Any) -> Callable[[Path, np.ndarray], Source]:
        def build(root: Path, table: np.ndarray) -> Source:
            path = write_dataset(root / "ds", table, progress=False, **options)
            return TensorStoreSource(path)

        return build

    def memmap(root: Path, table: np.ndarray) -> Source:
        np.save(root / "table.npy", table)
        return MemmapSource(root / "table.npy")

    return {
        "zarr3 sharded, 1-row chunks (psdp)": zarr3(),
        "zarr3 sharded, 64-row chunks": zarr3(rows_per_chunk=64),
        "zarr3 sharded, 1-row chunks, zstd": zarr3(compression="zstd"),
        "zarr3 sharded, 1-row chunks, no crc32c": zarr3(checksum=False),
        MEMMAP: memmap,
    }


def time_reads(source: Source, batches: list[np.ndarray], warmup: int) -> list[float]:
    for ids in batches[:warmup]:
        source.read(ids)
    times = []
    for ids in batches:
        started = time.perf_counter()
        source.read(ids)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def measure(args: argparse.Namespace, parent: str | None) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    table = rng.integers(0, 50_000, size=(args.rows, args.width), dtype=np.int32)
    batches = [rng.integers(0, args.rows, size=args.batch) for _ in range(args.repeats)]
    batch_mb = args.batch * args.width * 4 / 1e6
    figures: dict[str, Any] = {}
    for name, build in layouts().items():
        root = Path(tempfile.mkdtemp(prefix="psdp-bench-", dir=parent))
        try:
            started = time.perf_counter()
            source = build(root, table)
            write_s = time.perf_counter() - started
            got = source.read(batches[0])  # the layouts must agree before their speed matters
            np.testing.assert_array_equal(got, table[batches[0]])
            times = time_reads(source, batches, warmup=min(3, len(batches)))
            median = statistics.median(times)
            figures[name] = {
                "median_ms": median,
                "p90_ms": float(np.percentile(times, 90)),
                "MB_per_s": batch_mb / (median / 1e3),
                "write_s": write_s,
                "disk_MB": disk_bytes(root) / 1e6,
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)
    base = figures[MEMMAP]["median_ms"]
    for f in figures.values():
        f["x_memmap"] = f["median_ms"] / base
    return figures


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        "| layout | median ms | p90 ms | MB/s | x memmap | write s | disk MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        lines.append(
            f"| {name} | {f['median_ms']:.2f} | {f['p90_ms']:.2f} | {f['MB_per_s']:.0f} | "
            f"{f['x_memmap']:.1f} | {f['write_s']:.1f} | {f['disk_MB']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows in the table")
    parser.add_argument("--width", type=int, default=2048, help="int32 tokens per row")
    parser.add_argument("--batch", type=int, default=256, help="random rows per read")
    parser.add_argument("--repeats", type=int, default=200, help="timed reads per layout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="where the temporary layouts go")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    figures = measure(args, args.dir)
    print(markdown(figures))
    print(
        f"\n{args.rows} x {args.width} int32 ({args.rows * args.width * 4 / 1e6:.0f} MB), "
        f"{args.batch} random rows per read, median of {args.repeats}, warm page cache"
    )
    if args.json:
        config = {k: v for k, v in vars(args).items() if k not in ("dir", "json")}
        Path(args.json).write_text(json.dumps({"config": config, "layouts": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
