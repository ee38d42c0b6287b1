"""``psdp inspect``: what a step of a data config trains on, and a saved loader state, in words
(``docs/reference/cli.md``, "psdp inspect").

A step of a `DataConfig` is known without a device or a loader: the order's step -> sample offset
map (`OrderOptions.step_offsets`) gives its offsets, the `Mixture` the config builds gives the
stage in force there, the per-source counts and each row's segments (``provenance``, which reads
no token), and one read of those offsets gives the tokens. Only the step's rows are read, so a
config over any corpus opens as fast as its stores do. The tokens are decoded with the tokenizer
the store was prepared with: the config's (or ``--tokenizer``), checked against the sha256 the
store's manifest records, so no text is shown through another tokenizer.

A loader state is read from a plain JSON file or from an Orbax checkpoint (a manager's folder,
a step of it, or the item itself), without importing Orbax: `psdp.orbax` writes the state as
Orbax's JSON item, a file named ``metadata`` in the item's folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psdp import DataConfig
from psdp._imports import import_optional
from psdp._plan.leaves import TOKENS
from psdp._plan.mixture import MIXTURE_ROWS
from psdp._runtime.state import check_state

__all__ = ["StepReport", "describe_state", "load_config", "read_state", "step_report"]

#: Where a trainer's YAML may keep its run length beside the data section (the example trainer's
#: ``steps``, Levanter's ``trainer.num_train_steps``).
RUN_STEPS = (("steps",), ("num_train_steps",), ("trainer", "num_train_steps"))
#: The file Orbax's JSON handler (so `psdp.orbax`) writes an item to.
ORBAX_ITEM_FILE = "metadata"


@dataclass(frozen=True)
class Segment:
    """A run of one document's tokens in a row: ``tokens`` ``[start, stop)`` of document
    ``document`` sit from ``column`` on; ``text`` is their decoding (``None``: no tokenizer)."""

    document: int
    start: int
    stop: int
    column: int
    ids: list[int]
    text: str | None


@dataclass(frozen=True)
class Row:
    """One row of the step: its sample offset, source, segments and padding columns."""

    offset: int
    source: str
    segments: list[Segment]
    padding: int


@dataclass(frozen=True)
class StepReport:
    """What step ``step`` of a data config trains on (`step_report`); ``str()`` says it in words.

    ``stage`` is the index of the mixture stage in force, ``stage_start`` where its config puts
    it (``"step 4"``, ``"offset 4096"``, ``"tokens 2097152"``), ``stage_offset`` the sample offset
    it starts at in this run, and ``weights`` its weights; ``counts`` the rows each source gives the step.
    """

    step: int
    offset: int
    batch_size: int
    rows: int
    epoch: int
    stage: int
    stages: int
    stage_start: str
    stage_offset: int
    weights: dict[str, float]
    counts: dict[str, int]
    decoded: dict[str, str] = field(default_factory=dict)
    """source -> how its tokens were decoded (the tokenizer's path, or why they were not)."""
    row_list: list[Row] = field(default_factory=list)
    seq_len: int | None = None
    """The stage's seq_len where the config has length stages (``None``: the config's one)."""

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (``psdp inspect --json``)."""
        out = {k: v for k, v in vars(self).items() if k != "row_list"}
        out["row_list"] = [
            {**vars(row), "segments": [vars(s) for s in row.segments]} for row in self.row_list
        ]
        return out

    def __str__(self) -> str:
        weights = ", ".join(f"{n} {_number(w)}" for n, w in self.weights.items())
        counts = ", ".join(f"{n} {c}" for n, c in self.counts.items())
        short = (
            f" ({self.batch_size - self.rows} padding rows)" if self.rows < self.batch_size else ""
        )
        lines = [
            f"step {self.step}: sample offsets {self.offset}-{self.offset + self.rows - 1}, "
            f"{self.rows} rows of a batch of {self.batch_size}{short}",
            f"stage {self.stage + 1} of {self.stages} (from {self.stage_start}, sample offset "
            f"{self.stage_offset}): "
            f"{'' if self.seq_len is None else f'seq_len {self.seq_len}, '}weights {weights}",
            f"rows per source: {counts}",
            *(f"decoded {name}: {how}" for name, how in self.decoded.items()),
        ]
        for row in self.row_list:
            tokens = sum(s.stop - s.start for s in row.segments)
            lines += [
                "",
                f"row {row.offset - self.offset} (sample offset {row.offset}), {row.source}: "
                f"{len(row.segments)} segment(s), {tokens} tokens, {row.padding} padding",
            ]
            for number, s in enumerate(row.segments, 1):
                shown = json.dumps(s.text, ensure_ascii=False) if s.text is not None else s.ids
                lines.append(
                    f"  [{number}] document {s.document} tokens {s.start}-{s.stop} at column "
                    f"{s.column}: {shown}"
                )
        return "\n".join(lines)


# ----------------------------------------------------------------------------------- configs
def load_config(path: str | Path) -> tuple[DataConfig, int | None]:
    """The `DataConfig` of a YAML or JSON file, and the run's length in steps where the file
    says it (a trainer's ``steps`` or ``num_train_steps``, Levanter's
    ``trainer.num_train_steps``; else ``None``). The file is a `DataConfig`'s fields, or a
    trainer config holding them under ``data:``.

    Examples:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> _ = (Path(folder) / "run.yaml").write_text("data: {seq_len: 8}\\nsteps: 100\\n")
        >>> config, steps = load_config(Path(folder) / "run.yaml")
        >>> config.seq_len, steps
        (8, 100)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"the config {str(path)!r} does not exist (or is not a file); give the YAML or JSON "
            "of a DataConfig, or a trainer's config with a data: section"
        )
    text = path.read_text()
    if path.suffix == ".json":
        raw = json.loads(text)
    else:
        yaml = import_optional("yaml", extra="draccus", needed_for="psdp inspect CONFIG.yaml")
        raw = yaml.safe_load(text)
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"the config {str(path)!r} holds {type(raw).__name__} {str(raw)[:60]!r}, not a "
            "mapping; give a DataConfig's fields (seq_len, sources, ...) or a data: section"
        )
    data = raw.get("data", raw) if isinstance(raw.get("data"), Mapping) else raw
    if "components" in data:  # Levanter's data section (LmDataConfig), not a DataConfig
        raise ValueError(
            f"the config {str(path)!r} holds Levanter's data section (components: "
            f"{', '.join(map(str, data['components'] or {}))}), which psdp inspect does not "
            "read; inspect the DataConfig psdp.levanter reads it as: save "
            "psdp.levanter.data_config(config.data, seq_len=..., batch_size=...).to_dict() as "
            "YAML (its mixture.seed set to the seed psdp.levanter.train_lm gives it) and give that"
        )
    try:
        config = DataConfig.from_dict(data)
    except TypeError as error:
        raise ValueError(f"the config {str(path)!r}: {error}") from None
    return config, _run_steps(raw)


