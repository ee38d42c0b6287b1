"""Length stages: sample offset -> (stage, source, lane, tokens), pure, when ``seq_len`` changes.

A run's stages each give a ``seq_len`` and the mixture weights from a sample offset on. Each
source's token stream is read concatenate-then-split, but the rows are not fixed: a sample takes
the next ``seq_len`` tokens where its *lane* stopped. A source's epoch stream (its store stream
cut into units of ``unit_tokens``, the units in a keyed order per epoch) is cut into ``lanes``
contiguous lanes; the source's sample ``j`` reads lane ``j % lanes``, so the samples of one batch
come from far-apart places, while every lane is read front to back, whatever the lengths. A
lane's position is O(length changes) arithmetic from the mixture's sample counts, so no state
grows with the run: ``docs/concepts/length-stages.md``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from psdp._checks import check_int
from psdp._plan.index_shuffle import MASK64, shuffle_each, splitmix64_array
from psdp._plan.mixture import (
    MixturePlan,
    check_block_size,
    exact_weight,
    source_change,
    source_key,
    stages_from,
)
from psdp._plan.offsets import StepOffsets

#: The ``kind`` of a length-stage plan's record in a loader state.
LENGTH_STAGES_KIND = "psdp.length-stages/1"
_UNIT_TAG = 0x756E69742D6F7264  # "unit-ord": the unit orders' keys apart from the row orders'
_GOLDEN = 0x9E3779B97F4A7C15  # the short unit's slot key, as `BlockShuffle`'s short block


class LengthStage(NamedTuple):
    """From sample offset ``start`` on (until the next stage): rows of ``seq_len`` tokens, drawn
    from the sources by ``weights`` (one per source, in the plan's source order)."""

    start: int
    seq_len: int
    weights: tuple[float, ...]


class Samples(NamedTuple):
    """Per sample offset: its stage, source, lane, first position in the lane's endless stream,
    and its ``seq_len``."""

    stage: np.ndarray
    source: np.ndarray
    lane: np.ndarray
    position: np.ndarray
    seq_len: np.ndarray


class Pieces(NamedTuple):
    """Rows as ranges: piece ``i`` is ``size[i]`` tokens of row ``row[i]`` from its column
    ``column[i]``, of source ``source[i]``'s epoch ``epoch[i]``, from position ``start[i]``."""

    row: np.ndarray
    column: np.ndarray
    source: np.ndarray
    epoch: np.ndarray
    start: np.ndarray
    size: np.ndarray


@dataclass(frozen=True)
class LengthPlan:
    """Which tokens of which source every sample offset reads, across stages of ``seq_len``.

    Args:
        names: the sources, in tag order.
        tokens: each source's stream tokens per epoch (EOS included), 0 for a source no stage
            weights.
        stages: ``(start_offset, seq_len, {name: weight})``, the first at 0, starts increasing
            multiples of ``block_size`` (so a block, and a step starting on one, has one length).
        block_size: samples per mixture block (`MixturePlan`).
        lanes: lanes per source; a batch's samples of one source come from distinct lanes when
            it holds at most ``lanes`` of them.
        unit_tokens: the epoch order's grain: a source's epoch is its units of this many tokens
            in a keyed order (the last unit may be short).
        seed: keys the blocks and the unit orders.
        shuffle: order each epoch's units by key (``False``: the store's order).
        extra: tokens a row reads past its ``seq_len`` (1 for shifted targets): they are the
            next sample's of its lane, as `TokenSequences`' are the next row's.
        context: the context axis every ``seq_len`` must divide by (1: none).

    Examples:
        >>> plan = LengthPlan(("a",), (40,), ((0, 4, {"a": 1}), (4, 8, {"a": 1})),
        ...                   block_size=1, lanes=2, unit_tokens=8, shuffle=False)
        >>> samples = plan.locate(np.arange(6))  # 4 rows of 4 tokens, then rows of 8
        >>> samples.lane.tolist(), samples.position.tolist(), samples.seq_len.tolist()
        ([0, 1, 0, 1, 0, 1], [0, 0, 4, 4, 8, 8], [4, 4, 4, 4, 8, 8])
        >>> plan.pieces(np.array([5])).start.tolist()  # lane 1 starts at token 20
        [28]
    """

    names: tuple[str, ...]
    tokens: tuple[int, ...]
    stages: tuple[LengthStage, ...]
    block_size: int
    lanes: int
    unit_tokens: int
    seed: int = 0
    shuffle: bool = True
    extra: int = 0
    context: int = 1
    #: the mixture of the stages' weights: which source, and its how-many-th sample, an offset is
    mixture: MixturePlan = field(init=False, repr=False, compare=False)
    #: each stage's ``seq_len``, as an array
    lengths: np.ndarray = field(init=False, repr=False, compare=False)
    #: stages whose ``seq_len`` differs from the stage before (stage 0 included): a lane's
    #: position is a sum over them only
    changes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: each source's tokens, and each lane's first token in an epoch (sources x lanes + 1)
    token_array: np.ndarray = field(init=False, repr=False, compare=False)
    lane_starts: np.ndarray = field(init=False, repr=False, compare=False)
    source_keys: np.ndarray = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        names: Sequence[str],
        tokens: Sequence[int],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        *,
        block_size: int,
        lanes: int,
        unit_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        extra: int = 0,
        context: int = 1,
    ) -> None:
        names, tokens = tuple(names), tuple(operator.index(t) for t in tokens)
        if len(names) != len(tokens):
            raise ValueError(f"{len(names)} source names but {len(tokens)} token counts")
        for name, count in zip(names, tokens, strict=True):
            if count < 0:
                raise ValueError(
                    f"source {name!r} has {count} tokens an epoch; a count of tokens is >= 0 "
                    "(its stream's tokens, EOS included)"
                )
        for name, value in (("lanes", lanes), ("unit_tokens", unit_tokens), ("context", context)):
            check_int(name, value, minimum=1)
        check_int("extra", extra, minimum=0)
        checked, weights, block_size = length_stages(names, stages, block_size, context)
        lengths = [stage.seq_len for stage in checked]
        set_ = object.__setattr__
        fields: dict[str, Any] = {
            "names": names, "tokens": tokens, "block_size": block_size, "lanes": int(lanes),
            "unit_tokens": int(unit_tokens), "seed": seed, "shuffle": bool(shuffle),
            "extra": int(extra), "context": int(context),
        }  # fmt: skip
        for attribute, value in fields.items():
            set_(self, attribute, value)
        set_(self, "stages", checked)
        _check_sources(self)
        # the mixture counts samples only: its "rows" are never read
        set_(self, "mixture", MixturePlan(names, tuple(max(1, t) for t in tokens), weights,
                                          block_size, seed, shuffle))  # fmt: skip
        set_(self, "lengths", np.array(lengths, np.int64))
        changes = tuple(i for i in range(len(lengths)) if i == 0 or lengths[i] != lengths[i - 1])
        set_(self, "changes", changes)
        token_array = np.array(tokens, np.int64)
        set_(self, "token_array", token_array)
        lane_ids = np.arange(self.lanes + 1, dtype=np.int64)
        set_(self, "lane_starts", token_array[:, None] * lane_ids // self.lanes)
        keys = [source_key(self.seed, name) ^ _UNIT_TAG for name in names]
        set_(self, "source_keys", np.array(keys, np.uint64))

    def locate(self, offsets: np.ndarray) -> Samples:
        """Each offset's stage, source, lane, first position in its lane and ``seq_len``.

        Lane ``l``'s samples are the source's samples ``j = q * lanes + l``; sample ``q`` of the
        lane starts after the tokens of the ones before it: ``sum L(stage of each)``, which is
        ``L_k q - sum over length changes i <= k of (L_i - L_{i-1}) c_i`` (``c_i``: the lane's
        samples before stage ``i``), so O(length changes) whatever the step.
        """
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        if offsets.size and offsets.min() < 0:
            raise ValueError(f"a sample offset must be >= 0, got {int(offsets.min())}")
        stage, source, sample = self.mixture.slots(offsets)
        lane, quotient = sample % self.lanes, sample // self.lanes
        position = self.lengths[stage] * quotient
        for index in self.changes[1:]:
            before = self.mixture.before[index, source]  # the source's samples before stage
            lane_before = (before + self.lanes - 1 - lane) // self.lanes
            step = self.lengths[index] - self.lengths[index - 1]
            position -= np.where(stage >= index, step * lane_before, 0)
        return Samples(stage, source, lane, position, self.lengths[stage])

    def pieces(self, offsets: np.ndarray) -> Pieces:
        """The rows at ``offsets`` (``seq_len + extra`` tokens each) as ranges of each source's
        epoch streams: one range, or two where a row passes its lane's end (the lane goes on in
        the next epoch). Positions are in the epoch stream (units in their epoch's order);
        `store_pieces` maps them to the store."""
        samples = self.locate(offsets)
        rows = np.arange(len(samples.stage), dtype=np.int64)
        first = self.lane_starts[samples.source, samples.lane]
        size = self.lane_starts[samples.source, samples.lane + 1] - first
        epoch, within = np.divmod(samples.position, size)
        width = samples.seq_len + self.extra
        head = np.minimum(width, size - within)
        tail = width - head  # <= a lane (checked on creation): one more piece at most
        more = tail > 0
        return _by_row(
            Pieces(
                np.concatenate([rows, rows[more]]),
                np.concatenate([np.zeros_like(rows), head[more]]),
                np.concatenate([samples.source, samples.source[more]]),
                np.concatenate([epoch, epoch[more] + 1]),
                np.concatenate([first + within, first[more]]),
                np.concatenate([head, tail[more]]),
            )
        )

    def store_pieces(self, offsets: np.ndarray) -> Pieces:
        """`pieces` with positions in the store's stream (``start``): each piece cut where a
        unit of its epoch's order ends, so each is one range of the store."""
        pieces = self.pieces(offsets)
        if not self.shuffle:
            return pieces
        out: list[Pieces] = []
        todo = pieces
        while len(todo.row):
            stop, store = _unit_of(self, todo)
            size = np.minimum(todo.size, stop - todo.start)
            out.append(todo._replace(start=store, size=size))
            rest = size < todo.size
            todo = Pieces(todo.row[rest], (todo.column + size)[rest], todo.source[rest],
                          todo.epoch[rest], (todo.start + size)[rest],
                          (todo.size - size)[rest])  # fmt: skip
        return _by_row(Pieces(*(np.concatenate(arrays) for arrays in zip(*out, strict=True))))

    def record(self) -> dict[str, Any]:
        """What the samples depend on, as JSON values (a loader state keeps it)."""
        return {
            "kind": LENGTH_STAGES_KIND,
            "sources": [[n, t] for n, t in zip(self.names, self.tokens, strict=True)],
            "stages": [[s.start, s.seq_len, list(s.weights)] for s in self.stages],
            "block_size": self.block_size,
            "lanes": self.lanes,
            "unit_tokens": self.unit_tokens,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "extra": self.extra,
        }

    def check_past(self, saved: Mapping[str, Any], offset: int) -> None:
        """Raises unless the saved `record` gives the samples before ``offset`` this plan gives:
        the same sources and tokens, settings, and stages starting before ``offset`` (a stage
        from ``offset`` on may change or be added: the lanes go on from where they stand).

        Examples:
            >>> plan = LengthPlan(("a",), (64,), ((0, 4, {"a": 1}),), block_size=1, lanes=2,
            ...                   unit_tokens=8)
            >>> saved = plan.record() | {"lanes": 4}
            >>> plan.check_past(saved, 10)
            Traceback (most recent call last):
                ...
            ValueError: the length stages' lanes is 2, but the saved run's was 4; every sample depends on it, so resume with the saved value (only stages starting at or after the resume offset 10 may change)
        """
        check_stages_past(
            self.record(), saved, offset, self.names, self.block_size,
            ("block_size", "lanes", "unit_tokens", "seed", "shuffle", "extra"),
        )  # fmt: skip

    @classmethod
    def from_record(cls, record: Mapping[str, Any], context: int = 1) -> LengthPlan:
        """The plan a `record` describes.

        Examples:
            >>> plan = LengthPlan(("a",), (64,), ((0, 4, {"a": 1}),), block_size=1, lanes=2,
            ...                   unit_tokens=8)
            >>> LengthPlan.from_record(plan.record()) == plan
            True
        """
        if record.get("kind") != LENGTH_STAGES_KIND:
            raise ValueError(f"not a length-stage plan's record ({LENGTH_STAGES_KIND}): {record}")
        names = [name for name, _ in record["sources"]]
        stages = [(s, n, dict(zip(names, w, strict=True))) for s, n, w in record["stages"]]
        return cls(
            names, [t for _, t in record["sources"]], stages, block_size=record["block_size"],
            lanes=record["lanes"], unit_tokens=record["unit_tokens"], seed=record["seed"],
            shuffle=record["shuffle"], extra=record["extra"], context=context,
        )  # fmt: skip


def stage_offsets(
    steps: Sequence[int], batch_size: int | Sequence[tuple[int, int]], block_size: int
) -> tuple[int, ...]:
    """The sample offsets where stages declared by step start, under a batch-size schedule
    (``StepOffsets`` of an endless source), each checked to lie on a block boundary.

    Examples:
        >>> stage_offsets([0, 10, 20], [(0, 8), (10, 4)], 8)
        (0, 80, 120)
    """
    offsets = StepOffsets.create(None, batch_size)
    out = []
    for index, step in enumerate(steps):
        check_int(f"stage {index}'s start step", step, minimum=0)
        offset = offsets.info(step).offset
        if offset % block_size:
            raise ValueError(
                f"stage {index} starts at step {step}, sample offset {offset}, which is not a "
                f"multiple of block_size={block_size}; a block has one seq_len, so start the "
                "stage at a step whose offset is a multiple of block_size (batch sizes that are "
                "multiples of block_size keep every step on one)"
            )
        out.append(offset)
    return tuple(out)


def check_stages_past(
    now: Mapping[str, Any],
    saved: Mapping[str, Any],
    offset: int,
    names: Sequence[str],
    block_size: int,
    settings: Sequence[str],
) -> None:
    """Raises unless a saved length-stage record gives the samples before ``offset`` that the
    record ``now`` gives: the same ``kind``, sources, ``settings`` and stages starting before
    ``offset`` (`LengthPlan.check_past`; a packed plan's too)."""
    kind = now["kind"]
    if saved.get("kind") != kind:
        raise ValueError(
            f"the state was saved from a source of kind {saved.get('kind')!r}, not {kind!r} "
            "(this run's length stages): every sample before the resume depends on how that "
            "source ordered them, so a run cannot switch into or out of length stages, nor "
            "between packed and unpacked ones, at a resume; resume with the source the state "
            "was saved from"
        )
    if saved.get("sources") != now["sources"]:
        change = source_change(saved.get("sources"), now["sources"]).replace(" rows", " tokens")
        raise ValueError(
            f"the sources differ from the saved run's ({change}): now {now['sources']!r}, saved {saved.get('sources')!r} "
            "(name, tokens an epoch); every sample depends on them, so resume with the "
            "saved stores in the saved order"
        )
    for name in settings:
        if saved.get(name) != now[name]:
            raise ValueError(
                f"the length stages' {name} is {now[name]!r}, but the saved run's was "
                f"{saved.get(name)!r}; every sample depends on it, so resume with the saved "
                f"value (only stages starting at or after the resume offset {offset} may "
                "change)"
            )
    past = [s for s in saved["stages"] if s[0] < offset]
    mine = [s for s in now["stages"] if s[0] < offset]
    for index in range(max(len(past), len(mine))):
        was = past[index] if index < len(past) else None
        is_ = mine[index] if index < len(mine) else None
        if was is not None and is_ is not None and _same_stage(was, is_):
            continue
        raise ValueError(
            f"stage {index} differs from the saved run's before the resume offset {offset}: "
            f"saved {_stage_text(was, names)}, now {_stage_text(is_, names)}; its "
            f"samples were already trained on, so keep every stage that starts before "
            f"{offset} as saved, and edit or add stages from offset {offset} on (a multiple "
            f"of block_size={block_size})"
        )


def _same_stage(saved: Sequence[Any], now: Sequence[Any]) -> bool:
    """Two stage records ``[start, seq_len, weights]`` that read alike: one start and length,
    weights proportional as written (their block counts are then equal)."""
    if list(saved[:2]) != list(now[:2]) or len(saved[2]) != len(now[2]):
        return False
    before, after = [exact_weight(w) for w in saved[2]], [exact_weight(w) for w in now[2]]
    return [w * sum(after) for w in before] == [w * sum(before) for w in after]


def _stage_text(stage: Sequence[Any] | None, names: Sequence[str]) -> str:
    if stage is None:
        return "no such stage"
    weights = dict(zip(names, stage[2], strict=False))
    return f"from offset {stage[0]} with seq_len={stage[1]} and weights {weights}"


def length_stages(
    names: Sequence[str], stages: Sequence[Any], block_size: int, context: int
) -> tuple[tuple[LengthStage, ...], tuple[tuple[int, tuple[float, ...]], ...], int]:
    """Checked stages ``[(start_offset, seq_len, {name: weight}), ...]``: their `LengthStage`s,
    the mixture's weight stages ``(start, weights)`` and the checked ``block_size``."""
    given = list(stages)
    if not given:
        raise ValueError("stages=[] has no stage; the first stage must start at offset 0")
    seq_lens = [stage_seq_len(index, stage, context) for index, stage in enumerate(given)]
    block_size = check_block_size(block_size)
    weights = stages_from(names, None, [(s[0], s[2]) for s in given], block_size)
    pairs = zip(weights, seq_lens, strict=True)
    return tuple(LengthStage(s, n, w) for (s, w), n in pairs), weights, block_size


def stage_seq_len(index: int, stage: Any, context: int) -> int:
    """Stage ``index``'s ``seq_len``, checked: an int >= 1 dividing by ``context``."""
    if not isinstance(stage, Sequence) or len(stage) != 3:
        raise TypeError(
            f"stage {index} must be (start_offset, seq_len, {{name: weight}}), got {stage!r}"
        )
    seq_len = stage[1]
    check_int(f"stage {index}'s seq_len", seq_len, minimum=1)
    if seq_len % context:
        raise ValueError(
            f"stage {index}'s seq_len={seq_len} does not divide by the context axis of "
            f"{context} devices, so its rows cannot be split evenly along it; use a multiple of "
            f"{context}, e.g. {seq_len - seq_len % context or context}"
        )
    return int(seq_len)


def _check_sources(plan: LengthPlan) -> None:
    """Raises where a stage weights a source with no tokens, or a lane is shorter than a row."""
    for s, (name, tokens) in enumerate(zip(plan.names, plan.tokens, strict=True)):
        weighted = [i for i, stage in enumerate(plan.stages) if stage.weights[s] > 0]
        if not weighted:
            continue
        if tokens < 1:
            raise ValueError(
                f"stage {weighted[0]}'s weights give source {name!r} weight "
                f"{plan.stages[weighted[0]].weights[s]}, but it has no tokens; give it weight 0 "
                "in every stage, or data"
            )
        longest = max(plan.stages[i].seq_len for i in weighted) + plan.extra
        lane = tokens // plan.lanes
        if lane < longest:
            raise ValueError(
                f"source {name!r} has {tokens} tokens an epoch, so lanes={plan.lanes} gives "
                f"lanes of {lane} tokens, shorter than a row of {longest} tokens (its longest "
                f"seq_len{' + extra' if plan.extra else ''}); use lanes <= "
                f"{max(1, tokens // longest)} or more data"
            )


def _unit_of(plan: LengthPlan, pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
    """For each piece's first position: where its unit ends in the epoch stream, and the
    position in the store. The epoch's full units are in `shuffle_each` order, the short last
    one (if any) at a keyed slot, as `BlockShuffle`'s short block."""
    unit = plan.unit_tokens
    tokens = plan.token_array[pieces.source]
    full, short = tokens // unit, tokens % unit
    key = splitmix64_array(plan.source_keys[pieces.source] ^ pieces.epoch.astype(np.uint64))
    slots = full + (short > 0)
    hashed = splitmix64_array(key ^ np.uint64(_GOLDEN & MASK64))
    z = (hashed % np.maximum(slots, 1).astype(np.uint64)).astype(np.int64)
    z = np.where(short > 0, z, full)  # no short unit: every slot is a full unit's
    x = pieces.start
    short_first = z * unit
    in_short = (x >= short_first) & (x < short_first + short)
    after = x >= short_first + short
    shifted = np.where(after, x - short, x)
    slot = shifted // unit
    placed = shuffle_each(np.minimum(slot, np.maximum(full - 1, 0)), np.maximum(full, 1), key)
    store = np.where(in_short, full * unit + x - short_first, placed * unit + shifted % unit)
    stop = np.where(in_short, short_first + short, (slot + 1) * unit + np.where(after, short, 0))
    return stop, store


def _by_row(pieces: Pieces) -> Pieces:
    """The pieces by row, each row's in column order."""
    order = np.lexsort((pieces.column, pieces.row))
    return Pieces(*(a[order] for a in pieces))
