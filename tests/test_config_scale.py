"""`DataConfig.build` on every host of a 2-host and a 64-host pod over a store of 10^9 documents
that is never written (`tests.config_scale`): with its indexes in place, every host makes the same
requests of the store, reads the same bytes and keeps the same index arrays, whatever the pod's
size; what it keeps is O(D / 4096 + D / window) numbers. Counts only, no timing: the seconds and
MiB are in ``docs/measurements/scale.md`` (``scripts/measure/config_scale.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # 64 simulated hosts, each building its loader

ROOT = Path(__file__).parents[1]
DOCUMENTS, WINDOW, STRIDE = 10**9, 4096, 4096
#: Per host at build, exact: the document index file (one read), the pack index file (one
#: read), the offsets' ranges (the ends, and the first and last windows' to check them against
#: the pack index) and the first row's tokens (the loader learns the leaves).
BUILD_REQUESTS = {
    "sequences": {"document index": 1, "offsets": 4, "tokens": 2},
    "packed": {"document index": 1, "offsets": 5, "pack index": 1, "tokens": 7},
}


def run_pods(tmp_path: Path, pods: tuple[int, ...]) -> list[dict]:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(2 * max(pods)), "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.config_scale", str(tmp_path), "sequences,packed",
         *map(str, pods)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_host_of_2_and_64_hosts_builds_a_billion_document_config_with_the_same_requests(
    tmp_path,
):
    runs = run_pods(tmp_path, (2, 64))
    assert [(r["kind"], r["hosts"]) for r in runs] == [
        ("sequences", 2), ("sequences", 64), ("packed", 2), ("packed", 64)]  # fmt: skip
    blocks, windows = -(-DOCUMENTS // STRIDE), -(-DOCUMENTS // WINDOW)
    for kind in ("sequences", "packed"):
        startups = [s for r in runs if r["kind"] == kind for s in r["startups"]]
        assert len(startups) == 66
        first = startups[0]
        assert first["build_requests"] == BUILD_REQUESTS[kind]
        same = ("build_requests", "build_bytes", "held_bytes", "first_batch_rows")
        for startup in startups:  # every host of both pods
            assert {k: startup[k] for k in same} == {k: first[k] for k in same}, startup["host"]
        # what a host keeps: 16 bytes per 4,096 documents, and 32 per window of the pack index
        held = {"document_index": 16 * (blocks + 1)}
        if kind == "packed":
            held["pack_index"] = 8 * (windows + 1) + 24 * windows
        assert first["held_bytes"] == held
        # what it reads at build: the index files and a few ranges, not the corpus's offsets
        index_files = sum(runs[0]["store"].values()) if kind == "packed" else runs[0]["store"][
            "document_index_bytes"]  # fmt: skip
        assert sum(first["build_bytes"].values()) - index_files < 1 << 20
        assert first["first_batch_rows"] == 8  # 4 rows, on each of the host's 2 devices
