"""`psdp.filter_shard`: exact data on every device shard, in one process and on a 4-host pod."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp._integration.filter_shard import filter_shard
from tests.batch_checks import (
    assert_shards_exact,
    run_on_noncontiguous_pod,
    token_table,
)
from tests.meshes import mesh_of
from tests.pod_targets_shard import check_filter_shard, filter_shard_exact


@pytest.fixture
def mesh():
    # devices out of id order, so nothing can pass by assuming a device's position from its id
    return mesh_of(("data", "model"), (4, 2), [5, 2, 7, 0, 3, 6, 1, 4])


def test_every_check_in_one_process(mesh):
    result = check_filter_shard(mesh, batch_size=16)
    # per spec: 2 modes x 2 leaves x 8 devices; then reshard 16, prefix 16, jit 16, device 2
    assert result["shards"] == 4 * 2 * 2 * 8 + 16 + 16 + 16 + 2
    assert all(rows == list(range(16)) for rows in result["held"].values())


def test_wrong_row_count_names_leaf_rows_plan_and_fix(mesh):
    message = check_filter_shard(mesh, batch_size=16)["errors"]["rows"]
    assert message.startswith("ValueError: host-local leaf ['tokens'] has 17 rows")
    assert "needs 16" in message and "global_batch_size=16" in message
    assert "psdp.plan_batch(mesh, spec, (16, 4)).rows" in message
    assert "host_local=False" in message


def test_host_local_needs_a_batch_size_and_a_named_sharding(mesh):
    errors = check_filter_shard(mesh, batch_size=8)["errors"]
    assert "needs global_batch_size" in errors["no_batch_size"]
    assert errors["device"].startswith(
        "TypeError: filter_shard(host_local=True) needs a NamedSharding"
    )
    assert "SingleDeviceSharding" in errors["device"]


@pytest.mark.parametrize(
    ("leaf", "spec", "needle"),
    [
        (np.int32(3), P(), "is 0-d"),  # a scalar has no rows
        (np.zeros((4, 3)), P("data", "model"), "dimension 1 of size 3 is not divisible"),
    ],
)
def test_host_local_leaf_errors_name_the_path(mesh, leaf, spec, needle):
    with pytest.raises(ValueError, match=needle) as info:
        filter_shard({"a": [leaf]}, NamedSharding(mesh, spec), host_local=True, global_batch_size=4)
    assert "['a'][0]" in str(info.value)


def test_bad_target_and_batch_size(mesh):
    with pytest.raises(TypeError, match="needs a jax.Device, a jax.sharding.Sharding"):
        filter_shard({"a": np.zeros(4)}, {"a": "data"})
    with pytest.raises(ValueError, match="global_batch_size must be >= 1, got 0"):
        filter_shard(np.zeros(4), NamedSharding(mesh, P()), host_local=True, global_batch_size=0)


def test_host_local_rows_in_plan_order_not_device_order(mesh):
    # a data-sharded batch assembled from rows given in plan order lands row r on the devices
    # whose box holds r, whatever the mesh's device order
    tokens = token_table(8)
    sharding = NamedSharding(mesh, P("data"))
    out = filter_shard(tokens, sharding, host_local=True, global_batch_size=8)
    assert_shards_exact(out, tokens)
    for shard in out.addressable_shards:
        rows = np.asarray(shard.data)[:, 0] // 1000
        assert rows.tolist() == list(range(8))[shard.index[0]]


def test_numpy_scalars_and_non_arrays_outside_host_local(mesh):
    tree = {"lr": np.float32(0.5), "fn": len, "ints": [1, 2]}
    out = filter_shard(tree, NamedSharding(mesh, P()))
    assert isinstance(out["lr"], jax.Array) and float(out["lr"]) == 0.5
    assert out["fn"] is len and out["ints"] == [1, 2]


@pytest.mark.multiprocess
def test_noncontiguous_four_hosts_every_shard_exact():
    results = run_on_noncontiguous_pod(
        filter_shard_exact,
        batch_size=16,
    )
    # per spec: 2 modes x 2 leaves x 2 local devices; then reshard 4, prefix 4, jit 4, device 2
    assert [r["shards"] for r in results] == [4 * 2 * 2 * 2 + 4 + 4 + 4 + 2] * 4
    # hosts 0 and 1 hold data rows 0 and 2 (rows 0-3, 8-11); hosts 2 and 3 rows 1 and 3
    even, odd = [*range(0, 4), *range(8, 12)], [*range(4, 8), *range(12, 16)]
    assert [r["held"]["batch"] for r in results] == [even, even, odd, odd]
    assert [r["held"]["sequence"] for r in results] == [even, even, odd, odd]
    # full: each device its own 2 rows; host 0 has (data 0, model 0) and (data 2, model 0)
    assert [r["held"]["full"] for r in results] == [
        [0, 1, 8, 9],
        [2, 3, 10, 11],
        [4, 5, 12, 13],
        [6, 7, 14, 15],
    ]
    assert all(r["held"]["replicated"] == list(range(16)) for r in results)
    for r in results:
        want = "even" if r["process"] < 2 else "odd"
        rows = {"even": even, "odd": odd}[want]
        assert f"has 9 rows, but the plan for process {r['process']} needs 8" in r["errors"]["rows"]
        assert str(rows[:6]) in r["errors"]["rows"]
