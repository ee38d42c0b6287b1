"""The global order: the source rows of every step's batch, a pure function of the step.

Endless epochs, each a keyed permutation evaluated only where a step needs it, so any step costs
the same to look up: ``docs/loader.md``, "The order and the resume rule".
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from psdp._checks import check_int

_MASK64 = (1 << 64) - 1
_ROUNDS = 6


def _splitmix64(x: int) -> int:
    """One step of splitmix64 on a Python int: derives well-mixed round keys from small seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _round_keys(key: int) -> tuple[int, ...]:
    keys, k = [], key & _MASK64
    for _ in range(_ROUNDS):
        k = _splitmix64(k)
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

    Example:
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
        # multiplicative hashing: the top bits of the products depend on every bit of lo
        f = (lo ^ np.uint64(key)) * np.uint64(0x9E3779B97F4A7C15)
        f = (f ^ (f >> np.uint64(32))) * np.uint64(0xD6E8FEB86659FD93)
        x = (lo << np.uint64(hi_bits)) | (hi ^ (f >> np.uint64(64 - hi_bits)))
        hi_bits, lo_bits = lo_bits, hi_bits
    return x


#: The id `GlobalOrder.batch_ids` gives a padding position (an epoch's short final batch).
PAD = -1


def check_seed(seed: object) -> None:
    """Raises unless ``seed`` is an int in ``[0, 2**64 - 1]``, the seeds with distinct orders.

    The order hashes the seed as 64 bits, so a seed outside that range would silently repeat
    the order of another (``2**64`` that of ``0``, ``-1`` that of ``2**64 - 1``).

    Example:
        >>> check_seed(2**64)
        Traceback (most recent call last):
            ...
        ValueError: seed must be in [0, 2**64 - 1] (the order hashes it as 64 bits, so other seeds would repeat another seed's order), got 18446744073709551616; pass seed % 2**64 (the order such a seed used to give) or a new one, e.g. secrets.randbits(64)
    """
    check_int("seed", seed, minimum=None)
    if not 0 <= int(seed) <= _MASK64:  # type: ignore[call-overload]
        raise ValueError(
            f"seed must be in [0, 2**64 - 1] (the order hashes it as 64 bits, so other seeds "
            f"would repeat another seed's order), got {seed}; pass seed % 2**64 (the order such a "
            "seed used to give) or a new one, e.g. secrets.randbits(64)"
        )


@dataclass(frozen=True)
class GlobalOrder:
    """Row ids of every step's global batch.

    Args:
        num_rows: ``N``, the number of source rows.
        batch_size: ``B``, rows per global batch.
        shuffle: permute each epoch (from ``seed`` and the epoch number) or keep source order.
        seed: the shuffle seed.
        drop_last: drop each epoch's short final batch (its last ``N % B`` rows) instead of
            padding it with `PAD` ids.

    Example:
        >>> GlobalOrder(10, 4, shuffle=False).batch_ids(2).tolist()  # the short final batch
        [8, 9, -1, -1]
        >>> GlobalOrder(10, 4, shuffle=False).batch_ids(3).tolist()  # epoch 1 starts afresh
        [0, 1, 2, 3]
        >>> GlobalOrder(10, 4, shuffle=False, drop_last=True).batch_ids(2).tolist()
        [0, 1, 2, 3]
    """

    num_rows: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        check_seed(self.seed)
        for name in ("num_rows", "batch_size", "seed"):  # numpy ints would overflow the hashing
            object.__setattr__(self, name, operator.index(getattr(self, name)))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_rows < 1:
            raise ValueError(f"the source is empty (num_rows={self.num_rows}); it needs rows")
        if self.drop_last and self.num_rows < self.batch_size:
            raise ValueError(
                f"drop_last=True with a source of {self.num_rows} rows and global_batch_size="
                f"{self.batch_size} would yield no batch at all; use a batch of at most "
                f"{self.num_rows} rows or set drop_last=False (the short batch is then padded "
                "and masked)"
            )

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: ``N // B`` with ``drop_last``, otherwise ``ceil(N / B)``."""
        if self.drop_last:
            return self.num_rows // self.batch_size
        return -(-self.num_rows // self.batch_size)

    @property
    def pads(self) -> bool:
        """Whether some batch holds padding (`PAD` ids): an epoch's short final batch."""
        return not self.drop_last and self.num_rows % self.batch_size != 0

    def batch_ids(self, step: int) -> np.ndarray:
        """The ``B`` source row ids of the global batch at ``step``: increasing, then `PAD` for
        padding (int64)."""
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n, b = self.num_rows, self.batch_size
        epoch, within_epoch = divmod(step, self.steps_per_epoch)
        position = within_epoch * b + np.arange(b, dtype=np.int64)
        real = position < n
        if not self.shuffle:
            return np.where(real, position, PAD)
        ids = IndexShuffle(n, self._epoch_key(epoch))(position[real])
        # a batch is a set of rows: in increasing id order, every host's reads are sorted gathers
        return np.concatenate([np.sort(ids), np.full(b - len(ids), PAD, np.int64)])

    def _epoch_key(self, epoch: int) -> int:
        return _splitmix64((_splitmix64(self.seed & _MASK64) ^ epoch) & _MASK64)
