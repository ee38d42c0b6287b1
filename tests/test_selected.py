"""Sources selected by document length (`SelectedDocuments`, `LengthBounds`, ``psdp index
--min-length``, a `DataConfig` source's ``min_length``/``max_length``): exactly the documents a
numpy filter of the store's lengths keeps, read through blocks and passes small enough that a
few hundred documents span several of each; a stale index refused, a missing one a fast error
naming the command, an empty selection an error naming the source and the field
(``docs/guides/mixtures.md``, "Sources selected by length")."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from psdp import (
    DataConfig,
    DocumentStore,
    Mixture,
    StagedTokens,
    TokenSequences,
    write_documents,
)
from psdp._integration.source_config import SourceConfig
from psdp.prepare import build_indexes
from psdp.sources import LengthBounds, SelectedDocuments
from psdp.sources.documents import selected
from psdp.sources.documents.beside import IndexFolder
from psdp.sources.stores.location import INDEX_DIRECTORY
from psdp.tools.cli import main

#: (min_length, max_length): a lower bound, an upper bound that keeps the empty documents, both
BOUNDS = [(40, None), (None, 12), (10, 30)]


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 16 selected documents, a mark every 4, a pass of 50 store documents: a few
    hundred documents cross every edge the code has."""
    monkeypatch.setattr(selected, "BLOCK", 16)
    monkeypatch.setattr(selected, "STRIDE", 4)
    monkeypatch.setattr(selected, "PASS_DOCUMENTS", 50)
    monkeypatch.setattr(selected, "CACHED_BLOCKS", {"remote": 2, "local": 2})


def lengths_of(count: int, seed: int) -> np.ndarray:
    """Document lengths from 0 to 59, empty documents included."""
    return np.random.default_rng(seed).integers(0, 60, count)


def in_memory(lengths: np.ndarray) -> DocumentStore:
    """A store whose token ``t`` is ``t`` (so a range read is its own oracle)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return DocumentStore.from_arrays(offsets, {"input_ids": np.arange(offsets[-1], dtype=np.int64)})


def check_against_numpy(selection: SelectedDocuments, lengths: np.ndarray, bounds) -> None:
    low, high = bounds
    keep = (lengths >= (low or 0)) & (lengths <= (np.inf if high is None else high))
    ids = np.flatnonzero(keep)  # the oracle: the store's lengths filtered, nothing of psdp
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    tokens = np.concatenate([np.arange(starts[d], starts[d] + lengths[d]) for d in ids])
    assert selection.num_documents == len(ids)
    assert selection.document_ids(0, len(ids)).tolist() == ids.tolist()
    assert selection.num_tokens == len(tokens)
    offsets = np.concatenate([[0], np.cumsum(lengths[ids])])
    assert selection.offsets_range(0, len(ids) + 1).tolist() == offsets.tolist()
    rng = np.random.default_rng(1)
    a = rng.integers(0, len(tokens), 40)
    b = np.minimum(a + rng.integers(0, 90, 40), len(tokens))  # many across documents
    got = selection.read_ranges(a, b)["input_ids"]
    assert (
        got.tolist() == np.concatenate([tokens[x:y] for x, y in zip(a, b, strict=False)]).tolist()
    )
    # a view reads it as it reads the selected documents stored alone, EOS and all
    view = TokenSequences(selection, 16, eos_id=-1)
    oracle = TokenSequences(DocumentStore.from_arrays(offsets, {"input_ids": tokens}), 16,
                            eos_id=-1)  # fmt: skip
    assert len(view) == len(oracle)
    rows = np.arange(len(view))
    assert view.read(rows)["input_ids"].tolist() == oracle.read(rows)["input_ids"].tolist()


@pytest.mark.parametrize("bounds", BOUNDS)
def test_a_selection_in_memory_is_the_numpy_filter_of_the_lengths(bounds):
    lengths = lengths_of(300, seed=0)
    selection = SelectedDocuments.select(in_memory(lengths), min_length=bounds[0],
                                         max_length=bounds[1])  # fmt: skip
    check_against_numpy(selection, lengths, bounds)


def written(path, lengths: np.ndarray) -> str:
    """A psdp store at ``path`` whose token ``t`` is ``t`` (empty documents dropped: write
    refuses them), and its lengths."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    docs = [np.arange(offsets[d], offsets[d + 1]) for d in range(len(lengths)) if lengths[d]]
    write_documents(path, docs, progress=False, overwrite=True)
    return str(path)


@pytest.mark.parametrize("bounds", BOUNDS[::2])
def test_the_index_built_beside_the_store_reads_the_numpy_filter(tmp_path, bounds):
    lengths = lengths_of(300, seed=2)
    lengths = lengths[lengths > 0]
    store = written(tmp_path / "s", lengths)
    records = build_indexes(store, lengths=[LengthBounds(*bounds)], progress=False)
    assert [r["state"] for r in records] == ["built"]
    assert build_indexes(store, lengths=[LengthBounds(*bounds)], progress=False)[0]["state"] == (
        "up to date"
    )
    opened = DocumentStore.open(store)
    selection = SelectedDocuments.beside(store, opened, min_length=bounds[0], max_length=bounds[1])
    check_against_numpy(selection, lengths, bounds)


