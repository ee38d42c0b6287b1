"""A Ray cluster for the tests: a head of 2 CPUs on 127.0.0.1, started once per test session; and
`two_nodes`, a head and a second node (``ray start --address``) with its own resources, started
and stopped by the test that uses it (and started again where Ray gave up on a node under load).

The head runs as ``ray start --head`` in a subprocess, and the tests join it by address, as a user
joins a multi-node cluster (``docs/guides/prepare.md``, "On a Ray cluster"). Not ``ray.init()`` here: it
forks, and tensorstore before 0.1.86 aborts a process that forks after using it (the lower-bound
job). `requires_ray` skips a test, with its reason, only where ray is not installed (CI has it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Ray gives a cluster the machine's interface address unless clusters are "disabled", which keeps
# every process on 127.0.0.1: the tests talk to nothing but loopback. Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# The newest ray authenticates by token: one made here for the head and the tests alike, from the
# environment (nothing read from ~/.ray); older releases ignore both. Also read at import.
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))

requires_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'psdp[ray]'); CI installs it and runs these tests",
)
START_LIMIT_S = 120  # not a timing threshold: a head that never starts fails instead of hanging


#: the ports handed out in this process: a port is free once its probe closes, so the kernel may
#: offer it again before Ray binds it; two components given one port make `ray start` fail
_GIVEN: set[int] = set()


def _free_port() -> int:
    """A free port on 127.0.0.1 that this process has not handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


@pytest.fixture(scope="session")
def ray_engine(tmp_path_factory):
    """A `RayEngine` joined to a fresh head by its address; the head is stopped at the end. Its
    log goes to pytest's temporary folder; Ray's session to a short directory of its own, as in
    `two_nodes` (pytest's folder grows with the run count, past a socket path's 107 bytes)."""
    import ray

    from psdp.prepare.ray_engine import RayEngine

    tmp = tmp_path_factory.mktemp("ray")
    session = tempfile.mkdtemp(prefix="psdp-ray-")
    port = _free_port()
    # A head stopped by SIGTERM first "drains" its node for 30 s (for Ray Serve's proxies, which
    # these tests do not run): without the wait its processes stop at once.
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    head = None
    try:
        head = _start_node(
            ["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             f"--dashboard-port={_free_port()}", f"--temp-dir={session}"],
            tmp / "head.log", env, session,
        )  # fmt: skip
        engine = RayEngine(address=f"127.0.0.1:{port}")
        yield engine
        engine.close()
        assert not ray.is_initialized(), "the engine opened the session, so it closes it"
    finally:
        if head is not None:
            _stop(head)
        shutil.rmtree(session, ignore_errors=True)


def _node_ports() -> list[str]:
    """Options giving a node's every agent port of its own (nodes on one machine never collide)."""
    names = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
             "metrics-export-port", "node-manager-port", "object-manager-port")  # fmt: skip
    return [f"--{name}={_free_port()}" for name in names]


class StartTimedOut(AssertionError):
    """A node that Ray itself gave up on: its raylet did not register with the GCS within the 30 s
    that `ray start` waits (a constant in ray/_private/node.py), which a loaded machine can exceed."""


def _start_node(options: list[str], log, env, session: str) -> subprocess.Popen:
    """``ray start --block`` with ``options``, in its own process group; returns once the node
    says it runs, or fails showing its log and the tails of Ray's own logs in ``session``."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
               "--node-ip-address=127.0.0.1", "--disable-usage-stats", *_node_ports(),
               *options]  # fmt: skip
    with log.open("w") as out:
        node = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    deadline = time.monotonic() + START_LIMIT_S
    while "Ray runtime started" not in log.read_text():
        if node.poll() is not None or time.monotonic() > deadline:
            _stop(node)
            text = log.read_text()
            failure = StartTimedOut if "timed out during startup" in text else AssertionError
            raise failure(f"ray start {options} did not start:\n{text}{_ray_logs(session)}")
        time.sleep(0.2)
    return node


def _ray_logs(session: str, lines: int = 15) -> str:
    """The last ``lines`` of every non-empty log of the GCS and the raylets in ``session``."""
    tails = []
    for path in sorted(Path(session).glob("session_*/logs/*")):
        if path.name.startswith(("gcs_server", "raylet")) and path.stat().st_size:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"\n--- {path.name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
    return "".join(tails)


#: What a process of a multi-node cluster (a node, or a driver joining it) needs: Ray refuses a
#: second node where clusters are "disabled", as above; every node still names 127.0.0.1.
TWO_NODES_ENVIRONMENT = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}


#: How many times `two_nodes` starts a cluster whose node Ray gave up on (`StartTimedOut`).
START_TRIES = 3


@contextlib.contextmanager
def two_nodes(tmp, head_cpus=0, node_cpus=2):
    """A head of ``head_cpus`` CPUs and a second node joined to it by address, with
    ``node_cpus`` CPUs and a resource of its own (``second_node: 1``): yields the head's address;
    both are stopped (and every process they started) on exit. Ray gives a node of a multi-node
    cluster the address of the machine's interface: both are on this machine, and every address
    named here is 127.0.0.1. A cluster whose node Ray gave up on under load is stopped and started
    afresh, at most `START_TRIES` times; any other failure fails at once. Their logs go to ``tmp``;
    Ray's session to a short directory of its own (a socket's path has at most 107 bytes), deleted
    on exit."""
    env = {**os.environ, **TWO_NODES_ENVIRONMENT, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    for attempt in range(1, START_TRIES + 1):
        port = _free_port()
        session = tempfile.mkdtemp(prefix="psdp-ray-")
        nodes = []
        try:
            try:
                nodes.append(_start_node(
                    ["--head", f"--port={port}", f"--num-cpus={head_cpus}",
                     "--include-dashboard=false", f"--dashboard-port={_free_port()}",
                     f"--temp-dir={session}"], tmp / f"head-{attempt}.log", env, session))  # fmt: skip
                nodes.append(_start_node(
                    [f"--address=127.0.0.1:{port}", f"--num-cpus={node_cpus}",
                     '--resources={"second_node": 1}'], tmp / f"second-{attempt}.log", env,
                    session))  # fmt: skip
            except StartTimedOut:
                if attempt == START_TRIES:
                    raise
                continue  # the finally below stops what started
            yield f"127.0.0.1:{port}"
            return
        finally:
            for node in reversed(nodes):
                _stop(node)
            shutil.rmtree(session, ignore_errors=True)


def _stop(head: subprocess.Popen) -> None:
    """SIGTERM to the head and every process it started (its own process group), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            return  # the whole group is gone
        try:
            head.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
