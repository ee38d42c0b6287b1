"""Assembly: a host's window buffers -> one global `jax.Array` per leaf (``docs/measurements/performance.md``,
figure 1, measures the two paths)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from functools import cached_property
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp._compat import enable_x64
from psdp._imports import import_optional
from psdp._plan.leaves import Key, in_leaf_order, leaf_label, unwrap
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.order import PAD
from psdp._plan.windows import LeafWindows

#: Host bytes per leaf from which `LeafAssembler.assemble` sends every box in one batched
#: ``jax.device_put`` instead of ``jax.make_array_from_callback`` (below it the batched call's
#: fixed cost of about 0.1 ms dominates).
BATCHED_PUT_MIN_BYTES = 4 << 20


class LeafAssembler(LeafWindows):
    """A leaf's windows (`LeafWindows`) and the per-step work: `assemble`.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafAssembler.create(mesh, P("data"), (8, 3), np.int32, process_index=0)
        >>> batch = leaf.assemble(np.arange(24, dtype=np.int32).reshape(8, 3))
        >>> batch.shape, batch.sharding.spec
        ((8, 3), P('data',))

        A sequence sharded over ``model`` with one halo column (``-1`` outside the sequence):

        >>> leaf = LeafAssembler.create(mesh, P("data", "model"), (4, 4), np.int32, 0, halo=1)
        >>> batch = leaf.assemble(leaf.fill(np.arange(16, dtype=np.int32).reshape(4, 4), -1))
        >>> np.asarray(batch)[0].tolist()  # row 0 = [0, 1, 2, 3], as two haloed windows
        [-1, 0, 1, 2, 1, 2, 3, -1]

        A ``(B, H, W)`` field over ``data x model`` in ``W``, with a periodic halo of 1:

        >>> from psdp._plan.windows import AxisHalo
        >>> leaf = LeafAssembler.create(mesh, P("data", None, "model"), (4, 2, 4), np.int32, 0,
        ...                             halo={2: AxisHalo(1, "periodic")})
        >>> batch = leaf.assemble(leaf.fill(np.arange(32, dtype=np.int32).reshape(4, 2, 4)))
        >>> batch.shape, np.asarray(batch)[0, 0].tolist()  # row 0, H = 0: [0, 1, 2, 3]
        ((4, 2, 8), [3, 0, 1, 2, 1, 2, 3, 0])
    """

    @classmethod
    def of(cls, windows: LeafWindows) -> LeafAssembler:
        """The assembler of a planned leaf."""
        return cls(**{f.name: getattr(windows, f.name) for f in fields(windows)})

    @cached_property
    def live_sharding(self) -> NamedSharding:
        """The leaf's sharding (an assembler is planned on a live mesh)."""
        assert self.sharding is not None, "planned on a MeshLayout: nothing to assemble"
        return self.sharding

    @cached_property
    def device_boxes(self) -> dict[jax.Device, tuple[slice, ...]]:
        """Each local device's box of the global array."""
        return self.live_sharding.addressable_devices_indices_map(self.global_shape)  # type: ignore[return-value]

    def halo_mask(self, dim: int | None = None) -> jax.Array:
        """`halo_mask` of this leaf: which positions of dimension ``dim`` are halo positions."""
        return _halo_mask(self, "this leaf", dim)

    def domain_mask(self, dim: int | None = None) -> jax.Array:
        """`domain_mask` of this leaf: which positions of dimension ``dim`` lie in the domain."""
        return _domain_mask(self, "this leaf", dim)

    def assemble(self, buffers: np.ndarray | Sequence[np.ndarray]) -> jax.Array:
        """Builds the global array from this host's window buffers (one array if one window)."""
        if isinstance(buffers, np.ndarray):
            buffers = [buffers]
        if len(buffers) != len(self.windows):
            raise ValueError(f"got {len(buffers)} buffers for {len(self.windows)} windows")
        for i, buffer in enumerate(buffers):
            if buffer.shape != self.window_shape(i) or buffer.dtype != self.dtype:
                raise ValueError(
                    f"window {i}'s buffer has shape {buffer.shape} and dtype {buffer.dtype}, but "
                    f"the plan needs {self.window_shape(i)} {self.dtype}"
                )
        batch = self.global_shape[0]
        extents = [
            self.global_shape[d] // c for d, c in zip(self.windowed, self.shards, strict=True)
        ]

        def device_box(index: tuple[slice, ...] | None) -> np.ndarray:
            assert index is not None  # only None for arrays with no addressable shards
            start = index[0].start or 0
            stop = batch if index[0].stop is None else index[0].stop
            shard = tuple(
                (index[d].start or 0) // n for d, n in zip(self.windowed, extents, strict=True)
            )
            window, offset = self.locate[(start, shard)]
            # a window is one device's box in every dimension but the batch
            return buffers[window][offset : offset + stop - start]

        if sum(b.nbytes for b in buffers) < BATCHED_PUT_MIN_BYTES:
            return jax.make_array_from_callback(self.global_shape, self.live_sharding, device_box)
        devices = list(self.device_boxes)
        shards = jax.device_put([device_box(self.device_boxes[d]) for d in devices], devices)
        return jax.make_array_from_single_device_arrays(
            self.global_shape, self.live_sharding, shards
        )


