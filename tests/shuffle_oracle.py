"""The epoch permutations written again from their documented rule alone (``docs/concepts/order-and-resume.md``,
"The permutations, bit for bit"), in plain Python integers: nothing here comes from psdp.

Deliberately simple and slow: a full shuffle one position at a time, a block shuffle as a deck
of blocks laid out in lists (tests keep its ``n`` small). tests/test_oracle.py pins both with
literal known answers, so a change of the rule in psdp or here fails there first.
"""

from __future__ import annotations

import functools

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
ROUNDS = 6


def splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele, Lea and Flood, 2014) on a 64-bit word."""
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def epoch_key(seed: int, epoch: int) -> int:
    """The key of epoch ``epoch``'s permutation."""
    return splitmix64(splitmix64(seed) ^ epoch)


def index_shuffle(n: int, key: int, x: int) -> int:
    """Position ``x`` of the keyed permutation of ``range(n)``: six Feistel rounds on
    ``bits`` bits, repeated while the result lies outside ``range(n)``."""
    bits = max(2, (n - 1).bit_length())
    keys, k = [], key
    for _ in range(ROUNDS):
        k = splitmix64(k)
        keys.append(k)
    while True:
        high, low = bits - bits // 2, bits // 2
        for k in keys:
            hi, lo = x >> low, x & ((1 << low) - 1)
            f = ((lo ^ k) * GOLDEN) & MASK64
            f = ((f ^ (f >> 32)) * 0xD6E8FEB86659FD93) & MASK64
            x = (lo << high) | (hi ^ (f >> (64 - high)))
            high, low = low, high
        if x < n:
            return x


@functools.lru_cache(maxsize=8)  # a test reads an epoch's positions over several steps
def block_shuffle(n: int, io_block: int, window_blocks: int, key: int) -> tuple[int, ...]:
    """The whole block-shuffled permutation of ``range(n)``: position -> row."""
    blocks = [list(range(first, min(first + io_block, n))) for first in range(0, n, io_block)]
    full = [block for block in blocks if len(block) == io_block]
    deck = [full[index_shuffle(len(full), key, slot)] for slot in range(len(full))]
    if len(full) < len(blocks):  # the short last block, at its keyed slot
        deck.insert(splitmix64(key ^ GOLDEN) % len(blocks), blocks[-1])
    out: list[int] = []
    for window, first in enumerate(range(0, len(deck), window_blocks)):
        rows = [row for block in deck[first : first + window_blocks] for row in block]
        mixed = splitmix64(splitmix64(key) ^ window)
        out += [rows[index_shuffle(len(rows), mixed, i)] for i in range(len(rows))]
    return tuple(out)


def epoch_rows(
    n: int, seed: int, epoch: int, positions, block: tuple[int, int] | None = None
) -> list[int]:
    """The rows at ``positions`` of epoch ``epoch``'s permutation of ``n`` rows (``block``:
    the ``(io_block, window_blocks)`` of a block shuffle)."""
    key = epoch_key(seed, epoch)
    if block is None:
        return [index_shuffle(n, key, int(p)) for p in positions]
    permutation = block_shuffle(n, *block, key)
    return [permutation[int(p)] for p in positions]
