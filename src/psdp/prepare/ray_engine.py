"""The Ray engine: `prepare`'s tasks as Ray tasks, on a running cluster or on one it starts here.

It has the local engine's protocol (``map_unordered(fn, tasks)``, ``close()``), and runs the same
module-level task function, so a store does not depend on the engine (the work is cut by input,
never by worker). Each task becomes one ``ray.remote`` call; results come back as they finish.
Running on a multi-node cluster: ``docs/prepare.md``, "On a Ray cluster".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from psdp._imports import import_optional

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

    Example:
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
            self._ray.init(address=address, num_cpus=num_cpus, include_dashboard=False)

    def map_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        """``fn(task)`` for every task, run as Ray tasks, yielded in the order they finish.

        ``fn`` must be a module-level callable that every node can import (psdp installed there).
        A task's exception is raised here as itself (not wrapped), and cancels the tasks left.
        """
        remote = self._ray.remote(_apply)  # a plain function: ray.remote refuses builtins as fn
        pending = [remote.remote(fn, task) for task in tasks]
        try:
            while pending:
                [done], pending = self._ray.wait(pending, num_returns=1)
                try:
                    yield self._ray.get(done)
                except self._ray.exceptions.RayTaskError as error:
                    raise error.cause from None  # the task's own error, as the local engine gives
        finally:
            for ref in pending:  # on an error or an abandoned iteration: stop the work left
                self._ray.cancel(ref)

    def close(self) -> None:
        """Shuts down the Ray session if this engine started it."""
        if self._owns_session and self._ray.is_initialized():
            self._ray.shutdown()


def _apply(fn: Callable[[T], R], task: T) -> R:
    return fn(task)
