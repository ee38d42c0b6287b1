"""The store `prepare` writes: parts, each an ordinary document store committed atomically, listed
in input order by a manifest (``psdp.json``, format `PARTS_FORMAT`) that `DocumentStore.open`
reads as one corpus (``psdp.sources.documents.parts``). ``docs/guides/prepare.md``, "Parts".

The manifest is the store's only commit point, replaced by compare-and-swap (TensorStore's
conditional write, on a local directory as on S3/GCS): it records the key of the settings and
tokenizer, every planned unit with its part's name, and each committed part's counts. A run
resumes by skipping committed parts, appends parts for new input shards, and refuses a key that
differs. A part is one unit's documents, so a store is a function of its inputs and settings,
never of the workers that wrote it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorstore as ts

from psdp.prepare.readers import Unit
from psdp.sources.documents.parts import PARTS_DIRECTORY, PARTS_FORMAT, PARTS_VERSION, index_key
from psdp.sources.documents.store import join_documents
from psdp.sources.stores.errors import is_transient_store_error, retried_write
from psdp.sources.stores.location import (
    DATA_PREFIX,
    Location,
    list_keys,
    locate,
    open_kvstore,
    write_not_found,
)
from psdp.sources.stores.tensorstore import METADATA_FILE

Manifest = dict[str, Any]


@dataclass(frozen=True)
class PartResult:
    """What a task reports of the part it committed (`run_task`)."""

    name: str
    num_documents: int
    num_tokens: int
    leaves: dict[str, str]
    empty: int
    skipped: dict[str, int]
    examples: list[tuple[str, str]]
    input_sha256: str | None = None  # a local input's, by the task of its first rows


#: The file a run holds locked while it writes a local store (one run per output at a time).
LOCK_FILE = ".psdp-prepare.lock"


class Output:
    """The store's place, and its manifest read and replaced by compare-and-swap.

    A local output is also held, from here to `release`, by an exclusive lock on `LOCK_FILE`
    (the kernel drops it when the run ends, killed too): a second run stops before it reads or
    writes anything. On an object store, the compare-and-swap alone stops the run that commits
    second.
    """

    def __init__(self, where: Any):
        self.location: Location = locate(where)
        self.name = self.location.name
        self._lock: Any = None
        if self.location.local is not None:
            root = Path(os.path.abspath(self.location.local))
            root.mkdir(parents=True, exist_ok=True)  # over a file: raises, named by prepare()
            self._hold(root / LOCK_FILE)
            self.store = open_kvstore(Location(None, {"driver": "file", "path": f"{root}/"}, ""))
        else:
            self.store = open_kvstore(self.location)
        self.generation = b""

    @property
    def root(self) -> str | None:
        """The local store's directory, symlinks resolved (``None``: an object store)."""
        if self.location.local is None:
            return None
        return os.path.realpath(self.location.local)

    def _hold(self, path: Path) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: the compare-and-swap alone
            return
        lock = open(path, "a+")  # noqa: SIM115 (held open until release)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise FileExistsError(
                f"another psdp prepare ({holder}) is writing {self.name} now; run one prepare "
                "per output at a time: wait for it to end (the store is then complete; run "
                "this command again to append or check it), or stop that run"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        lock.flush()
        self._lock = lock

    def release(self) -> None:
        """Lets another run write the output (a local lock; a killed run's is dropped too)."""
        if self._lock is not None:
            self._lock.truncate(0)  # a finished store's files are the same, whoever wrote them
            self._lock.close()
            self._lock = None

    def part(self, name: str) -> Any:
        """Where the part ``name`` is written: a local path or a kvstore spec."""
        relative = f"{PARTS_DIRECTORY}/{name}"
        if self.location.local is not None:
            return str(Path(os.path.abspath(self.location.local)) / relative)
        return self.location.below(relative + "/")

    def read(self) -> Manifest | None:
        """The manifest (``None``: no store yet); remembers its generation for `commit`."""
        got = retried_write(
            lambda: self.store.read(METADATA_FILE.encode()).result(), f"reading {self._manifest}"
        )
        self.generation = bytes(got.stamp.generation)
        if got.state != "value":
            keys = [  # a TensorStore lock file is no content: a write was cut short there
                k for k in retried_write(lambda: list_keys(self.store), f"listing {self.name}")
                if not k.startswith(".") and not k.endswith(".__lock")
            ]  # fmt: skip
            if keys:
                raise FileExistsError(
                    f"{self.name} already holds {len(keys)} files and is no psdp prepare store; "
                    "choose a new output, or empty it"
                )
            return None
        try:
            meta = json.loads(bytes(got.value))
        except ValueError as error:  # not JSON, or not UTF-8
            raise ValueError(
                f"{self.name}/{METADATA_FILE}, the manifest of the store, is not valid JSON "
                f"({error}); it was damaged outside psdp (prepare replaces it whole): restore it "
                "from a copy, or prepare into a new output"
            ) from None
        if not isinstance(meta, dict) or meta.get("format") != PARTS_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise FileExistsError(
                f"{self.name} holds another kind of store ({found!r}), not one "
                "psdp prepare wrote; choose a new output"
            )
        return meta

    def commit(self, meta: Manifest) -> None:
        """Replaces the manifest if it is still the one last read or written, else raises."""
        # keys sorted: the same manifest is the same bytes, however it was reached
        body = (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()
        try:
            generation = retried_write(lambda: self._swap(body), f"committing {self._manifest}")
        except ValueError as error:
            if not str(error).startswith("NOT_FOUND:"):
                raise
            raise write_not_found(self.location) from None
        if not generation:
            raise FileExistsError(
                f"another psdp prepare wrote {self.name} while this one ran (its manifest "
                f"{METADATA_FILE} changed since this run read it); run one prepare per output "
                "at a time: this one stops; once the other ends, run it again to resume"
            )
        self.generation = bytes(generation)

    @property
    def _manifest(self) -> str:
        return f"{self.name}/{METADATA_FILE}"

    def _swap(self, body: bytes) -> bytes:
        """The manifest replaced by ``body`` if still at `generation`: the new generation, or
        ``b""`` if another writer changed it. A reply lost in transit is no answer: the write
        may have landed, so the manifest is read back; ``body`` found there is this write's."""
        key = METADATA_FILE.encode()
        try:
            return bytes(self.store.write(key, body, if_equal=self.generation).result().generation)
        except Exception as error:
            if not is_transient_store_error(error):
                raise
            got = self.store.read(key).result()
            if got.state == "value" and bytes(got.value) == body:
                return bytes(got.stamp.generation)
            raise

    def write_index(self, meta: Manifest) -> None:
        """Builds the whole corpus's index (one pass over the parts' offsets) and writes it
        where ``meta`` will name it."""
        names = [u["part"] for u in meta["units"] if meta["parts"][u["part"]]["num_documents"]]
        store = join_documents([self.part(n) for n in names], name=self.name)
        body = io.BytesIO()
        store.index.save(body)
        retried_write(
            lambda: self.store.write(meta["index"].encode(), body.getvalue()).result(),
            f"writing {self.name}/{meta['index']}",
        )

    def clean(self, meta: Manifest) -> None:
        """Deletes what a killed run left and no manifest names: another size's index; parts of
        an append given up; a local part's staging directory, and an object store part's data
        prefixes (``psdp-data-*/``) that its own ``psdp.json`` does not name (a write cut off).
        The parts a manifest names are overwritten."""
        for key in retried_write(lambda: self.store.list().result(), f"listing {self.name}"):
            name = key.decode()
            if name.startswith("index-") and name != meta.get("index"):
                doomed = ts.KvStore.KeyRange(name, name + "\0")
                retried_write(
                    lambda doomed=doomed: self.store.delete_range(doomed).result(),  # type: ignore[misc]
                    f"deleting {name}",
                )  # fmt: skip
        named = {u["part"] for u in [*meta["units"], *meta.get("append", {}).get("units", [])]}
        if self.location.local is None:
            self._clean_remote_parts(named)
        else:
            parts = Path(os.path.abspath(self.location.local)) / PARTS_DIRECTORY
            for leftover in parts.iterdir() if parts.is_dir() else ():
                if leftover.name in named:
                    continue
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)

    def _clean_remote_parts(self, named: set[str]) -> None:
        """On an object store, where a part is written below a fresh ``psdp-data-*/`` prefix and
        committed by its ``psdp.json`` (``psdp.sources.stores.remote``): deletes every part not
        ``named``, and each named part's prefixes other than the one its ``psdp.json`` names.
        Run with no task of this run in flight; a run writing the output at the same time loses
        only parts it has not committed to the manifest (its next commit fails), which the run
        that commits redoes."""
        below = f"{PARTS_DIRECTORY}/"
        keys = retried_write(
            lambda: self.store.list(_prefix_range(below)).result(), f"listing {self.name}/{below}"
        )
        prefixes: dict[str, set[str]] = {}  # part -> its data prefixes
        for key in keys:
            part, _, rest = key.decode()[len(below) :].partition("/")
            found = prefixes.setdefault(part, set())
            if rest.startswith(DATA_PREFIX) and "/" in rest:
                found.add(rest[: rest.index("/") + 1])
        for part, found in prefixes.items():
            if part in named:
                doomed = [f"{below}{part}/{p}" for p in sorted(found - {self._data_prefix(part)})]
            else:
                doomed = [f"{below}{part}/"]
            for prefix in doomed:
                retried_write(
                    lambda prefix=prefix: self.store.delete_range(_prefix_range(prefix)).result(),  # type: ignore[misc]
                    f"deleting {self.name}/{prefix}",
                )  # fmt: skip

    def _data_prefix(self, part: str) -> str | None:
        """The data prefix a remote part's ``psdp.json`` names (``None``: none, or unreadable: a
        part not committed, whose objects all go)."""
        key = f"{PARTS_DIRECTORY}/{part}/{METADATA_FILE}".encode()
        got = retried_write(lambda: self.store.read(key).result(), f"reading {self.name}/{key!r}")
        if got.state != "value":
            return None
        try:
            prefix = json.loads(bytes(got.value)).get("data_prefix")
        except (ValueError, AttributeError):
            return None
        return prefix if isinstance(prefix, str) else None


