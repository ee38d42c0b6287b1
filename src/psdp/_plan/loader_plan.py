"""`LoaderPlan`: everything a loader fixes once, from its options, mesh and first row (pure).

What each part means: ``docs/concepts/loader.md``; where it lives: ``docs/concepts/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from psdp._plan.dtypes import LeafDtype, check_pad_value, needs_x64, plan_dtypes
from psdp._plan.layout import MeshLayout
from psdp._plan.leaves import Key, in_leaf_order, leaf_label
from psdp._plan.mesh import spec_axes
from psdp._plan.options import LoaderOptions
from psdp._plan.partition import (
    batch_shards,
    named_spec,
    physical_batch_size,
    resolve_halos,
    resolve_named_axes,
    resolve_specs,
)
from psdp._plan.reads import ReadRequest, feeding_positions, plan_reads, stream_shard
from psdp._plan.windows import AxisHalo, LeafWindows


@dataclass(frozen=True, eq=False)
class LoaderPlan:
    """One host's plan of every step: specs, physical batch, windows, reads and the mask.

    Built by `LoaderPlan.create`; the same every step, so a step's work is only reading.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp._plan.options import LoaderOptions
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> first_row = {"tokens": np.zeros((1, 16), np.int32)}
        >>> plan = LoaderPlan.create(
        ...     first_row, mesh, LoaderOptions.create(global_batch_size=6), process_index=0,
        ...     stream=False, ends_short=False)
        >>> plan.physical_batch_size, plan.padded, plan.specs["tokens"], plan.mask is not None
        (8, True, P('data',), True)
    """

    options: LoaderOptions
    layout: MeshLayout
    process_index: int
    #: each leaf's `PartitionSpec`
    specs: dict[Key, PartitionSpec]
    #: each leaf's haliax axis names (only leaves delivered as NamedArrays)
    named: dict[Key, tuple[Any, ...]]
    #: each leaf's source and delivered dtype
    dtypes: dict[Key, LeafDtype]
    #: each leaf's halo per dimension
    halos: dict[Key, dict[int, AxisHalo]]
    physical_batch_size: int
    #: where the global batch's rows sit in the physical batch (the rest is padding)
    real_positions: np.ndarray
    #: whether a batch can hold padding rows (a physical batch larger than the global one, or an
    #: epoch's short final batch)
    padded: bool
    leaves: dict[Key, LeafWindows]
    #: the mask leaf's windows (``None``: no mask leaf)
    mask: LeafWindows | None
    requests: tuple[ReadRequest, ...]
    #: positions within each physical batch this host reads, sorted
    read_positions: np.ndarray
    #: the real ones among them
    real_read_positions: np.ndarray
    #: (uid, number of uids): the stream shard this host reads; ``None`` for random access
    stream_shard: tuple[int, int] | None
    #: whether a delivered leaf is 64-bit (assembled with ``jax_enable_x64`` on)
    needs_x64: bool

    @classmethod
    def create(
        cls,
        first_row: Mapping[Key, np.ndarray],
        mesh: Mesh,
        options: LoaderOptions,
        process_index: int,
        *,
        layout: MeshLayout | None = None,
        stream: bool,
        ends_short: bool,
        zero_rows_weigh_nothing: bool = False,
    ) -> LoaderPlan:
        """Plans a loader from its source's first row (one row per leaf, ``(1, ...)``).

        ``stream``: the rows come from a stream (each host reads a stream shard); ``ends_short``:
        an epoch's final batch may be short (so batches can hold padding); ``layout``: the mesh's
        (default: `MeshLayout.from_mesh`); ``zero_rows_weigh_nothing``: the source says a row of
        zeros counts nowhere (`MaxTextRows`), so zero padding needs no mask leaf.
        """
        layout = MeshLayout.from_mesh(mesh) if layout is None else layout
        first_row = in_leaf_order(first_row)  # every leaf table of the plan in the one order
        order, sharding, output = options.order, options.sharding, options.output
        batch = order.global_batch_size
        assert isinstance(batch, int)  # a schedule has one plan per batch size (DataLoader)
        ndims = {k: np.ndim(v) for k, v in first_row.items()}
        dtypes = plan_dtypes({k: np.asarray(v).dtype for k, v in first_row.items()}, output.dtypes)
        named = resolve_named_axes(sharding.named_axes, sharding.axis_mapping, ndims)
        mapping = sharding.axis_mapping or {}
        specs = resolve_specs(
            sharding.batch_spec,
            mesh,
            list(first_row),
            {k: named_spec(v, mapping, mesh, repr(k)) for k, v in named.items()},
            sharding.batch_axes,
        )
        for key, spec in specs.items():
            spec_axes(layout, spec, ndims[key])  # raises naming the spec and the mesh
        shards = [batch_shards(mesh, spec) for spec in specs.values()]
        physical = physical_batch_size(batch, shards)
        real = np.arange(batch)
        if sharding.feeding_processes is not None:
            physical, real = feeding_positions(
                sharding.feeding_processes, specs, shards, batch, layout
            )
        padded = physical > batch or ends_short
        halos = resolve_halos(sharding.halo, specs, ndims)
        leaves = {
            key: _windows_of(
                key,
                mesh,
                specs[key],
                (physical, *np.shape(row)[1:]),
                dtypes[key].delivered,
                process_index,
                halos[key],
            )
            for key, row in first_row.items()
        }
        _check_pad_value(options, dtypes, leaves, padded, physical)
        # a padding row the trainer weighs 0 by its own leaves needs no mask to mark it
        weightless = zero_rows_weigh_nothing and options.output.pad_value == 0
        mask = _plan_mask(
            options, mesh, specs, leaves, padded and not weightless, physical, process_index
        )
        requests = tuple(plan_reads(leaves))
        read_positions = np.unique(np.concatenate([r.positions for r in requests]))
        return cls(
            options=options,
            layout=layout,
            process_index=process_index,
            specs=specs,
            named=named,
            dtypes=dtypes,
            halos=halos,
            physical_batch_size=physical,
            real_positions=real,
            padded=padded,
            leaves=leaves,
            mask=mask,
            requests=requests,
            read_positions=read_positions,
            real_read_positions=np.intersect1d(read_positions, real),
            stream_shard=stream_shard(specs, layout, process_index, physical, real)
            if stream
            else None,
            needs_x64=any(needs_x64(d.delivered) for d in dtypes.values()),
        )

    def leaf_shapes(self) -> dict[str, list[Any]]:
        """Each leaf's delivered dtype and trailing shape, by name (part of a source's fingerprint)."""
        return {
            str(k): [str(v.dtype), list(v.source_shape[1:])]
            for k, v in sorted(self.leaves.items(), key=lambda kv: str(kv[0]))
        }

    def settings(self) -> dict[str, Any]:
        """What the batches depend on beyond the order and the source, as JSON values: every host
        of the mesh must agree on it."""
        feeding = self.options.sharding.feeding_processes
        return {
            "batch_spec": {str(k): str(v) for k, v in self.specs.items()},
            "halo": {str(k): _halo_setting(v) for k, v in self.halos.items()},
            "feeding_processes": None if feeding is None else sorted(int(p) for p in feeding),
            "pad_value": np.asarray(self.options.output.pad_value).item(),
            "mask_key": self.options.output.mask_key,
        }


def _windows_of(
    key: Key,
    mesh: Mesh,
    spec: PartitionSpec,
    shape: tuple[int, ...],
    dtype: np.dtype,
    process_index: int,
    halos: dict[int, AxisHalo],
) -> LeafWindows:
    """A leaf's windows, uneven dimensions padded; an error names the leaf."""
    try:
        return LeafWindows.create(
            mesh, spec, shape, dtype, process_index, halo=halos, pad_uneven=True
        )
    except ValueError as err:
        raise ValueError(f"{leaf_label(key)}: {err}") from None


