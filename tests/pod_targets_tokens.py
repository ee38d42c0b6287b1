"""TokenSequences pod target, run inside each process of the 4-host non-contiguous pod
(``data=4 x context=2``, each host one context column of two data rows): every local device
shard of every leaf against the numpy oracle (tests/token_oracle.py) for BATCH, FULL and
``P("data", "context")`` with a pad and a ``continue`` halo, and the token ranges each host's
store reads, counted and compared with the ranges its devices' rows and columns need."""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from psdp import DataLoader, MeshLayout
from psdp.sources import DocumentStore, TokenSequences
from tests import token_oracle
from tests.batch_checks import assert_batch_exact, expected_batch, physical_ids

S, B, HALO = 8, 8, 2  # seq_len, global batch, halo width
STORED = ("input_ids", "loss_mask")
LEAVES = (*STORED, "segment_ids", "positions")


class CountingStore(DocumentStore):
    """A document store that records every token range it reads, per leaf."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ranges: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()  # reads may come from several read threads

    def read_ranges(self, starts, stops, leaves=None):
        with self._lock:
            for name in leaves or self.leaves:
                self.ranges += [(name, int(a), int(b)) for a, b in zip(starts, stops, strict=True)]
        return super().read_ranges(starts, stops, leaves)


def documents() -> list[dict[str, np.ndarray]]:
    docs = token_oracle.documents(seed=7, count=40, mean=9)
    return [{"input_ids": d, "loss_mask": (d % 3 == 0).astype(np.uint8)} for d in docs]


def _cases(docs) -> dict[str, dict[str, Any]]:
    """name -> the loader's options, the rows the oracle expects, and the column shards' halo
    mode (``None``: whole rows)."""
    plain = token_oracle.rows(docs, S)
    context = {k: P("data", "context") for k in LEAVES}
    return {
        "batch": dict(spec="batch", rows=plain, halo=None, mode=None),
        "full": dict(spec="full", rows=plain, halo=None, mode=None),
        "eos+targets": dict(
            spec="batch",
            rows=token_oracle.rows(docs, S, targets=True, eos_id=1),
            halo=None,
            mode=None,
            targets=True,
            eos_id=1,
        ),  # fmt: skip
        "context": dict(spec=context, rows=plain, halo=None, mode="pad", width=0),
        "context+pad halo": dict(
            spec=context, rows=plain, halo={k: HALO for k in LEAVES}, mode="pad", width=HALO
        ),
        "context+continue halo": dict(
            spec=context,
            halo={k: {1: (HALO, "continue")} for k in LEAVES},
            mode="continue",
            rows=token_oracle.continued_rows(docs, S, shards=2, halo=HALO, pad_id=9),
            width=HALO,
        ),  # fmt: skip
    }


def _positions(mesh) -> list[tuple[int, int]]:
    """(data index, context index) of each of this process's devices."""
    where = {d: tuple(int(i) for i in np.argwhere(mesh.devices == d)[0]) for d in mesh.devices.flat}
    return sorted(where[d] for d in jax.local_devices())


