"""The benchmark runs end to end in its reduced form, so it cannot rot (no timing thresholds here).

``--quick`` computes every figure on tiny inputs; the test checks that every figure is present,
every row has a finite ratio (where the baseline exists), and the markdown names each figure. The
baselines' own correctness (every loop's shards checked before timing) is tested at the end.
"""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import jax
import numpy as np
import pytest

from psdp.tools import benchmarks
from psdp.tools.benchmarks import (
    assembly,
    baselines,
    grain_loops,
    multihost,
    object_tokens_levanter,
    throughput,
    token_checks,
    token_loops,
    tokens,
)
from psdp.tools.cli import main as cli_main

MEASURE = Path(__file__).resolve().parents[1] / "scripts" / "measure"
# the quick benchmark run (a module fixture, charged to its first test) took 176 s beside the rest
# of the slow group on 2 loaded cores (its object-store figures start moto and fake-gcs servers)
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert benchmarks.main(["--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "bench.json").read_text())


@pytest.mark.slow
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


@pytest.mark.slow
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
    threads = benchmarks.QUICK.read_threads
    for source in ("in-memory", "TensorStore zarr3"):
        for loop in (throughput.NAIVE, throughput.PREFETCH_LOOP, throughput.PROCESS_LOCAL):
            assert (source, loop) in loops
        for count in threads:
            assert (source, f"psdp, {throughput.threads_text(count)}") in loops
        grain = grain_loops.load_grain()
        if grain is not None:
            for count in (min(threads), max(threads)):
                name = f"Grain MapDataset of batch reads, {throughput.threads_text(count)}"
                assert (source, name) in loops
                # Grain's oldest supported releases have no experimental.device_put
                placed = (source, f"{name} + experimental.device_put") in loops
                assert placed == hasattr(grain.experimental, "device_put")
            assert (source, "Grain DataLoader, 1 worker process") in loops
    for row in figures["throughput"]["rows"]:  # psdp against the fastest other loop of its cell
        mine = row["loader"].startswith("psdp")
        assert (row["vs_best_other"] is not None) == mine
        assert mine or row["best_other"] is None
    stall = figures["stall"]["rows"]
    assert sorted({r["step_ms"] for r in stall}) == [5, 20, 100]
    assert {r["read_threads"] for r in stall} == set(threads)
    assert {r["source"] for r in stall} == {"in-memory + 10 ms per read", "TensorStore zarr3"}
    assert all("bottleneck" in r["stats"] for r in stall)
    assert {r["step"] for r in figures["planning"]["rows"]} == {
        "plan_pod + plan(p)",
        "process_mesh_mapping",
    }
    resume = figures["resume"]["rows"]
    assert [r["prefetch"] for r in resume if "prefetch" in r] == list(benchmarks.QUICK.rss_prefetch)
    assert all(r["bound_batches"] == r["prefetch"] + 2 for r in resume if "prefetch" in r)
    # Levanter's reader: a row beside psdp's where Levanter is installed, a word where it is not
    with_levanter = object_tokens_levanter.installed()
    levanter_rows = [
        r for r in figures["object_tokens"]["rows"] if r["job"] == object_tokens_levanter.JOB
    ]
    assert bool(levanter_rows) == with_levanter
    if with_levanter:  # beside psdp's on every store: local disk, S3 and GCS
        stores = {r["store"] for r in figures["object_tokens"]["rows"]}
        assert {r["store"] for r in levanter_rows} == stores
    assert (
        object_tokens_levanter.NOT_INSTALLED in figures["object_tokens"]["note"]
    ) != with_levanter
    pod = figures["multihost"]["rows"]
    assert {r["read_ms"] for r in pod} == set(benchmarks.QUICK.pod_read_ms)
    for (
        row
    ) in pod:  # bytes are exact, whatever the timings: psdp reads half, the read-all loops all
        if row["loader"].startswith("psdp") or row["loader"] == multihost.OWN_ROWS:
            assert row["host_share"] == 0.5 and row["own_rows_exact"] is True, row
        else:
            assert row["host_share"] == 1 and row["own_rows_exact"] is False, row


@pytest.mark.slow
def test_markdown_names_the_machine_the_command_and_every_figure(quick_report):
    out, report = quick_report
    text = (out / "bench.md").read_text()
    assert "bench --quick" in text and "cpu_cores" in text
    for number in range(1, len(benchmarks.FIGURES) + 1):
        assert f"## {number}. " in text


def test_only_selects_figures(tmp_path, capsys):
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
    assert benchmarks.QUICK is common.QUICK and benchmarks.tight_loop is baselines.tight_loop


# ------------------------------------------------------ --set: the sizes of any figure (what
# scripts/bench_plan.py and scripts/bench_loader.py measured before they were folded in here)
def test_planning_on_a_pod_of_any_size(tmp_path, capsys):
    argv = ["--only", "planning", "--set", "pod=64,16,8", "repeats=1", "--out", str(tmp_path)]
    assert benchmarks.main(argv) == 0
    table = capsys.readouterr().out
    assert "| pod | devices | hosts | step | ms | naive_ms | ratio | goal_ms |" in table
    assert "noncontiguous data=8 x model=8" in table
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {r["devices"] for r in report["figures"]["planning"]["rows"]} == {64}
    assert report["sizes"]["pod"] == [64, 16, 8] and report["quick"] is False


def test_naive_uid_table_matches_the_pod_of_the_docs():
    from psdp import MeshLayout

    layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
    assert benchmarks.naive_uid_table(layout, ["data"]) == {0: 0, 1: 0, 2: 1, 3: 1}


def test_throughput_of_any_size_and_train_steps(tmp_path, capsys):
    sizes = ["rows=64", "width=8", "batch=16", "steps=3", "repeats=1", "train_ms=0,1", "prefetch=3"]
    argv = ["--quick", "--only", "throughput", "--set", *sizes, "--out", str(tmp_path)]
    assert benchmarks.main(argv) == 0
    table = capsys.readouterr().out
    assert "| source | train_ms | loader | ms_per_batch | spread | ratio | vs_best_other |" in table
    assert "shuffled 16 x 8 int32 batches" in table and "prefetch=3" in table
    report = json.loads((tmp_path / "bench.json").read_text())
    figure = report["figures"]["throughput"]
    assert sorted({r["train_ms"] for r in figure["rows"]}) == [0.0, 1.0]
    assert {r["loader"] for r in figure["rows"]} >= {throughput.NAIVE, "psdp, 1 read thread"}
    assert report["sizes"]["rows"] == 64 and report["quick"] is True


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("pod=64,16", "give 3 comma-separated values, each an int >= 1, e.g. pod=256,64,8"),
        ("repeats=0", "give one value, an int >= 1, e.g. repeats=2"),
        ("train_ms=-1", "give comma-separated values, each a number >= 0, e.g. train_ms=0,1"),
        ("rowz=4", "'rowz' is not a size; use FIELD=VALUE with a field among assembly_mib,"),
    ],
)
def test_a_bad_size_is_refused_before_the_run(tmp_path, capsys, change, words):
    out = tmp_path / "out"
    assert benchmarks.main(["--quick", "--set", change, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()  # nothing ran, nothing was created
    assert captured.err.startswith(f"psdp bench: error: --set {change!r}: {words}")
    assert captured.err.count("\n") == 1


def test_the_user_shuffle_reads_sorted_ids_of_a_permutation_per_epoch():
    import numpy as np

    ids = benchmarks.BatchIds(num_rows=12, batch=4, seed=3)
    epochs = [np.concatenate([ids(3 * e + i) for i in range(3)]) for e in range(2)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(12))  # every row once per epoch
        assert all((np.diff(b) > 0).all() for b in np.split(epoch, 3))  # each batch sorted
    assert epochs[0].tolist() != epochs[1].tolist()  # a new permutation each epoch
    assert ids(4).tolist() == ids(4).tolist()  # random access: the same step, the same ids


# ------------------------------------------------------------------------------ the baselines
def test_the_pod_figure_runs_on_the_pod_of_the_tests():
    from tests.batch_checks import NONCONTIGUOUS_4x2

    assert NONCONTIGUOUS_4x2 == multihost.LAYOUT


def test_a_loop_that_delivers_wrong_rows_is_refused_before_any_timing(tmp_path):
    """Every loop of figure 2 is checked on every device shard when opened: a read that returns
    the right rows in the wrong order fails the check, naming the loop and the step."""
    from contextlib import ExitStack

    import numpy as np

    from psdp.tools.benchmarks.common import cpu_mesh, int32_table

    sizes = benchmarks.with_changes(benchmarks.QUICK, ["grain_workers=1"])
    mesh = cpu_mesh((4, 2), ("data", "model"))
    table = int32_table(sizes.rows, sizes.width)
    honest = baselines.TableRows(table)
    with ExitStack() as stack:
        loops = throughput.open_loops(sizes, mesh, table, table, honest, "memory", stack)
        assert throughput.NAIVE in loops
    with ExitStack() as stack, pytest.raises(AssertionError, match=r"tight loop on memory, step 0"):
        throughput.open_loops(
            sizes, mesh, table, table, lambda ids: honest(ids[::-1]), "memory", stack
        )
    assert np.array_equal(honest(np.array([1])), table[[1]])


def test_the_prefetch_loop_keeps_order_reraises_errors_and_joins_its_thread():
    import itertools
    import threading

    def numbers():
        yield from range(5)
        raise KeyError("bad row")

    before = set(threading.enumerate())
    batches = baselines.prefetched(numbers(), depth=2)
    assert list(itertools.islice(batches, 5)) == [0, 1, 2, 3, 4]
    with pytest.raises(KeyError, match="bad row"):
        next(batches)
    endless = baselines.prefetched(itertools.count(), depth=2)
    assert next(endless) == 0
    endless.close()  # the thread is blocked on a full queue: closing frees it and joins it
    assert set(threading.enumerate()) <= before


def test_the_own_rows_loop_reads_only_its_rows_on_one_host():
    """On one process the host holds every row; figure 6 runs the same loop on 4 hosts, where
    each reads half (checked there on every device shard)."""
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from psdp.tools.benchmarks.common import check_batches, cpu_mesh, int32_table

    table = int32_table(32, 4)
    ids = benchmarks.BatchIds(32, 8)
    read = multihost.TimedReads(table)
    sharding = NamedSharding(cpu_mesh((4, 2), ("data", "model")), P("data"))
    check_batches(baselines.own_rows_loop(read.read, ids, sharding, 4), ids, table, "own rows")
    assert read.rows_read == [8, 8]
    assert np.array_equal(read.read(np.array([3])), table[[3]])


# ------------------------------------------------------------------ figure 8: the token path
@pytest.mark.slow
def test_the_token_figure_has_every_job_and_loop_with_consistent_rates(quick_report):
    _, report = quick_report
    rows = report["figures"]["tokens"]["rows"]
    loops = [n for n in tokens.LOOPS if n != tokens.GRAIN or tokens.token_grain() is not None]
    assert [(r["job"], r["loader"]) for r in rows] == [
        (job.name, loop) for job in tokens.JOBS for loop in loops
    ]
    for row in rows:
        assert row["mtokens_min"] <= row["mtokens_per_s"] <= row["mtokens_max"], row
        if row["loader"] == tokens.TIGHT:
            assert row["ratio"] == 1
        packed = row["job"] == tokens.JOBS[-1].name
        assert (row["efficiency"] is not None) == packed == (row["slot_mtokens"] is not None)
        if packed:  # real tokens are the slots that hold a token
            assert 0 < row["efficiency"] <= 1
            assert row["mtokens_per_s"] == pytest.approx(row["slot_mtokens"] * row["efficiency"])
        leaves = set(row["leaves"].split(", "))
        assert "input_ids" in leaves
        if row["job"] != tokens.JOBS[0].name and row["job"] != tokens.JOBS[1].name:
            assert {"segment_ids", "positions"} <= leaves, row


@pytest.mark.slow
def test_the_token_figure_prints_the_goals_table_with_met_or_not(quick_report):
    """Issue 29: `psdp bench --only tokens` prints the goals it measures from one run: each
    goal, its target, the median and range of the rounds' ratios, and met / not met."""
    out, report = quick_report
    figure = report["figures"]["tokens"]
    assert [g["goal"] for g in figure["goals"]] == [g.text for g in tokens.GOALS]
    psdp = {r["job"]: r for r in figure["rows"] if r["loader"] == tokens.PSDP_MEMMAP}
    for goal, row in zip(tokens.GOALS, figure["goals"], strict=True):
        value = psdp[goal.job]["ratio_median" if goal.measure == "ratio" else goal.measure]
        assert row["met"] == (value >= goal.target), row
        assert row["reached"].startswith(f"{value:.3g}")
    for row in figure["rows"]:
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"], row
    text = (out / "bench.md").read_text()
    assert "Goals (one run):\n\n| goal | target | reached | met |" in text


def test_the_scale_script_prints_its_goals_met_or_not(capsys):
    """Issue 29: scripts/measure/scale_tokens.py ends with the goals it measures, met / not met: here
    from given measurements (the script's own run takes minutes)."""
    script = runpy.run_path(str(MEASURE / "scale_tokens.py"), run_name="scale_tokens")
    scale = {
        "first_batch": {10**6: (0.01, 1 << 20), 10**9: (6.0, 10 << 20)},
        "own": {
            (10**6, "in place", None): [1.0, 1.0, 1.0],
            (10**9, "in place", None): [1.05, 1.1, 1.3],
        },
    }
    packed = {"open_and_first_batch_s": 0.03, "rss_added_bytes": 2**31}
    mixture = {"sources": 100, "open_and_first_batch_s": 1.5, "rss_added_bytes": 300 << 20}
    efficiency = {"log-normal": 0.9985, "chat": 0.98}
    rows = script["goal_rows"](scale, packed, efficiency, mixture)
    assert [met for *_, met in rows] == [False, True, True, False, True, True, True, True, False]
    assert rows[4][0] == "Mixture of 100 TokenSequences of 10^9 documents: open + first batch"
    assert rows[6][2] == "1.1 (1.05-1.3)"  # the median and range of the rounds' ratios
    assert len(script["goal_rows"](scale, packed, efficiency)) == len(rows) - 2  # no mixture
    script["print_goals"](rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| goal | target | reached | met |"
    assert (
        lines[2]
        == "| TokenSequences, 10^9 documents: open + first batch | <= 5 s | 6.000 s | not met |"
    )
    assert lines[-1].endswith("| >= 0.99 | 0.9800 | not met |") and len(lines) == 11


def test_the_user_computes_segment_ids_and_positions_per_row():
    """Documents of 3, 2, 0 and 4 tokens (one empty); rows of 4 from stream positions 0, 2, 5."""
    offsets = np.array([0, 3, 5, 5, 9])
    got = token_loops.row_segments(np.array([0, 2, 5]), 4, offsets)
    assert got["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 2, 2, 4], [4, 4, 4, 4]]
    assert got["positions"].tolist() == [[0, 1, 2, 0], [2, 0, 1, 0], [0, 1, 2, 3]]
    assert got["segment_ids"].dtype == got["positions"].dtype == np.int32


def test_the_greedy_packer_fills_packs_with_whole_documents_in_order():
    """Levanter's prepacking: lengths 3, 2, 4, 1, 5, 2 into packs of 5: [3, 2], [4, 1], [5], [2]."""
    offsets = np.array([0, 3, 5, 9, 10, 15, 17])
    firsts = token_loops.greedy_packs(offsets, 5)
    assert firsts.tolist() == [0, 2, 4, 5, 6]
    flat = np.arange(1, 18, dtype=np.int32)
    got = token_loops.pack_rows(flat, offsets, firsts, np.array([3, 1]), 5)
    assert got["input_ids"].tolist() == [[16, 17, 0, 0, 0], [6, 7, 8, 9, 10]]
    assert got["segment_ids"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 2]]
    assert got["positions"].tolist() == [[0, 1, 0, 0, 0], [0, 1, 2, 3, 0]]
    assert got["input_ids"].dtype == np.int32


def test_the_stream_oracles_follow_the_ids_alone():
    store = token_checks.Store(base=10, offsets=np.array([0, 3, 5, 9]))
    rows = token_checks.stream_rows(store, np.array([2, 6]), 3)
    assert rows["input_ids"].tolist() == [[12, 13, 14], [16, 17, 18]]
    assert rows["segment_ids"].tolist() == [[1, 2, 2], [3, 3, 3]]
    assert rows["positions"].tolist() == [[2, 0, 1], [1, 2, 3]]
    shuffled = token_checks.shuffled_stream(store, np.array([[15, 16, 17], [18, 10, 11]]))
    assert shuffled["segment_ids"].tolist() == [[1, 1, 1], [1, 2, 2]]
    assert shuffled["positions"].tolist() == [[0, 1, 2], [0, 0, 1]]
    with pytest.raises(AssertionError, match="appears twice"):
        token_checks.shuffled_stream(store, np.array([[10, 11, 12, 13, 14, 10]]))
    with pytest.raises(AssertionError, match="not all in the store"):
        token_checks.shuffled_stream(store, np.array([[10, 11, 12, 19]]))


@pytest.mark.parametrize(
    "row",
    [
        [15, 16, 17, 18, 10, 0],  # the second document cut short
        [15, 16, 17, 18, 10, 11],  # the second document cut at the row's end
        [13, 14, 0, 10, 11, 12],  # padding between documents
        [13, 14, 100, 0, 0, 0],  # a token of the other store
        [0, 0, 0, 0, 0, 0],  # no token at all
        [13, 14, 13, 14, 0, 0],  # a document twice
    ],
)
def test_the_packed_oracle_refuses_rows_that_are_not_whole_documents(row):
    stores = [
        token_checks.Store(10, np.array([0, 3, 5, 9])),
        token_checks.Store(100, np.array([0, 2])),
    ]
    whole = token_checks.packed_rows(stores, np.array([[15, 16, 17, 18, 13, 14]]))
    assert whole.expected["input_ids"].tolist() == [[15, 16, 17, 18, 13, 14]]
    assert whole.documents == [(0, 2), (0, 1)] and whole.efficiency == 1
    try:  # refused outright, or expected to hold other ids than it does
        refused = token_checks.packed_rows(stores, np.array([row])).expected["input_ids"]
    except AssertionError:
        return
    assert refused.tolist() != [row]


@pytest.fixture(scope="module")
def token_corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    sizes = benchmarks.QUICK
    corpora = []
    for index, count in enumerate((sizes.token_documents, sizes.token_documents // 2)):
        lengths = tokens.document_lengths(
            count, sizes.token_mean_length, sizes.token_seq_len, index
        )
        base = 1 + (int(corpora[0].offsets[-1]) if corpora else 0)
        corpora.append(tokens.write_corpus(root / str(index), lengths, base))
    return tuple(corpora)


def _tampered(batches, leaf, step, change):
    """The batches with ``leaf`` at ``step`` changed in place by ``change(its global array)``."""
    out = [dict(b) for b in batches]
    host = np.array(out[step][leaf])
    change(host)
    out[step][leaf] = jax.device_put(host, out[step][leaf].sharding)
    return out


def _plus_one(host):
    host[-1, -1] += 1


def _a_row_repeated(batches):
    """The batches with step 1's first row replaced by step 0's, in every leaf."""
    out = [dict(b) for b in batches]
    for leaf in out[0]:
        second = np.array(out[1][leaf])
        second[0] = np.asarray(out[0][leaf])[0]
        out[1][leaf] = jax.device_put(second, out[1][leaf].sharding)
    return out


def _stores_swapped(batches, second_base):
    """The batches with a row of the first store at step 0 and one of the second store at step 1
    swapped, in every leaf: each row is still whole documents, each once, but neither step holds
    its 3:1 share."""
    first = np.asarray(batches[0]["input_ids"])[:, 0] < second_base
    second = np.asarray(batches[1]["input_ids"])[:, 0] >= second_base
    a, b = int(np.argmax(first)), int(np.argmax(second))
    assert first[a] and second[b]
    out = [dict(x) for x in batches]
    for leaf in out[0]:
        zero, one = np.array(out[0][leaf]), np.array(out[1][leaf])
        zero[a], one[b] = one[b].copy(), zero[a].copy()
        out[0][leaf] = jax.device_put(zero, out[0][leaf].sharding)
        out[1][leaf] = jax.device_put(one, out[1][leaf].sharding)
    return out


@pytest.mark.parametrize("job", tokens.JOBS, ids=lambda job: job.name)
def test_every_token_loop_passes_its_check_and_a_wrong_batch_fails_it(token_corpora, job):
    """Each loop's first batches pass the numpy oracle; the same batches with one id, one
    segment id or one position changed (the last of step 1), with a row of step 0 again in step
    1, without one of the job's leaves, or (packed) with rows of the two stores swapped between
    steps, fail it."""
    from contextlib import ExitStack

    from psdp.tools.benchmarks.common import cpu_mesh

    mesh = cpu_mesh((4, 2), ("data", "model"))
    grain = tokens.token_grain()
    with ExitStack() as stack:
        loops = tokens.loops(job, benchmarks.QUICK, mesh, token_corpora, grain, stack)
        assert list(loops) == [n for n in tokens.LOOPS if n != tokens.GRAIN or grain is not None]
        for name, (open_loop, check) in loops.items():
            batches = open_loop()
            stack.callback(batches.close)
            got = [next(batches) for _ in range(tokens.CHECKED_STEPS)]
            efficiency = check(got)
            assert 0 < efficiency <= 1 and (efficiency == 1) != job.packed, name
            leaves = ["input_ids", "segment_ids", "positions"] if job.segments else ["input_ids"]
            for leaf in leaves:
                with pytest.raises(AssertionError):
                    check(_tampered(got, leaf, 1, _plus_one))
            with pytest.raises(AssertionError):
                check(_a_row_repeated(got))
            without = [{k: v for k, v in b.items() if k != leaves[-1]} for b in got]
            with pytest.raises(AssertionError, match=f"step 0: no leaf '{leaves[-1]}'"):
                check(without)
            if job.packed:
                with pytest.raises(
                    AssertionError, match=r"step 0: rows per store \[11, 5\], not \[12, 4\]"
                ):
                    check(_stores_swapped(got, token_corpora[1].base))


def test_a_token_loop_that_delivers_wrong_rows_stops_the_figure_naming_it(tmp_path, monkeypatch):
    """The tight loop reading every row one token late fails the check of the first job, before
    any timing, and the error names the loop, the job, the step and the leaf."""
    honest = token_loops.concat_loop

    def one_token_late(flat, *args):
        return honest(flat[1:], *args)

    monkeypatch.setattr(token_loops, "concat_loop", one_token_late)
    pattern = r"tight loop, concatenate-then-split: step 0, input_ids: device \d+ holds the wrong"
    with pytest.raises(AssertionError, match=pattern):
        tokens.bench_tokens(benchmarks.QUICK, tmp_path)


class _FakeClock:
    """``time`` for `common.settle`: each sleep advances the clock, and the process's CPU time by
    the next of ``busy`` (cores used in that window; 0 once they run out)."""

    def __init__(self, busy):
        self.now, self.cpu, self.busy = 0.0, 0.0, list(busy)

    def monotonic(self):
        return self.now

    def process_time(self):
        return self.cpu

    def sleep(self, seconds):
        self.now += seconds
        self.cpu += seconds * (self.busy.pop(0) if self.busy else 0.0)


@pytest.mark.parametrize(
    ("busy", "waited"),
    [
        ([], 0.05),  # idle: one window
        ([1.0, 0.5, 0.2], 0.2),  # a loop refills its read-ahead for 3 windows
        ([0.09], 0.05),  # under a tenth of a core is idle
        ([1.0] * 1000, 1.0),  # never idle: the limit
    ],
)
def test_a_turn_starts_once_the_other_loops_are_idle(monkeypatch, busy, waited):
    import psdp.tools.benchmarks.common as common

    monkeypatch.setattr(common, "time", _FakeClock(busy))
    assert common.settle(window_s=0.05, limit_s=1.0) == pytest.approx(waited)
