"""The planner against hand-worked tables, against JAX's own devices_indices_map, and at pod scale."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp import (
    MeshLayout,
    RowBlock,
    local_device_mapping,
    plan_batch,
    plan_pod,
    process_mesh_mapping,
)
from psdp._plan.mesh import dp_index
from psdp._plan.picture import plan_summary
from tests.meshes import SCRAMBLED, mesh_of


def seed_layout() -> MeshLayout:
    """The 4-host example pod (docs/concepts/mesh.md), written out by hand (process = device // 4)."""
    rows = [[0, 1, 4, 5], [8, 9, 12, 13], [10, 11, 14, 15], [2, 3, 6, 7]]
    ids = np.array(rows)
    return MeshLayout(ids // 4, ("data", "model"), ids)


# ---------------------------------------------------------------------------------- tables
def test_seed_example_exact():
    layout = seed_layout()
    assert process_mesh_mapping(layout, "data") == {0: 0, 1: 0, 2: 1, 3: 1}
    assert local_device_mapping(layout, "data", process_index=0) == {0: 0, 3: 1}
    assert local_device_mapping(layout, "data", process_index=1) == {0: 0, 3: 1}
    assert local_device_mapping(layout, "data", process_index=2) == {1: 0, 2: 1}
    plan = plan_batch(layout, P("data"), (16,), process_index=0)
    assert plan.rows.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert (plan.uid, plan.num_uids) == (0, 2)


def test_noncontiguous_builder_reproduces_seed():
    built = MeshLayout.noncontiguous({"data": 4, "model": 4}, num_processes=4)
    seed = seed_layout()
    np.testing.assert_array_equal(built.process_index, seed.process_index)
    np.testing.assert_array_equal(built.device_ids, seed.device_ids)


@pytest.mark.parametrize(
    ("layout", "batch_axes", "uids", "mapping_p1"),
    [
        # contiguous 2-D: each host one data row block, all uids distinct
        (
            MeshLayout.contiguous({"data": 4, "model": 2}, 4),
            "data",
            {0: 0, 1: 1, 2: 2, 3: 3},
            {1: 0},
        ),
        # contiguous, two data rows per host
        (MeshLayout.contiguous({"data": 4, "model": 2}, 2), "data", {0: 0, 1: 1}, {2: 0, 3: 1}),
        # hosts split along the model axis: both hosts hold every data row -> one uid
        (
            MeshLayout(np.array([[0, 1]] * 4), ("data", "model")),
            "data",
            {0: 0, 1: 0},
            {0: 0, 1: 1, 2: 2, 3: 3},
        ),
        # 1-D pure data parallel
        (MeshLayout.contiguous({"data": 8}, 4), "data", {0: 0, 1: 1, 2: 2, 3: 3}, {2: 0, 3: 1}),
        # 3-D replica x data x model, batch over (replica, data): DP = replica * 2 + data
        (
            MeshLayout.contiguous({"replica": 2, "data": 2, "model": 2}, 4),
            ("replica", "data"),
            {0: 0, 1: 1, 2: 2, 3: 3},
            {1: 0},
        ),
        # FSDP: batch over (data, fsdp); each host one fsdp pair
        (
            MeshLayout.contiguous({"data": 2, "fsdp": 2, "model": 2}, 2),
            ("data", "fsdp"),
            {0: 0, 1: 1},
            {2: 0, 3: 1},
        ),
        # order of batch axes matters: (fsdp, data) linearises fsdp-major
        (
            MeshLayout.contiguous({"data": 2, "fsdp": 2, "model": 2}, 2),
            ("fsdp", "data"),
            {0: 0, 1: 1},
            {1: 0, 3: 1},
        ),
    ],
)
def test_mapping_tables(layout, batch_axes, uids, mapping_p1):
    assert process_mesh_mapping(layout, batch_axes) == uids
    assert local_device_mapping(layout, batch_axes, process_index=1) == mapping_p1


def test_replicated_spec_every_host_reads_everything_with_one_uid():
    layout = MeshLayout.noncontiguous({"data": 4, "model": 4}, 4)
    pod = plan_pod(layout, P(), (16, 8))
    assert pod.uid_table() == {0: 0, 1: 0, 2: 0, 3: 0}
    for p in range(4):
        assert pod.plan(p).rows.tolist() == list(range(16))


def test_full_spec_splits_tp_groups():
    """FULL: batch over every axis, so each device of a TP group gets different rows."""
    layout = MeshLayout.contiguous({"data": 2, "model": 2}, 2)
    plan = plan_batch(layout, P(("data", "model")), (8,), process_index=1)
    assert [b[0] for b in plan.device_indices] == [slice(4, 6), slice(6, 8)]
    assert plan.rows.tolist() == [4, 5, 6, 7]


def test_sequence_sharded_column_ranges():
    layout = MeshLayout.noncontiguous({"data": 2, "context": 4}, num_processes=4)
    # tiles of 2 data rows x 1 context column: host p holds context column p of both data rows
    plan = plan_batch(layout, P("data", "context"), (4, 32), process_index=1)
    assert plan.rows.tolist() == [0, 1, 2, 3]
    # both data rows, context column 1: adjacent row blocks with the same columns, one read
    assert [(b.rows, b.columns) for b in plan.row_blocks] == [(slice(0, 4), (slice(8, 16),))]
    assert plan.num_elements == 4 * 8
    # two adjacent context columns on one host merge into one range
    wide = plan_batch(
        MeshLayout.contiguous({"data": 2, "context": 4}, 4), P("data", "context"), (4, 32), 0
    )
    assert [b.columns for b in wide.row_blocks] == [(slice(0, 16),)]


def test_device_ids_need_not_be_contiguous():
    ids = np.array([[2048, 2049], [0, 1]])
    layout = MeshLayout(ids // 2048, ("data", "model"), ids)
    assert process_mesh_mapping(layout, "data") == {0: 0, 1: 1}
    assert plan_batch(layout, P("data"), (4,), process_index=1).rows.tolist() == [0, 1]


# --------------------------------------------------------------- against JAX, hypothesis
AXIS_POOL = ("replica", "data", "fsdp", "model", "context")
FACTORISATIONS = sorted(
    {
        tuple(f)
        for n in (1, 2, 3)
        for f in itertools.product((1, 2, 4, 8), repeat=n)
        if np.prod(f) == 8
    }
)


def _normalise(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


@st.composite
def layouts_and_specs(draw):
    mesh_shape = draw(st.sampled_from(FACTORISATIONS))
    names = tuple(draw(st.permutations(AXIS_POOL))[: len(mesh_shape)])
    order = draw(st.permutations(range(8)))
    raw = draw(st.lists(st.integers(0, 7), min_size=8, max_size=8))
    procs = np.unique(raw, return_inverse=True)[1].reshape(mesh_shape)  # dense 0..P-1
    # each mesh axis shards one dimension of a 2-D or 3-D leaf, or nothing; order within a
    # dimension is drawn
    ndim = draw(st.integers(2, 3))
    dims = [draw(st.sampled_from((*range(ndim), None))) for _ in names]
    entries = []
    for dim in range(ndim):
        axes = [n for n, d in zip(names, dims, strict=True) if d == dim]
        axes = draw(st.permutations(axes)) if axes else []
        entries.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    sizes = dict(zip(names, mesh_shape, strict=True))
    shards = [
        int(np.prod([sizes[a] for a in ((e,) if isinstance(e, str) else e or ())])) for e in entries
    ]
    shape = tuple(s * draw(st.integers(1, 3)) for s in shards)
    return mesh_shape, names, order, procs, P(*entries), shape


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts_and_specs())
def test_plan_equals_union_of_jax_devices_indices_map(case):
    mesh_shape, names, order, procs, spec, shape = case
    mesh = mesh_of(names, mesh_shape, order)
    devices = mesh.devices
    jax_map = NamedSharding(mesh, spec).devices_indices_map(shape)
    layout = MeshLayout(procs, names)
    pod = plan_pod(layout, spec, shape)
    unions = {}
    for p in range(layout.num_processes):
        plan = pod.plan(p)
        positions = np.flatnonzero(procs.ravel() == p)
        expected = [_normalise(jax_map[devices.flat[i]], shape) for i in positions]
        assert [_normalise(b, shape) for b in plan.device_indices] == expected
        assert {_normalise(b, shape) for b in plan.blocks} == set(expected)
        rows = sorted({r for box in expected for r in range(*box[0])})
        assert plan.rows.tolist() == rows
        assert plan.num_elements == sum(np.prod([b - a for a, b in box]) for box in set(expected))
        assert _row_block_elements(plan.row_blocks, shape) == _elements(set(expected), shape)
        for above, below in itertools.pairwise(plan.row_blocks):  # merged only when they may
            assert above.rows.stop < below.rows.start or above.columns != below.columns
        unions[p] = frozenset(expected)
    # every element of the leaf is covered by some process
    covered = {box for u in unions.values() for box in u}
    assert covered == {_normalise(idx, shape) for idx in jax_map.values()}
    # equal U <=> equal uid, uids dense and numbered by first appearance
    uids = pod.uid_table()
    for p, q in itertools.combinations(unions, 2):
        assert (unions[p] == unions[q]) == (uids[p] == uids[q])
    first_seen = list(dict.fromkeys(uids.values()))
    assert first_seen == list(range(pod.num_uids))


def _elements(boxes, shape) -> set[tuple[int, int]]:
    """(row, column) pairs of boxes (column -1 for a 1-D leaf)."""
    columns = (lambda box: range(*box[1])) if len(shape) > 1 else (lambda box: [-1])
    return {(r, c) for box in boxes for r in range(*box[0]) for c in columns(box)}


def _row_block_elements(blocks, shape) -> set[tuple[int, int]]:
    out = set()
    for block in blocks:
        spans = (
            [(0, shape[1])] if block.columns is None else [(s.start, s.stop) for s in block.columns]
        )
        columns = [c for a, b in spans for c in range(a, b)] if len(shape) > 1 else [-1]
        out |= {(r, c) for r in range(block.rows.start, block.rows.stop) for c in columns}
    return out


def test_row_blocks_with_different_columns_stay_apart():
    """Hole 6: host 0 of [[0, 1], [1, 0]] holds rows 0:4 cols 0:4 and rows 4:8 cols 4:8: two
    reads, never one box rows 0:8 x cols 0:4; ``psdp plan`` prints the same blocks."""
    layout = MeshLayout(np.array([[0, 1], [1, 0]]), ("data", "context"))
    plan = plan_batch(layout, P("data", "context"), (8, 8), process_index=0)
    assert plan.row_blocks == (
        RowBlock(slice(0, 4), (slice(0, 4),)),
        RowBlock(slice(4, 8), (slice(4, 8),)),
    )
    summary = plan_summary(layout, "data", P("data", "context"), (8, 8))
    assert summary["processes"][0]["row_blocks"] == [
        {"rows": [0, 4], "columns": [[0, 4]]},
        {"rows": [4, 8], "columns": [[4, 8]]},
    ]
    same = MeshLayout(np.array([[0, 1], [0, 1]]), ("data", "context"))  # same columns: one read
    merged = plan_batch(same, P("data", "context"), (8, 8), process_index=1).row_blocks
    assert merged == (RowBlock(slice(0, 8), (slice(4, 8),)),)


def _naive_uid_table(procs: np.ndarray, keys: np.ndarray) -> dict[int, int]:
    held: dict[int, set[int]] = {}
    for p, k in zip(procs.ravel().tolist(), keys.tolist(), strict=True):
        held.setdefault(p, set()).add(k)
    seen: dict[frozenset[int], int] = {}
    return {p: seen.setdefault(frozenset(held[p]), len(seen)) for p in sorted(held)}


@settings(max_examples=60, deadline=None)
@given(
    data=st.integers(1, 6).map(lambda k: 2**k),
    model=st.integers(0, 4).map(lambda k: 2**k),
    per=st.integers(0, 3).map(lambda k: 2**k),
    seed=st.integers(0, 2**32 - 1),
)
def test_uid_table_matches_naive_reference_on_shuffled_pods(data, model, per, seed):
    total = data * model
    if total % per:
        return
    procs = np.random.default_rng(seed).permutation(np.arange(total) // per).reshape(data, model)
    layout = MeshLayout(procs, ("data", "model"))
    dp, count = dp_index(layout, "data")
    assert count == data
    assert process_mesh_mapping(layout, "data") == _naive_uid_table(procs, dp)
    for p in range(layout.num_processes):
        held = sorted(set(np.flatnonzero(procs == p) // model))
        assert local_device_mapping(layout, "data", p) == {d: i for i, d in enumerate(held)}


def test_build_mesh_fills_each_process_positions_in_device_order():
    """A process's devices, in the order given, fill its positions in row-major order."""
    devices = list(np.array(jax.devices())[list(SCRAMBLED)])
    mesh = MeshLayout(np.zeros((4, 2), int), ("data", "model")).build_mesh(devices)
    assert list(mesh.devices.flat) == devices
    assert mesh.axis_names == ("data", "model")


def test_live_mesh_is_accepted(mesh_2d):
    assert process_mesh_mapping(mesh_2d, "data") == {0: 0}
    assert local_device_mapping(mesh_2d, "data") == {0: 0, 1: 1, 2: 2, 3: 3}
    plan = plan_batch(mesh_2d, P("data"), (8, 3))
    assert plan.rows.tolist() == list(range(8))


def test_pod_scale_65536_devices():
    layout = MeshLayout.noncontiguous({"data": 256, "model": 256}, num_processes=16384)
    pod = plan_pod(layout, P("data"), (1024, 16))
    assert pod.num_uids == 128  # 2 data rows per host, 128 hosts per row pair
    plan = pod.plan(16383)
    assert plan.rows.size == 2 * 4


# ------------------------------------------------------------------------------- bad input
SEED = MeshLayout.noncontiguous({"data": 4, "model": 4}, 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: process_mesh_mapping(SEED, "dta"), "'dta' is not in the mesh; the mesh axes are"),
        (lambda: plan_batch(SEED, P("context"), (16,), 0), "'context' is not in the mesh"),
        (lambda: plan_batch(SEED, P("data"), (10,), 0), "size 10 is not divisible by its 4 shards"),
        (lambda: plan_batch(SEED, P("data"), (16,), 4), "process_index=4 is out of range"),
        (lambda: local_device_mapping(SEED, "data", -1), "process_index=-1 is out of range"),
        (lambda: plan_batch(SEED, P("data", "data"), (16, 4), 0), "appears twice"),
        (lambda: plan_batch(SEED, P("data", None, None), (16, 4), 0), "has 3 entries"),
        (lambda: plan_batch(SEED, P("data"), (0,), 0), "positive ints"),
        (lambda: plan_batch(SEED, P("data"), (True,), 0), "positive ints"),  # a bool is no size
        (lambda: process_mesh_mapping(SEED, ()), "non-empty sequence of axis names"),
        (lambda: process_mesh_mapping(SEED, ("data", "data")), "names an axis twice"),
        (lambda: MeshLayout(np.array([[-1, 0]]), ("a", "b")), "must be >= 0, got -1"),
        (lambda: MeshLayout(np.zeros((2, 2), int), ("a",)), "2 mesh dimensions"),
        (lambda: MeshLayout(np.zeros(2), ("a",)), "integer array"),
        (
            lambda: MeshLayout(np.array([[0, 0, 1]]), ("a", "b")).devices_per_process,
            "different numbers of devices",
        ),
        (
            lambda: MeshLayout.contiguous({"data": 4}, 3),
            "num_processes=3 must be a positive divisor",
        ),
        (lambda: MeshLayout.noncontiguous({"data": 3, "model": 2}, 3), "does not tile the mesh"),
    ],
)
def test_bad_input_names_the_values(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_not_a_mesh_is_a_type_error():
    with pytest.raises(TypeError, match="expected a jax.sharding.Mesh or a psdp.MeshLayout"):
        process_mesh_mapping("data=4", "data")


def test_string_spec_means_one_entry():
    plan = plan_batch(SEED, "data", (16,), process_index=2)
    assert plan.rows.tolist() == list(range(4, 12))


def test_adjacent_row_blocks_merge_into_one_read():
    plan = plan_batch(SEED, P("data"), (16,), process_index=2)  # DP1 and DP2: rows 4..11
    assert [b.rows for b in plan.row_blocks] == [slice(4, 12)]
    split = plan_batch(SEED, P("data"), (16,), process_index=0)  # DP0 and DP3: two reads
    assert [b.rows for b in split.row_blocks] == [slice(0, 4), slice(12, 16)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not a valid layout"),
        ('{"axis_names": ["a"]}', "is not a valid layout"),
        ('{"axis_names": ["a", "b"], "process_index": [[0, 1], [0]]}', "is not a valid layout"),
    ],
)
def test_bad_layout_files_name_the_file(tmp_path, text, message):
    path = tmp_path / "layout.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        MeshLayout.from_file(path)
    assert "layout.json" in str(info.value)  # every case names the file
    with pytest.raises(ValueError, match="cannot be read"):
        MeshLayout.from_file(tmp_path)  # a directory
    with pytest.raises(ValueError, match="does not exist"):
        MeshLayout.from_file(tmp_path / "missing.json")


def test_layout_file_round_trip_with_device_ids(tmp_path):
    path = tmp_path / "seed.json"
    seed = seed_layout()
    procs, ids = seed.process_index.tolist(), seed.device_ids.tolist()
    path.write_text(
        f'{{"axis_names": ["data", "model"], "process_index": {procs}, "device_ids": {ids}}}'
    )
    loaded = MeshLayout.from_file(path)
    np.testing.assert_array_equal(loaded.device_ids, seed.device_ids)
    assert process_mesh_mapping(loaded, "data") == {0: 0, 1: 0, 2: 1, 3: 1}


@pytest.mark.parametrize("bad", [True, 1.0, "0"])
def test_process_index_must_be_a_real_int(bad):
    with pytest.raises(ValueError, match="is out of range"):
        plan_batch(SEED, P("data"), (16,), process_index=bad)


def test_numpy_ints_are_fine():
    layout = MeshLayout.contiguous({"data": np.int64(4)}, np.int64(2))
    assert layout.num_processes == 2
    with pytest.raises(ValueError, match="positive ints"):
        MeshLayout.contiguous({"data": True}, 1)


@pytest.mark.parametrize(
    ("names", "procs", "message"),
    [
        ("dm", [[0, 0], [1, 1]], "sequence of non-empty strings, got 'dm'"),
        (("data", ""), [[0, 0], [1, 1]], "non-empty strings"),
        (("data", 3), [[0, 0], [1, 1]], "non-empty strings"),
        ((), 0, "at least one mesh axis"),
    ],
)
def test_layout_axis_names_are_checked(names, procs, message):
    with pytest.raises(ValueError, match=message):
        MeshLayout(np.array(procs), names)


# ------------------------------------------------------------------ a mesh over some processes
def test_a_mesh_over_some_processes_plans_as_its_renumbered_twin():
    """Processes 0, 2, 5, 7 of a job: every answer is the dense layout's, under the relabelling."""
    dense = seed_layout()
    real = np.array([0, 2, 5, 7])
    sparse = MeshLayout(real[dense.process_index], ("data", "model"), dense.device_ids)
    assert sparse.processes == (0, 2, 5, 7) and sparse.num_processes == 4
    np.testing.assert_array_equal(sparse.ranks, dense.process_index)
    assert process_mesh_mapping(sparse, "data") == {0: 0, 2: 0, 5: 1, 7: 1}
    for rank, p in enumerate(real.tolist()):
        assert local_device_mapping(sparse, "data", p) == local_device_mapping(dense, "data", rank)
        for spec, shape in [(P("data"), (16,)), (P("data", "model"), (16, 8))]:
            got, want = plan_batch(sparse, spec, shape, p), plan_batch(dense, spec, shape, rank)
            assert got.process_index == p and (got.uid, got.num_uids) == (want.uid, want.num_uids)
            assert got.blocks == want.blocks and got.row_blocks == want.row_blocks
    assert plan_pod(sparse, P("data"), (16,)).uid_table() == {0: 0, 2: 0, 5: 1, 7: 1}
    with pytest.raises(
        ValueError, match=r"process_index=1 is out of range: .* processes \[0, 2, 5, 7\]"
    ):
        plan_batch(sparse, P("data"), (16,), 1)
    assert sparse.devices_per_process == 4


def test_a_layout_file_over_some_processes(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text('{"axis_names": ["a"], "process_index": [0, 2]}')
    layout = MeshLayout.from_file(path)
    assert layout.processes == (0, 2)
    assert process_mesh_mapping(layout, "a") == {0: 0, 2: 1}
