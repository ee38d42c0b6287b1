"""Pod targets for hosts that disagree, meshes over some processes, and streams of unequal shards.

One target, `host_cases`, runs several named cases one after another in every process of one pod
(a pod start costs seconds), and returns per case either ``"ok"`` with figures, or the error it
raised as ``[type, message]``. Every case that builds a loader builds it on every process of its
mesh in the same order, as a trainer does. Oracles are plain numpy on rows that name themselves
(``token_table``), with the positions written out by hand for the layouts used here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from psdp import DataLoader, MeshLayout
from psdp._plan.order import PAD
from psdp.sources import StreamSource
from tests.batch_checks import assert_batch_exact, expected_global, token_table

ROWS = 64
B = 8


def _full_mesh(process_index, axis_names, mesh_shape) -> Mesh:
    layout = MeshLayout(np.asarray(process_index).reshape(mesh_shape), tuple(axis_names))
    return layout.build_mesh(jax.devices())


def _subset_mesh(rows: list[int]) -> Mesh:
    """A 1-D ``data`` mesh over the devices of some processes: row ``i`` is a device of ``rows[i]``."""
    by_process: dict[int, list[Any]] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    taken = dict.fromkeys(by_process, 0)
    grid = []
    for p in rows:
        grid.append(by_process[p][taken[p]])
        taken[p] += 1
    return Mesh(np.array(grid), ("data",))


def _data(rows: int = ROWS) -> dict[str, np.ndarray]:
    return {"tokens": token_table(ROWS, width=8)[:rows]}


def _unshuffled_ids(step: int, batch: int, physical: int, rows: int = ROWS) -> np.ndarray:
    """The documented unshuffled order, written independently: step s holds rows s*B .. s*B+B-1
    of its epoch (the last batch short), then PAD up to the physical batch."""
    per_epoch = -(-rows // batch)
    start = (step % per_epoch) * batch
    ids = np.full(physical, PAD, np.int64)
    real = np.arange(start, min(start + batch, rows))
    ids[: len(real)] = real
    return ids


def _expected(data: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
    """The oracle batch at ``ids``, with the mask every dict batch carries."""
    return expected_global(data, ids) | {"mask": ids != PAD}


def _build(source: Any, mesh: Mesh, **kwargs: Any) -> None:
    """Builds a loader and closes it: ``None`` means it was accepted."""
    DataLoader(source, mesh=mesh, **kwargs).close()


def _error(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except Exception as error:  # the case's answer: its type and message
        return [type(error).__name__, " ".join(str(error).split())]
    return result


# ------------------------------------------------------------------------- host agreement
def _agreeing(mesh: Mesh) -> Any:
    """Every host builds the same loader: it checks, and batch 0..2 are exact on every shard."""
    data = _data()
    shards = 0
    with DataLoader(data, mesh=mesh, global_batch_size=B, shuffle=False) as loader:
        for step, batch in zip(range(3), loader, strict=False):
            shards += assert_batch_exact(batch, _expected(data, _unshuffled_ids(step, B, B)))
    return ["ok", shards]


def _per_host_seed(mesh: Mesh) -> Any:
    seed = 100 + jax.process_index()  # seed=time.time() and friends
    return _error(lambda: _build(_data(), mesh, global_batch_size=B, seed=seed))


def _stale_copy(mesh: Mesh) -> Any:
    rows = ROWS - 1 if jax.process_index() == 3 else ROWS  # one host's copy lacks the last row
    return _error(lambda: _build(_data(rows), mesh, global_batch_size=B))


def _other_spec(mesh: Mesh) -> Any:
    spec = "replicated" if jax.process_index() == 2 else "batch"
    return _error(lambda: _build(_data(), mesh, global_batch_size=B, batch_spec=spec))


def _restore_other_step(mesh: Mesh) -> Any:
    with DataLoader(_data(), mesh=mesh, global_batch_size=B) as loader:
        state = loader.state()
    step = 2 if jax.process_index() == 1 else 3  # one host read an older checkpoint
    state |= {"step": step, "offset": step * B}
    return _error(lambda: DataLoader.restore(state, _data(), mesh=mesh).close())


def _restore_same_step(mesh: Mesh) -> Any:
    data = _data()
    with DataLoader(data, mesh=mesh, global_batch_size=B, shuffle=False) as loader:
        state = loader.state() | {"step": 3, "offset": 3 * B}
    with DataLoader.restore(state, data, mesh=mesh) as loader:
        batch = next(iter(loader))
        return ["ok", assert_batch_exact(batch, _expected(data, _unshuffled_ids(3, B, B)))]


def _other_start(mesh: Mesh) -> Any:
    """Process 2 continues from another sample offset than the others (a per-host start_at)."""
    start = (2, 20) if jax.process_index() == 2 else (2, 16)
    return _error(lambda: _build(_data(), mesh, global_batch_size=B, start_at=start))


# --------------------------------------------------------------- one host's failure, everywhere
def _timed(call: Callable[[], Any]) -> Any:
    """The answer of ``call`` (its error as ``[type, message]``), and its seconds."""
    started = time.monotonic()
    answer = _error(call)
    return [*(answer if isinstance(answer, list) else [answer]), time.monotonic() - started]


def _others_fail_to_build(mesh: Mesh) -> Any:
    """Processes 1-3 pass a wrong process_index (a ValueError before they reach the agreement);
    process 0 builds its loader and waits for them."""
    me = jax.process_index()
    wrong = None if me == 0 else (me + 1) % jax.process_count()
    return _timed(lambda: _build(_data(), mesh, global_batch_size=B, process_index=wrong))


def _others_fail_to_restore(mesh: Mesh) -> Any:
    """Processes 1-3 restore with another seed than the saved one (a ValueError before their
    loader is built); process 0 restores as it should."""
    with DataLoader(_data(), mesh=mesh, global_batch_size=B, seed=5) as loader:
        state = loader.state()
    seed = {"seed": 7} if jax.process_index() > 0 else {}
    return _timed(lambda: DataLoader.restore(state, _data(), mesh=mesh, **seed).close())


# ------------------------------------------------------------------------- process index
def _other_process_index(mesh: Mesh) -> Any:
    """Every host passes the next host's index: a clear error at construction, not a KeyError."""
    wrong = (jax.process_index() + 1) % jax.process_count()
    return _error(lambda: _build(_data(), mesh, global_batch_size=B, process_index=wrong))


