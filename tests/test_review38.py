"""Issue 38 reviewed through its documented paths (DataConfig dicts, the Python API, the CLI):
each test is a case that once gave wrong data or a wrong answer, against an exact oracle
computed here with numpy, never by the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import DataConfig, write_documents
from psdp._integration.source_config import SourceConfig
from psdp.prepare import build_indexes
from psdp.sources import LengthBounds


def test_an_index_of_min_length_0_serves_a_source_that_leaves_min_length_unset(tmp_path):
    """``--min-length 0 --max-length 100`` and ``--max-length 100`` select alike and write one
    file, ``length-0-100.npz``; the source refused the first's index and named the second's
    command, which found the file up to date and left it: no way out but deleting it."""
    lengths = np.random.default_rng(0).integers(1, 200, 50)
    store = str(tmp_path / "web")
    write_documents(store, [np.arange(1, n + 1) for n in lengths], progress=False)
    build_indexes(store, lengths=[LengthBounds(min_length=0, max_length=100)], progress=False)
    for bounds in ({"max_length": 100}, {"min_length": 0, "max_length": 100}):
        config = DataConfig(sources={"s": SourceConfig(store=store, **bounds)}, seq_len=16)
        selected = config.train_source().sources["s"].store
        ids = selected.document_ids(0, selected.num_documents)
        assert ids.tolist() == np.flatnonzero(lengths <= 100).tolist()


def _unique_store(tmp_path, seed: int = 1, documents: int = 60) -> tuple[str, np.ndarray]:
    """A store whose stream (no EOS) is the tokens 1, 2, ..., T: a token's value is its place."""
    lengths = np.random.default_rng(seed).integers(1, 60, documents)
    tokens = np.arange(1, lengths.sum() + 1, dtype=np.int32)
    store = str(tmp_path / f"unique{seed}")
    docs = np.split(tokens, np.cumsum(lengths)[:-1])
    write_documents(store, [{"input_ids": d} for d in docs], progress=False)
    return store, tokens


def _lane_rows(tokens: np.ndarray, lengths: list[int], lanes: int, extra: int) -> list[np.ndarray]:
    """One source read in ``lanes`` lanes of its stream (store order, no shuffle): sample ``g``
    is lane ``g % lanes``'s next ``lengths[g]`` tokens (plus ``extra``), a lane wrapping to its
    own start in the next epoch (docs/concepts/length-stages.md, "The model")."""
    total, cursor, rows = len(tokens), [0] * lanes, []
    for g, length in enumerate(lengths):
        lane = g % lanes
        start, stop = lane * total // lanes, (lane + 1) * total // lanes
        places = np.arange(cursor[lane], cursor[lane] + length + extra) % (stop - start)
        rows.append(tokens[start + places])
        cursor[lane] += length
    return rows


def _staged_config(store: str, batch, stages, **extra) -> DataConfig:
    return DataConfig.from_dict(
        {
            "sources": {"a": {"store": store}},
            "seq_len": 8,
            "view": {"targets": True},
            "mixture": {"block_size": 4, "shuffle": False},
            "order": {"global_batch_size": batch},
            "lanes": 4,
            "stages": stages,
            **extra,
        }
    )


def test_a_restore_may_lengthen_a_later_stage_when_unit_tokens_is_unset(tmp_path, mesh_1d):
    """unit_tokens unset is the longest seq_len; a restore that lengthens a later stage (which
    the docs allow) changed it, and was refused for a unit_tokens the user never set. The
    resumed rows are the saved run's units, each lane going on where it stood."""
    store, tokens = _unique_store(tmp_path)
    stages = [
        {"step": 0, "weights": {"a": 1}},
        {"offset": 64, "weights": {"a": 1}, "seq_len": 32},
        {"offset": 96, "weights": {"a": 1}, "seq_len": 16},
    ]
    with _staged_config(store, [[0, 16], [4, 8]], stages).build(mesh_1d) as loader:
        state = loader.iter_from(5).state()  # offset 72, inside stage 1
    assert state["offset"] == 72
    longer = [*stages[:2], {**stages[2], "seq_len": 48}]
    lengths = [8] * 64 + [32] * 32 + [48] * 16
    want = _lane_rows(tokens, lengths, 4, extra=1)
    with _staged_config(store, 8, longer).restore(state, mesh_1d) as loader:
        batches = loader.iter_from(5)
        got = [row for _ in range(5) for row in np.asarray(next(batches)["input_ids"])]
    assert len(got) == 40
    for offset, row in enumerate(got, 72):
        np.testing.assert_array_equal(row, want[offset], err_msg=f"sample offset {offset}")


