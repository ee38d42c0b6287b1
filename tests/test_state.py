"""Whose state a checkpoint saves: each iterator has its own; `loader.state()` refuses to guess;
`batch_at` peeks without an iterator; `LoaderConfig.restore` continues a saved run."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest

from psdp import DataLoader, LoaderConfig, OrderOptions
from tests.batch_checks import assert_batch_exact, token_table

ROWS, B = 64, 8
DATA = {"tokens": token_table(ROWS)}


def _unshuffled(step: int) -> dict[str, np.ndarray]:
    """Unshuffled step s holds rows s*B .. s*B + B - 1 (64 rows: no short batch, all real)."""
    return {"tokens": DATA["tokens"][(step * B) % ROWS + np.arange(B)], "mask": np.ones(B, bool)}


def test_each_iterator_has_its_own_state_and_the_loader_refuses_to_guess(mesh_2d):
    with DataLoader(DATA, mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
        train = iter(loader)
        for _ in range(5):
            next(train)
        peek = iter(loader)  # a peek during training: the newest iterator
        next(peek)
        assert train.state()["step"] == 5 and peek.state()["step"] == 1
        with pytest.raises(ValueError, match=r"2 iterators .* open \(next steps \[5, 1\]\)"):
            loader.state()
        peek.close()
        assert loader.state() == train.state()
        saved = json.loads(json.dumps(train.state()))  # JSON-able, in the format restore takes
    with DataLoader.restore(saved, DATA, mesh=mesh_2d) as loader:
        assert_batch_exact(next(iter(loader)), _unshuffled(5))


def test_batch_at_peeks_without_an_iterator_or_a_thread(mesh_2d):
    with DataLoader(DATA, mesh=mesh_2d, global_batch_size=B, shuffle=False) as loader:
        train = iter(loader)
        next(train), next(train)
        before, threads = loader.state(), threading.active_count()
        assert_batch_exact(loader.batch_at(7), _unshuffled(7))
        assert loader.state() == before == train.state()
        assert threading.active_count() == threads
        assert_batch_exact(next(train), _unshuffled(2))


def test_loader_config_restore_continues_a_saved_run(mesh_2d):
    config = LoaderConfig.create(global_batch_size=B, shuffle=False)
    with config.build(mesh_2d, source=DATA) as loader:
        train = iter(loader)
        for _ in range(3):
            next(train)
        state = train.state()
    with config.restore(state, mesh_2d, source=DATA) as loader:
        assert loader.start_step == 3
        assert_batch_exact(next(iter(loader)), _unshuffled(3))
    with pytest.raises(ValueError, match="resuming with seed=4, but the saved state has seed=0"):
        LoaderConfig.create(global_batch_size=B, shuffle=False, seed=4).restore(
            state, mesh_2d, source=DATA
        )
    with pytest.raises(ValueError, match="the source does not match the saved state"):
        config.restore(state, mesh_2d, source={"tokens": DATA["tokens"][:32]})


def test_the_trainer_doc_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """docs/guides/trainer.md's resume example: a run of 100 steps saves; a restart continues at 100."""
    import re
    from pathlib import Path

    from psdp import MeshConfig

    text = (Path(__file__).parents[1] / "docs" / "guides" / "trainer.md").read_text()
    trainer = re.search(r"## A trainer in under 30 lines\n\n```python\n(.*?)```", text, re.S)
    resume = re.search(r"## Resuming from a checkpoint\n.*?```python\n(.*?)```", text, re.S)
    assert trainer and resume, "docs/guides/trainer.md lost its examples"
    namespace: dict = {}
    exec(trainer.group(1).replace('if __name__ == "__main__":', "if False:"), namespace)
    exec(resume.group(1), namespace)
    np.save(tmp_path / "tokens.npy", DATA["tokens"])
    data = LoaderConfig.create(
        source=str(tmp_path / "tokens.npy"), global_batch_size=B, shuffle=False
    )
    config = namespace["TrainerConfig"](mesh=MeshConfig(axes={"data": 4, "model": 2}), data=data)
    starts: list[int] = []
    iter_from = DataLoader.iter_from
    monkeypatch.setattr(
        DataLoader, "iter_from", lambda self, s: starts.append(s) or iter_from(self, s)
    )
    namespace["train"](config, tmp_path)
    saved = json.loads((tmp_path / "loader.json").read_text())
    assert saved["step"] == 100
    longer = namespace["TrainerConfig"](mesh=config.mesh, data=data, num_train_steps=103)
    namespace["train"](longer, tmp_path)  # a restart: steps 100, 101, 102
    assert starts == [0, 100]
    with data.restore(saved, longer.mesh.build()) as loader:
        assert_batch_exact(next(iter(loader)), _unshuffled(100)["tokens"])


def test_restore_takes_the_order_from_an_order_group_or_flat_keywords(mesh_2d):
    """`DataLoader.restore` checks an ``order=`` group's fields like flat keywords; both may
    repeat the saved order, and a field that differs is refused."""
    with DataLoader(DATA, mesh=mesh_2d, global_batch_size=B, shuffle=False, seed=3) as loader:
        train = iter(loader)
        next(train), next(train)
        saved = train.state()
    same = OrderOptions(global_batch_size=B, shuffle=False, seed=3)
    for given in ({"order": same}, {"global_batch_size": B, "shuffle": False}):
        with DataLoader.restore(saved, DATA, mesh=mesh_2d, **given) as loader:
            assert_batch_exact(next(iter(loader)), _unshuffled(2))
    for given in ({"order": replace(same, seed=4)}, {"seed": 4}):
        with pytest.raises(
            ValueError, match=r"resuming with seed=4, but the saved state has seed=3"
        ):
            DataLoader.restore(saved, DATA, mesh=mesh_2d, **given)


@pytest.mark.parametrize(
    "change",
    [{"window_blocks": 8}, {"io_block": 4}, {"order": OrderOptions(io_block=2, window_blocks=8)}],
    ids=["window_blocks", "io_block", "order group"],
)
def test_a_restore_mid_epoch_refuses_another_block_shuffle(mesh_2d, change):
    """``io_block`` and ``window_blocks`` decide the current epoch's permutation: a restore that
    changes them would re-permute the epoch half read (rows twice, rows never), so it is refused;
    with the saved values the epoch's 64 rows come exactly once (a set the test writes down)."""
    shuffle = dict(global_batch_size=B, io_block=2, window_blocks=4, seed=1)
    with DataLoader(DATA, mesh=mesh_2d, **shuffle) as loader:
        train = iter(loader)
        first = [next(train) for _ in range(3)]  # 3 of epoch 0's 8 steps: mid-way in a window
        saved = train.state()
    name = next(iter(change)) if "order" not in change else "window_blocks"
    with pytest.raises(ValueError, match=rf"resuming with {name}=\d+, but the saved state has"):
        DataLoader.restore(saved, DATA, mesh=mesh_2d, **change)
    with DataLoader.restore(saved, DATA, mesh=mesh_2d, io_block=2, window_blocks=4) as loader:
        second = [batch for batch, _ in zip(loader, range(5), strict=False)]
    rows = [row for batch in first + second for row in np.asarray(batch["tokens"])[:, 0] // 1000]
    assert sorted(rows) == list(range(ROWS))  # the whole epoch, each row once
