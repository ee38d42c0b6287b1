"""`LoaderIterator`: a loader's batches prefetched from a step, with its own checkpoint state;
`Iterators`: the iterators a loader has open (``docs/concepts/loader.md``, ``docs/reference/reliability.md``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from psdp._runtime.prefetch import Prefetcher


class LoaderIterator(Prefetcher[Any]):
    """What ``iter(loader)`` and `DataLoader.iter_from` return: batches prefetched on background
    threads, and the iterator's own `state`.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp import DataLoader
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> with DataLoader(np.arange(64, dtype=np.int32), mesh=mesh, global_batch_size=8) as loader:
        ...     it = iter(loader)
        ...     _ = next(it), next(it)
        ...     it.state()["step"]
        2
    """

    def __init__(
        self,
        read: Callable[[int, Callable[[], bool]], Any],
        state_at: Callable[[int], dict[str, Any]],
        *,
        start: int,
        **kwargs: Any,
    ) -> None:
        """``read(step, stopped)`` makes a step's batch (``stopped()``: this iterator closed);
        ``state_at(step)`` is the loader's state at a step; ``kwargs`` go to `Prefetcher`."""
        self._state_at = state_at
        super().__init__(lambda step: read(step, lambda: self.closed), start=start, **kwargs)

    def state(self) -> dict[str, Any]:
        """The loader's state with this iterator's next step: what `DataLoader.restore` takes."""
        return self._state_at(self.next_step)


class Iterators:
    """The iterators a loader started: which one `DataLoader.state` counts from, and closing."""

    def __init__(self) -> None:
        self._open: list[LoaderIterator] = []
        self._last: LoaderIterator | None = None  # counted from even once closed
        self._lock = threading.Lock()

    def add(self, start: Callable[[], LoaderIterator]) -> LoaderIterator:
        """Starts an iterator with ``start()`` and keeps it."""
        with self._lock:
            self._open = [it for it in self._open if not it.closed]
            self._last = iterator = start()
            self._open.append(iterator)
        return iterator

    def next_step(self, default: int) -> int:
        """The step the open iterator hands out next (the last one's once all are closed,
        ``default`` before any); raises when two are open."""
        with self._lock:
            open_iterators = [it for it in self._open if not it.closed]
            if len(open_iterators) > 1:
                steps = [it.next_step for it in open_iterators]
                raise ValueError(
                    f"loader.state() is ambiguous: {len(open_iterators)} iterators of this loader "
                    f"are open (next steps {steps}); save the state of the one you train from "
                    "with it.state(), or close the others (next(iter(loader)) leaves an iterator "
                    "open; peek with loader.batch_at(step), which opens none)"
                )
            last = open_iterators[0] if open_iterators else self._last
            return default if last is None else last.next_step

    def close(self) -> None:
        """Closes every iterator (joining their threads)."""
        with self._lock:
            iterators, self._open = self._open, []
        for iterator in iterators:
            iterator.close()
