"""`DataConfig`: the train loader from YAML equals the same loader built by hand and an independent
oracle (packing, token and mixture oracles), eval loaders are finite and exactly once, YAML and
flags round trip, a restore refuses what decides past rows and accepts what may change, and a
missing, unfinished or stale store names its ``psdp prepare`` command."""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import draccus
import numpy as np
import pytest

from psdp import (
    DataConfig,
    DataLoader,
    DocumentStore,
    Mixture,
    MixtureConfig,
    OrderOptions,
    PackedSequences,
    SourceConfig,
    StageConfig,
    TokenSequences,
    ViewConfig,
)
from psdp.sources.documents.writer import write_documents
from tests import token_oracle
from tests.batch_checks import assert_batch_exact
from tests.eval_oracle import eval_batches
from tests.meshes import mesh_of
from tests.mixture_oracle import OracleMixture
from tests.packing_oracle import (
    naive_pack,
    named_documents,
    packed_table,
    with_eos,
    with_targets,
)

SEQ_LEN, BATCH, BLOCK = 16, 8, 16
#: document lengths of the two sources and the eval set (some longer than SEQ_LEN: split)
LENGTHS = {
    "code": [5, 3, 17, 2, 6, 4, 8, 1, 9, 12, 3, 7] * 3,
    "prose": [11, 4, 6, 20, 2, 9, 5, 13, 7, 3] * 4,
    "held_out": [7, 2, 9, 14, 3, 5, 6, 10, 4],
}
#: each store's tokens are told apart by this base (named_documents: doc * 1000 + i)
BASE = {"code": 0, "prose": 100_000, "held_out": 200_000}


def _docs(name: str) -> list[dict[str, np.ndarray]]:
    docs = named_documents(LENGTHS[name])
    return [{"input_ids": d["input_ids"] + BASE[name]} for d in docs]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stores")
    return {
        name: str(write_documents(root / name, _docs(name), progress=False)) for name in LENGTHS
    }


def _yaml(stores: dict[str, str], view: str, stages: bool = False) -> str:
    weights = "" if stages else ", weight: {}"
    text = f"""
sources:
  code: {{store: {stores["code"]}{weights.format(1)}}}
  prose: {{store: {stores["prose"]}{weights.format(3)}}}
seq_len: {SEQ_LEN}
view: {view}
mixture: {{block_size: {BLOCK}, seed: 5}}
eval:
  held_out: {{store: {stores["held_out"]}}}
eval_batch_size: 6
order: {{global_batch_size: {BATCH}}}
"""
    if stages:  # step 4 starts at offset 4 * 8 = 32, a block boundary
        text += "stages:\n  - {step: 0, weights: {code: 1, prose: 3}}\n"
        text += "  - {step: 4, weights: {code: 1, prose: 1}}\n"
    return text


def _config(stores, view="{packing: best_fit}", stages=False) -> DataConfig:
    return draccus.load(DataConfig, io.StringIO(_yaml(stores, view, stages)))


def _mesh():
    return mesh_of(("data", "model"), (4, 2))


def _oracle_rows(name: str, view: str) -> dict[str, np.ndarray]:
    """A store's rows by the independent oracles: packed with naive best fit, or concatenated
    (EOS 0 after each document) and split."""
    docs = _docs(name)
    if view == "packed":
        bins = naive_pack(LENGTHS[name], SEQ_LEN, "best_fit")
        return packed_table(docs, bins, SEQ_LEN)
    if view == "packed_lm":  # each document and its EOS 0 packed; next-token targets
        docs, slots = with_eos(docs, 0)
        return with_targets(packed_table(docs, naive_pack(slots, SEQ_LEN, "best_fit"), SEQ_LEN))
    return token_oracle.rows([d["input_ids"] for d in docs], SEQ_LEN, eos_id=0)


def _oracle_step(view: str, step: int, stages, block: int = BLOCK) -> dict[str, np.ndarray]:
    """The global batch of ``step`` (a constant batch of BATCH: offsets step * BATCH ...) by the
    mixture oracle, which walks the blocks one by one, over the oracle rows."""
    tables = {n: _oracle_rows(n, view) for n in ("code", "prose")}
    lengths = [len(tables[n]["input_ids"]) for n in ("code", "prose")]
    mixture = OracleMixture(["code", "prose"], lengths, stages, block, seed=5)
    source, row = mixture.sequence((step + 1) * BATCH)
    offsets = range(step * BATCH, (step + 1) * BATCH)
    names = ("code", "prose")
    batch = {
        key: np.stack([tables[names[source[g]]][key][row[g]] for g in offsets])
        for key in tables["code"]
    }
    batch["mask"] = np.ones(BATCH, bool)
    return batch


VIEWS = {
    "packed": "{packing: best_fit}",
    "packed_lm": "{packing: best_fit, targets: true, eos_id: 0}",
    "concatenated": "{eos_id: 0}",
}


# ----------------------------------------------------------------------------- exact data
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("stages", [False, True], ids=["weights", "stages"])
def test_the_train_loader_from_yaml_is_the_oracle_batch_for_batch(stores, view, stages):
    config = _config(stores, VIEWS[view], stages)
    weights = [(0, {"code": 1, "prose": 3})]
    if stages:
        weights.append((4 * BATCH, {"code": 1, "prose": 1}))
    with config.build(_mesh()) as loader:
        for step in range(8):  # both stages
            assert_batch_exact(loader.batch_at(step), _oracle_step(view, step, weights))


@pytest.fixture(scope="module", params=["s3", "gs"])
def bucket_stores(request) -> Any:
    """The same three stores in a bucket of moto's S3 server or fake-gcs-server on 127.0.0.1,
    named by URL: the config finds the endpoint in the environment, as on a pod."""
    from psdp.tools.benchmarks.object_store import GcsServer, S3Server

    server = S3Server() if request.param == "s3" else GcsServer()
    with server, pytest.MonkeyPatch.context() as env:
        if request.param == "s3":
            env.setenv("AWS_ENDPOINT_URL", server.endpoint)
        urls = {name: f"{request.param}://psdp/{name}/" for name in LENGTHS}
        for name, url in urls.items():
            write_documents(url, _docs(name), progress=False)
        yield urls


