"""The example's oracle: each step's global batch rebuilt without psdp's readers, so that every
device's part of the delivered batch can be checked against it (`psdp.check_consistency`).

The tokens come from the prepared stores' zarr3 arrays, read with TensorStore into numpy
(`store_documents`); which document pieces fill which row comes from the mixture's provenance
(`psdp.Mixture.provenance`: the plan, which reads no token). `expected_batch` then lays the
pieces out by the rules of docs/guides/packing.md ("The leaves", "Next-token targets").

    >>> import numpy as np
    >>> documents = {"a": [np.array([5, 6, 7, 0]), np.array([8, 0])]}
    >>> rows = [[["a", 0, 0, 4, 0], ["a", 1, 0, 2, 4]], [["a", 1, 0, 2, 0]]]
    >>> batch = expected_batch(rows, documents, seq_len=8)
    >>> batch["input_ids"].tolist()
    [[5, 6, 7, 0, 8, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0]]
    >>> batch["segment_ids"][0].tolist(), batch["positions"][0].tolist()
    ([1, 1, 1, 1, 2, 2, 0, 0], [0, 1, 2, 3, 0, 1, 0, 0])
    >>> batch["targets"][0].tolist(), batch["loss_mask"][0].tolist()
    ([6, 7, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 1, 0, 0, 0])
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np


def store_documents(store: str | Path) -> list[np.ndarray]:
    """A prepared store's documents, in order, from its parts' zarr3 arrays (TensorStore)."""
    import tensorstore as ts

    def read(path: Path) -> np.ndarray:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
        return ts.open(spec).result().read().result()

    store = Path(store)
    documents = []
    for unit in json.loads((store / "psdp.json").read_text())["units"]:  # in document order
        part = store / "parts" / unit["part"]
        offsets, tokens = read(part / "offsets"), read(part / "tokens" / "input_ids")
        documents += [tokens[a:b] for a, b in pairwise(offsets)]
    return documents


def expected_batch(
    rows: Sequence[Sequence[Sequence[Any]]],
    documents: Mapping[str, Sequence[np.ndarray]],
    seq_len: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """The packed rows (``input_ids``, ``segment_ids``, ``positions``, ``targets``,
    ``loss_mask``) whose segments ``rows`` names, each ``[source, document, start, stop, column]``:
    the document's tokens ``[start, stop)`` from ``column`` on."""
    shape = (len(rows), seq_len)
    out = {
        "input_ids": np.full(shape, pad_id, np.int64),
        "segment_ids": np.zeros(shape, np.int32),
        "positions": np.zeros(shape, np.int32),
        "targets": np.full(shape, pad_id, np.int64),
        "loss_mask": np.zeros(shape, np.uint8),
    }
    for r, segments in enumerate(rows):
        ordered = sorted(segments, key=lambda segment: segment[4])  # column order
        for number, (source, document, start, stop, column) in enumerate(ordered, start=1):
            tokens = np.asarray(documents[source][document][start:stop])
            end = column + len(tokens)
            out["input_ids"][r, column:end] = tokens
            out["segment_ids"][r, column:end] = number
            out["positions"][r, column:end] = np.arange(len(tokens))
            # a target is the next token of the same segment; a segment's last column has none
            out["targets"][r, column : end - 1] = tokens[1:]
            out["loss_mask"][r, column : end - 1] = 1
    return out