class BatchAssembler:
    """A step's window buffers -> the batch: every leaf's global array, the mask leaf, haliax
    NamedArrays where asked, and the single leaf of an array source unwrapped.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp._plan.loader_plan import LoaderPlan
        >>> from psdp._plan.options import LoaderOptions
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> plan = LoaderPlan.create({"x": np.zeros(1, np.int32)}, mesh,
        ...     LoaderOptions.create(global_batch_size=6), 0, stream=False, ends_short=False)
        >>> ids = np.array([0, 1, 2, 3, 4, 5, -1, -1])
        >>> batch = BatchAssembler(plan).assemble(ids, {"x": [np.arange(8, dtype=np.int32)]})
        >>> np.asarray(batch["mask"]).tolist()
        [True, True, True, True, True, True, False, False]
    """

    def __init__(self, plan: LoaderPlan) -> None:
        self.plan = plan
        self.leaves = {key: LeafAssembler.of(leaf) for key, leaf in plan.leaves.items()}
        self.mask = None if plan.mask is None else LeafAssembler.of(plan.mask)
        self._all_real: jax.Array | None = None  # the mask of every step when nothing is padded
        if plan.named:  # after the planner's checks of the names, which need no haliax
            self._haliax = import_optional("haliax", extra="haliax", needed_for="named_axes")

    def assemble(self, ids: np.ndarray, buffers: Mapping[Key, Sequence[np.ndarray]]) -> Any:
        """The batch of a physical batch holding ``ids`` (`PAD` for padding), from its buffers."""
        # the x64 switch is thread-local: deliver 64-bit leaves as the planner checked them
        with enable_x64(True) if self.plan.needs_x64 else contextlib.nullcontext():
            batch = {key: leaf.assemble(buffers[key]) for key, leaf in self.leaves.items()}
            if self.mask is not None:
                batch[self.plan.options.output.mask_key] = self._mask_of(ids)
        return self._wrap(in_leaf_order(batch))

    def _mask_of(self, ids: np.ndarray) -> jax.Array:
        """The mask of every step without padding is the same, so it is assembled once
        (jax.Arrays are immutable, so batches may share it; two read threads racing here build
        it twice); a padded step's is its own."""
        assert self.mask is not None
        real = (ids != PAD)[self.mask.plan.rows]
        if not real.all():
            return self.mask.assemble(real)
        if self._all_real is None:
            self._all_real = self.mask.assemble(real)
        return self._all_real

    def _wrap(self, batch: dict[Key, jax.Array]) -> Any:
        named = self.plan.named
        if named:
            names = dict(named)
            mask_key = self.plan.options.output.mask_key
            if mask_key is not None:
                names.setdefault(mask_key, next(iter(named.values()))[:1])
            batch = {
                key: self._haliax.named(value, tuple(getattr(n, "name", n) for n in names[key]))
                if key in names
                else value
                for key, value in batch.items()
            }
        return unwrap(batch)


