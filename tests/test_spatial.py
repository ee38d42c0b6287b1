"""Domain parallelism on 8 fake devices: leaves split along any dimension, halos per dimension
(``pad`` or ``periodic``), uneven domains, every device's box against the numpy oracle of
tests/test_spatial_oracle.py, a ppermute halo exchange, and the bytes each host reads.

Hosts are simulated in one process (tests/fake_hosts.py), so a host holds only part of the
domain; the same checks on a real 4-process pod: tests/test_spatial_pod.py.
"""

from __future__ import annotations

import io
import math
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, LoaderConfig, MeshLayout, ShardingOptions
from psdp._plan.windows import AxisHalo
from psdp._runtime.assembly import domain_mask, halo_mask
from psdp.sources.stores.writer import write_dataset
from tests import oracle
from tests.batch_checks import assert_shards_exact, expected_batch, expected_step, physical_ids
from tests.fake_hosts import fake_pod, host_batch
from tests.meshes import SCRAMBLED, mesh_of
from tests.test_spatial_oracle import (
    Recording,
    RecordingStore,
    exchange,
    expected_leaf,
    needed_bytes,
    needed_cells,
    windowed,
)

SPEC_2D = P("data", None, "h", "w")  # (B, C, H, W) over data x h x w
SPEC_3D = P(None, "x", "y", "z")  # (B, X, Y, Z) over x x y x z, the batch on every device

# data=2 x h=2 x w=2 -> process: each host's two devices in different data rows and shards
NONCONTIGUOUS = [[[0, 1], [2, 3]], [[3, 2], [1, 0]]]
# host 0 holds (d0, h0, w0) and (d0, h0, w1): one grid, one read of both windows
ROW_OF_W = [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]
# host 0 holds (d0, h0, w0) and (d0, h1, w1): no grid; each window is its own read
DIAGONAL = [[[0, 1], [1, 0]], [[2, 3], [3, 2]]]


def mesh_2d():
    return mesh_of(("data", "h", "w"), (2, 2, 2), SCRAMBLED)


def mesh_3d():
    return mesh_of(("x", "y", "z"), (2, 2, 2), SCRAMBLED)


def field(rows: int, *shape: int, dtype=np.float32) -> np.ndarray:
    """Every entry distinct: a wrong entry is always visible."""
    return (np.arange(rows * math.prod(shape)).reshape(rows, *shape) + 1).astype(dtype)


def want_of(data, step, halos, **settings):
    """The oracle's delivered batch for a loader given ``settings`` and ``halo=options(halos)``:
    whole rows from tests/oracle.py, widened per dimension."""
    want = expected_step(data, step, **settings)
    mesh, pad_value = settings["mesh"], settings.get("pad_value", 0)
    return {
        k: v if k == "mask" else expected_leaf(v, mesh, want.specs[k], halos.get(k, {}), pad_value)
        for k, v in want.leaves.items()
    }


def check_host(batch, want, mesh, process_of, host) -> int:
    """Every device of ``host`` holds the oracle's values at the box JAX gives it."""
    count = 0
    for key, leaf in batch.items():
        assert leaf.shape == want[key].shape, (key, leaf.shape, want[key].shape)
        count += oracle.check_shards(
            leaf.shards, want[key], leaf.sharding.spec, mesh, f"host {host}", leaf=key,
            process_of=process_of,
        )  # fmt: skip
    assert count == len(batch) * sum(1 for p in process_of.values() if p == host)
    return count


def options(halos):
    return {k: {d: tuple(h) for d, h in v.items()} for k, v in halos.items()}


# ------------------------------------------------------------------------ every device's box
CASES_2D = [
    # (H, W, halos of the field)
    (8, 12, {2: (1, "periodic"), 3: (2, "periodic")}),
    (8, 12, {2: (2, "pad"), 3: (1, "periodic")}),
    (7, 10, {2: (1, "periodic"), 3: (2, "pad")}),  # uneven: 7 -> 8, 10 -> 10 (even), h then w
    (5, 9, {2: (3, "periodic"), 3: (5, "periodic")}),  # uneven both, halos a whole shard wide
    (6, 8, {}),  # no halos: the boxes alone
    (6, 8, {1: (1, "periodic")}),  # a halo on an unsharded dimension wraps its own ends
]


