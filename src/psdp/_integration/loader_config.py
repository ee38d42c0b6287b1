"""Trainer configs: `MeshConfig` (the device mesh) and `LoaderConfig` (the `DataLoader`).

Both are frozen dataclasses of plain values that drop into a Levanter-style ``TrainerConfig`` and
parse from YAML and flags with draccus (``docs/guides/trainer.md``). `LoaderConfig` is the loader's four
option groups (`psdp._plan.options`) plus a source path, so the same checks guard the API and the
config. Checks that need devices run in `MeshConfig.build` and `LoaderConfig.build`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp._checks import is_int
from psdp._deprecated import warn_deprecated
from psdp._plan.options import (
    GROUP_OF,
    GROUPS,
    LoaderOptions,
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
    check_groups,
    route,
)
from psdp._plan.partition import DEFAULT_BATCH_AXES
from psdp._plan.spec_text import parse_names, parse_spec, spec_text

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

    from psdp._plan.layout import MeshLayout
    from psdp._runtime.loader import DataLoader
    from psdp.sources import Source

__all__ = ["LoaderConfig", "MeshConfig", "parse_axes", "parse_names", "parse_spec"]

#: ``MeshConfig.layout`` values that are not a file.
BUILTIN_LAYOUTS = ("contiguous", "noncontiguous")


# ------------------------------------------------------------------------------------ mesh
if TYPE_CHECKING:
    _Axes = dict[str, int]
else:  # draccus decodes the text form too; a flag over a YAML needs it, as draccus merges a
    _Axes = dict[str, int] | str  # dict flag into the YAML's dict key by key, a text replaces it


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh: its axes, which of them carry the batch, and which host owns which device.

    Examples:
        The example pod: 4 hosts x 4 devices, each host folded across two data rows.

        >>> config = MeshConfig(axes={"data": 4, "model": 4}, layout="noncontiguous")
        >>> config.resolved_batch_axes(), config.batch_spec()
        (('data',), P('data',))
        >>> config.layout_for(num_processes=4, num_devices=16).process_index[:, 0].tolist()
        [0, 2, 2, 0]
        >>> MeshConfig(axes={"data": 4, "model": 0})
        Traceback (most recent call last):
            ...
        ValueError: MeshConfig.axes: axis 'model' has size 0; every size must be a positive int, e.g. axes: {data: 4, model: 2}
    """

    axes: _Axes | None = None
    """Mesh axes in order, name -> size, e.g. ``{data: 4, model: 2}`` or its text
    ``data=4,model=2`` (on the command line over a YAML: the text replaces the YAML's axes, a
    dict merges with them); the sizes multiply to the
    number of devices. Unset: one axis ``data`` over every device."""

    batch_axes: tuple[str, ...] | None = None
    """The axes that shard the batch, major to minor, e.g. ``[replica, data]``. Unset: the axes
    named replica, data, fsdp or batch, in mesh order."""

    layout: str | None = None
    """Which host owns which mesh position: ``contiguous`` (each host one block, row-major),
    ``noncontiguous`` (hosts folded across two data rows, as on a torus), or the path of a JSON
    layout file (see ``psdp plan --layout``). Unset: contiguous."""

    def __post_init__(self) -> None:
        if self.axes is not None:
            object.__setattr__(self, "axes", _checked_axes(self.axes))
        if self.batch_axes is not None:
            object.__setattr__(self, "batch_axes", _checked_batch_axes(self.batch_axes, self.axes))
        elif self.axes is not None and not any(a in DEFAULT_BATCH_AXES for a in self.axes):
            raise ValueError(
                f"MeshConfig.batch_axes is unset and none of the axes {list(self.axes)} is a usual "
                f"batch axis {list(DEFAULT_BATCH_AXES)}; set batch_axes, e.g. batch_axes: "
                f"[{next(iter(self.axes))}]"
            )
        if self.layout is not None and not isinstance(self.layout, str):
            raise TypeError(
                f"MeshConfig.layout must be a str, got {self.layout!r} of type "
                f"{type(self.layout).__name__}; e.g. layout: noncontiguous"
            )
        if self.layout is not None and (
            self.layout not in BUILTIN_LAYOUTS and not self.layout.endswith(".json")
        ):
            raise ValueError(
                f"MeshConfig.layout must be contiguous, noncontiguous or a .json layout file, got "
                f"{self.layout!r}; e.g. layout: noncontiguous"
            )

    def resolved_batch_axes(self) -> tuple[str, ...]:
        """``batch_axes``, or the usual batch axes of ``axes`` (``("data",)`` when both are unset)."""
        if self.batch_axes is not None:
            return self.batch_axes
        if self.axes is None:
            return ("data",)
        return tuple(a for a in self.axes if a in DEFAULT_BATCH_AXES)

    def batch_spec(self) -> PartitionSpec:
        """The `PartitionSpec` that shards the batch dimension over the batch axes."""
        from jax.sharding import PartitionSpec

        axes = self.resolved_batch_axes()
        return PartitionSpec(axes[0] if len(axes) == 1 else axes)

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        """``axes``, checked against the job's device count (unset: ``{"data": num_devices}``)."""
        if self.axes is None:
            return {"data": num_devices}
        needed = math.prod(self.axes.values())
        if needed != num_devices:
            raise ValueError(
                f"MeshConfig.axes {self.axes} needs {needed} devices but the job has {num_devices}; "
                f"make the sizes multiply to {num_devices} (a --mesh.axes flag given as a dict "
                "merges into a YAML's axes key by key; give it as text, e.g. --mesh.axes "
                f"data={num_devices}, to replace them)"
            )
        return dict(self.axes)

    def layout_for(self, num_processes: int, num_devices: int) -> MeshLayout:
        """The `MeshLayout` of this config on a job of ``num_processes`` hosts and ``num_devices``."""
        from psdp._plan.layout import MeshLayout

        kind = self.layout or "contiguous"
        if kind not in BUILTIN_LAYOUTS:
            return self._layout_file(kind, num_processes, num_devices)
        sizes = self.axis_sizes(num_devices)
        if kind == "contiguous":
            return MeshLayout.contiguous(sizes, num_processes)
        batch = self.resolved_batch_axes()
        if tuple(sizes)[: len(batch)] != batch:
            raise ValueError(
                f"MeshConfig.layout noncontiguous folds hosts across the leading axes, but the batch "
                f"axes {list(batch)} are not the first axes of {list(sizes)}; put the batch axes "
                "first in MeshConfig.axes or use a layout file"
            )
        try:
            return MeshLayout.noncontiguous(sizes, num_processes, batch_axes=len(batch))
        except ValueError as err:
            raise ValueError(f"MeshConfig.layout noncontiguous: {err}") from None

    def _layout_file(self, path: str, num_processes: int, num_devices: int) -> MeshLayout:
        from psdp._plan.layout import MeshLayout

        layout = MeshLayout.from_file(path)
        if self.axes is not None and layout.axis_sizes != self.axes:
            raise ValueError(
                f"MeshConfig.axes {self.axes} does not match the layout file {path!r}, whose axes "
                f"are {layout.axis_sizes}; unset axes or make them agree"
            )
        if (layout.num_processes, layout.num_devices) != (num_processes, num_devices):
            raise ValueError(
                f"MeshConfig.layout {path!r} is for {layout.num_processes} processes and "
                f"{layout.num_devices} devices, but the job has {num_processes} processes and "
                f"{num_devices} devices; use a layout file written for this job"
            )
        return layout

    def build(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """The `jax.sharding.Mesh` over ``devices`` (default: every device of the job).

        Examples:
            >>> import jax
            >>> mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
            >>> dict(mesh.shape), len(jax.devices())
            ({'data': 4, 'model': 2}, 8)
        """
        import jax

        devices = list(jax.devices() if devices is None else devices)
        processes = len({d.process_index for d in devices})
        return self.layout_for(processes, len(devices)).build_mesh(devices)


def _checked_axes(axes: Any) -> dict[str, int]:
    example = "e.g. axes: {data: 4, model: 2}"
    if isinstance(axes, str):
        try:
            return parse_axes(axes)
        except ValueError as error:
            raise ValueError(f"MeshConfig.axes {axes!r}: {error}; or {example}") from None
    if not isinstance(axes, Mapping):
        raise TypeError(
            f"MeshConfig.axes must be a mapping of axis name -> size, got {axes!r} of type "
            f"{type(axes).__name__}; {example}"
        )
    if not axes:
        raise ValueError(f"MeshConfig.axes must be a non-empty mapping, got {{}}; {example}")
    for name, size in axes.items():
        if not isinstance(name, str) or not is_int(size):
            raise TypeError(
                f"MeshConfig.axes: axis {name!r} has size {size!r}; every name must be a str and "
                f"every size a positive int, {example}"
            )
        if not name.isidentifier():
            raise ValueError(
                f"MeshConfig.axes: {name!r} is not an axis name; use identifiers, {example}"
            )
        if size < 1:
            raise ValueError(
                f"MeshConfig.axes: axis {name!r} has size {size!r}; every size must be a positive "
                f"int, {example}"
            )
    return {str(k): int(v) for k, v in axes.items()}


def _checked_batch_axes(batch_axes: Any, axes: dict[str, int] | None) -> tuple[str, ...]:
    names = (batch_axes,) if isinstance(batch_axes, str) else batch_axes
    known = list(axes) if axes is not None else ["data"]
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"MeshConfig.batch_axes must be a list of axis names, got {batch_axes!r}; e.g. "
            f"batch_axes: [{known[0]}]"
        )
    unknown = [n for n in names if n not in known]
    if not names or unknown or len(set(names)) != len(names):
        why = f"{unknown[0]!r} is not a mesh axis" if unknown else "give each axis once"
        raise ValueError(
            f"MeshConfig.batch_axes {list(names)}: {why}; choose among the mesh axes {known}, "
            f"e.g. batch_axes: [{known[0]}]"
        )
    return tuple(names)


