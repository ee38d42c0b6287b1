"""Determinism: the same bytes at every step, whatever the restarts, prefetch, threads and layout.

The oracle is one uninterrupted single-process run (`reference`), itself checked row by row against
the source. Every other run is compared to it shard by shard (`batch_digest`: a sha256 per leaf and
box of the global array), so one flipped bit in one device's shard fails the test.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from psdp import ArraySource, DataLoader, MeshLayout, Mixture
from psdp.tools.pod import run_pod
from tests.batch_checks import assert_shards_exact, expected_batch
from tests.pod_targets_reliability import batch_digest, dataset, layout_digests, loader_kwargs

ROWS = 27  # with a batch of 6, every epoch (5 steps) ends in a short batch, padded and masked
STEPS = 15  # three epochs: three different shuffles
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "reliability.md"


class JitterSource:
    """Reads take 0-4 ms, different per step, so concurrent reads finish out of step order."""

    def __init__(self, data: dict[str, np.ndarray]):
        self.rows = ArraySource(data)

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, ids):
        time.sleep(int(np.sum(ids) * 7919 % 5) / 1000)
        return self.rows.read(ids)

    def describe(self) -> str:
        return "JitterSource"


def _run(loader: DataLoader, steps: int, start: int | None = None) -> list[dict[str, str]]:
    iterator = iter(loader) if start is None else loader.iter_from(start)
    return [batch_digest(batch) for _, batch in zip(range(steps), iterator, strict=False)]


@pytest.fixture(scope="module")
def reference(mesh_2d) -> list[dict[str, str]]:
    """One uninterrupted run; its non-halo leaves checked exactly against the source rows."""
    data = dataset(ROWS)
    digests = []
    with DataLoader(data, mesh=mesh_2d, **loader_kwargs()) as loader:
        for step, batch in zip(range(STEPS), loader, strict=False):
            expected = expected_batch(
                {"weight": data["weight"]}, step, mesh=mesh_2d, **loader_kwargs()
            )
            assert_shards_exact(batch["weight"], expected["weight"], leaf="weight")
            assert_shards_exact(batch["mask"], expected["mask"], leaf="mask")
            digests.append(batch_digest(batch))
    assert len({json.dumps(d, sort_keys=True) for d in digests}) == STEPS  # no two steps alike
    return digests


def test_digests_see_a_different_seed(reference, mesh_2d):
    kwargs = {**loader_kwargs(), "seed": 1235}
    with DataLoader(dataset(ROWS), mesh=mesh_2d, **kwargs) as loader:
        assert _run(loader, STEPS) != reference


@pytest.mark.parametrize("read_threads", [1, 2, 3, 8])
def test_prefetch_depths_and_read_threads_change_no_byte(reference, mesh_2d, read_threads):
    source = JitterSource(dataset(ROWS))
    for prefetch in range(1, 9):
        kwargs = dict(prefetch=prefetch, read_threads=read_threads)
        with DataLoader(source, mesh=mesh_2d, **loader_kwargs(), **kwargs) as loader:
            assert _run(loader, STEPS) == reference, kwargs


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_restarts_at_random_steps_resume_bit_for_bit(reference, mesh_2d, seed):
    """A run cut at random steps, each time saved to JSON and restored with other settings."""
    rng = np.random.default_rng(seed)
    source, digests = JitterSource(dataset(ROWS)), []
    loader = DataLoader(source, mesh=mesh_2d, **loader_kwargs(), prefetch=8)
    while len(digests) < STEPS:
        digests += _run(loader, int(rng.integers(0, 6)))
        state = json.loads(json.dumps(loader.state()))
        assert state["step"] == len(digests)  # what the trainer took, not what was read ahead
        loader.close()
        settings = dict(prefetch=int(rng.integers(1, 9)), read_threads=int(rng.integers(1, 4)))
        # the state fixes the order; the layout (batch_spec, halo) is the trainer's to give again
        loader = DataLoader.restore(state, source, mesh=mesh_2d, **loader_kwargs(), **settings)
    loader.close()
    assert digests[:STEPS] == reference


def test_iter_from_and_batch_at_agree_with_the_run(reference, mesh_2d):
    with DataLoader(dataset(ROWS), mesh=mesh_2d, **loader_kwargs()) as loader:
        for step in (14, 0, 7, 3):
            assert _run(loader, STEPS - step, start=step) == reference[step:]
            assert batch_digest(loader.batch_at(step)) == reference[step]


def test_state_is_small_json(mesh_2d):
    with DataLoader(dataset(ROWS), mesh=mesh_2d, **loader_kwargs(), prefetch=8) as loader:
        iterator = iter(loader)
        for _ in range(3):
            next(iterator)
        state = loader.state()
    text = json.dumps(state)
    assert len(text) < 400, text
    assert state["step"] == 3
    assert state["global_batch_size"] == 6 and state["seed"] == 1234
    assert state["source"] == {
        "rows": ROWS,
        "leaves": {"tokens": ["int32", [8]], "weight": ["float32", []]},
    }


def test_docs_checkpoint_example_runs(tmp_path, monkeypatch, capsys):
    """The runnable plain-JSON example of docs/reference/reliability.md saves, restores and resumes."""
    block = re.search(r"<!-- runnable -->\n```python\n(.*?)```", DOCS.read_text(), re.S)
    assert block is not None, "docs/reference/reliability.md lost its runnable example"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's run directory
    exec(compile(block.group(1), str(DOCS), "exec"), {})
    assert capsys.readouterr().out.split() == ["resumed", "at", "step", "3", "True"]


def test_the_docs_state_is_a_real_state_and_its_sizes_are_measured(tmp_path, monkeypatch, mesh_2d):
    """docs/reference/reliability.md's state is the checkpoint example's own, and the sizes it gives are
    those of that state and of a loader over docs/guides/mixtures.md's first mixture."""
    text = DOCS.read_text()
    block = re.search(r"<!-- runnable -->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    namespace: dict = {}
    exec(compile(block.group(1), str(DOCS), "exec"), namespace)
    shown = re.search(r"```json\n(.*?)```", text, re.S)
    assert shown is not None
    assert json.loads(shown.group(1)) == namespace["state"]
    words = " ".join(text.split())
    assert f"({len(json.dumps(namespace['state']))} bytes for the one below," in words

    web = {"tokens": np.arange(400, dtype=np.int32).reshape(100, 4)}
    code = {"tokens": -np.arange(160, dtype=np.int32).reshape(40, 4)}
    mix = Mixture({"web": web, "code": code}, weights={"web": 3, "code": 1}, block_size=16)
    with DataLoader(mix, mesh=mesh_2d, global_batch_size=8) as loader:
        state = loader.state()
    assert f" {len(json.dumps(state))} bytes for a loader over the two-source `Mixture`" in words


LAYOUTS = {
    "2 processes x 4 devices": MeshLayout.contiguous({"data": 4, "model": 2}, 2),
    "4 x 2, contiguous": MeshLayout.contiguous({"data": 4, "model": 2}, 4),
    "4 x 2, non-contiguous": MeshLayout.noncontiguous({"data": 4, "model": 2}, 4),
    "8 x 1": MeshLayout.contiguous({"data": 4, "model": 2}, 8),
}


@pytest.mark.timeout(300)  # its pod's time limit, plus a minute
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_process_layouts_deliver_the_single_process_bytes(reference, name):
    """Each process restarts at step 4 and uses its own prefetch and thread counts."""
    layout = LAYOUTS[name]
    results = run_pod(
        layout_digests,
        num_processes=layout.num_processes,
        devices_per_process=layout.devices_per_process,
        args=dict(
            process_index=layout.process_index.tolist(),
            mesh_shape=[4, 2],
            num_rows=ROWS,
            steps=STEPS,
            restart_at=4,
        ),
        timeout_s=240,
    )
    assert [r["state_step"] for r in results] == [4] * layout.num_processes
    for step in range(STEPS):
        union: dict[str, str] = {}
        for result in results:
            for key, digest in result["digests"][step].items():
                assert union.setdefault(key, digest) == digest, (step, key)  # replicas agree
        assert union == reference[step], step
