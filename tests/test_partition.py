"""Partition strategies on 8 fake devices: per-leaf specs, sequence windows with halos, logical
batches with a mask, NamedArray batches. Exact data on every device shard."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from psdp import ArraySource, DataLoader
from psdp._plan.order import PAD
from psdp._plan.windows import AxisHalo
from tests.batch_checks import (
    CountingSource,
    WindowSource,
    assert_batch_exact,
    assert_shards_exact,
    expected_batch,
    halo_exchange,
    physical_ids,
    token_table,
)
from tests.meshes import SCRAMBLED, mesh_of

RDM = (("replica", "data", "model"), (2, 2, 2))


# ------------------------------------------------------------------------------ strategies
@pytest.mark.parametrize("strategy", ["batch", "full", "replicated"])
def test_each_strategy_delivers_exact_rows(strategy):
    mesh = mesh_of(*RDM, SCRAMBLED)
    data = {"tokens": token_table(64, 4), "weight": np.arange(64, dtype=np.float32)}
    settings = dict(mesh=mesh, global_batch_size=16, batch_spec=strategy, seed=2)
    with DataLoader(data, **settings) as loader:
        for step, batch in zip(range(5), loader, strict=False):
            shards = assert_batch_exact(batch, expected_batch(data, step, **settings))
            assert shards == 24  # 8 devices x 3 leaves: tokens, weight and the mask
    spec = batch["tokens"].sharding.spec
    assert spec == {"batch": P(("replica", "data")), "full": P(("replica", "data", "model")),
                    "replicated": P()}[strategy]  # fmt: skip
    distinct = {str(s.index) for s in batch["tokens"].addressable_shards}
    assert len(distinct) == {"batch": 4, "full": 8, "replicated": 1}[strategy]


def test_full_gives_a_tensor_parallel_group_different_rows():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    loader = DataLoader({"x": token_table(32)}, mesh=mesh, global_batch_size=8,
                        batch_spec="full", shuffle=False)  # fmt: skip
    batch = loader.batch_at(0)["x"]
    by_device = {s.device: np.asarray(s.data) for s in batch.addressable_shards}
    for group in mesh.devices:  # the two devices of one data row (a model-parallel group)
        assert not np.array_equal(by_device[group[0]], by_device[group[1]])


def test_per_leaf_specs_and_one_read_for_whole_row_leaves():
    mesh = mesh_of(*RDM, SCRAMBLED)
    data = {"tokens": token_table(32, 4), "doc": np.arange(32, dtype=np.int32),
            "w": np.ones(32, np.float32)}  # fmt: skip
    source = CountingSource(data)
    specs = {"tokens": "full", "doc": "replicated"}  # "w" takes the default, "batch"
    settings = dict(mesh=mesh, global_batch_size=8, batch_spec=specs, seed=1)
    loader = DataLoader(source, **settings)
    assert loader.batch_spec == {
        "tokens": P(("replica", "data", "model")), "doc": P(), "w": P(("replica", "data"))
    }  # fmt: skip
    source.reads.clear()
    batch = loader.batch_at(3)
    assert_batch_exact(batch, expected_batch(data, 3, **settings))
    assert len(source.reads) == 1  # every whole-row leaf shares one read


def test_unknown_leaf_or_strategy_in_batch_spec():
    mesh = mesh_of(*RDM, SCRAMBLED)
    data = {"tokens": token_table(32)}
    with pytest.raises(ValueError, match=r"names leaves \['toks'\].*leaves are \['tokens'\]"):
        DataLoader(data, mesh=mesh, global_batch_size=8, batch_spec={"toks": "full"})
    with pytest.raises(ValueError, match=r"'fully'; use a jax.sharding.PartitionSpec or one of"):
        DataLoader(data, mesh=mesh, global_batch_size=8, batch_spec="fully")


# ------------------------------------------------------------------------- sequence windows
def seq_mesh() -> Mesh:
    return mesh_of(("data", "context"), (4, 2), SCRAMBLED)


def test_sequence_sharded_leaf_is_read_in_column_windows():
    data = {"tokens": token_table(32, 16), "w": np.arange(32, dtype=np.float32)}
    source = WindowSource(data)
    spec = {"tokens": P("data", "context")}
    settings = dict(mesh=seq_mesh(), global_batch_size=8, batch_spec=spec, seed=3)
    loader = DataLoader(source, **settings)
    source.windows.clear()
    batch = loader.batch_at(2)
    assert_batch_exact(batch, expected_batch(data, 2, **settings))
    # whole rows for "w"; the tokens' two column windows sit on the same rows here (one process
    # holds every device) and touch, so they merge into one read of their span. On a pod, a host
    # reads only its own windows (tests/test_partition_multiprocess.py).
    assert [c for _, c in source.windows] == [{"w": ()}, {"tokens": slice(0, 16)}]


class DocsWindowSource:
    """A source written from docs/guides/stores.md alone ("The protocol", "Column windows and boxes"):
    a box is a slice of dimension 1 or a tuple with a slice or an index array per dimension from
    1 on, the dimensions past it whole, read with outer indexing (np.ix_)."""

    def __init__(self, data):
        self.data = data
        self.boxes = []

    def __len__(self):
        return len(self.data["w"])

    def read(self, ids):
        return {key: leaf[ids] for key, leaf in self.data.items()}

    def read_window(self, ids, columns):
        self.boxes.append(dict(columns))
        out = {}
        for key, box in columns.items():
            leaf = self.data[key]
            parts = box if isinstance(box, tuple) else (box,)
            axes = [
                np.arange(leaf.shape[d])[part] if isinstance(part, slice) else np.asarray(part)
                for d, part in enumerate(parts, start=1)
            ]
            out[key] = leaf[np.ix_(ids, *axes)]
        return out

    def describe(self):
        return "DocsWindowSource"


def test_a_source_written_from_the_docs_reads_windows_beside_whole_row_leaves():
    """One leaf windowed, one read whole: the whole-row leaf comes through read_window as the
    empty box () (it came as None, which no doc named: np.ix_ raised 'Cross index must be 1
    dimensional'), and every shard is exact."""
    from psdp.sources import SupportsReadWindow

    data = {"tokens": token_table(24, 8), "w": np.arange(24, dtype=np.float32)}
    source = DocsWindowSource(data)
    assert isinstance(source, SupportsReadWindow)
    spec = {"tokens": P("data", "context"), "w": P("data")}
    settings = dict(mesh=seq_mesh(), global_batch_size=8, batch_spec=spec, seed=2)
    loader = DataLoader(source, **settings)
    for step in range(3):
        assert_batch_exact(loader.batch_at(step), expected_batch(data, step, **settings))
    assert {"w": ()} in source.boxes and {"tokens": slice(0, 8)} in source.boxes


@pytest.mark.parametrize(("h", "pad"), [(1, 0), (3, -7), (4, -1)])
def test_halo_equals_a_ppermute_halo_exchange(h, pad):
    """The oracle's halo rule is a ppermute exchange (tests/test_oracle.py); every shard is the
    oracle's, and a ppermute exchange of the oracle's plain batch, as placed by JAX, agrees."""
    mesh = seq_mesh()
    data = {"tokens": token_table(24, 8)}
    spec = {"tokens": P("data", "context")}
    settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, pad_value=pad, seed=5)
    haloed = DataLoader(data, halo=h, **settings)
    sharding = NamedSharding(mesh, P("data", "context"))
    for step in range(3):
        got = haloed.batch_at(step)["tokens"]
        assert got.shape == (8, 2 * (4 + 2 * h)) and got.sharding == sharding
        want = expected_batch(data, step, halo=h, **settings)["tokens"]
        assert_shards_exact(got, want, leaf="tokens")
        plain = jax.device_put(expected_batch(data, step, **settings)["tokens"], sharding)
        assert_shards_exact(got, np.asarray(halo_exchange(plain, mesh, h, pad)), leaf="tokens")
    mask = haloed.halo_mask("tokens")  # per device: h halo, 4 own, h halo columns
    assert mask.sharding.spec == P("context")
    assert np.asarray(mask).tolist() == ([True] * h + [False] * 4 + [True] * h) * 2