def _run_steps(raw: Mapping[str, Any]) -> int | None:
    for keys in RUN_STEPS:
        found: Any = raw
        for key in keys:
            found = found.get(key) if isinstance(found, Mapping) else None
        if isinstance(found, int) and not isinstance(found, bool):
            return found
    return None


# -------------------------------------------------------------------------------------- steps
def step_report(
    config: DataConfig,
    step: int,
    *,
    run_steps: int | None = None,
    rows: slice | None = None,
    tokenizer: str | None = None,
    resumed_from: Mapping[str, Any] | None = None,
) -> StepReport:
    """What step ``step`` of ``config``'s train loader delivers: its offsets, stage, per-source
    counts, and the rows in ``rows`` (a slice of positions in the step; ``None``: all), each
    segment's tokens decoded.

    ``run_steps``: the run's length, where a step at or beyond it is refused. ``tokenizer``: a
    tokenizer.json (or model folder) for every source, instead of the config's own.
    ``resumed_from``: the loader state the run was restored from (`DataConfig.restore`), whose
    steps from its own on follow the config's order from the saved sample offset.
    """
    if config.order.global_batch_size is None:
        raise ValueError(
            "the config's order.global_batch_size is unset, so its steps have no sample offsets; "
            "set it, e.g. order: {global_batch_size: 256}"
        )
    if run_steps is not None and step >= run_steps:
        raise ValueError(
            f"--step {step} is beyond the run's schedule: the config trains steps 0-"
            f"{run_steps - 1} ({run_steps} steps); give a step below {run_steps}"
        )
    if resumed_from is None:
        mixture, order = config.train_source(), config.order
    elif step < resumed_from["step"]:
        raise ValueError(
            f"--step {step} is before step {resumed_from['step']}, where the run resumed from the "
            "state given: the earlier steps were read under the saved run's settings; inspect "
            "them without the state, with the saved run's config"
        )
    else:
        mixture, order = config.restored_source(resumed_from)
    info = order.step_offsets(MIXTURE_ROWS).info(step)
    if info.offset + info.rows > MIXTURE_ROWS:
        raise ValueError(
            f"--step {step} is beyond the schedule: its sample offset {info.offset} passes the "
            f"mixture's last row ({MIXTURE_ROWS - 1}); give a smaller step"
        )
    offsets = np.arange(info.offset, info.offset + info.rows, dtype=np.int64)
    stages = [_stage_of(s) for s in mixture.plan.stages]
    stage = int(np.searchsorted([s[0] for s in stages], info.offset, side="right")) - 1
    starts = [s.where for s in config.stages] if config.stages else ["step 0"]
    report = StepReport(
        step=step, offset=info.offset, batch_size=info.batch_size, rows=info.rows,
        epoch=info.epoch, stage=stage, stages=len(starts), stage_start=starts[stage],
        stage_offset=int(stages[stage][0]),
        weights={n: float(w) for n, w in zip(mixture.names, stages[stage][1], strict=True)},
        counts=mixture.counts(info.offset, info.rows), seq_len=stages[stage][2],
    )  # fmt: skip
    chosen = offsets if rows is None else offsets[rows]
    tokenizers, decoded = _tokenizers(config, mixture.names, tokenizer)
    report.decoded.update(decoded)
    report.row_list.extend(_rows(mixture, chosen, tokenizers))
    return report


