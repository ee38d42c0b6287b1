"""The loader's state in Orbax checkpoints (psdp.orbax) on real pods: docs/reference/reliability.md's recipe
(an optax state and the loader saved, restored, and trained on by a jitted step, whose scalar
``count`` must not sit on one device), and a pod killed between the model's save and the
loader's, restored on another pod."""

import pytest

from psdp.tools.pod import PodError, run_pod
from tests.pod_targets_orbax import restore_latest, run_orbax_recipe, train_saving_until_killed

pytestmark = pytest.mark.multiprocess


def test_the_orbax_recipe_restores_an_optax_state_that_trains_on_a_pod(tmp_path):
    results = run_pod(
        run_orbax_recipe,
        num_processes=2,
        devices_per_process=4,
        args={"run_dir": str(tmp_path)},
        timeout_s=180,
    )
    # adam's count: 2 after the restored state's step; the step's arrays span the 8 devices
    assert results == [
        {"process": p, "loader_step": 3, "count": 2, "count_devices": 8} for p in (0, 1)
    ]


@pytest.mark.timeout(420)  # two pods of 180 s, and a minute
def test_a_pod_killed_between_the_models_save_and_the_loaders_restores_a_matching_pair(tmp_path):
    """Steps 2 and 4 save model and loader in one Orbax step each; the save of step 6 is killed
    on every host once its model item is on disk and before its loader file is written. A pod
    of another shape (4 hosts, not 2) and batch size (16, not 8) restores step 4: the model of
    step 4 with the loader of step 4, whose first batch is the next 16 rows (offset 32), never
    step 6's model or its data state."""
    with pytest.raises(PodError):
        run_pod(
            train_saving_until_killed,
            num_processes=2,
            devices_per_process=4,
            args={"run_dir": str(tmp_path), "kill_step": 6},
            timeout_s=180,
        )
    orbax_dir = tmp_path / "orbax"
    names = sorted(p.name for p in orbax_dir.iterdir())
    assert "6" not in names and any(n.startswith("6.") for n in names), names  # uncommitted
    (pending,) = [p for p in orbax_dir.iterdir() if p.name.startswith("6.")]
    # the items' directories: "model", or "model.<Orbax's temporary suffix>" (0.12)
    for p in (0, 1):  # every host's part of the model item was written
        assert list(pending.glob(f"model*/ocdbt.process_{p}/manifest.ocdbt")), p
    assert list(pending.glob("data*")) and not list(
        pending.glob("data*/metadata")
    )  # the loader's not
    results = run_pod(
        restore_latest,
        num_processes=4,
        devices_per_process=2,
        args={"run_dir": str(tmp_path), "global_batch_size": 16},
        timeout_s=180,
    )
    assert results == [
        {
            "process": p,
            "steps": [2, 4],
            "latest": 4,
            "model": [4],
            "loader_step": 4,
            "offset": 32,
            "rows": list(range(32, 48)),
        }
        for p in range(4)
    ]
