"""A loader's checkpoint state: what it holds, and the checks of a restore (``docs/reliability.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from psdp._checks import check_fields, check_int
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.options import OrderOptions, check_groups
from psdp._runtime.agreement import agree

#: The ``format`` field of a loader state.
STATE_FORMAT = "psdp.loader/1"
RESTORE_FIX = "pass the whole dict DataLoader.state() returned, as it was saved"
#: The keys a restore needs in a state, and their kinds.
STATE_FIELDS = {
    "format": "str",
    "step": "int",
    "global_batch_size": "int",
    "seed": "int",
    "shuffle": "bool",
    "drop_last": "bool",
    "source": "dict",
}
#: The order's fields a state pins.
ORDER_FIELDS = ("global_batch_size", "seed", "shuffle", "drop_last")


def fingerprint(rows: int | None, plan: LoaderPlan) -> dict[str, Any]:
    """What a state records of its source: its length (``None`` for a stream) and leaves."""
    return {"rows": rows, "leaves": plan.leaf_shapes()}


def loader_state(step: int, order: OrderOptions, feed: Any, plan: LoaderPlan) -> dict[str, Any]:
    """The state of a loader whose next batch is that of ``step``.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp._plan.options import LoaderOptions
        >>> from psdp._runtime.feeds import open_feed
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> options = LoaderOptions.create(global_batch_size=8, seed=3)
        >>> feed = open_feed(np.arange(64, dtype=np.int32), options.order)
        >>> plan = LoaderPlan.create(feed.probe(), mesh, options, 0, stream=False, ends_short=False)
        >>> loader_state(5, options.order, feed, plan)
        {'format': 'psdp.loader/1', 'step': 5, 'global_batch_size': 8, 'seed': 3, 'shuffle': True, 'drop_last': False, 'source': {'rows': 64, 'leaves': {'None': ['int32', []]}}}
    """
    return {
        "format": STATE_FORMAT,
        "step": int(step),
        "global_batch_size": order.global_batch_size,
        "seed": 0 if feed.order is None else feed.order.seed,
        "shuffle": False if feed.order is None else feed.order.shuffle,
        "drop_last": order.drop_last,
        "source": fingerprint(feed.rows, plan),
    }


def check_state(state: Any) -> None:
    """Raises unless ``state`` is a whole loader state."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"not a psdp loader state (expected a dict with format={STATE_FORMAT!r}, got "
            f"{str(state)[:80]!r}); pass what DataLoader.state() returned"
        )
    check_fields("the saved state", state, STATE_FIELDS, RESTORE_FIX)
    check_int("step", state["step"], minimum=0)


def restored_order(state: Mapping[str, Any], kwargs: dict[str, Any]) -> OrderOptions:
    """The order of a restored loader: the state's, refusing a given value that differs.

    Takes the order's flat keywords and ``order=`` out of ``kwargs``; a field of an ``order``
    group left at its default counts as not given.
    """
    given = {name: kwargs.pop(name) for name in ORDER_FIELDS if name in kwargs}
    group = kwargs.pop("order", None)
    if group is not None:
        # a group of the wrong type: the constructor's TypeError, before its fields are read
        check_groups("", {"order": group})
        defaults = OrderOptions()
        given.update(
            {
                name: getattr(group, name)
                for name in ORDER_FIELDS
                if getattr(group, name) != getattr(defaults, name)
            }
        )
    for name, value in given.items():
        if value != state[name]:
            raise ValueError(
                f"resuming with {name}={value!r}, but the saved state has {name}={state[name]!r}; "
                "the batch order depends on it, so resume with the saved value (or start a new "
                "run from step 0)"
            )
    return dataclasses.replace(OrderOptions(), **{name: state[name] for name in ORDER_FIELDS})


def check_restored(state: Mapping[str, Any], plan: LoaderPlan, rows: int | None, name: str) -> None:
    """Raises unless every host restored the same state, from the source it was saved from."""
    # hosts that restored from different checkpoints would feed one batch two ways
    agree(
        {"step": state["step"], "saved source": state["source"]},
        plan.layout.processes,
        f"restored DataLoader {name!r}",
    )
    found = fingerprint(rows, plan)
    if found != state["source"]:
        raise ValueError(
            f"the source does not match the saved state: saved {state['source']}, found "
            f"{found}; resume with the source the state was saved from"
        )


def agreed_settings(order: OrderOptions, feed: Any, plan: LoaderPlan) -> dict[str, Any]:
    """What the batches depend on, which every host of the mesh must agree on."""
    state = loader_state(0, order, feed, plan)
    return {
        **{k: v for k, v in state.items() if k not in ("format", "step", "source")},
        "source rows": feed.rows,
        "source leaves": plan.leaf_shapes(),
        **plan.settings(),
    }
