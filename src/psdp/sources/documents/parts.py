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
        start, stop = where.start, where.stop
        out = np.zeros(stop - start, np.int64)
        low = max(start, 1)  # entry 0 is 0; entry g >= 1 is the rest's g - 1
        if stop > low:
            rest = np.asarray(self._rest[low - 1 : stop - 1].read().result(), np.int64)
            part = np.searchsorted(self.first_document, np.arange(low - 1, stop - 1), "right") - 1
            out[low - start :] = rest + self.first_token[part]
        return out
