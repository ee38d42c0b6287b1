"""`DataConfig`: the whole language-model data path in one config (``docs/guides/trainer.md``).

Named document stores (written by ``psdp prepare`` or `write_documents`), each cut into rows of
``seq_len`` tokens by one view (`TokenSequences`, or `PackedSequences` with a strategy), mixed by
weight (a `Mixture`, with weight stages that start at steps), read by a `DataLoader` with the
loader's four option groups; plus eval sets, each read once by an `eval_loader`. The config is
frozen dataclasses of plain values, so it parses from YAML and flags with draccus like
`LoaderConfig`, which it uses to build and restore the loader.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psdp._checks import is_int
from psdp._integration.config import LoaderConfig
from psdp._plan.mixture import MIXTURE_ROWS
from psdp._plan.options import (
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
    check_groups,
)
from psdp._plan.packing import PACKING_STRATEGIES
from psdp.sources.mixture import Mixture

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from psdp._runtime.loader import DataLoader
    from psdp.sources import DocumentStore

__all__ = ["DataConfig", "MixtureConfig", "SourceConfig", "StageConfig", "ViewConfig"]

#: The manifest ``format`` of a store that ``psdp prepare`` writes (``docs/guides/prepare.md``).
PREPARED_FORMAT = "psdp.document_parts"
#: ``SourceConfig.format`` values: a psdp store, or a Levanter token cache (``docs/guides/tokens.md``).
STORE_FORMATS = ("psdp", "levanter")
#: ``ViewConfig.long_documents`` values (`PackedSequences`).
LONG_DOCUMENTS = ("split", "drop")


# ---------------------------------------------------------------------------------- sources
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
        return "psdp prepare " + " ".join(words)

    def open(self, role: str) -> DocumentStore:
        """The store, or an error naming the ``psdp prepare`` command when it is missing,
        unfinished or stale (``role``, e.g. ``source 'code'``, names it)."""
        from psdp.sources import DocumentStore

        if self.format == "levanter":
            return self._open_levanter(role)
        manifest = _local_manifest(self.store)
        if manifest is not None and manifest.get("format") == PREPARED_FORMAT:
            self._check_prepared(manifest, role)
        try:
            return DocumentStore.open(self.store)
        except (FileNotFoundError, ValueError) as error:
            from psdp.sources.levanter import is_levanter_cache

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
        from psdp.sources.levanter import open_levanter_cache

        assert self.store is not None  # checked in __post_init__
        try:
            return open_levanter_cache(self.store)
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
        from psdp.prepare.parts import stale_inputs
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
        units = plan_units(self.inputs, key.get("rows_per_part", 1))
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


@dataclass(frozen=True)
class StageConfig:
    """From ``step`` on, the mixture's weights are ``weights`` (a source left out: 0).

    Examples:
        >>> StageConfig(step=1000, weights={"code": 1, "prose": 1}).step
        1000
    """

    step: int = 0
    """The first step of the stage (the first stage starts at 0)."""

    weights: dict[str, float] = field(default_factory=dict)
    """Source name -> relative weight, e.g. ``{code: 1, prose: 3}``."""

    def __post_init__(self) -> None:
        if not is_int(self.step) or self.step < 0:
            raise ValueError(
                f"StageConfig.step must be an int >= 0, got {self.step!r}; e.g. step: 1000"
            )
        bad = (
            not isinstance(self.weights, Mapping)
            or not self.weights
            or not all(
                isinstance(k, str)
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v >= 0
                for k, v in self.weights.items()
            )
        )
        if bad:
            raise ValueError(
                f"StageConfig.weights (step {self.step}) must map source names to finite "
                f"weights >= 0, got {self.weights!r}; e.g. weights: {{code: 1, prose: 3}}"
            )
        if not any(self.weights.values()):
            raise ValueError(
                f"StageConfig.weights (step {self.step}) are all 0 ({self.weights!r}); a stage "
                "needs a source with a weight > 0, e.g. weights: {code: 1, prose: 3}"
            )
        object.__setattr__(self, "weights", dict(self.weights))


# -------------------------------------------------------------------------------- the view
@dataclass(frozen=True)
class ViewConfig:
    """How documents become rows of ``seq_len`` tokens: concatenated then split
    (`TokenSequences`), or packed (`PackedSequences`) with a strategy.

    Examples:
        >>> ViewConfig(packing="best_fit", window=4096).view_kwargs()
        {'strategy': 'best_fit', 'long_documents': 'split', 'seed': None, 'pad_id': 0, 'window': 4096}
    """

    packing: str | None = None
    """Unset: concatenate the documents and split them (`TokenSequences`); a strategy
    (best_fit, first_fit, greedy): pack them (`PackedSequences`)."""

    window: int | None = None
    """Packing only: pack each window of this many documents alone (unset: the whole corpus)."""

    long_documents: str = "split"
    """Packing only: ``split`` a document longer than seq_len into pieces, or ``drop`` it."""

    seed: int | None = None
    """Packing only: pack the documents in an order drawn from this seed (unset: store order)."""

    targets: bool = False
    """Next-token targets: one more token per row (concatenate then split), or a ``targets``
    leaf and a loss mask of the real targets (packing)."""

    eos_id: int | None = None
    """A token put after every non-empty document by the view; unset: none."""

    pad_id: int = 0
    """The ``input_ids`` of padding."""

    def __post_init__(self) -> None:
        if self.packing is not None and self.packing not in PACKING_STRATEGIES:
            raise ValueError(
                f"ViewConfig.packing must be one of {list(PACKING_STRATEGIES)} or unset (concatenate "
                f"then split), got {self.packing!r}; e.g. packing: best_fit"
            )
        if self.long_documents not in LONG_DOCUMENTS:
            raise ValueError(
                f"ViewConfig.long_documents must be one of {list(LONG_DOCUMENTS)}, got "
                f"{self.long_documents!r}; e.g. long_documents: split"
            )
        if self.window is not None and (not is_int(self.window) or self.window < 1):
            raise ValueError(
                f"ViewConfig.window must be an int >= 1 or unset, got {self.window!r}; e.g. "
                "window: 4096"
            )
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise ValueError(
                f"ViewConfig.seed must be an int >= 0 or unset, got {self.seed!r}; e.g. seed: 0"
            )
        if not isinstance(self.targets, bool):
            raise TypeError(
                f"ViewConfig.targets must be true or false, got {self.targets!r}; e.g. "
                "targets: true"
            )
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise TypeError(
                    f"ViewConfig.{name} must be a token id (an int), got {value!r}; e.g. "
                    f"{name}: 0"
                )
        self._check_packing_only()

    def _check_packing_only(self) -> None:
        """Packing's fields without packing are refused: they would be ignored."""
        packing_only = {"window": None, "long_documents": "split", "seed": None}
        set_ = [n for n, unset in packing_only.items() if getattr(self, n) != unset]
        if self.packing is None and set_:
            raise ValueError(
                f"ViewConfig.{set_[0]}={getattr(self, set_[0])!r} applies to packing only, but "
                "packing is unset (concatenate then split); set packing (e.g. packing: "
                f"best_fit) or drop {set_[0]}"
            )

    def view_kwargs(self) -> dict[str, Any]:
        """The keywords of the view's constructor (beyond the store and seq_len)."""
        if self.packing is None:
            return {"targets": self.targets, "eos_id": self.eos_id, "pad_id": self.pad_id}
        kwargs = {"strategy": self.packing, "long_documents": self.long_documents,
                  "seed": self.seed, "pad_id": self.pad_id, "window": self.window}  # fmt: skip
        if self.targets:
            kwargs["targets"] = True
        if self.eos_id is not None:
            kwargs["eos_id"] = self.eos_id
        return kwargs


