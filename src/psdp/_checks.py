"""Small argument checks and message helpers shared by the modules that validate user input."""

from __future__ import annotations

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
