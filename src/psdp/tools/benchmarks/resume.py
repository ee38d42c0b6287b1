"""Figure 5, resume and memory: resume at step 10**7 against step 0; peak RSS per ``prefetch``
(``docs/measurements/performance.md``)."""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from psdp import DataLoader
from psdp.tools.benchmarks.common import (
    DEVICES,
    Sizes,
    check_shards,
    cpu_mesh,
    int32_table,
    interleaved_ms,
    ratio,
)

FAR = 10**7


def bench_resume(sizes: Sizes) -> dict[str, Any]:
    """First batch at step 10**7 vs step 0, and peak RSS per prefetch depth (subprocesses)."""
    return {
        "title": "Resume cost and peak memory",
        "ratio_means": (
            "resume rows: time at step 10**7 / time at step 0 (1 = O(1) resume); baseline row: "
            "its peak RSS above idle in batches (1 batch + JAX's allocator constant); prefetch "
            "rows: batches held (peak RSS above idle, in batches, less that constant) / "
            "(prefetch + 2); slope row: batches of RSS per extra prefetch slot (bound: 1)"
        ),
        "rows": resume_rows(sizes) + rss_rows(sizes),
    }


def resume_rows(sizes: Sizes) -> list[dict[str, Any]]:
    """The order lookup and the first batch of a fresh iterator, at step 10**7 against step 0."""
    mesh = cpu_mesh((4, 2), ("data", "model"))
    table = int32_table(sizes.rows, sizes.width)
    loader = DataLoader(table, mesh=mesh, global_batch_size=sizes.batch, seed=1)
    order = loader.order
    assert order is not None, "an array source has a global order"
    check_shards(loader.batch_at(FAR), table[order.batch_ids(FAR)], "resume")

    def first_batch(step: int) -> Callable[[], None]:
        def run() -> None:
            it = loader.iter_from(step)
            next(it).block_until_ready()
            it.close()

        return run

    with loader:
        ms = interleaved_ms(
            {
                "order 0": lambda: order.batch_ids(0),
                "order far": lambda: order.batch_ids(FAR),
                "iter 0": first_batch(0),
                "iter far": first_batch(FAR),
            },
            max(sizes.repeats, 3),
        )
    return [
        {
            "what": what,
            "step_0_ms": ms[f"{key} 0"],
            "step_1e7_ms": ms[f"{key} far"],
            "ratio": ratio(ms[f"{key} far"], ms[f"{key} 0"]),
        }
        for what, key in (
            ("GlobalOrder.batch_ids(step)", "order"),
            ("iter_from(step) + first next()", "iter"),
        )
    ]


def rss_rows(sizes: Sizes) -> list[dict[str, Any]]:
    """Peak RSS of the ``batch_at`` baseline and of each prefetch depth, in batches, and the slope."""
    # what the baseline holds above idle beyond its one batch is JAX's allocator keeping freed
    # buffers (a constant), so psdp's batches held = its extra RSS - the baseline's + 1
    naive = rss_in_subprocess(0, sizes.rss_batch_mib, sizes.rss_steps)
    unit = naive["batch_mib"]
    constant = naive["extra_mib"] / unit - 1
    rows_out: list[dict[str, Any]] = [
        {
            "what": "peak RSS, no prefetch (batch_at loop, the baseline)",
            "batch_mib": unit,
            "extra_mib": naive["extra_mib"],
            "batches_held": 1.0,
            "ratio": naive["extra_mib"] / unit,
        }
    ]
    held = []
    for prefetch in sizes.rss_prefetch:
        child = rss_in_subprocess(prefetch, sizes.rss_batch_mib, sizes.rss_steps)
        batches = child["extra_mib"] / unit - constant
        held.append((prefetch, batches))
        rows_out.append(
            {
                "what": f"peak RSS, prefetch={prefetch}",
                "prefetch": prefetch,
                "batch_mib": unit,
                "extra_mib": child["extra_mib"],
                "batches_held": batches,
                "bound_batches": prefetch + 2,
                "ratio": max(batches, 0.0) / (prefetch + 2),
            }
        )
    if len(held) >= 2:
        slope = float(np.polyfit([p for p, _ in held], [b for _, b in held], 1)[0])
        rows_out.append(
            {
                "what": "peak RSS growth per extra prefetch slot (batches)",
                "ratio": max(slope, 0.0),
                "bound_batches": 1,
            }
        )
    return rows_out


