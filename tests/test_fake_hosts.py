"""Every host of a pod, simulated in one process: the whole loader for hosts that do not hold
every row, against the independent oracle (tests/oracle.py).

A bug that needs a host holding only part of the batch (a whole-row leaf picking its rows out of
a shared read, a column offset, two column windows of one host) is invisible when one process
holds every device. `fake_hosts` gives psdp any device -> process layout of this process's 8
devices, so each host of that layout is planned, read and cut by the real loader; its devices'
boxes and its reads are compared with the oracle (tests/matrix.py). The same cases run on real
multi-process pods in tests/test_pod_matrix.py.
"""

from __future__ import annotations

import math
from unittest import mock

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from psdp._runtime.assembly import LeafAssembler
from tests import oracle
from tests.fake_hosts import fake_pod, host_batch, recorder
from tests.matrix import SOURCES, Case, check_case, spec_of
from tests.meshes import SCRAMBLED, mesh_of
from tests.pod_cases import ALTERNATE_COLUMNS, PODS, SEED_LIKE, TWISTED_3D


def check_every_host(case: Case, mesh: Mesh, layout) -> int:
    """`check_case` for every host of ``layout``; returns the device shards checked."""
    hosts = int(np.max(layout)) + 1
    with fake_pod(mesh, layout) as process_of:

        def simulated(loader, step):
            batch = host_batch(loader, step, process_of)
            return {k: (v.sharding.spec, v.shards) for k, v in batch.items()}

        return sum(check_case(case, mesh, p, process_of, simulated) for p in range(hosts))


# ------------------------------------------------------------------------------------ holes
@pytest.mark.parametrize(
    "specs",
    [
        {"tokens": "full", "weight": "batch"},
        {"tokens": "replicated", "weight": "batch", "doc": "full"},
        {"tokens": "batch", "weight": ["model"], "doc": "replicated"},
    ],
)
def test_whole_row_leaves_with_different_strategies_pick_their_rows_on_every_host(specs):
    """Hole 1: leaves of different strategies share one read; each picks its own rows from it."""
    leaves = {"tokens": [3], "weight": [], "doc": [2]}
    case = Case({k: leaves[k] for k in specs}, specs, batch_size=10, num_rows=37, seed=4,
                float_leaves=["weight"], steps=[0, 3, 4])  # fmt: skip
    assert check_every_host(case, mesh_of(("data", "model"), (4, 2), SCRAMBLED), SEED_LIKE) > 0


@pytest.mark.parametrize("source", ["window", "read"])
def test_leaves_sharded_beyond_dimension_one_get_their_boxes(source):
    """Hole 2: dimensions >= 2 of a device's box are cut at their offsets, on one host and four."""
    mesh = mesh_of(("data", "context", "model"), (2, 2, 2), SCRAMBLED)
    case = Case(
        leaves={"x3": [3, 4], "x4": [4, 2, 6], "seq": [4, 2], "w": []},
        specs={
            "x3": ["data", None, "model"],
            "x4": ["data", "context", None, "model"],
            "seq": ["data", "context", "model"],
            "w": "batch",
        },
        batch_size=6, num_rows=21, source=source, halo={"seq": 1}, steps=[0, 3],
    )  # fmt: skip
    assert check_every_host(case, mesh, np.zeros((2, 2, 2), int)) == 2 * 5 * 8
    check_every_host(case, mesh, TWISTED_3D)


@pytest.mark.parametrize("source", ["read", "getitem", "grain"])
@pytest.mark.parametrize("halo", [0, 1])
def test_sources_without_read_window_give_each_host_its_columns(source, halo):
    """Hole 3: a host holding only column shard 1 cuts it from whole rows at its offset."""
    case = Case({"tokens": [8], "w": []}, {"tokens": ["data", "context"]}, batch_size=8,
                num_rows=20, source=source, halo={"tokens": halo})  # fmt: skip
    check_every_host(case, mesh_of(("data", "context"), (4, 2), SCRAMBLED), [[0, 1]] * 4)


