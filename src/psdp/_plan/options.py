"""The `DataLoader`'s options in four frozen groups, each validated once when made (``docs/reference/config.md``).

A group checks what its values alone decide (types, ranges, combinations) and normalises them
(spec texts to `PartitionSpec`, sequences to tuples, mappings to dicts); what needs the mesh or
the source is checked when the loader is planned. Bad input raises `TypeError` for a wrong type
and `ValueError` for a wrong value, naming the field, the value, the rule and a fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from jax.sharding import PartitionSpec

from psdp._plan import option_checks as checks
from psdp._plan.offsets import StepOffsets

# The fields' annotations are also what draccus decodes YAML and flags with: it tries a union's
# types in order and its `str` takes anything, its `tuple` splits a string, so lists come first,
# then `str`, then tuples (which the API accepts too); `__post_init__` normalises to tuples.


# ------------------------------------------------------------------------------------ groups
@dataclass(frozen=True)
class OrderOptions:
    """Which rows each step holds: the batch size (or its schedule), the shuffle, the epoch's
    end, skipped ranges and the resume point (``docs/concepts/order-and-resume.md``, "Offsets, schedules and skips").

    Examples:
        >>> OrderOptions(global_batch_size=256, seed=3)
        OrderOptions(global_batch_size=256, shuffle=None, seed=3, drop_last=False, skip_steps=(), skip_offsets=(), start_at=None, io_block=None, window_blocks=16, epochs=None)
        >>> OrderOptions(global_batch_size=[(0, 64), (1000, 128)]).global_batch_size
        ((0, 64), (1000, 128))
        >>> OrderOptions(global_batch_size=0)
        Traceback (most recent call last):
            ...
        ValueError: OrderOptions.global_batch_size must be >= 1, got 0 (the real rows per step); e.g. global_batch_size=256
    """

    global_batch_size: int | list[tuple[int, int]] | tuple[tuple[int, int], ...] | None = None
    """Rows per step, over all hosts (required to build a loader): an int, or a schedule of
    ``(start_step, rows)`` stages from step 0, e.g. ``[[0, 256], [1000, 512]]``."""

    shuffle: bool | None = None
    """Permute each epoch (unset: true for a random-access source, false for a stream or a source
    that orders its own rows, such as a `Mixture`)."""

    seed: int = 0
    """The shuffle's seed, in [0, 2**64 - 1]."""

    drop_last: bool = False
    """Drop a step cut short by an epoch's end or a skip (false: pad it and mask the padding)."""

    skip_steps: list[tuple[int, int]] | tuple[tuple[int, int], ...] = ()
    """Ranges ``(first, end)`` of steps whose samples are skipped: step ``first`` gets the
    samples step ``end`` would have had, and training goes on from there."""

    skip_offsets: list[tuple[int, int]] | tuple[tuple[int, int], ...] = ()
    """Ranges ``(first, end)`` of sample offsets never read (a step reaching one is cut short
    there, like at an epoch's end)."""

    start_at: list[int] | tuple[int, int] | None = None
    """``(step, sample offset)``: the order continues from there (set by a restore; unset:
    ``(0, 0)``)."""

    io_block: int | None = None
    """Block shuffle: permute blocks of this many consecutive rows, then rows within windows of
    ``window_blocks`` blocks, so a step reads few large blocks from an object store (unset: a
    full shuffle)."""

    window_blocks: int = 16
    """Blocks whose rows a block shuffle mixes together (with ``io_block``)."""

    epochs: int | None = None
    """Passes over the source, then iteration ends on every host at the same step (an eval
    loader: 1); unset: endless."""

    def __post_init__(self) -> None:
        if self.global_batch_size is not None:
            checks.fix_field(self, "global_batch_size", checks.as_batch_size)
        if self.shuffle is not None:
            checks.fix_field(self, "shuffle", checks.as_flag)
        checks.fix_field(self, "drop_last", checks.as_flag)
        checks.fix_field(self, "seed", checks.as_seed)
        checks.fix_field(self, "skip_steps", checks.as_ranges, "step")
        checks.fix_field(self, "skip_offsets", checks.as_ranges, "sample offset")
        if self.start_at is not None:
            checks.fix_field(self, "start_at", checks.as_start)
        if self.io_block is not None:
            checks.fix_field(self, "io_block", checks.as_count, "rows per shuffled block", 32)
            if self.shuffle is False:
                raise ValueError(
                    f"OrderOptions.io_block={self.io_block} asks for a block shuffle, but "
                    "shuffle=False; drop io_block, or set shuffle=True"
                )
        checks.fix_field(self, "window_blocks", checks.as_count, "blocks mixed together", 16)
        if self.epochs is not None:
            checks.fix_field(self, "epochs", checks.as_count, "passes over the source", 1)

    @property
    def start(self) -> tuple[int, int]:
        """``start_at``, or ``(0, 0)``."""
        return (0, 0) if self.start_at is None else self.start_at  # type: ignore[return-value]

    def step_offsets(self, rows: int | None) -> StepOffsets:
        """The step -> sample offset map of these options over ``rows`` rows (None: endless);
        needs ``global_batch_size``.

        Examples:
            >>> OrderOptions(global_batch_size=4).step_offsets(None).info(2).offset
            8
        """
        assert self.global_batch_size is not None
        return StepOffsets.create(
            rows,
            self.global_batch_size,
            drop_last=self.drop_last,
            skip_steps=self.skip_steps,
            skip_offsets=self.skip_offsets,
            start=self.start,
        )


