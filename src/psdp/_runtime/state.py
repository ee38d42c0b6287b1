"""A loader's checkpoint state: what it holds, and the checks of a restore (``docs/reference/reliability.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from psdp._checks import check_fields, check_int
from psdp._plan.loader_plan import LoaderPlan
from psdp._plan.offsets import StepOffsets
from psdp._plan.options import OrderOptions, check_groups
from psdp._runtime.agreement import agree

#: The ``format`` field of a loader state.
STATE_FORMAT = "psdp.loader/2"
#: The format before sample offsets (a constant batch size, no skips): still restored.
OLD_FORMAT = "psdp.loader/1"
RESTORE_FIX = "pass the whole dict DataLoader.state() returned, as it was saved"
#: The keys a restore needs in a state, and their kinds.
STATE_FIELDS = {
    "format": "str",
    "step": "int",
    "offset": "int",
    "global_batch_size": "int or list",
    "skip_steps": "list",
    "skip_offsets": "list",
    "seed": "int",
    "shuffle": "bool",
    "drop_last": "bool",
    "io_block": "int or null",
    "window_blocks": "int",
    "source": "dict",
}
#: The order's fields a state records (what the samples of later steps depend on).
ORDER_FIELDS = (
    "global_batch_size",
    "skip_steps",
    "skip_offsets",
    "seed",
    "shuffle",
    "drop_last",
    "io_block",
    "window_blocks",
)
#: Of those, the ones a restore may change: they only decide the steps after the resume point.
CHANGEABLE = ("global_batch_size", "skip_steps", "skip_offsets", "drop_last", "epochs")


def fingerprint(
    rows: int | None, plan: LoaderPlan, source: Any = None, offset: int | None = None
) -> dict[str, Any]:
    """What a state records of its source: its length (``None`` for a stream), its leaves, a
    stream's number of shards, and what a source with a ``state_record()`` method says decides
    its rows (a `Mixture`'s definition), under ``"definition"``; at a state's ``offset``, a
    source with a ``state_cursors(offset)`` method adds what lets a restore there start
    cheaply (`StagedPacked`'s lanes' cursors), under the definition's ``"cursors"``."""
    found: dict[str, Any] = {"rows": rows, "leaves": plan.leaf_shapes()}
    if plan.stream_shard is not None:
        found["stream_shards"] = plan.stream_shard[1]
    record = getattr(source, "state_record", None)
    if record is not None:
        found["definition"] = record()
        cursors = getattr(source, "state_cursors", None)
        if offset is not None and cursors is not None:
            found["definition"]["cursors"] = cursors(offset)
    return found


def loader_state(step: int, order: OrderOptions, feed: Any, plan: LoaderPlan) -> dict[str, Any]:
    """The state of a loader whose next batch is that of ``step``.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from psdp._plan.options import LoaderOptions
        >>> from psdp._runtime.feeds import open_feed
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> options = LoaderOptions.create(global_batch_size=8, seed=3)
        >>> feed = open_feed(np.arange(64, dtype=np.int32), options.order)
        >>> plan = LoaderPlan.create(feed.probe(), mesh, options, 0, stream=False, ends_short=False)
        >>> loader_state(5, options.order, feed, plan)
        {'format': 'psdp.loader/2', 'step': 5, 'offset': 40, 'global_batch_size': 8, 'skip_steps': [], 'skip_offsets': [], 'seed': 3, 'shuffle': True, 'drop_last': False, 'io_block': None, 'window_blocks': 16, 'source': {'rows': 64, 'leaves': {'None': ['int32', []]}}}
    """
    offset = int(feed.offsets.resume_offset(step))
    return {
        "format": STATE_FORMAT,
        "step": int(step),
        "offset": offset,
        **order_record(order, feed),
        "source": fingerprint(feed.rows, plan, feed.source, offset),
    }


def order_record(order: OrderOptions, feed: Any) -> dict[str, Any]:
    """The order's fields as JSON values (the seed and shuffle the feed uses); ``epochs`` only
    when set, so an endless loader's state is what it was before finite loaders (the hosts'
    agreement compares it all the same: a host without it differs from one with it)."""
    batch = order.global_batch_size
    finite = {} if order.epochs is None else {"epochs": order.epochs}
    return {
        "global_batch_size": batch if isinstance(batch, int) else [list(s) for s in batch],  # type: ignore[union-attr]
        "skip_steps": [list(r) for r in order.skip_steps],
        "skip_offsets": [list(r) for r in order.skip_offsets],
        "seed": 0 if feed.order is None else feed.order.seed,
        "shuffle": False if feed.order is None else feed.order.shuffle,
        "drop_last": order.drop_last,
        # the block the feed shuffles in (its source's suggestion when none was given)
        "io_block": order.io_block if feed.order is None else feed.order.io_block,
        "window_blocks": order.window_blocks,
        **finite,
    }


def check_state(state: Any) -> dict[str, Any]:
    """The state, checked whole (an old-format one brought up to date), or raises."""
    if not isinstance(state, Mapping) or state.get("format") not in (STATE_FORMAT, OLD_FORMAT):
        raise ValueError(
            f"not a psdp loader state (expected a dict with format={STATE_FORMAT!r}, got "
            f"{str(state)[:80]!r}); pass what DataLoader.state() returned"
        )
    if state["format"] == OLD_FORMAT:
        state = _upgraded(state)
    check_fields("the saved state", state, STATE_FIELDS, RESTORE_FIX)
    check_int("step", state["step"], minimum=0)
    check_int("offset", state["offset"], minimum=0)
    return dict(state)


def _upgraded(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ``psdp.loader/1`` state (a constant batch size, no skips) in the current format."""
    new = ("offset", "skip_steps", "skip_offsets", "io_block", "window_blocks")
    old = {k: v for k, v in STATE_FIELDS.items() if k not in new}
    check_fields("the saved state", state, {**old, "global_batch_size": "int"}, RESTORE_FIX)
    rows = state["source"].get("rows")
    offsets = StepOffsets.create(rows, state["global_batch_size"], drop_last=state["drop_last"])
    return {
        **state,
        "format": STATE_FORMAT,
        "offset": offsets.info(state["step"]).offset,
        "skip_steps": [],
        "skip_offsets": [],
        "io_block": None,
        "window_blocks": OrderOptions().window_blocks,
    }


def restored_order(state: Mapping[str, Any], kwargs: dict[str, Any]) -> OrderOptions:
    """The order of a restored loader: resumes at the state's (step, offset); the seed and
    shuffle are the state's (a given value that differs is an error), the batch size, skips,
    drop_last and epochs are the given ones or else the state's.

    Takes the order's flat keywords and ``order=`` out of ``kwargs``; a field of an ``order``
    group left at its default counts as not given.
    """
    names = (*ORDER_FIELDS, "epochs", "start_at")
    given = {name: kwargs.pop(name) for name in names if name in kwargs}
    group = kwargs.pop("order", None)
    if group is not None:
        # a group of the wrong type: the constructor's TypeError, before its fields are read
        check_groups("", {"order": group})
        defaults = OrderOptions()
        given.update(
            {
                f.name: getattr(group, f.name)
                for f in dataclasses.fields(OrderOptions)
                if getattr(group, f.name) != getattr(defaults, f.name)
            }
        )
    if "start_at" in given:
        raise ValueError(
            f"resuming with start_at={given['start_at']!r}, but a restore resumes where the state "
            f"was saved (step {state['step']}, offset {state['offset']}); drop start_at"
        )
    saved = OrderOptions(**{name: state[name] for name in ORDER_FIELDS})
    saved = dataclasses.replace(saved, epochs=state.get("epochs"))  # recorded only when set
    for name in ORDER_FIELDS:
        if name not in CHANGEABLE and name in given and given[name] != state[name]:
            raise ValueError(
                f"resuming with {name}={given[name]!r}, but the saved state has {name}="
                f"{state[name]!r}; the batch order depends on it, so resume with the saved value "
                "(or start a new run from step 0)"
            )
    order = dataclasses.replace(
        saved,
        **{name: given[name] for name in CHANGEABLE if name in given},
        start_at=(state["step"], state["offset"]),
    )
    _check_past_skips(order.skip_steps, saved.skip_steps, state["step"])
    _check_past_offsets(order.skip_offsets, saved.skip_offsets, state["offset"], state["step"])
    return order


def _check_past_skips(
    skips: Sequence[tuple[int, int]], saved: Sequence[tuple[int, int]], step: int
) -> None:
    """A step skip that starts before the resume step must be one the saved run had (done);
    a new one cannot skip steps that were already trained on."""
    for first, end in skips:
        if first < step and (first, end) not in saved:
            raise ValueError(
                f"skip_steps ({first}, {end}) starts before step {step}, where this run resumes, "
                "and the saved run did not have it, so its first steps were already trained on; "
                f"to skip the samples ahead, give ({step}, {step + end - first}) (or ({step}, "
                f"{end}) to skip to where step {end} would have read)"
            )


def _check_past_offsets(
    skips: Sequence[tuple[int, int]], saved: Sequence[tuple[int, int]], offset: int, step: int
) -> None:
    """An offset skip that starts before the resume offset must be one the saved run had;
    a new one cannot skip offsets that were already trained on."""
    for first, end in skips:
        if first < offset and (first, end) not in saved:
            fix = f"give ({offset}, {end}) to skip the offsets ahead" if end > offset else "drop it"
            raise ValueError(
                f"skip_offsets ({first}, {end}) starts before sample offset {offset}, where this "
                f"run resumes (step {step}), and the saved run did not have it, so offsets "
                f"{first}..{min(end, offset) - 1} are already passed (trained on, or skipped); {fix}"
            )


def check_restored(
    state: Mapping[str, Any], plan: LoaderPlan, rows: int | None, name: str, source: Any = None
) -> None:
    """Raises unless every host restored the same state, from the source it was saved from.

    A source's ``"definition"`` (`fingerprint`) may differ where the source's own
    ``check_resume(saved, offset)`` allows it: in what decides only offsets after the resume.
    """
    # hosts that restored from different checkpoints would feed one batch two ways
    agree(
        {"step": state["step"], "offset": state["offset"], "saved source": state["source"]},
        plan.layout.processes,
        f"restored DataLoader {name!r}",
    )
    found = fingerprint(rows, plan, source)
    _check_definition(state["source"].get("definition"), found.get("definition"), source, state)
    saved_shards = state["source"].get("stream_shards")
    if saved_shards is not None and saved_shards != found.get("stream_shards"):
        raise ValueError(
            f"the stream was saved read as {saved_shards} shards, but this mesh reads it as "
            f"{found.get('stream_shards')}; a stream shard is its own sequence of elements, so "
            f"the run resumes exactly only with {saved_shards} stream shards (a mesh with as "
            "many distinct data shards), or from a random-access source"
        )
    saved = {k: v for k, v in state["source"].items() if k != "definition"}
    now = {k: v for k, v in found.items() if k != "definition"}
    tag = getattr(source, "source_leaf", None)
    if tag is not None and tag not in saved.get("leaves", {}):
        # the per-source tags switched on at a resume (per-domain losses from here on): a
        # function of each row's offset, which adds a leaf and changes no row
        now["leaves"] = {k: v for k, v in now["leaves"].items() if k != tag}
    if now != saved:
        gone = sorted(set(saved.get("leaves", {})) - set(now.get("leaves", {})))
        hint = (
            f" (if {gone[0]!r} was the mixture's source_leaf, set it again: "
            f"mixture.source_leaf: {gone[0]})"
            if len(gone) == 1
            else ""
        )
        raise ValueError(
            f"the source does not match the saved state: saved {state['source']}, found "
            f"{found}; resume with the source the state was saved from{hint}"
        )


def _check_definition(saved: Any, found: Any, source: Any, state: Mapping[str, Any]) -> None:
    """The source's own check of its saved definition at the resume offset (`check_resume`)."""
    if saved is None and found is None:
        return
    if saved is None or found is None:
        was = "without a definition" if saved is None else f"defined as {saved}"
        has = "has no definition" if found is None else f"is defined as {found}"
        raise ValueError(
            f"the state was saved from a source {was}, but this source {has}; resume with the "
            "source the state was saved from"
        )
    source.check_resume(saved, state["offset"])


def agreed_settings(order: OrderOptions, feed: Any, plan: LoaderPlan) -> dict[str, Any]:
    """What the batches depend on, which every host of the mesh must agree on."""
    return {
        **order_record(order, feed),
        "start step": order.start[0],
        "start offset": order.start[1],
        "source rows": feed.rows,
        "source leaves": plan.leaf_shapes(),
        "source definition": fingerprint(feed.rows, plan, feed.source).get("definition"),
        **plan.settings(),
    }
