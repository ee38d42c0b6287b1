"""`StagedTokens`: token sources read in stages of ``seq_len``, each stage a source of its own.

The map is `psdp._plan.length_stages`' (``docs/concepts/length-stages.md``): a sample offset is a
source, a lane and ranges of the source's stream. This module reads them: each stage is a
`StageRows` whose row ``r`` is sample offset ``stage start + r`` (a loader reads it in id order,
as a `Mixture`), its ranges read as windows of a one-token `TokenSequences` of each store, so
EOS tokens, stored leaves and ``positions`` are `TokenSequences`' own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psdp._plan.leaves import SEGMENT_IDS, Key, in_leaf_order
from psdp._plan.length_stages import LengthPlan
from psdp._plan.mixture import MIXTURE_ROWS
from psdp.sources.base import check_ids, fresh_rows
from psdp.sources.documents.store import DocumentStore
from psdp.sources.views.tokens import TokenSequences


class StagedTokens:
    """Documents of several stores, mixed and cut into rows whose ``seq_len`` changes by stage.

    Args:
        stores: ``{name: DocumentStore}``, all with the same leaves.
        stages: ``[(start_offset, seq_len, {name: weight}), ...]``, the first at 0, starts
            increasing multiples of ``block_size``.
        lanes: lanes per source (`LengthPlan`): at least the most samples of one source a batch
            holds, so they come from distinct places of its stream.
        block_size, seed, shuffle: the mixture's (`Mixture`), and the keys of the unit order.
        unit_tokens: the unit order's grain; default the longest ``seq_len``.
        targets: one more token per row (the next row's first), for shifted targets.
        eos_id, pad_id: as `TokenSequences`'.
        context: the context axis every ``seq_len`` must divide by.

    Examples:
        >>> store = DocumentStore.from_documents([np.arange(100, 160)])
        >>> staged = StagedTokens({"a": store}, [(0, 4, {"a": 1}), (4, 8, {"a": 1})],
        ...                       lanes=2, block_size=1, shuffle=False)
        >>> staged.stage(0).read(np.arange(4))["input_ids"][:, 0].tolist()
        [100, 130, 104, 134]
        >>> staged.stage(1).read(np.arange(2))["input_ids"].tolist()  # each lane goes on
        [[108, 109, 110, 111, 112, 113, 114, 115], [138, 139, 140, 141, 142, 143, 144, 145]]
    """

    def __init__(
        self,
        stores: Mapping[str, DocumentStore],
        stages: Sequence[tuple[int, int, Mapping[str, float]]],
        *,
        lanes: int,
        block_size: int = 2048,
        unit_tokens: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        targets: bool = False,
        eos_id: int | None = None,
        pad_id: int = 0,
        context: int = 1,
    ) -> None:
        if not isinstance(stores, Mapping) or not stores:
            raise TypeError(
                f"stores must be a non-empty dict {{name: DocumentStore}}, got {stores!r}"
            )
        self.streams = {
            name: TokenSequences(store, 1, eos_id=eos_id, pad_id=pad_id)
            for name, store in stores.items()
        }
        longest = max((stage[1] for stage in stages if _is_stage(stage)), default=1)
        self.plan = LengthPlan(
            tuple(self.streams),
            tuple(s.stream_tokens for s in self.streams.values()),
            stages,
            block_size=block_size,
            lanes=lanes,
            unit_tokens=longest if unit_tokens is None else unit_tokens,
            seed=seed,
            shuffle=shuffle,
            extra=int(targets),
            context=context,
        )
        leaves = [s.leaves for s in self.streams.values()]
        if any(other != leaves[0] for other in leaves[1:]):
            raise ValueError(
                f"the stores' leaves differ ({dict(zip(self.streams, leaves, strict=True))}); "
                "a mixture's rows need the same leaves and dtypes from every store"
            )
        self.leaves = leaves[0]

    def stage(self, index: int) -> StageRows:
        """Stage ``index``'s rows, a source whose row ``r`` is offset ``start + r``."""
        if not 0 <= index < len(self.plan.stages):
            raise IndexError(f"stage {index} does not exist: there are {len(self.plan.stages)}")
        return StageRows(self, index)

    def describe(self) -> str:
        lengths = [stage.seq_len for stage in self.plan.stages]
        return f"StagedTokens({', '.join(self.streams)}; seq_len by stage {lengths})"


class StageRows:
    """One stage of a `StagedTokens`: row ``r`` is sample offset ``start + r`` of the run.

    It reads its rows in id order (``orders_itself``: the plan shuffles). Its length is endless,
    as a mixture's, so a loader never wraps back to its first row; a row past the stage's end is
    refused, naming the stage that holds it. ``segment_ids`` number each row's segments from 1:
    a new one at each document and wherever the row goes on at another place of its store's
    stream (the next unit of the epoch's order, or the lane's next epoch).
    """

    orders_itself = True

    def __init__(self, staged: StagedTokens, index: int) -> None:
        stages = staged.plan.stages
        self.staged, self.index = staged, index
        self.start, self.seq_len = stages[index].start, stages[index].seq_len
        self.stop = stages[index + 1].start if index + 1 < len(stages) else MIXTURE_ROWS
        self.width = self.seq_len + staged.plan.extra

    def __len__(self) -> int:
        return MIXTURE_ROWS - self.start

    @property
    def leaves(self) -> dict[str, np.dtype]:
        return dict(self.staged.leaves)

    @fresh_rows
    def read(self, ids: np.ndarray) -> dict[Key, np.ndarray]:
        ids = check_ids(ids, len(self), self.describe)
        offsets = ids + self.start
        if ids.size and offsets.max() >= self.stop:
            raise IndexError(
                f"row {int(ids.max())} of stage {self.index} is sample offset "
                f"{int(offsets.max())}, where stage {self.index + 1} starts (at {self.stop}) "
                f"with another seq_len; stage {self.index} holds {self.stop - self.start} rows: "
                f"read the rest from stage {self.index + 1}'s rows"
            )
        plan = self.staged.plan
        pieces = plan.store_pieces(offsets)
        shape = (len(ids), self.width)
        names = list(self.leaves)
        out: dict[Key, np.ndarray] = {n: np.zeros(shape, d) for n, d in self.leaves.items()}
        documents = np.zeros(shape, np.int64)
        places = np.zeros(shape, np.int64)  # each token's place in its store's stream
        for source, name in enumerate(self.staged.streams):
            stream = self.staged.streams[name]
            for size in np.unique(pieces.size[pieces.source == source]):
                at = np.flatnonzero((pieces.source == source) & (pieces.size == size))
                box = slice(0, int(size))
                got = stream.read_window(
                    pieces.start[at], dict.fromkeys([*names, SEGMENT_IDS], box)
                )
                rows = pieces.row[at][:, None]
                columns = pieces.column[at][:, None] + np.arange(int(size))
                for leaf in names:
                    out[leaf][rows, columns] = got[leaf]
                documents[rows, columns] = got[SEGMENT_IDS]
                places[rows, columns] = pieces.start[at][:, None] + np.arange(int(size))
        # a segment starts at a new document, or where the row jumps to another place
        new = np.ones(shape, bool)
        new[:, 1:] = (documents[:, 1:] != documents[:, :-1]) | (places[:, 1:] != places[:, :-1] + 1)
        if SEGMENT_IDS in out:
            out[SEGMENT_IDS] = np.cumsum(new, axis=1).astype(self.leaves[SEGMENT_IDS])
        return in_leaf_order(out)

    def describe(self) -> str:
        return (
            f"stage {self.index} of {self.staged.describe()} (offsets from {self.start}, "
            f"seq_len={self.seq_len}{' + 1' if self.width > self.seq_len else ''})"
        )


def _is_stage(stage: Any) -> bool:
    return isinstance(stage, Sequence) and len(stage) == 3 and isinstance(stage[1], int)