def _stage_of(stage: Any) -> tuple[int, Sequence[float], int | None]:
    """A plan's stage as ``(start, weights, seq_len)``: a mixture's ``(start, weights)`` (no
    length of its own: ``None``), or a length stage (``LengthStage``)."""
    if len(stage) == 2:
        return stage[0], stage[1], None
    return stage.start, stage.weights, stage.seq_len


def _rows(mixture: Any, offsets: np.ndarray, tokenizers: Mapping[str, Any]) -> list[Row]:
    """The rows at ``offsets``: one read of their tokens, laid out by their provenance."""
    if not offsets.size:
        return []
    tokens = np.asarray(mixture.read(offsets)[TOKENS])
    source, _ = mixture.locate(offsets)
    table = mixture.provenance(offsets)
    out = []
    for position, offset in enumerate(offsets.tolist()):
        name = mixture.names[int(source[position])]
        segments, mine = [], table[table["row"] == position]
        for entry in mine:  # in column order
            column, length = int(entry["column"]), int(entry["stop"] - entry["start"])
            ids = tokens[position, column : column + length].tolist()
            decoder = tokenizers.get(name)
            text = None if decoder is None else decoder.decode(ids, skip_special_tokens=False)
            segments.append(Segment(int(entry["document"]), int(entry["start"]),
                                    int(entry["stop"]), column, ids, text))  # fmt: skip
        covered = int((mine["stop"] - mine["start"] + mine["eos"]).sum())  # an added EOS: 1 more
        out.append(Row(offset, name, segments, max(0, tokens.shape[1] - covered)))
    return out


