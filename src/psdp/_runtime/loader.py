"""The `DataLoader`: global batches for a device mesh, read host-locally, prefetched on a thread.

One step, on every host (see ``docs/loader.md``)::

    GlobalOrder.batch_ids(step)            the step's B source row ids, PAD-filled  (pure, psdp._plan.order)
      -> physical batch positions          padded up to the physical batch          (psdp._plan.partition)
      -> source reads, one per request     the boxes this host's devices hold       (background thread)
      -> LeafAssembler.assemble(...)       one global jax.Array per leaf            (psdp._runtime.assembly)
      -> Prefetcher queue -> trainer

Planning happens once, in the constructor: every leaf gets a spec (`psdp._plan.partition`), an
assembler with its windows (`psdp._runtime.assembly`), and the windows of all leaves are grouped into
*read requests*: a set of batch positions and, per leaf, the columns to read. Whole-row leaves
share one request (the union of their rows); each column window of a sequence-sharded leaf is a
request of its own unless another leaf has a window on the same rows. Positions whose id is `PAD`
(a logical batch smaller than the physical one, or an epoch's short final batch) are never read:
they are filled with ``pad_value``, and the ``mask`` leaf says which rows are real.

Resume rule: the batch at a step is a function of ``(len(source), global_batch_size, seed, shuffle,
drop_last, step)`` only, so ``iter_from(step)`` starts anywhere in O(1) and every host, whatever
its layout, prefetch depth or number of read threads, agrees on every batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp._checks import check_fields, check_int, preview_ids
from psdp._compat import enable_x64
from psdp._imports import import_optional
from psdp._plan.dtypes import check_pad_value, needs_x64, plan_dtypes
from psdp._plan.leaves import Key, leaf_label, leaves_of
from psdp._plan.mesh import as_layout, spec_axes
from psdp._plan.options import (
    LoaderOptions,
    OrderOptions,
    OutputOptions,
    ReadingOptions,
    ShardingOptions,
)
from psdp._plan.order import PAD, GlobalOrder, check_seed
from psdp._plan.partition import (
    DEFAULT_BATCH_AXES,
    batch_shards,
    default_batch_spec,
    named_spec,
    physical_batch_size,
    resolve_halos,
    resolve_named_axes,
    resolve_specs,
)
from psdp._plan.reads import ReadRequest, feeding_positions, plan_reads, stream_shard
from psdp._runtime.agreement import StreamEnds, agree, check_own_process, describe_end
from psdp._runtime.assembly import LeafAssembler
from psdp._runtime.prefetch import LoaderClosedError, Prefetcher
from psdp._runtime.telemetry import LoaderStats, Telemetry
from psdp.sources import ArraySource, Rows, StreamReader, StreamSource, as_source
from psdp.sources.base import reads_fresh_rows

__all__ = ["DEFAULT_BATCH_AXES", "DataLoader", "LoaderIterator", "default_batch_spec"]

#: The ``format`` field of `DataLoader.state`.
STATE_FORMAT = "psdp.loader/1"
RESTORE_FIX = "pass the whole dict DataLoader.state() returned, as it was saved"
#: The keys `DataLoader.restore` needs in a state, and their kinds.
STATE_FIELDS = {
    "format": "str",
    "step": "int",
    "global_batch_size": "int",
    "seed": "int",
    "shuffle": "bool",
    "drop_last": "bool",
    "source": "dict",
}

logger = logging.getLogger(__name__)

Batch = Any  # a jax.Array, or a dict of jax.Arrays / haliax NamedArrays


class DataLoader:
    """Feeds global batches to a mesh; each host reads only what its devices hold.

    Args:
        source: a numpy array ``(N, ...)``, a dict of such arrays (a dict batch), a psdp source,
            any object with ``__len__`` and a batched ``__getitem__(ids)``, or a list of records
            (each an array or a dict of arrays; read record by record, so slow for big batches).
        mesh: the `jax.sharding.Mesh` the batch lives on.
        global_batch_size: real rows per global batch. When the leaves' batch shards do not divide
            it (or it is smaller than them), the batch is padded to the *physical* batch size and
            a mask leaf is added (see ``mask_key``).
        batch_spec: how leaves are split: a `PartitionSpec`, a strategy (``"batch"``: over the
            mesh's batch axes, the default; ``"full"``: over every axis; ``"replicated"``), or a
            dict leaf -> one of those (missing leaves take ``"batch"``). A leaf ``(B, S, ...)``
            whose spec shards dimension 1 (e.g. ``P("data", "context")``) is read in column
            windows: each host reads only its columns.
        batch_axes: the mesh axes the ``"batch"`` strategy splits over, major to minor; default:
            the mesh axes named like batch axes (``replica``, ``data``, ``fsdp``, ``batch``).
        shuffle: permute each epoch (from ``seed`` and the epoch number).
        seed: the shuffle seed.
        prefetch: how many finished batches wait in the queue (>= 1).
        drop_last: drop each epoch's short final batch; otherwise it is padded and masked.
        halo: columns of each neighbouring sequence shard added on each side of a device's window
            (an int for every sequence-sharded leaf, or a dict leaf -> int); see `halo_mask`.
        pad_value: the fill of padding rows and of halo columns outside the sequence; every
            leaf it fills must hold it exactly (``-1`` is refused for a ``uint16`` leaf).
        mask_key: the name of the boolean ``(physical batch,)`` leaf, ``True`` for real rows,
            that every dict batch carries (all ``True`` when nothing is padded), so a batch's
            structure never depends on the dataset's size. ``None``: no mask leaf; padding is
            then an error, as it is for an array source.
        dtypes: the dtype to deliver a leaf in (a dict leaf -> dtype, or one dtype for an array
            source), cast on every read; a value that does not fit is an error naming the step,
            leaf, row and value. Needed for 64-bit leaves while ``jax_enable_x64`` is off
            (refused otherwise, as JAX would wrap them silently). Big-endian leaves are
            delivered in native byte order either way. `DataLoader.dtypes` says what is
            delivered.
        named_axes: haliax axis names per leaf (a dict leaf -> names, or one sequence for an array
            source); those leaves come out as ``haliax.NamedArray`` with their spec taken from
            ``axis_mapping``.
        axis_mapping: logical axis name -> mesh axis or axes, e.g.
            ``{"batch": ("replica", "data"), "position": "context"}``.
        feeding_processes: only the devices of these processes (and whoever shares their batch
            shards) get real rows; the physical batch grows so they hold all ``global_batch_size``
            rows, and a process whose shards are all padding reads nothing (AXLearn's logical
            feeds). ``None``: every process.
        read_threads: steps read and assembled concurrently (each step is still one batched read
            per request, and batches are still delivered in step order).
        read_timeout_s: a step whose reads take longer raises `TimeoutError` naming the step and
            rows, instead of blocking the trainer forever; ``None`` to wait as long as it takes.
        process_index: this host; defaults to ``jax.process_index()``.
        name: the prefetch threads' name.
        stall_warning_s: log a warning with the loader's figures when the trainer waits longer
            than this for one batch; ``None`` to disable.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> tokens = np.arange(64, dtype=np.int32).reshape(32, 2)
        >>> with DataLoader(tokens, mesh=mesh, global_batch_size=8, shuffle=False) as loader:
        ...     batch = next(iter(loader))
        >>> batch.sharding.spec, np.asarray(batch)[:, 0].tolist()
        (P('data',), [0, 2, 4, 6, 8, 10, 12, 14])

        Dict batches carry a ``mask`` leaf; a batch of 6 on 4 data shards is padded to 8 rows,
        and the mask says which are real:

        >>> data = {"tokens": np.arange(10, dtype=np.int32)}
        >>> with DataLoader(data, mesh=mesh, global_batch_size=6, shuffle=False) as loader:
        ...     batch = next(iter(loader))
        >>> np.asarray(batch["tokens"]).tolist(), np.asarray(batch["mask"]).tolist()
        ([0, 1, 2, 3, 4, 5, 0, 0], [True, True, True, True, True, True, False, False])
    """

    def __init__(
        self,
        source: Any,
        *,
        mesh: Mesh,
        order: OrderOptions | None = None,
        sharding: ShardingOptions | None = None,
        output: OutputOptions | None = None,
        reading: ReadingOptions | None = None,
        process_index: int | None = None,
        name: str = "psdp-loader",
        **options: Any,
    ):
        groups = LoaderOptions.create(order, sharding, output, reading, **options)
        self.options = groups
        global_batch_size = groups.order.global_batch_size
        if global_batch_size is None:
            raise TypeError(
                "DataLoader needs global_batch_size (the real rows per step), e.g. "
                "DataLoader(source, mesh=mesh, global_batch_size=256)"
            )
        shuffle, seed, drop_last = groups.order.shuffle, groups.order.seed, groups.order.drop_last
        batch_spec, batch_axes = groups.sharding.batch_spec, groups.sharding.batch_axes
        named_axes, axis_mapping = groups.sharding.named_axes, groups.sharding.axis_mapping
        halo, feeding_processes = groups.sharding.halo, groups.sharding.feeding_processes
        pad_value, mask_key, dtypes = (
            groups.output.pad_value,
            groups.output.mask_key,
            groups.output.dtypes,
        )
        prefetch, read_threads = groups.reading.prefetch, groups.reading.read_threads
        read_timeout_s, stall_warning_s = (
            groups.reading.read_timeout_s,
            groups.reading.stall_warning_s,
        )
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        check_int("global_batch_size", global_batch_size, minimum=1)
        check_int("prefetch", prefetch, minimum=1)
        check_seed(seed)
        check_int("read_threads", read_threads, minimum=1)
        if read_timeout_s is not None and not (_is_number(read_timeout_s) and read_timeout_s > 0):
            raise ValueError(
                f"read_timeout_s must be > 0 or None (a number of seconds, or no limit), got "
                f"{read_timeout_s!r}"
            )
        if not _is_number(pad_value):
            raise ValueError(
                f"pad_value must be a number (it fills padding rows and halo columns), got "
                f"{pad_value!r}"
            )
        if mask_key is not None and (not isinstance(mask_key, str) or not mask_key):
            raise ValueError(f"mask_key must be a non-empty string or None, got {mask_key!r}")
        self._stream = source if isinstance(source, StreamSource) else None
        if self._stream is not None and shuffle:
            raise ValueError(
                f"shuffle=True with a stream ({self._stream.describe()}): a stream has no random "
                "access, so psdp cannot permute it; shuffle upstream (e.g. a shuffle buffer in "
                "the stream) and pass shuffle=False"
            )
        self.source: Any = source if self._stream is not None else as_source(source)
        self.mesh = mesh
        self.global_batch_size = global_batch_size
        self.prefetch = prefetch
        self.read_threads = read_threads
        self.read_timeout_s = read_timeout_s
        self.pad_value = pad_value
        self.mask_key = mask_key
        self.name = name
        layout = as_layout(mesh)
        self.process_index = check_own_process(layout, process_index)
        self.drop_last = drop_last
        self.order: GlobalOrder | None = None  # None for a stream: it has no global order
        if self._stream is None:
            self.order = GlobalOrder(
                len(self.source),
                global_batch_size,
                True if shuffle is None else shuffle,
                seed,
                drop_last,
            )
        probe = {k: np.asarray(v) for k, v in leaves_of(self._probe()).items()}
        ndims = {k: v.ndim for k, v in probe.items()}
        self._dtypes = plan_dtypes({k: v.dtype for k, v in probe.items()}, dtypes)
        #: the dtype each leaf is delivered in (a dict for dict sources; one for an array source)
        self.dtypes: Any = {k: v.delivered for k, v in self._dtypes.items()}
        if None in self.dtypes:
            self.dtypes = self.dtypes[None]
        self._needs_x64 = any(needs_x64(d.delivered) for d in self._dtypes.values())
        # psdp's own sources return new arrays; other reads may be views of memory they refill
        self._fresh = self._stream is not None or reads_fresh_rows(self.source)
        self._named = resolve_named_axes(named_axes, axis_mapping, ndims)
        specs = resolve_specs(
            batch_spec,
            mesh,
            list(probe),
            {k: named_spec(v, axis_mapping or {}, mesh, repr(k)) for k, v in self._named.items()},
            batch_axes,
        )
        #: each leaf's `PartitionSpec` (a dict for dict sources; one spec for an array source)
        self.batch_spec: Any = specs[None] if None in specs else specs
        for key, spec in specs.items():
            spec_axes(layout, spec, ndims[key])  # raises naming the spec and the mesh
        if self._named:  # after the checks of the names, which need no haliax
            self._haliax = import_optional("haliax", extra="haliax", needed_for="named_axes")
        shards = [batch_shards(mesh, spec) for spec in specs.values()]
        self.physical_batch_size = physical_batch_size(global_batch_size, shards)
        #: where the global batch's rows sit in the physical batch (the rest is padding)
        self.real_positions = np.arange(global_batch_size)
        if feeding_processes is not None:
            self.physical_batch_size, self.real_positions = feeding_positions(
                feeding_processes, specs, shards, global_batch_size, layout
            )
        ends_short = (not drop_last) if self.order is None else self.order.pads
        self.padded = self.physical_batch_size > global_batch_size or ends_short
        halos = resolve_halos(halo, specs, ndims)
        self._leaves = {
            key: LeafAssembler.create(
                mesh,
                specs[key],
                (self.physical_batch_size, *np.shape(row)[1:]),
                self._dtypes[key].delivered,
                self.process_index,
                halo=halos[key],
            )
            for key, row in probe.items()
        }
        self._check_pad_value(halos)
        self._mask = self._plan_mask(specs)
        self._all_real: jax.Array | None = None  # the mask of every step when nothing is padded
        self._requests = plan_reads(self._leaves)
        self._read_positions = np.unique(np.concatenate([r.positions for r in self._requests]))
        self._real_positions = np.intersect1d(self._read_positions, self.real_positions)
        self._reader: StreamReader | None = None
        self._reader_lock = threading.Lock()
        #: (uid, number of uids): the stream shard this host reads; None for random access
        self.stream_shard: tuple[int, int] | None = None
        if self._stream is not None:
            self.stream_shard = stream_shard(
                specs, layout, self.process_index, self.physical_batch_size, self.real_positions
            )
        self.telemetry = Telemetry(stall_warning_s=stall_warning_s)
        self._iterators: list[LoaderIterator] = []
        self._last_iterator: LoaderIterator | None = None  # state() counts from it, even closed
        self._lock = threading.Lock()
        self._closed = False
        self._direct_reads = 0  # batch_at calls, numbered alike on every host: see StreamEnds
        self._iterations = 0  # iterators started, numbered alike on every host: see StreamEnds
        self.start_step = 0
        self._processes = layout.processes  # they must all build this loader alike
        namespace = agree(
            self._settings(specs, halos, feeding_processes),
            self._processes,
            f"built DataLoader {self.name!r}",
        )
        #: per step, which shards of a callable stream ran short, agreed by every host
        self._ends = self._stream_ends(namespace)

    def _plan_mask(self, specs: dict[Key, PartitionSpec]) -> LeafAssembler | None:
        """The mask leaf of every dict batch (unless ``mask_key=None``); padding needs one."""
        if self.padded and (None in self._leaves or self.mask_key is None):
            why = (
                "which an array source cannot carry; pass a dict source, e.g. {'inputs': array}"
                if None in self._leaves
                else "but mask_key=None; pass mask_key='mask' (the default)"
            )
            raise ValueError(
                f"global_batch_size={self.global_batch_size} needs padding (the physical batch "
                f"is {self.physical_batch_size} rows for the batch shards, and drop_last="
                f"{self.drop_last} for an epoch's short final batch), so batches need a mask "
                f"leaf, {why}, or a global_batch_size that is a multiple of the batch shards "
                "with drop_last=True"
            )
        if None in self._leaves or self.mask_key is None:
            return None
        if self.mask_key in self._leaves:
            raise ValueError(
                f"the source already has a leaf named {self.mask_key!r}; pass another mask_key"
            )
        first = next(iter(specs.values()))
        spec = PartitionSpec(first[0] if len(first) else None)
        return LeafAssembler.create(
            self.mesh, spec, (self.physical_batch_size,), np.dtype(bool), self.process_index
        )

    def _settings(
        self,
        specs: dict[Key, PartitionSpec],
        halos: Mapping[Key, int],
        feeding_processes: Sequence[int] | None,
    ) -> dict[str, Any]:
        """What the batches depend on, which every host of the mesh must agree on."""
        fingerprint = self._fingerprint()
        return {
            **{k: v for k, v in self._state_at(0).items() if k not in ("format", "step", "source")},
            "source rows": fingerprint["rows"],
            "source leaves": fingerprint["leaves"],
            "batch_spec": {str(k): str(v) for k, v in specs.items()},
            "halo": {str(k): int(v) for k, v in halos.items()},
            "feeding_processes": None
            if feeding_processes is None
            else sorted(int(p) for p in feeding_processes),
            "pad_value": np.asarray(self.pad_value).item(),  # a numpy scalar as a JSON number
            "mask_key": self.mask_key,
        }

    def _stream_ends(self, namespace: str | None) -> StreamEnds | None:
        """Where hosts must agree per step: a callable stream (its shards may be unequally long)
        of several shards, on several processes (``namespace`` is None for one process)."""
        if namespace is None or self._stream is None or self._stream.round_robin:
            return None
        assert self.stream_shard is not None
        shard, num_shards = self.stream_shard
        if num_shards == 1:
            return None
        return StreamEnds(namespace, self._processes, shard, self._stream.describe())

    def _check_pad_value(self, halos: dict[Key, int]) -> None:
        """Every leaf that ``pad_value`` can ever fill holds it exactly."""
        for key, dtype in self._dtypes.items():
            if self.padded:
                reason = (
                    f"the batch can hold padding rows (global_batch_size={self.global_batch_size} "
                    f"in a physical batch of {self.physical_batch_size}, drop_last={self.drop_last})"
                )
            elif halos[key]:
                reason = (
                    f"its halo={halos[key]} columns beyond the sequence's ends are filled with it"
                )
            else:
                continue
            check_pad_value(self.pad_value, dtype.delivered, key, reason)

    def _probe(self) -> Rows:
        """One row, to learn the leaves' names, trailing shapes and dtypes."""
        if self._stream is None:
            try:
                return self.source.read(np.zeros(1, np.int64))
            except StopIteration as err:
                raise _stray_stop_iteration("the first read (row 0)", self.source) from err
        with self._stream.open(0, 1) as reader:
            rows = reader.take(1)
        if rows is None:
            raise ValueError(f"the stream {self._stream.describe()} is empty; it needs elements")
        return rows

    # ------------------------------------------------------------------------------- planning
    @property
    def read_positions(self) -> np.ndarray:
        """Positions within each (physical) batch this host reads, sorted; the same every step."""
        return self._read_positions

    def plan(self, key: str | None = None) -> Any:
        """The `DataPlan` of one leaf (``key`` for dict sources)."""
        return self._leaves[key].plan

    def leaf(self, key: str | None = None) -> LeafAssembler:
        """The `LeafAssembler` of one leaf: its global shape, sharding and windows."""
        return self._leaves[key]

    def halo_mask(self, key: str | None = None) -> jax.Array:
        """Which columns of a sequence-sharded leaf are halo columns (``True``), as a global array.

        It is the same every step: shape ``(C * (S/C + 2h),)``, sharded like the leaf's dimension
        1, so inside ``jax.shard_map`` each device sees ``h`` ``True`` on each side of ``S/C``
        ``False``. Halo columns outside the sequence hold ``pad_value``.
        """
        leaf = self._leaves[key]
        if not leaf.column_shards:
            raise ValueError(f"{leaf_label(key)} is not read in column windows; it has no halo")
        width, h = leaf.global_shape[1] // leaf.column_shards, leaf.halo
        one = np.zeros(width, bool)
        one[:h], one[width - h :] = True, True
        value = np.tile(one, leaf.column_shards)
        spec = leaf.sharding.spec
        sharding = NamedSharding(self.mesh, PartitionSpec(spec[1] if len(spec) > 1 else None))
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    # ------------------------------------------------------------------------------ one step
    def batch_at(self, step: int) -> Batch:
        """Reads and assembles the batch of ``step`` on the calling thread (no prefetch).

        The way to peek at a batch during training: no iterator, no thread, and `state` is
        unaffected. For a stream on several hosts, every host must make the same calls.
        """
        with self._lock:
            self._direct_reads += 1
            run = f"d{self._direct_reads}"
        return self._batch(step, run, lambda: self._closed)

    def _batch(self, step: int, run: str, stop: Callable[[], bool]) -> Batch:
        """`batch_at`, for the read named ``run`` (an iterator, or a direct call) until ``stop()``."""
        check_int("step", step, minimum=0)
        started = time.perf_counter()
        ids = np.full(self.physical_batch_size, PAD, np.int64)
        if self.order is not None:
            ids[self.real_positions] = self.order.batch_ids(step)

        def read_rows() -> dict[Key, list[np.ndarray]]:
            stream = self._stream is not None
            source = self._stream_rows(step, ids, run, stop) if stream else self.source
            return self._read_step(step, ids, source)

        if self.read_timeout_s is None:
            buffers = read_rows()
        else:
            buffers = _with_timeout(
                read_rows,
                self.read_timeout_s,
                lambda: f"step {step}: reading {self._what_is_read(ids)} from "
                f"{self.source.describe()} took longer than read_timeout_s={self.read_timeout_s}; "
                "the source may be stuck (a hung filesystem or object store); raise "
                "read_timeout_s if reads are just slow",
            )
        read = time.perf_counter()
        # the x64 switch is thread-local: deliver 64-bit leaves as the constructor checked them
        with enable_x64(True) if self._needs_x64 else contextlib.nullcontext():
            batch = {key: leaf.assemble(buffers[key]) for key, leaf in self._leaves.items()}
            if self._mask is not None:
                batch[self.mask_key] = self._mask_of(ids)
        self.telemetry.record_read(read - started, time.perf_counter() - read)
        return self._wrap(batch)

    def _mask_of(self, ids: np.ndarray) -> jax.Array:
        """The mask leaf; without padding it is the same every step, so it is assembled once
        (jax.Arrays are immutable, so every batch may share it; two read threads racing here
        build it twice at worst)."""
        assert self._mask is not None
        if self.padded:
            return self._mask.assemble((ids != PAD)[self._mask.plan.rows])
        if self._all_real is None:
            self._all_real = self._mask.assemble(np.ones(len(self._mask.plan.rows), bool))
        return self._all_real

    def _what_is_read(self, ids: np.ndarray) -> str:
        if self.stream_shard is not None:
            return f"the next {len(self._real_positions)} elements of shard {self.stream_shard[0]}"
        return f"{len(self._read_positions)} rows (ids {preview_ids(ids[self._read_positions])})"

    def _stream_rows(self, step: int, ids: np.ndarray, run: str, stop: Callable[[], bool]) -> Any:
        """A stream step's rows (as a source), with ``ids`` set to index them; O(step) on a jump.

        This host takes the next ``R`` elements of its uid's shard for its ``R`` real batch
        positions, so hosts with the same uid hold the same elements (see ``docs/sources.md``).
        """
        assert self._stream is not None and self.stream_shard is not None
        per_step = len(self._real_positions)  # the same on every host (stream_shard checks)
        with self._reader_lock:
            reader = self._reader
            if reader is None or reader.consumed != step * per_step:
                if self._closed:
                    raise LoaderClosedError("this DataLoader is closed")
                if reader is not None:
                    reader.close()
                reader = self._reader = self._stream.open(*self.stream_shard, start=step * per_step)
            rows = reader.take(per_step)
        got = 0 if rows is None else len(next(iter(leaves_of(rows).values())))
        shard, num_shards = self.stream_shard
        short = {shard: got} if got < per_step else {}
        if self._ends is not None:  # the other hosts' shards may end first (unequal lengths)
            short = self._ends.short_shards(run, step, got, per_step, stop)
        ended = sorted(u for u, n in short.items() if n == 0 or self.drop_last)
        if ended:
            message = describe_end(step, ended, short, num_shards, self._stream.describe())
            if shard not in ended:
                logger.warning("this host's stream shard %d still had elements: %s", shard, message)
            raise StopIteration(message)
        assert rows is not None  # a shard without rows ended above
        ids[self._real_positions[:got]] = np.arange(got)
        return ArraySource(rows)

    def _read_step(self, step: int, ids: np.ndarray, source: Any) -> dict[Key, list[np.ndarray]]:
        empty = np.empty(0, np.int8)
        buffers = {k: [empty] * len(v.windows) for k, v in self._leaves.items()}
        for request in self._requests:
            got, borrowed = self._read(step, ids[request.positions], request, source)
            for entry in request.entries:
                rows = got[entry.key]
                if entry.rows is not None:
                    rows = rows[entry.rows]
                if entry.columns is not None:
                    rows = rows[:, entry.columns]
                leaf = self._leaves[entry.key]
                buffer = leaf.pad_columns(entry.window, rows, self.pad_value)
                if entry.key in borrowed and np.may_share_memory(buffer, got[entry.key]):
                    buffer = buffer.copy()  # the source may refill it while the batch lives
                buffers[entry.key][entry.window] = buffer
        return buffers

    def _read(
        self, step: int, ids: np.ndarray, request: ReadRequest, source: Any
    ) -> tuple[dict[Key, np.ndarray], set[Key]]:
        """One request's rows, each leaf cut to its columns; `PAD` ids become pad rows.

        Also returns the leaves whose arrays may be memory the source keeps (not copied yet).
        """
        real = ids != PAD
        if real.all():
            return self._checked(step, ids, request, self._source_read(step, source, ids, request))
        out = {
            key: np.full(
                self._row_shape(key, columns, len(ids)), self.pad_value, self._leaves[key].dtype
            )
            for key, columns in request.columns.items()
        }
        if real.any():
            got, _ = self._checked(
                step, ids[real], request, self._source_read(step, source, ids[real], request)
            )
            for key in out:
                out[key][real] = got[key]
        return out, set()

    def _source_read(
        self, step: int, source: Any, ids: np.ndarray, request: ReadRequest
    ) -> dict[Key, np.ndarray]:
        try:
            return self._read_columns(source, ids, request)
        except StopIteration as err:  # only a stream's end may end iteration (as in PEP 479)
            where = f"step {step}: reading {len(ids)} rows (ids {preview_ids(ids)})"
            raise _stray_stop_iteration(where, source) from err

    def _read_columns(
        self, source: Any, ids: np.ndarray, request: ReadRequest
    ) -> dict[Key, np.ndarray]:
        # `read` is the protocol; `read_window` (optional) serves column windows and leaf subsets
        read_window = _read_window_of(source)
        partial = len(request.columns) < len(self._leaves) or any(
            c is not None for c in request.columns.values()
        )
        if partial and read_window is not None:
            return leaves_of(read_window(ids, request.columns))
        # a source without column reads: read whole rows, keep this request's leaves and columns
        got = leaves_of(source.read(ids))
        wanted = {key for key in got if key in request.columns or key not in self._leaves}
        return {
            key: got[key]
            if request.columns.get(key) is None
            else np.asarray(got[key])[:, request.columns[key]]
            for key in wanted
        }

    def _row_shape(self, key: Key, columns: slice | None, rows: int) -> tuple[int, ...]:
        trailing = list(self._leaves[key].plan.global_shape[1:])
        if columns is not None:
            trailing[0] = columns.stop - columns.start
        return (rows, *trailing)

    def _checked(
        self, step: int, ids: np.ndarray, request: ReadRequest, got: dict[Key, np.ndarray]
    ) -> tuple[dict[Key, np.ndarray], set[Key]]:
        """The read's leaves checked and in their delivered dtypes, and which may be borrowed."""
        missing = set(request.columns) - set(got)
        extra = set(got) - set(self._leaves)
        if missing or extra:
            raise ValueError(
                f"step {step}: the source returned leaves {sorted(map(str, got))}, but its first "
                f"row had {sorted(map(str, self._leaves))}; every read must return the same leaves"
            )
        out, borrowed = {}, set()
        for key, columns in request.columns.items():
            data = np.asarray(got[key])
            leaf, dtype = self._leaves[key], self._dtypes[key]
            expected = self._row_shape(key, columns, len(ids))
            if data.shape[:1] != (len(ids),):
                raise ValueError(
                    f"step {step}: the read of {leaf_label(key)} returned {len(data) if data.ndim else 0} "
                    f"rows for {len(ids)} ids ({preview_ids(ids)}); a source's read(ids) must "
                    "return one row per id, in the order of the ids"
                )
            if data.shape != expected or data.dtype != dtype.source:
                raise ValueError(
                    f"step {step}: rows of {leaf_label(key)} have shape {data.shape[1:]} and dtype "
                    f"{data.dtype}, but the source's first row had {leaf.plan.global_shape[1:]} "
                    f"{dtype.source} (read of {len(ids)} rows, ids {preview_ids(ids)}); every row "
                    "of a source must have one shape and dtype"
                )
            if dtype.casts:
                data = dtype.convert(data, step=step, key=key, ids=ids)  # a new array
            elif not self._fresh:
                borrowed.add(key)
            out[key] = data
        return out, borrowed

    def _wrap(self, batch: dict[Key, jax.Array]) -> Batch:
        if self._named:
            first = next(iter(self._named.values()))
            names = dict(self._named)
            if self.mask_key is not None:
                names.setdefault(self.mask_key, first[:1])
            batch = {
                key: self._haliax.named(value, tuple(getattr(n, "name", n) for n in names[key]))
                if key in names
                else value
                for key, value in batch.items()
            }
        return batch[None] if None in batch else batch

    def stats(self) -> LoaderStats:
        """Recent wait, read and assembly times, queue depth, and whether the loader is the bottleneck.

        ``print(loader.stats())`` gives a one-line verdict, e.g. "the loader is not the
        bottleneck: the trainer waited 0.1% of its time (...)".
        """
        return self.telemetry.stats()

    # ----------------------------------------------------------------------------- iteration
    def iter_from(self, step: int) -> LoaderIterator:
        """An iterator over the batches of steps ``step, step + 1, ...``, prefetched.

        Its ``state()`` is the state to save with a checkpoint taken while training from it.
        """
        check_int("step", step, minimum=0)
        with self._lock:
            if self._closed:
                raise LoaderClosedError(
                    "this DataLoader is closed; create a new DataLoader to read again"
                )
            self._iterators = [it for it in self._iterators if not it.closed]
            threads = 1 if self._stream is not None else self.read_threads  # streams: in order
            extra = {"workers": threads} if threads > 1 else {}
            self._iterations += 1
            iterator = LoaderIterator(
                self,
                f"i{self._iterations}",
                start=step,
                depth=self.prefetch,
                name=f"{self.name}-{step}",
                observer=self.telemetry.record_next,
                **extra,
            )
            self._iterators.append(iterator)
            self._last_iterator = iterator
        return iterator

    def __iter__(self) -> LoaderIterator:
        """Iterates from `start_step` (0, or the step of a restored `state`)."""
        return self.iter_from(self.start_step)

    # ---------------------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """A small JSON-able record to resume from: the next step and what the order depends on.

        The step is the one the open iterator hands out next (`start_step` before any; the last
        one's once all are closed). With two open iterators it is ambiguous, so this raises: save
        ``it.state()`` of the iterator you train from, or close the other (peek with
        `batch_at`, which opens none). Save it with the model checkpoint; `DataLoader.restore`
        refuses a source or batch settings that would change the order.
        """
        with self._lock:
            open_iterators = [it for it in self._iterators if not it.closed]
            if len(open_iterators) > 1:
                steps = [it.next_step for it in open_iterators]
                raise ValueError(
                    f"loader.state() is ambiguous: {len(open_iterators)} iterators of this loader "
                    f"are open (next steps {steps}); save the state of the one you train from "
                    "with it.state(), or close the others (next(iter(loader)) leaves an iterator "
                    "open; peek with loader.batch_at(step), which opens none)"
                )
            last = open_iterators[0] if open_iterators else self._last_iterator
            step = self.start_step if last is None else last.next_step
        return self._state_at(step)

    def _state_at(self, step: int) -> dict[str, Any]:
        """The state of a loader whose next batch is that of ``step``."""
        return {
            "format": STATE_FORMAT,
            "step": int(step),
            "global_batch_size": self.global_batch_size,
            "seed": 0 if self.order is None else self.order.seed,
            "shuffle": False if self.order is None else self.order.shuffle,
            "drop_last": self.drop_last,
            "source": self._fingerprint(),
        }

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "rows": None if self._stream is not None else len(self.source),
            "leaves": {
                str(k): [str(v.dtype), list(v.plan.global_shape[1:])]
                for k, v in sorted(self._leaves.items(), key=lambda kv: str(kv[0]))
            },
        }

    @classmethod
    def restore(
        cls, state: Mapping[str, Any], source: Any, *, mesh: Mesh, **kwargs: Any
    ) -> DataLoader:
        """A loader that continues from a saved `state` (``iter(loader)`` starts at its step).

        ``kwargs`` are other `DataLoader` arguments (prefetch, threads, ...); the ones the order
        depends on come from the state, and giving a different value is an error.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"not a psdp loader state (expected a dict with format={STATE_FORMAT!r}, got "
                f"{str(state)[:80]!r}); pass what DataLoader.state() returned"
            )
        check_fields("the saved state", state, STATE_FIELDS, RESTORE_FIX)
        for name in ("global_batch_size", "seed", "shuffle", "drop_last"):
            if name in kwargs and kwargs[name] != state[name]:
                raise ValueError(
                    f"resuming with {name}={kwargs[name]!r}, but the saved state has "
                    f"{name}={state[name]!r}; the batch order depends on it, so resume with the "
                    f"saved value (or start a new run from step 0)"
                )
            kwargs[name] = state[name]
        loader = cls(source, mesh=mesh, **kwargs)
        try:  # hosts that restored from different checkpoints would feed one batch two ways
            agree(
                {"step": state["step"], "saved source": state["source"]},
                loader._processes,
                f"restored DataLoader {loader.name!r}",
            )
        except BaseException:
            loader.close()
            raise
        found = loader._fingerprint()
        if found != state["source"]:
            loader.close()
            raise ValueError(
                f"the source does not match the saved state: saved {state['source']}, found "
                f"{found}; resume with the source the state was saved from"
            )
        check_int("step", state["step"], minimum=0)
        loader.start_step = int(state["step"])
        return loader

    def close(self) -> None:
        """Stops every iterator this loader started and joins their threads; idempotent."""
        with self._lock:
            self._closed = True
            iterators, self._iterators = self._iterators, []
        for iterator in iterators:
            iterator.close()
        reader, self._reader = self._reader, None  # no lock: a stuck read may hold it forever
        if reader is not None:
            reader.close()  # never waits for a take in progress

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DataLoader({self.source.describe()}, global_batch_size={self.global_batch_size}, "
            f"batch_spec={self.batch_spec}, process {self.process_index} reads "
            f"{len(self._read_positions)} rows/step)"
        )


class LoaderIterator(Prefetcher[Batch]):
    """What ``iter(loader)`` and `DataLoader.iter_from` return: batches prefetched on background
    threads, and the iterator's own `state`.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> with DataLoader(np.arange(64, dtype=np.int32), mesh=mesh, global_batch_size=8) as loader:
        ...     it = iter(loader)
        ...     _ = next(it), next(it)
        ...     it.state()["step"]
        2
    """

    def __init__(self, loader: DataLoader, run: str, *, start: int, **kwargs: Any) -> None:
        self._loader = loader
        self._run = run  # names this iterator's reads in the hosts' stream agreement
        super().__init__(self._produce, start=start, **kwargs)

    def _produce(self, step: int) -> Batch:
        return self._loader._batch(step, self._run, lambda: self.closed or self._loader._closed)

    def state(self) -> dict[str, Any]:
        """The loader's state with this iterator's next step: what `DataLoader.restore` takes."""
        return self._loader._state_at(self.next_step)


# ------------------------------------------------------------------------------------ helpers
def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool | np.bool_)


