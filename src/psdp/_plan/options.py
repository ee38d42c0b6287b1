"""The `DataLoader`'s options in four frozen groups, each validated once when made (``docs/loader.md``).

A group checks what its values alone decide (types, ranges, combinations) and normalises them
(spec texts to `PartitionSpec`, sequences to tuples, mappings to dicts); what needs the mesh or
the source is checked when the loader is planned. Bad input raises `TypeError` for a wrong type
and `ValueError` for a wrong value, naming the field, the value, the rule and a fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp._checks import is_int
from psdp._plan.order import check_seed
from psdp._plan.partition import DEFAULT_BATCH_AXES, STRATEGIES

#: A leaf's spec as the options hold it: a strategy name or a `PartitionSpec`.
Spec = str | PartitionSpec

# The fields' annotations are also what draccus decodes YAML and flags with: it tries a union's
# types in order and its `str` takes anything, its `tuple` splits a string, so lists come first,
# then `str`, then tuples (which the API accepts too); `__post_init__` normalises to tuples.


# ------------------------------------------------------------------------------------ groups
@dataclass(frozen=True)
class OrderOptions:
    """Which rows each step holds: the batch size, the shuffle and the epoch's end.

    Example:
        >>> OrderOptions(global_batch_size=256, seed=3)
        OrderOptions(global_batch_size=256, shuffle=None, seed=3, drop_last=False)
        >>> OrderOptions(global_batch_size=0)
        Traceback (most recent call last):
            ...
        ValueError: OrderOptions.global_batch_size must be >= 1, got 0 (the real rows per step); e.g. global_batch_size=256
    """

    global_batch_size: int | None = None
    """Rows per step, over all hosts (required to build a loader)."""

    shuffle: bool | None = None
    """Permute each epoch (unset: true for a random-access source, false for a stream)."""

    seed: int = 0
    """The shuffle's seed, in [0, 2**64 - 1]."""

    drop_last: bool = False
    """Drop each epoch's short final batch (false: pad it and mask the padding)."""

    def __post_init__(self) -> None:
        if self.global_batch_size is not None:
            _fix(self, "global_batch_size", _count, "the real rows per step", 256)
        if self.shuffle is not None:
            _fix(self, "shuffle", _flag)
        _fix(self, "drop_last", _flag)
        _fix(self, "seed", _seed)


