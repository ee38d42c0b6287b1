"""Packed length stages: sample offset -> the documents its packed row holds, when ``seq_len``
changes (``docs/concepts/length-stages.md``, "Packed sources").

The packed counterpart of `psdp._plan.length_stages`: a source's lanes are lanes of *documents*
(its non-empty documents in a keyed order per epoch, cut into ``lanes`` contiguous runs), and a
lane's row takes the next documents that fit its stage's ``seq_len``, by greedy packing
(`plan_window` with ``strategy="greedy"``, so ``long_documents`` and ``max_segments`` mean what
they mean for `PackedSequences`). A lane's row never crosses the end of its part of an epoch.

Where a row starts depends on the lengths of the documents before it, so it is not arithmetic:
a lane keeps a *cursor* (epoch, document position, token) at each stage's start, and each
stage's rows are the greedy plan of the lane's documents from that cursor, then of the lane's
whole part of each later epoch. The cursors and plans are computed from document lengths on
first use and cached: no state grows with the run, but finding a row costs the packing of the
lane's documents from the run's start to it (once; later rows reuse the plans).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from psdp._checks import check_int
from psdp._plan.index_shuffle import shuffle_each, splitmix64
from psdp._plan.length_stages import LengthStage, check_stages_past, length_stages
from psdp._plan.mixture import MixturePlan, source_key
from psdp._plan.packing import LONG_DOCUMENTS, PackPlan, check_max_segments, plan_window

#: The ``kind`` of a packed length-stage plan's record in a loader state.
PACKED_STAGES_KIND = "psdp.packed-length-stages/1"
_DOCS_TAG = 0x646F632D6F726465  # "doc-orde": the document orders' keys apart from the others'


class PackedPieces(NamedTuple):
    """Rows as pieces of documents: piece ``i`` is ``size[i]`` tokens of document
    ``document[i]`` of source ``source[i]`` from its token ``start[i]``, at column
    ``column[i]`` of row ``row[i]`` (read in epoch ``epoch[i]`` of the source)."""

    row: np.ndarray
    column: np.ndarray
    source: np.ndarray
    epoch: np.ndarray
    document: np.ndarray
    start: np.ndarray
    size: np.ndarray


class Cursor(NamedTuple):
    """Where a lane's next row starts: its epoch, the position in the lane's part of that
    epoch's document order, and the token within that document (> 0 only in a split one)."""

    epoch: int
    position: int
    token: int


