"""Figure 1, assembly: host buffer -> one global `jax.Array`, every JAX path against the memcpy
floor (``docs/measurements/performance.md``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from psdp._runtime.assembly import LeafAssembler
from psdp.tools.benchmarks.common import (
    Sizes,
    blocking,
    check_shards,
    cpu_mesh,
    int32_table,
    interleaved_ms,
    ratio,
)

PSDP = "psdp LeafAssembler (batched device_put)"
CALLBACK = "make_array_from_callback (psdp before)"


def assembly_paths(
    mesh: Mesh, spec: PartitionSpec, host: np.ndarray
) -> dict[str, Callable[[], Any]]:
    """Every way to turn the host's batch ``host`` into a global array, plus the floor.

    Examples:
        >>> mesh = cpu_mesh((4, 2), ("data", "model"))
        >>> paths = assembly_paths(mesh, PartitionSpec("data"), int32_table(8, 4))
        >>> paths[CALLBACK]().shape
        (8, 4)
    """
    sharding = NamedSharding(mesh, spec)
    shape = host.shape
    leaf = LeafAssembler.create(mesh, spec, shape, host.dtype, process_index=0)
    boxes = sharding.addressable_devices_indices_map(shape)
    devices = list(boxes)
    floor_buffers = [np.empty_like(host) for _ in range(mesh.shape["model"])]

    def floor() -> None:
        for buffer in floor_buffers:  # the bytes every TP replica must hold
            np.copyto(buffer, host)

    def per_device() -> jax.Array:
        shards = [jax.device_put(host[boxes[d]], d) for d in devices]
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)

    def per_device_one_call() -> jax.Array:
        shards = jax.device_put([host[boxes[d]] for d in devices], devices)
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)

    return {
        "floor": floor,
        PSDP: lambda: leaf.assemble(host),
        CALLBACK: lambda: jax.make_array_from_callback(shape, sharding, lambda i: host[i]),
        "device_put(global)": lambda: jax.device_put(host, sharding),
        "make_array_from_process_local_data": lambda: (
            jax.make_array_from_process_local_data(sharding, host, shape)
        ),
        "per-device device_put": per_device,
        "per-device device_put (one call)": per_device_one_call,
    }


def bench_assembly(sizes: Sizes) -> dict[str, Any]:
    """Host buffer -> global array, every path, against the memcpy floor; exact data checked."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    spec = PartitionSpec("data")
    rows_out = []
    for mib in sizes.assembly_mib:
        width = sizes.assembly_width
        host = int32_table(max(8, int(mib * 2**20) // (width * 4) // 8 * 8), width)
        paths = assembly_paths(mesh, spec, host)
        for name, path in paths.items():  # every path must give exactly the right shards
            if name != "floor":
                check_shards(path(), host, name)
        ms = interleaved_ms({n: blocking(p) for n, p in paths.items()}, max(sizes.repeats, 3))
        rows_out += [
            {
                "batch_mib": host.nbytes / 2**20,
                "path": name,
                "ms": ms[name],
                "floor_ms": ms["floor"],
                "ratio": ratio(ms[name], ms["floor"]),
                "vs_device_put": ratio(ms[name], ms["device_put(global)"]),
            }
            for name in paths
            if name != "floor"
        ]
    return {
        "title": "Assembly: host buffer -> global jax.Array (int32, 8 fake devices, data=4 x model=2)",
        "ratio_means": "time / floor (numpy memcpy of the host's bytes x 2 model replicas); lower is better",
        "rows": rows_out,
    }
