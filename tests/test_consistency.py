"""check_consistency on padded batches and NaN data (single process; the pod runs are in
tests/test_simulate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from psdp import ConsistencyError, DataLoader, check_consistency


def test_padding_boxes_may_repeat_but_real_ones_may_not(mesh_2d):
    source = {"tokens": np.arange(40, dtype=np.int32).reshape(10, 4) + 1}
    with DataLoader(source, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        it = iter(loader)
        next(it)
        batch = next(it)  # rows 8, 9 and six padding rows: boxes 1..3 are all padding
    assert np.asarray(batch["mask"]).tolist() == [True] * 2 + [False] * 6
    report = check_consistency(batch)
    assert report.devices == 8
    with pytest.raises(ConsistencyError, match="two different index boxes hold identical bytes"):
        check_consistency(batch, mask_key=None)  # without the mask, padding looks like a bug
    ones = {"tokens": np.ones((10, 4), np.int32)}
    with DataLoader(ones, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        repeated = next(iter(loader))  # real rows, all equal: still caught
    with pytest.raises(ConsistencyError, match="identical bytes"):
        check_consistency(repeated)


def test_nan_where_nan_is_expected_is_exact(mesh_2d):
    data = np.arange(32, dtype=np.float32).reshape(8, 4)
    data[0, 1] = np.nan
    with DataLoader({"x": data}, mesh=mesh_2d, global_batch_size=8, shuffle=False) as loader:
        batch = next(iter(loader))
    assert check_consistency(batch, {"x": data, "mask": np.ones(8, bool)}).exact
    wrong = data.copy()
    wrong[5, 2] = -1
    with pytest.raises(
        ConsistencyError, match=r"at global index \(5, 2\) it holds np.float32\(22.0\)"
    ):
        check_consistency(batch, {"x": wrong})
