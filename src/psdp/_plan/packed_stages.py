"""Packed length stages: sample offset -> the documents its packed row holds, when ``seq_len``
changes (``docs/concepts/length-stages.md``, "Packed sources").

The packed counterpart of `psdp._plan.length_stages`: a source's lanes are lanes of *documents*
(its non-empty documents in a keyed order per epoch, cut into ``lanes`` contiguous runs), and a
lane's row takes the next documents that fit its stage's ``seq_len``, by greedy packing
(`plan_window` with ``strategy="greedy"``, so ``long_documents`` and ``max_segments`` mean what
they mean for `PackedSequences`). A lane's row never crosses the end of its part of an epoch.

Where a row starts depends on the lengths of the documents before it, so it is not arithmetic:
a lane keeps a *cursor* (epoch, document position, token) at each stage's start, and each
stage's rows are the greedy plan of the lane's documents from that cursor. Greedy packing
(next-fit) decides a row from the documents before it alone, and packing from any row's first
piece gives the rows after it, so the plan packs a lane in *chunks* of about
``chunk_documents`` documents: a chunk's rows but its last (still open) are final, and the next
chunk starts at that last row's first piece. The plan keeps each chunk's first row and cursor
(a few ints a chunk) and caches the chunks in use, so a row costs the chunks from the nearest
known cursor before it: the first batch O(lanes x chunk), not O(documents). A loader state
carries each lane's cursor at its offset (`resume_cursors`), which a restore validates and seeds
the walks with (`seed_cursors`); without them a restore packs from the run's start.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import operator
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from psdp._checks import check_int, is_int
from psdp._plan.index_shuffle import IndexShuffle, shuffle_each, splitmix64, splitmix64_array
from psdp._plan.length_stages import LengthStage, check_stages_past, length_stages
from psdp._plan.mixture import MixturePlan, source_key
from psdp._plan.packing import LONG_DOCUMENTS, PackPlan, check_max_segments, plan_window

#: The ``kind`` of a packed length-stage plan's record in a loader state.
PACKED_STAGES_KIND = "psdp.packed-length-stages/1"
_DOCS_TAG = 0x646F632D6F726465  # "doc-orde": the document orders' keys apart from the others'
#: Documents a lane's packing plans at once (`PackedLengthPlan`'s ``chunk_documents``): a chunk
#: is about a ms of greedy packing, and at seq_len 4,096 over a hundred rows.
CHUNK_DOCUMENTS = 512
#: Known cursors kept per lane and stage: the stage's start and the latest ones walked (a row
#: before them is found from the stage's start again), so memory does not grow with the run.
KEPT_CURSORS = 64
#: A walk past several chunks doubles each next one, up to this many times ``chunk_documents``
#: (a far row, such as a restore's without cursors, costs what packing the documents does, not
#: a chunk's overhead per ``chunk_documents``).
CHUNK_GROWTH = 64


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


class _Chunk(NamedTuple):
    """A greedy plan of a lane's documents from a cursor: its first ``rows`` rows are final,
    ``after`` is where the row after them starts, ``order`` the plan's documents' store numbers."""

    plan: PackPlan
    order: np.ndarray
    rows: int
    after: Cursor


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
        chunk_documents: documents a lane's packing plans at once (more when a chunk would
            close no row); any value gives the same rows.

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
    chunk_documents: int = field(default=CHUNK_DOCUMENTS, compare=False)
    documents: tuple[int, ...] = field(init=False)
    tokens: tuple[int, ...] = field(init=False)
    #: per source, its non-empty documents (an epoch orders these)
    kept: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    mixture: MixturePlan = field(init=False, repr=False, compare=False)
    #: per (source, lane, stage), the known cursors: sorted stage rows, and the cursor each
    #: row starts at (each chunk's first row, the stage's start, seeded ones)
    _walks: dict = field(init=False, repr=False, compare=False)
    #: chunks keyed (source, lane, cursor, seq_len), least recently used first
    _chunks: OrderedDict = field(init=False, repr=False, compare=False)
    _lock: Any = field(init=False, repr=False, compare=False)
    #: the documents the cached chunks hold (the cache is bounded by it)
    _held: list = field(init=False, repr=False, compare=False)
    #: per source, the key its epochs' document orders derive from
    _keys: tuple[int, ...] = field(init=False, repr=False, compare=False)

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
        chunk_documents: int = CHUNK_DOCUMENTS,
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
        check_int("chunk_documents", chunk_documents, minimum=1)
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
            "context": int(context), "chunk_documents": int(chunk_documents),
            "documents": tuple(len(k) for k in kept),
            "tokens": tuple(int(a.sum()) for a in arrays), "kept": kept,
            "_walks": {}, "_chunks": OrderedDict(), "_lock": threading.RLock(), "_held": [0],
            "_keys": tuple(source_key(operator.index(seed), n) ^ _DOCS_TAG for n in names),
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
        with self._lock:  # loader threads share the walks and the chunk cache
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
        with self._lock:
            return self._cursor_at(source, lane, stage, 0)

    def resume_cursors(self, offset: int) -> dict[str, Any]:
        """Each (source, lane)'s cursor at sample ``offset``: where its first row of
        ``offset``'s block starts (the rows a restore at ``offset`` reads start there; a block
        orders its samples by key), as JSON values for a loader state: O(sources x lanes) ints
        and a digest, which `seed_cursors` checks. Costs the chunks holding those rows (cached
        where the loader read them).

        Examples:
            >>> plan = PackedLengthPlan(("a",), ([3, 30, 2],), ((0, 8, {"a": 1}),),
            ...     block_size=1, lanes=1, shuffle=False, long_documents="split")
            >>> plan.resume_cursors(2)["at"]  # epoch, position, token, document, its slots
            [[0, 1, 8, 1, 30]]
        """
        offset = operator.index(offset)
        with self._lock:
            stage, rows = self._rows_before(offset)
            at: list[list[int]] = []
            for s in range(len(self.names)):
                cursors = [self._cursor_at(s, n, stage, int(rows[s, n])) for n in range(self.lanes)]
                found = self._documents_at(s, cursors)
                at.extend([*c, *d] for c, d in zip(cursors, found, strict=True))
        body = {"offset": offset, "at": at}
        return {**body, "digest": self._digest(body)}

    def seed_cursors(self, saved: Any, offset: int) -> bool:
        """Starts each lane's walk at its cursor in ``saved`` (a `resume_cursors` of a plan
        whose rows before ``offset`` are this plan's), so rows from ``offset`` on cost no
        packing of the documents before them. Cursors saved at another offset are not used
        (``False``: the rows are packed from the run's start); cursors of another plan, or
        edited, are refused.

        Examples:
            >>> kwargs = dict(block_size=1, lanes=1, shuffle=False, long_documents="split")
            >>> plan = PackedLengthPlan(("a",), ([3, 30, 2],), ((0, 8, {"a": 1}),), **kwargs)
            >>> fresh = PackedLengthPlan(("a",), ([3, 30, 2],), ((0, 8, {"a": 1}),), **kwargs)
            >>> fresh.seed_cursors(plan.resume_cursors(2), 2)
            True
            >>> fresh.pieces(np.array([2])).start.tolist()  # document 1 from its token 8
            [8]
        """
        offset = operator.index(offset)
        count = len(self.names) * self.lanes
        fix = ("restore the whole state DataLoader.state() saved, with the source and plan it "
               "was saved from (or drop its 'cursors' to pack each lane from the run's start)")  # fmt: skip
        if (
            not isinstance(saved, Mapping)
            or not isinstance(saved.get("at"), list)
            or len(saved["at"]) != count
            or not all(
                isinstance(c, list) and len(c) == 5 and all(map(is_int, c)) for c in saved["at"]
            )  # fmt: skip
            or not is_int(saved.get("offset"))
        ):
            raise ValueError(
                f"the state's packing cursors are not {count} cursors (sources x lanes) of 5 "
                f"ints with their offset and digest: got {str(saved)[:200]!r}; {fix}"
            )
        if saved["offset"] != offset:
            return False
        if saved.get("digest") != self._digest({"offset": offset, "at": saved["at"]}):
            raise ValueError(
                f"the state's packing cursors at offset {offset} do not match this plan (their "
                "digest differs: they were saved by a plan of other documents, lanes, seed, "
                f"stages or packing before offset {offset}, or edited); {fix}"
            )
        checked = []
        for s in range(len(self.names)):  # every cursor checked before any is used
            mine = saved["at"][s * self.lanes : (s + 1) * self.lanes]
            cursors = [Cursor(*map(int, c[:3])) for c in mine]
            found = self._documents_at(s, cursors)
            for lane, (cursor, c, there) in enumerate(zip(cursors, mine, found, strict=True)):
                self._check_cursor(s, lane, cursor, (int(c[3]), int(c[4])), there, fix)
                checked.append((s, lane, cursor))
        with self._lock:
            stage, rows = self._rows_before(offset)
            for s, lane, cursor in checked:
                self._remember(s, lane, stage, int(rows[s, lane]), cursor, fix)
        return True

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
        output), from the chunks that hold them."""
        todo = np.argsort(rows, kind="stable")
        done = 0
        while done < len(todo):
            first, cursor, chunk = self._walk(source, lane, stage, int(rows[todo[done]]))
            assert chunk is not None
            plan, stop = chunk.plan, first + chunk.rows
            mine = todo[done:][rows[todo[done:]] < stop]
            out_rows, piece = plan.pieces_of(rows[mine] - first)
            doc = plan.piece_doc[piece]
            start = plan.piece_start[piece] + np.where(doc == 0, cursor.token, 0)
            yield PackedPieces(
                at[mine][out_rows], plan.piece_column[piece],
                np.full(len(piece), source), np.full(len(piece), cursor.epoch),
                chunk.order[doc], start, plan.piece_len[piece],
            )  # fmt: skip
            done += mine.size

    def _cursor_at(self, source: int, lane: int, stage: int, row: int) -> Cursor:
        """Where row ``row`` of stage ``stage`` on a lane starts (its first piece; past the
        stage's rows, where its next row would start)."""
        first, cursor, chunk = self._walk(source, lane, stage, row, exact=True)
        if chunk is None:
            return cursor
        piece = chunk.plan.seq_starts[row - first]
        doc = int(chunk.plan.piece_doc[piece])
        token = int(chunk.plan.piece_start[piece]) + (cursor.token if doc == 0 else 0)
        return Cursor(cursor.epoch, cursor.position + doc, token)

    def _walk(
        self, source: int, lane: int, stage: int, row: int, exact: bool = False
    ) -> tuple[int, Cursor, _Chunk | None]:
        """The chunk holding row ``row`` of a lane's stage ``stage``: ``(its first row, its
        cursor, it)``, packed from the nearest known cursor before it (each chunk's start
        kept). ``exact``: ``(row, its cursor, None)`` where a known cursor starts ``row``."""
        rows, cursors = self._walks.setdefault((source, lane, stage), ([], []))
        i = bisect.bisect_right(rows, row) - 1
        if i < 0:  # the stage's start: the stage before's cursor after the lane's rows in it
            if stage == 0:
                start = Cursor(0, 0, 0)
            else:
                counts = self.mixture.before[[stage - 1, stage], source]
                before = np.diff((counts + self.lanes - 1 - lane) // self.lanes)[0]
                start = self._cursor_at(source, lane, stage - 1, int(before))
            rows.insert(0, 0)
            cursors.insert(0, start)
            i = 0
        first, cursor = rows[i], cursors[i]
        seq_len, documents = self.stages[stage].seq_len, self.chunk_documents
        while True:
            if exact and first == row:
                return first, cursor, None
            chunk = self._chunk(source, lane, cursor, seq_len, documents)
            if row < first + chunk.rows:
                return first, cursor, chunk
            first, cursor = first + chunk.rows, chunk.after
            documents = min(2 * documents, CHUNK_GROWTH * self.chunk_documents)
            j = bisect.bisect_left(rows, first)
            if j == len(rows) or rows[j] != first:
                rows.insert(j, first)
                cursors.insert(j, cursor)
                if len(rows) > 2 * KEPT_CURSORS:
                    keep = 1 if rows[0] == 0 else 0
                    del rows[keep:-KEPT_CURSORS], cursors[keep:-KEPT_CURSORS]

    def _chunk(self, source: int, lane: int, at: Cursor, seq_len: int, documents: int) -> _Chunk:
        """The greedy plan of a lane's documents from ``at`` (document 0 of the plan is the one
        at ``at``, from its token ``at.token``): ``documents`` of them, doubled until a row is
        final (a row before the chunk's last, or any at the end of the lane's part of the
        epoch). A cached chunk from ``at`` serves, whatever its size."""
        key = (source, lane, at, seq_len)
        if key in self._chunks:
            self._chunks.move_to_end(key)
            return self._chunks[key]
        count = self.documents[source]
        first, size = lane * count // self.lanes, (lane + 1) * count // self.lanes
        size -= first
        wanted = documents
        while True:
            stop = min(at.position + wanted, size)
            order = self.kept[source][
                self._epoch_order(source, at.epoch, first + at.position, first + stop)
            ]
            lengths = self.lengths[source][order]
            lengths[0] -= at.token
            plan = plan_window(
                lengths, seq_len, "greedy", self.long_documents or "split", None,
                window=len(lengths), index=0, max_segments=self.max_segments,
            )  # fmt: skip
            if stop == size:
                chunk = _Chunk(plan, order, len(plan), Cursor(at.epoch + 1, 0, 0))
                break
            if len(plan) >= 2:  # the last row may take the next chunk's documents: not final
                piece = plan.seq_starts[len(plan) - 1]
                doc = int(plan.piece_doc[piece])
                token = int(plan.piece_start[piece]) + (at.token if doc == 0 else 0)
                chunk = _Chunk(
                    plan, order, len(plan) - 1, Cursor(at.epoch, at.position + doc, token)
                )
                break
            wanted *= 2
        if not chunk.rows and at.position == 0:
            raise ValueError(
                f"lane {lane} of source {self.names[source]!r} packs no row of seq_len={seq_len} "
                f"in epoch {at.epoch}: each of its {size} documents is longer, and "
                f"long_documents={self.long_documents!r} drops them; use fewer lanes, a longer "
                "seq_len or long_documents='split'"
            )
        # bounded by documents: the chunks in use are about one a lane (two across a stage's
        # start) of chunk_documents; a long walk's larger ones leave soon
        limit = max(4 * self.lanes * len(self.names), 2 * CHUNK_GROWTH) * self.chunk_documents
        while self._chunks and self._held[0] + len(order) > limit:
            self._held[0] -= len(self._chunks.popitem(last=False)[1].order)
        self._chunks[key] = chunk
        self._held[0] += len(order)
        return chunk

    def _rows_before(self, offset: int) -> tuple[int, np.ndarray]:
        """The stage holding ``offset``, and each (source, lane)'s rows in it before the start
        of ``offset``'s block (a block's samples of a source come in a keyed order, so the rows
        after ``offset`` may start before its own count)."""
        if offset < 0:
            raise ValueError(f"a sample offset must be >= 0, got {offset}")
        offset -= offset % self.block_size
        stage = max(k for k, s in enumerate(self.stages) if s.start <= offset)
        lanes = np.arange(self.lanes)[None, :]
        given = self.mixture.given_before(offset)[:, None]
        before = self.mixture.before[stage][:, None]
        return stage, (given + self.lanes - 1 - lanes) // self.lanes - (
            before + self.lanes - 1 - lanes
        ) // self.lanes

    def _documents_at(self, source: int, cursors: Sequence[Cursor]) -> list[tuple[int, int]]:
        """The store number and slots of the document at each lane's cursor (lane ``i``'s at
        ``cursors[i]``; ``(-1, 0)`` off the lane's documents), the epoch orders evaluated at
        once."""
        count, lanes = self.documents[source], np.arange(len(cursors))
        first = lanes * count // self.lanes
        size = (lanes + 1) * count // self.lanes - first
        epoch = np.array([c.epoch for c in cursors], np.int64)
        position = np.array([c.position for c in cursors], np.int64)
        valid = (epoch >= 0) & (position >= 0) & (position < size)
        where = first + np.where(valid, position, 0)
        if self.shuffle and valid.any():
            keys = splitmix64_array(
                np.uint64(self._keys[source]) ^ np.maximum(epoch, 0).astype(np.uint64)
            )
            where = shuffle_each(where, max(count, 1), keys)
        document = self.kept[source][np.where(valid, where, 0)] if count else where
        sizes = self.lengths[source][document] if count else where
        return [(int(d), int(n)) if ok else (-1, 0)
                for d, n, ok in zip(document, sizes, valid, strict=True)]  # fmt: skip

    def _digest(self, body: Mapping[str, Any]) -> str:
        """A digest of cursors and what they depend on: this plan's record but its stages,
        and of the stages before their offset each start, ``seq_len`` and samples of each
        source before it (a restore may change later stages, and spell weights otherwise)."""
        offset = body["offset"]
        record = self.record()
        record["stages"] = [[s.start, s.seq_len, self.mixture.before[k].tolist()]
                            for k, s in enumerate(self.stages) if s.start < offset]  # fmt: skip
        record["given"] = self.mixture.given_before(offset - offset % self.block_size).tolist()
        text = json.dumps([record, offset, body["at"]], sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def _check_cursor(self, source: int, lane: int, at: Cursor, saved: tuple[int, int],
                      there: tuple[int, int], fix: str) -> None:  # fmt: skip
        """Raises unless a saved cursor lies on one of the lane's documents (``there``: the
        plan's document at it, and its slots), the one saved."""
        document, size = there
        ok = (
            (document, size) == tuple(saved)
            and at.epoch >= 0
            and (document >= 0 or (at.position, at.token) == (0, 0))
            and 0 <= at.token < max(1, size)
            and (at.token == 0 or self.long_documents == "split")
        )
        if not ok:
            raise ValueError(
                f"the state's packing cursor of lane {lane} of source {self.names[source]!r}, "
                f"{at} on document {saved[0]} of {saved[1]} slots, is not one of this plan's "
                f"(there: document {document} of {size} slots); {fix}"
            )

    def _remember(self, source: int, lane: int, stage: int, row: int, at: Cursor,
                  fix: str) -> None:  # fmt: skip
        """Keeps ``at`` as where row ``row`` of a lane's stage starts (refused where a known
        cursor there differs)."""
        rows, cursors = self._walks.setdefault((source, lane, stage), ([], []))
        j = bisect.bisect_left(rows, row)
        if j < len(rows) and rows[j] == row:
            if cursors[j] != at:
                raise ValueError(
                    f"the state's packing cursor of lane {lane} of source "
                    f"{self.names[source]!r}, {at}, differs from this plan's, {cursors[j]}; {fix}"
                )
            return
        rows.insert(j, row)
        cursors.insert(j, at)

    def _epoch_order(self, source: int, epoch: int, first: int, stop: int) -> np.ndarray:
        """Epoch positions ``[first, stop)`` of the source's document order (indices into its
        non-empty documents)."""
        positions = np.arange(first, stop, dtype=np.int64)
        if not self.shuffle:
            return positions
        key = splitmix64(self._keys[source] ^ epoch)
        return IndexShuffle(self.documents[source], key)(positions)

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
