"""The cost of `run_pod`'s live output: a 2-process pod whose processes each print ``--lines``
lines, run alternately without and with ``echo=`` (to a stream that drops the text), ``--repeats``
times each; prints the median wall time of each (``docs/guides/local-pod.md``, "Your own trainer on a local pod").

    python scripts/measure/pod_echo_cost.py [--lines 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from psdp.tools.pod import run_pod


def chatty(lines: int) -> int:
    """The pod target: prints ``lines`` lines, as a trainer logs its steps."""
    for i in range(lines):
        print(f"step {i} loss {1.0 / (i + 1):.4f}")
    return lines


class _Dropped(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    target = f"{Path(__file__).resolve()}:chatty"
    times: dict[str, list[float]] = {"without echo": [], "with echo": []}
    for _ in range(opts.repeats):
        for name, echo in (("without echo", None), ("with echo", _Dropped())):
            started = time.perf_counter()
            run_pod(target, num_processes=2, devices_per_process=1, args={"lines": opts.lines},
                    echo=echo)  # fmt: skip
            times[name].append(time.perf_counter() - started)
    for name, seconds in times.items():
        print(f"{name}: median {statistics.median(seconds):.2f} s over {opts.repeats} pods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
