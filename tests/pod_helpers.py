"""Tiny pod targets for testing the harness itself."""

import os
import time

import jax
import numpy as np
from jax.experimental import multihost_utils


def whoami(tag=None):
    return {
        "process": jax.process_index(),
        "count": jax.process_count(),
        "local": jax.local_device_count(),
        "global": jax.device_count(),
        "tag": tag,
    }


def fail_on_one():
    if jax.process_index() == 1:
        raise ZeroDivisionError("host 1 cannot divide")
    multihost_utils.sync_global_devices("never reached by host 1")
    return np.zeros(1).tolist()


def sleep_forever():
    time.sleep(3600)


def exit_0_on(process=None):
    """``os._exit(0)`` without returning: on every host (``process=None``) or on one."""
    if process is None or jax.process_index() == process:
        os._exit(0)
    multihost_utils.sync_global_devices("never reached by the process that left")
    return "unreachable"


def say_then_wait(flag: str) -> int:
    """Prints a line, then waits for ``flag`` to exist: only a parent that shows the line while
    the process still runs can create the flag (the test's echo does), so the pod ends."""
    me = jax.process_index()
    print(f"ready from {me}")  # no flush, as a trainer prints: the pod's children are unbuffered
    while not os.path.exists(flag):
        time.sleep(0.01)
    print(f"done on {me}", end="")  # a last line without its newline is shown too
    return me
