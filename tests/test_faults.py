"""Faults: a failing, a stuck or a dead reader ends in a clear error, never a hang or a wrong batch.

Each fault is injected where it happens in production: a source whose read raises at step k (a
disk or object-store error), a read that never returns (a hung NFS mount), ``close()`` from a
signal handler or watchdog thread while the trainer waits, Ctrl-C in the trainer, and a host of a
pod killed mid-run. The loose time bounds below are hang guards, not performance thresholds.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
import traceback

import pytest

from psdp import ArraySource, DataLoader, LoaderClosedError, MeshLayout
from psdp.tools.pod import STOPPED, PodError, run_pod
from tests.batch_checks import assert_batch_exact, expected_batch, token_table
from tests.pod_targets_reliability import killed_mid_run

B = 8
K = 3  # the faulty step
DATA = {"tokens": token_table(64, width=4)}


def _psdp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("psdp", "fault"))]


def _wait_for_no_threads(limit_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + limit_s
    while _psdp_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _psdp_threads()


class FaultySource:
    """Reads step ``K``'s rows (unshuffled) badly: ``raise`` after a delay, or ``block`` forever."""

    def __init__(self, how: str):
        self.rows = ArraySource(DATA)
        self.how = how
        self.release = threading.Event()  # set by the test: a blocked read then returns
        self.raised_at = 0.0

    def read(self, ids):
        if len(ids) > 1 and K * B <= ids.min() < (K + 1) * B:
            if self.how == "raise":
                self._disk_read_fails(ids)
            self.release.wait()
        return self.rows.read(ids)

    def __len__(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        return f"FaultySource({self.how})"

    def _disk_read_fails(self, ids):
        time.sleep(0.3)  # the trainer is already waiting for this step
        self.raised_at = time.perf_counter()
        raise OSError(f"EIO reading rows {ids.min()}-{ids.max()} from shard 7")


def _take_good_steps(mesh, iterator, count: int) -> None:
    """The first ``count`` batches of a loader of ``DATA`` on ``mesh``, batches of `B` in source
    order (every test's settings), each exact."""
    for step in range(count):
        want = expected_batch(DATA, step, mesh=mesh, global_batch_size=B, shuffle=False)
        assert_batch_exact(next(iterator), want)


@pytest.mark.parametrize(("read_threads", "prefetch"), [(1, 1), (1, 4), (3, 2)])
def test_a_source_error_reaches_the_trainer_at_its_step_with_its_traceback(
    read_threads, prefetch, mesh_2d
):
    source = FaultySource("raise")
    with DataLoader(
        source, mesh=mesh_2d, global_batch_size=B, shuffle=False, read_threads=read_threads,
        prefetch=prefetch,
    ) as loader:  # fmt: skip
        iterator = iter(loader)
        _take_good_steps(mesh_2d, iterator, K)  # steps before the failure are delivered, exact
        with pytest.raises(OSError, match="EIO reading rows 24-31 from shard 7") as info:
            next(iterator)
        latency = time.perf_counter() - source.raised_at
        frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
        assert frames[-1] == "_disk_read_fails" and "read" in frames  # the source's own frames
        with pytest.raises(LoaderClosedError, match="step 3 raised OSError"):
            next(iterator)  # the iterator is done: no later batch slips through
    assert latency < 5, latency  # hang guard; measured ~1 ms
    assert _wait_for_no_threads() == []


@pytest.mark.parametrize("read_threads", [1, 3])
def test_a_read_that_never_returns_times_out_naming_step_and_rows(read_threads, mesh_2d):
    source = FaultySource("block")
    try:
        with DataLoader(
            source, mesh=mesh_2d, global_batch_size=B, shuffle=False, read_timeout_s=0.5,
            read_threads=read_threads,
        ) as loader:  # fmt: skip
            iterator = iter(loader)
            _take_good_steps(mesh_2d, iterator, K)
            with pytest.raises(TimeoutError) as info:
                next(iterator)
        message = str(info.value)
        for fragment in (
            "step 3",
            "8 rows",
            "ids [24, 25",
            "read_timeout_s=0.5",
            "FaultySource(block)",
        ):
            assert fragment in message, message
    finally:
        source.release.set()  # the abandoned read returns; its thread ends
    assert _wait_for_no_threads() == []


class UnansweredStore(ArraySource):
    """A store that does not answer: every read waits until the test releases it (at most
    ``answer_after_s``, so that an unbounded constructor ends and the test fails instead of
    hanging)."""

    def __init__(self, answer_after_s: float = 20.0):
        super().__init__(DATA)
        self.answer_after_s = answer_after_s
        self.release = threading.Event()
        self.reads = 0

    def read(self, ids):
        self.reads += 1
        self.release.wait(self.answer_after_s)
        return super().read(ids)

    def describe(self) -> str:
        return "UnansweredStore(tokens)"


def _restored(source, mesh, **options):
    with DataLoader(ArraySource(DATA), mesh=mesh, global_batch_size=B) as saved:
        state = saved.state()
    return DataLoader.restore(state, source, mesh=mesh, **options)


@pytest.mark.parametrize("how", ["build", "restore"])
@pytest.mark.parametrize(
    ("options", "limit"),
    [
        ({"read_timeout_s": 0.5}, "read_timeout_s=0.5"),
        ({"read_timeout_s": 60, "first_read_timeout_s": 0.5}, "first_read_timeout_s=0.5"),
    ],
    ids=["read_timeout_s", "first_read_timeout_s"],
)
def test_building_or_restoring_from_a_store_that_never_answers_times_out(
    how, options, limit, mesh_2d
):
    """Construction reads row 0 for the leaves' shapes, within the first read's time limit."""
    source = UnansweredStore()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as info:
            if how == "build":
                DataLoader(source, mesh=mesh_2d, global_batch_size=B, **options)
            else:
                _restored(source, mesh_2d, **options)
        elapsed = time.monotonic() - started
    finally:
        source.release.set()  # the abandoned read returns; its thread ends
    message = str(info.value)
    for fragment in ("the first read (row 0", "UnansweredStore(tokens)", f"longer than {limit}"):
        assert fragment in message, message
    assert f"raise {limit.split('=')[0]}" in message, message  # the fix
    assert elapsed < 10, elapsed  # hang guard: the store answers only after 20 s
    assert _wait_for_no_threads() == []
    assert source.reads == 1  # the abandoned read was not tried again


def test_close_from_another_thread_wakes_a_blocked_next(caplog, mesh_2d):
    source = FaultySource("block")
    loader = DataLoader(source, mesh=mesh_2d, global_batch_size=B, shuffle=False)
    iterator = iter(loader)
    _take_good_steps(mesh_2d, iterator, K)
    closer = threading.Timer(0.3, loader.close)
    closer.name = "fault-closer"
    try:
        with caplog.at_level(logging.WARNING, logger="psdp._runtime.prefetch"):
            closer.start()
            with pytest.raises(LoaderClosedError, match="close\\(\\) was called"):
                next(iterator)  # blocked on step 3's read until close() wakes it
            closer.join(10)
            assert not closer.is_alive()  # close() returned although the read is still stuck
        assert "did not stop" in caplog.text  # ... and said so
        with pytest.raises(LoaderClosedError, match="create a new DataLoader"):
            loader.iter_from(K)
    finally:
        source.release.set()
    assert _wait_for_no_threads() == []


TRAINER = """
import signal, sys, threading, time
# a job started in the background by a non-interactive shell (as CI may be) inherits SIGINT
# ignored; a trainer run by hand has Python's handler, which this test is about
signal.signal(signal.SIGINT, signal.default_int_handler)
import jax, numpy as np
from jax.sharding import Mesh
from psdp import ArraySource, DataLoader

variant = sys.argv[1]

class Source(ArraySource):
    def read(self, ids):
        if variant == "stuck read" and len(ids) > 1 and ids.min() >= 24:
            threading.Event().wait()  # a read that never returns
        time.sleep(0.02)
        return super().read(ids)

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
loader = DataLoader(Source({"tokens": np.arange(64 * 4, dtype=np.int32).reshape(64, 4)}), mesh=mesh,
                    global_batch_size=8, shuffle=False, read_threads=2)
try:
    if variant == "no close":
        for step, batch in enumerate(loader):
            print("step", step, flush=True)
            time.sleep(0.05)
    else:
        with loader:
            for step, batch in enumerate(loader):
                print("step", step, flush=True)
                time.sleep(0.05)
except KeyboardInterrupt:
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("psdp"))
    print("interrupted; psdp threads alive:", names, flush=True)
    raise
"""


@pytest.mark.parametrize("variant", ["with", "no close", "stuck read"])
def test_ctrl_c_in_the_trainer_ends_the_threads_and_the_process(tmp_path, variant):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), variant],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    guard = threading.Timer(120, proc.kill)  # hang guard: a child that never prints dies
    guard.name = "fault-guard"
    guard.start()
    try:
        lines = []
        while not lines or lines[-1] != "step 2":
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line.strip())
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)  # hang guard
        exited_s = time.monotonic() - interrupted
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGINT, out  # died of the Ctrl-C, as Python does
    assert "KeyboardInterrupt" in out
    if variant == "with":
        assert "psdp threads alive: []" in out  # close() joined them before the process ended
    elif variant == "stuck read":
        assert "did not stop within" in out  # close() gave up on the stuck read after 1 s ...
    assert exited_s < 30, exited_s  # ... and its daemon thread did not keep the process alive


@pytest.mark.timeout(180)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("sigkill", "process 1 exited with status -9: killed by signal SIGKILL"),
        ("exit", "process 1 exited with status 7"),
    ],
)
def test_a_process_killed_mid_run_stops_the_pod_with_a_clear_error(how, reason):
    layout = MeshLayout.contiguous({"data": 4, "model": 2}, 2)
    started = time.monotonic()
    with pytest.raises(PodError) as info:
        run_pod(
            killed_mid_run,
            num_processes=2,
            devices_per_process=4,
            args=dict(
                process_index=layout.process_index.tolist(),
                mesh_shape=[4, 2],
                num_rows=27,
                steps=100_000,  # never ends by itself: process 0 must be stopped
                kill_at=5,
                how=how,
            ),
            timeout_s=120,
        )
    elapsed = time.monotonic() - started
    assert info.value.reason.startswith(reason), info.value.reason
    survivor_status, survivor_output = info.value.outputs[0]
    assert survivor_status in (STOPPED, -signal.SIGKILL), survivor_output
    if survivor_status == STOPPED:
        assert f"process 0 stops: {reason}" in survivor_output
    assert elapsed < 60, elapsed  # bounded by the pod's grace period, far below timeout_s