# ------------------------------------------------------------------ mesh over some processes
def _subset(mesh_rows: list[int], batch: int, steps: int, shuffle_seed: int | None = None) -> Any:
    """A ``data`` mesh over some processes; the others must be refused with a clear error.

    The processes of the mesh check every local shard of ``steps`` batches against the numpy
    oracle, and run a reduction over the whole mesh (only they take part in it).
    """
    mesh = _subset_mesh(mesh_rows)
    data = {**_data(), "weight": np.arange(ROWS, dtype=np.float32)}
    if jax.process_index() not in mesh_rows:
        return _error(lambda: _build(data, mesh, global_batch_size=batch))
    physical = -(-batch // len(mesh_rows)) * len(mesh_rows)
    shards, totals = 0, []
    with DataLoader(data, mesh=mesh, global_batch_size=batch, shuffle=False) as loader:
        for step, got in zip(range(steps), loader, strict=False):
            ids = _unshuffled_ids(step, batch, physical)
            want = expected_global(data, ids)
            want["mask"] = ids != PAD  # every dict batch carries the mask
            shards += assert_batch_exact(got, want)
            totals.append(float(jax.jit(lambda w: w.sum())(got["weight"])))
            assert totals[-1] == float(want["weight"].sum()), (step, totals[-1])
    return ["ok", shards, totals]


def _subset_stale_copy() -> Any:
    """Processes 0 and 2 share a mesh, 1 and 3 another; process 2's copy is stale. Only the first
    mesh's processes are refused, and only they take part in its check."""
    rows = [0, 2, 0, 2] if jax.process_index() in (0, 2) else [1, 3, 1, 3]
    mesh = _subset_mesh(rows)
    stale = ROWS - 1 if jax.process_index() == 2 else ROWS
    return _error(lambda: _build(_data(stale), mesh, global_batch_size=B))


# ---------------------------------------------------------------------- unequal stream shards
def _unequal_shards(shard: int, num_shards: int):
    """Shard ``u`` holds ``20 - 6u`` elements named ``1 + u * 1000 + k``: shard 1 ends first."""
    for k in range(20 - 6 * shard):
        yield {"x": np.int32(1 + shard * 1000 + k)}


def _stream_to_its_end(mesh: Mesh, drop_last: bool) -> Any:
    """Iterates until the loader stops, with a collective per batch (a hang would show here).

    On the data=4 x model=2 pod, uid 0 (hosts 0, 1) holds batch positions 0, 1, 4, 5 and uid 1
    (hosts 2, 3) positions 2, 3, 6, 7: 4 elements per host per step. Shard 1 has 14 elements:
    3 full steps, then 2 elements at step 3.
    """
    source = StreamSource(_unequal_shards, name="unequal")
    positions = {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    lengths = {0: 20, 1: 14}
    started = time.monotonic()
    loader = DataLoader(source, mesh=mesh, global_batch_size=B, shuffle=False, drop_last=drop_last)
    iterator = iter(loader)
    real_rows, shards = [], 0
    with loader:
        for step in range(10):
            try:
                batch = next(iterator)
            except StopIteration as end:
                return ["end", step, str(end), real_rows, shards, time.monotonic() - started]
            want = np.zeros(B, np.int32)
            mask = np.zeros(B, bool)
            for uid, where in positions.items():
                for j, position in enumerate(where):
                    k = step * 4 + j
                    if k < lengths[uid]:
                        want[position], mask[position] = 1 + uid * 1000 + k, True
            expected = {"x": want, "mask": mask}  # every dict batch carries the mask
            shards += assert_batch_exact(batch, expected)
            # a collective over every host (a host that stopped early would hang it); pads are 0
            real_rows.append(int(jax.jit(lambda x: (x != 0).sum())(batch["x"])))
    return ["no end", real_rows]


# ---------------------------------------------------------------------------------- timeout
def _missing_host(mesh: Mesh, timeout_s: float) -> Any:
    """Process 3 never builds its loader: the others get a TimeoutError naming it, in bounded time.

    The short timeout applies from here on, so this case runs last."""
    import psdp._runtime.agreement

    psdp._runtime.agreement.TIMEOUT_S = timeout_s
    if jax.process_index() == 3:
        return "skipped"
    return _error(lambda: _build(_data(), mesh, global_batch_size=B))


def host_cases(process_index, axis_names, mesh_shape, cases, missing_host_timeout_s=3.0):
    """Runs the named cases in order on every process; returns {case: answer}."""
    mesh = _full_mesh(process_index, axis_names, mesh_shape)
    table: dict[str, Callable[[], Any]] = {
        "agreeing": lambda: _agreeing(mesh),
        "per-host seed": lambda: _per_host_seed(mesh),
        "stale copy": lambda: _stale_copy(mesh),
        "other spec": lambda: _other_spec(mesh),
        "restore other step": lambda: _restore_other_step(mesh),
        "restore same step": lambda: _restore_same_step(mesh),
        "other start offset": lambda: _other_start(mesh),
        "hosts 1-3 fail to build": lambda: _others_fail_to_build(mesh),
        "hosts 1-3 fail to restore": lambda: _others_fail_to_restore(mesh),
        "other process index": lambda: _other_process_index(mesh),
        "subset {0, 2}": lambda: _subset([0, 2, 0, 2], batch=8, steps=3),
        "subset {0, 2} padded": lambda: _subset([0, 2], batch=6, steps=12),
        "subset stale copy": _subset_stale_copy,
        "stream padded end": lambda: _stream_to_its_end(mesh, drop_last=False),
        "stream dropped end": lambda: _stream_to_its_end(mesh, drop_last=True),
        "missing host": lambda: _missing_host(mesh, missing_host_timeout_s),
    }
    out = {}
    for case in cases:
        out[case] = _error(table[case])
    return {"process": jax.process_index(), **out}


# ------------------------------------------------------------------------------ measurement
def _endless(shard: int, num_shards: int):
    k = 0
    while True:
        yield {"x": np.int32(shard * 1_000_000 + k)}
        k += 1


def agreement_cost(process_index, axis_names, mesh_shape, steps=300, repeats=20):
    """Milliseconds (median) of: one construction agreement; one stream step's agreement alone;
    a stream step through batch_at with and without it; one tiny device all-gather, for scale."""
    from jax.experimental import multihost_utils

    from psdp._runtime.agreement import StreamEnds, agree

    mesh = _full_mesh(process_index, axis_names, mesh_shape)
    processes = list(range(jax.process_count()))

    def median_ms(call: Callable[[int], Any], count: int) -> float:
        times = []
        for i in range(count):
            started = time.perf_counter()
            call(i)
            times.append(time.perf_counter() - started)
        return 1e3 * float(np.median(times))

    out = {"construction agree": median_ms(lambda i: agree({"seed": 0}, processes, "x"), repeats)}
    ends = StreamEnds(agree({"n": 1}, processes, "x"), processes, 0, "stream")
    out["stream step agree"] = median_ms(
        lambda i: ends.short_shards("m", i, 4, 4, lambda: False), steps
    )
    source = StreamSource(_endless, name="endless")
    with DataLoader(source, mesh=mesh, global_batch_size=B, shuffle=False) as loader:
        loader.batch_at(0)  # warm up: open the shard, compile nothing further
        out["batch_at with agreement"] = median_ms(lambda i: loader.batch_at(i + 1), steps)
        loader.feed.ends = None  # the same loader without the agreement
        out["batch_at without"] = median_ms(lambda i: loader.batch_at(steps + i + 1), steps)
    flag = np.int32(1)
    multihost_utils.process_allgather(flag)  # compile once
    out["device all-gather"] = median_ms(lambda i: multihost_utils.process_allgather(flag), steps)
    return {"process": jax.process_index(), **{k: round(v, 3) for k, v in out.items()}}
