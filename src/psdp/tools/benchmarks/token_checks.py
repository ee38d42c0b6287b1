"""The checks of figure 8, run on every loop's first batches before any timing: numpy oracles that
need no loop's order (``docs/measurements/token-path.md``, "The token path").

The benchmark's token ids say where each token lies: the id of the token at position ``p`` of a
store is ``base + p`` (ids >= 1, so 0 is padding), and each store has its own ``base``. So the
expected rows follow from the offsets and the ids delivered: a row cut from the stream holds the
stream from its first id on; a stream of shuffled documents holds whole documents back to back,
each once; a packed row holds whole documents side by side, then padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from psdp.tools.benchmarks.common import check_shards
from psdp.tools.benchmarks.token_loops import Batch


@dataclass(frozen=True)
class Store:
    """What the checks know of a store: its first id and its document offsets."""

    base: int
    offsets: np.ndarray

    def documents(self, ids: np.ndarray) -> np.ndarray:
        """The document of each token id (the ids must belong to this store)."""
        at = np.asarray(ids, np.int64) - self.base
        if at.size and (at.min() < 0 or at.max() >= self.offsets[-1]):
            raise AssertionError(
                f"token ids {at.min() + self.base}..{at.max() + self.base} are "
                f"not all in the store of ids {self.base}.."
            )
        return np.searchsorted(self.offsets, at, side="right") - 1


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i], ..., starts[i] + lengths[i] - 1`` for every ``i``, one after the other: one
    ``np.arange`` each, plainly (the loops' vectorised `token_loops.ranges` is under test).

    Examples:
        >>> spans(np.array([7, 0]), np.array([2, 3])).tolist()
        [7, 8, 0, 1, 2]
    """
    return np.concatenate([np.arange(a, a + n) for a, n in zip(starts, lengths, strict=True)])


def check_leaves(batch: Mapping[str, jax.Array], expected: Batch, what: str) -> None:
    """Raises unless every leaf of ``expected`` is in ``batch`` and each of its addressable
    shards holds exactly its box of the expected array."""
    for key, value in expected.items():
        if key not in batch:
            raise AssertionError(f"{what}: no leaf {key!r} (it has {sorted(batch)})")
        check_shards(batch[key], value, f"{what}, {key}")


def stacked(batches: Sequence[Mapping[str, jax.Array]], key: str) -> np.ndarray:
    """Leaf ``key`` of every batch, one after the other, as one host array."""
    for step, batch in enumerate(batches):
        if key not in batch:
            raise AssertionError(f"step {step}: no leaf {key!r} (it has {sorted(batch)})")
    return np.concatenate([np.asarray(batch[key]) for batch in batches])


def stream_rows(store: Store, starts: np.ndarray, width: int) -> Batch:
    """The rows ``stream[start:start + width]``: ids, ``segment_ids`` (document + 1) and
    ``positions`` (in the document), token by token.

    Examples:
        >>> got = stream_rows(Store(base=1, offsets=np.array([0, 3, 5, 9])), np.array([4]), 4)
        >>> [got[k].tolist() for k in ("input_ids", "segment_ids", "positions")]
        [[[5, 6, 7, 8]], [[2, 3, 3, 3]], [[1, 0, 1, 2]]]
    """
    ids = store.base + starts[:, None] + np.arange(width)
    doc = store.documents(ids)
    return {
        "input_ids": ids.astype(np.int32),
        "segment_ids": (doc + 1).astype(np.int32),
        "positions": (ids - store.base - store.offsets[doc]).astype(np.int32),
    }


