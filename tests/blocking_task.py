"""A prepare task that says it started and waits for the test's word, for tests that act on a
run at a known point (another run, a kill) instead of after a sleep.

`run` is the driver: ``python -m tests.blocking_task DIR INPUTS OUTPUT TOKENIZER WORKERS``. Each
task first creates ``DIR/started-<pid>`` (the pid of the process that runs it), then waits until
``DIR/go`` exists, then runs the real task.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from psdp.prepare.tasks import run_task


def blocking_task(task: Any, report: Any = None) -> Any:
    where = Path(os.environ["PSDP_TEST_DIR"])
    (where / f"started-{os.getpid()}").touch()
    while not (where / "go").exists():
        time.sleep(0.01)
    return run_task(task, report)


def started(where: Path) -> list[int]:
    """The pids of the processes that started a task."""
    return sorted(int(p.name.split("-")[1]) for p in where.glob("started-*"))


def main(argv: list[str]) -> None:
    where, inputs, output, tokenizer, workers = argv
    os.environ["PSDP_TEST_DIR"] = where  # spawned workers inherit it
    import psdp.prepare

    package = sys.modules["psdp.prepare"]
    package.run_task = blocking_task  # type: ignore[attr-defined]
    psdp.prepare(inputs, output, tokenizer=tokenizer, eos=1, workers=int(workers), progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
