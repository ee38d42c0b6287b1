"""The scripts under scripts/ run end to end on tiny inputs, so they cannot rot."""

import json
import runpy
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_bench_plan_on_a_tiny_pod(tmp_path, capsys):
    bench = runpy.run_path(str(SCRIPTS / "bench_plan.py"), run_name="bench_plan")
    out = tmp_path / "bench.json"
    argv = [
        "--devices",
        "64",
        "--hosts",
        "16",
        "--model",
        "8",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    assert bench["main"](argv) == 0
    table = capsys.readouterr().out
    assert table.startswith("| pod | step | median ms |")
    assert "noncontiguous data=8 x model=8" in table
    figures = json.loads(out.read_text())
    assert {f["devices"] for f in figures.values()} == {64}


def test_naive_uid_table_matches_the_seed():
    bench = runpy.run_path(str(SCRIPTS / "bench_plan.py"), run_name="bench_plan")
    layout = bench["MeshLayout"].noncontiguous({"data": 4, "model": 4}, num_processes=4)
    assert bench["naive_uid_table"](layout, ["data"]) == {0: 0, 1: 0, 2: 1, 3: 1}


def test_bench_loader_reduced(tmp_path, capsys):
    bench = runpy.run_path(str(SCRIPTS / "bench_loader.py"), run_name="bench_loader")
    out = tmp_path / "loader.json"
    argv = ["--rows", "64", "--width", "8", "--batch", "16", "--steps", "3", "--repeats", "1"]
    result = bench["main"]([*argv, "--train-ms", "0", "1", "--json", str(out)])
    table = capsys.readouterr().out
    assert "| train step | naive: fancy index + device_put | psdp DataLoader | speedup |" in table
    assert [c["train_ms"] for c in result["cases"]] == [0.0, 1.0]
    assert json.loads(out.read_text()) == result
