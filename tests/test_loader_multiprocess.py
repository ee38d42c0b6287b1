"""The loader on real multi-process pods: jax.distributed on 127.0.0.1, fake CPU devices each."""

from __future__ import annotations

import numpy as np
import pytest

from psdp.tools.pod import run_pod
from tests.batch_checks import NONCONTIGUOUS_4x2, run_on_noncontiguous_pod
from tests.pod_targets import loader_exact

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]  # pods of 180 s, plus a minute

CONTIGUOUS_2x4 = [[0, 0], [0, 0], [1, 1], [1, 1]]


@pytest.mark.parametrize("shuffle", [False, True])
def test_noncontiguous_four_hosts_every_shard_exact(shuffle):
    results = run_on_noncontiguous_pod(
        loader_exact,
        num_rows=40,  # B=16: steps 2 and 5 are short epoch ends, padded and masked
        batch_size=16,
        steps=6,
        shuffle=shuffle,
        batch_axes="data",
    )
    assert [r["held"] for r in results] == [[0, 2], [0, 2], [1, 3], [1, 3]]
    # 2 leaves + the mask x 2 local devices x 6 steps, every one checked against the source
    assert [r["shards"] for r in results] == [36] * 4
    assert all(r["reads"] >= 6 for r in results)


def test_contiguous_two_hosts_every_shard_exact():
    results = run_pod(
        loader_exact,
        num_processes=2,
        devices_per_process=4,
        args=dict(
            process_index=CONTIGUOUS_2x4,
            axis_names=["data", "model"],
            mesh_shape=[4, 2],
            num_rows=24,
            batch_size=8,
            steps=5,
            shuffle=True,
            batch_axes="data",
        ),
        timeout_s=180,
    )
    assert [r["held"] for r in results] == [[0, 1], [2, 3]]
    # 2 leaves (and the all-True mask: 24 rows, B=8, nothing padded) x 4 devices x 5 steps
    assert [r["shards"] for r in results] == [3 * 4 * 5] * 2


def test_layout_matches_the_seed_shape():
    # sanity of the fixture itself: it is non-contiguous: a host holds several data rows that are not neighbours
    procs = np.array(NONCONTIGUOUS_4x2)
    for p in range(4):
        rows = sorted(set(np.nonzero(procs == p)[0].tolist()))
        assert len(rows) == 2 and rows[1] - rows[0] > 1
    assert all(len(set(row)) == 2 for row in NONCONTIGUOUS_4x2)
