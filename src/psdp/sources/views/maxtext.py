"""`MaxTextRows`: language-model rows under MaxText's six leaf names, so a `DataLoader` over them
yields the global batches MaxText's train step takes (``docs/guides/grain-maxtext.md``).

MaxText's contract (``maxtext.utils.maxtext_utils.get_shaped_batch``, ``input_pipeline``):
int32 ``(batch, seq)`` leaves ``inputs``, ``inputs_segmentation``, ``inputs_position``,
``targets``, ``targets_segmentation``, ``targets_position``; attention keeps tokens of one
``inputs_segmentation`` together, and the loss counts a token where ``targets_segmentation``
is non-zero. A padding row is all zeros, so it counts nowhere, without a mask leaf.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from psdp._plan.leaves import POSITIONS, SEGMENT_IDS, TOKENS
from psdp.sources.base import check_ids, fresh_rows

#: The leaves a `MaxTextRows` source needs (``PackedSequences(..., targets=True)`` has them).
NEEDED = (TOKENS, SEGMENT_IDS, POSITIONS, "targets", "loss_mask")
#: MaxText's batch leaves, all int32.
MAXTEXT_LEAVES = (
    "inputs",
    "inputs_position",
    "inputs_segmentation",
    "targets",
    "targets_position",
    "targets_segmentation",
)
_INT32 = np.iinfo(np.int32)


class MaxTextRows:
    """A source's language-model rows as MaxText's six int32 leaves.

    ``inputs`` and ``targets`` are the rows' ``input_ids`` and ``targets``; both positions are
    ``positions``; ``inputs_segmentation`` is ``segment_ids`` and ``targets_segmentation`` is
    ``segment_ids`` where ``loss_mask`` is set, else 0 (no loss there). Targets stay within a
    segment (psdp's rule: ``docs/guides/packing.md``, "Next-token targets"), where MaxText's own
    shift also counts a segment's last token predicting the next segment's first.

    Args:
        source: rows with ``input_ids``, ``segment_ids``, ``positions``, ``targets`` and
            ``loss_mask``: ``PackedSequences(..., targets=True)``, or a `Mixture` of them.

    Examples:
        >>> from psdp.sources import DocumentStore, PackedSequences
        >>> store = DocumentStore.from_documents([np.array([5, 6, 7]), np.array([8, 9])])
        >>> rows = MaxTextRows(PackedSequences(store, seq_len=8, targets=True, eos_id=1))
        >>> row = rows.read(np.array([0]))
        >>> row["inputs"].tolist(), row["targets"].tolist(), row["targets_segmentation"].tolist()
        ([[5, 6, 7, 1, 8, 9, 1, 0]], [[6, 7, 1, 0, 9, 1, 0, 0]], [[1, 1, 1, 0, 2, 2, 0, 0]])
    """

    #: a zero row (the loader's padding) has ``targets_segmentation`` 0, which MaxText's loss
    #: counts nowhere: a `DataLoader` pads these rows with ``mask_key=None`` (MaxText's batches
    #: have no mask leaf, and its loss cuts every leaf as ``v[:micro_batch, :]``)
    zero_rows_weigh_nothing = True

    def __init__(self, source: Any):
        leaves = getattr(source, "leaves", None)
        if isinstance(leaves, dict):
            missing = [k for k in NEEDED if k not in leaves]
            if missing:
                raise ValueError(
                    f"MaxTextRows needs rows with the leaves {list(NEEDED)}, but "
                    f"{_describe(source)} lacks {missing}; read the documents with "
                    "PackedSequences(store, seq_len, targets=True, eos_id=...)"
                )
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    @fresh_rows  # every leaf is a new int32 array
    def read(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, len(self), lambda: _describe(self.source))
        rows = self.source.read(ids)
        if not isinstance(rows, dict) or any(k not in rows for k in NEEDED):
            got = sorted(rows) if isinstance(rows, dict) else type(rows).__name__
            raise ValueError(
                f"MaxTextRows needs rows with the leaves {list(NEEDED)}, but "
                f"{_describe(self.source)} read {got}; read the documents with "
                "PackedSequences(store, seq_len, targets=True, eos_id=...)"
            )
        positions = _int32(rows[POSITIONS], POSITIONS)
        segments = _int32(rows[SEGMENT_IDS], SEGMENT_IDS)
        return {
            "inputs": _int32(rows[TOKENS], TOKENS),
            "inputs_position": positions,
            "inputs_segmentation": segments,
            "targets": _int32(rows["targets"], "targets"),
            "targets_position": positions.copy(),
            "targets_segmentation": np.where(rows["loss_mask"] != 0, segments, 0).astype(np.int32),
        }

    def describe(self) -> str:
        return f"MaxTextRows({_describe(self.source)})"


def _int32(values: np.ndarray, leaf: str) -> np.ndarray:
    """``values`` as a new int32 array; raises when one does not fit (MaxText's leaves are int32)."""
    values = np.asarray(values)
    if values.size and (values.min() < _INT32.min or values.max() > _INT32.max):
        raise ValueError(
            f"MaxText's leaves are int32, but leaf {leaf!r} holds {values.min()}..{values.max()}, "
            f"outside {_INT32.min}..{_INT32.max}; use a vocabulary (or document count) that fits"
        )
    return np.array(values, dtype=np.int32)


def _describe(source: Any) -> str:
    describe = getattr(source, "describe", None)
    return describe() if callable(describe) else type(source).__name__
