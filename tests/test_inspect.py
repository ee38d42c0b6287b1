"""``psdp inspect``: a step of a data config (offsets, stage, per-source counts, its rows decoded
to text) and a saved loader state in words.

Oracles: the step's offsets by the batch arithmetic (step x batch), the mixture's (source, row)
walked block by block (tests/mixture_oracle.py), each store's token stream from the tokenizer
called directly on the input texts (plus the EOS), cut into rows of SEQ_LEN as concatenate-then-
split documents it, and the tokenizer's own decoding of those ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from psdp import DataConfig
from psdp.prepare import prepare
from psdp.tools.cli import main
from psdp.tools.inspection import describe_state, load_config, read_state, step_report
from tests import prepare_corpus as corpus
from tests.mixture_oracle import OracleMixture

SEQ_LEN, BATCH, BLOCK, EOS = 16, 4, 8, 1  # EOS: "<|eos|>", the tokenizer's second token
STAGES = [(0, {"code": 1, "prose": 3}), (4, {"code": 1, "prose": 1})]  # (step, weights)
SEEDS = {"code": 1, "prose": 2}

CONFIG = f"""
data:
  seq_len: {SEQ_LEN}
  sources:
    code: {{store: tokens/code, inputs: [code.jsonl], tokenizer: tok/tokenizer.json, eos: <|eos|>}}
    prose: {{store: tokens/prose, inputs: [prose.jsonl], tokenizer: tok/tokenizer.json, eos: <|eos|>}}
  stages:
    - {{step: 0, weights: {{code: 1, prose: 3}}}}
    - {{step: 4, weights: {{code: 1, prose: 1}}}}
  mixture: {{block_size: {BLOCK}, seed: 4}}
  order: {{global_batch_size: {BATCH}}}
steps: 20
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run folder: a tokenizer, two prepared stores and the config naming them."""
    folder = tmp_path_factory.mktemp("run")
    tokenizer = corpus.train_tokenizer(folder / "tok" / "tokenizer.json")
    for name, seed in SEEDS.items():
        corpus.write_jsonl(folder / f"{name}.jsonl", corpus.texts(40, seed=seed))
        prepare([str(folder / f"{name}.jsonl")], folder / "tokens" / name, tokenizer=tokenizer,
                eos="<|eos|>", workers=1, progress=False)  # fmt: skip
    (folder / "train.yaml").write_text(CONFIG)
    return folder


@pytest.fixture
def in_run(run, monkeypatch) -> Path:
    monkeypatch.chdir(run)  # the config's paths are relative to the run folder
    return run


def _streams(run: Path) -> tuple[dict[str, list[list[int]]], object]:
    """Each source's documents as the tokenizer makes them from the texts, and the tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(run / "tok" / "tokenizer.json"))
    documents = {}
    for name, seed in SEEDS.items():
        ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in corpus.texts(40, seed)]
        documents[name] = [[*d, EOS] for d in ids if d]
    return documents, tokenizer


