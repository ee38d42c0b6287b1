"""`IndexShuffle`: a keyed permutation of ``range(n)`` evaluated pointwise (the order's full
shuffle; `BlockShuffle` builds on it); the rule in full: ``docs/concepts/order-and-resume.md``, "The permutations,
bit for bit"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: All 64 bits: the seeds and keys are hashed as 64-bit words.
MASK64 = (1 << 64) - 1
_ROUNDS = 6
#: 2**0 .. 2**62: an int64 ``v >= 0`` has ``v.bit_length()`` of them at or below it
_POWERS = 1 << np.arange(63, dtype=np.int64)


def splitmix64(x: int) -> int:
    """One step of splitmix64 on a Python int: derives well-mixed round keys from small seeds."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """`splitmix64` on every element of a uint64 array (wrapping arithmetic, as on ints).

    Examples:
        >>> x = np.array([0, 7, 2**64 - 1], np.uint64)
        >>> splitmix64_array(x).tolist() == [splitmix64(int(v)) for v in x]
        True
    """
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _round_keys(key: int) -> tuple[int, ...]:
    keys, k = [], key & MASK64
    for _ in range(_ROUNDS):
        k = splitmix64(k)
        keys.append(k)
    return tuple(keys)


@dataclass(frozen=True)
class IndexShuffle:
    """A keyed permutation of ``range(n)``, evaluated pointwise in O(1) memory per index.

    An unbalanced Feistel network permutes ``[0, 2**bits)``, the smallest power of two >= n (each
    round swaps a ``hi``-bit and a ``lo``-bit half: ``(hi, lo) -> (lo, hi ^ F(lo))``, a bijection
    whatever the split); cycle walking (re-applying it to values that land outside ``[0, n)``)
    restricts it to ``[0, n)`` while staying a bijection. The domain is at most ``2n``, so each
    value needs fewer than 2 walks on average. ``F`` is a keyed multiplicative hash (top bits).

    Examples:
        >>> perm = IndexShuffle(10, key=7)
        >>> out = perm(np.arange(10))
        >>> sorted(out.tolist()) == list(range(10))
        True
    """

    n: int
    key: int

    def __call__(self, index: np.ndarray) -> np.ndarray:
        bits = max(2, (self.n - 1).bit_length())
        keys = _round_keys(self.key)
        out = np.asarray(index, dtype=np.uint64).copy()
        todo = np.arange(out.size)
        while todo.size:
            out[todo] = _feistel(out[todo], bits, keys)
            todo = todo[out[todo] >= self.n]
        return out.astype(np.int64)


def _feistel(x: np.ndarray, bits: int, keys: tuple[int, ...]) -> np.ndarray:
    hi_bits, lo_bits = bits - bits // 2, bits // 2
    for key in keys:
        hi, lo = x >> np.uint64(lo_bits), x & np.uint64((1 << lo_bits) - 1)
        f = _round(lo, np.uint64(key))
        x = (lo << np.uint64(hi_bits)) | (hi ^ (f >> np.uint64(64 - hi_bits)))
        hi_bits, lo_bits = lo_bits, hi_bits
    return x


def _round(lo: np.ndarray, key: np.ndarray | np.uint64) -> np.ndarray:
    """A Feistel round's function of the low half: multiplicative hashing, so the top bits of
    the products (the ones used) depend on every bit of ``lo``."""
    f = (lo ^ key) * np.uint64(0x9E3779B97F4A7C15)
    return (f ^ (f >> np.uint64(32))) * np.uint64(0xD6E8FEB86659FD93)


def shuffle_each(index: np.ndarray, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """``IndexShuffle(n[i], key[i])(index[i])`` for every ``i``, in one vectorised pass.

    Many small permutations at once (a mixture's blocks and its sources' epochs): each element
    has its own domain and key, and the result equals `IndexShuffle`'s element by element.

    Examples:
        >>> shuffle_each(np.array([3, 3]), np.array([10, 7]), np.array([5, 9])).tolist() == [
        ...     int(IndexShuffle(10, 5)(np.array([3]))[0]), int(IndexShuffle(7, 9)(np.array([3]))[0])]
        True
    """
    index = np.asarray(index, dtype=np.int64)
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), index.shape)
    key = np.broadcast_to(np.asarray(key, dtype=np.uint64), index.shape)
    # a mixture's batch may hold as many domains and keys as elements: no Python loop over them
    below = np.searchsorted(_POWERS, n - 1, side="right")  # (n - 1).bit_length()
    bits = np.maximum(2, below).astype(np.uint64)
    round_keys = np.empty((_ROUNDS, index.size), np.uint64)
    k = key.reshape(-1)
    for r in range(_ROUNDS):  # `_round_keys`, elementwise
        k = round_keys[r] = splitmix64_array(k)
    out = index.astype(np.uint64).reshape(-1)
    limit, bits = n.astype(np.uint64).reshape(-1), bits.reshape(-1)
    todo = np.arange(out.size)
    while todo.size:
        out[todo] = _feistel_each(out[todo], bits[todo], round_keys[:, todo])
        todo = todo[out[todo] >= limit[todo]]
    return out.astype(np.int64).reshape(index.shape)


def _feistel_each(x: np.ndarray, bits: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`_feistel` with a bit width and round keys per element."""
    one = np.uint64(1)
    hi_bits = bits - bits // np.uint64(2)
    lo_bits = bits // np.uint64(2)
    for key in keys:
        hi, lo = x >> lo_bits, x & ((one << lo_bits) - one)
        f = _round(lo, key)
        x = (lo << hi_bits) | (hi ^ (f >> (np.uint64(64) - hi_bits)))
        hi_bits, lo_bits = lo_bits, hi_bits
    return x