def test_a_whole_row_leaf_has_no_halo_mask():
    data = {"tokens": token_table(8, 8), "w": np.ones(8, np.float32)}
    loader = DataLoader(data, mesh=seq_mesh(), global_batch_size=8, halo=1,
                        batch_spec={"tokens": P("data", "context")})  # fmt: skip
    with pytest.raises(ValueError, match=r"^leaf 'w' is not read in windows; it has no"):
        loader.halo_mask("w")


def test_halo_inside_shard_map_sees_its_window_and_neighbours():
    mesh = seq_mesh()
    data = {"tokens": token_table(8, 8)}
    loader = DataLoader(data, mesh=mesh, global_batch_size=8, batch_spec={"tokens": P("data", "context")},
                        halo=2, pad_value=-1, shuffle=False)  # fmt: skip
    batch = loader.batch_at(0)["tokens"]

    @functools.partial(
        jax.shard_map, mesh=mesh, in_specs=P("data", "context"), out_specs=P("data", "context")
    )
    def shapes(block):
        return jnp.full(block.shape, block.shape[1])

    assert (np.asarray(shapes(batch)) == 4 + 2 * 2).all()  # S/C + 2h columns per device
    row0 = np.asarray(batch)[0]  # row 0 holds 0..7: windows [-,-,0,1,2,3,4,5] [2,3,4,5,6,7,-,-]
    assert row0.tolist() == [-1, -1, 0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 7, -1, -1]


