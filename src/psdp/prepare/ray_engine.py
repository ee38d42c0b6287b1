"""The Ray engine: `prepare`'s tasks as Ray tasks, on a running cluster or on one it starts here.

It has the local engine's protocol (``map_unordered(fn, tasks, on_progress)``, ``close()``), and
runs the same module-level task function, so a store does not depend on the engine (the work is
cut by input, never by worker). Each task becomes one ``ray.remote`` call; results come back as
they finish; a task's reports go through a Ray queue (an actor of no CPU) to the driver.
Running on a multi-node cluster: ``docs/guides/prepare.md``, "On a Ray cluster".
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from typing import Any, TypeVar

from psdp._imports import import_optional
from psdp.prepare.reports import REPORT_SECONDS, Reports

T = TypeVar("T")
R = TypeVar("R")


class RayEngine:
    """Runs tasks on Ray: on the cluster at ``address``, or on a local one of ``num_cpus`` CPUs.

    Arguments:
        address: a running cluster's address (``HOST:6379`` as ``ray start --head`` prints it, or
            ``"auto"``); None starts a local cluster in this process (or joins the one that
            ``RAY_ADDRESS`` names, as ``ray.init`` does).
        num_cpus: the local cluster's CPUs (None: all of this machine's); only without ``address``.

    A Ray session that is already open in this process is used as it is, and left open by
    `close`; one that the engine opened, it shuts down.

    Examples:
        >>> import operator
        >>> engine = RayEngine(num_cpus=1)  # doctest: +SKIP
        >>> sorted(engine.map_unordered(operator.neg, [1, 2, 3]))  # doctest: +SKIP
        [-3, -2, -1]
        >>> engine.close()  # doctest: +SKIP
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        if address is not None and num_cpus is not None:
            raise ValueError(
                f"num_cpus sizes a local Ray cluster, and a running cluster at address="
                f"{address!r} keeps its own size (num_cpus={num_cpus} given): pass address to "
                "use a running cluster, or num_cpus to start a local one, not both"
            )
        self._ray = import_optional("ray", extra="ray", needed_for="engine='ray'")
        self._owns_session = not self._ray.is_initialized()
        if self._owns_session:
            if address is None and "RAY_ADDRESS" not in os.environ:
                _check_can_fork()
            self._ray.init(address=address, num_cpus=num_cpus, include_dashboard=False)

    def map_unordered(
        self,
        fn: Callable[..., R],
        tasks: Iterable[T],
        on_progress: Callable[[Any], None] | None = None,
    ) -> Iterator[R]:
        """``fn(task)`` for every task, run as Ray tasks, yielded in the order they finish
        (with ``on_progress``: ``fn(task, report)``, each report passed to ``on_progress`` here,
        a task's every one before its result).

        ``fn`` must be a module-level callable that every node can import (psdp installed there).
        At most two tasks per CPU of the cluster are in flight. A task's exception is raised here
        as itself (not wrapped), once the tasks in flight have ended; no task starts after it.
        """
        remote = self._ray.remote(_apply)  # a plain function: ray.remote refuses builtins as fn
        queue = None
        if on_progress is not None:
            from ray.util.queue import Queue

            queue = Queue(actor_options={"num_cpus": 0})  # a task's CPU is the tokenizer's
        reports = None if on_progress is None else Reports(on_progress)
        waiting = enumerate(tasks)
        in_flight = 2 * max(1, int(self._ray.cluster_resources().get("CPU", 1)))
        tokens = {}  # a running task's object ref -> its token

        def start(count: int) -> list[Any]:
            started = []
            for token, task in itertools.islice(waiting, count):
                started.append(remote.remote(fn, task, queue, token))
                tokens[started[-1]] = token
            return started

        running = start(in_flight)
        try:
            while running:
                timeout = None if queue is None else REPORT_SECONDS
                done, running = self._ray.wait(running, num_returns=1, timeout=timeout)
                if reports is not None:
                    for report in queue.get_nowait_batch(queue.qsize()):  # type: ignore[union-attr]
                        reports.take(report)
                if not done:
                    continue
                try:
                    sent, result = self._ray.get(done[0])
                except self._ray.exceptions.RayTaskError as error:
                    raise error.cause from None  # the task's own error, as the local engine gives
                if reports is not None:
                    reports.deliver(tokens.pop(done[0]), sent, queue.get)  # type: ignore[union-attr]
                running += start(1)
                yield result
        finally:
            # On an error or an abandoned iteration the tasks in flight end on their own: none is
            # cancelled, as Ray 2.60's driver aborted the whole process when the reply of a task
            # it had just cancelled arrived ("Tried to complete task that was not pending").
            if running:
                self._ray.wait(running, num_returns=len(running))
            if queue is not None:
                queue.shutdown()

    def close(self) -> None:
        """Shuts down the Ray session if this engine started it."""
        if self._owns_session and self._ray.is_initialized():
            self._ray.shutdown()


def _apply(fn: Callable[..., R], task: T, queue: Any, token: int) -> tuple[int, R]:
    """``fn(task)``, or with a ``queue`` ``fn(task, report)``, each report put on it; returns how
    many it put, with the result."""
    if queue is None:
        return 0, fn(task)
    sent = 0

    def report(item: Any) -> None:
        nonlocal sent
        queue.put((token, item))  # blocks until the queue holds it: before the result
        sent += 1

    result = fn(task, report)
    return sent, result


#: The first TensorStore that lets a process fork after using it (0.1.72 aborts; docs/guides/prepare.md).
FORK_SAFE_TENSORSTORE = (0, 1, 86)


def _check_can_fork() -> None:
    """Starting a local Ray instance forks; older TensorStore aborts the whole process then."""
    have = version("tensorstore")
    if tuple(int(part) for part in have.split(".")[:3] if part.isdigit()) < FORK_SAFE_TENSORSTORE:
        raise RuntimeError(
            f"starting a local Ray instance forks this process, and tensorstore {have} aborts a "
            "process that forks after using it (fork-safe from 0.1.86): start Ray with "
            "`ray start --head` and pass its address (address= / --ray-address), or upgrade "
            "tensorstore to >= 0.1.86"
        )
