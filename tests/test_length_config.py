"""Length stages in `DataConfig`: a stage that sets ``seq_len`` makes the train source a
`StagedTokens` of the stores; every device shard of every step is tests/length_oracle.py's, a
restore inside a later stage on another mesh and batch size goes on exactly, later stages' lengths
may change on a restore and earlier ones may not."""

from __future__ import annotations

import io

import draccus
import numpy as np
import pytest

from psdp import DataConfig
from psdp.sources.documents.writer import write_documents
from tests.length_oracle import OracleLengthRun
from tests.test_staged_tokens import (
    EOS,
    assert_steps_are_the_oracles,
    documents,
    stage_tables,
    streams,
)

#: sorted as DataConfig lists them; code's documents are test_staged_tokens' second store's
NAMES = ["code", "web"]
DOCS = {"code": documents(1), "web": documents(0)}
SETTINGS = {"block_size": 8, "lanes": 4, "unit_tokens": 32, "seed": 5}
#: 8 -> 32 -> 64 tokens: stage 1 by step (step 2 of batches of 32: offset 64), stage 2 by offset
STAGES = """stages:
  - {step: 0, weights: {web: 1, code: 1}}
  - {step: 2, weights: {web: 3, code: 1}, seq_len: 32}
  - {offset: 128, weights: {web: 1, code: 3}, seq_len: LAST}
"""


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("length_stores")
    return {
        name: str(write_documents(root / name, [{"input_ids": d} for d in docs], progress=False))
        for name, docs in DOCS.items()
    }


def config(stores, batch="[[0, 32], [2, 8], [10, 4]]", last=64, seq_len=8, **extra) -> DataConfig:
    text = f"""
sources:
  code: {{store: {stores["code"]}}}
  web: {{store: {stores["web"]}}}
seq_len: {seq_len}
view: {{eos_id: {EOS}, targets: true}}
mixture: {{block_size: 8, seed: 5}}
order: {{global_batch_size: {batch}}}
lanes: 4
unit_tokens: 32
{STAGES.replace("LAST", str(last))}"""
    loaded = draccus.load(DataConfig, io.StringIO(text))
    return loaded if not extra else DataConfig.from_dict(loaded.to_dict() | extra)


def oracle(stages, rows: int) -> list[dict[str, np.ndarray]]:
    """Each stage's rows (the last one's first ``rows``), from the stores' streams."""
    stream = [streams(DOCS[n]) for n in NAMES]
    run = OracleLengthRun(NAMES, [len(s["input_ids"]) for s in stream], stages, extra=1,
                          **SETTINGS)  # fmt: skip
    return stage_tables(run, stream, stages, rows)


def stages_of(last: int = 64):
    return [(0, 8, {"web": 1, "code": 1}), (64, 32, {"web": 3, "code": 1}),
            (128, last, {"web": 1, "code": 3})]  # fmt: skip


def test_the_config_round_trips_its_length_stages(stores):
    made = config(stores)
    assert [s.seq_len for s in made.stages] == [None, 32, 64]
    assert DataConfig.from_dict(made.to_dict()) == made
    assert made.to_dict()["lanes"] == 4


def test_three_length_stages_from_yaml_are_the_oracles_on_every_device(stores, mesh_2d):
    stages = stages_of()
    with config(stores).build(mesh_2d) as loader:
        assert [loader.step_info(s).offset for s in (2, 10)] == [64, 128]
        assert_steps_are_the_oracles(loader, range(18), oracle(stages, 32), stages, mesh=mesh_2d)