def _tokenizers(
    config: DataConfig, names: Sequence[str], given: str | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Per source, the tokenizer its store was prepared with (checked against the sha256 the
    store records), and how each source's tokens are shown."""
    from psdp.prepare.tokenize import load_tokenizer, tokenizer_digest

    tokenizers, how = {}, {}
    for name in names:
        source = config.sources[name]
        path = given or source.tokenizer
        recorded = _recorded_digest(source.store)
        if path is None:
            how[name] = "not decoded (the config names no tokenizer: give --tokenizer)"
            continue
        if not Path(path).exists():
            raise FileNotFoundError(
                f"source {name!r}: the tokenizer {path!r} does not exist; give the tokenizer the "
                "store was prepared with (--tokenizer PATH)"
            )
        if recorded is None and given is None:
            how[name] = f"not decoded (the store records no tokenizer to check {path!r} against)"
            continue
        if recorded is None:  # a Levanter cache, a remote store: the user's word for it
            tokenizers[name] = load_tokenizer(path)
            how[name] = f"{path} (not checked: the store records no tokenizer)"
            continue
        if tokenizer_digest(path) != recorded:
            raise ValueError(
                f"source {name!r}: the tokenizer {path!r} is not the one the store "
                f"{source.store!r} was prepared with (its sha256 differs from the store's "
                f"{recorded[:12]}...); give that tokenizer (--tokenizer PATH)"
            )
        tokenizers[name], how[name] = load_tokenizer(path), path
    return tokenizers, how


def _recorded_digest(store: Any) -> str | None:
    """The tokenizer sha256 a local store's ``psdp prepare`` manifest records (``None``: none
    recorded, or a store in an object store, whose manifest is not read here)."""
    if not isinstance(store, str) or "://" in store:
        return None
    manifest = Path(store) / "psdp.json"
    if not manifest.is_file():
        return None
    found = json.loads(manifest.read_text())
    key = found.get("key") if isinstance(found, dict) else None
    return key.get("tokenizer_sha256") if isinstance(key, dict) else None


# -------------------------------------------------------------------------------------- states
def read_state(path: str | Path) -> tuple[dict[str, Any], Path]:
    """A loader state and the file it was read from: ``path`` is a JSON file of the state, or
    an Orbax checkpoint (a `CheckpointManager`'s folder: its latest step; a step's folder; or
    the item's folder) holding it as `psdp.orbax.LoaderSave` (or ``ocp.args.JsonSave``) wrote it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"the checkpoint {str(path)!r} does not exist; give a loader state's JSON file or an "
            "Orbax checkpoint folder"
        )
    if path.is_file():
        return _state_file(path), path
    candidates = _orbax_items(path)
    for file in candidates:
        state = _json_state(file)
        if state is not None:
            return check_state(state), file
    looked = ", ".join(str(f.relative_to(path)) for f in candidates) or "no JSON item"
    raise ValueError(
        f"the checkpoint {str(path)!r} holds no psdp loader state (looked at: {looked}); save "
        "it with psdp.orbax.LoaderSave(it) beside the model, or give the state's JSON file"
    )


def _orbax_items(path: Path) -> list[Path]:
    """The JSON item files an Orbax path may hold the state in: the item's, a step's items', or
    a manager folder's latest committed step's (a step folder is named by its number; Orbax
    renames an uncommitted one into place on its commit)."""
    steps = sorted((int(p.name), p) for p in path.iterdir() if p.is_dir() and p.name.isdigit())
    step = steps[-1][1] if steps else path
    files = [step / ORBAX_ITEM_FILE, *sorted(step.glob(f"*/{ORBAX_ITEM_FILE}"))]
    return [f for f in files if f.is_file()]


def _json_state(file: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) and "format" in found and "step" in found else None


def _state_file(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{str(path)!r} is not JSON ({error}); give a loader state's JSON file (what "
            "json.dumps(it.state()) wrote) or an Orbax checkpoint folder"
        ) from None
    try:
        return check_state(found)
    except ValueError as error:
        raise ValueError(f"{str(path)!r}: {error}") from None


def describe_state(state: Mapping[str, Any]) -> str:
    """A loader state in words: where the run resumes, its order, and its source.

    Examples:
        >>> print(describe_state({"format": "psdp.loader/2", "step": 5, "offset": 40,
        ...     "global_batch_size": 8, "skip_steps": [], "skip_offsets": [], "seed": 3,
        ...     "shuffle": True, "drop_last": False, "io_block": None, "window_blocks": 16,
        ...     "source": {"rows": 64, "leaves": {"None": ["int32", []]}}}))
        resumes at step 5, sample offset 40 (steps 0-4 done)
        batch size 8; shuffled, seed 3; a short batch padded
        source: 64 rows; leaves: the array int32 []
    """
    state = check_state(state)
    source = state["source"]
    definition = source.get("definition") or {}
    batch = state["global_batch_size"]
    if isinstance(batch, list):
        batch = "; ".join(f"{size} from step {start}" for start, size in batch)
    order = f"shuffled, seed {state['seed']}" if state["shuffle"] else "in order"
    if definition.get("sources"):  # the loader reads a mixture's offsets in order
        order = "in sample-offset order (the mixture shuffles)"
    last = "a short batch dropped" if state["drop_last"] else "a short batch padded"
    lines = [
        f"resumes at step {state['step']}, sample offset {state['offset']}"
        + (f" (steps 0-{state['step'] - 1} done)" if state["step"] else " (no step done)"),
        f"batch size {batch}; {order}; {last}",
    ]
    for kind in ("skip_steps", "skip_offsets"):
        if state[kind]:
            ranges = ", ".join(f"[{a}, {b})" for a, b in state[kind])
            lines.append(f"skipped {kind.split('_')[1]}: {ranges}")
    rows = "a stream" if source.get("rows") is None else f"{source['rows']} rows"
    if definition.get("sources"):
        rows = "a mixture (its rows are sample offsets)"
    leaves = ", ".join(
        f"{'the array' if k == 'None' else k} {v[0]} {v[1]}"
        for k, v in source.get("leaves", {}).items()
    )
    lines.append(f"source: {rows}; leaves: {leaves}")
    if definition.get("sources"):
        sizes = ", ".join(f"{name} ({n} rows)" for name, n in definition["sources"])
        lines.append(
            f"mixture of {sizes}; block_size {definition.get('block_size')}, seed "
            f"{definition.get('seed')}"
        )
        for start, weights in definition.get("stages", []):
            names = [name for name, _ in definition["sources"]]
            shown = ", ".join(f"{n} {_number(w)}" for n, w in zip(names, weights, strict=True))
            lines.append(f"  from sample offset {start}: weights {shown}")
    if definition.get("view"):
        view = {k: v for k, v in definition["view"].items() if v is not None}
        lines.append("view: " + ", ".join(f"{k} {v}" for k, v in view.items()))
    return "\n".join(lines)


def _number(value: float) -> str:
    """A weight as written: 3.0 as 3."""
    return str(int(value)) if float(value).is_integer() else str(value)
