"""The one place psdp uses JAX's private API: the coordination service's key-value store.

``jax.distributed.initialize`` starts a coordination service (on process 0) and a client in every
process; JAX keeps the client in ``jax._src.distributed.global_state`` and has no public name for
it (Orbax reaches it the same way). psdp uses it to compare settings across hosts and to agree on
where a stream ended, without device collectives (see `psdp.agreement`).
"""

from __future__ import annotations

from typing import Any


def coordination_client() -> Any | None:
    """The distributed runtime client of this process, or ``None`` without ``jax.distributed``."""
    try:
        from jax._src.distributed import global_state
    except ImportError:  # a JAX that moved it: psdp then checks nothing across hosts
        return None
    return getattr(global_state, "client", None)