def halo_mask(leaf: LeafWindows, key: Key, dim: int | None = None) -> jax.Array:
    """Which positions of a windowed leaf's dimension ``dim`` are halo positions (``True``), as a
    global array sharded like that dimension (`DataLoader.halo_mask`); ``dim`` may be left out
    when the leaf has one windowed dimension.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafWindows.create(mesh, P("data", "model"), (4, 4), np.int32, 0, halo=1)
        >>> np.asarray(halo_mask(leaf, "tokens")).astype(int).tolist()
        [1, 0, 0, 1, 1, 0, 0, 1]
    """
    return _halo_mask(leaf, leaf_label(key), dim)


def _halo_mask(leaf: LeafWindows, label: str, dim: int | None) -> jax.Array:
    axis = _windowed_axis(leaf, label, dim)
    h = leaf.halos[axis].width
    count = leaf.shards[axis]
    extent = leaf.global_shape[leaf.windowed[axis]] // count
    position = np.arange(extent)
    one = (position < h) | (position >= extent - h)
    return _axis_array(leaf, axis, np.tile(one, count))


def domain_mask(leaf: LeafWindows, key: Key, dim: int | None = None) -> jax.Array:
    """Which positions of a windowed leaf's dimension ``dim`` lie inside the domain (``True``),
    as a global array sharded like that dimension: ``False`` for an uneven domain's padding and
    for halo positions beyond the domain's edges, whatever their boundary rule filled in. A
    device's own entries are ``domain_mask & ~halo_mask``.

    Examples:
        7 columns over 2 shards: 4 per device, the last one padding.

        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafWindows.create(mesh, P("data", "model"), (4, 7), np.int32, 0, pad_uneven=True)
        >>> np.asarray(domain_mask(leaf, "tokens")).astype(int).tolist()
        [1, 1, 1, 1, 1, 1, 1, 0]
    """
    return _domain_mask(leaf, leaf_label(key), dim)


def _domain_mask(leaf: LeafWindows, label: str, dim: int | None) -> jax.Array:
    axis = _windowed_axis(leaf, label, dim)
    d = leaf.windowed[axis]
    h, count = leaf.halos[axis].width, leaf.shards[axis]
    width = leaf.plan.global_shape[d] // count  # a shard's own entries
    coordinate = (np.arange(count)[:, None] * width - h + np.arange(width + 2 * h)).ravel()
    return _axis_array(leaf, axis, (coordinate >= 0) & (coordinate < leaf.source_shape[d]))


def _windowed_axis(leaf: LeafWindows, label: str, dim: int | None) -> int:
    """The position of dimension ``dim`` among the leaf's windowed dimensions."""
    if not leaf.windowed:
        raise ValueError(f"{label} is not read in windows; it has no halo")
    if dim is None:
        if len(leaf.windowed) > 1:
            raise ValueError(
                f"{label} is windowed in dimensions {list(leaf.windowed)}; name one, "
                f"e.g. dim={leaf.windowed[-1]}"
            )
        return 0
    if dim not in leaf.windowed:
        raise ValueError(
            f"dimension {dim} of {label} is not read in windows (its windowed "
            f"dimensions are {list(leaf.windowed)}); pass one of them"
        )
    return leaf.windowed.index(dim)


def _axis_array(leaf: LeafWindows, axis: int, value: np.ndarray) -> jax.Array:
    """``value`` (one entry per position of a windowed dimension) sharded like that dimension."""
    assert leaf.sharding is not None  # planned on a live mesh
    spec = leaf.sharding.spec
    d = leaf.windowed[axis]
    sharding = NamedSharding(leaf.sharding.mesh, PartitionSpec(spec[d] if len(spec) > d else None))
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
