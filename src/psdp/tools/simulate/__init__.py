"""``psdp simulate``: a whole pod on one machine, checking that every device got exactly its rows.

How it runs (the parent, the hosts, the synthetic rows and the checks): ``docs/reference/cli.md``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from psdp.tools.pod import run_pod
from psdp.tools.simulate.checks import check_simulation
from psdp.tools.simulate.config import DEFAULT_MESH, Simulation
from psdp.tools.simulate.data import (
    describe_store,
    is_document_store,
    synthetic_tokens,
    write_synthetic,
)
from psdp.tools.simulate.host import TARGET, run_host
from psdp.tools.simulate.report import SimulationReport, plan_picture, report_json

__all__ = [
    "DEFAULT_MESH",
    "Simulation",
    "SimulationReport",
    "check_simulation",
    "report_json",
    "run_host",
    "simulate",
    "synthetic_tokens",
]


def simulate(
    simulation: Simulation,
    *,
    source: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationReport:
    """Runs ``simulation`` on a local pod and returns what every host verified.

    Args:
        simulation: the pod, loader and steps.
        source: a dataset path, ``.npy`` file or document store (read as `psdp.TokenSequences`
            of ``seq_len``, or packed with ``packing``); overrides ``simulation.data.source``;
            unset: a synthetic token dataset is written to a temporary TensorStore store and
            removed afterwards.
        progress: ``progress(done, total)`` as process 0 advances.

    Returns:
        A `SimulationReport`; ``print(report)`` gives the plan picture, the loss curve with
        ``train``, steps/s, the loader wait per step and the verdict.

    Raises:
        psdp.tools.pod.PodError: a host failed (its error first, then every host's output), or the
            pod ran past ``timeout_s``; the other hosts are stopped within seconds.
        ValueError: the configuration does not fit (mesh, processes, batch, spec, source).

    Examples:
        >>> from psdp import MeshConfig
        >>> sim = Simulation(processes=2, mesh=MeshConfig(axes={"data": 2, "model": 2}), steps=3)
        >>> print(str(simulate(sim)).splitlines()[-1])
        all devices received exactly their rows
    """
    source = source or simulation.data.source
    layout = check_simulation(simulation, source)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="psdp-simulate-") as tmp:
        path: str | None
        if simulation.packing is not None and source is None:
            path, synthetic = None, False  # every host packs the same synthetic documents
            described = (
                f"{simulation.rows} synthetic documents packed ({simulation.packing}) into "
                f"sequences of {simulation.seq_len}"
            )
        elif source is None:
            path, synthetic = str(Path(tmp) / "tokens"), True
            write_synthetic(path, simulation.rows, simulation.seq_len, simulation.vocab)
            described = f"a synthetic TensorStore dataset ({simulation.rows} rows)"
        elif is_document_store(source):
            path, synthetic = source, False
            described = describe_store(source, simulation.seq_len, simulation.packing)
        else:
            path, described, synthetic = source, source, False
        hosts = run_pod(
            TARGET,
            num_processes=simulation.processes,
            devices_per_process=simulation.devices_per_process(),
            args={"simulation": simulation.to_json(), "path": path, "synthetic": synthetic},
            timeout_s=simulation.timeout_s,
            progress=progress,
        )
    shape = tuple(hosts[0]["shape"])
    picture = plan_picture(simulation, layout, shape, hosts[0]["spec"])
    return SimulationReport(
        simulation, picture, described, shape, hosts, time.perf_counter() - started
    )
