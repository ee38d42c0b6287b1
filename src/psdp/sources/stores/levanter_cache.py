"""A Levanter token cache on disk, its arrays opened and checked (``docs/guides/tokens.md``;
``documents/levanter.py`` makes them a `DocumentStore`).

A Levanter cache directory (one split of a ``TreeCache``, e.g. ``<cache_dir>/train``) holds a
``JaggedArrayStore`` per leaf: ``<leaf>/data``, the leaf's values back to back, and
``<leaf>/offsets``, whose entry 0 is the number of documents D and entry ``1 + d`` document
``d``'s end. Both are zarr3 arrays allocated ``2**54`` entries long, written ahead of the count
(an append writes its data and ends, then the count). ``shard_ledger.json`` says
``is_finished`` once every input shard is in. psdp reads the counted part only, by range:
offsets ``[0, ends[1:D + 1]]`` and each leaf ``[:ends[D]]``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorstore as ts

from psdp.sources.stores.location import Location, list_keys, locate, open_kvstore
from psdp.sources.stores.tensorstore import METADATA_FILE

#: The file Levanter's ``CacheLedger`` is saved in, at the cache directory's root.
LEDGER_FILE = "shard_ledger.json"
#: Levanter's cache builder: it writes ``<cache_dir>/train`` and ``<cache_dir>/validation``.
LEVANTER_BUILDER = "python -m levanter.main.cache_dataset --config_path <config.yaml>"


def open_cache_arrays(
    path: str | os.PathLike[str] | Mapping[str, Any], names: tuple[str, ...]
) -> tuple[ts.TensorStore, dict[str, ts.TensorStore], str, str]:
    """The used offsets of the finished cache at ``path``, its leaves ``names`` (the first, the
    token ids, counts the documents) cut to their used part, its name for messages, and what
    this build of the cache is: ``levanter-ledger:<sha256 of its ledger's bytes>`` (Levanter
    writes the ledger last, with every shard's rows: a cache built again has another)."""
    location = locate(path)
    base = _base_spec(location)
    kvstore = _kvstore(location, base)
    ledger, written = _ledger(location, kvstore)
    context = ts.Context()
    offsets = {leaf: _open(location, base, kvstore, leaf, "offsets", context) for leaf in names}
    data = {leaf: _open(location, base, kvstore, leaf, "data", context) for leaf in names}
    count = int(offsets[names[0]][0].read().result())
    rows = ledger.get("total_num_rows")
    if count != rows:
        raise ValueError(
            f"the Levanter cache at {location.name} counts {count} documents in "
            f"{names[0]}/offsets[0], but its {LEDGER_FILE} says total_num_rows={rows!r}: the "
            f"cache is damaged or still being written; build it again with `{LEVANTER_BUILDER}`"
        )
    end = int(offsets[names[0]][count].read().result()) if count else 0
    for leaf in names[1:]:
        its = offsets[leaf][0].read().result(), offsets[leaf][count].read().result()
        if [int(its[0]), int(its[1]) if count else 0] != [count, end]:
            raise ValueError(
                f"leaf {leaf!r} of the Levanter cache at {location.name} holds {int(its[0])} "
                f"documents ending at {int(its[1])}, but {names[0]} holds {count} ending at "
                f"{end}: it is not one value per token; read it on its own, or leave it out"
            )
    # entry 0 is the count: the used offsets are a 0 then the ends of documents 0..D-1
    used = ts.concat([ts.array(np.zeros(1, np.int64)), offsets[names[0]][1 : count + 1]], 0)
    flat = {leaf: data[leaf][:end] for leaf in names}
    return used, flat, f"Levanter cache {location.name}", written


def is_levanter_cache(path: str | os.PathLike[str] | Mapping[str, Any]) -> bool:
    """Whether ``path`` holds a Levanter cache's ledger (finished or not)."""
    location = locate(path)
    if location.local is not None:
        return (location.local / LEDGER_FILE).is_file()
    found = _kvstore(location, _base_spec(location)).read(LEDGER_FILE.encode()).result()
    return found.state == "value"


