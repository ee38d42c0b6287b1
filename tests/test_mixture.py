"""The mixture map and the `Mixture` source, against the block-walking oracle (tests/mixture_oracle.py):
exact counts in every block, realised weights, each source's rows once per its own epoch, the
map itself, counts without reading, and one batched read per source."""

from __future__ import annotations

import sys
import threading
import tracemalloc
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from psdp import ArraySource, Mixture, OrderOptions
from psdp._plan.index_shuffle import shuffle_each
from psdp._plan.mixture import MixturePlan, block_counts, stage_counts, stages_from
from psdp._runtime.feeds import open_feed
from psdp.sources.views.mixture import SOURCE_READS_AT_ONCE
from tests import shuffle_oracle
from tests.batch_checks import CountingSource, token_table
from tests.mixture_oracle import OracleMixture, largest_remainder
from tests.oracle import schedule_spans

NAMES = ("web", "code", "books")
LENGTHS = (97, 40, 13)
STAGES = [
    (0, {"web": 0.5, "code": 0.3, "books": 0.2}),
    (640, {"web": 0.1, "books": 0.9}),
    (1280, {"code": 2, "books": 1, "web": 1}),
]


def _plan(stages=STAGES, block=64, seed=5, shuffle=True, names=NAMES, lengths=LENGTHS):
    return MixturePlan(
        names, lengths, stages_from(names, None, stages, block), block, seed, shuffle
    )


def _oracle(stages=STAGES, block=64, seed=5, shuffle=True, names=NAMES, lengths=LENGTHS):
    return OracleMixture(names, lengths, stages, block, seed, shuffle)


def test_every_block_holds_the_exact_counts_of_its_stage():
    """Three stages (one leaving a source out), 40 blocks: each block's per-source counts are the
    oracle's largest-remainder counts of its stage, and the whole map equals the oracle's."""
    plan, oracle = _plan(), _oracle()
    source, row = plan.locate(np.arange(64 * 40))
    for block in range(40):
        got = np.bincount(source[block * 64 : (block + 1) * 64], minlength=3).tolist()
        assert got == oracle.block_counts(block), block
    want_source, want_row = oracle.sequence(64 * 40)
    np.testing.assert_array_equal(source, want_source)
    np.testing.assert_array_equal(row, want_row)


