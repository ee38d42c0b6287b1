"""Pod target for tests/test_length_pod.py: a `DataConfig` of three length stages (8 -> 32 -> 64
tokens) read as docs/guides/trainer.md's resumable loop does ("Resuming from a checkpoint"), whose
hosts are SIGKILLed while the loader reads ahead; and the run's expected rows, from
tests/length_oracle.py.

One store written twice as a mixture's sources: ``web``, its every document, and ``long``, its
documents of `MIN_LENGTH` tokens or more (``min_length``, read through the store's length index).
Token ``t`` of the store's stream is ``FIRST + t`` (an EOS after each document), so every token
names its place and a token delivered twice shows as a repeated value.

The same run is read twice side by side, by one pod: concatenate-then-split (``tokens``) and
packed (``view.packing: greedy``). Each host writes one JSON line per step to
``<run_dir>/<record>-<view>.p<process>.jsonl``: the step and every shard of every leaf this
host's devices hold (by its box in the global array), written before the step is trained on, so
a pod that is killed still leaves what it delivered.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tests.length_oracle import OracleLengthRun, OraclePackedRun

EOS, FIRST, MIN_LENGTH = 7, 100, 40
NAMES = ["long", "web"]  # sorted, as DataConfig lists its sources
BLOCK, LANES, SEED = 8, 4, 5
UNIT_TOKENS = 64
#: (first sample offset, seq_len, weights): the weights shift toward ``long`` in the last stage
STAGES = [(0, 8, {"web": 3, "long": 1}), (64, 32, {"web": 1, "long": 1}),
          (128, 64, {"web": 1, "long": 3})]  # fmt: skip
#: every `SAVE_EVERY` steps process 0 saves the loader's state, as the trainer guide's loop does
SAVE_EVERY = 2


def documents() -> list[np.ndarray]:
    """30 documents of 1 to 89 tokens; the store's token ``t`` is ``FIRST + t``."""
    lengths = np.random.default_rng(11).integers(1, 90, size=30)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [FIRST + np.arange(a, b, dtype=np.int32) for a, b in pairwise(starts)]


def config_text(store: str, packed: bool) -> str:
    """The run's `DataConfig` as YAML: stages by offset, so they stay where they are put
    whatever batch sizes a resume picks."""
    view = f"{{packing: greedy, long_documents: split, eos_id: {EOS}}}"
    if not packed:
        view = f"{{eos_id: {EOS}, targets: true}}\nunit_tokens: {UNIT_TOKENS}"
    (a, _, wa), (b, lb, wb), (c, lc, wc) = STAGES
    weights = [f"{{{', '.join(f'{k}: {v}' for k, v in w.items())}}}" for w in (wa, wb, wc)]
    return f"""
sources:
  web: {{store: {store}}}
  long: {{store: {store}, min_length: {MIN_LENGTH}}}
seq_len: {STAGES[0][1]}
view: {view}
mixture: {{block_size: {BLOCK}, seed: {SEED}}}
order: {{global_batch_size: [[0, 16], [4, 8], [12, 4]]}}
lanes: {LANES}
stages:
  - {{offset: {a}, weights: {weights[0]}}}
  - {{offset: {b}, weights: {weights[1]}, seq_len: {lb}}}
  - {{offset: {c}, weights: {weights[2]}, seq_len: {lc}}}
"""


def seq_len(offset: int) -> int:
    """The tokens per row at sample ``offset``."""
    return [n for start, n, _ in STAGES if start <= offset][-1]


def load_config(text: str, batch):
    """The YAML config, with ``batch`` as its ``order.global_batch_size`` where set."""
    import draccus

    from psdp import DataConfig

    config = draccus.load(DataConfig, io.StringIO(text))
    if batch is None:
        return config
    raw = config.to_dict()
    return DataConfig.from_dict(raw | {"order": raw["order"] | {"global_batch_size": batch}})


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    return ",".join(
        f"{s.start or 0}:{size if s.stop is None else s.stop}"
        for s, size in zip(index, shape, strict=True)
    )