def _halo_setting(halos: dict[int, AxisHalo]) -> int | dict[str, list[Any]]:
    """A leaf's halos as the hosts agree on them: an int for dimension 1 with ``pad`` (as saved
    before halos had dimensions), else dimension -> [width, boundary]."""
    if not halos or (list(halos) == [1] and halos[1].boundary == "pad"):
        return halos[1].width if halos else 0
    return {str(d): [h.width, h.boundary] for d, h in halos.items()}


def _check_pad_value(
    options: LoaderOptions,
    dtypes: dict[Key, LeafDtype],
    leaves: dict[Key, LeafWindows],
    padded: bool,
    physical: int,
) -> None:
    """Every leaf that ``pad_value`` can ever fill holds it exactly."""
    order = options.order
    for key, dtype in dtypes.items():
        if padded:
            reason = (
                f"the batch can hold padding rows (global_batch_size={order.global_batch_size} "
                f"in a physical batch of {physical}, drop_last={order.drop_last})"
            )
        else:
            reason = _pad_filled(leaves[key])
            if not reason:
                continue
        check_pad_value(options.output.pad_value, dtype.delivered, key, reason)


def _pad_filled(leaf: LeafWindows) -> str:
    """Why ``pad_value`` fills some entries of a leaf's windows ("": it never does)."""
    for d, count, halo in zip(leaf.windowed, leaf.shards, leaf.halos, strict=True):
        size = leaf.source_shape[d]
        if size % count:
            return (
                f"its dimension {d} of {size} entries is padded to {leaf.plan.global_shape[d]} "
                f"for its {count} shards"
            )
        if halo.width and halo.boundary == "pad":
            if d == 1:
                return (
                    f"its halo={halo.width} columns beyond the sequence's ends are filled with it"
                )
            return f"its halo of {halo.width} on dimension {d} is filled with it beyond the edges"
    return ""


