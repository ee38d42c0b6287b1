"""Start-up on 1 to 1,024 simulated hosts, on moto's S3 server on 127.0.0.1: the table of
docs/measurements/scale.md, "Hosts".

Every host of an N-host pod (``data=N x model=2``, a host per data row, 4 rows a host per step)
opens one dataset through a counting proxy (a plain dataset of rows, or a document store read as
`TokenSequences`), builds its `DataLoader` and reads its first batch, host after host in this
process (`tests.host_startup`); every host's boxes are checked against the written rows. Then all
hosts agree at once, one thread and one client of a real coordination service each. Printed per
pod, over its hosts: the S3 requests (open, loader build, first batch), the seconds of each
phase and of planning alone, the agreement's round trips and bytes per host, the process ids its
barriers name, and its seconds (until the last host leaves; in one process, so no network).

    python scripts/measure/host_scale.py [--hosts 1,8,64,256,1024] [--kinds plain,docs] [--json]

Takes about 10 minutes with 1,024 hosts (moto answers each request in ~30 ms; a host makes 7 or
19); ``--hosts 1,8,64`` about 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

GOAL = "start-up S3 requests per host independent of the host count"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,8,64,256,1024", help="pod sizes, comma-separated")
    parser.add_argument("--kinds", default="plain,docs", help="plain and/or docs")
    parser.add_argument("--json", action="store_true", help="print every host's figures")
    return parser.parse_args(argv)


def row(run: dict[str, Any], spread: Any) -> str:
    """One pod's line of the table."""
    hosts, starts, agreements = run["hosts"], run["startups"], run["agreements"]

    def span(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
        low, mid, high = (v * scale for v in spread(values))
        if low == high:
            return f"{mid:.{digits}f}"
        return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

    def figure(name: str) -> list[float]:
        return [s[name] for s in starts]

    def agreed(name: str) -> list[float]:
        return [a.get(name, 0) for a in agreements]

    return " | ".join(
        [
            f"| {run['kind']}",
            f"{hosts:,}",
            span(figure("open_requests")),
            span(figure("build_requests")),
            span(figure("first_batch_requests")),
            span(figure("open_s"), 1e3),
            span(figure("planning_s"), 1e3, 2),
            span(figure("first_batch_s"), 1e3),
            span(agreed("round_trips")),
            span(agreed("bytes_sent")),
            span(agreed("bytes_received")),
            span(agreed("barrier_ids_sent")),
            f"{max(run['agreement_s']) * 1e3:.1f} |",
        ]
    )


HEADER = (
    "| dataset | hosts | S3 requests: open | build | first batch | open ms | planning ms "
    "| first batch ms | agreement round trips | bytes sent | bytes received | barrier ids "
    "| agreement ms (last host) |\n" + "|---" * 13 + "|"
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pods = [int(n) for n in args.hosts.split(",")]
    # the mesh needs 2 devices a host, set before JAX starts
    os.environ["JAX_NUM_CPU_DEVICES"] = str(max(16, 2 * max(pods)))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(Path(__file__).parents[2]))  # tests.host_startup
    from tests.host_startup import measure, spread

    runs = measure(pods, args.kinds.split(","))
    if args.json:
        print(json.dumps(runs))
        return 0
    print("per host, median (min-max) over the pod's hosts; one process, moto on 127.0.0.1")
    print(HEADER)
    for run in runs:
        print(row(run, spread))
    met = all(
        len({(s["open_requests"], s["build_requests"], s["first_batch_requests"])
             for r in runs if r["kind"] == kind for s in r["startups"]}) == 1
        for kind in {r["kind"] for r in runs}
    )  # fmt: skip
    print(f"\ngoal: {GOAL}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
