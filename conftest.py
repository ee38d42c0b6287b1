"""Every test and doctest runs with 8 fake CPU devices, so multi-device code really runs in CI.

This must happen before JAX initialises its backend, hence the root conftest (loaded first).
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

# The doctests, docs and README show specs as jax >= 0.9.1 prints them, ``P('data',)``; older jax
# (down to psdp's lower bound) prints ``PartitionSpec('data',)``. The lower-bound job prints the
# newer form, so that the same examples hold on both (only the repr changes).
if repr(jax.sharding.PartitionSpec("x")).startswith("PartitionSpec("):
    _spec_repr = jax.sharding.PartitionSpec.__repr__
    jax.sharding.PartitionSpec.__repr__ = (
        lambda self: "P" + _spec_repr(self)[len("PartitionSpec") :]
    )

# scripts/mutation.py runs the tests once per mutant and needs only "does a test fail", not the
# smallest failing example: its profile skips hypothesis's shrinking
import pytest  # noqa: E402
from hypothesis import Phase, settings  # noqa: E402

settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that launches a local pod is one of the slow end-to-end runs as well."""
    for item in items:
        if item.get_closest_marker("multiprocess"):
            item.add_marker(pytest.mark.slow)
