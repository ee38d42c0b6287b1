"""An independent oracle of a mixture (docs/guides/mixtures.md, "The map"): it walks the blocks one by one
in plain Python, counting what each source gave so far, instead of the plan's prefix sums and
vectorised lookups. Its keyed permutations and `splitmix64` are tests/shuffle_oracle.py's (the
documented rule written again, nothing from psdp), with the documented keys."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from tests.shuffle_oracle import index_shuffle, splitmix64

BLOCK_TAG = 0x6D69782D626C6F63  # documented in docs/guides/mixtures.md


def largest_remainder(weights: Sequence[float], block: int) -> list[int]:
    """Hamilton's method: floors of the exact quotas, then one more to each of the largest
    remainders (earlier source first on ties), of the weights as written: a float is the
    decimal number its shortest repr shows (docs/guides/mixtures.md)."""
    exact = [Fraction(repr(w)) if isinstance(w, float) else Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [w * block / total for w in exact]
    floors = [q.numerator // q.denominator for q in quotas]
    remainders = [q - f for q, f in zip(quotas, floors, strict=True)]
    ranked = sorted(range(len(weights)), key=lambda i: remainders[i], reverse=True)  # stable
    for i in ranked[: block - sum(floors)]:
        floors[i] += 1
    return floors


class OracleMixture:
    """The sequence of (source, row) of a mixture, walked block by block from offset 0."""

    def __init__(
        self,
        names: Sequence[str],
        lengths: Sequence[int],
        stages: Sequence[tuple[int, Mapping[str, float]]],
        block_size: int,
        seed: int = 0,
        shuffle: bool = True,
    ):
        self.names, self.lengths = list(names), list(lengths)
        self.stages = [(s, [float(w.get(n, 0)) for n in names]) for s, w in stages]
        self.block, self.seed, self.shuffle = block_size, seed, shuffle
        self._source = np.zeros(0, np.int64)
        self._row = np.zeros(0, np.int64)
        self._sample = np.zeros(0, np.int64)
        self._given = [0] * len(names)
        self._epochs: dict[tuple[int, int], list[int]] = {}

    def stage_weights(self, offset: int) -> list[float]:
        weights = self.stages[0][1]
        for start, w in self.stages:
            if start <= offset:
                weights = w
        return weights

    def block_counts(self, block: int) -> list[int]:
        return largest_remainder(self.stage_weights(block * self.block), self.block)

    def sequence(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, row) of offsets ``[0, count)``."""
        while len(self._source) < count:
            self._walk_block(len(self._source) // self.block)
        return self._source[:count], self._row[:count]

    def _walk_block(self, block: int) -> None:
        counts = self.block_counts(block)
        key = splitmix64(splitmix64(BLOCK_TAG ^ splitmix64(self.seed)) ^ block)
        position_slot = [index_shuffle(self.block, key, p) for p in range(self.block)]
        slots = np.array(position_slot, np.int64)
        owner = np.repeat(np.arange(len(counts)), counts)  # slot -> source, sources in order
        rank = np.concatenate([np.arange(c) for c in counts]).astype(np.int64)
        source, rows = owner[slots], np.zeros(self.block, np.int64)
        samples = np.zeros(self.block, np.int64)
        handed = [0] * len(counts)  # unshuffled: each source's samples in position order
        for position in range(self.block):
            s = int(source[position])
            within = int(rank[slots[position]]) if self.shuffle else handed[s]
            handed[s] += 1
            samples[position] = self._given[s] + within
            rows[position] = self._row_of(s, int(samples[position]))
        for s, c in enumerate(counts):
            self._given[s] += c
        self._source = np.concatenate([self._source, source])
        self._row = np.concatenate([self._row, rows])
        self._sample = np.concatenate([self._sample, samples])

    def samples(self, count: int) -> np.ndarray:
        """Each offset's sample number within its source (its source's samples so far)."""
        self.sequence(count)
        return self._sample[:count]

    def _row_of(self, source: int, sample: int) -> int:
        n = self.lengths[source]
        epoch, within = divmod(sample, n)
        if not self.shuffle:
            return within
        if (source, epoch) not in self._epochs:
            name = self.names[source].encode()
            digest = int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")
            key = splitmix64(splitmix64(splitmix64(self.seed) ^ digest) ^ epoch)
            self._epochs[(source, epoch)] = [index_shuffle(n, key, i) for i in range(n)]
        return int(self._epochs[(source, epoch)][within])


class OracleLeaf:
    """A mixture's leaf as a lazy table indexed by sample offset (for tests/oracle.py)."""

    def __init__(self, mixture: OracleMixture, data: Sequence[np.ndarray]):
        self.mixture, self.data = mixture, data

    def __len__(self) -> int:
        return 1 << 62

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        # a test reads a few thousand offsets; a far one means the loader lost the offset order
        assert ids.max(initial=0) < 1 << 20, f"offset {ids.max()} is far past any test's run"
        source, row = self.mixture.sequence(int(ids.max(initial=0)) + 1)
        return np.stack([self.data[source[g]][row[g]] for g in ids.tolist()])


def tag_leaf(mixture: OracleMixture) -> OracleLeaf:
    """The ``source`` tag leaf: each source's rows are its index (int32)."""
    tags = [np.full(n, i, np.int32) for i, n in enumerate(mixture.lengths)]
    return OracleLeaf(mixture, tags)


def mixture_at(
    names: Sequence[str],
    lengths: Sequence[int],
    stages: Sequence[tuple[int, Mapping[str, float]]],
    block: int,
    seed: int,
    offset: int,
) -> tuple[int, int]:
    """(source, row) at one sample offset anywhere in a run (2**40 is as cheap as 0): the same
    documented rule as `OracleMixture`, but a source's samples before the offset's block summed
    stage by stage (whole blocks of each earlier stage times its counts) instead of walked."""
    number, position = divmod(offset, block)
    weights = [[float(w.get(n, 0)) for n in names] for _, w in stages]
    firsts = [start // block for start, _ in stages] + [number + 1]
    given = [0] * len(names)
    for index, counts in enumerate(largest_remainder(w, block) for w in weights):
        if firsts[index] > number:
            break
        blocks = min(firsts[index + 1], number) - firsts[index]
        given = [g + blocks * c for g, c in zip(given, counts, strict=True)]
        here = counts
    key = splitmix64(splitmix64(BLOCK_TAG ^ splitmix64(seed)) ^ number)
    slot = index_shuffle(block, key, position)
    source = 0
    while slot >= sum(here[: source + 1]):  # the slots are the sources' in turn
        source += 1
    sample = given[source] + slot - sum(here[:source])
    epoch, within = divmod(sample, lengths[source])
    digest = int.from_bytes(
        hashlib.blake2b(names[source].encode(), digest_size=8).digest(), "little"
    )
    epoch_key = splitmix64(splitmix64(splitmix64(seed) ^ digest) ^ epoch)
    return source, index_shuffle(lengths[source], epoch_key, within)
