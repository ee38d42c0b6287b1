"""Hosts that must agree: settings checked across processes, meshes over some processes, the
process index, and streams whose shards end at different steps.

The multi-process cases share one pod run (`tests/pod_targets_hosts.py`): 4 processes x 2 CPU
devices on the ``data=4 x model=2`` non-contiguous layout, where each tensor-parallel group spans
two hosts.
"""

from __future__ import annotations

import pytest

from tests.batch_checks import run_on_noncontiguous_pod
from tests.pod_targets_hosts import host_cases

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]  # the pod: 240 s, plus a minute

POD_CASES = [
    "agreeing",
    "per-host seed",
    "stale copy",
    "other spec",
    "restore other step",
    "restore same step",
    "other start offset",
    "hosts 1-3 fail to build",
    "hosts 1-3 fail to restore",
    "other process index",
    "subset {0, 2}",
    "subset {0, 2} padded",
    "subset stale copy",
    "stream padded end",
    "stream dropped end",
    "missing host",  # last: the host that skipped a loader is out of step from here on
]


@pytest.fixture(scope="module")
def pod() -> list[dict]:
    return run_on_noncontiguous_pod(
        host_cases, cases=POD_CASES, missing_host_timeout_s=3, timeout_s=240
    )


def _answers(pod: list[dict], case: str) -> list:
    return [result[case] for result in pod]


def _message(answer: list, error: str = "ValueError") -> str:
    assert answer[0] == error, answer
    return answer[1]


# ----------------------------------------------------------------------- item 3: agreement
def test_hosts_that_agree_pass_and_get_exact_batches(pod):
    # 1 leaf x 2 local devices x 3 steps, each shard against the numpy oracle
    assert _answers(pod, "agreeing") == [["ok", 12]] * 4  # tokens and mask x 2 devices x 3 steps
    assert _answers(pod, "restore same step") == [["ok", 4]] * 4


def test_a_per_host_seed_is_refused_on_every_host(pod):
    for answer in _answers(pod, "per-host seed"):
        message = _message(answer)
        assert "seed" in message
        for p in range(4):
            assert f"process {p} has {100 + p}" in message, message
        assert "the same seed on every host" in message


def test_a_stale_copy_on_one_host_is_refused_on_every_host(pod):
    for answer in _answers(pod, "stale copy"):
        message = _message(answer)
        assert "source rows" in message
        assert "processes 0, 1, 2 have 64" in message and "process 3 has 63" in message, message
        assert "the same dataset" in message


def test_another_batch_spec_on_one_host_is_refused_on_every_host(pod):
    for answer in _answers(pod, "other spec"):
        message = _message(answer)
        assert "batch_spec" in message and "process 2 has" in message, message


def test_restoring_other_steps_on_different_hosts_is_refused(pod):
    for answer in _answers(pod, "restore other step"):
        message = _message(answer)
        assert "step" in message and "process 1 has 2" in message, message
        assert "processes 0, 2, 3 have 3" in message, message


def test_a_host_that_never_builds_its_loader_is_named_in_bounded_time(pod):
    answers = _answers(pod, "missing host")
    assert answers[3] == "skipped"
    for answer in answers[:3]:
        message = _message(answer, "TimeoutError")
        assert "process 3 of the mesh did not arrive within 3 s" in message, message


def test_hosts_given_different_start_offsets_are_refused_on_every_host(pod):
    for answer in _answers(pod, "other start offset"):
        message = _message(answer)
        assert "start offset (processes 0, 1, 3 have 16, process 2 has 20)" in message, message
        assert "start step" not in message  # the steps agree
        assert "pass the same start_at everywhere" in message


# ------------------------------------------------------- one host's failure reaches every host
@pytest.mark.parametrize(
    ("case", "doing", "cause"),
    [
        (
            "hosts 1-3 fail to build",
            "building",
            "ValueError: process_index={next} is not this process",
        ),
        (
            "hosts 1-3 fail to restore",
            "restoring",
            "ValueError: resuming with seed=7, but the saved state has seed=5",
        ),
    ],
)
def test_a_failure_on_some_hosts_reaches_every_host_within_seconds(pod, case, doing, cause):
    answers = _answers(pod, case)
    for p in (1, 2, 3):  # each failing host raises its own error
        kind, message, _ = answers[p]
        assert f"{kind}: {message}".startswith(cause.format(next=(p + 1) % 4)), answers[p]
    kind, message, _ = answers[0]  # the host that waited for them names each, and its cause
    assert kind == "HostFailedError", answers[0]
    assert message.startswith("processes 1, 2, 3 of the mesh failed"), message
    for p in (1, 2, 3):
        what = f"process {p} ({doing} DataLoader 'psdp-loader'): {cause.format(next=(p + 1) % 4)}"
        assert what in message, message
    # a hang guard, as the pod's own timeout is: it waited 300 s before (the agreement's timeout)
    assert max(seconds for _, _, seconds in answers) < 60, answers


# -------------------------------------------------------------------- item 7: process index
def test_a_process_index_of_another_host_is_a_clear_error(pod):
    for p, answer in enumerate(_answers(pod, "other process index")):
        message = _message(answer)
        assert f"process_index={(p + 1) % 4}" in message, message
        assert f"jax.process_index() is {p}" in message
        assert "leave process_index unset" in message


# ---------------------------------------------------------- item 8: a mesh over some processes
def test_a_mesh_over_processes_0_and_2_feeds_exact_rows(pod):
    answers = _answers(pod, "subset {0, 2}")
    # tokens, weight and mask x 2 local devices x 3 steps on each mesh process; the reduction
    # runs on both
    for p in (0, 2):
        assert answers[p][:2] == ["ok", 18], answers[p]
    for p in (1, 3):
        message = _message(answers[p])
        assert f"process {p} holds no device of the mesh" in message, message
        assert "processes [0, 2]" in message
    padded = _answers(pod, "subset {0, 2} padded")
    # tokens, weight and mask x 1 device x 12 steps (step 10 is the epoch's short batch)
    assert padded[0][:2] == padded[2][:2] == ["ok", 36]
    assert padded[0][2] == padded[2][2]


def test_only_the_processes_of_a_mesh_take_part_in_its_check(pod):
    answers = _answers(pod, "subset stale copy")
    assert answers[1] is None and answers[3] is None  # their own mesh agrees
    for p in (0, 2):
        message = _message(answers[p])
        assert "process 0 has 64" in message and "process 2 has 63" in message, message
        assert "process 1" not in message


# ------------------------------------------------------------- item 5: unequal stream shards
def test_unequal_stream_shards_end_every_host_at_the_same_step(pod):
    for answer in _answers(pod, "stream padded end"):
        assert answer[:2] == ["end", 4], answer  # steps 0-3; step 3 padded on shard 1's rows
        assert "shard 1 of 2" in answer[2] and "unequal" in answer[2], answer
        assert answer[3] == [8, 8, 8, 6]
    for answer in _answers(pod, "stream dropped end"):
        assert answer[:2] == ["end", 3], answer  # step 3 is short on shard 1: dropped
        assert "shard 1 of 2" in answer[2], answer
        assert answer[3] == [8, 8, 8]