@dataclass(frozen=True)
class ShardingOptions:
    """How each leaf is split over the mesh, and which processes are fed (``docs/concepts/partitioning.md``).

    Examples:
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

    halo: (
        Mapping[str, Mapping[int, list[int | str] | int | tuple[int, str]] | int]
        | Mapping[int, list[int | str] | int | tuple[int, str]]
        | int
    ) = 0
    """Entries of each neighbouring shard added on each side of a device's window: an int for
    dimension 1 of every sequence-sharded leaf, or a dict leaf -> an int (dimension 1) or a dict
    dimension -> width or ``[width, boundary]``, boundary ``pad`` (pad_value beyond the domain's
    edges, the default), ``periodic`` (wrap around) or ``continue`` (the source's neighbouring
    entries: `TokenSequences`), e.g. ``{field: {2: 1, 3: [2, periodic]}}``;
    for an array source's single leaf, a dict dimension -> width or ``[width, boundary]``."""

    feeding_processes: list[int] | tuple[int, ...] | None = None
    """Only these processes' batch shards get real rows, the rest padding (unset: every one)."""

    def __post_init__(self) -> None:
        if self.batch_spec is not None:
            checks.set_field(self, "batch_spec", checks.as_batch_spec(self.batch_spec))
        if self.batch_axes is not None:
            checks.fix_field(
                self, "batch_axes", checks.as_names, "e.g. batch_axes=('replica', 'data')"
            )
        if self.named_axes is not None:
            checks.set_field(self, "named_axes", checks.as_named_axes(self.named_axes))
        if self.axis_mapping is not None:
            checks.set_field(self, "axis_mapping", checks.as_axis_mapping(self.axis_mapping))
        checks.set_field(self, "halo", checks.as_halo(self.halo))
        if self.feeding_processes is not None:
            checks.set_field(self, "feeding_processes", checks.as_processes(self.feeding_processes))
        self._refuse_conflicts()

    def uses_batch_axes(self) -> bool:
        """Whether ``batch_axes`` can reach a leaf: ``batch_spec`` is unset, ``"batch"``, or a
        dict (whose missing leaves take ``"batch"``).

        Examples:
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
        both = checks.leaves_with_both(self.named_axes, self.batch_spec)
        if both:
            raise ValueError(
                f"{where}: {both} has both a batch_spec entry ({self.batch_spec!r}) and "
                f"named_axes ({self.named_axes!r}); give one of them: a named leaf's spec follows "
                "from named_axes and axis_mapping"
            )


@dataclass(frozen=True)
class OutputOptions:
    """What the delivered leaves hold beyond the rows: the padding's fill, the mask leaf, dtypes.

    Examples:
        >>> OutputOptions(pad_value=-1, dtypes={"tokens": "int32"})
        OutputOptions(pad_value=-1, mask_key='mask', dtypes={'tokens': 'int32'})
        >>> OutputOptions(mask_key="")
        Traceback (most recent call last):
            ...
        ValueError: OutputOptions.mask_key must be a non-empty leaf name or None (no mask leaf), got ''; e.g. mask_key='mask'
    """

    pad_value: int | float = 0
    """Fill of padding rows, of pad halos beyond a domain's edges, and of an uneven domain's
    padding."""

    mask_key: str | None = "mask"
    """Name of the boolean leaf of every dict batch that marks its real rows (null: no mask
    leaf, and padding is then an error)."""

    dtypes: Any = None
    """Cast leaves on every read, range-checked: a dict leaf -> dtype, e.g. ``{tokens: int32}``
    (needed for 64-bit leaves without ``jax_enable_x64``), or one dtype for an array source
    (unset: the source's dtypes)."""

    def __post_init__(self) -> None:
        checks.fix_field(self, "pad_value", checks.as_number)
        if self.mask_key is not None:
            checks.fix_field(self, "mask_key", checks.as_leaf_name)
        if self.dtypes is not None:
            checks.set_field(self, "dtypes", checks.as_dtypes(self.dtypes))


#: The read threads of a source that waits on storage when `ReadingOptions.read_threads` is unset:
#: its reads release the GIL, so several overlap (``docs/guides/tuning.md``, "Read threads").
STORAGE_READ_THREADS = 4
#: The most read threads such a loader grows to when its reads are slower than the trainer's
#: steps: it starts `STORAGE_READ_THREADS` and adds what the reads' measured times call for
#: (``docs/guides/tuning.md``, "Read threads"). Each thread holds one batch being read.
MAX_STORAGE_READ_THREADS = 32


def read_threads_for(requested: int | None, reads_storage: bool) -> int:
    """The read threads of a loader: ``requested``, or when unset, `STORAGE_READ_THREADS` for a
    source that waits on storage and 1 for one in memory (more threads do not help it).

    Examples:
        >>> read_threads_for(None, reads_storage=True), read_threads_for(None, False)
        (4, 1)
        >>> read_threads_for(2, reads_storage=True)
        2
    """
    if requested is not None:
        return requested
    return STORAGE_READ_THREADS if reads_storage else 1


def read_threads_limit(requested: int | None, threads: int) -> int | None:
    """The most read threads a loader that starts ``threads`` grows to: `MAX_STORAGE_READ_THREADS`
    when ``read_threads`` was not ``requested`` and the source reads storage (``threads > 1``);
    ``None`` (never grows) otherwise.

    Examples:
        >>> read_threads_limit(None, 4), read_threads_limit(4, 4), read_threads_limit(None, 1)
        (32, None, None)
    """
    if requested is not None or threads == 1:
        return None
    return max(threads, MAX_STORAGE_READ_THREADS)


@dataclass(frozen=True)
class ReadingOptions:
    """How the background threads read: prefetch depth, threads, time limit, stall warning.

    Examples:
        >>> ReadingOptions(prefetch=4, read_timeout_s=60)  # doctest: +ELLIPSIS
        ReadingOptions(prefetch=4, read_threads=None, read_timeout_s=60.0, stall_warning_s=1.0, ...)
        >>> ReadingOptions(read_threads=0)
        Traceback (most recent call last):
            ...
        ValueError: ReadingOptions.read_threads must be >= 1, got 0 (steps read at once); e.g. read_threads=1
    """

    prefetch: int = 2
    """Finished batches that wait in the queue (>= 1)."""

    read_threads: int | None = None
    """Steps read and assembled concurrently by background threads (>= 1; unset:
    `STORAGE_READ_THREADS` for a source that waits on storage, such as `TensorStoreSource`, more
    up to `MAX_STORAGE_READ_THREADS` while its measured reads are slower than the trainer's
    steps, and 1 for one in memory)."""

    read_timeout_s: float | None = None
    """Raise `TimeoutError` naming the step when its reads take longer (unset: no limit)."""

    stall_warning_s: float | None = 1.0
    """Log a warning with the loader's figures when the trainer waits longer for one batch
    (null: never)."""

    read_attempts: int = 4
    """Tries of each read that fails with a transient error (a reset connection, a 5xx or
    throttling answer, `TransientReadError`), the first included (1: never retry); other errors
    fail at once."""

    retry_backoff_s: float | None = 0.5
    """The pause before the first retry; each further one doubles it (at most 60 s), with
    jitter: a random time between half and the whole (null: retry at once)."""

    first_read_timeout_s: float | None = None
    """The time limit of reads until the first batch is read, the row read when the loader is
    built included: a grace for cold caches and new connections (unset: read_timeout_s)."""

    def __post_init__(self) -> None:
        checks.fix_field(self, "prefetch", checks.as_count, "batches ahead", 2)
        if self.read_threads is not None:  # unset: chosen by the source (`read_threads_for`)
            checks.fix_field(self, "read_threads", checks.as_count, "steps read at once", 1)
        checks.fix_field(
            self,
            "read_timeout_s",
            checks.as_seconds,
            "> 0 or None (a number of seconds, or no limit)",
            60,
        )
        checks.fix_field(
            self,
            "stall_warning_s",
            checks.as_seconds,
            "a positive number of seconds or None (no warning)",
            1,
        )
        checks.fix_field(
            self, "read_attempts", checks.as_count, "tries of a read, the first included", 4
        )
        checks.fix_field(
            self,
            "retry_backoff_s",
            checks.as_seconds,
            "> 0 or None (seconds before the first retry, or none)",
            1,
        )
        checks.fix_field(
            self,
            "first_read_timeout_s",
            checks.as_seconds,
            "> 0 or None (seconds for the first batch's reads, or read_timeout_s)",
            600,
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

    Examples:
        Flat keywords are the front door to the same groups:

        >>> options = LoaderOptions.create(global_batch_size=8, seed=3, prefetch=4)
        >>> options == LoaderOptions(OrderOptions(global_batch_size=8, seed=3),
        ...                          reading=ReadingOptions(prefetch=4))
        True
        >>> LoaderOptions.create(global_batch_size=8, batch_size=8)
        Traceback (most recent call last):
            ...
        TypeError: unknown loader option 'batch_size' (did you mean 'global_batch_size'?); the options are axis_mapping, batch_axes, batch_spec, drop_last, dtypes, epochs, feeding_processes, first_read_timeout_s, global_batch_size, halo, io_block, mask_key, named_axes, pad_value, prefetch, read_attempts, read_threads, read_timeout_s, retry_backoff_s, seed, shuffle, skip_offsets, skip_steps, stall_warning_s, start_at, window_blocks (docs/reference/config.md)
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

    Examples:
        >>> route(seed=3, reading=ReadingOptions(prefetch=4))["order"].seed
        3
    """
    groups = {name: given.pop(name, None) for name in GROUPS}
    unknown = sorted(set(given) - set(GROUP_OF))
    if unknown:
        close = _suggest(unknown[0])
        hint = f" (did you mean {close!r}?)" if close else ""
        raise TypeError(
            f"unknown loader option {', '.join(map(repr, unknown))}{hint}; the options are "
            f"{', '.join(sorted(GROUP_OF))} (docs/reference/config.md)"
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
            raise checks.type_error(
                where,
                value,
                f"a {kind.__name__}",
                f"e.g. {name}={kind.__name__}(...), or its fields as keywords",
            )
