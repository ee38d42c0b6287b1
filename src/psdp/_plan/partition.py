"""Partition strategies: from ``batch_spec`` (and ``named_axes``) to one `PartitionSpec` per leaf.

Also the physical batch: the global batch rounded up so every leaf's shards divide it. The
strategies, what each host reads and when to pick which: ``docs/concepts/partitioning.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import Mesh, PartitionSpec

from psdp._checks import check_int
from psdp._plan.leaves import Key
from psdp._plan.mesh import axes_of, spec_entry
from psdp._plan.windows import AxisHalo

#: Mesh axis names taken as batch axes by the ``"batch"`` strategy, in mesh order.
DEFAULT_BATCH_AXES = ("replica", "data", "fsdp", "batch")

#: The named strategies a ``batch_spec`` may use.
STRATEGIES = ("batch", "full", "replicated")

Strategy = PartitionSpec | str


def default_batch_spec(mesh: Mesh) -> PartitionSpec:
    """``P(batch axes)``: the mesh axes named like batch axes (`DEFAULT_BATCH_AXES`), in mesh order.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("replica", "data", "model"))
        >>> default_batch_spec(mesh)
        P(('replica', 'data'),)
    """
    axes = tuple(a for a in mesh.axis_names if a in DEFAULT_BATCH_AXES)
    if not axes:
        raise ValueError(
            f"the mesh axes {tuple(mesh.axis_names)} include none of the usual batch axes "
            f"{DEFAULT_BATCH_AXES}; pass batch_spec=PartitionSpec(<your batch axes>)"
        )
    return PartitionSpec(spec_entry(axes))


def resolve_spec(
    strategy: Strategy,
    mesh: Mesh,
    leaf: str = "the batch",
    batch_axes: str | Sequence[str] | None = None,
) -> PartitionSpec:
    """The `PartitionSpec` of one named strategy or spec on ``mesh``.

    ``batch_axes`` are the axes ``"batch"`` splits over (default: `default_batch_spec`'s).

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("replica", "data", "model"))
        >>> [resolve_spec(s, mesh) for s in STRATEGIES]
        [P(('replica', 'data'),), P(('replica', 'data', 'model'),), P()]
    """
    if isinstance(strategy, PartitionSpec):
        return strategy
    if strategy == "batch":
        if batch_axes:
            return PartitionSpec(spec_entry(axes_of(batch_axes)))
        return default_batch_spec(mesh)
    if strategy == "full":
        return PartitionSpec(tuple(mesh.axis_names))
    if strategy == "replicated":
        return PartitionSpec()
    raise ValueError(
        f"batch_spec for {leaf} is {strategy!r}; use a jax.sharding.PartitionSpec or one of "
        f"the strategies {STRATEGIES}"
    )


def resolve_specs(
    batch_spec: Strategy | Mapping[str, Strategy] | None,
    mesh: Mesh,
    leaves: Sequence[str | None],
    named: Mapping[str | None, PartitionSpec] | None = None,
    batch_axes: str | Sequence[str] | None = None,
) -> dict[str | None, PartitionSpec]:
    """One spec per leaf (``None`` names an array source's only leaf).

    ``batch_spec`` is one strategy for every leaf, or a dict leaf -> strategy where missing leaves
    take ``"batch"``. ``named`` holds the specs of leaves that have haliax axes.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> resolve_specs({"tokens": P("data", "model")}, mesh, ["tokens", "weight"])
        {'tokens': P('data', 'model'), 'weight': P('data',)}
    """
    named = dict(named or {})
    if isinstance(batch_spec, Mapping):
        unknown = sorted(set(map(str, batch_spec)) - {str(k) for k in leaves})
        if unknown:
            raise ValueError(
                f"batch_spec names leaves {unknown} that the source does not have; its leaves are "
                f"{sorted(map(str, leaves))}"
            )
        per_leaf: dict[str | None, Strategy] = {k: batch_spec.get(k, "batch") for k in leaves}  # type: ignore[arg-type]
    else:
        per_leaf = {k: "batch" if batch_spec is None else batch_spec for k in leaves}
    out = {}
    for key in leaves:
        if key in named:
            if isinstance(batch_spec, Mapping) and key in batch_spec:
                raise ValueError(
                    f"leaf {key!r} has both a batch_spec and named_axes; give one of them (its "
                    "spec follows from named_axes and axis_mapping)"
                )
            out[key] = named[key]
        else:
            out[key] = resolve_spec(
                per_leaf[key], mesh, "the batch" if key is None else repr(key), batch_axes
            )
    return out


def batch_shards(mesh: Mesh, spec: PartitionSpec) -> int:
    """How many shards split dimension 0 under ``spec`` (1 when it is replicated).

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> batch_shards(mesh, P(("data", "model"))), batch_shards(mesh, P())
        (8, 1)
    """
    axes = axes_of(spec[0]) if len(spec) else ()
    return math.prod(mesh.shape[a] for a in axes)


def physical_batch_size(global_batch_size: int, shards: Sequence[int]) -> int:
    """The smallest batch ``>= global_batch_size`` that every leaf's shards divide.

    Examples:
        >>> physical_batch_size(10, [4]), physical_batch_size(3, [4, 8]), physical_batch_size(16, [4])
        (12, 8, 16)
    """
    unit = math.lcm(*shards) if shards else 1
    return -(-global_batch_size // unit) * unit


def named_spec(
    names: Sequence[Any], axis_mapping: Mapping[str, Any], mesh: Mesh, leaf: str
) -> PartitionSpec:
    """The spec of a leaf whose dimensions are named (haliax axes or strings) via an axis mapping.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "context"))
        >>> named_spec(["batch", "position"], {"batch": "data", "position": "context"}, mesh, "x")
        P('data', 'context')
    """
    entries = []
    for name in names:
        axis_name = getattr(name, "name", name)
        entry = axis_mapping.get(axis_name)
        for axis in axes_of(entry):
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"axis_mapping maps {axis_name!r} (a dimension of leaf {leaf}) to mesh axis "
                    f"{axis!r}, which the mesh {tuple(mesh.axis_names)} does not have"
                )
        entries.append(tuple(entry) if isinstance(entry, list) else entry)
    return PartitionSpec(*entries)


def resolve_named_axes(
    named_axes: Sequence[Any] | Mapping[str, Sequence[Any]] | None,
    axis_mapping: Mapping[str, Any] | None,
    ndims: Mapping[Key, int],
) -> dict[Key, tuple[Any, ...]]:
    """Each named leaf's axis names (an array source's single leaf is ``None``), checked.

    ``ndims`` gives every leaf's number of dimensions; a leaf needs one name per dimension.
    """
    leaves = list(ndims)
    if named_axes is None:
        if axis_mapping is not None:
            raise ValueError("axis_mapping is given without named_axes; name each leaf's axes")
        return {}
    if axis_mapping is None:
        raise ValueError(
            "named_axes needs an axis_mapping from axis names to mesh axes, e.g. "
            '{"batch": ("replica", "data"), "position": "context"}'
        )
    per_leaf: dict[Key, tuple[Any, ...]]
    if isinstance(named_axes, Mapping):
        per_leaf = {str(k): tuple(v) for k, v in named_axes.items()}
    else:
        per_leaf = {None: tuple(named_axes)}  # an array source's only leaf
    unknown = sorted(map(str, set(per_leaf) - set(leaves)))
    if unknown:
        raise ValueError(
            f"named_axes names leaves {unknown} that the source does not have; its leaves are "
            f"{sorted(map(str, leaves))}"
        )
    for key, names in per_leaf.items():
        if len(names) != ndims[key]:
            raise ValueError(
                f"named_axes gives leaf {key!r} {len(names)} axis names {list(names)}, but it has "
                f"{ndims[key]} dimensions; name every dimension, e.g. (batch, position)"
            )
    return {k: tuple(v) for k, v in per_leaf.items()}


def resolve_halos(
    halo: int | Mapping[Any, Any],
    specs: dict[Key, PartitionSpec],
    ndims: dict[Key, int],
) -> dict[Key, dict[int, AxisHalo]]:
    """Each leaf's halos per dimension: an int is dimension 1 (``pad``) of every leaf sharded on
    dimension 1; a dict gives its leaves an int (dimension 1) or halos per dimension, and a dict
    of dimensions gives an array source's single leaf its halos.

    Examples:
        >>> from jax.sharding import PartitionSpec as P
        >>> resolve_halos(2, {"tokens": P("data", "context"), "w": P("data")}, {"tokens": 2, "w": 1})
        {'tokens': {1: AxisHalo(width=2, boundary='pad')}, 'w': {}}
        >>> resolve_halos({"field": {3: AxisHalo(1, "periodic")}}, {"field": P("data")}, {"field": 4})
        {'field': {3: AxisHalo(width=1, boundary='periodic')}}
        >>> resolve_halos({2: AxisHalo(1, "periodic")}, {None: P("data")}, {None: 3})  # one array
        {None: {2: AxisHalo(width=1, boundary='periodic')}}
    """
    if isinstance(halo, Mapping) and halo and all(isinstance(k, int) for k in halo):
        if None not in specs:  # per dimension: the single leaf of an array source
            raise ValueError(
                f"halo={dict(halo)} gives halos per dimension, which is for an array source's "
                f"single leaf, but the source has leaves {sorted(map(str, specs))}; name the "
                f"leaf, e.g. halo={{{next(iter(specs))!r}: {dict(halo)}}}"
            )
        return {None: _leaf_halos(halo, None, ndims[None])}
    if isinstance(halo, Mapping):
        unknown = sorted(map(str, set(halo) - set(specs)))
        if unknown:
            raise ValueError(f"halo names leaves {unknown} that the source does not have")
        return {k: _leaf_halos(halo.get(k, 0), k, ndims[k]) if k is not None else {} for k in specs}
    check_int("halo", halo, minimum=0)
    sequence = {k for k, s in specs.items() if ndims[k] >= 2 and len(s) > 1 and s[1] is not None}
    if halo and not sequence:
        raise ValueError(
            f"halo={halo} but no leaf is sharded along its sequence dimension (dimension 1); "
            'give a leaf a spec like P("data", "context") or drop the halo'
        )
    return {k: {1: AxisHalo(halo)} if halo and k in sequence else {} for k in specs}


def _leaf_halos(halo: int | Mapping[int, Any], key: Key, ndim: int) -> dict[int, AxisHalo]:
    """One leaf's halos per dimension, each on a dimension the leaf has (widths 0 dropped)."""
    if not isinstance(halo, Mapping):
        if halo and ndim < 2:
            raise ValueError(
                f"halo={halo} for leaf {key!r} needs a sequence dimension (dimension 1), but the "
                f"leaf has {ndim} dimension; give halos only to (batch, sequence, ...) leaves"
            )
        return {1: AxisHalo(halo)} if halo else {}
    missing = sorted(d for d in halo if d >= ndim)
    if missing:
        raise ValueError(
            f"halo gives leaf {key!r} a halo on dimension {missing[0]}, but the leaf has {ndim} "
            f"dimensions (0 is the batch); give halos to dimensions 1..{ndim - 1}"
        )
    return {d: AxisHalo(*h) for d, h in sorted(halo.items()) if h[0]}
