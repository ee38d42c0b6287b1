"""The mixture map: sample offset -> (source, row of that source), pure, a bisection a sample.

Offsets come in blocks of ``block_size``. A block takes exact per-source counts from the weights of
its stage (largest-remainder rounding), places them at positions drawn by a keyed permutation of
the block, and each source hands out its samples in turn: sample ``j`` of a source is row
``permutation_e(j - e n)`` of its epoch ``e = j // n``. Unshuffled, sample ``j`` is row
``j mod n`` and a block hands each source's samples out in the order of its positions, so every
source's rows come in store order. How many samples a source gave before a block is a sum over
the stages before it, so no table grows with the run: ``docs/guides/mixtures.md``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from psdp._plan.index_shuffle import MASK64, shuffle_each, splitmix64, splitmix64_array
from psdp._plan.order import check_seed

#: The ``kind`` of a mixture's record in a loader state: ``/2`` counts the weights as written
#: (`exact_weight`); ``/1``, the previous release's, counted their binary floats.
MIXTURE_KIND = "psdp.mixture/2"
_BINARY_KIND = "psdp.mixture/1"
#: A mixture's length: its rows are sample offsets, and no run reaches this many, so the
#: loader's order (which restarts at a source's end) never wraps back to the first stage.
MIXTURE_ROWS = 1 << 62
_BLOCK_TAG = 0x6D69782D626C6F63  # "mix-bloc": block permutations' keys apart from sources'


def block_counts(weights: Sequence[float | Fraction], block_size: int) -> tuple[int, ...]:
    """Per-source samples in one block: ``block_size * w / sum(w)`` rounded by largest remainder
    (exact fractions of the weights as written, `exact_weight`; ties go to the earlier source), so
    the counts sum to ``block_size`` and proportional weights give the same counts.

    Examples:
        >>> block_counts([0.5, 0.3, 0.2], 10), block_counts([1, 1, 1], 10)
        ((5, 3, 2), (4, 3, 3))
        >>> block_counts([0.3, 0.1], 10), block_counts([3, 1], 10)
        ((8, 2), (8, 2))
    """
    exact = [exact_weight(w) for w in weights]
    common = math.lcm(*(w.denominator for w in exact))
    scaled = [w.numerator * (common // w.denominator) for w in exact]  # w * common, ints
    total = sum(scaled)
    # quota_i = block * scaled_i / total: its floor and remainder (times total) in exact ints
    parts = [divmod(block_size * w, total) for w in scaled]
    counts = [floor for floor, _ in parts]
    by_remainder = sorted(range(len(parts)), key=lambda i: -parts[i][1])  # stable: earlier first
    for i in by_remainder[: block_size - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def exact_weight(weight: Any) -> Fraction:
    """A weight as the number it is written as: a float is the decimal of its shortest repr
    (``0.3`` is 3/10, not the binary float just below it), so ``0.3 : 0.1`` is exactly ``3 : 1``.

    Examples:
        >>> exact_weight(0.3), exact_weight(3)
        (Fraction(3, 10), Fraction(3, 1))
    """
    if isinstance(weight, float | np.floating):
        return Fraction(repr(float(weight)))
    return Fraction(weight)


#: Weights a chunk of `stage_counts` holds (its float temporaries: ~8 bytes each, a few times).
_CHUNK = 1 << 18


def stage_counts(weights: np.ndarray, block_size: int) -> np.ndarray:
    """`block_counts` of every row of ``weights`` (stages x sources), as an int64 array.

    Vectorised in float64 where a bound on its rounding error decides every count of a row (almost
    always), and exact (`block_counts`) for the rows it cannot: a remainder within the bound of 0
    or 1, or of the remainder that decides the last extra sample, with another weight.

    Examples:
        >>> stage_counts(np.array([[0.5, 0.3, 0.2], [1, 1, 1]]), 10).tolist()
        [[5, 3, 2], [4, 3, 3]]
    """
    weights = np.asarray(weights, np.float64)
    out = np.empty(weights.shape, np.int64)
    rows = max(1, _CHUNK // max(1, weights.shape[1]))
    for first in range(0, len(weights), rows):
        out[first : first + rows] = _float_counts(weights[first : first + rows], block_size)
    return out


def _float_counts(weights: np.ndarray, block: int) -> np.ndarray:
    sources = weights.shape[1]
    total = weights.sum(1)
    quota = block * weights / total[:, None]
    # Error bound: the sum of n weights >= 0 is within (n - 1) u of exact (u = 2**-53, any
    # order), the product and the quotient within u each, so |quota - exact| <= (n + 2) u block
    # (doubled for the second-order terms), while block < 2**53 is exact as a float and the
    # total lies far from underflow and overflow. The exact quota is of the weights' decimals
    # (`exact_weight`), each within u of its float: 2 u block more.
    error = 2 * (sources + 5) * 2.0**-53 * block
    floor = np.floor(quota)
    remainder = quota - floor  # exact
    counts = floor.astype(np.int64)
    extra = block - counts.sum(1)
    order = np.argsort(-remainder, axis=1, kind="stable")  # ties: the earlier source first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(sources), order.shape), axis=1)
    counts += rank < extra[:, None]
    # undecided rows: a floor within the bound of an integer (a weight of 0 is exact), or the
    # last remainder given an extra sample and the first not within twice the bound of each
    # other with different weights (equal weights have equal remainders, taken in order)
    unsure = ~((total >= 2.0**-900) & (total <= 2.0**900) & (block < 2**53))
    unsure |= ((weights > 0) & ((remainder < error) | (remainder > 1 - error))).any(1)
    unsure |= (extra < 0) | (extra >= sources)
    ranked = np.pad(np.take_along_axis(remainder, order, 1), ((0, 0), (0, 1)))
    at = np.clip(extra, 1, sources)[:, None]
    last, first_out = np.take_along_axis(ranked, at - 1, 1), np.take_along_axis(ranked, at, 1)
    band = (remainder >= first_out - 2 * error) & (remainder <= last + 2 * error)
    mixed = np.where(band, weights, np.inf).min(1) != np.where(band, weights, -np.inf).max(1)
    unsure |= (extra > 0) & (last[:, 0] - first_out[:, 0] <= 2 * error) & mixed
    for row in np.flatnonzero(unsure):
        counts[row] = block_counts(weights[row].tolist(), block)
    return counts


def source_key(seed: int, name: str) -> int:
    """The key of a source's epoch permutations: from the seed and the source's name (not its
    position), so listing the sources in another order keeps each one's order."""
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return splitmix64(splitmix64(seed & MASK64) ^ digest)


