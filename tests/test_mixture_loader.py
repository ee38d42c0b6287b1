"""A `Mixture` through the loader: exact device shards across stage changes, resume on another
layout, editing future stages, refusing an edited past, and the 4-host non-contiguous pod."""

from __future__ import annotations

import re

import numpy as np
import pytest

from psdp import DataLoader, Mixture
from tests.batch_checks import assert_batch_exact, expected_batch
from tests.mixture_oracle import OracleMixture
from tests.pod_targets_mixture import BLOCK, EDITED, LENGTHS, NAMES, STAGES, data, oracle_batch


def _mixture(stages=STAGES, **changes):
    options = dict(stages=stages, block_size=BLOCK, seed=7, source_leaf="source") | changes
    return Mixture(data(), **options)


def _tags(loader, steps) -> list[int]:
    """The source tags of ``steps``' real rows, in offset order."""
    out: list[int] = []
    for step, batch in zip(steps, loader.iter_from(steps[0]), strict=False):
        rows = loader.step_info(step).rows
        out += np.asarray(batch["source"])[:rows].tolist()
    return out


def test_batches_are_exact_on_every_device_across_stage_changes(mesh_2d):
    """Batches of 24 over three stages (the last one a single source): every device shard of
    every leaf (tokens, weight, source tag, mask) equals the oracle's; counts() equals the tags."""
    mix = _mixture()
    want = oracle_batch(STAGES, data())
    settings = dict(mesh=mesh_2d, global_batch_size=24)
    with DataLoader(mix, **settings) as loader:
        for step, batch in zip(range(7), loader, strict=False):
            got = assert_batch_exact(batch, expected_batch(want, step, shuffle=False, **settings))
            assert got == 4 * 8
            info = loader.step_info(step)
            tags = np.bincount(np.asarray(batch["source"]), minlength=2).tolist()
            assert mix.counts(info.offset, info.rows) == dict(zip(NAMES, tags, strict=True))
        assert loader.order.shuffle is False


def test_resume_mid_stage_on_another_layout_gives_the_uninterrupted_samples(mesh_1d, mesh_2d):
    """Saved at step 3 (offset 72: mid-block, mid-stage) on data=8 with batches of 24, restored
    on data=4 x model=2 with batches of 16: together they read the oracle's sequence, every
    sample once."""
    sources = data()
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        it = iter(loader)
        first = [np.asarray(next(it)["tokens"]) for _ in range(3)]
        state = it.state()
        it.close()
    assert (state["step"], state["offset"]) == (3, 72)
    with DataLoader.restore(state, _mixture(), mesh=mesh_2d, global_batch_size=16) as loader:
        assert loader.step_info(3).offset == 72
        second = [np.asarray(b["tokens"]) for _, b in zip(range(8), loader, strict=False)]
    got = np.concatenate(first + second)
    source, row = OracleMixture(NAMES, LENGTHS, STAGES, BLOCK, 7).sequence(len(got))
    want = np.stack([sources[NAMES[s]]["tokens"][r] for s, r in zip(source, row, strict=True)])
    np.testing.assert_array_equal(got, want)


