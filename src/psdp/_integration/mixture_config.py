"""The mixture's sections of a `DataConfig`: `StageConfig` (weights from a step on),
`MixtureConfig` (blocks and seed), and `ConfiguredMixture` (`ConfiguredStages` with length
stages), the source a config builds, which records the config's view so that a restore refuses a
changed one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psdp._checks import is_int
from psdp.sources.views.mixture import Mixture
from psdp.sources.views.staged import StagedTokens
from psdp.sources.views.staged_packed import StagedPacked


@dataclass(frozen=True)
class StageConfig:
    """The mixture's weights are ``weights`` (a source left out: 0) from where the stage starts:
    a ``step``, a sample ``offset`` or a count of ``tokens`` (one of them; none: step 0).

    A stage by step moves with the batch size: resumed with smaller batches, a later step's
    first sample comes earlier. A stage by offset or by tokens stays at the sample where the user
    put it, whatever batch sizes a run takes (``docs/guides/mixtures.md``).

    Examples:
        >>> StageConfig(step=1000, weights={"code": 1, "prose": 1}).start
        ('step', 1000)
        >>> StageConfig(weights={"code": 1}, tokens=2**30).start
        ('tokens', 1073741824)
    """

    step: int | None = None
    """The first step of the stage (the first stage starts at 0); or set ``offset`` or
    ``tokens``."""

    weights: dict[str, float] = field(default_factory=dict)
    """Source name -> relative weight, e.g. ``{code: 1, prose: 3}``."""

    offset: int | None = None
    """The stage's first sample offset (a multiple of ``mixture.block_size``), instead of a
    step: it stays there whatever the batch sizes."""

    tokens: int | None = None
    """The tokens of the rows before the stage (``offset * seq_len``, padding included),
    instead of a step: it stays there whatever the batch sizes."""

    seq_len: int | None = None
    """The stage's tokens per row (a length stage, ``docs/concepts/length-stages.md``); unset:
    the stage before's (the first stage's: ``DataConfig.seq_len``)."""

    def __post_init__(self) -> None:
        given = {k: v for k in ("step", "offset", "tokens") if (v := getattr(self, k)) is not None}
        if len(given) > 1:
            raise ValueError(
                f"StageConfig sets {' and '.join(f'{k}={v}' for k, v in given.items())}; a stage "
                "starts at one of step, offset or tokens: keep one"
            )
        if self.seq_len is not None and (not is_int(self.seq_len) or self.seq_len < 1):
            raise ValueError(
                f"StageConfig.seq_len ({self.where}) must be an int >= 1 or unset, got "
                f"{self.seq_len!r}; e.g. seq_len: 32768"
            )
        for name, value in given.items():
            if not is_int(value) or value < 0:
                raise ValueError(
                    f"StageConfig.{name} must be an int >= 0, got {value!r}; e.g. {name}: 1000"
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
                f"StageConfig.weights ({self.where}) must map source names to finite "
                f"weights >= 0, got {self.weights!r}; e.g. weights: {{code: 1, prose: 3}}"
            )
        if not any(self.weights.values()):
            raise ValueError(
                f"StageConfig.weights ({self.where}) are all 0 ({self.weights!r}); a stage "
                "needs a source with a weight > 0, e.g. weights: {code: 1, prose: 3}"
            )
        object.__setattr__(self, "weights", dict(self.weights))

    @property
    def start(self) -> tuple[str, int]:
        """Where the stage starts, as given: ``("step" | "offset" | "tokens", value)``."""
        for name in ("offset", "tokens"):
            if getattr(self, name) is not None:
                return name, int(getattr(self, name))
        return "step", 0 if self.step is None else int(self.step)

    @property
    def where(self) -> str:
        """The start in words, for messages: ``"step 1000"``, ``"offset 4096"``."""
        kind, value = self.start
        return f"{kind} {value}"


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

    shuffle: bool = True
    """Permute each source's epochs; ``false``: every source's rows in store order, each epoch
    in the same order (Levanter's ``shuffle: false``; several sources still interleave by
    weight, block by block)."""

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
        if not isinstance(self.shuffle, bool):
            raise TypeError(
                f"MixtureConfig.shuffle must be true or false, got {self.shuffle!r}; e.g. "
                "shuffle: false to read every source in store order"
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


class ConfiguredStages(StagedTokens):
    """A `StagedTokens` whose state record holds the config's view too (`ConfiguredMixture`'s
    rule: a restore refuses a changed first ``seq_len`` or view)."""

    def __init__(self, stores: Mapping[str, Any], stages: Any, *, view: dict[str, Any],
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(stores, stages, **kwargs)
        self.view = view

    def state_record(self) -> dict[str, Any]:
        return {**super().state_record(), "view": self.view}

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        check_view(self.view, saved)
        super().check_resume(saved, offset)


class ConfiguredPackedStages(ConfiguredStages, StagedPacked):
    """A `StagedPacked` whose state record holds the config's view too (`ConfiguredStages`')."""


def check_view(view: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Raises unless the saved state record's ``"view"`` is ``view``, naming the field."""
    had = saved.get("view")
    if had is None:
        raise ValueError(
            f"the state was saved from a source without a data config's view ({dict(saved)}); "
            "resume it with the source it was saved from (DataLoader.restore)"
        )
    for name, now in view.items():
        then = had.get(name)
        if then != now:
            where = "DataConfig.seq_len" if name == "seq_len" else f"DataConfig.view.{name}"
            raise ValueError(
                f"{where} is {now!r}, but the run was saved with {then!r}; every row depends "
                f"on it, so resume with {name}: {then!r} (a restore may change the batch "
                "size, skips, later stages, eval sets, sharding, output and reading)"
            )


class ConfiguredMixture(Mixture):
    """A `Mixture` whose state record holds the config's view too, so a restore refuses a
    changed ``seq_len`` or view even where the sources' lengths happen to stay the same."""

    def __init__(self, sources: Mapping[str, Any], *, view: dict[str, Any], **kwargs: Any):
        super().__init__(sources, **kwargs)
        self.view = view

    def state_record(self) -> dict[str, Any]:
        return {**super().state_record(), "view": self.view}

    def check_resume(self, saved: Mapping[str, Any], offset: int) -> None:
        check_view(self.view, saved)
        super().check_resume(saved, offset)