@pytest.mark.parametrize("short", [1, 200], ids=["dense", "sparse"])
def test_a_length_index_of_a_levanter_cache_rebuilt_in_another_order_is_refused(tmp_path, short):
    """A Levanter cache's identity is its ledger (counts and metadata, no tokens): the same
    documents rebuilt in another order keep it, and keep the size and every 4,096th offset. The
    length index of the old order was taken as current, and the source read a 12-token document
    and half of a long one as its "long documents" (silently). Now the first read of a block of
    the selection checks its documents' places against the store's offsets, and refuses (here
    at the build, before a batch). ``short`` 12-token documents lie between the long ones: a
    dense selection's offsets are one range read, a sparse one's a range per document."""
    from tests.levanter_cache import write_levanter_cache

    root = str(tmp_path / "train")
    lengths = [10, 50, *[12] * short, 45]
    docs = [np.arange(1000 * i, 1000 * i + n, dtype=np.int32) for i, n in enumerate(lengths)]
    write_levanter_cache(root, [{"input_ids": d} for d in docs])
    build_indexes(root, lengths=[LengthBounds(min_length=40)], format="levanter", progress=False)
    source = SourceConfig(store=root, format="levanter", min_length=40)
    config = DataConfig(sources={"long": source}, seq_len=8)
    long = config.train_source().sources["long"].store
    np.testing.assert_array_equal(
        long.read_ranges([0], [95])["input_ids"], np.concatenate([docs[1], docs[-1]])
    )
    swapped = [0, 2, 1, *range(3, len(docs))]  # documents 1 (50 tokens) and 2 (12) swapped
    write_levanter_cache(root, [{"input_ids": docs[i]} for i in swapped])
    with pytest.raises(ValueError, match=r"length index .* is stale.*psdp index"):
        config.train_source()  # the view's first look at the selection reads block 0


def test_a_packed_stage_may_not_cut_a_sources_documents_by_way_of_a_stage_without_it(tmp_path):
    """64 (a) -> 16 (a and b) is refused: documents of a that stage 0 held whole would be split.
    64 (a) -> 16 (b only) -> 16 (a) splits the same documents, but stage 2 is no shorter than
    stage 1 and stage 1 reads no a: it was taken."""
    rng = np.random.default_rng(5)
    stores = {}
    for name, longest in (("a", 30), ("b", 6)):
        stores[name] = str(tmp_path / name)
        docs = [rng.integers(1, 100, n).astype(np.int32) for n in rng.integers(1, longest, 40)]
        docs[8] = np.arange(1, 30, dtype=np.int32)  # 29 tokens, 30 slots with its EOS
        write_documents(stores[name], [{"input_ids": d[:longest]} for d in docs], progress=False)

    def config(stages) -> DataConfig:
        return DataConfig.from_dict(
            {
                "sources": {n: {"store": s} for n, s in stores.items()},
                "seq_len": 64,
                "view": {"packing": "greedy", "eos_id": 0},
                "mixture": {"block_size": 4},
                "order": {"global_batch_size": 4},
                "lanes": 2,
                "stages": stages,
            }
        )

    first = {"step": 0, "weights": {"a": 1}}
    direct = [first, {"step": 4, "weights": {"a": 1, "b": 1}, "seq_len": 16}]
    around = [
        first,
        {"step": 4, "weights": {"b": 1}, "seq_len": 16},
        {"step": 8, "weights": {"a": 1}},
    ]
    message = r"the stage at step \d lowers seq_len from 64 to 16 .* document 8 of source 'a' \(30"
    for stages in (direct, around):
        with pytest.raises(ValueError, match=message):
            config(stages).train_source()
    config([first, {"step": 4, "weights": {"b": 1}, "seq_len": 16}]).train_source()  # b: short


