"""Review of psdp's trainer integrations (issue 37): Levanter data sections that Levanter reads
one way and `psdp.levanter.data_config` read another, checked against Levanter's own
`LmDataConfig` (its validation sets, its train set).

Runs in the Levanter venv (`make test-levanter`); elsewhere every test skips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

levanter = pytest.importorskip(
    "levanter", reason="Levanter is not installed here: `make test-levanter` runs these tests"
)

import haliax as hax  # noqa: E402
import jax  # noqa: E402
from levanter.data.text.datasets import DatasetComponent, LmDataConfig  # noqa: E402
from levanter.data.text.formats import SupervisedLmDatasetFormat  # noqa: E402
from levanter.schedule import BatchSchedule  # noqa: E402
from levanter.store.cache import SerialCacheWriter  # noqa: E402

from psdp.levanter import data_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:jax[.].* is deprecated:DeprecationWarning")

SEQ_LEN, VOCAB, EOS = 8, 128, 1
Pos = hax.Axis("position", SEQ_LEN)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 128-id tokenizer saved locally (Levanter loads its caches through one): id 1 is EOS."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tok")
    words = models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0")
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(words), eos_token="t1").save_pretrained(path)
    return str(path)


def _write(path: Path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    docs = [
        {"input_ids": np.append(rng.integers(2, VOCAB, int(n)), EOS).astype(np.int64)}
        for n in rng.integers(3, 20, count)
    ]
    with SerialCacheWriter(str(path), {"input_ids": np.zeros(0, np.int64)}) as writer:
        writer.write_batch(docs)


def _levanter_eval_sets(levanter_data: LmDataConfig) -> set[str]:
    return set(levanter_data.validation_sets(Pos))


def test_a_flat_cache_is_no_eval_set_as_levanter_reads_it(tmp_path, tokenizer) -> None:
    """`flat_cache: true` makes cache_dir the train split itself; Levanter evaluates such a
    component on nothing. psdp read its validation split at the same folder: the train cache,
    so the "eval loss" was a loss on the training rows."""
    _write(tmp_path / "flat", 60, 0)
    levanter_data = LmDataConfig(
        tokenizer=tokenizer,
        cache_dir=None,
        components={"flat": DatasetComponent(cache_dir=str(tmp_path / "flat"), flat_cache=True)},
    )
    config = data_config(levanter_data, seq_len=SEQ_LEN)
    assert config.sources["flat"].store == str(tmp_path / "flat")
    assert set(config.eval) == _levanter_eval_sets(levanter_data) == set()


def test_a_component_never_weighted_needs_no_train_split_and_stays_an_eval_set(
    tmp_path, tokenizer
) -> None:
    """Levanter's eval-only component (train weight 0, a validation split only) trains nothing
    and is evaluated; psdp asked for its train split and told the user to build it."""
    _write(tmp_path / "web" / "train", 60, 0)
    _write(tmp_path / "web" / "validation", 20, 1)
    _write(tmp_path / "heldout" / "validation", 20, 2)
    components = {
        "web": DatasetComponent(cache_dir=str(tmp_path / "web")),
        "heldout": DatasetComponent(cache_dir=str(tmp_path / "heldout")),
    }
    for weights in (
        {"web": 1.0, "heldout": 0.0},
        [(0, {"web": 1.0}), (8, {"web": 2.0, "heldout": 0.0})],
    ):
        levanter_data = LmDataConfig(
            tokenizer=tokenizer, cache_dir=None, components=components, train_weights=weights,
            mixture_block_size=8,
        )  # fmt: skip
        # Levanter's own train set builds without the split
        levanter_data.train_set(Pos, BatchSchedule(4), key=jax.random.PRNGKey(0))
        config = data_config(levanter_data, seq_len=SEQ_LEN, batch_size=4)
        assert set(config.sources) == {"web"}
        assert set(config.eval) == _levanter_eval_sets(levanter_data) == {"web", "heldout"}
        source = config.train_source()
        rows = source.read(np.arange(4))["input_ids"]
        assert rows.shape == (4, SEQ_LEN) and rows.max() < VOCAB


@pytest.mark.parametrize(
    "option, value",
    [
        ("num_validation_sequences", {"web": 16}),  # Levanter holds 16 rows out of training
        ("max_train_batches", {"web": 2}),  # Levanter trains on 2 batches of web only
        ("stop_strategy", "first_exhausted"),  # Levanter's mixture ends
    ],
)
def test_options_that_change_the_training_rows_are_refused_not_ignored(
    tmp_path, tokenizer, option, value
) -> None:
    """Each option makes Levanter train on other rows than the caches' whole train splits;
    psdp read the section without them, so a run fed by psdp trained on Levanter's held-out
    rows (num_validation_sequences) or on more data than asked, and said nothing."""
    _write(tmp_path / "web" / "train", 60, 0)
    levanter_data = LmDataConfig(
        tokenizer=tokenizer, cache_dir=None, **{option: value},
        components={"web": DatasetComponent(cache_dir=str(tmp_path / "web"))},
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"sets {option}: .*drop it|sets {option}: .*use stop"):
        data_config(levanter_data, seq_len=SEQ_LEN)


def test_a_supervised_component_is_refused_not_trained_on_every_token(tmp_path, tokenizer):
    """Levanter weighs a supervised cache's loss by its `loss_weights` leaf (the target only);
    psdp read its input_ids alone and weighed every token, prompts included."""
    component = DatasetComponent(
        cache_dir=str(tmp_path / "sft"), format=SupervisedLmDatasetFormat()
    )
    levanter_data = LmDataConfig(tokenizer=tokenizer, cache_dir=None, components={"sft": component})
    with pytest.raises(ValueError, match=r"'sft' has format SupervisedLmDatasetFormat.*text"):
        data_config(levanter_data, seq_len=SEQ_LEN)


# ------------------------------------------------------- packed rows: segments from the pack
BATCH, STEPS = 4, 6


def _segment_classes(example) -> np.ndarray:
    """Which positions of each row attend to each other by segment: (batch, pos, pos) bools
    (Levanter numbers a pack's segments by document and its padding -1, psdp 1, 2, ... and 0)."""
    segments = example.attn_mask.segment_ids
    segments = np.asarray((segments[0] if isinstance(segments, tuple) else segments).array)
    return segments[:, :, None] == segments[:, None, :]


def _assert_same_examples(ours, theirs) -> None:
    for mine, other in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(np.asarray(mine.tokens.array), np.asarray(other.tokens.array))
        np.testing.assert_array_equal(
            np.asarray(mine.loss_weight.array), np.asarray(other.loss_weight.array)
        )
        np.testing.assert_array_equal(_segment_classes(mine), _segment_classes(other))


def _write_without_eos(path: Path, count: int, seed: int) -> None:
    """Documents of 1..24 ids that end without EOS (Levanter's `enforce_eos: false`, or a
    tokenizer that appends none), EOS nowhere in them."""
    rng = np.random.default_rng(seed)
    docs = [{"input_ids": rng.integers(2, VOCAB, int(n)).astype(np.int64)} for n in
            rng.integers(1, 25, count)]  # fmt: skip
    with SerialCacheWriter(str(path), {"input_ids": np.zeros(0, np.int64)}) as writer:
        writer.write_batch(docs)


def test_packed_rows_of_documents_without_eos_attend_as_levanters_packed_examples(tmp_path):
    """Levanter's packed example takes its segments from the pack, so documents packed side by
    side never attend to each other; psdp took them from EOS, so documents without one (a
    cache built with `enforce_eos: false`) made one segment of the whole row, silently: the
    same tokens and weights, another attention. Checked against Levanter's own loader over
    its own `PackedTokenDataset`, train rows and an eval pass."""
    from types import SimpleNamespace

    from levanter.data.loader import DataLoader as LevanterDataLoader
    from levanter.data.text.datasets import NamedLmDataset, PackedTokenDataset
    from levanter.store.cache import TreeCache

    from psdp.levanter import _eval_rows, _PsdpEvalSet, _TaggedEvalLoader, train_loader
    from tests.meshes import mesh_of

    for split, count in (("train", 120), ("validation", 30)):
        _write_without_eos(tmp_path / "web" / split, count, {"train": 0, "validation": 1}[split])
    mesh = mesh_of(("data",), (4,))
    Pos16 = hax.Axis("position", 16)

    def levanter_examples(split: str, steps: int) -> list:
        cache = TreeCache.load(str(tmp_path / "web" / split), {"input_ids": np.zeros(0, np.int64)})
        rows = NamedLmDataset(PackedTokenDataset(cache, Pos16, max_segments_per_example=4), Pos16)
        loader = LevanterDataLoader(rows, BATCH, mesh=mesh, axis_resources={"batch": "data"})
        return [example for _, example in zip(range(steps), loader, strict=False)]

    component = SimpleNamespace(cache_dir=str(tmp_path / "web"), flat_cache=False, pack=4,
                                format=None, tags=None)  # fmt: skip
    levanter_data = SimpleNamespace(
        cache_dir=None, mixture_block_size=BATCH, shuffle=False, components={"web": component},
        train_weights=None, the_tokenizer=SimpleNamespace(eos_token_id=EOS),
        block_cross_document_attention=True,
    )  # fmt: skip
    trainer = SimpleNamespace(
        device_mesh=mesh, compute_axis_mapping={"batch": "data"},
        config=SimpleNamespace(train_batch_size=BATCH, batch_axis_name="batch"),
    )  # fmt: skip
    with train_loader(levanter_data, trainer, Pos16) as loader:
        ours = [example for _, example in zip(range(STEPS), loader, strict=False)]
    _assert_same_examples(ours, levanter_examples("train", STEPS))

    config = data_config(levanter_data, seq_len=16)
    eval_set = _PsdpEvalSet(levanter_data, str(config.eval["web"].store), Pos16, config.view)
    rows = len(_eval_rows(eval_set))
    tagged = SimpleNamespace(datasets=[(eval_set, ["web"])], num_tags=1, tag_to_index={"web": 0})
    ours = [example for example, _ in _TaggedEvalLoader(tagged, hax.Axis("batch", BATCH), mesh,
                                                        {"batch": "data"})]  # fmt: skip
    whole = rows // BATCH  # the whole batches; the last, padded, weighs its padding rows 0
    assert len(ours) == -(-rows // BATCH) and rows % BATCH
    _assert_same_examples(ours[:whole], levanter_examples("validation", whole))
    assert not np.asarray(ours[-1].loss_weight.array)[rows % BATCH :].any()


def test_the_iterator_levanters_trainer_reads_saves_with_orbax(tmp_path) -> None:
    """`loader.iter_from_step(s)` is what Levanter's trainer reads; `LoaderSave(it)`, the Orbax
    recipe's "the iterator the trainer takes batches from", refused it ("got _Examples; pass
    LoaderSave(it)", which it was). Its state is the psdp iterator's: the next step."""
    import orbax.checkpoint as ocp

    from psdp import DocumentStore, TokenSequences
    from psdp.levanter import LevanterLoader
    from psdp.orbax import LoaderRestore, LoaderSave
    from tests.meshes import mesh_of

    mesh = mesh_of(("data",), (4,))
    documents = [np.arange(2, 40, dtype=np.int32) + 100 * d for d in range(20)]
    rows = TokenSequences(DocumentStore.from_documents(documents), SEQ_LEN)
    with LevanterLoader(rows, mesh=mesh, Pos=Pos, batch_size=4) as loader:
        it = loader.iter_from_step(3)
        for _ in range(2):
            next(it)
        state = LoaderSave(it).state
        assert state == loader.state() and state["step"] == 5 and state["offset"] == 20
        manager = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",))
        manager.save(5, args=ocp.args.Composite(data=LoaderSave(it)))
        manager.wait_until_finished()
        it.close()
    restored = manager.restore(5, args=ocp.args.Composite(data=LoaderRestore())).data
    assert restored == state


def test_levanters_train_set_permutes_each_block_of_the_unshuffled_order(tmp_path, tokenizer):
    """A guard of the guide's "Orders": the guide said an unshuffled one-component run "moves
    between the two loaders at any step", but `train_lm` reads `LmDataConfig.train_set`, a
    `MixtureDataset` that permutes the rows inside each `mixture_block_size` block even then.
    psdp's `train_loader` gives store order; Levanter's block holds the same rows, permuted."""
    import asyncio
    from types import SimpleNamespace

    from psdp.levanter import train_loader
    from tests.meshes import mesh_of

    _write(tmp_path / "web" / "train", 40, 0)
    _write(tmp_path / "web" / "validation", 5, 1)
    block = 8
    levanter_data = LmDataConfig(
        tokenizer=tokenizer, cache_dir=None, shuffle=False, mixture_block_size=block,
        components={"web": DatasetComponent(cache_dir=str(tmp_path / "web"))},
    )  # fmt: skip
    theirs = levanter_data.train_set(Pos, BatchSchedule(4), key=jax.random.PRNGKey(0))
    trainer = SimpleNamespace(
        device_mesh=mesh_of(("data",), (4,)), compute_axis_mapping={"batch": "data"},
        config=SimpleNamespace(train_batch_size=4, batch_axis_name="batch"),
    )  # fmt: skip
    with train_loader(levanter_data, trainer, Pos) as loader:
        rows = loader.loader.source
        ours = np.asarray(rows.read(np.arange(len(rows)))["input_ids"])
        steps = [np.asarray(loader.batch_at(s).tokens.array) for s in range(len(ours) // 4)]
    np.testing.assert_array_equal(np.concatenate(steps), ours[: len(steps) * 4])  # store order
    blocks = len(ours) // block
    got = asyncio.run(theirs.get_batch(list(range(blocks * block))))
    got = np.stack([np.asarray(example.tokens.array) for example in got])
    for b in range(blocks):
        mine, levanters = ours[b * block : (b + 1) * block], got[b * block : (b + 1) * block]
        assert sorted(map(tuple, mine)) == sorted(map(tuple, levanters))  # the same rows
    assert not np.array_equal(got, ours[: blocks * block])  # in another order
