"""The token loops of figure 8 that are not psdp (``docs/measurements/token-path.md``, "The token path"): the
tight loops a demanding user writes over a flat token array and its offsets, and Grain's own
operators, each an iterator of dict batches of global `jax.Array` leaves.

A tight loop does per step: its sorted row ids, one gather of whole rows, any per-token leaf
from the document boundaries of each row (one ``searchsorted`` per row, then ``np.repeat``), and
one ``jax.device_put``. Packed rows come from a greedy pack plan made once from the offsets, as
Levanter's ``GreedyPrepackedDataset`` does: a pack is consecutive whole documents, so one
contiguous token range of the flat array.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

Ids = Callable[[int], np.ndarray]
Batch = dict[str, np.ndarray]
#: A batch placed on the mesh: each leaf a global `jax.Array`.
Placed = dict[str, jax.Array]


def ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``first[i], first[i] + 1, ..., first[i] + count[i] - 1`` for every ``i``, concatenated.

    Examples:
        >>> ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
        [5, 6, 9, 10, 11]
    """
    before = np.cumsum(count) - count
    return np.arange(count.sum()) - np.repeat(before - first, count)


def row_segments(starts: np.ndarray, width: int, offsets: np.ndarray) -> Batch:
    """``segment_ids`` (document + 1) and ``positions`` (in the document) of the rows
    ``flat[start:start + width]``, as a user computes them: per row, the documents it touches
    (``searchsorted`` of its start and end into the offsets), then each piece's ids by
    ``np.repeat``.

    Examples:
        >>> offsets = np.array([0, 3, 5, 9])  # documents of 3, 2 and 4 tokens
        >>> got = row_segments(np.array([0, 4]), 4, offsets)
        >>> got["segment_ids"].tolist(), got["positions"].tolist()
        ([[1, 1, 1, 2], [2, 3, 3, 3]], [[0, 1, 2, 0], [1, 0, 1, 2]])
    """
    first = np.searchsorted(offsets, starts, side="right") - 1
    count = np.searchsorted(offsets, starts + width, side="left") - first
    doc = ranges(first, count)
    row_start = np.repeat(starts, count)
    low = np.maximum(offsets[doc], row_start)
    lengths = np.minimum(offsets[doc + 1], row_start + width) - low
    shape = (len(starts), width)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return {
        "segment_ids": np.repeat(doc + 1, lengths).astype(np.int32).reshape(shape),
        "positions": (within + np.repeat(low - offsets[doc], lengths))
        .astype(np.int32)
        .reshape(shape),
    }