def _want_ranges(case, ids, positions, num_tokens) -> list[tuple[str, int, int]]:
    """The token ranges this host needs for the step whose batch holds rows ``ids``: per device
    (data i, context c), the rows it holds, whole or its column shard widened by the halo
    (clipped to the row for a pad halo, to the store for ``continue``)."""
    data, context = 4, 2
    want = set()
    for i, c in positions:
        if case["spec"] == "full":
            rows = ids[(i * context + c) * B // 8 : (i * context + c + 1) * B // 8]
        else:
            rows = ids[i * B // data : (i + 1) * B // data]
        for r in rows.tolist():
            if case["mode"] is None:
                a, b = r * S, r * S + S
            else:
                w, h = S // context, case["width"]
                a, b = r * S + c * w - h, r * S + (c + 1) * w + h
                lo, hi = (r * S, r * S + S) if case["mode"] == "pad" else (0, num_tokens)
                a, b = max(a, lo), min(b, hi)
            want.update((name, a, b) for name in STORED)
    return sorted(want)


def token_shards_exact(process_index, axis_names, mesh_shape) -> dict[str, Any]:
    """Every case of `_cases` at steps 0 and 1: shards checked and ranges counted."""
    mesh = MeshLayout(np.asarray(process_index), tuple(axis_names)).build_mesh(jax.devices())
    docs = documents()
    positions = _positions(mesh)
    shards: dict[str, int] = {}
    ranges: dict[str, int] = {}
    for name, case in _cases(docs).items():
        store = CountingStore.from_documents(docs)
        source = TokenSequences(
            store, S, targets=case.get("targets", False), eos_id=case.get("eos_id"), pad_id=9
        )
        settings = dict(mesh=mesh, global_batch_size=B, batch_spec=case["spec"], seed=3,
                        pad_value=7)  # fmt: skip
        loader = DataLoader(source, halo=case["halo"] or 0, **settings)
        shards[name] = 0
        for step in (0, 1):
            store.ranges.clear()
            batch = loader.batch_at(step)
            # a continue halo's rows come widened already (token_oracle.continued_rows)
            halo = case["halo"] if case["mode"] == "pad" else None
            shards[name] += assert_batch_exact(
                batch, expected_batch(case["rows"], step, halo=halo or 0, **settings)
            )
            if "targets" in case:  # EOS tokens are not stored: its ranges skip them
                continue
            ids = physical_ids(case["rows"], step, **settings)
            want = _want_ranges(case, ids, positions, store.num_tokens)
            assert sorted(store.ranges) == want, (name, step, positions)
            ranges[name] = ranges.get(name, 0) + len(want)
        loader.close()
    return {
        "process": jax.process_index(),
        "positions": positions,
        "shards": shards,
        "ranges": ranges,
    }


def host_reads(process_index, axis_names, seq_len, batch, halos, steps) -> dict[str, Any]:
    """For scripts/measure/token_bytes.py: the tokens, ranges and requests this host's store reads per
    step, for the batch-only spec, the whole batch on every host, and the context spec with each
    ``continue`` halo width of ``halos`` (0: none)."""
    mesh = MeshLayout(np.asarray(process_index), tuple(axis_names)).build_mesh(jax.devices())
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.3, 1.0, 8 * batch * seq_len // 250), 1, 8 * seq_len)
    docs = [rng.integers(3, 50_000, int(n)).astype(np.uint16) for n in lengths]
    leaves = ("input_ids", "segment_ids", "positions")
    cases: dict[str, Any] = {"P(data)": (P("data"), 0), "P() (whole batch)": (P(), 0)}
    for h in halos:
        cases[f"P(data, context), halo {h}"] = (P("data", "context"), h)
    out: dict[str, Any] = {}
    for name, (spec, h) in cases.items():
        store = CountingStore.from_documents(docs)
        calls = []
        original = store.read_ranges

        def counted(starts, stops, leaves=None, _original=original, _calls=calls):
            _calls.append(len(starts))
            return _original(starts, stops, leaves)

        store.read_ranges = counted  # type: ignore[method-assign]
        halo = {k: {1: (h, "continue")} for k in leaves} if h else 0
        loader = DataLoader(
            TokenSequences(store, seq_len), mesh=mesh, global_batch_size=batch,
            batch_spec={k: spec for k in leaves}, halo=halo, seed=1,
        )  # fmt: skip
        per_step = []
        for step in range(steps):
            store.ranges.clear()
            calls.clear()
            loader.batch_at(step)
            tokens = sum(b - a for _, a, b in store.ranges)
            per_step.append({"tokens": tokens, "ranges": len(store.ranges), "requests": len(calls)})
        loader.close()
        out[name] = per_step
    return {"process": jax.process_index(), "reads": out}
