"""What every figure shares: the sizes, the fake-CPU mesh, interleaved timing, and the shard
check run before any timing (``docs/performance.md``)."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

FIGURES = ("assembly", "throughput", "stall", "planning", "resume", "object_store")
DEVICES = 8


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; `FULL` for the real run, `QUICK` for CI.

    Example:
        >>> QUICK.batch, FULL.batch
        (16, 128)
    """

    assembly_mib: tuple[float, ...]
    """Host batch sizes of figure 1, in MiB."""
    assembly_width: int
    """int32 columns per row in figure 1."""
    repeats: int
    """Timed repeats of each path (figures 2 and 4 use a fraction of it)."""
    rows: int
    """Source rows of figures 2, 3 and 5."""
    width: int
    """int32 columns per source row of figures 2, 3 and 5."""
    batch: int
    """Global batch size of figures 2, 3 and 5."""
    steps: int
    """Batches per timed loop of figure 2."""
    train_ms: tuple[float, ...]
    """Simulated train step costs of figure 2."""
    stall_steps_ms: tuple[float, ...]
    """Simulated train step costs of figure 3."""
    stall_steps: int
    """Steps per stall run of figure 3."""
    read_latency_ms: float
    """Latency injected into every read of figure 3."""
    read_threads: int
    """The several-read-threads setting of figures 2 and 3."""
    prefetch: int
    """The loader's prefetch depth in figures 2 and 3."""
    pod: tuple[int, int, int]
    """Figure 4's pod: devices, hosts, model axis size."""
    rss_prefetch: tuple[int, ...]
    """The prefetch depths of figure 5's peak-RSS rows."""
    rss_batch_mib: float
    """Batch size of figure 5's peak-RSS rows, in MiB."""
    rss_steps: int
    """Steps the slow trainer takes in each peak-RSS subprocess."""


FULL = Sizes(
    assembly_mib=(4, 32),
    assembly_width=2048,
    repeats=20,
    rows=8192,
    width=2048,
    batch=128,
    steps=100,
    train_ms=(0, 2),
    stall_steps_ms=(5, 20, 100),
    stall_steps=100,
    read_latency_ms=10,
    read_threads=4,
    prefetch=2,
    pod=(65536, 16384, 256),
    rss_prefetch=(1, 2, 4, 8),
    rss_batch_mib=16,
    rss_steps=30,
)
QUICK = Sizes(
    assembly_mib=(0.0625, 0.25),
    assembly_width=256,
    repeats=2,
    rows=256,
    width=64,
    batch=16,
    steps=4,
    train_ms=(0, 1),
    stall_steps_ms=(5, 20, 100),
    stall_steps=4,
    read_latency_ms=10,
    read_threads=4,
    prefetch=2,
    pod=(256, 64, 8),
    rss_prefetch=(1, 2),
    rss_batch_mib=1,
    rss_steps=6,
)


def with_changes(sizes: Sizes, assignments: Sequence[str]) -> Sizes:
    """``sizes`` with ``FIELD=VALUE`` assignments (``psdp bench --set``); a tuple takes ``A,B,..``.

    Example:
        >>> changed = with_changes(QUICK, ["pod=64,16,8", "train_ms=0"])
        >>> changed.pod, changed.train_ms
        ((64, 16, 8), (0.0,))
    """
    types = {f.name: str(f.type) for f in fields(Sizes)}
    changes: dict[str, Any] = {}
    for text in assignments:
        name, _, value = (part.strip() for part in text.partition("="))
        if name not in types:
            raise ValueError(
                f"--set {text!r}: {name!r} is not a size; use FIELD=VALUE with a field among "
                f"{', '.join(types)}"
            )
        changes[name] = _parsed(text, value, types[name], getattr(sizes, name))
    return replace(sizes, **changes)


