"""``psdp simulate``: a whole pod on one machine, proving every device got exactly its rows.

Mental model. `simulate` is the parent: it resolves the mesh and layout from a `Simulation`
config, writes a small synthetic token dataset to a temporary TensorStore store (unless a source
is given), and starts a local pod with `psdp.tools.pod.run_pod`: N processes on 127.0.0.1, each with
k fake CPU devices and a real ``jax.distributed`` runtime. Every process runs `run_host`:

    mesh = MeshConfig.build()                       the same (non-contiguous) mesh on every host
    loader = LoaderConfig.build(mesh)               reads only this host's rows
    for each step: check_consistency(batch, ...)    collective: every device vs the expected rows
                   train_step(params, batch)        optional: a tiny model, jitted, batch sharded
                                                    as planned, params sharded over model axes

and returns its figures; process 0 also returns the loss curve. The parent turns them into a
`SimulationReport` (plan picture, loss going down, steps/s, loader wait per step, the verdict).

The synthetic rows follow a rule a bigram model can learn (token ``t`` is followed by
``(5 t + 3) mod vocab``), so the loss visibly falls within a few hundred steps, and the expected
rows of any step are recomputed from the row ids alone: an oracle independent of the writer, the
source and the loader.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from psdp._integration.config import LoaderConfig, MeshConfig
from psdp._plan.layout import MeshLayout
from psdp.tools.pod import report_progress, run_pod

#: The mesh of ``make run``: the seed pod of docs/concepts.md (4 hosts x 4 devices, folded).
DEFAULT_MESH = MeshConfig(axes={"data": 4, "model": 4}, layout="noncontiguous")
_MULTIPLIER, _INCREMENT = 5, 3  # a full-period rule mod any power of two


@dataclass(frozen=True)
class Simulation:
    """What ``psdp simulate`` runs: the pod, the loader, and how long.

    Example:
        >>> sim = Simulation(processes=4, steps=20)
        >>> sim.devices_per_process(), sim.token_shape()
        (4, (16, 32))
    """

    processes: int = 4
    """Processes (hosts) of the local pod."""

    mesh: MeshConfig = field(default_factory=lambda: DEFAULT_MESH)
    """The mesh; its axes must hold ``processes`` x k devices."""

    data: LoaderConfig = field(default_factory=lambda: LoaderConfig(global_batch_size=16))
    """The loader; unset ``source`` means a synthetic token dataset."""

    steps: int = 300
    """Steps to run."""

    train: bool = False
    """Train a tiny model on the batches (jitted step, batch sharded as planned)."""

    seq_len: int = 32
    """Tokens per synthetic row."""

    vocab: int = 64
    """Vocabulary of the synthetic rows and the model (a power of two)."""

    rows: int = 2048
    """Rows of the synthetic dataset."""

    learning_rate: float = 2.0
    """SGD learning rate of the tiny model."""

    timeout_s: float = 300.0
    """The whole pod's time limit; stuck processes are stopped after it."""

    fail_at: str | None = None
    """Testing aid ``PROCESS:STEP[:raise|die|hang]``: that process raises, kills itself or hangs
    at that step, to watch the others stop with its message."""

    def __post_init__(self) -> None:
        for name in ("processes", "steps", "seq_len", "rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Simulation.{name} must be an int >= 1, got {value!r}")
        if self.vocab < 2 or self.vocab & (self.vocab - 1):
            raise ValueError(
                f"Simulation.vocab must be a power of two >= 2 (the synthetic rule needs it), got "
                f"{self.vocab!r}; e.g. 64"
            )
        if self.data.global_batch_size is None:
            raise ValueError("Simulation.data.global_batch_size is unset; e.g. 16")
        if self.fail_at is not None:
            _parse_fail_at(self.fail_at, self.processes)
        self.devices_per_process()

    def devices_per_process(self) -> int:
        """The mesh's devices divided by ``processes`` (they must divide evenly)."""
        if self.mesh.axes is None:
            raise ValueError(
                "Simulation.mesh.axes is unset; a simulated pod needs its mesh axes, e.g. "
                "--axes data=4,model=4"
            )
        devices = math.prod(self.mesh.axes.values())
        if devices % self.processes:
            raise ValueError(
                f"--processes {self.processes} does not divide the {devices} devices of the mesh "
                f"{self.mesh.axes}; every process owns the same number of devices"
            )
        return devices // self.processes

    def token_shape(self) -> tuple[int, int]:
        """The global shape of the ``tokens`` leaf of one batch."""
        assert self.data.global_batch_size is not None  # checked in __post_init__
        return (self.data.global_batch_size, self.seq_len)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Simulation:
        raw = dict(raw)
        raw["mesh"] = MeshConfig(**raw["mesh"])
        raw["data"] = LoaderConfig(**raw["data"])
        return cls(**raw)