def test_realised_weights_over_100k_samples_are_within_one_percent():
    weights = {"web": 0.55, "code": 0.3, "books": 0.15}
    plan = _plan([(0, weights)], block=2048, lengths=(1000, 300, 70))
    source, _ = plan.locate(np.arange(100_000))
    shares = np.bincount(source, minlength=3) / 100_000
    for name, share in zip(NAMES, shares, strict=True):
        assert abs(share - weights[name]) < 0.01, (name, share)


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_source_gives_each_row_once_per_its_own_epoch(shuffle):
    """Sources of 97, 40 and 13 rows: taken in the order of their sample numbers (the oracle's),
    each run of n samples of a source (its epoch) is a permutation of its rows (row order without
    shuffle), and epochs differ; over a whole block the sample numbers are the next ones."""
    plan, oracle = _plan(shuffle=shuffle), _oracle(shuffle=shuffle)
    count = 64 * 30
    source, row = plan.locate(np.arange(count))
    sample = oracle.samples(count)
    for index, n in enumerate(LENGTHS):
        mine = source == index
        assert sorted(sample[mine].tolist()) == list(range(mine.sum()))
        rows = row[mine][np.argsort(sample[mine])]
        epochs = [rows[e * n : (e + 1) * n] for e in range(len(rows) // n)]
        assert len(epochs) >= 3
        for epoch in epochs:
            assert sorted(epoch.tolist()) == list(range(n))
            if not shuffle:
                assert epoch.tolist() == list(range(n))
        if shuffle:
            assert not np.array_equal(epochs[0], epochs[1])


def test_offsets_far_into_a_run_cost_no_walk():
    """An offset near 2**50 is located by arithmetic: its block's counts are its stage's, and its
    sample number is what the stages before it gave."""
    plan = _plan()
    far = (1 << 50) // 64 * 64
    source, _ = plan.locate(far + np.arange(64))
    assert np.bincount(source, minlength=3).tolist() == largest_remainder([1, 2, 1], 64)
    given = plan.given_before(far)
    blocks_2 = far // 64 - 20  # stage 2 starts at block 20
    want = 10 * np.array(largest_remainder([0.5, 0.3, 0.2], 64))
    want += 10 * np.array(largest_remainder([0.1, 0, 0.9], 64))
    want += blocks_2 * np.array(largest_remainder([1, 2, 1], 64))
    assert given.tolist() == want.tolist()


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(
        st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(any), min_size=1, max_size=3
    ),
    block=st.integers(27, 48),  # >= 27: every weight >= 1 of a sum <= 27 gets a sample per block
    seed=st.integers(0, 2**64 - 1),
    gaps=st.lists(st.integers(1, 4), min_size=2, max_size=2),
)
def test_the_map_equals_the_oracle(weights, block, seed, gaps):
    """Random stages (integer weights 0..9, some 0) on random block sizes and seeds."""
    starts = [0, gaps[0] * block, (gaps[0] + gaps[1]) * block][: len(weights)]
    stages = [(s, dict(zip(NAMES, w, strict=True))) for s, w in zip(starts, weights, strict=True)]
    plan, oracle = _plan(stages, block, seed), _oracle(stages, block, seed)
    count = block * (sum(gaps) + 3)
    source, row = plan.locate(np.arange(count))
    want_source, want_row = oracle.sequence(count)
    np.testing.assert_array_equal(source, want_source)
    np.testing.assert_array_equal(row, want_row)


@settings(max_examples=30, deadline=None)
@given(offset=st.integers(0, 3000), count=st.integers(0, 500))
def test_counts_without_reading_equal_the_samples(offset, count):
    plan, oracle = _plan(), _oracle()
    source, _ = oracle.sequence(offset + count)
    want = np.bincount(source[offset:], minlength=3)
    assert plan.counts_between(offset, count).tolist() == want.tolist()


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=6),
    keys=st.lists(st.integers(0, 2**64 - 1), min_size=6, max_size=6),
    data=st.data(),
)
def test_shuffle_each_equals_index_shuffle(sizes, keys, data):
    """Element by element, the documented `IndexShuffle` (tests/shuffle_oracle.py)."""
    index = [data.draw(st.integers(0, n - 1)) for n in sizes]
    got = shuffle_each(np.array(index), np.array(sizes), np.array(keys[: len(sizes)], np.uint64))
    want = [
        shuffle_oracle.index_shuffle(n, k, i)
        for n, k, i in zip(sizes, keys[: len(sizes)], index, strict=True)
    ]
    assert got.tolist() == want


def test_weights_may_be_any_real_number():
    """A `Fraction` or numpy scalar is a weight like a float (1/3 : 2/3 of 3 is 1 : 2)."""
    got = stages_from(["a", "b"], {"a": Fraction(1, 3), "b": np.float32(2 / 3)}, None, 3)
    assert block_counts(got[0][1], 3) == (1, 2)


@pytest.mark.parametrize("block", [2, 10, 18, 1000])
def test_proportional_weights_give_the_same_counts(block):
    """Weights are counted as written (a float is the decimal of its repr): 0.3 : 0.1 is 3 : 1,
    whose quotas in a block of 10 tie at 7.5 : 2.5 (the earlier source wins), though the
    binary float below 0.3 and the one above 0.1 would give 7 : 3."""
    want = largest_remainder([3, 1], block)
    for weights in ([0.3, 0.1], [0.6, 0.2], [1.5, 0.5], [3e-7, 1e-7], [30.0, 10.0]):
        assert block_counts(weights, block) == tuple(want), weights
        assert stage_counts(np.array([weights]), block).tolist() == [want], weights
    assert block_counts([0.3, 0.1], 10) == (8, 2)


