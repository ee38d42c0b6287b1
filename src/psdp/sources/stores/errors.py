"""Which store errors may pass if the read or write is tried again, and the pause before each
new try (``docs/reference/reliability.md``, retries).

A *transient* error (a reset connection, a reply cut off mid-way, a 5xx or throttling answer, a
socket timeout) is worth retrying after a pause; anything else (a missing object, a checksum
mismatch, a bad id) is *permanent* and fails at once, naming the object. Sources raise
`TransientReadError` to ask for a retry; the loader also retries Python's `ConnectionError` and
`TimeoutError`. A write to a store retries each of its requests by the same rule
(`retried_write`).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: TensorStore's status codes (the start of its error messages) that may pass on a retry: it
#: gives ABORTED once its own request retries are spent.
TRANSIENT_STATUS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED")
#: curl's transport failures that TensorStore reports as UNKNOWN (its own retries skip them):
#: 8, "Weird server reply", a reply cut off or garbled mid-way (a dropped connection).
TRANSIENT_CURL_CODES = ("8",)
_CURL_CODE = re.compile(r"^UNKNOWN: .*CURL error .*?\[curl_code='(\d+)'\]", re.S)
#: The same failure as TensorStore's gcs driver reports it, with curl's text and no code.
_CURL_TEXT = re.compile(r"^UNKNOWN: .*CURL error Weird server reply\b", re.S)
#: The longest pause between two tries of a read or write, however many tries came before.
MAX_BACKOFF_S = 60.0
#: Tries of each request of a write (the first included), and the pause after the first failed
#: one, doubled after each: the loader's defaults for a read (``read_attempts``,
#: ``retry_backoff_s``).
WRITE_ATTEMPTS = 4
WRITE_BACKOFF_S = 0.5


class TransientReadError(RuntimeError):
    """A read failed for a reason that may pass (e.g. the store was unreachable for a moment):
    the loader retries it, with backoff, up to ``read_attempts`` times.

    Examples:
        >>> is_transient(TransientReadError("503 SlowDown")), is_transient(KeyError("row"))
        (True, False)
    """


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` out of a source's read may pass if the read is tried again."""
    return isinstance(error, TransientReadError | ConnectionError | TimeoutError)


def is_transient_status(message: str) -> bool:
    """Whether a TensorStore error message has a status code that may pass on a retry: the code
    at the start of the message only, never a word later on (a path may hold one); or is an
    ``UNKNOWN`` that TensorStore gave one of curl's transport failures (`TRANSIENT_CURL_CODES`).

    Examples:
        >>> is_transient_status("ABORTED: All 32 retry attempts failed: SlowDown")
        True
        >>> is_transient_status('NOT_FOUND: chunk {8, 0} in "UNAVAILABLE/c/1/0" is missing')
        False
        >>> is_transient_status("UNKNOWN: Error reading gs://b/x: CURL error Weird server reply")
        True
    """
    if message.split(":", 1)[0].strip() in TRANSIENT_STATUS:
        return True
    code = _CURL_CODE.match(message)
    if code is not None:
        return code.group(1) in TRANSIENT_CURL_CODES
    return _CURL_TEXT.match(message) is not None


def is_transient_store_error(error: BaseException) -> bool:
    """Whether ``error`` out of a store operation (TensorStore raises its statuses as
    `ValueError`) may pass if the operation is tried again."""
    return is_transient(error) or (
        isinstance(error, ValueError) and is_transient_status(str(error))
    )


def backoff_s(attempt: int, base_s: float | None, draw: float) -> float:
    """The pause after failed try ``attempt`` (1, 2, ...): ``base_s * 2**(attempt - 1)``, at
    most `MAX_BACKOFF_S`, times ``draw`` (a random number in [0.5, 1]: jitter, so that hosts
    that failed together do not retry together); 0 without a base.

    Examples:
        >>> [backoff_s(a, 0.5, 1.0) for a in (1, 2, 3, 9)], backoff_s(2, 0.5, 0.5)
        ([0.5, 1.0, 2.0, 60.0], 0.5)
    """
    if base_s is None:
        return 0.0
    return min(MAX_BACKOFF_S, base_s * 2 ** (attempt - 1)) * draw


def retried_write(operation: Callable[[], T], what: str) -> T:
    """``operation()``, one request (or one batch of requests) of a write to a store (or of an
    open: every object it reads is immutable), tried again
    while it fails with a transient store error (`is_transient_store_error`), up to
    `WRITE_ATTEMPTS` tries with `backoff_s` pauses from `WRITE_BACKOFF_S`, as the loader retries a
    read; any other error, or the last try's, is raised. ``operation`` must be safe to repeat
    (it writes the same bytes to the same keys). Each retry logs a warning naming ``what``.

    Examples:
        >>> failures = [ValueError("UNKNOWN: CURL error Weird server reply [curl_code='8']")]
        >>> def put():
        ...     if failures:
        ...         raise failures.pop()
        ...     return "written"
        >>> retried_write(put, "writing shard c/0")
        'written'
    """
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            return operation()
        except Exception as error:
            if attempt == WRITE_ATTEMPTS or not is_transient_store_error(error):
                raise
            pause = backoff_s(attempt, WRITE_BACKOFF_S, random.uniform(0.5, 1.0))
            logger.warning(
                "psdp: %s failed (%s); try %d of %d in %.2f s",
                what, error, attempt + 1, WRITE_ATTEMPTS, pause,
            )  # fmt: skip
            time.sleep(pause)
    raise AssertionError("unreachable")