@pytest.mark.parametrize("view", list(VIEWS))
def test_the_config_reads_stores_in_a_bucket_batch_for_batch(bucket_stores, view):
    """`DataConfig` sources at ``s3://`` and ``gs://`` URLs: every view (TokenSequences,
    PackedSequences, with targets) in a Mixture over two stages, the oracle's batches, and the
    eval loader's."""
    config = _config(bucket_stores, VIEWS[view], stages=True)
    weights = [(0, {"code": 1, "prose": 3}), (4 * BATCH, {"code": 1, "prose": 1})]
    with config.build(_mesh()) as loader:
        for step in range(8):  # both stages
            assert_batch_exact(loader.batch_at(step), _oracle_step(view, step, weights))
    expected = eval_batches(_oracle_rows("held_out", view), 6, batch_shards=4)
    with config.eval_loaders(_mesh())["held_out"] as held_out:
        for got, want in zip(held_out, expected, strict=True):
            assert_batch_exact(got, want)


@pytest.mark.parametrize("view", list(VIEWS))
def test_the_train_loader_from_yaml_equals_the_loader_built_by_hand(stores, view):
    config = _config(stores, VIEWS[view], stages=True)
    stores_ = {n: DocumentStore.open(stores[n]) for n in ("code", "prose")}
    if view == "packed":
        views = {n: PackedSequences(s, SEQ_LEN, "best_fit") for n, s in stores_.items()}
    elif view == "packed_lm":
        views = {n: PackedSequences(s, SEQ_LEN, "best_fit", targets=True, eos_id=0)
                 for n, s in stores_.items()}  # fmt: skip
    else:
        views = {n: TokenSequences(s, SEQ_LEN, eos_id=0) for n, s in stores_.items()}
    stages = [(0, {"code": 1, "prose": 3}), (4 * BATCH, {"code": 1, "prose": 1})]
    by_hand = Mixture(views, stages=stages, block_size=BLOCK, seed=5)
    with (
        config.build(_mesh()) as loader,
        DataLoader(by_hand, mesh=_mesh(), global_batch_size=BATCH) as hand,
    ):
        for step in range(10):
            got, want = loader.batch_at(step), hand.batch_at(step)
            assert set(got) == set(want)
            for key in want:
                assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), (step, key)


# ---------------------------------------------------------------------------------- eval
@pytest.mark.parametrize("view", list(VIEWS))
def test_eval_loaders_from_the_config_are_finite_and_exactly_once(stores, view):
    config = _config(stores, VIEWS[view])
    rows = _oracle_rows("held_out", view)
    expected = eval_batches(rows, 6, batch_shards=4)
    loaders = config.eval_loaders(_mesh())
    assert list(loaders) == ["held_out"]
    with loaders["held_out"] as loader:
        assert len(loader) == len(expected)
        for _ in range(2):  # each pass is a new pass, the same batches
            it = iter(loader)
            for want in expected:
                assert_batch_exact(next(it), want)
            with pytest.raises(StopIteration):
                next(it)
    real = sum(int(b["mask"].sum()) for b in expected)
    assert real == len(rows["input_ids"])  # every row once


# ------------------------------------------------------------------------ YAML and flags
@dataclass(frozen=True)
class TrainerConfig:
    data: DataConfig = field(default_factory=DataConfig)
    num_train_steps: int = 100


FULL = DataConfig(
    sources={
        "code": SourceConfig(
            store="tokens/code", inputs=["code/*.jsonl"], tokenizer="tok.json", eos="</s>"
        ),
        "prose": SourceConfig(store="s3://bucket/prose"),
    },
    stages=[
        StageConfig(step=0, weights={"code": 1, "prose": 3}),
        StageConfig(step=1000, weights={"code": 1, "prose": 1}),
    ],
    seq_len=256,
    view=ViewConfig(packing="first_fit", window=4096, long_documents="drop", seed=3, pad_id=7),
    mixture=MixtureConfig(block_size=64, seed=9),
    eval={"held_out": SourceConfig(store="tokens/eval")},
    eval_batch_size=32,
    order=OrderOptions(global_batch_size=[(0, 32), (500, 64)], skip_steps=[(10, 12)]),
)


def test_dict_and_yaml_round_trip():
    assert DataConfig.from_dict(FULL.to_dict()) == FULL
    assert DataConfig.from_dict(json.loads(json.dumps(FULL.to_dict()))) == FULL
    trainer = TrainerConfig(data=FULL, num_train_steps=3)
    assert draccus.load(TrainerConfig, io.StringIO(draccus.dump(trainer))) == trainer


def test_this_sessions_fields_round_trip_too():
    """A packing cap, an unshuffled mixture with a source leaf and stages by offset and by
    tokens: through dicts, JSON and draccus YAML to an equal config."""
    newer = replace(
        FULL,
        stages=[
            StageConfig(weights={"code": 1, "prose": 3}),
            StageConfig(offset=4096, weights={"code": 1, "prose": 1}),
            StageConfig(tokens=2**21, weights={"code": 1}),
        ],
        view=replace(FULL.view, max_segments=8),
        mixture=replace(FULL.mixture, shuffle=False, source_leaf="source"),
    )
    assert DataConfig.from_dict(newer.to_dict()) == newer
    assert DataConfig.from_dict(json.loads(json.dumps(newer.to_dict()))) == newer
    trainer = TrainerConfig(data=newer, num_train_steps=3)
    assert draccus.load(TrainerConfig, io.StringIO(draccus.dump(trainer))) == trainer


