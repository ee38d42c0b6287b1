"""Trainer configs: `MeshConfig` (the device mesh) and `LoaderConfig` (the `DataLoader`).

Mental model. A config is a frozen dataclass of plain values (ints, strings, dicts of strings)
with ``None`` meaning "unset: use the library's default", so it drops into a Levanter-style
``TrainerConfig`` as a field and parses from YAML and command-line flags with draccus, which
shows each field's docstring in ``--help``. Checks that need nothing but the values run when the
config is made and name the field, the value and the fix; checks that need devices run in the
explicit methods that use them (`MeshConfig.build`, `LoaderConfig.build`), never in properties.

    mesh = config.mesh.build()                 # a jax.sharding.Mesh over every process's devices
    loader = config.data.build(mesh)           # a psdp.DataLoader

The text forms shared with the command line live here too: `parse_axes` (``data=4,model=2``),
`parse_names` and `parse_spec` (``(replica,data),context``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psdp._checks import is_int

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, PartitionSpec

    from psdp._plan.layout import MeshLayout
    from psdp._runtime.loader import DataLoader
    from psdp.sources import Source

#: ``MeshConfig.layout`` values that are not a file.
BUILTIN_LAYOUTS = ("contiguous", "noncontiguous")
#: ``LoaderConfig.partition`` strategies the `DataLoader` understands by name.
PARTITION_STRATEGIES = ("batch", "full", "replicated")
#: Mesh axis names taken as batch axes when ``MeshConfig.batch_axes`` is unset, in mesh order.
DEFAULT_BATCH_AXES = ("replica", "data", "fsdp", "batch")


# ------------------------------------------------------------------------------------ mesh
@dataclass(frozen=True)
class MeshConfig:
    """The device mesh: its axes, which of them carry the batch, and which host owns which device.

    Example:
        The seed pod: 4 hosts x 4 devices, each host folded across two data rows.

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

    axes: dict[str, int] | None = None
    """Mesh axes in order, name -> size, e.g. ``{data: 4, model: 2}``; the sizes multiply to the
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
        if self.layout is not None and (
            not isinstance(self.layout, str)
            or (self.layout not in BUILTIN_LAYOUTS and not self.layout.endswith(".json"))
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
                f"make the sizes multiply to {num_devices}"
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

        Example:
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
    if not isinstance(axes, Mapping) or not axes:
        raise ValueError(
            f"MeshConfig.axes must be a non-empty mapping of axis name -> size, got {axes!r}; "
            f"{example}"
        )
    for name, size in axes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"MeshConfig.axes: {name!r} is not an axis name; use identifiers, {example}"
            )
        if not is_int(size) or size < 1:
            raise ValueError(
                f"MeshConfig.axes: axis {name!r} has size {size!r}; every size must be a positive "
                f"int, {example}"
            )
    return {str(k): int(v) for k, v in axes.items()}


def _checked_batch_axes(batch_axes: Any, axes: dict[str, int] | None) -> tuple[str, ...]:
    names = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    known = list(axes) if axes is not None else ["data"]
    unknown = [n for n in names if n not in known]
    if not names or unknown or len(set(names)) != len(names):
        why = f"{unknown[0]!r} is not a mesh axis" if unknown else "give each axis once"
        raise ValueError(
            f"MeshConfig.batch_axes {list(names)}: {why}; choose among the mesh axes {known}, "
            f"e.g. batch_axes: [{known[0]}]"
        )
    return names


def _checked_processes(value: Any) -> list[int]:
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(is_int(p) and p >= 0 for p in value)
    ):
        raise ValueError(
            f"LoaderConfig.feeding_processes must be a non-empty list of process indices, got "
            f"{value!r}; e.g. feeding_processes: [0, 1], or leave it unset to feed every process"
        )
    return [int(p) for p in value]


def _checked_names(field_name: str, value: Any) -> dict[str, list[str]]:
    ok = isinstance(value, dict) and all(
        isinstance(k, str)
        and isinstance(v, list | tuple)
        and v
        and all(isinstance(n, str) and n for n in v)
        for k, v in value.items()
    )
    if not ok or not value:
        raise ValueError(
            f"LoaderConfig.{field_name} must map names to non-empty lists of names, got "
            f"{value!r}; e.g. {field_name}: "
            + ("{tokens: [batch, position]}" if field_name == "named_axes" else "{batch: [data]}")
        )
    return {k: [str(n) for n in v] for k, v in value.items()}


# ---------------------------------------------------------------------------------- loader
@dataclass(frozen=True)
class LoaderConfig:
    """The data loader: where rows come from, how many per step, and how the batch is sharded.

    Only the fields that are set reach the `DataLoader`; unset fields keep its defaults.

    Example:
        >>> config = LoaderConfig(source="data/tokens", global_batch_size=256, seed=3)
        >>> config.loader_kwargs()
        {'global_batch_size': 256, 'seed': 3}
        >>> LoaderConfig(global_batch_size=0)
        Traceback (most recent call last):
            ...
        ValueError: LoaderConfig.global_batch_size must be an int >= 1, got 0; set the rows per step, e.g. global_batch_size: 256
    """

    source: str | None = None
    """The rows: a psdp TensorStore dataset directory (written by ``psdp write`` or
    ``psdp.write_dataset``) or a ``.npy`` file (memory-mapped)."""

    global_batch_size: int | None = None
    """Rows per step, over all hosts."""

    partition: dict[str, str] | str | None = None
    """How each leaf is sharded: a strategy (``batch``: dimension 0 over the batch axes; ``full``:
    over every mesh axis; ``replicated``) or a partition spec such as ``(replica,data),context``;
    or a dict leaf -> one of those. Unset: batch."""

    shuffle: bool | None = None
    """Permute the rows each epoch. Unset: the loader's default (true for random-access sources)."""

    seed: int | None = None
    """The shuffle seed (unset: 0)."""

    prefetch: int | None = None
    """Batches prepared ahead of the trainer (unset: 2)."""

    drop_last: bool | None = None
    """Drop each epoch's short final batch instead of padding it (unset: the loader's default)."""

    halo: dict[str, int] | int | None = None
    """Extra sequence columns on each side of a context-sharded leaf, or a dict leaf -> columns
    (unset: 0)."""

    pad_value: int | float | None = None
    """Fill for padding rows and halo columns outside the sequence (unset: 0)."""

    mask_key: str | None = None
    """Name of the boolean leaf of every dict batch that marks its real rows (unset: ``mask``)."""

    dtypes: dict[str, str] | str | None = None
    """Cast leaves on every read, range-checked: a dict leaf -> dtype name, e.g. ``{tokens:
    int32}`` (needed for 64-bit leaves without ``jax_enable_x64``), or one name for a single-array
    source (unset: the source's dtypes)."""

    read_threads: int | None = None
    """Steps read concurrently by background threads (unset: 1)."""

    feeding_processes: list[int] | None = None
    """Only these processes' batch shards get real rows, the rest padding (unset: every process)."""

    named_axes: dict[str, list[str]] | None = None
    """haliax axis names per leaf, e.g. ``{tokens: [batch, position]}``: those leaves come out as
    ``NamedArray`` with specs from ``axis_mapping`` (unset: plain arrays)."""

    axis_mapping: dict[str, list[str]] | None = None
    """Axis name -> mesh axes, e.g. ``{batch: [replica, data], position: [context]}``; needed with
    ``named_axes``."""

    read_timeout_s: float | None = None
    """Raise `TimeoutError` naming the step when one read takes longer (unset: no limit)."""

    def __post_init__(self) -> None:
        if self.source is not None and (not isinstance(self.source, str) or not self.source):
            raise ValueError(
                f"LoaderConfig.source must be a path, got {self.source!r}; give a psdp dataset "
                "directory or a .npy file, e.g. source: data/tokens"
            )
        _check_count("global_batch_size", self.global_batch_size, "set the rows per step", 256)
        _check_count("prefetch", self.prefetch, "prepare at least one batch ahead", 2)
        _check_count("read_threads", self.read_threads, "use at least one reader thread", 1)
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"LoaderConfig.seed must be an int, got {self.seed!r}; e.g. seed: 0")
        for name in ("shuffle", "drop_last"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(
                    f"LoaderConfig.{name} must be true or false, got {value!r}; e.g. {name}: true"
                )
        if self.partition is not None:
            object.__setattr__(self, "partition", _checked_partition(self.partition))
        if self.halo is not None:
            object.__setattr__(self, "halo", _checked_halo(self.halo))
        if self.pad_value is not None and (
            isinstance(self.pad_value, bool) or not isinstance(self.pad_value, int | float)
        ):
            raise ValueError(
                f"LoaderConfig.pad_value must be a number, got {self.pad_value!r}; e.g. pad_value: 0"
            )
        if self.mask_key is not None and (not isinstance(self.mask_key, str) or not self.mask_key):
            raise ValueError(
                f"LoaderConfig.mask_key must be a non-empty leaf name, got {self.mask_key!r}; "
                "e.g. mask_key: mask"
            )
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", _checked_dtypes(self.dtypes))
        if self.feeding_processes is not None:
            object.__setattr__(
                self, "feeding_processes", _checked_processes(self.feeding_processes)
            )
        for name in ("named_axes", "axis_mapping"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _checked_names(name, getattr(self, name)))
        if (self.named_axes is None) != (self.axis_mapping is None):
            raise ValueError(
                "LoaderConfig.named_axes and LoaderConfig.axis_mapping go together: set both "
                "(e.g. named_axes: {tokens: [batch, position]}, axis_mapping: {batch: [data], "
                "position: [context]}) or neither"
            )
        if self.read_timeout_s is not None and (
            isinstance(self.read_timeout_s, bool)
            or not isinstance(self.read_timeout_s, int | float)
            or not self.read_timeout_s > 0
        ):
            raise ValueError(
                f"LoaderConfig.read_timeout_s must be a positive number of seconds, got "
                f"{self.read_timeout_s!r}; e.g. read_timeout_s: 60, or leave it unset for no limit"
            )

    def batch_spec(self) -> str | PartitionSpec | dict[str, str | PartitionSpec] | None:
        """``partition`` in the form `DataLoader` takes: strategy names stay, specs are parsed.

        Example:
            >>> LoaderConfig(partition={"tokens": "data,model", "mask": "batch"}).batch_spec()
            {'tokens': P('data', 'model'), 'mask': 'batch'}
        """
        if self.partition is None:
            return None
        if isinstance(self.partition, dict):
            return {leaf: _spec_of(text) for leaf, text in self.partition.items()}
        return _spec_of(self.partition)

    def loader_kwargs(self) -> dict[str, Any]:
        """The `DataLoader` keyword arguments this config sets (unset fields are left out)."""
        kwargs = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("source", "partition") and getattr(self, f.name) is not None
        }
        if self.partition is not None:
            kwargs["batch_spec"] = self.batch_spec()
        return kwargs

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

        ``batch_axes`` (e.g. ``MeshConfig.batch_axes``) are the axes the ``batch`` partition
        splits over; default: the mesh axes named like batch axes.

        Example:
            >>> import numpy as np
            >>> mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
            >>> config = LoaderConfig(global_batch_size=8, shuffle=False)
            >>> with config.build(mesh, source=np.arange(32, dtype=np.int32).reshape(16, 2)) as loader:
            ...     np.asarray(next(iter(loader)))[:, 0].tolist()
            [0, 2, 4, 6, 8, 10, 12, 14]
        """
        from psdp._runtime.loader import DataLoader

        if self.global_batch_size is None:
            raise ValueError(
                "LoaderConfig.global_batch_size is unset; set the rows per step, e.g. "
                "global_batch_size: 256"
            )
        return DataLoader(
            self.open_source() if source is None else source,
            mesh=mesh,
            batch_axes=batch_axes,
            **self.loader_kwargs(),
        )

    def restore(
        self,
        state: Mapping[str, Any],
        mesh: Mesh,
        source: Any = None,
        batch_axes: Sequence[str] | None = None,
    ) -> DataLoader:
        """The `DataLoader` of `build`, continuing from a saved ``loader.state()``.

        Checks as `DataLoader.restore` does: a set ``global_batch_size``, ``seed``, ``shuffle``
        or ``drop_last`` that differs from the state, or a source with other rows or leaves, is
        an error naming both values; unset ones take the state's value.

        Example:
            >>> import numpy as np
            >>> mesh = MeshConfig(axes={"data": 4, "model": 2}).build()
            >>> config = LoaderConfig(global_batch_size=8, shuffle=False)
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

        return DataLoader.restore(
            state,
            self.open_source() if source is None else source,
            mesh=mesh,
            batch_axes=batch_axes,
            **self.loader_kwargs(),
        )