def _read_window_of(source: Any) -> Any:
    """The source's ``read_window``, unless a subclass overrides ``read`` below it (then the
    override is what the user means, and ``read_window`` would bypass it)."""
    read_window = getattr(source, "read_window", None)
    if read_window is None:
        return None
    mro = type(source).__mro__
    defines = [
        next((i for i, c in enumerate(mro) if n in c.__dict__), len(mro))
        for n in ("read", "read_window")
    ]
    return read_window if defines[1] <= defines[0] else None


def _stray_stop_iteration(where: str, source: Any) -> RuntimeError:
    return RuntimeError(
        f"{where} from {source.describe()} raised StopIteration. Only a stream's end may end "
        "iteration; from a random-access source it would end the training loop early without a "
        "word (a stray next() on an exhausted iterator inside read?), so it is an error: catch "
        "it in the source, or wrap an iterable without random access in psdp.StreamSource"
    )


def _with_timeout(work: Any, timeout_s: float, message: Any) -> Any:
    """Runs ``work()`` on a daemon thread; raises `TimeoutError` if it takes over ``timeout_s``.

    A read that never returns cannot be interrupted from Python; its daemon thread is abandoned
    (it ends with the process), and the step fails instead of hanging the trainer.
    """
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as err:  # re-raised on the calling thread
            error.append(err)

    thread = threading.Thread(target=run, name="psdp-read", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(message())
    if error:
        raise error[0]
    return result[0]