def _prefix_range(prefix: str) -> Any:
    """The keys that start with ``prefix`` (which ends in ``/``)."""
    return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


def recorded(unit: Unit, root: str | None) -> dict[str, Any]:
    """What a store at ``root`` (`Output.root`) records of ``unit``: its file, rows and version,
    a local file by its path relative to a local store (both with symlinks resolved), so that
    moving, copying or linking a folder that holds both keeps every input the same."""
    identity = dict(unit.identity)
    if root is not None and unit.kvstore is None:
        identity["file"] = os.path.relpath(os.path.realpath(unit.path), root)
    return identity


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a local file's bytes, read 8 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            digest.update(block)
    return digest.hexdigest()


def paired(
    meta: Mapping[str, Any], units: list[Unit], root: str | None
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """Each committed unit of the store (``meta["units"]``, in order) paired with the unit of
    ``units`` that is the same input, or ``None``; and the units of ``units`` paired with none.

    The same input: the same recorded file and rows; or, for a file moved apart from the store
    (its relative path changed), the same rows and size and the same bytes (the sha256 its part
    recorded). An absolute path recorded by an older psdp counts as its relative path.
    """
    free = {unit_id(i): (i, u) for u in units for i in [recorded(u, root)]}
    pairs: list[dict[str, Any] | None] = []
    for unit in meta["units"]:
        file = unit["file"]
        if root is not None and os.path.isabs(file):
            file = os.path.relpath(file, root)
        found = free.pop(unit_id({**unit, "file": file}), None)
        pairs.append(None if found is None else found[0])
    hashes = {}  # by recorded file: the sha256 the part of its first rows recorded
    for unit in meta["units"]:
        part = meta["parts"].get(unit["part"]) or {}
        if part.get("input_sha256"):
            hashes[unit["file"]] = part["input_sha256"]
    for i, unit in enumerate(meta["units"]):
        if pairs[i] is not None or unit["file"] not in hashes:
            continue
        for key, (identity, candidate) in list(free.items()):
            if (
                identity["rows"] == unit["rows"]
                and identity.get("bytes") == unit.get("bytes")
                and identity["version"] == unit["version"]
                and candidate.kvstore is None
                and _sha256_of(candidate.path) == hashes[unit["file"]]
            ):
                pairs[i] = identity
                del free[key]
                break
    return pairs, [identity for identity, _ in free.values()]


def _sha256_of(path: str) -> str:
    stat = os.stat(path)  # a file rewritten in place is hashed again
    return _cached_sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=256)
