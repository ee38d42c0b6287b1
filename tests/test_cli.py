"""The ``psdp`` command line and the plan picture, called in-process (plus one real subprocess)."""

import itertools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp._plan.layout import MeshLayout
from psdp._plan.picture import plan_summary
from psdp.tools.cli import main, parse_spec

EXAMPLE = ["plan", "--example"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert (code, err) == (0, "")
    return json.loads(out)


# ------------------------------------------------------------------------------ example pod
def test_example_text_shows_uids_mapping_and_rows(capsys):
    code, out, err = run_cli(capsys, *EXAMPLE)
    assert (code, err) == (0, "")
    assert "uids (process_mesh_mapping): {0: 0, 1: 0, 2: 1, 3: 1}" in out
    assert "p0  uid 0  devices d0 d1 d2 d3  local_device_mapping {0: 0, 3: 1}\n" in out
    assert "    rows 0-3, 12-15\n" in out
    assert "DP0 | d0 p0   d1 p0   d4 p1   d5 p1" in out  # the device ids of docs/concepts/mesh.md
    assert "DP3 | d2 p0   d3 p0   d6 p1   d7 p1" in out


def test_example_json_rows_of_every_process(capsys):
    summary = plan_json(capsys, *EXAMPLE)
    assert summary["uids"] == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert summary["uid_groups"] == {"0": [0, 1], "1": [2, 3]}
    rows = {p["process"]: p["rows"] for p in summary["processes"]}
    assert rows == {0: [[0, 4], [12, 16]], 1: [[0, 4], [12, 16]], 2: [[4, 12]], 3: [[4, 12]]}
    p0 = summary["processes"][0]
    assert p0["local_device_mapping"] == {"0": 0, "3": 1}
    assert p0["row_blocks"] == [
        {"rows": [0, 4], "columns": None},
        {"rows": [12, 16], "columns": None},
    ]


def test_example_equals_explicit_options(capsys):
    explicit = plan_json(
        capsys,
        *["plan", "--axes", "data=4,model=4", "--processes", "4", "--layout", "noncontiguous"],
        *["--batch-axes", "data", "--batch-spec", "data", "--batch-size", "16"],
    )
    assert explicit == plan_json(capsys, *EXAMPLE)


def test_summary_is_plain_json_with_each_hosts_columns():
    """Only JSON types (string keys, lists), so ``--json`` prints it unchanged; with dimension 1
    sharded, hosts 0 and 1 hold the same rows but read different columns (their own read uids)."""
    layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
    summary = plan_summary(layout, "data", ("data", "model"), (16, 32))
    assert json.loads(json.dumps(summary)) == summary  # a tuple or an int key would differ
    assert summary["uids"] == {"0": 0, "1": 0, "2": 1, "3": 1}
    assert summary["read_uids"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    assert [p["row_blocks"] for p in summary["processes"][:2]] == [
        [{"rows": [0, 4], "columns": [[0, 16]]}, {"rows": [12, 16], "columns": [[0, 16]]}],
        [{"rows": [0, 4], "columns": [[16, 32]]}, {"rows": [12, 16], "columns": [[16, 32]]}],
    ]


# ------------------------------------------------------------------------------ other pods
def test_three_d_contiguous_mesh_is_flattened_with_a_caption(capsys):
    argv = ["plan", "--axes", "replica=2,data=2,model=2", "--processes", "4"]
    argv += ["--batch-axes", "replica,data", "--batch-spec", "(replica,data)", "--batch-size", "8"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    assert "replica=2 x data=2 (flattened, major to minor)" in out
    assert "3-D mesh is drawn flattened to 2-D" in out
    assert "DP3 | d6 p3  d7 p3" in out
    summary = plan_json(capsys, *argv)
    assert summary["uids"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    assert [p["rows"] for p in summary["processes"]] == [[[0, 2]], [[2, 4]], [[4, 6]], [[6, 8]]]


def test_model_axis_between_batch_axes_groups_rows_by_dp_index(capsys):
    # data is the middle axis: the grid's columns flatten replica and model.
    argv = ["plan", "--axes", "replica=2,data=2,model=2", "--processes", "4"]
    summary = plan_json(capsys, *argv, "--batch-axes", "data", "--batch-size", "4")
    assert summary["mesh"]["column_axes"] == ["replica", "model"]
    assert summary["mesh"]["processes"] == [[0, 0, 2, 2], [1, 1, 3, 3]]
    assert summary["uid_groups"] == {"0": [0, 2], "1": [1, 3]}


def test_seq_len_with_sharded_columns_shows_column_ranges(capsys):
    argv = [*EXAMPLE, "--batch-spec", "data,model", "--seq-len", "32"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    assert "    rows 0-3, 12-15 x cols 0-15\n" in out  # p0: model columns 0, 1
    assert "    rows 0-3, 12-15 x cols 16-31\n" in out  # p1: model columns 2, 3
    assert "read-plan uids" in out
    summary = plan_json(capsys, *argv)
    p1 = summary["processes"][1]
    assert p1["row_blocks"][0] == {"rows": [0, 4], "columns": [[16, 32]]}
    assert summary["read_uids"] == {"0": 0, "1": 1, "2": 2, "3": 3}
    assert summary["uids"] == {"0": 0, "1": 0, "2": 1, "3": 1}


@pytest.mark.parametrize(
    "argv",
    [
        [*EXAMPLE],  # the batch spec: labels are the batch uids
        [
            *EXAMPLE,
            "--batch-spec",
            "(data,model)",
        ],  # FULL: each host of a TP group reads other rows
        [*EXAMPLE, "--batch-spec", "data,model", "--seq-len", "32"],  # sequence: other columns
        [
            "plan",
            "--axes",
            "data=2,context=2",
            "--processes",
            "4",
            "--batch-spec",
            "data,context",
            "--batch-size",
            "4",
            "--seq-len",
            "8",
        ],  # fmt: skip
    ],
)
def test_plan_labels_hosts_alike_only_when_they_read_alike(capsys, argv):
    """Two hosts in the reads section share a uid label exactly when they read the same data."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = out.split("\nreads for global shape")[1].splitlines()[1:]
    labels = [re.match(r"p\d+  (.*?)  devices", line).group(1) for line in lines[::2]]
    reads = [line.strip() for line in lines[1::2]]
    for (label_a, read_a), (label_b, read_b) in itertools.combinations(
        zip(labels, reads, strict=True), 2
    ):
        assert (label_a == label_b) == (read_a == read_b), (label_a, read_a, label_b, read_b)


def test_layout_file(capsys, tmp_path):
    path = tmp_path / "layout.json"
    layout = {"axis_names": ["data", "model"], "process_index": [[0, 1], [0, 1]]}
    path.write_text(json.dumps(layout))
    summary = plan_json(
        capsys, "plan", "--layout", str(path), "--batch-spec", "data", "--batch-size", "4"
    )
    assert summary["uids"] == {"0": 0, "1": 0}
    assert [p["rows"] for p in summary["processes"]] == [[[0, 4]], [[0, 4]]]


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("data", ("data",)),
        ("(replica,data),context", (("replica", "data"), "context")),
        ("replica+data, None", (("replica", "data"), None)),
        ("-,model", (None, "model")),
        ("( data )", ("data",)),  # a one-axis group is just the axis
    ],
)
def test_parse_spec(text, entries):
    assert parse_spec(text) == entries


# ---------------------------------------------------------------------------- bad arguments
POD = ["--axes", "data=4,model=4", "--processes", "4", "--batch-axes", "data"]


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        # malformed --axes: an entry without a size
        ([*POD[:1], "data=4,model", *POD[2:], "--batch-size", "16"], ["--axes", "'model'"]),
        # an axis named twice
        (["--axes", "data=4,data=2", "--processes", "2"], ["--axes", "given twice"]),
        # a process count that does not divide the 16 devices
        ([*POD[:3], "3", *POD[4:], "--batch-size", "16"], ["--processes 3", "divisor"]),
        # a process count the noncontiguous tiling cannot use (1 device per host)
        ([*EXAMPLE, "--processes", "16"], ["--layout noncontiguous", "--processes 16"]),
        # a non-integer process count (argparse)
        ([*EXAMPLE, "--processes", "x"], ["--processes", "'x'"]),
        # an unknown batch axis
        (
            [*POD[:5], "foo", "--batch-size", "16"],
            ["--batch-axes 'foo'", "'foo' is not a mesh axis", "['data', 'model']"],
        ),
        # an unknown axis in the spec
        ([*EXAMPLE, "--batch-spec", "(data,ctx)"], ["--batch-spec '(data,ctx)'", "'ctx'"]),
        # a spec with an unclosed group
        ([*EXAMPLE, "--batch-spec", "(data,model"], ["--batch-spec '(data,model'", "not closed"]),
        # an axis used twice in the spec
        (
            [*EXAMPLE, "--batch-spec", "data,data", "--seq-len", "4"],
            ["--batch-spec 'data,data'", "twice"],
        ),
        # two spec entries for a 1-D leaf
        ([*EXAMPLE, "--batch-spec", "data,model"], ["--batch-spec 'data,model'", "--seq-len"]),
        # a batch the 4 data shards do not divide
        ([*EXAMPLE, "--batch-size", "10"], ["--batch-size 10", "multiple of 4"]),
        # a sequence the 4 model shards do not divide
        (
            [*EXAMPLE, "--batch-spec", "data,model", "--seq-len", "30"],
            ["--seq-len 30", "multiple of 4"],
        ),
        # no batch size at all
        (POD, ["--batch-size None", "--batch-size 16"]),
        # a missing layout file
        ([*EXAMPLE[:1], "--layout", "missing.json"], ["--layout 'missing.json'", "does not exist"]),
        # --example keeps a file --layout, which must exist
        ([*EXAMPLE, "--layout", "missing.json"], ["--layout 'missing.json'", "does not exist"]),
        # a built-in layout name misspelt reads as a file name, and the fix lists the built-ins
        ([*EXAMPLE, "--layout", "noncontig"], ["--layout 'noncontig'", "noncontiguous"]),
        # an unknown option
        ([*EXAMPLE, "--frob"], ["--frob"]),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_value(capsys, argv, names):
    code, out, err = run_cli(capsys, *(argv if argv[0] == "plan" else ["plan", *argv]))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("psdp")
    for name in names:
        assert name in err


def test_plan_of_a_layout_over_some_processes_names_the_real_processes(capsys, tmp_path):
    path = tmp_path / "layout.json"
    path.write_text('{"axis_names": ["data", "model"], "process_index": [[0, 2], [2, 0]]}')
    summary = plan_json(
        capsys, "plan", "--layout", str(path), "--batch-spec", "data", "--batch-size", "4"
    )
    assert summary["uids"] == {"0": 0, "2": 0}
    assert [p["process"] for p in summary["processes"]] == [0, 2]


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("not json", ["is not a valid layout", "Expected JSON like"]),  # not JSON at all
        ('{"axis_names": ["data"]}', ["'process_index'"]),  # a key missing
    ],
)
def test_bad_layout_file(capsys, tmp_path, content, names):
    path = tmp_path / "layout.json"
    path.write_text(content)
    code, _, err = run_cli(
        capsys, "plan", "--layout", str(path), "--batch-spec", "a", "--batch-size", "4"
    )
    assert code == 2
    assert f"--layout {str(path)!r}" in err and err.count("\n") == 1
    for name in names:
        assert name in err


def test_layout_file_rejects_processes_and_other_axes(capsys, tmp_path):
    path = tmp_path / "layout.json"
    path.write_text('{"axis_names": ["data", "model"], "process_index": [[0, 1], [0, 1]]}')
    argv = ["plan", "--layout", str(path), "--batch-spec", "data", "--batch-size", "4"]
    code, _, err = run_cli(capsys, *argv, "--processes", "2")
    assert code == 2 and "--processes 2: a layout file already fixes the processes" in err
    code, _, err = run_cli(capsys, *argv, "--axes", "data=4,model=1")
    assert code == 2 and "--axes 'data=4,model=1' does not match" in err


def test_help_lists_subcommands(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "plan" in out


def test_no_subcommand_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2
    assert "COMMAND" in err


def test_python_dash_m_entry_point():
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "psdp", "plan", "--example"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "uids (process_mesh_mapping): {0: 0, 1: 0, 2: 1, 3: 1}" in result.stdout


# ----------------------------------------------------------------------- simulate, write, bench
def test_help_lists_every_subcommand(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("plan", "simulate", "bench", "write", "prepare", "index", "inspect"):
        assert f"    {command} " in out


SMALL_POD = ["simulate", "--processes", "2", "--axes", "data=2,model=2", "--steps", "6"]


@pytest.mark.multiprocess
def test_simulate_json(capsys):
    code, out, err = run_cli(capsys, *SMALL_POD, "--batch-size", "8", "--seq-len", "4", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["verdict"] == "all devices received exactly their rows"
    assert report["shape"] == [8, 4]
    # 6 steps x 2 devices x 2 leaves (tokens and the mask every dict batch carries)
    assert [h["shards_checked"] for h in report["hosts"]] == [24, 24]
    assert report["simulation"]["mesh"]["axes"] == {"data": 2, "model": 2}


def _document_store(tmp_path: Path) -> Path:
    """300 documents of 1 to 40 tokens in [0, 64): document ``d`` counts up from ``7 d``."""
    from psdp import write_documents

    lengths = np.random.default_rng(3).integers(1, 41, 300)
    docs = [(7 * d + np.arange(n)) % 64 for d, n in enumerate(lengths)]
    return write_documents(tmp_path / "docs", docs, dtype=np.int32, progress=False)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("packing", "view", "leaves"),
    [
        ([], "read as TokenSequences of 16 tokens", 4),  # input_ids, segment_ids, positions, mask
        (["--packing", "best_fit"], "packed (best_fit) into sequences of 16 tokens", 5),  # + loss
    ],
)
def test_simulate_reads_a_document_store_through_its_token_view(
    capsys, tmp_path, packing, view, leaves
):
    store = _document_store(tmp_path)
    code, out, err = run_cli(
        capsys, *SMALL_POD, "--source", str(store), "--seq-len", "16", "--batch-size", "8",
        "--train", *packing, "--json",
    )  # fmt: skip
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["verdict"] == "all devices received exactly their rows"
    assert report["source"] == f"the document store {store}, {view}"
    assert report["shape"] == [8, 16]
    # 6 steps x 2 devices x the view's leaves, each device's shard equal to the re-read rows
    assert [h["shards_checked"] for h in report["hosts"]] == [6 * 2 * leaves] * 2
    assert len(report["hosts"][0]["losses"]) == 6


@pytest.mark.multiprocess
def test_simulate_a_failing_host_exits_1_with_its_message(capsys):
    code, out, err = run_cli(capsys, *SMALL_POD, "--fail-at", "1:2")
    assert code == 1
    assert err.startswith(
        "psdp simulate: error: pod running psdp.tools.simulate.host:run_host failed: process 1 exited with "
        "status 1: RuntimeError: injected failure: process 1 raised at step 2 (--fail-at)"
    )
    assert "--- process 0 (exit status 3)" in err
    assert "psdp pod: process 0 stops: process 1 exited with status 1" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--processes", "3"], ["psdp simulate: error:", "--processes 3 does not divide"]),
        (["--axes", "data=4,model"], ["--axes 'data=4,model'"]),
        (["--batch-size", "0"], ["OrderOptions.global_batch_size", "got 0"]),
        (["--fail-at", "x"], ["--fail-at 'x' must be PROCESS:STEP"]),
        (["--layout", "torus"], ["MeshConfig.layout", "'torus'"]),
        # planned in the parent: one line before any data is written or process started
        (
            [
                "--processes",
                "2",
                "--axes",
                "data=2,context=2",
                "--batch-spec",
                "data,context",
                "--seq-len",
                "7",
            ],
            ["psdp simulate: error: --seq-len 7: dimension 1 of size 7", "(context=2)"],
        ),
        (
            ["--processes", "2", "--axes", "data=2,model=2", "--batch-spec", "data,context"],
            ["--batch-spec 'data,context': axis 'context' is not in the mesh"],
        ),
        (
            ["--processes", "2", "--axes", "data=2,model=2", "--batch-spec", "data,model,model"],
            ["--batch-spec 'data,model,model': partition spec", "has 3 entries"],
        ),
    ],
)
def test_simulate_bad_options_exit_2(capsys, argv, words):
    code, out, err = run_cli(capsys, "simulate", *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    for word in words:
        assert word in err


@pytest.mark.parametrize(
    ("argv", "layout"),
    [
        ([], "noncontiguous"),
        (["--batch-axes", "data"], "noncontiguous"),  # --batch-axes alone keeps the default mesh
        (["--axes", "data=4,model=4"], None),  # --axes: contiguous (None)
        (["--batch-axes", "data", "--layout", "contiguous"], "contiguous"),
    ],
)
def test_simulate_default_layout(capsys, monkeypatch, argv, layout):
    import psdp.tools.simulate
    from psdp.tools.pod import PodError

    seen = []

    def fake_simulate(simulation, progress=None):
        seen.append(simulation)
        raise PodError("not run")

    monkeypatch.setattr(psdp.tools.simulate, "simulate", fake_simulate)
    code, _, err = run_cli(capsys, "simulate", *argv)
    assert (code, err) == (1, "psdp simulate: error: not run\n")
    assert seen[0].mesh.axes == {"data": 4, "model": 4}
    assert seen[0].mesh.layout == layout


def test_simulate_flags_reach_the_loader_config(capsys, monkeypatch):
    import psdp.tools.simulate
    from psdp.tools.pod import PodError

    seen = []

    def fake_simulate(simulation, progress=None):
        seen.append(simulation)
        raise PodError("not run")

    monkeypatch.setattr(psdp.tools.simulate, "simulate", fake_simulate)
    argv = ["--batch-spec", "data,model", "--read-threads", "3", "--prefetch", "4", "--seed", "7"]
    assert run_cli(capsys, "simulate", *argv, "--no-shuffle", "--drop-last")[0] == 1
    data = seen[0].data
    assert data.sharding.batch_spec == P("data", "model")
    assert (data.reading.read_threads, data.reading.prefetch, data.order.seed) == (3, 4, 7)
    assert (data.order.shuffle, data.order.drop_last) == (False, True)


def test_write_npy_and_npz(capsys, tmp_path):
    from psdp.sources import TensorStoreSource

    tokens = np.arange(60, dtype=np.int32).reshape(20, 3)
    np.save(tmp_path / "tokens.npy", tokens)
    code, out, err = run_cli(capsys, "write", str(tmp_path / "tokens.npy"), str(tmp_path / "a"))
    assert code == 0, err
    assert out == f"wrote 20 rows to {tmp_path / 'a'} (leaves: array (3,) int32)\n"
    np.testing.assert_array_equal(TensorStoreSource(tmp_path / "a").read(np.arange(20)), tokens)

    weight = np.linspace(0, 1, 20, dtype=np.float32)
    np.savez(tmp_path / "rows.npz", tokens=tokens, weight=weight)
    argv = ["write", str(tmp_path / "rows.npz"), str(tmp_path / "b"), "--rows-per-shard", "8"]
    meta = json.loads(run_cli(capsys, *argv, "--json")[1])
    assert (meta["num_rows"], meta["rows_per_shard"]) == (20, 8)
    assert meta["leaves"] == {
        "tokens": {"dtype": "int32", "shape": [3]},
        "weight": {"dtype": "float32", "shape": []},
    }
    rows = TensorStoreSource(tmp_path / "b").read(np.array([19, 0]))
    np.testing.assert_array_equal(rows["tokens"], tokens[[19, 0]])
    np.testing.assert_array_equal(rows["weight"], weight[[19, 0]])


def test_write_rewrites_a_dataset_in_place(capsys, tmp_path):
    """INPUT may be the OUTPUT dataset: it is read while the new one is built beside it."""
    from psdp.sources import TensorStoreSource, read_metadata

    tokens = np.arange(90, dtype=np.int32).reshape(30, 3)
    np.save(tmp_path / "tokens.npy", tokens)
    ds = str(tmp_path / "ds")
    assert (
        run_cli(capsys, "write", str(tmp_path / "tokens.npy"), ds, "--rows-per-shard", "8")[0] == 0
    )
    code, _, err = run_cli(capsys, "write", ds, ds)
    assert code == 2 and "already exists" in err and "overwrite" in err
    argv = ["write", ds, ds, "--overwrite", "--compression", "zstd", "--rows-per-shard", "16"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert out == f"wrote 30 rows to {ds} (leaves: array (3,) int32)\n"
    meta = read_metadata(ds)
    assert (meta["compression"], meta["rows_per_shard"], meta["single_array"]) == ("zstd", 16, True)
    np.testing.assert_array_equal(TensorStoreSource(ds).read(np.arange(30)), tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "tokens.npy"]


def test_write_errors(capsys, tmp_path):
    code, _, err = run_cli(capsys, "write", str(tmp_path / "x.csv"), str(tmp_path / "out"))
    assert code == 2 and "must be a .npy or .npz file" in err
    code, _, err = run_cli(capsys, "write", str(tmp_path / "missing.npy"), str(tmp_path / "out"))
    assert code == 2 and "missing.npy" in err
    np.save(tmp_path / "t.npy", np.zeros((4, 2)))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    code, _, err = run_cli(capsys, "write", str(tmp_path / "t.npy"), str(tmp_path / "taken"))
    assert code == 2 and "taken" in err and err.count("\n") == 1
    assert err.startswith(f"psdp write: error: output {str(tmp_path / 'taken')!r}: ")


def test_write_blames_the_input_for_its_data(capsys, tmp_path):
    np.savez(tmp_path / "str.npz", s=np.array(["a", "b"]))
    code, _, err = run_cli(capsys, "write", str(tmp_path / "str.npz"), str(tmp_path / "out"))
    assert code == 2
    assert err == (
        f"psdp write: error: input {str(tmp_path / 'str.npz')!r}: leaf 's' has dtype <U1; "
        "datasets store numeric and bool arrays (encode strings or objects as numbers first)\n"
    )
    assert not (tmp_path / "out").exists()


def test_bench_passes_every_argument_on(capsys, monkeypatch):
    import psdp.tools.benchmarks

    seen = []
    monkeypatch.setattr(psdp.tools.benchmarks, "main", lambda argv: seen.append(argv) or 0)
    assert run_cli(capsys, "bench", "--quick", "--only", "planning")[0] == 0
    assert run_cli(capsys, "bench", "--help")[0] == 0
    assert seen == [["--quick", "--only", "planning"], ["--help"]]


# what each README quick-start command must print
QUICK_START = {
    "simulate": "all devices received exactly their rows",
    "plan": "uids (process_mesh_mapping)",
    "write": "wrote 64 rows to my_dataset",
}


@pytest.mark.multiprocess
def test_readme_quick_start_commands_run(capsys, tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"After `make run`.*?```bash\n(.*?)```", readme, re.S)
    assert block is not None
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    makes_input = [c for c in commands if c[0] == ".venv/bin/python"]
    commands = [c for c in commands if c not in makes_input]
    assert [c[:2] for c in commands] == [[".venv/bin/psdp", name] for name in QUICK_START]
    monkeypatch.chdir(tmp_path)
    for command in makes_input:  # the README's own line makes tokens.npz
        subprocess.run([sys.executable, *command[1:]], check=True, timeout=120)
    for command in commands:
        code, out, err = run_cli(capsys, *command[1:])
        assert code == 0, err
        assert QUICK_START[command[1]] in out


def test_plan_and_simulate_build_the_same_noncontiguous_layout(capsys):
    from psdp._integration.loader_config import MeshConfig

    args = ["--axes", "replica=2,data=2,model=2", "--layout", "noncontiguous"]
    assert main(["plan", *args, "--processes", "4", "--batch-axes", "replica,data",
                 "--batch-size", "8", "--json"]) == 0  # fmt: skip
    drawn = json.loads(capsys.readouterr().out)
    config = MeshConfig({"replica": 2, "data": 2, "model": 2}, ("replica", "data"), "noncontiguous")
    layout = config.layout_for(num_processes=4, num_devices=8)
    from psdp._plan.mesh import local_device_mapping

    for entry in drawn["processes"]:  # the same DP rows on the same hosts
        want = local_device_mapping(layout, ("replica", "data"), entry["process"])
        assert {int(k): v for k, v in entry["local_device_mapping"].items()} == want


def test_plan_piped_into_head_ends_quietly():
    """``psdp plan | head -1``: the rest of the plan (120 kB, more than a pipe holds) meets a
    closed pipe, which must end psdp quietly, not with a BrokenPipeError traceback."""
    plan = "plan --axes data=1024 --processes 1024 --batch-axes data --batch-size 1024"
    command = f"{shlex.quote(sys.executable)} -m psdp {plan} | head -1"
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=300)
    assert (
        done.stdout == "mesh data=1024: 1024 devices on 1024 processes; cell = device id, process\n"
    )
    assert done.stderr == ""


def test_the_old_spec_flag_is_a_hidden_alias_of_batch_spec(capsys):
    new = plan_json(capsys, *EXAMPLE, "--batch-spec", "data,model", "--seq-len", "32")
    assert plan_json(capsys, *EXAMPLE, "--spec", "data,model", "--seq-len", "32") == new
    for command in ("plan", "simulate"):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and "--batch-spec" in out and "--spec" not in out


# ------------------------------------------------------------------------- write: token documents
def _documents_of(path):
    """A written document store as its documents (the offsets applied by numpy here)."""
    from psdp.sources import DocumentStore

    store = DocumentStore.open(path)
    flat = store.read_ranges([0], [store.num_tokens])["input_ids"]
    offsets = store.offsets_range(0, store.num_documents + 1)
    return [flat[offsets[d] : offsets[d + 1]].tolist() for d in range(store.num_documents)], flat


def test_write_token_documents(capsys, tmp_path):
    """A flat .npy with offsets or split at EOS, a nanoGPT .bin, .jsonl lists and objects: each
    store holds exactly the documents given (empty ones left out and counted)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 60_000, n).astype(np.uint16) for n in (5, 1, 0, 9, 3)]
    kept = [d.tolist() for d in docs if len(d)]
    flat = np.concatenate(docs)
    np.save(tmp_path / "tokens.npy", flat)
    np.save(tmp_path / "offsets.npy", np.cumsum([0, *map(len, docs)]))
    out = str(tmp_path / "a")
    code, text, err = run_cli(capsys, "write", str(tmp_path / "tokens.npy"), out, "--offsets", str(tmp_path / "offsets.npy"))  # fmt: skip
    assert code == 0, err
    assert text == f"wrote 4 documents, 18 tokens to {out} (input_ids uint16; left out 1 empty documents)\n"  # fmt: skip
    assert _documents_of(out)[0] == kept

    eos = np.zeros(1, np.uint16)
    with_eos = np.concatenate([docs[0], eos, docs[1], eos, docs[3]])  # the last: no EOS
    with_eos.tofile(tmp_path / "train.bin")  # nanoGPT: raw uint16, no header
    argv = ["write", str(tmp_path / "train.bin"), str(tmp_path / "b"), "--eos-id", "0", "--json"]
    meta = json.loads(run_cli(capsys, *argv)[1])
    assert (meta["num_documents"], meta["dtype"]) == (3, "uint16")
    got, stream = _documents_of(tmp_path / "b")
    assert got == [[*docs[0].tolist(), 0], [*docs[1].tolist(), 0], docs[3].tolist()]
    np.testing.assert_array_equal(stream, with_eos)  # the stream is the file's exactly

    lines = [json.dumps(d.tolist()) for d in docs[:2]] + ["", json.dumps([70_000, 1])]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    assert run_cli(capsys, "write", str(tmp_path / "d.jsonl"), str(tmp_path / "c"))[0] == 0
    got, stream = _documents_of(tmp_path / "c")
    assert got == [docs[0].tolist(), docs[1].tolist(), [70_000, 1]]
    assert stream.dtype == np.uint32
    lines = [json.dumps({"text": "x", "ids": d.tolist()}) for d in docs]
    (tmp_path / "o.jsonl").write_text("\n".join(lines) + "\n")
    argv = ["write", str(tmp_path / "o.jsonl"), str(tmp_path / "e"), "--key", "ids", "--dtype", "uint16"]  # fmt: skip
    assert run_cli(capsys, *argv)[0] == 0
    assert _documents_of(tmp_path / "e")[0] == kept


@pytest.mark.parametrize(
    ("files", "argv", "message"),
    [
        ({"t.npy": [1, 2, 3], "o.npy": [0, 2, 4]}, ["t.npy", "--offsets", "o.npy"], "'o.npy' end at 4, but 't.npy' holds 3 tokens"),
        ({"t.npy": [1, 2, 3], "o.npy": [0, 2]}, ["t.npy", "--offsets", "o.npy"], "end at 2, but 't.npy' holds 3 tokens; the last offset is the number of tokens"),
        ({"t.npy": [1, 2, 3], "o.npy": [0, 3, 2, 3]}, ["t.npy", "--offsets", "o.npy"], "must never decrease, got offsets[1]=3 > offsets[2]=2"),
        ({"t.npy": [1, 2, 3], "o.npy": [1, 3]}, ["t.npy", "--offsets", "o.npy"], "must start at 0, got 1"),
        ({"t.npy": [1.0, 2.0]}, ["t.npy", "--eos-id", "0"], "must hold a flat (1-D) integer token array, got float64[2]"),
        ({"t.npy": [1, 2]}, ["t.npy"] , None),  # rows: a .npy alone is still a dataset
        ({"t.npy": [1, 2], "o.npy": [0, 2]}, ["t.npy", "--offsets", "o.npy", "--eos-id", "0"], "give --offsets OFFSETS.npy or --eos-id ID (not both)"),
        ({"t.bin": b"\x01\x00\x02"}, ["t.bin", "--eos-id", "0"], "holds 3 bytes, not a whole number of uint16 tokens"),
        ({"t.bin": b"\x01\x00"}, ["t.bin"], "give --offsets OFFSETS.npy or --eos-id ID"),
        ({"d.jsonl": "[1, 2]\n[3, oops]\n"}, ["d.jsonl"], "'d.jsonl' line 2 is not JSON"),
        ({"d.jsonl": "[1, 2]\n\n[3, 4.0]\n"}, ["d.jsonl"], "'d.jsonl' line 3: token ids must be integers, got 4.0"),
        ({"d.jsonl": '[1, "2"]\n'}, ["d.jsonl"], "line 1: token ids must be integers, got '2'"),
        ({"d.jsonl": "[true]\n"}, ["d.jsonl"], "line 1: token ids must be integers, got True"),
        ({"d.jsonl": "[1, -1]\n"}, ["d.jsonl"], "line 1: token id -1 does not fit uint32 (0 to 4294967295); give a signed --dtype (e.g. int32)"),
        ({"d.jsonl": "[1, 99999999999]\n"}, ["d.jsonl"], "token id 99999999999 does not fit uint32 (0 to 4294967295); give a wider --dtype (e.g. uint64)"),
        ({"d.jsonl": "\ufeff[1, 2]\n[3]\n"}, ["d.jsonl"], None),  # a byte-order mark (Windows tools write one)
        ({"d.jsonl": "[1, 70000]\n"}, ["d.jsonl", "--dtype", "uint16"], "line 1: token id 70000 does not fit uint16 (0 to 65535); give a wider --dtype (e.g. uint32)"),
        ({"d.jsonl": '{"ids": [1]}\n'}, ["d.jsonl"], "line 1 must be a list of token ids, got dict (lines are objects: name the key of the token ids with --key)"),
        ({"d.jsonl": '{"ids": [1]}\n{"text": "a"}\n'}, ["d.jsonl", "--key", "ids"], "line 2 must be an object with the key 'ids' (--key), got keys ['text']"),
        ({"d.jsonl": "[1]\n"}, ["d.jsonl", "--dtype", "float32"], "--dtype float32 is not an integer dtype"),
        ({"d.jsonl": "[1]\n"}, ["d.jsonl", "--rows-per-chunk", "2"], "--rows-per-chunk does not apply to token documents"),
        ({"t.npy": [1, 2]}, ["t.npy", "--tokens-per-chunk", "2"], "--tokens-per-chunk does not apply to the rows of"),
    ],
)  # fmt: skip
def test_write_token_documents_errors(capsys, tmp_path, monkeypatch, files, argv, message):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        if name.endswith(".npy"):
            np.save(name, np.array(content))
        else:
            (tmp_path / name).write_bytes(
                content if isinstance(content, bytes) else content.encode()
            )
    code, _, err = run_cli(capsys, "write", *argv, "out")
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ object stores
#: A secret that must never reach the CLI's output (moto takes any value).
SECRET = "psdp-secret-never-printed"


def _psdp(*argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m psdp ARGV`` in a child, with ``env`` on top of this process's environment
    and no AWS or GCS endpoint unless ``env`` names one."""
    import os

    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_ENDPOINT_URL", "TENSORSTORE_GCS_HTTP_URL"))
    }
    return subprocess.run(
        [sys.executable, "-m", "psdp", *argv],
        env={**base, "AWS_SECRET_ACCESS_KEY": SECRET, **env},
        capture_output=True,
        text=True,
        timeout=timeout,  # not a timing threshold: the endpoint ignored meant minutes of retries
    )


@pytest.fixture(scope="module")
def s3_tokenizer(tmp_path_factory):
    from tests import prepare_corpus as corpus

    return corpus.train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def s3_server():
    from psdp.tools.benchmarks.object_store import S3Server

    with S3Server() as server:
        yield server


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_prepare_reads_and_writes_s3_urls_at_the_endpoint_given(
    s3_server, s3_tokenizer, tmp_path, how
):
    """``psdp prepare s3://.../*.jsonl --output s3://...`` against moto on 127.0.0.1, its endpoint
    from AWS_ENDPOINT_URL or from --endpoint (which wins over a wrong AWS_ENDPOINT_URL_S3): the
    store holds the tokenizer's ids of every text, and no credential is printed."""
    from tokenizers import Tokenizer

    from psdp import DocumentStore
    from tests import prepare_corpus as corpus

    texts = corpus.texts(40, seed=31)
    tokenizer = s3_tokenizer
    objects = s3_server.objects()
    for i in range(2):
        local = corpus.write_jsonl(tmp_path / f"s{i}.jsonl", texts[i * 20 : (i + 1) * 20])
        objects.write(f"raw-{how}/s{i}.jsonl", local.read_bytes()).result()
    if how == "flag":
        from psdp.tools.benchmarks.object_store import free_port

        given = ["--endpoint", s3_server.endpoint]
        env = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_port()}"}  # the flag wins
    else:
        given, env = [], {"AWS_ENDPOINT_URL": s3_server.endpoint}
    done = _psdp("prepare", f"s3://psdp/raw-{how}/*.jsonl", "--output", f"s3://psdp/tok-{how}/",
                 "--tokenizer", str(tokenizer), "--eos", "<|eos|>", "--workers", "1",
                 "--no-progress", *given, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "40 documents" in done.stdout and SECRET not in done.stdout + done.stderr
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|eos|>")
    want = [i for text in texts for i in [*tok.encode(text, add_special_tokens=False).ids, eos]]
    store = DocumentStore.open(s3_server.kvstore(f"tok-{how}/"))
    assert store.read_ranges([0], [store.num_tokens])["input_ids"].tolist() == want


@pytest.fixture(scope="module")
def gcs_server():
    from psdp.tools.benchmarks.object_store import GcsServer

    with GcsServer() as server:
        yield server


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_prepare_and_write_take_gs_urls_at_the_endpoint_given(
    gcs_server, s3_tokenizer, tmp_path, how
):
    """``psdp prepare gs://.../*.jsonl --output gs://...`` and ``psdp write`` to and from gs://
    against fake-gcs-server, its endpoint from TENSORSTORE_GCS_HTTP_URL or from --endpoint (which
    wins over a wrong variable): the tokenizer's ids of every text, the rows written, and the
    token never printed."""
    from tokenizers import Tokenizer

    from psdp import DocumentStore
    from psdp.sources import TensorStoreSource
    from psdp.tools.benchmarks.object_store import GCS_ENVIRONMENT, free_port
    from tests import prepare_corpus as corpus

    texts = corpus.texts(30, seed=32)
    objects = gcs_server.objects()
    for i in range(2):
        local = corpus.write_jsonl(tmp_path / f"g{i}.jsonl", texts[i * 15 : (i + 1) * 15])
        objects.write(f"raw-{how}/g{i}.jsonl", local.read_bytes()).result()
    if how == "flag":
        given = ["--endpoint", gcs_server.endpoint]
        env = {"TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{free_port()}"}  # the flag wins
    else:
        given, env = [], {"TENSORSTORE_GCS_HTTP_URL": gcs_server.endpoint}
    done = _psdp("prepare", f"gs://psdp/raw-{how}/*.jsonl", "--output", f"gs://psdp/tok-{how}/",
                 "--tokenizer", str(s3_tokenizer), "--eos", "<|eos|>", "--workers", "1",
                 "--no-progress", *given, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "30 documents" in done.stdout
    tok = Tokenizer.from_file(str(s3_tokenizer))
    eos = tok.token_to_id("<|eos|>")
    want = [i for text in texts for i in [*tok.encode(text, add_special_tokens=False).ids, eos]]
    with gcs_server.environment():
        store = DocumentStore.open(gcs_server.kvstore(f"tok-{how}/"))
        assert store.read_ranges([0], [store.num_tokens])["input_ids"].tolist() == want
    table = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    np.save(tmp_path / "table.npy", table)
    url = f"gs://psdp/table-{how}/"
    up = _psdp("write", str(tmp_path / "table.npy"), url, "--rows-per-shard", "16", *given, env=env)
    assert up.returncode == 0, up.stderr
    assert f"wrote 40 rows to {url} (endpoint {gcs_server.endpoint})" in up.stdout
    down = _psdp("write", url, str(tmp_path / "back"), *given, env=env)
    assert down.returncode == 0, down.stderr
    np.testing.assert_array_equal(TensorStoreSource(tmp_path / "back").read(np.arange(40)), table)
    token = GCS_ENVIRONMENT["GOOGLE_AUTH_TOKEN_FOR_TESTING"]
    assert token not in done.stdout + done.stderr + up.stdout + up.stderr + down.stdout


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_write_reads_and_writes_s3_urls_at_the_endpoint_given(s3_server, tmp_path, how):
    """``psdp write`` of a .npy to an s3:// URL, then of that dataset back to a directory."""
    from psdp.sources import TensorStoreSource

    table = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    np.save(tmp_path / "table.npy", table)
    if how == "flag":
        given, env = ["--endpoint", s3_server.endpoint], {}
    else:
        given, env = [], {"AWS_ENDPOINT_URL_S3": s3_server.endpoint}
    url = f"s3://psdp/table-{how}/"
    up = _psdp("write", str(tmp_path / "table.npy"), url, "--rows-per-shard", "16", *given, env=env)
    assert up.returncode == 0, up.stderr
    assert f"wrote 40 rows to {url} (endpoint {s3_server.endpoint})" in up.stdout
    down = _psdp("write", url, str(tmp_path / "back"), *given, env=env)
    assert down.returncode == 0, down.stderr
    assert SECRET not in up.stdout + up.stderr + down.stdout + down.stderr
    np.testing.assert_array_equal(TensorStoreSource(tmp_path / "back").read(np.arange(40)), table)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["environment", "flag"])
def test_an_unreachable_endpoint_fails_soon_naming_it(tmp_path, s3_tokenizer, how):
    """A closed port on 127.0.0.1: each command exits 2 with one line naming the store and the
    endpoint, after a few tries, not TensorStore's many minutes of them."""
    from psdp.tools.benchmarks.object_store import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    if how == "flag":
        given, env = ["--endpoint", endpoint], {}
    else:
        given, env = [], {"AWS_ENDPOINT_URL": endpoint}
    np.save(tmp_path / "table.npy", np.zeros((4, 2), np.int32))
    commands = {
        "s3://psdp/gone/": ["write", "s3://psdp/gone/", str(tmp_path / "out")],
        "s3://psdp/new/": ["write", str(tmp_path / "table.npy"), "s3://psdp/new/"],
        "s3://psdp/raw/": ["prepare", "s3://psdp/raw/*.jsonl", "--output", str(tmp_path / "s"),
                           "--tokenizer", str(s3_tokenizer)],
    }  # fmt: skip
    for name, argv in commands.items():
        done = _psdp(*argv, *given, env={"AWS_ACCESS_KEY_ID": "psdp-test", **env}, timeout=60)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(f"psdp {argv[0]}: error: "), line
        assert f"cannot reach {name} (endpoint {endpoint})" in line, line
        assert SECRET not in done.stdout + done.stderr


def test_a_malformed_endpoint_is_a_usage_error(capsys, tmp_path):
    np.save(tmp_path / "table.npy", np.zeros((4, 2), np.int32))
    code, _, err = run_cli(capsys, "write", str(tmp_path / "table.npy"), "s3://psdp/x/",
                           "--endpoint", "127.0.0.1:9000")  # fmt: skip
    assert code == 2
    assert "--endpoint='127.0.0.1:9000' is not an S3 endpoint URL" in err
    assert "http://127.0.0.1:9000" in err