def shuffled_stream(store: Store, got: np.ndarray) -> Batch:
    """What concatenate-then-split of shuffled documents must hold, given the rows it delivered
    (``got``, in order): the documents its rows start, each whole, once, back to back, cut into
    the rows; ``segment_ids`` number the pieces of each row from 1 and ``positions`` restart at 0
    in each piece (Grain's ``ConcatThenSplitIterDataset``).

    Examples:
        >>> store = Store(base=1, offsets=np.array([0, 3, 5, 9]))  # documents of 3, 2, 4 tokens
        >>> got = shuffled_stream(store, np.array([[4, 5, 6, 7], [8, 9, 1, 2]]))
        >>> [got[k].tolist() for k in ("input_ids", "segment_ids", "positions")]
        [[[4, 5, 6, 7], [8, 9, 1, 2]], [[1, 1, 2, 2], [1, 1, 2, 2]], [[0, 1, 0, 1], [0, 1, 0, 1]]]
    """
    doc = store.documents(got.ravel())
    order = doc[np.flatnonzero(np.diff(doc, prepend=-1))]  # the documents in stream order
    if len(np.unique(order)) != len(order):
        raise AssertionError(f"a document appears twice in the stream: documents {order.tolist()}")
    lengths = np.diff(store.offsets)[order]
    stream = spans(store.offsets[order], lengths)[: got.size]
    if stream.size < got.size:
        raise AssertionError(f"the documents {order.tolist()} hold fewer tokens than the rows")
    ids = (store.base + stream).reshape(got.shape)
    piece = np.diff(store.documents(ids), axis=1, prepend=-1) != 0
    column = np.arange(got.shape[1])
    start = np.maximum.accumulate(np.where(piece, column, 0), axis=1)
    return {
        "input_ids": ids.astype(np.int32),
        "segment_ids": np.cumsum(piece, axis=1).astype(np.int32),
        "positions": (column - start).astype(np.int32),
    }


@dataclass(frozen=True)
class PackedRows:
    """What packed rows must hold (`packed_rows`), each row's store, and the documents read."""

    expected: Batch
    store: np.ndarray
    documents: list[tuple[int, int]]

    @property
    def efficiency(self) -> float:
        """Real tokens / slots."""
        ids = self.expected["input_ids"]
        return float((ids != 0).sum() / ids.size)


def packed_rows(stores: Sequence[Store], got: np.ndarray) -> PackedRows:
    """What packed rows must hold, given the rows delivered: each row the whole documents whose
    ids it holds, of one store, side by side from column 0 in the order it holds them, then
    padding (id 0); ``segment_ids`` 1, 2, ... per document (0 on padding), ``positions`` in the
    document (0 on padding), ``loss_mask`` 1 on tokens.

    Examples:
        >>> stores = [Store(1, np.array([0, 3, 5])), Store(100, np.array([0, 4]))]
        >>> rows = packed_rows(stores, np.array([[4, 5, 1, 2, 3, 0], [100, 101, 102, 103, 0, 0]]))
        >>> rows.expected["segment_ids"].tolist(), rows.store.tolist(), rows.documents
        ([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]], [0, 1], [(0, 1), (0, 0), (1, 0)])
    """
    bases = np.array([s.base for s in stores])
    which = np.searchsorted(bases, got[:, 0], side="right") - 1
    expected = {k: np.zeros(got.shape, np.int32) for k in ("input_ids", "segment_ids", "positions")}
    documents = []
    for row, (tokens, index) in enumerate(zip(got, which, strict=True)):
        store = stores[index]
        doc = store.documents(tokens[tokens != 0])
        order = doc[np.flatnonzero(np.diff(doc, prepend=-1))]
        lengths = np.diff(store.offsets)[order]
        if not order.size or lengths.sum() > got.shape[1]:
            raise AssertionError(f"row {row} holds no token or does not hold whole documents")
        real = slice(0, lengths.sum())
        expected["input_ids"][row, real] = store.base + spans(store.offsets[order], lengths)
        expected["segment_ids"][row, real] = np.repeat(np.arange(1, len(order) + 1), lengths)
        expected["positions"][row, real] = spans(np.zeros_like(lengths), lengths)
        documents += [(int(index), int(d)) for d in order]
    expected["loss_mask"] = (expected["segment_ids"] != 0).astype(np.uint8)
    if len(set(documents)) != len(documents):
        raise AssertionError("a document appears twice in the rows checked")
    return PackedRows(expected, which, documents)