@dataclass(frozen=True)
class MixturePlan:
    """Which source and row every sample offset of a mixture reads (`locate`), checked on creation.

    Args:
        names: the sources, in tag order (the ``source`` leaf holds a position in ``names``).
        lengths: each source's rows.
        stages: ``(start_offset, weights)`` pairs, weights one per source, the first stage at 0,
            starts increasing and multiples of ``block_size``.
        block_size: samples per block; each block holds the exact counts of `block_counts`.
        seed: keys the block permutations and the sources' epoch permutations.
        shuffle: permute each source's epochs and hand a block's samples of a source out in
            its permuted order; ``False``: every source's rows in row order (a block's samples
            of a source in the order of their positions).

    Examples:
        >>> plan = MixturePlan(("a", "b"), (5, 100), ((0, (3.0, 1.0)),), block_size=4, seed=0)
        >>> source, row = plan.locate(np.arange(8))
        >>> np.bincount(source[:4]).tolist(), np.bincount(source[4:]).tolist()
        ([3, 1], [3, 1])
    """

    names: tuple[str, ...]
    lengths: tuple[int, ...]
    stages: tuple[tuple[int, tuple[float, ...]], ...]
    block_size: int
    seed: int = 0
    shuffle: bool = True
    #: (stages, sources) samples per block, each stage's
    counts: np.ndarray = field(init=False, repr=False, compare=False)
    #: where each source's slots end in a block of each stage, stage ``s``'s shifted by
    #: ``s * (block_size + 1)``: one increasing array, so one bisection finds a slot's source
    ends: np.ndarray = field(init=False, repr=False, compare=False)
    #: (stages, sources) samples each source gave before each stage's first block
    before: np.ndarray = field(init=False, repr=False, compare=False)
    #: each stage's first block
    first_blocks: np.ndarray = field(init=False, repr=False, compare=False)
    #: each source's rows, as an array
    length_array: np.ndarray = field(init=False, repr=False, compare=False)
    #: each source's key (`source_key`), and the key of the block permutations
    source_keys: np.ndarray = field(init=False, repr=False, compare=False)
    block_key: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_sources(self.names, self.lengths)
        block = check_block_size(self.block_size)
        check_seed(self.seed)
        object.__setattr__(self, "seed", operator.index(self.seed))
        weights = np.array([w for _, w in self.stages], np.float64).reshape(len(self.stages), -1)
        counts = stage_counts(weights, block)
        check_counts(self.names, self.stages, weights, counts, block)
        starts = np.array([start for start, _ in self.stages], np.int64) // block
        blocks_in = np.diff(starts)[:, None] * counts[:-1]
        before = np.concatenate([np.zeros((1, len(self.names)), np.int64), np.cumsum(blocks_in, 0)])
        shift = np.arange(len(counts), dtype=np.int64)[:, None] * (block + 1)
        ends = (np.cumsum(counts, 1) + shift).reshape(-1)
        lengths = np.array(self.lengths, np.int64)
        for name, value in (("counts", counts), ("ends", ends), ("before", before)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "first_blocks", starts)
        object.__setattr__(self, "length_array", lengths)
        keys = [source_key(self.seed, name) for name in self.names]
        object.__setattr__(self, "source_keys", np.array(keys, np.uint64))
        object.__setattr__(self, "block_key", splitmix64(_BLOCK_TAG ^ splitmix64(self.seed)))

    def slots(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per offset: its stage, its source, and how many samples that source gave before it."""
        offsets = np.asarray(offsets, np.int64)
        block, position = np.divmod(offsets, self.block_size)
        stage, source, before, rank = self._placed(block, position)
        if not self.shuffle:
            rank = self._ranks_in_order(block, position)
        return stage, source, before + rank

    def _placed(
        self, block: np.ndarray, position: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per (block, position): its stage, its source, the samples that source gave before
        the block, and its slot's rank among the source's slots of the block."""
        stage = np.searchsorted(self.first_blocks, block, side="right") - 1
        base = np.full(block.shape, self.block_key, np.uint64)
        slot = shuffle_each(position, self.block_size, _mix(base, block))
        # the first source whose slots end after the slot: a bisection of all stages' ends
        key = slot + stage * (self.block_size + 1)
        end = np.searchsorted(self.ends, key, side="right")
        source = end - stage * len(self.names)
        counts = self.counts[stage, source]
        rank = key - self.ends[end] + counts
        earlier = self.before[stage, source] + (block - self.first_blocks[stage]) * counts
        return stage, source, earlier, rank

    def _ranks_in_order(self, block: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Per (block, position): its rank among the positions of its block that its source
        fills, counted in position order. Every position of each block touched is placed (a
        block's permutation is evaluated whole), then grouped by (block, source), stably."""
        blocks, which = np.unique(block, return_inverse=True)
        size, count = self.block_size, len(self.names)
        every = np.arange(size, dtype=np.int64)
        _, source, _, _ = self._placed(np.repeat(blocks, size), np.tile(every, len(blocks)))
        group = np.repeat(np.arange(len(blocks), dtype=np.int64), size) * count + source
        by_group = np.argsort(group, kind="stable")  # each group's positions stay in order
        grouped = group[by_group]
        first = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        sizes = np.diff(np.r_[first, len(grouped)])
        rank = np.empty_like(group)
        rank[by_group] = np.arange(len(grouped)) - np.repeat(first, sizes)
        return rank.reshape(len(blocks), size)[which.reshape(-1), position.reshape(-1)].reshape(
            position.shape
        )

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source (a position in ``names``) and the row of that source at each offset."""
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        _, source, sample = self.slots(offsets)
        lengths = self.length_array[source]
        epoch, within = np.divmod(sample, lengths)
        if not self.shuffle:
            return source, within
        epoch_keys = _mix(self.source_keys[source], epoch)
        return source, shuffle_each(within, lengths, epoch_keys)

    def given_before(self, offset: int) -> np.ndarray:
        """Samples each source gave at offsets ``[0, offset)``: whole blocks by arithmetic, the
        part of ``offset``'s block by evaluating its permutation (at most ``block_size``)."""
        offset = operator.index(offset)
        if offset < 0:
            raise ValueError(f"a sample offset must be >= 0, got {offset}")
        block, position = divmod(offset, self.block_size)
        stage = int(np.searchsorted(self.first_blocks, block, side="right")) - 1
        whole = self.before[stage] + (block - self.first_blocks[stage]) * self.counts[stage]
        if not position:
            return whole
        _, source, _, _ = self._placed(
            np.full(position, block, np.int64), np.arange(position, dtype=np.int64)
        )
        return whole + np.bincount(source, minlength=len(self.names))

    def counts_between(self, offset: int, count: int) -> np.ndarray:
        """Samples each source gives at offsets ``[offset, offset + count)`` (reads nothing)."""
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        return self.given_before(offset + count) - self.given_before(offset)

    def record(self) -> dict[str, Any]:
        """What the samples depend on, as JSON values (a loader state keeps it)."""
        return {
            "kind": MIXTURE_KIND,
            "sources": [[name, n] for name, n in zip(self.names, self.lengths, strict=True)],
            "block_size": self.block_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "stages": [[start, list(w)] for start, w in self.stages],
            # unshuffled, a block's rows of a source come in row order; an earlier psdp placed
            # them in the block's permuted order, and its states lack this key
            **({} if self.shuffle else {"order": "rows"}),
        }

    def check_past(self, saved: Mapping[str, Any], offset: int) -> None:
        """Raises unless the saved ``record`` gives the same samples as this plan before
        ``offset``: the same sources, block size, seed and shuffle, and the same stages starting
        before ``offset`` (later stages may differ: they decide only later samples)."""
        now = self.record()
        if saved.get("kind") not in (MIXTURE_KIND, _BINARY_KIND):
            raise ValueError(
                f"the state was saved from a source recorded as {dict(saved)}, not a mixture "
                f"({MIXTURE_KIND}); resume with the source the state was saved from"
            )
        if saved.get("sources") != now["sources"]:
            raise ValueError(
                f"the mixture's sources differ from the saved run's "
                f"({source_change(saved.get('sources'), now['sources'])}): now "
                f"{now['sources']!r}, saved {saved.get('sources')!r} (name, rows; in tag order); "
                "every sample depends on them, so resume with the saved sources in the "
                "saved order"
            )
        for name in ("block_size", "seed", "shuffle"):
            if saved.get(name) != now[name]:
                raise ValueError(
                    f"the mixture's {name} is {now[name]!r}, but the saved run's was "
                    f"{saved.get(name)!r}; every sample depends on it, so resume with the saved "
                    "value (only stages that start at or after the resume offset "
                    f"{offset} may change)"
                )
        if saved.get("shuffle") is False and saved.get("order") != "rows":
            raise ValueError(
                "the state was saved by a psdp whose unshuffled mixture placed each block's rows "
                "of a source in the block's permuted order; this one reads every source in row "
                "order, so the rows after the resume would differ; resume it with the psdp that "
                "saved it, or start the run again"
            )
        if saved.get("kind") == _BINARY_KIND:
            self._check_binary_counts(offset)
        past = [s for s in saved["stages"] if s[0] < offset]
        mine = [s for s in now["stages"] if s[0] < offset]
        for index in range(max(len(past), len(mine))):
            if index < len(past) and index < len(mine) and _same_stage(past[index], mine[index]):
                continue
            raise ValueError(_past_stage_message(index, past, mine, self.names, offset))

    def _check_binary_counts(self, offset: int) -> None:
        """Raises where a state of the previous release (it counted the weights' binary floats)
        would read other samples here: a stage in effect by ``offset`` whose counts differ."""
        for (start, weights), counts in zip(self.stages, self.counts, strict=True):
            if start > offset:
                break
            binary = block_counts([Fraction(float(w)) for w in weights], self.block_size)
            if list(binary) != counts.tolist():
                raise ValueError(
                    f"the state was saved by a psdp that counted the weights {list(weights)} of "
                    f"the stage from offset {start} as binary floats, {list(binary)} samples a "
                    f"block, but they are now counted as written, {counts.tolist()}; resume it "
                    "with the psdp that saved it, or start the run again"
                )


def _same_stage(saved: Sequence[Any], now: Sequence[Any]) -> bool:
    """Two stage records ``[start, weights]`` that mix alike: one start, weights proportional as
    written (``0.3 : 0.1`` is ``3 : 1``), so their block counts are equal."""
    if saved[0] != now[0] or len(saved[1]) != len(now[1]):
        return False
    before, after = [exact_weight(w) for w in saved[1]], [exact_weight(w) for w in now[1]]
    return [w * sum(after) for w in before] == [w * sum(before) for w in after]


def source_change(saved: Any, now: Sequence[Sequence[Any]]) -> str:
    """What changed between two ``sources`` records (``[[name, rows], ...]``), in words."""
    before = {name: rows for name, rows in saved or ()}
    after = {name: rows for name, rows in now}
    words = []
    added = [n for n in after if n not in before]
    removed = [n for n in before if n not in after]
    resized = [
        f"{n!r} {before[n]} -> {after[n]} rows"
        for n in after
        if before.get(n, after[n]) != after[n]
    ]
    if added:
        words.append(f"added {added}")
    if removed:
        words.append(f"removed {removed}")
    if resized:
        words.append("resized " + ", ".join(resized))
    kept_saved = [n for n in before if n in after]
    kept_now = [n for n in after if n in before]
    if kept_saved != kept_now:
        words.append(f"reordered from {kept_saved} to {kept_now}")
    return "; ".join(words) or "differ"


def _past_stage_message(
    index: int, saved: list[Any], now: list[Any], names: Sequence[str], offset: int
) -> str:
    def text(stage: Any) -> str:
        if stage is None:
            return "no such stage"
        weights = dict(zip(names, stage[1], strict=True))
        return f"from offset {stage[0]} with weights {weights}"

    was = saved[index] if index < len(saved) else None
    is_ = now[index] if index < len(now) else None
    return (
        f"mixture stage {index} differs from the saved run's before the resume offset {offset}: "
        f"saved {text(was)}, now {text(is_)}; samples before {offset} were already trained on, so "
        f"keep every stage that starts before {offset} as saved, and edit or add stages from "
        f"offset {offset} on (rounded up to a multiple of block_size)"
    )


def _mix(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """A splitmix64 step of ``key ^ value``, vectorised: keys per (source, epoch) or block."""
    return splitmix64_array(key ^ np.asarray(value).astype(np.uint64))


# ------------------------------------------------------------------------------ checks
def check_sources(names: Sequence[str], lengths: Sequence[int]) -> None:
    """Raises unless there is at least one source, each with rows."""
    if not names:
        raise ValueError("a mixture needs at least one source, got none; pass {name: source}")
    for name, n in zip(names, lengths, strict=True):
        if n < 1:
            raise ValueError(
                f"source {name!r} of the mixture is empty (0 rows); a mixed source needs rows: "
                "drop it, or give it data"
            )


def check_block_size(block_size: Any) -> int:
    """``block_size`` as an int >= 1, or raises."""
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 sample, got {block_size}")
    return int(block_size)


def check_counts(
    names: Sequence[str],
    stages: Sequence[Any],
    weights: np.ndarray,
    counts: np.ndarray,
    block_size: int,
) -> None:
    """Raises where a source with weight gets no sample in its stage's blocks."""
    missed = np.argwhere((weights > 0) & (counts == 0))
    if not len(missed):
        return
    index, source = map(int, missed[0])
    weight = stages[index][1][source]
    share = weight / sum(stages[index][1])
    raise ValueError(
        f"source {names[source]!r} has weight {weight} (a share of {share:.3g}) in stage "
        f"{index} (from offset {stages[index][0]}), but a block of {block_size} samples rounds "
        "its share to 0 samples, so it would never be read; use block_size >= "
        f"{math.ceil(1 / share)} or a larger weight (or weight 0 to leave it out)"
    )


def stages_from(
    names: Sequence[str],
    weights: Mapping[str, Any] | None,
    stages: Sequence[Any] | None,
    block_size: int,
) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """The stages as ``(start, weights in names order)``, from ``weights=`` or ``stages=``,
    checked: known names, finite weights >= 0 not all 0, starts from 0, increasing, on blocks.

    Examples:
        >>> stages_from(["a", "b"], None, [(0, {"a": 1}), (8, {"a": 1, "b": 3})], 4)
        ((0, (1.0, 0.0)), (8, (1.0, 3.0)))
    """
    if (weights is None) == (stages is None):
        raise ValueError(
            "a mixture needs its weights: pass weights={name: weight} (one stage) or "
            "stages=[(start_offset, {name: weight}), ...], not both and not neither"
        )
    given = [(0, weights)] if stages is None else list(stages)
    if not given:
        raise ValueError("stages=[] has no stage; the first stage must start at offset 0")
    out, known = [], frozenset(names)
    for index, stage in enumerate(given):
        if not isinstance(stage, Sequence) or len(stage) != 2:
            raise TypeError(
                f"stage {index} must be a pair (start_offset, {{name: weight}}), got {stage!r}"
            )
        start, stage_weights = stage
        out.append(
            (_stage_start(index, start, block_size), _weights(index, stage_weights, names, known))
        )
    _check_order(out, block_size)
    return tuple(out)


def _stage_start(index: int, start: Any, block_size: int) -> int:
    if isinstance(start, bool) or not isinstance(start, int | np.integer):
        raise TypeError(f"stage {index} starts at a sample offset (an int), got {start!r}")
    start = int(start)
    if start < 0 or start % block_size:
        down, up = start // block_size * block_size, -(-start // block_size) * block_size
        raise ValueError(
            f"stage {index} starts at offset {start}, which is not a block boundary (a multiple "
            f"of block_size={block_size} that is >= 0); every block takes one stage's weights, "
            f"so start it at {max(down, 0)} or {max(up, 0)}"
        )
    if start >= MIXTURE_ROWS:  # never reached, and past what the int64 prefix sums hold
        raise ValueError(
            f"stage {index} starts at offset {start}, past every sample offset of a mixture "
            "(its rows are offsets below 2**62); start it at an offset a run reaches, or drop it"
        )
    return start


def _weights(
    index: int, weights: Any, names: Sequence[str], known: frozenset[str]
) -> tuple[float, ...]:
    where = f"stage {index}'s weights"
    if not isinstance(weights, Mapping):
        raise TypeError(f"{where} must be a dict {{name: weight}}, got {type(weights).__name__}")
    unknown = [name for name in weights if name not in known]
    if unknown:
        raise ValueError(
            f"{where} name {unknown}, which the mixture has no source for (its sources: "
            f"{list(names)}); give weights only to those sources"
        )
    values = [weights.get(name, 0.0) for name in names]
    # thousands of sources: plain floats and ints checked at once, anything else one by one
    if set(map(type, values)) <= {float, int}:
        array = np.array(values, np.float64)
        if np.isfinite(array).all() and (array >= 0).all() and array.any():
            return tuple(array.tolist())
    out = []
    for name, weight in zip(names, values, strict=True):
        if isinstance(weight, bool | np.bool_) or not isinstance(weight, numbers.Real):
            raise TypeError(f"{where}: the weight of {name!r} must be a number, got {weight!r}")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(
                f"{where}: the weight of {name!r} is {weight}; weights must be finite and >= 0 "
                "(0 leaves a source out of the stage)"
            )
        out.append(float(weight))
    if sum(out) == 0:
        raise ValueError(
            f"{where} are all 0 ({dict(weights)}); a stage needs some source with a weight > 0"
        )
    return tuple(out)


def _check_order(stages: Sequence[tuple[int, Any]], block_size: int) -> None:
    if stages[0][0] != 0:
        raise ValueError(
            f"the first stage starts at offset {stages[0][0]}, but the mixture needs weights "
            "from offset 0; start the first stage at 0"
        )
    for index in range(1, len(stages)):
        if stages[index][0] <= stages[index - 1][0]:
            raise ValueError(
                f"stage {index} starts at offset {stages[index][0]}, not after stage "
                f"{index - 1} (offset {stages[index - 1][0]}); list the stages in increasing "
                "order of their start offsets, each once"
            )