def test_overlapping_halo_windows_are_read_once():
    data = {"tokens": token_table(16, 12)}
    source = WindowSource(data)
    mesh = mesh_of(("data", "context"), (2, 4), SCRAMBLED)
    loader = DataLoader(source, mesh=mesh, global_batch_size=4, batch_spec={"tokens": P("data", "context")},
                        halo=2, shuffle=False)  # fmt: skip
    assert [loader.leaf("tokens").box(i) for i in range(4)] == [
        (slice(0, 5),), (slice(1, 8),), (slice(4, 11),), (slice(7, 12),)
    ]  # fmt: skip
    source.windows.clear()
    batch = loader.batch_at(0)["tokens"]
    assert [c for _, c in source.windows] == [{"tokens": slice(0, 12)}]  # not 5 + 7 + 7 + 5
    assert np.asarray(batch)[1].tolist() == [  # row 1 = 1000..1011 in 4 windows of 3 + 2 halos
        0, 0, 1000, 1001, 1002, 1003, 1004,
        1001, 1002, 1003, 1004, 1005, 1006, 1007,
        1004, 1005, 1006, 1007, 1008, 1009, 1010,
        1007, 1008, 1009, 1010, 1011, 0, 0,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(halo=5), r"halo=5 is wider than one sequence shard: 8 columns over 2 shards is 4"),
        (dict(halo=-1), r"halo must be >= 0, got -1"),
        (dict(halo=1, batch_spec=None), r"halo=1 but no leaf is sharded along its sequence"),
        (dict(halo={"toks": 1}), r"halo names leaves \['toks'\]"),
    ],
)
def test_bad_halos(kwargs, message):
    args = dict(batch_spec={"tokens": P("data", "context")}) | kwargs
    with pytest.raises(ValueError, match=message):
        DataLoader({"tokens": token_table(16, 8)}, mesh=seq_mesh(), global_batch_size=8, **args)


