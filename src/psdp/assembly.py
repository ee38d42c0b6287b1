"""Assembly: from a host's buffer of rows to one global `jax.Array` per batch leaf.

Mental model: for every leaf the planner gives this host its rows ``plan.rows`` (ascending global
positions in the batch). The host reads exactly those rows into one buffer, in that order; then
``jax.make_array_from_callback`` asks, device by device, for the box each local device holds, and
the callback answers with a *view* of the buffer: the block of rows the box starts at, sliced along
the other dimensions. The buffer is laid out by the plan, not by device order, so replicas of a
row block (a tensor-parallel group) share one buffer region, and a host never needs rows it does
not hold. `LeafAssembler` holds what is fixed for a leaf (sharding, plan, offsets); `assemble` is
the per-step work.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from psdp.mesh import DataPlan, plan_pod


@dataclass(frozen=True, eq=False)
class LeafAssembler:
    """Everything fixed about one batch leaf: its global shape, sharding and this host's plan.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> leaf = LeafAssembler.create(mesh, P("data"), (8, 3), np.int32, process_index=0)
        >>> leaf.plan.rows.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> batch = leaf.assemble(np.arange(24, dtype=np.int32).reshape(8, 3))
        >>> batch.shape, batch.sharding.spec
        ((8, 3), P('data',))
    """

    global_shape: tuple[int, ...]
    dtype: np.dtype
    sharding: NamedSharding
    plan: DataPlan
    row_offset: dict[int, int]  # first global row of a block -> its offset in the host buffer

    @classmethod
    def create(
        cls,
        mesh: jax.sharding.Mesh,
        spec: PartitionSpec,
        global_shape: tuple[int, ...],
        dtype: np.dtype | type,
        process_index: int,
    ) -> LeafAssembler:
        plan = plan_pod(mesh, spec, global_shape).plan(process_index)
        block = plan.blocks[0][0].stop - plan.blocks[0][0].start
        offsets = {int(r): i * block for i, r in enumerate(plan.rows[::block].tolist())}
        return cls(tuple(global_shape), np.dtype(dtype), NamedSharding(mesh, spec), plan, offsets)

    @property
    def host_shape(self) -> tuple[int, ...]:
        """The shape of this host's buffer: its rows, whole."""
        return (len(self.plan.rows), *self.global_shape[1:])

    def assemble(self, host_rows: np.ndarray) -> jax.Array:
        """Builds the global array from this host's rows (``host_shape``, in ``plan.rows`` order)."""
        if host_rows.shape != self.host_shape or host_rows.dtype != self.dtype:
            raise ValueError(
                f"host buffer has shape {host_rows.shape} and dtype {host_rows.dtype}, but the plan "
                f"needs {self.host_shape} {self.dtype}"
            )

        def device_box(index: tuple[slice, ...] | None) -> np.ndarray:
            assert index is not None  # only None for arrays with no addressable shards
            rows = index[0]
            start = self.row_offset[rows.start or 0]
            stop = start + (rows.stop or self.global_shape[0]) - (rows.start or 0)
            return host_rows[(slice(start, stop), *index[1:])]

        return jax.make_array_from_callback(self.global_shape, self.sharding, device_box)
