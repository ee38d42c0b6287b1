"""Streams: uid sharding (round-robin or the user's own), resume by skipping, and loud errors.

Every element's values name it (element ``k`` is token row ``k``), so each test checks exactly which
elements a shard got and in what order, never only how many. The multi-process test runs the
DataLoader on the 4-host non-contiguous pod, where two hosts share each uid.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from psdp.sources import StreamReader, StreamSource
from psdp.tools.pod import run_pod
from tests.batch_checks import NONCONTIGUOUS_4x2, run_on_noncontiguous_pod, token_table
from tests.pod_targets_streams import (
    stream_loader_exact,
    stream_runs_to_its_end,
    stream_uid_shards,
)

TABLE = token_table(23, width=4)


def elements(n: int = 23) -> list[dict[str, np.ndarray]]:
    """Element ``k``: ``{"tokens": token row k (int32[4]), "id": k (int64 scalar)}``."""
    return [{"tokens": TABLE[k], "id": np.int64(k)} for k in range(n)]


def read_all(reader: StreamReader, chunk: int) -> list[int]:
    """The ids of every remaining element, taken ``chunk`` at a time, each take checked."""
    ids: list[int] = []
    while (rows := reader.take(chunk)) is not None:
        assert 1 <= len(rows["id"]) <= chunk
        np.testing.assert_array_equal(rows["tokens"], TABLE[rows["id"]])
        ids += rows["id"].tolist()
    assert reader.take(chunk) is None  # stays ended
    return ids


def by_files(shard: int, num_shards: int):
    """A user's own sharding: 6 "files" of 4 elements, file f read by shard f % num_shards."""
    for f in range(shard, 6, num_shards):
        for k in range(4 * f, min(4 * f + 4, 23)):
            yield {"tokens": TABLE[k], "id": np.int64(k)}


# ---------------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("num_shards", [1, 2, 3, 5, 23, 30])
@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_round_robin_shards_are_exact(num_shards, chunk):
    source = StreamSource(elements())
    seen = []
    for shard in range(num_shards):
        reader = source.open(shard, num_shards)
        ids = read_all(reader, chunk)
        # element k goes to shard k % n, in whole rounds: the incomplete last round is dropped
        whole = 23 - 23 % num_shards
        assert ids == list(range(shard, whole, num_shards))
        assert reader.consumed == len(ids) == whole // num_shards  # every shard equally long
        seen += ids
    assert sorted(seen) == list(range(whole))  # disjoint, and complete up to the last round


def test_round_robin_over_an_array_and_scalars():
    rows = StreamSource(TABLE).open(1, 3).take(3)
    assert isinstance(rows, np.ndarray) and rows.dtype == np.int32
    np.testing.assert_array_equal(rows, TABLE[[1, 4, 7]])
    ids = StreamSource(range(10)).open(0, 4).take(10)  # Python ints: one int64 per row
    assert ids.tolist() == [0, 4] and ids.shape == (2,)  # the round 8, 9 is incomplete: dropped


def test_callable_sharding_is_the_users_own():
    calls = []

    def shard_fn(shard, num_shards):
        calls.append((shard, num_shards))
        return by_files(shard, num_shards)

    source = StreamSource(shard_fn, name="files")
    assert read_all(source.open(0, 2), 3) == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert read_all(source.open(1, 2), 5) == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22]
    assert calls == [(0, 2), (1, 2)]  # once per open, never round-robin on top
    assert source.describe() == "StreamSource(files, sharded by a callable)"
    assert not source.round_robin


def test_readers_of_one_shard_are_independent():
    source = StreamSource(elements())
    a, b = source.open(2, 3), source.open(2, 3)
    assert a.take(2)["id"].tolist() == [2, 5]
    assert b.take(3)["id"].tolist() == [2, 5, 8]  # b restarted the stream, a did not move it
    assert a.take(1)["id"].tolist() == [8]


# ------------------------------------------------------------------------- skip and resume
@pytest.mark.parametrize("kind", ["round-robin", "callable"])
@pytest.mark.parametrize("rows_per_step", [1, 3])
def test_resume_by_skipping_equals_continuous_reading(kind, rows_per_step):
    source = StreamSource(elements() if kind == "round-robin" else by_files)
    for shard in range(2):
        continuous = source.open(shard, 2)
        steps = []
        while (rows := continuous.take(rows_per_step)) is not None:
            steps.append(rows["id"].tolist())
        for step in range(len(steps) + 2):  # resume at every step, and past the end
            resumed = source.open(shard, 2, start=step * rows_per_step)
            got = []
            while (rows := resumed.take(rows_per_step)) is not None:
                got.append(rows["id"].tolist())
            assert got == steps[step:], (shard, step)