@dataclass(frozen=True)
class MixtureConfig:
    """The mixture's blocks and permutations (``docs/guides/mixtures.md``).

    Examples:
        >>> MixtureConfig(block_size=0)
        Traceback (most recent call last):
            ...
        ValueError: MixtureConfig.block_size must be an int >= 1, got 0; every block of this many samples holds the weights exactly, e.g. block_size: 2048
    """

    block_size: int = 2048
    """Samples per block; every block holds exactly its stage's per-source counts."""

    seed: int = 0
    """Keys the blocks' and every source's permutations."""

    source_leaf: str | None = None
    """The name of an int32 leaf added to every train row: its source's position in
    ``loader.source.names``, for a loss or metrics per source (unset: none)."""

    def __post_init__(self) -> None:
        if self.source_leaf is not None and (
            not isinstance(self.source_leaf, str) or not self.source_leaf
        ):
            raise TypeError(
                f"MixtureConfig.source_leaf must be a leaf name (a non-empty str) or unset, got "
                f"{self.source_leaf!r}; e.g. source_leaf: source"
            )
        if not is_int(self.block_size) or self.block_size < 1:
            raise ValueError(
                f"MixtureConfig.block_size must be an int >= 1, got {self.block_size!r}; every "
                "block of this many samples holds the weights exactly, e.g. block_size: 2048"
            )
        if not is_int(self.seed) or not 0 <= self.seed < 2**64:
            raise ValueError(
                f"MixtureConfig.seed must be an int in [0, 2**64 - 1], got {self.seed!r}; e.g. "
                "seed: 0"
            )