def _cached_sha256(path: str, *stamp: int) -> str:
    return file_sha256(path)


def stale_inputs(meta: Mapping[str, Any], units: list[Unit], root: str | None) -> str:
    """How ``units`` differ from the complete store's inputs ('' if they are its inputs)."""
    pairs, added = paired(meta, units, root)
    for unit, pair in zip(meta["units"], pairs, strict=True):
        if pair is None:
            return f"it holds inputs the config does not name ({shown(unit['file'], root)})"
        if pair["version"] != unit["version"]:
            return f"the input {shown(pair['file'], root)} changed since it was prepared"
    if added:
        return f"the input {shown(added[0]['file'], root)} is not in it"
    return ""


def shown(file: str, root: str | None) -> str:
    """A recorded file as messages name it: a local one by its path, not relative to the store."""
    if root is None or "://" in file or os.path.isabs(file):
        return file
    return os.path.normpath(os.path.join(root, file))


def planned(
    meta: Manifest | None,
    units: list[Unit],
    key: Mapping[str, Any],
    name: str,
    root: str | None = None,
) -> Manifest:
    """The manifest for ``units`` under ``key``: a new one, or ``meta`` with the units it lacks
    planned after its own; refuses another key, and a changed or left out input of a complete
    store.

    Work not committed as a complete store is planned again from this run's inputs: a part is
    kept when its unit (file, rows and version) and its name are the same. A complete store's
    new units go to an ``append`` section of the manifest, which readers ignore: until the
    append completes, the store reads as it was (and a failed append can be run again with the
    input fixed, or given up by naming only the store's own inputs).
    """
    if made_uncut(meta):  # its own cut: ``units`` are planned as it was (`made_uncut`)
        key = {k: v for k, v in key.items() if k != "bytes_per_part"}
    if meta is None:
        meta = {"format": PARTS_FORMAT, "version": PARTS_VERSION, "key": dict(key), "units": [],
                "parts": {}, "complete": False}  # fmt: skip
    elif meta.get("key") == {**dict(key), "skip_bad": False} and key["skip_bad"]:
        # a rerun with skip_bad, as a malformed record's error advises: the parts committed
        # without it met no malformed record, so they are the parts skip_bad writes
        meta = {**meta, "key": dict(key)}
    elif meta.get("key") != dict(key):
        raise ValueError(_key_mismatch(meta.get("key") or {}, key, name))
    complete = bool(meta.get("complete"))
    work = meta.get("append", {"units": [], "parts": {}}) if complete else meta
    base: list[dict[str, Any]] = []
    pairs, added = (
        paired(meta, units, root) if complete else ([], [recorded(u, root) for u in units])
    )
    for unit, pair in zip(meta["units"] if complete else [], pairs, strict=True):
        if pair is None:
            raise ValueError(
                f"{name} holds the input {shown(unit['file'], root)} (rows {unit['rows']}), "
                "which this run does not name; name every input of the store (new inputs are "
                "appended), or prepare into a new output"
            )
        if pair["version"] != unit["version"]:
            raise ValueError(
                f"the input {shown(pair['file'], root)} changed since it was prepared into "
                f"{name} (size or version {unit['version']} then, {pair['version']} now); "
                "prepare into a new output"
            )
        base.append({**unit, "file": pair["file"]})  # recorded as now named: moved, it follows
    if complete:
        meta = {**meta, "units": base}
    before = {unit_id(u): u for u in work["units"]}
    planned_units, parts = [], {}
    for i, unit in enumerate(added):
        part = f"{len(base) + i:06d}"
        old = before.get(unit_id(unit))
        same = old is not None and old["version"] == unit["version"] and old["part"] == part
        planned_units.append({**unit, "part": part})
        parts[part] = work["parts"][part] if same else None
    if complete:
        rest = {k: v for k, v in meta.items() if k != "append"}
        return {**rest, "append": {"units": planned_units, "parts": parts}} if parts else rest
    return {**meta, "units": planned_units, "parts": parts}


