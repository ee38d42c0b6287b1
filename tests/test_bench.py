"""The benchmark runs end to end in its reduced form, so it cannot rot (no timing thresholds here).

``--quick`` computes all five figures on tiny inputs; the test checks that every figure is present,
every row has a finite ratio (where the baseline exists), and the markdown names each figure.
"""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import pytest

from psdp.tools import benchmarks
from psdp.tools.benchmarks import assembly, throughput
from psdp.tools.cli import main as cli_main

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert benchmarks.main(["--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "bench.json").read_text())


def test_quick_run_computes_every_figure_with_finite_ratios(quick_report):
    _, report = quick_report
    assert report["quick"] is True
    assert set(report["figures"]) == set(benchmarks.FIGURES)
    for name in benchmarks.FIGURES:
        figure = report["figures"][name]
        assert figure["rows"], name
        for row in figure["rows"]:
            ratio = row["ratio"]
            assert ratio is not None and math.isfinite(ratio), (name, row)


def test_each_figure_has_the_rows_the_issue_asks_for(quick_report):
    _, report = quick_report
    figures = report["figures"]
    paths = {r["path"] for r in figures["assembly"]["rows"]}
    assert {
        assembly.PSDP,
        assembly.CALLBACK,
        "device_put(global)",
        "make_array_from_process_local_data",
        "per-device device_put",
        "per-device device_put (one call)",
    } <= paths
    assert len({r["batch_mib"] for r in figures["assembly"]["rows"]}) == 2
    loops = {(r["source"], r["loader"]) for r in figures["throughput"]["rows"]}
    for source in ("in-memory", "TensorStore zarr3"):
        assert (source, "naive loop") in loops and (source, "psdp") in loops
        if throughput.load_grain() is not None:
            assert (source, "Grain DataLoader") in loops
    stall = figures["stall"]["rows"]
    assert sorted({r["step_ms"] for r in stall}) == [5, 20, 100]
    assert all("bottleneck" in r["stats"] for r in stall)
    assert {r["step"] for r in figures["planning"]["rows"]} == {
        "plan_pod + plan(p)",
        "process_mesh_mapping",
    }
    resume = figures["resume"]["rows"]
    assert [r["prefetch"] for r in resume if "prefetch" in r] == list(benchmarks.QUICK.rss_prefetch)
    assert all(r["bound_batches"] == r["prefetch"] + 2 for r in resume if "prefetch" in r)


def test_markdown_names_the_machine_the_command_and_every_figure(quick_report):
    out, report = quick_report
    text = (out / "bench.md").read_text()
    assert "bench --quick" in text and "cpu_cores" in text
    for number in range(1, 6):
        assert f"## {number}. " in text


def test_only_selects_figures_and_the_script_wrapper_runs(tmp_path, capsys):
    script = runpy.run_path(str(SCRIPTS / "bench.py"), run_name="bench")
    assert script["main"] is benchmarks.main
    assert benchmarks.main(["--quick", "--only", "planning", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert list(report["figures"]) == ["planning"]
    assert "## 4. Planning" in capsys.readouterr().out


def test_an_unwritable_out_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "results"  # below a file: no one can create it, root included
    for run in (benchmarks.main, lambda argv: cli_main(["bench", *argv])):
        assert run(["--quick", "--only", "planning", "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # nothing ran
        assert captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith(f"psdp bench: error: --out {out}: cannot write there")
        assert captured.err.rstrip().endswith("choose a writable directory")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "bench.json").mkdir()  # a directory where a result file goes
    assert benchmarks.main(["--quick", "--out", str(tmp_path / "out")]) == 2
    assert "bench.json exists and cannot be overwritten" in capsys.readouterr().err


def test_results_are_printed_even_when_writing_them_fails(tmp_path, capsys, monkeypatch):
    honest = benchmarks.run

    def run_then_lose_the_directory(*args, **kwargs):
        report = honest(*args, **kwargs)
        if (tmp_path / "out").is_dir():
            (tmp_path / "out").rmdir()
        (tmp_path / "out").write_text("x")  # the directory became a file during the run
        return report

    monkeypatch.setattr(benchmarks, "run", run_then_lose_the_directory)
    assert benchmarks.main(["--quick", "--only", "planning", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "## 4. Planning" in captured.out
    assert "the table above has the results" in captured.err


def test_unknown_figure_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        benchmarks.main(["--quick", "--only", "nonsense", "--out", str(tmp_path)])


def test_latency_source_sleeps_only_after_its_probe(monkeypatch):
    import numpy as np

    from psdp.tools.benchmarks import stall

    slept = []
    monkeypatch.setattr(stall.time, "sleep", slept.append)
    source = benchmarks.LatencySource(np.arange(6).reshape(3, 2), latency_s=0.25)
    assert source.read(np.array([2, 0])).tolist() == [[4, 5], [0, 1]]
    assert slept.count(0.25) == 0  # the loader's probe at construction is free
    assert source.read(np.array([1])).tolist() == [[2, 3]]
    assert slept.count(0.25) == 1


def test_the_package_keeps_the_import_paths_scripts_and_the_cli_use():
    import psdp.tools.benchmarks.common as common

    assert benchmarks.main.__module__ == "psdp.tools.benchmarks"
    assert benchmarks.QUICK is common.QUICK and benchmarks.naive_loop is throughput.naive_loop
    loader = runpy.run_path(str(SCRIPTS / "bench_loader.py"), run_name="bench_loader")
    assert loader["naive_loop"] is throughput.naive_loop