def _plan_mask(
    options: LoaderOptions,
    mesh: Mesh,
    specs: dict[Key, PartitionSpec],
    leaves: dict[Key, LeafWindows],
    padded: bool,
    physical: int,
    process_index: int,
) -> LeafWindows | None:
    """The mask leaf of every dict batch (unless ``mask_key=None``); padding needs one."""
    mask_key = options.output.mask_key
    if padded and (None in leaves or mask_key is None):
        batch = options.order.global_batch_size
        assert isinstance(batch, int)  # a schedule has one plan per batch size
        reasons, fixes = [], []
        if physical > batch:
            reasons.append(
                f"global_batch_size={batch} is not a multiple of the batch shards, so every "
                f"batch is padded to {physical} rows"
            )
            fixes.append(f"a global_batch_size that the batch shards divide (e.g. {physical})")
        else:
            reasons.append(
                f"drop_last={options.order.drop_last}: a batch cut short (an epoch's final "
                "batch, or a skip) is padded to the full batch"
            )
            fixes.append("drop_last=True (short final batches dropped)")
        why = (
            "an array source cannot carry one; pass a dict source, e.g. {'inputs': array}, or "
            if None in leaves
            else "mask_key=None asks for none; pass mask_key='mask' (the default), or "
        )
        raise ValueError(
            f"padded rows need a mask leaf that marks them, and {why}avoid the padding: "
            f"{'; '.join(reasons)}; use {' and '.join(fixes)}"
        )
    if None in leaves or mask_key is None:
        return None
    if mask_key in leaves:
        raise ValueError(f"the source already has a leaf named {mask_key!r}; pass another mask_key")
    first = next(iter(specs.values()))  # the first leaf by name (`create` orders the leaves)
    spec = PartitionSpec(first[0] if len(first) else None)
    return LeafWindows.create(mesh, spec, (physical,), np.dtype(bool), process_index)