def test_a_state_of_binary_counts_resumes_only_where_they_agree():
    """A state of the previous release (psdp.mixture/1 counted binary floats) resumes where its
    counts equal today's, and is refused where they differ (0.3 : 0.1 in blocks of 10)."""
    agree = MixturePlan(("a", "b"), (50, 50), ((0, (3.0, 1.0)),), block_size=10)
    agree.check_past({**agree.record(), "kind": "psdp.mixture/1"}, 20)
    differ = MixturePlan(("a", "b"), (50, 50), ((0, (0.3, 0.1)),), block_size=10)
    differ.check_past(differ.record(), 20)
    with pytest.raises(ValueError, match=r"binary floats, \[7, 3\] .* as written, \[8, 2\]"):
        differ.check_past({**differ.record(), "kind": "psdp.mixture/1"}, 20)


def test_block_counts_sum_to_the_block_and_break_ties_by_order():
    assert block_counts([1, 1, 1], 10) == (4, 3, 3)
    assert block_counts([0, 1, 1], 3) == (0, 2, 1)
    assert sum(block_counts([0.1] * 7, 1000)) == 1000


def _sources():
    return {
        name: {"tokens": token_table(n, 4) + 10_000_000 * i, "weight": np.arange(n) * 1.0 + i}
        for i, (name, n) in enumerate(zip(NAMES, LENGTHS, strict=True))
    }


def test_read_is_one_batched_read_per_source_in_the_order_of_the_ids():
    """Ids out of order with repeats: each source is read once (its rows sorted), and every row
    is the oracle's, with its source tag."""
    data = _sources()
    counting = {name: CountingSource(d) for name, d in data.items()}
    mix = Mixture(counting, stages=STAGES, block_size=64, seed=5, source_leaf="source")
    for s in counting.values():
        s.reads.clear()
    ids = np.array([1500, 3, 3, 700, 64, 2, 1999, 0, 640, 1281])
    got = mix.read(ids)
    assert [len(s.reads) for s in counting.values()] == [1, 1, 1]
    for s in counting.values():
        assert np.all(np.diff(s.reads[0]) >= 0)
    source, row = _oracle().sequence(2000)
    for key in ("tokens", "weight"):
        want = np.stack([data[NAMES[source[g]]][key][row[g]] for g in ids])
        np.testing.assert_array_equal(got[key], want)
    assert got["source"].dtype == np.int32
    assert got["source"].tolist() == source[ids].tolist()


class WaitingSource(ArraySource):
    """A source that waits on storage: each read meets the other sources' at a barrier, so the
    reads of one mixture read finish only if they run at once."""

    reads_storage = True

    def __init__(self, data):
        super().__init__(data)
        self.barrier, self.fail, self.threads = None, False, []

    def read(self, ids):
        self.threads.append(threading.current_thread())
        if self.barrier is not None:  # raises BrokenBarrierError after its timeout if alone
            self.barrier.wait()
        if self.fail:
            raise OSError("the object store refused the read")
        return super().read(ids)


@pytest.mark.parametrize("storage", [True, False])
def test_sources_that_wait_on_storage_are_read_at_once(storage):
    data = _sources()
    sources = {name: WaitingSource(d) for name, d in data.items()}
    mix = Mixture(sources, stages=STAGES, block_size=64, seed=5)
    barrier = threading.Barrier(3 if storage else 1, timeout=30)
    for s in sources.values():
        s.reads_storage = storage  # in memory: read one after the other on this thread
        s.barrier = barrier
        s.threads.clear()
    ids = np.array([1500, 3, 700, 64, 2, 1999, 0, 640, 1281])
    got = mix.read(ids)
    source, row = _oracle().sequence(2000)
    want = np.stack([data[NAMES[source[g]]]["tokens"][row[g]] for g in ids])
    np.testing.assert_array_equal(got["tokens"], want)
    threads = [t for s in sources.values() for t in s.threads]
    assert len(threads) == 3
    assert len(set(threads)) == (3 if storage else 1)
    assert threading.current_thread() in threads
    barrier.reset()
    sources[NAMES[1]].fail = True  # one source's error is raised once every read is done
    with pytest.raises(OSError, match="refused"):
        mix.read(ids)


