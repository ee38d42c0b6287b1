"""`prepare`: text (jsonl, Parquet, Arrow, a `datasets` export) -> tokenizer -> a document store
that `DocumentStore.open`, `TokenSequences`, `PackedSequences` and `Mixture` read.
``docs/guides/prepare.md``.

The driver plans units (`readers`), records them in the store's manifest (`parts`), runs one
task per pending unit on an engine (`engines`, `tasks`: read, tokenize, write and commit a part)
and commits each part to the manifest as it comes back; then it writes the corpus's index and
marks the store complete. Nothing here is imported by ``import psdp`` until used.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from psdp._checks import check_int
from psdp.prepare.engines import engine_named
from psdp.prepare.indexes import build_indexes
from psdp.prepare.parts import (
    Output,
    finished,
    made_uncut,
    pending,
    planned,
    recorded,
    unit_id,
    with_part,
)
from psdp.prepare.readers import BadRecordError, CorruptFileError, plan_units
from psdp.prepare.tasks import Progress, Task, run_task
from psdp.prepare.tokenize import Encoder, files_digest, tokenizer_files, tokenizer_from
from psdp.sources.documents.beside import PackSettings

#: Rows of a Parquet or Arrow file per part (cut at its row groups): the unit of work and resume.
ROWS_PER_PART = 100_000
#: Bytes of an uncompressed jsonl file per part (cut at its lines).
BYTES_PER_PART = 1 << 27


@dataclass(frozen=True)
class PrepareSummary:
    """What `prepare` stored: documents and tokens, the records left out (empty texts, and with
    ``skip_bad`` the malformed ones by reason, with a few examples), the token dtype."""

    output: str
    documents: int
    tokens: int
    dtype: str
    parts: int
    empty: int
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    #: the pack indexes built beside the store (``packs``): `build_indexes`' records
    indexes: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"prepared {self.output}: {self.documents:,} documents, {self.tokens:,} tokens "
            f"({self.dtype}) in {self.parts} part{'' if self.parts == 1 else 's'}",
            f"empty records (not stored): {self.empty:,}",
            f"skipped records: {sum(self.skipped.values()):,}",
        ]
        lines += [f"  {count:,} x {reason}" for reason, count in sorted(self.skipped.items())]
        lines += [f"  e.g. {where}: {reason}" for where, reason in self.examples]
        lines += [f"{r['index']}: {r['state']}, {r['sequences']:,} sequences" for r in self.indexes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON values, as ``psdp prepare --json`` prints it."""
        return {
            **{name: getattr(self, name) for name in ("output", "documents", "tokens", "dtype",
                                                      "parts", "empty", "skipped")},
            "examples": [{"where": where, "reason": reason} for where, reason in self.examples],
            "seconds": round(self.seconds, 3),
            **({"indexes": self.indexes} if self.indexes else {}),
        }  # fmt: skip


#: About how many times a run commits its manifest, whatever its number of parts.
COMMITS = 100