@pytest.mark.parametrize("layout", [NONCONTIGUOUS, ROW_OF_W, DIAGONAL, np.zeros((2, 2, 2), int)])
@pytest.mark.parametrize(("height", "width", "halos"), CASES_2D)
def test_2d_domain_every_device_exact_on_every_host(layout, height, width, halos):
    mesh = mesh_2d()
    data = {"field": field(13, 3, height, width), "label": np.arange(13, dtype=np.int32)}
    halo = {"field": halos}
    hosts = int(np.max(layout)) + 1
    with fake_pod(mesh, layout) as process_of:
        for host in range(hosts):
            settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": SPEC_2D},
                            pad_value=-1, seed=2)  # fmt: skip
            loader = DataLoader(data, halo=options(halo), process_index=host, **settings)
            for step in (0, 2):
                want = want_of(data, step, halo, **settings)
                check_host(host_batch(loader, step, process_of), want, mesh, process_of, host)


CASES_3D = [
    (4, 6, 8, {1: (1, "periodic"), 2: (2, "periodic"), 3: (1, "pad")}),
    (5, 6, 7, {1: (2, "periodic"), 2: (1, "pad"), 3: (3, "periodic")}),  # uneven X and Z
]


@pytest.mark.parametrize(("nx", "ny", "nz", "halos"), CASES_3D)
def test_3d_domain_every_device_exact_with_the_batch_replicated(nx, ny, nz, halos):
    """The batch dimension on every device (replicated), a 'full' leaf beside it, 3 hosts' worth
    of devices each holding a different corner of the cube."""
    mesh = mesh_3d()
    data = {"field": field(9, nx, ny, nz), "label": np.arange(9, dtype=np.int32)}
    halo = {"field": halos}
    layout = [[[0, 1], [2, 3]], [[1, 0], [3, 2]]]
    with fake_pod(mesh, layout) as process_of:
        for host in range(4):
            settings = dict(mesh=mesh, global_batch_size=5, pad_value=-2, seed=1,
                            batch_spec={"field": SPEC_3D, "label": "full"})  # fmt: skip
            loader = DataLoader(data, halo=options(halo), process_index=host, **settings)
            assert loader.plan.physical_batch_size == 8  # "full" splits 5 rows over 8 devices
            want = want_of(data, 1, halo, **settings)
            check_host(host_batch(loader, 1, process_of), want, mesh, process_of, host)


def test_every_batch_strategy_feeding_and_an_uneven_batch_beside_a_2d_domain():
    mesh = mesh_2d()
    data = {
        "field": field(11, 2, 6, 8),
        "tokens": field(11, 8, dtype=np.int32),
        "weight": np.arange(11, dtype=np.float32),
    }
    halo = {"field": {2: (1, "periodic"), 3: (1, "periodic")}}
    specs = [
        {"field": SPEC_2D, "tokens": "full", "weight": "replicated"},
        {"field": P(None, None, "h", "w"), "tokens": "replicated", "weight": "full"},
        {"field": P("data", None, "h", "w"), "tokens": P("data", ("h", "w"))},  # a sequence too
    ]
    with fake_pod(mesh, NONCONTIGUOUS) as process_of:
        for batch_spec in specs:
            for host in range(4):
                settings = dict(mesh=mesh, global_batch_size=3, batch_spec=batch_spec, seed=7)
                loader = DataLoader(data, halo=options(halo), process_index=host, **settings)
                want = want_of(data, 0, halo, **settings)
                check_host(host_batch(loader, 0, process_of), want, mesh, process_of, host)
        for host in range(4):  # only hosts 0 and 3 fed: the others' rows are padding
            settings = dict(
                mesh=mesh, global_batch_size=3, batch_spec={"field": SPEC_2D, "tokens": P("data")},
                feeding_processes=[0, 3], seed=3,
            )  # fmt: skip
            loader = DataLoader(data, halo=options(halo), process_index=host, **settings)
            want = expected_batch(data, 0, **settings)
            want["field"] = expected_leaf(want["field"], mesh, SPEC_2D, halo["field"], 0)
            check_host(host_batch(loader, 0, process_of), want, mesh, process_of, host)