@dataclass(frozen=True)
class SimulationReport:
    """The outcome of `simulate`: what every host measured and verified; ``str()`` is the report."""

    simulation: Simulation
    picture: str
    source: str
    shape: tuple[int, ...]
    hosts: list[dict[str, Any]]
    seconds: float

    @property
    def losses(self) -> list[float]:
        return list(self.hosts[0].get("losses") or [])

    def to_json(self) -> dict[str, Any]:
        return {
            "simulation": self.simulation.to_json(),
            "source": self.source,
            "shape": list(self.shape),
            "seconds": self.seconds,
            "hosts": self.hosts,
            "verdict": "all devices received exactly their rows",
        }

    def __str__(self) -> str:
        sim, first = self.simulation, self.hosts[0]
        lines = [
            self.picture,
            "",
            f"simulate: {sim.processes} processes x {sim.devices_per_process()} CPU devices "
            f"(jax.distributed on 127.0.0.1), {sim.steps} steps of batch {self.shape} from "
            f"{self.source}",
        ]
        if self.losses:
            lines += _loss_lines(self.losses, first["model"])
        lines += [
            f"speed: {first['steps_per_s']:.1f} steps/s on process 0 (after the first, compiled, "
            f"step; whole pod {self.seconds:.1f} s with start-up)",
            "loader wait per step (process 0): "
            f"p50 {first['wait_ms_p50']:.2f} ms, p99 {first['wait_ms_p99']:.2f} ms, "
            f"{first['wait_fraction']:.1%} of step time; read p50 {first['read_ms_p50']:.2f} ms",
            "rows read per step: "
            + ", ".join(f"p{h['process']} {h['rows_per_step']}" for h in self.hosts)
            + f" of {self.shape[0]}",
            f"checked {sum(h['shards_checked'] for h in self.hosts)} device shards on "
            f"{len(self.hosts)} hosts, every step: {first['consistency']}",
            "all devices received exactly their rows",
        ]
        return "\n".join(lines)


