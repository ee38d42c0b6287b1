"""check_consistency on padded batches and NaN data (single process; the pod runs are in
tests/test_simulate.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp import ConsistencyError, DataLoader, DocumentStore, TokenSequences, check_consistency
from tests import token_oracle
from tests.batch_checks import expected_batch, physical_ids
from tests.meshes import SCRAMBLED, mesh_of
from tests.test_spatial_oracle import expected_leaf


def test_padding_boxes_may_repeat_but_real_ones_may_not(mesh_2d):
    source = {"tokens": np.arange(40, dtype=np.int32).reshape(10, 4) + 1}
    with DataLoader(source, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        it = iter(loader)
        next(it)
        batch = next(it)  # rows 8, 9 and six padding rows: boxes 1..3 are all padding
    assert np.asarray(batch["mask"]).tolist() == [True] * 2 + [False] * 6
    report = check_consistency(batch)
    assert report.devices == 8
    with pytest.raises(ConsistencyError, match="two different index boxes hold identical bytes"):
        check_consistency(batch, mask_key=None)  # without the mask, padding looks like a bug
    ones = {"tokens": np.ones((10, 4), np.int32)}
    with DataLoader(ones, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        repeated = next(iter(loader))  # real rows, all equal: still caught
    with pytest.raises(ConsistencyError, match="identical bytes"):
        check_consistency(repeated)


def test_nan_where_nan_is_expected_is_exact(mesh_2d):
    data = np.arange(32, dtype=np.float32).reshape(8, 4)
    data[0, 1] = np.nan
    with DataLoader({"x": data}, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        batch = next(iter(loader))
    assert check_consistency(batch, {"x": data, "mask": np.ones(8, bool)}).exact
    wrong = data.copy()
    wrong[5, 2] = -1
    with pytest.raises(
        ConsistencyError, match=r"at global index \(5, 2\) it holds np.float32\(22.0\)"
    ):
        check_consistency(batch, {"x": wrong})


# ------------------------------------------------------------------------------- halos
def _tampered(leaf: jax.Array, dim: int, shard: int, at: tuple[int, ...]):
    """``leaf`` with one entry changed on one device: the first whose box is shard ``shard``
    along ``dim``, at position ``at`` of its box. Returns (array, device, box, global index)."""
    index_map = leaf.sharding.addressable_devices_indices_map(leaf.shape)
    width = leaf.shape[dim] // (leaf.shape[dim] // leaf.sharding.shard_shape(leaf.shape)[dim])
    device = next(d for d, i in index_map.items() if (i[dim].start or 0) == shard * width)
    arrays = []
    for shard_ in leaf.addressable_shards:
        data = np.array(shard_.data)
        if shard_.device == device:
            data[at] += 100
        arrays.append(jax.device_put(data, shard_.device))
    wrong = jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, arrays)
    box = index_map[device]
    where = tuple((s.start or 0) + a for s, a in zip(box, at, strict=False))
    return wrong, device, box, where


def _box_text(box, shape) -> str:
    words = ["rows", "cols", *(f"dim{i}" for i in range(2, len(shape)))]
    return ", ".join(
        f"{w} {s.indices(n)[0]}:{s.indices(n)[1]}"
        for w, s, n in zip(words, box, shape, strict=True)
    )


def _no_halo(settings):
    """The settings without the halo, which does not change which rows a step holds."""
    return {k: v for k, v in settings.items() if k != "halo"}


def _field_loader():
    """A (16, 7, 10) field on data=2 x h=2 x w=2: 7 latitudes (pad, uneven: 8) by 10 longitudes
    (periodic), every entry distinct."""
    mesh = mesh_of(("data", "h", "w"), (2, 2, 2), SCRAMBLED)
    data = {"field": np.arange(16 * 7 * 10, dtype=np.int32).reshape(16, 7, 10) + 1}
    halo = {"field": {1: 1, 2: (2, "periodic")}}
    settings = dict(mesh=mesh, global_batch_size=4, batch_spec={"field": P("data", "h", "w")},
                    halo=halo, pad_value=-1, seed=2)  # fmt: skip
    loader = DataLoader(data, **settings)
    ids = physical_ids(data, 1, **_no_halo(settings))  # the oracle's halo: expected_leaf's
    want = expected_leaf(data["field"][ids], mesh, P("data", "h", "w"),
                         {1: (1, "pad"), 2: (2, "periodic")}, pad_value=-1)  # fmt: skip
    # device (h=0, w=0)'s window position (1, 0): latitude 0, longitude 8 (the wrap)
    return loader, ids, data, halo, -1, {"field": want}, ("field", 2, 0, (0, 1, 0))


def _tokens_loader(mesh_context):
    """A (B, 16) token leaf over context=2 with a pad halo of 2."""
    data = {"tokens": np.arange(64 * 16, dtype=np.int32).reshape(64, 16) + 1}
    settings = dict(mesh=mesh_context, global_batch_size=8, seed=3,
                    batch_spec={"tokens": P("data", "context")}, halo=2, pad_value=-1)  # fmt: skip
    loader = DataLoader(data, **settings)
    want = expected_batch(data, 1, **settings)
    ids = physical_ids(data, 1, **settings)
    # context shard 1's window position (0, 1): column 7, the halo from shard 0
    return loader, ids, data, 2, -1, want, ("tokens", 1, 1, (0, 1))


def _continue_loader(mesh_context):
    """TokenSequences with a continue halo: halo columns are the neighbouring rows' tokens."""
    docs = token_oracle.documents(seed=3, count=30, mean=9)
    source = TokenSequences(DocumentStore.from_documents(docs), 8, eos_id=1, pad_id=9)
    halo = {"input_ids": {1: (2, "continue")}}
    spec = {k: P("data", "context") for k in ("input_ids", "segment_ids", "positions")}
    settings = dict(mesh=mesh_context, global_batch_size=8, batch_spec=spec, halo=halo,
                    pad_value=7, seed=4)  # fmt: skip
    loader = DataLoader(source, **settings)
    rows = token_oracle.continued_rows(docs, 8, shards=2, halo=2, pad_id=9, eos_id=1)
    ids = physical_ids(rows["input_ids"], 1, **_no_halo(settings))
    want = {"input_ids": rows["input_ids"][ids]}
    # context shard 0's window position (0, 0): the previous row's token (or pad_id)
    return loader, ids, source, halo, 7, want, ("input_ids", 1, 0, (0, 0))