def test_a_periodic_sequence_and_the_int_halo_side_by_side():
    """``halo={"tokens": 2}`` is dimension 1 with ``pad``, as it always was; a dict per dimension
    gives the same leaf a periodic halo."""
    mesh = mesh_of(("data", "context"), (4, 2), SCRAMBLED)
    data = {"tokens": field(16, 12, dtype=np.int32)}
    spec = {"tokens": P("data", "context")}
    for halo, boundary in ((2, "pad"), ({1: (2, "periodic")}, "periodic")):
        settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, pad_value=-1, seed=4)
        loader = DataLoader(data, halo={"tokens": halo}, **settings)
        assert loader.plan.halos == {"tokens": {1: AxisHalo(2, boundary)}}
        want = expected_leaf(expected_batch(data, 1, **settings)["tokens"], mesh, spec["tokens"],
                             {1: (2, boundary)}, -1)  # fmt: skip
        assert_shards_exact(loader.batch_at(1)["tokens"], want, leaf="tokens")


def test_a_source_without_read_window_gives_the_same_boxes():
    class ReadOnly:
        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data["field"])

        def read(self, ids):
            return {k: v[ids] for k, v in self.data.items()}

        def describe(self):
            return "ReadOnly"

    mesh = mesh_2d()
    data = {"field": field(9, 2, 7, 6)}
    halo = {"field": {2: (2, "periodic"), 3: (1, "pad")}}
    with fake_pod(mesh, NONCONTIGUOUS) as process_of:
        for host in range(4):
            settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": SPEC_2D})
            loader = DataLoader(ReadOnly(data), halo=options(halo), process_index=host, **settings)
            want = want_of(data, 1, halo, **settings)
            check_host(host_batch(loader, 1, process_of), want, mesh, process_of, host)


# ------------------------------------------------------------------------- a ppermute exchange
@pytest.mark.parametrize(
    ("mesh_fn", "spec", "shape", "halos"),
    [
        (mesh_2d, SPEC_2D, (2, 8, 12), {2: (1, "periodic"), 3: (3, "periodic")}),
        (mesh_2d, SPEC_2D, (2, 8, 12), {2: (4, "pad"), 3: (2, "periodic")}),
        (mesh_3d, SPEC_3D, (4, 6, 8), {1: (2, "periodic"), 2: (1, "pad"), 3: (4, "periodic")}),
    ],
)
def test_halos_equal_a_ppermute_halo_exchange(mesh_fn, spec, shape, halos):
    mesh = mesh_fn()
    data = {"field": field(10, *shape)}
    batch_spec = {"field": spec}
    loader = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec=batch_spec,
                        halo={"field": halos}, pad_value=-3, seed=5)  # fmt: skip
    plain = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec=batch_spec, seed=5)
    for step in range(2):
        got = loader.batch_at(step)["field"]
        assert got.sharding == NamedSharding(mesh, spec)
        want = exchange(plain.batch_at(step)["field"], mesh, spec, halos, -3)
        assert_shards_exact(got, np.asarray(want), leaf="field")


# ---------------------------------------------------------------------------------- the masks
def test_halo_and_domain_masks_per_dimension():
    mesh = mesh_2d()
    data = {"field": field(8, 1, 7, 10)}  # H = 7 over 2 shards: 4 each, the last one padding
    halos = {2: (1, "periodic"), 3: (2, "pad")}
    loader = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec={"field": SPEC_2D},
                        halo={"field": halos})  # fmt: skip
    leaf = loader.plan.leaves["field"]
    h_mask, w_mask = halo_mask(leaf, "field", 2), halo_mask(leaf, "field", 3)
    assert h_mask.sharding.spec == P("h") and w_mask.sharding.spec == P("w")
    assert np.asarray(h_mask).astype(int).tolist() == [1, 0, 0, 0, 0, 1] * 2
    assert np.asarray(w_mask).astype(int).tolist() == [1, 1, 0, 0, 0, 0, 0, 1, 1] * 2
    # position p of shard k is entry k * w - h + p: inside [0, n) or not
    h_domain = np.asarray(domain_mask(leaf, "field", 2)).astype(int).tolist()
    assert h_domain[:6] == [0, 1, 1, 1, 1, 1] and h_domain[6:] == [1, 1, 1, 1, 0, 0]  # -1..4, 3..8
    w_domain = np.asarray(domain_mask(leaf, "field", 3)).astype(int).tolist()
    assert w_domain[:9] == [0, 0, 1, 1, 1, 1, 1, 1, 1] and w_domain[9:] == [1] * 7 + [0, 0]
    with pytest.raises(ValueError, match=r"windowed in dimensions \[2, 3\]; name one, e.g. dim=3"):
        halo_mask(leaf, "field")
    with pytest.raises(ValueError, match=r"dimension 1 of leaf 'field' is not read in windows"):
        domain_mask(leaf, "field", 1)


