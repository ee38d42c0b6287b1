"""A batch-size ramp with skips, saved on the 4-host non-contiguous pod and resumed on a 2-host
pod with another batch size: every device shard checked against the oracle, each sample once.

    python scripts/measure/resume_ramp.py

Prints each step's offset, batch size, real rows and epoch on both pods, the shards checked, and
the offsets read twice or lost (both must be none). The pods are those of
tests/test_schedule.py::test_a_ramp_saved_on_four_hosts_resumes_on_two_with_a_new_batch_size.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import pod_targets_schedule as targets
from tests.batch_checks import run_on_noncontiguous_pod

from psdp.tools.pod import run_pod

SAVE_AT, STEPS, NEW_BATCH = 9, 14, 96


def _table(title: str, steps: list[dict]) -> None:
    print(title)
    print("  step  offset  batch  rows  epoch")
    for s in steps:
        print(
            f"  {s['step']:>4}  {s['offset']:>6}  {s['batch_size']:>5}  {s['rows']:>4}  {s['epoch']:>5}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args(argv)
    # SAVE_AT + 1 steps checked; the state saved when SAVE_AT batches were taken
    first = run_on_noncontiguous_pod(targets.ramp_then_save, steps=SAVE_AT + 1, save_at=SAVE_AT,
                                     timeout_s=240)  # fmt: skip
    state = first[0]["state"]
    print(f"4 hosts (data=4 x model=2, non-contiguous), global_batch_size={targets.RAMP}, "
          f"skip_steps={targets.SKIP_STEPS}, skip_offsets={targets.SKIP_OFFSETS}")  # fmt: skip
    _table("", first[0]["steps"][:SAVE_AT])
    print(f"  device shards checked (steps 0-{SAVE_AT}): {sum(r['checked'] for r in first)}")
    print(f"saved at step {state['step']}: offset {state['offset']}")
    layout = dict(process_index=[[0, 1], [1, 0], [0, 1], [1, 0]], axis_names=["data", "model"])
    second = run_pod(
        targets.restore_and_check, num_processes=2, devices_per_process=4, timeout_s=240,
        args=layout | dict(mesh_shape=[4, 2], state=state, steps=STEPS,
                           changes={"global_batch_size": NEW_BATCH}),
    )  # fmt: skip
    print(
        f"2 hosts (4 devices each, each host in all 4 data groups), global_batch_size={NEW_BATCH}"
    )
    _table("", second[0]["steps"])
    print(f"  device shards checked: {sum(r['checked'] for r in second)}")
    spans = first[0]["steps"][:SAVE_AT] + second[0]["steps"]
    offsets = [g for s in spans for g in range(s["offset"], s["offset"] + s["rows"])]
    skipped = set()
    for first_offset, end in targets.SKIP_OFFSETS:
        skipped |= set(range(first_offset, end))
    span = set(range(max(offsets) + 1))
    twice = len(offsets) - len(set(offsets))
    print(f"offsets read: {len(offsets)}; read twice: {twice}; offsets below the last one "
          f"neither read nor skipped: {len(span - set(offsets) - skipped)} (the step skips)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
