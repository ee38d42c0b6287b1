"""A reviewer's attacks on the object-store paths of issue 36 (S3 on moto, GCS on fake-gcs-server),
through the documented entry points: each a case that once failed, kept failing if it regresses.

Every test runs on both stores where both apply; the emulators are the ones the other object-store
tests start (``psdp.tools.benchmarks.object_store``)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from psdp.sources import TensorStoreSource
from psdp.sources.stores import location
from psdp.tools.benchmarks.object_store import GCS_ENVIRONMENT, S3_ENVIRONMENT


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that accepts every connection and never answers (a hung server, a
    firewall that swallows packets after the handshake): no error ever reaches the client."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listening.accept()[0])

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        listening.shutdown(socket.SHUT_RDWR)  # ends the accept() under way
        listening.close()
        accepting.join()
        for connection in held:
            connection.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_endpoint_that_never_answers_is_an_error_naming_it_in_bounded_time(scheme, monkeypatch):
    """The first request's reach check had no deadline: TensorStore sets no timeout on a request
    that gets no answer, so an open hung for good (over 300 s, measured) instead of failing in
    seconds naming the endpoint as a refused one does. ~1 s per store."""
    monkeypatch.setattr(location, "REACH_TIMEOUT_S", 1.0)
    for name, value in {**S3_ENVIRONMENT, **GCS_ENVIRONMENT}.items():
        monkeypatch.setenv(name, value)
    with silent_endpoint() as endpoint:
        variable = "AWS_ENDPOINT_URL_S3" if scheme == "s3" else location.GCS_ENDPOINT_VARIABLE
        monkeypatch.setenv(variable, endpoint)
        with pytest.raises(ValueError, match="no answer within 1.0 s") as caught:
            TensorStoreSource(f"{scheme}://psdp/silent")
    assert f"cannot reach {scheme}://psdp/silent/ (endpoint {endpoint})" in str(caught.value)
