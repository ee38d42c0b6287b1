"""The global order: index shuffles are permutations, batches follow the documented formulas."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psdp._plan.order import PAD, GlobalOrder, IndexShuffle


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), key=st.integers(0, 2**64 - 1))
def test_index_shuffle_is_a_permutation(n, key):
    out = IndexShuffle(n, key)(np.arange(n))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.sort(out), np.arange(n))


def test_index_shuffle_is_pointwise():
    perm = IndexShuffle(10**6, key=42)
    full = perm(np.arange(0, 10**6, 997))
    for i, position in enumerate(range(0, 10**6, 997 * 50)):
        assert perm(np.array([position]))[0] == full[i * 50]


def test_different_keys_give_different_permutations():
    a, b = IndexShuffle(1000, 1)(np.arange(1000)), IndexShuffle(1000, 2)(np.arange(1000))
    assert (a != b).mean() > 0.9


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 200), b=st.integers(1, 64), step=st.integers(0, 10**12))
def test_unshuffled_batches_follow_the_formula(n, b, step):
    ids = GlobalOrder(n, b, shuffle=False).batch_ids(step)
    per_epoch = -(-n // b)
    position = (step % per_epoch) * b + np.arange(b)
    np.testing.assert_array_equal(ids, np.where(position < n, position, PAD))


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 300),
    b=st.integers(1, 40),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 10**6),
)
def test_drop_last_epochs_never_repeat_a_row(n, b, seed, epoch):
    if b > n:
        return
    order = GlobalOrder(n, b, seed=seed, drop_last=True)
    per = n // b
    rows = np.concatenate([order.batch_ids(epoch * per + k) for k in range(per)])
    assert len(set(rows.tolist())) == per * b


@settings(max_examples=50, deadline=None)
@given(
    k=st.integers(1, 20),
    b=st.integers(1, 32),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 10**6),
)
def test_every_epoch_covers_every_row_once_when_n_is_a_multiple_of_b(k, b, seed, epoch):
    n = k * b
    order = GlobalOrder(n, b, seed=seed)
    rows = np.concatenate([order.batch_ids(epoch * k + s) for s in range(k)])
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 300),
    b=st.integers(1, 40),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 10**6),
    shuffle=st.booleans(),
)
def test_without_drop_last_every_row_comes_exactly_once_per_epoch(n, b, seed, epoch, shuffle):
    order = GlobalOrder(n, b, shuffle=shuffle, seed=seed)
    per = order.steps_per_epoch
    assert per == -(-n // b)
    batches = [order.batch_ids(epoch * per + k) for k in range(per)]
    assert all(len(ids) == b for ids in batches)
    assert all((ids != PAD).all() for ids in batches[:-1])  # only the final batch is short
    rows = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(rows[rows != PAD]), np.arange(n))
    assert (rows == PAD).sum() == per * b - n and order.pads == (n % b != 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_rows=0, batch_size=4), "the source is empty"),
        (dict(num_rows=3, batch_size=4, drop_last=True), "would yield no batch at all"),
    ],
)
def test_bad_orders(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GlobalOrder(**kwargs)


@pytest.mark.parametrize("n", [48, 1000, 65536])
def test_shuffles_look_random(n):
    """Position and output are uncorrelated and fixed points are rare, as for a random permutation.

    For a uniformly random permutation, E|corr| is about 0.8 / sqrt(n) and E[fixed points] is 1.
    """
    cors, fixed = [], []
    for key in range(40):
        out = IndexShuffle(n, key)(np.arange(n))
        cors.append(abs(np.corrcoef(np.arange(n), out)[0, 1]))
        fixed.append(int((out == np.arange(n)).sum()))
    assert np.mean(cors) < 2 * 0.8 / np.sqrt(n)
    assert np.mean(fixed) < 3


def test_numpy_ints_are_plain_ints_to_the_order():
    seed = np.random.default_rng(0).integers(0, 2**31)  # numpy.int64, as a config might give
    a = GlobalOrder(10, 4, seed=seed).batch_ids(np.int64(5))
    b = GlobalOrder(10, 4, seed=int(seed)).batch_ids(5)
    np.testing.assert_array_equal(a, b)
    assert type(GlobalOrder(np.int64(10), np.int32(4), seed=seed).seed) is int
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        GlobalOrder(10, 0)


@pytest.mark.parametrize("seed", [-1, 2**64, 2**64 + 5])
def test_seeds_outside_64_bits_are_refused_not_reduced(seed):
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64 - 1\]"):
        GlobalOrder(10, 4, seed=seed)
    assert GlobalOrder(10, 4, seed=2**64 - 1).batch_ids(0).size == 4  # the largest seed works
