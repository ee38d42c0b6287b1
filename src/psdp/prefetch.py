"""A background thread that keeps the next few steps' items ready, in step order.

Mental model (Grain's prefetch iterator): one named daemon thread calls ``produce(step)`` for
consecutive steps and puts ``(step, item, error)`` into a bounded queue; the consumer takes them in
order. The queue bound is the prefetch depth, so the thread is always working on the next item
while ``depth`` finished ones wait (continuous, never in windows). An exception in ``produce`` travels
through the queue and is re-raised by the consumer with its original type and traceback, after
which the iterator is closed. ``close()`` sets a stop event, drains the queue (so a blocked ``put``
returns) and joins the thread. Both sides poll with a short timeout, so neither a full queue nor a
consumer that stopped reading can keep the thread alive, and a ``close()`` from another thread wakes
a blocked ``next()``. Nothing here knows about JAX or meshes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

_POLL_S = 0.02
_JOIN_TIMEOUT_S = 1.0


class LoaderClosedError(RuntimeError):
    """``next()`` was called on an iterator that was closed, or that already raised an error."""


class Prefetcher(Generic[T]):
    """Yields ``produce(start), produce(start + 1), ...`` computed ahead on a background thread.

    Args:
        produce: the per-step work; runs on the background thread only.
        start: the first step.
        depth: how many finished items may wait in the queue (>= 1).
        name: the thread's name (shows up in stack dumps and py-spy).
        observer: called on the consumer's thread after each successful ``next()`` with
            ``(step, seconds waited, items that were ready when next() was called)``.

    Example:
        >>> with Prefetcher(lambda step: step * step, start=3, depth=2, name="demo") as items:
        ...     [next(items) for _ in range(3)]
        [9, 16, 25]
    """

    def __init__(
        self,
        produce: Callable[[int], T],
        *,
        start: int,
        depth: int,
        name: str,
        observer: Callable[[int, float, int], None] | None = None,
    ):
        self._produce = produce
        self._observer = observer
        self._queue: queue.Queue[tuple[int, T | None, BaseException | None]] = queue.Queue(depth)
        self._stop = threading.Event()
        self._closed_because: str | None = None
        self.next_step = start
        self.last_wait_s = 0.0
        self._thread = threading.Thread(target=self._fill, args=(start,), name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------- background thread
    def _fill(self, step: int) -> None:
        while not self._stop.is_set():
            try:
                item: tuple[int, T | None, BaseException | None] = (step, self._produce(step), None)
            except BaseException as err:  # forwarded to the consumer, which re-raises it
                item = (step, None, err)
            if not self._put(item) or item[2] is not None:
                return
            step += 1

    def _put(self, item: tuple[int, T | None, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # ---------------------------------------------------------------------------- consumer
    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        started = time.perf_counter()
        ready = self._queue.qsize()
        while True:
            if self._closed_because is not None:
                raise LoaderClosedError(
                    f"this iterator is closed ({self._closed_because}); start a new one, e.g. "
                    f"loader.iter_from({self.next_step})"
                )
            try:
                step, value, error = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._close(f"its thread {self._thread.name!r} exited unexpectedly")
        self.last_wait_s = time.perf_counter() - started
        if error is not None:
            self._close(f"step {step} raised {type(error).__name__}")
            raise error
        self.next_step = step + 1
        if self._observer is not None:
            self._observer(step, self.last_wait_s, ready)
        return value  # type: ignore[return-value]

    # ---------------------------------------------------------------------------- shutdown
    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    def close(self) -> None:
        """Stops and joins the thread; idempotent and safe from any thread."""
        self._close("close() was called")

    def _close(self, reason: str) -> None:
        if self._closed_because is None:
            self._closed_because = reason
        self._stop.set()
        self._drain()  # so a blocked put returns
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
            self._drain()  # an item put just before the stop: free its buffers now
            if self._thread.is_alive():
                logger.warning(
                    "prefetch thread %r did not stop within %.1fs (a read is still running); it "
                    "is a daemon thread and will not keep the process alive",
                    self._thread.name,
                    _JOIN_TIMEOUT_S,
                )

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