def prepare(
    inputs: Any,
    output: str | os.PathLike[str] | Mapping[str, Any],
    *,
    tokenizer: str | os.PathLike[str],
    field: str = "text",
    messages_field: str | None = None,
    bos: str | int | None = None,
    eos: str | int | None = None,
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    skip_bad: bool = False,
    rows_per_part: int = ROWS_PER_PART,
    bytes_per_part: int | None = BYTES_PER_PART,
    tokens_per_shard: int = 1 << 20,
    progress: bool = True,
    packs: Sequence[PackSettings] = (),
) -> PrepareSummary:
    """Tokenizes ``inputs`` into a parted document store at ``output``; resumes a killed run and
    appends new input shards (``docs/guides/prepare.md``).

    Args:
        inputs: files, globs or `datasets` save_to_disk directories, local or in an object store
            (URLs, or kvstore spec dicts whose ``path`` names the file or glob).
        output: a directory, URL or kvstore spec, as for `write_documents`.
        tokenizer: a ``tokenizer.json`` or a directory holding one (nothing is downloaded).
        field: the text field (column) of each record.
        messages_field: instead of ``field``, a field of chat messages rendered with the
            tokenizer's chat template (a ``loss_mask`` leaf covers the assistant's tokens).
        bos: a token (string or id) put before each document, or ``None``.
        eos: a token (string or id) put after each document, or ``None``.
        workers: worker processes (default: every core); engine ``"ray"``: ignored.
        engine: ``"local"`` or ``"ray"`` (on the cluster at ``ray_address``).
        skip_bad: skip malformed records, counted by reason, instead of raising.
        rows_per_part: rows of a Parquet or Arrow file per part (the unit of work and resume).
        bytes_per_part: bytes of an uncompressed jsonl file per part (``None``: a file a part).
        tokens_per_shard: tokens per shard file of each part's arrays.
        progress: show a progress bar with documents/s and tokens/s.
        packs: packings in windows whose pack index is then built beside the store, on the
            same engine (`psdp.prepare.indexes.build_indexes`; ``psdp prepare --pack``), so that
            no host builds it at start-up (``docs/guides/packing.md``).

    Examples:
        >>> import json, tempfile
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from psdp import DocumentStore
        >>> tmp = tempfile.TemporaryDirectory()
        >>> words = Tokenizer(models.WordLevel({"[unk]": 0, "hello": 1, "world": 2}, "[unk]"))
        >>> words.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> words.save(f"{tmp.name}/tokenizer.json")
        >>> with open(f"{tmp.name}/a.jsonl", "w") as f:
        ...     f.write(json.dumps({"text": "hello world"}) + "\\n" + json.dumps({"text": "world"}))
        41
        >>> summary = prepare(f"{tmp.name}/a.jsonl", f"{tmp.name}/store",
        ...                   tokenizer=f"{tmp.name}/tokenizer.json", workers=1, progress=False)
        >>> summary.documents, summary.tokens, summary.dtype
        (2, 3, 'uint8')
        >>> DocumentStore.open(f"{tmp.name}/store").read_ranges([0], [3])["input_ids"].tolist()
        [1, 2, 2]
        >>> tmp.cleanup()
    """
    started = time.perf_counter()
    check_int("rows_per_part", rows_per_part, minimum=1)
    if bytes_per_part is not None:
        check_int("bytes_per_part", bytes_per_part, minimum=1)
    check_int("tokens_per_shard", tokens_per_shard, minimum=4096)
    if tokens_per_shard % 4096:
        raise ValueError(
            f"tokens_per_shard={tokens_per_shard} must be a multiple of 4096 (the chunk), e.g. "
            f"{tokens_per_shard // 4096 * 4096 or 4096}"
        )
    text_field = field if messages_field is None else messages_field
    if not isinstance(text_field, str) or not text_field:
        raise TypeError(f"field must be a non-empty string, got {text_field!r}")
    tokenizer_path = os.path.abspath(tokenizer)  # a directory stays one: chat needs its config
    files = tokenizer_files(tokenizer_path)  # read once: the key is what the encoder loads
    encoder = Encoder(tokenizer_from(files["tokenizer.json"], tokenizer_path), bos=bos, eos=eos)
    units = plan_units(inputs, rows_per_part, bytes_per_part)
    key = {
        "tokenizer_sha256": files_digest(files),
        "field": field if messages_field is None else None,
        "messages_field": messages_field,
        "bos": encoder.bos,
        "eos": encoder.eos,
        "dtype": encoder.dtype.name,
        "skip_bad": skip_bad,
        "rows_per_part": rows_per_part,
        "bytes_per_part": bytes_per_part,
        "tokens_per_shard": tokens_per_shard,
    }
    settings = {  # every task's, beside its unit and part
        "tokenizer": tokenizer_path, "tokenizer_sha256": key["tokenizer_sha256"],
        "field": text_field, "messages": messages_field is not None, "bos": bos, "eos": eos,
        "skip_bad": skip_bad, "tokens_per_shard": tokens_per_shard,
    }  # fmt: skip
    try:
        out = Output(output)  # held by this run until it returns
    except (FileExistsError, NotADirectoryError) as error:
        if error.filename is None:  # not mkdir over a file: another run holds the output
            raise
        where = Path(os.path.abspath(error.filename))
        file = next((p for p in (where, *where.parents) if p.is_file()), where)
        raise FileExistsError(
            f"the output {str(output)!r} must be a directory, but {file} is a file; name a new "
            "directory (or a URL) for the store"
        ) from None
    try:
        engine_options = {"workers": workers, "address": ray_address}

        def uncut() -> list[Any]:  # the units of a store an older psdp made (`made_uncut`)
            return plan_units(inputs, rows_per_part, None, cut_objects=False)

        meta = _run(out, (units, uncut), key, settings, engine, engine_options, progress, started)
    finally:
        out.release()
    built = []
    if packs:  # after the release: the store is complete, and the index step only reads it
        built = build_indexes(output, packs, workers=workers, engine=engine,
                              ray_address=ray_address, progress=progress)  # fmt: skip
    summary = _summary(out.name, meta, time.perf_counter() - started)
    return dataclasses.replace(summary, indexes=built) if built else summary


