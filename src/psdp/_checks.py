"""Small argument checks and message helpers shared by the modules that validate user input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def is_int(value: object) -> bool:
    """A Python or numpy integer, but not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int | None) -> None:
    """Raises `TypeError` for a non-int and `ValueError` below ``minimum``, naming the argument."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def preview_ids(ids: np.ndarray) -> str:
    """The first few row ids, for error messages: ``[3, 17, 4, ...]``."""
    head = ids[:6].tolist()
    return f"{head}{'...' if ids.size > 6 else ''}"


def check_fields(what: str, record: Mapping[str, Any], kinds: Mapping[str, str], fix: str) -> None:
    """Raises unless ``record`` has every key of ``kinds``, each of its kind (a key of `_IS_KIND`).

    `ValueError` names the missing keys, `TypeError` a key of the wrong kind; both end in ``fix``.

    Examples:
        >>> check_fields("the state", {"step": "3"}, {"step": "int", "seed": "int"}, "save it again")
        Traceback (most recent call last):
            ...
        ValueError: the state lacks keys ['seed'] (it needs ['seed', 'step']); save it again
    """
    missing = sorted(set(kinds) - set(record))
    if missing:
        raise ValueError(f"{what} lacks keys {missing} (it needs {sorted(kinds)}); {fix}")
    for key, kind in kinds.items():
        value = record[key]
        if not _IS_KIND[kind](value):
            article = "an" if kind.startswith("int") else "a"
            raise TypeError(
                f"{what}'s {key!r} must be {article} {kind}, got {type(value).__name__} "
                f"{value!r}; {fix}"
            )


_IS_KIND = {
    "int": is_int,
    "bool": lambda v: isinstance(v, bool | np.bool_),
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, Mapping),
    "list": lambda v: isinstance(v, list | tuple),
    "int or list": lambda v: is_int(v) or isinstance(v, list | tuple),
    "int or null": lambda v: v is None or is_int(v),
}
