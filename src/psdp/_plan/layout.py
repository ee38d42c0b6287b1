"""Mesh layouts: which process owns each position of a device mesh (``docs/concepts/mesh.md``).

A layout is all the planner needs to know of a mesh, so a 65,536-device pod is planned in one
process without devices. Build one from a live mesh, by hand, from a JSON file, or with
`MeshLayout.contiguous` / `MeshLayout.noncontiguous`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from psdp._checks import is_int

if TYPE_CHECKING:
    import jax


@dataclass(frozen=True, eq=False)
class MeshLayout:
    """The process of every device position of a mesh.

    Attributes:
        process_index: integer array shaped like the mesh; entry ``[i, j, ...]`` is the process that
            owns the device at that mesh position (JAX's ``device.process_index``). A mesh may span
            only some processes of a job, e.g. processes 0 and 2 of 4: the planner then numbers
            them by their position among the mesh's processes (`processes`, `ranks`) internally,
            and speaks of them by their real index everywhere else.
        axis_names: one name per mesh dimension.
        device_ids: optional array of device ids shaped like the mesh (for pictures only).

    Examples:
        The 4-host non-contiguous example pod of ``docs/concepts/mesh.md``: 4 hosts with 4 devices
        each on a ``data=4 x model=4`` mesh, each host's devices in two data rows that are not
        adjacent.

        >>> layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
        >>> layout.process_index
        array([[0, 0, 1, 1],
               [2, 2, 3, 3],
               [2, 2, 3, 3],
               [0, 0, 1, 1]])
        >>> layout.num_processes, layout.axis_sizes
        (4, {'data': 4, 'model': 4})

        A mesh over processes 0 and 2 of a job:

        >>> MeshLayout(np.array([[0, 2], [0, 2]]), ("data", "model")).processes
        (0, 2)
    """

    process_index: np.ndarray
    axis_names: tuple[str, ...]
    device_ids: np.ndarray | None = None
    _processes: tuple[int, ...] = field(init=False, repr=False)
    _ranks: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        procs = np.asarray(self.process_index)
        if isinstance(self.axis_names, str) or not all(
            isinstance(n, str) and n for n in self.axis_names
        ):
            raise ValueError(
                f"MeshLayout.axis_names must be a sequence of non-empty strings, got "
                f"{self.axis_names!r}; e.g. ('data', 'model')"
            )
        names = tuple(self.axis_names)
        object.__setattr__(self, "axis_names", names)
        if not names:
            raise ValueError("MeshLayout needs at least one mesh axis; got no axis names")
        if not np.issubdtype(procs.dtype, np.integer):
            raise ValueError(
                f"MeshLayout.process_index must be an integer array, got dtype {procs.dtype}; "
                "pass the process index of every mesh position as ints"
            )
        if procs.ndim != len(names):
            raise ValueError(
                f"MeshLayout has {procs.ndim} mesh dimensions (shape {procs.shape}) but "
                f"{len(names)} axis names {names}; give exactly one name per dimension"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"MeshLayout axis names must be unique, got {names}")
        if procs.size == 0:
            raise ValueError(f"MeshLayout must have at least one device, got shape {procs.shape}")
        if procs.min() < 0:
            raise ValueError(
                f"MeshLayout.process_index must be >= 0, got {int(procs.min())}; "
                "processes are numbered 0..P-1"
            )
        procs = procs.astype(np.int64, copy=False)
        procs.setflags(write=False)
        object.__setattr__(self, "process_index", procs)
        present, ranks = np.unique(procs, return_inverse=True)
        ranks = ranks.reshape(procs.shape)
        ranks.setflags(write=False)
        object.__setattr__(self, "_processes", tuple(int(p) for p in present))
        object.__setattr__(self, "_ranks", ranks)
        if self.device_ids is not None:
            ids = np.asarray(self.device_ids)
            if ids.shape != procs.shape:
                raise ValueError(
                    f"MeshLayout.device_ids has shape {ids.shape}, expected the mesh shape {procs.shape}"
                )
            ids.setflags(write=False)
            object.__setattr__(self, "device_ids", ids)

    # ----------------------------------------------------------------------------------- queries
    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape, one size per axis."""
        return tuple(int(s) for s in self.process_index.shape)

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Axis name -> size, in mesh order."""
        return dict(zip(self.axis_names, self.shape, strict=True))

    @property
    def num_devices(self) -> int:
        return int(self.process_index.size)

    @property
    def processes(self) -> tuple[int, ...]:
        """The processes that own devices of the mesh, ascending."""
        return self._processes

    @property
    def ranks(self) -> np.ndarray:
        """Like `process_index`, with each process replaced by its position in `processes`.

        The planner's tables have one row per process of the mesh, in this numbering; for a mesh
        over every process of a job (processes ``0..P-1``) it equals `process_index`.
        """
        return self._ranks

    @property
    def num_processes(self) -> int:
        """The number of processes that own devices of the mesh."""
        return len(self.processes)

    def rank(self, process_index: int) -> int:
        """The position of ``process_index`` among `processes` (checked with `check_process`)."""
        return self.processes.index(self.check_process(process_index))

    @property
    def devices_per_process(self) -> int:
        """The number of devices each process owns; raises if processes own different numbers.

        Multi-controller JAX launches every process with the same number of local devices, so a
        layout meant to be run (by `psdp simulate`, or `build_mesh`) must be balanced.
        """
        counts = np.bincount(self.ranks.ravel())
        if counts.min() != counts.max():
            owners = self.processes
            uneven = {owners[r]: int(c) for r, c in enumerate(counts) if c != counts[0]}
            raise ValueError(
                f"processes own different numbers of devices (process {owners[0]} owns "
                f"{int(counts[0])}, "
                f"but {dict(list(uneven.items())[:4])}); every process of a JAX job has the same "
                "number of local devices, so give each process the same count"
            )
        return int(counts[0])

    def axis_index(self, name: str) -> int:
        """The dimension of axis ``name``; a `ValueError` names the mesh's axes if it is absent."""
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise ValueError(
                f"axis {name!r} is not in the mesh; the mesh axes are {self.axis_names}"
            ) from None

    def check_process(self, process_index: int) -> int:
        """Returns ``process_index`` as an int after checking it is one of this layout's processes."""
        if not is_int(process_index) or int(process_index) not in self.processes:
            raise ValueError(
                f"process_index={process_index!r} is out of range: this layout has "
                f"{self.num_processes} processes, {self.describe_processes()}"
            )
        return int(process_index)

    def describe_processes(self) -> str:
        """``"numbered 0..3"``, or ``"processes [0, 2]"`` for a mesh over some processes of a job."""
        owners = self.processes
        if owners == tuple(range(len(owners))):
            return f"numbered 0..{len(owners) - 1}"
        shown = ", ".join(map(str, owners[:16])) + (", ..." if len(owners) > 16 else "")
        return f"processes [{shown}]"

    # ---------------------------------------------------------------------------------- builders
    @classmethod
    def from_mesh(cls, mesh: jax.sharding.Mesh) -> MeshLayout:
        """Reads the layout of a live mesh (each device's ``process_index``)."""
        devices = np.asarray(mesh.devices)
        procs = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
        return cls(procs, tuple(mesh.axis_names), ids)

    @classmethod
    def contiguous(cls, axis_sizes: Mapping[str, int], num_processes: int) -> MeshLayout:
        """Each process owns one contiguous block of the mesh in row-major order.

        Examples:
            >>> MeshLayout.contiguous({"data": 4, "model": 2}, num_processes=2).process_index
            array([[0, 0],
                   [0, 0],
                   [1, 1],
                   [1, 1]])
        """
        names, shape = _checked_sizes(axis_sizes)
        total = math.prod(shape)
        per = _devices_per_process(total, num_processes)
        procs = (np.arange(total) // per).reshape(shape)
        return cls(procs, names, np.arange(total).reshape(shape))

    @classmethod
    def noncontiguous(
        cls, axis_sizes: Mapping[str, int], num_processes: int, batch_axes: int = 1
    ) -> MeshLayout:
        """Hosts folded across data rows, as on a torus: the example pod of ``docs/concepts/mesh.md``.

        The mesh is viewed as a grid of ``DP`` data rows (the first ``batch_axes`` axes) by ``M``
        model columns (the rest). Each host owns a tile of 2 data rows by ``k/2`` model columns of a
        physical grid, tiles numbered row-major; the physical grid is then folded like a ring, so
        the two rows of tile row ``t`` become data rows ``t`` and ``DP-1-t``. Every host therefore
        sits in two data rows (non-adjacent for the outer tiles) and every data row spans several
        hosts. Device ids are the physical, host-major ids (host ``p`` owns ids ``p*k .. p*k+k-1``).

        Examples:
            Two hosts of 2 devices each on ``data=2 x model=2``: each data row spans both hosts.

            >>> MeshLayout.noncontiguous({"data": 2, "model": 2}, num_processes=2).process_index
            array([[0, 1],
                   [0, 1]])
        """
        names, shape = _checked_sizes(axis_sizes)
        if not 1 <= batch_axes < len(shape):
            raise ValueError(
                f"noncontiguous layouts need at least one batch axis and one model axis; got "
                f"batch_axes={batch_axes} for axes {names}"
            )
        dp = math.prod(shape[:batch_axes])
        m = math.prod(shape[batch_axes:])
        per = _devices_per_process(dp * m, num_processes)
        if per % 2 or dp % 2 or m % (per // 2):
            raise ValueError(
                f"a noncontiguous layout gives each host a tile of 2 data rows x k/2 model "
                f"columns; with {dp} data rows, {m} model columns and k={per} devices per host "
                "that does not tile the mesh. Use an even number of data rows, an even k, and a "
                "model size divisible by k/2 (or use the contiguous layout)"
            )
        half = per // 2
        tiles_across = m // half
        phys_row, col = np.divmod(np.arange(dp * m), m)
        tile_row, row_in_tile = np.divmod(phys_row, 2)
        host = tile_row * tiles_across + col // half
        device_id = host * per + row_in_tile * half + col % half
        data_row = np.where(row_in_tile == 0, tile_row, dp - 1 - tile_row)
        procs = np.empty((dp, m), np.int64)
        ids = np.empty((dp, m), np.int64)
        procs[data_row, col] = host
        ids[data_row, col] = device_id
        return cls(procs.reshape(shape), names, ids.reshape(shape))

    @classmethod
    def from_file(cls, path: str | Path) -> MeshLayout:
        """Reads a layout from JSON: ``{"axis_names": [...], "process_index": nested lists}``.

        An optional ``"device_ids"`` entry (nested lists shaped like ``process_index``) names the
        devices in pictures. Example file for 2 hosts on ``data=2 x model=2`` where each host holds
        one model column::

            {"axis_names": ["data", "model"], "process_index": [[0, 1], [0, 1]]}
        """
        path = Path(path)
        try:
            raw: Any = json.loads(path.read_text())
            ids = raw.get("device_ids")
            return cls(
                np.asarray(raw["process_index"]),
                tuple(raw["axis_names"]),
                None if ids is None else np.asarray(ids),
            )
        except FileNotFoundError:
            raise ValueError(f"layout file {str(path)!r} does not exist") from None
        except OSError as err:
            raise ValueError(f"layout file {str(path)!r} cannot be read: {err.strerror}") from None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(
                f"layout file {str(path)!r} is not a valid layout: {err}. Expected JSON like "
                '{"axis_names": ["data", "model"], "process_index": [[0, 1], [0, 1]]}'
            ) from None

    def build_mesh(self, devices: Sequence[jax.Device]) -> jax.sharding.Mesh:
        """Places ``devices`` in a `jax.sharding.Mesh` following this layout.

        Process ``p``'s devices (taken from ``devices`` in order) fill the positions this layout
        gives to ``p``, in row-major order. This is how a live multi-process job gets a
        non-contiguous mesh of a chosen shape.
        """
        from jax.sharding import Mesh

        by_process: dict[int, list[jax.Device]] = {}
        for device in devices:
            by_process.setdefault(device.process_index, []).append(device)
        counts = dict(zip(self.processes, np.bincount(self.ranks.ravel()).tolist(), strict=True))
        have = {p: len(by_process.get(p, [])) for p in self.processes}
        if have != counts or len(by_process) != len(have):
            raise ValueError(
                f"the layout needs {counts} devices per process, but the "
                f"devices given are {dict(sorted((p, len(d)) for p, d in by_process.items()))}; "
                "launch the job with that many processes and local devices"
            )
        grid = np.empty(self.shape, dtype=object)
        flat = self.process_index.ravel()
        taken = dict.fromkeys(by_process, 0)
        for position, p in enumerate(flat.tolist()):
            grid.flat[position] = by_process[p][taken[p]]
            taken[p] += 1
        return Mesh(grid, self.axis_names)


def _checked_sizes(axis_sizes: Mapping[str, int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if not axis_sizes:
        raise ValueError("a mesh needs at least one axis, got none")
    bad = {k: v for k, v in axis_sizes.items() if not is_int(v) or v < 1}
    if bad:
        raise ValueError(f"mesh axis sizes must be positive ints, got {bad}")
    return tuple(axis_sizes), tuple(int(v) for v in axis_sizes.values())


def _devices_per_process(total: int, num_processes: int) -> int:
    if not is_int(num_processes) or num_processes < 1 or total % num_processes:
        raise ValueError(
            f"num_processes={num_processes!r} must be a positive divisor of the {total} mesh "
            "devices so that every process owns the same number of devices"
        )
    return total // int(num_processes)