@dataclass(frozen=True)
class ShardingOptions:
    """How each leaf is split over the mesh, and which processes are fed (``docs/partitioning.md``).

    Example:
        A spec text is parsed; a dict is per leaf, and its missing leaves take ``"batch"``:

        >>> ShardingOptions(batch_spec={"tokens": "data,context", "mask": "batch"}).batch_spec
        {'tokens': P('data', 'context'), 'mask': 'batch'}
        >>> ShardingOptions(batch_spec="data,model", batch_axes="data")
        Traceback (most recent call last):
            ...
        ValueError: ShardingOptions.batch_axes ('data',) would be ignored: only the 'batch' strategy splits over batch_axes, and batch_spec P('data', 'model') does not use it; drop batch_axes, or name the axes in the spec, e.g. batch_spec=PartitionSpec(('replica', 'data'))
    """

    batch_spec: Mapping[str, str | PartitionSpec] | str | PartitionSpec | None = None
    """How leaves are split: a strategy (batch: dimension 0 over the batch axes; full: over every
    mesh axis; replicated), a partition spec such as ``(replica,data),context``, or a dict leaf ->
    one of those (missing leaves: batch). Unset: batch."""

    batch_axes: list[str] | str | tuple[str, ...] | None = None
    """The mesh axes the batch strategy splits over, major to minor (unset: the axes named
    replica, data, fsdp or batch, in mesh order)."""

    named_axes: Mapping[str, list[Any] | tuple[Any, ...]] | list[Any] | tuple[Any, ...] | None = (
        None
    )
    """haliax axis names per leaf, e.g. ``{tokens: [batch, position]}`` (one sequence for an
    array source): those leaves come out as ``NamedArray``, their specs from ``axis_mapping``."""

    axis_mapping: Mapping[str, list[str] | str | tuple[str, ...] | None] | None = None
    """Axis name -> mesh axis or axes, e.g. ``{batch: [replica, data], position: context}``;
    goes with ``named_axes``."""

    halo: Mapping[str, int] | int = 0
    """Columns of each neighbouring sequence shard added on each side of a device's window: an
    int for every sequence-sharded leaf, or a dict leaf -> int."""

    feeding_processes: list[int] | tuple[int, ...] | None = None
    """Only these processes' batch shards get real rows, the rest padding (unset: every one)."""

    def __post_init__(self) -> None:
        if self.batch_spec is not None:
            _set(self, "batch_spec", _batch_spec(self.batch_spec))
        if self.batch_axes is not None:
            _fix(self, "batch_axes", _names, "e.g. batch_axes=('replica', 'data')")
        if self.named_axes is not None:
            _set(self, "named_axes", _named_axes(self.named_axes))
        if self.axis_mapping is not None:
            _set(self, "axis_mapping", _axis_mapping(self.axis_mapping))
        _set(self, "halo", _halo(self.halo))
        if self.feeding_processes is not None:
            _set(self, "feeding_processes", _processes(self.feeding_processes))
        self._refuse_conflicts()

    def uses_batch_axes(self) -> bool:
        """Whether ``batch_axes`` can reach a leaf: ``batch_spec`` is unset, ``"batch"``, or a
        dict (whose missing leaves take ``"batch"``).

        Example:
            >>> ShardingOptions().uses_batch_axes(), ShardingOptions(batch_spec="full").uses_batch_axes()
            (True, False)
        """
        return (
            self.batch_spec is None
            or self.batch_spec == "batch"
            or isinstance(self.batch_spec, dict)
        )

    def _refuse_conflicts(self) -> None:
        where = "ShardingOptions"
        if self.batch_axes is not None and not self.uses_batch_axes():
            raise ValueError(
                f"{where}.batch_axes {self.batch_axes} would be ignored: only the 'batch' strategy "
                f"splits over batch_axes, and batch_spec {self.batch_spec!r} does not use it; drop "
                "batch_axes, or name the axes in the spec, e.g. "
                "batch_spec=PartitionSpec(('replica', 'data'))"
            )
        if self.named_axes is not None and self.axis_mapping is None:
            raise ValueError(
                f"{where}.named_axes needs an axis_mapping from axis names to mesh axes, got "
                f"named_axes={self.named_axes!r} alone; add e.g. "
                'axis_mapping={"batch": ("replica", "data"), "position": "context"}'
            )
        if self.axis_mapping is not None and self.named_axes is None:
            raise ValueError(
                f"{where}.axis_mapping {self.axis_mapping!r} is given without named_axes, so no "
                "leaf would use it; name each leaf's axes, e.g. named_axes={'tokens': ('batch', "
                "'position')}, or drop axis_mapping"
            )
        both = _leaves_with_both(self.named_axes, self.batch_spec)
        if both:
            raise ValueError(
                f"{where}: {both} has both a batch_spec entry ({self.batch_spec!r}) and "
                f"named_axes ({self.named_axes!r}); give one of them: a named leaf's spec follows "
                "from named_axes and axis_mapping"
            )


@dataclass(frozen=True)
class OutputOptions:
    """What the delivered leaves hold beyond the rows: the padding's fill, the mask leaf, dtypes.

    Example:
        >>> OutputOptions(pad_value=-1, dtypes={"tokens": "int32"})
        OutputOptions(pad_value=-1, mask_key='mask', dtypes={'tokens': 'int32'})
        >>> OutputOptions(mask_key="")
        Traceback (most recent call last):
            ...
        ValueError: OutputOptions.mask_key must be a non-empty leaf name or None (no mask leaf), got ''; e.g. mask_key='mask'
    """

    pad_value: int | float = 0
    """Fill of padding rows and of halo columns outside the sequence."""

    mask_key: str | None = "mask"
    """Name of the boolean leaf of every dict batch that marks its real rows (null: no mask
    leaf, and padding is then an error)."""

    dtypes: Any = None
    """Cast leaves on every read, range-checked: a dict leaf -> dtype, e.g. ``{tokens: int32}``
    (needed for 64-bit leaves without ``jax_enable_x64``), or one dtype for an array source
    (unset: the source's dtypes)."""

    def __post_init__(self) -> None:
        _fix(self, "pad_value", _number)
        if self.mask_key is not None:
            _fix(self, "mask_key", _leaf_name)
        if self.dtypes is not None:
            _set(self, "dtypes", _dtypes(self.dtypes))


