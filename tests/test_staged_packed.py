"""`StagedPacked` through the loader: three packed stages, 16 -> 8 -> 32 slots (the second
lowers seq_len and splits documents the first held whole), every device shard of every leaf
equal to tests/length_oracle.py's packed rows, also after a restore on another mesh and batch."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import DataLoader, StagedPacked
from psdp.sources.documents.store import DocumentStore
from tests.length_oracle import OraclePackedRun
from tests.test_staged_tokens import RAMP, assert_steps_are_the_oracles

EOS = 7
NAMES = ["web", "code"]
STAGES = [(0, 16, {"web": 1, "code": 1}), (64, 8, {"web": 3, "code": 1}),
          (128, 32, {"web": 1, "code": 3})]  # fmt: skip
SETTINGS = {"block_size": 8, "lanes": 4, "seed": 5, "long_documents": "split"}


def documents(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 15, size=30)
    first = 1000 * (seed + 1)
    return [first + 20 * i + np.arange(n, dtype=np.int32) % 20 for i, n in enumerate(lengths)]


def tables(rows: int, stages=STAGES, names=NAMES) -> list[dict[str, np.ndarray]]:
    """Each stage's packed rows as the loader must deliver them (the last stage's first
    ``rows``), laid out from the oracle's pieces: tokens then EOS, a segment and positions
    from 0 per piece, padding 0."""
    docs = [documents(NAMES.index(n)) for n in names]
    slots = [[len(d) + (len(d) > 0) for d in ds] for ds in docs]
    run = OraclePackedRun(names, slots, stages, **SETTINGS)
    starts = [start for start, _, _ in stages]
    out = []
    for (start, seq_len, _), stop in zip(stages, [*starts[1:], starts[-1] + rows], strict=True):
        leaves = ("input_ids", "segment_ids", "positions", "loss_mask")
        table = {k: np.zeros((stop - start, seq_len), np.int32) for k in leaves}
        for r, (source, pieces, _) in enumerate(run.rows(stop)[start:]):
            column = 0
            for segment, (doc, first, size) in enumerate(pieces, 1):
                values = np.append(docs[source][doc], EOS)[first : first + size]
                span = slice(column, column + size)
                table["input_ids"][r, span] = values
                table["segment_ids"][r, span] = segment
                table["positions"][r, span] = np.arange(size)
                table["loss_mask"][r, span] = 1
                column += size
        out.append(table)
    return out


def staged() -> StagedPacked:
    stores = {n: DocumentStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    return StagedPacked(stores, STAGES, eos_id=EOS, **SETTINGS)


def test_one_loader_over_three_packed_stages_is_the_oracles_on_every_device(mesh_2d):
    """Batches of 32, 8 then 4 (16 -> 8 -> 32 slots): each step reads its stage's packed rows,
    every shard of every leaf the oracle's, across both boundaries."""
    with DataLoader(staged(), mesh=mesh_2d, global_batch_size=RAMP) as loader:
        assert sorted(loader.plans) == [(b, k) for b in (4, 8, 32) for k in range(3)]
        assert_steps_are_the_oracles(loader, range(18), tables(32), STAGES, mesh=mesh_2d)


@pytest.mark.parametrize("saved_at", [5, 13])
def test_a_restore_inside_a_later_packed_stage_on_another_mesh_equals_the_oracle(
    mesh_2d, mesh_1d, saved_at
):
    """Saved inside stage 1 (step 5) and stage 2 (step 13) on the 4x2 mesh; restored on the
    8-way mesh with batches of 8 by a fresh source (no row read before): every later step is
    the uninterrupted run's."""
    with DataLoader(staged(), mesh=mesh_2d, global_batch_size=RAMP) as loader:
        it = loader.iter_from(saved_at - 1)
        next(it)
        state = it.state()
        it.close()
    offset = state["offset"]
    assert state["source"]["definition"]["kind"] == "psdp.packed-length-stages/1"
    with DataLoader.restore(state, staged(), mesh=mesh_1d, global_batch_size=8) as loader:
        steps = range(saved_at, saved_at + (192 - offset) // 8)
        assert_steps_are_the_oracles(loader, steps, tables(64), STAGES, mesh=mesh_1d)


def test_a_stage_that_lowers_seq_len_below_a_document_is_refused_unless_told():
    stores = {n: DocumentStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    settings = SETTINGS | {"long_documents": None}
    with pytest.raises(ValueError, match=r"stage 1's seq_len=8 is shorter than document \d+ of "
                       r"source 'web' \(\d+ tokens"):  # fmt: skip
        StagedPacked(stores, STAGES, eos_id=EOS, **settings)


def test_a_source_leaf_is_each_packed_rows_source():
    stores = {n: DocumentStore.from_documents(documents(i)) for i, n in enumerate(NAMES)}
    view = StagedPacked(stores, STAGES, eos_id=EOS, source_leaf="src", **SETTINGS)
    slots = [[len(d) + 1 for d in documents(i)] for i in range(len(NAMES))]
    sources = [s for s, *_ in OraclePackedRun(NAMES, slots, STAGES, **SETTINGS).rows(136)]
    assert view.leaves["src"] == np.int32
    assert view.stage(1).read(np.arange(8, 16))["src"].tolist() == sources[72:80]
    window = view.stage(2).read_window(np.arange(8), {"src": slice(None), "input_ids": slice(0, 4)})
    assert window["src"].tolist() == sources[128:136] and window["input_ids"].shape == (8, 4)
