"""Where `prepare`'s tasks run: an `Engine` maps a function over tasks and yields the results as
they finish, in any order (the manifest puts parts in input order, so the order never shows in
the store). `LocalEngine` runs worker processes on this machine; ``engine="ray"`` runs the same
tasks on a Ray cluster (``psdp.prepare.ray_engine``, imported only then).

A task may report progress while it runs: given ``on_progress``, an engine calls
``fn(task, report)``, and each ``report(item)`` in a worker becomes ``on_progress(item)`` in the
driver, every one of a task's reports before its result (``psdp.prepare.reports``).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from queue import Empty
from typing import Any, Protocol

from psdp._checks import check_int
from psdp.prepare.reports import REPORT_SECONDS, Reports

#: The engines `engine_named` knows.
ENGINES = ("local", "ray")
#: A worker is one core: the tokenizer's own threads would compete with the other workers'.
ONE_CORE = {"TOKENIZERS_PARALLELISM": "false"}


class Engine(Protocol):
    """Runs ``fn`` on every task; yields each result as it finishes (with ``on_progress``,
    ``fn(task, report)``: see the module's docstring)."""

    def map_unordered(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[Any],
        on_progress: Callable[[Any], None] | None = None,
    ) -> Iterator[Any]: ...

    def close(self) -> None: ...


_REPORTS: Any = None  # a worker's queue to its driver, set when it starts


def _reporting(fn: Callable[..., Any], task: Any, token: int) -> tuple[int, Any]:
    """``fn(task, report)`` in a worker, each report put on the driver's queue; returns how many
    it sent, with the result."""
    sent = 0

    def report(item: Any) -> None:
        nonlocal sent
        _REPORTS.put((token, item))
        sent += 1

    result = fn(task, report)
    return sent, result


class LocalEngine:
    """``workers`` processes on this machine (``spawn``: JAX and the tokenizer's threads do not
    survive ``fork``), each tokenizing on one core (`ONE_CORE`); one worker runs the tasks in
    this process, on one core too while it runs.

    Examples:
        >>> engine = LocalEngine(1)
        >>> sorted(engine.map_unordered(abs, [-2, 1]))
        [1, 2]
    """

    def __init__(self, workers: int | None = None):
        if workers is not None:
            check_int("workers", workers, minimum=1)
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None
        self._reports: Any = None  # the workers' queue of reports to this driver

    def map_unordered(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[Any],
        on_progress: Callable[[Any], None] | None = None,
    ) -> Iterator[Any]:
        if self.workers == 1:
            saved = {name: os.environ.get(name) for name in ONE_CORE}
            os.environ.update(ONE_CORE)
            try:
                for task in tasks:
                    yield fn(task) if on_progress is None else fn(task, on_progress)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            return
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._reports = context.Queue()
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=_start_worker,
                initargs=(os.getpid(), self._reports),
            )
        reports = None if on_progress is None else Reports(on_progress)
        queue = enumerate(tasks)
        running: dict[Future[Any], int] = {}  # future -> its task's token
        while True:  # at most two tasks per worker in flight: their results come back in turn
            for token, task in queue:
                if reports is None:
                    running[self._pool.submit(fn, task)] = token
                else:
                    running[self._pool.submit(_reporting, fn, task, token)] = token
                if len(running) >= 2 * self.workers:
                    break
            if not running:
                return
            timeout = None if reports is None else REPORT_SECONDS
            done, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            if reports is not None:
                self._take_reports(reports)
            for future in done:
                token = running.pop(future)
                if reports is None:
                    yield future.result()
                    continue
                sent, result = future.result()
                reports.deliver(token, sent, self._reports.get)
                yield result

    def _take_reports(self, reports: Reports) -> None:
        """Takes the reports that have arrived, without waiting for more."""
        while True:
            try:
                reports.take(self._reports.get_nowait())
            except Empty:
                return

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            self._reports.close()
            self._reports.join_thread()
            self._reports = None


#: Linux's prctl option that sends a process a signal when its parent ends.
PR_SET_PDEATHSIG = 1
#: How often a worker without prctl looks for its driver, in seconds.
WATCH_SECONDS = 0.5


def _start_worker(driver: int, reports: Any) -> None:
    global _REPORTS
    os.environ.update(ONE_CORE)
    # a worker that ends (the run stopped by an error, no longer reading) must not wait to flush
    # reports no one reads; while the run goes on, the driver reads each task's every report
    reports.cancel_join_thread()
    _REPORTS = reports
    _die_with(driver)


def _die_with(driver: int) -> None:
    """Ends this worker when its driver ends, killed too (SIGKILL runs no cleanup, and a worker
    left alive holds the driver's stdout: a ``| tee`` never ends). Linux: the kernel sends
    SIGKILL (``PR_SET_PDEATHSIG``); elsewhere a daemon thread watches the parent pid."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):  # no libc prctl: the thread below
            armed = False
    if os.getppid() != driver:  # the driver ended before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch, args=(driver,), name="psdp-watch-driver",
                         daemon=True).start()  # fmt: skip


def _watch(driver: int) -> None:
    while os.getppid() == driver:  # an orphan is adopted by another process
        time.sleep(WATCH_SECONDS)
    os._exit(1)


def engine_named(name: str, **options: Any) -> Engine:
    """The engine ``name`` (`ENGINES`) with its options (``workers`` for local; ``address``,
    ``num_cpus`` for Ray)."""
    if name == "local":
        return LocalEngine(options.get("workers"))
    if name == "ray":
        from psdp.prepare.ray_engine import RayEngine  # an extra: only when asked for

        return RayEngine(**{k: v for k, v in options.items() if k != "workers"})
    raise ValueError(f"engine={name!r} is not one of {list(ENGINES)}; the default is 'local'")