@pytest.mark.parametrize("step", [0, 3, 4, 7])
def test_a_step_is_its_offsets_stage_counts_and_rows_as_the_oracles_make_them(in_run, step):
    documents, tokenizer = _streams(in_run)
    config, run_steps = load_config("train.yaml")
    report = step_report(config, step, run_steps=run_steps)

    assert (report.offset, report.rows, report.batch_size) == (step * BATCH, BATCH, BATCH)
    stage = 1 if step >= 4 else 0
    assert (report.stage, report.stages) == (stage, 2)
    assert report.stage_start == f"step {STAGES[stage][0]}"
    assert report.stage_offset == STAGES[stage][0] * BATCH
    assert report.weights == {k: float(v) for k, v in STAGES[stage][1].items()}

    streams = {n: np.concatenate([np.array(d) for d in docs]) for n, docs in documents.items()}
    rows = {n: len(s) // SEQ_LEN for n, s in streams.items()}
    oracle = OracleMixture(["code", "prose"], [rows["code"], rows["prose"]],
                           [(s * BATCH, w) for s, w in STAGES], BLOCK, seed=4)  # fmt: skip
    source, row = oracle.sequence(report.offset + BATCH)
    names = [["code", "prose"][s] for s in source[report.offset :]]
    assert report.counts == {n: names.count(n) for n in ("code", "prose")}
    assert [r.source for r in report.row_list] == names
    starts = {n: np.cumsum([0, *map(len, docs)]) for n, docs in documents.items()}
    for got, name, r in zip(report.row_list, names, row[report.offset :], strict=True):
        want = streams[name][r * SEQ_LEN : (r + 1) * SEQ_LEN]
        assert np.concatenate([s.ids for s in got.segments]).tolist() == want.tolist()
        assert got.padding == 0 and got.segments[0].column == 0
        for segment in got.segments:
            document = documents[name][segment.document]
            assert segment.ids == document[segment.start : segment.stop]
            assert starts[name][segment.document] + segment.start == (
                r * SEQ_LEN + segment.column
            )  # the segment sits where the stream puts it
            assert segment.text == tokenizer.decode(segment.ids, skip_special_tokens=False)


def test_the_command_prints_the_step_and_its_json(in_run, capsys):
    assert main(["inspect", "train.yaml", "--step", "4", "--rows", "1:3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("step 4: sample offsets 16-19, 4 rows of a batch of 4\n")
    assert "stage 2 of 2 (from step 4, sample offset 16): weights code 1, prose 1" in text
    assert "row 1 (sample offset 17)" in text and "row 0 " not in text and "row 3 " not in text
    assert main(["inspect", "train.yaml", "--step", "4", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    config, _ = load_config("train.yaml")
    assert found == step_report(config, 4).to_json()
    assert [r["offset"] for r in found["row_list"]] == [16, 17, 18, 19]


def test_a_tokenizer_the_store_was_not_prepared_with_is_refused(in_run, tmp_path):
    other = corpus.train_tokenizer(tmp_path / "other.json", vocab_size=280)
    config = DataConfig.from_dict(load_config("train.yaml")[0].to_dict())
    with pytest.raises(ValueError, match="not the one the store 'tokens/code' was prepared with"):
        step_report(config, 0, tokenizer=str(other))
    bare = DataConfig.from_dict({**config.to_dict(), "sources": {
        "code": {"store": "tokens/code"}, "prose": {"store": "tokens/prose"}}})  # fmt: skip
    report = step_report(bare, 0)  # no tokenizer named: the ids, and how to get the text
    assert report.decoded["code"].startswith("not decoded (the config names no tokenizer")
    assert all(s.text is None and s.ids for r in report.row_list for s in r.segments)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope.yaml", "--step", "1"], "the config 'nope.yaml' does not exist"),
        (["train.yaml", "--step", "20"], "--step 20 is beyond the run's schedule: the config "
                                         "trains steps 0-19 (20 steps)"),
        (["train.yaml", "--step", "-1"], "--step -1: give a step >= 0"),
        (["train.yaml"], "give a config and a step"),
        (["train.yaml", "--step", "1", "--rows", "a:b"], "--rows 'a:b': give rows as START:STOP"),
        (["--state", "missing"], "the checkpoint 'missing' does not exist"),
        (["--state", "train.yaml"], "'train.yaml' is not JSON"),
        (["--state", "tok/tokenizer.json"], "not a psdp loader state"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_with_the_fix(in_run, capsys, args, message):
    assert main(["inspect", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("psdp inspect: error: ") and err.count("\n") == 1
    assert message in err


def test_a_levanter_yaml_is_refused_naming_the_translation(in_run, capsys):
    """The YAML a Levanter user runs with ``python -m psdp.levanter`` holds Levanter's data
    section, not a DataConfig: said so, with the way to a DataConfig, not as a missing field."""
    Path("levanter.yaml").write_text(
        "data: {tokenizer: tok, cache_dir: cache, components: {web: {}, code: {}}}\n"
        "trainer: {num_train_steps: 8, train_batch_size: 8}\n"
    )
    assert main(["inspect", "levanter.yaml", "--step", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "holds Levanter's data section (components: web, code)" in err
    assert "psdp.levanter.data_config(config.data" in err


def _state_after(mesh, steps: int) -> dict:
    config, _ = load_config("train.yaml")
    with config.build(mesh) as loader:
        it = iter(loader)
        for _ in range(steps):
            next(it)
        return it.state()


def test_a_state_from_an_orbax_checkpoint_or_a_file_reads_in_words(in_run, mesh_1d, capsys):
    ocp = pytest.importorskip("orbax.checkpoint")
    from psdp.orbax import LoaderSave

    manager = ocp.CheckpointManager(in_run / "ckpt", item_names=("model", "loader"))
    states = {}
    for step in (2, 5):
        states[step] = _state_after(mesh_1d, step)
        manager.save(step, args=ocp.args.Composite(
            model=ocp.args.StandardSave({"w": np.zeros(2)}), loader=LoaderSave(states[step])))  # fmt: skip
        manager.wait_until_finished()
    manager.close()
    # the manager's folder: its latest step; a step's folder; the item's folder
    for where, step in (("ckpt", 5), ("ckpt/2", 2), ("ckpt/2/loader", 2)):
        state, file = read_state(where)
        assert state == states[step] and file == Path(f"ckpt/{step}/loader/metadata")
    words = describe_state(states[5])
    assert words.splitlines()[:3] == [
        "resumes at step 5, sample offset 20 (steps 0-4 done)",
        "batch size 4; in sample-offset order (the mixture shuffles); a short batch padded",
        "source: a mixture (its rows are sample offsets); leaves: input_ids uint16 [16], "
        "positions int32 [16], segment_ids int32 [16]",
    ]
    assert words.splitlines()[3].startswith("mixture of code (")  # its sources and their rows
    assert "  from sample offset 16: weights code 1, prose 1" in words  # stage 2 at step 4
    (in_run / "state.json").write_text(json.dumps(states[2]))
    assert main(["inspect", "--state", "state.json"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "resumes at step 2, sample offset 8 (steps 0-1 done)"
    )
    # a checkpoint that holds the model only
    only_model = ocp.CheckpointManager(in_run / "model-only", item_names=("model",))
    only_model.save(1, args=ocp.args.Composite(model=ocp.args.JsonSave({"w": 1})))
    only_model.wait_until_finished()
    only_model.close()
    assert main(["inspect", "--state", "model-only"]) == 2
    assert "holds no psdp loader state (looked at: 1/model/metadata)" in capsys.readouterr().err


def test_a_step_of_a_run_resumed_with_another_batch_size_counts_from_the_saved_offset(
    in_run, mesh_1d, capsys
):
    """Saved after step 3 (offset 16) with batch 4, resumed with batch 8: step 6 reads offsets
    16 + 2 x 8 = 32 on, not 6 x 8; the stage at step 4 keeps the saved run's offset 16."""
    (in_run / "state4.json").write_text(json.dumps(_state_after(mesh_1d, 4)))
    (in_run / "resumed.yaml").write_text(
        CONFIG.replace(f"global_batch_size: {BATCH}", "global_batch_size: 8")
    )
    config, _ = load_config("resumed.yaml")
    report = step_report(config, 6, resumed_from=read_state("state4.json")[0])
    assert (report.offset, report.rows, report.stage, report.stage_start) == (32, 8, 1, "step 4")
    assert report.stage_offset == 16
    documents, _ = _streams(in_run)
    rows = {n: sum(map(len, docs)) // SEQ_LEN for n, docs in documents.items()}
    oracle = OracleMixture(["code", "prose"], [rows["code"], rows["prose"]],
                           [(0, STAGES[0][1]), (16, STAGES[1][1])], BLOCK, seed=4)  # fmt: skip
    source, _ = oracle.sequence(40)
    assert [r.source for r in report.row_list] == [["code", "prose"][s] for s in source[32:40]]
    with config.restore(read_state("state4.json")[0], mesh_1d) as loader:  # the loader agrees
        assert loader.step_info(6).offset == 32
        batch = loader.batch_at(6)
        ids = np.asarray(batch["input_ids"])
    assert [np.concatenate([s.ids for s in r.segments]).tolist() for r in report.row_list] == (
        ids.tolist()
    )
    assert main(["inspect", "resumed.yaml", "--step", "3", "--state", "state4.json"]) == 2
    assert "--step 3 is before step 4, where the run resumed" in capsys.readouterr().err


def test_a_store_without_a_recorded_tokenizer_decodes_only_with_the_one_given(in_run, tmp_path):
    """A store `write_documents` made records no tokenizer: ids, unless --tokenizer is given."""
    from psdp.sources.documents.writer import write_documents

    documents, tokenizer = _streams(in_run)
    write_documents(tmp_path / "plain", [np.array(d, np.uint16) for d in documents["code"]])
    config = DataConfig.from_dict({"seq_len": SEQ_LEN, "order": {"global_batch_size": 2},
                                   "sources": {"code": {"store": str(tmp_path / "plain")}}})  # fmt: skip
    assert step_report(config, 0).decoded["code"].startswith("not decoded")
    given = step_report(config, 0, tokenizer="tok/tokenizer.json")
    assert given.decoded["code"].endswith("(not checked: the store records no tokenizer)")
    segment = given.row_list[0].segments[0]
    assert segment.text == tokenizer.decode(segment.ids, skip_special_tokens=False)


def test_a_stage_given_by_tokens_is_reported_where_its_config_puts_it(in_run):
    """The second stage at ``tokens: 256`` (16 samples of 16 tokens, step 4 at batch 4): step 4
    is in it, step 3 is not, and the report names the stage's start as the config gives it."""
    (in_run / "by_tokens.yaml").write_text(
        CONFIG.replace("{step: 4, weights", f"{{tokens: {16 * SEQ_LEN}, weights")
    )
    config, run_steps = load_config("by_tokens.yaml")
    before, inside = (step_report(config, s, run_steps=run_steps) for s in (3, 4))
    assert (before.stage, before.stage_start, before.stage_offset) == (0, "step 0", 0)
    assert (inside.stage, inside.stage_start, inside.stage_offset) == (1, "tokens 256", 16)
    assert "(from tokens 256, sample offset 16)" in str(inside)
