"""What every figure shares: the sizes, the fake-CPU mesh, interleaved timing, and the shard
check run before any timing (``docs/measurements/performance.md``)."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

FIGURES = (
    "assembly",
    "throughput",
    "stall",
    "planning",
    "resume",
    "multihost",
    "object_store",
    "tokens",
    "object_tokens",
)
DEVICES = 8


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; `FULL` for the real run, `QUICK` for CI.

    Examples:
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
    """Batches per timed segment of figure 2 (after the warm-up of `warmup_steps`)."""
    warmup_steps: int
    """Untimed batches before each timed segment of figures 2 and 6: more than any loop reads
    ahead (Grain's ``experimental.device_put`` holds up to prefetch + threads + 6), so every
    segment starts with its buffers drained, in the steady state."""
    train_ms: tuple[float, ...]
    """Simulated train step costs of figure 2."""
    stall_steps_ms: tuple[float, ...]
    """Simulated train step costs of figure 3."""
    stall_steps: int
    """Steps per stall run of figure 3."""
    read_latency_ms: float
    """Latency injected into every read of figure 3."""
    read_threads: tuple[int, ...]
    """psdp's read threads in figures 2, 3 and 6 (and Grain's, in figure 2)."""
    grain_workers: int
    """Worker processes of figure 2's ``grain.DataLoader`` row (0: no such row)."""
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
    pod_batch: int
    """Global batch of figure 6 (the 4-host pod)."""
    pod_steps: int
    """Batches per timed segment of figure 6."""
    pod_read_ms: tuple[float, ...]
    """Latency injected into every read of figure 6."""
    token_documents: int
    """Documents of figure 8's store (its mixture's second store has half as many)."""
    token_mean_length: int
    """Mean tokens of figure 8's documents (log-normal lengths, at most `token_seq_len`)."""
    token_seq_len: int
    """Tokens per row in figure 8."""
    token_batch: int
    """Rows per step in figure 8 (a multiple of 4, for the 3:1 mixture)."""
    token_steps: int
    """Batches per timed turn of figure 8 (after `warmup_steps`)."""
    object_token_documents: int
    """Documents of figure 9's first store (its mixture's second store has half as many)."""
    object_token_latency_ms: tuple[float, ...]
    """Latency the proxy adds to every request of figure 9."""
    object_token_seq_len: int
    """Tokens per row in figure 9."""
    object_token_batch: int
    """Rows per step in figure 9 (a multiple of 4, for the 3:1 mixture)."""
    object_token_steps: int
    """Steps counted, and steps timed, per setting of figure 9."""
    object_token_stall_steps: int
    """Steps per stall run of figure 9."""


FULL = Sizes(
    assembly_mib=(4, 32),
    assembly_width=2048,
    repeats=20,
    rows=8192,
    width=2048,
    batch=128,
    steps=100,
    warmup_steps=16,
    train_ms=(0, 2),
    stall_steps_ms=(5, 20, 100),
    stall_steps=100,
    read_latency_ms=10,
    read_threads=(1, 2, 4),
    grain_workers=2,
    prefetch=2,
    pod=(65536, 16384, 256),
    rss_prefetch=(1, 2, 4, 8),
    rss_batch_mib=16,
    rss_steps=30,
    pod_batch=128,
    pod_steps=30,
    pod_read_ms=(0, 10),
    token_documents=200_000,
    token_mean_length=300,
    token_seq_len=2048,
    token_batch=64,
    token_steps=20,
    object_token_documents=8000,
    object_token_latency_ms=(20, 50, 100),
    object_token_seq_len=2048,
    object_token_batch=16,
    object_token_steps=20,
    object_token_stall_steps=40,
)
QUICK = Sizes(
    assembly_mib=(0.0625, 0.25),
    assembly_width=256,
    repeats=2,
    rows=256,
    width=64,
    batch=16,
    steps=4,
    warmup_steps=12,
    train_ms=(0, 1),
    stall_steps_ms=(5, 20, 100),
    stall_steps=4,
    read_latency_ms=10,
    read_threads=(1, 2),
    grain_workers=1,
    prefetch=2,
    pod=(256, 64, 8),
    rss_prefetch=(1, 2),
    rss_batch_mib=1,
    rss_steps=6,
    pod_batch=16,
    pod_steps=2,
    pod_read_ms=(0, 10),
    token_documents=600,
    token_mean_length=24,
    token_seq_len=128,
    token_batch=16,
    token_steps=2,
    object_token_documents=400,
    object_token_latency_ms=(20,),
    object_token_seq_len=256,
    object_token_batch=8,
    object_token_steps=2,
    object_token_stall_steps=3,
)


