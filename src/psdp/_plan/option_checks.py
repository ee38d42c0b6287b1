"""The field checks of the option groups (`psdp._plan.options`): each takes where (``Group.field``)
and a value, and returns it checked and normalised (``TypeError``/``ValueError`` naming both)."""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from psdp._checks import is_int
from psdp._plan.order import check_seed
from psdp._plan.partition import DEFAULT_BATCH_AXES, STRATEGIES
from psdp._plan.spec_text import parse_spec
from psdp._plan.windows import BOUNDARIES, AxisHalo

#: A leaf's spec as the options hold it: a strategy name or a `PartitionSpec`.
Spec = str | PartitionSpec


def set_field(group: Any, name: str, value: Any) -> None:
    object.__setattr__(group, name, value)  # normalising a frozen group, once, in __post_init__


def fix_field(group: Any, name: str, check: Any, *args: Any) -> None:
    """Sets field ``name`` to ``check(where, value, *args)``: the value checked and normalised."""
    set_field(group, name, check(f"{type(group).__name__}.{name}", getattr(group, name), *args))


def type_error(where: str, value: Any, rule: str, fix: str) -> TypeError:
    return TypeError(f"{where} must be {rule}, got {value!r} of type {type(value).__name__}; {fix}")


def example_of(where: str, value: Any) -> str:
    return f"e.g. {where.rpartition('.')[2]}={value!r}"


def as_count(where: str, value: Any, meaning: str, example: int) -> int:
    if not is_int(value):
        raise type_error(where, value, "an int", example_of(where, example))
    if value < 1:
        raise ValueError(
            f"{where} must be >= 1, got {value} ({meaning}); {example_of(where, example)}"
        )
    return int(value)


def as_flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise type_error(where, value, "True or False", example_of(where, True))
    return bool(value)


def as_seed(where: str, value: Any) -> int:
    if not is_int(value):
        raise type_error(where, value, "an int", example_of(where, 0))
    try:
        check_seed(value)
    except ValueError as err:  # "seed must be in [0, 2**64 - 1] ..., got ...; pass ..."
        raise ValueError(f"{where.rpartition('.')[0]}.{err}") from None
    return int(value)


def as_batch_size(where: str, value: Any) -> int | tuple[tuple[int, int], ...]:
    """An int, or a schedule: ``(start_step, rows)`` stages from step 0, starts increasing."""
    if is_int(value):
        return as_count(where, value, "the real rows per step", 256)
    example = "e.g. global_batch_size=256, or a schedule global_batch_size=[(0, 256), (1000, 512)]"
    stages = as_pairs(where, value, "an int or a schedule of (start_step, rows) stages", example)
    if not stages:
        raise ValueError(f"{where} is an empty schedule; give an int or stages, {example}")
    for index, (start, rows) in enumerate(stages):
        stage = f"{where} stage {index} {(start, rows)}"
        if rows < 1:
            raise ValueError(f"{stage}: rows must be >= 1, got {rows}; {example}")
        if index == 0 and start != 0:
            raise ValueError(
                f"{stage} starts at step {start}, but the first stage must start at step 0 "
                f"(the batch size of steps 0 to {start - 1} would be unknown); {example}"
            )
        if index and start <= stages[index - 1][0]:
            raise ValueError(
                f"{stage} starts at step {start}, not after stage {index - 1} (step "
                f"{stages[index - 1][0]}); list the stages by increasing start step, {example}"
            )
    return stages


def as_ranges(where: str, value: Any, unit: str) -> tuple[tuple[int, int], ...]:
    """Disjoint ``(first, end)`` ranges of ``unit`` (``0 <= first < end``), sorted."""
    example = f"e.g. {where.rpartition('.')[2]}=[(12000, 12500)]"
    ranges = as_pairs(where, value, f"a list of (first, end) ranges of {unit}s", example)
    for first, end in ranges:
        if not 0 <= first < end:
            raise ValueError(
                f"{where} range {(first, end)} must have 0 <= first < end (the {unit}s first, "
                f"first + 1, ..., end - 1 are skipped); {example}"
            )
    ranges = tuple(sorted(ranges))
    for before, after in itertools.pairwise(ranges):
        if after[0] < before[1]:
            raise ValueError(
                f"{where} ranges {before} and {after} overlap; merge them into "
                f"{(before[0], max(before[1], after[1]))}"
            )
    return ranges


