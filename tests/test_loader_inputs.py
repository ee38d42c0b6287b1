"""What the loader makes of what a source returns: owned buffers, dtypes, lists, the mask leaf.

Every batch is checked shard by shard against a numpy oracle computed here from the unshuffled
order (step ``s`` of an epoch of ``K`` steps holds rows ``(s % K)*B + i``), never from ids the
loader computed.
"""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp import (
    ArraySource,
    DataLoader,
    GrainSource,
    MemmapSource,
    TensorStoreSource,
    plan_batch,
    write_dataset,
)
from psdp._compat import enable_x64  # jax.enable_x64, or jax.experimental's on older jax
from psdp.sources.base import reads_fresh_rows
from tests.batch_checks import assert_batch_exact, token_table

B = 8


def unshuffled(data, step: int, num_rows: int, mask: bool | None = None):
    """The oracle: rows ``(step % K)*B ..`` of ``data`` (a full batch: ``num_rows % B == 0``)."""
    steps_per_epoch = num_rows // B
    ids = (step % steps_per_epoch) * B + np.arange(B)
    if isinstance(data, dict):
        out = {k: v[ids] for k, v in data.items()}
        if mask is not None:
            out["mask"] = np.full(B, mask)
        return out
    return data[ids]


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array whose memory starts on a 64-byte boundary (XLA may alias those)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


class RefillingSource:
    """Legal under the `Source` protocol: every read returns a view of one buffer it refills."""

    def __init__(self, data: np.ndarray | dict[str, np.ndarray]):
        self.data = data
        leaves = data if isinstance(data, dict) else {None: data}
        self.buffers = {k: aligned_empty((B, *v.shape[1:]), v.dtype) for k, v in leaves.items()}

    def __len__(self) -> int:
        leaves = self.data if isinstance(self.data, dict) else {None: self.data}
        return len(next(iter(leaves.values())))

    def describe(self) -> str:
        return "RefillingSource"

    def read(self, ids):
        leaves = self.data if isinstance(self.data, dict) else {None: self.data}
        out = {}
        for key, values in leaves.items():
            view = self.buffers[key][: len(ids)]
            np.take(values, ids, axis=0, out=view)
            out[key] = view
        return out[None] if None in out else out


# ------------------------------------------------------------------- owned buffers
@pytest.mark.parametrize(
    ("case", "steps", "width"),
    [
        ("array source", 60, 16),
        ("dict source", 60, 16),
        ("4 MiB rows: the batched device_put path", 6, 131072),
    ],
)
def test_a_source_that_refills_one_buffer_never_changes_delivered_batches(
    case, steps, width, mesh_2d
):
    rows = token_table(64, width=width)
    data = (
        {"tokens": rows, "weight": rows[:, 0].astype(np.float32)} if case == "dict source" else rows
    )
    loader = DataLoader(RefillingSource(data), mesh=mesh_2d, global_batch_size=B, shuffle=False)
    with loader:
        held = [batch for _, batch in zip(range(steps), loader, strict=False)]
    assert len(held) == steps
    for step, batch in enumerate(held):  # compared only after the run, when the buffer moved on
        assert_batch_exact(batch, unshuffled(data, step, 64, mask=True))


def _fresh_sources(tmp_path):
    rows = token_table(16, width=4)
    np.save(tmp_path / "rows.npy", rows)
    store = write_dataset(tmp_path / "ds", {"tokens": rows}, rows_per_shard=8, progress=False)
    records = [{"tokens": r} for r in rows]
    return rows, {
        "ArraySource": ArraySource({"tokens": rows}),
        "MemmapSource": MemmapSource({"tokens": tmp_path / "rows.npy"}),
        "TensorStoreSource": TensorStoreSource(store),
        "GrainSource": GrainSource(records, read_threads=1),
    }


def test_psdp_sources_return_new_arrays_on_every_read(tmp_path):
    """Why the loader does not copy their rows again: nothing else holds what they return."""
    rows, sources = _fresh_sources(tmp_path)
    ids = np.array([3, 1, 3])
    for name, source in sources.items():
        assert reads_fresh_rows(source), name  # so the loader does not copy again
        first = source.read(ids)["tokens"]
        first[...] = -7  # a trainer-side owner writing to its batch must not reach the source
        second = source.read(ids)["tokens"]
        np.testing.assert_array_equal(second, rows[ids], err_msg=name)
        assert not np.may_share_memory(first, second), name
        if hasattr(source, "read_window"):
            window = source.read_window(ids, {"tokens": slice(1, 3)})["tokens"]
            assert not np.may_share_memory(window, second), name
            np.testing.assert_array_equal(window, rows[ids, 1:3], err_msg=name)


