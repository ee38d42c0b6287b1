"""A corpus that is never written: 10^9 documents and ~1.2 x 10^12 tokens, computed on the fly
from a seeded formula. Plain numpy, no psdp: it is also the oracle of the scale tests.

Document ``d`` starts at token ``offsets(d) = d * L + g(d)``, with ``g`` a seeded hash in
``[0, L)`` and ``g(0) = 0``, so every document has between 1 and ``2L - 1`` tokens; token ``t``
is ``hash(t) mod vocab``. `LazyArray` serves both as flat arrays (``shape``, ``dtype`` and
``a[start:stop]``: the array protocol ``DocumentStore.from_arrays`` reads), computing only the
slice asked for; `GatheredArray` also computes ``take(d)`` (offsets searched in place).

With an EOS after every document, document ``d`` starts in the stream at ``s(d) = offsets(d) +
d``; without, at ``offsets(d)``. Since ``s(d)`` lies in ``[d (L + e), d (L + e) + L)`` (``e``: 1
with EOS), the document holding stream position ``p`` is ``q = p // (L + e)`` or ``q - 1``: the
oracle finds it with two evaluations of the formula, not a search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix(x: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of ``x + seed * golden`` (uint64, wrapping): a seeded hash of each value."""
    z = np.asarray(x).astype(np.uint64) + np.uint64((seed * _GOLDEN + _GOLDEN) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class LazyArray:
    """A 1-d array whose ``[start:stop]`` is computed by ``values(np.arange(start, stop))``."""

    shape: tuple[int]
    dtype: np.dtype
    values: Callable[[np.ndarray], np.ndarray]

    def __getitem__(self, where: slice) -> np.ndarray:
        assert isinstance(where, slice) and where.step is None, where
        start, stop, _ = where.indices(self.shape[0])
        return self.values(np.arange(start, max(start, stop), dtype=np.int64)).astype(self.dtype)


@dataclass(frozen=True)
class GatheredArray(LazyArray):
    """A `LazyArray` that also gathers, ``take(d)``, as a numpy array (a memory-mapped file)
    does: a search of the offsets then reads only the entries it visits."""

    def take(self, where: np.ndarray) -> np.ndarray:
        return self.values(np.asarray(where, np.int64)).astype(self.dtype)


@dataclass(frozen=True)
class ScaleCorpus:
    """``documents`` documents of mean length ``length`` (``L``), ids below ``vocab``."""

    documents: int = 10**9
    length: int = 1200
    vocab: int = 50_257
    seed: int = 0

    def offsets(self, d: np.ndarray) -> np.ndarray:
        d = np.asarray(d, np.int64)
        g = (mix(d, self.seed) % np.uint64(self.length)).astype(np.int64)
        return d * self.length + np.where(d == 0, 0, g)

    def tokens(self, t: np.ndarray) -> np.ndarray:
        return (mix(t, self.seed + 1) % np.uint64(self.vocab)).astype(np.uint32)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets(np.array([self.documents]))[0])

    def offsets_array(self, gather: bool = False) -> LazyArray:
        """The offsets, read by slice (as a remote store's), or also gathered (as a memmap's)."""
        kind = GatheredArray if gather else LazyArray
        return kind((self.documents + 1,), np.dtype(np.int64), self.offsets)

    def tokens_array(self) -> LazyArray:
        return LazyArray((self.num_tokens,), np.dtype(np.uint32), self.tokens)

    def marks(self, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """Every ``stride``-th offset (and the last), and the non-empty documents before each:
        all of them, since every document holds a token."""
        docs = np.minimum(np.arange(-(-self.documents // stride) + 1) * stride, self.documents)
        return self.offsets(docs), docs

    def stream(self, p: np.ndarray, eos: bool) -> dict[str, np.ndarray]:
        """Stream positions ``p`` (any shape, inside the stream): the token (``-1`` for an EOS),
        its document + 1 and its position in the document."""
        p = np.asarray(p, np.int64)
        e = int(eos)
        q = np.minimum(p // (self.length + e), self.documents - 1)
        start = self.offsets(q) + e * q
        d = np.where(start <= p, q, q - 1)
        start = self.offsets(d) + e * d
        within = p - start
        length = self.offsets(d + 1) - self.offsets(d)
        token = within < length
        at = self.offsets(d) + np.minimum(within, length - 1)
        ids = np.where(token, self.tokens(at).astype(np.int64), -1)
        return {"input_ids": ids, "segment_ids": d + 1, "positions": within}