def simulate(
    simulation: Simulation,
    *,
    source: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationReport:
    """Runs ``simulation`` on a local pod and returns what every host verified.

    Args:
        simulation: the pod, loader and steps.
        source: a dataset path (overrides ``simulation.data.source``); unset: a synthetic token
            dataset is written to a temporary TensorStore store and removed afterwards.
        progress: ``progress(done, total)`` as process 0 advances.

    Returns:
        A `SimulationReport`; ``print(report)`` gives the plan picture, the loss curve with
        ``train``, steps/s, the loader wait per step and the verdict.

    Raises:
        psdp.tools.pod.PodError: a host failed (its error first, then every host's output), or the pod
            ran past ``timeout_s``; the other hosts are stopped within seconds.
        ValueError: the configuration does not fit (mesh, processes, batch).

    Example:
        >>> sim = Simulation(processes=2, mesh=MeshConfig(axes={"data": 2, "model": 2}), steps=3)
        >>> report = simulate(sim)
        >>> print(str(report).splitlines()[-1])
        all devices received exactly their rows
    """
    source = source or simulation.data.source
    layout = check_simulation(simulation, source)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="psdp-simulate-") as tmp:
        if source is None:
            path = str(Path(tmp) / "tokens")
            _write_synthetic(path, simulation)
            described, synthetic = f"a synthetic TensorStore dataset ({simulation.rows} rows)", True
        else:
            path, described, synthetic = source, source, False
        hosts = run_pod(
            "psdp.tools.simulate:run_host",
            num_processes=simulation.processes,
            devices_per_process=simulation.devices_per_process(),
            args={"simulation": simulation.to_json(), "path": path, "synthetic": synthetic},
            timeout_s=simulation.timeout_s,
            progress=progress,
        )
    shape, spec = tuple(hosts[0]["shape"]), hosts[0]["spec"]
    picture = _picture(simulation, layout, shape, spec)
    return SimulationReport(
        simulation, picture, described, shape, hosts, time.perf_counter() - started
    )


def check_simulation(simulation: Simulation, source: str | None = None) -> MeshLayout:
    """Checks in the parent, without devices, what the hosts would otherwise fail on.

    Resolves the mesh layout, plans the main leaf's partition spec on it (the synthetic
    ``tokens``, or the source's main leaf), and with ``train`` checks the source's tokens, so that
    a bad ``--spec``, ``--seq-len`` or source fails in one line naming the option, before any data
    is written or any process started. `simulate` calls it first.

    Args:
        simulation: the pod, loader and steps.
        source: a dataset path (overrides ``simulation.data.source``); unset: synthetic rows.

    Returns:
        The `psdp._plan.layout.MeshLayout` of the simulated pod.

    Raises:
        ValueError: the spec, the sequence length or the source does not fit; the message starts
            with the option.

    Example:
        >>> bad = Simulation(
        ...     processes=2,
        ...     mesh=MeshConfig(axes={"data": 2, "context": 2}),
        ...     data=LoaderConfig(global_batch_size=8, partition="data,context"),
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
    layout = simulation.mesh.layout_for(
        simulation.processes, simulation.processes * simulation.devices_per_process()
    )
    leaf, rows = ("tokens", None) if source is None else _main_leaf_rows(simulation, source)
    _check_plan(simulation, layout, leaf, None if rows is None else rows.shape[1:])
    if rows is not None:
        _check_tokens(simulation, leaf, rows)
    return layout


# ------------------------------------------------------------------------------ synthetic data
def synthetic_tokens(ids: np.ndarray, seq_len: int, vocab: int) -> np.ndarray:
    """The synthetic rows ``ids``: row ``r`` starts at ``7919 r mod vocab`` and follows the rule.

    Example:
        >>> synthetic_tokens(np.array([0, 1]), seq_len=4, vocab=64).tolist()
        [[0, 3, 18, 29], [47, 46, 41, 16]]
    """
    tokens = np.empty((len(ids), seq_len), np.int32)
    tokens[:, 0] = (np.asarray(ids, np.int64) * 7919) % vocab
    for column in range(1, seq_len):
        tokens[:, column] = (tokens[:, column - 1] * _MULTIPLIER + _INCREMENT) % vocab
    return tokens


def _write_synthetic(path: str, simulation: Simulation) -> None:
    from psdp.sources.writer import write_dataset

    rows = synthetic_tokens(np.arange(simulation.rows), simulation.seq_len, simulation.vocab)
    write_dataset(path, {"tokens": rows}, rows_per_shard=256, progress=False)


def _main_leaf_rows(simulation: Simulation, path: str) -> tuple[Any, np.ndarray]:
    """The name of the source's main leaf (see `_main_leaf`) and its first rows (up to 256)."""
    from psdp.sources import as_source

    source = as_source(LoaderConfig(source=path).open_source())
    rows: Any = source.read(np.arange(min(len(source), 256)))
    leaves = rows if isinstance(rows, dict) else {None: rows}
    name, sample = _main_leaf(leaves, simulation.data.mask_key or "mask")
    return name, np.asarray(sample)