def concat_loop(
    flat: np.ndarray,
    offsets: np.ndarray,
    seq_len: int,
    ids: Ids,
    sharding: NamedSharding,
    segments: bool,
) -> Iterator[Placed]:
    """Concatenate-then-split: row ``r`` is ``flat[r * seq_len:(r + 1) * seq_len]``, one fancy
    index of the rows of a reshape, plus `row_segments` when ``segments``; one ``device_put``.

    Examples:
        >>> from psdp.tools.benchmarks.common import BatchIds, cpu_mesh
        >>> from jax.sharding import PartitionSpec as P
        >>> sharding = NamedSharding(cpu_mesh((4, 2), ("data", "model")), P("data"))
        >>> flat, offsets = np.arange(1, 33, dtype=np.int32), np.array([0, 20, 32])
        >>> batch = next(concat_loop(flat, offsets, 4, BatchIds(8, 4), sharding, True))
        >>> np.asarray(batch["input_ids"])[:, 0].tolist() == (1 + 4 * BatchIds(8, 4)(0)).tolist()
        True
    """
    rows = flat[: len(flat) // seq_len * seq_len].reshape(-1, seq_len)
    for step in itertools.count():
        step_ids = ids(step)
        batch = {"input_ids": rows[step_ids]}
        if segments:
            batch.update(row_segments(step_ids * seq_len, seq_len, offsets))
        yield jax.device_put(batch, sharding)


def greedy_packs(offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """Levanter's greedy prepacking: whole documents in store order, a new pack whenever the next
    one does not fit; pack ``k`` holds documents ``firsts[k]:firsts[k + 1]`` (the result).

    Examples:
        >>> greedy_packs(np.array([0, 3, 5, 9, 10]), seq_len=5).tolist()  # lengths 3, 2, 4, 1
        [0, 2, 4]
    """
    firsts = [0]
    while firsts[-1] < len(offsets) - 1:
        end = int(np.searchsorted(offsets, offsets[firsts[-1]] + seq_len, side="right")) - 1
        assert end > firsts[-1], "every document of the benchmark's corpus fits a sequence"
        firsts.append(end)
    return np.asarray(firsts, np.int64)


def pack_rows(
    flat: np.ndarray, offsets: np.ndarray, firsts: np.ndarray, packs: np.ndarray, seq_len: int
) -> Batch:
    """The rows of ``packs`` (`greedy_packs`): each pack's token range in one gather, padded
    with 0, and its ``segment_ids`` (1, 2, ... per document, 0 on padding) and ``positions``.

    Examples:
        >>> offsets = np.array([0, 3, 5, 9, 10])
        >>> got = pack_rows(np.arange(1, 11), offsets, greedy_packs(offsets, 5), np.array([1]), 5)
        >>> [got[k].tolist() for k in ("input_ids", "segment_ids", "positions")]
        [[[6, 7, 8, 9, 10]], [[1, 1, 1, 1, 2]], [[0, 1, 2, 3, 0]]]
    """
    first, count = firsts[packs], firsts[packs + 1] - firsts[packs]
    low = offsets[first]
    real = np.arange(seq_len) < (offsets[first + count] - low)[:, None]
    # one gather of whole rows: a padding column reads some token inside the array, then 0
    at = np.minimum(low[:, None] + np.arange(seq_len), len(flat) - 1)
    doc = ranges(first, count)
    lengths = offsets[doc + 1] - offsets[doc]
    segment_ids = np.zeros(real.shape, np.int32)
    segment_ids[real] = np.repeat(doc - np.repeat(first, count) + 1, lengths)
    positions = np.zeros(real.shape, np.int32)
    positions[real] = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return {
        "input_ids": np.where(real, flat[at], 0).astype(flat.dtype),
        "segment_ids": segment_ids,
        "positions": positions,
    }


def packed_mixture_loop(
    stores: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    ids: Sequence[Ids],
    seq_len: int,
    sharding: NamedSharding,
) -> Iterator[Placed]:
    """A mixture of packed stores: per step, each store's packs at its sorted ids (``ids[s]``
    gives the store's share of the batch), one `pack_rows` per store, the stores' rows one after
    the other, one ``device_put``. ``stores``: ``(flat, offsets, firsts)`` each."""
    for step in itertools.count():
        parts = [
            pack_rows(flat, offsets, firsts, store_ids(step), seq_len)
            for (flat, offsets, firsts), store_ids in zip(stores, ids, strict=True)
        ]
        yield jax.device_put({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, sharding)


class Documents:
    """A Grain data source whose record ``d`` is document ``d``: ``{"input_ids": tokens}``, a view
    of the flat array (Grain's packers copy it into their rows).

    Examples:
        >>> Documents(np.arange(10, 15), np.array([0, 2, 5]))[1]["input_ids"].tolist()
        [12, 13, 14]
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, doc: int) -> dict[str, np.ndarray]:
        return {"input_ids": self.flat[self.offsets[doc] : self.offsets[doc + 1]]}

    def __repr__(self) -> str:  # Grain logs it; keep it short
        return f"Documents({len(self)})"


def grain_documents(grain: Any, source: Documents, seed: int, options: Any) -> Any:
    """Grain's documents as its guides read them: ``MapDataset.source(...).shuffle(seed)``,
    repeated, read ahead by Grain's threads (``to_iter_dataset(options)``)."""
    return grain.MapDataset.source(source).shuffle(seed=seed).repeat().to_iter_dataset(options)


def grain_concat(
    grain: Any,
    source: Documents,
    seq_len: int,
    batch: int,
    sharding: NamedSharding,
    segments: bool,
    options: Any,
) -> Iterator[Placed]:
    """Grain's ``ConcatThenSplitIterDataset`` over shuffled documents, ``batch`` rows a step, then
    ``grain.experimental.device_put`` (a host buffer filled by a Grain thread, then the transfer).
    Its own ``segment_ids`` (1, 2, ... per piece of a row) and ``positions`` (restarting at 0 in
    each piece) are kept when ``segments``."""
    dataset = grain.experimental.ConcatThenSplitIterDataset(
        grain_documents(grain, source, 1, options), length_struct={"input_ids": seq_len}
    )
    keys = {"input_ids": "input_ids"}
    if segments:
        keys |= {"segment_ids": "input_ids_segment_ids", "positions": "input_ids_positions"}
    return _grain_batches(grain, dataset.map(lambda row: _renamed(row, keys)), batch, sharding)


def grain_packed_mixture(
    grain: Any,
    sources: Sequence[Documents],
    weights: Sequence[float],
    seq_len: int,
    batch: int,
    sharding: NamedSharding,
    options: Any,
) -> Iterator[Placed]:
    """Each store's shuffled documents packed by Grain's ``BestFitPackIterDataset`` (``batch``
    bins), the stores mixed by ``IterDataset.mix(weights)``, ``batch`` rows a step, then
    ``grain.experimental.device_put``."""
    packed = [
        grain.experimental.BestFitPackIterDataset(
            grain_documents(grain, source, 1 + index, options),
            length_struct={"input_ids": seq_len},
            num_packing_bins=batch,
        )
        for index, source in enumerate(sources)
    ]
    keys = {
        "input_ids": "input_ids",
        "segment_ids": "input_ids_segment_ids",
        "positions": "input_ids_positions",
    }
    mixed = grain.IterDataset.mix(packed, weights=list(weights))
    return _grain_batches(grain, mixed.map(lambda row: _renamed(row, keys)), batch, sharding)


def _renamed(row: Mapping[str, np.ndarray], keys: Mapping[str, str]) -> Batch:
    return {new: row[old] for new, old in keys.items()}


def _grain_batches(grain: Any, rows: Any, batch: int, sharding: NamedSharding) -> Iterator[Placed]:
    """``rows`` batched and placed by ``grain.experimental.device_put``; closing this closes
    Grain's iterator (its threads)."""
    iterator = iter(grain.experimental.device_put(rows.batch(batch), sharding))
    try:
        yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
