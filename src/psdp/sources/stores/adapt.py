"""`as_source`: whatever a user passes as data, as a `Source` (``docs/guides/stores.md``).

It sits above `base` and the stores because it picks among them (a list of records becomes a
`GrainSource`); `base` holds the protocol and the in-memory sources it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from psdp.sources.base import ArraySource, IndexableSource, Source
from psdp.sources.stores.grain import GrainSource


def as_source(data: Any) -> Source:
    """Returns ``data`` as a `Source`: sources pass through; arrays and dicts become `ArraySource`.

    A list (or tuple) of records, each an array or a dict of arrays, becomes a `GrainSource` that
    reads record by record on the calling thread: simple, but slow for big batches; stack the
    records into arrays (a dict of arrays) for speed.

    Examples:
        >>> as_source(np.zeros((4, 2))).describe()
        'ArraySource(float64[4, 2])'
        >>> records = [{"x": np.array([i, i])} for i in range(3)]
        >>> as_source(records).read(np.array([2, 0]))["x"].tolist()
        [[2, 2], [0, 0]]
    """
    if isinstance(data, Source):
        return data
    if isinstance(data, np.ndarray | Mapping):
        return ArraySource(data)
    if isinstance(data, list | tuple):  # records: read one by one (slow), stacked per leaf
        return GrainSource(data, read_threads=1)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        return IndexableSource(data)
    hint = (
        "; an iterable without random access is a stream: wrap it in psdp.sources.StreamSource"
        if hasattr(data, "__iter__")
        else ""
    )
    raise TypeError(
        f"cannot read rows from a {type(data).__name__}; pass a numpy array, a dict of arrays, a "
        f"psdp source, or an object with __len__ and a batched __getitem__(ids){hint}"
    )
