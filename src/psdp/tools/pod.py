"""A local pod: N real JAX processes on 127.0.0.1, each with k fake CPU devices, running one function;
a failing process stops the others within seconds (``docs/guides/local-pod.md``, "The local pod")."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["PodError", "run_pod"]  # what a user's own pod needs; the rest serves psdp's tools

_GRACE_S = 5.0  # how long the others get to exit by themselves after one child failed
_POLL_S = 0.05
_ECHO_WAIT_S = 1.0  # how long a failed child waits to learn it only echoed another's failure
_LEADER_WAIT_S = 0.5  # at most this long process 0 outlives the others (< _ECHO_WAIT_S)
#: What JAX's distributed client logs when it aborts its process because another one died.
_JAX_PEER_DIED = "JAX distributed service detected fatal errors"
#: Exit status of a child stopped by the watchdog because another process failed.
STOPPED = 3
#: Environment variable naming the file `report_progress` writes (set by `run_pod`).
PROGRESS_ENV = "PSDP_POD_PROGRESS"

Child = tuple[subprocess.Popen[bytes], Path, Path]


class PodError(RuntimeError):
    """A pod process failed or the pod ran past its time limit; the message has every output.

    Attributes:
        reason: the first line: which process failed and its error (or the time limit).
        outputs: ``(exit status, output)`` of every process, in process order.
    """

    def __init__(self, message: str, reason: str = "", outputs: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.outputs = list(outputs)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_pod(
    target: str | Callable[..., Any],
    *,
    num_processes: int,
    devices_per_process: int,
    args: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    env: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    echo: IO[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
) -> list[Any]:
    """Runs ``target(**args)`` in ``num_processes`` JAX processes and returns their results.

    Args:
        target: a module-level function, ``"package.module:function"`` or
            ``"path/to/file.py:function"``; it runs after ``jax.distributed.initialize`` and
            returns something JSON-able. A function's module is imported in each child from the
            folder it was imported from here, whatever the working directory.
        num_processes: how many processes (hosts) to launch.
        devices_per_process: fake CPU devices per process.
        args: keyword arguments for the target (JSON-able).
        timeout_s: the whole pod's time limit.
        env: extra environment variables for the children: one dict for all, or a list of one
            dict per process (e.g. a different ``PYTHONHASHSEED`` on each host).
        progress: called as ``progress(done, total)`` whenever process 0's target reports
            progress with `report_progress` (e.g. to move a progress bar).
        echo: a text stream (e.g. ``sys.stdout``) that shows every process's output while it
            runs, each line prefixed by its process index: ``[p1] step 3 loss 2.1``.
        log_dir: a folder (made if missing) that keeps each process's output as ``p0.log``,
            ``p1.log``, ... (replacing logs of an earlier run) whether the pod succeeds or
            fails; unset: the output lives in a temporary folder, removed at the end.

    Raises:
        TypeError: ``target`` is a function a child process cannot import by name (a lambda, a
            nested function, one defined in ``__main__``), or ``echo`` is not a text stream.
        ValueError: ``log_dir`` is a file.
        PodError: a child exited non-zero, exited 0 without returning (``os._exit(0)`` in the
            target), or the pod timed out; the message starts with the failing process and its
            error, then each child's exit status and the tail of its output. The other children
            are stopped within about `_GRACE_S` seconds.

    Examples:
        >>> results = run_pod("psdp.tools.pod:_describe_host", num_processes=2, devices_per_process=2)
        >>> results
        [{'process': 0, 'devices': 4}, {'process': 1, 'devices': 4}]
    """
    named, root = target_of(target)
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"a pod needs at least one process and one device per process, got "
            f"num_processes={num_processes}, devices_per_process={devices_per_process}"
        )
    envs = [env] * num_processes if env is None or isinstance(env, Mapping) else list(env)
    if len(envs) != num_processes:
        raise ValueError(
            f"env is a list of {len(envs)} environments for {num_processes} processes; give one "
            "dict per process, or one dict for all"
        )
    if echo is not None and not all(callable(getattr(echo, m, None)) for m in ("write", "flush")):
        raise TypeError(
            f"run_pod's echo must be a text stream (write and flush), such as sys.stdout, got "
            f"{type(echo).__name__} {echo!r}; pass echo=sys.stdout to see the output live"
        )
    logs = _log_folder(log_dir)
    coordinator = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="psdp-pod-") as name:
        tmp = Path(name)
        children = [
            _start_child(
                tmp, logs or tmp, i, coordinator, num_processes, devices_per_process, named,
                root, args, envs[i],
            )
            for i in range(num_processes)
        ]  # fmt: skip
        tails = None if echo is None else _Tails([log for _, log, _ in children], echo)
        watch = _Watch(tmp, children, time.monotonic() + timeout_s, timeout_s, progress, tails)
        try:
            failure = watch.wait()
        except BaseException:  # Ctrl-C, or a progress callback that raised: leave no orphans
            watch.kill_all()
            raise
        finally:
            if tails is not None:
                tails.show(final=True)
        outputs = [(proc.returncode, log.read_text(errors="replace")) for proc, log, _ in children]
        if failure:
            kept = f"\nthe output of every process is kept in {logs}" if logs else ""
            raise PodError(_report(failure, named, outputs) + kept, failure, outputs)
        return [json.loads(result.read_text()) for _, _, result in children]


def _log_folder(log_dir: str | os.PathLike[str] | None) -> Path | None:
    """``log_dir`` made (with its parents) when missing."""
    if log_dir is None:
        return None
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"run_pod's log_dir must be a folder to keep each process's output in, but "
            f"{str(path)!r} is a file; name a folder (it is made if missing)"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def report_progress(done: int, total: int) -> None:
    """Inside a pod target: tells the parent how far this process is (a no-op elsewhere).

    Examples:
        >>> report_progress(3, 10)  # outside a pod: nothing happens
    """
    path = os.environ.get(PROGRESS_ENV)
    if path:
        partial = f"{path}.tmp"
        Path(partial).write_text(f"{int(done)} {int(total)}")
        os.replace(partial, path)


def target_of(target: str | Callable[..., Any]) -> tuple[str, str | None]:
    """``(target string, folder to import it from)`` for `run_pod`'s children.

    A string is kept as given (no folder). A function becomes ``"module:name"`` and the folder
    that holds its top-level package, so a child finds the same module as this process did, even
    from another working directory or where another installed package has the same name.

    Examples:
        >>> target_of(target_of)[0]
        'psdp.tools.pod:target_of'
        >>> target_of(lambda: 0)
        Traceback (most recent call last):
        ...
        TypeError: run_pod needs a target that a child process can import by name: a function at the top level of a module, got <lambda> of psdp.tools.pod; define it at the top level of a module, or pass 'package.module:function'
    """
    if isinstance(target, str):
        return target, None
    if not isinstance(target, types.FunctionType):
        raise TypeError(
            f"run_pod's target must be a function or a 'package.module:function' string, got "
            f"{type(target).__name__} {target!r}"
        )
    module, name = target.__module__, target.__qualname__
    loaded = sys.modules.get(module)
    if name != target.__name__ or module == "__main__" or getattr(loaded, name, None) is not target:
        raise TypeError(
            "run_pod needs a target that a child process can import by name: a function at the "
            f"top level of a module, got {name} of {module}; define it at the top level of a "
            "module, or pass 'package.module:function'"
        )
    return f"{module}:{name}", _import_root(module, getattr(loaded, "__file__", None))


def _import_root(module: str, file: str | None) -> str | None:
    """The folder on ``sys.path`` that ``module`` (loaded from ``file``) was imported from."""
    if file is None:  # a namespace package or a built-in: the child finds it as this one did
        return None
    path = Path(file).resolve()
    depth = module.count(".") + (path.stem == "__init__")
    return str(path.parents[depth])


def _start_child(
    tmp: Path,
    logs: Path,
    index: int,
    coordinator: str,
    num_processes: int,
    devices: int,
    target: str,
    root: str | None,
    args: dict[str, Any] | None,
    env: Mapping[str, str] | None,
) -> Child:
    log, result = logs / f"p{index}.log", tmp / f"p{index}.json"
    # unbuffered: a line is in the log (and on the echo) when printed, not when a buffer fills
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), "JAX_PLATFORMS": "cpu"}
    child_env["JAX_NUM_CPU_DEVICES"] = str(devices)
    child_env[PROGRESS_ENV] = str(tmp / f"p{index}.progress")
    command = [
        sys.executable, "-m", "psdp.tools.pod",
        "--coordinator", coordinator,
        "--num-processes", str(num_processes),
        "--process-id", str(index),
        "--devices", str(devices),
        "--target", target,
        *(["--import-root", root] if root else []),
        "--args", json.dumps(args or {}),
        "--result", str(result),
        "--abort-file", str(tmp / ("abort-leader" if index == 0 else "abort")),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env)
    return proc, log, result


class _Watch:
    """The parent's loop: waits for the children, aborts the rest after a failure, kills stragglers."""

    def __init__(
        self,
        tmp: Path,
        children: list[Child],
        deadline: float,
        timeout_s: float,
        progress: Callable[[int, int], None] | None,
        tails: _Tails | None = None,
    ) -> None:
        self.tmp, self.children, self.deadline, self.timeout_s = tmp, children, deadline, timeout_s
        self.progress, self.tails = progress, tails
        self.shown = ""
        self.leader_at: float | None = None  # when process 0 is told to stop, after a failure

    def wait(self) -> str:
        """Returns "" when every child succeeded, else why the pod failed (after stopping all)."""
        failure = ""
        while True:
            codes = [proc.poll() for proc, _, _ in self.children]
            self._show_progress()
            if self.tails is not None:
                self.tails.show()
            returned = [
                code == 0 and result.exists()
                for code, (_, _, result) in zip(codes, self.children, strict=True)
            ]
            if all(returned):
                return ""
            # status 0 without a result file: the target left by os._exit(0), never returning
            failed = [
                i for i, code in enumerate(codes) if code not in (None, STOPPED) and not returned[i]
            ]
            if failed and not failure:
                first = min(failed, key=lambda i: self._failed_when(i, codes[i]))
                failure = self._why(first, codes[first])
                self._abort(failure)
            if failure:
                self._stop_leader_when_alone(failure, codes)
            if all(code is not None for code in codes):
                return failure or "every process exited, but not all succeeded"
            if time.monotonic() > self.deadline:
                if not failure:
                    failure = (
                        f"the pod ran past its time limit of {self.timeout_s:g} s; stuck "
                        "processes were stopped"
                    )
                    self.deadline = time.monotonic() + 1.0  # time to print their message
                    self._abort(failure)
                    continue
                self.kill_all()
                return failure
            time.sleep(_POLL_S)

    def _failed_when(self, index: int, code: int | None) -> float:
        """When a child failed, to find the first of several seen at once: the others often fail
        as a consequence (a collective loses its peer). A death by signal ranks first, as it is
        never such a consequence, unless JAX's client aborted the process because another one
        died (jax 0.6 and 0.7 do when process 0 leaves); then the time of each child's error file."""
        if code is not None and code < 0:
            log = self.children[index][1].read_text(errors="replace")
            return float("inf") if _JAX_PEER_DIED in log else -1.0
        try:
            return (self.tmp / f"p{index}.error").stat().st_mtime
        except FileNotFoundError:
            return float("inf")

    def _why(self, index: int, code: int | None) -> str:
        error = self.tmp / f"p{index}.error"
        if code == 0:
            return f"process {index} exited with status 0 without returning a result"
        if error.exists():
            detail = error.read_text(errors="replace").strip()
        elif code is not None and code < 0:
            detail = f"killed by signal {signal.Signals(-code).name}"
        else:
            detail = "no Python error recorded (see its output below)"
        return f"process {index} exited with status {code}: {detail}"

    def _abort(self, reason: str) -> None:
        """Stops every child but process 0 now (see `_stop_leader_when_alone`)."""
        _write_atomically(self.tmp / "abort", reason)
        now = time.monotonic()
        self.deadline = min(self.deadline, now + _GRACE_S)
        self.leader_at = now + min(_LEADER_WAIT_S, (self.deadline - now) / 2)

    def _stop_leader_when_alone(self, reason: str, codes: list[int | None]) -> None:
        """Stops process 0 once the others have exited (or it waited long enough)."""
        leader_file = self.tmp / "abort-leader"
        alone = all(code is not None for code in codes[1:])
        late = self.leader_at is not None and time.monotonic() >= self.leader_at
        if (alone or late) and not leader_file.exists():
            _write_atomically(leader_file, reason)

    def kill_all(self) -> None:
        for proc, _, _ in self.children:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def _show_progress(self) -> None:
        if self.progress is None:
            return
        path = self.tmp / "p0.progress"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        if text and text != self.shown:
            self.shown = text
            done, total = (int(v) for v in text.split())
            self.progress(done, total)