def test_the_command_builds_it_and_a_config_source_reads_it_beside_the_whole_store(
    tmp_path, capsys
):
    lengths = np.random.default_rng(3).integers(1, 60, 200)
    store = written(tmp_path / "s", lengths)
    assert main(["index", store, "--min-length", "40", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{store}/{INDEX_DIRECTORY}/length-40-any.npz: built, ")
    assert main(["index", store, "--min-length", "40", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)[0]
    assert (record["state"], record["documents"]) == ("up to date", int((lengths >= 40).sum()))
    config = DataConfig(
        sources={"web": SourceConfig(store=store, weight=3),
                 "long": SourceConfig(store=store, weight=1, min_length=40)},
        seq_len=16,
    )  # fmt: skip
    mixture = config.train_source()
    assert isinstance(mixture, Mixture)
    long = mixture.sources["long"].store
    assert isinstance(long, SelectedDocuments)
    assert (
        long.document_ids(0, long.num_documents).tolist() == np.flatnonzero(lengths >= 40).tolist()
    )
    assert mixture.sources["web"].store.num_documents == len(lengths)
    assert DataConfig.from_dict(config.to_dict()) == config


def test_an_index_of_the_store_before_it_changed_is_refused_naming_the_command(tmp_path):
    lengths = np.random.default_rng(4).integers(1, 60, 100)
    store = written(tmp_path / "s", lengths)
    build_indexes(store, lengths=[LengthBounds(40)], progress=False)
    shutil.copytree(tmp_path / "s" / INDEX_DIRECTORY, tmp_path / "kept")
    written(tmp_path / "s", lengths[::-1])  # same size, other documents: another write
    shutil.copytree(tmp_path / "kept", tmp_path / "s" / INDEX_DIRECTORY)
    with pytest.raises(ValueError, match=r"is stale: .*`psdp index .*/s --min-length 40`"):
        SelectedDocuments.beside(store, DocumentStore.open(store), min_length=40)
    config = DataConfig(sources={"long": SourceConfig(store=store, min_length=40)}, seq_len=16)
    with pytest.raises(ValueError, match=r"^source 'long': the length index .* is stale"):
        config.train_source()
    build_indexes(store, lengths=[LengthBounds(40)], progress=False)  # rebuilt: read again
    assert config.train_source().sources["long"].store.num_documents == (lengths >= 40).sum()


def test_a_missing_index_fails_fast_naming_the_command(tmp_path):
    store = written(tmp_path / "s", np.array([5, 50, 7]))
    config = DataConfig(
        sources={"long": SourceConfig(store=store, min_length=8, max_length=60)}, seq_len=16
    )
    with pytest.raises(FileNotFoundError, match=(
        r"^source 'long': no length index beside .* for min_length=8, max_length=60 .*build it "
        r"once with `psdp index .*/s --min-length 8 --max-length 60`")):  # fmt: skip
        config.train_source()


def test_a_selection_of_no_document_is_refused_naming_the_source_and_the_field(tmp_path, capsys):
    store = written(tmp_path / "s", np.array([5, 50, 7]))
    assert main(["index", store, "--min-length", "8192", "--no-progress"]) == 0
    assert "selects no document" in capsys.readouterr().err
    config = DataConfig(sources={"long": SourceConfig(store=store, min_length=8192)}, seq_len=16)
    with pytest.raises(ValueError, match=(
        r"^source 'long': min_length=8192 selects no document of .*: its documents have 5 to 50 "
        r"tokens")):  # fmt: skip
        config.train_source()
    with pytest.raises(
        ValueError, match=r"max_length=3 selects no document of arrays: its documents have 5 to 50"
    ):
        SelectedDocuments.select(in_memory(np.array([5, 50])), max_length=3)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"min_length": -1}, r"min_length of 'tokens/web' must be a token count .* got -1"),
        ({"min_length": "8k"}, r"min_length of 'tokens/web' must be a token count"),
        ({"min_length": 10, "max_length": 5}, r"max_length=5 is below min_length=10"),
    ],
)
def test_bad_bounds_are_refused_when_the_config_is_made(fields, error):
    with pytest.raises(ValueError, match=error):
        SourceConfig(store="tokens/web", **fields)


def test_bad_flags_are_one_line_naming_them(tmp_path, capsys):
    assert main(["index", str(tmp_path), "--min-length", "9", "--max-length", "3"]) == 2
    assert "--min-length 9 --max-length 3: max_length=3 is below min_length=9" in (
        capsys.readouterr().err
    )