def test_own_entries_of_the_uneven_last_shard_end_at_the_domain():
    """The valid entries of a device (domain and not halo) are exactly the domain, once."""
    mesh = mesh_of(("data", "context"), (4, 2), SCRAMBLED)
    data = {"tokens": field(8, 7, dtype=np.int32)}
    loader = DataLoader(data, mesh=mesh, global_batch_size=4, batch_spec={"tokens": P("data", "context")},
                        halo={"tokens": {1: (1, "periodic")}}, shuffle=False)  # fmt: skip
    leaf = loader.plan.leaves["tokens"]
    own = np.asarray(domain_mask(leaf, "tokens")) & ~np.asarray(halo_mask(leaf, "tokens"))
    row = np.asarray(loader.batch_at(0)["tokens"])[0]
    # 4 entries per shard: [wrap | 1 2 3 4 | 5] and [4 | 5 6 7 + the wrap (1), adjacent to the
    # domain's end | padding]
    assert row.tolist() == [7, 1, 2, 3, 4, 5, 4, 5, 6, 7, 1, 0]  # shard 1: 3 real + wrap + pad
    assert row[own].tolist() == [1, 2, 3, 4, 5, 6, 7]


# ------------------------------------------------------------------------ bytes at the source
def host_reads(loader, source, step, process_of):
    source.clear()
    host_batch(loader, step, process_of)
    return list(source.reads), source.bytes


@pytest.mark.parametrize("layout", [NONCONTIGUOUS, ROW_OF_W, DIAGONAL, np.zeros((2, 2, 2), int)])
@pytest.mark.parametrize(
    "halos",
    [{2: (1, "periodic"), 3: (2, "periodic")}, {2: (2, "pad"), 3: (1, "periodic")}, {}],
)
def test_bytes_read_per_host_are_the_union_of_its_boxes_and_halos(layout, halos):
    mesh = mesh_2d()
    shape = (13, 2, 8, 12)
    data = {"field": field(*shape)}
    with fake_pod(mesh, layout) as process_of:
        for host in range(int(np.max(layout)) + 1):
            source = Recording(data)
            settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": SPEC_2D}, seed=9)
            loader = DataLoader(source, halo={"field": halos}, process_index=host, **settings)
            devices = [d for d, p in process_of.items() if p == host]
            ids = physical_ids(data, 1, **settings)
            cells = needed_cells(ids, (len(ids), *shape[1:]), mesh, SPEC_2D, halos, devices)
            reads, got = host_reads(loader, source, 1, process_of)
            assert got == needed_bytes(cells, shape, [2, 3], 4), host
            if layout is DIAGONAL:
                # corners (h0, w0) and (h1, w1) of the same rows: their halos overlap, so the
                # union is 3 boxes (rows of h only in the first, in both, only in the second);
                # without halos they touch nowhere but at edges: 2 boxes
                assert len(reads) == (3 if halos else 2), host
            else:  # one read per box: the windows on the same rows form one grid
                assert len(reads) == row_sets(mesh, devices), host


# host 0 holds rows 0-1 of both column shards, rows 2-3 of shard 0 and rows 4-5 of shard 1: its
# two windows' rows overlap in part (2 processes x 4 devices, the defect report's case)
MIXED_ROWS = [[0, 0], [0, 1], [1, 0], [1, 1]]


@pytest.mark.parametrize("halo", [(1, "pad"), (2, "periodic"), (4, "periodic")])
def test_windows_whose_rows_overlap_in_part_read_each_entry_once(halo):
    mesh = mesh_of(("a0", "a1"), (4, 2), SCRAMBLED)
    spec, shape, halos = P("a0", None, "a1"), (12, 3, 8), {2: halo}
    data = {"field": field(*shape)}
    with fake_pod(mesh, MIXED_ROWS) as process_of:
        for host in range(2):
            source = Recording(data)
            settings = dict(mesh=mesh, global_batch_size=8, batch_spec={"field": spec}, seed=5)
            loader = DataLoader(source, halo={"field": halos}, process_index=host, **settings)
            devices = [d for d, p in process_of.items() if p == host]
            ids = physical_ids(data, 1, **settings)
            cells = needed_cells(ids, (len(ids), *shape[1:]), mesh, spec, halos, devices)
            source.clear()
            batch = host_batch(loader, 1, process_of)
            assert source.bytes == needed_bytes(cells, shape, [2], 4), host
            check_host(
                batch, want_of(data, 1, {"field": halos}, **settings), mesh, process_of, host
            )