@dataclass(frozen=True)
class ReadingOptions:
    """How the background threads read: prefetch depth, threads, time limit, stall warning.

    Example:
        >>> ReadingOptions(prefetch=4, read_timeout_s=60)
        ReadingOptions(prefetch=4, read_threads=1, read_timeout_s=60.0, stall_warning_s=1.0)
        >>> ReadingOptions(read_threads=0)
        Traceback (most recent call last):
            ...
        ValueError: ReadingOptions.read_threads must be >= 1, got 0 (steps read at once); e.g. read_threads=1
    """

    prefetch: int = 2
    """Finished batches that wait in the queue (>= 1)."""

    read_threads: int = 1
    """Steps read and assembled concurrently by background threads (>= 1)."""

    read_timeout_s: float | None = None
    """Raise `TimeoutError` naming the step when its reads take longer (unset: no limit)."""

    stall_warning_s: float | None = 1.0
    """Log a warning with the loader's figures when the trainer waits longer for one batch
    (null: never)."""

    def __post_init__(self) -> None:
        _fix(self, "prefetch", _count, "batches ahead", 2)
        _fix(self, "read_threads", _count, "steps read at once", 1)
        _fix(self, "read_timeout_s", _seconds, "> 0 or None (a number of seconds, or no limit)", 60)
        _fix(
            self,
            "stall_warning_s",
            _seconds,
            "a positive number of seconds or None (no warning)",
            1,
        )


GROUPS: dict[str, Any] = {
    "order": OrderOptions,
    "sharding": ShardingOptions,
    "output": OutputOptions,
    "reading": ReadingOptions,
}
#: flat keyword -> the group that holds it
GROUP_OF = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}