def test_length_stages_and_length_selected_sources_round_trip():
    """Stages that set ``seq_len`` (with ``lanes``) over a packed view, and a
    source selected by length, through dicts, JSON and draccus YAML to an equal config."""
    longer = replace(
        FULL,
        sources={**FULL.sources, "long": SourceConfig(store="tokens/code", min_length=8192,
                                                      max_length=2**20)},
        stages=[
            StageConfig(weights={"code": 1, "prose": 3, "long": 0}),
            StageConfig(offset=4096, seq_len=1024, weights={"code": 1, "prose": 1, "long": 2}),
        ],
        view=replace(FULL.view, packing="greedy", window=None, seed=None),
        lanes=64,
    )  # fmt: skip
    assert DataConfig.from_dict(longer.to_dict()) == longer
    assert DataConfig.from_dict(json.loads(json.dumps(longer.to_dict()))) == longer
    trainer = TrainerConfig(data=longer, num_train_steps=3)
    assert draccus.load(TrainerConfig, io.StringIO(draccus.dump(trainer))) == trainer


def test_yaml_file_and_flags(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(draccus.dump(TrainerConfig(data=FULL)))
    flags = ["--data.seq_len", "128", "--data.view.packing", "greedy"]
    flags += ["--data.mixture.seed", "4", "--data.order.global_batch_size", "16"]
    flags += ["--data.eval", "{other: {store: tokens/other}}"]
    parsed = draccus.parse(TrainerConfig, config_path=str(path), args=flags)
    assert parsed.data == replace(
        FULL,
        seq_len=128,
        view=replace(FULL.view, packing="greedy"),
        mixture=replace(FULL.mixture, seed=4),
        order=replace(FULL.order, global_batch_size=16),
        eval={**FULL.eval, "other": SourceConfig(store="tokens/other")},  # a dict flag merges
    )


def test_help_shows_the_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        draccus.parse(TrainerConfig, args=["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Tokens per row (required by build)." in out
    assert "pack them (`PackedSequences`)" in out


# ------------------------------------------------------------------------------- restore
def _saved_state(config: DataConfig, steps: int) -> dict:
    with config.build(_mesh()) as loader:
        it = iter(loader)
        for _ in range(steps):
            next(it)
        state = it.state()
        it.close()
    return state


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda c: replace(c, seq_len=8), ["DataConfig.seq_len is 8", "saved with 16"]),
        (
            lambda c: replace(c, view=replace(c.view, packing="greedy")),
            ["DataConfig.view.packing is 'greedy'", "saved with 'best_fit'"],
        ),
        (
            lambda c: replace(c, view=replace(c.view, seed=1)),
            ["DataConfig.view.seed is 1", "saved with None"],
        ),
        (
            lambda c: replace(c, view=replace(c.view, max_segments=2)),
            ["DataConfig.view.max_segments is 2", "saved with None"],
        ),
        (
            lambda c: replace(c, mixture=replace(c.mixture, seed=6)),
            ["mixture's seed is 6", "saved run's was 5"],
        ),
        (
            lambda c: replace(
                c,
                stages=[
                    StageConfig(0, {"code": 1, "prose": 3}),
                    StageConfig(2, {"code": 1, "prose": 1}),
                ],
            ),
            ["stage at step 2 starts before step 3", "saved run had 1 stage(s) before it"],
        ),  # fmt: skip
    ],
    ids=[
        "seq_len",
        "packing",
        "pack seed",
        "segment cap",
        "mixture seed",
        "a stage added to the past",
    ],
)
def test_restore_refuses_what_decides_the_rows_already_trained_on(stores, change, words):
    config = _config(stores, stages=True)
    state = _saved_state(config, 3)
    with pytest.raises(ValueError) as info:
        change(config).restore(state, _mesh())
    message = " ".join(str(info.value).split())
    assert all(w in message for w in words), message


def test_restore_accepts_a_new_batch_size_later_stages_and_eval_sets(stores):
    """Saved at step 2 (offset 16), resumed with batches of 16 and the second stage moved from
    step 4 to step 5 with other weights: step 5 starts at offset 16 + 3 * 16 = 64."""
    config = _config(stores, stages=True)
    state = _saved_state(config, 2)
    later = [StageConfig(0, {"code": 1, "prose": 3}), StageConfig(5, {"code": 3, "prose": 1})]
    resumed = replace(
        config, order=OrderOptions(global_batch_size=16), stages=later, eval={}, eval_batch_size=2
    )
    stages = [(0, {"code": 1, "prose": 3}), (64, {"code": 3, "prose": 1})]
    tables = {n: _oracle_rows(n, "packed") for n in ("code", "prose")}
    lengths = [len(tables[n]["input_ids"]) for n in ("code", "prose")]
    source, row = OracleMixture(["code", "prose"], lengths, stages, BLOCK, seed=5).sequence(112)
    names = ("code", "prose")
    with resumed.restore(state, _mesh()) as loader:
        it = iter(loader)
        for step in range(2, 8):
            offsets = range(16 + (step - 2) * 16, 16 + (step - 1) * 16)
            want = {
                k: np.stack([tables[names[source[g]]][k][row[g]] for g in offsets])
                for k in tables["code"]
            }
            assert_batch_exact(next(it), {**want, "mask": np.ones(16, bool)})
        it.close()


def test_a_past_stage_keeps_its_offset_across_batch_size_changes(stores):
    """Stage 1 starts at step 4. Saved at step 2 (batch 8: offset 16), resumed with batch 16:
    step 4 is offset 16 + 2 * 16 = 48. Saved again at step 6 (offset 80), resumed with batch 8:
    step 4 lies in the past, at the offset the run gave it (48), not 4 * 8 = 32."""
    config = _config(stores, stages=True)
    first = _saved_state(config, 2)
    sixteen = replace(config, order=OrderOptions(global_batch_size=16))
    with sixteen.restore(first, _mesh()) as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
        second = it.state()
        it.close()
    assert second["source"]["definition"]["stages"][1][0] == 48
    with config.restore(second, _mesh()) as loader:
        assert loader.step_info(6).offset == 80
        assert loader.source.plan.record()["stages"] == second["source"]["definition"]["stages"]