# ------------------------------------------------------------- a stray StopIteration
class StopsAt:
    """A random-access source whose read (or read_window) lets a StopIteration escape at a step."""

    def __init__(self, data: dict[str, np.ndarray], from_step: int):
        self.rows = ArraySource(data)
        self.from_step = from_step

    def __len__(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        return "StopsAt(6)"

    def _maybe_stop(self, ids) -> None:
        if len(ids) > 1 and ids.min() >= self.from_step * B:
            next(iter([]))  # a stray next() on an exhausted iterator

    def read(self, ids):
        self._maybe_stop(ids)
        return self.rows.read(ids)

    def read_window(self, ids, columns):
        self._maybe_stop(ids)
        return self.rows.read_window(ids, columns)


@pytest.mark.parametrize("batch_spec", [None, {"tokens": P("data", "model")}])
@pytest.mark.parametrize("read_timeout_s", [None, 60.0])
def test_a_stray_stop_iteration_in_a_read_is_an_error_at_its_step(
    batch_spec, read_timeout_s, mesh_2d
):
    data = {"tokens": token_table(160, width=4)}
    source = StopsAt(data, from_step=6)
    delivered = []
    loader = DataLoader(
        source,
        mesh=mesh_2d,
        global_batch_size=B,
        shuffle=False,
        batch_spec=batch_spec,
        read_timeout_s=read_timeout_s,
    )
    with loader, pytest.raises(RuntimeError) as raised:
        for step, batch in zip(range(20), loader, strict=False):  # 20 steps asked for
            assert_batch_exact(batch, unshuffled(data, step, 160, mask=True))
            delivered.append(step)
    assert delivered == list(range(6))  # then the error, not a short loop that looks finished
    message = str(raised.value)
    assert "step 6" in message and "StopsAt(6)" in message and "StopIteration" in message
    assert isinstance(raised.value.__cause__, StopIteration)


def test_a_stop_iteration_in_the_first_read_is_an_error_at_construction(mesh_2d):
    source = StopsAt({"tokens": token_table(16)}, from_step=0)
    source._maybe_stop = lambda ids: next(iter([]))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="StopsAt.*StopIteration"):
        DataLoader(source, mesh=mesh_2d, global_batch_size=B)


# ------------------------------------------------------- 64-bit leaves and dtypes=
def test_a_declared_dtype_casts_every_read_and_the_loader_reports_it(mesh_2d):
    wide = token_table(32).astype(np.int64)
    data = {"tokens": wide, "weight": np.linspace(0, 1, 32)}  # int64 and float64
    dtypes = {"tokens": np.int32, "weight": "float32"}
    with DataLoader(
        data, mesh=mesh_2d, global_batch_size=B, shuffle=False, dtypes=dtypes
    ) as loader:
        assert loader.dtypes == {"tokens": np.dtype(np.int32), "weight": np.dtype(np.float32)}
        for step, batch in zip(range(5), loader, strict=False):
            want = unshuffled(data, step, 32, mask=True)
            want = {k: v.astype(np.float32 if k == "weight" else np.int32) for k, v in want.items()}
            want["mask"] = want["mask"].astype(bool)
            assert batch["tokens"].dtype == np.int32 and batch["weight"].dtype == np.float32
            assert_batch_exact(batch, want)


def test_a_value_that_does_not_fit_the_declared_dtype_stops_at_its_step(mesh_2d):
    wide = token_table(32).astype(np.int64)
    wide[27, 1] = 2**40 + 7  # step 3
    with DataLoader({"tokens": wide}, mesh=mesh_2d, global_batch_size=B, shuffle=False,
                    dtypes={"tokens": np.int32}) as loader:  # fmt: skip
        delivered = []
        with pytest.raises(ValueError) as raised:
            for step, batch in zip(range(6), loader, strict=False):
                assert_batch_exact(batch, unshuffled({"tokens": wide.astype(np.int32)}, step, 32,
                                                     mask=True))  # fmt: skip
                delivered.append(step)
    assert delivered == [0, 1, 2]
    message = str(raised.value)
    for fragment in ["step 3", "leaf 'tokens'", "1099511627783", "row 27", "int32"]:
        assert fragment in message, message


