"""psdp as Levanter's data loader (``docs/guides/levanter.md``; ``pip install 'psdp[levanter]'``).

`LevanterLoader` is psdp's `DataLoader` with the surface of Levanter's own (``iter_from_step``,
``__iter__``): each batch is Levanter's ``LmExample``, built as Levanter builds it (segments from
EOS, the last position's loss weight 0), its leaves sharded as Levanter's loader shards them.
`data_config` reads Levanter's data section (``LmDataConfig``: its caches, weights and stages)
into a `DataConfig`, and `train_lm` is Levanter's own ``train_lm`` fed by psdp: a Levanter YAML
runs unchanged with ``python -m psdp.levanter --config_path run.yaml``.

Levanter is imported on first use, so this module imports without it (its doctests need none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from psdp._imports import import_optional
from psdp._integration.data_config import DataConfig
from psdp._integration.mixture_config import MixtureConfig, StageConfig
from psdp._integration.source_config import SourceConfig
from psdp._integration.view_config import ViewConfig
from psdp._plan.leaves import TOKENS
from psdp._runtime.loader import DataLoader
from psdp.sources import PackedSequences, TokenSequences
from psdp.sources.documents.levanter import open_levanter_cache

#: why Levanter is imported: named in the ImportError when it is missing
_NEEDED_FOR = "psdp.levanter"
#: Levanter's ``max_segments_per_example`` for a component with ``pack: true``
LEVANTER_MAX_SEGMENTS = 64
#: the leaf numbering a packed row's segments (`PackedSequences`)
PACKED_SEGMENTS = "segment_ids"


def _levanter(module: str) -> Any:
    return import_optional(module, extra="levanter", needed_for=_NEEDED_FOR)


class LevanterLoader:
    """Batches of a psdp source as Levanter's ``LmExample``, with Levanter's loader surface.

    Every row of ``source`` (``input_ids`` of ``Pos.size`` tokens: `TokenSequences`,
    `PackedSequences`, a `Mixture` of them) becomes one example as Levanter's own datasets make
    it: ``LmExample.causal`` with segments starting after each ``eos_id`` and the last
    position's loss weight 0. The batch's leaves are laid out as Levanter's loader lays them:
    ``(batch, position)`` named arrays sharded by ``axis_resources`` on ``mesh``. Levanter's
    batches carry no row mask, so a training loader drops a short last step (``drop_last``);
    an evaluation loader (``evaluation=True``: one pass, in order) pads its last batch and
    zeroes the padding rows' loss weights, so Levanter's mask-weighted eval loss counts each
    real row once.

    Args:
        source: a psdp source whose rows hold ``input_ids`` of ``Pos.size`` tokens.
        mesh: the device mesh (Levanter's ``trainer.device_mesh``).
        Pos: Levanter's position axis (``config.model.max_Pos.resize(seq_len)``).
        batch_size: rows per step over all hosts, or psdp's schedule ``[(step, rows), ...]``.
        axis_resources: logical axis -> mesh axes (Levanter's ``compute_axis_mapping``);
            unset: ``{batch_axis_name: "data"}``.
        batch_axis_name: the batch axis's name (Levanter's ``trainer.config.batch_axis_name``).
        eos_id: the tokenizer's EOS id: a new segment starts after it (``None``: one segment).
        block_cross_document_attention: segments block attention (Levanter's default).
        segment_key: a per-token leaf of ``source`` numbering each row's segments (a packed
            view's ``segment_ids``): the segments, instead of ``eos_id``'s, as Levanter's packed
            examples take theirs from the pack (a document without an EOS is a segment too).
        loss_weight_key: a per-token leaf of ``source`` weighting the loss (a supervised cache's
            ``loss_weights``); unset: every token.
        evaluation: one pass in order, the last batch padded with zero-weight rows.
        shuffle: permute the rows (psdp's permutation, not Levanter's); a `Mixture` orders (and
            shuffles) its own rows, so leave it False for one: True is refused, naming why.
        seed: the shuffle's seed.
        options: more `DataLoader` options (e.g. ``prefetch``, ``read_threads``).
    """

    def __init__(
        self,
        source: Any,
        *,
        mesh: Any,
        Pos: Any,
        batch_size: Any,
        axis_resources: Mapping[str, Any] | None = None,
        batch_axis_name: str = "batch",
        eos_id: int | None = None,
        block_cross_document_attention: bool = True,
        segment_key: str | None = None,
        loss_weight_key: str | None = None,
        evaluation: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        name: str = "levanter",
        **options: Any,
    ):
        _check_pos(Pos)
        self.mesh, self.Pos, self.batch_axis_name = mesh, Pos, batch_axis_name
        mapping = {batch_axis_name: "data"} if axis_resources is None else dict(axis_resources)
        self.axis_resources = mapping
        names = (batch_axis_name, Pos.name)
        extra = (k for k in (loss_weight_key, segment_key) if k is not None)
        leaves = (TOKENS, *extra)
        order: dict[str, Any] = {"global_batch_size": batch_size}
        if evaluation:
            order.update(epochs=1, shuffle=False)
        elif not shuffle:
            order.update(shuffle=False, drop_last=True)
        else:
            order.update(shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(
            source,
            mesh=mesh,
            named_axes={leaf: names for leaf in leaves},
            axis_mapping={axis: mapping.get(axis) for axis in names},
            mask_key="mask" if evaluation else None,
            name=name,
            **order,
            **options,
        )
        width = self.loader.leaf(TOKENS).global_shape[-1]
        if width != Pos.size:
            self.loader.close()
            raise ValueError(
                f"the source's rows hold {width} tokens but Pos has size {Pos.size}; make the "
                f"rows Pos.size wide, e.g. TokenSequences(store, {Pos.size}) (without targets)"
            )
        self._leaves = leaves
        self._to_example = _example_maker(
            eos_id, block_cross_document_attention, loss_weight_key, segment_key, evaluation,
            mesh, mapping,
        )  # fmt: skip

    @classmethod
    def from_cache(cls, path: Any, *, Pos: Any, **kwargs: Any) -> LevanterLoader:
        """A loader over one finished Levanter cache split (the folder of ``shard_ledger.json``),
        concatenated and split into ``Pos.size``-token rows in order, as Levanter's unshuffled
        ``TokenSeqDataset`` cuts them; its int64 ids are read as int32, every read checked."""
        leaves = (TOKENS,) if kwargs.get("loss_weight_key") is None else (
            TOKENS, kwargs["loss_weight_key"])  # fmt: skip
        _check_pos(Pos)
        store = open_levanter_cache(path, leaves)
        return cls(TokenSequences(store, Pos.size, leaves=leaves), Pos=Pos, **kwargs)

    # ------------------------------------------------------------- Levanter's loader surface
    def iter_from_step(self, start_from_batch: int | None = None) -> Iterator[Any]:
        """The batches from step ``start_from_batch`` on (``None``: 0), as Levanter's loader."""
        step = 0 if start_from_batch is None else int(start_from_batch)
        return _Examples(self.loader.iter_from(step), self._to_example)

    def __iter__(self) -> Iterator[Any]:
        return self.iter_from_step(None)

    def has_len(self) -> bool:
        """Whether the loader ends (an evaluation loader does)."""
        return self.loader.options.order.epochs is not None

    def __len__(self) -> int:
        return len(self.loader)

    def batch_at(self, step: int) -> Any:
        """Step ``step``'s batch as an ``LmExample``, read directly."""
        return self._to_example(self.loader.batch_at(step))

    def state(self) -> dict[str, Any]:
        """The psdp loader's state (`DataLoader.state`)."""
        return self.loader.state()

    def close(self) -> None:
        self.loader.close()

    def __enter__(self) -> LevanterLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_pos(Pos: Any) -> None:
    if not isinstance(Pos, _levanter("haliax").Axis):
        raise TypeError(
            f"Pos must be Levanter's position axis, a haliax.Axis, got {Pos!r}; e.g. "
            "Pos=config.model.max_Pos.resize(seq_len)"
        )


class _Examples:
    """An iterator of converted batches that closes its psdp iterator with it."""

    def __init__(self, batches: Any, convert: Any):
        self._batches, self._convert = batches, convert

    def __iter__(self) -> _Examples:
        return self

    def __next__(self) -> Any:
        return self._convert(next(self._batches))

    def state(self) -> dict[str, Any]:
        """The psdp iterator's state: the step the next example is (what `psdp.orbax.LoaderSave`
        saves of the iterator the trainer reads)."""
        return self._batches.state()

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def _example_maker(
    eos_id: int | None,
    block_cross_document_attention: bool,
    loss_weight_key: str | None,
    segment_key: str | None,
    evaluation: bool,
    mesh: Any,
    mapping: Mapping[str, Any],
) -> Any:
    """A function from a psdp batch to Levanter's ``LmExample``, jitted once."""
    import equinox as eqx
    import jax

    hax = _levanter("haliax")
    examples = _levanter("levanter.data.text.examples")

    def one_row(tokens: Any, weight: Any, segments: Any) -> Any:
        return examples.GrugLmExample.causal(
            tokens,
            loss_weight=weight,
            eos_id=eos_id if segments is None else None,
            segment_ids=segments,
            block_cross_document_attention=block_cross_document_attention,
        )

    @eqx.filter_jit
    def convert(tokens: Any, weight: Any, segments: Any, mask: Any) -> Any:
        Batch, Pos = tokens.axes
        raw_weight = None if weight is None else weight.array
        raw_segments = None if segments is None else segments.array
        rows = jax.vmap(one_row)(tokens.array, raw_weight, raw_segments)
        example = examples.named_lm_example_from_grug(rows, Pos, batch_axis=Batch)
        if mask is not None:  # padding rows of an eval batch weigh nothing
            scale = hax.named(mask.astype(example.loss_weight.dtype), (Batch,))
            example = dataclasses.replace(example, loss_weight=example.loss_weight * scale)
        return hax.shard(example, mapping)

    def to_example(batch: Mapping[str, Any]) -> Any:
        weight = None if loss_weight_key is None else batch[loss_weight_key]
        segments = None if segment_key is None else batch[segment_key]
        mask = batch.get("mask") if evaluation else None
        if mask is not None:
            mask = mask.array if isinstance(mask, hax.NamedArray) else mask
        with hax.partitioning.set_mesh(mesh):
            return convert(batch[TOKENS], weight, segments, mask)

    return to_example


# ------------------------------------------------------------------ Levanter's data config
def data_config(levanter_data: Any, *, seq_len: int, batch_size: Any = None) -> DataConfig:
    """Levanter's data section (``LmDataConfig``) as a `DataConfig` over the same caches.

    Each cached component is a source of ``format: levanter`` reading its ``train`` split in
    place, each with a ``validation`` split an eval set; ``train_weights`` (a dict, or Levanter's
    stages ``[(step, weights)]``) become the sources' weights or `DataConfig.stages`; its
    ``mixture_block_size`` the mixture's block size; ``shuffle: false`` ``mixture.shuffle:
    false`` (every source in store order). The components' ``pack`` (``true``: 64 documents a
    row, or ``N``) is the view: greedy packing of at most that many documents a row, long
    documents cut to ``seq_len`` (Levanter's packing). psdp mixes and shuffles the rows its own
    way: the same rows in another order (``docs/guides/levanter.md``, "Orders").

    Args:
        levanter_data: Levanter's ``LmDataConfig`` (``config.data`` of ``train_lm``).
        seq_len: tokens per row (Levanter's ``Pos.size``).
        batch_size: rows per step (``order.global_batch_size`` and ``eval_batch_size``).

    Examples:
        >>> from types import SimpleNamespace as Cached
        >>> levanter_data = Cached(cache_dir="cache/", mixture_block_size=2048, shuffle=True,
        ...     components={
        ...     "web": Cached(cache_dir=None, flat_cache=False, pack=None, format=None),
        ...     "code": Cached(cache_dir="/data/code", flat_cache=False, pack=None, format=None)},
        ...     train_weights=[(0, {"web": 1.0, "code": 0.0}), (100, {"web": 1.0, "code": 1.0})])
        >>> config = data_config(levanter_data, seq_len=512, batch_size=8)
        >>> config.sources["web"].store, config.sources["code"].store
        ('cache/web/train', '/data/code/train')
        >>> [(s.step, s.weights) for s in config.stages]
        [(0, {'web': 1.0, 'code': 0.0}), (100, {'web': 1.0, 'code': 1.0})]
        >>> packed = Cached(cache_dir="/data/chat", flat_cache=False, pack=16, format=None)
        >>> config = data_config(Cached(cache_dir=None, mixture_block_size=2048, shuffle=False,
        ...     components={"chat": packed}, train_weights=None), seq_len=512)
        >>> config.view.packing, config.view.max_segments, config.mixture.shuffle
        ('greedy', 16, False)
    """
    _check_levanter_options(levanter_data)
    weights = getattr(levanter_data, "train_weights", None)
    trained = _trained_components(levanter_data.components, weights)
    sources: dict[str, SourceConfig] = {}
    evals: dict[str, SourceConfig] = {}
    packs: dict[str, int | None] = {}
    for name, component in levanter_data.components.items():
        if not hasattr(component, "flat_cache"):
            raise ValueError(
                f"Levanter's data component {name!r} is a {type(component).__name__}; psdp reads "
                "cached components (a component with cache_dir), e.g. components: {web: "
                "{cache_dir: gs://bucket/web}}"
            )
        _check_text_format(name, getattr(component, "format", None))
        packs[name] = _max_segments(name, component.pack)
        root = component.cache_dir
        if root is None:
            if levanter_data.cache_dir is None:
                raise ValueError(
                    f"Levanter's data component {name!r} has no cache_dir and the data config "
                    "none either; set one, e.g. cache_dir: gs://bucket/cache"
                )
            root = os.path.join(levanter_data.cache_dir, name)
        if name in trained:  # Levanter opens no train split of a component never weighted
            sources[name] = SourceConfig(store=_split(root, "train", component), format="levanter")
        # a flat cache is its train split only: Levanter evaluates it on nothing
        validation = os.path.join(root, "validation")
        if not component.flat_cache and _exists(os.path.join(validation, "shard_ledger.json")):
            evals[name] = SourceConfig(store=validation, format="levanter")
    stages = None
    if isinstance(weights, Mapping):
        sources = {n: dataclasses.replace(s, weight=float(weights.get(n, 0.0)))
                   for n, s in sources.items()}  # fmt: skip
    elif weights is not None:
        stages = [
            StageConfig(step=int(step), weights={n: v for n, v in w.items() if n in trained})
            for step, w in weights
        ]
    order: dict[str, Any] = {} if batch_size is None else {"global_batch_size": batch_size}
    mixture = MixtureConfig(
        block_size=int(levanter_data.mixture_block_size),
        # Levanter's shuffle is False, True (a full permutation) or a block shuffle's config
        shuffle=levanter_data.shuffle is not False,
    )
    return DataConfig.from_dict(
        {
            "sources": {n: dataclasses.asdict(s) for n, s in sources.items()},
            "stages": None if stages is None else [dataclasses.asdict(s) for s in stages],
            "seq_len": seq_len,
            "view": dataclasses.asdict(_view(packs)),
            "mixture": dataclasses.asdict(mixture),
            "eval": {n: dataclasses.asdict(s) for n, s in evals.items()},
            "order": order,
        }
    )


def _trained_components(components: Mapping[str, Any], weights: Any) -> set[str]:
    """The components Levanter trains on: a weight above 0 in some stage (all, unweighted)."""
    if weights is None:
        return set(components)
    stages = [weights] if isinstance(weights, Mapping) else [w for _, w in weights]
    return {name for name in components if any(w.get(name, 0) > 0 for w in stages)}


#: Levanter data options psdp cannot honour, each unused where ``None``
_UNSUPPORTED = (
    "num_validation_sequences",  # validation rows split off the train set
    "max_train_batches",  # a component's training rows capped
    "target_budget",  # a simulated data budget
    "experiment_budget",
)


def _check_levanter_options(levanter_data: Any) -> None:
    """Refuses the Levanter data options that would change which rows a run trains on, which
    psdp's config does not express: silently ignored, they would train on other data."""
    for option in _UNSUPPORTED:
        value = getattr(levanter_data, option, None)
        if value is not None:
            raise ValueError(
                f"Levanter's data config sets {option}: {value!r}, which psdp does not read (it "
                "would train on other rows than Levanter's); drop it from the YAML, or run "
                "Levanter's own loader (python -m levanter.main.train_lm)"
            )
    stop = getattr(levanter_data, "stop_strategy", "restart")
    if str(getattr(stop, "value", stop)) != "restart":
        raise ValueError(
            f"Levanter's data config sets stop_strategy: {stop!r}; psdp's mixture never ends, as "
            "Levanter's restart strategy: use stop_strategy: restart (the default)"
        )


def _check_text_format(name: str, fmt: Any) -> None:
    """Refuses a component whose format weights tokens (supervised, chat, prebuilt): psdp
    reads its ``input_ids`` alone, so every token would weigh 1, prompts included."""
    if fmt is None or type(fmt).__name__ == "TextLmDatasetFormat":
        return
    raise ValueError(
        f"Levanter's data component {name!r} has format {type(fmt).__name__}; psdp.levanter "
        "reads text caches (format: text) only: a supervised or chat cache's loss weights "
        "would be ignored and every token trained on; use Levanter's own loader for it, or "
        "LevanterLoader(..., loss_weight_key=...) over the cache"
    )


def _max_segments(name: str, pack: Any) -> int | None:
    """A component's ``pack`` as the cap on documents per row (``None``: not packed)."""
    if pack is None or pack is False:
        return None
    if pack is True:
        return LEVANTER_MAX_SEGMENTS
    if isinstance(pack, int) and pack >= 1:
        return pack
    raise ValueError(
        f"Levanter's data component {name!r} has pack: {pack!r}; psdp packs a component with "
        f"pack: true ({LEVANTER_MAX_SEGMENTS} documents a row, Levanter's default) or pack: N "
        "(at most N documents a row, N >= 1), as Levanter does; use one of those, or drop pack"
    )


def _view(packs: Mapping[str, int | None]) -> ViewConfig:
    """The one view of every source: concatenate then split, or Levanter's packing (greedy,
    in store order, a long document cut to its first seq_len tokens, a cap on documents)."""
    caps = set(packs.values())
    if len(caps) > 1:
        listed = ", ".join(
            f"{n} ({'no pack' if c is None else f'{c} documents a row'})" for n, c in packs.items()
        )
        raise ValueError(
            f"Levanter's data components pack differently: {listed}; psdp makes every source's "
            "rows with one view (DataConfig.view), so give every component the same pack"
        )
    cap = next(iter(caps), None)
    if cap is None:
        return ViewConfig()
    return ViewConfig(packing="greedy", long_documents="truncate", max_segments=cap)


def _exists(path: str) -> bool:
    """Whether ``path`` (local, or a URL such as ``gs://``, as Levanter takes) exists."""
    if "://" not in path:
        return os.path.exists(path)
    fsspec = import_optional("fsspec", extra="levanter", needed_for="a cache URL")
    filesystem, inner = fsspec.core.url_to_fs(path)
    return bool(filesystem.exists(inner))


def _split(root: str, split: str, component: Any) -> str:
    return root if component.flat_cache else os.path.join(root, split)


# ---------------------------------------------------------------------- Levanter's train_lm
def train_loader(levanter_data: Any, trainer: Any, Pos: Any, *, seed: int = 0) -> LevanterLoader:
    """The training `LevanterLoader` of Levanter's data section on ``trainer``'s mesh.

    One component with ``shuffle: false`` is read in store order, Levanter's ``TokenSeqDataset``
    rows (Levanter's own ``train_lm`` permutes them inside each mixture block: not the same
    order, ``docs/guides/levanter.md``, "Orders"); otherwise psdp's `Mixture` of `data_config`
    orders the rows (seeded by ``seed``; with ``shuffle: false`` every component in store
    order), packed as the components' ``pack`` says."""
    components = levanter_data.components
    eos_id = levanter_data.the_tokenizer.eos_token_id
    common = dict(
        mesh=trainer.device_mesh,
        Pos=Pos,
        batch_size=_batch_size(trainer.config),
        axis_resources=trainer.compute_axis_mapping,
        batch_axis_name=trainer.config.batch_axis_name,
        eos_id=eos_id if levanter_data.block_cross_document_attention else None,
        block_cross_document_attention=levanter_data.block_cross_document_attention,
    )
    config = data_config(levanter_data, seq_len=Pos.size, batch_size=common["batch_size"])
    if len(components) == 1 and not config.mixture.shuffle and config.view.packing is None:
        (source,) = config.sources.values()
        return LevanterLoader.from_cache(source.store, **common)
    config = dataclasses.replace(config, mixture=dataclasses.replace(config.mixture, seed=seed))
    return LevanterLoader(config.train_source(), **common, **_packed_segments(config.view))


def _packed_segments(view: ViewConfig) -> dict[str, Any]:
    """A packed view's rows take their segments from the pack, as Levanter's packed examples
    do: from EOS they would join documents that end without one (``enforce_eos: false``)."""
    return {} if view.packing is None else {"segment_key": PACKED_SEGMENTS}


def _batch_size(trainer_config: Any) -> Any:
    schedule = trainer_config.train_batch_size
    if isinstance(schedule, int):
        return schedule
    return [(int(stage.start), int(stage.value)) for stage in schedule]


@functools.cache
def _psdp_trainer_class() -> Any:
    trainer_module = _levanter("levanter.trainer")

    class PsdpTrainer(trainer_module.Trainer):  # type: ignore[name-defined]
        """Levanter's `Trainer` whose loader for psdp's training set is psdp's."""

        def data_loader(self, dataset: Any, batch: Any = None) -> Any:
            if isinstance(dataset, _PsdpTrainSet):
                return train_loader(dataset.data, self, dataset.Pos, seed=dataset.seed)
            return super().data_loader(dataset, batch)

    return PsdpTrainer


@dataclasses.dataclass(frozen=True)
class _PsdpTrainSet:
    """What ``config.data.train_set`` returns under `train_lm`: psdp builds its loader."""

    data: Any
    Pos: Any
    seed: int


def _train_set(self: Any, Pos: Any, batch_schedule: Any, *, key: Any) -> _PsdpTrainSet:
    import jax

    return _PsdpTrainSet(self, Pos, int(jax.random.key_data(key).ravel()[-1]))


@dataclasses.dataclass(frozen=True)
class _PsdpEvalSet:
    """An eval set of ``config.data.tagged_eval_sets`` under `train_lm`: psdp reads it."""

    data: Any
    store: str
    Pos: Any
    view: ViewConfig


def _tagged_eval_sets(self: Any, Pos: Any) -> list[tuple[_PsdpEvalSet, list[str]]]:
    config = data_config(self, seq_len=Pos.size)
    return [
        (
            _PsdpEvalSet(self, str(source.store), Pos, config.view),
            [*(self.components[name].tags or []), name],
        )
        for name, source in config.eval.items()
    ]


class _TaggedEvalLoader:
    """What Levanter's evaluator iterates, ``(LmExample, tags)`` batches, read by psdp: each
    eval set once, in order, its last batch's padding rows weighing 0 (Levanter's evaluator
    weighs every token by ``loss_weight``), ``tags`` a ``(batch, num_tags)`` array of the set's
    tags sharded like the rows."""

    def __init__(self, tagged: Any, EvalBatch: Any, mesh: Any, axis_resources: Any):
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        self._sets = []
        mapping = dict(axis_resources or {})
        physical = mapping.get(EvalBatch.name, mapping.get("batch"))
        sharding = NamedSharding(mesh, PartitionSpec(physical, None))
        for index, (dataset, set_tags) in enumerate(tagged.datasets):
            data = dataset.data
            eos = data.the_tokenizer.eos_token_id if data.block_cross_document_attention else None
            loader = LevanterLoader(
                _eval_rows(dataset), mesh=mesh, Pos=dataset.Pos, batch_size=EvalBatch.size,
                axis_resources=mapping | {"batch": physical}, batch_axis_name=EvalBatch.name,
                eos_id=eos, evaluation=True, name=f"levanter eval {index}",
                **_packed_segments(dataset.view),
            )  # fmt: skip
            # the set's tag row, as Levanter's `DomainTaggedDataset` makes it (its own copy is a
            # global array, which a host cannot read on a pod)
            tags = np.zeros((EvalBatch.size, tagged.num_tags), dtype=np.int32)
            tags[:, [tagged.tag_to_index[tag] for tag in set_tags]] = 1
            on_mesh = jax.make_array_from_callback(tags.shape, sharding, tags.__getitem__)
            self._sets.append((loader, on_mesh))

    def __iter__(self) -> Iterator[Any]:
        for loader, tags in self._sets:
            for example in loader:
                yield example, tags

    def __len__(self) -> int:
        return sum(len(loader) for loader, _ in self._sets)


def _eval_rows(dataset: _PsdpEvalSet) -> Any:
    """An eval set's rows, as Levanter makes its component's: concatenated then split, or
    packed as the component's ``pack`` says (its input_ids, and a pack's segment_ids)."""
    store = open_levanter_cache(dataset.store, (TOKENS,))
    if dataset.view.packing is None:
        return TokenSequences(store, dataset.Pos.size, leaves=(TOKENS,))
    kwargs = {**dataset.view.view_kwargs(), "leaves": (TOKENS, PACKED_SEGMENTS)}
    return PackedSequences(store, dataset.Pos.size, **kwargs)


def _eval_data_loader(levanter_loader_class: Any) -> Any:
    """Levanter's evaluator's ``DataLoader``, psdp's for psdp's eval sets."""

    def data_loader(dataset: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        sets = getattr(dataset, "datasets", ())
        if sets and all(isinstance(d, _PsdpEvalSet) for d, _ in sets):
            return _TaggedEvalLoader(dataset, batch, kwargs["mesh"], kwargs.get("axis_resources"))
        return levanter_loader_class(dataset, batch, *args, **kwargs)

    return data_loader


def train_lm(config: Any) -> None:
    """Levanter's own ``train_lm`` on ``config`` (its ``TrainLmConfig``), fed by psdp.

    Nothing of ``train_lm`` is copied: while it runs, its ``Trainer`` is one whose
    ``data_loader`` returns `train_loader` for the training set (so resuming goes through
    ``iter_from_step``, as with Levanter's loader), and the data config's ``train_set`` hands
    psdp the data section instead of building Levanter's datasets. Levanter's evaluator runs
    as always on batches psdp reads from the components' ``validation`` caches (each set once,
    padding rows weighing 0, the set's tags beside). ``python -m psdp.levanter --config_path
    run.yaml`` runs it on a Levanter YAML.
    """
    train_module = _levanter("levanter.main.train_lm")
    datasets = _levanter("levanter.data.text.datasets")
    evaluation = _levanter("levanter.eval")
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        from unittest import mock

        # the two seams of train_lm: the Trainer it makes and the train set it asks its data for
        patch(mock.patch.object(train_module, "Trainer", _psdp_trainer_class()))
        patch(mock.patch.object(datasets.LmDataConfig, "train_set", _train_set))
        # and the evaluator's: its eval sets and the loader it makes of them
        patch(mock.patch.object(datasets.LmDataConfig, "tagged_eval_sets", _tagged_eval_sets))
        patch(mock.patch.object(evaluation, "DataLoader", _eval_data_loader(evaluation.DataLoader)))
        train_module.main(config)


def main() -> None:
    """``python -m psdp.levanter --config_path run.yaml [flags]``: `train_lm` on a Levanter YAML."""
    config_module = _levanter("levanter.config")
    train_module = _levanter("levanter.main.train_lm")

    def run(config: Any) -> None:
        train_lm(config)

    # Levanter's parser reads the config class from the annotation (a class, not a string)
    run.__annotations__ = {"config": train_module.TrainLmConfig, "return": None}
    config_module.main(run)()


__all__ = ["LevanterLoader", "data_config", "main", "train_lm", "train_loader"]

if __name__ == "__main__":
    main()