def as_start(where: str, value: Any) -> tuple[int, int]:
    """A ``(step, sample offset)`` pair of ints >= 0."""
    example = "e.g. start_at=(1000, 256000)"
    pairs = as_pairs(where, [value], "a (step, sample offset) pair", example)
    step, offset = pairs[0]
    if step < 0 or offset < 0:
        raise ValueError(f"{where} must be >= 0 in both parts, got {(step, offset)}; {example}")
    return step, offset


def as_pairs(where: str, value: Any, rule: str, example: str) -> tuple[tuple[int, int], ...]:
    """A sequence of pairs of ints, as a tuple of int tuples."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise type_error(where, value, rule, example)
    pairs = []
    for item in value:
        if (
            isinstance(item, str | bytes)
            or not isinstance(item, Sequence | np.ndarray)
            or len(item) != 2
            or not all(is_int(x) for x in item)
        ):
            raise type_error(where, value, f"{rule} (pairs of ints; {item!r} is not one)", example)
        pairs.append((int(item[0]), int(item[1])))
    return tuple(pairs)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool | np.bool_)


def as_number(where: str, value: Any) -> Any:
    if not is_number(value):
        rule = "a number (it fills padding rows and halo columns)"
        raise type_error(where, value, rule, example_of(where, 0))
    return value.item() if isinstance(value, np.generic) else value  # exact: a Python number


def as_leaf_name(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise type_error(where, value, "a leaf name or None", example_of(where, "mask"))
    if not value:
        raise ValueError(
            f"{where} must be a non-empty leaf name or None (no mask leaf), got ''; "
            f"{example_of(where, 'mask')}"
        )
    return value


def as_seconds(where: str, value: Any, rule: str, example: int) -> float | None:
    if value is None:
        return None
    if not is_number(value):
        raise type_error(where, value, rule, example_of(where, example))
    if not value > 0:
        raise ValueError(f"{where} must be {rule}, got {value!r}; {example_of(where, example)}")
    return float(value)


def as_names(where: str, value: Any, fix: str) -> tuple[str, ...]:
    """One name or a sequence of names, as a non-empty tuple of non-empty strings, each once."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise type_error(where, value, "a name or a sequence of names", fix)
    if not names or not all(names) or len(set(names)) != len(names):
        raise ValueError(f"{where} must name at least one axis, each once, got {value!r}; {fix}")
    return tuple(names)


def as_leaf_dict(where: str, value: Mapping[Any, Any], fix: str) -> dict[str, Any]:
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise type_error(f"{where} key", bad[0], "a leaf name (a str)", fix)
    return dict(value)


def as_batch_spec(value: Any) -> Spec | dict[str, Spec]:
    where = "ShardingOptions.batch_spec"
    if isinstance(value, Mapping):
        specs = as_leaf_dict(where, value, "e.g. batch_spec={'tokens': 'data,context'}")
        return {leaf: as_spec(f"{where}[{leaf!r}]", spec) for leaf, spec in specs.items()}
    return as_spec(where, value)


def as_spec(where: str, value: Any) -> Spec:
    fix = "e.g. batch_spec='batch', batch_spec='(replica,data),context' or a PartitionSpec"
    if isinstance(value, PartitionSpec):
        return value if len(value) else "replicated"  # one value per meaning: P() is replicated
    if not isinstance(value, str):
        raise type_error(
            where, value, f"a strategy {STRATEGIES}, a spec text or a PartitionSpec", fix
        )
    text = value.strip()
    if text in STRATEGIES:
        return text
    close = misspelt_strategy(text)
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


def misspelt_strategy(text: str) -> str | None:
    """The strategy a bare name is a near miss of (``fully``), unless it is a usual axis name."""
    if text in DEFAULT_BATCH_AXES or not text.isidentifier():
        return None
    close = difflib.get_close_matches(text, STRATEGIES, n=1, cutoff=0.75)
    return close[0] if close else None


