"""`StagedPacked`: documents of several stores packed into rows whose ``seq_len`` changes by stage.

The map is `psdp._plan.packed_stages`' (``docs/concepts/length-stages.md``, "Packed sources"): a
sample offset is a source, a lane and the documents its lane packs next. This module reads them:
each stage is a `PackedStageRows` whose row ``r`` is sample offset ``stage start + r``, its
pieces read by `PlacedRows`, so leaves, EOS, targets and column windows are `PackedSequences`'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from psdp._plan.leaves import Key
from psdp._plan.packed_stages import PackedLengthPlan
from psdp._plan.packing import segment_lengths
from psdp._plan.windows import Box
from psdp.sources.documents.store import DocumentStore
from psdp.sources.views.packed import PlacedRows
from psdp.sources.views.staged import StagedTokens, StageRows, with_source_leaf


class StagedPacked(StagedTokens):
    """Documents of several stores, mixed and packed into rows whose ``seq_len`` changes by
    stage; across a stage's start each source's lanes go on at their next unpacked document.

    Its row ``g`` is sample offset ``g``, as `StagedTokens`' (one `DataLoader` reads it across
    all its stages); its leaves are `PackedSequences`'.

    Args:
        stores: ``{name: DocumentStore}``, all with the same leaves.
        stages: ``[(start_offset, seq_len, {name: weight}), ...]``, as `StagedTokens`'.
        lanes: lanes of documents per source; each source needs at least this many non-empty
            documents.
        block_size: samples per mixture block.
        seed: keys the mixture's blocks and the document orders.
        shuffle: order each epoch's documents by key (``False``: the store's order).
        long_documents: ``None`` refuses a stage whose ``seq_len`` would cut a document of a
            source it weights; ``"split"``, ``"truncate"`` or ``"drop"`` as `PackedSequences`'.
        max_segments: the most documents (or pieces) a row holds; ``None``: as many as fit.
        targets: a ``targets`` leaf, as `PackedSequences`'.
        eos_id: the token after each document (unset: none).
        pad_id: the padding token.
        context: the context axis every ``seq_len`` must divide by.
        source_leaf: the name of an int32 leaf added to each row: its source's position.

    Examples:
        >>> store = DocumentStore.from_documents(
        ...     [np.arange(1, 4), np.arange(10, 40), np.arange(50, 52)])
        >>> staged = StagedPacked({"a": store}, [(0, 8, {"a": 1}), (2, 4, {"a": 1})],
        ...                       lanes=1, block_size=1, shuffle=False, long_documents="split")
        >>> staged.stage(0).read(np.arange(2))["input_ids"].tolist()
        [[1, 2, 3, 0, 0, 0, 0, 0], [10, 11, 12, 13, 14, 15, 16, 17]]
        >>> staged.stage(1).read(np.arange(2))["input_ids"].tolist()  # the document goes on
        [[18, 19, 20, 21], [22, 23, 24, 25]]
    """

    plan: PackedLengthPlan  # type: ignore[assignment]  # StagedTokens' stages, packed

    def __init__(
        self,
        stores: Mapping[str, DocumentStore],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        *,
        lanes: int,
        block_size: int = 2048,
        seed: int = 0,
        shuffle: bool = True,
        long_documents: str | None = None,
        max_segments: int | None = None,
        targets: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
        context: int = 1,
        source_leaf: str | None = None,
    ) -> None:
        if not isinstance(stores, Mapping) or not stores:
            raise TypeError(
                f"stores must be a non-empty dict {{name: DocumentStore}}, got {stores!r}"
            )
        self.stores = dict(stores)
        self.offsets = {n: s.offsets_range(0, s.num_documents + 1) for n, s in stores.items()}
        self.pad_id, self.targets, self.eos_id = pad_id, targets, eos_id
        lengths = [segment_lengths(o, eos_id is not None) for o in self.offsets.values()]
        self.plan = PackedLengthPlan(
            tuple(stores), lengths, stages, block_size=block_size, lanes=lanes, seed=seed,
            shuffle=shuffle, long_documents=long_documents, max_segments=max_segments,
            context=context,
        )  # fmt: skip
        leaves = {name: self._rows(name, 1).leaves for name in stores}
        first = next(iter(leaves.values()))
        if any(other != first for other in leaves.values()):
            raise ValueError(
                f"the stores' leaves differ ({leaves}); a mixture's rows need the same leaves "
                "and dtypes from every store"
            )
        self.leaves = with_source_leaf(first, source_leaf)
        self.source_leaf = source_leaf

    def stage(self, index: int) -> PackedStageRows:
        """Stage ``index``'s rows, a source whose row ``r`` is offset ``start + r``."""
        if not 0 <= index < len(self.plan.stages):
            raise IndexError(f"stage {index} does not exist: there are {len(self.plan.stages)}")
        return PackedStageRows(self, index)

    def provenance(self, offsets: np.ndarray) -> np.ndarray:
        """Where every segment of the packed rows at sample ``offsets`` comes from: a
        `provenance_table` row per segment, in row then column order; reads no token.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(1, 4), np.arange(10, 40)])
            >>> staged = StagedPacked({"a": store}, [(0, 8, {"a": 1}), (2, 4, {"a": 1})],
            ...     lanes=1, block_size=1, shuffle=False, long_documents="split")
            >>> staged.provenance(np.array([2]))[["document", "start", "stop"]].tolist()
            [(1, 8, 12)]
        """
        offsets = np.asarray(offsets, np.int64).reshape(-1)
        pieces = self.plan.pieces(offsets)
        tables = []
        width = 1 + int(pieces.column.max(initial=0) + pieces.size.max(initial=0))
        for rows, ids in self._source_rows(pieces, width, len(offsets)):
            table = rows.provenance(ids)
            table["row"] = ids[table["row"]]
            tables.append(table)
        if not tables:
            return self._rows(next(iter(self.stores)), 1).provenance(np.zeros(0, np.int64))
        joined = np.concatenate(tables)
        return joined[np.lexsort((joined["column"], joined["row"]))]

    def probe_row(self, stage: int) -> dict[Key, np.ndarray]:
        """A row of stage ``stage``'s leaves (names, shapes, dtypes) holding no document: a
        loader's probe of each stage, which so packs no lane up to the stage's start.

        Examples:
            >>> store = DocumentStore.from_documents([np.arange(1, 4)])
            >>> staged = StagedPacked({"a": store}, [(0, 8, {"a": 1}), (2, 4, {"a": 1})],
            ...                       lanes=1, block_size=1)
            >>> staged.probe_row(1)["input_ids"].tolist()
            [[0, 0, 0, 0]]
        """
        return self.stage(stage).probe_row()

    def state_cursors(self, offset: int) -> dict[str, Any]:
        """Each source's lanes' cursors at sample ``offset`` (`PackedLengthPlan.resume_cursors`):
        a loader state carries them, so a restore there packs from them, not from the run's
        start (O(sources x lanes) ints)."""
        return self.plan.resume_cursors(offset)

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        """`StagedTokens.check_resume`, then the saved cursors, if any, checked and used
        (`PackedLengthPlan.seed_cursors`: refused where they are not this plan's)."""
        super().check_resume(saved, offset)
        if "cursors" in saved:
            self.plan.seed_cursors(saved["cursors"], offset)

    def describe(self) -> str:
        lengths = [stage.seq_len for stage in self.plan.stages]
        return f"StagedPacked({', '.join(self.stores)}; seq_len by stage {lengths})"

    def _source_rows(
        self, pieces: Any, seq_len: int, count: int
    ) -> Iterator[tuple[PlacedRows, np.ndarray]]:
        """Per source that ``pieces`` (`PackedLengthPlan.pieces` of ``count`` offsets) hold:
        a `PlacedRows` of its pieces, rows ``seq_len`` wide, and the rows it fills."""
        for s, name in enumerate(self.stores):
            mine = pieces.source == s
            if mine.any():
                given = (pieces.row[mine], pieces.document[mine], pieces.start[mine],
                         pieces.size[mine], pieces.column[mine])  # fmt: skip
                yield self._rows(name, seq_len, given, count), np.unique(pieces.row[mine])

    def _rows(self, name: str, seq_len: int, pieces: Any = None, count: int = 0) -> PlacedRows:
        """A `PlacedRows` of store ``name`` holding ``pieces`` (rows ``[0, count)``)."""
        empty = np.zeros(0, np.int64)
        given = pieces or (empty, empty, empty, empty, empty)
        row, document, start, size, column = given
        return PlacedRows(self.stores[name], seq_len, self.offsets[name], rows=count, row=row,
                          document=document, start=start, size=size, column=column,
                          pad_id=self.pad_id, targets=self.targets,
                          eos_id=self.eos_id)  # fmt: skip