@pytest.mark.parametrize(
    "second",
    [
        StageConfig(weights={"code": 1, "prose": 1}, offset=48),
        StageConfig(weights={"code": 1, "prose": 1}, tokens=48 * SEQ_LEN),
    ],
    ids=["offset", "tokens"],
)
def test_a_stage_by_offset_or_tokens_stays_where_it_was_put(stores, caplog, second):
    """Stage 1 at offset 48 (step 6 with batches of 8). Saved at step 2 (offset 16), resumed
    with batches of 16: a stage at step 6 would move to offset 16 + 4 * 16 = 80; at offset 48
    (or its tokens) it stays there, step 4 now, and the resume log says so."""
    first = StageConfig(0, {"code": 1, "prose": 3})
    config = replace(_config(stores, stages=True), stages=[first, second])
    with config.build(_mesh()) as loader:
        assert [start for start, _ in loader.source.plan.stages] == [0, 48]
    state = _saved_state(config, 2)
    sixteen = replace(config, order=OrderOptions(global_batch_size=16))
    with caplog.at_level("INFO", logger="psdp"), sixteen.restore(state, _mesh()) as loader:
        assert [start for start, _ in loader.source.plan.stages] == [0, 48]
        assert loader.step_info(4).offset == 48
    logged = [r.getMessage() for r in caplog.records if "DataConfig.stages" in r.getMessage()]
    assert logged == [
        "DataConfig.stages[0] (at step 0) starts at sample offset 0 (before the resume)",
        f"DataConfig.stages[1] (at {second.where}) starts at sample offset 48 (step 4)",
    ]
    by_step = replace(sixteen, stages=[first, StageConfig(6, {"code": 1, "prose": 1})])
    with by_step.restore(state, _mesh()) as loader:
        assert [start for start, _ in loader.source.plan.stages] == [0, 80]


def test_the_resume_log_says_a_stage_lands_inside_a_step(stores, caplog):
    """Resumed at offset 16 with batches of 12, the stage at offset 48 falls inside step 4
    (offsets 40 to 51): the log says so, not "step 5" (the first step after it)."""
    first = StageConfig(0, {"code": 1, "prose": 3})
    config = replace(
        _config(stores, stages=True), stages=[first, StageConfig(offset=48, weights={"code": 1})]
    )
    state = _saved_state(config, 2)
    twelve = replace(config, order=OrderOptions(global_batch_size=12))
    with caplog.at_level("INFO", logger="psdp"), twelve.restore(state, _mesh()):
        pass
    logged = [r.getMessage() for r in caplog.records if "DataConfig.stages[1]" in r.getMessage()]
    assert logged == [
        "DataConfig.stages[1] (at offset 48) starts at sample offset 48 (inside step 4, offsets "
        "40 to 51)"
    ]


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([{"step": 0, "offset": 0, "weights": {"code": 1}}],
         "StageConfig sets step=0 and offset=0; a stage starts at one of step, offset or tokens"),
        ([{"weights": {"code": 1}}, {"tokens": 40, "weights": {"prose": 1}}],
         "the stage at tokens 40 needs a whole number of rows of seq_len=16"),
        ([{"weights": {"code": 1}}, {"offset": 40, "weights": {"prose": 1}}],
         "the stage at offset 40 starts at sample offset 40, which is not a multiple of "
         "mixture.block_size=16"),
        ([{"weights": {"code": 1}}, {"step": 8, "weights": {"prose": 1}},
          {"offset": 32, "weights": {"code": 1}}],
         "the stage at offset 32 starts at sample offset 32, not after the stage before it "
         "(at step 8, offset 64)"),
    ],
)  # fmt: skip
def test_a_stage_start_that_cannot_be_is_refused(stores, stages, message):
    with pytest.raises(ValueError) as caught:
        config = replace(_config(stores, stages=True), stages=stages)
        config.train_source()
    assert message in str(caught.value)


# ------------------------------------------------------------------------------- stores
def test_a_missing_store_names_the_prepare_command(stores, tmp_path):
    missing = str(tmp_path / "web")
    config = replace(
        _config(stores),
        sources={"web": SourceConfig(store=missing, inputs=["web/*.jsonl"], tokenizer="tok.json")},
    )
    with pytest.raises(FileNotFoundError) as info:
        config.build(_mesh())
    assert str(info.value) == (
        f"source 'web': there is no document store at {missing!r}; make it with `psdp prepare "
        f"'web/*.jsonl' --output {missing} --tokenizer tok.json` (or psdp.write_documents)"
    )


def test_an_unfinished_prepared_store_names_the_prepare_command(stores, tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "psdp.json").write_text(
        json.dumps({"format": "psdp.document_parts", "complete": False})
    )
    config = replace(_config(stores), eval={"web": SourceConfig(store=str(tmp_path / "web"))})
    with pytest.raises(ValueError, match="eval set 'web': the store .* is unfinished") as info:
        config.eval_loaders(_mesh())
    assert str(info.value).endswith(
        f"finish it with `psdp prepare <text files> --output {tmp_path / 'web'} --tokenizer "
        "<tokenizer.json>`"
    )


