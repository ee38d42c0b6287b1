"""`psdp.check_consistency` (one and several processes) and `psdp.tools.simulate` on 2- and 4-host pods,
including hosts that raise, die or hang: the others stop with the failing host's message."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from psdp._integration.consistency import ConsistencyError, check_consistency
from psdp._integration.loader_config import LoaderConfig, MeshConfig
from psdp.tools.pod import STOPPED, PodError, run_pod
from psdp.tools.simulate import Simulation, simulate, synthetic_tokens
from tests.pod_targets_simulate import global_rows

TARGETS = Path(__file__).parent / "pod_targets_simulate.py"
ROWS = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)


@pytest.fixture
def mesh():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def first_device_of_box(mesh, spec, box_start, shape=ROWS.shape):
    sharding = NamedSharding(mesh, spec)
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        if index[0].start == box_start:
            return device
    raise AssertionError(box_start)


# ---------------------------------------------------------------------- check_consistency
def test_exact_batch_passes_and_reports(mesh):
    batch = {"tokens": global_rows(ROWS, NamedSharding(mesh, P("data")), None)}
    report = check_consistency(batch, {"tokens": ROWS})
    assert (report.devices, report.processes, report.distinct_shards) == (8, 1, 4)
    assert (report.local_shards, report.exact) == (8, True)
    assert str(report).startswith("all 8 devices received exactly their rows")


def test_a_wrong_replica_is_caught_without_expected(mesh):
    bad = first_device_of_box(mesh, P("data"), 4)  # one of the two devices holding rows 4:6
    batch = {"tokens": global_rows(ROWS, NamedSharding(mesh, P("data")), bad.id)}
    with pytest.raises(ConsistencyError) as info:
        check_consistency(batch)
    message = str(info.value)
    assert "leaf 'tokens': the replicas of rows 4:6, cols 0:3 disagree" in message
    assert f"{bad.id} (process 0)" in message


def test_a_wrong_shard_is_caught_against_expected(mesh):
    bad = first_device_of_box(mesh, P("data", "model"), 2, shape=(8, 2))
    sharding = NamedSharding(mesh, P("data", "model"))
    batch = {"tokens": global_rows(ROWS[:, :2], sharding, bad.id)}
    with pytest.raises(ConsistencyError) as info:
        check_consistency(batch, {"tokens": ROWS[:, :2]})
    message = str(info.value)
    assert f"leaf 'tokens': device {bad.id} (process 0) holds rows 2:4, cols" in message
    assert "differ from the expected rows; at global index (2," in message


@pytest.mark.parametrize("part", ["all", "last"])
def test_one_wrong_element_in_any_shard_is_caught(mesh, part):
    """Corrupting only the last element of one device's box: a checker comparing part of each
    shard (its first row, its first element) must not pass it."""
    rows = np.arange(8 * 4, dtype=np.int32).reshape(8, 4)
    for spec, start, at in [(P("data"), 6, "(7, 3)"), (P("data", "model"), 2, "(3, 1)")]:
        bad = first_device_of_box(mesh, spec, start, rows.shape)
        batch = {"tokens": global_rows(rows, NamedSharding(mesh, spec), bad.id, part)}
        with pytest.raises(ConsistencyError, match="differ from the expected rows") as info:
            check_consistency(batch, {"tokens": rows})
        assert f"device {bad.id} (process 0)" in str(info.value)
        if part == "last":
            assert f"at global index {at} it holds" in str(info.value)
    bad = first_device_of_box(mesh, P("data"), 6, rows.shape)  # no expected rows: the replicas
    batch = {"tokens": global_rows(rows, NamedSharding(mesh, P("data")), bad.id, part)}
    with pytest.raises(ConsistencyError, match="the replicas of rows 6:8, cols 0:4 disagree"):
        check_consistency(batch)


def test_every_leaf_is_checked_not_only_the_first(mesh):
    """Hole 5: a wrong second leaf fails the check; the report counts both leaves."""
    sharding = NamedSharding(mesh, P("data"))
    good = jax.device_put(ROWS, sharding)
    report = check_consistency({"a": good, "b": good}, {"a": ROWS, "b": ROWS})
    assert (report.leaves, report.local_shards) == (2, 16)
    assert str(report).startswith("all 8 devices received exactly their rows (2 leaves")
    with pytest.raises(ConsistencyError, match="leaf 'b': device"):
        check_consistency({"a": good, "b": good}, {"a": ROWS, "b": ROWS + 1})
    bad = first_device_of_box(mesh, P("data"), 4)
    wrong = global_rows(ROWS, sharding, bad.id, "last")
    with pytest.raises(ConsistencyError, match="leaf 'b': the replicas of rows 4:6"):
        check_consistency({"a": good, "b": wrong})  # no expected rows: replicas must agree
    same = jax.device_put(np.tile(ROWS[:2], (4, 1)), sharding)
    with pytest.raises(ConsistencyError, match="leaf 'b': two different index boxes"):
        check_consistency({"a": good, "b": same})  # and disjoint boxes must differ


def test_every_host_reading_the_same_rows_is_caught(mesh):
    same = np.tile(ROWS[:2], (4, 1))  # every data shard gets rows 0:2
    batch = jax.device_put(same, NamedSharding(mesh, P("data")))
    with pytest.raises(ConsistencyError, match="two different index boxes hold identical bytes"):
        check_consistency(batch)
    assert check_consistency(batch, distinct=False).distinct_shards == 4
    assert check_consistency({"rows": batch}, distinct=["other"]).leaves == 1


def test_masks_may_repeat_and_leaves_without_expected_are_checked_for_agreement(mesh):
    sharding = NamedSharding(mesh, P("data"))
    batch = {
        "tokens": jax.device_put(ROWS, sharding),
        "mask": jax.device_put(np.ones(8, bool), sharding),
    }
    report = check_consistency(batch, {"tokens": ROWS})
    assert (report.leaves, report.exact) == (2, False)
    assert str(report).startswith("all 8 devices received consistent rows")


def test_source_and_ids(mesh):
    data = {"tokens": np.arange(40, dtype=np.int32).reshape(20, 2)}
    ids = np.array([5, 6, 5, 6, 11, 2, 19, 0])  # boxes 0:2 and 2:4 hold the same rows
    batch = {"tokens": jax.device_put(data["tokens"][ids], NamedSharding(mesh, P("data")))}
    assert check_consistency(batch, source=data, ids=ids).exact  # exact: no distinct check
    with pytest.raises(ConsistencyError, match="differ from the expected rows"):
        check_consistency(batch, source=data, ids=ids[::-1])


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda b: check_consistency(b, {"other": ROWS}), ["leaves ['other']", "lacks"]),
        (lambda b: check_consistency(b, {"tokens": ROWS[:4]}), ["shape (4, 3)", "(8, 3)"]),
        (lambda b: check_consistency(b, source=ROWS), ["ids=None"]),
        (lambda b: check_consistency({"tokens": ROWS}), ["jax.Array leaves", "ndarray"]),
    ],
)
def test_bad_arguments(mesh, call, words):
    batch = {"tokens": jax.device_put(ROWS, NamedSharding(mesh, P("data")))}
    with pytest.raises((ValueError, TypeError)) as info:
        call(batch)
    for word in words:
        assert word in str(info.value)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("with_expected", "part"), [(False, "all"), (True, "last")])
def test_every_host_raises_the_same_error_for_one_wrong_device(with_expected, part):
    results = run_pod(
        f"{TARGETS}:check_across_hosts",
        num_processes=4,
        devices_per_process=2,
        args={"corrupt_process": 2, "with_expected": with_expected, "part": part},
        timeout_s=60,
    )
    verdicts = {r["error"].split(";")[0] for r in results}
    assert len(verdicts) == 1  # the same verdict on every host, none left waiting
    corrupt = next(r["corrupt"] for r in results if r["corrupt"] is not None)
    assert f"{corrupt} (process 2)" in verdicts.pop()
    if with_expected:  # the host holding the device names the element; the others point to it
        assert "at global index (7, 2) it holds" in results[2]["error"]  # its box's last
        assert "process 2 reports the first differing element" in results[0]["error"]


@pytest.mark.multiprocess
def test_a_correct_batch_passes_on_every_host():
    results = run_pod(
        f"{TARGETS}:check_across_hosts",
        num_processes=4,
        devices_per_process=2,
        args={"corrupt_process": None, "with_expected": True},
        timeout_s=60,
    )
    assert [r["local"] for r in results] == [2, 2, 2, 2]
    assert all(
        r["report"] == "all 8 devices received exactly their rows (1 leaf, 4 distinct shards, "
        "4 processes)"
        for r in results
    )


# ---------------------------------------------------------------------------- simulate
def test_synthetic_rows_follow_the_rule():
    tokens = synthetic_tokens(np.array([5, 0, 5]), seq_len=6, vocab=16)
    np.testing.assert_array_equal(tokens[0], tokens[2])
    np.testing.assert_array_equal(tokens[:, 1:], (tokens[:, :-1] * 5 + 3) % 16)
    assert tokens[0, 0] == (5 * 7919) % 16


TWO_HOSTS = Simulation(
    processes=2,
    mesh=MeshConfig(axes={"data": 2, "model": 2}),
    data=LoaderConfig.create(global_batch_size=8),
    steps=12,
    seq_len=8,
    rows=96,
    timeout_s=60,
)


@pytest.mark.multiprocess
def test_two_hosts_contiguous():
    report = simulate(TWO_HOSTS)
    assert [h["process"] for h in report.hosts] == [0, 1]
    assert [h["rows_per_step"] for h in report.hosts] == [4, 4]  # each host one data row
    # 2 devices x 12 steps x 2 leaves (tokens and the mask)
    assert [h["shards_checked"] for h in report.hosts] == [48, 48]
    text = str(report)
    assert "all 4 devices received exactly their rows" in text
    assert text.endswith("all devices received exactly their rows")
    assert "p0  uid 0  devices d0 d1" in text and report.losses == []


@pytest.mark.multiprocess
def test_four_hosts_noncontiguous_training_lowers_the_loss():
    sim = Simulation(processes=4, steps=40, train=True, rows=256, timeout_s=90)
    report = simulate(sim)
    assert [h["rows_per_step"] for h in report.hosts] == [8, 8, 8, 8]  # two data rows each
    losses = report.losses
    assert len(losses) == 40 and losses[-1] < 0.7 * losses[0]
    text = str(report)
    assert (
        "DP3 | d2 p0   d3 p0   d6 p1   d7 p1" in text
    )  # the non-contiguous pod of docs/concepts/mesh.md
    assert "loss went down" in text and "steps/s" in text and "loader wait per step" in text
    assert "all 16 devices received exactly their rows" in text


@pytest.mark.multiprocess
def test_training_on_packed_documents_lowers_the_loss():
    """``--packing``: every host packs the same synthetic documents (`PackedSequences`), every
    device shard of its 4 leaves and the mask is checked, and the model's loss goes down."""
    sim = replace(TWO_HOSTS, steps=30, seq_len=16, rows=200, train=True, packing="best_fit")
    report = simulate(sim)
    assert [h["shards_checked"] for h in report.hosts] == [2 * 30 * 5] * 2
    assert report.shape == (8, 16) and "200 synthetic documents packed (best_fit)" in str(report)
    losses = report.losses
    assert len(losses) == 30 and losses[-1] < 0.95 * losses[0]


