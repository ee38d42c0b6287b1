"""`filter_shard`: ``equinox.filter_shard``, plus host-local numpy leaves on a multi-host mesh.

With ``host_local=True`` each numpy leaf holds this host's rows of a global batch, in the planner's
order, and the loader's own `LeafAssembler` builds the global array. Where each kind of leaf goes,
and why the global batch size is given, never inferred: ``docs/concepts/partitioning.md``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding, SingleDeviceSharding

from psdp._checks import check_int, preview_ids
from psdp._runtime.assembly import LeafAssembler

_TARGETS = (jax.Device, Sharding)


def filter_shard(
    tree: Any,
    device_or_sharding: Any,
    *,
    host_local: bool = False,
    global_batch_size: int | None = None,
) -> Any:
    """Places (outside jit) or constrains (inside jit) every array leaf of ``tree`` on a sharding.

    Like ``equinox.filter_shard``, and with ``host_local=True`` correct for a host that holds only
    its own rows of a batch on a mesh that spans processes.

    Args:
        tree: any pytree; leaves that are not arrays (strings, ints, ``None``, functions) are
            returned untouched.
        device_or_sharding: a `jax.Device` (a single-device sharding), a `jax.sharding.Sharding`,
            or a pytree of those that is a prefix of ``tree`` (one per subtree).
        host_local: ``False``: every numpy leaf is the *global* value (the same on every host).
            ``True``: every numpy leaf holds this host's rows of the global batch (dimension 0),
            in the order of ``psdp.plan_batch(mesh, spec, global_shape).rows``, and is assembled
            into a global array; needs a `NamedSharding` and ``global_batch_size``. `jax.Array`
            leaves are global arrays in either mode.
        global_batch_size: with ``host_local=True``, the global size of dimension 0 of every
            numpy leaf; each leaf's global shape is ``(global_batch_size, *leaf.shape[1:])``.

    Returns:
        ``tree`` with every array leaf on its sharding and every other leaf as it was.

    Raises:
        ValueError: a host-local leaf has a row count other than the plan's, is 0-d, or has a
            dimension the sharding cannot split evenly; ``host_local`` without
            ``global_batch_size``. The message names the leaf path.
        TypeError: ``host_local=True`` with a sharding that is not a `NamedSharding`, or a target
            that is neither a device nor a sharding.

    Examples:
        One host, ``data=4 x model=2``: a global batch and an untouched non-array leaf.

        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> rows = NamedSharding(mesh, P("data"))
        >>> tree = {"tokens": np.arange(16).reshape(8, 2), "name": "wiki"}
        >>> out = filter_shard(tree, rows)
        >>> out["tokens"].sharding.spec, out["name"]
        (P('data',), 'wiki')

        Host-local rows: the host passes the rows its plan names (on one host, all of them).

        >>> from psdp import plan_batch
        >>> mine = plan_batch(mesh, P("data"), (8, 2), process_index=0).rows
        >>> out = filter_shard({"tokens": tree["tokens"][mine]}, rows, host_local=True,
        ...                    global_batch_size=8)
        >>> np.asarray(out["tokens"])[:, 0].tolist()
        [0, 2, 4, 6, 8, 10, 12, 14]

        Inside jit it is a sharding constraint:

        >>> jax.jit(lambda x: filter_shard(x * 2, rows))(out["tokens"]).sharding.spec
        P('data',)
    """
    if host_local:
        if global_batch_size is None:
            raise ValueError(
                "filter_shard(host_local=True) needs global_batch_size: a host's leaf holds only "
                "its rows, so the global size of dimension 0 cannot be read off it; pass "
                "global_batch_size=B (the batch size summed over all hosts, replicas counted once)"
            )
        check_int("global_batch_size", global_batch_size, minimum=1)
    if isinstance(device_or_sharding, _TARGETS):
        return _shard_subtree((), tree, device_or_sharding, host_local, global_batch_size)
    return jax.tree_util.tree_map_with_path(
        lambda path, target, subtree: _shard_subtree(
            path, subtree, target, host_local, global_batch_size
        ),
        device_or_sharding,
        tree,
        is_leaf=lambda x: isinstance(x, _TARGETS),
    )


def _shard_subtree(
    prefix: tuple[Any, ...],
    tree: Any,
    target: Any,
    host_local: bool,
    global_batch_size: int | None,
) -> Any:
    import equinox as eqx  # here, not at the top: it adds ~0.1 s to ``import psdp``

    sharding = _as_sharding(target)
    if not host_local:
        return eqx.filter_shard(tree, sharding)
    local, rest = eqx.partition(tree, _is_numpy)
    assembled = jax.tree_util.tree_map_with_path(
        lambda path, leaf: _assemble_host_rows(
            jax.tree_util.keystr((*prefix, *path)), leaf, sharding, global_batch_size
        ),
        local,
    )
    return eqx.combine(assembled, eqx.filter_shard(rest, sharding))


def _as_sharding(target: Any) -> Sharding:
    if isinstance(target, jax.Device):
        return SingleDeviceSharding(target)
    if isinstance(target, Sharding):
        return target
    raise TypeError(
        f"filter_shard needs a jax.Device, a jax.sharding.Sharding, or a pytree of them that is a "
        f"prefix of the tree, got {type(target).__name__} {target!r}"
    )


def _is_numpy(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray | np.generic)


def _assemble_host_rows(
    path: str, leaf: np.ndarray | np.generic, sharding: Sharding, global_batch_size: int | None
) -> jax.Array:
    """One host-local numpy leaf -> the global array, through the loader's own assembly."""
    assert global_batch_size is not None  # checked by filter_shard
    where = path or "(the root)"
    host_rows = np.asarray(leaf)
    if not (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh)):
        raise TypeError(
            f"filter_shard(host_local=True) needs a NamedSharding on a concrete Mesh, so the "
            f"planner can tell which rows this host holds, but leaf {where} got {sharding}; pass "
            "NamedSharding(mesh, spec), or pass the global value with host_local=False (a single "
            "device holds every row)"
        )
    if host_rows.ndim == 0:
        raise ValueError(
            f"host-local leaf {where} is 0-d and has no rows to split; pass scalars with "
            "host_local=False, or give the leaf a batch dimension"
        )
    global_shape = (global_batch_size, *host_rows.shape[1:])
    spec = sharding.spec
    try:
        leaf_plan = LeafAssembler.create(
            sharding.mesh, spec, global_shape, host_rows.dtype, jax.process_index()
        )
    except ValueError as error:
        raise ValueError(
            f"host-local leaf {where} of global shape {global_shape} cannot take spec {spec}: "
            f"{error}"
        ) from None
    needed = leaf_plan.plan.rows
    if host_rows.shape[0] != needed.size:
        raise ValueError(
            f"host-local leaf {where} has {host_rows.shape[0]} rows, but the plan for process "
            f"{leaf_plan.plan.process_index} needs {needed.size} (global rows "
            f"{preview_ids(needed)} of global_batch_size={global_batch_size}, spec {spec}); pass "
            f"this host's rows in plan order, global_value[psdp.plan_batch(mesh, spec, "
            f"{global_shape}).rows], or pass the global value with host_local=False"
        )
    rows = np.ascontiguousarray(host_rows)
    return leaf_plan.assemble(leaf_plan.fill(rows, positions=leaf_plan.plan.rows))
