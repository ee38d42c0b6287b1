"""What ``psdp simulate`` prints: the plan picture, the loss curve, speed, and the verdict
(``docs/reference/cli.md``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psdp import MeshLayout
from psdp._plan.picture import render_plan
from psdp.tools.simulate.config import Simulation

VERDICT = "all devices received exactly their rows"


@dataclass(frozen=True)
class SimulationReport:
    """The outcome of `psdp.tools.simulate.simulate`: what every host measured and verified;
    ``str()`` is the report."""

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
            "verdict": VERDICT,
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
            lines += loss_lines(self.losses, first["model"])
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
            VERDICT,
        ]
        return "\n".join(lines)


def report_json(report: SimulationReport) -> str:
    """The report as indented JSON (what ``psdp simulate --json`` prints)."""
    return json.dumps(report.to_json(), indent=2)


def loss_lines(losses: list[float], model: str) -> list[str]:
    """The loss every 50 steps, first and last, and whether it went down.

    Examples:
        >>> print("\\n".join(loss_lines([4.0, 2.0, 1.0], "a model")))
        train: a model
          step    1  loss 4.0000
          step    3  loss 1.0000
          loss went down: 4.0000 -> 1.0000
    """
    marks = sorted({0, *range(49, len(losses), 50), len(losses) - 1})
    lines = [f"train: {model}"]
    lines += [f"  step {i + 1:4d}  loss {losses[i]:.4f}" for i in marks]
    verb = "went down" if losses[-1] < losses[0] else "did NOT go down"
    lines.append(f"  loss {verb}: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return lines


def plan_picture(
    simulation: Simulation, layout: MeshLayout, shape: tuple[int, ...], spec: list[Any]
) -> str:
    """The plan picture of the main leaf, with the spec the loader resolved on the hosts."""
    entries = tuple(tuple(e) if isinstance(e, list) else e for e in spec)
    return render_plan(layout, simulation.mesh.resolved_batch_axes(), entries, shape)