def test_at_most_source_reads_at_once_threads_read_a_step():
    names = [f"s{i}" for i in range(SOURCE_READS_AT_ONCE + 3)]
    sources = {
        name: WaitingSource({"tokens": token_table(5, 4) + 10_000_000 * i})
        for i, name in enumerate(names)
    }
    mix = Mixture(sources, weights=dict.fromkeys(names, 1), block_size=len(names), seed=1)
    for s in sources.values():
        s.reads_storage = True
        s.threads.clear()
    got = mix.read(np.arange(len(names)))  # one row of each source
    assert sorted(got["tokens"][:, 0] // 10_000_000) == list(range(len(names)))
    threads = [t for s in sources.values() for t in s.threads]
    assert len(threads) == len(names)
    assert len(set(threads)) == SOURCE_READS_AT_ONCE


def test_read_window_reads_each_source_s_columns_once():
    data = _sources()
    mix = Mixture(data, stages=STAGES, block_size=64, seed=5, source_leaf="source")
    ids = np.arange(100, 164)
    got = mix.read_window(ids, {"tokens": slice(1, 3), "source": ()})
    source, row = _oracle().sequence(164)
    want = np.stack([data[NAMES[source[g]]]["tokens"][row[g], 1:3] for g in ids])
    np.testing.assert_array_equal(got["tokens"], want)
    assert got["source"].tolist() == source[ids].tolist()
    assert set(got) == {"tokens", "source"}


def test_read_window_exists_only_when_every_source_has_it():
    class RowsOnly:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def read(self, ids):
            return np.asarray(ids, np.int64)

        def describe(self):
            return "RowsOnly"

    both = Mixture({"a": np.arange(5), "b": np.arange(7)}, weights={"a": 1, "b": 1}, block_size=4)
    mixed = Mixture({"a": np.arange(5), "b": RowsOnly(7)}, weights={"a": 1, "b": 1}, block_size=4)
    assert hasattr(both, "read_window") and not hasattr(mixed, "read_window")
    assert mixed.read(np.arange(4)).shape == (4,)


def test_counts_and_locate_of_the_source():
    mix = Mixture(_sources(), stages=STAGES, block_size=64, seed=5)
    source, row = _oracle().sequence(1000)
    assert mix.counts(600, 100) == dict(
        zip(NAMES, np.bincount(source[600:700], minlength=3).tolist(), strict=True)
    )
    got_source, got_row = mix.locate(np.arange(1000))
    assert got_source.tolist() == source.tolist() and got_row.tolist() == row.tolist()
    assert mix.read(np.zeros(0, np.int64))["tokens"].shape == (0, 4)
    assert isinstance(mix.sources["web"], ArraySource)


def test_sources_of_every_kind_mix(tmp_path):
    """A memory-mapped, a Grain-style and a TensorStore source with the same leaf, mixed: every
    row is the oracle's, read through each kind's own reads."""
    from psdp import GrainSource, MemmapSource, TensorStoreSource, write_dataset

    tables = [token_table(n, 4) + 10_000_000 * i for i, n in enumerate(LENGTHS)]
    np.save(tmp_path / "tokens.npy", tables[0])
    write_dataset(tmp_path / "books", {"tokens": tables[2]})
    sources = {
        "web": MemmapSource({"tokens": tmp_path / "tokens.npy"}),
        "code": GrainSource([{"tokens": row} for row in tables[1]]),
        "books": TensorStoreSource(tmp_path / "books"),
    }
    mix = Mixture(sources, stages=STAGES, block_size=64, seed=5)
    ids = np.arange(600, 1400, 7)
    source, row = _oracle().sequence(1400)
    want = np.stack([tables[source[g]][row[g]] for g in ids])
    np.testing.assert_array_equal(mix.read(ids)["tokens"], want)
    # one source waits on storage, so the loader's default read threads are storage's
    assert mix.reads_storage is True
    assert Mixture(_sources(), stages=STAGES, block_size=64).reads_storage is False
    assert open_feed(mix, OrderOptions(global_batch_size=8)).read_threads(None) == 4


def test_the_cost_script_checks_its_counts_and_reports_each_size():
    """scripts/measure/mixture_cost.py on a small batch: it runs, and its counts check holds."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "measure" / "mixture_cost.py"
    cost = runpy.run_path(str(script))["cost"]
    per_batch, per_sample = cost(64, batch=128, repeats=1)
    assert per_batch > 0 and per_sample == per_batch / 128


class _BreaksAfterProbe:
    """Rows of ``data`` for the mixture's one-row probe, then broken in one way (a source whose
    reads change mid-run): the mixture must name it, never cast or broadcast its rows."""

    def __init__(self, data, how):
        self.data, self.how = data, how

    def __len__(self):
        return len(self.data)

    def describe(self):
        return f"Breaks({self.how})"

    def read(self, ids):
        rows = self.data[ids]
        if len(ids) < 2:
            return {"tokens": rows}
        broken = {
            "dtype": lambda v: v + 0.5,  # float64: a cast to int32 would drop the .5
            "one row": lambda v: v[:1],  # would broadcast over every position
            "trailing shape": lambda v: v[:, :1],  # would broadcast over the columns
        }
        return {"tokens": broken[self.how](rows)}


@pytest.mark.parametrize(
    ("how", "fragments"),
    [
        ("dtype", ["dtype float64", "dtype int32"]),
        ("one row", ["shape (1, 4)", "for 2 ids", "shape (2, 4)"]),  # 2 of a block of 4 at 1:1
        ("trailing shape", ["shape (2, 1)", "shape (2, 4)"]),
    ],
)
def test_a_mixed_source_whose_reads_change_is_named_not_cast(how, fragments):
    good = token_table(20, 4)
    mix = Mixture(
        {"good": {"tokens": good}, "bad": _BreaksAfterProbe(token_table(9, 4), how)},
        weights={"good": 1, "bad": 1},
        block_size=4,
    )
    with pytest.raises(ValueError, match="source 'bad' of the mixture") as error:
        mix.read(np.arange(4))
    message = str(error.value)
    assert all(f in message for f in fragments), message
    assert "Breaks(" in message and "one row per id, all of one shape and dtype" in message


# ------------------------------------------------ many sources, many stages, many skips (#29)
_WEIGHT = st.one_of(
    st.integers(0, 9).map(float),  # integer quotas and exact ties
    st.floats(0, 10, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.1, 0.2, 0.3, 0.7, 1 / 3, 2 / 3, 1e-300, 1e300, 5e-324]),
)


@st.composite
def _stage_weights(draw):
    """(stages, sources) weights; some entries one ulp from another's (near-ties)."""
    sources = draw(st.integers(1, 12))
    rows = draw(st.lists(st.lists(_WEIGHT, min_size=sources, max_size=sources), min_size=1))
    rows = [row for row in rows if any(w > 0 for w in row)] or [[1.0] * sources]
    for row in rows:
        for i in draw(st.lists(st.integers(0, sources - 1), max_size=3)):
            j = draw(st.integers(0, sources - 1))
            row[i] = float(np.nextafter(row[j], np.inf))
    return rows