class _Tails:
    """Follows the children's logs and writes each new complete line to ``echo`` with its
    process prefix (the logs stay the record; the echo is only a view of them)."""

    def __init__(self, logs: list[Path], echo: IO[str]) -> None:
        self.logs, self.echo = logs, echo
        self.read = [0] * len(logs)  # bytes of each log shown (or held in `partial`)
        self.partial = [b""] * len(logs)  # each log's last line, until its newline arrives

    def show(self, final: bool = False) -> None:
        """Writes the lines completed since the last call; ``final``: unfinished lines too."""
        for i, log in enumerate(self.logs):
            with log.open("rb") as file:
                file.seek(self.read[i])
                new = file.read()
            self.read[i] += len(new)
            *lines, self.partial[i] = (self.partial[i] + new).split(b"\n")
            if final and self.partial[i]:
                lines.append(self.partial[i])
                self.partial[i] = b""
            for line in lines:
                self.echo.write(f"[p{i}] {line.decode(errors='replace')}\n")
        self.echo.flush()


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.tmp")
    partial.write_text(text)
    os.replace(partial, path)


def _report(failure: str, target: str, outputs: list[tuple[int | None, str]]) -> str:
    lines = [f"pod running {target} failed: {failure}"]
    for i, (code, text) in enumerate(outputs):
        tail = "\n    ".join(text.strip().splitlines()[-25:])
        lines.append(f"--- process {i} (exit status {code}):\n    {tail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the child
def load_target(target: str, import_root: str | None = None) -> Callable[..., Any]:
    """Imports ``"module:function"`` (from ``import_root`` first, when given) or
    ``"path/to/file.py:function"``: a file in a package is imported as that package's module (the
    package's folder importable), any other file as a script (its folder importable)."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(
            f"target {target!r} must look like 'path/to/file.py:function' or "
            "'package.module:function'"
        )
    if where.endswith(".py"):
        path = Path(where).resolve()
        import_root, where = _module_of_file(path)
        if "." not in where:  # no package: run the file as a script, its siblings importable
            sys.path.insert(0, import_root)
            return getattr(_exec_file(path, where), name)
    if import_root is not None:
        sys.path.insert(0, import_root)
    return getattr(importlib.import_module(where), name)


def _module_of_file(path: Path) -> tuple[str, str]:
    """``(folder to import from, dotted module name)`` of a ``.py`` file: the package it sits in
    (folders with ``__init__.py``) is part of the name."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return str(folder), ".".join(parts)


def _exec_file(path: Path, name: str) -> types.ModuleType:
    """Runs a script file as module ``name`` (a file that is no package's module)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _describe_host() -> dict[str, int]:
    """A minimal pod target: this process's index and the pod's device count."""
    import jax

    return {"process": jax.process_index(), "devices": jax.device_count()}


def _watchdog(abort_file: Path, process_id: int) -> None:
    """Exits this process with `STOPPED` as soon as the parent writes the abort file."""
    while not abort_file.exists():
        time.sleep(_POLL_S)
    reason = abort_file.read_text(errors="replace").strip()
    print(f"psdp pod: process {process_id} stops: {reason}", file=sys.stderr, flush=True)
    os._exit(STOPPED)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip jax.distributed's exit barrier: the others may be gone


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one process of a local psdp pod")
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--import-root")
    parser.add_argument("--args", default="{}")
    parser.add_argument("--result", required=True)
    parser.add_argument("--abort-file")
    opts = parser.parse_args(argv)
    if opts.abort_file:
        threading.Thread(
            target=_watchdog,
            args=(Path(opts.abort_file), opts.process_id),
            name="psdp-pod-watchdog",
            daemon=True,
        ).start()
    try:
        import jax

        jax.config.update("jax_num_cpu_devices", opts.devices)
        jax.distributed.initialize(
            opts.coordinator,
            num_processes=opts.num_processes,
            process_id=opts.process_id,
            initialization_timeout=60,
        )
        result = load_target(opts.target, opts.import_root)(**json.loads(opts.args))
        Path(opts.result).write_text(json.dumps(result))
        jax.distributed.shutdown()  # a barrier: process 0 hosts the coordinator the others need
    except BaseException as err:
        traceback.print_exc()
        error = Path(opts.result).with_suffix(".error")
        error.write_text(f"{type(err).__name__}: {' '.join(str(err).split())}"[:2000])
        if opts.abort_file:
            # Often this error is only the echo of another process's failure (a collective lost
            # its peer): give the parent time to name the first failure; the watchdog then
            # exits with STOPPED and that reason.
            time.sleep(_ECHO_WAIT_S)
        _exit(1)
    _exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
