"""Start-up on many simulated hosts (`tests.host_startup`): a host's requests to the object store
and its share of the host agreement must not grow with the number of hosts (``docs/measurements/scale.md``,
"Hosts"). The pods run in a subprocess, which has the devices a 64-host mesh needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # 64 simulated hosts, each opening the store

ROOT = Path(__file__).parents[1]
STORE_FIGURES = ("open_requests", "build_requests", "first_batch_requests", "requests_by_method")


def run_pods(kind: str, pods: tuple[int, ...]) -> dict[int, dict]:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(2 * max(pods)), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.host_startup", kind, *map(str, pods)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {run["hosts"]: run for run in json.loads(done.stdout)}


@pytest.mark.parametrize(("kind", "pods"), [("plain", (2, 64)), ("docs", (2, 16))])
def test_a_hosts_startup_costs_do_not_grow_with_the_hosts(kind, pods):
    runs = run_pods(kind, pods)
    small, large = (runs[n] for n in pods)
    # every host of both pods: the same requests to the store, opening, building, first batch
    first = {k: small["startups"][0][k] for k in STORE_FIGURES}
    for run in (small, large):
        assert [{k: s[k] for k in STORE_FIGURES} for s in run["startups"]] == [first] * run["hosts"]
    assert first["requests_by_method"] == {"GET": sum(first[k] for k in STORE_FIGURES[:3])}

    # and the same traffic with the coordination service on every host of both pods; the bytes
    # a host sends differ only by the digits of its own index (in its arrival key)
    def traffic(run, host):
        counts = dict(run["agreements"][host])
        return {**counts, "bytes_sent": counts["bytes_sent"] - len(str(host))}

    agreement = traffic(small, 0)
    for run in (small, large):
        assert [traffic(run, host) for host in range(run["hosts"])] == [agreement] * run["hosts"]
    assert agreement["round_trips"] <= 4 and agreement["barrier_ids_sent"] == 0
