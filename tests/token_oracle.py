"""The token oracle: documents concatenated with numpy and split into rows, written without
psdp's token code (never its offsets, ids or positions)."""

from __future__ import annotations

import numpy as np


def documents(seed: int, count: int, mean: int, high: int = 60_000) -> list[np.ndarray]:
    """``count`` uint16 documents of random lengths (at least 1, about ``mean``)."""
    rng = np.random.default_rng(seed)
    lengths = 1 + rng.poisson(mean - 1, count)
    return [rng.integers(3, high, n).astype(np.uint16) for n in lengths]


def stream(docs, eos_id=None) -> dict[str, np.ndarray]:
    """Every leaf of the documents back to back (EOS after each), plus segment ids (document
    number + 1) and positions, built one document at a time. An empty document contributes no
    token, no EOS either (docs/guides/tokens.md), but keeps its number."""
    leaves: dict[str, list[np.ndarray]] = {"segment_ids": [], "positions": []}
    for d, doc in enumerate(docs):
        doc = doc if isinstance(doc, dict) else {"input_ids": doc}
        if not len(doc["input_ids"]):
            continue
        n = len(doc["input_ids"]) + (eos_id is not None)
        for name, values in doc.items():
            extra = [] if eos_id is None else [eos_id if name == "input_ids" else 0]
            leaves.setdefault(name, []).append(
                np.concatenate([values, np.array(extra, values.dtype)])
            )
        leaves["segment_ids"].append(np.full(n, d + 1, np.int32))
        leaves["positions"].append(np.arange(n, dtype=np.int32))
    leaves.setdefault("input_ids", [])
    return {k: np.concatenate(v) if v else np.zeros(0, np.int32) for k, v in leaves.items()}


def rows(docs, seq_len: int, targets: bool = False, eos_id=None) -> dict[str, np.ndarray]:
    """Row r of every leaf: stream[r*seq_len : r*seq_len + seq_len (+1)], whole rows only."""
    flat = stream(docs, eos_id)
    width = seq_len + int(targets)
    n = max(0, (len(flat["input_ids"]) - int(targets)) // seq_len)
    return {
        k: np.array([v[r * seq_len : r * seq_len + width] for r in range(n)], v.dtype)
        for k, v in flat.items()
    }


def continued_rows(
    docs, seq_len: int, shards: int, halo: int, pad_id: int, targets=False, eos_id=None
) -> dict[str, np.ndarray]:
    """Rows as the loader delivers them with a ``continue`` halo: each of ``shards`` column
    shards widened by ``halo`` stream tokens on each side (the neighbouring rows' tokens), and
    ``pad_id`` (0 for the other leaves) beyond the stream's ends."""
    flat = stream(docs, eos_id)
    width = seq_len + int(targets)
    n = (len(flat["input_ids"]) - int(targets)) // seq_len
    w = width // shards
    out = {}
    for name, values in flat.items():
        fill = pad_id if name == "input_ids" else 0
        padded = np.concatenate(
            [np.full(halo, fill, values.dtype), values, np.full(width + halo, fill, values.dtype)]
        )
        out[name] = np.stack([
            np.concatenate([padded[r * seq_len + c * w : r * seq_len + (c + 1) * w + 2 * halo] for c in range(shards)])
            for r in range(n)
        ])  # fmt: skip
    return out