# ------------------------------------------------------------------------ prepared stores
def _prepared(tmp_path: Path, texts: dict[str, list[str]]) -> SourceConfig:
    """A store ``psdp prepare`` made from jsonl files of ``texts`` (file name -> texts) with a
    word-level tokenizer, and the source config that says so."""
    prepare = pytest.importorskip("psdp.prepare", reason="psdp prepare is not in this psdp")
    tokenizers = pytest.importorskip("tokenizers", reason="pip install 'psdp[prepare]'")
    vocab = {"[unk]": 0, "hello": 1, "world": 2, "</s>": 3}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "[unk]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "raw").mkdir()
    for name, lines in texts.items():
        (tmp_path / "raw" / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    inputs, store = [str(tmp_path / "raw" / "*.jsonl")], str(tmp_path / "store")
    tokenizer = str(tmp_path / "tokenizer.json")
    prepare.prepare(inputs, store, tokenizer=tokenizer, eos="</s>", workers=1, progress=False)
    return SourceConfig(store=store, inputs=inputs, tokenizer=tokenizer, eos="</s>")


TEXTS = {"a.jsonl": ["hello world"] * 40, "b.jsonl": ["world hello hello"] * 30}


def _stale(tmp_path: Path, change) -> str:
    source = _prepared(tmp_path, TEXTS)
    config = DataConfig(
        sources={"web": source}, seq_len=4, order=OrderOptions(global_batch_size=BATCH)
    )
    with config.build(_mesh()) as loader:  # as prepared: not stale
        assert np.asarray(loader.batch_at(0)["input_ids"]).shape == (BATCH, 4)
    changed = change(tmp_path, source)
    with pytest.raises(ValueError) as info:
        replace(config, sources={"web": changed}).build(_mesh())
    message = str(info.value)
    assert message.startswith(f"source 'web': the store {source.store!r} is stale: ")
    assert "delete it and make it again with `psdp prepare " in message
    assert message.endswith(
        f"--output {source.store} --tokenizer {tmp_path}/tokenizer.json --eos "
        + ("'</s>'`" if changed.eos == "</s>" else f"{changed.eos}`")  # the config's eos, quoted
    )
    return message


def _add_input(tmp_path, source):
    (tmp_path / "raw" / "c.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    return source


def _change_input(tmp_path, source):
    with open(tmp_path / "raw" / "a.jsonl", "a") as f:
        f.write(json.dumps({"text": "world"}) + "\n")
    return source


def _name_fewer_inputs(tmp_path, source):
    return replace(source, inputs=[str(tmp_path / "raw" / "a.jsonl")])


def _other_tokenizer(tmp_path, source):
    text = (tmp_path / "tokenizer.json").read_text().replace('"world": 2', '"world": 4')
    (tmp_path / "tokenizer.json").write_text(text)
    return source


def _other_eos(tmp_path, source):
    return replace(source, eos="hello")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_add_input, "the input {raw}/c.jsonl is not in it"),
        (_change_input, "the input {raw}/a.jsonl changed since it was prepared"),
        (_name_fewer_inputs, "it holds inputs the config does not name ({raw}/b.jsonl)"),
        (_other_tokenizer, "it was made with another tokenizer than '{tmp}/tokenizer.json'"),
        (_other_eos, "its eos id is 3, but eos='hello' is id 1"),
    ],
    ids=["an input added", "an input changed", "an input left out", "tokenizer", "eos"],
)
def test_a_stale_prepared_store_is_refused_naming_the_difference(tmp_path, change, why):
    message = _stale(tmp_path, change)
    assert why.format(raw=tmp_path / "raw", tmp=tmp_path) in message


# ------------------------------------------------------------------ saved forms and weights
def _listed(stores, order: tuple[str, ...], weights: dict[str, object], block=BLOCK) -> str:
    """The YAML of `_yaml` (best-fit packing) with the sources listed in ``order``, weights as
    written and blocks of ``block``."""
    lines = [f"  {n}: {{store: {stores[n]}, weight: {weights[n]}}}" for n in order]
    rest = _yaml(stores, "{packing: best_fit}").split("seq_len:", 1)[1]
    rest = rest.replace(f"block_size: {BLOCK},", f"block_size: {block},")
    return "sources:\n" + "\n".join(lines) + "\nseq_len:" + rest


def _batches(config: DataConfig, steps: int = 6) -> list[dict]:
    with config.build(_mesh()) as loader:
        return [loader.batch_at(step) for step in range(steps)]


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key in want:
        assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), key


def test_every_saved_form_builds_the_identical_loader(stores):
    """Sources listed prose-first, then saved and loaded by every documented route (draccus
    dump/load, which sorts the keys; to_dict/from_dict through JSON; YAML in either order):
    each builds the oracle's batches, whose slots follow the sorted names (code, prose)."""
    text = _listed(stores, ("prose", "code"), {"code": 1, "prose": 3})
    listed = draccus.load(DataConfig, io.StringIO(text))
    assert list(listed.sources) == ["prose", "code"]
    trainer = TrainerConfig(data=listed)
    routes = {
        "yaml": listed,
        "yaml sorted": draccus.load(
            DataConfig, io.StringIO(_listed(stores, ("code", "prose"), {"code": 1, "prose": 3}))
        ),
        "draccus": draccus.load(TrainerConfig, io.StringIO(draccus.dump(trainer))).data,
        "dict": DataConfig.from_dict(json.loads(json.dumps(listed.to_dict()))),
    }
    want = [_oracle_step("packed", s, [(0, {"code": 1, "prose": 3})]) for s in range(6)]
    for route, config in routes.items():
        for step, (got, expected) in enumerate(zip(_batches(config), want, strict=True)):
            try:
                assert_batch_exact(got, expected)
            except AssertionError as error:
                raise AssertionError(f"{route}, step {step}") from error


def test_a_state_keeps_its_sources_order_across_a_restore(stores):
    """A state saved while the slots followed the listed order (the previous release: prose
    first) resumes in that order; one saved from a config listed the other way resumes too."""
    config = draccus.load(
        DataConfig, io.StringIO(_listed(stores, ("prose", "code"), {"code": 1, "prose": 3}))
    )
    old = config.train_source(names=["prose", "code"])  # as the previous release built it
    with config._loader_config().build(_mesh(), source=old) as loader:
        state = loader.iter_from(3).state()
        want = [{k: np.asarray(v) for k, v in loader.batch_at(s).items()} for s in range(3, 6)]
    assert [n for n, _ in state["source"]["definition"]["sources"]] == ["prose", "code"]
    with config.restore(state, _mesh()) as resumed:
        for step, expected in zip(range(3, 6), want, strict=True):
            _assert_same(resumed.batch_at(step), expected)
    state = _saved_state(config, 3)
    reordered = replace(config, sources=dict(sorted(config.sources.items())))
    with reordered.restore(state, _mesh()) as resumed:
        _assert_same(resumed.batch_at(3), _batches(config, 4)[3])


