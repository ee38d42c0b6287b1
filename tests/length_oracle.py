"""An independent oracle of length stages (docs/concepts/length-stages.md): every source's epoch
streams built whole (its units in the documented keyed order), cut into lanes, and each source's
samples walked one by one in sample order, each taking the next ``seq_len`` tokens of its lane,
instead of the plan's closed-form lane positions. The mixture is tests/mixture_oracle.py's, the
keyed permutations tests/shuffle_oracle.py's (nothing from psdp)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from tests.mixture_oracle import OracleMixture
from tests.shuffle_oracle import GOLDEN, index_shuffle, splitmix64

UNIT_TAG = 0x756E69742D6F7264  # documented in docs/concepts/length-stages.md


class OracleLengthRun:
    """The rows of offsets ``[0, count)`` of a run with length stages, each as store positions."""

    def __init__(
        self,
        names: Sequence[str],
        tokens: Sequence[int],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        block_size: int,
        lanes: int,
        unit_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        extra: int = 0,
    ):
        self.names, self.tokens = list(names), list(tokens)
        self.stages = list(stages)
        self.block, self.lanes, self.unit = block_size, lanes, unit_tokens
        self.seed, self.shuffle, self.extra = seed, shuffle, extra
        self.mixture = OracleMixture(
            names,
            [max(1, t) for t in tokens],
            [(s, w) for s, _, w in stages],
            block_size,
            seed,
            shuffle,
        )
        self._epochs: dict[tuple[int, int], np.ndarray] = {}

    def seq_len(self, offset: int) -> int:
        return [n for start, n, _ in self.stages if start <= offset][-1]

    def epoch_stream(self, source: int, epoch: int) -> np.ndarray:
        """Source ``source``'s epoch ``epoch``: its store positions in the epoch's order."""
        if (source, epoch) not in self._epochs:
            total, unit = self.tokens[source], self.unit
            full, short = divmod(total, unit)
            order = list(range(full))
            if self.shuffle:
                digest = hashlib.blake2b(self.names[source].encode(), digest_size=8).digest()
                key = splitmix64(splitmix64(self.seed) ^ int.from_bytes(digest, "little"))
                key = splitmix64(key ^ UNIT_TAG ^ epoch)
                order = [index_shuffle(full, key, i) for i in range(full)] if full else []
                if short:
                    order.insert(splitmix64(key ^ GOLDEN) % (full + 1), full)
            elif short:
                order.append(full)
            parts = [np.arange(u * unit, min((u + 1) * unit, total)) for u in order]
            self._epochs[(source, epoch)] = np.concatenate(parts) if parts else np.zeros(0, int)
        return self._epochs[(source, epoch)]

    def lane_tokens(self, source: int, lane: int, start: int, count: int) -> tuple[list, list]:
        """Tokens ``[start, start + count)`` of a lane's endless stream (its part of each epoch
        back to back), with each token's epoch."""
        total = self.tokens[source]
        first, stop = total * lane // self.lanes, total * (lane + 1) // self.lanes
        size = stop - first
        out, epochs = [], []
        for position in range(start, start + count):
            epoch, within = divmod(position, size)
            out.append(int(self.epoch_stream(source, epoch)[first + within]))
            epochs.append(epoch)
        return out, epochs

    def rows(self, count: int) -> list[tuple[int, list[int], list[int], int]]:
        """``(source, tokens, epochs, seq_len)`` of offsets ``[0, count)``, ``count`` a multiple
        of the block: each source's samples are walked in sample order, lane cursors kept."""
        assert count % self.block == 0
        source, _ = self.mixture.sequence(count)
        sample = self.mixture.samples(count)
        by_sample = {
            (int(s), int(j)): g for g, (s, j) in enumerate(zip(source, sample, strict=False))
        }
        out: list = [None] * count
        for s in range(len(self.names)):
            cursors = [0] * self.lanes
            j = 0
            while (s, j) in by_sample:
                g = by_sample[(s, j)]
                lane, length = j % self.lanes, self.seq_len(g)
                tokens, epochs = self.lane_tokens(s, lane, cursors[lane], length + self.extra)
                out[g] = (s, tokens, epochs, length)
                cursors[lane] += length
                j += 1
        return out
