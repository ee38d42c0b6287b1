"""The oracle of tests/oracle.py, pinned: literal known answers for the shuffled order, the
documented structure of epochs and padding, and the halo rule against a ppermute exchange.

The literal orders are what a resume across versions relies on: a changed Feistel constant, round
count or seed/epoch mixing re-reads or skips rows silently, so it must fail here first. Each is
checked twice: against psdp's order and against tests/shuffle_oracle.py, the rule written again
from the docs, so the oracles of every other test stand alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp import MeshLayout
from psdp._plan.index_shuffle import splitmix64
from psdp._plan.order import PAD, GlobalOrder
from psdp._plan.reads import feeding_positions
from tests import oracle, shuffle_oracle
from tests.batch_checks import assert_batch_exact, halo_exchange, token_table
from tests.meshes import mesh_of

# (num_rows, seed, epoch) -> the epoch's permutation (position -> row), as psdp 0.1 computes it
KNOWN_PERMUTATIONS = {
    (10, 0, 0): [5, 4, 9, 8, 3, 0, 2, 7, 1, 6],
    (10, 0, 1): [1, 5, 8, 2, 4, 6, 7, 3, 9, 0],
    (10, 1, 0): [5, 1, 6, 8, 0, 7, 2, 4, 9, 3],
    (10, 2**40 + 3, 5): [7, 2, 8, 6, 4, 5, 9, 1, 3, 0],
    (16, 5, 0): [0, 3, 11, 15, 8, 5, 14, 10, 2, 12, 6, 1, 4, 7, 13, 9],  # N a power of two
    (4, 1, 2): [2, 3, 1, 0],  # the smallest Feistel domain (2 bits)
}

# (num_rows, seed, epoch, io_block, window_blocks) -> the block shuffle's permutation, as psdp
# 0.1 computes it
KNOWN_BLOCK_PERMUTATIONS = {
    (10, 0, 0, 2, 2): [9, 5, 8, 4, 3, 7, 2, 6, 0, 1],  # 5 full blocks, a last window of one
    (10, 3, 1, 3, 2): [8, 6, 3, 7, 5, 4, 0, 2, 9, 1],  # a short block (row 9) at a keyed slot
    (11, 7, 2, 4, 1): [7, 4, 5, 6, 10, 9, 8, 1, 0, 3, 2],  # windows of one block
    (5, 0, 0, 8, 2): [0, 1, 3, 2, 4],  # the short block is the only one
    (16, 5, 3, 4, 16): [1, 8, 3, 10, 2, 9, 4, 6, 13, 7, 5, 15, 0, 14, 11, 12],  # one window
    (14, 2**40 + 3, 5, 3, 3): [10, 11, 5, 9, 12, 3, 13, 4, 7, 1, 2, 0, 8, 6],  # a big seed
}

# (num_rows, batch, seed, drop_last, step) -> the step's ids: the same rows as psdp 0.1 gave,
# now in increasing id order (a batch is a set; sorted ids make every host's reads sorted)
KNOWN_BATCHES = {
    (100, 8, 3, False, 37): [8, 40, 52, 62, 66, 75, 78, 91],
    (1000, 16, 12345, False, 10**7): [
        123,
        175,
        185,
        215,
        452,
        537,
        551,
        597,
        625,
        635,
        677,
        694,
        723,
        745,
        784,
        911,
    ],
    (10, 4, 7, False, 2): [4, 7, PAD, PAD],  # epoch 0's short final batch
    (10, 4, 7, False, 5): [0, 6, PAD, PAD],  # epoch 1's
    (10, 4, 7, True, 2): [1, 2, 5, 7],  # epoch 1 (2 steps per epoch), its first batch
    (10, 4, 7, True, 3): [3, 4, 8, 9],
    (2**20 + 1, 5, 0, False, 3): [234583, 445799, 570373, 662025, 745862],  # 21-bit domain
    (1024, 8, 9, False, 300): [92, 190, 225, 236, 351, 369, 550, 681],  # exactly 10 bits
}


@pytest.mark.parametrize(("key", "perm"), list(KNOWN_PERMUTATIONS.items()))
def test_known_epoch_permutations(key, perm):
    n, seed, epoch = key
    one_row = GlobalOrder(n, 1, seed=seed)  # a batch of one row: the permutation, step by step
    assert [int(one_row.batch_ids(epoch * n + i)[0]) for i in range(n)] == perm
    assert oracle.epoch_permutation(n, seed, epoch).tolist() == perm


@pytest.mark.parametrize(("key", "perm"), list(KNOWN_BLOCK_PERMUTATIONS.items()))
def test_known_block_permutations(key, perm):
    n, seed, epoch, io_block, window = key
    one_row = GlobalOrder(n, 1, seed=seed, io_block=io_block, window_blocks=window)
    assert [int(one_row.batch_ids(epoch * n + i)[0]) for i in range(n)] == perm
    got = shuffle_oracle.epoch_rows(n, seed, epoch, range(n), (io_block, window))
    assert got == perm


def test_splitmix64_is_the_published_sequence():
    """The first outputs of splitmix64 seeded with 0 (the state steps by the golden gamma)."""
    outputs = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    states = [i * shuffle_oracle.GOLDEN % 2**64 for i in range(3)]
    assert [shuffle_oracle.splitmix64(s) for s in states] == outputs
    assert [splitmix64(s) for s in states] == outputs


@pytest.mark.parametrize(
    "name", ["oracle", "shuffle_oracle", "mixture_oracle", "packing_oracle", "token_oracle"]
)
def test_the_oracles_import_nothing_from_psdp(name):
    """An oracle that borrows psdp's code follows a change of it: it must stand alone."""
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "psdp"], imported


