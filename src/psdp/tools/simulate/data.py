"""The rows of ``psdp simulate``: synthetic tokens a bigram model can learn, and a source's main
leaf (``docs/reference/cli.md``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from psdp._plan.leaves import Key

_MULTIPLIER, _INCREMENT = 5, 3  # a full-period rule mod any power of two


def synthetic_tokens(ids: np.ndarray, seq_len: int, vocab: int) -> np.ndarray:
    """The synthetic rows ``ids``: row ``r`` starts at ``7919 r mod vocab`` and follows the rule.

    Examples:
        >>> synthetic_tokens(np.array([0, 1]), seq_len=4, vocab=64).tolist()
        [[0, 3, 18, 29], [47, 46, 41, 16]]
    """
    tokens = np.empty((len(ids), seq_len), np.int32)
    tokens[:, 0] = (np.asarray(ids, np.int64) * 7919) % vocab
    for column in range(1, seq_len):
        tokens[:, column] = (tokens[:, column - 1] * _MULTIPLIER + _INCREMENT) % vocab
    return tokens


def synthetic_documents(count: int, seq_len: int, vocab: int) -> list[np.ndarray]:
    """``count`` documents of 1 to ``2 * seq_len`` tokens (a fixed draw): document ``d`` is the
    start of synthetic row ``d``, so a bigram model learns them as it learns the rows.

    Examples:
        >>> [d.tolist() for d in synthetic_documents(2, seq_len=4, vocab=64)]
        [[0, 3, 18, 29, 20, 39, 6], [47, 46, 41, 16, 19, 34]]
    """
    lengths = np.random.default_rng(0).integers(1, 2 * seq_len + 1, count)
    rows = synthetic_tokens(np.arange(count), 2 * seq_len, vocab)
    return [row[:n] for row, n in zip(rows, lengths, strict=True)]


def packed_source(count: int, seq_len: int, vocab: int, strategy: str) -> Any:
    """`synthetic_documents` packed into sequences of ``seq_len``: a `psdp.PackedSequences`."""
    from psdp import DocumentStore, PackedSequences

    store = DocumentStore.from_documents(synthetic_documents(count, seq_len, vocab))
    return PackedSequences(store, seq_len, strategy)


def is_document_store(path: str) -> bool:
    """Whether ``path`` holds a document store (`psdp.write_documents`), not a dataset of rows."""
    from psdp.sources.documents.format import DOCUMENTS_FORMAT
    from psdp.sources.stores.tensorstore import METADATA_FILE

    try:
        meta = json.loads((Path(path) / METADATA_FILE).read_text())
    except (OSError, ValueError):  # no metadata file, or not JSON: not a store
        return False
    return isinstance(meta, dict) and meta.get("format") == DOCUMENTS_FORMAT


def open_source(path: str, seq_len: int, packing: str | None) -> Any:
    """The source at ``path``: a document store read through its token view (`TokenSequences`
    of ``seq_len``, or `PackedSequences` with the ``packing`` strategy), else the dataset or
    ``.npy`` file `psdp.LoaderConfig.open_source` opens."""
    from psdp import DocumentStore, LoaderConfig, PackedSequences, TokenSequences

    if not is_document_store(path):
        return LoaderConfig(source=path).open_source()
    store = DocumentStore.open(path)
    if packing is None:
        return TokenSequences(store, seq_len)
    return PackedSequences(store, seq_len, packing)


def describe_store(path: str, seq_len: int, packing: str | None) -> str:
    """How the report names a document store and its view.

    Examples:
        >>> describe_store("docs", 16, None), describe_store("docs", 16, "greedy")
        ('the document store docs, read as TokenSequences of 16 tokens', 'the document store docs, packed (greedy) into sequences of 16 tokens')
    """
    view = (
        f"read as TokenSequences of {seq_len} tokens"
        if packing is None
        else f"packed ({packing}) into sequences of {seq_len} tokens"
    )
    return f"the document store {path}, {view}"


def write_synthetic(path: str, rows: int, seq_len: int, vocab: int) -> None:
    """Writes ``rows`` synthetic rows as a dataset with one leaf, ``tokens``."""
    from psdp.sources.stores.writer import write_dataset

    tokens = synthetic_tokens(np.arange(rows), seq_len, vocab)
    write_dataset(path, {"tokens": tokens}, rows_per_shard=256, progress=False)


def main_leaf(leaves: dict[Key, Any], mask_key: str = "mask") -> tuple[Key, Any]:
    """The leaf the model trains on and the picture shows: ``tokens``, else the first other.

    Examples:
        >>> main_leaf({"mask": 1, "ids": 2, "w": 3})
        ('ids', 2)
    """
    name = "tokens" if "tokens" in leaves else next(k for k in leaves if k != mask_key)
    return name, leaves[name]
