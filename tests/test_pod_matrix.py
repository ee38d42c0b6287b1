"""The loader on real multi-process pods, many configurations per pod: every host checks every
addressable shard, and what it read, against the independent oracle (tests/matrix.py).

Three non-contiguous layouts, one pod each (a pod costs seconds to start, a case milliseconds):

- ``data=4 x model=2`` on 4 hosts, each in two non-adjacent data rows (the seed's shape);
- ``data=2 x context=4`` on 2 hosts, each holding the column shards 0 and 2, or 1 and 3, of every
  row: two non-adjacent windows of the same rows, halos at both sequence edges;
- ``replica=2 x data=2 x context=2`` on 4 hosts, two batch axes, each host in two of the four
  (replica, data) rows.

Across them: per-leaf strategies side by side (full, batch, replicated, sequence), sources with
``read_window`` and without (``read`` only, ``__getitem__``, Grain-style records), 3-D and 4-D
leaves sharded on dimensions >= 2, halos, feeding subsets, uneven batches and ``drop_last``. The
same cases run on every host of the same layouts simulated in one process (tests/test_hosts.py).
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from psdp.tools.pod import run_pod
from tests.pod_cases import PODS
from tests.pod_targets_matrix import check_cases

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]  # pods of 240 s, plus a minute


@pytest.mark.parametrize("pod", list(PODS))
def test_every_host_of_the_pod_checks_every_case(pod):
    layout, names, shape, hosts, cases = PODS[pod]
    results = run_pod(
        check_cases,
        num_processes=hosts,
        devices_per_process=8 // hosts,
        args=dict(process_index=layout, axis_names=names, mesh_shape=shape,
                  cases=[asdict(c) for c in cases]),
        timeout_s=240,
    )  # fmt: skip
    assert [r["process"] for r in results] == list(range(hosts))
    for number, case in enumerate(cases):  # every local device of every leaf, every step
        assert all(r["shards"][number] > 0 for r in results), case.name
