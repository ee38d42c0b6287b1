"""The one place psdp uses JAX APIs that moved or are private: the coordination service's
key-value store (JAX keeps its client in ``jax._src.distributed.global_state``, as Orbax reads it;
`psdp._runtime.agreement` uses it), and the 64-bit switch, which moved from ``jax.experimental``
to ``jax`` within psdp's supported range.
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


def enable_x64(enabled: bool = True) -> Any:
    """A context manager that turns 64-bit JAX on or off for the calling thread.

    ``jax.enable_x64`` since jax 0.8; ``jax.experimental.enable_x64`` before (removed later).
    """
    import jax
    import jax.experimental

    name = "enable_x64"  # looked up by name: each jax has only one of the two
    context: Any = getattr(jax, name, None)  # a config State: never test its truth
    if context is None:
        context = getattr(jax.experimental, name)
    return context(enabled)