class PackedStageRows(StageRows):
    """One stage of a `StagedPacked`: row ``r`` is sample offset ``start + r`` of the run."""

    def __init__(self, staged: StagedPacked, index: int) -> None:
        stages = staged.plan.stages
        self.staged: StagedPacked = staged
        self.index = index
        self.start, self.seq_len = stages[index].start, stages[index].seq_len
        self.stop = stages[index + 1].start if index + 1 < len(stages) else len(staged)
        self.width = self.seq_len

    def _read_at(
        self, offsets: np.ndarray, columns: Mapping[Key, Box] | None
    ) -> dict[Key, np.ndarray]:
        """The store and packing leaves of the packed rows at ``offsets`` (whole, or each cut
        to its columns): `PlacedRows`' reads of each source's rows."""
        staged = self.staged
        pieces = staged.plan.pieces(offsets)
        out: dict[Key, np.ndarray] = {}
        if not len(offsets):
            rows = staged._rows(next(iter(staged.stores)), self.seq_len)
            got = rows.read(offsets) if columns is None else rows.read_window(offsets, columns)
            return {k: v for k, v in got.items() if k != staged.source_leaf}
        for rows, ids in staged._source_rows(pieces, self.seq_len, len(offsets)):
            got = rows.read(ids) if columns is None else rows.read_window(ids, columns)
            for key, value in got.items():
                if key not in out:
                    out[key] = np.zeros((len(offsets), *value.shape[1:]), value.dtype)
                out[key][ids] = value
        return out

    def probe_row(self) -> dict[Key, np.ndarray]:
        """A row of this stage's leaves holding no document (`StagedPacked.probe_row`)."""
        staged = self.staged
        rows = staged._rows(next(iter(staged.stores)), self.seq_len, None, 1)
        read = rows.read(np.zeros(1, np.int64))
        got: dict[Key, np.ndarray] = {k: v for k, v in read.items() if k != staged.source_leaf}
        return self._tagged(np.full(1, self.start, np.int64), got, None)

    def describe(self) -> str:
        return (
            f"stage {self.index} of {self.staged.describe()} (offsets from {self.start}, "
            f"seq_len={self.seq_len})"
        )
