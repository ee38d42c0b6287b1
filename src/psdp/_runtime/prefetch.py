"""`Prefetcher`: background threads that keep the next few steps' items ready, delivered strictly
in step order; errors at their step; a bounded, prompt `close` (``docs/concepts/loader.md``, "Threads, errors
and shutdown"). Nothing here knows about JAX or meshes.

Every wait is on a condition, without a timeout, and every change that could end one notifies it
(a finished step, a freed slot, a failed step, ``close``, a crashed thread): nothing polls, so idle
threads sleep until there is work and never take the GIL from the trainer."""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from psdp._checks import check_int

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: How long ``close()`` waits for all threads together before it gives up on a stuck ``produce``.
JOIN_TIMEOUT_S = 1.0
#: The recent reads whose times decide how many steps are read at once (`steps_in_flight`),
#: and the steps the consumer takes at a number of threads before it may change.
TIMED_READS = 8
#: How much a growth of the read threads must raise the consumer's steps per second for the
#: prefetcher to grow them further (`Prefetcher.adapt`).
GAIN = 1.2


def steps_in_flight(read_s: float, read_cpu_s: float, step_s: float) -> int:
    """How many steps must be read at once for the trainer never to wait: a read takes
    ``read_s`` (wall), ``read_cpu_s`` of it on its own thread's CPU, and the trainer spends
    ``step_s`` between two ``next()`` calls. A new read must start every ``max(step_s,
    read_cpu_s)`` (reads cannot start faster than their own CPU work lets them finish, so a
    trainer faster than that gains nothing from more), so ``read_s`` over that are in flight,
    plus one for a read slower than the recent ones.

    Examples:
        >>> steps_in_flight(read_s=0.6, read_cpu_s=0.01, step_s=0.2)  # 100 ms round trips
        4
        >>> steps_in_flight(read_s=0.6, read_cpu_s=0.01, step_s=0.0)  # no trainer: CPU bound
        61
        >>> steps_in_flight(read_s=0.05, read_cpu_s=0.04, step_s=0.0)  # a local store
        3
    """
    return math.ceil(read_s / max(step_s, read_cpu_s, 1e-6)) + 1


class LoaderClosedError(RuntimeError):
    """``next()`` was called on an iterator that was closed, or that already raised an error."""


