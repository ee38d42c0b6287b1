"""Prefetcher: step order, bounded backlog, errors at their step, and prompt shutdown, for 1..N
read threads, observed through its public behaviour: what ``produce`` is called with, what
``next()`` returns or raises, ``ready``, and the threads it names.

Timing is only ever used to provoke interleavings (random sleeps), never asserted as a threshold.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
import weakref
from typing import ClassVar

import pytest

from psdp._runtime import prefetch as prefetch_module
from psdp._runtime.prefetch import LoaderClosedError, Prefetcher

READ_THREADS = [1, 2, 4]


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def threads_of(name: str) -> list[threading.Thread]:
    """The live threads of the prefetcher called ``name`` (``name``, or ``name-w0``, ``name-w1``...)."""
    return [t for t in threading.enumerate() if t.name == name or t.name.startswith(f"{name}-w")]


@pytest.mark.parametrize("read_threads", READ_THREADS)
@pytest.mark.parametrize("depth", [1, 3])
def test_items_come_in_step_order_under_random_produce_delays(read_threads, depth):
    rng = random.Random(read_threads * 10 + depth)
    delays = [rng.uniform(0, 0.004) for _ in range(200)]

    def produce(step):
        time.sleep(delays[step % len(delays)])  # later steps often finish first
        return ("item", step)

    with Prefetcher(
        produce, start=7, depth=depth, name="order", read_threads=read_threads
    ) as items:
        got = [next(items) for _ in range(60)]
        assert items.next_step == 67
    assert got == [("item", s) for s in range(7, 67)]


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_produce_is_called_once_per_step_and_never_skips(read_threads):
    calls: list[int] = []
    lock = threading.Lock()

    def produce(step):
        with lock:
            calls.append(step)
        time.sleep(random.uniform(0, 0.002))
        return step

    items = Prefetcher(produce, start=0, depth=2, name="once", read_threads=read_threads)
    assert [next(items) for _ in range(30)] == list(range(30))
    items.close()
    # claimed steps are consecutive and unique; at most depth + read_threads beyond the consumer
    assert sorted(calls) == list(range(len(calls)))
    assert 30 <= len(calls) <= 30 + 2 + read_threads


@pytest.mark.parametrize("read_threads", READ_THREADS)
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_backlog_is_bounded_by_depth_plus_read_threads(read_threads, depth):
    started: list[int] = []
    lock = threading.Lock()

    def produce(step):
        with lock:
            started.append(step)
        return step

    with Prefetcher(
        produce, start=0, depth=depth, name="bound", read_threads=read_threads
    ) as items:
        # nobody consumes: the threads fill up to the bound, then stop claiming
        wait_until(lambda: len(started) >= depth + read_threads)
        time.sleep(0.05)
        assert sorted(started) == list(range(depth + read_threads))
        assert items.ready == depth + read_threads  # all of them finished
        # consuming one frees exactly one slot
        assert next(items) == 0
        wait_until(lambda: len(started) >= depth + read_threads + 1)
        time.sleep(0.05)
        assert len(started) == depth + read_threads + 1


def test_one_read_thread_keeps_depth_ready_plus_one_in_flight():
    """read_threads=1 is the classic one thread + queue of ``depth``: depth + 1 produced ahead."""
    started: list[int] = []
    with Prefetcher(started.append, start=5, depth=3, name="classic") as items:
        wait_until(lambda: len(started) >= 4)
        time.sleep(0.05)
        assert started == [5, 6, 7, 8]
        assert [t.name for t in threads_of("classic")] == ["classic"]
        assert items.ready == 4


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_error_surfaces_at_its_step_with_the_original_traceback(read_threads):
    def produce(step):
        time.sleep(random.uniform(0, 0.003))
        if step == 5:
            raise KeyError(f"bad row in step {step}")
        return step

    items = Prefetcher(produce, start=0, depth=2, name="err", read_threads=read_threads)
    assert [next(items) for _ in range(5)] == [0, 1, 2, 3, 4]  # steps before k are all delivered
    with pytest.raises(KeyError, match="bad row in step 5") as info:
        next(items)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "produce" in frames  # raised where it happened, on the worker
    assert items.closed
    with pytest.raises(LoaderClosedError, match=r"step 5 raised KeyError.*iter_from\(5\)"):
        next(items)
    assert threads_of("err") == []


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_error_in_the_first_step(read_threads):
    def produce(step):
        raise ValueError("cannot open")

    items = Prefetcher(produce, start=3, depth=2, name="err0", read_threads=read_threads)
    with pytest.raises(ValueError, match="cannot open"):
        next(items)
    assert items.closed


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_close_from_another_thread_wakes_a_blocked_next(read_threads):
    release = threading.Event()

    def produce(step):
        if step >= 2:
            release.wait(5)  # a read that hangs until the test ends
        return step

    items = Prefetcher(produce, start=0, depth=2, name="wake", read_threads=read_threads)
    assert [next(items), next(items)] == [0, 1]
    outcome: list[BaseException] = []

    def consume():
        try:
            next(items)
        except BaseException as err:
            outcome.append(err)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.05)  # the consumer is now blocked waiting for step 2
    closer = threading.Thread(target=items.close)
    closer.start()
    consumer.join(timeout=3)
    assert not consumer.is_alive()
    assert isinstance(outcome[0], LoaderClosedError)
    assert "close() was called" in str(outcome[0])
    release.set()
    closer.join(timeout=3)
    wait_until(lambda: threads_of("wake") == [])


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_close_returns_within_the_bound_when_produce_is_blocked(read_threads, monkeypatch, caplog):
    monkeypatch.setattr(prefetch_module, "JOIN_TIMEOUT_S", 0.2)
    release = threading.Event()
    entered = threading.Semaphore(0)

    def produce(step):
        entered.release()
        release.wait(10)
        return step

    items = Prefetcher(produce, start=0, depth=1, name="stuck", read_threads=read_threads)
    for _ in range(read_threads):  # every thread is inside produce, stuck
        assert entered.acquire(timeout=5)
    started = time.monotonic()
    items.close()
    elapsed = time.monotonic() - started
    # generous: the bound is shared by all threads, not paid once per thread
    assert elapsed < 0.2 + 2.0
    assert "did not stop" in caplog.text
    release.set()  # the stuck reads finish; their results are dropped and the threads exit
    wait_until(lambda: threads_of("stuck") == [])
    with pytest.raises(LoaderClosedError):
        next(items)


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_thread_count_returns_to_baseline(read_threads):
    baseline = threading.active_count()
    for round_ in range(3):
        items = Prefetcher(
            lambda s: s, start=0, depth=2, name=f"count{round_}", read_threads=read_threads
        )
        assert len(threads_of(f"count{round_}")) == read_threads
        assert [next(items) for _ in range(4)] == [0, 1, 2, 3]
        items.close()
        assert threads_of(f"count{round_}") == []
    assert threading.active_count() == baseline


class Buffer:
    """A produced item that can be watched for being freed (a weak reference to it)."""

    def __init__(self) -> None:
        self.data = bytearray(10)


def test_close_is_idempotent_and_drops_finished_items():
    produced: list[weakref.ref] = []

    def produce(step):
        item = Buffer()
        produced.append(weakref.ref(item))
        return item

    items = Prefetcher(produce, start=0, depth=3, name="idem", read_threads=2)
    wait_until(lambda: items.ready == 5)
    items.close()
    items.close()
    assert items.ready == 0
    assert len(produced) == 5 and all(ref() is None for ref in produced)  # no buffer kept alive
    assert items.closed


class SteppedClock:
    """``perf_counter`` that returns the given readings in turn (the prefetcher reads it twice per
    ``next()``: before and after taking an item)."""

    def __init__(self, *readings: float):
        self.readings = list(readings)

    def perf_counter(self) -> float:
        return self.readings.pop(0)

    def __getattr__(self, name):  # everything else from the real module
        return getattr(time, name)


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_observer_sees_each_step_its_wait_and_ready_count(read_threads, monkeypatch):
    monkeypatch.setattr(prefetch_module, "time", SteppedClock(10.0, 10.25, 20.0, 20.75))
    seen: list[tuple[int, float, int]] = []
    with Prefetcher(
        lambda s: s,
        start=2,
        depth=2,
        name="obs",
        read_threads=read_threads,
        observer=lambda *a: seen.append(a),
    ) as items:
        next(items)
        wait_until(lambda: items.ready == 2 + read_threads)
        next(items)
    assert [s for s, _, _ in seen] == [2, 3]
    assert [wait for _, wait, _ in seen] == [0.25, 0.75]  # its own clock, read around each next()
    assert seen[1][2] == 2 + read_threads  # every produced step was ready when asked for


def test_parallel_read_threads_overlap_slow_produce_calls():
    """Four read threads run four produce calls at once: each call waits at a barrier of four, which
    opens only when all four are inside (it breaks after 10 s, a hang guard, not a threshold)."""
    active = 0
    peak = 0
    lock = threading.Lock()
    together = threading.Barrier(4, timeout=10)

    def produce(step):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        together.wait()
        with lock:
            active -= 1
        return step

    with Prefetcher(produce, start=0, depth=4, name="overlap", read_threads=4) as items:
        assert [next(items) for _ in range(8)] == list(range(8))
    assert peak == 4


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"depth": 0}, ValueError, "depth must be >= 1, got 0"),
        ({"read_threads": 0}, ValueError, "read_threads must be >= 1, got 0"),
        ({"read_threads": 2.0}, TypeError, "read_threads must be an int"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    options = {"start": 0, "depth": 2, "name": "bad", **kwargs}
    with pytest.raises(error, match=match):
        Prefetcher(lambda s: s, **options)


# ------------------------------------------------------------ notification instead of polling
class RecordedCondition(threading.Condition):
    """A condition that records the timeout of every ``wait`` (``None``: until notified)."""

    timeouts: ClassVar[list[float | None]] = []

    def wait(self, timeout=None):
        RecordedCondition.timeouts.append(timeout)
        return super().wait(timeout)


class ThreadingWithRecordedConditions:
    """The ``threading`` module as the prefetcher sees it, its conditions recorded."""

    Condition = RecordedCondition

    def __getattr__(self, name):
        return getattr(threading, name)


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_idle_threads_and_a_waiting_next_wait_until_notified_never_polling(
    read_threads, monkeypatch
):
    """Every wait has no timeout (an idle thread that wakes on a timer takes the GIL from the
    trainer), yet every wait ends: a full queue, a slow step, an error and ``close``."""
    monkeypatch.setattr(prefetch_module, "threading", ThreadingWithRecordedConditions())
    RecordedCondition.timeouts = []
    release = threading.Event()

    def produce(step):
        if step == 3:
            release.wait(10)  # next() waits for this step while the other threads sit idle
        if step == 6:
            raise KeyError("bad row")
        return step

    items = Prefetcher(produce, start=0, depth=2, name="notify", read_threads=read_threads)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    threading.Timer(0.05, release.set).start()
    assert [next(items) for _ in range(3)] == [3, 4, 5]
    with pytest.raises(KeyError, match="bad row"):
        next(items)
    wait_until(lambda: threads_of("notify") == [])
    assert RecordedCondition.timeouts, "the prefetcher waited on its conditions"
    assert set(RecordedCondition.timeouts) == {None}


class CrashingPrefetcher(Prefetcher):
    """A prefetcher whose first thread fails outside ``produce`` (a bug in the prefetcher itself,
    which ``produce``'s error handling does not cover)."""

    def _produce_until_stopped(self) -> None:
        if threading.current_thread().name in ("crash", "crash-w0"):
            raise RuntimeError("bug in the prefetcher")
        super()._produce_until_stopped()


def next_or_hang_guard(items) -> BaseException | object:
    """``next(items)`` on another thread: its item or exception (a hang fails the test at 10 s)."""
    outcome: list = []

    def take():
        try:
            outcome.append(next(items))
        except BaseException as err:
            outcome.append(err)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(timeout=10)
    assert outcome, "next() never returned"
    return outcome[0]


@pytest.mark.parametrize("read_threads", READ_THREADS)
def test_a_thread_that_crashes_closes_the_iterator_instead_of_leaving_next_waiting(
    read_threads, caplog
):
    holder: list[Prefetcher] = []

    def produce(step):  # the other threads produce only once the crash has closed the iterator
        wait_until(lambda: bool(holder) and holder[0].closed)
        return step

    items = CrashingPrefetcher(produce, start=0, depth=2, name="crash", read_threads=read_threads)
    holder.append(items)
    outcome = next_or_hang_guard(items)
    assert isinstance(outcome, LoaderClosedError), outcome
    assert "thread 'crash" in str(outcome) and "RuntimeError: bug in the prefetcher" in str(outcome)
    assert "prefetch thread" in caplog.text and "bug in the prefetcher" in caplog.text
    wait_until(lambda: threads_of("crash") == [])  # the others stopped by themselves
    items.close()


def test_a_thread_that_cannot_start_stops_the_ones_already_started(monkeypatch):
    start = threading.Thread.start

    def refuse_the_third(thread):
        if thread.name == "nostart-w2":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse_the_third)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        Prefetcher(lambda s: s, start=0, depth=2, name="nostart", read_threads=4)
    assert threads_of("nostart") == []  # w0 and w1 were joined, w3 never started
