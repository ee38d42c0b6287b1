"""Pod targets for tests/test_simulate.py: `check_consistency` across real processes."""

from __future__ import annotations

import os
import signal
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp._integration.consistency import ConsistencyError, check_consistency
from psdp._integration.loader_config import MeshConfig


def global_rows(
    rows: np.ndarray, sharding: NamedSharding, corrupt: int | None, part: str = "all"
) -> jax.Array:
    """``rows`` as a global array; the device with id ``corrupt`` (if local) holds wrong data:
    every element + 1 (``part="all"``), or only the last element of its box (``"last"``), so a
    checker that compares part of a shard (its first row, say) is caught too."""
    shards = []
    for device, index in sharding.addressable_devices_indices_map(rows.shape).items():
        block = np.array(rows[index])
        if device.id == corrupt:
            if part == "all":
                block += 1
            else:
                block[(-1,) * block.ndim] += 1
        shards.append(jax.device_put(block, device))
    return jax.make_array_from_single_device_arrays(rows.shape, sharding, shards)


def check_across_hosts(corrupt_process: int | None, with_expected: bool, part: str = "all") -> dict:
    """Every host checks one batch; one device of ``corrupt_process`` (if any) holds wrong data
    (all of its box, or its last element: see `global_rows`).

    Returns what this host saw: the report line, or the error message.
    """
    mesh = MeshConfig(axes={"data": 4, "model": 2}, layout="noncontiguous").build()
    rows = np.arange(16 * 3, dtype=np.int32).reshape(16, 3)
    corrupt = None
    if corrupt_process is not None:
        corrupt = min(d.id for d in mesh.devices.flat if d.process_index == corrupt_process)
    batch = {"tokens": global_rows(rows, NamedSharding(mesh, P("data")), corrupt, part)}
    try:
        report = check_consistency(batch, {"tokens": rows} if with_expected else None)
    except ConsistencyError as err:
        return {"process": jax.process_index(), "error": str(err), "corrupt": corrupt}
    return {"process": jax.process_index(), "report": str(report), "local": report.local_shards}


def count_with_progress(total: int) -> int:
    """Reports progress 1..total (process 0's reaches the parent) and returns ``total``."""
    from psdp.tools.pod import report_progress

    for done in range(1, total + 1):
        report_progress(done, total)
        time.sleep(0.06)  # longer than the parent's poll, so it sees several values
    return total


def kill_one() -> None:
    """Process 1 dies by SIGKILL; the others wait in a collective that never completes."""
    from jax.experimental import multihost_utils

    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    multihost_utils.sync_global_devices("never reached by process 1")
