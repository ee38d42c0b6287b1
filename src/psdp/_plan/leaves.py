"""The leaf-key convention, in one place: a batch is a dict of leaves, in sorted key order on
every host (`in_leaf_order`); an array source's single leaf is keyed ``None`` in memory and
stored as `SINGLE_LEAF` on disk (``docs/guides/stores.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

K = TypeVar("K", bound="str | None")
V = TypeVar("V")

#: A leaf's name; ``None`` for an array source's single leaf.
Key = str | None
#: The name a dataset written from a single array stores its one leaf under.
SINGLE_LEAF = "array"
#: The leaf every document store has: the token ids (integers). A document given as one array
#: is this leaf.
TOKENS = "input_ids"
#: The leaf a view of a store (`TokenSequences`, `PackedSequences`) numbers each token's document
#: or segment with (0: padding).
SEGMENT_IDS = "segment_ids"
#: The leaf a view gives each token's position in its document or segment (0 at its first token).
POSITIONS = "positions"


def in_leaf_order(leaves: Mapping[K, V]) -> dict[K, V]:
    """``leaves`` in the one order of a batch's leaves: sorted by name. A dict's order would
    otherwise depend on how it was built (a set's order changes with ``PYTHONHASHSEED``, so from
    host to host), and code that pairs leaves by position across hosts would pair different ones.

    Examples:
        >>> list(in_leaf_order({"weight": 1, "mask": 2, "tokens": 3}))
        ['mask', 'tokens', 'weight']
    """
    # a single array's key None never meets a name: one sort key for both
    return dict(sorted(leaves.items(), key=lambda item: str(item[0])))


def leaves_of(rows: Any) -> dict[Key, np.ndarray]:
    """A read's leaves by name, `in_leaf_order`: a dict's keys as strings, or ``{None: rows}``
    for one array.

    Examples:
        >>> leaves_of({"weight": [1.0], "tokens": [1, 2]}), leaves_of([1, 2])
        ({'tokens': [1, 2], 'weight': [1.0]}, {None: [1, 2]})
    """
    if isinstance(rows, dict):
        return in_leaf_order({(None if k is None else str(k)): v for k, v in rows.items()})
    return {None: rows}


def leaf_label(key: Key) -> str:
    """How messages name a leaf.

    Examples:
        >>> leaf_label("tokens"), leaf_label(None)
        ("leaf 'tokens'", 'the array source')
    """
    return "the array source" if key is None else f"leaf {key!r}"


def unwrap(values: dict[Key, Any]) -> Any:
    """An array source's single value, or the dict of a dict source's leaves.

    Examples:
        >>> unwrap({None: 1}), unwrap({"tokens": 1})
        (1, {'tokens': 1})
    """
    return values[None] if None in values else values
