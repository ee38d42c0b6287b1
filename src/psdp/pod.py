"""A local pod: N real JAX processes on 127.0.0.1, each with k fake CPU devices, running one function.

Mental model: `run_pod` is a tiny multi-controller launcher. It picks a free port, starts N copies
of ``python -m psdp.pod`` (each sets its CPU device count *before* JAX starts, then calls
``jax.distributed.initialize`` against the coordinator on that port) and waits. Each child imports
the target function (``path/to/file.py:function`` or ``package.module:function``), calls it with
the JSON arguments, and writes its JSON-able result to a file. The parent returns the results in
process order, or raises `PodError` with every child's output when any child fails or the pod
overruns its time limit; stragglers are killed, so a stuck child never hangs the caller.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_GRACE_S = 5.0  # how long the others get to exit by themselves after one child failed


class PodError(RuntimeError):
    """A pod process failed or the pod ran past its time limit; the message has every output."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_pod(
    target: str,
    *,
    num_processes: int,
    devices_per_process: int,
    args: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Runs ``target(**args)`` in ``num_processes`` JAX processes and returns their results.

    Args:
        target: ``"path/to/file.py:function"`` or ``"package.module:function"``; the function runs
            after ``jax.distributed.initialize`` and returns something JSON-able.
        num_processes: how many processes (hosts) to launch.
        devices_per_process: fake CPU devices per process.
        args: keyword arguments for the target (JSON-able).
        timeout_s: the whole pod's time limit.
        env: extra environment variables for the children.

    Raises:
        PodError: a child exited non-zero or the pod timed out; the message has each child's
            exit status and the tail of its output.
    """
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"a pod needs at least one process and one device per process, got "
            f"num_processes={num_processes}, devices_per_process={devices_per_process}"
        )
    coordinator = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="psdp-pod-") as tmp:
        children = [
            _start_child(
                Path(tmp), i, coordinator, num_processes, devices_per_process, target, args, env
            )
            for i in range(num_processes)
        ]
        failure = _wait(children, time.monotonic() + timeout_s)
        outputs = [(proc.returncode, log.read_text(errors="replace")) for proc, log, _ in children]
        if failure:
            raise PodError(_report(failure, target, outputs))
        return [json.loads(result.read_text()) for _, _, result in children]


def _start_child(
    tmp: Path,
    index: int,
    coordinator: str,
    num_processes: int,
    devices: int,
    target: str,
    args: dict[str, Any] | None,
    env: dict[str, str] | None,
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    log, result = tmp / f"p{index}.log", tmp / f"p{index}.json"
    child_env = {**os.environ, **(env or {}), "JAX_PLATFORMS": "cpu"}
    child_env["JAX_NUM_CPU_DEVICES"] = str(devices)
    command = [
        sys.executable, "-m", "psdp.pod",
        "--coordinator", coordinator,
        "--num-processes", str(num_processes),
        "--process-id", str(index),
        "--devices", str(devices),
        "--target", target,
        "--args", json.dumps(args or {}),
        "--result", str(result),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env)
    return proc, log, result


def _wait(children: list[tuple[subprocess.Popen[bytes], Path, Path]], deadline: float) -> str:
    """Waits for all children; returns "" on success or why the pod failed (after killing)."""
    failure = ""
    while True:
        codes = [proc.poll() for proc, _, _ in children]
        if all(code == 0 for code in codes):
            return ""
        failed = [i for i, code in enumerate(codes) if code not in (0, None)]
        if failed and not failure:
            failure = f"process {failed[0]} exited with status {codes[failed[0]]}"
            deadline = min(deadline, time.monotonic() + _GRACE_S)
        if all(code is not None for code in codes):
            return failure
        if time.monotonic() > deadline:
            for proc, _, _ in children:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            return failure or "the pod ran past its time limit; stuck processes were killed"
        time.sleep(0.05)


def _report(failure: str, target: str, outputs: list[tuple[int | None, str]]) -> str:
    lines = [f"pod running {target} failed: {failure}"]
    for i, (code, text) in enumerate(outputs):
        tail = "\n    ".join(text.strip().splitlines()[-25:])
        lines.append(f"--- process {i} (exit status {code}):\n    {tail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the child
def load_target(target: str) -> Callable[..., Any]:
    """Imports ``"file.py:function"`` (its folder importable, as for a script) or ``"module:function"``."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(f"target {target!r} must look like 'path/to/file.py:function'")
    if where.endswith(".py"):
        sys.path.insert(
            0, str(Path(where).resolve().parent)
        )  # its siblings import, as for a script
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {where!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one process of a local psdp pod")
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--args", default="{}")
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)
    try:
        import jax

        jax.config.update("jax_num_cpu_devices", opts.devices)
        jax.distributed.initialize(
            opts.coordinator,
            num_processes=opts.num_processes,
            process_id=opts.process_id,
            initialization_timeout=60,
        )
        result = load_target(opts.target)(**json.loads(opts.args))
        Path(opts.result).write_text(json.dumps(result))
        jax.distributed.shutdown()  # a barrier: process 0 hosts the coordinator the others need
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip jax.distributed's exit barrier: the others may be gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
