"""One task of `prepare`: read a `Unit`, tokenize it, write and commit its part. `run_task` is a
module-level function of a picklable `Task`, so that every engine (local processes, Ray) runs
the same code; what it returns (`PartResult`) is all the driver learns of the part.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from psdp.prepare.parts import PartResult
from psdp.prepare.readers import Unit, read_batches
from psdp.prepare.tokenize import Encoder, load_tokenizer
from psdp.sources.document_writer import write_documents

#: The skipped records a part keeps as examples (their count is always exact).
EXAMPLES = 5


@dataclass(frozen=True)
class Task:
    """A unit and where its part goes, with the settings of the whole `prepare`."""

    unit: Unit
    part: str
    destination: Any  # a local path or a kvstore spec
    tokenizer: str
    field: str
    messages: bool
    bos: str | int | None
    eos: str | int | None
    skip_bad: bool
    tokens_per_shard: int


def run_task(task: Task) -> PartResult:
    """Writes the part of ``task`` (replacing one a killed run may have left) and reports it."""
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
            for doc in _tokenized(task, batch.values):
                if doc is None:
                    counts["empty"] += 1
                    continue
                counts["documents"] += 1
                counts["tokens"] += len(doc["input_ids"])
                yield doc

    stream = documents()
    first = next(stream, None)
    leaves: dict[str, str] = {}
    if first is not None:
        leaves = {name: values.dtype.name for name, values in first.items()}
        write_documents(task.destination, itertools.chain([first], stream), tokens_per_shard=
                        task.tokens_per_shard, overwrite=True, progress=False)  # fmt: skip
    return PartResult(
        task.part, counts["documents"], counts["tokens"], leaves, counts["empty"], skipped,
        examples,
    )  # fmt: skip


def _tokenized(task: Task, values: list[Any]) -> list[dict[str, np.ndarray] | None]:
    if task.messages:
        from psdp.prepare.chat import render_chat  # R's module: transformers' chat templates

        rendered = render_chat(task.tokenizer, values)
        return [
            {"input_ids": ids, "loss_mask": mask} if len(ids) else None for ids, mask in rendered
        ]
    encoder = _encoder(task.tokenizer, task.bos, task.eos)
    return [None if ids is None else {"input_ids": ids} for ids in encoder.encode(values)]


@functools.cache
def _encoder(tokenizer: str, bos: str | int | None, eos: str | int | None) -> Encoder:
    """One per process and settings: loading a tokenizer takes longer than a small part."""
    return Encoder(load_tokenizer(tokenizer), bos=bos, eos=eos)
