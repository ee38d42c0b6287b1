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


def offsets_by_sample(mixture: OracleMixture, count: int) -> dict[tuple[int, int], int]:
    """``(source, sample)`` -> the offset in ``[0, count)`` that reads it, from the mixture
    oracle's sequence of sources and their sample numbers."""
    source, _ = mixture.sequence(count)
    sample = mixture.samples(count)
    return {(int(s), int(j)): g for g, (s, j) in enumerate(zip(source, sample, strict=False))}


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
        by_sample = offsets_by_sample(self.mixture, count)
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


DOCS_TAG = 0x646F632D6F726465  # documented in docs/concepts/length-stages.md, "Packed sources"


class NoRow(Exception):
    """A lane's part of an epoch packs no row (every document dropped)."""


class OraclePackedRun:
    """The packed rows of offsets ``[0, count)`` of a run with length stages: each source's
    epochs as lists of its non-empty documents in the documented keyed order, cut into lanes, and
    each source's samples walked one by one in sample order, each packing greedily from a
    document cursor per lane (epoch, position, token), instead of the plan's cached pack plans.
    A row: ``(source, [(document, first token, tokens), ...], seq_len)``."""

    def __init__(
        self,
        names: Sequence[str],
        lengths: Sequence[Sequence[int]],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        block_size: int,
        lanes: int,
        seed: int = 0,
        shuffle: bool = True,
        long_documents: str | None = None,
        max_segments: int | None = None,
    ):
        self.names, self.lengths = list(names), [list(a) for a in lengths]
        self.stages, self.block, self.lanes = list(stages), block_size, lanes
        self.seed, self.shuffle = seed, shuffle
        self.long = long_documents or "split"
        self.cap = max_segments
        self.kept = [[d for d, n in enumerate(a) if n > 0] for a in self.lengths]
        self.mixture = OracleMixture(
            names, [max(1, len(k)) for k in self.kept], [(s, w) for s, _, w in stages],
            block_size, seed, shuffle,
        )  # fmt: skip

    def seq_len(self, offset: int) -> int:
        return [n for start, n, _ in self.stages if start <= offset][-1]

    def lane(self, source: int, lane: int, epoch: int) -> list[int]:
        """The store documents of lane ``lane``'s part of epoch ``epoch``, in order."""
        kept = self.kept[source]
        n = len(kept)
        order = list(range(n))
        if self.shuffle:
            digest = hashlib.blake2b(self.names[source].encode(), digest_size=8).digest()
            key = splitmix64(splitmix64(self.seed) ^ int.from_bytes(digest, "little"))
            key = splitmix64(key ^ DOCS_TAG ^ epoch)
            order = [index_shuffle(n, key, i) for i in range(n)]
        return [kept[order[p]] for p in range(lane * n // self.lanes, (lane + 1) * n // self.lanes)]

    def pack(self, source: int, cursor: list[int], seq_len: int) -> list[tuple[int, int, int]]:
        """One row from ``cursor`` = [epoch, position, token] (moved past the row): documents
        taken in order while they fit, dropped ones skipped, never past the lane's epoch end."""
        lane_docs = self.lane(source, cursor[3], cursor[0])
        row: list[tuple[int, int, int]] = []
        room = seq_len
        for _ in range(10**6):
            # at the start of a lane's part of an epoch (the run's first included)
            if (
                cursor[1:3] == [0, 0]
                and self.long == "drop"
                and all(self.lengths[source][d] > seq_len for d in lane_docs)
            ):
                raise NoRow(f"lane {cursor[3]} of source {source}, epoch {cursor[0]}")
            if cursor[1] == len(lane_docs):
                if row:
                    return row
                cursor[:3] = [cursor[0] + 1, 0, 0]
                lane_docs = self.lane(source, cursor[3], cursor[0])
                continue
            doc = lane_docs[cursor[1]]
            rest = self.lengths[source][doc] - cursor[2]
            if rest > seq_len and self.long == "drop":
                cursor[1:3] = [cursor[1] + 1, 0]
                continue
            if self.cap is not None and len(row) == self.cap:
                return row
            if rest > seq_len and not row:  # a long document in an empty row: its next seq_len
                row.append((doc, cursor[2], seq_len))
                if self.long == "truncate":
                    cursor[1:3] = [cursor[1] + 1, 0]
                else:
                    cursor[2] += seq_len
                return row
            if rest > room:
                return row
            row.append((doc, cursor[2], rest))
            room -= rest
            cursor[1:3] = [cursor[1] + 1, 0]
        raise AssertionError("a row never ended")

    def rows(self, count: int) -> list[tuple[int, list[tuple[int, int, int]], int]]:
        """``(source, pieces, seq_len)`` of offsets ``[0, count)``, ``count`` a multiple of the
        block: each source's samples walked in sample order, a cursor per lane."""
        assert count % self.block == 0
        by_sample = offsets_by_sample(self.mixture, count)
        out: list = [None] * count
        for s in range(len(self.names)):
            cursors = [[0, 0, 0, lane] for lane in range(self.lanes)]
            j = 0
            while (s, j) in by_sample:
                g = by_sample[(s, j)]
                length = self.seq_len(g)
                out[g] = (s, self.pack(s, cursors[j % self.lanes], length), length)
                j += 1
        return out