def test_consumed_counts_skipped_and_taken_elements():
    reader = StreamSource(elements()).open(0, 2, start=5)  # shard 0: 11 whole rounds of 2
    assert reader.consumed == 5
    assert reader.take(4)["id"].tolist() == [10, 12, 14, 16]
    assert reader.consumed == 9
    assert reader.take(10)["id"].tolist() == [18, 20]  # element 22's round is incomplete
    assert reader.consumed == 11
    past = StreamSource(elements()).open(0, 2, start=50)
    assert past.consumed == 11 and past.take(1) is None  # the shard had fewer than start


def test_take_zero_looks_without_consuming():
    reader = StreamSource(elements()).open(1, 2)
    empty = reader.take(0)
    assert empty["tokens"].shape == (0, 4) and empty["tokens"].dtype == np.int32
    assert empty["id"].shape == (0,) and reader.consumed == 0
    assert reader.take(2)["id"].tolist() == [1, 3]  # the looked-at element is still first
    assert StreamSource([]).open(0, 1).take(0) is None


def test_concurrent_takes_get_disjoint_consecutive_elements():
    reader = StreamSource(np.arange(460)).open(0, 1)
    taken: list[list[int]] = []

    def worker():
        while (rows := reader.take(7)) is not None:
            taken.append(rows.tolist())  # list.append is atomic

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for chunk in taken for i in chunk) == list(range(460))
    assert all(c == list(range(c[0], c[0] + len(c))) for c in taken)  # each take is a run
    assert reader.consumed == 460


def test_close_runs_the_generators_finally():
    closed = []

    def shard_fn(shard, num_shards):
        try:
            yield from range(shard, 100, num_shards)
        finally:
            closed.append(shard)

    with StreamSource(shard_fn).open(1, 3) as reader:
        assert reader.take(2).tolist() == [1, 4]
    assert closed == [1]
    reader.close()  # idempotent
    with pytest.raises(ValueError, match=r"shard 1 of 3: this reader is closed; open a new one"):
        reader.take(1)


# ----------------------------------------------------------------------------------- errors
def test_one_shot_iterators_are_refused():
    def gen():
        yield from elements()

    with pytest.raises(TypeError, match=r"one-shot iterator \(generator\).*lambda shard, num_"):
        StreamSource(gen())
    with pytest.raises(TypeError, match=r"one-shot iterator \(list_iterator\)"):
        StreamSource(iter(elements()))
    with pytest.raises(TypeError, match=r"gen\(\) cannot take those two arguments"):
        StreamSource(gen)  # a generator function of no arguments


@pytest.mark.parametrize(
    ("stream", "error", "message"),
    [
        ({"tokens": TABLE}, TypeError, r"got a dict.*pass it to DataLoader directly"),
        (42, TypeError, r"a re-iterable or a callable .* got int"),
    ],
)
def test_bad_streams_are_refused(stream, error, message):
    with pytest.raises(error, match=message):
        StreamSource(stream)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((2, 2), ValueError, r"shard must be in \[0, 1\] for num_shards=2, got 2"),
        ((-1, 2), ValueError, r"shard must be >= 0, got -1"),
        ((0, 0), ValueError, r"num_shards must be >= 1, got 0"),
        ((0, 2, -3), ValueError, r"start must be >= 0, got -3"),
        ((0.0, 2), TypeError, r"shard must be an int, got float"),
        ((0, True), TypeError, r"num_shards must be an int, got bool"),
    ],
)
def test_open_validates_its_arguments(args, error, message):
    with pytest.raises(error, match=message):
        StreamSource(elements()).open(*args)