@pytest.mark.multiprocess
def test_a_user_source_is_checked_against_itself(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, synthetic_tokens(np.arange(64), seq_len=5, vocab=64))
    report = simulate(TWO_HOSTS, source=str(path))
    assert report.shape == (8, 5) and str(path) in str(report)
    assert report.hosts[0]["consistency"].startswith("all 4 devices received exactly")


@pytest.mark.multiprocess
def test_a_padded_final_batch_and_its_mask_are_exact(tmp_path):
    from psdp.sources.stores.writer import write_dataset

    rows = {"tokens": synthetic_tokens(np.arange(70), 5, 64), "w": np.arange(70, dtype=np.float32)}
    path = write_dataset(tmp_path / "ds", rows, rows_per_shard=16, progress=False)
    sim = Simulation(
        processes=2,
        mesh=TWO_HOSTS.mesh,
        data=LoaderConfig.create(global_batch_size=8, shuffle=False),
        steps=10,  # step 8 is the epoch's short final batch: 6 rows and 2 padding rows
        timeout_s=60,
    )
    report = simulate(sim, source=str(path))
    assert report.hosts[0]["consistency"] == (
        "all 4 devices received exactly their rows (3 leaves, 6 distinct shards, 2 processes)"
    )


@pytest.mark.multiprocess
def test_train_on_a_source_whose_leaf_is_not_named_tokens(tmp_path):
    from psdp.sources.stores.writer import write_dataset

    rows = {"ids": synthetic_tokens(np.arange(64), 6, 64), "w": np.ones(64, np.float32)}
    path = write_dataset(tmp_path / "ds", rows, rows_per_shard=16, progress=False)
    sim = Simulation(processes=2, mesh=TWO_HOSTS.mesh, data=TWO_HOSTS.data, steps=6, train=True)
    report = simulate(sim, source=str(path))  # trains on the main leaf "ids"
    assert len(report.losses) == 6 and report.shape == (8, 6)
    assert report.hosts[0]["consistency"].startswith("all 4 devices received exactly")