@pytest.mark.parametrize("halo", [0, 1, 2, 3])
@pytest.mark.parametrize("source", ["window", "read"])
def test_a_host_holding_two_non_adjacent_column_shards(halo, source):
    """Hole 4: two column windows of one host on the same rows; with halo 2 they touch, 3 overlap."""
    case = Case({"tokens": [16], "w": [2]}, {"tokens": ["data", "context"]}, batch_size=4,
                num_rows=11, source=source, halo={"tokens": halo}, steps=[0, 2])  # fmt: skip
    check_every_host(case, mesh_of(("data", "context"), (2, 4), SCRAMBLED), ALTERNATE_COLUMNS)


def test_physical_batch_is_a_multiple_of_every_leafs_shards():
    """Hole 8: shard counts 2 and 3 (six devices): batch 7 -> lcm 6 -> 12 rows, not 9."""
    mesh = mesh_of(("data", "model"), (2, 3), SCRAMBLED)
    case = Case({"a": [2], "b": []}, {"a": ["data"], "b": ["model"]}, batch_size=7, num_rows=30)
    assert oracle.physical_size(7, mesh, [P("data"), P("model")]) == 12
    assert check_every_host(case, mesh, [[0, 0, 1], [1, 0, 1]]) == 3 * 6 * 2


def test_halos_at_both_sequence_edges_and_feeding_on_a_3d_mesh_with_two_batch_axes():
    mesh = mesh_of(("replica", "data", "context"), (2, 2, 2), SCRAMBLED)
    for feeding in (None, [1], [0, 3]):
        case = Case({"tokens": [8, 2], "w": []},
                    {"tokens": [["replica", "data"], "context"], "w": [["replica", "data"]]},
                    batch_size=6, num_rows=17, halo={"tokens": 2}, feeding=feeding, pad_value=-5,
                    steps=[0, 2])  # fmt: skip
        check_every_host(case, mesh, TWISTED_3D)


def test_a_host_holding_an_unfed_shard_before_a_fed_one_keeps_each_row_in_place():
    """Host 1 holds batch shards 0 and 2; with feeding_processes=[3] only shards 2 and 3 are fed,
    so host 1's read holds padding before real rows (each row must stay at its position)."""
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    for feeding in ([3], [2]):
        case = Case({"tokens": [2]}, {"tokens": ["data"]}, batch_size=3, num_rows=11,
                    feeding=feeding, steps=[0, 3])  # fmt: skip
        assert check_every_host(case, mesh, [[0, 1], [0, 2], [1, 3], [2, 3]]) == 4 * 8


def test_fill_cuts_each_window_from_a_hosts_own_rows():
    """`LeafAssembler.fill` with ``positions`` (how `filter_shard` feeds a host's own rows): host
    0 of [[0, 1], [1, 0], ...] holds column shard 0 of some rows and shard 1 of others, so each
    window is a different subset of the host's rows."""
    mesh = mesh_of(("data", "context"), (4, 2), SCRAMBLED)
    rows = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    with fake_pod(mesh, [[0, 1], [1, 0], [0, 1], [1, 0]]) as process_of:
        for halo in (0, 1):
            leaf = LeafAssembler.create(mesh, P("data", "context"), (8, 6), np.int32, 0, halo)
            mine = leaf.plan.rows  # the host's rows, ascending: what filter_shard is given
            windows = leaf.fill(rows[mine], pad_value=-1, positions=mine)
            assert [w.shape[0] for w in windows] == [4, 4]  # not every row of the host
            want = oracle.haloed(rows, 2, halo, -1)
            with mock.patch.object(jax, "make_array_from_callback", recorder(process_of, 0)):
                got = leaf.assemble(windows)
            oracle.check_shards(
                got.shards, want, P("data", "context"), mesh, f"halo {halo}", process_of=process_of
            )
            assert len(got.shards) == 4


# ------------------------------------------------------------------------------- property
MESHES = [(8,), (4, 2), (2, 4), (2, 2, 2), (1, 8), (2, 1, 4)]
NAMES = ("data", "model", "context", "replica")


