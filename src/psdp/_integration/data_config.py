"""`DataConfig`: the whole language-model data path in one config (``docs/guides/trainer.md``).

Named document stores (written by ``psdp prepare`` or `write_documents`), each cut into rows of
``seq_len`` tokens by one view (`TokenSequences`, or `PackedSequences` with a strategy), mixed by
weight (a `Mixture`, with weight stages that start at steps), read by a `DataLoader` with the
loader's four option groups; plus eval sets, each read once by an `eval_loader`. The config is
frozen dataclasses of plain values, so it parses from YAML and flags with draccus like
`LoaderConfig`, which it uses to build and restore the loader.

Its sections have modules of their own: `SourceConfig` (``source_config.py``: a store, opened
and checked fresh), `ViewConfig` (``view_config.py``), `StageConfig` and `MixtureConfig`
(``mixture_config.py``, with the `Mixture` a config builds); this module checks the whole and
builds the loaders.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from psdp._checks import is_int
from psdp._integration.loader_config import LoaderConfig
from psdp._integration.mixture_config import (
    ConfiguredMixture,
    ConfiguredPackedStages,
    ConfiguredStages,
    MixtureConfig,
    StageConfig,
)
from psdp._integration.source_config import SourceConfig
from psdp._integration.view_config import ViewConfig
from psdp._plan.leaves import TOKENS
from psdp._plan.mixture import MIXTURE_ROWS
from psdp._plan.options import (
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
    check_groups,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from psdp._runtime.loader import DataLoader

__all__ = ["DataConfig"]


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
    """The mixture's block size, seed, and whether it shuffles the sources' rows."""

    eval: dict[str, SourceConfig] = field(default_factory=dict)
    """Eval sets, name -> store, each read once in order by a loader of its own."""

    eval_batch_size: int | None = None
    """Rows per eval batch (unset: order.global_batch_size)."""

    order: OrderOptions = field(default_factory=OrderOptions)
    """global_batch_size (or a schedule), skips, drop_last... (shuffle stays unset: the mixture
    orders the rows, mixture.shuffle)."""

    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    """How leaves are split over the mesh (train and eval)."""

    output: OutputOptions = field(default_factory=OutputOptions)
    """pad_value, mask_key, dtypes (train and eval)."""

    reading: ReadingOptions = field(default_factory=ReadingOptions)
    """prefetch, read_threads, timeouts, retries (train and eval)."""

    lanes: int | None = None
    """With length stages (a stage that sets ``seq_len``): the lanes each source is read in, at
    least the most rows of one source a batch holds, e.g. the largest global_batch_size
    (``docs/concepts/length-stages.md``); unset without them."""

    unit_tokens: int | None = None
    """With length stages: the grain of each source's epoch order, in tokens (unset: the
    longest stage's seq_len; on a restore, the saved run's)."""

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
                "(the mixture's seed is mixture.seed; mixture.shuffle: false reads every source "
                "in store order)"
            )
        if self.stages is not None:
            object.__setattr__(self, "stages", _stages(self.stages, self.sources))
        self._check_lengths()
        if (
            self.stages is None
            and self.sources
            and not any(1 if s.weight is None else s.weight for s in self.sources.values())
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
            "stages": None if self.stages is None else [_stage_dict(s) for s in self.stages],
            "seq_len": self.seq_len,
            "view": asdict(self.view),
            "mixture": asdict(self.mixture),
            "eval": {n: asdict(s) for n, s in self.eval.items()},
            "eval_batch_size": self.eval_batch_size,
            **{n: groups[n] for n in _GROUPS},
            **{
                n: getattr(self, n)
                for n in ("lanes", "unit_tokens")
                if getattr(self, n) is not None
            },
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
            lanes=raw.get("lanes"),
            unit_tokens=raw.get("unit_tokens"),
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
        mesh, and ``mixture.source_leaf`` turned on (a tag, no other row). What decides the rows
        already trained on may not: ``seq_len``, the view, the stores (their sizes),
        ``mixture``, and stages that start before the resume step; each is a `ValueError`
        naming both values.
        """
        from psdp._runtime.state import check_state

        state = check_state(state)
        source, _ = self.restored_source(state)
        return self._loader_config().restore(state, mesh, source=source, batch_axes=batch_axes)

    def restored_source(self, state: Mapping[str, Any]) -> tuple[Any, OrderOptions]:
        """The train source and order that `restore` resumes from ``state`` with (its stages
        where the resumed run puts them, the order resuming at the state's step): what each
        later step of the resumed run reads, known without a mesh (``psdp inspect --state``).
        """
        from psdp._runtime.state import check_state, restored_order

        state = check_state(state)
        order = restored_order(state, {"order": self.order})
        saved = [name for name, _ in (state["source"].get("definition") or {}).get("sources", [])]
        # a state saved before the sources were sorted keeps its listing order
        names = saved if sorted(saved) == sorted(self.sources) else None
        config = self
        recorded = (state["source"].get("definition") or {}).get("unit_tokens")
        if self.unit_tokens is None and recorded is not None and self._lengths() is not None:
            # unset is the longest seq_len, which a later stage changed on this resume may move;
            # every sample depends on the saved grain, so unset resumes with it
            config = replace(self, unit_tokens=recorded)
        return config.train_source(self._resumed_stage_offsets(state, order), names), order

    def _resumed_stage_offsets(
        self, state: Mapping[str, Any], order: OrderOptions
    ) -> dict[int, int]:
        """Stage index -> sample offset on a resume: a stage before the resume has the saved
        run's offset (its batch sizes may have changed since), a later one its offset under the
        resumed ``order`` (a step's moves with the batch size; an offset's or tokens' does not,
        so one before the resume must be where the saved run had it). Logs where each stage now
        starts."""
        saved = (state["source"].get("definition") or {}).get("stages", [])
        saved_past = [stage[0] for stage in saved if stage[0] < state["offset"]]
        stages = self.stages or []
        # a step before the resume is the saved run's (the resumed order starts after it)
        by_step = [i for i, s in enumerate(stages) if s.step is not None and s.step < state["step"]]
        resumed: dict[int, int] = {}
        for i, s in enumerate(stages):
            if i not in by_step:  # the stages before it where the resumed run has them
                before = [saved_past[j] if j < len(saved_past) else resumed.get(j, 0)
                          for j in range(i)]  # fmt: skip
                resumed[i] = self._stage_offset(s, order, before)
        past = sorted(by_step + [i for i, o in resumed.items() if o < state["offset"]])
        if len(past) > len(saved_past):
            stage = stages[past[len(saved_past)]]
            raise ValueError(
                f"DataConfig.stages: the stage at {stage.where} starts before step "
                f"{state['step']} (offset {state['offset']}), where this run resumes, but the "
                f"saved run had {len(saved_past)} stage(s) before it: the steps before the "
                f"resume were already trained on; start the stage at step {state['step']} or "
                f"later (by offset: {state['offset']} or later)"
            )
        for i, saved_at in zip(past, saved_past, strict=False):
            # a stage by offset or tokens is where the user put it, not moved by the batch sizes
            if i in resumed and resumed[i] != saved_at:
                raise ValueError(
                    f"DataConfig.stages: the stage at {stages[i].where} starts at sample offset "
                    f"{resumed[i]}, before step {state['step']} (offset {state['offset']}), where "
                    f"this run resumes, but the saved run started it at {saved_at}: the steps "
                    f"before the resume were already trained on; put it back at offset "
                    f"{saved_at}, or edit stages from offset {state['offset']} on"
                )
        offsets = resumed | dict(zip(past, saved_past, strict=False))
        steps = order.step_offsets(MIXTURE_ROWS)
        for index, stage in enumerate(stages):
            offset = offsets[index]
            when = "before the resume" if index in past else _step_text(steps, offset)
            logger.info(
                "DataConfig.stages[%d] (at %s) starts at sample offset %d (%s)",
                index, stage.where, offset, when,
            )  # fmt: skip
        self._warn_batch_unchanged(offsets, order, after=state["offset"])
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
    ) -> Any:
        """The training sources' views as one `Mixture` (one source: weight 1), in sorted order
        of their names: the order a YAML or ``draccus.dump`` lists them in changes nothing. With
        length stages (a stage sets ``seq_len``), a `StagedTokens` of the stores instead.

        ``stage_offsets``: stage index -> its sample offset (default: where the stage's step,
        offset or tokens put it under ``order``); ``names``: the sources in another order (a
        restore's)."""
        if not self.sources:
            raise ValueError(
                "DataConfig.sources is empty; name at least one store, e.g. sources: {code: "
                "{store: tokens/code}}"
            )
        listed = sorted(self.sources) if names is None else list(names)
        lengths = self._lengths()
        if lengths is None:
            views = {name: self._view(self.sources[name], f"source {name!r}") for name in listed}
            views = self._common_ids(views)
        else:  # the stages' own views read the stores: no view of stage 0's seq_len alone
            opened = {name: self.sources[name].open(f"source {name!r}") for name in listed}
            tokens = self._common_dtype(opened)
            stores = {name: s if tokens is None else s.with_dtypes({TOKENS: tokens})
                      for name, s in opened.items()}  # fmt: skip
        if self.stages is None:
            weights = {n: 1.0 if s.weight is None else s.weight for n, s in self.sources.items()}
            stages = [(0, weights)]
        else:
            given = stage_offsets or {}
            stages = []
            for i, s in enumerate(self.stages):
                before = [start for start, _ in stages]
                offset = given[i] if i in given else self._stage_offset(s, self.order, before)
                stages.append((offset, s.weights))
            _check_stage_order(self.stages, [start for start, _ in stages])
            if not given:  # a restore's offsets were checked against its own order
                self._warn_batch_unchanged(dict(enumerate(s for s, _ in stages)), self.order)
        if lengths is not None:
            staged = [(start, n, w) for (start, w), n in zip(stages, lengths, strict=True)]
            common: dict[str, Any] = {"lanes": self.lanes, "block_size": self.mixture.block_size,
                      "seed": self.mixture.seed, "shuffle": self.mixture.shuffle,
                      "targets": self.view.targets, "eos_id": self.view.eos_id,
                      "pad_id": self.view.pad_id, "view": self._view_record(),
                      "source_leaf": self.mixture.source_leaf}  # fmt: skip
            if self.view.packing is None:
                return ConfiguredStages(stores, staged, unit_tokens=self.unit_tokens, **common)
            packed = ConfiguredPackedStages(
                stores, staged, long_documents=self.view.long_documents,
                max_segments=self.view.max_segments, **common,
            )  # fmt: skip
            self._check_lowered(packed, listed)
            return packed
        return ConfiguredMixture(
            views,
            stages=stages,
            block_size=self.mixture.block_size,
            seed=self.mixture.seed,
            shuffle=self.mixture.shuffle,
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
        kwargs = self.view.view_kwargs()
        try:
            if self.view.window is not None:
                kwargs["index"] = self._pack_index(source, store)
            return kind(store, self.seq_len, **kwargs)
        except ValueError as error:
            raise ValueError(f"{role} ({source.store!r}): {error}") from None
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{role} ({source.store!r}): {error}") from None

    def _pack_index(self, source: SourceConfig, store: Any) -> Any:
        """The pack index ``psdp index`` built beside the store for the view's packing
        (checked), or ``None`` for a small store without one (built at start-up)."""
        from psdp.sources.documents.beside import PackSettings
        from psdp.sources.views.pack_index import pack_index_beside

        assert self.seq_len is not None and self.view.packing is not None
        assert self.view.window is not None
        if source.length_bounds() is not None:  # psdp index builds no pack index of a selection
            return self._selection_pack_index(source, store)
        settings = PackSettings(
            self.seq_len, self.view.window, self.view.packing, self.view.long_documents,
            self.view.seed, eos=self.view.eos_id is not None,
            max_segments=self.view.max_segments,
        )  # fmt: skip
        return pack_index_beside(source.store, store, settings, format=source.format)

    def _selection_pack_index(self, source: SourceConfig, store: Any) -> None:
        """``None`` (planned at start-up) for a small selection by length; a larger one is
        refused: no pack index is built for a selection yet."""
        from psdp.sources.documents.beside import IN_MEMORY_DOCUMENTS

        if store.num_documents <= IN_MEMORY_DOCUMENTS:
            return None
        raise ValueError(
            f"packing in windows reads a pack index, which psdp index does not build for a "
            f"selection by length ({source.length_bounds()}: {store.num_documents:,} documents,"
            f" more than {IN_MEMORY_DOCUMENTS:,} to plan at start-up on every host); read this "
            "source concatenated then split (view.packing unset), or narrow the selection"
        )

    def _common_ids(self, views: dict[str, Any]) -> dict[str, Any]:
        """The views with their stores' token ids read as one dtype, so that they mix: numpy's
        common type of theirs (uint16 and int32: int32), int32 where that would be 64-bit
        (JAX's default holds no int64); each read checked (`DocumentStore.with_dtypes`)."""

        common = self._common_dtype({name: view.store for name, view in views.items()})
        if common is None:
            return views

        def again(view: Any) -> Any:  # the same view over the store read as ``common``
            kwargs = self.view.view_kwargs()
            if self.view.window is not None:  # the index it found or built, not built again
                kwargs["index"] = view.plan
            return type(view)(view.store.with_dtypes({TOKENS: common}), self.seq_len, **kwargs)

        return {
            name: view if view.store.leaves[TOKENS] == common else again(view)
            for name, view in views.items()
        }

    @staticmethod
    def _common_dtype(stores: Mapping[str, Any]) -> Any:
        """The token dtype the stores' ids are read as so that they mix (`_common_ids`'
        rule), or ``None`` where they already share one."""
        import numpy as np

        found = {store.leaves[TOKENS] for store in stores.values()}
        if len(found) < 2:
            return None
        common = np.result_type(*found)
        return np.dtype(np.int32) if common.itemsize == 8 else common

    def _stage_offset(
        self, stage: StageConfig, order: OrderOptions, before: Sequence[int] = ()
    ) -> int:
        """The stage's first sample offset: its step's first row under ``order``, its offset,
        or its tokens over ``seq_len`` (with length stages: over the lengths of the stages
        ``before`` it, which start at those offsets); a block boundary."""
        kind, value = stage.start
        lengths = self._lengths()
        if kind == "offset":
            offset = value
        elif kind == "tokens" and lengths is not None:
            offset = _token_offset(stage, value, before, lengths)
        elif kind == "tokens":
            if self.seq_len is None or value % self.seq_len:
                raise ValueError(
                    f"DataConfig.stages: the stage at tokens {value} needs a whole number of "
                    f"rows of seq_len={self.seq_len} before it, but {value} / {self.seq_len} is "
                    f"not one; use a multiple of seq_len, e.g. tokens: "
                    f"{value // (self.seq_len or 1) * (self.seq_len or 1)}"
                )
            offset = value // self.seq_len
        else:
            if order.global_batch_size is None:
                raise ValueError(
                    f"DataConfig.stages start at steps (step {value}), which need "
                    "order.global_batch_size to find their sample offsets; set it, e.g. "
                    "order: {global_batch_size: 256}"
                )
            offset = order.step_offsets(MIXTURE_ROWS).info(value).offset
        block = self.mixture.block_size
        if offset % block:
            what = "step" if kind == "step" else kind
            raise ValueError(
                f"DataConfig.stages: the stage at {stage.where} starts at sample offset {offset}, "
                f"which is not a multiple of mixture.block_size={block} (a block takes one "
                f"stage's weights); start it at a {what} whose offset is a multiple of {block}, "
                f"or use a block_size that divides {offset}"
            )
        return offset

    def _warn_batch_unchanged(
        self, offsets: Mapping[int, int], order: OrderOptions, after: int = 0
    ) -> None:
        """Warns where a length stage (from sample offset ``after`` on) changes ``seq_len`` at a
        step where a batch *schedule* keeps its size: a schedule shows the batch was meant to
        follow the lengths, and a resume at another batch size moves stages declared by offset
        or tokens to other steps while the schedule's steps stay (``docs/guides/long-context.md``).
        A constant batch size is a choice, never warned about."""
        lengths, stages = self._lengths(), self.stages or []
        if lengths is None or not isinstance(order.global_batch_size, list | tuple):
            return
        steps = order.step_offsets(MIXTURE_ROWS)
        changes = [step for step, _ in order.global_batch_size][1:]
        for index in range(1, len(lengths)):
            offset = offsets[index]
            if lengths[index] == lengths[index - 1] or offset < after:
                continue
            step = steps.step_at(offset)
            if step <= steps.start[0] or steps.info(step).offset != offset:
                continue  # the run's first step, or inside a step: refused where it is read
            rows = steps.info(step).batch_size
            if steps.info(step - 1).batch_size == rows:
                logger.warning(
                    "DataConfig.stages[%d] (at %s) changes seq_len from %d to %d at step %d, "
                    "but order.global_batch_size keeps %d rows there (its schedule changes at "
                    "steps %s), so a step's tokens go from %d to %d; if the batch size was "
                    "meant to change with seq_len, move that change to step %d",
                    index, stages[index].where,
                    lengths[index - 1], lengths[index], step, rows, changes,
                    rows * lengths[index - 1], rows * lengths[index], step,
                )  # fmt: skip

    def _lengths(self) -> list[int] | None:
        """Each stage's seq_len, where a stage sets one (length stages); else ``None``."""
        if not self.stages or all(s.seq_len is None for s in self.stages):
            return None
        lengths = [self.seq_len or 0]
        for stage in self.stages[1:]:
            lengths.append(lengths[-1] if stage.seq_len is None else stage.seq_len)
        return lengths

    def _check_lengths(self) -> None:
        """Length stages' own rules, each naming the stage and the field, before a store opens."""
        given = [s for s in self.stages or [] if s.seq_len is not None]
        if not given:
            for name in ("lanes", "unit_tokens"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"DataConfig.{name}={getattr(self, name)!r} is set, but no stage sets "
                        "seq_len (it reads length stages only); drop it, or give a stage its "
                        "seq_len, e.g. stages: [{step: 0, weights: {code: 1}}, {step: 1000, "
                        "weights: {code: 1}, seq_len: 32768}]"
                    )
            return
        stage = self.stages[0]  # type: ignore[index]
        first = next((s for s in self.stages[1:] if s.seq_len is not None), given[0])  # type: ignore[index]
        if self.seq_len is None:
            raise ValueError(
                f"DataConfig.seq_len is unset, but the stage at {first.where} sets seq_len="
                f"{first.seq_len} (length stages): DataConfig.seq_len is the first stage's; set "
                "it, e.g. seq_len: 4096"
            )
        if stage.seq_len is not None and stage.seq_len != self.seq_len:
            raise ValueError(
                f"DataConfig.stages: the first stage (at {stage.where}) sets seq_len="
                f"{stage.seq_len}, but DataConfig.seq_len={self.seq_len!r} is the first stage's; "
                f"drop the stage's seq_len or set seq_len: {stage.seq_len}"
            )
        packed = self.view.packing is not None
        wrong = [
            (f"view.packing={self.view.packing!r}", "a packed source's lanes pack greedily "
             "(each row takes the next documents that fit); use packing: greedy")
            if packed and self.view.packing != "greedy" else None,
            (f"view.window={self.view.window!r}", "a packed source's lanes plan their own "
             "packing (no pack index); drop view.window") if packed and self.view.window else None,
            (f"view.seed={self.view.seed!r}", "the documents' order is keyed by mixture.seed; "
             "drop view.seed") if packed and self.view.seed is not None else None,
            (f"unit_tokens={self.unit_tokens!r}", "a packed source's lanes are lanes of "
             "documents, not of units of tokens; drop unit_tokens")
            if packed and self.unit_tokens is not None else None,
        ]  # fmt: skip
        for what, fix in filter(None, wrong):
            raise ValueError(
                f"DataConfig.stages: the stage at {first.where} sets seq_len={first.seq_len} "
                f"(length stages), with {what}: {fix}"
            )
        if self.lanes is None:
            raise ValueError(
                f"DataConfig.lanes is unset, but the stage at {first.where} sets seq_len="
                f"{first.seq_len}: length stages read each source in lanes, at least the most "
                "rows of one source a batch holds (docs/concepts/length-stages.md); set it, "
                "e.g. lanes: 256 for batches of up to 256 rows"
            )
        for name in ("lanes", "unit_tokens"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(
                    f"DataConfig.{name} must be an int >= 1 or unset, got {value!r}; e.g. "
                    f"{name}: 256"
                )

    def _check_lowered(self, packed: Any, names: Sequence[str]) -> None:
        """A packed view's stage that lowers ``seq_len`` below a document it weights would cut
        documents an earlier stage held whole: refused, naming the stage and the field."""
        cut = packed.plan.lowered_cut()
        if cut is None:
            return
        index, source, document, slots, before = cut
        assert self.stages is not None
        stage = self.stages[index]
        raise ValueError(
            f"DataConfig.stages: the stage at {stage.where} lowers seq_len from {before} to "
            f"{packed.plan.stages[index].seq_len} on a packed view (view.packing="
            f"{self.view.packing!r}), below document {document} of source {names[source]!r} "
            f"({slots} tokens{' with its EOS' if self.view.eos_id is not None else ''}), so "
            f"packing would {self.view.long_documents} documents an earlier stage held whole; "
            f"give that stage a seq_len >= {slots}, or keep seq_len from rising and falling"
        )

    def _view_record(self) -> dict[str, Any]:
        """What decides every row besides the mixture: recorded in the loader's state."""
        return {"seq_len": self.seq_len, **asdict(self.view)}

    def _loader_config(self) -> LoaderConfig:
        return LoaderConfig(**{n: getattr(self, n) for n in _GROUPS})


#: The loader's option groups, as `LoaderConfig` holds them.
_GROUPS = ("order", "sharding", "output", "reading")


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
    steps = [s.step for s in stages if s.step is not None]
    if stages[0].start[1] != 0 or any(a >= b for a, b in pairwise(steps)):
        by_step = len(steps) == len(stages)
        starts = steps if by_step else [s.where for s in stages]
        raise ValueError(
            f"DataConfig.stages start at {'steps ' if by_step else ''}{starts}: the first must start at step 0 and the "
            f"starts must increase; {example}"
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
                f"DataConfig.stages: the stage at {stage.where} weights {unknown[0]!r}, which "
                f"is not a source (the sources are {sorted(sources)}); name sources only"
            )
    return stages


def _token_offset(
    stage: StageConfig, tokens: int, before: Sequence[int], lengths: Sequence[int]
) -> int:
    """The offset where a stage of length stages starting at a count of ``tokens`` begins: the
    rows before it are the earlier stages' (stage ``m`` from ``before[m]``, rows of
    ``lengths[m]``), so it is the last earlier stage's start plus the rest of the tokens over
    that stage's ``seq_len``.

    Examples:
        >>> _token_offset(StageConfig(tokens=1024, weights={"a": 1}), 1024, [0, 64], [8, 32])
        80
    """
    if not before:
        return 0  # the first stage, which starts at 0 (checked)
    index = len(before)
    spent = sum((before[m + 1] - before[m]) * lengths[m] for m in range(index - 1))
    rest, seq_len = tokens - spent, lengths[index - 1]
    if rest < 0 or rest % seq_len:
        nearest = before[-1] + max(0, rest) // seq_len
        raise ValueError(
            f"DataConfig.stages: the stage at {stage.where} (stage {index}) needs a whole number "
            f"of rows of seq_len={seq_len} after the {spent} tokens before stage {index - 1}'s "
            f"start (offset {before[-1]}), but {tokens} - {spent} = {rest} is not one; use "
            f"tokens: {spent + (nearest - before[-1]) * seq_len} (offset {nearest}) or another "
            "multiple"
        )
    return before[-1] + rest // seq_len


def _step_text(steps: Any, offset: int) -> str:
    """Where ``offset`` falls in the run's steps, for the resume log: ``"step 12"`` where it
    starts a step, else the step that holds it (a length stage there is refused at that step).

    Examples:
        >>> from psdp._plan.offsets import StepOffsets
        >>> _step_text(StepOffsets.create(None, 8), 16), _step_text(StepOffsets.create(None, 8), 20)
        ('step 2', 'inside step 2, offsets 16 to 23')
    """
    step = steps.step_at(offset)
    inside = steps.info(max(step - 1, steps.start[0]))
    if (
        steps.info(step).offset == offset
        or not inside.offset < offset < inside.offset + inside.rows
    ):
        return f"step {step}"  # or the first step after it, where a skip passes over it
    return (
        f"inside step {inside.step}, offsets {inside.offset} to {inside.offset + inside.rows - 1}"
    )


def _stage_dict(stage: StageConfig) -> dict[str, Any]:
    """A stage as YAML values: ``seq_len`` only where set (a length stage)."""
    out = asdict(stage)
    if out["seq_len"] is None:
        del out["seq_len"]
    return out


def _check_stage_order(stages: Sequence[StageConfig], offsets: Sequence[int]) -> None:
    """Raises where a stage does not start after the stage before it, once every start is a
    sample offset (a step's under the batch schedule)."""
    for index in range(1, len(stages)):
        if offsets[index] <= offsets[index - 1]:
            raise ValueError(
                f"DataConfig.stages: the stage at {stages[index].where} starts at sample offset "
                f"{offsets[index]}, not after the stage before it (at {stages[index - 1].where}, "
                f"offset {offsets[index - 1]}); order the stages by where they start"
            )


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