@pytest.mark.parametrize("synthetic", [True, False])
def test_the_expected_batch_of_padded_steps_is_what_the_loader_delivers(mesh, synthetic):
    """In one process: the expected batch a host checks against (rows, padding rows, the mask)
    equals the loader's on every device, at a step padded up to the physical batch (10 rows over
    data=4: 12) and at the epoch's short final step (6 real rows)."""
    from psdp import DataLoader
    from psdp.tools.simulate.host import expected_batch

    sim = Simulation(
        processes=2,
        mesh=TWO_HOSTS.mesh,
        data=LoaderConfig.create(global_batch_size=10, shuffle=False),
        seq_len=5,
    )
    rows = {"tokens": synthetic_tokens(np.arange(66), sim.seq_len, sim.vocab)}
    with DataLoader(rows, mesh=mesh, global_batch_size=10, shuffle=False) as loader:
        assert loader.plan.physical_batch_size == 12
        for step in (0, 6):
            batch = loader.batch_at(step)
            want = expected_batch(loader, batch, step, sim, synthetic)
            assert want["mask"].sum() == (10 if step == 0 else 6)
            assert check_consistency(batch, want).exact


def test_the_plan_is_checked_in_the_parent_before_any_process_starts(tmp_path, monkeypatch):
    import psdp.tools.simulate

    monkeypatch.setattr(psdp.tools.simulate, "run_pod", lambda *a, **k: pytest.fail("pod started"))
    context = MeshConfig(axes={"data": 2, "context": 2})
    sim = Simulation(
        processes=2,
        mesh=context,
        data=LoaderConfig.create(global_batch_size=8, batch_spec="data,context"),
        seq_len=7,
    )
    with pytest.raises(ValueError, match=r"^--seq-len 7: dimension 1 of size 7 is not divisible"):
        simulate(sim)
    np.save(tmp_path / "rows.npy", np.zeros((16, 5), np.int32))
    with pytest.raises(ValueError) as info:
        simulate(sim, source=str(tmp_path / "rows.npy"))
    assert str(info.value).startswith(
        "--batch-spec 'data,context' does not fit the array source of rows (5,): dimension 1 of "
        "size 5 is not divisible by its 2 shards (context=2)"
    )
    per_leaf = LoaderConfig.create(global_batch_size=8, batch_spec={"tokens": "data,model"})
    with pytest.raises(
        ValueError, match=r"^--batch-spec 'data,model': axis 'model' is not in the mesh"
    ):
        simulate(Simulation(processes=2, mesh=context, data=per_leaf))


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (
            np.arange(40, dtype=np.int32).reshape(10, 4) * 10,
            "has values 0..390; pass --vocab above",
        ),
        (np.linspace(0, 1, 40).reshape(10, 4), "has dtype float64, not integer token ids"),
        (np.arange(10), "has rows of shape (), not sequences of tokens"),
    ],
)
def test_train_refuses_rows_that_are_not_tokens(tmp_path, rows, problem):
    path = tmp_path / "rows.npy"
    np.save(path, rows)
    sim = Simulation(processes=2, mesh=TWO_HOSTS.mesh, data=TWO_HOSTS.data, train=True)
    with pytest.raises(ValueError) as info:
        simulate(sim, source=str(path))
    message = str(info.value)
    assert "the array source " + problem in message and "None" not in message, message
    assert message.endswith("drop --train")