def shards(batch: dict) -> dict[str, dict[str, list]]:
    """``{leaf: {box: values}}`` of this host's devices; devices of one box must agree."""
    out: dict[str, dict[str, list]] = {}
    for leaf, array in sorted(batch.items()):
        for shard in array.addressable_shards:
            values = np.asarray(shard.data).tolist()
            box = _box(shard.index, array.shape)
            if out.setdefault(leaf, {}).setdefault(box, values) != values:
                raise AssertionError(f"two devices of host {jax.process_index()} hold {leaf}@{box} "
                                     "with different values")  # fmt: skip
    return out


def train(run_dir: str, configs: dict[str, str], batch, mesh_shape: list[int], steps: int,
          kill_at: int | None, record: str) -> dict:  # fmt: skip
    """The trainer guide's loop on this pod, for each config of ``configs`` side by side (one
    pod serves both views): a restart (``loader-<name>.json`` under ``run_dir``) restores the
    saved state, with ``batch`` as the new batch size; process 0 saves each iterator's state
    after every `SAVE_EVERY`-th step. At step ``kill_at`` (its batches taken, the loaders
    holding the next ones, read ahead, the step not saved) every host SIGKILLs itself."""
    from contextlib import ExitStack

    from jax.experimental import multihost_utils
    from jax.sharding import Mesh

    me = jax.process_index()
    mesh = Mesh(np.array(jax.devices()).reshape(mesh_shape), ("data", "model")[: len(mesh_shape)])
    with ExitStack() as stack:
        runs = {}
        for name, text in configs.items():
            made = load_config(text, batch)
            saved = Path(run_dir) / f"loader-{name}.json"
            if saved.exists():  # a restart: continue where the checkpoint left off
                state = json.loads(saved.read_text())
                loader = stack.enter_context(made.restore(state, mesh))
            else:
                loader = stack.enter_context(made.build(mesh))
            out = stack.enter_context((Path(run_dir) / f"{record}-{name}.p{me}.jsonl").open("w"))
            runs[name] = (loader.start_step, iter(loader), saved, out)
        (first,) = {start for start, *_ in runs.values()}
        for step in range(first, steps):
            for _, batches, _, out in runs.values():
                got = next(batches)  # train_state = train_step(train_state, batch)
                out.write(json.dumps({"step": step, "shards": shards(got)}) + "\n")
                out.flush()
            if step == kill_at:
                # the kill comes once each loader has read the next step ahead (run 1's is in
                # the next stage) and every host has recorded the steps it took
                ahead = {name: read_ahead(batches) for name, (_, batches, _, _) in runs.items()}
                (Path(run_dir) / f"{record}.p{me}.killed").write_text(json.dumps(ahead))
                multihost_utils.sync_global_devices("every host recorded its steps")
                os.kill(os.getpid(), signal.SIGKILL)
            if (step + 1) % SAVE_EVERY == 0 and me == 0:  # save the model here, too
                for _, batches, saved, _ in runs.values():
                    partial = saved.with_suffix(".partial")
                    partial.write_text(json.dumps(batches.state()))
                    os.replace(partial, saved)  # a kill mid-write leaves the last whole state
        for _, batches, _, _ in runs.values():
            batches.close()
    return {"process": me, "first_step": first}


def read_ahead(batches, timeout_s: float = 120.0) -> int:
    """Waits until the iterator's prefetch holds at least the next step's batch, read and
    waiting; returns how many steps it holds."""
    deadline = time.monotonic() + timeout_s
    while batches.ready < 1:
        assert time.monotonic() < deadline, "the loader read no step ahead"
        time.sleep(0.01)
    return int(batches.ready)


# ------------------------------------------------------------------------------ the oracle
def chosen() -> dict[str, list[np.ndarray]]:
    """Each source's documents: ``long``'s by a numpy filter of the lengths."""
    docs = documents()
    return {"web": docs, "long": [d for d in docs if len(d) >= MIN_LENGTH]}


def streams() -> dict[str, dict[str, np.ndarray]]:
    """Each source's stream (its documents back to back, each followed by EOS): each place's
    token, document (from 1) and position in its document."""
    out = {}
    for name, picked in chosen().items():
        out[name] = {
            "input_ids": np.concatenate([np.append(d, EOS) for d in picked]).astype(np.int32),
            "document": np.concatenate([np.full(len(d) + 1, i + 1) for i, d in enumerate(picked)]),
            "positions": np.concatenate([np.arange(len(d) + 1) for d in picked]),
        }
    return out


