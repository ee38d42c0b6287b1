"""One task of `prepare`: read a `Unit`, tokenize it, write and commit its part. `run_task` is a
module-level function of a picklable `Task`, so that every engine (local processes, Ray) runs
the same code; what it returns (`PartResult`) is all the driver learns of the part.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from psdp.prepare.parts import PartResult, file_sha256
from psdp.prepare.readers import Unit, read_batches
from psdp.prepare.tokenize import Encoder, files_digest, tokenizer_files, tokenizer_from
from psdp.sources.documents.writer import write_documents

#: The skipped records a part keeps as examples (their count is always exact).
EXAMPLES = 5


@dataclass(frozen=True)
class Task:
    """A unit and where its part goes, with the settings of the whole `prepare`."""

    unit: Unit
    part: str
    destination: Any  # a local path or a kvstore spec
    tokenizer: str
    tokenizer_sha256: str  # the store's key: the task checks that it reads this tokenizer
    field: str
    messages: bool
    bos: str | int | None
    eos: str | int | None
    skip_bad: bool
    tokens_per_shard: int


def run_task(task: Task, report: Callable[[Progress], None] | None = None) -> PartResult:
    """Writes the part of ``task`` (replacing one a killed run may have left) and returns what it
    holds; ``report`` gets a `Progress` after each batch of records is tokenized."""
    tokenizer = _tokenizer(task)
    counts = {"empty": 0, "documents": 0, "tokens": 0}
    skipped: dict[str, int] = {}
    examples: list[tuple[str, str]] = []

    def documents() -> Iterator[Any]:
        for batch in read_batches(task.unit, task.field, list if task.messages else str,
                                  task.skip_bad):  # fmt: skip
            for where, reason in batch.bad:
                kind = reason.split(" (")[0]
                skipped[kind] = skipped.get(kind, 0) + 1
                if len(examples) < EXAMPLES:
                    examples.append((where, reason))
            before = counts["documents"], counts["tokens"]
            tokenized = _tokenized(task, tokenizer, batch.values)
            for doc in tokenized:
                if doc is None:
                    counts["empty"] += 1
                    continue
                counts["documents"] += 1
                counts["tokens"] += len(doc["input_ids"])
            if report is not None:
                report(Progress(len(batch.values) + len(batch.bad),
                                counts["documents"] - before[0], counts["tokens"] - before[1]))  # fmt: skip
            yield from (doc for doc in tokenized if doc is not None)

    stream = documents()
    first = next(stream, None)
    leaves: dict[str, str] = {}
    if first is not None:
        leaves = {name: values.dtype.name for name, values in first.items()}
        write_documents(task.destination, itertools.chain([first], stream), tokens_per_shard=
                        task.tokens_per_shard, overwrite=True, progress=False)  # fmt: skip
    unit = task.unit  # a local input's bytes, once per file: it is the same input moved too
    digest = file_sha256(unit.path) if unit.kvstore is None and unit.first else None
    return PartResult(
        task.part, counts["documents"], counts["tokens"], leaves, counts["empty"], skipped,
        examples, digest,
    )  # fmt: skip


class Progress(NamedTuple):
    """What a task reports after a batch: its records read (malformed and empty ones too), and
    the documents and tokens they made."""

    records: int
    documents: int
    tokens: int


def _tokenized(task: Task, tokenizer: Any, values: list[Any]) -> list[dict[str, np.ndarray] | None]:
    if task.messages:
        from psdp.prepare.chat import render_chat  # R's module: transformers' chat templates

        rendered = render_chat(task.tokenizer, values, digest=task.tokenizer_sha256)
        return [
            {"input_ids": ids, "loss_mask": mask} if len(ids) else None for ids, mask in rendered
        ]
    return [None if ids is None else {"input_ids": ids} for ids in tokenizer.encode(values)]


#: Encoders by tokenizer content and BOS/EOS: loading one takes longer than a small part. Keyed by
#: the files' sha256, never their path: a tokenizer saved again at the same path is another one.
_ENCODERS: dict[tuple[str, str | int | None, str | int | None], Encoder] = {}


def _tokenizer(task: Task) -> Encoder | None:
    """The encoder of the tokenizer that the store's key names (``None`` for chat records, which
    `render_chat` tokenizes); refuses a tokenizer changed since the run planned."""
    files = tokenizer_files(task.tokenizer)
    digest = files_digest(files)
    if digest != task.tokenizer_sha256:
        raise ValueError(
            f"the tokenizer {task.tokenizer} changed while psdp prepare ran (sha256 "
            f"{task.tokenizer_sha256} planned, {digest} now): a store holds one tokenizer; "
            "keep it unchanged until the run ends, then run the same command again to resume"
        )
    if task.messages:
        return None
    key = (digest, task.bos, task.eos)
    if key not in _ENCODERS:
        if len(_ENCODERS) >= 4:
            _ENCODERS.clear()
        tokenizer = tokenizer_from(files["tokenizer.json"], task.tokenizer)
        _ENCODERS[key] = Encoder(tokenizer, bos=task.bos, eos=task.eos)
    return _ENCODERS[key]
