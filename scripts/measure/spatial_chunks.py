"""How a zarr3 array's chunk shape decides the cost of a spatial read (``docs/measurements/storage.md``,
"Chunks for spatial reads"; the rule: ``docs/guides/spatial.md``).

Writes a ``(N, C, H, W)`` float32 field (random values) once per chunk shape and codec, then times
the read a host of ``data=2 x h=2 x w=2`` makes for one step of 2 samples: its device's box (a
quarter of each sample) widened by a halo of ``--halo`` on both spatial dimensions, wrapping
around both edges (one TensorStore read with outer indexing, as `TensorStoreSource` makes it),
against reading the 2 samples whole. Best of ``--repeats``, warm page cache.

    python scripts/measure/spatial_chunks.py [--shape 8,8,720,1440] [--halo 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tensorstore as ts

CODECS = {"raw": None, "zstd": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1}}]}


def best_ms(read, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8,8,720,1440", help="N,C,H,W")
    parser.add_argument("--halo", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n, c, height, width = (int(v) for v in args.shape.split(","))
    data = np.random.default_rng(0).standard_normal((n, c, height, width), dtype=np.float32)
    ids = np.array([1, min(5, n - 1)])
    rows = np.arange(-args.halo, height // 2 + args.halo) % height
    cols = np.arange(-args.halo, width // 2 + args.halo) % width
    chunks = {
        "one sample": (1, c, height, width),
        "one box": (1, c, height // 2, width // 2),
        "a box / 16": (1, c, height // 8, width // 8),
        "one row": (1, c, 1, width),
    }
    print("| chunk | codec | box + halo ms | 2 whole samples ms |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, chunk in chunks.items():
            for codec_name, codec in CODECS.items():
                path = Path(tmp) / "field"
                metadata = {
                    "shape": [n, c, height, width],
                    "data_type": "float32",
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
                }
                if codec:
                    metadata["codecs"] = codec
                spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
                ts.open({**spec, "metadata": metadata, "create": True}).result().write(
                    data
                ).result()
                array = ts.open(spec).result()
                got = array.oindex[ids, :, rows, cols].read().result()
                assert (got == data[ids][:, :, rows][:, :, :, cols]).all()
                box = best_ms(
                    lambda a=array: a.oindex[ids, :, rows, cols].read().result(), args.repeats
                )
                whole = best_ms(lambda a=array: a[ids].read().result(), args.repeats)
                print(f"| {name} {list(chunk)} | {codec_name} | {box:.1f} | {whole:.1f} |")
                shutil.rmtree(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
