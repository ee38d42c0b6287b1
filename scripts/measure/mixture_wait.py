"""Where the packed 3:1 mixture's loader wait comes from, over an object store with latency.

    python scripts/measure/mixture_wait.py [--store s3|gcs] [--latency-ms 100] [--step-ms 200]
        [--steps 40] [--runs 3] [--counted-steps 12] [--documents 8000] [--warm-indexes]

The job of figure 9's mixture row (``psdp bench --only object_tokens``): two ``psdp prepare``
stores of ``--documents`` and half as many documents (`object_tokens.write_inputs`), in moto's
S3 (or fake-gcs-server) behind a `FaultProxy` adding ``--latency-ms`` to every request, read as
a 3:1 `Mixture` of `PackedSequences` of 2048 tokens, 16 rows a step, with psdp's defaults. It
first checks that step 1's batch from the store equals the same loader's over the local copy.

Then, per step, with fresh stores (a cache of their own, cold) and a fresh loader:

- counted: steps ``0 .. --counted-steps - 1`` read one at a time (``batch_at``): the requests,
  shard-index requests (suffix byte ranges) and KiB at the proxy, the step's time, and when its
  requests reached the proxy (ms after the read began): one wave is one round trip;
- ``--runs`` stall runs as figure 9's (`stall_run`: step 0, one trainer step, then ``--steps``
  steps of ``--step-ms``): the wait's share of the time, and each wait over 5 ms with the batches
  that were ready when ``next()`` was called and the read threads then.

``--warm-indexes`` reads one token of every shard of each store before the loader starts, so
that no read waits on a shard index (the experiment of ``docs/measurements/token-path.md``,
"The packed mixture's wait").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("s3", "gcs"), default="s3")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--step-ms", type=float, default=200.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--counted-steps", type=int, default=12)
    parser.add_argument("--documents", type=int, default=8000)
    parser.add_argument("--warm-indexes", action="store_true")
    args = parser.parse_args(argv)
    from psdp.tools.benchmarks.common import ask_for_cpu_devices

    ask_for_cpu_devices(8)
    with tempfile.TemporaryDirectory() as workdir:
        measure(args, Path(workdir))


def measure(args: argparse.Namespace, workdir: Path) -> None:
    import tensorstore as ts

    from psdp import DataLoader, DocumentStore, Mixture, PackedSequences
    from psdp.prepare import prepare
    from psdp.sources.documents.format import CACHE_BYTES
    from psdp.tools.benchmarks import object_tokens as ot
    from psdp.tools.benchmarks.common import cpu_mesh
    from psdp.tools.benchmarks.object_store import FaultProxy, GcsServer, S3Server
    from psdp.tools.benchmarks.stall import stall_run

    tokenizer = str(ot.word_tokenizer(workdir / "tokenizer.json"))
    inputs = {
        "a": ot.write_inputs(workdir, args.documents, 400, 4, seed=0),
        "b": ot.write_inputs(workdir, args.documents // 2, 400, 2, seed=1),
    }
    for name, paths in inputs.items():
        prepare(paths, workdir / f"store-{name}", tokenizer=tokenizer, workers=1, progress=False)
    parts = {name: ot.part_starts(workdir / f"store-{name}") for name in inputs}
    mesh = cpu_mesh((4, 2), ("data", "model"))

    def loader(open_store: Any) -> DataLoader:
        packed = {name: PackedSequences(open_store(name), 2048) for name in ot.WEIGHTS}
        view = Mixture(packed, weights=ot.WEIGHTS, block_size=16, seed=ot.SEED)
        return DataLoader(view, mesh=mesh, global_batch_size=16, stall_warning_s=None)

    log: list[tuple[float, str]] = []  # (when a request reached the proxy, its byte range)
    server_class = S3Server if args.store == "s3" else GcsServer
    with server_class() as server, FaultProxy(server.endpoint) as proxy:
        for name, paths in inputs.items():
            prepare(paths, server.kvstore(f"{name}/"), tokenizer=tokenizer, workers=1,
                    progress=False)  # fmt: skip
        proxy.latency_s = args.latency_ms / 1e3
        counted = proxy.fault

        def logged(method: str, path: str, byte_range: str | None) -> str | None:
            log.append((time.perf_counter() - proxy.latency_s, byte_range or ""))
            return counted(method, path, byte_range)

        proxy.fault = logged  # type: ignore[method-assign]

        def remote(name: str) -> DocumentStore:
            context = ts.Context({"cache_pool": {"total_bytes_limit": CACHE_BYTES}})
            store = DocumentStore.open(server.kvstore(f"{name}/", proxy.endpoint), context=context)
            if args.warm_indexes:  # one token of every shard of every part
                ends = [*parts[name][1:], store.num_tokens]
                starts = [p + t for p, e in zip(parts[name], ends, strict=True)
                          for t in range(0, e - p, ot.PER_SHARD)]  # fmt: skip
                store.read_ranges(np.array(starts), np.array(starts) + 1)
            return store

        with loader(lambda n: DocumentStore.open(workdir / f"store-{n}")) as local:
            expected = local.batch_at(1)
        with loader(remote) as checked:
            got = checked.batch_at(1)
        for key, value in expected.items():
            if not np.array_equal(np.asarray(value), np.asarray(got[key])):
                sys.exit(f"step 1's {key} differs between the local and the remote store")
        print(
            f"{args.store}, {args.latency_ms:g} ms a request, step 1 checked against the local store"
        )

        with loader(remote) as counting:
            print("step  ms   requests  index  KiB  arrivals (ms after the read began)")
            for step in range(args.counted_steps):
                proxy.reset()
                log.clear()
                began = time.perf_counter()
                counting.batch_at(step)
                took = time.perf_counter() - began
                index = sum(1 for _, r in log if r.startswith("bytes=-"))
                arrivals = " ".join(f"{(t - began) * 1e3:.0f}" for t, _ in sorted(log))
                print(f"{step:>4} {took * 1e3:>4.0f} {len(log):>9} {index:>6} "
                      f"{proxy.bytes_sent / 1024:>4.0f}  {arrivals}")  # fmt: skip

        for run in range(args.runs):
            with loader(remote) as stalled:
                waits = _stall_trace(stalled, args.step_ms / 1e3, args.steps, stall_run)
            print(f"run {run}: {waits}")


def _stall_trace(loader: Any, step_s: float, steps: int, stall_run: Any) -> str:
    """`stall_run`'s wait share, with each wait over 5 ms: (step, ms, batches ready, threads)."""
    from psdp._runtime.prefetch import Prefetcher

    seen: list[tuple[int, float, int, int]] = []
    plain = Prefetcher.__next__

    def traced(self: Any) -> Any:
        ready, began = self.ready, time.perf_counter()
        value = plain(self)
        seen.append((self.next_step - 1, time.perf_counter() - began, ready, self.read_threads))
        return value

    Prefetcher.__next__ = traced  # type: ignore[method-assign]
    try:
        figures = stall_run(loader, step_s, steps)
    finally:
        Prefetcher.__next__ = plain  # type: ignore[method-assign]
    slow = [(s, round(w * 1e3), r, t) for s, w, r, t in seen[1:] if w > 0.005]
    return (
        f"wait {figures['wait_fraction']:.2%}; waits over 5 ms (step, ms, ready, threads): {slow}"
    )


if __name__ == "__main__":
    main()