def row_sets(mesh, devices) -> int:
    """How many distinct sets of data rows the devices' (h, w) shards are held on."""
    rows: dict[tuple[int, int], set[int]] = {}
    for device in devices:
        d, h, w = (int(i) for i in np.argwhere(mesh.devices == device)[0])
        rows.setdefault((h, w), set()).add(d)
    return len({frozenset(r) for r in rows.values()})


def test_bytes_read_from_tensorstore_per_host_and_one_read_per_box(tmp_path):
    mesh = mesh_2d()
    data = {"field": field(10, 2, 7, 12)}
    path = write_dataset(tmp_path / "ds", data, progress=False)
    halos = {2: (1, "periodic"), 3: (2, "periodic")}
    with fake_pod(mesh, NONCONTIGUOUS) as process_of:
        for host in range(4):
            source = RecordingStore(path)
            settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": SPEC_2D}, seed=3)
            loader = DataLoader(source, halo={"field": halos}, process_index=host, **settings)
            source.reads = source.bytes = 0
            batch = host_batch(loader, 1, process_of)
            check_host(
                batch, want_of(data, 1, {"field": halos}, **settings), mesh, process_of, host
            )
            devices = [d for d, p in process_of.items() if p == host]
            ids = physical_ids(data, 1, **settings)
            cells = needed_cells(ids, (len(ids), 2, 7, 12), mesh, SPEC_2D, halos, devices)
            assert source.bytes == needed_bytes(cells, (10, 2, 7, 12), [2, 3], 4)
            assert source.reads == 2  # the host's two boxes, one batched read each


# ---------------------------------------------------------------------------------- options
def test_the_halo_spelling_through_options_and_config():
    halo = {"tokens": 4, "field": {2: 1, 3: (2, "periodic")}}
    want = {"tokens": 4, "field": {2: AxisHalo(1, "pad"), 3: AxisHalo(2, "periodic")}}
    assert ShardingOptions(halo=halo).halo == want
    config = LoaderConfig.create(global_batch_size=8, halo=halo)
    raw = config.to_dict()
    assert raw["sharding"]["halo"] == {
        "tokens": 4,
        "field": {"2": [1, "pad"], "3": [2, "periodic"]},
    }
    assert LoaderConfig.from_dict(raw) == config  # JSON's string keys read back as dimensions


def test_the_halo_spelling_through_draccus_flags_and_yaml():
    draccus = pytest.importorskip("draccus")
    flags = ["--sharding.halo", "{tokens: 4, field: {2: 1, 3: [2, periodic]}}"]
    config = draccus.parse(LoaderConfig, args=flags)
    assert config.sharding.halo == {
        "tokens": 4, "field": {2: AxisHalo(1, "pad"), 3: AxisHalo(2, "periodic")}
    }  # fmt: skip
    yaml = "sharding:\n  halo:\n    field:\n      3: [1, periodic]\n"
    assert draccus.load(LoaderConfig, io.StringIO(yaml)).sharding.halo == {
        "field": {3: AxisHalo(1, "periodic")}
    }
    assert draccus.parse(LoaderConfig, args=["--sharding.halo", "4"]).sharding.halo == 4


def test_settings_keep_the_int_form_for_a_sequence_pad_halo():
    """Hosts agree on (and states record) an int for halos of the old kind, as before."""
    mesh = mesh_2d()
    data = {"field": field(8, 2, 8, 12), "tokens": field(8, 4, dtype=np.int32)}
    loader = DataLoader(data, mesh=mesh, global_batch_size=4,
                        batch_spec={"field": SPEC_2D, "tokens": P("data", "w")},
                        halo={"tokens": 1, "field": {3: (2, "periodic")}})  # fmt: skip
    assert loader.plan.settings()["halo"] == {"field": {"3": [2, "periodic"]}, "tokens": 1}
    assert windowed(mesh, SPEC_2D, 4, {}) == [2, 3]


