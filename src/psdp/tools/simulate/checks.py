"""What ``psdp simulate`` checks in the parent, before any data is written or process started: the
main leaf's plan on the mesh, and with ``--train`` the source's tokens (``docs/reference/cli.md``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from psdp import MeshLayout, ShardingOptions, plan_pod
from psdp._plan.leaves import Key, leaf_label, leaves_of
from psdp._plan.partition import batch_shards, physical_batch_size, resolve_spec
from psdp.tools.simulate.config import Simulation
from psdp.tools.simulate.data import is_document_store, main_leaf, open_source


def check_simulation(simulation: Simulation, source: str | None = None) -> MeshLayout:
    """Checks in the parent, without devices, what the hosts would otherwise fail on.

    Plans the main leaf (the synthetic ``tokens``, or the source's main leaf) on the pod's layout
    and, with ``train``, checks the source's tokens, so that a bad ``--batch-spec``,
    ``--seq-len`` or source fails in one line naming the option. `psdp.tools.simulate.simulate`
    calls it first.

    Args:
        simulation: the pod, loader and steps.
        source: a dataset path (overrides ``simulation.data.source``); unset: synthetic rows.

    Returns:
        The `psdp.MeshLayout` of the simulated pod.

    Raises:
        ValueError: the spec, the sequence length or the source does not fit; the message starts
            with the option.

    Examples:
        >>> from psdp import LoaderConfig, MeshConfig
        >>> bad = Simulation(
        ...     processes=2,
        ...     mesh=MeshConfig(axes={"data": 2, "context": 2}),
        ...     data=LoaderConfig.create(global_batch_size=8, batch_spec="data,context"),
        ...     seq_len=7,
        ... )
        >>> try:
        ...     check_simulation(bad)
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        --seq-len 7: dimension 1 of size 7 is not divisible by its 2 shards (context=2), and every shard must hold the same number of entries
        >>> check_simulation(Simulation(processes=4)).num_processes
        4
    """
    source = source or simulation.data.source
    if simulation.packing is not None and source is not None and not is_document_store(source):
        raise ValueError(
            f"--packing packs documents, but the source {source!r} is no document store (a "
            "dataset of rows, or a .npy file); drop --packing, or give a document store (psdp "
            "write --offsets or --eos-id writes one from token files)"
        )
    layout = simulation.mesh.layout_for(
        simulation.processes, simulation.processes * simulation.devices_per_process()
    )
    if source is None:
        check_plan(
            simulation, layout, "tokens" if simulation.packing is None else "input_ids", None
        )
        return layout
    leaf, sample = source_sample(source, simulation)
    check_plan(simulation, layout, leaf, sample.shape[1:])
    if simulation.train:
        check_tokens(simulation.vocab, leaf, sample)
    return layout


def source_sample(path: str, simulation: Simulation) -> tuple[Key, np.ndarray]:
    """The name of the source's main leaf (`main_leaf`) and its first rows (up to 256); a
    document store is read through its token view, as the hosts read it."""
    try:
        source = open_source(path, simulation.seq_len, simulation.packing)
    except ValueError as err:  # a view that does not fit the store: name the options
        if not is_document_store(path):
            raise
        raise ValueError(f"--source {path!r} --seq-len {simulation.seq_len}: {err}") from None
    rows = source.read(np.arange(min(len(source), 256)))
    name, sample = main_leaf(leaves_of(rows), simulation.data.output.mask_key or "mask")
    return name, np.asarray(sample)


def check_plan(
    simulation: Simulation, layout: MeshLayout, leaf: Key, row_shape: tuple[int, ...] | None
) -> None:
    """Plans ``leaf`` as every host will; ``row_shape`` is a source's (None: synthetic rows)."""
    from jax.sharding import AbstractMesh

    text = simulation.batch_spec_text(leaf)
    option = f"--batch-spec {text!r}"
    shape = (simulation.seq_len,) if row_shape is None else row_shape
    mesh: Any = AbstractMesh(layout.shape, layout.axis_names)  # all that resolve_spec reads
    try:
        spec = resolve_spec(
            ShardingOptions(batch_spec=text).batch_spec,  # type: ignore[arg-type]  # not a dict
            mesh,
            batch_axes=simulation.mesh.batch_axes,
        )
        # every shard count divides the device count: this plan fails only on the spec itself
        plan_pod(layout, spec, (layout.num_devices,) * (1 + len(shape)))
    except ValueError as err:
        raise ValueError(f"{option}: {err}") from None
    batch = simulation.data.order.global_batch_size
    assert isinstance(batch, int)  # checked by Simulation
    rows = physical_batch_size(batch, [batch_shards(mesh, spec)])
    try:
        plan_pod(layout, spec, (rows, *shape))
    except ValueError as err:
        if row_shape is None:
            raise ValueError(f"--seq-len {simulation.seq_len}: {err}") from None
        raise ValueError(
            f"{option} does not fit {leaf_label(leaf)} of rows {shape}: {err}"
        ) from None


def check_tokens(vocab: int, leaf: Key, sample: np.ndarray) -> None:
    """For ``--train``: ``leaf`` must hold integer token rows in ``[0, vocab)``."""
    if not np.issubdtype(sample.dtype, np.integer):
        problem = f"has dtype {sample.dtype}, not integer token ids; drop --train"
    elif sample.ndim != 2:
        problem = (
            f"has rows of shape {sample.shape[1:]}, not sequences of tokens (a leaf of shape "
            "(rows, seq_len)); drop --train"
        )
    elif sample.min() < 0 or sample.max() >= vocab:
        problem = (
            f"has values {sample.min()}..{sample.max()}; pass --vocab above the largest token "
            "(tokens must be >= 0), or drop --train"
        )
    else:
        return
    raise ValueError(
        f"--train fits a bigram model to rows of integer tokens in [0, {vocab}), but "
        f"{leaf_label(leaf)} {problem}"
    )