def test_with_x64_enabled_64_bit_leaves_pass_through_unchanged_on_the_loader_threads(mesh_2d):
    data = {
        "i": token_table(32).astype(np.int64) + 2**40,
        "u": token_table(32).astype(np.uint64) + 2**63,
        "f": np.linspace(0, 1, 32) + 1e-12,
    }
    # jax.enable_x64 is a thread-local setting: the prefetch thread must deliver what the
    # constructor (on this thread) saw
    with enable_x64(True):
        with DataLoader(data, mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
            assert loader.dtypes == {k: v.dtype for k, v in data.items()}
            batches = [b for _, b in zip(range(4), loader, strict=False)]
        for step, batch in enumerate(batches):
            assert {k: v.dtype for k, v in batch.items() if k != "mask"} == loader.dtypes
            assert_batch_exact(batch, unshuffled(data, step, 32, mask=True))


# ---------------------------------------------------------- byte order is converted
def test_a_big_endian_leaf_is_delivered_in_native_byte_order(mesh_2d):
    big = token_table(30).astype(">i4")  # 30 rows: a short, padded final batch too
    data = {"tokens": big}
    with DataLoader(data, mesh=mesh_2d, global_batch_size=B, shuffle=False, pad_value=-1) as loader:
        assert loader.dtypes == {"tokens": np.dtype(np.int32)}
        batches = [b for _, b in zip(range(4), loader, strict=False)]
    for step, batch in enumerate(batches):
        ids = step * B + np.arange(B)
        real = ids < 30
        want = np.full((B, 3), -1, np.int32)
        want[real] = big[ids[real]]
        assert batch["tokens"].dtype == np.int32
        assert_batch_exact(batch, {"tokens": want, "mask": real})


# ------------------------------------------------------------------- Python lists
def test_a_list_of_records_is_a_source(mesh_2d):
    rows = token_table(24)
    weights = np.arange(24, dtype=np.float32)
    records = [{"tokens": rows[i], "weight": weights[i]} for i in range(24)]
    data = {"tokens": rows, "weight": weights}
    with DataLoader(records, mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
        for step, batch in zip(range(4), loader, strict=False):
            assert_batch_exact(batch, unshuffled(data, step, 24, mask=True))


def test_a_list_of_arrays_is_a_source(mesh_2d):
    rows = token_table(24)
    with DataLoader(list(rows), mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
        for step, batch in zip(range(4), loader, strict=False):
            assert_batch_exact(batch, unshuffled(rows, step, 24))


# ------------------------------------------------------------------------- the mask leaf
def test_dict_batches_carry_the_mask_even_when_nothing_is_padded(mesh_2d):
    data = {"tokens": token_table(32)}
    with DataLoader(data, mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
        assert not loader.plan.padded
        for step, batch in zip(range(5), loader, strict=False):
            assert set(batch) == {"tokens", "mask"}
            assert_batch_exact(batch, unshuffled(data, step, 32, mask=True))


def test_mask_key_none_leaves_the_mask_out_when_nothing_can_be_padded(mesh_2d):
    data = {"tokens": token_table(32)}
    loader = DataLoader(data, mesh=mesh_2d, global_batch_size=B, shuffle=False, mask_key=None)
    with loader:
        assert set(loader.batch_at(0)) == {"tokens"}
        assert_batch_exact(loader.batch_at(1), unshuffled(data, 1, 32))


# ------------------------------------------------------- what is not refused
def test_a_pad_value_is_only_checked_against_leaves_it_can_fill(mesh_2d):
    data = {"tokens": token_table(32).astype(np.uint16)}  # 32 rows, B=8 on 4 shards: no padding
    loader = DataLoader(data, mesh=mesh_2d, global_batch_size=B, pad_value=-1, shuffle=False)
    with loader:
        assert not loader.plan.padded
        assert_batch_exact(loader.batch_at(0), unshuffled(data, 0, 32, mask=True))


def test_an_indivisible_sequence_never_suggests_padding_the_batch(mesh_context):
    # the loader pads an uneven sequence (tests/test_spatial.py); a plan of a given global
    # shape refuses it, naming the sequence's own fix
    with pytest.raises(ValueError) as raised:
        plan_batch(mesh_context, P("data", "context"), (B, 7), process_index=0)
    message = str(raised.value)
    assert "pad the batch" not in message and "sequence length" in message
