"""The indexes kept beside a document store: built once (``psdp index``, ``psdp prepare --pack``),
found and checked by every host that opens the store through a `DataConfig`
(``docs/guides/packing.md``, "The pack index beside the store").

Layout, below the store (a psdp store or a Levanter cache, local or in an object store)::

    psdp-index/documents.npz           the store's DocumentIndex (a Levanter cache has none)
    psdp-index/pack-<settings>.npz     a PackIndex per packing (`PackSettings.file_name`)
    psdp-index/length-<bounds>.npz     a selection by length (`LengthBounds.file_name`), whose
    psdp-index/length-<bounds>-<store>/  blocks of selected documents it names
    psdp-index/.build-<name>-<store>/  the finished parts of a build in progress (resume)

Each file is written whole, in one commit (a local file renamed into place; one PUT on an object
store), so a reader sees no file or a whole one. A pack index records the store it was built
for (`store_digest`: the store's size, its document index, which every host holds anyway, and
the identity of the write that made it), so an index of another store, or of this store
before it changed, is refused, never used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psdp._checks import check_int
from psdp._plan.pack_windows import PackKey
from psdp._plan.packing import check_packing_options
from psdp.sources.documents.index import DocumentIndex

#: The document index's file in it (for a store that has none of its own: a Levanter cache).
DOCUMENT_INDEX = "documents.npz"
#: A store of at most this many documents whose index is missing builds it in memory at
#: start-up, on every host (a pack index: about 1 s of one core at this size, measured in
#: ``docs/measurements/scale.md``); a larger one is refused, naming the command that builds it.
IN_MEMORY_DOCUMENTS = 1 << 20


@dataclass(frozen=True)
class PackSettings:
    """A packing in windows, as a pack index is built for it: ``PackedSequences(store, seq_len,
    strategy, long_documents, seed=seed, window=window, max_segments=max_segments)``, with an
    EOS slot after every non-empty document if ``eos`` (any ``eos_id``: the id does not change
    the plan).

    Examples:
        >>> settings = PackSettings.parse("4096,64")
        >>> settings.file_name, settings.flags()
        ('pack-4096-64-best_fit-split-noseed.npz', '--pack 4096,64')
        >>> PackSettings(2048, 4096, "greedy", seed=3, eos=True).flags()
        '--pack 2048,4096 --strategy greedy --seed 3 --pack-eos'
        >>> capped = PackSettings(4096, 64, "greedy", max_segments=64)
        >>> capped.file_name, capped.flags()
        ('pack-4096-64-greedy-split-noseed-max64.npz', '--pack 4096,64 --strategy greedy --max-segments 64')
    """

    seq_len: int
    window: int
    strategy: str = "best_fit"
    long_documents: str = "split"
    seed: int | None = None
    eos: bool = False
    max_segments: int | None = None

    def __post_init__(self) -> None:
        check_int("window", self.window, minimum=1)
        check_packing_options(
            self.seq_len, self.strategy, self.long_documents, self.seed, self.max_segments
        )
        if not isinstance(self.eos, bool):
            raise TypeError(f"eos must be a bool (an EOS slot or none), got {self.eos!r}")

    @classmethod
    def parse(cls, text: str, **options: Any) -> PackSettings:
        """``"SEQ_LEN,WINDOW"`` (``--pack 4096,64``) with the other settings as keywords."""
        try:
            seq_len, window = (int(part) for part in text.split(","))
        except ValueError:
            raise ValueError(
                f"{text!r} must be two integers SEQ_LEN,WINDOW (tokens per sequence, "
                "documents per window), e.g. --pack 4096,4096"
            ) from None
        return cls(seq_len, window, **options)

    def key(self, num_documents: int, num_tokens: int) -> PackKey:
        """The `PackKey` of this packing of a store of that size."""
        return PackKey(self.seq_len, self.strategy, self.long_documents, self.seed, self.window,
                       num_documents, num_tokens, eos=self.eos,
                       max_segments=self.max_segments)  # fmt: skip

    @property
    def file_name(self) -> str:
        """The pack index's file in ``psdp-index/``: named by the settings, not the store's
        size, so that an index left from before the store grew is found, and refused."""
        seed = "noseed" if self.seed is None else f"seed{self.seed}"
        eos = "-eos" if self.eos else ""
        cap = "" if self.max_segments is None else f"-max{self.max_segments}"
        return (f"pack-{self.seq_len}-{self.window}-{self.strategy}-{self.long_documents}-"
                f"{seed}{eos}{cap}.npz")  # fmt: skip

    def flags(self) -> str:
        """The ``psdp index`` flags that build this packing's index."""
        words = [f"--pack {self.seq_len},{self.window}"]
        if self.strategy != "best_fit":
            words.append(f"--strategy {self.strategy}")
        if self.long_documents != "split":
            words.append(f"--long-documents {self.long_documents}")
        if self.seed is not None:
            words.append(f"--seed {self.seed}")
        if self.eos:
            words.append("--pack-eos")
        if self.max_segments is not None:
            words.append(f"--max-segments {self.max_segments}")
        return " ".join(words)