def _failing(mode: str, processes: int, timeout_s: float = 60) -> PodError:
    mesh = TWO_HOSTS.mesh if processes == 2 else MeshConfig(axes={"data": 4, "model": 2})
    sim = Simulation(
        processes=processes,
        mesh=mesh,
        data=TWO_HOSTS.data,
        steps=50,
        seq_len=8,
        rows=96,
        timeout_s=timeout_s,
        fail_at=f"1:3:{mode}",
    )
    with pytest.raises(PodError) as info:
        simulate(sim)
    return info.value


@pytest.mark.multiprocess
@pytest.mark.parametrize("processes", [2, 4])
def test_a_host_that_raises_stops_the_others_with_its_message(processes):
    error = _failing("raise", processes)
    message = "RuntimeError: injected failure: process 1 raised at step 3 (--fail-at)"
    assert error.reason == f"process 1 exited with status 1: {message}"
    for index, (code, output) in enumerate(error.outputs):
        if index != 1:
            assert code == STOPPED
            assert f"psdp pod: process {index} stops: process 1 exited" in output
            assert message in output


@pytest.mark.multiprocess
def test_a_host_that_dies_stops_the_others():
    error = _failing("die", 2)
    assert error.reason == "process 1 exited with status -9: killed by signal SIGKILL"
    code, output = error.outputs[0]
    assert code == STOPPED and "stops: process 1 exited with status -9" in output


