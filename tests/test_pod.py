"""The local pod harness: results in process order; failures and hangs end with every output."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import pytest

from psdp.tools.pod import (
    PROGRESS_ENV,
    STOPPED,
    PodError,
    load_target,
    report_progress,
    run_pod,
    target_of,
)
from tests import pod_helpers
from tests.pod_helpers import exit_0_on, fail_on_one, say_then_wait, sleep_forever, whoami
from tests.pod_targets_simulate import count_with_progress, kill_one

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).resolve().parents[1]


def test_results_come_back_in_process_order(tmp_path, monkeypatch):
    # from another directory, where ``tests`` is not the working directory's package (an installed
    # package of that name may even be found first): the children import it where we did
    monkeypatch.chdir(tmp_path)
    results = run_pod(whoami, num_processes=3, devices_per_process=2, args={"tag": "x"})
    assert [r["process"] for r in results] == [0, 1, 2]
    assert all(r["count"] == 3 and r["local"] == 2 and r["global"] == 6 for r in results)
    assert results[0]["tag"] == "x"


def test_a_failing_process_fails_the_pod_with_its_message():
    started = time.monotonic()
    with pytest.raises(PodError) as info:  # a target named by its file, as a string
        run_pod(
            f"{ROOT / 'tests' / 'pod_helpers.py'}:fail_on_one",
            num_processes=2,
            devices_per_process=1,
            timeout_s=60,
        )
    message = str(info.value)
    assert "process 1 exited with status 1" in message
    assert "ZeroDivisionError: host 1 cannot divide" in message
    assert time.monotonic() - started < 30  # process 0 hangs in a barrier: it gets killed


def test_a_stuck_pod_is_killed_at_its_time_limit():
    started = time.monotonic()
    with pytest.raises(PodError, match="ran past its time limit"):
        run_pod(sleep_forever, num_processes=2, devices_per_process=1, timeout_s=8)
    assert time.monotonic() - started < 20


def test_bad_targets_are_clear():
    with pytest.raises(ValueError, match="must look like 'path/to/file.py:function'"):
        load_target("no_colon")
    with pytest.raises(ValueError, match="at least one process"):
        run_pod(whoami, num_processes=0, devices_per_process=1)


def nested_function():
    def inner():
        return 0

    return inner


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (lambda: 0, r"import by name: a function at the top level of a module, got <lambda> of "),
        (nested_function(), r"got nested_function.<locals>.inner of tests.test_pod; define it at"),
        (functools.partial(whoami, tag=1), r"a function or a 'package.module:function' string"),
        (print, r"must be a function or a 'package.module:function' string, got "),
    ],
)
def test_targets_a_child_cannot_import_are_refused_before_any_process_starts(target, match):
    with pytest.raises(TypeError, match=match):
        run_pod(target, num_processes=2, devices_per_process=1)


def test_a_function_is_named_by_its_module_and_the_folder_it_was_imported_from():
    assert target_of(whoami) == ("tests.pod_helpers:whoami", str(ROOT))
    assert target_of("tests.pod_helpers:whoami") == ("tests.pod_helpers:whoami", None)


def test_a_file_of_a_package_loads_as_that_packages_module(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_target adds the file's folder
    assert load_target(f"{ROOT / 'tests' / 'pod_helpers.py'}:whoami") is pod_helpers.whoami
    script = tmp_path / "psdp_pod_script.py"  # no package: run as a script, as before
    script.write_text("def answer():\n    return 42\n")
    monkeypatch.delitem(sys.modules, "psdp_pod_script", raising=False)
    assert load_target(f"{script}:answer")() == 42
    del sys.modules["psdp_pod_script"]


def test_the_others_stop_with_the_failing_process_message():
    with pytest.raises(PodError) as info:
        run_pod(fail_on_one, num_processes=3, devices_per_process=1, timeout_s=60)
    error = info.value
    assert error.reason == (
        "process 1 exited with status 1: ZeroDivisionError: host 1 cannot divide"
    )
    for index in (0, 2):
        code, output = error.outputs[index]
        assert code == STOPPED
        assert f"psdp pod: process {index} stops: {error.reason}" in output


def test_a_killed_process_is_named_with_its_signal():
    with pytest.raises(PodError) as info:
        run_pod(kill_one, num_processes=2, devices_per_process=1, timeout_s=60)
    assert info.value.reason == "process 1 exited with status -9: killed by signal SIGKILL"
    assert info.value.outputs[0][0] == STOPPED


def test_progress_of_process_0_reaches_the_parent():
    seen = []
    results = run_pod(
        count_with_progress,
        num_processes=2,
        devices_per_process=1,
        args={"total": 8},
        progress=lambda done, total: seen.append((done, total)),
    )
    assert results == [8, 8]
    assert seen[-1] == (8, 8) and seen == sorted(seen) and len(seen) >= 2


def test_report_progress_outside_a_pod_does_nothing(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    report_progress(1, 2)


def test_an_error_in_the_parent_stops_the_children():
    def progress(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pod(
            count_with_progress,
            num_processes=2,
            devices_per_process=1,
            args={"total": 100},  # 6 s unless stopped
            progress=progress,
        )


@pytest.mark.parametrize("process", [None, 1])
def test_a_process_that_exits_0_without_returning_fails_the_pod(process):
    with pytest.raises(PodError) as info:  # not FileNotFoundError, nor a hang to the time limit
        run_pod(
            exit_0_on,
            num_processes=2,
            devices_per_process=1,
            args={"process": process},
            timeout_s=60,
        )
    # every host leaving (None): the parent names whichever exit it saw first, 0 or 1
    first = {0, 1} if process is None else {1}
    assert info.value.reason in {
        f"process {i} exited with status 0 without returning a result" for i in first
    }
    if process == 1:  # process 0 waited in a collective: it is stopped with that reason
        code, output = info.value.outputs[0]
        assert code == STOPPED and f"stops: {info.value.reason}" in output


class FlagOnLine:
    """An ``echo`` stream that records what it receives and creates ``flag`` once ``line`` came."""

    def __init__(self, line: str, flag: Path) -> None:
        self.line, self.flag, self.text = line, flag, ""

    def write(self, text: str) -> int:
        self.text += text
        if self.line in self.text.splitlines():
            self.flag.touch()
        return len(text)

    def flush(self) -> None:
        pass


def test_output_is_shown_live_with_each_process_prefix(tmp_path, monkeypatch):
    # the children wait for the flag, which only the echo of "[p1] ready from 1" creates: the pod
    # ends only if process 1's line is shown while it runs (else: the time limit fails it)
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # a user's shell: children buffer
    flag = tmp_path / "flag"
    echo = FlagOnLine("[p1] ready from 1", flag)
    results = run_pod(
        say_then_wait,
        num_processes=2,
        devices_per_process=1,
        args={"flag": str(flag)},
        echo=echo,
        timeout_s=60,
    )
    assert results == [0, 1]
    lines = echo.text.splitlines()
    for i in (0, 1):
        mine = [line for line in lines if line.startswith(f"[p{i}] ")]
        assert f"[p{i}] ready from {i}" in mine and f"[p{i}] done on {i}" in mine
        assert mine.index(f"[p{i}] ready from {i}") < mine.index(f"[p{i}] done on {i}")
    assert all(line.startswith(("[p0] ", "[p1] ")) for line in lines)


def test_logs_are_kept_on_success_when_asked(tmp_path):
    flag = tmp_path / "flag"
    flag.touch()  # no waiting
    logs = tmp_path / "logs" / "run"  # made, parents too
    run_pod(
        say_then_wait,
        num_processes=2,
        devices_per_process=1,
        args={"flag": str(flag)},
        log_dir=logs,
    )
    assert sorted(p.name for p in logs.iterdir()) == ["p0.log", "p1.log"]
    for i in (0, 1):
        kept = (logs / f"p{i}.log").read_text().splitlines()
        assert f"ready from {i}" in kept and f"done on {i}" in kept


def test_logs_are_kept_on_failure_and_the_error_says_where(tmp_path):
    with pytest.raises(PodError) as info:
        run_pod(fail_on_one, num_processes=2, devices_per_process=1, log_dir=tmp_path, timeout_s=60)
    assert f"the output of every process is kept in {tmp_path}" in str(info.value)
    assert "ZeroDivisionError: host 1 cannot divide" in (tmp_path / "p1.log").read_text()
    assert "psdp pod: process 0 stops" in (tmp_path / "p0.log").read_text()