def made_uncut(meta: Mapping[str, Any] | None) -> bool:
    """Whether ``meta`` is the manifest of a store that a psdp before byte ranges made (its key
    has no ``bytes_per_part``): it read every jsonl file and every object whole, and so do the
    runs that resume, append to or check it (``plan_units(..., None, cut_objects=False)``), so
    that its units stay the same."""
    key = None if meta is None else meta.get("key")
    return isinstance(key, Mapping) and "bytes_per_part" not in key


def with_part(meta: Manifest, result: PartResult) -> Manifest:
    """``meta`` with the part ``result`` committed."""
    leaves = meta.get("leaves")
    if result.num_documents and leaves is not None and leaves != result.leaves:
        raise ValueError(
            f"part {result.name} has leaves {result.leaves}, the store {leaves}; this is a bug"
        )
    counts = {
        "num_documents": result.num_documents,
        "num_tokens": result.num_tokens,
        "empty": result.empty,
        "skipped": result.skipped,
        "examples": [list(e) for e in result.examples],
    }
    if result.input_sha256 is not None:
        counts["input_sha256"] = result.input_sha256
    if meta.get("complete"):  # an append's part
        work = meta["append"]
        new = {**meta, "append": {**work, "parts": {**work["parts"], result.name: counts}}}
    else:
        new = {**meta, "parts": {**meta["parts"], result.name: counts}}
    if result.num_documents and leaves is None:
        new["leaves"] = result.leaves
    return new