def test_an_edited_future_stage_takes_effect_at_its_start_and_not_before(mesh_1d):
    """Restored at offset 72 with a new stage from offset 96: offsets 72..95 are the saved run's,
    every block from 96 on holds the new stage's exact counts (1:3), and the whole sequence is
    the oracle's of the edited stages."""
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        state = loader.iter_from(3).state()
    with DataLoader.restore(state, _mixture(EDITED), mesh=mesh_1d, global_batch_size=8) as loader:
        tags = _tags(loader, list(range(3, 3 + 16)))  # offsets 72..199
    saved = OracleMixture(NAMES, LENGTHS, STAGES, BLOCK, 7).sequence(200)[0]
    edited = OracleMixture(NAMES, LENGTHS, EDITED, BLOCK, 7).sequence(200)[0]
    assert tags[: 96 - 72] == saved[72:96].tolist()  # not before its start
    assert tags == edited[72:200].tolist()
    for block in range(96 // BLOCK, 200 // BLOCK):
        counts = np.bincount(edited[block * BLOCK : (block + 1) * BLOCK], minlength=2)
        assert counts.tolist() == [4, 12]  # 1:3 of 16, exact in every block
    assert saved[112:128].tolist() != edited[112:128].tolist()


def test_a_stage_starting_exactly_at_the_resume_offset_may_change(mesh_1d):
    """Saved at step 2 (offset 48, where stage 1 starts): stage 1's weights may change, and the
    samples from 48 on are the edited oracle's."""
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        state = loader.iter_from(2).state()
    assert state["offset"] == 48
    edited = [STAGES[0], (48, {"web": 1, "code": 7}), STAGES[2]]
    with DataLoader.restore(state, _mixture(edited), mesh=mesh_1d, global_batch_size=16) as loader:
        tags = _tags(loader, list(range(2, 6)))  # offsets 48..111
    want = OracleMixture(NAMES, LENGTHS, edited, BLOCK, 7).sequence(112)[0]
    assert tags == want[48:112].tolist() and tags.count(1) == 4 * 14


@pytest.mark.parametrize(
    ("stages", "changes", "message"),
    [
        (
            [STAGES[0], (48, {"web": 2, "code": 1}), STAGES[2]],
            {},
            r"mixture stage 1 differs .* before the resume offset 72: saved from offset 48 with "
            r"weights \{'web': 1.0, 'code': 1.0\}, now from offset 48 with weights \{'web': 2.0",
        ),
        (
            [STAGES[0], (64, {"web": 1, "code": 1})],
            {},
            r"mixture stage 1 differs .*saved from offset 48 .* now from offset 64",
        ),
        (
            [*STAGES[:2], (64, {"code": 1})],
            {},
            r"mixture stage 2 differs .*saved no such stage, now from offset 64",
        ),
        (STAGES, {"seed": 8}, r"the mixture's seed is 8, but the saved run's was 7"),
        (STAGES, {"block_size": 8}, r"the mixture's block_size is 8, but the saved run's was 16"),
        (
            STAGES,
            {"shuffle": False},
            r"the mixture's shuffle is False, but the saved run's was True",
        ),
    ],
)
def test_a_restore_that_changes_the_past_is_refused(mesh_1d, stages, changes, message):
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        state = loader.iter_from(3).state()
    with pytest.raises(ValueError, match=message):
        DataLoader.restore(state, _mixture(stages, **changes), mesh=mesh_1d)


@pytest.mark.parametrize(
    ("edit", "now"),
    [
        (
            lambda d: {**d, "web": {k: v[:80] for k, v in d["web"].items()}},
            "resized 'web' 90 -> 80 rows): now [['web', 80], ['code', 35]]",
        ),
        (
            lambda d: {"wiki": d["web"], "code": d["code"]},
            "added ['wiki']; removed ['web']): now [['wiki', 90], ['code', 35]]",
        ),
        (
            lambda d: {"code": d["code"], "web": d["web"]},
            "reordered from ['web', 'code'] to ['code', 'web']): now [['code', 35], ['web', 90]]",
        ),
    ],
    ids=["a source with fewer rows", "a renamed source", "the sources in another order"],
)
def test_a_restore_with_other_sources_is_refused(mesh_1d, edit, now):
    """Every sample depends on the sources (their names, rows and tag order): other sources are
    refused, saying what changed and naming both (before the stages, which differ here too)."""
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        state = loader.iter_from(3).state()
    sources = edit(data())
    mix = Mixture(sources, weights=dict.fromkeys(sources, 1), block_size=BLOCK, seed=7)
    message = f"{now}, saved [['web', 90], ['code', 35]]"
    with pytest.raises(ValueError, match=re.escape(message)):
        DataLoader.restore(state, mix, mesh=mesh_1d)


def test_a_mixture_state_records_its_definition_and_an_array_cannot_restore_it(mesh_1d):
    with DataLoader(_mixture(), mesh=mesh_1d, global_batch_size=24) as loader:
        state = loader.iter_from(3).state()
    assert state["shuffle"] is False and state["source"]["rows"] == 1 << 62
    assert state["source"]["definition"] == {
        "kind": "psdp.mixture/2",
        "sources": [["web", 90], ["code", 35]],
        "block_size": 16,
        "seed": 7,
        "shuffle": True,
        "stages": [[0, [3.0, 1.0]], [48, [1.0, 1.0]], [112, [0.0, 1.0]]],
    }
    with pytest.raises(ValueError, match="saved from a source defined as .* this source has no"):
        DataLoader.restore(state, data()["web"], mesh=mesh_1d)


def test_a_batch_that_does_not_divide_the_length_needs_no_padding(mesh_2d):
    """A mixture is endless in practice: batches of 12 are never cut short, so a single-array
    mixture (no mask leaf) works with any batch size that the mesh divides."""
    mix = Mixture(
        {"a": np.arange(10, dtype=np.int32), "b": np.arange(100, 107, dtype=np.int32)},
        weights={"a": 1, "b": 1},
        block_size=4,
    )
    with DataLoader(mix, mesh=mesh_2d, global_batch_size=12) as loader:
        batch = np.asarray(next(iter(loader)))
    source, row = mix.locate(np.arange(12))
    want = np.where(source == 0, row, 100 + row)
    assert batch.tolist() == want.tolist()


@pytest.mark.timeout(300)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
def test_mixture_on_the_four_host_noncontiguous_pod():
    """One pod run: three stages with a source tag, a restore with a new batch size and an
    edited future stage, and a sequence-split leaf read as column windows from each source;
    every device shard exact against the oracle on every host; hosts whose mixtures differ are
    refused on every host."""
    from tests import pod_targets_mixture as targets
    from tests.batch_checks import run_on_noncontiguous_pod

    results = run_on_noncontiguous_pod(targets.mixture_cases, timeout_s=240)
    # 4 leaves (tokens, weight, source, mask) x 2 local devices x steps
    assert [r["stages"] for r in results] == [4 * 2 * 8] * 4
    assert [r["restored"] for r in results] == [4 * 2 * 9] * 4
    assert [r["context"] for r in results] == [3 * 2 * 6] * 4
    states = [r["state"] for r in results]
    assert all(s == states[0] for s in states) and states[0]["offset"] == 72
    # each host holds one half of the 8 token columns: it reads just that half
    halves = {"slice(0, 4, None)", "slice(4, 8, None)"}
    assert all(r["token_columns"] and set(r["token_columns"]) <= halves for r in results)
    for r in results:  # process 0's third stage differs: every host names the definition
        assert "source definition (process 0 has" in r["disagreement"], r["disagreement"]


@pytest.mark.parametrize(("offset", "refused"), [(47, False), (48, False), (49, True), (60, True)])
def test_a_stage_is_past_once_one_of_its_samples_was_read(offset, refused):
    """Stage 1 starts at 48: editing it is allowed up to a resume at 48 and refused from 49
    (sample 48 was read with it)."""
    saved = _mixture().state_record()
    edited = _mixture([STAGES[0], (48, {"web": 5, "code": 1}), STAGES[2]])
    if refused:
        with pytest.raises(ValueError, match=rf"mixture stage 1 differs .* offset {offset}"):
            edited.check_resume(saved, offset)
    else:
        edited.check_resume(saved, offset)


@pytest.mark.multiprocess
def test_leaf_order_and_consistency_agree_on_hosts_with_different_hash_seeds():
    """Each host of the 4-host pod runs with its own PYTHONHASHSEED (0-3: sets of the leaf names
    iterate in two different orders among them): every host's batch has the same keys in sorted
    order, the mask included, and check_consistency passes on every host, also when odd hosts
    hand it the leaves reversed."""
    from tests import pod_targets_mixture as targets
    from tests.batch_checks import run_on_noncontiguous_pod

    envs = [{"PYTHONHASHSEED": str(seed)} for seed in range(4)]
    results = run_on_noncontiguous_pod(targets.leaf_order_cases, env=envs, timeout_s=240)
    keys = ["mask", "source", "tokens", "weight"]
    assert [r["keys"] for r in results] == [[keys, keys]] * 4
    assert [r["errors"] for r in results] == [[]] * 4
    for r in results:
        assert len(r["reports"]) == 6, r
        assert all(report.startswith("all 8 devices received") for report in r["reports"]), r