@settings(max_examples=150, deadline=None)
@given(weights=_stage_weights(), block=st.integers(1, 5000))
@example(weights=[[1.0, 1.0, 1.0]], block=10)  # equal remainders: the earlier source first
@example(weights=[[1.0, float(np.nextafter(1.0, 2.0)), 1.0]], block=10)  # one ulp decides
@example(weights=[[1.0] * 1024, [3.0, 1.0] * 512], block=2048)  # integer quotas
@example(weights=[[0.1, 0.2, 0.7], [0.7, 0.2, 0.1]], block=10)  # sums one ulp off 1
@example(weights=[[1e-300, 1.0, 5e-324], [1e300, 1e300, 1.0]], block=4)  # far magnitudes
@example(weights=[[0.3, 0.1], [3.0, 1.0], [0.6, 0.2]], block=10)  # ties of the decimals
def test_all_stages_counts_equal_largest_remainder(weights, block):
    """`stage_counts` (every stage at once, in floating point where its error bound decides)
    equals the exact largest-remainder rule (tests/mixture_oracle.py, Fractions) row by row."""
    got = stage_counts(np.array(weights, np.float64), block)
    assert got.tolist() == [largest_remainder(row, block) for row in weights]


@st.composite
def _ranges(draw, first_max: int, length_max: int):
    """Sorted, disjoint ranges ``(first, end)``."""
    out, at = [], 0
    for gap, length in draw(
        st.lists(st.tuples(st.integers(0, first_max), st.integers(1, length_max)), max_size=12)
    ):
        out.append((at + gap, at + gap + length))
        at += gap + length + 1
    return out


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(
        st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(any), min_size=1, max_size=40
    ),
    batches=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    skip_steps=_ranges(6, 3),
    skip_offsets=_ranges(30, 12),
    seed=st.integers(0, 2**64 - 1),
)
def test_many_stages_and_skips_read_the_oracles_samples(
    weights, batches, skip_steps, skip_offsets, seed
):
    """Up to 40 weight stages (a new one every block of 16), 40 batch-size stages (one every 2
    steps), 12 skip_steps and 12 skip_offsets ranges: each of 80 steps covers the offsets of
    the offset-walking oracle (tests/oracle.py) and reads the block-walking oracle's
    (source, row) at each of them (tests/mixture_oracle.py)."""
    block = 16  # >= 12 (the largest sum of 3 weights <= 4): every weighted source gets a sample
    stages = [(block * i, dict(zip(NAMES, w, strict=True))) for i, w in enumerate(weights)]
    sources = {
        n: 1000 * i + np.arange(length)
        for i, (n, length) in enumerate(zip(NAMES, LENGTHS, strict=True))
    }
    mix = Mixture(sources, stages=stages, block_size=block, seed=seed)
    schedule = [(2 * i, b) for i, b in enumerate(batches)]
    options = OrderOptions(
        global_batch_size=schedule, skip_steps=skip_steps, skip_offsets=skip_offsets
    )
    feed = open_feed(mix, options)
    spans = schedule_spans(None, schedule, 80, skip_steps=skip_steps, skip_offsets=skip_offsets)
    oracle = OracleMixture(NAMES, LENGTHS, stages, block, seed)
    source, row = oracle.sequence(spans[-1].offset + spans[-1].rows)
    for step, span in enumerate(spans):
        info = feed.step_info(step)
        assert (info.offset, info.rows) == (span.offset, span.rows), step
        at = np.arange(span.offset, span.offset + span.rows)
        assert mix.read(at).tolist() == (1000 * source[at] + row[at]).tolist(), step