@st.composite
def pods(draw):
    """A mesh of the 8 devices in a random order, and a random balanced device->process layout."""
    shape = draw(st.sampled_from(MESHES))
    names = draw(st.permutations(NAMES))[: len(shape)]
    order = draw(st.permutations(range(8)))
    hosts = draw(st.sampled_from([1, 2, 4, 4, 8]))
    layout = np.array(draw(st.permutations(np.repeat(np.arange(hosts), 8 // hosts).tolist())))
    return mesh_of(names, shape, [SCRAMBLED[i] for i in order]), layout.reshape(shape)


def _spec(draw, mesh, ndim, batch_axes):
    """One leaf's spec: ``batch_axes`` on dimension 0, each other axis on a random dimension."""
    free = [a for a in mesh.axis_names if a not in batch_axes]
    dims = [-1, *range(1, ndim), *range(1, min(ndim, 2))]  # dimension 1 (sequence) twice as likely
    where = draw(st.lists(st.sampled_from(dims), min_size=len(free), max_size=len(free)))
    entries = [list(batch_axes)] + [[] for _ in range(ndim - 1)]
    for axis, dim in zip(free, where, strict=True):
        if dim >= 1:
            entries[dim].append(axis)
    return [e if e else None for e in entries]


@st.composite
def cases(draw, mesh, hosts):
    """Random leaves (1-D to 4-D), specs (strategies too), halos, batches, feeding and source."""
    feeding = None
    if hosts > 1 and draw(st.booleans()):
        feeding = sorted(draw(st.sets(st.integers(0, hosts - 1), min_size=1, max_size=hosts)))
    shared = None
    if feeding is not None:  # feeding needs one batch split for every leaf
        shared = draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    leaves, specs, halo = {}, {}, {}
    for key in ("a", "b", "c")[: draw(st.integers(1, 3))]:
        ndim = draw(st.integers(1, 4))
        strategy = draw(st.sampled_from(["spec", "spec", "batch", "full", "replicated"]))
        if (
            shared is None
            and strategy != "spec"
            and (strategy != "batch" or set(mesh.axis_names) & set(oracle.BATCH_AXES))
        ):
            specs[key] = strategy
            spec = oracle.resolve(strategy, mesh)
        else:
            axes = (
                shared
                if shared is not None
                else draw(st.lists(st.sampled_from(mesh.axis_names), unique=True, max_size=2))
            )
            specs[key] = _spec(draw, mesh, ndim, axes)
            spec = oracle.resolve(spec_of(specs[key]), mesh)
        trailing = []
        for dim in range(1, ndim):
            shards = oracle.shard_count(mesh, spec[dim] if dim < len(spec) else None)
            trailing.append(shards * draw(st.integers(1, 3 if dim == 1 else 2)))
        leaves[key] = trailing
        if ndim >= 2 and oracle.shard_count(mesh, spec[1] if len(spec) > 1 else None) > 1:
            halo[key] = draw(st.integers(0, trailing[0] // oracle.shard_count(mesh, spec[1])))
    batch_size = draw(st.integers(1, 20))
    drop_last = draw(st.booleans())
    num_rows = draw(st.integers(batch_size if drop_last else 1, 50))
    return Case(
        leaves, specs, batch_size, num_rows,
        source=draw(st.sampled_from(SOURCES)),
        halo=halo, feeding=feeding,
        seed=draw(st.integers(0, 2**32)), shuffle=draw(st.booleans()), drop_last=drop_last,
        pad_value=draw(st.sampled_from([-1, 0, 9])),
        steps=[draw(st.integers(0, 3 * math.ceil(num_rows / batch_size)))],
        float_leaves=draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True)),
    )  # fmt: skip


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_every_simulated_host_gets_exactly_its_boxes_and_reads_exactly_them(data):
    mesh, layout = data.draw(pods())
    case = data.draw(cases(mesh, int(layout.max()) + 1))
    check_every_host(case, mesh, layout)


@pytest.mark.parametrize("pod", list(PODS))
def test_the_pod_matrix_on_simulated_hosts(pod):
    """tests/test_pod_matrix.py's cases, on the same layouts, every host in this process."""
    layout, names, shape, _, cases = PODS[pod]
    mesh = mesh_of(names, shape, SCRAMBLED)
    for case in cases:
        check_every_host(case, mesh, layout)