def as_named_axes(value: Any) -> dict[str, tuple[Any, ...]] | tuple[Any, ...]:
    where = "ShardingOptions.named_axes"
    fix = "e.g. named_axes={'tokens': ('batch', 'position')}"
    if isinstance(value, Mapping):
        return {
            k: as_axis_names(f"{where}[{k!r}]", v, fix)
            for k, v in as_leaf_dict(where, value, fix).items()
        }
    return as_axis_names(where, value, fix)


def as_axis_names(where: str, value: Any, fix: str) -> tuple[Any, ...]:
    """A leaf's axis names: strings, or objects with a string ``name`` (haliax ``Axis``)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise type_error(where, value, "a sequence of axis names, one per dimension", fix)
    for name in value:
        if not isinstance(getattr(name, "name", name), str):
            raise type_error(where, value, "a sequence of axis names (str or haliax Axis)", fix)
    if not value or not all(getattr(name, "name", name) for name in value):
        raise ValueError(f"{where} must name every dimension of the leaf, got {value!r}; {fix}")
    return tuple(value)


def as_axis_mapping(value: Any) -> dict[str, tuple[str, ...] | str | None]:
    where = "ShardingOptions.axis_mapping"
    fix = "e.g. axis_mapping={'batch': ('replica', 'data'), 'position': 'context'}"
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise type_error(where, value, "a dict axis name -> mesh axis or axes", fix)
    return {
        name: axes
        if axes is None or isinstance(axes, str)
        else as_names(f"{where}[{name!r}]", axes, fix)
        for name, axes in value.items()
    }


#: A leaf's halos as the options hold them: an int (dimension 1, ``pad``), or per dimension.
LeafHalo = int | dict[int, AxisHalo]


def as_halo(value: Any) -> int | dict[str, LeafHalo] | dict[int, AxisHalo]:
    """``ShardingOptions.halo``: an int for every sequence-sharded leaf; a dict leaf -> an int
    (dimension 1) or a dict dimension -> width or ``(width, boundary)``; or, for an array
    source's single leaf, a dict dimension -> width or ``(width, boundary)``. Normalised to
    `AxisHalo`; dimension keys may be digit strings, as JSON writes them.

    Examples:
        >>> as_halo({"tokens": 4, "field": {2: 1, "3": [2, "periodic"]}})
        {'tokens': 4, 'field': {2: AxisHalo(width=1, boundary='pad'), 3: AxisHalo(width=2, boundary='periodic')}}
        >>> as_halo({3: (1, "periodic")})  # an array source
        {3: AxisHalo(width=1, boundary='periodic')}
    """
    where = "ShardingOptions.halo"
    fix = "e.g. halo=128, halo={'tokens': 128}, or halo={'field': {2: 1, 3: (2, 'periodic')}}"
    if isinstance(value, Mapping) and value and all(map(is_dimension, value)):
        return as_axis_halos(where, value, fix)
    if isinstance(value, Mapping):
        halos = as_leaf_dict(where, value, fix)
        return {leaf: as_leaf_halo(f"{where}[{leaf!r}]", h, fix) for leaf, h in halos.items()}
    return as_columns(where, value, fix)


def as_leaf_halo(where: str, value: Any, fix: str) -> LeafHalo:
    """One leaf's halos: an int (dimension 1) or a dict dimension -> width or (width, boundary)."""
    if not isinstance(value, Mapping):
        return as_columns(where, value, fix)
    return as_axis_halos(where, value, fix)


def as_axis_halos(where: str, value: Mapping[Any, Any], fix: str) -> dict[int, AxisHalo]:
    """A dict dimension -> width or ``(width, boundary)``, as `AxisHalo` by dimension."""
    return {
        as_dimension(where, dim, fix): as_axis_halo(f"{where}[{dim!r}]", axis, fix)
        for dim, axis in value.items()
    }


def is_dimension(key: Any) -> bool:
    """Whether a key of a halo dict is a dimension number (an int, or its digits) not a leaf."""
    return is_int(key) or (isinstance(key, str) and key.isdigit())