@dataclass(frozen=True)
class LengthBounds:
    """A selection of a store's documents by length: those of at least ``min_length`` and at
    most ``max_length`` tokens (both inclusive; ``None``: no bound on that side), as a length
    index is built for it (``psdp index --min-length N``) and a `DataConfig` source names it.

    Examples:
        >>> bounds = LengthBounds(min_length=8192)
        >>> bounds.file_name, bounds.flags(), bounds.fields()
        ('length-8192-any.npz', '--min-length 8192', 'min_length=8192')
        >>> LengthBounds(max_length=100).selects(np.array([0, 5, 100, 101])).tolist()
        [True, True, True, False]
    """

    min_length: int | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_length", "max_length"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=0)
        if self.min_length is None and self.max_length is None:
            raise ValueError(
                "a length selection needs min_length or max_length (tokens, inclusive), got "
                "neither; e.g. min_length=8192"
            )
        low, high = self.min_length or 0, self.max_length
        if high is not None and high < low:
            raise ValueError(
                f"max_length={high} is below min_length={low}: no document could be selected; "
                "give max_length >= min_length (both inclusive)"
            )

    def selects(self, lengths: np.ndarray) -> np.ndarray:
        """Whether each document of these ``lengths`` is selected."""
        keep = lengths >= (self.min_length or 0)
        return keep if self.max_length is None else keep & (lengths <= self.max_length)

    @property
    def file_name(self) -> str:
        """The length index's file in ``psdp-index/``, named by the bounds."""
        high = "any" if self.max_length is None else self.max_length
        return f"length-{self.min_length or 0}-{high}.npz"

    def fields(self) -> str:
        """The bounds as a `DataConfig` source sets them, for messages."""
        given = [(n, getattr(self, n)) for n in ("min_length", "max_length")]
        return ", ".join(f"{n}={v}" for n, v in given if v is not None)

    def flags(self) -> str:
        """The ``psdp index`` flags that build this selection's index."""
        given = [(n, getattr(self, n)) for n in ("min_length", "max_length")]
        return " ".join(f"--{n.replace('_', '-')} {v}" for n, v in given if v is not None)


def index_command(
    store: Any,
    format: str = "psdp",
    packs: tuple[PackSettings, ...] = (),
    lengths: tuple[LengthBounds, ...] = (),
) -> str:
    """The ``psdp index`` command that builds a store's indexes beside it.

    Examples:
        >>> index_command("gs://bucket/code", "levanter", (PackSettings(4096, 4096),))
        'psdp index gs://bucket/code --format levanter --pack 4096,4096'
        >>> index_command("tokens/web", lengths=(LengthBounds(8192),))
        'psdp index tokens/web --min-length 8192'
        >>> print(index_command({"driver": "s3", "bucket": "b", "path": "web/"}))
        psdp index '{"driver": "s3", "bucket": "b", "path": "web/"}'
    """
    from psdp.sources.stores.location import redacted_message  # tensorstore: not at import

    # a spec as the JSON the command line takes (an endpoint's password hidden)
    where = store if isinstance(store, str) else redacted_message(json.dumps(dict(store)))
    words = ["psdp index", shlex.quote(os.fspath(where))]
    if format != "psdp":
        words.append(f"--format {format}")
    return " ".join(words + [p.flags() for p in packs] + [b.flags() for b in lengths])


def store_digest(index: DocumentIndex, written: str | None = None) -> str:
    """What a store is, for the indexes built beside it: a sha256 of its size, its document
    index (every ``stride``-th offset and the non-empty documents before each), which every
    host holds anyway, and ``written``, what the write that made it wrote
    (`DocumentStore.written`: a sha256 of the documents `write_documents` wrote, or of what a
    ``psdp prepare`` commit holds, appends too; a Levanter cache's ledger's sha256). Another
    store, or this one rewritten with other documents or appended to, has another. A store written before psdp recorded the
    identity (``written`` is ``None``) is known by its size and index alone, which cannot tell
    apart two stores of the same size whose every ``stride``-th offset agrees (e.g. the same
    documents in another order): rewrite or prepare it again for the stronger check.

    Examples:
        >>> index = DocumentIndex(5, 2, np.array([0, 3, 8, 10]), np.array([0, 1, 3, 4]), 4)
        >>> store_digest(index)
        '5:10:b03e9814845940ebdfb5314b744fae4f'
        >>> store_digest(index, "a") != store_digest(index, "b")
        True
    """
    digest = hashlib.sha256()
    for value in (index.num_documents, index.stride, index.num_tokens):
        digest.update(int(value).to_bytes(8, "little"))
    digest.update(np.ascontiguousarray(index.marks, "<i8").tobytes())
    digest.update(np.ascontiguousarray(index.nonempty, "<i8").tobytes())
    if written is not None:  # none: the digest of a store written before it was recorded
        digest.update(b"written:" + written.encode())
    return f"{index.num_documents}:{index.num_tokens}:{digest.hexdigest()[:32]}"


