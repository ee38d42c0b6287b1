"""examples/train_lm on real local pods: killed on 4 processes, resumed on 2 with another batch
size, against an uninterrupted run with the same batch-size schedule.

"Equal" with a new batch size: the resumed run (the killed run's steps before its checkpoint,
then the resumed run's) and the uninterrupted run (global batch 16 for steps 0-3, then 8: the
schedule the resume gave) deliver the same rows at every sample offset, in the same steps, and
their losses per step (and eval losses) agree to float tolerance (the pods' meshes differ, so
the sums run in another order). The oracles: the uninterrupted run, the prepared stores' arrays
read with TensorStore into numpy, the tokenizer on the input text, and the mixture's documented
rule (every block of 8 samples holds its stage's counts exactly).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.multiprocess

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_lm"
EOS_ID = 0  # the example's tokenizer: <|endoftext|> is its first special token


def load(name: str):
    """The example's module ``name`` (``run``, ``model``), imported from its file."""
    spec = importlib.util.spec_from_file_location(f"train_lm_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def records(path: Path) -> tuple[list[dict], dict[int, dict]]:
    """Process 0's log: the step records in order, and the eval rounds by step."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if "step" in r], {
        r["eval_after"]: r for r in lines if "eval_after" in r
    }


def rows_by_offset(steps: list[dict]) -> dict[int, tuple[list[int], list]]:
    return {
        r["offset"] + i: (tokens, provenance)
        for r in steps
        for i, (tokens, provenance) in enumerate(zip(r["input_ids"], r["provenance"], strict=True))
    }


@pytest.mark.timeout(600)
def test_the_example_resumes_on_half_the_hosts_as_an_uninterrupted_run(tmp_path):
    run = load("run")
    run.prepare(tmp_path)
    resumed = run.killed_then_resumed(tmp_path, echo=None)
    steps, evals = records(tmp_path / "steps.jsonl")
    killed = [r for r in steps if r["processes"] == 4]
    after = [r for r in steps if r["processes"] == 2]
    assert [r["step"] for r in killed] == list(range(7))  # killed after step 6
    assert [r["step"] for r in after] == list(range(4, 16))  # resumed at the checkpoint (4)
    assert [r["rows"] for r in killed + after] == [16] * 7 + [8] * 12
    assert {int(s) for s in resumed[0]["losses"]} == set(range(4, 16))
    # every host checked every step's batch, every leaf, against the example's own oracle
    assert all(r["checked"] == list(range(4, 16)) for r in resumed)

    run.train(tmp_path, 2, 2, ["--data.order.global_batch_size", "[[0, 16], [4, 8]]",
                               "--checkpoints", "checkpoints-uninterrupted",
                               "--log", "uninterrupted.jsonl"], echo=None)  # fmt: skip
    whole, whole_evals = records(tmp_path / "uninterrupted.jsonl")
    trained = killed[:4] + after  # what the resumed model learnt from: steps 0-3, then 4-15
    assert [r["step"] for r in whole] == list(range(16))
    for mine, theirs in zip(trained, whole, strict=True):
        assert (mine["step"], mine["offset"], mine["rows"]) == (
            theirs["step"], theirs["offset"], theirs["rows"])  # fmt: skip
        assert mine["input_ids"] == theirs["input_ids"], mine["step"]
    np.testing.assert_allclose([r["loss"] for r in trained], [r["loss"] for r in whole], rtol=2e-5)
    assert sorted(evals) == sorted(whole_evals) == [7, 15]
    for step in (7, 15):
        np.testing.assert_allclose(
            evals[step]["held_out"], whole_evals[step]["held_out"], rtol=2e-5
        )
    assert whole[-1]["loss"] < whole[0]["loss"] - 1  # it learns
    # the loss per source (the rows' source tag): one per source the step's rows come from, and
    # the step's loss (their token-weighted mean) between them; equal across the two runs
    for mine, theirs in zip(trained, whole, strict=True):
        by_source = mine["loss_by_source"]
        assert set(by_source) == {seg[0] for row in mine["provenance"] for seg in row}
        assert min(by_source.values()) - 1e-5 <= mine["loss"] <= max(by_source.values()) + 1e-5
        assert by_source.keys() == theirs["loss_by_source"].keys()
        np.testing.assert_allclose(list(by_source.values()),
                                   list(theirs["loss_by_source"].values()), rtol=2e-5)  # fmt: skip

    # the lost steps 4-6 (batch 16) delivered the rows the resume delivered again (batch 8)
    delivered, uninterrupted = rows_by_offset(killed), rows_by_offset(whole)
    assert sorted(delivered) == list(range(7 * 16))
    assert all(delivered[g] == uninterrupted[g] for g in delivered)

    # every block of 8 samples holds its stage's counts: 2 code : 6 prose, 4 : 4 from step 12
    # (offset 128 under the schedule)
    sources = {g: {s[0] for s in uninterrupted[g][1]} for g in uninterrupted}
    assert all(len(names) == 1 for names in sources.values())
    for block in range(0, 160, 8):
        code = sum("code" in sources[g] for g in range(block, block + 8))
        assert code == (2 if block < 128 else 4), block

    # every delivered token is a token of the document its provenance names (the stores read
    # by the example's oracle, which reads the zarr3 arrays with TensorStore, not psdp)
    read = load("batch_oracle").store_documents
    stores = {name: read(tmp_path / "tokens" / name) for name in ("code", "prose")}
    texts = {name: [json.loads(line)["text"] for f in sorted((tmp_path / "raw" / name).glob("*.jsonl"))
                    for line in f.read_text().splitlines()] for name in stores}  # fmt: skip
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    checked = 0
    for tokens, provenance in [*delivered.values(), *uninterrupted.values()]:
        row, covered = np.asarray(tokens), np.zeros(len(tokens), bool)
        for name, doc, start, stop, column in provenance:
            document, length = stores[name][doc], stop - start
            assert document.tolist() == [*tokenizer.encode(texts[name][doc]).ids, EOS_ID]
            assert row[column : column + length].tolist() == document[start:stop].tolist()
            assert not covered[column : column + length].any()  # segments never overlap
            covered[column : column + length] = True
            checked += length
        assert covered.tolist() == sorted(covered.tolist(), reverse=True)  # padding at the end
        assert (row[~covered] == 0).all()  # pad_id
    assert checked > 0.9 * 128 * (len(delivered) + len(uninterrupted))  # packed ~full


def test_the_readme_and_the_trainer_docs_give_the_one_command():
    root = EXAMPLE.parents[1]
    readme, makefile = (root / "README.md").read_text(), (root / "Makefile").read_text()
    assert "make run" in readme and "examples/train_lm/run.py" in readme
    assert "run: $(STAMP)\n\t$(PY) examples/train_lm/run.py\n" in makefile
    trainer = (root / "docs" / "guides" / "trainer.md").read_text()
    assert "## A language model, end to end: `examples/train_lm`" in trainer
    assert "docs/guides/trainer.md#a-language-model-end-to-end-examplestrain_lm" in readme


def test_the_oracle_lays_pieces_out_by_the_packing_rules():
    """batch_oracle.py's docstring example: two rows, a document and a piece of another."""
    import doctest

    results = doctest.testmod(load("batch_oracle"))
    assert results.failed == 0 and results.attempted >= 5


def test_the_example_model_keeps_packed_documents_apart_and_weights_its_loss_by_the_masks():
    """Oracles: each document run by itself (positions from 0), and the loss summed by numpy."""
    import jax.numpy as jnp

    model = load("model")
    net = model.Transformer(model.ModelConfig(vocab_size=32, d_model=16, heads=2), seq_len=8)
    a, b = [3, 4, 5], [7, 8, 9, 10]
    batch = {
        "input_ids": jnp.array([[*a, *b, 0], [*b, *a, 0]]),
        "segment_ids": jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 2, 2, 2, 0]]),
        "positions": jnp.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 0, 1, 2, 0]]),
        "targets": jnp.array([[4, 5, 0, 8, 9, 10, 0, 0], [8, 9, 10, 0, 4, 5, 0, 0]]),
        "loss_mask": jnp.array([[1, 1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1, 0, 0]], jnp.uint8),
        "mask": jnp.array([True, False]),  # the second row pads the batch
    }
    packed = np.asarray(net(batch["input_ids"], batch["segment_ids"], batch["positions"]))
    for doc, columns in ((a, slice(0, 3)), (b, slice(3, 7))):
        alone = net(
            jnp.array([doc]), jnp.ones((1, len(doc)), jnp.int32), jnp.arange(len(doc))[None]
        )
        np.testing.assert_allclose(packed[0, columns], np.asarray(alone)[0], rtol=1e-5, atol=1e-6)
    total, tokens = model.loss_sum(net, batch)
    logits = packed[0].astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = [0, 1, 3, 4, 5]  # row 0's tokens with a target; row 1 is padding
    expected = -sum(log_probs[c, int(batch["targets"][0, c])] for c in real)
    assert float(tokens) == len(real)
    np.testing.assert_allclose(float(total), expected, rtol=1e-5)
