"""The `DataLoader`'s options in four groups, each validated once when made (``docs/loader.md``).

CONTRACT STUB (session 4): field names are fixed; validation is being written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class OrderOptions:
    """Which rows each step holds: the batch size, the shuffle and the epoch's end."""

    global_batch_size: int | None = None
    shuffle: bool | None = None  # None: True for random access, False for a stream
    seed: int = 0
    drop_last: bool = False


@dataclass(frozen=True)
class ShardingOptions:
    """How each leaf is split over the mesh, and which processes are fed."""

    batch_spec: Any = None
    batch_axes: str | Sequence[str] | None = None
    named_axes: Any = None
    axis_mapping: Mapping[str, Any] | None = None
    halo: int | Mapping[str, int] = 0
    feeding_processes: Sequence[int] | None = None


@dataclass(frozen=True)
class OutputOptions:
    """What the delivered leaves hold beyond the rows: their dtypes, the fill, the mask leaf."""

    pad_value: int | float = 0
    mask_key: str | None = "mask"
    dtypes: Any = None


@dataclass(frozen=True)
class ReadingOptions:
    """How the background threads read: prefetch depth, threads, timeout, stall warning."""

    prefetch: int = 2
    read_threads: int = 1
    read_timeout_s: float | None = None
    stall_warning_s: float | None = 1.0


GROUPS: dict[str, Any] = {
    "order": OrderOptions,
    "sharding": ShardingOptions,
    "output": OutputOptions,
    "reading": ReadingOptions,
}


@dataclass(frozen=True)
class LoaderOptions:
    """The four groups together."""

    order: OrderOptions = field(default_factory=OrderOptions)
    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    reading: ReadingOptions = field(default_factory=ReadingOptions)

    @classmethod
    def create(
        cls,
        order: OrderOptions | None = None,
        sharding: ShardingOptions | None = None,
        output: OutputOptions | None = None,
        reading: ReadingOptions | None = None,
        **keywords: Any,
    ) -> LoaderOptions:
        """The groups from group objects and/or flat keywords (each keyword goes to its group)."""
        given = {"order": order, "sharding": sharding, "output": output, "reading": reading}
        made: dict[str, Any] = {}
        for name, kind in GROUPS.items():
            names = {f.name for f in fields(kind)}
            mine = {k: keywords.pop(k) for k in list(keywords) if k in names}
            made[name] = given[name] or kind(**mine)
        if keywords:
            raise TypeError(f"unknown DataLoader options {sorted(keywords)}")
        return cls(**made)