class IndexFolder:
    """``psdp-index/`` (``INDEX_DIRECTORY`` of ``psdp.sources.stores.location``) beside a store
    (a path, URL or kvstore spec): its files read, written whole (atomically), listed, deleted.

    Examples:
        >>> import tempfile
        >>> folder = IndexFolder(tempfile.mkdtemp())
        >>> folder.read("a.npz") is None
        True
        >>> folder.write("a.npz", b"whole"); folder.read("a.npz"), folder.names("a")
        (b'whole', ['a.npz'])
    """

    def __init__(self, store: str | os.PathLike[str] | Mapping[str, Any]):
        # loads tensorstore: on first use
        from psdp.sources.stores.location import INDEX_DIRECTORY, locate

        location = locate(store)
        self.name = f"{location.name.rstrip('/')}/{INDEX_DIRECTORY}"
        self._local = None if location.local is None else Path(location.local) / INDEX_DIRECTORY
        self._location = location
        self._kvstore: Any = None

    @property
    def local(self) -> Path | None:
        """The folder on this machine's file system, or ``None`` (an object store)."""
        return self._local

    def where(self, name: str) -> str:
        """The file ``name``, for messages (its URL, then an object store's endpoint)."""
        from psdp.sources.stores.location import INDEX_DIRECTORY

        return self._location.named(f"{INDEX_DIRECTORY}/{name}")

    def _remote(self) -> Any:
        if self._kvstore is None:
            import tensorstore as ts

            spec = self._location.below(self.name.rsplit("/", 1)[-1] + "/")
            self._kvstore = ts.KvStore.open(spec).result()
        return self._kvstore

    def read(self, name: str) -> bytes | None:
        """The file's bytes (one read), or ``None`` if there is none."""
        if self._local is not None:
            try:
                return (self._local / name).read_bytes()
            except FileNotFoundError:
                return None
        got = self._remote().read(name.encode()).result()
        return bytes(got.value) if got.state == "value" else None

    def write(self, name: str, data: bytes) -> None:
        """Writes the file whole: a reader sees the old file (or none) or the new one."""
        if self._local is not None:
            path = self._local / name
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staging.write_bytes(data)
            os.replace(staging, path)
            return
        from psdp.sources.stores.errors import retried_write

        retried_write(
            lambda: self._remote().write(name.encode(), data).result(),
            f"writing {self.where(name)}",
        )

    def names(self, prefix: str) -> list[str]:
        """The files whose names (paths below the folder) start with ``prefix``."""
        if self._local is not None:
            if not self._local.is_dir():
                return []
            found = (p.relative_to(self._local).as_posix() for p in self._local.rglob("*"))
            return sorted(n for n in found if n.startswith(prefix) and not n.endswith(".tmp")
                          and (self._local / n).is_file())  # fmt: skip
        import tensorstore as ts

        keys = self._remote().list(ts.KvStore.KeyRange(prefix, prefix + "\xff")).result()
        return sorted(key.decode() for key in keys)

    def delete(self, names: list[str]) -> None:
        """Deletes the files (and a local subfolder left empty)."""
        for name in names:
            if self._local is not None:
                (self._local / name).unlink(missing_ok=True)
                folder = (self._local / name).parent
                if folder != self._local and folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            else:
                import tensorstore as ts

                self._remote().delete_range(ts.KvStore.KeyRange(name, name + "\0")).result()


def saved_document_index(folder: IndexFolder) -> DocumentIndex | None:
    """The `DOCUMENT_INDEX` saved in ``folder``, or ``None``; a file that is not one is a
    `ValueError` naming it."""
    data = folder.read(DOCUMENT_INDEX)
    if data is None:
        return None
    try:
        return DocumentIndex.load(io.BytesIO(data))
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"{folder.where(DOCUMENT_INDEX)} is not a document index psdp saved ({error}); "
            "delete it and build it again with psdp index"
        ) from error


def document_index_bytes(index: DocumentIndex) -> bytes:
    """``index`` as the bytes of its file (`DocumentIndex.save`)."""
    body = io.BytesIO()
    index.save(body)
    return body.getvalue()