def _calls(work) -> int:
    """Python and C function calls ``work()`` makes: a deterministic count of its work."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def _wide(sources: int) -> Mixture:
    """``sources`` sources; the one stage weights the first 4 (the same in every width)."""
    names = [f"s{i}" for i in range(sources)]
    data = {name: 1000 * i + np.arange(50 + i) for i, name in enumerate(names)}
    return Mixture(data, weights={"s0": 1, "s1": 2, "s2": 3, "s3": 4}, block_size=64, seed=3)


def test_a_step_s_work_does_not_grow_with_the_sources():
    """A batch of 256 offsets drawn from 4 sources of a mixture of 8 or of 8,000: the same rows,
    the same function calls (no loop over the sources) and the same peak of memory allocated
    (no table of batch x sources), counted, not timed."""
    ids = 10**9 + np.arange(256)
    calls, peaks, rows = [], [], []
    for sources in (8, 8000):
        mix = _wide(sources)
        rows.append(mix.read(ids).tolist())  # warm: what a first call caches is not a step's
        calls.append(_calls(lambda mix=mix: mix.read(ids)))
        tracemalloc.start()
        mix.read(ids)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert rows[0] == rows[1]
    assert calls[0] == calls[1], calls
    assert peaks[1] <= peaks[0] + 4096, peaks


def test_building_a_plan_makes_no_call_per_weight():
    """1,000 sources x 100 stages (10^5 weights, drawn so the float bound decides): building the
    plan makes O(stages + sources) function calls (a source's key is a few), not one per
    weight (the Fraction arithmetic made ~18 million)."""
    names = tuple(f"s{i}" for i in range(1000))
    weights = np.random.default_rng(0).uniform(1, 3, (100, 1000))
    stages = tuple((2048 * i, tuple(w.tolist())) for i, w in enumerate(weights))
    calls = _calls(lambda: MixturePlan(names, (10**6,) * 1000, stages, block_size=2048))
    assert calls <= 10 * (100 + 1000) + 1000, calls


class _Name(str):
    """A source name that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other):
        type(self).compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_checking_the_weights_compares_no_name_with_every_other():
    """10 stages naming each of 1,000 sources: checking them looks each name up once (a set),
    not along the list of names (that made 1,000 x 1,000 / 2 comparisons a stage)."""
    names = [_Name(f"s{i}") for i in range(1000)]
    stages = [(64 * i, dict.fromkeys(names, 1.0)) for i in range(10)]
    _Name.compared = 0
    got = stages_from(names, None, stages, 64)
    assert got[9] == (9 * 64, (1.0,) * 1000)
    assert _Name.compared <= 10 * 1000, _Name.compared


