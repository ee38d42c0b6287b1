"""Partition strategies on the 4-process non-contiguous pod: exact shards, reads equal the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_checks import NONCONTIGUOUS_4x2, run_on_noncontiguous_pod
from psdp.pod import run_pod

TARGET = f"{Path(__file__).parent / 'pod_targets_partition.py'}:partition_exact"
pytestmark = pytest.mark.multiprocess

CONTIGUOUS_2x4 = [[0, 0], [0, 0], [1, 1], [1, 1]]


def run(axis_names, batch_spec, batch_size=16, num_rows=40, halo=0, layout=NONCONTIGUOUS_4x2):
    processes = len({p for row in layout for p in row})
    return run_pod(
        TARGET,
        num_processes=processes,
        devices_per_process=8 // processes,
        args=dict(
            process_index=layout,
            axis_names=axis_names,
            mesh_shape=[4, 2],
            batch_spec=batch_spec,
            batch_size=batch_size,
            num_rows=num_rows,
            steps=4,
            halo=halo,
        ),
        timeout_s=180,
    )


@pytest.mark.parametrize(
    ("strategy", "rows_per_step"),
    [("batch", 8), ("full", 4), ("replicated", 16)],  # of a 16-row batch, per host
)
def test_strategies_on_the_noncontiguous_pod(strategy, rows_per_step):
    results = run(["data", "model"], strategy, num_rows=64)
    # 3 leaves (tokens, weight, mask) x 2 devices x 4 steps, every shard exact; each host reads
    # what the plan says
    assert [r["shards"] for r in results] == [24] * 4
    assert [r["rows_per_step"] for r in results] == [rows_per_step] * 4


def test_sequence_windows_with_halo_equal_a_ppermute_exchange_across_hosts():
    spec = {"tokens": ["data", "context"]}
    results = run(["data", "context"], spec, halo=2, num_rows=64)
    assert [r["shards"] for r in results] == [24] * 4  # 3 leaves x 2 devices x 4 steps
    # each host reads its 8 rows x (4 own + 2 halo columns) of tokens, and 8 weights
    assert [r["elements"] for r in results] == [8 * 6 + 8] * 4


def test_halo_windows_of_one_host_merge_into_one_read_on_a_contiguous_pod():
    spec = {"tokens": ["data", "context"]}
    results = run(["data", "context"], spec, halo=2, num_rows=64, layout=CONTIGUOUS_2x4)
    assert [r["shards"] for r in results] == [48] * 2  # 3 leaves x 4 devices x 4 steps
    # each host holds both sequence shards of its 8 rows: whole rows (8 columns), read once
    assert [r["elements"] for r in results] == [8 * 8 + 8] * 2


def test_logical_batch_of_10_on_the_noncontiguous_pod():
    results = run(["data", "model"], "batch", batch_size=10, num_rows=23)
    # physical batch 12: tokens, weight and mask x 2 devices x 4 steps
    assert [r["shards"] for r in results] == [24] * 4


def test_only_the_feeding_hosts_read():
    results = run_on_noncontiguous_pod(
        f"{Path(__file__).parent / 'pod_targets_partition.py'}:feeding_exact",
        feeding=[0],  # host 0 holds data rows 0 and 2, shared with host 1
        batch_size=8,
        num_rows=40,
        steps=3,
    )
    # rows 0 and 2 of 4 get 4 real rows each: physical batch 16, 8 of them padding
    assert [r["physical"] for r in results] == [16] * 4
    assert [r["shards"] for r in results] == [18] * 4  # 3 leaves x 2 devices x 3 steps, exact
    assert [r["rows_read"] for r in results] == [24, 24, 0, 0]  # hosts 2 and 3 read nothing
