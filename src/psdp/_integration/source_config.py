"""`SourceConfig`: one document store of a `DataConfig` (a training source or an eval set),
opened by name, with the ``psdp prepare`` command that makes it and the checks that a prepared
store is finished and made from what the config says (its inputs and tokenizer).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psdp._checks import is_int

if TYPE_CHECKING:
    from psdp.sources import DocumentStore
    from psdp.sources.documents.beside import LengthBounds

#: The manifest ``format`` of a store that ``psdp prepare`` writes (``docs/guides/prepare.md``).
PREPARED_FORMAT = "psdp.document_parts"
#: ``SourceConfig.format`` values: a psdp store, or a Levanter token cache (``docs/guides/tokens.md``).
STORE_FORMATS = ("psdp", "levanter")


@dataclass(frozen=True)
class SourceConfig:
    """One document store: a source of the training mixture, or an eval set.

    ``inputs`` and ``tokenizer`` (with ``bos``, ``eos``, ``field`` or ``messages``,
    ``skip_bad`` and ``rows_per_part``: its flags) say how ``psdp prepare`` makes the store: a
    missing, unfinished or stale store is then an error naming that command.

    Examples:
        >>> SourceConfig(store="tokens/code", weight=1, inputs=["code/*.jsonl"],
        ...              tokenizer="tokenizer.json", eos="</s>").prepare_command()
        "psdp prepare 'code/*.jsonl' --output tokens/code --tokenizer tokenizer.json --eos '</s>'"
    """

    store: str | None = None
    """The document store: a directory or URL written by ``psdp prepare`` or
    ``psdp.write_documents`` (required)."""

    weight: float | None = None
    """The source's relative weight in the mixture (unset: 1), exactly as written (``0.3 : 0.1``
    is ``3 : 1``); not with ``stages`` (their weights give every source's), nor for an eval
    set."""

    inputs: list[str] | None = None
    """The text files (or globs) ``psdp prepare`` made the store from, with ``tokenizer``: a store
    made from other inputs or another tokenizer is refused as stale."""

    tokenizer: str | None = None
    """The tokenizer ``psdp prepare`` used (a tokenizer.json or a model directory), with
    ``inputs``."""

    bos: str | None = None
    """The BOS token ``psdp prepare`` put before each document (with ``inputs``), or unset."""

    eos: str | None = None
    """The EOS token ``psdp prepare`` put after each document (with ``inputs``), or unset."""

    format: str = "psdp"
    """``psdp``: a store of ``psdp prepare`` or ``write_documents``; ``levanter``: the directory
    of one split of a finished Levanter token cache (its ``input_ids``)."""

    field: str | None = None
    """The text field of each record ``psdp prepare`` tokenized (``--field``; unset: ``text``
    for a new store, whatever an existing one was made with); not with ``messages``."""

    messages: str | None = None
    """The field of chat messages ``psdp prepare`` rendered with the tokenizer's chat template
    (``--messages``), instead of ``field``."""

    skip_bad: bool = False
    """Whether ``psdp prepare`` skipped malformed records (``--skip-bad``)."""

    rows_per_part: int | None = None
    """Parquet/Arrow rows per part of ``psdp prepare`` (``--rows-per-part``; unset: its
    default)."""

    min_length: int | None = None
    """Only the store's documents of at least this many tokens (unset: no lower bound), read
    through the length index ``psdp index STORE --min-length N`` built beside the store; e.g.
    a long-document source of a long-context stage (``docs/guides/mixtures.md``)."""

    max_length: int | None = None
    """Only the store's documents of at most this many tokens (unset: no upper bound), as for
    ``min_length`` (``psdp index STORE --max-length N``)."""

    def __post_init__(self) -> None:
        example = "e.g. store: tokens/code"
        if not isinstance(self.store, str) or not self.store:
            raise TypeError(
                f"SourceConfig.store must be the path or URL of a document store (a non-empty "
                f"str), got {self.store!r}; {example}"
            )
        if self.format not in STORE_FORMATS:
            raise ValueError(
                f"SourceConfig.format of {self.store!r} must be one of {list(STORE_FORMATS)}, "
                f"got {self.format!r}; e.g. format: levanter for a Levanter token cache"
            )
        if self.format == "levanter" and self.inputs is not None:
            raise ValueError(
                f"SourceConfig of {self.store!r} is a Levanter cache (format: levanter) and sets "
                "inputs and tokenizer, which say how psdp prepare makes a psdp store; Levanter's "
                "cache builder makes this one: drop inputs, tokenizer, bos and eos"
            )
        if self.weight is not None and (
            not isinstance(self.weight, int | float)
            or isinstance(self.weight, bool)
            or not math.isfinite(self.weight)
            or self.weight < 0
        ):
            raise ValueError(
                f"SourceConfig.weight of {self.store!r} must be a finite number >= 0, got "
                f"{self.weight!r}; weights are relative, e.g. weight: 3"
            )
        if self.inputs is not None and (
            isinstance(self.inputs, str)
            or not isinstance(self.inputs, Sequence)
            or not self.inputs
            or not all(isinstance(i, str) and i for i in self.inputs)
        ):
            raise TypeError(
                f"SourceConfig.inputs of {self.store!r} must be a non-empty list of files or "
                f"globs, got {self.inputs!r}; e.g. inputs: [code/*.jsonl]"
            )
        if (self.inputs is None) != (self.tokenizer is None):
            given, missing = ("inputs", "tokenizer") if self.tokenizer is None else (
                "tokenizer", "inputs")  # fmt: skip
            raise ValueError(
                f"SourceConfig of {self.store!r} sets {given} but not {missing}: the prepare "
                f"command needs both; set {missing}, or neither"
            )
        for name in ("bos", "eos"):  # an int is an id, as its digits are (docs/guides/prepare.md)
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                object.__setattr__(self, name, str(value))
        for name in ("tokenizer", "bos", "eos"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                what = "a non-empty str" if name == "tokenizer" else "a token or an id >= 0"
                raise TypeError(
                    f"SourceConfig.{name} of {self.store!r} must be {what}, got {value!r}; e.g. "
                    f"{name}: {'tokenizer.json' if name == 'tokenizer' else '</s>'}"
                )
        if self.inputs is None and (self.bos is not None or self.eos is not None):
            raise ValueError(
                f"SourceConfig of {self.store!r} sets bos/eos ({self.bos!r}, {self.eos!r}) but "
                "not inputs and tokenizer: they describe how psdp prepare makes the store; set "
                "inputs and tokenizer too, or drop them"
            )
        self._check_prepare_settings()
        self.length_bounds()  # checked now, not when the store opens
        if self.inputs is not None:
            object.__setattr__(self, "inputs", list(self.inputs))

    def _check_prepare_settings(self) -> None:
        """``field``, ``messages``, ``skip_bad`` and ``rows_per_part``: how psdp prepare ran."""
        given = {
            name: getattr(self, name)
            for name in ("field", "messages", "skip_bad", "rows_per_part")
            if getattr(self, name) not in (None, False)
        }
        for name in ("field", "messages"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(
                    f"SourceConfig.{name} of {self.store!r} must be a non-empty str (a field of "
                    f"the input records), got {value!r}; e.g. {name}: "
                    f"{'text' if name == 'field' else 'messages'}"
                )
        if self.field is not None and self.messages is not None:
            raise ValueError(
                f"SourceConfig of {self.store!r} sets field={self.field!r} and messages="
                f"{self.messages!r}: psdp prepare reads a text field or a field of chat "
                "messages, not both; keep one"
            )
        if not isinstance(self.skip_bad, bool):
            raise TypeError(
                f"SourceConfig.skip_bad of {self.store!r} must be true or false, got "
                f"{self.skip_bad!r}"
            )
        if self.rows_per_part is not None and (
            not is_int(self.rows_per_part) or self.rows_per_part < 1
        ):
            raise ValueError(
                f"SourceConfig.rows_per_part of {self.store!r} must be an int >= 1, got "
                f"{self.rows_per_part!r}; e.g. rows_per_part: 100000, or leave it unset"
            )
        if given and self.inputs is None:
            raise ValueError(
                f"SourceConfig of {self.store!r} sets {sorted(given)} but not inputs and "
                "tokenizer: they describe how psdp prepare makes the store; set inputs and "
                "tokenizer too, or drop them"
            )

    def length_bounds(self) -> LengthBounds | None:
        """The `LengthBounds` of ``min_length`` and ``max_length``, or ``None`` (every document).

        Examples:
            >>> SourceConfig(store="tokens/web", min_length=8192).length_bounds()
            LengthBounds(min_length=8192, max_length=None)
        """
        if self.min_length is None and self.max_length is None:
            return None
        from psdp.sources.documents.beside import LengthBounds

        for name in ("min_length", "max_length"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(
                    f"SourceConfig.{name} of {self.store!r} must be a token count (an int >= 0) "
                    f"or unset, got {value!r}; e.g. {name}: 8192"
                )
        try:
            return LengthBounds(self.min_length, self.max_length)
        except ValueError as error:
            raise ValueError(f"SourceConfig of {self.store!r}: {error}") from None

    def prepare_command(self) -> str:
        """The ``psdp prepare`` command that makes this store (placeholders where the config
        does not say its inputs and tokenizer)."""
        return self._command({})

    def _command(self, recorded: Mapping[str, Any]) -> str:
        """`prepare_command`, with the settings of a store's key (``recorded``) where the config
        does not give them: a resume with other settings is refused."""
        inputs = [shlex.quote(i) for i in self.inputs] if self.inputs else ["<text files>"]
        words = [*inputs, "--output", shlex.quote(str(self.store))]
        tokenizer = shlex.quote(self.tokenizer) if self.tokenizer else "<tokenizer.json>"
        words += ["--tokenizer", tokenizer]
        for name in ("bos", "eos"):
            if getattr(self, name) is not None:
                words += [f"--{name}", shlex.quote(getattr(self, name))]
        messages, field = self.messages, self.field
        if messages is None and field is None:
            messages, field = recorded.get("messages_field"), recorded.get("field")
        if messages:
            words += ["--messages", shlex.quote(str(messages))]
        elif field not in (None, "text"):
            words += ["--field", shlex.quote(str(field))]
        if self.skip_bad or recorded.get("skip_bad"):
            words.append("--skip-bad")
        rows = self.rows_per_part
        if rows is None and recorded.get("rows_per_part") is not None:
            from psdp.prepare import ROWS_PER_PART  # imports prepare's dependencies

            rows = None if recorded["rows_per_part"] == ROWS_PER_PART else recorded["rows_per_part"]
        if rows is not None:
            words += ["--rows-per-part", str(rows)]
        if "bytes_per_part" in recorded:
            from psdp.prepare import BYTES_PER_PART

            if recorded["bytes_per_part"] != BYTES_PER_PART:  # None: a file a part
                words += ["--bytes-per-part", str(recorded["bytes_per_part"] or 0)]
        return "psdp prepare " + " ".join(words)

    def open(self, role: str) -> DocumentStore:
        """The store, or an error naming the ``psdp prepare`` command when it is missing,
        unfinished or stale (``role``, e.g. ``source 'code'``, names it); with ``min_length``
        or ``max_length``, its documents of those lengths (`SelectedDocuments`), or an error
        naming the ``psdp index`` command when their length index is missing or stale, or the
        field when they are none."""
        store = self._open_store(role)
        bounds = self.length_bounds()
        if bounds is None:
            return store
        from psdp.sources import SelectedDocuments

        try:
            return SelectedDocuments.beside(
                self.store, store, min_length=bounds.min_length, max_length=bounds.max_length,
                format=self.format,
            )  # fmt: skip
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{role}: {error}") from None
        except ValueError as error:
            raise ValueError(f"{role}: {error}") from None

    def _open_store(self, role: str) -> DocumentStore:
        from psdp.sources import DocumentStore

        if self.format == "levanter":
            return self._open_levanter(role)
        manifest = _local_manifest(self.store)
        if manifest is not None and manifest.get("format") == PREPARED_FORMAT:
            self._check_prepared(manifest, role)
        try:
            return DocumentStore.open(self.store)
        except (FileNotFoundError, ValueError) as error:
            from psdp.sources.stores.levanter_cache import is_levanter_cache

            assert self.store is not None  # checked in __post_init__
            levanter = is_levanter_cache(self.store)  # DocumentStore.open names no role
            if isinstance(error, ValueError) and not levanter:
                raise
            if levanter:
                raise ValueError(
                    f"{role}: {self.store!r} is a Levanter token cache (shard_ledger.json), not "
                    "a psdp store; set format: levanter to read it in place"
                ) from None
            raise FileNotFoundError(
                f"{role}: there is no document store at {self.store!r}; make it with "
                f"`{self.prepare_command()}` (or psdp.write_documents)"
            ) from None

    def _open_levanter(self, role: str) -> DocumentStore:
        from psdp.sources.documents.levanter import open_levanter_cache

        assert self.store is not None  # checked in __post_init__
        try:
            return open_levanter_cache(self.store, index="beside")
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{role}: {error}") from None
        except ValueError as error:
            raise ValueError(f"{role}: {error}") from None

    def _check_prepared(self, manifest: Mapping[str, Any], role: str) -> None:
        """Raises unless the prepared store is complete and, when the config says how it is
        made, made from these inputs and this tokenizer."""
        if not manifest.get("complete"):
            raise ValueError(
                f"{role}: the store {self.store!r} is unfinished (psdp prepare was stopped before "
                f"every part was committed); finish it with `{self._finish_command(manifest)}`"
            )
        why = self._stale_reason(manifest)
        if why and manifest.get("append"):  # an append that stopped: rerunning it finishes it
            raise ValueError(
                f"{role}: the store {self.store!r} has an unfinished append ({why}; psdp prepare "
                f"was stopped before the append completed); finish it with "
                f"`{self._finish_command(manifest)}`"
            )
        if why:
            raise ValueError(
                f"{role}: the store {self.store!r} is stale: {why}; delete it and make it again "
                f"with `{self.prepare_command()}`"
            )

    def _finish_command(self, manifest: Mapping[str, Any]) -> str:
        """`prepare_command` with the settings the store's key records beyond the config's
        (field, skip_bad, rows per part): a resume with other settings is refused."""
        return self._command(manifest.get("key") or {})

    def _stale_reason(self, manifest: Mapping[str, Any]) -> str:
        """How the prepared store differs from what the config says it is made of ('' if not)."""
        if self.inputs is None or self.tokenizer is None:
            return ""
        try:
            return self._difference(manifest)
        except FileNotFoundError:  # the text or tokenizer is gone: nothing to compare, and the
            return ""  # store itself is still what it was

    def _difference(self, manifest: Mapping[str, Any]) -> str:
        from psdp.prepare.parts import made_uncut, stale_inputs
        from psdp.prepare.readers import plan_units
        from psdp.prepare.tokenize import Encoder, load_tokenizer, tokenizer_digest

        assert self.inputs is not None and self.tokenizer is not None
        key = manifest.get("key", {})
        if tokenizer_digest(self.tokenizer) != key.get("tokenizer_sha256"):
            return f"it was made with another tokenizer than {self.tokenizer!r}"
        if self.field is not None or self.messages is not None:
            said = ("field", self.field) if self.messages is None else ("messages", self.messages)
            made = ("messages", key.get("messages_field"))
            if not made[1]:
                made = ("field", key.get("field"))
            if said != made:
                return (
                    f"it was made from {made[0]} {made[1]!r} of each record, but the config says "
                    f"{said[0]}: {said[1]}"
                )
        encoder = Encoder(load_tokenizer(self.tokenizer), bos=self.bos, eos=self.eos)
        for name in ("bos", "eos"):
            if getattr(encoder, name) != key.get(name):
                return (
                    f"its {name} id is {key.get(name)!r}, but {name}={getattr(self, name)!r} "
                    f"is id {getattr(encoder, name)!r}"
                )
        units = plan_units(self.inputs, key.get("rows_per_part", 1), key.get("bytes_per_part"),
                           cut_objects=not made_uncut(manifest))  # fmt: skip
        local = _local_manifest(self.store) is not None  # a local store: its own directory
        root = str(Path(str(self.store)).resolve()) if local else None
        return stale_inputs(manifest, units, root)  # inputs by content: a moved folder is fine


def _local_manifest(store: Any) -> dict[str, Any] | None:
    """The ``psdp.json`` of a local store (``None``: not local, or none there)."""
    if not isinstance(store, str) or "://" in store:
        return None
    path = Path(store) / "psdp.json"
    if not path.is_file():
        return None
    found = json.loads(path.read_text())
    return found if isinstance(found, dict) else None