@pytest.mark.multiprocess
def test_a_host_that_hangs_stops_every_host_at_the_time_limit():
    error = _failing("hang", 2, timeout_s=10)
    assert error.reason.startswith("the pod ran past its time limit of 10 s")
    assert [code for code, _ in error.outputs] == [STOPPED, STOPPED]
    assert all("stops: the pod ran past its time limit" in out for _, out in error.outputs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"processes": 0}, ["Simulation.processes must be an int >= 1, got 0"]),
        ({"vocab": 48}, ["Simulation.vocab must be a power of two", "48"]),
        ({"processes": 3}, ["--processes 3 does not divide the 16 devices"]),
        ({"fail_at": "1"}, ["--fail-at '1' must be PROCESS:STEP"]),
        ({"fail_at": "9:1"}, ["PROCESS < 4"]),
        ({"fail_at": "1:2:explode"}, ["raise|die|hang"]),
        ({"data": LoaderConfig()}, ["global_batch_size is unset"]),
        ({"mesh": MeshConfig()}, ["mesh.axes is unset"]),
    ],
)
def test_simulation_errors(kwargs, words):
    with pytest.raises(ValueError) as info:
        Simulation(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_named_arrays_are_checked_through_their_arrays(mesh):
    hax = pytest.importorskip("haliax", reason="haliax is optional: pip install 'psdp[haliax]'")

    batch = jax.device_put(ROWS, NamedSharding(mesh, P("data")))
    named = hax.named(batch, ("batch", "feature"))
    assert check_consistency({"tokens": named}, {"tokens": ROWS}).exact


@pytest.mark.parametrize("with_loss_mask", [False, True])
def test_the_tiny_model_learns_only_within_documents(mesh, with_loss_mask):
    """A batch with ``segment_ids`` (a document store's TokenSequences has no loss mask; packed
    rows have one): the loss covers exactly the pairs of one document (and of the loss mask),
    against a numpy bigram loss at the initial weights."""
    from psdp.tools.simulate.model import TinyModel

    sim = Simulation(processes=1, mesh=MeshConfig(axes={"data": 4, "model": 2}), vocab=16)
    model = TinyModel(mesh, sim)
    embed, head = (np.asarray(w, np.float64) for w in (model.params.embed, model.params.head))
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 16, (8, 6)).astype(np.int32)
    segments = np.array([[1, 1, 2, 2, 2, 0]] * 4 + [[1, 1, 1, 1, 1, 1]] * 4, np.int32)
    loss_mask = rng.integers(0, 2, (8, 6)).astype(np.uint8)
    batch = {"input_ids": tokens, "segment_ids": segments}
    if with_loss_mask:
        batch["loss_mask"] = loss_mask
    sharding = NamedSharding(mesh, P("data"))
    loss = model.step({k: jax.device_put(v, sharding) for k, v in batch.items()})

    logits = embed[tokens[:, :-1]] @ head
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    weight = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    if with_loss_mask:
        weight = weight * loss_mask[:, 1:]
    assert loss == pytest.approx(-(picked * weight).sum() / weight.sum(), rel=1e-5)