# ------------------------------------------------------------------------------ the config
@dataclass(frozen=True)
class DataConfig:
    """The language-model data path: sources by name, weight stages, seq_len, the view, the
    mixture, eval sets and the loader's option groups. `build` gives the train loader,
    `eval_loaders` one finite loader per eval set, `restore` resumes the train loader.

    Examples:
        >>> config = DataConfig(sources={"code": SourceConfig(store="tokens/code")}, seq_len=256)
        >>> DataConfig.from_dict(config.to_dict()) == config
        True
        >>> DataConfig(seq_len=0)
        Traceback (most recent call last):
            ...
        ValueError: DataConfig.seq_len must be an int >= 1, got 0 (tokens per row); e.g. seq_len: 2048
    """

    sources: dict[str, SourceConfig] = field(default_factory=dict)
    """The training sources, name -> store (and weight), e.g. ``{code: {store: tokens/code,
    weight: 1}}``."""

    stages: list[StageConfig] | None = None
    """Weights that change at steps, e.g. ``[{step: 0, weights: {code: 1}}, {step: 1000,
    weights: {code: 1, prose: 1}}]``; unset: the sources' weights for the whole run."""

    seq_len: int | None = None
    """Tokens per row (required by build)."""

    view: ViewConfig = field(default_factory=ViewConfig)
    """How documents become rows: concatenate then split, or pack."""

    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    """The mixture's block size and seed."""

    eval: dict[str, SourceConfig] = field(default_factory=dict)
    """Eval sets, name -> store, each read once in order by a loader of its own."""

    eval_batch_size: int | None = None
    """Rows per eval batch (unset: order.global_batch_size)."""

    order: OrderOptions = field(default_factory=OrderOptions)
    """global_batch_size (or a schedule), skips, drop_last... (shuffle stays unset: the mixture
    shuffles)."""

    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    """How leaves are split over the mesh (train and eval)."""

    output: OutputOptions = field(default_factory=OutputOptions)
    """pad_value, mask_key, dtypes (train and eval)."""

    reading: ReadingOptions = field(default_factory=ReadingOptions)
    """prefetch, read_threads, timeouts, retries (train and eval)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", _sources("sources", self.sources))
        object.__setattr__(self, "eval", _sources("eval", self.eval))
        if self.seq_len is not None and (not is_int(self.seq_len) or self.seq_len < 1):
            raise ValueError(
                f"DataConfig.seq_len must be an int >= 1, got {self.seq_len!r} (tokens per row); "
                "e.g. seq_len: 2048"
            )
        if self.eval_batch_size is not None and (
            not is_int(self.eval_batch_size) or self.eval_batch_size < 1
        ):
            raise ValueError(
                f"DataConfig.eval_batch_size must be an int >= 1 or unset, got "
                f"{self.eval_batch_size!r}; e.g. eval_batch_size: 64"
            )
        weighted = [n for n, s in self.eval.items() if s.weight is not None]
        if weighted:
            raise ValueError(
                f"DataConfig.eval[{weighted[0]!r}] has weight {self.eval[weighted[0]].weight!r}, "
                "but an eval set is read whole, once, by a loader of its own; drop the weight"
            )
        for name, kind in (("view", ViewConfig), ("mixture", MixtureConfig)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(
                    f"DataConfig.{name} must be a {kind.__name__}, got "
                    f"{type(getattr(self, name)).__name__}; e.g. {kind.__name__}()"
                )
        check_groups("DataConfig", {n: getattr(self, n) for n in _GROUPS})
        if self.order.shuffle:
            raise ValueError(
                "DataConfig.order.shuffle=True, but the sources are read as a mixture, which "
                "shuffles inside its blocks and each source's epochs itself; leave shuffle unset "
                "(the mixture's seed is mixture.seed)"
            )
        if self.stages is not None:
            object.__setattr__(self, "stages", _stages(self.stages, self.sources))
        elif self.sources and not any(
            1 if s.weight is None else s.weight for s in self.sources.values()
        ):
            raise ValueError(
                "DataConfig.sources: every weight is 0 "
                f"({ {n: s.weight for n, s in self.sources.items()} }), so the mixture has no "
                "source to read; give a source a weight > 0 (unset: 1)"
            )

    # ------------------------------------------------------------------------- dict forms
    def to_dict(self) -> dict[str, Any]:
        """The config as YAML/JSON values; `from_dict` reads it back."""
        groups = LoaderConfig(**{n: getattr(self, n) for n in _GROUPS}).to_dict()
        return {
            "sources": {n: asdict(s) for n, s in self.sources.items()},
            "stages": None if self.stages is None else [asdict(s) for s in self.stages],
            "seq_len": self.seq_len,
            "view": asdict(self.view),
            "mixture": asdict(self.mixture),
            "eval": {n: asdict(s) for n, s in self.eval.items()},
            "eval_batch_size": self.eval_batch_size,
            **{n: groups[n] for n in _GROUPS},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DataConfig:
        """The config `to_dict` wrote (or one parsed from YAML/JSON of the same form)."""
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(
                f"DataConfig has no field {unknown[0]!r}; its fields are "
                f"{[f.name for f in fields(cls)]}"
            )
        groups = LoaderConfig.from_dict({n: raw[n] for n in _GROUPS if n in raw})
        stages = raw.get("stages")
        return cls(
            sources=dict(raw.get("sources") or {}),
            stages=None if stages is None else [_made(StageConfig, s) for s in stages],
            seq_len=raw.get("seq_len"),
            view=_made(ViewConfig, raw.get("view") or {}),
            mixture=_made(MixtureConfig, raw.get("mixture") or {}),
            eval=dict(raw.get("eval") or {}),
            eval_batch_size=raw.get("eval_batch_size"),
            **{n: getattr(groups, n) for n in _GROUPS},
        )

    # --------------------------------------------------------------------------- loaders
    def build(self, mesh: Mesh, batch_axes: Sequence[str] | None = None) -> DataLoader:
        """The train `DataLoader`: the sources' views mixed by weight, on ``mesh``.

        ``batch_axes`` as for `LoaderConfig.build` (e.g. ``MeshConfig.batch_axes``).
        """
        loader = self._loader_config()
        loader.options(batch_axes)  # the options checked before a store is opened
        return loader.build(mesh, source=self.train_source(), batch_axes=batch_axes)

    def restore(
        self, state: Mapping[str, Any], mesh: Mesh, batch_axes: Sequence[str] | None = None
    ) -> DataLoader:
        """The train `DataLoader` of `build`, continuing from a saved ``loader.state()``.

        What may change: the batch size (or schedule), skips, ``drop_last``, stages that start
        at or after the resume step, eval sets, ``sharding``, ``output``, ``reading`` and the
        mesh. What decides the rows already trained on may not: ``seq_len``, the view, the
        stores (their sizes), ``mixture``, and stages that start before the resume step; each is
        a `ValueError` naming both values.
        """
        from psdp._runtime.state import check_state, restored_order

        state = check_state(state)
        order = restored_order(state, {"order": self.order})
        saved = [name for name, _ in (state["source"].get("definition") or {}).get("sources", [])]
        # a state saved before the sources were sorted keeps its listing order
        names = saved if sorted(saved) == sorted(self.sources) else None
        source = self.train_source(self._resumed_stage_offsets(state, order), names)
        return self._loader_config().restore(state, mesh, source=source, batch_axes=batch_axes)

    def _resumed_stage_offsets(
        self, state: Mapping[str, Any], order: OrderOptions
    ) -> dict[int, int]:
        """Stage step -> sample offset on a resume: a stage before the resume step has the
        saved run's offset (its batch sizes may have changed since), a later one the offset
        of its step under the resumed ``order``."""
        saved = (state["source"].get("definition") or {}).get("stages", [])
        saved_past = [start for start, _ in saved if start < state["offset"]]
        past = [s.step for s in self.stages or () if s.step < state["step"]]
        if len(past) > len(saved_past):
            step = past[len(saved_past)]
            raise ValueError(
                f"DataConfig.stages: the stage at step {step} starts before step "
                f"{state['step']}, where this run resumes, but the saved run had "
                f"{len(saved_past)} stage(s) before it: the steps before the resume were already "
                f"trained on; start the stage at step {state['step']} or later"
            )
        offsets = dict(zip(past, saved_past, strict=False))
        for stage in self.stages or ():
            if stage.step >= state["step"]:
                offsets[stage.step] = self._stage_offset(stage.step, order)
        return offsets

    def eval_loaders(
        self, mesh: Mesh, batch_axes: Sequence[str] | None = None
    ) -> dict[str, DataLoader]:
        """One finite loader per eval set (`eval_loader`): every row of the set once, in order,
        the last batch padded and masked, the same end on every host."""
        from psdp._runtime.evaluation import eval_loader

        batch = self.eval_batch_size or self.order.global_batch_size
        if not is_int(batch):
            raise ValueError(
                f"DataConfig.eval_batch_size is unset and order.global_batch_size is "
                f"{batch!r}, not one batch size; set eval_batch_size, e.g. eval_batch_size: 64"
            )
        options = self._loader_config().options(batch_axes)
        views = {name: self._view(s, f"eval set {name!r}") for name, s in self.eval.items()}
        loaders: dict[str, DataLoader] = {}
        try:
            for name, view in views.items():
                loaders[name] = eval_loader(
                    view, mesh=mesh, order=OrderOptions(global_batch_size=batch),
                    sharding=options.sharding, output=options.output, reading=options.reading,
                    name=f"eval {name}",
                )  # fmt: skip
        except BaseException:
            for loader in loaders.values():
                loader.close()
            raise
        return loaders

    # ------------------------------------------------------------------------- the source
    def train_source(
        self,
        stage_offsets: Mapping[int, int] | None = None,
        names: Sequence[str] | None = None,
    ) -> Mixture:
        """The training sources' views as one `Mixture` (one source: weight 1), in sorted order
        of their names: the order a YAML or ``draccus.dump`` lists them in changes nothing.

        ``stage_offsets``: stage step -> its sample offset (default: the offset of the step's
        first row under ``order``); ``names``: the sources in another order (a restore's)."""
        if not self.sources:
            raise ValueError(
                "DataConfig.sources is empty; name at least one store, e.g. sources: {code: "
                "{store: tokens/code}}"
            )
        listed = sorted(self.sources) if names is None else list(names)
        views = {name: self._view(self.sources[name], f"source {name!r}") for name in listed}
        views = self._common_ids(views)
        if self.stages is None:
            weights = {n: 1.0 if s.weight is None else s.weight for n, s in self.sources.items()}
            stages = [(0, weights)]
        else:
            given = stage_offsets or {}
            stages = [
                (given[s.step] if s.step in given else self._stage_offset(s.step, self.order),
                 s.weights)
                for s in self.stages
            ]  # fmt: skip
        return _ConfiguredMixture(
            views,
            stages=stages,
            block_size=self.mixture.block_size,
            seed=self.mixture.seed,
            source_leaf=self.mixture.source_leaf,
            view=self._view_record(),
        )

    def _view(self, source: SourceConfig, role: str) -> Any:
        from psdp.sources import PackedSequences, TokenSequences

        if self.seq_len is None:
            raise ValueError(
                "DataConfig.seq_len is unset; set the tokens per row, e.g. seq_len: 2048"
            )
        store = source.open(role)
        kind = TokenSequences if self.view.packing is None else PackedSequences
        try:
            return kind(store, self.seq_len, **self.view.view_kwargs())
        except ValueError as error:
            raise ValueError(f"{role} ({source.store!r}): {error}") from None

    def _common_ids(self, views: dict[str, Any]) -> dict[str, Any]:
        """The views with their stores' token ids read as one dtype, so that they mix: numpy's
        common type of theirs (uint16 and int32: int32), int32 where that would be 64-bit
        (JAX's default holds no int64); each read checked (`DocumentStore.with_dtypes`)."""
        import numpy as np

        from psdp.sources.documents import TOKENS

        found = {name: view.store.leaves[TOKENS] for name, view in views.items()}
        if len(set(found.values())) < 2:
            return views
        common = np.result_type(*found.values())
        if common.itemsize == 8:
            common = np.dtype(np.int32)
        return {
            name: view if found[name] == common else type(view)(
                view.store.with_dtypes({TOKENS: common}), self.seq_len, **self.view.view_kwargs()
            )
            for name, view in views.items()
        }  # fmt: skip

    def _stage_offset(self, step: int, order: OrderOptions) -> int:
        """The sample offset of ``step``'s first row under ``order``; a block boundary."""
        if order.global_batch_size is None:
            raise ValueError(
                f"DataConfig.stages start at steps (step {step}), which need "
                "order.global_batch_size to find their sample offsets; set it, e.g. "
                "order: {global_batch_size: 256}"
            )
        offset = order.step_offsets(MIXTURE_ROWS).info(step).offset
        block = self.mixture.block_size
        if offset % block:
            raise ValueError(
                f"DataConfig.stages: the stage at step {step} starts at sample offset {offset}, "
                f"which is not a multiple of mixture.block_size={block} (a block takes one "
                f"stage's weights); start it at a step whose offset is a multiple of {block}, or "
                f"use a block_size that divides {offset}"
            )
        return offset

    def _view_record(self) -> dict[str, Any]:
        """What decides every row besides the mixture: recorded in the loader's state."""
        return {"seq_len": self.seq_len, **asdict(self.view)}

    def _loader_config(self) -> LoaderConfig:
        return LoaderConfig(**{n: getattr(self, n) for n in _GROUPS})


#: The loader's option groups, as `LoaderConfig` holds them.
_GROUPS = ("order", "sharding", "output", "reading")


class _ConfiguredMixture(Mixture):
    """A `Mixture` whose state record holds the config's view too, so a restore refuses a
    changed ``seq_len`` or view even where the sources' lengths happen to stay the same."""

    def __init__(self, sources: Mapping[str, Any], *, view: dict[str, Any], **kwargs: Any):
        super().__init__(sources, **kwargs)
        self.view = view

    def state_record(self) -> dict[str, Any]:
        return {**super().state_record(), "view": self.view}

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        had = saved.get("view")
        if had is None:
            raise ValueError(
                f"the state was saved from a source without a data config's view ({dict(saved)}); "
                "resume it with the source it was saved from (DataLoader.restore)"
            )
        for name, now in self.view.items():
            then = had.get(name)
            if then != now:
                where = "DataConfig.seq_len" if name == "seq_len" else f"DataConfig.view.{name}"
                raise ValueError(
                    f"{where} is {now!r}, but the run was saved with {then!r}; every row depends "
                    f"on it, so resume with {name}: {then!r} (a restore may change the batch "
                    "size, skips, later stages, eval sets, sharding, output and reading)"
                )
        super().check_resume(saved, offset)


def _sources(what: str, given: Any) -> dict[str, SourceConfig]:
    if not isinstance(given, Mapping):
        raise TypeError(
            f"DataConfig.{what} must be a mapping of name -> store, got {type(given).__name__} "
            f"{given!r}; e.g. {what}: {{code: {{store: tokens/code}}}}"
        )
    out = {}
    for name, source in given.items():
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"DataConfig.{what}: every name must be a non-empty str, got {name!r}; e.g. "
                f"{what}: {{code: {{store: tokens/code}}}}"
            )
        out[name] = _made(SourceConfig, source) if isinstance(source, Mapping) else source
        if not isinstance(out[name], SourceConfig):
            raise TypeError(
                f"DataConfig.{what}[{name!r}] must be a SourceConfig or a mapping such as "
                f"{{store: tokens/{name}}}, got {type(source).__name__} {source!r}"
            )
    return out


