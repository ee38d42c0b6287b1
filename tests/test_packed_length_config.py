"""Length stages on a packed view in `DataConfig`: ``view.packing: greedy`` with stages that set
``seq_len`` makes the train source a `StagedPacked`; every device shard is tests/length_oracle.py's
packed rows, also after a restore on another mesh and batch; the packed view's own bad input."""

from __future__ import annotations

import io

import draccus
import numpy as np
import pytest

from psdp import DataConfig
from psdp.sources.documents.writer import write_documents
from tests.test_staged_packed import EOS, documents, tables
from tests.test_staged_tokens import assert_steps_are_the_oracles

#: sorted as DataConfig lists them: code's documents are test_staged_packed's second store's
NAMES = ["code", "web"]
#: 8 -> 16 -> 32 slots: stage 0 splits the documents longer than 8 (with their EOS)
STAGES = [(0, 8, {"web": 1, "code": 1}), (64, 16, {"web": 3, "code": 1}),
          (128, 32, {"web": 1, "code": 3})]  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("packed_length_stores")
    docs = {"web": documents(0), "code": documents(1)}
    return {
        name: str(write_documents(root / name, [{"input_ids": d} for d in docs[name]],
                                  progress=False))
        for name in NAMES
    }  # fmt: skip


def config(stores, batch="[[0, 32], [2, 8], [10, 4]]", second=16, **extra) -> DataConfig:
    text = f"""
sources:
  code: {{store: {stores["code"]}}}
  web: {{store: {stores["web"]}}}
seq_len: 8
view: {{packing: greedy, eos_id: {EOS}}}
mixture: {{block_size: 8, seed: 5}}
order: {{global_batch_size: {batch}}}
lanes: 4
stages:
  - {{step: 0, weights: {{web: 1, code: 1}}}}
  - {{step: 2, weights: {{web: 3, code: 1}}, seq_len: {second}}}
  - {{offset: 128, weights: {{web: 1, code: 3}}, seq_len: 32}}
"""
    loaded = draccus.load(DataConfig, io.StringIO(text))
    return loaded if not extra else DataConfig.from_dict(loaded.to_dict() | extra)


def test_packed_length_stages_from_yaml_are_the_oracles_and_resume_on_another_mesh(
    stores, mesh_2d, mesh_1d
):
    made = config(stores)
    assert DataConfig.from_dict(made.to_dict()) == made
    want = tables(64, STAGES, NAMES)
    with made.build(mesh_2d) as loader:
        assert type(loader.source).__name__ == "ConfiguredPackedStages"
        assert_steps_are_the_oracles(loader, range(14), want, STAGES, mesh=mesh_2d)
        state = loader.iter_from(13).state()
    with config(stores, batch="8").restore(state, mesh_1d) as loader:
        steps = range(13, 13 + (192 - state["offset"]) // 8)
        assert_steps_are_the_oracles(loader, steps, want, STAGES, mesh=mesh_1d)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"view": {"packing": "best_fit", "eos_id": EOS}}, r"view.packing='best_fit'.*greedy"),
        ({"view": {"packing": "greedy", "window": 64}}, r"view.window=64"),
        ({"view": {"packing": "greedy", "seed": 3}}, r"view.seed=3.*mixture.seed"),
        ({"unit_tokens": 32}, r"unit_tokens=32.*lanes of documents"),
    ],
)
def test_bad_packed_length_stages_name_the_stage_and_field(stores, change, words):
    with pytest.raises(ValueError, match=r"the stage at step 2 sets seq_len=16 .*" + words):
        DataConfig.from_dict(config(stores).to_dict() | change)


def test_a_stage_that_lowers_seq_len_below_a_packed_document_is_refused(stores):
    """Stage 2 at 32 slots, then 8 would split documents of up to 16 slots stage 1 held whole:
    refused before a batch, naming the stage, both lengths and the field."""
    raw = config(stores, second=32).to_dict()
    raw["stages"][2]["seq_len"] = 8
    with pytest.raises(ValueError, match=r"the stage at offset 128 lowers seq_len from 32 to 8 "
                       r"on a packed view \(view.packing='greedy'\), below document \d+ of "
                       r"source '(web|code)' \(\d+ tokens with its EOS\), so packing would "
                       r"split"):  # fmt: skip
        DataConfig.from_dict(raw).train_source()


def test_psdp_inspect_reports_a_packed_length_stage_step_as_the_oracle(stores):
    """Step 13 (offsets 140-143, stage 2, 32 slots): its stage and seq_len, and each row's
    segments the oracle's pieces (document, tokens, column), its padding the slots left."""
    from psdp.tools.inspection import step_report
    from tests.length_oracle import OraclePackedRun
    from tests.test_staged_packed import SETTINGS

    report = step_report(config(stores), 13)
    assert (report.stage, report.seq_len, report.offset, report.rows) == (2, 32, 140, 4)
    docs = {"web": documents(0), "code": documents(1)}
    slots = [[len(d) + 1 for d in docs[n]] for n in NAMES]
    expected = OraclePackedRun(NAMES, slots, STAGES, **SETTINGS).rows(144)[140:]
    for row, (source, pieces, _) in zip(report.row_list, expected, strict=True):
        assert row.source == NAMES[source]
        got = [(s.document, s.start, s.column) for s in row.segments]
        columns = np.cumsum([0] + [size for _, _, size in pieces])[:-1].tolist()
        assert got == [(d, first, c) for (d, first, _), c in zip(pieces, columns, strict=True)]
        assert row.padding == 32 - sum(size for *_, size in pieces)
        for segment in row.segments:
            assert (
                segment.ids
                == docs[row.source][segment.document][segment.start : segment.stop].tolist()
            )
