"""The Ray engine on a local Ray cluster started by the test: every task once, errors as themselves."""

from __future__ import annotations

import math

import pytest

from tests.ray_cluster import ray_engine, requires_ray  # noqa: F401 (a fixture)

pytestmark = [requires_ray, pytest.mark.timeout(300)]


def test_every_task_runs_once_and_its_result_comes_back(ray_engine):  # noqa: F811
    results = list(ray_engine.map_unordered(math.factorial, range(12)))
    assert sorted(results) == [math.factorial(n) for n in range(12)]
    assert list(ray_engine.map_unordered(math.factorial, [])) == []


def test_a_task_error_is_raised_as_itself_not_wrapped(ray_engine):  # noqa: F811
    with pytest.raises(
        ValueError, match=r"^invalid literal for int\(\) with base 10: 'x'$"
    ) as info:
        list(ray_engine.map_unordered(int, ["1", "x", "2"]))
    assert type(info.value) is ValueError