def _check_plan(
    simulation: Simulation, layout: MeshLayout, leaf: Any, row_shape: tuple[int, ...] | None
) -> None:
    """Plans the main leaf in the parent as every host will, so that a spec or a sequence length
    that does not fit the mesh fails here, in one line naming the option, before any data is
    written or any process started. ``row_shape`` is a source's; None: the synthetic rows."""
    from jax.sharding import AbstractMesh

    from psdp._plan.mesh import plan_pod, spec_axes
    from psdp._plan.partition import physical_batch_size, resolve_spec

    partition = simulation.data.partition
    text = partition.get(leaf, "batch") if isinstance(partition, dict) else partition or "batch"
    option = f"--spec {text!r}"
    strategy: Any = LoaderConfig(partition=text).batch_spec()  # a strategy name or a spec
    shape = (simulation.seq_len,) if row_shape is None else row_shape
    mesh: Any = AbstractMesh(layout.shape, layout.axis_names)  # all that resolve_spec reads
    try:
        spec = resolve_spec(strategy, mesh, batch_axes=simulation.mesh.batch_axes)
        per_dim = spec_axes(layout, spec, 1 + len(shape))
    except ValueError as err:
        raise ValueError(f"{option}: {err}") from None
    shards = math.prod(layout.axis_sizes[a] for a in per_dim[0])
    assert simulation.data.global_batch_size is not None  # checked by Simulation
    rows = physical_batch_size(simulation.data.global_batch_size, [shards])  # padded as the loader
    try:
        plan_pod(layout, spec, (rows, *shape))
    except ValueError as err:
        if row_shape is None:
            raise ValueError(f"--seq-len {simulation.seq_len}: {err}") from None
        raise ValueError(
            f"{option} does not fit {_leaf_text(leaf)} of rows {row_shape}: {err}"
        ) from None


def _check_tokens(simulation: Simulation, name: Any, sample: np.ndarray) -> None:
    """With ``train``: the source's main leaf must be integer token rows below ``vocab``."""
    if not simulation.train:
        return
    vocab = simulation.vocab
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
        f"{_leaf_text(name)} {problem}"
    )


def _leaf_text(name: Any) -> str:
    """How messages name a source's leaf; an array source's single leaf has no name (None)."""
    return "the source's array" if name is None else f"the source's leaf {name!r}"


def _main_leaf(leaves: dict[Any, Any], mask_key: str = "mask") -> tuple[Any, Any]:
    """The leaf the model trains on and the picture shows: ``tokens``, else the first other."""
    name = "tokens" if "tokens" in leaves else next(k for k in leaves if k != mask_key)
    return name, leaves[name]


def _picture(
    simulation: Simulation, layout: MeshLayout, shape: tuple[int, ...], spec: list[Any]
) -> str:
    """The plan picture of the main leaf, with the spec the loader resolved on the hosts."""
    from psdp._plan.picture import render_plan

    entries = tuple(tuple(e) if isinstance(e, list) else e for e in spec)
    return render_plan(layout, simulation.mesh.resolved_batch_axes(), entries, shape)


