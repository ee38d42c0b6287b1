"""Writes a token cache in the exact layout Levanter's ``TreeCache`` writes (read from its source,
``src/levanter/store/{jagged_array,tree_store,cache}.py``; Levanter itself is not installed): per
leaf a ``JaggedArrayStore``, ``<leaf>/offsets`` (int64) and ``<leaf>/data``, zarr3 arrays of shape
``[2**54]`` in shards of 2**27 entries with inner chunks of 2**18 compressed by blosc; ``offsets[0]``
is the number of documents and ``offsets[1 + d]`` document ``d``'s end, written after the data of
each appended batch; ``shard_ledger.json`` (the ``CacheLedger``) says whether the cache is finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

#: Levanter's DEFAULT_WRITE_CHUNK_SIZE (a shard) and DEFAULT_CHUNK_SIZE (an inner chunk).
SHARD, CHUNK = 256 * 1024 * 512, 256 * 1024


def levanter_spec(kvstore: Any) -> dict[str, Any]:
    """The spec of Levanter's ``_get_spec`` for a 1-D array (``shape[1:]`` empty)."""
    return {
        "driver": "zarr3",
        "kvstore": kvstore,
        "metadata": {
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [SHARD]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [CHUNK],
                        "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}],
                    },
                }
            ],
        },
    }


def _array(kvstore: Any, dtype: Any) -> ts.TensorStore:
    # mode "w" of JaggedArrayStore.open: created 2**54 long, dtype given
    return ts.open(
        levanter_spec(kvstore), dtype=np.dtype(dtype).name, shape=[2**54], create=True,
        delete_existing=True,
    ).result()  # fmt: skip


def write_levanter_cache(
    root: Path | dict[str, Any],
    docs: list[dict[str, np.ndarray]],
    *,
    batches: int = 3,
    finished: bool = True,
    torn_batch: bool = False,
) -> None:
    """``docs`` (dicts of aligned 1-D leaves) as a Levanter cache at ``root`` (a directory, or a
    kvstore spec whose ``path`` ends in ``/``), appended in ``batches`` extends as
    ``JaggedArrayStore.extend`` does; ``finished``: the ledger's ``is_finished``;
    ``torn_batch``: one more batch's data and offsets written but not counted in ``offsets[0]``
    (an extend stopped before its last write)."""
    leaves = list(docs[0])

    def below(name: str) -> Any:
        if isinstance(root, dict):
            return {**root, "path": root["path"] + name + "/"}
        return {"driver": "file", "path": f"{root}/{name}/"}

    for leaf in leaves:
        data = _array(below(f"{leaf}/data"), docs[0][leaf].dtype)
        offsets = _array(below(f"{leaf}/offsets"), np.int64)
        rows, size = 0, 0
        parts = np.array_split(np.arange(len(docs)), batches)
        if torn_batch:
            parts.append(np.arange(2))  # two more documents, never counted
        for part_number, part in enumerate(parts):
            values = [docs[i][leaf] for i in part]
            flat = np.concatenate([v.reshape(-1) for v in values]) if values else []
            ends = size + np.cumsum([v.size for v in values], dtype=np.int64)
            data[size : size + len(flat)].write(np.asarray(flat, data.dtype.numpy_dtype)).result()
            offsets[rows + 1 : rows + 1 + len(part)].write(ends).result()
            if torn_batch and part_number == len(parts) - 1:
                break  # stopped before the count
            offsets[0].write(rows + len(part)).result()
            rows, size = rows + len(part), size + len(flat)
    counted = len(docs)
    ledger = {
        "total_num_rows": counted if finished else counted // 2,
        "shard_rows": {"shard_0": counted // 2, "shard_1": counted - counted // 2},
        "is_finished": finished,
        "finished_shards": ["shard_0", "shard_1"] if finished else ["shard_0"],
        "field_counts": {},
        "metadata": {"preprocessor_metadata": {"tokenizer": "test", "append_eos": True}},
    }
    text = json.dumps(ledger).encode()
    if isinstance(root, dict):
        ts.KvStore.open(root).result().write(b"shard_ledger.json", text).result()
    else:
        (Path(root) / "shard_ledger.json").write_bytes(text)
