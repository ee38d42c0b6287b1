"""Stall telemetry: the figures are computed right, and one call tells who the bottleneck is."""

from __future__ import annotations

import logging
import time

import pytest

from psdp import DataLoader
from psdp._runtime import telemetry as telemetry_module
from psdp._runtime.telemetry import Telemetry
from tests.batch_checks import CountingSource, token_table


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_wait_fraction_is_waiting_over_trainer_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    t = Telemetry(stall_warning_s=None)
    # four steps of 100 ms each between next() returns; the trainer waited 10, 30, 0 and 20 ms
    for step, wait in enumerate([0.010, 0.030, 0.0, 0.020]):
        clock.now += 0.1
        t.record_next(step, wait, depth=step % 2)
        t.record_read(0.004, 0.001)
    stats = t.stats()
    # the first wait is start-up (no interval before it): (30 + 0 + 20) / 300
    assert stats.wait_fraction == pytest.approx(50 / 300)
    assert stats.bottleneck
    assert stats.step_ms_p50 == pytest.approx(80)  # own time: 100 - (30, 0, 20) -> 70, 100, 80
    assert stats.wait_ms_max == pytest.approx(30)
    assert stats.read_ms_p50 == pytest.approx(4) and stats.assemble_ms_p50 == pytest.approx(1)
    assert stats.queue_depth_mean == pytest.approx(0.5)
    assert (stats.steps_read, stats.steps_consumed) == (4, 4)
    assert str(stats).startswith("the loader IS the bottleneck: the trainer waited 16.7%")


def test_no_waiting_is_no_bottleneck(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    t = Telemetry(stall_warning_s=None)
    for step in range(5):
        clock.now += 0.05
        t.record_next(step, 0.0, depth=2)
    assert not t.stats().bottleneck
    assert str(t.stats()).startswith("the loader is not the bottleneck")


def test_empty_telemetry_is_all_zero():
    stats = Telemetry().stats()
    assert stats.steps_consumed == 0 and stats.wait_fraction == 0.0 and not stats.bottleneck


class SlowSource(CountingSource):
    def read(self, ids):
        if self.reads:  # not the constructor's probe
            time.sleep(0.05)
        return super().read(ids)


def test_a_slow_source_is_reported_as_the_bottleneck_and_warned_about(caplog, mesh_1d):
    loader = DataLoader(
        SlowSource(token_table(64)), mesh=mesh_1d, global_batch_size=8, stall_warning_s=0.01
    )
    with caplog.at_level(logging.WARNING, logger="psdp"), loader:
        for _, _batch in zip(range(5), loader, strict=False):
            pass  # a trainer that does no work: every step waits for a 50 ms read
    stats = loader.stats()
    assert stats.bottleneck and stats.wait_fraction > 0.5
    assert stats.read_ms_p50 >= 45
    assert "the trainer waited" in caplog.text and "the loader IS the bottleneck" in caplog.text


def test_a_slow_trainer_hides_the_loader(mesh_1d):
    loader = DataLoader(token_table(64), mesh=mesh_1d, global_batch_size=8, prefetch=2)
    with loader:
        it = iter(loader)
        for _ in range(7):
            # the train step lasts until the loader has filled its queue (2 batches) and read
            # one more, plus 20 ms: next() then never waits for a read
            deadline = time.monotonic() + 10
            while it.ready < 3 and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.02)
            next(it)
    stats = loader.stats()
    assert not stats.bottleneck
    assert stats.queue_depth_mean == 3  # every next() found prefetch + 1 batches ready


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("1", TypeError),
        (0, ValueError),
        (-1.0, ValueError),
        (True, TypeError),
        (float("nan"), ValueError),
    ],
)
def test_bad_stall_threshold_is_refused_up_front(bad, error, mesh_1d):
    with pytest.raises(error, match="stall_warning_s must be a positive number"):
        DataLoader(token_table(16), mesh=mesh_1d, global_batch_size=8, stall_warning_s=bad)


def test_reads_recorded_from_many_threads_are_all_counted():
    """Parallel reads call record_read from several threads while the trainer reads stats."""
    import threading

    t = Telemetry(window=100_000, stall_warning_s=None)
    threads_n, per_thread = 8, 2000

    def reader(i):
        for _ in range(per_thread):
            t.record_read(0.001 * (i + 1), 0.0005)

    workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads_n)]
    for w in workers:
        w.start()
    for step in range(200):  # the trainer side, concurrently
        t.record_next(step, 0.0, depth=1)
        t.stats()
    for w in workers:
        w.join()
    stats = t.stats()
    assert stats.steps_read == threads_n * per_thread
    assert stats.steps_consumed == 200
    # every thread's appends landed: the median of 8 equal-sized groups 1..8 ms is 4.5 ms
    assert stats.read_ms_p50 == pytest.approx(4.5)
    assert stats.assemble_ms_p50 == pytest.approx(0.5)


def test_a_bottleneck_verdict_says_which_half_to_fix(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    t = Telemetry(stall_warning_s=None)
    for step in range(3):
        clock.now += 0.01
        t.record_next(step, 0.008, depth=0)
        t.record_read(0.002, 0.009)
    assert str(t.stats()).endswith(
        "assembly dominates (9.00 ms vs 2.00 ms read): raise read_threads so batches assemble in "
        "parallel"
    )


def test_too_few_steps_give_no_verdict():
    t = Telemetry(stall_warning_s=None)
    assert str(t.stats()).startswith("too few steps to judge (0 batch taken)")
    t.record_next(0, 5.0, 0)  # one 5 s start-up wait: no interval to compare it with
    assert str(t.stats()).startswith("too few steps to judge (1 batch taken)")
