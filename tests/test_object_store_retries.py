"""Retries, the first batch's grace and the store counts, without a server: sources that fail on
purpose. Rows are checked against the numpy table the source holds."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh

from psdp import DataLoader
from psdp._plan.leaves import leaves_of
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.options import LoaderOptions
from psdp._runtime.feeds import open_feed
from psdp._runtime.step_reader import StepReader
from psdp._runtime.telemetry import LoaderStats, Telemetry
from psdp.sources import ArraySource
from psdp.sources.stores.errors import (
    MAX_BACKOFF_S,
    TransientReadError,
    backoff_s,
    is_transient,
    is_transient_status,
)


class Flaky(ArraySource):
    """Raises ``errors`` (one per read, in order) on the reads after the loader's probe."""

    def __init__(self, data, errors=(), delays=()):
        super().__init__(data)
        self.errors, self.delays, self.calls = list(errors), list(delays), 0

    def read(self, ids):
        self.calls += 1
        if self.calls > 1 and self.delays:
            time.sleep(self.delays.pop(0))
        if self.calls > 1 and self.errors:
            raise self.errors.pop(0)
        return super().read(ids)


def _reader(source, telemetry, **options):
    probe = leaves_of(source.read(np.zeros(1, np.int64)))
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    plan = LoaderPlan.create(
        probe,
        mesh,
        LoaderOptions.create(global_batch_size=8, shuffle=False, **options),
        0,
        stream=False,
        ends_short=False,
    )
    feed = open_feed(source, plan.options.order)
    feed.start({8: plan}, None)  # the plan of each batch size
    return StepReader(plan, feed, plan.options.reading.read_timeout_s, telemetry)


def test_transient_errors_are_retried_and_counted():
    table = np.arange(32, dtype=np.int32)
    errors = [ConnectionResetError("reset"), TransientReadError("503 SlowDown")]
    source = Flaky(table, errors)
    telemetry = Telemetry(stall_warning_s=None)
    reader = _reader(source, telemetry, read_attempts=3, retry_backoff_s=None)
    ids, buffers = reader.read_step(1, "r", lambda: False)
    np.testing.assert_array_equal(np.concatenate(buffers[None]), table[8:16])
    assert source.calls == 1 + 3  # the probe, two failures, the read that worked
    assert telemetry.stats().retried_reads == 2


def test_a_permanent_error_fails_at_once_naming_the_step():
    source = Flaky(np.arange(32, dtype=np.int32), [KeyError("object c/0/1 is gone")])
    reader = _reader(source, Telemetry(stall_warning_s=None), read_attempts=5)
    with pytest.raises(KeyError, match="c/0/1") as caught:
        reader.read_step(2, "r", lambda: False)
    assert source.calls == 2  # one try only
    assert caught.value.__notes__ == [
        "psdp: step 2: reading 8 rows (ids [16, 17, 18, 19, 20, 21]...) from "
        "ArraySource(int32[32])"
    ]


def test_the_budget_ends_the_retries():
    errors = [ConnectionResetError(f"reset {i}") for i in range(5)]
    source = Flaky(np.arange(32, dtype=np.int32), errors)
    reader = _reader(source, Telemetry(stall_warning_s=None), read_attempts=3, retry_backoff_s=None)
    with pytest.raises(ConnectionResetError, match="reset 2") as caught:
        reader.read_step(0, "r", lambda: False)
    assert source.calls == 1 + 3
    assert "(try 3 of 3)" in caught.value.__notes__[0]


def test_a_closed_loader_stops_retrying():
    errors = [ConnectionResetError("reset")] * 3
    source = Flaky(np.arange(32, dtype=np.int32), errors)
    reader = _reader(source, None, read_attempts=10, retry_backoff_s=1000)  # a long pause...
    with pytest.raises(ConnectionResetError):
        reader.read_step(0, "r", lambda: True)  # ...never taken: the loader is closing
    assert source.calls == 2


