"""Figure 8, the token path: Mtokens/s that psdp's token views deliver to the mesh, against the
tight loops a demanding user writes and Grain's own operators (``docs/measurements/token-path.md``, "The
token path").

The corpus: documents of log-normal lengths (mean ~`Sizes.token_mean_length`, at most
``token_seq_len``, so every packer keeps every document whole), int32 ids, stored flat with their
offsets as ``.npy`` files (read as memmaps) and as a zarr3 document store (`write_documents`).
Four jobs on ``data=4 x model=2``, each step ``token_batch`` rows of ``token_seq_len`` tokens:

- concatenate-then-split (``input_ids``, ``P("data")``);
- the same with the sequence split over ``model`` (``P("data", "model")``);
- concatenate-then-split with ``segment_ids`` and ``positions``;
- a 3:1 mixture of two stores, each packed (``input_ids``, ``segment_ids``, ``positions``).

Five loops per job (`LOOPS`), each checked on its first `CHECKED_STEPS` batches, device shard by
device shard (`token_checks`), then timed in `ROUNDS` rounds, the loops in turn, the order
rotating: a turn starts once the process is idle (`common.settle`: the other loops have refilled
what they read ahead), takes ``warmup_steps`` untimed batches, then times ``token_steps``. A row gives
the median and range over the rounds of the delivered tokens per second (real tokens for packed
rows, whose slots per second and packing efficiency come too) and the ratio to the tight loop.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp import (
    DataLoader,
    DocumentStore,
    Mixture,
    PackedSequences,
    TokenSequences,
    write_documents,
)
from psdp.tools.benchmarks import token_loops
from psdp.tools.benchmarks.baselines import prefetched
from psdp.tools.benchmarks.common import BatchIds, Sizes, cpu_mesh, ratio, settle, timed_ms
from psdp.tools.benchmarks.grain_loops import load_grain
from psdp.tools.benchmarks.throughput import psdp_batches
from psdp.tools.benchmarks.token_checks import (
    Store,
    check_leaves,
    packed_rows,
    shuffled_stream,
    stacked,
    stream_rows,
)

TIGHT = "tight loop"
PREFETCH_LOOP = "tight loop + 1 prefetch thread"
PSDP_MEMMAP = "psdp (memmap store)"
PSDP_ZARR = "psdp (zarr3 store)"
GRAIN = "Grain's own operators"
LOOPS = (TIGHT, PREFETCH_LOOP, PSDP_MEMMAP, PSDP_ZARR, GRAIN)
#: Timed rounds of every loop (a row: their median and range).
ROUNDS = 3
#: Batches of every loop checked before timing (packed rows: their packing efficiency too).
CHECKED_STEPS = 4
#: The packed job's stores and weights; the second store has half the first's documents.
WEIGHTS = {"a": 3, "b": 1}
SEED = 1

Delivered = dict[str, jax.Array]


@dataclass(frozen=True)
class Job:
    """One row group of the figure: which leaves every loop delivers, split how."""

    name: str
    spec: PartitionSpec
    segments: bool = False
    packed: bool = False


JOBS = (
    Job("concatenate-then-split", PartitionSpec("data")),
    Job("concatenate-then-split, sequence over model", PartitionSpec("data", "model")),
    Job("concatenate-then-split + segment_ids, positions", PartitionSpec("data"), segments=True),
    Job("packed 3:1 mixture of two stores", PartitionSpec("data"), segments=True, packed=True),
)


@dataclass(frozen=True)
class Corpus:
    """One store of the benchmark, written to ``directory``: ``flat.npy``, ``offsets.npy`` and the
    zarr3 document store ``zarr``. Token ``p`` has id ``base + p``."""

    directory: Path
    offsets: np.ndarray
    base: int

    def flat(self) -> np.ndarray:
        """The ids as a plain array over the memmap (no ``np.memmap`` object per slice)."""
        return np.asarray(np.load(self.directory / "flat.npy", mmap_mode="r"))

    def memmap_store(self) -> DocumentStore:
        flat = np.load(self.directory / "flat.npy", mmap_mode="r")
        offsets = np.load(self.directory / "offsets.npy")
        return DocumentStore.from_arrays(offsets, {"input_ids": flat})

    def zarr_store(self) -> DocumentStore:
        return DocumentStore.open(self.directory / "zarr")

    @property
    def store(self) -> Store:
        return Store(self.base, self.offsets)


def document_lengths(count: int, mean: float, longest: int, seed: int) -> np.ndarray:
    """``count`` log-normal lengths (sigma 1, mean ~``mean``), rounded, clipped to [1, longest].

    Examples:
        >>> lengths = document_lengths(10_000, 300, 2048, seed=0)
        >>> int(lengths.min()) >= 1, int(lengths.max()) <= 2048, bool(280 < lengths.mean() < 320)
        (True, True, True)
    """
    drawn = np.random.default_rng(seed).lognormal(np.log(mean) - 0.5, 1.0, count)
    return np.clip(np.round(drawn), 1, longest).astype(np.int64)


def write_corpus(directory: Path, lengths: np.ndarray, base: int) -> Corpus:
    """Writes the documents of ``lengths`` (ids ``base``, ``base + 1``, ...) in both layouts."""
    directory.mkdir(parents=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.arange(base, base + offsets[-1], dtype=np.int32)
    np.save(directory / "flat.npy", flat)
    np.save(directory / "offsets.npy", offsets)
    docs = (flat[a:b] for a, b in itertools.pairwise(offsets))
    write_documents(directory / "zarr", docs, progress=False)
    return Corpus(directory, offsets, base)


def bench_tokens(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """Mtokens/s of every job and loop: see the module's docstring."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    lengths = document_lengths(
        sizes.token_documents, sizes.token_mean_length, sizes.token_seq_len, seed=0
    )
    first = write_corpus(workdir / "tokens-a", lengths, base=1)
    second_lengths = document_lengths(
        sizes.token_documents // 2, sizes.token_mean_length, sizes.token_seq_len, seed=1
    )
    second = write_corpus(workdir / "tokens-b", second_lengths, base=1 + int(first.offsets[-1]))
    grain = token_grain()
    rows = []
    for job in JOBS:
        with ExitStack() as stack:
            opened = {
                name: _opened(name, loop, job, stack)
                for name, loop in loops(job, sizes, mesh, (first, second), grain, stack).items()
            }
            rows += _rows(job, sizes, opened)
    return {
        "title": (
            f"The token path: {sizes.token_documents:,} documents (log-normal lengths, mean "
            f"{sizes.token_mean_length}) plus {sizes.token_documents // 2:,} for the mixture, int32 "
            f"ids, {sizes.token_batch} x {sizes.token_seq_len} tokens a step, data=4 x model=2"
        ),
        "ratio_means": (
            "tokens/s over the tight loop's in the same job (real tokens in the packed job); "
            "mtokens_per_s: median over the rounds, mtokens_min-max their range; slot_mtokens: "
            "slots per second (padding included); efficiency: real tokens / slots"
        ),
        "note": None if grain is not None else GRAIN_MISSING,
        "rows": rows,
        "goals": goals(rows),
    }


