"""TokenSequences: every device shard of every leaf against a numpy oracle that concatenates the
documents and splits them (tests/token_oracle.py), for the batch, full and context strategies
with halos; a context-sharded host reads only its token ranges."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from psdp import DataLoader
from psdp.sources import DocumentStore, TokenSequences
from tests import token_oracle
from tests.batch_checks import assert_batch_exact, expected_batch

S = 8  # seq_len
DOCS = token_oracle.documents(seed=3, count=30, mean=9)


def _check_steps(loader, rows, steps=(0, 1, 2), halo=None):
    for step in steps:
        want = expected_batch(loader, rows, step, halo=halo)
        assert assert_batch_exact(loader.batch_at(step), want) > 0


@pytest.mark.parametrize("eos_id", [None, 2])
@pytest.mark.parametrize("targets", [False, True])
@pytest.mark.parametrize("strategy", ["batch", "full"])
def test_every_shard_exact_batch_and_full(mesh_2d, strategy, targets, eos_id):
    source = TokenSequences(DocumentStore.from_documents(DOCS), S, targets=targets, eos_id=eos_id)
    rows = token_oracle.rows(DOCS, S, targets=targets, eos_id=eos_id)
    assert len(source) == len(rows["input_ids"])
    loader = DataLoader(source, mesh=mesh_2d, global_batch_size=8, batch_spec=strategy, seed=5)
    _check_steps(loader, rows)


@pytest.mark.parametrize("halo", [0, 2])
def test_every_shard_exact_context_sharded_with_a_pad_halo(mesh_context, halo):
    docs = [{"input_ids": d, "loss_mask": (d % 3 == 0).astype(np.uint8)} for d in DOCS]
    source = TokenSequences(DocumentStore.from_documents(docs), S, eos_id=1)
    rows = token_oracle.rows(docs, S, eos_id=1)
    spec = {k: P("data", "context") for k in rows}
    halos = {k: halo for k in rows} if halo else None
    loader = DataLoader(
        source, mesh=mesh_context, global_batch_size=8, batch_spec=spec, halo=halos or 0,
        seed=1, pad_value=7,
    )  # fmt: skip
    _check_steps(loader, rows, halo=halos)


@pytest.mark.parametrize(("targets", "halo"), [(False, 2), (True, 1), (False, 4)])
def test_a_continue_halo_holds_the_neighbouring_tokens(mesh_context, targets, halo):
    """Halo columns are the stream's tokens before and after each shard, the previous and next
    rows' included; ``pad_id`` only before token 0 and after the stream's end."""
    docs = [{"input_ids": d, "loss_mask": (d % 2).astype(np.uint8)} for d in DOCS]
    seq = 8 if not targets else 9  # an even width for 2 context shards
    source = TokenSequences(
        DocumentStore.from_documents(docs), seq, targets=targets, eos_id=1, pad_id=9
    )
    want_rows = token_oracle.continued_rows(
        docs, seq, shards=2, halo=halo, pad_id=9, targets=targets, eos_id=1
    )
    spec = {k: P("data", "context") for k in want_rows}
    halos = {k: {1: (halo, "continue")} for k in want_rows}
    for shuffle in (False, True):  # unshuffled: row 0 (before token 0) and the last row
        loader = DataLoader(
            source, mesh=mesh_context, global_batch_size=8, batch_spec=spec, halo=halos,
            seed=4, shuffle=shuffle, pad_value=7,
        )  # fmt: skip
        steps = range(-(-len(source) // 8)) if not shuffle else (0, 1)
        for step in steps:
            want = expected_batch(loader, want_rows, step)  # rows already in delivered layout
            assert assert_batch_exact(loader.batch_at(step), want) > 0


def test_a_continue_halo_needs_a_source_that_continues_rows(mesh_context):
    rows = np.arange(64, dtype=np.int32).reshape(8, 8)
    with pytest.raises(ValueError, match="does not continue its rows"):
        DataLoader(
            {"input_ids": rows}, mesh=mesh_context, global_batch_size=8,
            batch_spec=P("data", "context"), halo={"input_ids": {1: (1, "continue")}},
        )  # fmt: skip