def test_an_array_source_takes_its_halos_per_dimension():
    mesh = mesh_2d()
    rows = field(9, 2, 6, 8)
    halos = {2: (1, "pad"), 3: (2, "periodic")}
    settings = dict(mesh=mesh, global_batch_size=4, batch_spec=SPEC_2D, pad_value=-1, seed=1,
                    drop_last=True)  # fmt: skip
    loader = DataLoader(rows, halo=halos, **settings)
    assert loader.plan.halos == {None: {2: AxisHalo(1, "pad"), 3: AxisHalo(2, "periodic")}}
    want = expected_leaf(expected_batch(rows, 0, **settings), mesh, SPEC_2D, halos, -1)
    assert_shards_exact(loader.batch_at(0), want)
    config = LoaderConfig.create(global_batch_size=4, halo=halos)
    assert config.to_dict()["sharding"]["halo"] == {"2": [1, "pad"], "3": [2, "periodic"]}
    assert LoaderConfig.from_dict(config.to_dict()) == config
    draccus = pytest.importorskip("draccus")
    flags = ["--sharding.halo", "{2: 1, 3: [2, periodic]}"]
    assert draccus.parse(LoaderConfig, args=flags).sharding.halo == loader.options.sharding.halo


def test_the_docs_halo_cost_formula_gives_its_table_and_the_counted_reads():
    """docs/measurements/partitioning.md's formula for the share of a sample a one-device host reads with
    halos of ``h`` (read from the page and evaluated) gives the ratio column of its table, and
    the bytes the planner's reads count (scripts/measure/spatial_bytes.py) for the table's shape."""
    text = (Path(__file__).parents[1] / "docs" / "measurements" / "partitioning.md").read_text()
    formula = re.search(r"reads\s+`(\(360 \+ [^`]+)`\s+of each", text).group(1)

    def share(h: int) -> float:
        # the page's arithmetic as Python: "(a)(b)" is a product, "2h" is 2 * h
        return eval(formula.replace(")(", ")*(").replace("2h", "2*h"), {"h": h})

    rows = re.findall(r"^\| (one host per device|4 hosts, non-contiguous) \| (\S+) \|.*\| ([\d.]+) \|$",
                      text, re.M)  # fmt: skip
    assert len(rows) == 6
    script = runpy.run_path(
        str(Path(__file__).parents[1] / "scripts" / "measure" / "spatial_bytes.py")
    )
    shape = (16, 8, 720, 1440)
    layout = MeshLayout(script["LAYOUTS"]["one host per device"], ("data", "h", "w"))
    for name, halo, ratio in rows:
        halos = script["parse_halo"]("" if halo == "none" else halo)
        h = {a.width for a in halos.values()}.pop() if halos else 0
        assert f"{share(h):.3f}" == ratio, (name, halo)
        counted = script["host_bytes"](layout, shape, halos, 4, 0)
        whole = script["whole_sample_bytes"](layout, shape, 4, 0)
        assert counted / whole == pytest.approx(share(h), rel=1e-12), halo


def test_the_bytes_script_gives_what_the_source_counts():
    """scripts/measure/spatial_bytes.py plans on a layout alone; each host's figure is what its reads
    return at the source, on the same layout simulated in this process."""
    script = runpy.run_path(
        str(Path(__file__).parents[1] / "scripts" / "measure" / "spatial_bytes.py")
    )
    mesh = mesh_2d()
    shape = (8, 2, 7, 12)
    halos = script["parse_halo"]("2:2:pad,3:1:periodic")
    data = {"field": field(*shape)}
    layout = script["LAYOUTS"]["4 hosts, non-contiguous"]
    plan_layout = MeshLayout(layout, ("data", "h", "w"))
    with fake_pod(mesh, layout) as process_of:
        for host in range(4):
            source = Recording(data)
            loader = DataLoader(source, mesh=mesh, global_batch_size=8,
                                batch_spec={"field": SPEC_2D}, halo={"field": halos},
                                process_index=host)  # fmt: skip
            _, counted = host_reads(loader, source, 0, process_of)
            assert script["host_bytes"](plan_layout, shape, halos, 4, host) == counted
            whole = script["whole_sample_bytes"](plan_layout, shape, 4, host)
            assert whole == 8 * 2 * 7 * 12 * 4  # both data rows: all 8 samples, whole
