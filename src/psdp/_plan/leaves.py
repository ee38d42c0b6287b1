"""The leaf-key convention, in one place: a batch is a dict of leaves; an array source's single
leaf is keyed ``None`` in memory and stored as `SINGLE_LEAF` on disk (``docs/sources.md``)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: A leaf's name; ``None`` for an array source's single leaf.
Key = str | None
#: The name a dataset written from a single array stores its one leaf under.
SINGLE_LEAF = "array"


def leaves_of(rows: Any) -> dict[Key, np.ndarray]:
    """A read's leaves by name: a dict's keys as strings, or ``{None: rows}`` for one array.

    Example:
        >>> leaves_of({"tokens": [1, 2]}), leaves_of([1, 2])
        ({'tokens': [1, 2]}, {None: [1, 2]})
    """
    if isinstance(rows, dict):
        return {(None if k is None else str(k)): v for k, v in rows.items()}
    return {None: rows}


def leaf_label(key: Key) -> str:
    """How messages name a leaf.

    Example:
        >>> leaf_label("tokens"), leaf_label(None)
        ("leaf 'tokens'", 'the array source')
    """
    return "the array source" if key is None else f"leaf {key!r}"


def unwrap(values: dict[Key, Any]) -> Any:
    """An array source's single value, or the dict of a dict source's leaves.

    Example:
        >>> unwrap({None: 1}), unwrap({"tokens": 1})
        (1, {'tokens': 1})
    """
    return values[None] if None in values else values