def test_stages_read_a_selection_as_they_read_its_documents_stored_alone():
    """`StagedTokens` (length stages) takes a selection as a store: its rows are those of the
    selected documents written as a store of their own."""
    lengths = lengths_of(200, seed=5)
    store = in_memory(lengths)
    long = SelectedDocuments.select(store, min_length=30)
    ids = np.flatnonzero(lengths >= 30)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    alone = DocumentStore.from_documents([np.arange(starts[d], starts[d + 1]) for d in ids])
    stages = [(0, 8, {"all": 1, "long": 1}), (16, 32, {"all": 1, "long": 3})]

    def rows(long_store: DocumentStore) -> list:
        staged = StagedTokens({"all": store, "long": long_store}, stages, lanes=4, block_size=8,
                              eos_id=-1)  # fmt: skip
        return [staged.stage(s).read(np.arange(16))["input_ids"].tolist() for s in (0, 1)]

    assert rows(long) == rows(alone)


@pytest.mark.parametrize("view", ["tokens", "packed", "staged", "staged_packed"])
def test_provenance_names_a_selected_document_by_its_id_in_the_store(view):
    """Every view's provenance names a selected source's documents as the store the user
    opened numbers them (a checker looks them up there, `psdp inspect` prints them): each
    segment's delivered tokens are the store's tokens of that document, from the token values
    alone (token ``t`` of the store is ``t``)."""
    from psdp import PackedSequences, StagedPacked

    lengths = lengths_of(200, seed=6)
    store = in_memory(lengths)
    long = SelectedDocuments.select(store, min_length=30)
    stages = [(0, 64, {"long": 1}), (8, 128, {"long": 1})]
    source = {
        "tokens": lambda: TokenSequences(long, 32, eos_id=-1),
        "packed": lambda: PackedSequences(long, seq_len=64, eos_id=-1),
        "staged": lambda: StagedTokens({"long": long}, stages, lanes=2, block_size=4, eos_id=-1),
        "staged_packed": lambda: StagedPacked(
            {"long": long}, stages, lanes=2, block_size=4, eos_id=-1
        ),
    }[view]()
    ids = np.arange(12)
    table = source.provenance(ids)
    if view.startswith("staged"):  # row g is sample offset g: 8 of stage 0, then of stage 1
        rows = np.concatenate(
            [
                source.stage(0).read(np.arange(8))["input_ids"],
                source.stage(1).read(np.arange(4))["input_ids"][:, :64],
            ]
        )
    else:
        rows = source.read(ids)["input_ids"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    checked = 0
    for seg in table:
        if seg["column"] + seg["stop"] - seg["start"] > 64:
            continue  # past the 64 columns kept of a stage-1 row
        got = rows[seg["row"], seg["column"] : seg["column"] + seg["stop"] - seg["start"]]
        assert lengths[seg["document"]] >= 30
        want = starts[seg["document"]] + np.arange(seg["start"], seg["stop"])
        np.testing.assert_array_equal(got, want)
        checked += 1
    assert checked >= 12


def test_an_object_store_reads_the_blocks_the_local_store_maps(tmp_path):
    """The blocks read whole through the index folder (an object store's way) hold what the
    local memory maps hold."""
    lengths = np.random.default_rng(6).integers(1, 60, 300)
    store = written(tmp_path / "s", lengths)
    [record] = build_indexes(store, lengths=[LengthBounds(30)], progress=False)
    head, _ = selected.read_length_head((tmp_path / "s" / INDEX_DIRECTORY /
                                         "length-30-any.npz").read_bytes(), "", "")  # fmt: skip
    folder = IndexFolder(store)
    local = selected._local_block(folder, head["blocks"])
    remote = selected._remote_block(folder, head["blocks"])
    blocks = -(-record["documents"] // selected.BLOCK)
    assert blocks > 2
    for k in range(blocks):
        assert np.asarray(local(k)).tolist() == remote(k).tolist()
    shutil.rmtree(tmp_path / "s" / INDEX_DIRECTORY / head["blocks"])
    with pytest.raises(FileNotFoundError, match=r"block-0000000.npy is missing: the length index"):
        remote(0)
    with pytest.raises(FileNotFoundError, match=r"block-0000000.npy is missing: the length index"):
        local(0)


def test_a_levanter_cache_is_selected_in_place(tmp_path):
    """``psdp index CACHE --format levanter --min-length N``: the cache's document index and its
    length index, then a source with ``format: levanter`` and ``min_length`` reads its long
    documents."""
    from tests.levanter_cache import write_levanter_cache

    lengths = np.random.default_rng(7).integers(1, 60, 120)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    docs = [{"input_ids": np.arange(starts[d], starts[d + 1])} for d in range(len(lengths))]
    write_levanter_cache(tmp_path / "cache", docs)
    cache = str(tmp_path / "cache")
    flags = ["--format", "levanter", "--min-length", "30", "--no-progress"]
    assert main(["index", cache, *flags]) == 0
    config = DataConfig(
        sources={"long": SourceConfig(store=cache, format="levanter", min_length=30)}, seq_len=8
    )
    long = config.train_source().sources["long"].store
    ids = np.flatnonzero(lengths >= 30)
    assert long.document_ids(0, long.num_documents).tolist() == ids.tolist()
    tokens = np.concatenate([docs[d]["input_ids"] for d in ids])
    assert long.read_ranges([0], [len(tokens)])["input_ids"].tolist() == tokens.tolist()
