"""`Simulation`: what ``psdp simulate`` runs, checked when made (``docs/reference/cli.md``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from psdp import PACKING_STRATEGIES, LoaderConfig, MeshConfig
from psdp._plan.spec_text import spec_text

#: The mesh of ``make run``: the pod of docs/concepts/mesh.md (4 hosts x 4 devices, folded).
DEFAULT_MESH = MeshConfig(axes={"data": 4, "model": 4}, layout="noncontiguous")
#: What ``--fail-at`` makes a process do at its step.
FAIL_MODES = ("raise", "die", "hang")


@dataclass(frozen=True)
class Simulation:
    """What ``psdp simulate`` runs: the pod, the loader, and how long.

    Examples:
        >>> sim = Simulation(processes=4, steps=20)
        >>> sim.devices_per_process(), sim.token_shape()
        (4, (16, 32))
    """

    processes: int = 4
    """Processes (hosts) of the local pod."""

    mesh: MeshConfig = field(default_factory=lambda: DEFAULT_MESH)
    """The mesh; its axes must hold ``processes`` x k devices."""

    data: LoaderConfig = field(default_factory=lambda: LoaderConfig.create(global_batch_size=16))
    """The loader; unset ``source`` means a synthetic token dataset."""

    steps: int = 300
    """Steps to run."""

    train: bool = False
    """Train a tiny model on the batches (jitted step, batch sharded as planned)."""

    seq_len: int = 32
    """Tokens per synthetic row, or per row of a document store's token view."""

    vocab: int = 64
    """Vocabulary of the synthetic rows and the model (a power of two)."""

    rows: int = 2048
    """Rows of the synthetic dataset (documents, with ``packing``)."""

    packing: str | None = None
    """Pack documents into sequences of ``seq_len`` with this strategy
    (`psdp.PACKING_STRATEGIES`), a `psdp.PackedSequences` source that every host builds: the
    source's documents when it is a document store, else synthetic documents of 1 to
    ``2 * seq_len`` tokens; ``None``: fixed rows (a document store's `psdp.TokenSequences`)."""

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
        if self.data.order.global_batch_size is None:
            raise ValueError("Simulation.data.global_batch_size is unset; e.g. 16")
        if not isinstance(self.data.order.global_batch_size, int):
            raise ValueError(
                f"Simulation.data.global_batch_size is the schedule "
                f"{self.data.order.global_batch_size}, but the simulator trains with one batch "
                "size; pass an int, e.g. 16"
            )
        if self.packing is not None and self.packing not in PACKING_STRATEGIES:
            raise ValueError(
                f"Simulation.packing must be one of {list(PACKING_STRATEGIES)} or None, got "
                f"{self.packing!r}; e.g. --packing best_fit"
            )
        if self.fail_at is not None:
            parse_fail_at(self.fail_at, self.processes)
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
        batch = self.data.order.global_batch_size
        assert isinstance(batch, int)  # checked in __post_init__
        return (batch, self.seq_len)

    def batch_spec_text(self, leaf: str | None) -> str:
        """The batch spec (a strategy name or spec text) the loader gives ``leaf``.

        Examples:
            >>> data = LoaderConfig.create(global_batch_size=8, batch_spec={"tokens": "data,model"})
            >>> sim = Simulation(data=data)
            >>> sim.batch_spec_text("tokens"), sim.batch_spec_text("mask")
            ('data,model', 'batch')
        """
        given: Any = self.data.sharding.batch_spec
        if isinstance(given, dict):
            given = None if leaf is None else given.get(leaf)
        given = given or "batch"
        return given if isinstance(given, str) else spec_text(given)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "data": self.data.to_dict()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Simulation:
        raw = dict(raw)
        raw["mesh"] = MeshConfig(**raw["mesh"])
        raw["data"] = LoaderConfig.from_dict(raw["data"])
        return cls(**raw)


def parse_fail_at(text: str, processes: int) -> tuple[int, int, str]:
    """``--fail-at PROCESS:STEP[:MODE]`` as (process, step, mode).

    Examples:
        >>> parse_fail_at("1:5", processes=4), parse_fail_at("0:2:hang", processes=4)
        ((1, 5, 'raise'), (0, 2, 'hang'))
    """
    parts = text.split(":")
    mode = parts[2] if len(parts) == 3 else "raise"
    ok = len(parts) in (2, 3) and all(p.isdigit() for p in parts[:2])
    if not ok or mode not in FAIL_MODES or int(parts[0]) >= processes:
        raise ValueError(
            f"--fail-at {text!r} must be PROCESS:STEP[:{'|'.join(FAIL_MODES)}] with PROCESS < "
            f"{processes}; e.g. --fail-at 1:5"
        )
    return int(parts[0]), int(parts[1]), mode