Check = Callable[[list[Delivered]], float]
Loop = tuple[Callable[[], Iterator[Any]], Check]  # psdp's batches are typed as jax.Array


def loops(
    job: Job, sizes: Sizes, mesh: Mesh, corpora: tuple[Corpus, Corpus], grain: Any, stack: ExitStack
) -> dict[str, Loop]:
    """Every loop of ``job``: name -> (open a fresh iterator, check its first batches). psdp's
    loaders are closed by ``stack``."""
    sharding = NamedSharding(mesh, job.spec)
    opened = (
        _packed_loops(job, sizes, mesh, sharding, corpora, grain, stack)
        if job.packed
        else _concat_loops(job, sizes, mesh, sharding, corpora[0], grain, stack)
    )
    tight = opened[TIGHT][0]
    opened[PREFETCH_LOOP] = (lambda: prefetched(tight(), sizes.prefetch), opened[TIGHT][1])
    return {name: opened[name] for name in LOOPS if name in opened}


def _concat_loops(
    job: Job,
    sizes: Sizes,
    mesh: Mesh,
    sharding: NamedSharding,
    corpus: Corpus,
    grain: Any,
    stack: ExitStack,
) -> dict[str, Loop]:
    seq_len, batch = sizes.token_seq_len, sizes.token_batch
    flat = corpus.flat()
    ids = BatchIds(len(flat) // seq_len, batch, seed=SEED)
    leaves = ("input_ids", "segment_ids", "positions") if job.segments else ("input_ids",)

    def by_rows(row_ids: Callable[[int], np.ndarray]) -> Check:
        return partial(_check_rows, corpus.store, row_ids, seq_len, leaves)

    found: dict[str, Loop] = {
        TIGHT: (
            partial(
                token_loops.concat_loop, flat, corpus.offsets, seq_len, ids, sharding, job.segments
            ),
            by_rows(ids),
        )
    }
    for name, store in ((PSDP_MEMMAP, corpus.memmap_store), (PSDP_ZARR, corpus.zarr_store)):
        rows = TokenSequences(store(), seq_len, leaves=leaves)  # the job's leaves, as the loops
        spec = {leaf: job.spec for leaf in rows.leaves}
        loader = stack.enter_context(
            DataLoader(rows, mesh=mesh, global_batch_size=batch, seed=SEED, batch_spec=spec)
        )
        assert loader.order is not None, "TokenSequences is a random-access source"
        found[name] = (partial(psdp_batches, loader), by_rows(loader.order.batch_ids))
    if grain is not None:
        documents = token_loops.Documents(flat, corpus.offsets)
        options = grain.ReadOptions()  # Grain's default: 16 threads, 500 documents ahead
        found[GRAIN] = (
            partial(
                token_loops.grain_concat,
                grain,
                documents,
                seq_len,
                batch,
                sharding,
                job.segments,
                options,
            ),
            partial(_check_shuffled, corpus.store, leaves),
        )
    return found


#: the packed job's leaves, as the tight loop and Grain deliver them (no loss mask)
PACKED_LEAVES = ("input_ids", "segment_ids", "positions")


#: Grain's operators the figure's Grain rows use (Grain 0.2.9, psdp's lower bound, has none of
#: the packers nor ``experimental.device_put``)
GRAIN_OPERATORS = ("device_put", "ConcatThenSplitIterDataset", "BestFitPackIterDataset")
GRAIN_MISSING = (
    "grain is not installed, or too old to have experimental."
    + ", experimental.".join(GRAIN_OPERATORS)
    + ": its rows are skipped"
)


def token_grain() -> Any | None:
    """The ``grain`` module when it has the operators of the Grain rows, else ``None``."""
    grain = load_grain()
    if grain is None or not all(hasattr(grain.experimental, op) for op in GRAIN_OPERATORS):
        return None
    return grain


def _packed_loops(
    job: Job,
    sizes: Sizes,
    mesh: Mesh,
    sharding: NamedSharding,
    corpora: tuple[Corpus, ...],
    grain: Any,
    stack: ExitStack,
) -> dict[str, Loop]:
    seq_len, batch = sizes.token_seq_len, sizes.token_batch
    total = sum(WEIGHTS.values())
    shares = [batch * w // total for w in WEIGHTS.values()]
    stores = [(c.flat(), c.offsets, token_loops.greedy_packs(c.offsets, seq_len)) for c in corpora]
    ids = [
        BatchIds(len(firsts) - 1, share, seed=SEED + i)
        for i, ((_, _, firsts), share) in enumerate(zip(stores, shares, strict=True))
    ]
    check = partial(_check_packed, [c.store for c in corpora], shares)
    found: dict[str, Loop] = {
        TIGHT: (partial(token_loops.packed_mixture_loop, stores, ids, seq_len, sharding), check),
    }
    for name, opener in ((PSDP_MEMMAP, Corpus.memmap_store), (PSDP_ZARR, Corpus.zarr_store)):
        packed = {
            n: PackedSequences(opener(c), seq_len, leaves=PACKED_LEAVES)
            for n, c in zip(WEIGHTS, corpora, strict=True)
        }
        mixture = Mixture(packed, weights=WEIGHTS, block_size=batch, seed=SEED)
        loader = stack.enter_context(
            DataLoader(mixture, mesh=mesh, global_batch_size=batch, batch_spec=job.spec)
        )
        found[name] = (partial(psdp_batches, loader), check)
    if grain is not None:
        documents = [token_loops.Documents(flat, offsets) for flat, offsets, _ in stores]
        options = grain.ReadOptions()  # Grain's default: 16 threads, 500 documents ahead
        found[GRAIN] = (
            partial(
                token_loops.grain_packed_mixture,
                grain,
                documents,
                list(WEIGHTS.values()),
                seq_len,
                batch,
                sharding,
                options,
            ),
            check,
        )
    return found


def _check_rows(
    store: Store,
    ids: Callable[[int], np.ndarray],
    seq_len: int,
    leaves: tuple[str, ...],
    got: list[Delivered],
) -> float:
    """Rows cut from the stream at the loop's row ids: ids, document + 1, position in it."""
    for step, batch in enumerate(got):
        expected = stream_rows(store, ids(step) * seq_len, seq_len)
        check_leaves(batch, {k: expected[k] for k in leaves}, f"step {step}")
    return 1.0


def _check_shuffled(store: Store, leaves: tuple[str, ...], got: list[Delivered]) -> float:
    """Whole shuffled documents back to back, cut into rows, in order over the steps checked."""
    rows = stacked(got, "input_ids")
    expected = shuffled_stream(store, rows)
    for step, batch in enumerate(got):
        cut = slice(step * len(rows) // len(got), (step + 1) * len(rows) // len(got))
        check_leaves(batch, {k: expected[k][cut] for k in leaves}, f"step {step}")
    return 1.0


def _check_packed(stores: list[Store], shares: list[int], got: list[Delivered]) -> float:
    """Packed rows of whole documents, each document once, the stores in their shares of every
    batch (``loss_mask`` too where the loop delivers one); returns the packing efficiency."""
    rows = packed_rows(stores, stacked(got, "input_ids"))
    for step, batch in enumerate(got):
        cut = slice(step * sum(shares), (step + 1) * sum(shares))
        counts = np.bincount(rows.store[cut], minlength=len(stores)).tolist()
        if counts != shares:
            raise AssertionError(f"step {step}: rows per store {counts}, not {shares}")
        keys = [k for k in rows.expected if k != "loss_mask" or k in batch]
        check_leaves(batch, {k: rows.expected[k][cut] for k in keys}, f"step {step}")
    return rows.efficiency


def _opened(name: str, loop: Loop, job: Job, stack: ExitStack) -> dict[str, Any]:
    """A fresh iterator of the loop, its first `CHECKED_STEPS` batches checked; ``stack`` closes
    it."""
    open_loop, check = loop
    batches = open_loop()
    stack.callback(batches.close)  # type: ignore[attr-defined]
    got = [next(batches) for _ in range(CHECKED_STEPS)]
    try:
        efficiency = check(got)
    except AssertionError as error:
        raise AssertionError(f"{name}, {job.name}: {error}") from error
    return {"batches": batches, "leaves": sorted(got[0]), "efficiency": efficiency}


def _rows(job: Job, sizes: Sizes, opened: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per loop: the loops timed in turns, `ROUNDS` turns each."""
    names = list(opened)
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(ROUNDS):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            settle()
            ms = timed_ms(opened[name]["batches"], sizes.warmup_steps, sizes.token_steps, 0)
            times[name].append(ms)
    slots = sizes.token_batch * sizes.token_seq_len / 1e3  # per ms: Mtokens/s
    real = {n: slots * opened[n]["efficiency"] / np.array(t) for n, t in times.items()}
    rows = []
    for name in names:
        # each round's ratio to the tight loop's turn in the same round (interleaved)
        rounds = real[name] / real[TIGHT]
        rows.append(
            {
                "job": job.name,
                "loader": name,
                "leaves": ", ".join(opened[name]["leaves"]),
                "ms_per_batch": statistics.median(times[name]),
                "mtokens_per_s": float(np.median(real[name])),
                "mtokens_min": float(real[name].min()),
                "mtokens_max": float(real[name].max()),
                "slot_mtokens": slots / statistics.median(times[name]) if job.packed else None,
                "efficiency": opened[name]["efficiency"] if job.packed else None,
                "ratio": ratio(float(np.median(real[name])), float(np.median(real[TIGHT]))),
                "ratio_min": float(rounds.min()),
                "ratio_max": float(rounds.max()),
                "ratio_median": float(np.median(rounds)),
            }
        )
    return rows


@dataclass(frozen=True)
class Goal:
    """A goal of the issue that the figure measures: psdp's memmap row of ``job`` reaches
    ``target`` in ``measure`` (``"ratio"``: the median over the rounds of each round's ratio to
    the tight loop; ``"efficiency"``: the packing efficiency of the checked batches)."""

    text: str
    job: str
    measure: str
    target: float


#: The goals of issue 29 that this figure measures (each met when its median reaches the target).
GOALS = (
    Goal("concatenate-then-split with segment_ids and positions: psdp >= 0.8x the tight loop's "
         "tokens/s", JOBS[2].name, "ratio", 0.8),
    Goal("packed mixture: psdp >= 0.8x the tight greedy loop's real tokens/s", JOBS[3].name,
         "ratio", 0.8),
    Goal("packed mixture: psdp's packing efficiency >= 0.99", JOBS[3].name, "efficiency", 0.99),
)  # fmt: skip


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals' table from the figure's rows: each goal, its target, the value reached
    (median and range over the rounds) and whether it is met.

    Examples:
        >>> row = {"job": JOBS[3].name, "loader": PSDP_MEMMAP, "ratio_median": 0.85,
        ...        "ratio_min": 0.79, "ratio_max": 0.9, "efficiency": 0.998}
        >>> [(g["reached"], g["met"]) for g in goals([row])]  # the goals of the packed job
        [('0.85 (0.79-0.9)', True), ('0.998', True)]
    """
    table = []
    for goal in GOALS:
        found = [r for r in rows if r["job"] == goal.job and r["loader"] == PSDP_MEMMAP]
        if not found:
            continue
        row = found[0]
        if goal.measure == "ratio":
            value = row["ratio_median"]
            reached = f"{value:.3g} ({row['ratio_min']:.3g}-{row['ratio_max']:.3g})"
        else:
            value = row[goal.measure]
            reached = f"{value:.3g}"
        table.append({"goal": goal.text, "target": f">= {goal.target}", "reached": reached,
                      "met": bool(value >= goal.target)})  # fmt: skip
    return table