def with_changes(sizes: Sizes, assignments: Sequence[str]) -> Sizes:
    """``sizes`` with ``FIELD=VALUE`` assignments (``psdp bench --set``); a tuple takes ``A,B,..``.

    Examples:
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

    Examples:
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

    Examples:
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

    Examples:
        >>> ratio(3.0, 2.0), ratio(None, 2.0), ratio(1.0, 0.0)
        (1.5, None, None)
    """
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def cpu_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """A mesh of the first ``prod(shape)`` CPU devices (fake ones: ``JAX_NUM_CPU_DEVICES=8``).

    Examples:
        >>> dict(cpu_mesh((4, 2), ("data", "model")).shape)
        {'data': 4, 'model': 2}
    """
    need = math.prod(shape)
    devices = jax.devices("cpu")
    if len(devices) < need:
        raise RuntimeError(
            f"the benchmark needs {need} CPU devices but JAX has {len(devices)}; run it with "
            f"JAX_NUM_CPU_DEVICES={need} (psdp bench sets it for you)"
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

    Examples:
        >>> int32_table(4, 3).shape, int32_table(4, 3).dtype.name
        ((4, 3), 'int32')
    """
    return np.random.default_rng(0).integers(0, 50_000, (rows, width), dtype=np.int32)


def blocking(path: Callable[[], Any]) -> Callable[[], None]:
    """``path`` made to wait for its arrays, so a timing includes the copies it started."""
    return lambda: jax.block_until_ready(path())


def check_shards(array: jax.Array, expected: np.ndarray, what: str) -> None:
    """Raises unless every addressable shard of ``array`` holds exactly its box of ``expected``.

    Examples:
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


class BatchIds:
    """A user's shuffle: a numpy permutation per epoch, each step's ids sorted (a sorted gather,
    and a store's sorted reads, are faster); random access by step and picklable, so a Grain
    ``MapDataset`` or worker process can read any step.

    Examples:
        >>> ids = BatchIds(num_rows=8, batch=4, seed=3)
        >>> epoch = np.concatenate([ids(0), ids(1)])
        >>> sorted(epoch.tolist()) == list(range(8)), bool((np.diff(ids(0)) > 0).all())
        (True, True)
        >>> ids(2).tolist() != ids(0).tolist()  # a new permutation each epoch
        True
    """

    def __init__(self, num_rows: int, batch: int, seed: int = 1):
        self.num_rows, self.batch, self.seed = num_rows, batch, seed
        self.per_epoch = num_rows // batch
        self._last: tuple[int, np.ndarray] | None = None  # the epoch in use and its permutation

    def __call__(self, step: int) -> np.ndarray:
        epoch, index = divmod(step, self.per_epoch)
        start = index * self.batch
        return np.sort(self._permutation(epoch)[start : start + self.batch])

    def _permutation(self, epoch: int) -> np.ndarray:
        last = self._last  # one read: other threads may replace it meanwhile
        if last is None or last[0] != epoch:
            last = self._last = (
                epoch,
                np.random.default_rng((self.seed, epoch)).permutation(self.num_rows),
            )
        return last[1]


def check_batches(
    batches: Iterator[jax.Array], ids: Callable[[int], np.ndarray], table: np.ndarray, what: str
) -> None:
    """Raises unless the first two batches of ``batches`` hold exactly ``table[ids(step)]`` on
    every addressable device (the second shows that the loop moves on to the next step)."""
    for step in range(2):
        check_shards(next(batches), table[ids(step)], f"{what}, step {step}")


def settle(window_s: float = 0.05, limit_s: float = 10.0) -> float:
    """Waits until this process spends under a tenth of a core for ``window_s`` (at most
    ``limit_s``), and returns the seconds waited: after a loop's turn, the loops that read ahead
    refill their buffers on their own threads, and the next turn must not pay for that.

    Examples:
        >>> settle() >= 0
        True
    """
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        cpu = time.process_time()
        time.sleep(window_s)
        if time.process_time() - cpu < window_s / 10:
            break
    return time.monotonic() - start


def timed_ms(batches: Iterator[Any], warmup: int, steps: int, train_s: float) -> float:
    """Milliseconds per batch over ``steps`` batches taken after ``warmup`` untimed ones, each
    waited for and followed by a train step of ``train_s``.

    The warm-up drains what a loader read ahead while others were timed, so each segment starts
    in the steady state.

    Examples:
        >>> timed_ms(iter(range(10)), warmup=2, steps=3, train_s=0) >= 0
        True
    """
    for _ in range(warmup):
        jax.block_until_ready(next(batches))
        train_step(train_s)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(batches))
        train_step(train_s)
    return (time.perf_counter() - start) / steps * 1e3
