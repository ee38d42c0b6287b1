"""Domain parallelism on a real 4-process pod (4 hosts x 2 fake CPU devices), one pod for every
case: 2-D domains on ``data=2 x h=2 x w=2`` and 3-D domains on ``x=2 x y=2 x z=2``, each host
holding two devices in different rows and different corners of the domain. Every host checks
every addressable shard against the numpy oracle (tests/test_spatial_oracle.py), counts the bytes
its reads return at the source (in memory and TensorStore) against the union of its devices'
boxes and halos, the wrap included, and a ppermute exchange across processes agrees. A second
pod, 2 hosts x 4 devices, holds windows whose rows overlap in part (each entry still read once).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, MeshLayout
from psdp.sources.stores.writer import write_dataset
from psdp.tools.pod import run_pod
from tests.batch_checks import assert_shards_exact, expected_batch, physical_ids
from tests.test_spatial_oracle import (
    Recording,
    RecordingStore,
    exchange,
    expected_leaf,
    needed_bytes,
    needed_cells,
    windowed,
)

pytestmark = pytest.mark.multiprocess

LAYOUT_2D = [[[0, 1], [2, 3]], [[3, 2], [1, 0]]]  # data=2 x h=2 x w=2
LAYOUT_3D = [[[0, 1], [2, 3]], [[1, 0], [3, 2]]]  # x=2 x y=2 x z=2

# (mesh, field shape after the batch, spec, halos, other leaves' specs, batch size)
CASES = [
    ("2d", [3, 8, 12], ["data", None, "h", "w"], {"2": [1, "periodic"], "3": [2, "periodic"]},
     {"label": "batch"}, 4),
    ("2d", [2, 7, 10], ["data", None, "h", "w"], {"2": [2, "pad"], "3": [1, "periodic"]},
     {"label": "full"}, 3),  # uneven H, an uneven batch: padding rows and the mask
    ("2d", [2, 5, 9], [None, None, "h", "w"], {"2": [3, "periodic"], "3": [5, "periodic"]},
     {"label": "replicated"}, 4),  # uneven both, the batch on every device
    ("2d", [2, 8, 12], [None, None, "h", "w"], {"2": [1, "periodic"], "3": [1, "pad"]},
     {"label": "batch"}, 4),  # each host's two corners on the same rows: no grid, 3 boxes
    ("2d", [6, 8], ["data", "h", "w"], {}, {"label": "batch"}, 4),  # boxes alone, no halo
    ("3d", [4, 6, 8], [None, "x", "y", "z"], {"1": [1, "periodic"], "2": [2, "periodic"],
     "3": [1, "pad"]}, {"label": "full"}, 5),
    ("3d", [5, 6, 7], [None, "x", "y", "z"], {"1": [2, "periodic"], "3": [3, "periodic"]},
     {"label": "replicated"}, 2),
]  # fmt: skip

MESHES = {"2d": (LAYOUT_2D, ("data", "h", "w")), "3d": (LAYOUT_3D, ("x", "y", "z"))}


def spatial_cases(cases, store):
    """Runs every case on this host; returns what it checked (shards, bytes, reads)."""
    me = jax.process_index()
    meshes = {
        name: MeshLayout(np.asarray(layout), names).build_mesh(jax.devices())
        for name, (layout, names) in MESHES.items()
    }
    out = []
    for mesh_name, shape, spec_entries, raw_halos, others, batch_size in cases:
        mesh = meshes[mesh_name]
        spec = P(*[tuple(e) if isinstance(e, list) else e for e in spec_entries])
        halos = {int(d): (w, b) for d, (w, b) in raw_halos.items()}
        data = {"field": field_of(17, shape), "label": np.arange(17, dtype=np.int32)}
        source = Recording(data)
        settings = dict(mesh=mesh, global_batch_size=batch_size,
                        batch_spec={"field": spec, **others}, pad_value=-1, seed=6)  # fmt: skip
        loader = DataLoader(source, halo={"field": halos}, **settings)
        mine = [d for d in mesh.devices.flat if d.process_index == me]
        shards, step_bytes = 0, []
        with loader:
            for step in (0, 1):
                source.clear()
                batch = loader.batch_at(step)
                want = expected_batch(data, step, **settings)
                want["field"] = expected_leaf(want["field"], mesh, spec, halos, -1)
                for key in want:
                    shards += assert_shards_exact(batch[key], want[key], leaf=key)
                ids = physical_ids(data, step, **settings)
                cells = needed_cells(ids, (len(ids), *shape), mesh, spec, halos, mine)
                dims = windowed(mesh, spec, 1 + len(shape), halos)
                union = needed_bytes(cells, (17, *shape), dims, 4)
                field_bytes = source.leaf_bytes.get("field", 0)
                assert field_bytes == union, (mesh_name, shape, step, field_bytes, union)
                step_bytes.append(field_bytes)
                # a global reduction over all hosts agrees with the oracle
                total = float(jax.jit(lambda x: x.sum())(batch["field"]))
                assert total == float(want["field"].astype(np.float64).sum())
        out.append({"shards": shards, "bytes": step_bytes})
    return {"process": me, "cases": out, "exchange": _exchange_check(meshes["2d"]),
            "store": _store_check(meshes["2d"], store)}  # fmt: skip


def field_of(rows, shape):
    size = rows * int(np.prod(shape))
    return (np.arange(size).reshape(rows, *shape) + 1).astype(np.float32)


def _exchange_check(mesh):
    """The periodic halos equal a ppermute exchange across the processes."""
    spec = P("data", None, "h", "w")
    halos = {2: (2, "periodic"), 3: (3, "pad")}
    data = {"field": field_of(9, [2, 8, 12])}
    haloed = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec={"field": spec},
                        halo={"field": halos}, pad_value=-3, seed=2)  # fmt: skip
    plain = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec={"field": spec}, seed=2)
    with haloed, plain:
        want = exchange(plain.batch_at(1)["field"], mesh, spec, halos, -3)
        got = haloed.batch_at(1)["field"]
        local = {s.device: np.asarray(s.data) for s in want.addressable_shards}
        return sum(
            int(np.array_equal(np.asarray(s.data), local[s.device])) for s in got.addressable_shards
        )


def _store_check(mesh, store):
    """A TensorStore dataset: exact shards, and one read per box of the bytes the boxes need."""
    spec = P("data", None, "h", "w")
    halos = {2: (1, "periodic"), 3: (2, "periodic")}
    with np.load(store["expected"]) as saved:
        data = {"field": saved["field"]}
    source = RecordingStore(store["path"])
    settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": spec}, seed=8)
    loader = DataLoader(source, halo={"field": halos}, **settings)
    me = jax.process_index()
    with loader:
        source.reads = source.bytes = 0
        batch = loader.batch_at(0)
        want = expected_leaf(expected_batch(data, 0, **settings)["field"], mesh, spec, halos)
        shards = assert_shards_exact(batch["field"], want, leaf="field")
        ids = physical_ids(data, 0, **settings)
        mine = [d for d in mesh.devices.flat if d.process_index == me]
        shape = data["field"].shape
        cells = needed_cells(ids, (len(ids), *shape[1:]), mesh, spec, halos, mine)
        assert source.bytes == needed_bytes(cells, shape, [2, 3], 4)
        return {"shards": shards, "reads": source.reads, "bytes": source.bytes}


@pytest.mark.timeout(360)  # its pod's time limit, plus a minute
def test_spatial_domains_on_a_four_host_pod(tmp_path):
    rows = field_of(12, [2, 7, 12])
    path = write_dataset(tmp_path / "field", {"field": rows}, progress=False)
    np.savez(tmp_path / "expected.npz", field=rows)
    store = {"path": str(path), "expected": str(tmp_path / "expected.npz")}
    results = run_pod(
        spatial_cases, num_processes=4, devices_per_process=2,
        args={"cases": CASES, "store": store}, timeout_s=300,
    )  # fmt: skip
    assert [r["process"] for r in results] == [0, 1, 2, 3]
    for r in results:
        for case, got in zip(CASES, r["cases"], strict=True):
            assert got["shards"] == 3 * 2 * 2, (
                r["process"],
                case,
            )  # 3 leaves (mask), 2 devices, 2 steps
        assert r["exchange"] == 2  # both local devices equal the exchange
        assert r["store"]["shards"] == 2 and r["store"]["reads"] == 2  # one read per box


# 2 hosts x 4 devices on a0=4 x a1=2: host 0 holds rows 0-1 of both column shards, rows 2-3 of
# shard 0 and rows 4-5 of shard 1, so its windows' rows overlap in part (the defect report's case)
MIXED_ROWS = [[0, 0], [0, 1], [1, 0], [1, 1]]


def mixed_rows_cases(cases):
    """Each case's shards against the oracle and its bytes at the source against the union of
    the host's windows, on the `MIXED_ROWS` pod."""
    me = jax.process_index()
    mesh = MeshLayout(np.asarray(MIXED_ROWS), ("a0", "a1")).build_mesh(jax.devices())
    spec, shape = P("a0", None, "a1"), (3, 8)
    mine = [d for d in mesh.devices.flat if d.process_index == me]
    out = []
    for width, boundary in cases:
        halos = {2: (width, boundary)}
        data = {"field": field_of(12, shape)}
        source = Recording(data)
        settings = dict(
            mesh=mesh, global_batch_size=8, batch_spec={"field": spec}, pad_value=-1, seed=5
        )
        with DataLoader(source, halo={"field": halos}, **settings) as loader:
            source.clear()
            batch = loader.batch_at(1)
            want = expected_leaf(
                expected_batch(data, 1, **settings)["field"], mesh, spec, halos, -1
            )
            shards = assert_shards_exact(batch["field"], want, leaf="field")
            ids = physical_ids(data, 1, **settings)
            cells = needed_cells(ids, (len(ids), *shape), mesh, spec, halos, mine)
            union = needed_bytes(cells, (12, *shape), [2], 4)
            out.append({"shards": shards, "bytes": source.bytes, "union": union})
    return {"process": me, "cases": out}


def test_windows_whose_rows_overlap_in_part_on_a_two_host_pod():
    cases = [(1, "pad"), (2, "periodic")]
    results = run_pod(mixed_rows_cases, num_processes=2, devices_per_process=4,
                      args={"cases": cases}, timeout_s=300)  # fmt: skip
    for r in results:
        for case, got in zip(cases, r["cases"], strict=True):
            assert got["shards"] == 4, (r["process"], case)  # its 4 devices, each exact
            assert got["bytes"] == got["union"], (r["process"], case)  # each entry read once