# ------------------------------------------------------------------------- logical batches
@pytest.mark.parametrize("batch_size", [1, 3, 10])
@pytest.mark.parametrize("shuffle", [False, True])
def test_logical_batches_on_data_4(batch_size, shuffle):
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    n = 23
    data = {"x": token_table(n), "y": np.arange(n, dtype=np.float32) + 1}
    settings = dict(mesh=mesh, global_batch_size=batch_size, shuffle=shuffle, seed=4)
    loader = DataLoader(data, **settings)
    physical = -(-batch_size // 4) * 4
    assert loader.plan.physical_batch_size == physical and loader.plan.padded
    per_epoch = -(-n // batch_size)
    seen = []
    with loader:
        for step, batch in zip(range(2 * per_epoch), loader, strict=False):
            assert_batch_exact(batch, expected_batch(data, step, **settings))
            mask = np.asarray(batch["mask"])
            assert mask.shape == (physical,) and not mask[batch_size:].any()
            assert (np.asarray(batch["x"])[~mask] == 0).all()  # padding is zero
            assert (np.asarray(batch["y"])[~mask] == 0).all()
            seen.append(np.asarray(batch["x"])[mask, 0] // 1000)
    for epoch in range(2):  # real rows exactly once per epoch
        rows = np.concatenate(seen[epoch * per_epoch : (epoch + 1) * per_epoch])
        assert sorted(rows.tolist()) == list(range(n))


def test_padding_rows_are_never_read():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    source = CountingSource({"x": token_table(10)})
    settings = dict(mesh=mesh, global_batch_size=3, shuffle=False)
    loader = DataLoader(source, **settings)
    source.reads.clear()
    batch = loader.batch_at(3)  # the epoch's final batch: one real row, physical batch 4
    assert np.asarray(batch["mask"]).tolist() == [True, False, False, False]
    assert [r.tolist() for r in source.reads] == [[9]]
    assert (physical_ids({"x": token_table(10)}, 3, **settings) == [9, PAD, PAD, PAD]).all()


def test_custom_mask_key_and_pad_value():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    data = {"x": token_table(8)}
    loader = DataLoader(data, mesh=mesh, global_batch_size=6, mask_key="valid", pad_value=-1,
                        shuffle=False, drop_last=True)  # fmt: skip
    batch = loader.batch_at(0)
    assert np.asarray(batch["valid"]).tolist() == [True] * 6 + [False] * 2
    assert (np.asarray(batch["x"])[6:] == -1).all()
    with pytest.raises(ValueError, match="already has a leaf named 'x'; pass another mask_key"):
        DataLoader(data, mesh=mesh, global_batch_size=6, mask_key="x")


def test_an_all_true_mask_when_nothing_is_padded():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    loader = DataLoader({"x": token_table(32)}, mesh=mesh, global_batch_size=8)
    batch = loader.batch_at(0)
    assert not loader.plan.padded and set(batch) == {"x", "mask"}
    assert np.asarray(batch["mask"]).all()


# ------------------------------------------------------------------------------- NamedArray
def test_named_axes_give_named_arrays_with_the_mapped_shardings():
    haliax = pytest.importorskip("haliax", reason="haliax is optional: pip install 'psdp[haliax]'")
    mesh = mesh_of(("replica", "data", "context"), (2, 2, 2), SCRAMBLED)
    data = {"tokens": token_table(32, 8), "weight": np.arange(32, dtype=np.float32)}
    Batch, Pos = haliax.Axis("batch", 8), haliax.Axis("position", 8)
    loader = DataLoader(
        data,
        mesh=mesh,
        global_batch_size=8,
        named_axes={"tokens": (Batch, Pos), "weight": ("batch",)},
        axis_mapping={"batch": ("replica", "data"), "position": "context"},
        seed=1,
    )
    batch = loader.batch_at(0)
    assert isinstance(batch["tokens"], haliax.NamedArray)
    assert batch["tokens"].axes == (Batch, Pos)
    assert batch["tokens"].array.sharding.spec == P(("replica", "data"), "context")
    assert batch["weight"].array.sharding.spec == P(("replica", "data"))
    spec = {"tokens": P(("replica", "data"), "context"), "weight": P(("replica", "data"))}
    expected = expected_batch(data, 0, mesh=mesh, global_batch_size=8, batch_spec=spec, seed=1)
    assert_shards_exact(batch["tokens"].array, expected["tokens"], leaf="tokens")
    assert_shards_exact(batch["weight"].array, expected["weight"], leaf="weight")


def test_named_axes_errors():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    data = {"tokens": token_table(32)}
    with pytest.raises(ValueError, match="named_axes needs an axis_mapping"):
        DataLoader(data, mesh=mesh, global_batch_size=8, named_axes={"tokens": ("batch", "pos")})
    with pytest.raises(ValueError, match="maps 'batch' .* to mesh axis 'dp'"):
        DataLoader(data, mesh=mesh, global_batch_size=8, named_axes={"tokens": ("batch", "pos")},
                   axis_mapping={"batch": "dp"})  # fmt: skip


@pytest.mark.parametrize("kind", ["array", "memmap", "tensorstore"])
def test_real_sources_read_column_windows(kind, tmp_path):
    from psdp import MemmapSource, TensorStoreSource, write_dataset

    data = {"tokens": token_table(24, 8), "w": np.arange(24, dtype=np.float32)}
    if kind == "array":
        source = ArraySource(data)
    elif kind == "memmap":
        for key, value in data.items():
            np.save(tmp_path / f"{key}.npy", value)
        source = MemmapSource({k: tmp_path / f"{k}.npy" for k in data})
    else:
        source = TensorStoreSource(write_dataset(tmp_path / "ds", data, progress=False))
    assert hasattr(source, "read_window")
    window = source.read_window(np.array([5, 2]), {"tokens": slice(3, 6), "w": ()})
    assert window["tokens"].tolist() == [[5003, 5004, 5005], [2003, 2004, 2005]]
    assert window["w"].tolist() == [5.0, 2.0]
    spec = {"tokens": P("data", "context")}
    settings = dict(mesh=seq_mesh(), global_batch_size=8, batch_spec=spec, halo=1, pad_value=-1,
                    seed=2)  # fmt: skip
    loader = DataLoader(source, **settings)
    for step in range(4):
        want = expected_batch(data, step, **settings)
        assert_batch_exact(loader.batch_at(step), want)


def test_feeding_processes_on_one_process_is_the_plain_logical_batch():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    data = {"x": token_table(30)}
    settings = dict(mesh=mesh, global_batch_size=10, feeding_processes=[0], seed=1)
    fed = DataLoader(data, **settings)
    assert fed.plan.physical_batch_size == 12 and fed.plan.real_positions.tolist() == list(
        range(10)
    )
    assert_batch_exact(fed.batch_at(1), expected_batch(data, 1, **settings))
    with pytest.raises(ValueError, match=r"process_index=3 is out of range: this layout has 1"):
        DataLoader(data, mesh=mesh, global_batch_size=10, feeding_processes=[3])
    with pytest.raises(ValueError, match="feeding_processes needs every leaf's batch dimension"):
        DataLoader(data | {"y": np.arange(30, dtype=np.int32)}, mesh=mesh, global_batch_size=8,
                   feeding_processes=[0], batch_spec={"y": "replicated"})  # fmt: skip


@pytest.mark.parametrize("batched", [False, True])
def test_both_assembly_paths_deliver_the_same_exact_shards(batched, monkeypatch):
    import psdp._runtime.assembly

    monkeypatch.setattr(psdp._runtime.assembly, "BATCHED_PUT_MIN_BYTES", 0 if batched else 1 << 60)
    data = {"tokens": token_table(24, 8), "w": np.arange(24, dtype=np.float32)}
    spec = {"tokens": P("data", "context")}
    settings = dict(mesh=seq_mesh(), global_batch_size=6, batch_spec=spec, seed=4)
    loader = DataLoader(data, **settings)
    for step in range(5):
        assert_batch_exact(loader.batch_at(step), expected_batch(data, step, **settings))
    settings = dict(mesh=seq_mesh(), global_batch_size=8, batch_spec=spec, halo=2, seed=4)
    haloed = DataLoader(data, **settings)
    for step in range(3):
        want = expected_batch(data, step, **settings)
        assert_batch_exact(haloed.batch_at(step), want)


def test_a_leaf_sharded_beyond_dimension_1_reads_each_row_once():
    mesh = mesh_of(("data", "context", "model"), (2, 2, 2), SCRAMBLED)
    data = {"x": (np.arange(16 * 4 * 2) % 1000).reshape(16, 4, 2).astype(np.int32)}
    source = WindowSource(data)
    settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"x": P("data", "context", "model")},
                    shuffle=False, halo=1)  # fmt: skip
    loader = DataLoader(source, **settings)
    source.windows.clear()
    assert_batch_exact(loader.batch_at(0), expected_batch(data, 0, **settings))
    for ids, _ in source.windows:
        assert len(set(ids.tolist())) == len(ids)  # no row twice in one read


def test_named_axes_must_name_every_dimension():
    mesh = mesh_of(("data", "model"), (4, 2), SCRAMBLED)
    with pytest.raises(
        ValueError, match=r"gives leaf 'tokens' 1 axis names \['batch'\], but it has 2"
    ):
        DataLoader({"tokens": token_table(16)}, mesh=mesh, global_batch_size=8,
                   named_axes={"tokens": ("batch",)}, axis_mapping={"batch": "data"})  # fmt: skip


def test_batch_axes_in_the_order_given():
    """``batch_axes`` of two axes splits the batch over both, major to minor as given."""
    mesh = mesh_of(*RDM, SCRAMBLED)
    data = {"x": token_table(16)}
    for axes in (("replica", "data"), ("data", "replica")):
        settings = dict(mesh=mesh, global_batch_size=8, batch_axes=axes, seed=6)
        loader = DataLoader(data, **settings)
        assert loader.batch_spec == {"x": P(axes)}
        assert_batch_exact(loader.batch_at(1), expected_batch(data, 1, **settings))


def test_an_int_halo_widens_only_the_sequence_sharded_leaves():
    """halo=2 for every leaf sharded on dimension 1; a 2-D leaf with whole rows keeps them."""
    data = {
        "tokens": token_table(24, 8),
        "doc": token_table(24, 3),
        "w": np.arange(24, dtype=np.int32),
    }
    settings = dict(mesh=seq_mesh(), global_batch_size=8, halo=2, seed=3,
                    batch_spec={"tokens": P("data", "context")})  # fmt: skip
    loader = DataLoader(data, **settings)
    assert [loader.leaf(k).halos for k in data] == [(AxisHalo(2, "pad"),), (), ()]
    assert_batch_exact(loader.batch_at(2), expected_batch(data, 2, **settings))


def test_batch_axes_may_be_one_name_and_bad_knobs_are_clear_errors():
    mesh = mesh_of(("rows", "model"), (4, 2), SCRAMBLED)
    data = {"x": token_table(16)}
    settings = dict(mesh=mesh, global_batch_size=8, batch_axes="rows", shuffle=False)
    loader = DataLoader(data, **settings)
    assert loader.batch_spec == {"x": P("rows")}
    assert_batch_exact(loader.batch_at(0), expected_batch(data, 0, **settings))
    with pytest.raises(
        TypeError, match=r"read_timeout_s must be > 0 or None \(a number of seconds.*'x'"
    ):
        DataLoader(data, mesh=mesh, global_batch_size=8, batch_axes="rows", read_timeout_s="x")
    with pytest.raises(TypeError, match=r"pad_value must be a number .* got 'a'"):
        DataLoader(data, mesh=mesh, global_batch_size=6, batch_axes="rows", pad_value="a")