def _check_count(name: str, value: Any, fix: str, example: int) -> None:
    if value is not None and (not is_int(value) or value < 1):
        raise ValueError(
            f"LoaderConfig.{name} must be an int >= 1, got {value!r}; {fix}, e.g. {name}: {example}"
        )


def _checked_partition(partition: Any) -> str | dict[str, str]:
    if isinstance(partition, Mapping):
        if not partition:
            raise ValueError(
                "LoaderConfig.partition is an empty dict; give leaf -> strategy or spec, e.g. "
                "partition: {tokens: batch}, or leave it unset"
            )
        for leaf, text in partition.items():
            _spec_text(text, f"LoaderConfig.partition[{leaf!r}]")
        return {str(k): str(v) for k, v in partition.items()}
    return _spec_text(partition, "LoaderConfig.partition")


def _spec_text(text: Any, where: str) -> str:
    try:
        if not isinstance(text, str):
            raise ValueError(f"got a {type(text).__name__}")
        _spec_of(text)
    except ValueError as err:
        raise ValueError(
            f"{where} {text!r} is not a strategy ({', '.join(PARTITION_STRATEGIES)}) or a partition "
            f"spec ({err}); e.g. partition: batch, or partition: '(replica,data),context'"
        ) from None
    return text


def _spec_of(text: str) -> str | PartitionSpec:
    from jax.sharding import PartitionSpec

    if text.strip() in PARTITION_STRATEGIES:
        return text.strip()
    return PartitionSpec(*parse_spec(text))