def oracle_rows(count: int, packed: bool) -> tuple[dict[str, np.ndarray], list[Any], list[int]]:
    """The leaves of sample offsets ``[0, count)`` (one row each, padded to the longest
    length), the oracle's rows: ``(source, places, epochs, seq_len)`` of each offset (packed:
    ``(source, pieces, seq_len)``), and each offset's lane (its sample number in its source,
    modulo the lanes)."""
    stream = streams()
    stream_list = [stream[n] for n in NAMES]
    width = max(n for _, n, _ in STAGES) + (not packed)
    names = ("input_ids", "segment_ids", "positions") + (("loss_mask",) if packed else ())
    table = {k: np.zeros((count, width), np.int32) for k in names}
    if packed:
        slots = [[len(d) + 1 for d in chosen()[n]] for n in NAMES]
        packed_run = OraclePackedRun(
            NAMES, slots, STAGES, BLOCK, LANES, SEED, long_documents="split"
        )
        rows = packed_run.rows(count)
        for g, (source, pieces, _) in enumerate(rows):
            s, starts = stream_list[source], np.flatnonzero(stream_list[source]["positions"] == 0)
            column = 0
            for segment, (doc, first, size) in enumerate(pieces, 1):
                span = slice(column, column + size)
                place = starts[doc] + first
                table["input_ids"][g, span] = s["input_ids"][place : place + size]
                table["segment_ids"][g, span] = segment
                table["positions"][g, span] = np.arange(size)
                table["loss_mask"][g, span] = 1
                column += size
        return table, rows, lanes_of(packed_run.mixture.samples(count))
    tokens = [len(s["input_ids"]) for s in stream_list]
    run = OracleLengthRun(NAMES, tokens, STAGES, BLOCK, LANES, UNIT_TOKENS, SEED, extra=1)
    token_rows = run.rows(count)
    for g, (source, row_places, _, _) in enumerate(token_rows):
        s, places = stream_list[source], np.array(row_places)
        new = np.ones(len(places), bool)
        new[1:] = (np.diff(s["document"][places]) != 0) | (np.diff(places) != 1)
        table["input_ids"][g, : len(places)] = s["input_ids"][places]
        table["positions"][g, : len(places)] = s["positions"][places]
        table["segment_ids"][g, : len(places)] = np.cumsum(new)
    return table, token_rows, lanes_of(run.mixture.samples(count))


def lanes_of(samples: np.ndarray) -> list[int]:
    return (samples % LANES).tolist()


def packed_epochs(rows: list) -> list[list[int]]:
    """Each packed row's pieces' epochs: each source's rows walked in sample order (the
    mixture's sample numbers), each lane's
    pieces matched, document by document and token by token, against the lane's documents of
    epoch 0, then of epoch 1, ... (`OraclePackedRun.lane`); a piece anywhere else fails."""
    slots = [[len(d) + 1 for d in chosen()[n]] for n in NAMES]
    run = OraclePackedRun(NAMES, slots, STAGES, BLOCK, LANES, SEED, long_documents="split")
    lanes = LANES
    # per (source, lane): [epoch, index in the lane's documents, token in the document]
    cursor = {(s, lane): [0, 0, 0] for s in range(len(NAMES)) for lane in range(lanes)}
    sample = run.mixture.samples(len(rows))  # each offset's sample number in its source
    out: list[list[int]] = [[] for _ in rows]
    for g in sorted(range(len(rows)), key=lambda g: (rows[g][0], sample[g])):
        source, pieces, _ = rows[g]
        lane = int(sample[g]) % lanes
        at = cursor[(source, lane)]
        for doc, first, size in pieces:
            docs = run.lane(source, lane, at[0])
            assert (docs[at[1]], at[2]) == (doc, first), (source, doc, first, at)
            out[g].append(at[0])
            at[2] += size
            if at[2] == slots[source][doc]:
                at[1:] = [at[1] + 1, 0]
                if at[1] == len(docs):
                    at[:] = [at[0] + 1, 0, 0]
    return out