@dataclass(frozen=True)
class LoaderOptions:
    """The four groups together: every option of a `DataLoader` but its source, mesh and name.

    Example:
        Flat keywords are the front door to the same groups:

        >>> options = LoaderOptions.create(global_batch_size=8, seed=3, prefetch=4)
        >>> options == LoaderOptions(OrderOptions(global_batch_size=8, seed=3),
        ...                          reading=ReadingOptions(prefetch=4))
        True
        >>> LoaderOptions.create(global_batch_size=8, batch_size=8)
        Traceback (most recent call last):
            ...
        TypeError: unknown loader option 'batch_size' (did you mean 'global_batch_size'?); the options are axis_mapping, batch_axes, batch_spec, drop_last, dtypes, feeding_processes, global_batch_size, halo, mask_key, named_axes, pad_value, prefetch, read_threads, read_timeout_s, seed, shuffle, stall_warning_s (docs/loader.md)
    """

    order: OrderOptions = field(default_factory=OrderOptions)
    sharding: ShardingOptions = field(default_factory=ShardingOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    reading: ReadingOptions = field(default_factory=ReadingOptions)

    def __post_init__(self) -> None:
        check_groups("LoaderOptions", vars(self))
        if self.order.global_batch_size is None:
            raise TypeError(
                "the loader needs global_batch_size (the real rows per step), but it is unset; "
                "pass global_batch_size=256, or order=OrderOptions(global_batch_size=256) (in a "
                "config: order.global_batch_size: 256)"
            )

    @classmethod
    def create(
        cls,
        order: OrderOptions | None = None,
        sharding: ShardingOptions | None = None,
        output: OutputOptions | None = None,
        reading: ReadingOptions | None = None,
        **keywords: Any,
    ) -> LoaderOptions:
        """The groups from group objects and/or flat keywords (each keyword goes to its group).

        A keyword of a group also given as an object is an error, as is an unknown keyword.
        """
        return cls(
            **route(order=order, sharding=sharding, output=output, reading=reading, **keywords)
        )


def route(**given: Any) -> dict[str, Any]:
    """``{"order": OrderOptions, ...}`` from group objects (``order=...``) and flat keywords.

    Example:
        >>> route(seed=3, reading=ReadingOptions(prefetch=4))["order"]
        OrderOptions(global_batch_size=None, shuffle=None, seed=3, drop_last=False)
    """
    groups = {name: given.pop(name, None) for name in GROUPS}
    unknown = sorted(set(given) - set(GROUP_OF))
    if unknown:
        close = _suggest(unknown[0])
        hint = f" (did you mean {close!r}?)" if close else ""
        raise TypeError(
            f"unknown loader option {', '.join(map(repr, unknown))}{hint}; the options are "
            f"{', '.join(sorted(GROUP_OF))} (docs/loader.md)"
        )
    check_groups("", {k: v for k, v in groups.items() if v is not None})
    out = {}
    for name, kind in GROUPS.items():
        flat = {k: v for k, v in given.items() if GROUP_OF[k] == name}
        if groups[name] is None:
            out[name] = kind(**flat)
        elif flat:
            raise TypeError(
                f"{', '.join(sorted(flat))} given as keywords and in {name}={kind.__name__}(...): "
                f"give each option once, e.g. {name}=dataclasses.replace({name}, "
                f"{next(iter(flat))}=...), or the keywords without {name}="
            )
        else:
            out[name] = groups[name]
    return out


#: names that other loaders (or older psdp) use for an option
_OTHER_NAMES = {"partition": "batch_spec", "spec": "batch_spec", "workers": "read_threads"}


def _suggest(name: str) -> str | None:
    if name in _OTHER_NAMES:
        return _OTHER_NAMES[name]
    matches = [option for option in GROUP_OF if name in option]
    matches = matches or difflib.get_close_matches(name, GROUP_OF, n=1)
    return matches[0] if matches else None


def check_groups(owner: str, groups: Mapping[str, Any]) -> None:
    """Raises `TypeError` unless each of ``groups`` (name -> value) is its group's class."""
    for name, value in groups.items():
        kind = GROUPS[name]
        if not isinstance(value, kind):
            where = f"{owner}.{name}" if owner else name
            raise _type_error(
                where,
                value,
                f"a {kind.__name__}",
                f"e.g. {name}={kind.__name__}(...), or its fields as keywords",
            )


# ------------------------------------------------------------------------------- spec texts
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
    a replicated dimension. `spec_text` writes a spec back.

    Example:
        >>> parse_spec("(replica,data),context")
        (('replica', 'data'), 'context')
        >>> parse_spec("data+fsdp,-")
        (('data', 'fsdp'), None)
    """
    return tuple(_spec_entry(entry) for entry in _split_top_level(text))


def spec_text(spec: PartitionSpec) -> str:
    """The text of ``spec`` that `parse_spec` reads back (for YAML and JSON).

    Example:
        >>> spec_text(PartitionSpec(("replica", "data"), None, "context"))
        '(replica,data),-,context'
    """
    if not len(spec):
        raise ValueError("PartitionSpec() has no text form; write the strategy 'replicated'")
    return ",".join(
        "-" if entry is None else entry if isinstance(entry, str) else f"({','.join(entry)})"
        for entry in spec
    )


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


# ------------------------------------------------------------------------------ field checks
def _set(group: Any, name: str, value: Any) -> None:
    object.__setattr__(group, name, value)  # normalising a frozen group, once, in __post_init__


def _fix(group: Any, name: str, check: Any, *args: Any) -> None:
    """Sets field ``name`` to ``check(where, value, *args)``: the value checked and normalised."""
    _set(group, name, check(f"{type(group).__name__}.{name}", getattr(group, name), *args))


def _type_error(where: str, value: Any, rule: str, fix: str) -> TypeError:
    return TypeError(f"{where} must be {rule}, got {value!r} of type {type(value).__name__}; {fix}")


def _example(where: str, value: Any) -> str:
    return f"e.g. {where.rpartition('.')[2]}={value!r}"


def _count(where: str, value: Any, meaning: str, example: int) -> int:
    if not is_int(value):
        raise _type_error(where, value, "an int", _example(where, example))
    if value < 1:
        raise ValueError(
            f"{where} must be >= 1, got {value} ({meaning}); {_example(where, example)}"
        )
    return int(value)


def _flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise _type_error(where, value, "True or False", _example(where, True))
    return bool(value)


def _seed(where: str, value: Any) -> int:
    if not is_int(value):
        raise _type_error(where, value, "an int", _example(where, 0))
    try:
        check_seed(value)
    except ValueError as err:  # "seed must be in [0, 2**64 - 1] ..., got ...; pass ..."
        raise ValueError(f"{where.rpartition('.')[0]}.{err}") from None
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool | np.bool_)


def _number(where: str, value: Any) -> Any:
    if not _is_number(value):
        rule = "a number (it fills padding rows and halo columns)"
        raise _type_error(where, value, rule, _example(where, 0))
    return value.item() if isinstance(value, np.generic) else value  # exact: a Python number


def _leaf_name(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _type_error(where, value, "a leaf name or None", _example(where, "mask"))
    if not value:
        raise ValueError(
            f"{where} must be a non-empty leaf name or None (no mask leaf), got ''; "
            f"{_example(where, 'mask')}"
        )
    return value


def _seconds(where: str, value: Any, rule: str, example: int) -> float | None:
    if value is None:
        return None
    if not _is_number(value):
        raise _type_error(where, value, rule, _example(where, example))
    if not value > 0:
        raise ValueError(f"{where} must be {rule}, got {value!r}; {_example(where, example)}")
    return float(value)


def _names(where: str, value: Any, fix: str) -> tuple[str, ...]:
    """One name or a sequence of names, as a non-empty tuple of non-empty strings, each once."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise _type_error(where, value, "a name or a sequence of names", fix)
    if not names or not all(names) or len(set(names)) != len(names):
        raise ValueError(f"{where} must name at least one axis, each once, got {value!r}; {fix}")
    return tuple(names)


def _leaf_dict(where: str, value: Mapping[Any, Any], fix: str) -> dict[str, Any]:
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise _type_error(f"{where} key", bad[0], "a leaf name (a str)", fix)
    return dict(value)


def _batch_spec(value: Any) -> Spec | dict[str, Spec]:
    where = "ShardingOptions.batch_spec"
    if isinstance(value, Mapping):
        specs = _leaf_dict(where, value, "e.g. batch_spec={'tokens': 'data,context'}")
        return {leaf: _spec(f"{where}[{leaf!r}]", spec) for leaf, spec in specs.items()}
    return _spec(where, value)


def _spec(where: str, value: Any) -> Spec:
    fix = "e.g. batch_spec='batch', batch_spec='(replica,data),context' or a PartitionSpec"
    if isinstance(value, PartitionSpec):
        return value if len(value) else "replicated"  # one value per meaning: P() is replicated
    if not isinstance(value, str):
        raise _type_error(
            where, value, f"a strategy {STRATEGIES}, a spec text or a PartitionSpec", fix
        )
    text = value.strip()
    if text in STRATEGIES:
        return text
    close = _misspelt_strategy(text)
    if close:
        raise ValueError(
            f"{where} is not a strategy (did you mean {close!r}?), got {value!r}; use a "
            f"jax.sharding.PartitionSpec or one of the strategies {STRATEGIES}, or write "
            f"'({text})' to mean the mesh axis {text!r}"
        )
    try:
        return PartitionSpec(*parse_spec(text))
    except ValueError as err:
        raise ValueError(
            f"{where} {value!r} is neither a strategy {STRATEGIES} nor a partition spec text "
            f"({err}); {fix}"
        ) from None


def _misspelt_strategy(text: str) -> str | None:
    """The strategy a bare name is a near miss of (``fully``), unless it is a usual axis name."""
    if text in DEFAULT_BATCH_AXES or not text.isidentifier():
        return None
    close = difflib.get_close_matches(text, STRATEGIES, n=1, cutoff=0.75)
    return close[0] if close else None


def _named_axes(value: Any) -> dict[str, tuple[Any, ...]] | tuple[Any, ...]:
    where = "ShardingOptions.named_axes"
    fix = "e.g. named_axes={'tokens': ('batch', 'position')}"
    if isinstance(value, Mapping):
        return {
            k: _axis_names(f"{where}[{k!r}]", v, fix)
            for k, v in _leaf_dict(where, value, fix).items()
        }
    return _axis_names(where, value, fix)


def _axis_names(where: str, value: Any, fix: str) -> tuple[Any, ...]:
    """A leaf's axis names: strings, or objects with a string ``name`` (haliax ``Axis``)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _type_error(where, value, "a sequence of axis names, one per dimension", fix)
    for name in value:
        if not isinstance(getattr(name, "name", name), str):
            raise _type_error(where, value, "a sequence of axis names (str or haliax Axis)", fix)
    if not value or not all(getattr(name, "name", name) for name in value):
        raise ValueError(f"{where} must name every dimension of the leaf, got {value!r}; {fix}")
    return tuple(value)


def _axis_mapping(value: Any) -> dict[str, tuple[str, ...] | str | None]:
    where = "ShardingOptions.axis_mapping"
    fix = "e.g. axis_mapping={'batch': ('replica', 'data'), 'position': 'context'}"
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _type_error(where, value, "a dict axis name -> mesh axis or axes", fix)
    return {
        name: axes
        if axes is None or isinstance(axes, str)
        else _names(f"{where}[{name!r}]", axes, fix)
        for name, axes in value.items()
    }


def _halo(value: Any) -> int | dict[str, int]:
    where = "ShardingOptions.halo"
    fix = "e.g. halo=128, or halo={'tokens': 128}"
    if isinstance(value, Mapping):
        halos = _leaf_dict(where, value, fix)
        return {leaf: _columns(f"{where}[{leaf!r}]", h, fix) for leaf, h in halos.items()}
    return _columns(where, value, fix)


def _columns(where: str, value: Any, fix: str) -> int:
    if not is_int(value):
        raise _type_error(where, value, "an int >= 0 (sequence columns on each side)", fix)
    if value < 0:
        raise ValueError(
            f"{where} must be >= 0, got {value} (sequence columns on each side); {fix}"
        )
    return int(value)


def _processes(value: Any) -> tuple[int, ...]:
    where = "ShardingOptions.feeding_processes"
    fix = "e.g. feeding_processes=(0, 1), or None to feed every process"
    if (
        not isinstance(value, Sequence | np.ndarray)
        or isinstance(value, str)
        or not all(is_int(p) for p in value)
    ):
        raise _type_error(where, value, "a sequence of process indices", fix)
    if not len(value) or min(value) < 0:
        raise ValueError(f"{where} must name at least one process, each >= 0, got {value!r}; {fix}")
    return tuple(int(p) for p in value)


def _dtypes(value: Any) -> Any:
    where = "OutputOptions.dtypes"
    fix = "e.g. dtypes={'tokens': np.int32}, or dtypes=np.int32 for an array source"
    if not isinstance(value, Mapping):
        _dtype(where, value, fix)
        return value
    dtypes = _leaf_dict(where, value, fix)
    for leaf, dtype in dtypes.items():
        _dtype(f"{where}[{leaf!r}]", dtype, fix)
    return dtypes


def _dtype(where: str, value: Any, fix: str) -> None:
    try:
        if value is None:  # np.dtype(None) is float64: never what None means here
            raise TypeError("None is no dtype")
        np.dtype(value)
    except TypeError:
        raise _type_error(where, value, "a numpy dtype or dtype name", fix) from None


def _leaves_with_both(named_axes: Any, batch_spec: Any) -> str:
    """The leaves that have named axes and a batch_spec entry, as a message names them."""
    if named_axes is None or batch_spec is None:
        return ""
    if not isinstance(named_axes, dict):  # the single leaf of an array source
        return "the array source"
    if not isinstance(batch_spec, dict):
        return ""  # the spec goes to the other leaves
    both = sorted(set(named_axes) & set(batch_spec))
    return ", ".join(f"leaf {leaf!r}" for leaf in both)