def rss_in_subprocess(prefetch: int, batch_mib: float, steps: int) -> dict[str, float]:
    """Runs `rss_child` in a fresh interpreter, so no two prefetch values share a peak."""
    # a fixed mmap threshold makes glibc return every freed batch-sized buffer to the OS at once,
    # so the peak counts the buffers alive, not what the allocator kept cached for reuse
    env = dict(
        os.environ,
        JAX_NUM_CPU_DEVICES=str(DEVICES),
        JAX_PLATFORMS="cpu",
        MALLOC_MMAP_THRESHOLD_=str(2**20),
    )
    code = (
        "import json; from psdp.tools.benchmarks.resume import rss_child; "
        f"print(json.dumps(rss_child({prefetch}, {batch_mib}, {steps})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the RSS subprocess for prefetch={prefetch} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class SyntheticRows:
    """Rows made on demand (a fresh buffer per read, like a real read); no table in memory.

    Examples:
        >>> SyntheticRows(num_rows=10, width=3)[np.array([7, 2])].tolist()
        [[7, 7, 7], [2, 2, 2]]
    """

    def __init__(self, num_rows: int, width: int):
        self.num_rows, self.width = num_rows, width

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        rows = np.empty((len(ids), self.width), np.int32)
        rows[:] = np.asarray(ids, np.int32)[:, None]
        return rows


def current_rss_mib() -> float:
    """This process's resident set size now, in MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss() -> bool:
    """Resets the kernel's peak RSS to the current RSS (Linux ``clear_refs``), if allowed.

    Without it the peak would include importing JAX, which is larger than a few batches.
    """
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def peak_rss_mib() -> float:
    """Peak RSS since the last `reset_peak_rss` (``VmHWM``), else since start (``ru_maxrss``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def wait_until_ready(iterator: Any, count: int, timeout_s: float = 10.0) -> None:
    """Waits until ``iterator.ready >= count`` (every slot of one read thread full: ``prefetch``
    waiting plus the one it read ahead), or ``timeout_s``.

    Examples:
        >>> class Full:
        ...     ready = 3
        >>> wait_until_ready(Full(), 3)
    """
    deadline = time.monotonic() + timeout_s
    while iterator.ready < count and time.monotonic() < deadline:
        time.sleep(0.001)


def rss_child(prefetch: int, batch_mib: float, steps: int) -> dict[str, float]:
    """In a fresh process: peak RSS above the idle loader while a slow trainer iterates.

    ``prefetch=0`` is the baseline: the same loader's ``batch_at`` called in the trainer's loop.
    """
    mesh = cpu_mesh((DEVICES,), ("data",))
    width = 4096
    batch = max(DEVICES, int(batch_mib * 2**20) // (width * 4) // DEVICES * DEVICES)
    loader = DataLoader(
        SyntheticRows(batch * 1000, width),  # whole batches: no padding, no mask leaf
        mesh=mesh,
        global_batch_size=batch,
        shuffle=False,
        prefetch=max(prefetch, 1),
        stall_warning_s=None,
    )
    warm = loader.batch_at(0)  # first-use allocations belong to the constant, not the batches
    del warm
    gc.collect()
    idle = current_rss_mib()
    reset = reset_peak_rss()
    with loader:
        batches: Iterator[Any]
        if prefetch == 0:
            batches = (loader.batch_at(step) for step in range(steps))
        else:
            batches = iter(loader)
        for step, batch_array in enumerate(batches):
            if prefetch:  # a slow trainer: the queue fills to its bound, however loaded the host
                wait_until_ready(batches, prefetch + 1)
            else:
                time.sleep(0.01)  # the baseline's trainer step
            del batch_array
            if step + 1 == steps:
                break
    peak = peak_rss_mib()
    return {
        "peak_reset": reset,
        "prefetch": prefetch,
        "batch_mib": batch * width * 4 / 2**20,
        "extra_mib": max(0.0, peak - idle),
    }