@pytest.mark.parametrize(
    "weights", [{"code": 0.3, "prose": 0.1}, {"code": 0.6, "prose": 0.2}, {"code": 3, "prose": 1}]
)
def test_proportional_weights_build_the_same_loader(stores, weights):
    """0.3 : 0.1 is 3 : 1 exactly (the weights as written, not their binary floats): a block of
    10 holds 7.5 : 2.5, a tie the earlier source wins, 8 : 2, for every proportional spelling
    (binary floats made it 7 : 3). The batches equal the oracle's for weights 3 and 1."""
    config = draccus.load(
        DataConfig, io.StringIO(_listed(stores, ("code", "prose"), weights, block=10))
    )
    with config.build(_mesh()) as loader:
        assert loader.source.counts(0, 10) == {"code": 8, "prose": 2}
    want = [_oracle_step("packed", s, [(0, {"code": 3, "prose": 1})], block=10) for s in range(6)]
    for got, expected in zip(_batches(config), want, strict=True):
        assert_batch_exact(got, expected)


def test_a_source_flag_over_a_yaml_changes_one_field(tmp_path):
    """docs/guides/trainer.md: a source is reached by the dict's path with a dict value, merged into
    the YAML's: ``--data.sources "{code: {store: X}}"`` changes code's store only."""
    path = tmp_path / "train.yaml"
    path.write_text(draccus.dump(TrainerConfig(data=FULL)))
    flags = ["--data.sources", "{code: {store: tokens/code2}}"]
    parsed = draccus.parse(TrainerConfig, config_path=str(path), args=flags)
    code = replace(FULL.sources["code"], store="tokens/code2")
    assert parsed.data == replace(FULL, sources={**FULL.sources, "code": code})
    with pytest.raises(SystemExit):  # the spelling draccus has no flag for, as the docs say
        draccus.parse(TrainerConfig, config_path=str(path), args=["--data.sources.code.store", "x"])


def test_a_restore_with_added_or_removed_sources_names_them(stores):
    """A resume with another set of sources is refused saying which were added and removed."""
    config = _config(stores)
    state = _saved_state(config, 3)
    fewer = replace(config, sources={"code": config.sources["code"]})
    with pytest.raises(ValueError, match=r"removed \['prose'\]\): now \[\['code', \d+\]\]"):
        fewer.restore(state, _mesh())
    more = replace(
        config, sources={**config.sources, "more": SourceConfig(store=stores["held_out"])}
    )
    with pytest.raises(ValueError, match=r"added \['more'\]\): now \[\['code'"):
        more.restore(state, _mesh())


def test_a_stage_inserted_before_the_resume_step_is_refused_with_a_new_batch_size(stores):
    """Saved at step 2 (offset 16); resumed with batches of 16 and a stage inserted at step 1,
    which the saved run never had: under the new batch size step 1 would fall on offset 16, the
    resume offset, where a mixture may start a stage; it lies before the resume step, so it is
    refused, not moved there."""
    config = _config(stores, stages=True)
    state = _saved_state(config, 2)
    inserted = [
        StageConfig(0, {"code": 1, "prose": 3}),
        StageConfig(1, {"code": 3, "prose": 1}),
        StageConfig(4, {"code": 1, "prose": 1}),
    ]
    resumed = replace(config, order=OrderOptions(global_batch_size=16), stages=inserted)
    with pytest.raises(ValueError) as info:
        resumed.restore(state, _mesh())
    message = " ".join(str(info.value).split())
    assert "the stage at step 1 starts before step 2" in message, message


def test_a_restore_may_change_the_stage_that_starts_at_the_resume_step(stores):
    """Saved at step 4 (offset 32), where the second stage starts: its weights may change (no
    sample of it was read), and the batches from step 4 on follow the new weights (oracle)."""
    config = _config(stores, stages=True)
    state = _saved_state(config, 4)
    assert state["offset"] == 32
    changed = [StageConfig(0, {"code": 1, "prose": 3}), StageConfig(4, {"code": 3, "prose": 1})]
    weights = [(0, {"code": 1, "prose": 3}), (32, {"code": 3, "prose": 1})]
    with replace(config, stages=changed).restore(state, _mesh()) as loader:
        it = iter(loader)
        for step in range(4, 7):
            assert_batch_exact(next(it), _oracle_step("packed", step, weights))
        it.close()


