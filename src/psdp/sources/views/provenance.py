"""Provenance: where every segment of a delivered row comes from (``docs/guides/mixtures.md``,
"Provenance").

A token view (`TokenSequences`, `PackedSequences`) and a `Mixture` of them answer
``provenance(ids)`` with one table: a row per segment (a run of one document's tokens inside
one row), naming the source, the document and the token range, computed from the offsets alone,
without reading a token. A checker can then compare every delivered token with the store's.
"""

from __future__ import annotations

import numpy as np


def provenance_dtype(name_chars: int = 1) -> np.dtype:
    """The table's structured dtype; ``source`` holds names of up to ``name_chars`` characters.

    Fields: ``row`` (a position in the ids asked for), ``column`` (the segment's first column in
    its row), ``source`` (the mixed source's name; ``""`` for a view read alone), ``document``
    (its id in the store the source names; for a source selected by length, the store's id, not
    its place in the selection), ``start`` and ``stop`` (the document's tokens
    ``[start, stop)`` the segment holds) and ``eos`` (whether the segment ends with the view's
    EOS token, one more column after them).
    """
    return np.dtype(
        [("row", np.int64), ("column", np.int64), ("source", f"U{max(1, name_chars)}"),
         ("document", np.int64), ("start", np.int64), ("stop", np.int64), ("eos", np.bool_)]
    )  # fmt: skip


def provenance_table(
    row: np.ndarray,
    column: np.ndarray,
    document: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    eos: np.ndarray,
) -> np.ndarray:
    """A provenance table of a view read alone (``source`` empty), from its columns.

    Examples:
        >>> t = provenance_table(*(np.array([v]) for v in (0, 5, 7, 0, 3, True)))
        >>> t.tolist()
        [(0, 5, '', 7, 0, 3, True)]
    """
    table = np.zeros(len(row), provenance_dtype())
    for name, values in zip(("row", "column", "document", "start", "stop", "eos"),
                            (row, column, document, start, stop, eos), strict=True):  # fmt: skip
        table[name] = values
    return table