# ---------------------------------------------------------------------------------- loader
@dataclass(frozen=True)
class LoaderConfig:
    """The data loader: a source path and the `DataLoader`'s four option groups.

    `create` takes the groups' fields as flat keywords, as `DataLoader` does.

    Examples:
        >>> config = LoaderConfig.create(source="data/tokens", global_batch_size=256, seed=3)
        >>> config.order.global_batch_size, config.order.seed
        (256, 3)
        >>> LoaderConfig(order=OrderOptions(global_batch_size=0))
        Traceback (most recent call last):
            ...
        ValueError: OrderOptions.global_batch_size must be >= 1, got 0 (the real rows per step); e.g. global_batch_size=256
    """

    source: str | None = None
    """The rows: a psdp TensorStore dataset directory (written by ``psdp write`` or
    ``psdp.write_dataset``) or a ``.npy`` file (memory-mapped)."""

    order: OrderOptions = field(default_factory=OrderOptions)
    """Which rows each step holds: global_batch_size (or a schedule), shuffle, seed, drop_last,
    skip_steps, skip_offsets, start_at, io_block, window_blocks, epochs."""

    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    """How leaves are split over the mesh: batch_spec, batch_axes, named_axes, axis_mapping,
    halo, feeding_processes."""

    output: OutputOptions = field(default_factory=OutputOptions)
    """What batches hold beyond the rows: pad_value, mask_key, dtypes."""

    reading: ReadingOptions = field(default_factory=ReadingOptions)
    """How rows are read: prefetch, read_threads, read_timeout_s, stall_warning_s,
    read_attempts, retry_backoff_s, first_read_timeout_s."""

    # The previous release's flat fields, deprecated (docs/guides/trainer.md, "Deprecated names"): a set
    # one moves into its group when the config is made and reads None after, so it takes no part
    # in comparisons or dumps. Their types are the previous release's, for draccus to parse.
    global_batch_size: int | None = field(default=None, repr=False, compare=False)
    """Deprecated: use order.global_batch_size."""
    partition: dict[str, str] | str | None = field(default=None, repr=False, compare=False)
    """Deprecated: use sharding.batch_spec."""
    shuffle: bool | None = field(default=None, repr=False, compare=False)
    """Deprecated: use order.shuffle."""
    seed: int | None = field(default=None, repr=False, compare=False)
    """Deprecated: use order.seed."""
    prefetch: int | None = field(default=None, repr=False, compare=False)
    """Deprecated: use reading.prefetch."""
    drop_last: bool | None = field(default=None, repr=False, compare=False)
    """Deprecated: use order.drop_last."""
    halo: dict[str, int] | int | None = field(default=None, repr=False, compare=False)
    """Deprecated: use sharding.halo."""
    pad_value: int | float | None = field(default=None, repr=False, compare=False)
    """Deprecated: use output.pad_value."""
    mask_key: str | None = field(default=None, repr=False, compare=False)
    """Deprecated: use output.mask_key."""
    dtypes: dict[str, str] | str | None = field(default=None, repr=False, compare=False)
    """Deprecated: use output.dtypes."""
    read_threads: int | None = field(default=None, repr=False, compare=False)
    """Deprecated: use reading.read_threads."""
    feeding_processes: list[int] | None = field(default=None, repr=False, compare=False)
    """Deprecated: use sharding.feeding_processes."""
    named_axes: dict[str, list[str]] | None = field(default=None, repr=False, compare=False)
    """Deprecated: use sharding.named_axes."""
    axis_mapping: dict[str, list[str]] | None = field(default=None, repr=False, compare=False)
    """Deprecated: use sharding.axis_mapping."""
    read_timeout_s: float | None = field(default=None, repr=False, compare=False)
    """Deprecated: use reading.read_timeout_s."""

    def __post_init__(self) -> None:
        if self.source is not None and not isinstance(self.source, str):
            raise TypeError(
                f"LoaderConfig.source must be a path (a str), got {self.source!r} of type "
                f"{type(self.source).__name__}; e.g. source: data/tokens"
            )
        if self.source == "":
            raise ValueError(
                "LoaderConfig.source must be a path, got ''; give a psdp dataset directory or a "
                ".npy file, e.g. source: data/tokens"
            )
        check_groups("LoaderConfig", {name: getattr(self, name) for name in GROUPS})
        self._move_flat_fields()

    def _move_flat_fields(self) -> None:
        """Moves the set deprecated flat fields into their groups, each with a warning."""
        moved = []  # (flat field, its group, its name there, value)
        for flat in _FLAT_FIELDS:
            value = getattr(self, flat)
            if value is None:
                continue
            name = _RENAMED.get(flat, flat)
            group = GROUP_OF[name]
            given = getattr(getattr(self, group), name)
            if given != getattr(GROUPS[group](), name):
                raise TypeError(
                    f"LoaderConfig.{flat} (deprecated) and LoaderConfig.{group}.{name} are both "
                    f"set ({value!r} and {given!r}); give it once, as {group}.{name}"
                )
            moved.append((flat, group, name, value))
            object.__setattr__(self, flat, None)
        for group in dict.fromkeys(g for _, g, _, _ in moved):  # whole: named_axes + axis_mapping
            values = {name: value for _, g, name, value in moved if g == group}
            object.__setattr__(self, group, replace(getattr(self, group), **values))
        for flat, group, name, _ in moved:
            warn_deprecated(
                f"LoaderConfig.{flat}",
                f"use LoaderConfig.{group}.{name} (YAML: `{group}: {{{name}: ...}}`, flag: "
                f"--<config>.{group}.{name})",
            )

    @classmethod
    def create(cls, source: str | None = None, **options: Any) -> LoaderConfig:
        """The config of ``source`` with the groups from group objects and/or flat keywords."""
        return cls(source=source, **route(**options))

    def to_dict(self) -> dict[str, Any]:
        """The config as YAML/JSON values (specs as text); `from_dict` reads it back.

        Examples:
            >>> config = LoaderConfig.create(global_batch_size=8, batch_spec="data,model")
            >>> config.to_dict()["sharding"]["batch_spec"]
            'data,model'
            >>> LoaderConfig.from_dict(config.to_dict()) == config
            True
        """
        out: dict[str, Any] = {"source": self.source}
        for name in GROUPS:
            group = getattr(self, name)
            out[name] = {f.name: _plain(getattr(group, f.name)) for f in fields(group)}
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LoaderConfig:
        """The config `to_dict` wrote (or one parsed from YAML/JSON of the same form)."""
        groups = {name: kind(**raw.get(name, {})) for name, kind in GROUPS.items()}
        flat = {k: v for k, v in raw.items() if k != "source" and k not in GROUPS}  # deprecated
        return cls(source=raw.get("source"), **groups, **flat)

    def loader_kwargs(self) -> dict[str, Any]:
        """Deprecated: the options that differ from their defaults, as flat `DataLoader` keywords;
        use `build`, or `options` for the groups."""
        warn_deprecated(
            "LoaderConfig.loader_kwargs()",
            "use config.build(mesh, source=...), or config.options() for the option groups that "
            "DataLoader takes (order=, sharding=, output=, reading=)",
        )
        kwargs: dict[str, Any] = {}
        for name, kind in GROUPS.items():
            group, default = getattr(self, name), kind()
            kwargs.update(
                {
                    f.name: getattr(group, f.name)
                    for f in fields(group)
                    if getattr(group, f.name) != getattr(default, f.name)
                }
            )
        return kwargs

    def options(self, batch_axes: Sequence[str] | None = None) -> LoaderOptions:
        """The `LoaderOptions` of `build`; ``batch_axes`` fills an unset ``sharding.batch_axes``
        where the batch strategy uses it."""
        return LoaderOptions(self.order, self._sharding(batch_axes), self.output, self.reading)

    def _sharding(self, batch_axes: Sequence[str] | None) -> ShardingOptions:
        if batch_axes is None or not self.sharding.uses_batch_axes():
            return self.sharding  # the spec names its axes: the mesh's batch axes do not apply
        if self.sharding.batch_axes is None:
            return replace(self.sharding, batch_axes=tuple(batch_axes))
        if self.sharding.batch_axes != tuple(batch_axes):
            raise ValueError(
                f"LoaderConfig.sharding.batch_axes {self.sharding.batch_axes} differs from the "
                f"batch_axes {tuple(batch_axes)} given to build/restore (the mesh's); set one of "
                "them, or make them agree"
            )
        return self.sharding

    def open_source(self) -> Source:
        """The source at ``source``: a `MemmapSource` for ``.npy``, else a `TensorStoreSource`."""
        from psdp.sources import MemmapSource, TensorStoreSource

        if self.source is None:
            raise ValueError(
                "LoaderConfig.source is unset; give a psdp dataset directory (psdp write converts "
                ".npy/.npz files) or a .npy file, e.g. source: data/tokens"
            )
        path = Path(self.source)
        if not path.exists():
            raise ValueError(
                f"LoaderConfig.source {self.source!r} does not exist; give a psdp dataset "
                "directory or a .npy file"
            )
        if path.suffix == ".npy":
            return MemmapSource(path)
        return TensorStoreSource(path)

    def build(
        self, mesh: Mesh, source: Any = None, batch_axes: Sequence[str] | None = None
    ) -> DataLoader:
        """The `DataLoader` for ``mesh``, reading ``source`` (default: `open_source`).

        ``batch_axes`` (e.g. ``MeshConfig.batch_axes``) are the axes the ``batch`` strategy
        splits over, unless ``sharding.batch_axes`` says; default: the mesh axes named like
        batch axes.

        Examples:
            >>> import numpy as np
            >>> mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
            >>> config = LoaderConfig.create(global_batch_size=8, shuffle=False)
            >>> with config.build(mesh, source=np.arange(32, dtype=np.int32).reshape(16, 2)) as loader:
            ...     np.asarray(next(iter(loader)))[:, 0].tolist()
            [0, 2, 4, 6, 8, 10, 12, 14]
        """
        from psdp._runtime.loader import DataLoader

        options = self.options(batch_axes)  # checked before the source is opened
        return DataLoader(
            self.open_source() if source is None else source,
            mesh=mesh,
            order=options.order,
            sharding=options.sharding,
            output=options.output,
            reading=options.reading,
        )

    def restore(
        self,
        state: Mapping[str, Any],
        mesh: Mesh,
        source: Any = None,
        batch_axes: Sequence[str] | None = None,
    ) -> DataLoader:
        """The `DataLoader` of `build`, continuing from a saved ``loader.state()``.

        Checks as `DataLoader.restore` does: a ``seed`` or ``shuffle`` that differs from the
        state, or a source with other rows or leaves, is an error naming both values; the
        config's batch size (or schedule), skips and ``drop_last`` apply from the resume step
        on; an unset ``global_batch_size`` or ``shuffle`` takes the state's.

        Examples:
            >>> import numpy as np
            >>> mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
            >>> config = LoaderConfig.create(global_batch_size=8, shuffle=False)
            >>> rows = np.arange(32, dtype=np.int32).reshape(16, 2)
            >>> with config.build(mesh, source=rows) as loader:
            ...     it = iter(loader)
            ...     _ = next(it)
            ...     state = it.state()
            >>> with config.restore(state, mesh, source=rows) as loader:
            ...     np.asarray(next(iter(loader)))[:, 0].tolist()
            [16, 18, 20, 22, 24, 26, 28, 30]
        """
        from psdp._runtime.loader import DataLoader

        # DataLoader.restore compares flat order keywords with the state and fills the unset ones
        order = {f.name: getattr(self.order, f.name) for f in fields(self.order)}
        return DataLoader.restore(
            state,
            self.open_source() if source is None else source,
            mesh=mesh,
            sharding=self._sharding(batch_axes),
            output=self.output,
            reading=self.reading,
            **{name: value for name, value in order.items() if value is not None},
        )