def _stages(given: Any, sources: Mapping[str, SourceConfig]) -> list[StageConfig]:
    example = (
        "e.g. stages: [{step: 0, weights: {code: 1}}, {step: 1000, weights: {code: 1, prose: 1}}]"
    )
    if isinstance(given, str | Mapping) or not isinstance(given, Sequence) or not given:
        raise TypeError(
            f"DataConfig.stages must be a non-empty list of stages, got {given!r}; {example}"
        )
    stages = [_made(StageConfig, s) if isinstance(s, Mapping) else s for s in given]
    if not all(isinstance(s, StageConfig) for s in stages):
        raise TypeError(
            f"DataConfig.stages must be StageConfigs or mappings, got {given!r}; {example}"
        )
    steps = [s.step for s in stages]
    if steps[0] != 0 or any(a >= b for a, b in pairwise(steps)):
        raise ValueError(
            f"DataConfig.stages start at steps {steps}: the first must start at step 0 and the "
            f"steps must increase; {example}"
        )
    weighted = [n for n, s in sources.items() if s.weight is not None]
    if weighted:
        raise ValueError(
            f"DataConfig has stages and sources[{weighted[0]!r}].weight="
            f"{sources[weighted[0]].weight!r}: the stages give every weight; drop the sources' "
            "weights"
        )
    for stage in stages:
        unknown = sorted(set(stage.weights) - set(sources))
        if unknown and sources:
            raise ValueError(
                f"DataConfig.stages: the stage at step {stage.step} weights {unknown[0]!r}, which "
                f"is not a source (the sources are {sorted(sources)}); name sources only"
            )
    return stages


def _made(kind: Any, raw: Any) -> Any:
    """``kind(**raw)``, or a TypeError naming ``kind``'s fields when ``raw`` does not fit."""
    if isinstance(raw, kind):
        return raw
    names = [f.name for f in fields(kind)]
    if not isinstance(raw, Mapping) or set(raw) - set(names):
        extra = sorted(set(raw) - set(names)) if isinstance(raw, Mapping) else raw
        raise TypeError(
            f"{kind.__name__} takes the fields {names}, got {extra!r}; e.g. {kind.__name__}"
            f"({names[0]}=...)"
        )
    return kind(**raw)
