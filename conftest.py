"""Every test and doctest runs with 8 fake CPU devices, so multi-device code really runs in CI.

This must happen before JAX initialises its backend, hence the root conftest (loaded first).
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

# scripts/mutation.py runs the tests once per mutant and needs only "does a test fail", not the
# smallest failing example: its profile skips hypothesis's shrinking
from hypothesis import Phase, settings  # noqa: E402

settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