@pytest.mark.parametrize("saved_at", [5, 10, 13])
def test_a_restore_inside_a_later_stage_on_another_mesh_and_batch_is_the_oracle(
    stores, mesh_2d, mesh_1d, saved_at
):
    stages = stages_of()
    with config(stores).build(mesh_2d) as loader:
        state = loader.iter_from(saved_at).state()
    restored = config(stores, batch="8")
    with restored.restore(state, mesh_1d) as loader:
        offset = loader.step_info(saved_at).offset
        assert offset == state["offset"]
        steps = range(saved_at, saved_at + (192 - offset) // 8)
        assert_steps_are_the_oracles(loader, steps, oracle(stages, 64), stages, mesh=mesh_1d)
        again = loader.iter_from(saved_at + 1).state()  # saved by a loader begun in its stage
    with restored.restore(again, mesh_2d) as loader:
        steps = range(saved_at + 1, saved_at + 3)
        assert_steps_are_the_oracles(loader, steps, oracle(stages, 64), stages, mesh=mesh_2d)


def test_a_restore_may_change_a_later_stages_seq_len_but_no_earlier_one(stores, mesh_2d, mesh_1d):
    """Saved at step 5 (offset 88, stage 1): stage 2 (from 128) may become rows of 48; saved at
    step 13 (offset 140) it may not, nor may the first seq_len."""
    with config(stores).build(mesh_2d) as loader:
        early, late = loader.iter_from(5).state(), loader.iter_from(13).state()
    stages = stages_of(48)
    with config(stores, batch="8", last=48).restore(early, mesh_1d) as loader:
        steps = range(5, 5 + (192 - 88) // 8)
        assert_steps_are_the_oracles(loader, steps, oracle(stages, 64), stages, mesh=mesh_1d)
    with pytest.raises(ValueError, match="stage 2"):
        config(stores, batch="8", last=48).restore(late, mesh_1d)
    with pytest.raises(ValueError, match="DataConfig.seq_len is 16, but the run was saved with 8"):
        config(stores, batch="8", seq_len=16).restore(early, mesh_1d)


def test_a_single_length_state_does_not_restore_into_length_stages(stores, mesh_2d, mesh_1d):
    plain = DataConfig.from_dict(
        {k: v for k, v in config(stores).to_dict().items() if k not in ("lanes", "unit_tokens")}
        | {"stages": None, "order": {"global_batch_size": 8}}
    )
    with plain.build(mesh_2d) as loader:
        state = loader.iter_from(1).state()
    with pytest.raises(ValueError, match="cannot switch into or out of length stages") as error:
        config(stores, batch="8").restore(state, mesh_1d)
    assert len(str(error.value)) < 600  # the kinds, not the saved record whole


@pytest.mark.parametrize(
    "change, words",
    [
        ({"lanes": None}, r"DataConfig.lanes is unset, but the stage at step 2 sets seq_len=32"),
        ({"view": {"packing": "best_fit"}}, r"stage at step 2 sets seq_len=32 .*view.packing"),
        ({"lanes": 0}, r"DataConfig.lanes must be an int >= 1 or unset, got 0"),
        (
            {"seq_len": 16},
            r"the first stage \(at step 0\) sets seq_len=8, but DataConfig.seq_len=16",
        ),
    ],
)
def test_bad_length_stages_name_the_stage_and_field(stores, change, words):
    raw = config(stores).to_dict()
    raw["stages"][0]["seq_len"] = 8
    with pytest.raises(ValueError, match=words):
        DataConfig.from_dict(raw | change)


def test_bad_length_stage_fields_are_refused(stores):
    raw = config(stores).to_dict()
    with pytest.raises(ValueError, match=r"StageConfig.seq_len \(step 2\) must be an int >= 1"):
        DataConfig.from_dict(
            raw | {"stages": [raw["stages"][0], raw["stages"][1] | {"seq_len": 0}]}
        )
    tokens = raw["stages"][:2] + [{"tokens": 2049, "weights": {"web": 1}, "seq_len": 64}]
    with pytest.raises(ValueError, match=r"the stage at tokens 2049 \(stage 2\) needs a whole "
                       r"number of rows of seq_len=32 after the 512 tokens"):  # fmt: skip
        DataConfig.from_dict(raw | {"stages": tokens}).train_source()
    single = raw | {
        "stages": [{k: v for k, v in s.items() if k != "seq_len"} for s in raw["stages"]]
    }
    with pytest.raises(ValueError, match="DataConfig.lanes=4 is set, but no stage sets seq_len"):
        DataConfig.from_dict(single)
    with pytest.raises(
        ValueError, match="stage 1's seq_len=32 does not divide by the context|lanes=100"
    ):
        DataConfig.from_dict(raw | {"lanes": 100}).train_source()


def test_psdp_inspect_reports_a_length_stage_step_as_the_oracle(stores):
    """Step 5 (offsets 88-95, stage 1, rows of 32 + 1): its stage, seq_len, counts, and each
    row's segments at the oracle's tokens and positions."""
    from psdp.tools.inspection import step_report

    report = step_report(config(stores), 5)
    assert (report.stage, report.seq_len, report.offset, report.rows) == (1, 32, 88, 8)
    assert "(from step 2, sample offset 64): seq_len 32, weights code 1, web 3" in str(report)
    table = {k: v[88 - 64 : 96 - 64] for k, v in oracle(stages_of(), 32)[1].items()}
    run = OracleLengthRun(NAMES, [len(streams(DOCS[n])["input_ids"]) for n in NAMES],
                          stages_of(), extra=1, **SETTINGS)  # fmt: skip
    sources = [NAMES[s] for s, *_ in run.rows(96)[88:96]]
    assert report.counts == {n: sources.count(n) for n in NAMES}
    for r, row in enumerate(report.row_list):
        assert row.source == sources[r]
        assert sum(s.stop - s.start + (s.stop == len(DOCS[row.source][s.document]))
                   for s in row.segments) + row.padding == 33  # fmt: skip
        for segment in row.segments:
            columns = slice(segment.column, segment.column + len(segment.ids))
            assert segment.ids == table["input_ids"][r, columns].tolist()
            assert table["positions"][r, segment.column] == segment.start


def test_a_source_leaf_tags_each_row_of_every_stage_with_its_source(stores, mesh_2d):
    """mixture.source_leaf with length stages: every step's ``src`` leaf is the oracle's source
    of each row (code 0, web 1), in stages 0, 1 and 2; a name the stores have is refused."""
    raw = config(stores).to_dict()
    made = DataConfig.from_dict(raw | {"mixture": {"block_size": 8, "seed": 5,
                                                   "source_leaf": "src"}})  # fmt: skip
    run = OracleLengthRun(NAMES, [len(streams(DOCS[n])["input_ids"]) for n in NAMES],
                          stages_of(), extra=1, **SETTINGS)  # fmt: skip
    sources = [source for source, *_ in run.rows(160)]
    with made.build(mesh_2d) as loader:
        for step in (0, 1, 2, 9, 10, 13):
            info = loader.step_info(step)
            want = sources[info.offset : info.offset + info.batch_size]
            assert np.asarray(loader.batch_at(step)["src"]).tolist() == want, step
    with pytest.raises(ValueError, match="source_leaf='input_ids', but the stores already"):
        DataConfig.from_dict(raw | {"mixture": {"block_size": 8, "source_leaf": "input_ids"}}
                             ).train_source()  # fmt: skip


def test_a_stage_by_tokens_counts_the_rows_of_every_length_before_it(stores, mesh_2d, mesh_1d):
    """Stage 2 at 2560 tokens: 64 rows of 8 (512) and then 64 rows of 32 (2048), so offset
    128, as by offset; a restore with other batch sizes keeps it there."""
    raw = config(stores).to_dict()
    stage = {k: v for k, v in raw["stages"][2].items() if k != "offset"} | {"tokens": 2560}
    by_tokens = DataConfig.from_dict(raw | {"stages": [*raw["stages"][:2], stage]})
    assert [s[0] for s in by_tokens.train_source().plan.stages] == [0, 64, 128]
    with by_tokens.build(mesh_2d) as loader:
        state = loader.iter_from(5).state()
    resumed = DataConfig.from_dict(by_tokens.to_dict() | {"order": {"global_batch_size": 16}})
    source, _ = resumed.restored_source(state)
    assert [s[0] for s in source.plan.stages] == [0, 64, 128]


@pytest.mark.parametrize(
    ("batch", "warned"),
    [
        ("[[0, 32], [2, 8], [10, 4]]", None),  # the batch changes where each length does
        ("16", None),  # a constant batch is a choice: tokens per step grow with seq_len
        ("[[0, 32], [2, 8], [12, 4]]", "stages[2] (at offset 128) changes seq_len from 32 to "
         "64 at step 10, but order.global_batch_size keeps 8 rows there (its schedule changes "
         "at steps [2, 12]), so a step's tokens go from 256 to 512"),
    ],
)  # fmt: skip
def test_a_length_stage_where_a_batch_schedule_keeps_its_size_is_warned_about(
    stores, caplog, batch, warned
):
    with caplog.at_level("WARNING", logger="psdp"):
        config(stores, batch=batch).train_source()
    got = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert got == ([] if warned is None else [f"DataConfig.{warned}; if the batch size was "
                   "meant to change with seq_len, move that change to step 10"])  # fmt: skip


def test_a_resume_that_moves_a_later_length_stage_off_the_schedules_change_is_warned_about(
    stores, mesh_2d, caplog
):
    """Resumed at step 3 with batches of 4 from there: stage 2 (by offset 128) now starts at
    step 17, where the schedule (changes at 2 and 3) keeps 4 rows; the stages before the
    resume are not warned about again."""
    with config(stores).build(mesh_2d) as loader:
        state = loader.iter_from(3).state()
    resumed = config(stores, batch="[[0, 32], [2, 8], [3, 4]]")
    with caplog.at_level("WARNING", logger="psdp"):
        source, _ = resumed.restored_source(state)
    assert [s[0] for s in source.plan.stages] == [0, 64, 128]
    [message] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert message.startswith(
        "DataConfig.stages[2] (at offset 128) changes seq_len from 32 to "
        "64 at step 17, but order.global_batch_size keeps 4 rows there"
    )
