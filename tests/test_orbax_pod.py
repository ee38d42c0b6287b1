"""docs/reference/reliability.md's Orbax recipe on a real 2-process pod: an optax state saved, restored, and
trained on by a jitted step (its scalar ``count`` must not sit on one device)."""

import pytest

from psdp.tools.pod import run_pod
from tests.pod_targets_orbax import run_orbax_recipe

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
