"""The block shuffle: a permutation of every row, pointwise, and local (a window of positions reads
at most ``window_blocks`` blocks). The oracle is plain arithmetic on row ids: a row's block is
``row // io_block``, never anything the shuffle computes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp._plan.block_shuffle import BlockShuffle

shapes = st.tuples(st.integers(1, 3000), st.integers(1, 80), st.integers(1, 12))
keys = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, key=keys)
def test_block_shuffle_is_a_permutation(shape, key):
    n, io_block, window_blocks = shape
    rows = BlockShuffle(n, io_block, window_blocks, key)(np.arange(n))
    assert rows.dtype == np.int64
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))  # each row exactly once


def _windows(n: int, io_block: int, window_blocks: int, rows: np.ndarray) -> list[np.ndarray]:
    """The positions cut into windows, from the rows alone: walking the positions, a new block
    starts whenever the blocks seen so far fill ``io_block`` rows each (the short last block
    fills ``n % io_block``)."""
    sizes = {b: min(io_block, n - b * io_block) for b in range(-(-n // io_block))}
    windows, current, seen, filled = [], [], set(), 0
    for row in rows.tolist():
        block = row // io_block
        if block not in seen:
            if len(seen) == window_blocks and filled == sum(sizes[b] for b in seen):
                windows.append(np.array(current))
                current, seen, filled = [], set(), 0
            seen.add(block)
        current.append(row)
        filled += 1
    windows.append(np.array(current))
    return windows


@settings(max_examples=200, deadline=None)
@given(shape=shapes, key=keys)
def test_each_window_of_positions_reads_at_most_window_blocks_blocks(shape, key):
    n, io_block, window_blocks = shape
    rows = BlockShuffle(n, io_block, window_blocks, key)(np.arange(n))
    span = io_block * window_blocks
    # any `span` consecutive positions meet at most two windows (three around the window that
    # holds the short block, which is shorter than `span`), and each window holds whole blocks
    windows_met = 3 if n % io_block else 2
    for start in range(0, n, max(1, span // 3)):
        blocks = set((rows[start : start + span] // io_block).tolist())
        assert len(blocks) <= windows_met * window_blocks
    for window in _windows(n, io_block, window_blocks, rows):
        blocks = np.unique(window // io_block)
        assert len(blocks) <= window_blocks
        whole = np.concatenate(
            [np.arange(b * io_block, min(n, (b + 1) * io_block)) for b in blocks]
        )
        np.testing.assert_array_equal(np.sort(window), whole)  # every row of those blocks


@settings(max_examples=50, deadline=None)
@given(shape=shapes, key=keys, data=st.data())
def test_block_shuffle_is_pointwise(shape, key, data):
    n, io_block, window_blocks = shape
    perm = BlockShuffle(n, io_block, window_blocks, key)
    full = perm(np.arange(n))
    picked = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20)))
    np.testing.assert_array_equal(perm(picked), full[picked])  # any positions, any order


def test_the_short_last_block_is_not_always_last():
    # 10 rows in blocks of 4: rows 8, 9 form the short block; over keys it takes every slot
    first_rows = {int(BlockShuffle(10, 4, 1, key)(np.array([0]))[0]) for key in range(64)}
    assert {8, 9} & first_rows and first_rows - {8, 9}


def test_rows_within_a_window_are_shuffled_and_keys_differ():
    n = 4096
    a = BlockShuffle(n, 16, 8, 1)(np.arange(n))
    b = BlockShuffle(n, 16, 8, 2)(np.arange(n))
    assert (a != b).mean() > 0.9
    # within a window, consecutive positions rarely hold consecutive rows (not just blocks moved)
    assert (np.diff(a) == 1).mean() < 0.2


def test_large_n_costs_no_table():
    # 10**12 rows: a table of blocks would not fit in memory; pointwise evaluation needs none
    perm = BlockShuffle(10**12 + 3, 1024, 64, key=5)
    positions = np.array([0, 10**12 + 2, 123_456_789_012])
    rows = perm(positions)
    assert ((rows >= 0) & (rows < 10**12 + 3)).all() and len(set(rows.tolist())) == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 0, "io_block": 1, "window_blocks": 1, "key": 0}, ValueError),
        ({"n": 10, "io_block": 0, "window_blocks": 1, "key": 0}, ValueError),
        ({"n": 10, "io_block": 2, "window_blocks": 0, "key": 0}, ValueError),
        ({"n": 10, "io_block": 2, "window_blocks": 1, "key": -1}, ValueError),
        ({"n": 10, "io_block": 2, "window_blocks": 1, "key": 2**64}, ValueError),
        ({"n": 10, "io_block": 2.0, "window_blocks": 1, "key": 0}, TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        BlockShuffle(**kwargs)


def test_positions_out_of_range():
    with pytest.raises(ValueError, match=r"positions must be in \[0, 9\], got 0 to 10"):
        BlockShuffle(10, 2, 2, 0)(np.array([0, 10]))