def test_take_validates_n():
    reader = StreamSource(elements()).open(0, 1)
    with pytest.raises(ValueError, match=r"n must be >= 0, got -1"):
        reader.take(-1)
    with pytest.raises(TypeError, match=r"n must be an int, got float"):
        reader.take(2.0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"tokens": np.zeros(5, np.int32), "id": np.int64(0)},
            r"has leaf 'tokens' int32\[5\] but element 0 \(element 1 of the stream\) had int32\[4\]",
        ),
        (
            {"tokens": np.zeros(4, np.int64), "id": np.int64(0)},
            r"has leaf 'tokens' int64\[4\] but element 0 \(element 1 of the stream\) had int32\[4\]",
        ),
        (
            {"tokens": np.zeros(4, np.int32)},
            r"is a dict with leaves \['tokens'\] but element 0 \(.*\) was a dict with leaves \['id', 'tok",
        ),
        (
            np.zeros(4, np.int32),
            r"is an array int32\[4\] but element 0 \(element 1 of the stream\) was a dict",
        ),
    ],
)
def test_an_element_that_changes_is_named(bad, message):
    # element 7 of the stream is shard 1's element 3 (shards of 2, round-robin)
    stream = elements()
    stream[7] = bad
    reader = StreamSource(stream, name="corpus").open(1, 2)
    assert reader.take(3)["id"].tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match=message) as info:
        reader.take(3)
    text = str(info.value)
    assert text.startswith(
        "StreamSource(corpus, round-robin over a re-iterable), shard 1 of 2: element 3 "
        "(element 7 of the stream) "
    )
    assert "must have the same leaves, shapes and dtypes" in text


def test_a_callable_element_that_changes_is_named_by_its_shard_position():
    def shard_fn(shard, num_shards):
        yield np.zeros(3, np.float32)
        yield np.zeros(3, np.float32)
        yield np.zeros(2, np.float32)

    with pytest.raises(ValueError, match=r"shard 0 of 4: element 2 is float32\[2\] but element 0"):
        StreamSource(shard_fn).open(0, 4).take(5)


@pytest.mark.parametrize(
    ("element", "message"),
    [
        ("some text", r"element 0 has dtype <U9; stream elements must be numeric or bool"),
        ({"x": None}, r"element 0 leaf 'x' has dtype object"),
        ([[1, 2], [3]], r"element 0 is not an array .*inhomogeneous.*pad it to one shape"),
        ({}, r"element 0 is an empty dict"),
    ],
)
def test_elements_that_are_not_numeric_rows(element, message):
    with pytest.raises((TypeError, ValueError), match=message):
        StreamSource([element]).open(0, 1).take(1)


def test_errors_from_the_users_iterator_say_where_they_happened():
    def shard_fn(shard, num_shards):
        yield 0
        raise OSError("connection reset")

    reader = StreamSource(shard_fn, name="web").open(1, 2)
    assert reader.take(1).tolist() == [0]
    with pytest.raises(OSError, match="connection reset") as info:
        reader.take(1)
    assert info.value.__notes__ == [
        "while reading element 1 of StreamSource(web, sharded by a callable), shard 1 of 2"
    ]

    def broken_open(shard, num_shards):
        raise FileNotFoundError("shard-00001.txt")

    with pytest.raises(FileNotFoundError) as info:
        StreamSource(broken_open, name="files").open(1, 2)
    assert info.value.__notes__ == [
        "while opening StreamSource(files, sharded by a callable), shard 1 of 2"
    ]
    with pytest.raises(TypeError, match=r"shard 0 of 1: the stream callable returned a NoneType"):
        StreamSource(lambda shard, n: None).open(0, 1)


