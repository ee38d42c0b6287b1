"""Mixture pod targets, run inside each process of the 4-host non-contiguous pod: several cases
in one pod run, every device shard checked against the block-walking oracle."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, MeshLayout, Mixture
from tests.batch_checks import WindowSource, assert_batch_exact, expected_batch, token_table
from tests.mixture_oracle import OracleLeaf, OracleMixture, tag_leaf

NAMES = ("web", "code")
LENGTHS = (90, 35)
BLOCK = 16
STAGES = [(0, {"web": 3, "code": 1}), (48, {"web": 1, "code": 1}), (112, {"code": 1})]
EDITED = [*STAGES[:2], (96, {"web": 1, "code": 3})]  # a new stage after the resume offset


def data(width: int = 4) -> dict[str, dict[str, np.ndarray]]:
    return {
        name: {
            "tokens": token_table(n, width) + 1_000_000 * i,
            "weight": (np.arange(n) + 0.5 * i).astype(np.float32),
        }
        for i, (name, n) in enumerate(zip(NAMES, LENGTHS, strict=True))
    }


def oracle_batch(stages, sources, source_leaf: str | None = "source", seed: int = 7):
    """The mixture's leaves as lazy tables by offset (tests/mixture_oracle.py)."""
    mixture = OracleMixture(NAMES, LENGTHS, stages, BLOCK, seed)
    leaves: dict[str, Any] = {
        key: OracleLeaf(mixture, [sources[name][key] for name in NAMES])
        for key in sources[NAMES[0]]
    }
    if source_leaf is not None:
        leaves[source_leaf] = tag_leaf(mixture)
    return leaves


def _mesh(process_index, axis_names):
    return MeshLayout(np.asarray(process_index), tuple(axis_names)).build_mesh(jax.devices())


def mixture_cases(process_index, axis_names, mesh_shape) -> dict[str, Any]:
    """(1) 3 stages with a source tag, batch 24, 8 steps; saved at step 3; (2) restored with a
    batch of 16 and an edited future stage; (3) tokens split over ``model`` as a sequence axis:
    each host reads only its columns, through each source's read_window; (4) hosts whose
    mixtures differ are refused."""
    mesh, sources = _mesh(process_index, axis_names), data()
    out: dict[str, Any] = {}
    mix = Mixture(sources, stages=STAGES, block_size=BLOCK, seed=7, source_leaf="source")
    want = oracle_batch(STAGES, sources)
    checked = 0
    # a mixture orders its own rows: the loader reads them in offset order (shuffle=False)
    settings = dict(mesh=mesh, global_batch_size=24, shuffle=False)
    with DataLoader(mix, **settings) as loader:
        it = iter(loader)
        for step in range(8):
            if step == 3:
                out["state"] = it.state()
            checked += assert_batch_exact(next(it), expected_batch(want, step, **settings))
        it.close()
    out["stages"] = checked

    edited = Mixture(sources, stages=EDITED, block_size=BLOCK, seed=7, source_leaf="source")
    want = oracle_batch(EDITED, sources)
    checked = 0
    # from step 3 at offset 3 * 24 (the saved run's), in batches of 16
    settings = dict(mesh=mesh, global_batch_size=16, shuffle=False, start_at=(3, 3 * 24))
    with DataLoader.restore(out["state"], edited, mesh=mesh, global_batch_size=16) as loader:
        for step, batch in zip(range(3, 12), loader, strict=False):
            checked += assert_batch_exact(batch, expected_batch(want, step, **settings))
    out["restored"] = checked

    windows = {name: WindowSource(d) for name, d in data(width=8).items()}
    mix = Mixture(windows, stages=STAGES, block_size=BLOCK, seed=7)
    want = oracle_batch(STAGES, data(width=8), source_leaf=None)
    spec = {"tokens": P("data", "model"), "weight": P("data")}
    checked = 0
    settings = dict(mesh=mesh, global_batch_size=8, batch_spec=spec, shuffle=False)
    with DataLoader(mix, **settings) as loader:
        for source in windows.values():
            source.windows.clear()
        for step, batch in zip(range(6), loader, strict=False):
            checked += assert_batch_exact(batch, expected_batch(want, step, **settings))
    out["context"] = checked
    out["token_columns"] = sorted(
        {
            str(cols["tokens"])
            for source in windows.values()
            for _, cols in source.windows
            if "tokens" in cols
        }
    )
    # (4) a host whose mixture has another stage than the others': refused on every host
    mine = STAGES if jax.process_index() else EDITED
    mix = Mixture(sources, stages=mine, block_size=BLOCK, seed=7)
    try:
        DataLoader(mix, mesh=mesh, global_batch_size=24).close()
        out["disagreement"] = ""
    except ValueError as error:
        out["disagreement"] = str(error)
    return out


def leaf_order_cases(process_index, axis_names, mesh_shape) -> dict[str, Any]:
    """Run with a different ``PYTHONHASHSEED`` on each host: a mixture's batch keys (mask
    included) in one order on every host, and `check_consistency` passing on its batches, also
    when a host hands it the leaves in another order (odd hosts: reversed)."""
    from psdp import ConsistencyError, check_consistency

    mesh, sources = _mesh(process_index, axis_names), data()
    mix = Mixture(sources, stages=STAGES, block_size=BLOCK, seed=7, source_leaf="source")
    want = oracle_batch(STAGES, sources)
    out: dict[str, Any] = {"keys": [], "reports": [], "errors": []}
    settings = dict(mesh=mesh, global_batch_size=24, shuffle=False)  # a mixture orders itself
    with DataLoader(mix, **settings) as loader:
        for step in range(2):
            batch = loader.batch_at(step)
            out["keys"].append(list(batch))
            mine = dict(reversed(batch.items())) if jax.process_index() % 2 else batch
            try:
                # source tags repeat by design: only the rows' own leaves must differ
                out["reports"].append(str(check_consistency(batch, distinct={"tokens", "weight"})))
                out["reports"].append(str(check_consistency(mine, distinct={"tokens", "weight"})))
                expected = expected_batch(want, step, **settings)
                out["reports"].append(str(check_consistency(mine, expected)))
            except ConsistencyError as error:
                out["errors"].append(str(error))
    return out
