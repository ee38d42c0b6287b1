"""The driver's side of the progress that `prepare`'s tasks report while they run: each report
crosses from a worker (a process, or a Ray task) with its task's token, and reaches the driver's
``on_progress`` before that task's result, whatever the channel's delays. Both engines use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: How often the driver takes the reports of running tasks, in seconds, while none finishes.
REPORT_SECONDS = 0.1


class Reports:
    """The driver's side of tasks' reports: each arrives as ``(token, item)`` (the token names
    its task) and goes to ``on_progress``; `deliver` waits for a finished task's last one, so
    that every report of a task comes before its result, whatever the channel's delays.

    Examples:
        >>> seen = []
        >>> reports = Reports(seen.append)
        >>> reports.take((7, "a"))
        >>> waiting = iter([(8, "b"), (7, "c")])  # the channel: 8's report comes first
        >>> reports.deliver(7, 2, lambda: next(waiting))
        >>> seen, reports.counts
        (['a', 'b', 'c'], {8: 1})
    """

    def __init__(self, on_progress: Callable[[Any], None]):
        self.on_progress = on_progress
        self.counts: dict[Any, int] = {}  # reports taken, by task token (until it finishes)

    def take(self, report: tuple[Any, Any]) -> None:
        token, item = report
        self.counts[token] = self.counts.get(token, 0) + 1
        self.on_progress(item)

    def deliver(self, token: Any, sent: int, get: Callable[[], tuple[Any, Any]]) -> None:
        """Takes reports (``get()`` blocks for the next) until task ``token``'s ``sent``."""
        while self.counts.get(token, 0) < sent:
            self.take(get())
        self.counts.pop(token, None)