@given(attempt=st.integers(1, 80), base=st.floats(0.001, 100), draw=st.floats(0.5, 1.0))
def test_backoff_doubles_is_capped_and_jittered(attempt, base, draw):
    ceiling = min(MAX_BACKOFF_S, base * 2.0 ** (attempt - 1))
    assert backoff_s(attempt, base, draw) == pytest.approx(ceiling * draw)
    assert backoff_s(attempt, None, draw) == 0.0


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionResetError(), True),
        (ConnectionAbortedError(), True),
        (TimeoutError(), True),  # a socket timeout inside the read (not the loader's own limit)
        (TransientReadError("x"), True),
        (ValueError("NOT_FOUND: gone"), False),
        (OSError("disk"), False),
        (KeyError(3), False),
    ],
)
def test_which_errors_are_transient(error, transient):
    assert is_transient(error) is transient


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("UNAVAILABLE: CURL error Empty reply from server", True),
        ("ABORTED: All 32 retry attempts failed: SlowDown [http_response_code='503']", True),
        ("DEADLINE_EXCEEDED: timed out", True),
        ("RESOURCE_EXHAUSTED: 429", True),
        ('NOT_FOUND: chunk in "ds/c/1/0" is missing', False),
        # a status word later on, e.g. in a path, is no status: only the code at the start is
        ('NOT_FOUND: chunk in local file "/data/UNAVAILABLE/ds/c/1/0" is missing', False),
        ("DATA_LOSS: Checksum mismatch in s3://b/ABORTED/c/0 (RESOURCE_EXHAUSTED?)", False),
        ("Error reading: DEADLINE_EXCEEDED", False),
        ("DATA_LOSS: Checksum mismatch", False),
        ("PERMISSION_DENIED: 403", False),
        # a reply cut or garbled mid-way: curl 8, which TensorStore calls UNKNOWN, is transient
        ("UNKNOWN: CURL error Weird server reply: Invalid status line [curl_code='8']", True),
        (
            "UNKNOWN: Error writing \"ds/c/0\": CURL error Weird server reply [curl_code='8'] "
            "[tensorstore_spec='{}']",
            True,
        ),  # fmt: skip
        ("UNKNOWN: CURL error URL using bad/illegal format [curl_code='3']", False),
        ("NOT_FOUND: \"ds/[curl_code='8']/c/0\" is missing", False),
        ("UNKNOWN: cannot decode \"ds/[curl_code='8']/c/0\"", False),  # no curl error: a path
    ],
)
def test_which_tensorstore_errors_are_transient(message, transient):
    assert is_transient_status(message) is transient


def test_a_permanent_store_error_naming_a_transient_status_in_its_path_is_tried_once(
    tmp_path, mesh_1d
):
    """A local TensorStore dataset under a directory named UNAVAILABLE with a shard file gone:
    its NOT_FOUND message holds the word in the path, and the read is tried once, not
    read_attempts times."""
    from psdp.sources import TensorStoreSource
    from psdp.sources.stores.writer import write_dataset

    class Counting(TensorStoreSource):
        calls = 0

        def read(self, ids):
            self.calls += 1
            return super().read(ids)

    path = tmp_path / "UNAVAILABLE" / "ds"
    data = {"tokens": np.arange(64 * 4, dtype=np.int32).reshape(64, 4)}
    write_dataset(path, data, rows_per_shard=16, progress=False)
    source = Counting(str(path))  # opened whole: then the shard file goes
    (path / "tokens" / "c" / "2" / "0").unlink()  # rows 32-47
    with DataLoader(source, mesh=mesh_1d, global_batch_size=16, shuffle=False, read_attempts=5,
                    retry_backoff_s=None) as loader:  # fmt: skip
        source.calls = 0
        with pytest.raises(ValueError, match=r"NOT_FOUND.*UNAVAILABLE.*is missing") as caught:
            loader.batch_at(2)
    assert source.calls == 1
    assert not any("(try" in note for note in caught.value.__notes__)