def _base_spec(location: Location) -> dict[str, Any]:
    """The kvstore spec of the cache directory (its ``path`` ends in ``/``)."""
    if location.local is None:
        return location.below("")
    return {"driver": "file", "path": f"{os.path.abspath(location.local)}/"}


def _kvstore(location: Location, base: dict[str, Any]) -> ts.KvStore:
    if location.local is None:
        return open_kvstore(location)
    return ts.KvStore.open(base).result()


def _ledger(location: Location, kvstore: ts.KvStore) -> tuple[dict[str, Any], str]:
    """The cache's ledger, refused unless it says the cache is finished, and its identity."""
    got = kvstore.read(LEDGER_FILE.encode()).result()
    if got.state != "value":
        if kvstore.read(METADATA_FILE.encode()).result().state == "value":
            raise ValueError(
                f"{location.name} is a psdp store ({METADATA_FILE}), not a Levanter cache (no "
                f"{LEDGER_FILE}); open it with DocumentStore.open (in a DataConfig source: "
                "format: psdp, the default)"
            )
        raise FileNotFoundError(
            f"there is no Levanter cache at {location.name}: it has no {LEDGER_FILE}; build it "
            f"with Levanter's cache builder, `{LEVANTER_BUILDER}`, and name the split directory "
            "it writes (<cache_dir>/train or <cache_dir>/validation)"
        )
    try:
        ledger = json.loads(bytes(got.value))
    except ValueError:
        ledger = None
    if not isinstance(ledger, dict):
        raise ValueError(
            f"the {LEDGER_FILE} of the Levanter cache at {location.name} is not a JSON object; "
            f"the cache is damaged: build it again with `{LEVANTER_BUILDER}`"
        )
    if ledger.get("is_finished") is not True:
        done, shards = len(ledger.get("finished_shards") or []), len(ledger.get("shard_rows") or {})
        raise ValueError(
            f"the Levanter cache at {location.name} is unfinished: its {LEDGER_FILE} says "
            f"is_finished={ledger.get('is_finished')!r} ({done} of {shards} shards finished, "
            f"{ledger.get('total_num_rows')!r} documents so far); let Levanter's cache builder "
            f"finish it (run `{LEVANTER_BUILDER}` again: it resumes), then open it"
        )
    return ledger, "levanter-ledger:" + hashlib.sha256(bytes(got.value)).hexdigest()


def _open(
    location: Location,
    base: dict[str, Any],
    kvstore: ts.KvStore,
    leaf: str,
    part: str,
    context: ts.Context,
) -> ts.TensorStore:
    """``<leaf>/<part>`` of the cache (``base``, opened as ``kvstore``): a 1-D zarr3 array."""
    spec = {**base, "path": base["path"] + f"{leaf}/{part}/"}
    try:
        array = ts.open(
            {"driver": "zarr3", "kvstore": spec}, read=True, open=True, context=context
        ).result()
    except ValueError as error:
        if "NOT_FOUND" not in str(error):
            raise ValueError(
                f"cannot open {leaf}/{part} of the Levanter cache at {location.name}: {error}; "
                f"the cache is damaged: build it again with `{LEVANTER_BUILDER}`"
            ) from error
        found = [
            key.removesuffix("/offsets/zarr.json")
            for key in list_keys(kvstore)
            if key.endswith("/offsets/zarr.json")
        ]
        raise ValueError(
            f"the Levanter cache at {location.name} has no leaf {leaf!r} (no {leaf}/{part}); "
            f"its leaves are {sorted(found)}; choose among those"
        ) from None
    if array.rank != 1 or list_keys(kvstore, f"{leaf}/shapes/"):
        raise ValueError(
            f"leaf {leaf!r} of the Levanter cache at {location.name} holds arrays of rank > 1 "
            f"({leaf}/shapes): psdp reads flat per-token leaves; leave it out"
        )
    return array
