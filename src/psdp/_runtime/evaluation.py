"""`eval_loader`: a `DataLoader` for evaluation, one pass over its source in order, then the end
(``docs/guides/evaluate.md``, "Finite loaders: evaluation")."""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.sharding import Mesh

from psdp._plan.options import OrderOptions
from psdp._runtime.loader import DataLoader


def eval_loader(source: Any, *, mesh: Mesh, **options: Any) -> DataLoader:
    """A finite `DataLoader` over ``source``: ``epochs=1`` and ``shuffle=False`` unless given.

    Every example comes exactly once over all hosts, in source order; the last batch is padded and
    masked (the ``mask`` leaf); every host stops at the same step; ``len(loader)`` is the number of
    batches, and each ``iter(loader)`` is a new pass. ``options`` are `DataLoader`'s. A `Mixture`
    of eval sets gets one loader per set: ``{name: eval_loader(source, ...) for name, source in
    mixture.sources.items()}``.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        >>> data = {"id": np.arange(10, dtype=np.int32)}
        >>> with eval_loader(data, mesh=mesh, global_batch_size=4) as loader:
        ...     batches = [np.asarray(b["id"]).tolist() for b in loader]
        >>> len(loader), batches
        (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]])
    """
    order = options.pop("order", None)
    if isinstance(order, OrderOptions):  # a group: its unset fields take the eval defaults
        order = dataclasses.replace(
            order,
            epochs=1 if order.epochs is None else order.epochs,
            shuffle=False if order.shuffle is None else order.shuffle,
        )
        return DataLoader(source, mesh=mesh, order=order, **options)
    if order is not None:  # not a group: the DataLoader's TypeError
        return DataLoader(source, mesh=mesh, order=order, **options)
    return DataLoader(source, mesh=mesh, **{"epochs": 1, "shuffle": False, **options})
