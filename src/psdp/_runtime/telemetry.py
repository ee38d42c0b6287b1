"""Stall telemetry: is the loader the bottleneck? (``docs/guides/tuning.md``).

Reader threads call ``record_read``, the trainer ``record_next``; one lock guards every append and
every snapshot. The verdict rests on the trainer's wait, never on read times alone: with ``N``
reader threads a read may take up to ``N`` trainer steps without a stall.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from psdp._checks import check_int

logger = logging.getLogger("psdp")

#: A trainer waiting more than this share of its time in ``next()`` is loader-bound.
BOTTLENECK_WAIT_FRACTION = 0.05


@dataclass(frozen=True)
class LoaderStats:
    """A summary of the last ``window`` steps; ``str()`` gives a one-line verdict.

    Times are milliseconds. ``wait_fraction`` is the share of the trainer's time between batches
    spent blocked in ``next()``; ``bottleneck`` is true when it exceeds 5%.
    """

    steps_read: int
    steps_consumed: int
    wait_ms_p50: float
    wait_ms_p99: float
    wait_ms_max: float
    wait_fraction: float
    step_ms_p50: float
    read_ms_p50: float
    read_ms_p99: float
    assemble_ms_p50: float
    assemble_ms_p99: float
    queue_depth_mean: float
    bottleneck: bool
    retried_reads: int = 0
    """Reads psdp tried again after a transient error (``read_attempts``), since the start."""
    store_requests_per_step: float = 0.0
    """Object-store HTTP requests per step read (TensorStore's process-wide count: exact when
    this loader is the process's only reader), since the start; 0 for local files."""
    store_retries: int = 0
    """Requests TensorStore itself retried (process-wide), since the start."""

    def __str__(self) -> str:
        verdict = (
            "the loader IS the bottleneck"
            if self.bottleneck
            else "the loader is not the bottleneck"
        )
        if self.steps_consumed < 2:  # no interval between two batches yet: nothing to compare
            verdict = f"too few steps to judge ({self.steps_consumed} batch taken)"
        return (
            f"{verdict}: the trainer waited {self.wait_fraction:.1%} of its time "
            f"(wait p50 {self.wait_ms_p50:.2f} ms, p99 {self.wait_ms_p99:.2f} ms, "
            f"max {self.wait_ms_max:.2f} ms); per batch: read p50 {self.read_ms_p50:.2f} ms, "
            f"assemble p50 {self.assemble_ms_p50:.2f} ms, trainer step p50 "
            f"{self.step_ms_p50:.2f} ms; {self.queue_depth_mean:.1f} batches ready on average"
            + self._store_text()
            + (f"; {self.advice()}" if self.bottleneck else "")
        )

    def _store_text(self) -> str:
        parts = []
        if self.store_requests_per_step:
            parts.append(f"{self.store_requests_per_step:.1f} store requests per step")
        if self.store_retries:
            parts.append(f"{self.store_retries} requests retried by the store")
        if self.retried_reads:
            parts.append(f"{self.retried_reads} reads retried by psdp")
        return "".join(f"; {part}" for part in parts)

    def advice(self) -> str:
        """Which half of the loader to speed up, from the read and assembly times.

        Examples:
            >>> LoaderStats(10, 10, 9.0, 12.0, 12.0, 0.4, 20.0, 25.0, 30.0, 1.0, 1.5, 0.0, True).advice()
            'reads dominate (25.00 ms vs 1.00 ms assembly): raise read_threads, or use a faster layout'
        """
        if self.read_ms_p50 >= self.assemble_ms_p50:
            return (
                f"reads dominate ({self.read_ms_p50:.2f} ms vs {self.assemble_ms_p50:.2f} ms "
                "assembly): raise read_threads, or use a faster layout"
            )
        return (
            f"assembly dominates ({self.assemble_ms_p50:.2f} ms vs {self.read_ms_p50:.2f} ms "
            "read): raise read_threads so batches assemble in parallel"
        )


class Telemetry:
    """Collects per-step timings from the reader threads and the trainer; summarised by `stats`.

    Args:
        window: how many recent steps the figures cover.
        stall_warning_s: log a warning (with the figures) when one ``next()`` waits longer than
            this; ``None`` disables it.

    Examples:
        >>> t = Telemetry(stall_warning_s=None)
        >>> t.record_read(0.004, 0.001)
        >>> t.record_next(step=0, wait_s=0.0, depth=2)
        >>> s = t.stats()
        >>> s.steps_read, s.steps_consumed, s.read_ms_p50, s.bottleneck
        (1, 1, 4.0, False)
    """

    def __init__(self, window: int = 1000, stall_warning_s: float | None = 1.0):
        check_int("window", window, minimum=1)
        if stall_warning_s is not None and (
            isinstance(stall_warning_s, bool)
            or not isinstance(stall_warning_s, int | float)
            or not stall_warning_s > 0
        ):
            raise ValueError(
                f"stall_warning_s must be a positive number of seconds or None (no warning), got "
                f"{stall_warning_s!r}"
            )
        self._lock = threading.Lock()
        self._read: deque[float] = deque(maxlen=window)
        self._assemble: deque[float] = deque(maxlen=window)
        self._wait: deque[float] = deque(maxlen=window)
        self._interval: deque[float] = deque(maxlen=window)
        self._depth: deque[int] = deque(maxlen=window)
        self._steps_read = 0
        self._steps_consumed = 0
        self._last_return: float | None = None
        self._retried_reads = 0
        self._store_counts = (0, 0)
        self.stall_warning_s = stall_warning_s

    def record_read(self, read_s: float, assemble_s: float) -> None:
        """Called by each reader thread once per produced step; safe from several threads."""
        with self._lock:
            self._read.append(read_s)
            self._assemble.append(assemble_s)
            self._steps_read += 1

    def record_retry(self) -> None:
        """Called by a reader thread each time it tries a failed read again."""
        with self._lock:
            self._retried_reads += 1

    def record_store_counts(self, requests: int, retries: int) -> None:
        """Called after a step's reads with the store's ``(requests, retries)`` since the loader
        started; reader threads may report out of order, so the largest counts win."""
        with self._lock:
            old = self._store_counts
            self._store_counts = (max(old[0], requests), max(old[1], retries))

    def record_next(self, step: int, wait_s: float, depth: int) -> None:
        """Called by the trainer's ``next()`` once per consumed step."""
        now = time.perf_counter()
        with self._lock:
            self._wait.append(wait_s)
            self._depth.append(depth)
            if self._last_return is not None:
                self._interval.append(now - self._last_return)
            self._last_return = now
            self._steps_consumed += 1
        if self.stall_warning_s is not None and wait_s > self.stall_warning_s:
            logger.warning(
                "psdp: the trainer waited %.2f s for step %d (threshold %.2f s); %s",
                wait_s,
                step,
                self.stall_warning_s,
                self.stats(),
            )

    def stats(self) -> LoaderStats:
        with self._lock:
            wait = np.array(self._wait, float) * 1e3
            interval = np.array(self._interval, float) * 1e3
            read = np.array(self._read, float) * 1e3
            assemble = np.array(self._assemble, float) * 1e3
            depth = np.array(self._depth, float)
            steps_read, steps_consumed = self._steps_read, self._steps_consumed
            retried, (requests, store_retries) = self._retried_reads, self._store_counts
        # the first wait has no interval before it (start-up), so compare like with like
        waits_in_intervals = wait[-len(interval) :] if len(interval) else wait[:0]
        spent_waiting = waits_in_intervals.sum()
        fraction = float(spent_waiting / interval.sum()) if interval.sum() > 0 else 0.0
        trainer_ms = interval - waits_in_intervals  # the trainer's own time between batches
        return LoaderStats(
            steps_read=steps_read,
            steps_consumed=steps_consumed,
            wait_ms_p50=_pct(wait, 50),
            wait_ms_p99=_pct(wait, 99),
            wait_ms_max=float(wait.max()) if wait.size else 0.0,
            wait_fraction=fraction,
            step_ms_p50=_pct(trainer_ms, 50),
            read_ms_p50=_pct(read, 50),
            read_ms_p99=_pct(read, 99),
            assemble_ms_p50=_pct(assemble, 50),
            assemble_ms_p99=_pct(assemble, 99),
            queue_depth_mean=float(depth.mean()) if depth.size else 0.0,
            bottleneck=fraction > BOTTLENECK_WAIT_FRACTION,
            retried_reads=retried,
            store_requests_per_step=requests / steps_read if steps_read else 0.0,
            store_retries=store_retries,
        )


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0