def _loss_lines(losses: list[float], model: str) -> list[str]:
    marks = sorted({0, *range(49, len(losses), 50), len(losses) - 1})
    lines = [f"train: {model}"]
    lines += [f"  step {i + 1:4d}  loss {losses[i]:.4f}" for i in marks]
    verb = "went down" if losses[-1] < losses[0] else "did NOT go down"
    lines.append(f"  loss {verb}: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return lines


def _parse_fail_at(text: str, processes: int) -> tuple[int, int, str]:
    parts = text.split(":")
    mode = parts[2] if len(parts) == 3 else "raise"
    ok = len(parts) in (2, 3) and all(p.isdigit() for p in parts[:2])
    if not ok or mode not in ("raise", "die", "hang") or int(parts[0]) >= processes:
        raise ValueError(
            f"--fail-at {text!r} must be PROCESS:STEP[:raise|die|hang] with PROCESS < "
            f"{processes}; e.g. --fail-at 1:5"
        )
    return int(parts[0]), int(parts[1]), mode


# ------------------------------------------------------------------------------- on each host
def run_host(simulation: dict[str, Any], path: str, synthetic: bool) -> dict[str, Any]:
    """The pod target: one host's loader (and model) for every step; returns its figures.

    Runs inside a `psdp.tools.pod` process, after ``jax.distributed.initialize``. Every step it checks
    the batch with `psdp.check_consistency` against the expected rows (recomputed from the row
    ids for synthetic data, re-read from the source otherwise).
    """
    import jax

    from psdp._integration.consistency import check_consistency

    sim = Simulation.from_json(simulation)
    me = jax.process_index()
    fail = _parse_fail_at(sim.fail_at, sim.processes) if sim.fail_at else None
    mesh = sim.mesh.build()
    config = LoaderConfig(**{**asdict(sim.data), "source": path})
    trainer = _TinyModel(mesh, sim) if sim.train else None
    losses: list[float] = []
    mask_key = sim.data.mask_key or "mask"
    shape: list[int] = []
    spec: list[Any] = []
    shards, report, first_done, last_note = 0, None, 0.0, 0.0
    with config.build(mesh, batch_axes=sim.mesh.batch_axes) as loader:
        for step, batch in zip(range(sim.steps), loader, strict=False):
            if fail is not None and (me, step) == fail[:2]:
                _fail(fail[2], me, step)
            expected = _expected(loader, batch, step, sim, synthetic)
            report = check_consistency(batch, expected)
            shards += report.local_shards
            if trainer is not None:
                losses.append(trainer.step(batch))
            if step == 0:
                first_done = time.perf_counter()
                main = _main_leaf(batch if isinstance(batch, dict) else {None: batch}, mask_key)[1]
                spec = [list(e) if isinstance(e, tuple) else e for e in main.sharding.spec]
                shape = list(main.shape)
            if me == 0 and (time.perf_counter() - last_note > 0.2 or step + 1 == sim.steps):
                report_progress(step + 1, sim.steps)
                last_note = time.perf_counter()
        elapsed = time.perf_counter() - first_done
        stats = loader.stats()
        rows_per_step = len(loader.plan.read_positions)
    return {
        "process": me,
        "steps": sim.steps,
        "shape": shape,
        "spec": spec,
        "shards_checked": shards,
        "consistency": str(report),
        "rows_per_step": rows_per_step,
        "steps_per_s": (sim.steps - 1) / elapsed if elapsed > 0 else float("nan"),
        "wait_ms_p50": stats.wait_ms_p50,
        "wait_ms_p99": stats.wait_ms_p99,
        "wait_fraction": stats.wait_fraction,
        "read_ms_p50": stats.read_ms_p50,
        "loader": str(stats),
        "model": trainer.describe() if trainer is not None else None,
        "losses": losses if me == 0 else None,
    }


def _fail(mode: str, me: int, step: int) -> None:
    import os
    import signal

    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(10**6)
    raise RuntimeError(f"injected failure: process {me} raised at step {step} (--fail-at)")


def _physical_ids(loader: Any, step: int) -> np.ndarray:
    """The source row id of every row of the step's (physical) batch; negative for padding."""
    if loader.order is None:
        raise ValueError(
            "psdp simulate checks every batch against its source rows, so it needs a "
            "random-access source (a dataset directory or a .npy file), not a stream"
        )
    ids = loader.order.batch_ids(step)
    physical = getattr(loader, "physical_batch_size", len(ids))
    if physical == len(ids):
        return np.asarray(ids)
    out = np.full(physical, -1, np.int64)
    out[loader.plan.real_positions] = ids
    return out


def _expected(loader: Any, batch: Any, step: int, sim: Simulation, synthetic: bool) -> Any:
    """The expected global batch of ``step`` (padding rows filled with ``pad_value``)."""
    ids = _physical_ids(loader, step)
    real = ids >= 0
    if synthetic:
        rows: Any = {"tokens": synthetic_tokens(np.where(real, ids, 0), sim.seq_len, sim.vocab)}
    else:
        rows = loader.source.read(np.where(real, ids, 0))
    leaves = rows if isinstance(rows, dict) else {None: rows}
    out = {}
    for name, value in leaves.items():
        value = np.array(value)
        value[~real] = sim.data.pad_value or 0
        out[name] = value
    if not isinstance(batch, dict):
        return out[None] if None in out else out
    mask_key = sim.data.mask_key or "mask"
    if None in out and None not in batch:  # an array source whose batch gained a mask leaf
        out[next(k for k in batch if k != mask_key)] = out.pop(None)
    if mask_key in batch:
        out[mask_key] = real
    return out


class _TinyModel:
    """A bigram language model (embedding + linear head) trained with plain SGD, all jitted.

    The hidden dimension is sharded over the mesh's non-batch axes (tensor parallelism: the head's
    contraction all-reduces across hosts on a non-contiguous mesh), the batch over the batch axes
    exactly as the loader planned it.
    """

    def __init__(self, mesh: Any, sim: Simulation) -> None:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        batch_axes = sim.mesh.resolved_batch_axes()
        model_axes = tuple(a for a in mesh.axis_names if a not in batch_axes)
        width = 8 * max(1, math.prod(mesh.shape[a] for a in model_axes))
        hidden = None if not model_axes else model_axes[0] if len(model_axes) == 1 else model_axes
        self.summary = (
            f"bigram model, embedding {sim.vocab}x{width} + head, hidden dimension sharded over "
            f"{hidden or 'nothing'}, jitted SGD step, batch sharded over {batch_axes}"
        )

        class Bigram(eqx.Module):
            embed: jax.Array
            head: jax.Array

            def __call__(self, tokens: jax.Array) -> jax.Array:
                return self.embed[tokens] @ self.head

        def init() -> Bigram:
            k1, k2 = jax.random.split(jax.random.key(0))
            return Bigram(
                jax.random.normal(k1, (sim.vocab, width)) * 0.1,
                jax.random.normal(k2, (width, sim.vocab)) * 0.1,
            )

        # a pytree shaped like the model whose leaves are shardings
        shardings = Bigram(
            NamedSharding(mesh, P(None, hidden)),  # type: ignore[arg-type]
            NamedSharding(mesh, P(hidden)),  # type: ignore[arg-type]
        )
        self.params = jax.jit(init, out_shardings=shardings)()
        lr = sim.learning_rate

        def loss_fn(model: Bigram, tokens: jax.Array) -> jax.Array:
            logits = model(tokens[:, :-1])
            logp = jax.nn.log_softmax(logits, axis=-1)
            target = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
            return -target.mean()

        def step(model: Bigram, tokens: jax.Array) -> tuple[Bigram, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(model, tokens)
            return jax.tree.map(lambda p, g: p - lr * g, model, grads), loss

        self._step = jax.jit(step, donate_argnums=0)
        self.mask_key = sim.data.mask_key or "mask"

    def step(self, batch: Any) -> float:
        tokens = _main_leaf(batch, self.mask_key)[1] if isinstance(batch, dict) else batch
        self.params, loss = self._step(self.params, tokens)
        return float(np.asarray(loss.addressable_data(0)))

    def describe(self) -> str:
        return self.summary


def report_json(report: SimulationReport) -> str:
    """The report as indented JSON (what ``psdp simulate --json`` prints)."""
    return json.dumps(report.to_json(), indent=2)
