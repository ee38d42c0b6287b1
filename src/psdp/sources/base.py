"""The random-access source protocol, the in-memory sources, and the helpers every source shares.
What a read must return (any order, repeats, thread-safe): ``docs/guides/custom-sources.md``, "The protocol".
`as_source`, which picks a source for any object, is in ``stores/adapt.py``: it needs the stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy as np

from psdp._plan.leaves import Key, in_leaf_order
from psdp._plan.windows import Box, read_box

Rows: TypeAlias = "np.ndarray | dict[str, np.ndarray]"

Method = TypeVar("Method", bound=Callable[..., Any])


def fresh_rows(method: Method) -> Method:
    """Marks a psdp read method whose arrays are new on every call, held by nothing else.

    The loader copies rows from every other read before they reach a batch: a source may return
    a view of a buffer it refills (`reads_fresh_rows`).
    """
    method.__psdp_fresh_rows__ = True  # type: ignore[attr-defined]
    return method


def reads_fresh_rows(source: Any) -> bool:
    """Whether every read method of ``source`` is a psdp method marked `fresh_rows`.

    A subclass that overrides ``read`` (or ``read_window``) may return memory it keeps, so it is
    not trusted, even when it calls the marked method of its parent.

    Examples:
        >>> class Views(ArraySource):
        ...     def read(self, ids): return super().read(ids)
        >>> reads_fresh_rows(ArraySource(np.zeros(3))), reads_fresh_rows(Views(np.zeros(3)))
        (True, False)
    """
    methods = [getattr(type(source), name, None) for name in ("read", "read_window")]
    return all(m is None or getattr(m, "__psdp_fresh_rows__", False) for m in methods)


@runtime_checkable
class Source(Protocol):
    """What the loader reads from: a sized table read in batches.

    ``read(ids)`` returns the rows at ``ids`` (an array, or a dict of arrays for a dict batch).
    A source may also offer `SupportsReadWindow`'s ``read_window``: the loader then reads a
    windowed leaf's columns or box only, instead of whole rows.

    Examples:
        >>> class Squares:
        ...     def __len__(self): return 10
        ...     def read(self, ids): return ids * ids
        ...     def describe(self): return "Squares(10 rows)"
        >>> isinstance(Squares(), Source), Squares().read(np.array([3, 1])).tolist()
        (True, [9, 1])
    """

    def __len__(self) -> int: ...

    def read(self, ids: np.ndarray) -> Rows: ...

    def describe(self) -> str: ...


@runtime_checkable
class SupportsReadWindow(Protocol):
    """A source that reads some leaves cut to a box: ``docs/guides/custom-sources.md``, "Column windows and
    boxes".

    ``columns`` maps each leaf to read (``None`` for a single array) to its box: a slice of
    dimension 1, or a tuple with a slice or a 1-d int index array per dimension from 1 on (outer
    indexing; dimensions past the tuple whole). ``()`` is the whole row: the loader reads
    whole-row leaves that way beside a windowed leaf. Returns exactly those leaves, one row per id.

    Examples:
        >>> src = ArraySource({"tokens": np.arange(12).reshape(3, 4), "w": np.arange(3)})
        >>> got = src.read_window(np.array([2]), {"tokens": (slice(1, 3),), "w": ()})
        >>> isinstance(src, SupportsReadWindow), got["tokens"].tolist(), got["w"].tolist()
        (True, [[9, 10]], [2])
    """

    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]: ...


class ArraySource:
    """In-memory rows: one array ``(N, ...)`` or a dict of arrays with the same ``N``.

    Examples:
        >>> src = ArraySource({"tokens": np.arange(12).reshape(6, 2), "weight": np.ones(6)})
        >>> len(src), src.read(np.array([4, 1]))["tokens"].tolist()
        (6, [[8, 9], [2, 3]])
    """

    def __init__(self, data: np.ndarray | Mapping[str, np.ndarray]):
        if isinstance(data, Mapping):
            if not data:
                raise ValueError("a dict source needs at least one leaf, got an empty dict")
            leaves = in_leaf_order({str(k): as_rows(v, f"leaf {k!r}") for k, v in data.items()})
            lengths = {k: len(v) for k, v in leaves.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(
                    f"every leaf of a dict source needs the same number of rows, got {lengths}; "
                    "trim or pad the leaves to one length"
                )
            self._data: Rows = leaves
            self._len = next(iter(lengths.values()))
        else:
            self._data = as_rows(data, "the source")
            self._len = len(self._data)

    def __len__(self) -> int:
        return self._len

    @fresh_rows  # an index array always copies
    def read(self, ids: np.ndarray) -> Rows:
        if isinstance(self._data, dict):
            return {k: v[ids] for k, v in self._data.items()}
        return self._data[ids]

    @fresh_rows
    def read_window(self, ids: np.ndarray, columns: Mapping[Key, Box]) -> dict[Key, np.ndarray]:
        """Only some leaves (``None``: the single array), each cut to a range of dimension 1, or
        to a box of several dimensions (``docs/guides/spatial.md``, "Spatial reads").

        The loader uses this for windowed leaves, so a host copies only its columns or box.

        Examples:
            >>> src = ArraySource({"tokens": np.arange(12).reshape(3, 4), "weight": np.ones(3)})
            >>> src.read_window(np.array([2, 0]), {"tokens": slice(1, 3)})["tokens"].tolist()
            [[9, 10], [1, 2]]
        """
        out = {}
        for key, cols in columns.items():
            leaf: Any = self._data if key is None else self._data[key]
            out[key] = read_box(leaf, ids, cols)
        return in_leaf_order(out)

    def describe(self) -> str:
        return f"ArraySource({describe_rows(self._data)})"


class IndexableSource:
    """Adapts any object with ``__len__`` and a batched ``__getitem__(ids)``.

    Examples:
        >>> src = IndexableSource(np.arange(10) * 10)
        >>> len(src), src.read(np.array([7, 2])).tolist(), src.describe()
        (10, [70, 20], 'IndexableSource(ndarray, 10 rows)')
    """

    def __init__(self, obj: Any):
        self._obj = obj

    def __len__(self) -> int:
        return len(self._obj)

    def read(self, ids: np.ndarray) -> Rows:
        return self._obj[ids]

    def describe(self) -> str:
        return f"IndexableSource({type(self._obj).__name__}, {len(self)} rows)"


# ------------------------------------------------------------------------------ shared helpers
def as_rows(value: Any, what: str) -> np.ndarray:
    """``value`` itself when it is a numpy array with a row dimension; raises otherwise."""
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy array with rows along dimension 0, got "
            f"{type(value).__name__}; convert it with np.asarray"
        )
    if value.ndim == 0:
        raise ValueError(f"{what} is a 0-d array; it needs a row dimension")
    return value


def describe_rows(data: Rows) -> str:
    if isinstance(data, dict):
        return ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in data.items())
    return f"{data.dtype}{list(data.shape)}"


def check_ids(ids: Any, num_rows: int, where: str | Callable[[], str]) -> np.ndarray:
    """``ids`` as a 1-d int64 array, each in ``[0, num_rows)``; raises naming ``where`` (or
    ``where()``: a source's description is built only for an error, never on every read)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(
            f"row ids must be a 1-d integer array, got {ids.dtype}{list(ids.shape)} for "
            f"{_named(where)}"
        )
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise IndexError(
            f"row ids must be in [0, {num_rows - 1}] for {_named(where)} ({num_rows} rows), got "
            f"ids from {int(ids.min())} to {int(ids.max())}"
        )
    return ids


def _named(where: str | Callable[[], str]) -> str:
    return where if isinstance(where, str) else where()