def test_the_first_batch_gets_its_grace(mesh_1d):
    table = np.arange(64, dtype=np.int32)
    # the first step's read is slow (a cold cache), later ones are fast, then one is stuck
    slow = Flaky(table, delays=[1.0, 0.0, 0.0, 5.0])
    options = dict(global_batch_size=8, shuffle=False, read_timeout_s=0.5)
    with pytest.raises(TimeoutError, match=r"step 0: .* took longer than read_timeout_s=0.5"):
        DataLoader(slow, mesh=mesh_1d, **options).batch_at(0)
    slow = Flaky(table, delays=[1.0, 0.0, 0.0, 5.0])
    loader = DataLoader(slow, mesh=mesh_1d, first_read_timeout_s=30, **options)
    for step in range(3):
        np.testing.assert_array_equal(
            np.asarray(loader.batch_at(step)), table[step * 8 : step * 8 + 8]
        )
    with pytest.raises(TimeoutError, match=r"step 3: .* took longer than read_timeout_s=0.5"):
        loader.batch_at(3)  # the grace is over


def test_a_slow_first_batch_names_the_grace():
    slow = Flaky(np.arange(16, dtype=np.int32), delays=[5.0])
    reader = _reader(slow, None, read_timeout_s=60, first_read_timeout_s=0.3)
    with pytest.raises(TimeoutError, match="took longer than first_read_timeout_s=0.3"):
        reader.read_step(0, "r", lambda: False)


def test_the_store_counts_are_per_step_and_start_with_the_loader():
    class Counted(ArraySource):
        remote = True  # only a remote source's counters are collected

        count = 100  # requests made before this loader: not its own

        @staticmethod
        def request_counts():
            Counted.count += 3
            return Counted.count, 1

    telemetry = Telemetry(stall_warning_s=None)
    reader = _reader(Counted(np.arange(32, dtype=np.int32)), telemetry)
    for step in range(4):
        reader.read_step(step, "r", lambda: False)
        telemetry.record_read(0.001, 0.001)
    stats = telemetry.stats()
    assert stats.store_requests_per_step == 3.0 and stats.store_retries == 0
    assert "3.0 store requests per step" in str(stats)


def test_stats_text_names_the_retries():
    stats = LoaderStats(10, 10, 0, 0, 0, 0.0, 20, 5, 5, 1, 1, 2.0, False, 3, 12.5, 7)
    assert str(stats).endswith(
        "; 12.5 store requests per step; 7 requests retried by the store; 3 reads retried by psdp"
    )


def test_the_first_read_is_retried_too_and_a_permanent_one_fails_at_once(mesh_1d):
    """The probe (row 0, read when the loader is built) follows the same rule as a step's reads:
    a throttled object store does not make building the loader fail."""

    class FirstReadsFail(ArraySource):
        def __init__(self, data, errors):
            super().__init__(data)
            self.errors = list(errors)

        def read(self, ids):
            if self.errors:
                raise self.errors.pop(0)
            return super().read(ids)

    data = np.arange(32, dtype=np.int32)
    source = FirstReadsFail(data, [ConnectionResetError("reset"), TransientReadError("503")])
    with DataLoader(source, mesh=mesh_1d, global_batch_size=8, shuffle=False,
                    retry_backoff_s=0.001) as loader:  # fmt: skip
        assert np.asarray(loader.batch_at(1)).tolist() == data[8:16].tolist()
    assert not source.errors
    gone = FirstReadsFail(data, [KeyError("object c/0 is gone"), ConnectionResetError("x")])
    with pytest.raises(KeyError, match="c/0 is gone") as caught:
        DataLoader(gone, mesh=mesh_1d, global_batch_size=8, retry_backoff_s=0.001)
    assert "the first read (row 0" in "".join(caught.value.__notes__)
    assert len(gone.errors) == 1  # not retried