def test_a_restore_refuses_a_stage_by_offset_moved_before_the_resume(tmp_path, mesh_1d):
    """The docs: stages that start before the resume step may not change (a ValueError naming
    both values). A stage by offset moved from 64 to 72, both before the resume at 104, was
    taken silently: the run went on with 64 while its config said 72 (and a later stage by
    tokens counted from 64)."""
    store, _ = _unique_store(tmp_path)
    stages = [
        {"step": 0, "weights": {"a": 1}},
        {"offset": 64, "weights": {"a": 1}, "seq_len": 32},
        {"offset": 96, "weights": {"a": 1}, "seq_len": 16},
    ]
    with _staged_config(store, 8, stages).build(mesh_1d) as loader:
        state = loader.iter_from(13).state()
    assert state["offset"] == 104
    moved = [stages[0], {**stages[1], "offset": 72}, stages[2]]
    message = r"the stage at offset 72 starts at sample offset 72, .* saved run started it at 64"
    with pytest.raises(ValueError, match=message):
        _staged_config(store, 8, moved).restore(state, mesh_1d)
    tokens = [stages[0], stages[1], {"tokens": 64 * 8 + 36 * 32, "weights": {"a": 1}}]
    with pytest.raises(ValueError, match=r"the stage at tokens 1664 starts at sample offset 100"):
        _staged_config(store, 8, tokens).restore(state, mesh_1d)  # 100, not the saved 96
    with _staged_config(store, 8, stages).restore(state, mesh_1d) as loader:  # unchanged: taken
        assert loader.step_info(13).offset == 104


@pytest.mark.parametrize("packing", [None, "greedy"])
def test_a_source_shorter_than_the_first_stages_row_reads_in_a_later_shorter_stage(
    tmp_path, packing
):
    """A source of 40 tokens weighted only from a stage of 8-token rows, after a first stage of
    64: the config opened every source as a view of the first stage's 64 tokens first (a packed
    one: a greedy plan of all its documents), and refused it (no stage named) before the
    stages' own views were made. Its stage-1 rows are
    runs of its stream (tokens 10001 to 10040), never another source's."""
    big, _ = _unique_store(tmp_path)
    small = str(tmp_path / "small")
    write_documents(small, [{"input_ids": np.arange(10001 + 8 * d, 10009 + 8 * d,
                                                    dtype=np.int32)} for d in range(5)],
                    progress=False)  # fmt: skip
    raw = {
        "sources": {"big": {"store": big}, "small": {"store": small}},
        "seq_len": 64, "lanes": 2, "mixture": {"block_size": 4, "seed": 3},
        "order": {"global_batch_size": 4},
        "stages": [{"step": 0, "weights": {"big": 1}},
                   {"step": 2, "seq_len": 8, "weights": {"big": 1, "small": 1}}],
    }  # fmt: skip
    if packing:  # big's documents (up to 59 tokens) may not be cut by 8-token rows: unweighted
        raw["view"] = {"packing": packing}
        raw["stages"][1]["weights"] = {"small": 1}
    else:
        raw["unit_tokens"] = 8
    source = DataConfig.from_dict(raw).train_source()
    assert [stage.start for stage in source.plan.stages] == [0, 8]
    rows = source.stage(1).read(np.arange(16))["input_ids"]
    mine = rows[(rows > 10000).any(axis=1)]
    assert len(mine) == (16 if packing else 8)  # weights 1:1 over 16 rows, or small alone
    for row in mine:
        real = row[row > 0]
        assert (real > 10000).all() and (real <= 10040).all()