def _run(out: Output, plans: tuple[list[Any], Any], key: dict[str, Any], settings: dict[str, Any],
         engine: str, engine_options: dict[str, Any], progress: bool,
         started: float) -> dict[str, Any]:  # fmt: skip
    """Plans, runs the pending tasks and commits the store at ``out``; returns its manifest."""
    found = out.read()
    units = plans[1]() if made_uncut(found) else plans[0]
    meta = planned(found, units, key, out.name, out.root)
    out.commit(meta)
    out.clean(meta)  # after the commit: the manifest replaced no longer names an old index
    by_id = {unit_id(recorded(u, out.root)): u for u in units}
    tasks = [
        Task(by_id[unit_id(u)], u["part"], out.part(u["part"]), **settings) for u in pending(meta)
    ]
    runner = engine_named(engine, **engine_options)
    planned_parts = len(meta["units"]) + len(meta.get("append", {}).get("units", []))
    # records, as tasks read them (a part can be a whole large file): no total is known before
    bar = tqdm(unit=" records", unit_scale=True, desc=f"prepare {out.name}",
               disable=not progress)  # fmt: skip
    done = {"documents": 0, "tokens": 0, "parts": planned_parts - len(tasks)}

    def show() -> None:
        elapsed = max(time.perf_counter() - started, 1e-9)
        bar.set_postfix_str(
            f"parts {done['parts']}/{planned_parts}, {done['documents'] / elapsed:,.0f} docs/s, "
            f"{done['tokens'] / elapsed:,.0f} tokens/s",
            refresh=False,
        )

    def moved(step: Progress) -> None:
        done["documents"] += step.documents
        done["tokens"] += step.tokens
        show()
        bar.update(step.records)

    # The manifest names every part, so a commit per part would write O(parts^2) bytes in all:
    # about COMMITS commits a run instead (a kill redoes at most the parts since the last one).
    every, uncommitted = max(1, len(tasks) // COMMITS), 0
    try:
        # no bar, no reports: a task's reports cross processes (or Ray) to reach it
        reports = moved if progress else None
        for result in runner.map_unordered(run_task, tasks, on_progress=reports):
            meta = with_part(meta, result)
            uncommitted += 1
            if uncommitted == every:
                out.commit(meta)
                uncommitted = 0
            done["parts"] += 1
            show()
    finally:
        bar.close()
        runner.close()
        if uncommitted:  # the parts finished before an error (or the last few) are kept
            out.commit(meta)
    if not meta.get("complete") or "append" in meta:
        _check_records(meta)
        meta = finished(meta)
        out.write_index(meta)
        out.commit(meta)
        out.clean(meta)
    return meta


def _check_records(meta: dict[str, Any]) -> None:
    """Raises if no input holds a single record (empty files): no field name is to blame."""
    parts = [(u, meta["parts"][u["part"]]) for u in meta["units"]]
    if any(p["num_documents"] or p["empty"] or p["skipped"] for _, p in parts):
        return
    files = sorted({u["file"] + (" (0 bytes)" if u["version"] == "0" else "") for u, _ in parts})
    more = f" and {len(files) - 5} more" if len(files) > 5 else ""
    raise ValueError(
        f"the inputs hold no record at all ({', '.join(files[:5])}{more}: empty, or only blank "
        "lines): nothing to store; name inputs that hold records (an empty file may be a failed "
        "download or copy)"
    )


def _summary(name: str, meta: dict[str, Any], seconds: float) -> PrepareSummary:
    parts = [meta["parts"][u["part"]] for u in meta["units"]]
    skipped: dict[str, int] = {}
    for part in parts:
        for reason, count in part["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
    return PrepareSummary(
        output=name,
        documents=meta["num_documents"],
        tokens=meta["num_tokens"],
        dtype=meta["leaves"]["input_ids"],
        parts=len(parts),
        empty=sum(p["empty"] for p in parts),
        skipped=skipped,
        examples=[tuple(e) for p in parts for e in p["examples"]][:10],
        seconds=seconds,
    )


class _CallablePackage(types.ModuleType):
    """``psdp.prepare`` names both this package and its function, and importing any of its
    modules binds the name to the package: so the package, called, is the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> PrepareSummary:
        return prepare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__all__ = ["BadRecordError", "CorruptFileError", "PrepareSummary", "build_indexes", "prepare"]
