"""`write_dataset` on an object store, where nothing can be renamed: the commit is one object.

A write fills a fresh prefix ``psdp-data-<id>/`` below the dataset, then PUTs ``psdp.json``
naming it: a single PUT is atomic on S3 and GCS, so a reader sees the old dataset or the new one,
never a mix, and objects no ``psdp.json`` names are never read. The PUT is a compare-and-swap:
it carries the generation of the ``psdp.json`` the write saw when it began, and the store itself
refuses it if another write committed since (S3 ``If-Match``/``If-None-Match``, GCS
``ifGenerationMatch``), so of two concurrent writers exactly one commits. Only then is the
replaced dataset's prefix deleted; other prefixes (a write still running elsewhere, or one that
was killed) are left alone. ``docs/guides/object-stores.md``, "Remote stores".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import tensorstore as ts

from psdp.sources.stores.errors import retried_write
from psdp.sources.stores.location import (
    DATA_PREFIX,
    INDEX_DIRECTORY,
    Location,
    list_keys,
    open_kvstore,
    write_not_found,
)
from psdp.sources.stores.tensorstore import METADATA_FILE


def write_remote(
    location: Location,
    overwrite: bool,
    fill: Callable[[Callable[[str], dict[str, Any]]], Any],
    metadata_of: Callable[..., dict[str, Any]],
    schema: Any,
    single: bool,
    layout: dict[str, Any],
    started: list[Any],
) -> None:
    """Writes the rows (``fill``, given each leaf's kvstore) below a fresh prefix, then commits.

    On any failure (Ctrl-C included) waits for the writes in flight (``started`` writers) and
    deletes what this write put there; the dataset that was there stays as it was.
    """
    store = open_kvstore(location)
    before, replaced = _check_target(store, location, overwrite)
    prefix = f"{DATA_PREFIX}{uuid.uuid4().hex[:12]}/"
    try:
        writer = fill(lambda name: location.below(f"{prefix}{name}/"))
        meta = {**metadata_of(schema, writer, single, layout), "data_prefix": prefix}
        _commit(store, location, meta, before)
    except BaseException as error:
        for writer in started:
            writer.wait_for_writes()  # a write landing after the delete would leave objects
        _delete_prefix(store, prefix)
        if isinstance(error, ValueError) and _write_not_found(str(error)):
            # a missing bucket (`write_not_found`), or another writer of the same place that
            # deleted what this one was writing
            raise write_not_found(
                location,
                ", or another write of the same place (a second psdp prepare of one output) "
                "deleted what this one wrote meanwhile (write one output at a time)",
            ) from error
        raise
    if replaced and replaced != prefix:
        _delete_prefix(store, replaced)


def _write_not_found(message: str) -> bool:
    """Whether a TensorStore error is a write answered 404 (``NOT_FOUND: ... Error writing``)."""
    return message.startswith("NOT_FOUND:") and "Error writing " in message


def _check_target(
    store: ts.KvStore, location: Location, overwrite: bool
) -> tuple[bytes, str | None]:
    """Refuses a non-empty location without ``overwrite``, and one holding anything but a psdp
    dataset; returns the generation of ``psdp.json``, the commit's condition (that of a missing
    object if there is none), and the prefix it names (``None`` for none)."""
    got = _read(store, location)  # first: the commit's condition covers
    keys = retried_write(lambda: list_keys(store), f"listing {location.name}")  # the LIST after
    if not keys and got.state != "value":
        return bytes(got.stamp.generation), None
    shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
    if not overwrite:
        raise FileExistsError(
            f"{location.name} already holds {len(keys)} objects ({shown}); pass overwrite=True "
            "to replace a psdp dataset there, or choose a new path"
        )
    ours = (DATA_PREFIX, f"{INDEX_DIRECTORY}/")
    foreign = [k for k in keys if k != METADATA_FILE and not k.startswith(ours)]
    if foreign:
        raise FileExistsError(
            f"refusing to overwrite {location.name}: it is not a psdp dataset (it holds "
            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); delete those "
            "objects yourself or choose a new path"
        )
    if got.state != "value":
        return bytes(got.stamp.generation), None
    try:
        replaced = json.loads(bytes(got.value)).get("data_prefix")
    except (ValueError, AttributeError):
        replaced = None  # damaged metadata: replace it, but delete no prefix on its word
    ok = isinstance(replaced, str) and replaced.startswith(DATA_PREFIX) and replaced.endswith("/")
    return bytes(got.stamp.generation), replaced if ok else None


def _commit(store: ts.KvStore, location: Location, meta: dict[str, Any], before: bytes) -> None:
    """PUTs ``psdp.json`` if it is still at generation ``before``, checked by the store itself in
    the same request; raises if another write committed there since this one began."""
    body = (json.dumps(meta, indent=1) + "\n").encode()
    written = retried_write(
        lambda: store.write(METADATA_FILE.encode(), body, if_equal=before).result(),
        f"writing {METADATA_FILE} of {location.name}",
    )
    if written.generation:
        return
    # The condition failed (an empty generation). A PUT that took effect but whose answer was
    # lost is retried (by TensorStore, or by psdp for an answer cut off mid-way), and then fails
    # its condition against itself: the body, which names this write's own unique prefix, tells
    # the two apart.
    got = _read(store, location)
    if got.state == "value" and bytes(got.value) == body:
        return
    raise FileExistsError(
        f"another write committed to {location.name} while this one ran (its "
        f"{METADATA_FILE} changed after this write began); this write's objects are deleted and "
        "the other dataset is kept. Write to one place from one process at a time, or run this "
        "write again (with overwrite=True) to replace the other one"
    )


def _read(store: ts.KvStore, location: Location) -> Any:
    """The ``psdp.json`` of ``location`` as read now (its value and generation)."""
    return retried_write(
        lambda: store.read(METADATA_FILE.encode()).result(),
        f"reading {METADATA_FILE} of {location.name}",
    )


def _delete_prefix(store: ts.KvStore, prefix: str) -> None:
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    retried_write(
        lambda: store.delete_range(ts.KvStore.KeyRange(prefix, end)).result(),
        f"deleting {prefix}",
    )