def pending(meta: Manifest) -> list[dict[str, Any]]:
    """The planned units whose part is not committed, in order."""
    work = meta.get("append", {"units": [], "parts": {}}) if meta.get("complete") else meta
    return [u for u in work["units"] if work["parts"][u["part"]] is None]


def finished(meta: Manifest) -> Manifest:
    """``meta`` complete: every part committed (an append's joined to the store's); the
    corpus's counts and index named."""
    append = meta.get("append", {"units": [], "parts": {}})
    meta = {k: v for k, v in meta.items() if k != "append"}
    meta["units"] = meta["units"] + append["units"]
    meta["parts"] = {**meta["parts"], **append["parts"]}
    parts = [meta["parts"][u["part"]] for u in meta["units"]]
    documents = sum(p["num_documents"] for p in parts)
    if documents == 0:
        skipped: dict[str, int] = {}
        for part in parts:
            for reason, count in part["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + count
        found = [f"{sum(p['empty'] for p in parts):,} empty"]
        found += [f"{count:,} x {reason}" for reason, count in sorted(skipped.items())]
        examples = [f"e.g. {where}: {why}" for p in parts for where, why in p["examples"]][:3]
        raise ValueError(
            f"every record of the inputs was empty or skipped ({'; '.join(found)}"
            f"{'; ' if examples else ''}{'; '.join(examples)}): no document to store; check the "
            "field name (field=, --field) and the records"
        )
    done = {
        **{k: v for k, v in meta.items() if k != "written"},
        "complete": True,
        "num_documents": documents,
        "num_tokens": sum(p["num_tokens"] for p in parts),
        "index": index_key(documents),
    }
    # what this commit (an append's too) holds: the settings and tokenizer, each input by its
    # content and each part's counts; the indexes beside the store record it (``beside.py``)
    body = json.dumps(done, sort_keys=True).encode()
    return {**done, "written": f"sha256:{hashlib.sha256(body).hexdigest()}"}


def unit_id(identity: Mapping[str, Any]) -> str:
    """A unit's key in a manifest: its recorded file and rows (and bytes, for a jsonl range)."""
    if "bytes" in identity:
        return json.dumps([identity["file"], identity["rows"], identity["bytes"]])
    return json.dumps([identity["file"], identity["rows"]])


def _key_mismatch(had: Mapping[str, Any], key: Mapping[str, Any], name: str) -> str:
    differ = sorted(k for k in {*had, *key} if had.get(k) != key.get(k))
    shown = "; ".join(f"{k}: {had.get(k)!r} there, {key.get(k)!r} now" for k in differ)
    return (
        f"{name} was prepared with other settings ({shown}); a store holds one tokenizer and "
        "one set of settings: prepare into a new output, or rerun with the store's settings"
    )
