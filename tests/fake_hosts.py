"""Several hosts simulated in one process: the whole loader, planned and read for any host.

psdp plans from a `MeshLayout` (the process of every mesh position), which it reads off a live
mesh with `MeshLayout.from_mesh`. `fake_pod` makes that return a chosen layout for one mesh of
this process's 8 CPU devices (and lets ``process_index`` name any of its hosts), so
``DataLoader(..., process_index=p)`` plans, reads and cuts its
device boxes exactly as host ``p`` of that layout would. Only the last JAX call differs: one
process cannot place data for devices another host owns, so `host_batch` replaces
``jax.make_array_from_callback`` by a recorder that asks the loader's callback for the boxes of
host ``p``'s devices alone (as JAX does on a real host: one call per addressable device, with
the box ``devices_indices_map`` gives it) and keeps the results per device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from psdp import MeshLayout


@dataclass
class HostShards:
    """What one simulated host would hand to JAX for one leaf: its devices' buffers."""

    shape: tuple[int, ...]
    sharding: NamedSharding
    shards: dict[Any, np.ndarray]


@contextlib.contextmanager
def fake_pod(mesh: Mesh, process_index: Any) -> Iterator[dict[Any, int]]:
    """While open, psdp sees ``mesh`` with the given process of every position.

    Yields device -> simulated process.
    """
    layout = MeshLayout(np.asarray(process_index).reshape(mesh.devices.shape), mesh.axis_names)
    real = MeshLayout.from_mesh.__func__  # type: ignore[attr-defined]

    def from_mesh(cls: type[MeshLayout], live: Mesh) -> MeshLayout:
        return layout if live is mesh else real(cls, live)

    def simulated_host(layout: MeshLayout, process_index: int | None) -> int:
        # a real loader refuses a process_index other than jax.process_index(); here the host is
        # simulated, so any process of the layout may be named (the pod tests keep that guard)
        assert process_index in layout.processes, (process_index, layout.processes)
        return int(process_index)

    with (
        mock.patch.object(MeshLayout, "from_mesh", classmethod(from_mesh)),
        mock.patch("psdp._runtime.loader.check_own_process", simulated_host),
    ):
        yield dict(zip(mesh.devices.flat, layout.process_index.ravel().tolist(), strict=True))


def recorder(process_of: Mapping[Any, int], host: int) -> Any:
    """A stand-in for ``jax.make_array_from_callback`` that asks for ``host``'s boxes alone."""

    def record(shape: Any, sharding: NamedSharding, callback: Any) -> HostShards:
        boxes = sharding.devices_indices_map(tuple(shape))
        shards = {d: np.array(callback(i)) for d, i in boxes.items() if process_of[d] == host}
        return HostShards(tuple(shape), sharding, shards)

    return record


def host_batch(loader: Any, step: int, process_of: Mapping[Any, int]) -> dict[Any, HostShards]:
    """The boxes ``loader``'s host would place on its devices at ``step``, per leaf."""
    record = recorder(process_of, loader.process_index)
    with mock.patch.object(jax, "make_array_from_callback", record):
        batch = loader.batch_at(step)
    return batch if isinstance(batch, dict) else {None: batch}