# ----------------------------------------------------------------------------- multi-process
@pytest.mark.timeout(240)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
def test_uid_shards_on_the_noncontiguous_pod():
    """Without the loader: hosts open shard uid of num_uids; equal uids read equal elements."""
    results = run_pod(
        stream_uid_shards,
        num_processes=4,
        devices_per_process=2,
        args=dict(process_index=NONCONTIGUOUS_4x2, num_elements=37, rows_per_step=4, steps=3),
        timeout_s=180,
    )
    assert [(r["uid"], r["num_uids"]) for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    ids = [r["ids"] for r in results]
    assert ids[0] == ids[1] == list(range(0, 24, 2))  # uid 0: elements 0, 2, 4, ...
    assert ids[2] == ids[3] == list(range(1, 25, 2))
    assert [r["resumed"] for r in results] == [r["ids"][8:] for r in results]


@pytest.mark.multiprocess
def test_loader_feeds_streams_by_uid_on_the_noncontiguous_pod():
    """DataLoader(StreamSource) on data=4 x model=2 over 4 hosts: exact rows on every device."""
    results = run_on_noncontiguous_pod(
        stream_loader_exact,
        num_elements=80,  # 40 per uid, 8 per host per step: 5 whole steps
        batch_size=16,
        steps=4,
        resume_step=2,
    )
    assert [r["uid"] for r in results] == [0, 0, 1, 1]
    # 3 leaves (with the mask) x 2 local devices x (4 steps + 1 resumed step), each checked
    # element by element
    assert [r["shards"] for r in results] == [30] * 4
    # hosts with the same uid got identical batches; different uids disjoint ones
    assert results[0]["ids"] == results[1]["ids"] != results[2]["ids"] == results[3]["ids"]
    assert not set(results[0]["ids"]) & set(results[2]["ids"])


# ------------------------------------------------------------------- streams on a pod's layout
def test_stream_shards_follow_the_uids_and_refuse_unequal_hosts():
    from jax.sharding import PartitionSpec as P

    from psdp._plan.layout import MeshLayout
    from psdp._plan.reads import stream_shard

    layout = MeshLayout(np.array(NONCONTIGUOUS_4x2), ("data", "model"))
    got = [stream_shard({"x": P("data")}, layout, p, 16, np.arange(16)) for p in range(4)]
    assert got == [(0, 2), (0, 2), (1, 2), (1, 2)]
    # a replicated leaf next to a batch-split one: hosts would need other shards' elements
    with pytest.raises(ValueError, match="same mesh axes.*replicated or differently split"):
        stream_shard({"x": P("data"), "r": P()}, layout, 0, 16, np.arange(16))
    # 6 rows on 4 batch shards (physical 8): hosts 0, 1 read 3 rows, hosts 2, 3 read 3 too, but
    # 10 rows on 4 shards (physical 12): 6 against 4, so their shards would end at other steps
    with pytest.raises(
        ValueError, match=r"the same number of real rows per step, but they read \[4, 6\]"
    ):
        stream_shard({"x": P("data")}, layout, 0, 12, np.arange(10))
    # feeding only host 0's shards: hosts 2 and 3 would read nothing and never see the end
    with pytest.raises(ValueError, match=r"read \[0, 8\]"):
        stream_shard({"x": P("data")}, layout, 0, 16, np.array([0, 1, 2, 3, 8, 9, 10, 11]))
    overlapping = MeshLayout(np.array([[0, 0], [0, 1], [1, 1], [1, 0]]), ("data", "model"))
    with pytest.raises(ValueError, match="overlapping but different sets of batch shards"):
        stream_shard({"x": P("data")}, overlapping, 0, 8, np.arange(8))


def test_closing_a_loader_does_not_wait_for_a_stuck_stream_read(mesh_1d):
    import time

    from psdp import DataLoader

    release = threading.Event()

    def stuck_after_16(shard, num_shards):
        for k in range(10**6):
            if k == 16:
                release.wait(60)  # a hung remote read
            yield {"x": np.int32(k)}

    loader = DataLoader(StreamSource(stuck_after_16), mesh=mesh_1d, global_batch_size=8,
                        drop_last=True, read_timeout_s=0.5)  # fmt: skip
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(TimeoutError, match="the next 8 elements of shard 0"):
        next(it)
    started = time.perf_counter()
    loader.close()
    assert time.perf_counter() - started < 5  # not the 60 s the read is stuck for
    release.set()


@pytest.mark.multiprocess
def test_every_host_reaches_the_end_of_a_round_robin_stream_at_the_same_step():
    # 33 elements over 2 uids: whole rounds give each shard 16 (element 32 is dropped); dealt one
    # by one, uid 0 would get 17, run one step longer than uid 1 and hang the collective
    results = run_on_noncontiguous_pod(
        stream_runs_to_its_end, num_elements=33, batch_size=8, timeout_s=60
    )
    assert [r["batches"] for r in results] == [4] * 4  # 4 rows per host per step
    assert all(r["real_rows"] == [8, 8, 8, 8] for r in results)
    # and a short end is padded on every host alike: 38 elements, 19 per shard, 4 + 3 rows
    results = run_on_noncontiguous_pod(
        stream_runs_to_its_end, num_elements=38, batch_size=8, timeout_s=60
    )
    assert all(r["real_rows"] == [8, 8, 8, 8, 6] for r in results)