def as_dimension(where: str, value: Any, fix: str) -> int:
    """A dimension key of a leaf's halos: an int >= 1 (or its digits, as JSON keys are strings)."""
    dim = int(value) if isinstance(value, str) and value.isdigit() else value
    if not is_int(dim):
        raise type_error(
            f"{where} key",
            value,
            "a dimension number (an int >= 1; 0 is the batch), not a mesh axis name",
            fix,
        )
    if dim == 0:
        raise ValueError(
            f"{where} gives dimension 0 a halo, but dimension 0 is the batch: its rows are "
            "separate samples with no neighbours; give halos to dimensions >= 1, e.g. "
            "halo={'field': {2: 1, 3: (2, 'periodic')}}"
        )
    if dim < 0:
        raise ValueError(f"{where} key must be a dimension >= 1, got {dim}; {fix}")
    return int(dim)


def as_axis_halo(where: str, value: Any, fix: str) -> AxisHalo:
    """A dimension's halo: a width (``pad``), or ``(width, boundary)`` with a boundary rule."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2 or not isinstance(value[1], str):
            raise type_error(where, value, "a width or (width, boundary)", fix)
        width, boundary = value
        if boundary not in BOUNDARIES:
            close = _OTHER_BOUNDARIES.get(boundary) or next(
                iter(difflib.get_close_matches(boundary, BOUNDARIES, n=1)), None
            )
            hint = f" (did you mean {close!r}?)" if close else ""
            raise ValueError(
                f"{where} has boundary {boundary!r}{hint}; a halo's boundary is one of "
                f"{BOUNDARIES}: 'pad' fills beyond the domain's edges with pad_value, 'periodic' "
                "wraps to the other end, 'continue' takes the entries that continue the row in "
                f"the source (TokenSequences); {fix}"
            )
        return AxisHalo(as_columns(where, width, fix, _ENTRIES), boundary)
    return AxisHalo(as_columns(where, value, fix, _ENTRIES))


#: numpy's ``np.pad`` modes (and other usual names) for the two boundary rules
_OTHER_BOUNDARIES = {"wrap": "periodic", "circular": "periodic", "constant": "pad", "zeros": "pad"}
_ENTRIES = "entries of each neighbour on each side"


def as_columns(
    where: str, value: Any, fix: str, meaning: str = "sequence columns on each side"
) -> int:
    if not is_int(value):
        raise type_error(where, value, f"an int >= 0 ({meaning})", fix)
    if value < 0:
        raise ValueError(f"{where} must be >= 0, got {value} ({meaning}); {fix}")
    return int(value)


def as_processes(value: Any) -> tuple[int, ...]:
    where = "ShardingOptions.feeding_processes"
    fix = "e.g. feeding_processes=(0, 1), or None to feed every process"
    if (
        not isinstance(value, Sequence | np.ndarray)
        or isinstance(value, str)
        or not all(is_int(p) for p in value)
    ):
        raise type_error(where, value, "a sequence of process indices", fix)
    if not len(value) or min(value) < 0:
        raise ValueError(f"{where} must name at least one process, each >= 0, got {value!r}; {fix}")
    return tuple(int(p) for p in value)


def as_dtypes(value: Any) -> Any:
    where = "OutputOptions.dtypes"
    fix = "e.g. dtypes={'tokens': np.int32}, or dtypes=np.int32 for an array source"
    if not isinstance(value, Mapping):
        as_dtype(where, value, fix)
        return value
    dtypes = as_leaf_dict(where, value, fix)
    for leaf, dtype in dtypes.items():
        as_dtype(f"{where}[{leaf!r}]", dtype, fix)
    return dtypes


def as_dtype(where: str, value: Any, fix: str) -> None:
    try:
        if value is None:  # np.dtype(None) is float64: never what None means here
            raise TypeError("None is no dtype")
        np.dtype(value)
    except TypeError:
        raise type_error(where, value, "a numpy dtype or dtype name", fix) from None


def leaves_with_both(named_axes: Any, batch_spec: Any) -> str:
    """The leaves that have named axes and a batch_spec entry, as a message names them."""
    if named_axes is None or batch_spec is None:
        return ""
    if not isinstance(named_axes, dict):  # the single leaf of an array source
        return "the array source"
    if not isinstance(batch_spec, dict):
        return ""  # the spec goes to the other leaves
    both = sorted(set(named_axes) & set(batch_spec))
    return ", ".join(f"leaf {leaf!r}" for leaf in both)
