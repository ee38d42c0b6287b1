"""`StepReader`: one step's source reads -> window buffers: read, retry, pad, check, cast, cut,
time out (``docs/concepts/loader.md``; the errors and retries: ``docs/reference/reliability.md``, ``docs/guides/object-stores.md``)."""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from psdp._checks import preview_ids
from psdp._plan.leaves import Key, leaf_label, leaves_of
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.options import ReadingOptions
from psdp._plan.order import PAD
from psdp._plan.reads import ReadRequest
from psdp._plan.windows import Box, take_box
from psdp._runtime.telemetry import Telemetry
from psdp.sources.base import SupportsReadWindow
from psdp.sources.stores.errors import backoff_s, is_transient

logger = logging.getLogger(__name__)

#: One leaf's window buffers, in window order.
Buffers = dict[Key, list[np.ndarray]]


class StepReader:
    """Reads a step's requests (`LoaderPlan.requests`) from a source into each leaf's windows.

    Positions whose id is `PAD` are never read: they hold ``pad_value``. A read that fails with
    a transient error (`psdp.sources.stores.errors.is_transient`) is tried again after a pause, up to
    ``read_attempts`` tries; any other error fails at once, with a note naming the step. Until
    the first step is read, reads get ``first_read_timeout_s`` instead of ``timeout_s``.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp._plan.options import LoaderOptions
        >>> from psdp._runtime.feeds import open_feed
        >>> from psdp.sources import ArraySource
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> source = ArraySource({"x": np.arange(10, dtype=np.int32)})
        >>> plan = LoaderPlan.create(source.read(np.arange(1)), mesh,
        ...     LoaderOptions.create(global_batch_size=6, pad_value=-1), 0, stream=False,
        ...     ends_short=False)
        >>> ids = np.array([3, 1, 4, 1, 5, 9, -1, -1])
        >>> StepReader(plan, open_feed(source, plan.options.order)).read(0, ids, source)["x"][0].tolist()
        [3, 1, 4, 1, 5, 9, -1, -1]
    """

    def __init__(
        self,
        plan: LoaderPlan,
        feed: Any,
        timeout_s: float | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.plan, self.feed, self.timeout_s = plan, feed, timeout_s
        self.fresh = feed.fresh  # reads return new arrays; otherwise buffers are copied out
        self.pad_value = plan.options.output.pad_value
        reading = plan.options.reading
        self.first_timeout_s = reading.first_read_timeout_s or timeout_s
        self.attempts, self.backoff_s = reading.read_attempts, reading.retry_backoff_s
        self.telemetry = telemetry
        self._warm = False  # a step was read: the first batch's grace is over
        self._jitter = random.Random()
        # a remote store's counters; only then: collecting TensorStore's metrics every step costs
        # memory (RSS grew ~17 KB a step in scripts/measure/soak.py on a local store)
        remote = getattr(feed.source, "remote", False)
        self._counts = getattr(feed.source, "request_counts", None) if remote else None
        self._counts_at_start = self._counts() if self._counts else (0, 0)
        # (source, its read_window or None): the same every step, and slow to find out
        self._windowed: tuple[Any, Any] | None = None

    def read_step(
        self, step: int, run: str, stop: Callable[[], bool]
    ) -> tuple[np.ndarray, Buffers]:
        """Step ``step``'s ids (from the feed) and buffers, within the time limit."""
        abandoned = threading.Event()  # set on timeout: the abandoned read stops retrying

        def read() -> tuple[np.ndarray, Buffers]:
            ids, source = self.feed.step(step, run, stop)
            return ids, self.read(step, ids, source, lambda: stop() or abandoned.is_set())

        warm = self._warm
        limit, name = (
            (self.timeout_s, "read_timeout_s")
            if warm
            else (self.first_timeout_s, "first_read_timeout_s")
        )
        if limit == self.timeout_s:
            name = "read_timeout_s"  # no grace was asked for
        out = with_timeout(
            read,
            limit,
            lambda: f"step {step}: reading {self.feed.what_is_read(step)} from "
            f"{self.feed.source.describe()} took longer than {name}={limit}; the source may "
            f"be stuck (a hung filesystem or object store); raise {name} if reads are just "
            "slow",
            abandoned,
        )
        self._warm = True
        self._record_counts()
        return out

    def _record_counts(self) -> None:
        if self._counts is not None and self.telemetry is not None:
            requests, retries = self._counts()
            start = self._counts_at_start
            self.telemetry.record_store_counts(requests - start[0], retries - start[1])

    def read(
        self,
        step: int,
        ids: np.ndarray,
        source: Any,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Buffers:
        """Every window buffer of step ``step``, whose physical batch holds ``ids``; retries
        stop early once ``stopped()``."""
        empty = np.empty(0, np.int8)
        buffers = {k: [empty] * len(v.windows) for k, v in self.plan.leaves.items()}
        for request in self.plan.requests:
            got, borrowed = self._read(step, ids[request.positions], request, source, stopped)
            for entry in request.entries:
                rows = got[entry.key]
                if entry.rows is not None:
                    rows = rows[entry.rows]
                if entry.columns is not None:
                    rows = take_box(rows, entry.columns)
                leaf = self.plan.leaves[entry.key]
                if entry.into is not None:  # one of several reads of a window: a copy
                    leaf.place(
                        buffers[entry.key],
                        entry.window,
                        rows,
                        entry.into,
                        self.pad_value,
                        entry.window_rows,
                    )
                    continue
                buffer = leaf.pad_window(entry.window, rows, self.pad_value)
                if entry.key in borrowed and np.may_share_memory(buffer, got[entry.key]):
                    buffer = buffer.copy()  # the source may refill it while the batch lives
                buffers[entry.key][entry.window] = buffer
        return buffers

    def _read(
        self,
        step: int,
        ids: np.ndarray,
        request: ReadRequest,
        source: Any,
        stopped: Callable[[], bool],
    ) -> tuple[dict[Key, np.ndarray], set[Key]]:
        """One request's rows, each leaf cut to its columns; `PAD` ids become pad rows.

        Also returns the leaves whose arrays may be memory the source keeps (not copied yet).
        """
        real = ids != PAD
        if real.all():
            got = self._source_read(step, source, ids, request, stopped)
            return self._checked(step, ids, request, got)
        out = {
            key: np.full(
                self._row_shape(key, columns, len(ids)),
                self.pad_value,
                self.plan.leaves[key].dtype,
            )
            for key, columns in request.columns.items()
        }
        if real.any():
            read = self._source_read(step, source, ids[real], request, stopped)
            got, _ = self._checked(step, ids[real], request, read)
            for key in out:
                out[key][real] = got[key]
        return out, set()

    def _source_read(
        self,
        step: int,
        source: Any,
        ids: np.ndarray,
        request: ReadRequest,
        stopped: Callable[[], bool],
    ) -> dict[Key, np.ndarray]:
        where = f"step {step}: reading {len(ids)} rows (ids {preview_ids(ids)})"
        return retried(
            lambda: self._read_columns(source, ids, request),
            where,
            source,
            self.attempts,
            self._backoff,
            stopped,
            None if self.telemetry is None else self.telemetry.record_retry,
        )

    def _backoff(self, attempt: int) -> float:
        return backoff_s(attempt, self.backoff_s, self._jitter.uniform(0.5, 1.0))

    def _read_columns(
        self, source: Any, ids: np.ndarray, request: ReadRequest
    ) -> dict[Key, np.ndarray]:
        # `read` is the protocol; `read_window` (optional) serves column windows and leaf subsets
        windowed = self._windowed  # one assignment below: safe for several read threads
        if windowed is None or windowed[0] is not source:
            windowed = self._windowed = (source, _read_window_of(source))
        read_window = windowed[1]
        leaves = self.plan.leaves
        partial = len(request.columns) < len(leaves) or any(
            c is not None for c in request.columns.values()
        )
        if partial and read_window is not None:
            # a whole-row leaf is the empty box, as docs/guides/custom-sources.md defines boxes
            boxes = {key: () if box is None else box for key, box in request.columns.items()}
            return leaves_of(read_window(ids, boxes))
        # a source without column reads: read whole rows, keep this request's leaves and columns
        got = leaves_of(source.read(ids))
        wanted = {key for key in got if key in request.columns or key not in leaves}
        return {
            key: got[key]
            if request.columns.get(key) is None
            else take_box(np.asarray(got[key]), request.columns[key])
            for key in wanted
        }

    def _row_shape(self, key: Key, columns: Box, rows: int) -> tuple[int, ...]:
        return self.plan.leaves[key].read_shape(columns, rows)

    def _checked(
        self, step: int, ids: np.ndarray, request: ReadRequest, got: dict[Key, np.ndarray]
    ) -> tuple[dict[Key, np.ndarray], set[Key]]:
        """The read's leaves checked and in their delivered dtypes, and which may be borrowed."""
        leaves = self.plan.leaves
        missing = set(request.columns) - set(got)
        extra = set(got) - set(leaves)
        if missing or extra:
            raise ValueError(
                f"step {step}: the source returned leaves {sorted(map(str, got))}, but its first "
                f"row had {sorted(map(str, leaves))}; every read must return the same leaves"
            )
        out, borrowed = {}, set()
        for key, columns in request.columns.items():
            data = np.asarray(got[key])
            leaf, dtype = leaves[key], self.plan.dtypes[key]
            expected = self._row_shape(key, columns, len(ids))
            if data.shape[:1] != (len(ids),):
                raise ValueError(
                    f"step {step}: the read of {leaf_label(key)} returned "
                    f"{len(data) if data.ndim else 0} rows for {len(ids)} ids ({preview_ids(ids)}); "
                    "a source's read(ids) must return one row per id, in the order of the ids"
                )
            if data.shape != expected or data.dtype != dtype.source:
                raise ValueError(
                    f"step {step}: rows of {leaf_label(key)} have shape {data.shape[1:]} and dtype "
                    f"{data.dtype}, but the source's first row had {leaf.source_shape[1:]} "
                    f"{dtype.source} (read of {len(ids)} rows, ids {preview_ids(ids)}); every row "
                    "of a source must have one shape and dtype"
                )
            if dtype.casts:
                data = dtype.convert(data, step=step, key=key, ids=ids)  # a new array
            elif not self.fresh:
                borrowed.add(key)
            out[key] = data
        return out, borrowed


def read_first_row(feed: Any, reading: ReadingOptions, stage: int = 0) -> dict[Key, np.ndarray]:
    """The row a loader reads when it is built, for its leaves' names, shapes and dtypes: retried
    like a step's reads, and bounded like the first step's (``first_read_timeout_s``, else
    ``read_timeout_s``; unset: no limit). ``stage``: the length stage whose first row it is
    (`StagedTokens`' rows differ in width by stage).

    Examples:
        >>> from psdp._plan.options import OrderOptions
        >>> from psdp._runtime.feeds import open_feed
        >>> feed = open_feed(np.arange(6, dtype=np.int32), OrderOptions(global_batch_size=2))
        >>> read_first_row(feed, ReadingOptions(read_timeout_s=1))
        {None: array([0], dtype=int32)}
    """
    limit = reading.first_read_timeout_s or reading.read_timeout_s
    name = "first_read_timeout_s" if reading.first_read_timeout_s else "read_timeout_s"
    where = "the first read (row 0, for the leaves' shapes)"
    if stage:
        where = f"the first read of length stage {stage} (for its leaves' shapes)"
    jitter = random.Random()
    abandoned = threading.Event()  # set on timeout: the abandoned read stops retrying
    return with_timeout(
        lambda: retried(
            functools.partial(feed.probe, stage) if stage else feed.probe,
            where,
            feed.source,
            reading.read_attempts,
            lambda attempt: backoff_s(attempt, reading.retry_backoff_s, jitter.uniform(0.5, 1.0)),
            abandoned.is_set,
        ),
        limit,
        lambda: f"{where} from {feed.source.describe()} took longer than {name}={limit}: a "
        "DataLoader reads one row when it is built or restored, within the first read's time "
        "limit (first_read_timeout_s, else read_timeout_s); the source may be stuck (a hung "
        f"filesystem or object store); raise {name} if its first read is just slow",
        abandoned,
    )


def stray_stop_iteration(where: str, source: Any) -> RuntimeError:
    """The error for a `StopIteration` out of a random-access read (it would end training)."""
    return RuntimeError(
        f"{where} from {source.describe()} raised StopIteration. Only a stream's end may end "
        "iteration; from a random-access source it would end the training loop early without a "
        "word (a stray next() on an exhausted iterator inside read?), so it is an error: catch "
        "it in the source, or wrap an iterable without random access in psdp.StreamSource"
    )


def retried(
    read: Callable[[], Any],
    where: str,
    source: Any,
    attempts: int,
    backoff: Callable[[int], float],
    stopped: Callable[[], bool] = lambda: False,
    on_retry: Callable[[], None] | None = None,
) -> Any:
    """``read()``, tried again after ``backoff(attempt)`` seconds while it fails with a transient
    error (`psdp.sources.stores.errors.is_transient`), up to ``attempts`` tries; any other error, the
    last try's, or one after ``stopped()`` is raised with a note naming ``where``.

    Examples:
        >>> from psdp.sources.stores.errors import TransientReadError
        >>> from psdp.sources import ArraySource
        >>> failures = [TransientReadError("503 SlowDown")]
        >>> def read():
        ...     if failures:
        ...         raise failures.pop()
        ...     return "rows"
        >>> retried(read, "step 0", ArraySource(np.zeros(1)), attempts=2, backoff=lambda a: 0.0)
        'rows'
    """
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except StopIteration as err:  # only a stream's end may end iteration (as in PEP 479)
            raise stray_stop_iteration(where, source) from err
        except Exception as err:
            if attempt == attempts or not is_transient(err) or stopped():
                tries = f" (try {attempt} of {attempts})" if attempt > 1 else ""
                err.add_note(f"psdp: {where} from {source.describe()}{tries}")
                raise
            pause = backoff(attempt)
            logger.warning(
                "psdp: %s failed (%s: %s); try %d of %d in %.2f s",
                where,
                type(err).__name__,
                err,
                attempt + 1,
                attempts,
                pause,
            )
            if on_retry is not None:
                on_retry()
            _pause(pause, stopped)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _pause(seconds: float, stopped: Callable[[], bool]) -> None:
    """Sleeps ``seconds``, waking early once ``stopped()`` (a closed loader stops retrying)."""
    deadline = time.monotonic() + seconds
    while not stopped() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def with_timeout(
    work: Any, timeout_s: float | None, message: Any, abandoned: threading.Event | None = None
) -> Any:
    """Runs ``work()`` on a daemon thread; raises `TimeoutError` if it takes over ``timeout_s``
    (``None``: runs it on the calling thread, unbounded), after setting ``abandoned``.

    A read that never returns cannot be interrupted from Python; its daemon thread is abandoned
    (it ends when the read returns, or with the process), and the step fails instead of hanging
    the trainer.
    """
    if timeout_s is None:
        return work()
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as err:  # re-raised on the calling thread
            error.append(err)

    thread = threading.Thread(target=run, name="psdp-read", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if abandoned is not None:
            abandoned.set()  # the work's retries stop: its thread ends with the read in flight
        raise TimeoutError(message())
    if error:
        raise error[0]
    return result[0]


def _read_window_of(source: Any) -> Any:
    """The source's ``read_window``, unless a subclass overrides ``read`` below it (then the
    override is what the user means, and ``read_window`` would bypass it)."""
    if not isinstance(source, SupportsReadWindow):
        return None
    mro = type(source).__mro__
    defines = [
        next((i for i, c in enumerate(mro) if n in c.__dict__), len(mro))
        for n in ("read", "read_window")
    ]
    return source.read_window if defines[1] <= defines[0] else None
