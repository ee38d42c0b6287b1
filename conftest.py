"""Every test and doctest runs with 8 fake CPU devices, so multi-device code really runs in CI.

This must happen before JAX initialises its backend, hence the root conftest (loaded first).
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