def _parsed(text: str, value: str, annotation: str, current: Any) -> Any:
    """``value`` as the field's type: an int >= 1, a float >= 0, or a tuple of them."""
    kind = float if "float" in annotation else int
    many = annotation.startswith("tuple")
    count = None if "..." in annotation else len(current) if many else 1  # None: any number
    try:
        parsed = tuple(kind(v) for v in value.split(","))
    except ValueError:
        parsed = ()
    minimum = 1 if kind is int else 0
    if not parsed or min(parsed) < minimum or count not in (None, len(parsed)):
        each = "an int >= 1" if kind is int else "a number >= 0"
        amount = {None: "comma-separated values", 1: "one value"}.get(
            count, f"{count} comma-separated values"
        )
        example = ",".join(map(str, current)) if many else str(current)
        name = text.partition("=")[0].strip()
        each = each if count == 1 else f"each {each}"
        raise ValueError(f"--set {text!r}: give {amount}, {each}, e.g. {name}={example}")
    return parsed if many else parsed[0]


def median_ms(action: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``action()`` over ``repeats`` calls, in ms.

    Example:
        >>> median_ms(lambda: None, 3) >= 0
        True
    """
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def interleaved_ms(actions: Mapping[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median ms of each action, timed round-robin (one of each per repeat) after one warm-up.

    Example:
        >>> sorted(interleaved_ms({"a": lambda: None, "b": lambda: None}, 2))
        ['a', 'b']
    """
    for action in actions.values():
        action()
    times: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the denominator is 0.

    Example:
        >>> ratio(3.0, 2.0), ratio(None, 2.0), ratio(1.0, 0.0)
        (1.5, None, None)
    """
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def cpu_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """A mesh of the first ``prod(shape)`` CPU devices (fake ones: ``JAX_NUM_CPU_DEVICES=8``).

    Example:
        >>> dict(cpu_mesh((4, 2), ("data", "model")).shape)
        {'data': 4, 'model': 2}
    """
    need = math.prod(shape)
    devices = jax.devices("cpu")
    if len(devices) < need:
        raise RuntimeError(
            f"the benchmark needs {need} CPU devices but JAX has {len(devices)}; run it with "
            f"JAX_NUM_CPU_DEVICES={need} (python scripts/bench.py sets it for you)"
        )
    return Mesh(np.array(devices[:need]).reshape(shape), names)


def ask_for_cpu_devices(count: int) -> None:
    """Asks JAX for ``count`` fake CPU devices, which works until its backend has started."""
    if int(jax.config.jax_num_cpu_devices) < count:  # type: ignore[attr-defined]
        # once the backend is up this raises; `cpu_mesh` then says what to do
        with contextlib.suppress(RuntimeError):
            jax.config.update("jax_num_cpu_devices", count)


def int32_table(rows: int, width: int) -> np.ndarray:
    """The benchmark's token table: ``rows x width`` random int32 values, the same every run.

    Example:
        >>> int32_table(4, 3).shape, int32_table(4, 3).dtype.name
        ((4, 3), 'int32')
    """
    return np.random.default_rng(0).integers(0, 50_000, (rows, width), dtype=np.int32)


def blocking(path: Callable[[], Any]) -> Callable[[], None]:
    """``path`` made to wait for its arrays, so a timing includes the copies it started."""
    return lambda: jax.block_until_ready(path())


def check_shards(array: jax.Array, expected: np.ndarray, what: str) -> None:
    """Raises unless every addressable shard of ``array`` holds exactly its box of ``expected``.

    Example:
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> host = int32_table(8, 2)
        >>> array = jax.device_put(host, NamedSharding(cpu_mesh((8,), ("data",)), P("data")))
        >>> check_shards(array, host, "device_put")
        >>> check_shards(array, host[::-1], "reversed")
        Traceback (most recent call last):
        ...
        AssertionError: reversed: device 0 holds the wrong rows
    """
    for shard in array.addressable_shards:
        if not np.array_equal(np.asarray(shard.data), expected[shard.index]):
            raise AssertionError(f"{what}: device {shard.device.id} holds the wrong rows")


def train_step(seconds: float) -> None:
    """A simulated train step of fixed cost; like XLA compute, a sleep frees the GIL."""
    if seconds:
        time.sleep(seconds)
