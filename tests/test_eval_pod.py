"""Eval loaders on real pods (jax.distributed on 127.0.0.1, fake CPU devices): 2 and 4 processes,
contiguous and non-contiguous, each host's shards exact against the numpy oracle, every example
exactly once over all hosts, and every host stopping at the same step, with the same batches
whatever the host count (docs/guides/evaluate.md, "Finite loaders: evaluation")."""

from __future__ import annotations

import numpy as np
import pytest

from psdp.tools.pod import run_pod
from tests.batch_checks import NONCONTIGUOUS_4x2
from tests.pod_targets_eval import eval_pass, per_host_epochs

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]

N, B = 37, 6  # 7 steps; each batch padded to 8 rows, the last holding one real row
STEPS = -(-N // B)

# name -> (processes, devices each, device -> process over the mesh, axes, shape, batch shards)
PODS = {
    "2 hosts, data=4 x model=2": (2, 4, [[0, 0], [0, 0], [1, 1], [1, 1]], ("data", "model"), (4, 2), 4),
    "4 hosts non-contiguous, data=4 x model=2": (4, 2, NONCONTIGUOUS_4x2, ("data", "model"), (4, 2), 4),
    "4 hosts, data=8": (4, 2, [0, 0, 1, 1, 2, 2, 3, 3], ("data",), (8,), 8),
}  # fmt: skip


def _run(name: str) -> list[dict]:
    processes, devices, layout, axes, shape, shards = PODS[name]
    return run_pod(
        eval_pass,
        num_processes=processes,
        devices_per_process=devices,
        args=dict(
            process_index=layout,
            axis_names=list(axes),
            mesh_shape=list(shape),
            num_rows=N,
            batch_size=B,
            batch_shards=shards,
        ),  # fmt: skip
        timeout_s=300,
    )


def _global_real_ids(results: list[dict]) -> list[list[int]]:
    """Per step, the real ids of the whole batch, pieced together from every host's blocks (a
    block held by several hosts, a tensor-parallel group, must hold the same ids on each)."""
    steps = []
    for step in range(STEPS):
        blocks: dict[int, list[int]] = {}
        for result in results:
            for start, ids in result["seen"][step]:
                assert blocks.setdefault(start, ids) == ids, (step, start)
        steps.append([i for start in sorted(blocks) for i in blocks[start]])
    return steps


@pytest.mark.parametrize("name", list(PODS))
def test_every_example_once_and_every_host_stops_at_the_same_step(name):
    results = _run(name)
    processes = PODS[name][0]
    assert [r["process"] for r in results] == list(range(processes))
    for r in results:  # every host: the same length up front, the same end, the same message
        assert (r["length"], r["steps"]) == (STEPS, STEPS)
        assert r["stop"] == results[0]["stop"] and f"step {STEPS} is past" in r["stop"]
        assert r["total"] == sum(range(N))  # each step's global sum of real ids, over all hosts
        assert r["shards"] > 0
    per_step = _global_real_ids(results)
    # host-count independent: the oracle's rows, whatever the pod
    assert per_step == [list(range(s * B, min(N, (s + 1) * B))) for s in range(STEPS)]
    seen = np.concatenate([np.array(ids, int) for ids in per_step])
    np.testing.assert_array_equal(np.sort(seen), np.arange(N))  # each example exactly once


def test_hosts_with_other_epochs_are_refused_on_every_host():
    messages = run_pod(per_host_epochs, num_processes=2, devices_per_process=1, timeout_s=120)
    for message in messages:
        assert "different settings" in message and "epochs" in message, message