class Prefetcher(Generic[T]):
    """Yields ``produce(start), produce(start + 1), ...`` computed ahead on background threads.

    Args:
        produce: the per-step work; runs on the background threads only, so with
            ``read_threads > 1`` it must be thread-safe.
        start: the first step.
        depth: how many finished items may wait for the consumer (>= 1).
        name: the thread's name (shows up in stack dumps and py-spy); with several threads,
            thread ``i`` is named ``f"{name}-w{i}"``.
        observer: called on the consumer's thread after each successful ``next()`` with
            ``(step, seconds waited, items that were ready when next() was called)``.
        read_threads: threads producing consecutive steps concurrently (>= 1); items are still
            delivered in step order, and at most ``depth + read_threads`` exist at once.
        max_read_threads: ``None``: always ``read_threads``. Else more threads start, up to this
            many, when the consumer had to wait: as many as `steps_in_flight` says from the
            recent reads' times and the consumer's time between ``next()`` calls (`adapt`).

    Examples:
        >>> with Prefetcher(lambda step: step * step, start=3, depth=2, name="demo") as items:
        ...     [next(items) for _ in range(3)]
        [9, 16, 25]
        >>> with Prefetcher(lambda s: s, start=0, depth=2, name="demo", read_threads=4) as items:
        ...     [next(items) for _ in range(6)]
        [0, 1, 2, 3, 4, 5]
    """

    def __init__(
        self,
        produce: Callable[[int], T],
        *,
        start: int,
        depth: int,
        name: str,
        observer: Callable[[int, float, int], None] | None = None,
        read_threads: int = 1,
        max_read_threads: int | None = None,
    ):
        check_int("depth", depth, minimum=1)
        check_int("read_threads", read_threads, minimum=1)
        if max_read_threads is not None:
            check_int("max_read_threads", max_read_threads, minimum=read_threads)
        self._produce = produce
        self._observer = observer
        self.depth = depth
        self.read_threads = read_threads
        self.max_read_threads = max_read_threads
        self._name = name
        #: (wall, thread CPU) seconds of the recent reads, for `adapt`
        self._timed: deque[tuple[float, float]] = deque(maxlen=TIMED_READS)
        self._returned_at: float | None = None  # when next() last handed out an item
        self._rate_before: float | None = None  # steps/s before the last growth
        self._window: tuple[float, int] | None = None  # (since, steps) at the current threads
        # everything below is guarded by one lock, with two conditions on it so a step's result
        # wakes only the consumer and a freed slot wakes only one thread (no thundering herd of
        # threads all wanting the GIL right when the trainer does)
        self._lock = threading.Lock()
        self._result_ready = threading.Condition(self._lock)
        self._slot_free = threading.Condition(self._lock)
        self._results: dict[int, tuple[T | None, BaseException | None]] = {}
        self._next_claim = start
        self._failed = False
        self._stop = False
        self._closed_because: str | None = None
        self.next_step = start
        self.last_wait_s = 0.0
        names = [name] if read_threads == 1 else [f"{name}-w{i}" for i in range(read_threads)]
        self._threads: list[threading.Thread] = []
        self._start_threads(names)

    def _start_threads(self, names: list[str]) -> None:
        for name in names:
            thread = threading.Thread(target=self._work, name=name, daemon=True)
            try:
                thread.start()
            except BaseException:  # e.g. the OS refused a thread: stop the ones already started
                self._close(f"thread {thread.name!r} could not start")
                raise
            self._threads.append(thread)

    # ------------------------------------------------------------------ adaptive read threads
    def record_read(self, wall_s: float, cpu_s: float) -> None:
        """Records a read's wall and thread-CPU seconds (each thread does, after `produce`)."""
        with self._lock:
            self._timed.append((wall_s, cpu_s))

    def adapt(self, step_s: float, rate: float | None = None) -> int:
        """Starts threads up to `steps_in_flight` of the recent reads (the slowest tenth's wall
        time, the median CPU time) and a consumer ``step_s`` between ``next()`` calls: at most
        twice the running threads at a time, and at most ``max_read_threads``; never stops any.
        ``rate``: the steps per second the consumer got since the threads last changed. If the
        last growth did not raise it by `GAIN`, more threads would not help either (the reads
        wait on a busy CPU or server, not on latency): the threads stay as they are from then
        on. Returns the threads now running; a no-op for a prefetcher of fixed threads, or before
        any read was timed.

        Examples:
            >>> items = Prefetcher(lambda s: s, start=0, depth=2, name="demo", read_threads=2,
            ...                    max_read_threads=32)
            >>> def reads():  # 0.6 s reads, mostly waiting on storage
            ...     for _ in range(4):
            ...         items.record_read(0.6, 0.01)
            >>> reads(); items.adapt(step_s=0.2, rate=1.0)  # 4 in flight cover a 0.2 s step
            4
            >>> reads(); items.adapt(step_s=0.0, rate=1.9)  # no trainer step: doubled (it helped)
            8
            >>> reads(); items.adapt(step_s=0.0, rate=2.0), items.max_read_threads  # it did not
            (8, 8)
            >>> items.close()
        """
        with self._lock:
            if self.max_read_threads is None or not self._timed or self._stop:
                return self.read_threads
            before = self._rate_before
            if rate is not None and before is not None and rate < GAIN * before:
                self.max_read_threads = self.read_threads  # the last growth did not help
                return self.read_threads
            walls = sorted(wall for wall, _ in self._timed)
            slow = walls[min(len(walls) - 1, int(0.9 * len(walls)))]
            cpu = statistics.median(c for _, c in self._timed)
            wanted = min(
                self.max_read_threads, 2 * self.read_threads, steps_in_flight(slow, cpu, step_s)
            )
            first = self.read_threads
            if wanted <= first:
                return first
            self.read_threads, self._rate_before = wanted, rate
            self._timed.clear()  # the next decision reads times at the new concurrency
            self._slot_free.notify_all()  # the running threads may claim further ahead
        if first == 1:  # the one thread had the loader's name; its siblings are numbered
            first = len(self._threads)
        self._start_threads([f"{self._name}-w{i}" for i in range(first, wanted)])
        return wanted

    # -------------------------------------------------------------------- background threads
    def _may_claim(self) -> bool:
        bound = self.next_step + self.depth + self.read_threads
        return not self._failed and self._next_claim < bound

    def _work(self) -> None:
        try:
            self._produce_until_stopped()
        except BaseException as err:  # a bug here, not in produce (whose errors are forwarded)
            logger.exception("prefetch thread %r failed", threading.current_thread().name)
            with self._lock:  # close the iterator: the consumer must not wait for this thread
                if self._closed_because is None:
                    name = threading.current_thread().name
                    self._closed_because = (
                        f"its thread {name!r} failed: {type(err).__name__}: {err}"
                    )
                self._stop = True
                self._results.clear()
                self._result_ready.notify_all()
                self._slot_free.notify_all()

    def _produce_until_stopped(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._may_claim():
                    if self._failed:
                        return  # every step before the failed one is already claimed
                    self._slot_free.wait()  # woken by a consumed step, a failure or close
                if self._stop:
                    return
                step = self._next_claim
                self._next_claim += 1
            timed = self.max_read_threads is not None
            wall, cpu = (time.perf_counter(), time.thread_time()) if timed else (0.0, 0.0)
            try:
                item: tuple[T | None, BaseException | None] = (self._produce(step), None)
            except BaseException as err:  # forwarded to the consumer, which re-raises it
                item = (None, err)
            if timed:
                self.record_read(time.perf_counter() - wall, time.thread_time() - cpu)
            with self._lock:
                if self._stop:
                    return
                self._results[step] = item
                if item[1] is not None:
                    self._failed = True
                    self._slot_free.notify_all()  # idle threads exit instead of waiting
                if step == self.next_step:
                    self._result_ready.notify()
            del item  # the consumer owns it now; do not keep it alive while waiting

    def _adapt_after(self, step_s: float, waited: bool) -> None:
        """Counts a step at the current threads; when the consumer waited, `adapt` with their
        rate: at once before the first growth (the first reads, cold, are the slowest: waiting
        for `TIMED_READS` steps there is what start-up waits on), after `TIMED_READS` steps
        since a growth (the rate at the new threads, for `GAIN`)."""
        now = self._returned_at or 0.0
        since, steps = self._window or (now, 0)
        self._window = (since, steps + 1)
        counted = steps + 1 >= TIMED_READS or self._rate_before is None
        if waited and counted and now > since:
            threads = self.read_threads
            if self.adapt(step_s, (steps + 1) / (now - since)) != threads:
                self._window = (now, 0)

    # ---------------------------------------------------------------------------- consumer
    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        started = time.perf_counter()
        # the consumer's own time since the last item (its train step): what reads must cover
        step_s = None if self._returned_at is None else started - self._returned_at
        with self._lock:
            ready = self._ready()
            while True:
                if self._closed_because is not None:
                    raise LoaderClosedError(
                        f"this iterator is closed ({self._closed_because}); start a new one, "
                        f"e.g. loader.iter_from({self.next_step})"
                    )
                step = self.next_step
                if step in self._results:
                    value, error = self._results.pop(step)
                    break
                self._result_ready.wait()  # woken by this step, a failure, or close
            if error is None:
                self.next_step = step + 1
                self._slot_free.notify()  # one thread may claim the next step now
        self.last_wait_s = time.perf_counter() - started
        self._returned_at = started + self.last_wait_s
        if error is not None:
            self._close(f"step {step} raised {type(error).__name__}")
            raise error
        if self.max_read_threads is not None and step_s is None:
            self._window = (self._returned_at, 0)  # the consumer's steps count from its first
        elif self.max_read_threads is not None and step_s is not None:
            self._adapt_after(step_s, waited=not ready)
        if self._observer is not None:
            self._observer(step, self.last_wait_s, ready)
        return value  # type: ignore[return-value]

    @property
    def ready(self) -> int:
        """Finished items ``next()`` can take now without waiting (consecutive from `next_step`).

        Examples:
            >>> items = Prefetcher(lambda step: step, start=0, depth=2, name="demo")
            >>> items.close()
            >>> items.ready  # close() dropped whatever was finished
            0
        """
        with self._lock:
            return self._ready()

    def _ready(self) -> int:
        """`ready`, with the lock held."""
        count = 0
        while self.next_step + count in self._results:
            count += 1
        return count

    # ---------------------------------------------------------------------------- shutdown
    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    def close(self) -> None:
        """Stops and joins the threads (at most `JOIN_TIMEOUT_S` in all); idempotent, from any
        thread."""
        self._close("close() was called")

    def _close(self, reason: str) -> None:
        with self._lock:
            if self._closed_because is None:
                self._closed_because = reason
            self._stop = True
            self._results.clear()  # free finished items' buffers now
            self._result_ready.notify_all()
            self._slot_free.notify_all()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        me = threading.current_thread()
        for thread in self._threads:
            if thread is not me:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t is not me and t.is_alive()]
        if stuck:
            logger.warning(
                "prefetch threads %s did not stop within %.1fs (a read is still running); they "
                "are daemon threads, will drop their result, and will not keep the process alive",
                stuck,
                JOIN_TIMEOUT_S,
            )

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