#: the deprecated flat fields (every field after the groups), and the one whose name changed
_FLAT_FIELDS = tuple(f.name for f in fields(LoaderConfig) if f.name not in ("source", *GROUPS))
_RENAMED = {"partition": "batch_spec"}


def _plain(value: Any) -> Any:
    """A group's value as YAML/JSON has it: specs as text, tuples as lists, dicts by leaf."""
    if isinstance(value, PartitionSpec):
        return spec_text(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    name = getattr(value, "name", None)  # a numpy dtype, or a haliax Axis
    return name if isinstance(name, str) else np.dtype(value).name  # a type such as np.int32


def _register_draccus_codecs() -> None:
    """Lets draccus read and write a `PartitionSpec` field as its text, e.g. ``data,model``."""
    try:
        import draccus
    except ImportError:  # draccus is optional: psdp[draccus]
        return

    def decode(raw: Any, path: Sequence[str] = ()) -> PartitionSpec:
        return PartitionSpec(*parse_spec(raw))

    draccus.decode.register(PartitionSpec, decode)
    draccus.encode.register(PartitionSpec, lambda spec, declared_type=None: spec_text(spec))
    # a dump holds the groups, not the deprecated flat fields: the next release loads it
    draccus.encode.register(
        LoaderConfig,
        lambda config, declared_type=None: {
            name: draccus.encode(getattr(config, name)) for name in ("source", *GROUPS)
        },
    )


_register_draccus_codecs()


# ----------------------------------------------------------------------------------- text forms
def parse_axes(text: str) -> dict[str, int]:
    """Parses ``--axes``: ``"data=4,model=4"`` -> ``{"data": 4, "model": 4}``.

    Examples:
        >>> parse_axes("replica=2,data=2,model=2")
        {'replica': 2, 'data': 2, 'model': 2}
    """
    axes: dict[str, int] = {}
    for entry in text.split(","):
        name, sep, size = (part.strip() for part in entry.partition("="))
        if not sep or not name.isidentifier() or not size.isdigit() or int(size) < 1:
            raise ValueError(
                f"entry {entry.strip()!r} is not NAME=SIZE with a positive size; write the axes "
                "as NAME=SIZE pairs, e.g. --axes data=4,model=4"
            )
        if name in axes:
            raise ValueError(f"axis {name!r} is given twice; name each mesh axis once")
        axes[name] = int(size)
    return axes
