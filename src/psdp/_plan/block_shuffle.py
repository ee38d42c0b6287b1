"""`BlockShuffle`: an I/O-aware permutation of ``range(n)`` for remote stores.

Rows are cut into blocks of ``io_block`` consecutive rows; the blocks are shuffled, then the rows
of each window of ``window_blocks`` consecutive (shuffled) blocks are shuffled among themselves.
So any window of positions reads at most ``window_blocks`` blocks: with blocks aligned to a
store's read unit (a zarr inner chunk), a step costs a few large requests instead of one per row.
Like `IndexShuffle` it is pointwise: position -> row id in O(1) memory per index, any position
costs the same, so resuming at any step is free. Mental model: a deck of ``n / io_block`` packets,
packets shuffled, then every ``window_blocks`` packets riffled together.

A short last block (``n % io_block`` rows) takes a keyed slot among the blocks, so its rows are
not always last; a short last window (fewer than ``window_blocks`` blocks) is shuffled alike.
The rule in full: ``docs/concepts/order-and-resume.md``, "The permutations, bit for bit".
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from psdp._checks import check_int
from psdp._plan.index_shuffle import IndexShuffle

_U64 = np.uint64
_ROUNDS = 6
_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class BlockShuffle:
    """A keyed permutation of ``range(n)`` that keeps each window of positions in few blocks.

    Args:
        n: rows to permute (>= 1).
        io_block: rows per block, e.g. a store's ``rows_per_chunk`` (>= 1).
        window_blocks: blocks whose rows are shuffled together (>= 1); any aligned window of
            ``io_block * window_blocks`` positions reads at most this many blocks.
        key: the permutation's key (an epoch's key), in ``[0, 2**64 - 1]``.

    Examples:
        Ten rows in blocks of 2, windows of 2 blocks: positions 0-3 hold the rows of two blocks.

        >>> perm = BlockShuffle(10, io_block=2, window_blocks=2, key=7)
        >>> rows = perm(np.arange(10))
        >>> sorted(rows.tolist()) == list(range(10))
        True
        >>> len({row // 2 for row in rows[:4].tolist()})  # blocks read by the first window
        2
    """

    n: int
    io_block: int
    window_blocks: int
    key: int

    def __post_init__(self) -> None:
        for name in ("n", "io_block", "window_blocks"):
            check_int(name, getattr(self, name), minimum=1)
            object.__setattr__(self, name, operator.index(getattr(self, name)))
        check_int("key", self.key, minimum=0)
        if self.key >> 64:
            raise ValueError(f"key must be in [0, 2**64 - 1], got {self.key}")
        object.__setattr__(self, "key", operator.index(self.key))

    @property
    def num_blocks(self) -> int:
        """Blocks, the short last one included: ``ceil(n / io_block)``."""
        return -(-self.n // self.io_block)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The row ids (int64) at ``positions`` (ints in ``[0, n)``)."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.n):
            raise ValueError(
                f"positions must be in [0, {self.n - 1}], got {int(p.min())} to {int(p.max())}"
            )
        window = self._slot_of(p) // self.window_blocks
        start = self._slot_start(window * self.window_blocks)
        stop = self._slot_start(np.minimum((window + 1) * self.window_blocks, self.num_blocks))
        within = _keyed_permutation(p - start, stop - start, _window_keys(self.key, window))
        slot, offset = self._slot_and_offset(start + within)
        return self._block_at(slot) * self.io_block + offset

    # ------------------------------------------------------------------ slots and blocks
    # Slot s of the shuffled deck holds block `_block_at(s)`. Every block has `io_block` rows
    # except the short last one (`tail` rows), which sits at slot `tail_slot`; positions after it
    # are shifted back by the rows it lacks.
    @property
    def _tail(self) -> int:
        return self.n - (self.num_blocks - 1) * self.io_block

    @property
    def _tail_slot(self) -> int:
        if self._tail == self.io_block:  # no short block: the last slot holds a full one
            return self.num_blocks - 1
        return int(_splitmix(np.array([self.key ^ _GOLDEN], _U64))[0] % _U64(self.num_blocks))

    def _slot_start(self, slot: np.ndarray | int) -> np.ndarray:
        """The first position of ``slot`` (``num_blocks``: ``n``)."""
        slot = np.asarray(slot, np.int64)
        short = self.io_block - self._tail
        return slot * self.io_block - np.where(slot > self._tail_slot, short, 0)

    def _slot_of(self, p: np.ndarray) -> np.ndarray:
        slot, _ = self._slot_and_offset(p)
        return slot

    def _slot_and_offset(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tail_start = self._tail_slot * self.io_block
        after = p >= tail_start + self._tail  # past the short block: shifted by what it lacks
        shifted = np.where(after, p + (self.io_block - self._tail), p)
        return shifted // self.io_block, shifted % self.io_block

    def _block_at(self, slot: np.ndarray) -> np.ndarray:
        """The block in ``slot``: the short last block at its slot, a shuffled full one elsewhere."""
        tail_slot, full = self._tail_slot, self.num_blocks - 1
        if self._tail == self.io_block:
            return IndexShuffle(self.num_blocks, self.key)(slot)
        if full == 0:  # the short block is the only one
            return np.zeros_like(slot)
        others = slot - (slot > tail_slot)  # the other slots, numbered 0 .. full - 1
        shuffled = IndexShuffle(full, self.key)(np.where(slot == tail_slot, 0, others))
        return np.where(slot == tail_slot, full, shuffled)


# ---------------------------------------------------------------- a per-element Feistel
def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64 on uint64 arrays (wrapping arithmetic, as the algorithm intends)."""
    with np.errstate(over="ignore"):
        x = x + _U64(_GOLDEN)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _window_keys(key: int, window: np.ndarray) -> np.ndarray:
    return _splitmix(_splitmix(np.full(window.shape, key, _U64)) ^ window.astype(_U64))


def _keyed_permutation(x: np.ndarray, size: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Element i of ``x`` permuted within ``[0, size[i])`` under ``keys[i]``: a Feistel network
    on the smallest power of two >= size[i], cycle-walked back into range (as `IndexShuffle`,
    but every element with its own key and domain, so windows of any size go in one call)."""
    _, exponent = np.frexp((size - 1).astype(np.float64))  # (size - 1).bit_length(), exactly
    bits = np.maximum(exponent, 2).astype(_U64)
    out = x.astype(_U64)
    todo = np.arange(out.size)
    while todo.size:
        out[todo] = _feistel(out[todo], bits[todo], keys[todo])
        todo = todo[out[todo] >= size[todo].astype(_U64)]
    return out.astype(np.int64)


def _feistel(x: np.ndarray, bits: np.ndarray, keys: np.ndarray) -> np.ndarray:
    lo_bits = bits // _U64(2)
    hi_bits = bits - lo_bits
    k = keys
    with np.errstate(over="ignore"):
        for _ in range(_ROUNDS):
            k = _splitmix(k)
            hi, lo = x >> lo_bits, x & ((_U64(1) << lo_bits) - _U64(1))
            f = (lo ^ k) * _U64(_GOLDEN)
            f = (f ^ (f >> _U64(32))) * _U64(0xD6E8FEB86659FD93)
            x = (lo << hi_bits) | (hi ^ (f >> (_U64(64) - hi_bits)))
            hi_bits, lo_bits = lo_bits, hi_bits
    return x
