"""`psdp.filter_shard` checks, run in one process (8 fake devices) and in every process of a pod.

`check_filter_shard` is the oracle both use: every addressable shard of every result is compared
with the global value it must hold, for global and host-local inputs, under several specs, outside
and inside jit; it returns counts and the error messages so the caller can compare hosts.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from psdp import MeshLayout, plan_batch
from psdp._integration.filter_shard import filter_shard
from tests.batch_checks import assert_shards_exact, token_table

SPECS = {
    "batch": P("data"),  # replicated over model: a TP group holds identical rows
    "full": P(("data", "model")),  # every device its own rows
    "sequence": P("data", "model"),  # columns split over model
    "replicated": P(),
}


def global_tree(batch_size: int) -> dict:
    return {
        "tokens": token_table(batch_size, width=4),
        "weight": np.arange(batch_size, dtype=np.float32) / 2,
        "name": "wiki",
        "step": 7,
        "nothing": None,
    }


def _check_untouched(out: dict, tree: dict) -> None:
    assert out["name"] is tree["name"] and out["step"] is tree["step"] and out["nothing"] is None


def _targets(mesh: Mesh, spec: P) -> dict:
    """A prefix of shardings for `global_tree`: ``spec`` for tokens, its dimension 0 for weight."""
    whole = NamedSharding(mesh, spec)
    first = NamedSharding(mesh, P(*spec[:1]))
    return {"tokens": whole, "weight": first, "name": whole, "step": whole, "nothing": whole}


def _exact(out: dict, tree: dict, targets) -> int:
    _check_untouched(out, tree)
    count = 0
    for key in ("tokens", "weight"):
        want = targets[key] if isinstance(targets, dict) else targets
        assert out[key].sharding == want, (key, out[key].sharding, want)
        count += assert_shards_exact(out[key], tree[key], leaf=key)
    return count


def _error(action) -> str:
    try:
        action()
    except (ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    raise AssertionError("no error raised")


def check_filter_shard(mesh: Mesh, batch_size: int) -> dict:
    """Runs every check on ``mesh`` for this process; returns what the hosts must agree on."""
    tree = global_tree(batch_size)
    shards = 0
    held = {}
    for name, spec in SPECS.items():
        targets = _targets(mesh, spec)
        # the global value, on every host
        shards += _exact(filter_shard(tree, targets), tree, targets)
        # this host's rows only, in the plan's order
        rows = plan_batch(mesh, spec, tree["tokens"].shape).rows
        weight_rows = plan_batch(mesh, targets["weight"].spec, tree["weight"].shape).rows
        held[name] = rows.tolist()
        local = {**tree, "tokens": tree["tokens"][rows], "weight": tree["weight"][weight_rows]}
        out = filter_shard(local, targets, host_local=True, global_batch_size=batch_size)
        shards += _exact(out, tree, targets)
        # and the whole batch agrees across hosts (a global reduction)
        assert int(jax.jit(jnp_sum)(out["tokens"])) == int(tree["tokens"].sum())

    # a jax.Array leaf is resharded (outside jit): batch -> full
    batch, full = NamedSharding(mesh, SPECS["batch"]), NamedSharding(mesh, SPECS["full"])
    placed = filter_shard(tree, batch)
    shards += _exact(filter_shard(placed, full), tree, full)

    # a per-subtree prefix of shardings, host-local
    rows = plan_batch(mesh, SPECS["full"], (batch_size,)).rows
    local = {"tokens": tree["tokens"][plan_batch(mesh, SPECS["batch"], (batch_size, 4)).rows]}
    out = filter_shard(
        {**local, "weight": tree["weight"][rows]},
        {"tokens": batch, "weight": full},
        host_local=True,
        global_batch_size=batch_size,
    )
    assert out["tokens"].sharding == batch and out["weight"].sharding == full
    shards += assert_shards_exact(out["tokens"], tree["tokens"], leaf="tokens")
    shards += assert_shards_exact(out["weight"], tree["weight"], leaf="weight")

    # inside jit: a sharding constraint; non-array leaves pass through filter_jit untouched
    @eqx.filter_jit
    def step(t):
        return filter_shard({**t, "tokens": t["tokens"] + 1}, full)

    out = step(placed)
    assert out["tokens"].sharding.spec == full.spec, out["tokens"].sharding
    shards += assert_shards_exact(out["tokens"], tree["tokens"] + 1, leaf="tokens")
    shards += assert_shards_exact(out["weight"], tree["weight"], leaf="weight")
    _check_untouched(out, tree)

    # a device means a single-device sharding
    device = jax.local_devices()[-1]
    out = filter_shard(tree, device)
    shards += _exact(out, tree, SingleDeviceSharding(device))

    # wrong host-local row count: every host raises before any device work
    mine = plan_batch(mesh, SPECS["batch"], (batch_size, 4)).rows
    too_many = {"tokens": tree["tokens"][np.append(mine, mine[0])]}
    errors = {
        "rows": _error(
            lambda: filter_shard(too_many, batch, host_local=True, global_batch_size=batch_size)
        ),
        "no_batch_size": _error(lambda: filter_shard(too_many, batch, host_local=True)),
        "device": _error(
            lambda: filter_shard(too_many, device, host_local=True, global_batch_size=batch_size)
        ),
    }
    return {"process": jax.process_index(), "shards": shards, "held": held, "errors": errors}


def jnp_sum(x):
    return x.sum()


def filter_shard_exact(process_index, axis_names, mesh_shape, batch_size):
    """Pod target: builds the mesh from a layout and runs `check_filter_shard` on this host."""
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    return check_filter_shard(layout.build_mesh(jax.devices()), batch_size)
