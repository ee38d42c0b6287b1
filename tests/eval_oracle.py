"""The eval oracle: one pass over a source's rows in order, written from docs/guides/evaluate.md ("Finite
loaders: evaluation") with plain numpy, never psdp's order, offsets or padding code."""

from __future__ import annotations

import numpy as np


def eval_batches(
    rows: dict[str, np.ndarray], batch_size: int, batch_shards: int, pad_value=0
) -> list[dict[str, np.ndarray]]:
    """Every batch of one pass: batch ``k`` holds rows ``k*B .. min((k+1)*B, N) - 1`` in order,
    then ``pad_value`` rows up to the physical batch (``B`` rounded up to a multiple of the batch
    shards), and a ``mask`` leaf that is ``True`` exactly on the real rows."""
    n = len(next(iter(rows.values())))
    physical = -(-batch_size // batch_shards) * batch_shards
    batches = []
    for first in range(0, n, batch_size):
        real = min(batch_size, n - first)
        batch = {}
        for key, values in rows.items():
            leaf = np.full((physical, *values.shape[1:]), pad_value, values.dtype)
            leaf[:real] = values[first : first + real]
            batch[key] = leaf
        batch["mask"] = np.arange(physical) < real
        batches.append(batch)
    return batches