@pytest.mark.parametrize("case", ["pad", "periodic", "continue"])
def test_a_haloed_batch_is_checked_against_its_windows(mesh_context, case):
    """The delivered halo follows docs/concepts/partitioning.md's rule: a correct batch passes (and equals
    the numpy oracle), one wrong halo entry on one device fails naming that device's box."""
    make = {"pad": lambda: _tokens_loader(mesh_context), "periodic": _field_loader,
            "continue": lambda: _continue_loader(mesh_context)}[case]  # fmt: skip
    loader, ids, source, halo, pad_value, want, (key, dim, shard, at) = make()
    with loader:
        batch = loader.batch_at(1)
    for name, value in want.items():
        if name != "mask":
            np.testing.assert_array_equal(np.asarray(batch[name]), value)
    report = check_consistency(batch, source=source, ids=ids, halo=halo, pad_value=pad_value)
    assert report.devices == 8
    wrong, device, box, where = _tampered(batch[key], dim, shard, at)
    with pytest.raises(ConsistencyError) as info:
        check_consistency({**batch, key: wrong}, source=source, ids=ids, halo=halo,
                          pad_value=pad_value)  # fmt: skip
    message = str(info.value)
    assert (
        f"leaf {key!r}: device {device.id} (process 0) holds {_box_text(box, wrong.shape)}"
        in message
    )
    assert f"at global index {where} it holds" in message