@pytest.mark.parametrize(("key", "ids"), list(KNOWN_BATCHES.items()))
def test_known_batches(key, ids):
    n, b, seed, drop_last, step = key
    assert GlobalOrder(n, b, seed=seed, drop_last=drop_last).batch_ids(step).tolist() == ids
    got = oracle.step_ids(n, b, step, seed=seed, drop_last=drop_last)
    assert got.tolist() == ids


def test_seed_and_epoch_are_not_interchangeable():
    """seed 0 epoch 1, seed 1 epoch 0: a mixing like ``seed + epoch`` would make them equal."""
    assert KNOWN_PERMUTATIONS[(10, 0, 1)] != KNOWN_PERMUTATIONS[(10, 1, 0)]
    for n in (10, 1000):
        a = oracle.epoch_permutation(n, seed=0, epoch=1)
        b = oracle.epoch_permutation(n, seed=1, epoch=0)
        assert not np.array_equal(a, b)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 120),
    b=st.integers(1, 40),
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 10**9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_every_batch_follows_the_documented_formula(n, b, seed, step, shuffle, drop_last):
    """Epochs of K steps, positions (s % K) * B .., PAD past N, from the epoch's permutation."""
    if drop_last and b > n:
        return
    order = GlobalOrder(n, b, shuffle=shuffle, seed=seed, drop_last=drop_last)
    want = oracle.step_ids(n, b, step, seed=seed, shuffle=shuffle, drop_last=drop_last)
    np.testing.assert_array_equal(order.batch_ids(step), want)
    assert order.steps_per_epoch == (n // b if drop_last else -(-n // b))
    assert order.pads == oracle.ends_short(n, b, drop_last)


def test_pad_is_the_documented_id():
    assert PAD == oracle.PAD == -1


# --------------------------------------------------------------------- physical batch, feeding
@pytest.mark.parametrize(
    ("shape", "specs", "batch", "physical"),
    [
        ((4, 2), [P("data")], 10, 12),
        ((4, 2), [P("data"), P(("data", "model"))], 3, 8),
        ((4, 2), [P()], 5, 5),
        ((2, 3), [P("data"), P("model")], 7, 12),  # lcm(2, 3) = 6, not max = 3
        ((2, 3), [P("model"), P(("data", "model"))], 13, 18),
    ],
)
def test_physical_batch_sizes(shape, specs, batch, physical):
    mesh = mesh_of(("data", "model"), shape)
    assert oracle.physical_size(batch, mesh, specs) == physical


def test_feeding_rule_on_the_documented_example(mesh_2d):
    """docs/concepts/partitioning.md: host 0 of the 4-host pod holds data rows 0 and 2; B=6 -> 3 and 3."""
    procs = [[0, 1], [2, 3], [0, 1], [2, 3]]
    process_of = dict(zip(mesh_2d.devices.flat, np.ravel(procs).tolist(), strict=True))
    size, positions = oracle.fed_positions(6, mesh_2d, "data", process_of, [0])
    assert (size, positions.tolist()) == (12, [0, 1, 2, 6, 7, 8])
    size, positions = oracle.fed_positions(8, mesh_2d, "data", process_of, [0])  # the docs' B=8
    assert (size, positions.tolist()) == (16, [0, 1, 2, 3, 8, 9, 10, 11])
    layout = MeshLayout(np.array(procs), ("data", "model"))
    size, positions = feeding_positions([0], {"x": P("data")}, [4], 6, layout)
    assert (size, positions.tolist()) == (12, [0, 1, 2, 6, 7, 8])


# ---------------------------------------------------------------------------------- halos
@pytest.mark.parametrize(("h", "pad"), [(1, 0), (2, -3), (4, 7)])
def test_the_halo_rule_equals_a_ppermute_exchange(h, pad, mesh_context):
    rows = np.arange(8 * 8, dtype=np.int32).reshape(8, 8)
    sharded = jax.device_put(rows, NamedSharding(mesh_context, P("data", "context")))
    exchanged = halo_exchange(sharded, mesh_context, h, pad)
    np.testing.assert_array_equal(np.asarray(exchanged), oracle.haloed(rows, 2, h, pad))


def test_halo_rule_by_hand():
    rows = np.arange(6)[None]  # one row, 3 shards of 2 columns, halo 1, pad -1
    assert oracle.haloed(rows, 3, 1, -1).tolist() == [[-1, 0, 1, 2, 1, 2, 3, 4, 3, 4, 5, -1]]


# ---------------------------------------------------------------------------- comparisons
def test_a_wrong_shard_names_its_leaf_device_process_and_first_differing_index(mesh_2d):
    rows = token_table(8, width=3).astype(np.float32)
    rows[0, 0] = np.nan  # NaN where NaN is expected is exact
    batch = {"tokens": jax.device_put(rows, NamedSharding(mesh_2d, P("data")))}
    assert assert_batch_exact(batch, {"tokens": rows}) == 8
    wrong = rows.copy()
    wrong[5, 2] = -1  # row 5 is on data shard 2: the devices at mesh positions (2, 0) and (2, 1)
    device = mesh_2d.devices[2, 0]
    message = (
        rf"^leaf 'tokens', device {device.id} \(process 0\), box \[4:6, 0:3\]: first difference "
        r"at global index \(5, 2\): holds 5002.0, expected -1.0 \(1 of 6 elements differ\)$"
    )
    with pytest.raises(AssertionError, match=message):
        assert_batch_exact(batch, {"tokens": wrong})
    # a simulated host's device is named with the process it plays
    shards = {device: rows[4:6]}
    with pytest.raises(AssertionError, match=rf"^step 3: .* device {device.id} \(process 7\), "):
        oracle.check_shards(shards, wrong, P("data"), mesh_2d, "step 3", process_of={device: 7})