@pytest.mark.parametrize(("eval_batch", "batch"), [(4, 8), (8, 4), (None, 4)])
def test_eval_batches_are_eval_batch_size_else_the_train_batch(stores, eval_batch, batch):
    """``eval_batch_size`` decides the eval batches even when ``order.global_batch_size`` is set
    (unset: the train batch size); the rows in source order, each once, as the oracle's."""
    config = replace(
        _config(stores),
        eval={"code": SourceConfig(store=stores["code"])},  # more rows than the held-out set
        eval_batch_size=eval_batch,
        order=OrderOptions(global_batch_size=batch),
    )
    rows = _oracle_rows("code", "packed")
    size = eval_batch or batch
    assert len(rows["input_ids"]) > 8  # several batches of either size
    expected = eval_batches(rows, size, batch_shards=4)
    with config.eval_loaders(_mesh())["code"] as loader:
        assert len(loader) == -(-len(rows["input_ids"]) // size)
        batches = list(loader)
    assert len(batches) == len(expected)
    for got, want in zip(batches, expected, strict=True):
        assert_batch_exact(got, want)


def _run_advised(command: str) -> None:
    """Runs the ``psdp prepare ...`` an error advised, as a user pastes it into a shell."""
    import shlex
    import subprocess
    import sys

    words = shlex.split(command)
    assert words[:2] == ["psdp", "prepare"], command
    done = subprocess.run(
        [sys.executable, "-m", "psdp", *words[1:], "--workers", "1", "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (command, done.stderr[-2000:])


def test_the_command_advised_for_a_missing_chat_store_makes_the_store_the_config_opens(tmp_path):
    """A source that says how psdp prepare makes it (messages, field, skip_bad, rows_per_part):
    the missing store's error names a command carrying them; run as given, it makes the store,
    which the config then opens (not stale) with the template's ids (the tokenizer's oracle)."""
    pytest.importorskip("transformers", reason="pip install 'psdp[chat]'")
    from tokenizers import Tokenizer

    from tests import prepare_corpus
    from tests.chat_tokenizer import conversations, rendered, save_chat_tokenizer

    chat_dir = save_chat_tokenizer(tmp_path / "tok")
    chats = conversations(30, seed=4)
    prepare_corpus.write_jsonl(tmp_path / "chats.jsonl", chats, field="conversation")
    with open(tmp_path / "chats.jsonl", "a") as f:
        f.write("{not json\n")  # a malformed record: only --skip-bad gets past it
    source = SourceConfig(
        store=str(tmp_path / "chat store"), inputs=[str(tmp_path / "chats.jsonl")],
        tokenizer=str(chat_dir), messages="conversation", skip_bad=True,
        rows_per_part=7,
    )  # fmt: skip
    config = DataConfig(
        sources={"chat": source}, seq_len=8, order=OrderOptions(global_batch_size=BATCH)
    )
    with pytest.raises(FileNotFoundError) as info:
        config.build(_mesh())
    command = str(info.value).split("make it with `")[1].split("`")[0]
    assert command == source.prepare_command()
    assert "--messages conversation" in command and "--skip-bad" in command, command
    assert "--rows-per-part 7" in command, command
    _run_advised(command)
    store = source.open("source 'chat'")  # not stale: made as the config says
    direct = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
    want = [direct.encode(rendered(c), add_special_tokens=False).ids for c in chats]
    offsets = store.offsets_range(0, len(store) + 1)
    got = store.read_ranges([0], [store.num_tokens])["input_ids"].tolist()
    assert [got[a:b] for a, b in itertools.pairwise(offsets)] == want
    assert list(store.leaves) == ["input_ids", "loss_mask"]
    with config.build(_mesh()) as loader:
        assert np.asarray(loader.batch_at(0)["input_ids"]).shape == (BATCH, 8)
    as_text = replace(source, messages=None, field="conversation")
    with pytest.raises(ValueError, match="it was made from messages 'conversation' of each"):
        as_text.open("source 'chat'")


def test_a_config_eos_of_digits_is_the_id_the_cli_recorded(tmp_path):
    """``eos: "2"`` in a config is what ``psdp prepare --eos 2`` means, id 2 (the command the
    config advises carries it so): the store made so opens, as does ``eos: world`` (the token
    of id 2); ``eos: "3"`` is another id, refused as stale."""
    source = _prepared(tmp_path, TEXTS)  # a word-level vocabulary: world = 2, </s> = 3
    made = replace(source, store=str(tmp_path / "by id"), eos="2")
    assert made.prepare_command().endswith("--eos 2")
    _run_advised(made.prepare_command())
    store = made.open("source 'web'")
    ends = store.offsets_range(0, len(store) + 1)
    first = store.read_ranges([ends[0]], [ends[1]])["input_ids"].tolist()
    assert first == [1, 2, 2]  # "hello world" and the EOS id 2
    assert replace(made, eos="world").open("source 'web'").num_documents == len(store)
    with pytest.raises(ValueError, match=r"its eos id is 2, but eos='3' is id 3"):
        replace(made, eos="3").open("source 'web'")
    as_int = DataConfig.from_dict(  # an int in Python is the id too (docs/guides/prepare.md)
        {"sources": {"web": {**asdict(made), "eos": 2}}, "seq_len": 4}
    ).sources["web"]
    assert as_int == made and as_int.open("source 'web'").num_documents == len(store)


@pytest.mark.parametrize("view", ["{eos_id: 0}", "{packing: best_fit}"])
def test_the_source_leaf_names_each_rows_source_for_a_loss_by_source(stores, view):
    """``mixture: {source_leaf: source}``: every real row's leaf is its source's position in
    ``loader.source.names``; the stores' token bases tell the sources apart (the oracle)."""
    yaml = _yaml(stores, view).replace("seed: 5}", "seed: 5, source_leaf: source}")
    config = draccus.load(DataConfig, io.StringIO(yaml))
    assert DataConfig.from_dict(config.to_dict()) == config
    with config.build(_mesh()) as loader:
        names = list(loader.source.names)
        assert sorted(names) == ["code", "prose"]
        seen = set()
        for step in range(10):
            batch = {k: np.asarray(v) for k, v in loader.batch_at(step).items()}
            assert batch["source"].dtype == np.int32 and batch["source"].shape == (BATCH,)
            rows = zip(batch["input_ids"], batch["source"], batch["mask"], strict=True)
            for row, source, real in rows:
                assert real
                tokens = row[row > 0]  # 0: EOS or padding
                want = "prose" if tokens.min() >= BASE["prose"] else "code"
                assert tokens.max() < BASE["prose"] or want == "prose"
                assert names[source] == want
                seen.add(want)
        assert seen == {"code", "prose"}


@pytest.mark.parametrize(
    ("view", "leaves", "width"),
    [
        (
            "{eos_id: 0, targets: true}",
            {"input_ids", "segment_ids", "positions", "mask"},
            SEQ_LEN + 1,
        ),
        (
            "{packing: best_fit, targets: true}",
            {"input_ids", "targets", "loss_mask", "segment_ids", "positions", "mask"},
            SEQ_LEN,
        ),
    ],  # fmt: skip
    ids=["concatenation", "packing"],
)
def test_targets_true_gives_the_documented_leaves_of_each_view(stores, view, leaves, width):
    """docs/guides/trainer.md: concatenation gives input_ids one token wider (targets: row[:, 1:]);
    packing gives targets and loss_mask beside seq_len-wide input_ids: each target is the next
    token of the same segment where loss_mask is 1."""
    config = _config(stores, view)
    with config.build(_mesh()) as loader:
        batch = {k: np.asarray(v) for k, v in loader.batch_at(0).items()}
    assert set(batch) == leaves
    assert batch["input_ids"].shape == (BATCH, width)
    if "targets" in batch:
        ids, seg, mask = batch["input_ids"], batch["segment_ids"], batch["loss_mask"]
        same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
        assert np.array_equal(mask[:, :-1].astype(bool), same) and not mask[:, -1].any()
        assert np.array_equal(batch["targets"][:, :-1][same], ids[:, 1:][same])


def test_a_state_restores_under_proportional_stage_weights(stores):
    """Stage weights written as other proportional numbers (0.1 : 0.3 for 1 : 3) mix alike, so a
    restore takes them; a stage that really changed before the resume offset is still refused."""
    config = _config(stores, stages=True)
    state = _saved_state(config, 5)
    scaled = [replace(s, weights={n: w / 10 for n, w in s.weights.items()}) for s in config.stages]
    with replace(config, stages=scaled).restore(state, _mesh()) as loader:
        _assert_same(loader.batch_at(5), _batches(config, 6)[5])
    other = [replace(scaled[0], weights={"code": 0.1, "prose": 0.4}), *scaled[1:]]
    with pytest.raises(ValueError, match="mixture stage 0 differs"):
        replace(config, stages=other).restore(state, _mesh())


# ------------------------------------------------------------------------ unshuffled sources
def _unshuffled(stores, view: str, sources=("code",)) -> DataConfig:
    listed = "\n".join(f"  {n}: {{store: {stores[n]}, weight: {1 + 2 * i}}}"
                       for i, n in enumerate(sources))  # fmt: skip
    text = f"""
sources:
{listed}
seq_len: {SEQ_LEN}
view: {VIEWS[view]}
mixture: {{block_size: {BLOCK}, seed: 5, shuffle: false}}
order: {{global_batch_size: {BATCH}}}
"""
    return draccus.load(DataConfig, io.StringIO(text))


def _in_store_order(view: str, step: int) -> dict[str, np.ndarray]:
    """Step ``step`` of one source read in store order: rows ``step * BATCH ...`` modulo the
    store's rows (an epoch repeats in the same order), by the view's oracle."""
    rows = _oracle_rows("code", view)
    ids = (step * BATCH + np.arange(BATCH)) % len(rows["input_ids"])
    return {**{k: v[ids] for k, v in rows.items()}, "mask": np.ones(BATCH, bool)}


@pytest.mark.parametrize("view", ["packed", "concatenated"])
def test_an_unshuffled_source_is_read_in_store_order_every_epoch_on_every_shard(stores, view):
    config = _unshuffled(stores, view)
    rows = len(_oracle_rows("code", view)["input_ids"])
    steps = 3 * rows // BATCH + 1  # three epochs and more, an epoch not a whole number of steps
    with config.build(_mesh()) as loader:
        for step in range(steps):
            assert_batch_exact(loader.batch_at(step), _in_store_order(view, step))


def test_unshuffled_sources_are_each_in_store_order_between_the_mixtures_blocks(stores):
    config = _unshuffled(stores, "concatenated", ("code", "prose"))
    tables = {n: _oracle_rows(n, "concatenated") for n in ("code", "prose")}
    lengths = [len(tables[n]["input_ids"]) for n in ("code", "prose")]
    oracle = OracleMixture(["code", "prose"], lengths, [(0, {"code": 1, "prose": 3})], BLOCK,
                           seed=5, shuffle=False)  # fmt: skip
    source, row = oracle.sequence(6 * BATCH)
    for k in range(2):  # each source's rows come in store order, epoch after epoch
        assert row[source == k].tolist() == [i % lengths[k] for i in range((source == k).sum())]
    with config.build(_mesh()) as loader:
        for step in range(6):
            g = range(step * BATCH, (step + 1) * BATCH)
            want = {key: np.stack([tables[("code", "prose")[source[i]]][key][row[i]] for i in g])
                    for key in tables["code"]}  # fmt: skip
            assert_batch_exact(loader.batch_at(step), {**want, "mask": np.ones(BATCH, bool)})


def test_an_unshuffled_source_is_sharded_exactly_per_host(stores):
    from tests.fake_hosts import fake_pod, host_batch

    config = _unshuffled(stores, "packed")
    mesh = _mesh()
    layout = np.repeat([0, 1], 4).reshape(4, 2)  # data rows 0-1 on host 0, 2-3 on host 1
    with fake_pod(mesh, layout) as process_of:
        for host in (0, 1):
            loader = DataLoader(config.train_source(), mesh=mesh, global_batch_size=BATCH,
                                process_index=host)  # fmt: skip
            with loader:
                for step in (0, 1, 5):
                    want = _in_store_order("packed", step)
                    got = host_batch(loader, step, process_of)
                    for key, shards in got.items():
                        boxes = shards.sharding.devices_indices_map(shards.shape)
                        assert {process_of[d] for d in shards.shards} == {host}
                        assert len(shards.shards) == 4
                        for device, value in shards.shards.items():
                            np.testing.assert_array_equal(value, want[key][boxes[device]])


def test_an_unshuffled_run_resumes_exactly_and_refuses_a_shuffled_restore(stores):
    config = _unshuffled(stores, "concatenated")
    state = _saved_state(config, 3)
    with config.restore(state, _mesh()) as loader:
        it = iter(loader)
        for step in range(3, 7):
            assert_batch_exact(next(it), _in_store_order("concatenated", step))
        it.close()
    shuffled = replace(config, mixture=replace(config.mixture, shuffle=True))
    with pytest.raises(ValueError, match="the mixture's shuffle is True, but the saved run's was "
                       "False; every sample depends on it"):  # fmt: skip
        shuffled.restore(state, _mesh())
