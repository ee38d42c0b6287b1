"""scripts/measure/bytes_per_host.py: exact byte counts, derived by hand, on small pods and the 4-host example pod."""

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "measure" / "bytes_per_host.py"


@pytest.fixture(scope="module")
def script():
    return runpy.run_path(str(SCRIPT), run_name="bytes_per_host")


def run_json(script, capsys, *argv):
    assert script["main"]([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_hosts_each_one_model_column(script, capsys):
    # data=2 x model=2, noncontiguous: host p owns model column p in both data rows.
    # Token leaf (4, 8) int32 = 128 bytes.
    out = run_json(
        script, capsys, "--pod", "data=2,model=2@2", "--batch-size", "4", "--seq-len", "8",
        "--halo", "2",
    )  # fmt: skip
    pod = out["pods"]["data=2 x model=2, 2 hosts"]
    assert pod["batch_bytes"] == 128
    assert pod["specs"]["BATCH"] == "P('data')" and pod["specs"]["FULL"] == "P(('data', 'model'))"
    for p, host in enumerate(pod["per_host"]):
        assert host == {
            "BATCH": 128,  # both data rows: all 4 rows, whole
            "FULL": 64,  # 4 row shards of 1 row; the host holds two of them
            "REPLICATED": 128,
            "sequence": 64,  # 4 rows x columns [4p, 4p + 4)
            "sequence+halo": 96,  # 4 rows x 6 columns: [0, 6) or [2, 8)
        }, p
        assert pod["ratio_to_batch"][p]["sequence+halo"] == 0.75
    assert pod["total_bytes"]["sequence+halo"] == 192
    assert pod["duplication"] == {
        "BATCH": 2.0,
        "FULL": 1.0,
        "REPLICATED": 2.0,
        "sequence": 1.0,
        "sequence+halo": 1.5,
    }


def test_one_host_holding_both_column_shards_reads_the_shared_halo_once(script, capsys):
    # one host owns the whole data=2 x model=2 mesh: windows [0, 6) and [2, 8) overlap, and the
    # loader reads their union (tests/test_partition.py::test_overlapping_halo_windows_are_read_once)
    out = run_json(
        script, capsys, "--pod", "data=2,model=2@1", "--layout", "contiguous",
        "--batch-size", "4", "--seq-len", "8", "--halo", "2",
    )  # fmt: skip
    (host,) = out["pods"]["data=2 x model=2, 1 hosts"]["per_host"]
    assert host["sequence"] == 128 and host["sequence+halo"] == 128  # the whole sequence


def test_seed_pod_defaults(script, capsys):
    # B=64, S=4096, int32: the batch is 1 MiB. Each host of the example pod holds 2 of the 4 data
    # rows (32 rows) and 2 adjacent model columns (2 of 4 column shards of 1024).
    out = run_json(script, capsys, "--pod", "data=4,model=4@4")
    pod = out["pods"]["data=4 x model=4, 4 hosts"]
    mib = 2**20
    want = {
        "BATCH": mib // 2,
        "FULL": mib // 4,  # 4 devices x 4 rows
        "REPLICATED": mib,
        "sequence": mib // 4,  # 32 rows x 2048 columns
        "sequence+halo": 32 * 2176 * 4,  # windows [0, 1152) and [896, 2176), read as [0, 2176)
    }
    assert pod["per_host"] == [want] * 4
    assert pod["duplication"] == {s: 4 * n / mib for s, n in want.items()}
    assert pod["duplication"]["sequence+halo"] == 1.0625


def test_markdown_table(script, capsys):
    assert script["main"](["--pod", "data=2,model=2@2", "--batch-size", "4", "--seq-len", "8"]) == 0
    table = capsys.readouterr().out
    assert "| pod | hosts | BATCH | FULL | REPLICATED | sequence | sequence+halo |" in table
    assert "| data=2 x model=2, 2 hosts | 0, 1 | 128 B (1x) | 64 B (0.5x) |" in table
    assert "| data=2 x model=2, 2 hosts | all hosts |" in table


def test_bad_pod(script):
    with pytest.raises(ValueError, match="must look like 'data=4,model=4@4'"):
        script["main"](["--pod", "data=4,model=4"])
    with pytest.raises(ValueError, match="needs a batch axis and a model axis"):
        script["main"](["--pod", "data=4@2"])
