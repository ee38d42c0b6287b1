"""Which read errors may pass if the read is tried again (``docs/reliability.md``, retries).

A *transient* error (a reset connection, a 5xx or throttling answer, a socket timeout) is worth
retrying after a pause; anything else (a missing object, a checksum mismatch, a bad id) is
*permanent* and fails the step at once, naming the object. Sources raise `TransientReadError`
to ask for a retry; the loader also retries Python's `ConnectionError` and `TimeoutError`.
"""

from __future__ import annotations

#: TensorStore's status codes (the start of its error messages) that may pass on a retry: it
#: gives ABORTED once its own request retries are spent.
TRANSIENT_STATUS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED")


class TransientReadError(RuntimeError):
    """A read failed for a reason that may pass (e.g. the store was unreachable for a moment):
    the loader retries it, with backoff, up to ``read_attempts`` times.

    Example:
        >>> is_transient(TransientReadError("503 SlowDown")), is_transient(KeyError("row"))
        (True, False)
    """


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` out of a source's read may pass if the read is tried again."""
    return isinstance(error, TransientReadError | ConnectionError | TimeoutError)


def is_transient_status(message: str) -> bool:
    """Whether a TensorStore error message has a status code that may pass on a retry: the code
    at the start of the message only, never a word later on (a path may hold one).

    Example:
        >>> is_transient_status("ABORTED: All 32 retry attempts failed: SlowDown")
        True
        >>> is_transient_status('NOT_FOUND: chunk {8, 0} in "UNAVAILABLE/c/1/0" is missing')
        False
    """
    return message.split(":", 1)[0].strip() in TRANSIENT_STATUS