def _checked_dtypes(dtypes: Any) -> str | dict[str, str]:
    import numpy as np

    items = dtypes.items() if isinstance(dtypes, Mapping) else [(None, dtypes)]
    for leaf, name in items:
        try:
            np.dtype(name)
        except TypeError:
            where = "LoaderConfig.dtypes" + ("" if leaf is None else f"[{leaf!r}]")
            raise ValueError(
                f"{where} must be a numpy dtype name, got {name!r}; e.g. dtypes: {{tokens: int32}}"
            ) from None
    return {str(k): str(v) for k, v in dtypes.items()} if isinstance(dtypes, Mapping) else dtypes


def _checked_halo(halo: Any) -> int | dict[str, int]:
    example = "e.g. halo: 128, or halo: {tokens: 128}"
    items = halo.items() if isinstance(halo, Mapping) else [(None, halo)]
    for leaf, value in items:
        if not is_int(value) or value < 0:
            where = "LoaderConfig.halo" + ("" if leaf is None else f"[{leaf!r}]")
            raise ValueError(
                f"{where} must be an int >= 0 (sequence columns on each side), got {value!r}; "
                f"{example}"
            )
    return {str(k): int(v) for k, v in halo.items()} if isinstance(halo, Mapping) else int(halo)


# ----------------------------------------------------------------------------------- text forms
def parse_axes(text: str) -> dict[str, int]:
    """Parses ``--axes``: ``"data=4,model=4"`` -> ``{"data": 4, "model": 4}``.

    Example:
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


def parse_names(text: str) -> tuple[str, ...]:
    """Parses a comma-separated list of axis names: ``"replica,data"`` -> ``("replica", "data")``.

    Example:
        >>> parse_names("replica, data")
        ('replica', 'data')
    """
    names = tuple(part.strip() for part in text.split(","))
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise ValueError(
            f"{bad[0]!r} is not an axis name; give comma-separated axis names, e.g. replica,data"
        )
    return names


def parse_spec(text: str) -> tuple[Any, ...]:
    """Parses a partition spec text into its entries, one per leaf dimension.

    Each entry is an axis name, several axis names as ``(a,b)`` or ``a+b``, or ``None``/``-`` for
    a replicated dimension.

    Example:
        >>> parse_spec("(replica,data),context")
        (('replica', 'data'), 'context')
        >>> parse_spec("data+fsdp,-")
        (('data', 'fsdp'), None)
    """
    return tuple(_spec_entry(entry) for entry in _split_top_level(text))


def _split_top_level(text: str) -> list[str]:
    """Splits on the commas outside parentheses."""
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(
                "parentheses are unbalanced or nested; group axes once, e.g. '(replica,data),context'"
            )
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '(' is not closed; group axes like '(replica,data)'")
    return [*entries, current]


def _spec_entry(entry: str) -> str | tuple[str, ...] | None:
    entry = entry.strip()
    if entry in ("None", "-"):
        return None
    if entry.startswith("(") and entry.endswith(")"):
        names = parse_names(entry[1:-1])
    else:
        names = tuple(part.strip() for part in entry.split("+"))
    if not all(name.isidentifier() for name in names):
        raise ValueError(
            f"entry {entry!r} is not an axis name, (a,b), a+b, None or -; e.g. '(replica,data),context'"
        )
    return names[0] if len(names) == 1 else names