@dataclass(frozen=True)
class PackedLengthPlan:
    """Which documents every sample offset's packed row holds, across stages of ``seq_len``.

    Args:
        names: the sources, in tag order.
        lengths: each source's document lengths in slots (tokens, plus one for an EOS:
            `segment_lengths`), in store order.
        stages: ``(start_offset, seq_len, {name: weight})``, as `LengthPlan`'s.
        block_size: samples per mixture block.
        lanes: lanes per source; each needs at least one non-empty document.
        seed: keys the blocks and the document orders.
        shuffle: order each epoch's documents by key (``False``: the store's order).
        long_documents: ``None`` (no document is ever cut: a stage whose ``seq_len`` is shorter
            than a document of a source it weights is refused), or a `LONG_DOCUMENTS` entry.
        max_segments: the most documents (or pieces) a row holds; ``None``: as many as fit.
        context: the context axis every ``seq_len`` must divide by.

    Examples:
        >>> plan = PackedLengthPlan(("a",), ([3, 2, 4, 1, 5, 3],),
        ...     ((0, 6, {"a": 1}), (2, 8, {"a": 1})), block_size=1, lanes=1, shuffle=False)
        >>> [plan.pieces(np.array([g])).document.tolist() for g in range(4)]
        [[0, 1], [2, 3], [4, 5], [0, 1]]
    """

    names: tuple[str, ...]
    lengths: tuple[np.ndarray, ...] = field(compare=False, repr=False)
    stages: tuple[LengthStage, ...]
    block_size: int
    lanes: int
    seed: int = 0
    shuffle: bool = True
    long_documents: str | None = None
    max_segments: int | None = None
    context: int = 1
    documents: tuple[int, ...] = field(init=False)
    tokens: tuple[int, ...] = field(init=False)
    #: per source, its non-empty documents (an epoch orders these)
    kept: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    mixture: MixturePlan = field(init=False, repr=False, compare=False)
    #: cursors at stage starts, keyed (source, lane, stage); plans keyed by a segment's start
    _cursors: dict = field(init=False, repr=False, compare=False)
    _plans: dict = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        names: Sequence[str],
        lengths: Sequence[Any],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        *,
        block_size: int,
        lanes: int,
        seed: int = 0,
        shuffle: bool = True,
        long_documents: str | None = None,
        max_segments: int | None = None,
        context: int = 1,
    ) -> None:
        names = tuple(names)
        arrays = tuple(np.asarray(a, np.int64).reshape(-1) for a in lengths)
        if len(names) != len(arrays):
            raise ValueError(f"{len(names)} source names but {len(arrays)} length arrays")
        for name, array in zip(names, arrays, strict=True):
            if array.size and array.min() < 0:
                raise ValueError(f"source {name!r} has a document of {array.min()} tokens; >= 0")
        check_int("lanes", lanes, minimum=1)
        check_int("context", context, minimum=1)
        if long_documents is not None and long_documents not in LONG_DOCUMENTS:
            raise ValueError(
                f"long_documents must be None (never cut a document) or one of "
                f"{list(LONG_DOCUMENTS)}, got {long_documents!r}"
            )
        check_max_segments(max_segments)
        checked, weights, block_size = length_stages(names, stages, block_size, context)
        kept = tuple(np.flatnonzero(a > 0) for a in arrays)
        set_ = object.__setattr__
        fields: dict[str, Any] = {
            "names": names, "lengths": arrays, "block_size": block_size, "lanes": int(lanes),
            "seed": operator.index(seed), "shuffle": bool(shuffle),
            "long_documents": long_documents, "max_segments": max_segments,
            "context": int(context), "documents": tuple(len(k) for k in kept),
            "tokens": tuple(int(a.sum()) for a in arrays), "kept": kept,
            "_cursors": {}, "_plans": {},
        }  # fmt: skip
        for attribute, value in fields.items():
            set_(self, attribute, value)
        set_(self, "stages", checked)
        self._check_sources()
        set_(self, "mixture", MixturePlan(names, tuple(max(1, d) for d in self.documents),
                                          weights, block_size, self.seed, self.shuffle))  # fmt: skip

    def pieces(self, offsets: np.ndarray) -> PackedPieces:
        """The packed rows at ``offsets`` as pieces of documents, by row and column."""
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        if offsets.size and offsets.min() < 0:
            raise ValueError(f"a sample offset must be >= 0, got {int(offsets.min())}")
        stage, source, sample = self.mixture.slots(offsets)
        lane, quotient = sample % self.lanes, sample // self.lanes
        before = self.mixture.before[stage, source]
        row = quotient - (before + self.lanes - 1 - lane) // self.lanes  # the stage's row
        out: list[PackedPieces] = []
        groups = np.stack([source, lane, stage])
        for s, n, k in np.unique(groups, axis=1).T.tolist():
            at = np.flatnonzero((source == s) & (lane == n) & (stage == k))
            out.extend(self._rows(s, n, k, at, row[at]))
        if not out:
            empty = np.zeros(0, np.int64)
            return PackedPieces(*([empty] * 7))
        joined = PackedPieces(*(np.concatenate(a) for a in zip(*out, strict=True)))
        order = np.lexsort((joined.column, joined.row))
        return PackedPieces(*(a[order] for a in joined))

    def cursor(self, source: int, lane: int, stage: int) -> Cursor:
        """Where lane ``lane`` of source ``source`` stands when stage ``stage`` starts: the
        stage before's cursor, advanced by the lane's rows in that stage."""
        known = [k for k in range(stage + 1) if (source, lane, k) in self._cursors]
        k = known[-1] if known else 0
        at = self._cursors.get((source, lane, k), Cursor(0, 0, 0))
        while k < stage:
            counts = self.mixture.before[[k, k + 1], source]
            rows = np.diff((counts + self.lanes - 1 - lane) // self.lanes)[0]
            at = self._advance(source, lane, at, self.stages[k].seq_len, int(rows))
            k += 1
            self._cursors[(source, lane, k)] = at
        return at

    def lowered_cut(self) -> tuple[int, int, int, int, int] | None:
        """The first stage that lowers ``seq_len`` below a document of a source it weights:
        ``(stage, source, document, its slots, the longer seq_len)``, or ``None``. Lowered: shorter
        than the stage before, or than an earlier stage that weights the source (a stage
        between that reads other sources changes nothing for its lanes). Such a stage cuts
        (splits, truncates or drops) documents an earlier stage held whole; `DataConfig`
        refuses it.

        Examples:
            >>> PackedLengthPlan(("a",), ([3, 9],), ((0, 16, {"a": 1}), (1, 8, {"a": 1})),
            ...                  block_size=1, lanes=1, long_documents="split").lowered_cut()
            (1, 0, 1, 9, 16)
        """
        longest = [0] * len(self.names)  # each source's longest seq_len in a stage weighting it
        for index, stage in enumerate(self.stages):
            before = self.stages[index - 1].seq_len if index else 0
            for s, weight in enumerate(stage.weights):
                if weight <= 0:
                    continue
                longer = max(before, longest[s])
                lengths = self.lengths[s]
                if stage.seq_len < longer and len(lengths) and lengths.max() > stage.seq_len:
                    document = int(np.argmax(lengths))
                    return index, s, document, int(lengths[document]), longer
                longest[s] = max(longest[s], stage.seq_len)
        return None

    def record(self) -> dict[str, Any]:
        """What the samples depend on, as JSON values (a loader state keeps it)."""
        return {
            "kind": PACKED_STAGES_KIND,
            "sources": [[n, t] for n, t in zip(self.names, self.tokens, strict=True)],
            "documents": list(self.documents),
            "stages": [[s.start, s.seq_len, list(s.weights)] for s in self.stages],
            "block_size": self.block_size,
            "lanes": self.lanes,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "long_documents": self.long_documents,
            "max_segments": self.max_segments,
        }

    def check_past(self, saved: Mapping[str, Any], offset: int) -> None:
        """Raises unless the saved `record` gives the samples before ``offset`` this plan gives
        (`LengthPlan.check_past`'s rule: only stages from ``offset`` on may change)."""
        settings = ("documents", "block_size", "lanes", "seed", "shuffle", "long_documents",
                    "max_segments")  # fmt: skip
        check_stages_past(self.record(), saved, offset, self.names, self.block_size, settings)

    def _rows(self, source: int, lane: int, stage: int, at: np.ndarray, rows: np.ndarray):
        """The pieces of stage ``stage``'s rows ``rows`` of a lane (row ``at[i]`` of the
        output), walking the lane's segments from the stage's cursor."""
        seq_len = self.stages[stage].seq_len
        cursor, first = self.cursor(source, lane, stage), 0
        todo = np.argsort(rows, kind="stable")
        done = 0
        while done < len(todo):
            plan, order = self._segment(source, lane, cursor, seq_len)
            stop = first + len(plan)
            mine = todo[done:][rows[todo[done:]] < stop]
            if mine.size:
                out_rows, piece = plan.pieces_of(rows[mine] - first)
                doc = plan.piece_doc[piece]
                start = plan.piece_start[piece] + np.where(doc == 0, cursor.token, 0)
                yield PackedPieces(
                    at[mine][out_rows], plan.piece_column[piece],
                    np.full(len(piece), source), np.full(len(piece), cursor.epoch),
                    order[doc], start, plan.piece_len[piece],
                )  # fmt: skip
                done += mine.size
            first, cursor = stop, Cursor(cursor.epoch + 1, 0, 0)

    def _advance(self, source: int, lane: int, at: Cursor, seq_len: int, rows: int) -> Cursor:
        """The cursor after ``rows`` rows of ``seq_len`` from ``at``: the next row's first
        piece (documents the rows' packing dropped before it stay dropped)."""
        while rows:
            plan, _ = self._segment(source, lane, at, seq_len)
            if rows < len(plan):
                piece = plan.seq_starts[rows]
                doc = int(plan.piece_doc[piece])
                token = int(plan.piece_start[piece]) + (at.token if doc == 0 else 0)
                return Cursor(at.epoch, at.position + doc, token)
            rows -= len(plan)
            at = Cursor(at.epoch + 1, 0, 0)
        return at

    def _segment(
        self, source: int, lane: int, at: Cursor, seq_len: int
    ) -> tuple[PackPlan, np.ndarray]:
        """The greedy plan of a lane's documents from ``at`` to its part's end in ``at``'s
        epoch (document 0 of the plan is the one at ``at``, from its token ``at.token``), and
        the plan's documents' numbers in the store."""
        key = (source, lane, at, seq_len)
        if key in self._plans:
            return self._plans[key]
        count = self.documents[source]
        first, stop = lane * count // self.lanes, (lane + 1) * count // self.lanes
        order = self.kept[source][self._epoch_order(source, at.epoch, first + at.position, stop)]
        lengths = self.lengths[source][order].copy()
        lengths[0] -= at.token
        plan = plan_window(
            lengths, seq_len, "greedy", self.long_documents or "split", None,
            window=len(lengths), index=0, max_segments=self.max_segments,
        )  # fmt: skip
        if not len(plan) and at.position == 0:
            raise ValueError(
                f"lane {lane} of source {self.names[source]!r} packs no row of seq_len={seq_len} "
                f"in epoch {at.epoch}: each of its {len(lengths)} documents is longer, and "
                f"long_documents={self.long_documents!r} drops them; use fewer lanes, a longer "
                "seq_len or long_documents='split'"
            )
        if len(self._plans) > 4 * self.lanes * len(self.names) * len(self.stages) + 64:
            self._plans.clear()  # bounded: the plans in use are a few per lane and stage
        self._plans[key] = (plan, order)
        return plan, order

    def _epoch_order(self, source: int, epoch: int, first: int, stop: int) -> np.ndarray:
        """Epoch positions ``[first, stop)`` of the source's document order (indices into its
        non-empty documents)."""
        positions = np.arange(first, stop, dtype=np.int64)
        if not self.shuffle:
            return positions
        key = splitmix64(source_key(self.seed, self.names[source]) ^ _DOCS_TAG ^ epoch)
        return shuffle_each(positions, self.documents[source], key)

    def _check_sources(self) -> None:
        """Raises where a stage weights a source with fewer documents than lanes, or (with
        ``long_documents=None``) a stage's ``seq_len`` would cut one of its documents."""
        for s, name in enumerate(self.names):
            weighted = [i for i, stage in enumerate(self.stages) if stage.weights[s] > 0]
            if not weighted:
                continue
            if self.documents[s] < self.lanes:
                raise ValueError(
                    f"stage {weighted[0]}'s weights give source {name!r} weight "
                    f"{self.stages[weighted[0]].weights[s]}, but it has {self.documents[s]} "
                    f"non-empty documents for lanes={self.lanes} lanes of documents; use lanes <= "
                    f"{max(1, self.documents[s])}, or more data"
                )
            if self.long_documents is not None:
                continue
            longest = int(np.argmax(self.lengths[s]))
            size = int(self.lengths[s][longest])
            for index in weighted:
                seq_len = self.stages[index].seq_len
                if seq_len < size:
                    raise ValueError(
                        f"stage {index}'s seq_len={seq_len} is shorter than document {longest} "
                        f"of source {name!r} ({size} tokens, with its EOS if one is set), so "
                        f"packing would split it at stage {index}, while long_documents=None "
                        f"keeps every document whole; raise stage {index}'s seq_len to >= {size}, "
                        "or set long_documents='split' (or 'truncate', 'drop') to say what "
                        "becomes of a document longer than a stage's seq_len"
                    )