def test_unshuffled_sources_give_their_rows_in_row_order_at_the_blocks_positions():
    """docs/guides/mixtures.md: ``shuffle=False`` drops the epoch permutations, and each block
    hands each source's next run of consecutive rows (row ``j mod n`` for sample ``j``) out in the
    order of the positions the block's permutation gave the source: every source in row order,
    within blocks too. Exact against the block-walking oracle."""
    names, lengths, block = ("a", "b"), (13, 40), 8
    stages = ((0, (3.0, 1.0)),)
    plan = MixturePlan(names, lengths, stages, block_size=block, seed=4, shuffle=False)
    source, row = plan.locate(np.arange(10 * block))
    oracle = OracleMixture(names, lengths, [(0, {"a": 3, "b": 1})], block, 4, shuffle=False)
    want_source, want_row = oracle.sequence(10 * block)
    assert source.tolist() == want_source.tolist() and row.tolist() == want_row.tolist()
    given = [0, 0]
    permuted = 0
    for b in range(10):
        part = slice(b * block, (b + 1) * block)
        for s in range(2):
            rows = row[part][source[part] == s]
            count = len(rows)
            want = [(given[s] + k) % lengths[s] for k in range(count)]
            assert rows.tolist() == want, (b, s)  # the next consecutive run, in order
            given[s] += count
        permuted += source[part].tolist() != sorted(source[part].tolist())
    assert permuted > 0  # the sources' positions in a block are permuted
    for offset in (0, 5, 19, 66):  # read from anywhere, as the loader reads a step
        got = plan.locate(np.arange(offset, offset + 11))
        assert got[1].tolist() == row[offset : offset + 11].tolist()


def test_an_unshuffled_state_of_the_permuted_block_order_is_refused():
    """A state saved when an unshuffled block placed its rows in the permuted order (no
    ``order`` key) would resume on other rows: refused; this release's resumes."""
    plan = MixturePlan(("a", "b"), (13, 40), ((0, (3.0, 1.0)),), block_size=8, shuffle=False)
    record = plan.record()
    assert record["order"] == "rows" and "order" not in replace(plan, shuffle=True).record()
    plan.check_past(record, 16)
    old = {k: v for k, v in record.items() if k != "order"}
    with pytest.raises(ValueError, match="unshuffled mixture placed each block's rows of a "
                       "source in the block's permuted order; .* start the run again"):  # fmt: skip
        plan.check_past(old, 16)
