"""A parted document store (what `psdp prepare` writes) read as one corpus: its parts, each an
ordinary document store (`write_documents`), back to back in the manifest's order.

Layout below the store (``docs/guides/prepare.md``, "Parts"): ``psdp.json`` (the manifest, format
`PARTS_FORMAT`: the parts in order with their counts, and once complete the file of the whole
corpus's `DocumentIndex`), ``parts/<name>/`` (one document store each) and ``index-<D>.npz``.
A host keeps, per part, its open arrays and two numbers (its first document and first token), and
the corpus's index; nothing per document. The token leaves are TensorStore's own virtual
concatenation of the parts' (``ts.concat``), so a batch of range reads stays one batched read;
the offsets are `PartedOffsets`, which add each part's first token to its offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorstore as ts

#: The ``format`` and ``version`` of a parted store's manifest (its ``psdp.json``).
PARTS_FORMAT = "psdp.document_parts"
PARTS_VERSION = 1
#: Where the parts are, below the store: ``parts/<name>/``.
PARTS_DIRECTORY = "parts"


def index_key(num_documents: int) -> str:
    """The key of a complete parted store's index, named by its size (an append writes a new one
    before the manifest names it, so a reader never sees an index of another manifest)."""
    return f"index-{num_documents}.npz"


class PartedOffsets:
    """The offsets of documents stored in parts, as one `FlatArray` of ``D + 1`` entries: entry 0
    is 0, then each part's offsets but its first, plus the tokens of the parts before it.

    Examples:
        >>> first, second = np.array([0, 2, 5]), np.array([0, 4])  # parts of 2 and 1 documents
        >>> offsets = PartedOffsets([ts.array(first), ts.array(second)])
        >>> offsets.shape, offsets[0:4].tolist(), offsets[2:4].tolist()
        ((4,), [0, 2, 5, 9], [5, 9])
    """

    def __init__(self, parts: Sequence[Any]):
        """``parts``: each part's offsets, a 1-D TensorStore array of at least 2 entries."""
        ends = [ts.concat([p[p.shape[0] - 1 :] for p in parts], axis=0)]
        last = np.asarray(ends[0].read().result(), np.int64)  # one batched read of every end
        #: per part: its first document, and its first token
        self.first_document = np.concatenate([[0], np.cumsum([p.shape[0] - 1 for p in parts])])
        self.first_token = np.concatenate([[0], np.cumsum(last)])
        self._rest = ts.concat([p[1:].translate_to[0] for p in parts], axis=0)
        self.shape = (int(self.first_document[-1]) + 1,)
        self.dtype = np.dtype(np.int64)

    def __getitem__(self, where: slice) -> np.ndarray:
        return self.read_ranges(np.array([where.start]), np.array([where.stop]))

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """``self[starts[i]:stops[i]]`` for every ``i``, concatenated: every range's read
        started in one TensorStore batch, then all awaited, so the ranges of a step (one per run
        of blocks its rows touch, `documents_touching`) cost one round trip to the store
        together, not one each.

        Examples:
            >>> offsets = PartedOffsets([ts.array(np.array([0, 2, 5])), ts.array(np.array([0, 4]))])
            >>> offsets.read_ranges(np.array([3, 0]), np.array([4, 2])).tolist()
            [9, 0, 2]
        """
        spans = list(zip(np.asarray(starts).tolist(), np.asarray(stops).tolist(), strict=True))
        with ts.Batch() as batch:  # entry 0 is 0; entry g >= 1 is the rest's g - 1
            futures = [
                self._rest[max(a, 1) - 1 : b - 1].read(batch=batch) if b > max(a, 1) else None
                for a, b in spans
            ]
        out = []
        for (a, b), future in zip(spans, futures, strict=True):
            values = np.zeros(b - a, np.int64)
            if future is not None:
                low = max(a, 1)
                part = np.searchsorted(self.first_document, np.arange(low - 1, b - 1), "right") - 1
                values[low - a :] = np.asarray(future.result(), np.int64) + self.first_token[part]
            out.append(values)
        return np.concatenate([np.zeros(0, np.int64), *out])
